"""The wheel ships every edgeinfer package and the recipes (models/ as edgeinfer/models)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgeinfer.export import recipes

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_wheel_holds_every_package_and_every_recipe(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("edgeinfer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "edgeinfer").rglob("__init__.py")}
    assert all(f"{package}/__init__.py" in names for package in packages), "pyproject packages"
    for recipe in recipes.all_recipes():
        assert f"edgeinfer/models/{recipe.name}/recipe.toml" in names
    assert "edgeinfer/models/README.md" in names
