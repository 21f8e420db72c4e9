"""``edgeinfer.bridge.Client``: send requests to a bridge and wait for the replies.

A broker killed with -9 can lose QoS 1 messages it had acknowledged, and a member of a shared
group that dies takes the requests it had accepted with it, so the client re-sends a request
with the **same id** when no reply came within ``attempt_timeout_s`` (backing off): the broker
hands the re-send to a live member, and a bridge that has seen the id answers it from its
de-duplication store without running the model twice. Each future resolves once; further
replies (a member that answered too, then died before the reply got out) are counted in
``duplicate_replies`` and dropped.

Every request carries its expiry as the MQTT v5 Message Expiry Interval: the time left until
its deadline, or else until the client gives up (every attempt's wait). The broker discards it
once that has passed, and a bridge drops it unstarted (``deadline_exceeded``), so a member
returning after an outage never runs work nobody waits for. The schedule and the matching of
replies are ``inflight.py``'s; this module is the paho side.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypedDict

from edgeinfer.bridge.connection import Connection, Handshake, connect_async, new_paho_client
from edgeinfer.bridge.inflight import Inflight, Pending, request_expiry_s, total_wait_s
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.failures import raise_for_error
from edgeinfer.errors import BridgeError, ConfigError

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient
    from paho.mqtt.client import ConnectFlags, MQTTMessage
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode
    from typing_extensions import Unpack  # annotations only: no runtime dependency

__all__ = ["Client", "RequestOptions"]

log = logging.getLogger(__name__)


class RequestOptions(TypedDict, total=False):
    """``Client.submit``'s keyword arguments, for ``Client.request`` (see ``submit``)."""

    text: str | None
    texts: list[str] | None
    request_id: str | None
    timeout_ms: float | None
    deadline_ms: float | None
    params: dict[str, Any] | None
    fields: dict[str, Any] | None
    on_chunk: Callable[[dict[str, Any]], None] | None
    attempt_timeout_s: float
    retries: int
    backoff: float
    busy_wait_s: float


class Client:
    """A request/response client for ``edgeinfer serve``.

    Args:
        connection: broker, credentials, TLS, protocol and a stable client id (its session).
        device_id, topic_prefix: the bridge's topic levels.
        qos: QoS for requests and the reply subscription.
        fmt: ``"json"`` or ``"msgpack"`` (MQTT v5 only: the content type says which).
    """

    def __init__(
        self,
        *,
        connection: Connection,
        device_id: str,
        topic_prefix: str = "edgeinfer",
        qos: int = 1,
        fmt: str = "json",
    ) -> None:
        if fmt not in ("json", "msgpack") or (fmt == "msgpack" and not connection.is_v5):
            raise ConfigError("fmt must be 'json', or 'msgpack' over MQTT v5")
        if qos not in (0, 1):
            raise ConfigError(f"qos must be 0 or 1, got {qos}")
        self.connection = connection
        self.base = f"{topic_prefix}/{device_id}"
        self.reply_topic = f"{topic_prefix}/clients/{connection.client_id}/reply"
        self.qos = qos
        self.fmt = fmt
        # Counted on paho's network thread (replies) and the re-send thread (resends).
        self.duplicate_replies = 0
        self.busy_replies = 0  # `busy` replies that were re-sent later
        self.resends = 0
        self._inflight = Inflight()
        self._ids = itertools.count()
        self._prefix = f"{os.getpid():x}-{uuid.uuid4().hex[:8]}"
        self._handshake = Handshake(connection)
        self._client: PahoClient = new_paho_client(connection)
        self._client.max_inflight_messages_set(1000)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = lambda c, u, mid, reasons, p: self._handshake.subscribed(
            reasons
        )
        self._client.on_message = self._on_message
        self._resender = threading.Thread(
            target=self._resend_loop, name="edgeinfer-resend", daemon=True
        )

    def connect(self, *, timeout_s: float = 30.0) -> Client:
        """Connect and subscribe to the reply topic.

        Raises:
            BrokerAuthError: the broker refused the connection (e.g. a wrong password).
            BrokerUnavailableError: not subscribed within ``timeout_s`` (the broker is down or
                unreachable, or the TLS handshake failed); also a built-in ``TimeoutError``.
        """
        if self._resender.is_alive():
            return self  # already connected (connect() then ``with client:``)
        connect_async(self._client, self.connection)
        self._client.loop_start()
        self._resender.start()
        try:
            self._handshake.wait(timeout_s=timeout_s)
        except BridgeError:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Disconnect; requests still waiting fail with ``RequestTimeoutError``."""
        if not self._inflight.close():
            return
        self._client.disconnect()
        self._client.loop_stop()

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        model: str,
        *,
        text: str | None = None,
        texts: list[str] | None = None,
        request_id: str | None = None,
        timeout_ms: float | None = None,
        deadline_ms: float | None = None,
        params: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
        attempt_timeout_s: float = 2.0,
        retries: int = 3,
        backoff: float = 2.0,
        busy_wait_s: float = 0.05,
    ) -> Future[dict[str, Any]]:
        """Send one request; the future resolves with the reply dict (``ok`` true or false).

        Args:
            model: the model's topic level on the bridge.
            text, texts: one input, or several (exactly one of the two).
            request_id: the id (default: a fresh unique one); re-sends reuse it.
            timeout_ms, deadline_ms: a relative or an absolute (epoch ms) deadline, or neither.
            params: model parameters (``{"truncate": bool}``).
            fields: other request fields (image, inputs, prompt, ...: docs/mqtt.md).
            on_chunk: called once with each new chunk of a generation, in order (the future
                resolves with the final message).
            attempt_timeout_s: wait this long for a reply before re-sending the same id.
            retries: re-sends at most; then the future fails with ``RequestTimeoutError``.
            backoff: each wait is this many times the previous one.
            busy_wait_s: a ``busy`` reply (the bridge's queue was full) is re-sent after this
                long, doubling each time, using up the same ``retries``; 0 returns it at once.
        """
        if (text is None) == (texts is None) and not fields:
            raise ConfigError("give exactly one of text= or texts=, or the request's fields=")
        if attempt_timeout_s <= 0 or retries < 0 or backoff < 1 or busy_wait_s < 0:
            raise ConfigError(
                "need attempt_timeout_s > 0, retries >= 0, backoff >= 1, busy_wait_s >= 0"
            )
        body: dict[str, Any] = {"id": request_id or f"{self._prefix}-{next(self._ids)}"}
        if text is not None or texts is not None:
            body.update({"text": text} if text is not None else {"texts": texts})
        body.update(fields or {})
        for key, value in (
            ("timeout_ms", timeout_ms),
            ("deadline_ms", deadline_ms),
            ("params", params),
        ):
            if value is not None:
                body[key] = value
        # Always in the payload too: a bridge on MQTT 3.1.1 never sees the v5 ResponseTopic.
        body["reply_to"] = self.reply_topic
        payload = proto.encode(body, fmt=self.fmt)
        content_type = proto.CONTENT_MSGPACK if self.fmt == "msgpack" else None
        waiting_s = total_wait_s(attempt_timeout_s, retries, backoff)
        return self._send(
            f"{self.base}/{model}/req",
            payload,
            body["id"].encode(),
            content_type,
            attempt_timeout_s,
            retries,
            backoff,
            busy_wait_s,
            on_chunk,
            expiry_s=request_expiry_s(timeout_ms, deadline_ms, waiting_s),
        )

    def request(
        self, model: str, *, raise_on_error: bool = False, **options: Unpack[RequestOptions]
    ) -> dict[str, Any]:
        """``submit(model, **options)`` then wait for the reply (``RequestTimeoutError`` after
        the last try); ``raise_on_error`` raises ``ReplyError`` for an error reply instead of
        returning it (its ``wire_code`` is the reply's ``error.code``)."""
        reply = self.submit(model, **options).result()
        return raise_for_error(reply) if raise_on_error else reply

    def send_raw(
        self,
        model: str,
        payload: bytes,
        *,
        content_type: str | None = None,
        attempt_timeout_s: float = 5.0,
        retries: int = 0,
    ) -> Future[dict[str, Any]]:
        """Publish arbitrary bytes as a request (MQTT v5) and get the bridge's reply.

        For diagnostics and tests: the reply is matched by a fresh CorrelationData, so even a
        payload the bridge cannot parse gets its error reply back here.
        """
        if not self.connection.is_v5:
            raise ConfigError("send_raw needs MQTT v5 (the reply is matched by CorrelationData)")
        correlation = f"raw-{self._prefix}-{next(self._ids)}".encode()
        topic = f"{self.base}/{model}/req"
        return self._send(topic, payload, correlation, content_type, attempt_timeout_s, retries,
                          1.0, 0.0, expiry_s=attempt_timeout_s * (retries + 1))  # fmt: skip

    def _send(
        self,
        topic: str,
        payload: bytes,
        correlation: bytes,
        content_type: str | None,
        attempt_timeout_s: float,
        retries: int,
        backoff: float,
        busy_wait_s: float,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
        *,
        expiry_s: float,
    ) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()
        now = time.monotonic()
        item = Pending(
            topic,
            payload,
            correlation,
            content_type,
            future,
            next_send=now + attempt_timeout_s,
            wait_s=attempt_timeout_s * backoff,
            resends_left=retries,
            backoff=backoff,
            busy_wait_s=busy_wait_s,
            expires_at=now + expiry_s,
            on_chunk=on_chunk,
        )
        self._inflight.add(item)
        self._publish(item)
        return future

    def _publish(self, item: Pending) -> None:
        props = None
        if self.connection.is_v5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.ResponseTopic = self.reply_topic
            props.CorrelationData = item.correlation
            if item.content_type:
                props.ContentType = item.content_type
            props.MessageExpiryInterval = item.expiry_interval_s()
        # Disconnected: paho keeps the QoS 1 message and sends it after reconnecting.
        self._client.publish(item.topic, item.payload, qos=self.qos, properties=props)

    def _resend_loop(self) -> None:
        while (due := self._inflight.take_due()) is not None:
            self.resends += len(due)
            for item in due:
                log.info("re-sending %r (attempt %d)", item.correlation, item.attempts)
                self._publish(item)
            self._inflight.wait_for_next()

    def _on_connect(
        self,
        client: PahoClient,
        userdata: Any,
        flags: ConnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if not self._handshake.connected(reason):
            client.disconnect()  # stop paho retrying a login the broker refused
            return
        client.subscribe(self.reply_topic, qos=self.qos)

    def _on_message(self, client: PahoClient, userdata: Any, message: MQTTMessage) -> None:
        props = getattr(message, "properties", None)
        fmt = proto.wire_format(getattr(props, "ContentType", None))
        try:
            reply = proto.decode_reply(bytes(message.payload), fmt=fmt)
        except ValueError:
            log.warning("dropping an undecodable reply on %s", message.topic)
            return
        correlation = getattr(props, "CorrelationData", None)
        key = bytes(correlation) if correlation else str(reply.get("id", "")).encode()
        outcome = self._inflight.settle(key, reply)
        self.duplicate_replies += outcome == "duplicate"
        self.busy_replies += outcome == "busy"
