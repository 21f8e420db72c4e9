"""The requests a ``Client`` has in flight, without paho: each one's re-send schedule (backing
off), how long its answer is wanted (the MQTT v5 Message Expiry Interval it carries), and which
reply settles it: a generation's chunks in order, a ``busy`` reply re-sent later, the final
reply once; any further reply is counted as a duplicate and dropped."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.errors import ConfigError, RequestTimeoutError

__all__ = ["Inflight", "Pending", "request_expiry_s", "total_wait_s"]

# The MQTT v5 Message Expiry Interval is a four-byte count of seconds.
_MAX_EXPIRY_S = 2**32 - 1


@dataclass
class Pending:
    """One request in flight, keyed by its correlation (its id, or a raw request's own)."""

    topic: str
    payload: bytes
    correlation: bytes
    content_type: str | None
    future: Future[dict[str, Any]]
    next_send: float  # time.monotonic() of the next re-send
    wait_s: float  # the current wait between sends
    resends_left: int
    backoff: float  # each wait is this many times the previous one
    busy_wait_s: float  # wait before re-sending after a `busy` reply (doubles each time)
    expires_at: float  # time.monotonic() after which no one waits for the answer
    attempts: int = 1
    on_chunk: Callable[[dict[str, Any]], None] | None = None  # a generation's chunks
    next_chunk: int = 0  # chunks below this number were delivered (repeats are dropped)

    def expiry_interval_s(self) -> int:
        """The time left, in whole seconds rounded up, at least 1, at most what MQTT holds."""
        left_s = min(float(_MAX_EXPIRY_S), self.expires_at - time.monotonic())
        return max(1, math.ceil(left_s))


class Inflight:
    """The pending requests under one lock: added by the sender, re-sent by the client's
    re-send thread (``take_due``, ``wait_for_next``), settled by paho's network thread."""

    def __init__(self) -> None:
        self._pending: dict[bytes, Pending] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._wake = 0.0  # time.monotonic() of the next due re-send

    def add(self, item: Pending) -> None:
        """Track ``item`` (a ``ConfigError`` once closed, or while its id is in flight)."""
        with self._lock:
            if self._closed:
                raise ConfigError("the client is closed")
            if item.correlation in self._pending:
                name = item.correlation.decode(errors="replace")
                raise ConfigError(f"request {name!r} is in flight")
            self._pending[item.correlation] = item
            self._lock.notify_all()

    def close(self) -> bool:
        """Fail every request still waiting; False when it was closed already."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            pending, self._pending = self._pending, {}
            self._lock.notify_all()
        for item in pending.values():
            if not item.future.done():
                item.future.set_exception(
                    RequestTimeoutError("client closed before the reply came")
                )
        return True

    def take_due(self) -> list[Pending] | None:
        """The requests to re-send now (their next wait backed off); those out of re-sends
        fail with ``RequestTimeoutError``. ``None`` once closed."""
        due: list[Pending] = []
        expired: list[Pending] = []
        with self._lock:
            if self._closed:
                return None
            now = time.monotonic()
            for key, item in list(self._pending.items()):
                if item.next_send > now:
                    continue
                if item.resends_left == 0:
                    expired.append(self._pending.pop(key))
                    continue
                item.resends_left -= 1
                item.attempts += 1
                item.next_send = now + item.wait_s
                item.wait_s *= item.backoff
                due.append(item)
            self._wake = min((i.next_send for i in self._pending.values()), default=now + 1.0)
        for item in expired:
            item.future.set_exception(
                RequestTimeoutError(
                    f"no reply to {item.correlation.decode(errors='replace')!r} "
                    f"after {item.attempts} attempt(s)"
                )
            )
        return due

    def wait_for_next(self) -> None:
        """Sleep until the next re-send is due (at most 1 s), a request is added, or close."""
        with self._lock:
            if not self._closed:
                self._lock.wait(max(0.0, min(self._wake - time.monotonic(), 1.0)))

    def settle(
        self, key: bytes, reply: dict[str, Any]
    ) -> Literal["answered", "chunk", "busy", "duplicate"]:
        """Match one reply to its request: a new chunk goes to ``on_chunk`` (and pushes the
        re-send back), a ``busy`` reply is re-sent after the request's busy wait while it has
        re-sends left, the final reply resolves the future; a reply to no request in flight
        is a duplicate. Returns which it was."""
        chunk = "chunk" in reply
        deliver = None
        with self._lock:
            item = self._pending.get(key)
            if item is None:
                return "duplicate"
            if chunk:  # a generation streams: not the final message yet
                number = reply["chunk"]
                if isinstance(number, int) and number >= item.next_chunk:
                    item.next_chunk = number + 1
                    deliver = item.on_chunk
                item.next_send = max(item.next_send, time.monotonic() + item.wait_s)
            else:
                error = reply.get("error")
                code = error.get("code") if isinstance(error, dict) else None
                if code == proto.BUSY and item.busy_wait_s > 0 and item.resends_left > 0:
                    item.next_send = time.monotonic() + item.busy_wait_s  # back-pressure: wait
                    item.busy_wait_s *= 2
                    self._lock.notify_all()
                    return "busy"
                del self._pending[key]
        if not chunk:
            item.future.set_result(reply)
            return "answered"
        if deliver is not None:
            deliver(reply)
        return "chunk"


def total_wait_s(attempt_timeout_s: float, retries: int, backoff: float) -> float:
    """How long the client waits in all before it gives up: every attempt's wait (at most
    MQTT's largest expiry, so that a huge ``retries`` costs no time and overflows nothing)."""
    if backoff == 1:
        return min(attempt_timeout_s * (retries + 1), float(_MAX_EXPIRY_S))
    total_s, wait_s = 0.0, attempt_timeout_s
    for _ in range(retries + 1):
        total_s += wait_s
        if not total_s < _MAX_EXPIRY_S:
            return float(_MAX_EXPIRY_S)
        wait_s *= backoff
    return total_s


def request_expiry_s(timeout_ms: float | None, deadline_ms: float | None, waits_s: float) -> float:
    """Seconds until a request's answer is useless: its timeout or deadline, else ``waits_s``
    (when the client gives up). Bad values are the bridge's to refuse: the client's own
    bound then."""
    if isinstance(timeout_ms, int | float) and math.isfinite(timeout_ms) and timeout_ms > 0:
        return min(float(timeout_ms) / 1e3, waits_s)
    if isinstance(deadline_ms, int | float) and math.isfinite(deadline_ms):
        left_s = (float(deadline_ms) - time.time() * 1e3) / 1e3
        return min(max(left_s, 0.0), waits_s)
    return waits_s
