"""Everything the bridge publishes, and what the broker refused of it.

Replies go out through the journal's ``Delivery.sending`` (so a reply's PUBACK marks its request
answered); status, discovery, deploy status and metrics straight to paho. A QoS 1 publish the
broker refuses (an MQTT v5 PUBACK reason code >= 0x80: ``Not authorized`` under an ACL, a quota,
a topic name it will not take) is otherwise silent: paho reports it to ``on_publish`` only. So the
outbox remembers each QoS 1 publish's topic until its PUBACK, and logs a refusal once per topic,
with the topic, the broker's reason and what to change.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from edgeinfer.bridge.serve.delivery import Delivery
from edgeinfer.bridge.serve.settings import BridgeConfig
from edgeinfer.bridge.serve.worker import Outgoing
from edgeinfer.bridge.wire import protocol as proto

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient
    from paho.mqtt.client import MQTTMessageInfo
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

    from edgeinfer.bridge.serve.reply_properties import ReplyProperties

__all__ = ["Outbox"]

log = logging.getLogger(__name__)

# Refused topics remembered (each logged once); reply topics are per client, so bound them.
_MAX_REFUSED_TOPICS = 4096


class Outbox:
    """The bridge's publishes on ``client``; ``acknowledged`` is paho's ``on_publish``."""

    def __init__(self, client: PahoClient, config: BridgeConfig, delivery: Delivery) -> None:
        self._client = client
        self._config = config
        self._delivery = delivery
        # Never held while calling paho: paho calls on_publish holding its own lock.
        self._lock = threading.Lock()
        self._topics: dict[int, str] = {}  # mid of a QoS 1 publish in flight -> its topic
        self._early: dict[int, str] = {}  # a refusal whose PUBACK beat publish() returning
        self._refused: set[str] = set()  # topics whose refusal was logged
        self.refusals = 0  # publishes the broker refused
        self._reply_properties: type[ReplyProperties] | None = None  # v5 only
        if config.connection.is_v5:  # paho (the mqtt extra) is there: the client is made
            from edgeinfer.bridge.serve.reply_properties import ReplyProperties

            self._reply_properties = ReplyProperties

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> MQTTMessageInfo:
        """Publish through paho (thread-safe; queued while disconnected), watching its PUBACK."""
        info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if qos > 0:
            self._watch(info.mid, topic)
        return info

    def send(self, out: Outgoing) -> None:
        """Publish one reply (an error reply without a reply topic goes to ``P/D/errors``)."""
        props = None
        if self._reply_properties is not None:
            content = proto.CONTENT_MSGPACK if out.fmt == "msgpack" else proto.CONTENT_JSON
            props = self._reply_properties(content, out.correlation)
        topic = out.topic or f"{self._config.base}/errors"
        qos = self._config.qos
        # Disconnected: paho keeps QoS 1 messages and sends them after the reconnect.
        try:
            self._delivery.sending(
                out, lambda: self.publish(topic, out.payload, qos=qos, properties=props).mid
            )
        except (ValueError, TypeError) as exc:  # paho refuses the topic or the payload size
            log.error("could not publish a %d-byte reply to %r: %s", len(out.payload), topic, exc)

    def acknowledged(self, mid: int, reason: ReasonCode | Any) -> None:
        """paho's ``on_publish``: the journal learns of the PUBACK; a refusal is logged."""
        failed = bool(getattr(reason, "is_failure", False))
        with self._lock:
            topic = self._topics.pop(mid, None)
            if topic is None and failed:
                self._early[mid] = str(reason)
        self._delivery.published(mid)
        if topic is not None and failed:
            self._report(topic, str(reason))

    def _watch(self, mid: int, topic: str) -> None:
        with self._lock:
            early = self._early.pop(mid, None)
            if early is None:
                self._topics[mid] = topic
        if early is not None:
            self._report(topic, early)

    def _report(self, topic: str, reason: str) -> None:
        with self._lock:
            self.refusals += 1
            if topic in self._refused:
                return
            if len(self._refused) >= _MAX_REFUSED_TOPICS:
                self._refused.clear()
            self._refused.add(topic)
        user = self._config.connection.username or "(anonymous)"
        log.error(
            "the broker refused a publish to %r (%s); nothing on that topic reaches anyone. "
            "Allow the bridge's MQTT user %s to write it in the broker's ACL (docs/mqtt.md, "
            "'The broker's ACL'); further refusals of this topic are not logged",
            topic,
            reason,
            user,
        )
