"""A real package under a real cgroup memory limit: it decodes the same tokens when the limit
holds its peak, and an OOM kill below that is reported as one (never taken for a result)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.bench import memory_limit
from edgeinfer.bench.generation import prompt_ids

_WHY_NOT = memory_limit.cgroup_unavailable()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"no memory cgroup: {_WHY_NOT}")


def _limited(package: Path, limit_bytes: int | None) -> memory_limit.LimitedRun:
    ids = prompt_ids(package)
    return memory_limit.run_limited("package", package, ids, limit_bytes=limit_bytes, tokens=16)


def _step_above(peak_bytes: int) -> int:
    """The peak rounded up to the sweep's step, plus a step for the page cache the process
    reads without mapping (its tokenizer, Python's own files)."""
    step = memory_limit.STEP_BYTES
    return (-(-peak_bytes // step) + 1) * step


def test_a_limit_that_holds_the_peak_decodes_the_same_tokens(tiny_package: Path) -> None:
    free = _limited(tiny_package, None)
    assert free.decode_tokens_per_s is not None, free.error
    held = _limited(tiny_package, _step_above(free.peak_rss_bytes))
    assert not held.oom_killed, "OOM-killed under a limit above its own unconstrained peak"
    assert held.returncode == 0 and held.token_ids == free.token_ids


def test_an_oom_kill_is_reported_and_gives_no_result(tiny_package: Path) -> None:
    # Below what the interpreter and its libraries alone take: the kernel must kill it.
    starved = _limited(tiny_package, memory_limit.STEP_BYTES)
    assert starved.oom_killed and starved.returncode != 0
    assert starved.decode_tokens_per_s is None and starved.token_ids == ()


@pytest.mark.slow
def test_smollm2_decodes_under_a_limit_at_its_peak(smollm2_package: Path) -> None:
    free = _limited(smollm2_package, None)
    assert free.decode_tokens_per_s is not None, free.error
    held = _limited(smollm2_package, _step_above(free.peak_rss_bytes))
    assert not held.oom_killed, "OOM-killed under a limit above its own unconstrained peak"
    assert held.token_ids == free.token_ids
