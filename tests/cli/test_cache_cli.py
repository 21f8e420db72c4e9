"""``edgeinfer cache stats|clear PKG`` on a real package and its real SQLite cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.cli import main


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(argv) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_cache_stats_and_clear(
    minilm_int8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--cache-dir", str(tmp_path)]
    empty = _json(capsys, ["cache", "stats", str(minilm_int8), *where, "--json"])
    assert empty["exists"] is False and not list(tmp_path.iterdir())  # stats creates nothing
    model = edgeinfer.load(minilm_int8, cache=edgeinfer.CacheConfig(directory=tmp_path))
    model.embed(["one", "two", "three"])
    model.close()
    stats = _json(capsys, ["cache", "stats", str(minilm_int8), *where, "--json"])
    assert stats["entries"] == 3 and isinstance(stats["bytes"], int) and stats["bytes"] > 0
    assert main(["cache", "stats", str(minilm_int8), *where]) == 0
    assert "3 entries" in capsys.readouterr().err.replace("\n", " ")
    cleared = _json(capsys, ["cache", "clear", str(minilm_int8), *where, "--json"])
    assert cleared["removed"] == 3
    assert _json(capsys, ["cache", "stats", str(minilm_int8), *where, "--json"])["entries"] == 0
    assert main(["cache", "stats", str(tmp_path / "no-such-package")]) == 2
