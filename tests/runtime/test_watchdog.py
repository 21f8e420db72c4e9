"""Every graph run is bounded: a package whose ``Loop`` runs for ever on one input is stopped at
``RuntimeConfig.run_timeout_s`` or at the caller's deadline, raises ``RunTimeoutError``, and the
same model answers the next call; other callers are answered meanwhile.

Real onnxruntime on the fast lane's spinner (tests/fast_packages.py). A call that could hang
runs in a thread joined with a bound, so the old code (no bound) fails the test, never hangs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import ConfigError, InferenceError, RunTimeoutError
from edgeinfer.runtime import watchdog

X = np.arange(4, dtype=np.float32)[None]  # [1, 4]
QUIET = {"x": X, "spin": np.zeros(1, np.int64)}
ENDLESS = {"x": X, "spin": np.ones(1, np.int64)}
LIMIT_S = 0.5
# How long a stopped run may take to come back before the test calls it hung: generous, the
# machine running the tests may be loaded; only a run that is never stopped gets near it.
HANG_S = 120.0


def _bounded(call: Callable[[], Any]) -> BaseException | Any:
    """``call()`` in a thread joined within HANG_S: what it returned or raised."""
    result: list[Any] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)  # a hung run must not block exit
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"the run was not stopped within {HANG_S} s: it hangs"
    return result[0]


def _load(package: Path, **fields: Any) -> Any:
    return edgeinfer.load(package, config=edgeinfer.RuntimeConfig(spin_wait=False, **fields))


def test_an_endless_loop_is_stopped_and_the_model_serves_on(fast_spinner: Path) -> None:
    with _load(fast_spinner, run_timeout_s=LIMIT_S) as model:
        assert np.array_equal(model.run(QUIET)["out"], X)  # spin 0: no trip
        for _ in range(2):  # stopped twice: the session is whole after a terminate
            error = _bounded(lambda: model.run(ENDLESS))
            assert isinstance(error, RunTimeoutError), error
            assert isinstance(error, InferenceError) and isinstance(error, TimeoutError)
            assert error.code == "run_timeout" and error.source == "run_timeout_s" and error.ran
            assert "run_timeout_s" in str(error) and "model.onnx" in str(error)
            assert np.array_equal(model.run(QUIET)["out"], X)


def test_the_callers_deadline_stops_a_run_without_a_timeout(fast_spinner: Path) -> None:
    with _load(fast_spinner, run_timeout_s=None) as model:

        def until_deadline() -> Any:
            with watchdog.deadline(at_s=time.monotonic() + LIMIT_S):
                return model.run(ENDLESS)

        error = _bounded(until_deadline)
        assert isinstance(error, RunTimeoutError) and error.source == "deadline" and error.ran
        with watchdog.deadline(at_s=None):  # no deadline, no timeout: runs to its end
            assert np.array_equal(model.run(QUIET)["out"], X)


def test_a_passed_deadline_runs_nothing(fast_spinner: Path) -> None:
    with _load(fast_spinner, run_timeout_s=None) as model:

        def late() -> Any:
            with watchdog.deadline(at_s=time.monotonic() - 1.0):
                return model.run(ENDLESS)  # would never end if it ran

        error = _bounded(late)
        assert isinstance(error, RunTimeoutError), error
        assert error.source == "deadline" and not error.ran and "was not run" in str(error)
        assert np.array_equal(model.run(QUIET)["out"], X)  # the deadline was the block's only


def test_the_earlier_limit_wins(fast_spinner: Path) -> None:
    with _load(fast_spinner, run_timeout_s=LIMIT_S) as model:

        def far_deadline() -> Any:
            with watchdog.deadline(at_s=time.monotonic() + 3600.0):
                return model.run(ENDLESS)

        error = _bounded(far_deadline)
        assert isinstance(error, RunTimeoutError) and error.source == "run_timeout_s"


def test_other_callers_are_answered_while_one_run_hangs(fast_spinner: Path) -> None:
    """Two parties on one model: the hostile caller's run spins until its limit; the quiet
    caller's calls, made meanwhile on another thread, each come back with their answer."""
    with _load(fast_spinner, run_timeout_s=LIMIT_S * 4) as model:
        started = threading.Event()
        quiet_answers: list[bool] = []

        def hostile() -> Any:
            started.set()
            return model.run(ENDLESS)

        hostile_thread: list[Any] = []
        runner = threading.Thread(target=lambda: hostile_thread.append(_bounded(hostile)))
        runner.start()
        started.wait()
        for i in range(5):
            x = np.full((1, 4), i, np.float32)
            quiet_answers.append(bool(np.array_equal(model.run({**QUIET, "x": x})["out"], x)))
        runner.join()
        assert quiet_answers == [True] * 5
        assert isinstance(hostile_thread[0], RunTimeoutError)


def test_an_io_binding_run_is_stopped_too(fast_spinner: Path) -> None:
    """The decoders run through IO bindings (``run_with_iobinding``) under the same
    ``RunLimit``: onnxruntime stops that kind of run as well, and binds the next."""
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(fast_spinner / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    limit = watchdog.RunLimit(timeout_s=LIMIT_S, graph="model.onnx")

    def bound(spin: int) -> Any:
        binding = session.io_binding()
        binding.bind_cpu_input("x", X)
        binding.bind_cpu_input("spin", np.full(1, spin, np.int64))
        binding.bind_output("out")
        limit.call(lambda options: session.run_with_iobinding(binding, options))
        return binding.copy_outputs_to_cpu()[0]

    error = _bounded(lambda: bound(1))
    assert isinstance(error, RunTimeoutError) and error.source == "run_timeout_s", error
    assert np.array_equal(bound(0), X)


def test_many_runs_leave_no_deadline_armed(fast_spinner: Path) -> None:
    """Finished runs leave the watchdog's heap (it does not grow with the calls made)."""
    with _load(fast_spinner, run_timeout_s=60.0) as model:
        for _ in range(200):
            model.run(QUIET)
        assert watchdog.armed_runs() == 0


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "5", 10**30])
def test_run_timeout_s_is_checked(bad: Any) -> None:
    with pytest.raises(ConfigError, match="run_timeout_s"):
        edgeinfer.RuntimeConfig(run_timeout_s=bad)
