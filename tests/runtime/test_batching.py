"""Dynamic batching: rows from concurrent callers are batched by length bucket, answered in
order with queue and compute time, failures reach every caller."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer import BatchConfig
from edgeinfer.errors import InferenceError
from edgeinfer.runtime.batching import DynamicBatcher, pad_rows


class Recorder:
    """A run function that answers each row with its sum and records every batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []  # row lengths per batch
        self.lock = threading.Lock()
        self.fail_on: int | None = None

    def __call__(self, rows: list[np.ndarray]) -> list[int]:
        with self.lock:
            self.batches.append([row.shape[0] for row in rows])
        if any(int(row[0]) == self.fail_on for row in rows):
            raise RuntimeError("boom")
        return [int(row.sum()) for row in rows]


def test_pad_rows_pads_to_the_longest_row() -> None:
    ids, mask = pad_rows([np.array([1, 2, 3]), np.array([4])], pad_id=0)
    np.testing.assert_array_equal(ids, [[1, 2, 3], [4, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 0, 0]])


def test_concurrent_callers_share_batches_within_one_length_bucket() -> None:
    recorder = Recorder()
    config = BatchConfig(max_batch_size=4, max_wait_ms=20.0, bucket_tokens=8)
    batcher = DynamicBatcher(recorder, config=config)
    lengths = [3, 5, 12, 14, 2, 7, 9, 16] * 4

    def call(i: int) -> list[int]:
        rows = [np.full(lengths[i], i + 1), np.full(lengths[-1 - i], i + 1)]
        answers = batcher.submit(rows)
        assert all(a.queue_ms >= 0 and a.compute_ms >= 0 and a.batch_size >= 1 for a in answers)
        return [a.value for a in answers]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(len(lengths))))
    for i, values in enumerate(results):
        assert values == [(i + 1) * lengths[i], (i + 1) * lengths[-1 - i]]
    assert all(len(b) <= 4 for b in recorder.batches)
    assert all(len({(n - 1) // 8 for n in b}) == 1 for b in recorder.batches)
    assert sum(len(b) for b in recorder.batches) == 2 * len(lengths)
    assert max(len(b) for b in recorder.batches) > 1  # callers really were batched together
    batcher.close()


def test_a_full_bucket_runs_without_waiting_for_max_wait() -> None:
    recorder = Recorder()
    batcher = DynamicBatcher(recorder, config=BatchConfig(max_batch_size=3, max_wait_ms=60_000))
    done = threading.Event()
    answers: list[object] = []

    def call() -> None:
        answers.extend(batcher.submit([np.array([1]), np.array([2]), np.array([3])]))
        done.set()

    threading.Thread(target=call, daemon=True).start()
    assert done.wait(timeout=30)  # a minute's max_wait would fail this
    assert recorder.batches == [[1, 1, 1]] and len(answers) == 3
    batcher.close()


def test_adaptive_wait_skips_max_wait_for_a_lone_caller_only() -> None:
    """One caller at a time never waits for company that is not coming; with
    adaptive_wait=False the same lone row waits until the batch fills."""
    minute = 60_000.0  # a lone row that waited this long would fail the test by timing out
    recorder = Recorder()
    batcher = DynamicBatcher(recorder, config=BatchConfig(max_batch_size=4, max_wait_ms=minute))
    for i in range(3):
        (answer,) = batcher.submit([np.array([i + 1])])
        assert answer.value == i + 1 and answer.batch_size == 1
    assert recorder.batches == [[1], [1], [1]]
    batcher.close()

    recorder = Recorder()
    config = BatchConfig(max_batch_size=4, max_wait_ms=minute, adaptive_wait=False)
    waiting = DynamicBatcher(recorder, config=config)
    done = threading.Event()
    threading.Thread(target=lambda: (waiting.submit([np.array([1])]), done.set())).start()
    assert not done.wait(timeout=0.5)  # still waiting for company
    waiting.submit([np.array([2]), np.array([3]), np.array([4])])  # fills the batch
    assert done.wait(timeout=30) and recorder.batches == [[1, 1, 1, 1]]
    waiting.close()


def test_workers_run_batches_at_once_and_split_calls_are_answered_whole() -> None:
    """Two workers: two batches are in flight together (each waits for the other at a
    barrier, which one worker could never pass), and a call whose rows went to different
    workers gets every answer in order."""
    barrier = threading.Barrier(2, timeout=30)
    recorder = Recorder()

    def meet(rows: list[np.ndarray]) -> list[int]:
        if int(rows[0][0]) < 0:
            barrier.wait()
        return recorder(rows)

    config = BatchConfig(max_batch_size=1, max_wait_ms=0, workers=2)
    batcher = DynamicBatcher(meet, config=config)
    with ThreadPoolExecutor(2) as pool:
        pair = list(pool.map(lambda v: batcher.submit([np.array([v])])[0].value, [-1, -2]))
    assert pair == [-1, -2]
    rows = [np.full(n, n) for n in range(1, 9)]
    assert [a.value for a in batcher.submit(rows)] == [n * n for n in range(1, 9)]
    batcher.close()


def test_a_failed_batch_reaches_its_callers_and_the_batcher_goes_on() -> None:
    recorder = Recorder()
    recorder.fail_on = 7
    batcher = DynamicBatcher(recorder, config=BatchConfig(max_wait_ms=0))
    with pytest.raises(InferenceError, match="boom"):
        batcher.submit([np.array([7, 1])])
    assert [a.value for a in batcher.submit([np.array([1, 2])])] == [3]
    batcher.close()
    with pytest.raises(InferenceError, match="closed"):
        batcher.submit([np.array([1])])


def test_batched_model_matches_unbatched_and_reports_timings(minilm_fp32: Path) -> None:
    texts = [f"Sentence number {i} about {'markets ' * (i % 5)}and weather." for i in range(24)]
    reference = edgeinfer.load(minilm_fp32).embed(texts, batch_size=1)
    model = edgeinfer.load(minilm_fp32, batching=BatchConfig(max_batch_size=8, max_wait_ms=5))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda t: model.embed_with_info(t)[0], texts))
    # fp32: padding and batch composition change results only at float rounding level.
    np.testing.assert_allclose(np.stack([r.vector for r in results]), reference, atol=1e-5)
    assert all(r.compute_ms > 0 and r.queue_ms >= 0 and not r.cached for r in results)
    latency = model.metrics().latency_ms["embed"]
    assert latency["queue"].count == latency["compute"].count == 24
    assert latency["end_to_end"].count == 24
    model.close()
