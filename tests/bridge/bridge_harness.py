"""Bridge test harness: a real MiniLM model, bridges and clients, and helpers.

The REAL mosquitto broker (config, passwords, TLS certificates) lives in tests/mosquitto.py,
shared with the examples' tests; its names are re-exported here for the bridge tests.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from mosquitto import (
    LOOPBACK,
    MOSQUITTO,
    MOSQUITTO_PASSWD,
    OPENSSL,
    Mosquitto,
    Secure,
    free_port,
    make_certificates,
    require_mosquitto,
)

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Client, Connection
from edgeinfer.bridge.serve.replies import epoch_ms

__all__ = [
    "LOOPBACK",
    "MOSQUITTO",
    "MOSQUITTO_PASSWD",
    "OPENSSL",
    "CountingModel",
    "FakeClock",
    "Harness",
    "Mosquitto",
    "Secure",
    "free_port",
    "make_certificates",
    "require_mosquitto",
    "wait_until",
]


class CountingModel:
    """A real model that also counts how often each text reached it (thread-safe)."""

    def __init__(self, model: edgeinfer.Model) -> None:
        self._model = model
        self.texts: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def task(self) -> str:
        return self._model.task

    @property
    def manifest(self) -> edgeinfer.Manifest:
        return self._model.manifest

    @property
    def model(self) -> edgeinfer.Model:
        """The real model behind the counter (for expected values that must not count)."""
        return self._model

    @property
    def calls(self) -> int:
        with self._lock:
            return sum(self.texts.values())

    def embed_with_info(self, texts: Sequence[str], *, truncate: bool = True) -> list[Any]:
        with self._lock:
            self.texts.update(texts)
        return self._model.embed_with_info(texts, truncate=truncate)

    def classify(self, texts: Sequence[str], *, truncate: bool = True) -> list[Any]:
        with self._lock:
            self.texts.update(texts)
        return self._model.classify(texts, truncate=truncate)


class FakeClock:
    """An epoch-ms clock that moves only when told (deadline tests never sleep)."""

    def __init__(self) -> None:
        self.now_ms = epoch_ms()

    def __call__(self) -> float:
        return self.now_ms

    def advance(self, ms: float) -> None:
        self.now_ms += ms


@dataclass
class Harness:
    """Starts bridges and clients against a broker and stops them all at the end."""

    model: edgeinfer.Model
    bridges: list[Bridge] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)

    def bridge(
        self,
        server: Mosquitto,
        *,
        device_id: str,
        protocol: str = "5",
        client_id: str | None = None,
        start: bool = True,
        **options: Any,
    ) -> tuple[Bridge, CountingModel]:
        counting = CountingModel(self.model)
        connection = Connection(
            broker=server.url,
            client_id=client_id or f"bridge-{device_id}",
            protocol=protocol,
            **_auth(server, options),
        )
        clock = options.pop("clock_ms", epoch_ms)
        config = BridgeConfig(
            connection=connection,
            device_id=device_id,
            metrics_interval_s=options.pop("metrics_interval_s", 0),
            **options,
        )
        bridge = Bridge({"minilm": counting}, config=config, clock_ms=clock)
        self.bridges.append(bridge)
        if start:
            bridge.start()
        return bridge, counting

    def client(
        self,
        server: Mosquitto,
        *,
        device_id: str,
        protocol: str = "5",
        client_id: str | None = None,
        fmt: str = "json",
        connect: bool = True,
        **auth: Any,
    ) -> Client:
        n = len(self.clients)
        connection = Connection(
            broker=server.url,
            protocol=protocol,
            client_id=client_id or f"client-{device_id}-{n}",
            **_auth(server, auth),
        )
        client = Client(connection=connection, device_id=device_id, fmt=fmt)
        self.clients.append(client)
        return client.connect() if connect else client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for bridge in self.bridges:
            bridge.stop()


def _auth(server: Mosquitto, options: dict[str, Any]) -> dict[str, Any]:
    """Credentials and CA for a secure broker (unless the test passes its own)."""
    auth = {k: options.pop(k) for k in ("username", "password", "tls_ca") if k in options}
    if server.secure is not None:
        auth.setdefault("username", server.secure.username)
        auth.setdefault("password", server.secure.password)
        auth.setdefault("tls_ca", server.secure.ca)
    return auth


def wait_until(predicate: Callable[[], bool], *, timeout_s: float = 30.0) -> None:
    """Poll ``predicate`` until it holds; fail the test if it never does (a hang guard only)."""
    give_up = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > give_up:
            pytest.fail("condition not reached (hang guard)")
        time.sleep(0.01)


class PahoPeer:
    """A device written with plain paho (not our Client): publishes requests with a v5
    ResponseTopic and CorrelationData, and keeps every message that comes back, in order."""

    def __init__(self, port: int, name: str, *, fmt: str = "msgpack") -> None:
        from paho.mqtt.client import Client as PahoClient
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

        self.topic = f"edgeinfer/clients/peer-{name}/reply"  # the reply convention
        self.fmt = fmt
        self.messages: list[tuple[bytes, dict[str, Any]]] = []  # (correlation, message)
        self._cond = threading.Condition()
        ready = threading.Event()
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2,
            client_id=f"peer-{name}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.on_connect = lambda c, *a: c.subscribe(self.topic, qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect(LOOPBACK, port)
        self.client.loop_start()
        assert ready.wait(10)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        from edgeinfer.bridge.wire import protocol as proto

        fmt = proto.wire_format(getattr(message.properties, "ContentType", None))
        with self._cond:
            self.messages.append(
                (
                    bytes(message.properties.CorrelationData),
                    proto.decode_reply(message.payload, fmt=fmt),
                )
            )
            self._cond.notify_all()

    def send(
        self, device: str, model: str, body: dict[str, Any], *, correlation: bytes | None = None
    ) -> bytes:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        from edgeinfer.bridge.wire import protocol as proto

        correlation = correlation or str(body["id"]).encode()
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.topic
        props.CorrelationData = correlation
        if self.fmt == "msgpack":
            props.ContentType = proto.CONTENT_MSGPACK
        self.client.publish(
            f"edgeinfer/{device}/{model}/req",
            proto.encode(body, fmt=self.fmt),
            qos=1,
            properties=props,
        ).wait_for_publish(10)
        return correlation

    def of(self, correlation: bytes) -> list[dict[str, Any]]:
        with self._cond:
            return [m for c, m in self.messages if c == correlation]

    def final(self, correlation: bytes, *, timeout_s: float = 60) -> dict[str, Any]:
        """The one final message (not a chunk) for ``correlation``."""

        def done() -> bool:
            return any("chunk" not in m for m in self.of(correlation))

        with self._cond:
            assert self._cond.wait_for(done, timeout=timeout_s), self.of(correlation)
        return next(m for m in self.of(correlation) if "chunk" not in m)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
