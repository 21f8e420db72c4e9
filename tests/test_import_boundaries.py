"""The runtime runs on devices without torch: importing it must not load export-only packages."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
