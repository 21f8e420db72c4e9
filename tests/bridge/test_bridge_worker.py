"""The worker alone (no broker): concurrent duplicates run once, and stop() drains the queue."""

from __future__ import annotations

import json
import threading

from bridge_harness import CountingModel

import edgeinfer
from edgeinfer.bridge.serve.worker import Outgoing, Worker, epoch_ms
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.kinds import TextInput


def request(i: int, *, ident: str | None = None) -> proto.Request:
    return proto.Request(
        id=ident or f"id-{i}",
        model="minilm",
        kind="text",
        input=TextInput((f"text {i}",)),
        reply_to="r",
        correlation=str(i).encode(),
        received_ms=epoch_ms(),
    )


def test_concurrent_duplicates_run_the_model_once(real_model: edgeinfer.Model) -> None:
    counting = CountingModel(real_model)
    sent: list[Outgoing] = []
    lock = threading.Lock()

    def send(out: Outgoing) -> None:
        with lock:
            sent.append(out)

    worker = Worker({"minilm": counting}, send=send, max_queue=1000)
    worker.start()
    distinct, copies = 40, 5

    def submitter() -> None:
        for i in range(distinct):
            worker.submit(request(i))

    threads = [threading.Thread(target=submitter) for _ in range(copies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worker.stop()
    replies = [json.loads(o.payload) for o in sent]
    assert all(r["ok"] for r in replies)
    assert sorted(counting.texts) == sorted(f"text {i}" for i in range(distinct))
    assert set(counting.texts.values()) == {1}
    counts = worker.counts
    assert counts["ok"] == distinct
    # every copy was either answered (computed or replayed) or dropped while its twin ran
    assert len(sent) + counts["duplicate_dropped"] == distinct * copies
    assert len(sent) == counts["ok"] + counts["duplicate_replayed"]


def test_stop_answers_what_is_queued(real_model: edgeinfer.Model) -> None:
    counting = CountingModel(real_model)
    sent: list[Outgoing] = []
    worker = Worker({"minilm": counting}, send=sent.append, max_queue=4)
    worker.start()
    worker.pause()
    for i in range(3):
        worker.submit(request(i))
    assert worker.queue_depth == 3 and counting.calls == 0
    worker.stop()
    assert counting.calls == 3 and len(sent) == 3
    assert worker.snapshot()["latency_ms"]["compute_ms"]["p50"] is not None
