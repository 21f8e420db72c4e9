"""The memory budget of a generate package (``RuntimeConfig.memory_budget_bytes``, else the
cgroup's limit): a request whose KV cache would not fit is refused before any graph runs and
the model keeps serving; continuous batching admits within it; the limit is read from a real
cgroup when one can be made here."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.bench import memory_limit
from edgeinfer.config import ContinuousBatchConfig
from edgeinfer.runtime import memory


def _budgeted(package: Path, room_bytes: int, **options: object) -> edgeinfer.Model:
    """The package loaded with a budget of what it holds after loading plus ``room_bytes``
    (a first load tells what loading adds: measured from this worker's own anonymous memory
    before each load, which earlier tests' garbage, freed in between, moves by ~100 MiB)."""

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


@pytest.mark.slow
def test_a_request_whose_kv_would_not_fit_is_refused_before_it_runs(
    smollm2_package: Path, graph_runs: Counter[str]
) -> None:
    # 46 kB of KV a token: 30 MiB of room holds 512 positions, not 1,500
    model = _budgeted(smollm2_package, 30 * 2**20)
    try:
        runs = sum(graph_runs.values())
        with pytest.raises(edgeinfer.MemoryBudgetError) as refused:
            model.generate("Write a short story about a robot.", max_new_tokens=1500)
        assert refused.value.code == "memory_budget" and 255 <= refused.value.fits < 1500
        assert "ask for at most" in str(refused.value)
        assert sum(graph_runs.values()) == runs  # refused before any graph ran
        done = model.generate("Write a short story about a robot.", max_new_tokens=16)
        assert done.finish_reason in ("length", "eos")
    finally:
        model.close()


def test_continuous_batching_admits_within_the_budget(
    tiny_package: Path, caplog: pytest.LogCaptureFixture
) -> None:
    starved = edgeinfer.RuntimeConfig(threads=1, warmup_runs=0, memory_budget_bytes=1)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.generate.generator"):
        model = edgeinfer.load(
            tiny_package, config=starved, continuous_batching=ContinuousBatchConfig()
        )
    assert "file_backed_prepacks=True" in caplog.text  # the load says what would help
    try:  # nothing left beside what loading took: every request refused, none run
        with pytest.raises(edgeinfer.ConfigError, match="budget"):
            model.generate("pump valve", max_new_tokens=8)
    finally:
        model.close()
    model = _budgeted(tiny_package, 64 * 2**20, continuous_batching=ContinuousBatchConfig())
    try:
        assert model.generate("pump valve", max_new_tokens=8).finish_reason in ("length", "eos")
    finally:
        model.close()


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
