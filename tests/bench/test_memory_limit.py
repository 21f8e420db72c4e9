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


def test_a_limit_that_holds_the_peak_decodes_the_same_tokens(fast_decoder: Path) -> None:
    free = _limited(fast_decoder, None)
    assert free.decode_tokens_per_s is not None, free.error
    held = _limited(fast_decoder, _step_above(free.peak_rss_bytes))
    assert not held.oom_killed, "OOM-killed under a limit above its own unconstrained peak"
    assert held.returncode == 0 and held.token_ids == free.token_ids


def test_an_oom_kill_is_reported_and_gives_no_result(fast_decoder: Path) -> None:
    # Below what the interpreter and its libraries alone take: the kernel must kill it.
    starved = _limited(fast_decoder, memory_limit.STEP_BYTES)
    assert starved.oom_killed and starved.returncode != 0
    assert starved.decode_tokens_per_s is None and starved.token_ids == ()


@pytest.mark.slow
@pytest.mark.long
def test_smollm2_decodes_under_a_limit_at_its_peak(smollm2_package: Path) -> None:
    free = _limited(smollm2_package, None)
    assert free.decode_tokens_per_s is not None, free.error
    held = _limited(smollm2_package, _step_above(free.peak_rss_bytes))
    assert not held.oom_killed, "OOM-killed under a limit above its own unconstrained peak"
    assert held.token_ids == free.token_ids


_ANONYMOUS_AFTER_LOAD = """
import sys
import edgeinfer
from edgeinfer.runtime import memory
model = edgeinfer.load(sys.argv[1], config=edgeinfer.RuntimeConfig(threads=2))
print(memory.anonymous_bytes())
"""


@pytest.mark.slow
@pytest.mark.long
def test_under_its_anonymous_floor_smollm2_is_killed_unless_its_prepacks_are_file_backed(
    smollm2_package: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    floor = int(
        subprocess.run(
            [sys.executable, "-c", _ANONYMOUS_AFTER_LOAD, str(smollm2_package)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    ids = prompt_ids(smollm2_package)
    cache = tmp_path / "prepacked"

    def run(limit_bytes: int | None, prepacks: Path | None) -> memory_limit.LimitedRun:
        return memory_limit.run_limited(
            "package", smollm2_package, ids, limit_bytes=limit_bytes, tokens=8,
            prepack_cache_dir=prepacks,
        )  # fmt: skip

    free = run(None, cache)  # builds the entry
    assert free.decode_tokens_per_s is not None, free.error
    # 20 MiB under what the plain process holds in anonymous memory: the kernel must kill it
    limit = (floor - 20 * 2**20) // memory_limit.STEP_BYTES * memory_limit.STEP_BYTES
    assert run(limit, None).oom_killed
    backed = run(limit, cache)  # its prepacks are evicted and reread: slower, alive
    assert not backed.oom_killed and backed.token_ids == free.token_ids, backed.error
