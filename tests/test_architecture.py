"""docs/architecture.md stays true: every package folder of edgeinfer/ is in its tree and its
folder table, every path it names exists, and its layer table names real modules (the same
table tests/test_import_boundaries.py enforces)."""

from __future__ import annotations

import re

from layers import ARCHITECTURE, ROOT, SOURCE, TOP, read_layers, source_modules

_PATH = re.compile(r"`((?:edgeinfer|tests|docs|runtime|export|bridge|bench|cli)/[\w./]*)`")


def _packages() -> set[str]:
    """Every package folder under edgeinfer/, as ``edgeinfer/a/b/``."""
    return {f"{p.parent.relative_to(ROOT)}/" for p in SOURCE.rglob("__init__.py")}


def _tree(text: str) -> list[str]:
    """The paths of the doc's tree block (two spaces of indent per level)."""
    block = text.split("\n```\nedgeinfer/\n", 1)[1].split("\n```", 1)[0]
    folders, paths = ["edgeinfer/"], ["edgeinfer/"]
    for line in block.splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        del folders[depth:]
        for name in line.split():
            paths.append("".join(folders) + name)
            if name.endswith("/"):
                folders.append(name)
    return paths


def test_the_tree_holds_every_package_folder_and_only_what_exists() -> None:
    tree = _tree(ARCHITECTURE.read_text())
    missing = sorted(p for p in tree if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md's tree names what does not exist: {missing}"
    unnamed = sorted(_packages() - set(tree))
    assert not unnamed, f"package folders missing from docs/architecture.md's tree: {unnamed}"


def test_every_package_folder_has_a_row_and_every_named_path_exists() -> None:
    text = ARCHITECTURE.read_text()
    rows = set(re.findall(r"^\| `(edgeinfer/[\w/]*)` \|", text, flags=re.M))
    assert _packages() <= rows, f"folders without a row: {sorted(_packages() - rows)}"
    named = set(_PATH.findall(text))
    assert named, "the path pattern no longer matches the doc"
    relative = ("runtime/", "export/", "bridge/", "bench/", "cli/")
    stale = sorted(
        p for p in named if not (SOURCE / p if p.startswith(relative) else ROOT / p).exists()
    )
    assert not stale, f"docs/architecture.md names paths that do not exist: {stale}"


def test_the_layer_table_names_real_modules() -> None:
    modules = {*source_modules(), TOP}
    named = [m for layer in read_layers().values() for m in layer.modules]
    assert len(named) == len(set(named)), "a module in two layers"
    assert not [m for m in named if m not in modules], "the layer table names a missing module"


def test_the_tree_is_read_by_its_indent() -> None:
    """What the checks above rely on: a name belongs to the folder above it by indent."""
    text = "\n```\nedgeinfer/\n  a.py  b.py\n  c/\n    d.py\n  e.py\n```\n"
    assert _tree(text) == [
        "edgeinfer/", "edgeinfer/a.py", "edgeinfer/b.py", "edgeinfer/c/", "edgeinfer/c/d.py",
        "edgeinfer/e.py",
    ]  # fmt: skip
