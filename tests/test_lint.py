"""The style the design asks for, checked on every run: ruff (lint, banned imports per layer,
format) on the whole tree and mypy --strict on edgeinfer/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "edgeinfer", "tests", "benchmarks", "examples", "tools"],
        ["mypy"],  # files and strictness from pyproject.toml
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_the_tree_is_clean(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
