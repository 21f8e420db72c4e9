"""The layers of docs/architecture.md (its layer table, parsed) and the edgeinfer imports of
every module of the source tree: what tests/test_import_boundaries.py and
tests/test_architecture.py check."""

from __future__ import annotations

import ast
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SOURCE = ROOT / "edgeinfer"
_HEADER = "| layer | modules | may import |"
# The table names the top package's own __init__.py so; every other name is a prefix.
TOP = "edgeinfer.__init__"


@dataclass(frozen=True)
class Layer:
    """One row of the layer table: its modules (each with everything under it) and the other
    layers they may import."""

    name: str
    modules: tuple[str, ...]
    may_import: frozenset[str]


def read_layers(text: str | None = None) -> dict[str, Layer]:
    """The layer table of docs/architecture.md (or of ``text``), by layer name."""
    lines = (ARCHITECTURE.read_text() if text is None else text).splitlines()
    start = lines.index(_HEADER) + 2  # past the header and its --- row
    layers: dict[str, Layer] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        name, modules, may_import = (cell.strip() for cell in line.strip("|").split("|"))
        layers[name] = Layer(
            name=name,
            modules=tuple(m.strip().strip("`") for m in modules.split(",")),
            may_import=frozenset(n.strip() for n in may_import.split(",") if n.strip()),
        )
    return layers


def layer_of(module: str, layers: dict[str, Layer]) -> str | None:
    """The layer of ``module``: the row naming it or its closest package (None: no row)."""
    name = TOP if module == "edgeinfer" else module
    best: tuple[int, str] | None = None
    for layer in layers.values():
        for entry in layer.modules:
            if name == entry or (entry != TOP and name.startswith(entry + ".")):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), layer.name)
    return None if best is None else best[1]


def source_modules(root: Path = SOURCE) -> dict[str, Path]:
    """Every module of the ``edgeinfer`` source tree by dotted name (packages by their name)."""
    found: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, module: str, modules: Container[str]) -> dict[str, int]:
    """The edgeinfer modules ``module`` imports anywhere in its file, each with the line of
    its first import: module-level, lazy (inside functions) and ``if TYPE_CHECKING:`` imports
    alike (an annotation-only import is still a dependency of the code that reads it)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # "from a.b import c": the submodule a.b.c when it is one, else a.b
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.append(sub if sub in modules else base)
        for name in names:
            if name.split(".")[0] == "edgeinfer" and name != module:
                found[name] = min(found.get(name, node.lineno), node.lineno)
    return found


def import_graph(root: Path = SOURCE) -> dict[str, dict[str, int]]:
    """Module -> {imported edgeinfer module: line}, for every module under ``root``."""
    modules = source_modules(root)
    return {
        name: {m: line for m, line in imports(path, name, modules).items() if m in modules}
        for name, path in modules.items()
    }
