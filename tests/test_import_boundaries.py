"""Import rules: the runtime runs on devices without torch (importing it loads no export-only
package), every import follows the layers of docs/architecture.md, and no edgeinfer module
imports itself back through others (no cycles). Every import counts: module-level, lazy (inside
functions) and ``if TYPE_CHECKING:`` ones (tests/layers.py reads them)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from layers import ROOT, import_graph, layer_of, read_layers, source_modules

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


def test_every_import_follows_the_layers() -> None:
    """Each module imports only its own layer and the layers its row of docs/architecture.md
    lists; every module is in a layer."""
    layers = read_layers()
    graph = import_graph()
    unplaced = sorted(m for m in graph if layer_of(m, layers) is None)
    assert not unplaced, f"in no layer of docs/architecture.md: {', '.join(unplaced)}"
    wrong = []
    for module, targets in sorted(graph.items()):
        layer = layer_of(module, layers)
        assert layer is not None
        for target, line in sorted(targets.items()):
            other = layer_of(target, layers)
            if other != layer and other not in layers[layer].may_import:
                path = source_modules()[module].relative_to(ROOT)
                wrong.append(f"{path}:{line}: {module} ({layer}) imports {target} ({other})")
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(wrong)


def test_the_layer_table_names_only_known_layers() -> None:
    layers = read_layers()
    unknown = {n for layer in layers.values() for n in layer.may_import} - set(layers)
    assert not unknown, f"may import unknown layers: {sorted(unknown)}"


def test_edgeinfer_has_no_import_cycle() -> None:
    graph = {name: set(targets) for name, targets in import_graph().items()}
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


def test_deploys_do_not_import_serving() -> None:
    """``ota/`` reads the served-model table from bridge/models.py, never ``serve/``: the two
    imported each other (a cycle) before; the bridge composes the deployer."""
    wrong = [
        f"{source_modules()[module].relative_to(ROOT)}:{line}: {module} imports {target}"
        for module, targets in sorted(import_graph().items())
        if module.startswith("edgeinfer.bridge.ota")
        for target, line in sorted(targets.items())
        if target.startswith("edgeinfer.bridge.serve")
    ]
    assert not wrong, "\n".join(wrong)
