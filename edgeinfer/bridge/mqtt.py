"""The MQTT side of the bridge: subscribe, decode, hand to the worker, publish replies.

paho's network thread runs ``_on_message``, which only decodes and calls ``Worker.submit`` (cheap);
models run on the worker's threads. Subscriptions are made in ``_on_connect`` so that they come
back after every reconnect; the retained status topic says ``online``, and the Last Will makes it
``offline`` when the bridge vanishes. Topics (``P`` = topic prefix, ``D`` = device id)::

    P/D/MODEL/req      requests (via $share/GROUP/P/D/+/req when scaled out)
    P/D/status         retained online/offline (P/D/status/CLIENT_ID in a shared group)
    P/D/metrics        periodic JSON statistics
    P/D/errors         error replies for requests that named no reply topic
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeinfer.bridge import protocol as proto
from edgeinfer.bridge.connection import Connection, connect_async, new_paho_client
from edgeinfer.bridge.worker import Outgoing, ServedModel, Worker, epoch_ms
from edgeinfer.errors import BrokerAuthError, BrokerUnavailableError, ConfigError

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient
    from paho.mqtt.client import ConnectFlags, DisconnectFlags, MQTTMessage
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["Bridge", "BridgeConfig", "default_client_id"]

log = logging.getLogger(__name__)

_TOPIC_LEVEL_BAD = set("/+#\0")


def default_client_id(device_id: str, shared_group: str | None = None) -> str:
    """A stable client id: the same bridge on the same host gets its persistent session back."""
    parts = ["edgeinfer", device_id]
    if shared_group:  # several bridges share the device id: the host tells them apart
        parts += [shared_group, socket.gethostname()]
    return "-".join(parts)[:128]


@dataclass(frozen=True)
class BridgeConfig:
    """How the bridge serves.

    Args:
        connection: broker, credentials, TLS, protocol, client id and session settings.
        device_id: the device's topic level.
        topic_prefix: the first topic level.
        shared_group: subscribe through ``$share/GROUP/...`` so bridges in a group split requests.
        qos: QoS of the request subscription and of the replies; 1 (at least once, with the
            de-duplication store making it answer-once) is the default.
        max_queue: requests waiting at most; one more is answered ``busy`` at once.
        max_payload_bytes: bigger requests get ``payload_too_large`` unparsed; 256 KiB holds 64
            texts of a full 512-token window with room to spare.
        dedup_size: recent replies kept to answer repeated ids without running the model.
        worker_threads: threads running models (1: a request at a time, every core each).
        metrics_interval_s: seconds between metrics messages; 0 turns them off.
    """

    connection: Connection
    device_id: str
    topic_prefix: str = "edgeinfer"
    shared_group: str | None = None
    qos: int = 1
    max_queue: int = 64
    max_payload_bytes: int = 256 * 1024
    dedup_size: int = 4096
    worker_threads: int = 1
    metrics_interval_s: float = 10.0

    def __post_init__(self) -> None:
        for name, level in (("device_id", self.device_id), ("topic_prefix", self.topic_prefix),
                            ("shared_group", self.shared_group or "x")):
            if not level or _TOPIC_LEVEL_BAD & set(level):
                raise ConfigError(f"{name} must be a non-empty topic level without / + # NUL")
        if self.qos not in (0, 1):
            raise ConfigError(f"qos must be 0 or 1, got {self.qos}")
        if self.max_payload_bytes < 64:
            raise ConfigError("max_payload_bytes must be >= 64")
        if self.metrics_interval_s < 0:
            raise ConfigError("metrics_interval_s must be >= 0")

    @property
    def base(self) -> str:
        """``PREFIX/DEVICE``."""
        return f"{self.topic_prefix}/{self.device_id}"

    def request_topic(self, model: str) -> str:
        """Where clients publish requests for ``model``."""
        return f"{self.base}/{model}/req"

    @property
    def subscription(self) -> str:
        """The bridge's one subscription (every model; unknown ones get ``unknown_model``)."""
        topic = f"{self.base}/+/req"
        return f"$share/{self.shared_group}/{topic}" if self.shared_group else topic

    @property
    def status_topic(self) -> str:
        """Retained online/offline; per client in a shared group (each bridge has its own)."""
        own = f"/{self.connection.client_id}" if self.shared_group else ""
        return f"{self.base}/status{own}"


@dataclass
class _State:
    connected: threading.Event = field(default_factory=threading.Event)
    subscribed: threading.Event = field(default_factory=threading.Event)
    refused: str | None = None
    connects: int = 0


class Bridge:
    """Serve models over MQTT. Use as a context manager, or ``start()`` then ``stop()``.

    Args:
        models: model name (its topic level) -> a loaded model.
        config: the bridge settings.
    """

    def __init__(self, models: Mapping[str, ServedModel], *, config: BridgeConfig) -> None:
        if not models:
            raise ConfigError("the bridge needs at least one model")
        for name in models:
            if not name or _TOPIC_LEVEL_BAD & set(name):
                raise ConfigError(f"model name {name!r} is not a valid topic level")
        self.config = config
        self._state = _State()
        self._stop = threading.Event()
        self.worker = Worker(models, send=self._send, max_queue=config.max_queue,
                             dedup_size=config.dedup_size, threads=config.worker_threads)
        self._client: PahoClient = new_paho_client(config.connection)
        self._client.will_set(config.status_topic, b"offline", qos=1, retain=True)
        self._client.max_inflight_messages_set(max(20, config.max_queue))
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._metrics = threading.Thread(target=self._metrics_loop, name="edgeinfer-metrics",
                                         daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, *, timeout_s: float | None = 30.0) -> Bridge:
        """Start the worker and connect; wait until subscribed (``timeout_s`` None: don't wait).

        Raises:
            BrokerAuthError: the broker refused the connection (bad credentials, not authorized).
            BrokerUnavailableError: not subscribed within ``timeout_s`` (a ``TimeoutError`` too).
        """
        self.worker.start()
        connect_async(self._client, self.config.connection)
        self._client.loop_start()
        if self.config.metrics_interval_s > 0:
            self._metrics.start()
        if timeout_s is not None:
            self.wait_ready(timeout_s=timeout_s)
        return self

    def wait_ready(self, *, timeout_s: float) -> None:
        """Block until subscribed.

        Raises:
            BrokerAuthError: the broker refused the connection or the subscription.
            BrokerUnavailableError: not subscribed within ``timeout_s``.
        """
        deadline = epoch_ms() + timeout_s * 1e3
        while not self._state.subscribed.wait(0.05):
            if self._state.refused is not None:
                self.stop()
                raise BrokerAuthError(f"the broker refused the bridge: {self._state.refused}")
            if epoch_ms() >= deadline:
                raise BrokerUnavailableError(f"bridge not subscribed within {timeout_s} s")

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Finish queued requests, mark the status offline, disconnect."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.worker.stop(timeout_s=timeout_s)
        if self._state.connected.is_set():
            info = self._client.publish(self.config.status_topic, b"offline", qos=1, retain=True)
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError):  # the link dropped meanwhile: the Will says it
                log.warning("could not publish the offline status; the Last Will will")
        self._client.disconnect()
        self._client.loop_stop()

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def connected(self) -> bool:
        """Whether the bridge is connected to the broker now."""
        return self._state.connected.is_set()

    @property
    def refused(self) -> str | None:
        """Why the broker refused the connection (bad credentials, ...), or ``None``."""
        return self._state.refused

    @property
    def connects(self) -> int:
        """Successful connections so far (more than 1 means it reconnected)."""
        return self._state.connects

    # -- paho callbacks (network thread: no model work here) ----------------------------------
    def _on_connect(self, client: PahoClient, userdata: Any, flags: ConnectFlags,
                    reason: ReasonCode, properties: Properties | None) -> None:
        if reason.is_failure:
            self._state.refused = str(reason)
            log.error("broker refused the connection: %s", reason)
            client.disconnect()  # stop paho retrying with credentials that cannot work
            return
        self._state.connects += 1
        self._state.connected.set()
        log.info("connected to %s (session present: %s)", self.config.connection.broker,
                 flags.session_present)
        client.subscribe(self.config.subscription, qos=self.config.qos)
        client.publish(self.config.status_topic, b"online", qos=1, retain=True)

    def _on_subscribe(self, client: PahoClient, userdata: Any, mid: int,
                      reasons: list[ReasonCode], properties: Properties | None) -> None:
        if any(r.is_failure for r in reasons):
            log.error("subscription to %s refused: %s", self.config.subscription, reasons)
            self._state.refused = f"subscription refused: {reasons}"
            return
        self._state.subscribed.set()

    def _on_disconnect(self, client: PahoClient, userdata: Any, flags: DisconnectFlags,
                       reason: ReasonCode, properties: Properties | None) -> None:
        self._state.connected.clear()
        if not self._stop.is_set():
            log.warning("disconnected (%s); reconnecting with backoff", reason)

    def _on_message(self, client: PahoClient, userdata: Any, message: MQTTMessage) -> None:
        received_ms = epoch_ms()
        levels = message.topic.split("/")
        props = getattr(message, "properties", None)
        response_topic = getattr(props, "ResponseTopic", None) or None
        correlation = getattr(props, "CorrelationData", None)
        decoded = proto.decode_request(
            bytes(message.payload),
            model=levels[-2] if len(levels) >= 2 else "",
            content_type=getattr(props, "ContentType", None),
            response_topic=response_topic,
            correlation=bytes(correlation) if correlation is not None else None,
            max_payload_bytes=self.config.max_payload_bytes,
            received_ms=received_ms,
        )
        self.worker.submit(decoded)

    # -- publishing (any thread; paho's publish is thread-safe) --------------------------------
    def _send(self, out: Outgoing) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = None
        if self.config.connection.is_v5:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            msgpack = out.fmt == "msgpack"
            props.ContentType = proto.CONTENT_MSGPACK if msgpack else proto.CONTENT_JSON
            if out.correlation is not None:
                props.CorrelationData = out.correlation
        topic = out.topic or f"{self.config.base}/errors"
        # Disconnected: paho keeps QoS 1 messages and sends them after the reconnect.
        self._client.publish(topic, out.payload, qos=self.config.qos, properties=props)

    def _metrics_loop(self) -> None:
        while not self._stop.wait(self.config.metrics_interval_s):
            snapshot = self.worker.snapshot()
            snapshot.update(client_id=self.config.connection.client_id, ts_ms=epoch_ms(),
                            models=sorted(self.worker.models))
            self._client.publish(f"{self.config.base}/metrics",
                                 json.dumps(snapshot).encode(), qos=0)
