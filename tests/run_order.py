"""The order in which the test files start (tests/conftest.py applies it to the collection;
tools/test.sh keeps it with xdist's ``--no-loadscope-reorder``).

A file's tests run on one worker (``--dist loadfile``), and xdist hands a worker the next file
when it is nearly done with its own, in the collection's order. So the files that take
minutes start first: a file with a ``long`` test, then the other slow (exporting) ones, then
the fast lane's, most tests first within each (xdist's own order). The end of the run is then
seconds-long files that keep both workers busy, not a minutes-long one that starts last while
the other worker idles.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest


def _rank(tests: Sequence[pytest.Item]) -> tuple[int, int]:
    marks = {mark.name for test in tests for mark in test.iter_markers()}
    kind = 0 if "long" in marks else 1 if "slow" in marks else 2
    return kind, -len(tests)


def longest_files_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """``items`` with their files in start order; a file's tests keep their order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    return [item for tests in sorted(files.values(), key=_rank) for item in tests]
