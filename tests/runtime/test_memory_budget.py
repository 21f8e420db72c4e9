"""The memory budget of a generate package (``RuntimeConfig.memory_budget_bytes``, else the
cgroup's limit): a request whose KV cache would not fit is refused before any graph runs and
the model keeps serving; continuous batching admits within it; the limit is read from a real
cgroup when one can be made here."""

from __future__ import annotations

import gc
import logging
import logging.handlers
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from isolated import in_fresh_process

import edgeinfer
from edgeinfer.bench import memory_limit
from edgeinfer.config import ContinuousBatchConfig
from edgeinfer.runtime import memory
from edgeinfer.runtime.session import GraphSession


def _budgeted(package: Path, room_bytes: int, **options: object) -> edgeinfer.Model:
    """The package loaded with a budget of what it holds after loading plus ``room_bytes`` (a
    first load tells what loading adds). Called in a fresh process (tests/isolated.py): the
    budget is anonymous memory, which another test's garbage, freed in between, would move."""

    def settled() -> int:
        gc.collect()
        memory.release_heap()
        return memory.anonymous_bytes()

    before = settled()
    probe = edgeinfer.load(package, config=edgeinfer.RuntimeConfig(threads=1, warmup_runs=0))
    loading = memory.anonymous_bytes() - before
    probe.close()
    del probe  # its sessions go before the budgeted model loads
    budget = settled() + loading + 8 * 2**20 + room_bytes  # the generator keeps 8 MiB
    config = edgeinfer.RuntimeConfig(threads=1, warmup_runs=0, memory_budget_bytes=budget)
    return edgeinfer.load(package, config=config, **options)


def _counted_graph_runs() -> list[int]:
    """A one-item list counting every ``GraphSession`` run of this (fresh) process from now."""
    runs = [0]
    real = GraphSession.run

    def counted(self: GraphSession, feeds: Any, *, shrink_arena: bool = False) -> list[Any]:
        runs[0] += 1
        return real(self, feeds, shrink_arena=shrink_arena)

    GraphSession.run = counted  # type: ignore[method-assign]  # this child process only
    return runs


def _refuse_then_serve(package: Path, room_bytes: int, prompt: str) -> dict[str, Any]:
    """In a fresh process: 1,500 new tokens under ``room_bytes`` of KV room (refused: the
    error's code, ``fits`` and message, and the graph runs it took), then 16 (served)."""
    runs = _counted_graph_runs()
    model = _budgeted(package, room_bytes)
    try:
        before = runs[0]
        try:
            model.generate(prompt, max_new_tokens=1500)
        except edgeinfer.MemoryBudgetError as exc:
            refused: dict[str, Any] = {"code": exc.code, "fits": exc.fits, "message": str(exc)}
        else:
            refused = {}
        ran = runs[0] - before
        return {"refused": refused, "ran": ran, "done": _finish(model, prompt, 16)}
    finally:
        model.close()


def _finish(model: edgeinfer.Model, prompt: str, tokens: int) -> str:
    return str(model.generate(prompt, max_new_tokens=tokens).finish_reason)


@pytest.mark.slow
def test_a_request_whose_kv_would_not_fit_is_refused_before_it_runs(
    smollm2_package: Path,
) -> None:
    # 46 kB of KV a token: 30 MiB of room holds 512 positions, not 1,500
    got = in_fresh_process(
        _refuse_then_serve, smollm2_package, 30 * 2**20, "Write a short story about a robot."
    )
    refused = got["refused"]
    assert refused, "1,500 tokens fitted in 30 MiB of room"
    assert refused["code"] == "memory_budget" and 255 <= refused["fits"] < 1500
    assert "ask for at most" in refused["message"]
    assert got["ran"] == 0  # refused before any graph ran
    assert got["done"] in ("length", "eos")


def _batching_under_budget(package: Path, room_bytes: int) -> dict[str, Any]:
    """In a fresh process: continuous batching with no room at all (what its load warns and
    what a request gets), then with ``room_bytes`` of room (how a request finishes)."""
    starved = edgeinfer.RuntimeConfig(threads=1, warmup_runs=0, memory_budget_bytes=1)
    logged = logging.handlers.BufferingHandler(capacity=1000)
    logger = logging.getLogger("edgeinfer.runtime.generate.generator")
    logger.addHandler(logged)
    try:
        model = edgeinfer.load(package, config=starved, continuous_batching=ContinuousBatchConfig())
    finally:
        logger.removeHandler(logged)
    warnings = [record.getMessage() for record in logged.buffer]
    try:  # nothing left beside what loading took: every request refused, none run
        model.generate("pump valve", max_new_tokens=8)
        starved_error = ""
    except edgeinfer.MemoryBudgetError as exc:  # the same answer as a load without batching
        starved_error = str(exc)
    finally:
        model.close()
    model = _budgeted(package, room_bytes, continuous_batching=ContinuousBatchConfig())
    try:
        return {
            "warnings": warnings,
            "starved": starved_error,
            "done": _finish(model, "pump valve", 8),
        }
    finally:
        model.close()


def test_continuous_batching_admits_within_the_budget(fast_decoder: Path) -> None:
    got = in_fresh_process(_batching_under_budget, fast_decoder, 64 * 2**20)
    assert any("file_backed_prepacks=True" in w for w in got["warnings"])  # says what would help
    assert "budget" in got["starved"]
    assert got["done"] in ("length", "eos")


_READ_LIMIT = "from edgeinfer.runtime import memory; print(memory.limit_bytes())"
_WHY_NOT = memory_limit.cgroup_unavailable()


@pytest.mark.skipif(_WHY_NOT is not None, reason=f"no memory cgroup: {_WHY_NOT}")
def test_the_budget_defaults_to_the_cgroups_limit() -> None:
    limit = 300 * 2**20
    group = memory_limit._Cgroup(limit)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _READ_LIMIT],
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=group.enter,
        )
    finally:
        group.close()
    assert int(done.stdout) == limit
