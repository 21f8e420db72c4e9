"""tests/run_order.py: the files that take minutes start first, a file's tests stay together
and in their order."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from tests.run_order import longest_files_first


@dataclass
class _Test:
    nodeid: str
    marks: tuple[str, ...] = field(default=())

    def iter_markers(self) -> list[SimpleNamespace]:  # what the ordering reads of a mark
        return [SimpleNamespace(name=name) for name in self.marks]


def _files(items: list[Any]) -> list[str]:
    return list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))


def test_long_then_slow_then_fast_files_most_tests_first() -> None:
    items = [
        _Test("a.py::one"), _Test("a.py::two"), _Test("a.py::three"),
        _Test("b.py::one", ("slow",)),
        _Test("c.py::one"), _Test("c.py::two", ("slow", "long")),
        _Test("d.py::one", ("slow",)), _Test("d.py::two"),
        _Test("e.py::one"),
    ]  # fmt: skip
    ordered = longest_files_first(items)  # type: ignore[arg-type]
    assert _files(ordered) == ["c.py", "d.py", "b.py", "a.py", "e.py"]
    assert sorted(ordered, key=items.index) == items  # the same tests
    for name in ("a.py", "c.py", "d.py"):  # a file's tests in their order
        mine = [t for t in ordered if t.nodeid.startswith(name)]
        assert mine == [t for t in items if t.nodeid.startswith(name)]


def test_this_run_starts_with_its_long_files(request: pytest.FixtureRequest) -> None:
    """The collection this test belongs to is ordered so (unless --fast deselected them)."""
    items = request.session.items
    ranks = [
        0 if any(t.get_closest_marker("long") for t in tests) else 1
        for tests in (
            [t for t in items if t.nodeid.split("::")[0] == name] for name in _files(items)
        )
    ]
    assert ranks == sorted(ranks)
