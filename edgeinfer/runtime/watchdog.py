"""The compute bound of every onnxruntime run: a run past its limit is stopped, not waited for.

A signed package can hang only on some inputs (a ``Loop`` whose trip count is an input value):
without a bound, such a request holds its thread for ever. Every run (``GraphSession.run``, the
decoders' IO-binding runs) goes through ``RunLimit.call``: it hands onnxruntime fresh
``RunOptions`` and arms them on the process's one ``Watchdog`` thread, which sets their
``terminate`` flag when the limit passes. The limit is the earlier of
``RuntimeConfig.run_timeout_s`` and the caller's own deadline (``deadline(at_s=...)``, which the
bridge sets from a request's ``deadline_ms``).

What onnxruntime 1.32 honours (checked by tests/runtime/test_watchdog.py): the flag is read
before every node, and by ``Loop`` and ``Scan`` before every iteration of their body, so a
loop driven by an input stops within one iteration of the limit; the session stays usable. It
is not read inside one kernel: a single huge op (a ``MatMul`` over an ``Expand`` of an input
size) ends that op first, so the bound is the limit plus the longest single kernel.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from edgeinfer.errors import RunTimeoutError

__all__ = ["RunLimit", "Watchdog", "armed_runs", "deadline"]

T = TypeVar("T")

# The caller's deadline on time.monotonic()'s clock; contextual, so it follows the call down
# to the sessions without a parameter on every model method, and never leaks to other threads.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "edgeinfer_run_deadline", default=None
)


@contextmanager
def deadline(*, at_s: float | None) -> Iterator[None]:
    """Runs inside the block stop at ``at_s`` (``time.monotonic()`` seconds; ``None``: no
    deadline of the caller's), or at ``RuntimeConfig.run_timeout_s`` when that is earlier.
    A run that would start after ``at_s`` raises ``RunTimeoutError`` without running."""
    token = _DEADLINE.set(at_s)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


class _Armed:
    """One armed run: its ``RunOptions``, whether it finished, whether the watchdog fired."""

    __slots__ = ("done", "fired", "options")

    def __init__(self, options: Any) -> None:
        self.options = options
        self.done = False
        self.fired = False


class Watchdog:
    """One thread over a heap of deadlines: it sets ``terminate`` on the runs whose deadline
    passed. Arming and disarming are a heap push and a flag (no thread per call); the thread
    is woken only when a new deadline is earlier than the one it sleeps until."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Armed]] = []
        self._order = itertools.count()  # ties on a deadline never compare _Armed
        self._lock = threading.Lock()  # taken directly on the hot path: a C-level with
        self._cond = threading.Condition(self._lock)  # the thread sleeps on it
        self._wake_at = float("inf")  # when the thread wakes next (inf: only when notified)
        self._thread: threading.Thread | None = None

    def arm(self, options: Any, *, at_s: float) -> _Armed:
        """Set ``options.terminate`` at ``at_s`` (``time.monotonic()``) unless disarmed first."""
        armed = _Armed(options)
        with self._lock:
            heapq.heappush(self._heap, (at_s, next(self._order), armed))
            if self._thread is None:
                self._start()
            if at_s < self._wake_at:
                self._cond.notify()
        return armed

    def disarm(self, armed: _Armed) -> None:
        """The run ended: it is never terminated now; finished runs at the top leave the heap."""
        with self._lock:
            armed.done = True
            self._drop_done()

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)

    def _drop_done(self) -> None:
        heap = self._heap
        while heap and heap[0][2].done:
            heapq.heappop(heap)

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-watchdog", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with self._cond:
            while True:
                self._fire_due(time.monotonic())
                self._wake_at = self._heap[0][0] if self._heap else float("inf")
                timeout = None if not self._heap else max(0.0, self._wake_at - time.monotonic())
                self._cond.wait(timeout)

    def _fire_due(self, now: float) -> None:
        heap = self._heap
        while heap and (heap[0][2].done or heap[0][0] <= now):
            armed = heapq.heappop(heap)[2]
            if not armed.done:
                armed.fired = True
                armed.options.terminate = True  # onnxruntime stops at its next check

    def _after_fork(self) -> None:
        """A forked child has no watchdog thread: start a fresh one on its first run."""
        self._heap, self._thread = [], None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._wake_at = float("inf")


# The process's one watchdog thread, shared by every session (started on the first armed run):
# one thread however many models are loaded. Reset in a forked child, which has no threads.
_WATCHDOG = Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG._after_fork)


def armed_runs() -> int:
    """Deadlines the process's watchdog holds now: running calls, plus finished ones still
    under an earlier running one (they leave when it does)."""
    return len(_WATCHDOG)


class RunLimit:
    """The compute bound of one graph's runs.

    Args:
        timeout_s: the longest one run may take (``RuntimeConfig.run_timeout_s``); ``None``:
            only the caller's deadline bounds it.
        graph: the graph's file name, for the error message.
    """

    def __init__(self, *, timeout_s: float | None, graph: str) -> None:
        import onnxruntime as ort

        self.timeout_s = timeout_s
        self.graph = graph
        self._options = ort.RunOptions
        self._watchdog = _WATCHDOG

    def _limit(self, now: float) -> tuple[float, str] | None:
        """(the monotonic time the run stops at, which limit that is), or None: unbounded."""
        at = _DEADLINE.get()
        if self.timeout_s is not None and (at is None or now + self.timeout_s < at):
            return now + self.timeout_s, "run_timeout_s"
        return None if at is None else (at, "deadline")

    def call(self, run: Callable[[Any], T], *, options: Callable[[Any], None] | None = None) -> T:
        """``run(run_options)`` under the limit; ``options`` adds entries to fresh options
        (``None`` options when nothing bounds the run and nothing is added). Raises
        ``RunTimeoutError`` when the watchdog stopped it; other errors pass through."""
        now = time.monotonic()
        limit = self._limit(now)
        if limit is None:
            return run(self._fresh(options) if options is not None else None)
        at, source = limit
        if at <= now:
            raise RunTimeoutError(graph=self.graph, limit_s=0.0, source=source, ran=False)
        run_options = self._fresh(options)
        armed = self._watchdog.arm(run_options, at_s=at)
        try:
            return run(run_options)
        except Exception as exc:
            if armed.fired:
                raise RunTimeoutError(
                    graph=self.graph, limit_s=at - now, source=source, ran=True
                ) from exc
            raise
        finally:
            self._watchdog.disarm(armed)

    def _fresh(self, options: Callable[[Any], None] | None) -> Any:
        run_options = self._options()  # one per run: a flag set late can never stop the next
        if options is not None:
            options(run_options)
        return run_options
