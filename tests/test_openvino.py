"""A real non-default execution provider: OpenVINO on this x86 CPU, in its own environment.

The onnxruntime-openvino wheel replaces the plain onnxruntime module, so these tests build (or
reuse) a separate virtual environment with tools/openvino_env.sh and run edgeinfer there in a
subprocess. They skip only when pip cannot install the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.manifest import Manifest
from edgeinfer.providers import CPU

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
OPENVINO = "OpenVINOExecutionProvider"

# Runs inside the OpenVINO environment; prints one JSON object.
_PROBE = r"""
import json, logging, sys
from pathlib import Path

import numpy as np

import edgeinfer
from edgeinfer.errors import EpCoverageError
from edgeinfer.placement import gate, placement

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


logging.getLogger().addHandler(Keep(logging.WARNING))

texts = [
    "the match ended in a draw after extra time",
    "shares fell sharply after the quarterly report",
    "a new phone was launched with a larger battery",
    "parliament voted on the budget late on tuesday",
    "the film won three awards at the festival",
    "broadband prices are set to rise next year",
    "the striker signed a four year contract",
    "inflation slowed for the second month in a row",
]
out = {}
reference = edgeinfer.load(Path(sys.argv[1]), providers=["cpu"]).embed(texts)  # fp32 on CPU
for name in sys.argv[1:]:  # the fp32 package first
    pkg = Path(name)
    cpu = edgeinfer.load(pkg, providers=["cpu"])
    ov = edgeinfer.load(pkg, providers=["openvino", "cpu"])
    b = ov.embed(texts)  # rows are L2-normalized: the dot product is the cosine
    same_package = (cpu.embed(texts) * b).sum(1)
    vs_fp32 = (reference * b).sum(1)
    on_cpu = placement(pkg, providers=["cpu"]).to_dict()
    on_ov = placement(pkg, providers=["openvino", "cpu"])
    try:
        gate(pkg, providers=["openvino", "cpu"], min_coverage=1.0)
        gate_error = None
    except EpCoverageError as exc:
        gate_error = exc.code
    out[pkg.name] = {
        "providers": ov.providers,
        "min_cosine_same_package": float(same_package.min()),
        "mean_cosine_vs_fp32": float(vs_fp32.mean()),
        "min_cosine_vs_fp32": float(vs_fp32.min()),
        "cpu_placement": on_cpu,
        "ov_placement": on_ov.to_dict(),
        "gate_error": gate_error,
    }
records.clear()
fallback = edgeinfer.load(Path(sys.argv[1]), providers=["cuda", "openvino"])
out["fallback"] = {"providers": fallback.providers, "warnings": list(records)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ov_python() -> Path:
    """The OpenVINO environment's python, built by tools/openvino_env.sh on first use."""
    venv = Path(os.environ.get("EDGEINFER_OPENVINO_VENV", REPO / ".venv-openvino"))
    env = {**os.environ, "EDGEINFER_OPENVINO_VENV": str(venv), "PYTHON": sys.executable}
    setup = subprocess.run(
        ["bash", str(REPO / "tools" / "openvino_env.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    if setup.returncode != 0:
        if "onnxruntime-openvino" in setup.stderr and "No matching distribution" in setup.stderr:
            pytest.skip(f"pip cannot install onnxruntime-openvino here: {setup.stderr[-300:]}")
        pytest.fail(f"tools/openvino_env.sh failed:\n{setup.stdout}\n{setup.stderr}")
    return venv / "bin" / "python"


def _run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def probe(ov_python: Path, minilm_fp32: Path, minilm_int8: Path) -> dict[str, Any]:
    result = _run(ov_python, "-c", _PROBE, str(minilm_fp32), str(minilm_int8))
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


def test_packages_run_on_openvino_and_match_cpu(probe: dict[str, Any], minilm_int8: Path) -> None:
    fp32, int8 = probe["minilm-fp32"], probe["minilm-int8"]
    assert fp32["providers"][0] == int8["providers"][0] == OPENVINO
    # fp32: the same math in another engine
    assert fp32["min_cosine_same_package"] >= 0.9999
    # int8: OpenVINO quantizes the activations its own way, so it is held to the package's
    # own accuracy gate against fp32 (mean >= 1 - loss, min >= 1 - 3 x loss)
    loss = Manifest.read(minilm_int8).accuracy["max_accuracy_loss"]
    assert int8["mean_cosine_vs_fp32"] >= 1 - loss
    assert int8["min_cosine_vs_fp32"] >= 1 - 3 * loss


def test_placement_on_openvino_vs_cpu(probe: dict[str, Any]) -> None:
    for name in ("minilm-fp32", "minilm-int8"):
        cpu, ov = probe[name]["cpu_placement"], probe[name]["ov_placement"]
        # one partitioning input: the node count and the FLOPs estimate do not depend on the EP
        assert ov["total_nodes"] == cpu["total_nodes"]
        assert ov["total_flops"] == pytest.approx(cpu["total_flops"])
        assert cpu["shares"][0]["coverage"] == 1.0
        assert [s["provider"] for s in ov["shares"]] == [OPENVINO, CPU]
    fp32 = probe["minilm-fp32"]["ov_placement"]["shares"]
    assert fp32[0]["coverage"] == 1.0  # OpenVINO takes the fused fp32 graph whole
    int8 = probe["minilm-int8"]["ov_placement"]["shares"]
    assert 0.0 < int8[0]["coverage"] < 1.0  # ... and leaves the int8 graph's QAttention to CPU
    assert int8[1]["op_types"].get("QAttention", 0) > 0


def test_coverage_gate_fails_on_a_partial_placement(probe: dict[str, Any]) -> None:
    assert probe["minilm-fp32"]["gate_error"] is None
    assert probe["minilm-int8"]["gate_error"] == "ep_coverage"


def test_unavailable_provider_falls_back_with_a_warning(probe: dict[str, Any]) -> None:
    fallback = probe["fallback"]
    assert fallback["providers"][0] == OPENVINO
    assert any("CUDAExecutionProvider" in w and "falling back" in w for w in fallback["warnings"])


def test_inspect_placement_cli_on_openvino(ov_python: Path, minilm_int8: Path) -> None:
    result = _run(
        ov_python,
        "-m",
        "edgeinfer",
        "inspect",
        str(minilm_int8),
        "--providers",
        "openvino,cpu",
        "--placement",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    shares = json.loads(result.stdout)["placement"]["shares"]
    assert [s["provider"] for s in shares] == [OPENVINO, CPU]
    assert sum(s["nodes"] for s in shares) > 0
