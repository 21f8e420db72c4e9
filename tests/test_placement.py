"""The placement report and the coverage gate on the CPU provider (OpenVINO: test_openvino.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import typer
from onnx import TensorProto, helper, numpy_helper

from edgeinfer.cli.common import EXIT_CHECK_FAILED, run_guarded
from edgeinfer.errors import ConfigError, EpCoverageError, ProviderError
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.run import export
from edgeinfer.placement import check_coverage, gate, placement
from edgeinfer.providers import CPU, available


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args], capture_output=True, text=True, timeout=300
    )


def _tiny_graph(path: Path) -> Path:
    """x [1, 16, 32] -> MatMul W [32, 64] -> Relu -> y: 2*16*32*64 + 16*64 FLOPs."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32), "W")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
            helper.make_node("Relu", ["h"], ["y"], name="act"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 64])],
        initializer=[weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_cpu_takes_every_node_of_a_package(minilm_int8: Path) -> None:
    report = placement(minilm_int8, providers=["cpu"])
    assert report.providers == (CPU,)
    assert report.graphs == ("model.onnx",)
    share = report.share("cpu")
    assert share.nodes == report.total_nodes > 0
    assert sum(share.op_types.values()) == share.nodes
    assert report.coverage("cpu") == report.node_coverage("cpu") == 1.0
    assert report.total_flops > 0
    # nodes the estimate cannot name (onnxruntime's unnamed Casts) are few and count no FLOPs
    assert report.unmatched_nodes < report.total_nodes // 10
    as_json = json.loads(json.dumps(report.to_dict()))
    assert as_json["shares"][0]["coverage"] == 1.0


def test_flops_estimate_is_exact_on_a_matmul_graph(tmp_path: Path) -> None:
    report = placement(_tiny_graph(tmp_path / "tiny.onnx"), providers=["cpu"])
    assert report.total_nodes == 2
    assert report.unmatched_nodes == 0
    assert report.total_flops == 2 * 16 * 32 * 64 + 16 * 64


def test_int8_and_fp32_packages_estimate_the_same_work(
    minilm_int8: Path, minilm_fp32: Path
) -> None:
    # same model, different kernels and node counts: the estimate counts the math, not the nodes
    int8, fp32 = (
        placement(minilm_int8, providers=["cpu"]),
        placement(minilm_fp32, providers=["cpu"]),
    )
    assert int8.total_nodes != fp32.total_nodes
    assert int8.total_flops == pytest.approx(fp32.total_flops, rel=0.02)


def test_coverage_gate_passes_and_fails(minilm_int8: Path) -> None:
    report = gate(minilm_int8, providers=["cpu"], min_coverage=1.0)
    with pytest.raises(EpCoverageError) as info:
        check_coverage(report, min_coverage=1.01)
    assert info.value.code == "ep_coverage"
    assert info.value.provider == CPU
    assert "--min-ep-coverage" in str(info.value)


def test_a_provider_that_is_not_here_names_its_install(minilm_int8: Path) -> None:
    if "OpenVINOExecutionProvider" in available():
        pytest.skip("this environment has the OpenVINO provider")
    with pytest.raises(ProviderError, match="pip install onnxruntime-openvino"):
        placement(minilm_int8, providers=["openvino", "cpu"])
    with pytest.raises(ConfigError):
        placement(minilm_int8, providers=[])
    with pytest.raises(ConfigError, match="neither a package"):
        placement(minilm_int8 / "tokenizer.json", providers=["cpu"])


def test_inspect_placement_cli(minilm_int8: Path) -> None:
    result = _cli("inspect", str(minilm_int8), "--placement", "--providers", "cpu", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["placement"]
    assert report["providers"] == [CPU]
    assert report["shares"][0]["nodes"] == report["total_nodes"]
    table = _cli("inspect", str(minilm_int8), "--placement")
    assert table.returncode == 0, table.stderr
    assert "FLOPs share" in table.stderr
    # --providers alone is a usage error; an unavailable provider says how to install it
    assert _cli("inspect", str(minilm_int8), "--providers", "cpu").returncode == 2
    if "CUDAExecutionProvider" not in available():
        missing = _cli("inspect", str(minilm_int8), "--placement", "--providers", "cuda")
        assert missing.returncode == 2
        assert "onnxruntime-gpu" in missing.stderr


def test_coverage_failure_is_exit_code_1() -> None:
    app = typer.Typer()

    @app.command()
    def fail() -> None:
        raise EpCoverageError(provider=CPU, coverage=1.0, min_coverage=1.01, cpu_coverage=None)

    assert run_guarded(app, []) == EXIT_CHECK_FAILED


@pytest.mark.slow
def test_export_gate_fails_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate runs on the staged package, before the rename. No accelerator runs here, so
    the gate's verdict is an NPU taking half of the FLOPs (the gate's own arithmetic is
    tested on real placements above)."""
    from edgeinfer import placement as placement_module

    def half_on_the_npu(package: Path, *, providers: Any, min_coverage: float) -> None:
        assert (package / "manifest.json").is_file()  # staged, not yet renamed
        raise EpCoverageError(
            provider="OpenVINOExecutionProvider",
            coverage=0.5,
            min_coverage=min_coverage,
            cpu_coverage=0.5,
        )

    monkeypatch.setattr(placement_module, "gate", half_on_the_npu)
    out = tmp_path / "gated"
    options = ExportOptions(
        source="minilm", out=out, quantize="none", held_count=8, min_ep_coverage=0.9
    )
    with pytest.raises(EpCoverageError):
        export(options)
    assert not out.exists()
    assert not (tmp_path / "gated.partial").exists()
    for bad in (-0.1, 1.01):
        with pytest.raises(ConfigError, match="min_ep_coverage"):
            ExportOptions(source="minilm", out=out, min_ep_coverage=bad)
