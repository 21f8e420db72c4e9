"""A deploy's trial on the device: the new package serves, the previous one runs in its shadow.

``TrialModel`` is what the model table serves during the trial: every request is answered by
the new package (timed, its errors counted); a bounded share of them is handed to a shadow
thread that answers it again with the previous package (still loaded) and compares the two
answers (``trial_policy.agree``). The shadow never delays a reply: it runs after the answer,
on its own thread, from a queue of ``_SHADOW_QUEUE`` that drops what it cannot take, and only
while the previous package's compute stays within ``shadow_share`` of the new one's.

The verdict comes once (``on_verdict``), from the shadow thread, which also wakes every
``_TICK_S`` to judge a trial without traffic:

- ``trial_errors``: the new package failed more than ``max_error_rate`` of its requests;
- ``trial_latency``: its p99 exceeds ``max_p99_ratio`` times the previous package's p99 on the
  same requests (judged from ``_P99_MIN_PAIRS`` compared requests on);
- ``trial_agreement``: fewer than ``min_agreement`` of the compared answers agreed;
- ``trial_no_traffic``: ``max_window_s`` passed without enough evidence to pass;
- ``passed``: ``window_s`` passed with ``min_requests`` served and ``min_shadow`` compared,
  every signal within its threshold.

A failing signal ends the trial as soon as its own minimum count is reached.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgeinfer.bridge.ota.trial_policy import TrialPolicy, agree
from edgeinfer.errors import InputError

__all__ = ["TrialModel", "Verdict"]

log = logging.getLogger(__name__)

_SHADOW_QUEUE = 4  # requests waiting for the shadow; more are not compared (never waited for)
_TICK_S = 0.2  # how often a quiet trial is judged (its windows are seconds to minutes)
# A p99 of fewer pairs is its few slowest requests: one stall of a loaded device would fail it.
_P99_MIN_PAIRS = 100
_COMPARED = frozenset({"embed_with_info", "classify", "detect", "run"})


@dataclass(frozen=True)
class Verdict:
    """How a trial ended, and what it saw."""

    passed: bool
    reason: str  # passed, trial_errors, trial_latency, trial_agreement, trial_no_traffic
    requests: int
    errors: int
    shadowed: int
    agreement: float | None
    p99_new_ms: float | None
    p99_old_ms: float | None
    shadow_compute_share: float | None  # the previous package's compute over the new one's
    elapsed_s: float

    def fields(self) -> dict[str, Any]:
        """For a status: the signals and counts."""
        return asdict(self)


def _p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


class _Evidence:
    """What a trial saw so far (under its lock)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.new_ms: list[float] = []  # of the requests the shadow compared, paired with old_ms
        self.old_ms: list[float] = []
        self.items = 0
        self.agreed = 0
        self.served_s = 0.0
        self.shadow_s = 0.0

    @property
    def shadowed(self) -> int:
        return len(self.old_ms)

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.items if self.items else None


class TrialModel:
    """Serve ``new`` in a trial against ``previous`` with ``policy``; ``on_verdict`` once.

    Other attributes (``task``, ``manifest``, a generator's ``stream``) are the new model's.
    ``clock_s`` times the window; ``timer_s`` each call of either package (their latencies).
    """

    def __init__(
        self,
        new: Any,
        previous: Any,
        *,
        policy: TrialPolicy,
        on_verdict: Callable[[TrialModel, Verdict], None],
        clock_s: Callable[[], float] = time.monotonic,
        timer_s: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.new, self.previous, self.policy = new, previous, policy
        self._on_verdict, self._clock, self._timer = on_verdict, clock_s, timer_s
        self._started = clock_s()
        self._seen = _Evidence()
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[str, tuple[Any, ...], dict[str, Any], Any, float]] = (
            queue.Queue(_SHADOW_QUEUE)
        )
        self._done = threading.Event()
        self.verdict: Verdict | None = None
        self._thread = threading.Thread(target=self._shadow_loop, name="edgeinfer-trial")
        self._thread.daemon = True  # a bridge that exits mid-trial rolls back at its next start
        self._thread.start()

    def __getattr__(self, name: str) -> Any:
        if name in _COMPARED:
            return lambda *args, **kwargs: self._serve(name, args, kwargs)
        return getattr(self.new, name)

    @property
    def task(self) -> str:
        """The new package's task."""
        return str(self.new.task)

    @property
    def manifest(self) -> Any:
        """The new package's manifest."""
        return self.new.manifest

    def close(self) -> None:
        """End the shadow thread (no verdict after this)."""
        self._done.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    # -- the serving threads ----------------------------------------------------------------
    def _serve(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t0 = self._timer()
        try:
            answer = getattr(self.new, method)(*args, **kwargs)
        except InputError:
            raise  # the caller's request: the previous package would refuse it as well
        except Exception:
            with self._lock:
                self._seen.requests += 1
                self._seen.errors += 1
            raise
        took_s = self._timer() - t0
        with self._lock:
            seen = self._seen
            seen.requests += 1
            seen.served_s += took_s
            shadow = (
                not self._done.is_set()
                and not (method == "run" and kwargs.get("stream") is not None)  # its state
                and seen.shadow_s <= self.policy.shadow_share * seen.served_s
                and self.policy.shadow_share > 0
            )
        if shadow:
            try:
                self._jobs.put_nowait((method, args, kwargs, answer, took_s * 1e3))
            except queue.Full:
                pass  # the shadow is busy: this one is not compared
        return answer

    # -- the shadow thread ------------------------------------------------------------------
    def _shadow_loop(self) -> None:
        while not self._done.is_set():
            try:
                job = self._jobs.get(timeout=_TICK_S)
            except queue.Empty:
                job = None
            if job is not None:
                self._compare(*job)
            verdict = self._judge()
            if verdict is not None:
                self.verdict = verdict
                self._done.set()
                log.info("trial of %s: %s", self.new.manifest.digest[:12], verdict)
                self._on_verdict(self, verdict)

    def _compare(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], new: Any, new_ms: float
    ) -> None:
        t0 = self._timer()
        try:
            old = getattr(self.previous, method)(*args, **kwargs)
        except Exception as exc:  # the previous package cannot answer it: nothing to compare
            log.debug("the previous package failed a shadowed request: %s", exc)
            return
        took_s = self._timer() - t0
        same = agree(method, new, old, self.policy)
        with self._lock:
            seen = self._seen
            seen.shadow_s += took_s
            seen.new_ms.append(new_ms)
            seen.old_ms.append(took_s * 1e3)
            seen.items += len(same)
            seen.agreed += sum(same)

    def _judge(self) -> Verdict | None:
        policy, elapsed_s = self.policy, self._clock() - self._started
        with self._lock:
            seen = self._seen
            p99_new, p99_old = _p99(seen.new_ms), _p99(seen.old_ms)
            share = seen.shadow_s / seen.served_s if seen.served_s else None

            def verdict(passed: bool, reason: str) -> Verdict:
                return Verdict(
                    passed, reason, seen.requests, seen.errors, seen.shadowed, seen.agreement,
                    p99_new, p99_old, share, round(elapsed_s, 3),
                )  # fmt: skip

            served_enough = seen.requests >= max(1, policy.min_requests)
            compared_enough = seen.shadowed >= policy.min_shadow
            if served_enough and seen.errors > policy.max_error_rate * seen.requests:
                return verdict(False, "trial_errors")
            if seen.shadowed and compared_enough and seen.items:
                if seen.agreed < policy.min_agreement * seen.items:
                    return verdict(False, "trial_agreement")
                if seen.shadowed >= _P99_MIN_PAIRS and p99_new is not None and p99_old:
                    if p99_new > policy.max_p99_ratio * p99_old:
                        return verdict(False, "trial_latency")
            if served_enough and compared_enough and elapsed_s >= policy.window_s:
                return verdict(True, "passed")
            if elapsed_s >= policy.max_window_s:
                return verdict(False, "trial_no_traffic")
        return None
