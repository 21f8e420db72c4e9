"""Dynamic micro-batching: texts from concurrent calls are gathered and run as one batch.

Callers (threads, the MQTT bridge's workers) ``submit`` token-id rows and block until their
rows are answered. Worker threads (``workers``, one by default) form batches: a batch runs
as soon as one length bucket holds ``max_batch_size`` rows, or when the oldest waiting row has
waited ``max_wait_ms``, and then takes that row's bucket (oldest first). Grouping by length
bucket keeps padding waste under one bucket width per row ("static batching by length", done
dynamically). With
``adaptive_wait`` a row does not wait for company that is not coming: while the last batch
and the queue held one caller's rows only, a due bucket runs at once. Each answer carries its
queue time (submit -> batch start) and compute time (the batch's run).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from edgeinfer.config import BatchConfig
from edgeinfer.errors import InferenceError

__all__ = ["BatchedAnswer", "DynamicBatcher", "pad_rows"]

log = logging.getLogger(__name__)

V = TypeVar("V")


def pad_rows(rows: Sequence[np.ndarray], *, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad 1-D token-id rows to ``input_ids`` [B, S] and ``attention_mask`` [B, S] (S: longest)."""
    seq = max(row.shape[0] for row in rows)
    ids = np.full((len(rows), seq), pad_id, dtype=rows[0].dtype)  # [B, S]
    mask = np.zeros((len(rows), seq), dtype=rows[0].dtype)  # [B, S]
    for i, row in enumerate(rows):
        ids[i, : row.shape[0]] = row
        mask[i, : row.shape[0]] = 1
    return ids, mask


@dataclass(frozen=True)
class BatchedAnswer(Generic[V]):
    """One row's answer with its queue and compute time."""

    value: V
    queue_ms: float
    compute_ms: float
    batch_size: int


@dataclass
class _Job(Generic[V]):
    """One ``submit`` call: its rows' answers, filled in by the worker."""

    answers: list[BatchedAnswer[V] | None]
    remaining: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(frozen=True)
class _Entry(Generic[V]):
    job: _Job[V]
    index: int
    row: np.ndarray
    arrived_s: float


class DynamicBatcher(Generic[V]):
    """Gather rows from concurrent callers into batches and run them on one worker thread.

    Args:
        run: rows (1-D token ids) -> one value per row, in order; runs on the worker thread.
        config: batch size, wait and bucket width.
        name: the worker thread's name (for logs and debuggers).
    """

    def __init__(
        self,
        run: Callable[[list[np.ndarray]], list[V]],
        *,
        config: BatchConfig,
        name: str = "edgeinfer-batcher",
    ) -> None:
        self._run = run
        self.config = config
        self._cond = threading.Condition()
        self._buckets: dict[int, deque[_Entry[V]]] = {}
        self._closed = False
        self._company = False  # more than one caller in the last batch or the queue
        self._workers = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(config.workers)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, rows: Sequence[np.ndarray]) -> list[BatchedAnswer[V]]:
        """Queue ``rows``, block until all are answered, return their answers in order.

        Raises:
            InferenceError: the batch failed (the cause is chained) or the batcher is closed.
        """
        if not rows:
            return []
        job: _Job[V] = _Job(answers=[None] * len(rows), remaining=len(rows))
        now = time.perf_counter()
        with self._cond:
            if self._closed:
                raise InferenceError("the model is closed")
            for index, row in enumerate(rows):
                bucket = (row.shape[0] - 1) // self.config.bucket_tokens
                self._buckets.setdefault(bucket, deque()).append(_Entry(job, index, row, now))
            self._cond.notify()
        job.done.wait()
        if job.error is not None:
            if isinstance(job.error, InferenceError):
                raise job.error
            raise InferenceError(f"batched inference failed: {job.error}") from job.error
        return [a for a in job.answers if a is not None]

    def close(self) -> None:
        """Stop the workers; rows still queued fail with ``InferenceError``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.join(timeout=5.0)

    def _next_batch(self) -> list[_Entry[V]] | None:
        """Under the lock: wait until a batch is due and take it (``None``: closed)."""
        max_wait_s = self.config.max_wait_ms / 1e3
        while True:
            if self._closed:
                return None
            heads = [(q[0].arrived_s, b) for b, q in self._buckets.items() if q]
            if not heads:
                self._cond.wait()
                continue
            full = [(t, b) for t, b in heads if len(self._buckets[b]) >= self.config.max_batch_size]
            oldest_s, bucket = min(full or heads)
            wait_s = oldest_s + max_wait_s - time.perf_counter()
            alone = self.config.adaptive_wait and not self._company and not self._callers(2)
            if full or wait_s <= 0 or alone:
                queue = self._buckets[bucket]
                take = min(len(queue), self.config.max_batch_size)
                batch = [queue.popleft() for _ in range(take)]
                self._company = len({id(e.job) for e in batch}) > 1 or self._callers(2)
                return batch
            self._cond.wait(timeout=wait_s)

    def _callers(self, at_least: int) -> bool:
        """Under the lock: whether the queue holds rows of ``at_least`` different calls."""
        seen: set[int] = set()
        for queue in self._buckets.values():
            for entry in queue:
                seen.add(id(entry.job))
                if len(seen) >= at_least:
                    return True
        return False

    def _loop(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
            if batch is None:
                break
            started = time.perf_counter()
            try:
                values = self._run([e.row for e in batch])
                error: BaseException | None = None
            except BaseException as exc:  # handed to every waiting caller, never lost
                values, error = [], exc
            compute_ms = (time.perf_counter() - started) * 1e3
            with self._cond:  # a call's rows may be answered by several workers
                self._answer(batch, values, error, started, compute_ms)
        self._fail_pending()

    def _answer(
        self,
        batch: list[_Entry[V]],
        values: list[V],
        error: BaseException | None,
        started: float,
        compute_ms: float,
    ) -> None:
        """Under the lock: hand a batch's answers (or its error) to the waiting calls."""
        for i, entry in enumerate(batch):
            job = entry.job
            if error is not None:
                job.error = error
                job.done.set()
                continue
            job.answers[entry.index] = BatchedAnswer(
                values[i], (started - entry.arrived_s) * 1e3, compute_ms, len(batch)
            )
            job.remaining -= 1
            if job.remaining == 0:
                job.done.set()

    def _fail_pending(self) -> None:
        with self._cond:
            for queue in self._buckets.values():
                for entry in queue:
                    entry.job.error = InferenceError("the model was closed before this ran")
                    entry.job.done.set()
                queue.clear()
