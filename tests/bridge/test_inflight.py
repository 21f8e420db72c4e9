"""The client's table of requests in flight, without a broker: re-sends back off and run out,
chunks arrive once and in order, ``busy`` is re-sent later, a second answer is a duplicate."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest

from edgeinfer.bridge.inflight import Inflight, Pending, request_expiry_s, total_wait_s
from edgeinfer.errors import ConfigError, RequestTimeoutError


def _pending(key: bytes, *, resends: int = 1, due_in_s: float = 0.0, **kw: Any) -> Pending:
    now = time.monotonic()
    return Pending("t/req", b"{}", key, None, Future(), next_send=now + due_in_s, wait_s=4.0,
                   resends_left=resends, backoff=2.0, busy_wait_s=kw.pop("busy_wait_s", 0.5),
                   expires_at=now + 60, **kw)  # fmt: skip


def test_a_request_is_re_sent_with_a_longer_wait_then_fails() -> None:
    table = Inflight()
    item = _pending(b"a", resends=1)
    table.add(item)
    assert table.take_due() == [item]
    assert (item.attempts, item.wait_s, item.resends_left) == (2, 8.0, 0)
    item.next_send = time.monotonic()  # its wait is over
    assert table.take_due() == []
    with pytest.raises(RequestTimeoutError, match="after 2 attempt"):
        item.future.result(timeout=0)


def test_chunks_go_out_once_busy_waits_and_the_answer_settles_once() -> None:
    table = Inflight()
    chunks: list[int] = []
    item = _pending(b"g", due_in_s=30, on_chunk=lambda c: chunks.append(c["chunk"]))
    table.add(item)
    assert [table.settle(b"g", {"chunk": n}) for n in (0, 1, 1)] == ["chunk"] * 3
    assert chunks == [0, 1]
    assert table.settle(b"g", {"ok": False, "error": {"code": "busy"}}) == "busy"
    assert item.busy_wait_s == 1.0 and not item.future.done()
    assert table.settle(b"g", {"ok": True}) == "answered"
    assert item.future.result(timeout=0) == {"ok": True}
    assert table.settle(b"g", {"ok": True}) == "duplicate"


def test_an_id_in_flight_and_a_closed_table_are_refused() -> None:
    table = Inflight()
    item = _pending(b"x", due_in_s=30)
    table.add(item)
    with pytest.raises(ConfigError, match="in flight"):
        table.add(_pending(b"x"))
    assert table.close() and not table.close()
    with pytest.raises(RequestTimeoutError, match="closed"):
        item.future.result(timeout=0)
    assert table.take_due() is None
    with pytest.raises(ConfigError, match="closed"):
        table.add(_pending(b"y"))


def test_the_expiry_is_the_deadline_or_every_wait() -> None:
    assert total_wait_s(1.0, 2, 2.0) == 7.0
    assert total_wait_s(1.0, 10**10, 1.0) == 2**32 - 1
    assert request_expiry_s(500, None, 7.0) == 0.5
    assert request_expiry_s(None, None, 7.0) == 7.0
    assert request_expiry_s(float("nan"), time.time() * 1e3 - 10, 7.0) == 0.0
