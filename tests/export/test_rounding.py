"""Error-compensating weight rounding (``weight_rounding = "gptq"``) of static QDQ graphs: it
lowers every layer's output error against nearest rounding on the calibration data, keeps the
scales, biases and integer range onnxruntime chose, and the graph's outputs move closer to fp32
on inputs it never saw."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeinfer.config import QuantConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export.passes import quantize
from edgeinfer.export.passes.rounding import round_weights
from edgeinfer.export.passes.sensitivity import run_outputs


def _tiny_cnn(path: Path) -> Path:
    """x [N, 3, 12, 12] -> 3x3 conv (8) -> ReLU -> 3x3 depthwise stride 2 -> ReLU -> 1x1 conv
    (6) -> global pool -> Gemm (5 classes, transB): every kind of layer the pass re-rounds."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32) * 0.5, name)

    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], "stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node(
            "Conv",
            ["r0", "w1", "b1"],
            ["c1"],
            "depthwise",
            pads=[1, 1, 1, 1],
            group=8,
            strides=[2, 2],
        ),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], "pointwise"),
        helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], "head", transB=1),
    ]
    inits = [
        weight("w0", 8, 3, 3, 3), weight("b0", 8), weight("w1", 8, 1, 3, 3), weight("b1", 8),
        weight("w2", 6, 8, 1, 1), weight("b2", 6), weight("w3", 5, 6), weight("b3", 5),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _feeds(seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """Smooth images (neighbouring pixels correlated, as in photos), one per feed."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(count, 3, 4, 4)).astype(np.float32)
    images = coarse.repeat(3, axis=2).repeat(3, axis=3)
    images += 0.1 * rng.normal(size=images.shape).astype(np.float32)
    return [{"x": image[None]} for image in images]


def _initializers(path: Path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def _error(graph: Path, fp32: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    want = np.concatenate(run_outputs(fp32, feeds, threads=1))
    got = np.concatenate(run_outputs(graph, feeds, threads=1))
    return float(np.mean((got - want) ** 2))


def test_gptq_lowers_each_layers_error_and_keeps_scales_and_biases(tmp_path: Path) -> None:
    fp32 = _tiny_cnn(tmp_path / "fp32.onnx")
    calibration, held = _feeds(1, 48), _feeds(2, 48)
    config = replace(QuantConfig.cpu_vnni(), mode="int8-static")
    nearest = tmp_path / "nearest.onnx"
    quantize.quantize_static_cnn(fp32, nearest, config, feeds=calibration)

    out = tmp_path / "gptq.onnx"
    layers = round_weights(nearest, fp32, feeds=calibration, out_path=out, threads=1)
    assert [layer.name for layer in layers] == ["stem", "depthwise", "pointwise", "head"]
    for layer in layers:
        assert layer.error <= layer.nearest, layer
    assert sum(layer.error for layer in layers) < 0.9 * sum(layer.nearest for layer in layers)

    before, after = _initializers(nearest), _initializers(out)
    assert before.keys() == after.keys()
    changed = [n for n in before if not np.array_equal(before[n], after[n])]
    assert changed and all(n.endswith("_quantized") and before[n].dtype == np.int8 for n in changed)
    assert not any(n.startswith("b") for n in changed)  # int32 biases: their scales are kept
    for name in changed:  # within the layer's range
        assert before[name].min() <= after[name].min() and after[name].max() <= before[name].max()
    producers = {o: n.op_type for n in onnx.load(str(out)).graph.node for o in n.output}
    assert producers["logits"] == "Gemm"  # the output is left in float
    # inputs the rounding never saw come out closer to fp32
    assert _error(out, fp32, held) < _error(nearest, fp32, held)


def test_the_preset_rounds_in_the_static_pass_and_keeps_avx2_seven_bit_weights(
    tmp_path: Path,
) -> None:
    fp32 = _tiny_cnn(tmp_path / "fp32.onnx")
    calibration = _feeds(1, 32)
    config = replace(QuantConfig.cpu_avx2(), mode="int8-static")
    nearest, rounded = tmp_path / "nearest.onnx", tmp_path / "gptq.onnx"
    plain = quantize.quantize_static_cnn(fp32, nearest, config, feeds=calibration)
    result = quantize.quantize_static_cnn(
        fp32, rounded, replace(config, weight_rounding="gptq"), feeds=calibration
    )
    assert plain.rounding is None and result.kept_fp32 == plain.kept_fp32 == ["stem"]
    record = quantize.static_info(replace(config, weight_rounding="gptq"), result)
    assert record["weight_rounding"] == "gptq"
    rounding = record["rounding"]
    assert rounding["layers"] == 3  # the stem stays float on AVX2
    assert rounding["calibration_output_error"] < rounding["calibration_output_error_nearest"]
    before, after = _initializers(nearest), _initializers(rounded)
    sevens = [n for n in before if before[n].dtype == np.int8 and np.abs(before[n]).max() == 64]
    assert sevens  # the AVX2 workaround's 7-bit weights
    for name in sevens:
        assert before[name].min() <= after[name].min() and after[name].max() <= before[name].max()


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    fp32 = _tiny_cnn(tmp_path / "fp32.onnx")
    with pytest.raises(ConfigError, match="calibration feeds"):
        round_weights(fp32, fp32, feeds=[], out_path=tmp_path / "out.onnx")
    with pytest.raises(ConfigError, match="damping"):
        round_weights(fp32, fp32, feeds=_feeds(1, 2), out_path=tmp_path / "o.onnx", damping=0.0)
    with pytest.raises(ConfigError, match="nearest or gptq"):
        replace(QuantConfig.cpu_vnni(), weight_rounding="adaround")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="QNN"):
        replace(QuantConfig.npu_qnn(), weight_rounding="gptq")
