"""Fair queues: round robin per reply address, push-out when full, optional per-client caps."""

from __future__ import annotations

import json
import threading
from collections import Counter

from fake_models import FakeEncoder
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.bridge.serve.fairness import FairQueue
from edgeinfer.bridge.serve.replies import Outgoing, epoch_ms
from edgeinfer.bridge.serve.worker import Worker
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto


def test_round_robin_serves_one_of_each_client_in_turn() -> None:
    queue: FairQueue[str] = FairQueue(100)
    for i in range(5):
        queue.push("flood", f"f{i}")
    queue.push("quiet", "q0")
    queue.push("other", "o0")
    assert [queue.pop() for _ in range(4)] == ["f0", "q0", "o0", "f1"]
    assert list(queue) == ["f2", "f3", "f4"] and len(queue) == 3


def test_a_full_queue_pushes_out_the_longest_clients_newest() -> None:
    queue: FairQueue[str] = FairQueue(3)
    assert all(queue.push("flood", f"f{i}").queued for i in range(3))
    assert not queue.push("flood", "f3").queued  # its own share: refused
    admitted = queue.push("quiet", "q0")
    assert admitted.queued and admitted.pushed_out == "f2"
    assert not queue.push("quiet", "q1").queued  # 2 vs 1 + 1: no one holds more than its share


def test_the_per_client_cap_counts_requests_in_flight_until_done() -> None:
    queue: FairQueue[str] = FairQueue(10, max_client=2)
    assert queue.push("a", "a0").queued and queue.push("a", "a1").queued
    refused = queue.push("a", "a2")
    assert not refused.queued and refused.capped
    assert queue.pop() == "a0"  # running: still in flight
    assert queue.push("a", "a2").capped
    queue.done("a")
    assert queue.push("a", "a2").queued and queue.push("b", "b0").queued


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=60))
def test_no_client_waits_behind_two_of_another(ops: list[tuple[str, bool]]) -> None:
    """While a client waits, no other client is served twice."""
    queue: FairQueue[tuple[str, int]] = FairQueue(8)
    served_while_waiting: dict[str, Counter[str]] = {}
    for n, (client, pop) in enumerate(ops):
        if not pop:
            queue.push(client, (client, n))
        elif queue:
            who, _ = queue.pop()
            queue.done(who)
            served_while_waiting.pop(who, None)
            for other in {c for c, _ in queue} - {who}:
                served = served_while_waiting.setdefault(other, Counter())
                served[who] += 1
                assert served[who] <= 1, (other, who)
        waiting = {c for c, _ in queue}
        for gone in set(served_while_waiting) - waiting:
            del served_while_waiting[gone]


def test_a_client_at_its_cap_gets_busy_while_another_is_served() -> None:
    sent: list[Outgoing] = []
    lock = threading.Lock()

    def send(out: Outgoing) -> None:
        with lock:
            sent.append(out)

    worker = Worker({"enc": FakeEncoder()}, send=send, max_queue=64, max_client_requests=2)
    worker.start()
    worker.pause()
    for i in range(4):
        worker.submit(_text(i, "edgeinfer/clients/flood/reply"))
    worker.submit(_text(9, "edgeinfer/clients/quiet/reply"))
    worker.stop()
    codes = {
        json.loads(o.payload)["id"]: json.loads(o.payload).get("error", {}).get("code")
        for o in sent
    }
    assert codes == {"t0": None, "t1": None, "t2": "busy", "t3": "busy", "t9": None}


def _text(i: int, reply_to: str) -> proto.Request:
    return proto.Request(
        id=f"t{i}",
        model="enc",
        kind="text",
        input=kinds.TextInput((f"text {i}",)),
        reply_to=reply_to,
        received_ms=epoch_ms(),
    )
