"""What a fleet says about itself, read from the broker: no server, only what devices publish.

``FleetWatch`` subscribes to every device's retained ``P/D/status`` (served packages:
digest, version, signer, previous; compatible classes), ``P/D/availability``, retained
``P/D/ota/status`` (the last deploy step: ``trial``, ``committed``, ``rolled_back`` with its
reason, ...) and ``P/D/metrics``, and keeps the latest of each per device. ``fleet_status``
takes one look (``edgeinfer fleet status``); a rollout keeps a watch open to follow its
devices.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from edgeinfer.bridge.connection import Connection, subscriber

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient

__all__ = ["DeviceView", "FleetWatch", "fleet_status"]

T = TypeVar("T")
_SETTLE_S = 0.5  # retained messages come at once after the subscription; then quiet
_FIELDS = ("status", "availability", "ota", "metrics")


def _epoch_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class DeviceView:
    """One device as its topics describe it.

    Args:
        device_id: its topic level.
        state: ``online``/``offline`` (its status), ``unknown`` when it published none.
        availability: ``online``/``offline`` or ``None`` (no availability topic).
        models: served name -> digest, version, signer, previous digest and version, task.
        compatible: the classes it takes releases for.
        deploy: its last deploy step (``state``, ``reason``, ``deploy_id``, ...) or ``{}``;
            refusals are left out: they change nothing on the device.
        metrics: its last metrics message (``counts``, latency), ``{}`` when none came.
        last_seen_ms: when this watch last heard from it (epoch ms).
    """

    device_id: str
    state: str
    availability: str | None
    models: dict[str, Any]
    compatible: tuple[str, ...]
    deploy: dict[str, Any]
    metrics: dict[str, Any]
    last_seen_ms: int

    @property
    def health(self) -> str:
        """``offline``, ``failed``/``rolled_back``/``trial`` (its last deploy says so) or
        ``ok``."""
        if self.state != "online" or self.availability == "offline":
            return "offline"
        last = self.deploy.get("state")
        return str(last) if last in ("failed", "rolled_back", "trial") else "ok"

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``: every field and the health."""
        return {
            "device_id": self.device_id,
            "state": self.state,
            "availability": self.availability,
            "health": self.health,
            "compatible": list(self.compatible),
            "models": self.models,
            "deploy": self.deploy,
            "counts": self.metrics.get("counts", {}),
            "last_seen_ms": self.last_seen_ms,
        }


@dataclass
class _Seen:
    status: dict[str, Any] = field(default_factory=dict)
    availability: str | None = None
    ota: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    last_seen_ms: int = 0

    def view(self, device_id: str) -> DeviceView:
        return DeviceView(
            device_id=device_id,
            state=str(self.status.get("state", "unknown")),
            availability=self.availability,
            models=dict(self.status.get("models") or {}),
            compatible=tuple(str(c) for c in self.status.get("compatible") or ()),
            deploy=dict(self.ota),
            metrics=dict(self.metrics),
            last_seen_ms=self.last_seen_ms,
        )


class FleetWatch:
    """The latest of every device's topics under ``topic_prefix``, kept up to date."""

    def __init__(
        self,
        connection: Connection,
        *,
        topic_prefix: str = "edgeinfer",
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.prefix = topic_prefix
        self._seen: dict[str, _Seen] = {}
        self._cond = threading.Condition()
        self._last_message_s = time.monotonic()
        p = topic_prefix
        topics = [(f"{p}/+/status", 1), (f"{p}/+/availability", 1), (f"{p}/+/ota/status", 1),
                  (f"{p}/+/metrics", 0)]  # fmt: skip
        self._client: PahoClient = subscriber(
            connection, topics, self._on_message, timeout_s=connect_timeout_s
        )

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        levels = str(message.topic).split("/")
        if len(levels) < 3 or levels[-1] not in ("status", "availability", "metrics"):
            return
        device, what = levels[-3 if levels[-2] == "ota" else -2], levels[-1]
        what = "ota" if levels[-2] == "ota" else what
        payload = bytes(message.payload)
        try:
            value: Any = payload.decode() if what == "availability" else json.loads(payload)
        except (UnicodeDecodeError, ValueError):
            return  # not a device's message
        if what != "availability" and not isinstance(value, dict):
            return
        if what == "ota" and value.get("state") == "refused":
            return  # a message the device would not take: nothing changed there (not retained)
        with self._cond:
            seen = self._seen.setdefault(device, _Seen())
            setattr(seen, what, value)
            seen.last_seen_ms = _epoch_ms()
            self._last_message_s = time.monotonic()
            self._cond.notify_all()

    def devices(self) -> list[DeviceView]:
        """Every device heard from, by id."""
        with self._cond:
            return [s.view(d) for d, s in sorted(self._seen.items())]

    def device(self, device_id: str) -> DeviceView | None:
        """One device, or ``None`` when it published nothing."""
        with self._cond:
            seen = self._seen.get(device_id)
            return None if seen is None else seen.view(device_id)

    def settle(self, *, quiet_s: float = _SETTLE_S, timeout_s: float = 10.0) -> None:
        """Wait until no message came for ``quiet_s`` (the retained ones are in), at most
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (now := time.monotonic()) < deadline:
                quiet_until = self._last_message_s + quiet_s
                if now >= quiet_until:
                    return
                self._cond.wait(min(quiet_until, deadline) - now)

    def wait_for(self, check: Callable[[], T | None], *, timeout_s: float) -> T | None:
        """The first non-``None`` answer of ``check`` (called after each message, and once
        first), or ``None`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = check()
                left = deadline - time.monotonic()
                if found is not None or left <= 0:
                    return found
                self._cond.wait(left)

    def close(self) -> None:
        """Disconnect."""
        self._client.disconnect()
        self._client.loop_stop()


def fleet_status(
    *,
    connection: Connection,
    topic_prefix: str = "edgeinfer",
    wait_s: float = 10.0,
    connect_timeout_s: float = 10.0,
) -> list[DeviceView]:
    """Every device under ``topic_prefix`` as its retained topics describe it (waits until
    they came, at most ``wait_s``)."""
    watch = FleetWatch(connection, topic_prefix=topic_prefix, connect_timeout_s=connect_timeout_s)
    try:
        watch.settle(timeout_s=wait_s)
        return watch.devices()
    finally:
        watch.close()
