"""Fixtures of the runtime tests."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from edgeinfer.runtime.session import GraphSession


@pytest.fixture
def graph_runs(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every graph run of every ``GraphSession``, counted by its package folder's name."""
    runs: Counter[str] = Counter()
    real = GraphSession.run

    def counted(self: GraphSession, feeds: Any, *, shrink_arena: bool = False) -> list[Any]:
        runs[self.path.parent.name] += 1
        return real(self, feeds, shrink_arena=shrink_arena)

    monkeypatch.setattr(GraphSession, "run", counted)
    return runs
