"""The memory-limit sweep's search: the smallest passing limit, found in a logarithmic number
of runs (each run is a process loading a model under a cgroup: seconds to minutes)."""

from __future__ import annotations

import pytest

from edgeinfer.bench.memory_limit import smallest_passing


@pytest.mark.parametrize("threshold", [1, 2, 37, 74, 75])
def test_bisection_finds_the_smallest_passing_step(threshold: int) -> None:
    tried: list[int] = []

    def serves(steps: int) -> bool:
        tried.append(steps)
        return steps >= threshold

    assert smallest_passing(serves, 75) == threshold
    assert len(tried) <= 1 + 7  # the top, then log2(75) halvings, where stepping down takes 75
    assert len(set(tried)) == len(tried)  # no limit is run twice


def test_nothing_below_a_top_that_fails_is_tried() -> None:
    tried: list[int] = []

    def serves(steps: int) -> bool:
        tried.append(steps)
        return False

    assert smallest_passing(serves, 75) is None
    assert tried == [75]
