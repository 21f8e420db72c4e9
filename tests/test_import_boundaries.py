"""Import rules: the runtime runs on devices without torch (importing it loads no export-only
package), and no edgeinfer module imports itself back through others (no cycles)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Container
from pathlib import Path

import pytest

import edgeinfer

FORBIDDEN = ("torch", "transformers", "optimum", "onnx")


@pytest.mark.parametrize(
    "module", ["edgeinfer", "edgeinfer.runtime", "edgeinfer.bridge", "edgeinfer.cli"]
)
def test_runtime_imports_no_export_packages(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imported {out.stdout.strip()}"


def test_loading_and_running_a_package_imports_no_export_packages(minilm_int8: object) -> None:
    code = (
        "import sys, edgeinfer\n"
        f"m = edgeinfer.load({str(minilm_int8)!r})\n"
        "m.embed(['hello'])\n"
        f"print(','.join(sorted(x for x in sys.modules if x.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _imports(path: Path, module: str, modules: Container[str]) -> set[str]:
    """The edgeinfer modules ``module`` imports anywhere in its file — lazy imports inside
    functions included (a cycle hidden by a lazy import is still a cycle), ``if
    TYPE_CHECKING:`` blocks excluded (annotations only)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # "from a.b import c": the submodule a.b.c when it is one, else a.b
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {name for name in found if name.split(".")[0] == "edgeinfer"}


def test_edgeinfer_has_no_import_cycle() -> None:
    root = Path(edgeinfer.__file__).parent
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {
        name: {m for m in _imports(path, name, modules) if m in modules and m != name}
        for name, path in modules.items()
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
