"""The sensitivity pass of static QDQ: it keeps in float the fewest nodes that let a tune set
pass, in rank order, and the quantization record names each with its gain and cost."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgeinfer.config import QuantConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export.passes import quantize
from edgeinfer.export.passes.sensitivity import Tuning, run_outputs
from tests.onnx_models import one_sensitive_node


def _feeds(seed: int, count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    views = rng.normal(size=(count, 1, 4, 1, 1)).astype(np.float32)
    views[:, :, 0] = 0.0  # the channel head weighs by 1000 (tests/onnx_models.py)
    return [{"x": view} for view in views]


def _tuning(graph: Path, feeds: list[dict[str, np.ndarray]]) -> Tuning:
    want = np.concatenate(run_outputs(graph, feeds, threads=1))

    def loss(outputs: list[np.ndarray]) -> float:
        return float(np.mean((np.concatenate(outputs) - want) ** 2))

    def score(outputs: list[np.ndarray]) -> float:
        return float(np.mean(np.concatenate(outputs).argmax(1) == want.argmax(1)))

    return Tuning(feeds=feeds, loss=loss, score=score, target=0.95)


def _float_weights(graph: Path, node: str) -> bool:
    """Whether ``node`` of ``graph`` reads its weight as an fp32 initializer."""
    model = onnx.load(str(graph))
    initializers = {i.name for i in model.graph.initializer}
    (found,) = [n for n in model.graph.node if n.name == node]
    return found.input[1] in initializers


def test_sensitivity_keeps_the_fewest_nodes_float_and_names_them(tmp_path: Path) -> None:
    graph = one_sensitive_node(tmp_path / "model.onnx")
    calibration, tune = _feeds(1, 32), _feeds(2, 40)
    tuning = _tuning(graph, tune)
    config = replace(QuantConfig.cpu_vnni(), mode="int8-static", float_nodes="sensitivity")

    plain = tmp_path / "plain.onnx"
    fixed = quantize.quantize_static_cnn(
        graph, plain, replace(config, float_nodes="fixed"), feeds=calibration
    )
    assert fixed.kept_fp32 == [] and fixed.sensitivity is None
    assert tuning.score(run_outputs(plain, tune, threads=1)) < tuning.target  # int8 breaks it

    out = tmp_path / "int8.onnx"
    result = quantize.quantize_static_cnn(graph, out, config, feeds=calibration, tuning=tuning)
    assert result.kept_fp32 == ["head"]  # the one node that matters, and only it
    assert _float_weights(out, "head") and not _float_weights(out, "wide")
    assert tuning.score(run_outputs(out, tune, threads=1)) >= tuning.target
    record = quantize.static_info(config, result)
    assert record["kept_fp32"] == ["head"] and record["float_nodes"] == "sensitivity"
    sensitivity = record["sensitivity"]
    assert sensitivity["tune_score_all_int8"] < sensitivity["tune_target"]
    (kept,) = sensitivity["float_nodes"]
    assert sensitivity["tried"] == []  # the first node tried reached the target
    assert kept["node"] == "head" and kept["op_type"] == "Conv"
    assert kept["tune_loss_gain"] > 0 and 0 < kept["macs_share"] < 1
    assert kept["tune_score_after"] >= sensitivity["tune_target"]


def test_sensitivity_needs_the_generic_qdq_rules() -> None:
    with pytest.raises(ConfigError, match="QNN"):
        replace(QuantConfig.npu_qnn(), float_nodes="sensitivity")
