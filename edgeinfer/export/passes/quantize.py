"""Quantization with onnxruntime's quantizer, driven by a ``QuantConfig`` preset.

Every onnxruntime-version workaround it relies on lives in ``ort_compat``, with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import QuantConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.passes import ort_compat, rounding
from edgeinfer.export.passes.sensitivity import Tuning, choose_float_nodes

__all__ = [
    "StaticResult",
    "convert_fp16",
    "quantize_dynamic_any",
    "quantize_dynamic_cnn",
    "quantize_dynamic_int8",
    "quantize_static_cnn",
    "quantize_static_int8",
    "static_info",
]

log = logging.getLogger(__name__)

_EXTRA_OPTIONS = ort_compat.UNTYPED_AS_FLOAT


def quantize_dynamic_int8(graph: Path, out_path: Path, config: QuantConfig) -> None:
    """Dynamic int8: weights quantized at export, activations per run (no calibration)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(graph),
        str(out_path),
        op_types_to_quantize=list(config.ops_to_quantize),
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        weight_type=QuantType.QInt8,
        extra_options=dict(_EXTRA_OPTIONS),
    )


class _TextReader:
    """A ``CalibrationDataReader`` over pre-tokenized feeds (one text per run, unpadded)."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]]) -> None:
        self._feeds: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize_static_int8(
    graph: Path,
    out_path: Path,
    config: QuantConfig,
    *,
    feeds: Sequence[dict[str, np.ndarray]],
    work_dir: Path,
) -> None:
    """Static int8 in QDQ form: activation ranges calibrated on ``feeds``, per-channel weights."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    prepped = work_dir / "preprocessed.onnx"
    ort_compat.preprocess(graph, prepped, contrib_ops=True)
    methods: dict[str, Any] = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }
    quantize_static(
        str(prepped),
        str(out_path),
        _TextReader(feeds),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=list(config.ops_to_quantize),
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=methods[config.calibration_method],
        extra_options={**_EXTRA_OPTIONS, "ActivationSymmetric": config.activation_symmetric},
    )


def quantize_decoder_dynamic(graph: Path, out_path: Path, *, exclude: Sequence[str]) -> None:
    """Dynamic int8 of a decoder graph's ``MatMul`` weights, per output channel, with
    ``exclude`` kept fp32.

    The weights are unsigned: ``ort_compat.DECODER_WEIGHT_TYPE`` says why.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(graph),
        str(out_path),
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        weight_type=getattr(QuantType, ort_compat.DECODER_WEIGHT_TYPE),
        nodes_to_exclude=list(exclude),
        extra_options={**_EXTRA_OPTIONS, "MatMulConstBOnly": True},
    )


WEIGHT_ONLY_ALGORITHMS = ("rtn", "rtn-asym", "k_quant", "hqq")


def quantize_weight_only(
    graph: Path,
    out_path: Path,
    *,
    bits: int,
    block_size: int = 32,
    exclude: Sequence[str] = (),
    include: Sequence[str] | None = None,
    accuracy_level: int = 4,
    algorithm: str = "rtn",
) -> None:
    """Weight-only int8/int4 ``MatMulNBits`` (blockwise) of a decoder graph's ``MatMul``s:
    those named in ``include`` (default: all) but not in ``exclude``.

    accuracy_level 4 lets the CPU kernel quantize activations to int8 per block and use integer
    dot products (VNNI/AVX2/sdot), the fastest path on CPUs; 1 keeps activations fp32 (weights
    dequantized per block), slower but exact up to the weights. ``algorithm`` picks
    onnxruntime's quantizer: ``rtn`` (round to nearest, symmetric), ``rtn-asym`` (with 4-bit
    zero points), ``k_quant`` (llama.cpp-style scale search), ``hqq`` (half-quadratic, float
    zero points: onnxruntime cannot prepack those and runs them on its slow unpacked path).
    """
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    if algorithm not in WEIGHT_ONLY_ALGORITHMS:
        raise ConfigError(f"unknown algorithm {algorithm!r}: use {WEIGHT_ONLY_ALGORITHMS}")
    model = onnx.load(str(graph))
    skipped = list(exclude)
    if include is not None:  # onnxruntime's quantizer ignores nodes_to_include
        wanted = set(include)
        skipped += [
            n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in wanted
        ]
    configs: dict[str, Any] = {
        "k_quant": nbits.KQuantWeightOnlyQuantConfig,
        "hqq": lambda: nbits.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits),
    }
    quantizer = nbits.MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=block_size,
        is_symmetric=algorithm == "rtn",
        accuracy_level=accuracy_level,
        nodes_to_exclude=skipped,
        algo_config=configs[algorithm]() if algorithm in configs else None,
    )
    quantizer.process()
    package.save_graph(quantizer.model.model, out_path)


# What dynamic int8 quantizes in a graph from anywhere (``quantize_dynamic_any``).
DYNAMIC_OPS = ("MatMul", "Gemm", "Attention", "LSTM", "GRU", "EmbedLayerNormalization")
_QUANT_TYPES = {"uint8": "QUInt8", "uint16": "QUInt16", "int8": "QInt8"}
_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def quantize_dynamic_cnn(graph: Path, out_path: Path, config: QuantConfig) -> None:
    """Dynamic int8 of a CNN's convolutions and Gemm (``ConvInteger``): activations are
    quantized on every run. Kept so the speed guard can refuse it where it is slower."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(graph),
        str(out_path),
        op_types_to_quantize=["Conv", "Gemm", "MatMul"],
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        weight_type=QuantType.QInt8,
    )


def quantize_dynamic_any(graph: Path, out_path: Path, config: QuantConfig) -> None:
    """Dynamic int8 of any graph's matrix products and recurrent cells (``DYNAMIC_OPS``),
    inside control-flow branches too.

    Convolutions stay fp32: dynamic ``ConvInteger`` quantizes every activation on every run,
    which made EfficientNet-Lite0 8.5-10x slower than fp32 here and broke a voice detector's STFT
    front end (relative error 0.91, 5 of 314 speech frames flagged; its int8 LSTM alone: 0.003,
    all 314). Convolutional graphs take ``int8-static``.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(graph),
        str(out_path),
        op_types_to_quantize=list(DYNAMIC_OPS),
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        weight_type=QuantType.QInt8,
        extra_options={**_EXTRA_OPTIONS, "EnableSubgraph": True},
    )


@dataclass(frozen=True)
class StaticResult:
    """What a static quantization kept in float: every node's name (``kept_fp32``), with
    ``float_nodes="sensitivity"`` how they were chosen (``sensitivity``), and with
    ``weight_rounding="gptq"`` what the re-rounding changed (``rounding``), for the report."""

    kept_fp32: list[str]
    sensitivity: dict[str, Any] | None = None
    rounding: dict[str, Any] | None = None


def quantize_static_cnn(
    graph: Path,
    out_path: Path,
    config: QuantConfig,
    *,
    feeds: Sequence[dict[str, np.ndarray]],
    tuning: Tuning | None = None,
    threads: int | None = None,
) -> StaticResult:
    """Static QDQ of a pre-processed CNN graph, calibrated on ``feeds``.

    ``config.qdq_rules`` "qnn" builds the graph with onnxruntime's QNN helpers
    (``qnn_preprocess_model``, then ``get_qnn_qdq_config``); "ort" with its generic quantizer,
    per-channel weights (and the AVX2 workarounds of ``ort_compat`` when the preset asks).
    ``config.float_nodes`` "sensitivity" keeps in float the fewest nodes that let ``tuning``
    (images neither calibration nor the gate use) reach its target: ``sensitivity``.
    """
    import onnx
    from onnxruntime.quantization import quantize

    if config.qdq_rules == "qnn":
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

        prepped = out_path.with_name(out_path.stem + "-qnn-pre.onnx")
        source = prepped if ort_compat.qnn_preprocess(graph, prepped) else graph
        qnn_config = get_qnn_qdq_config(
            str(source), _TextReader(feeds), per_channel=config.per_channel, **_types(config)
        )
        quantize(str(source), str(out_path), qnn_config)
        return StaticResult([])

    model = onnx.load(str(graph))
    fixed = ort_compat.float_input_nodes(model) if config.avx2_saturation_workaround else []
    options: dict[str, Any] = {
        # int8 activations go symmetric (zero point 0), as NPUs and S8S8 kernels expect
        "ActivationSymmetric": config.activation_symmetric or config.activation_type == "int8",
        "CalibPercentile": config.calibration_percentile,
    }
    if config.avx2_saturation_workaround:
        options["TensorQuantOverrides"] = ort_compat.avx2_weight_overrides(model)

    rounded: dict[Path, dict[str, Any]] = {}  # each written graph's re-rounding record

    def write(exclude: Sequence[str], out: Path) -> None:
        _quantize_ort(
            graph,
            out,
            config,
            feeds,
            [*fixed, *ort_compat.with_activations(model, exclude)],
            options,
        )
        if config.weight_rounding == "gptq":
            layers = rounding.round_weights(out, graph, feeds=feeds, out_path=out, threads=threads)
            rounded[out] = _rounding_record(layers)

    if config.float_nodes == "fixed" or tuning is None or config.max_float_nodes == 0:
        write([], out_path)
        return StaticResult(fixed, rounding=rounded.get(out_path))
    work = out_path.with_name(out_path.stem + "-sensitivity")
    work.mkdir(exist_ok=True)
    tried, count, first, best = choose_float_nodes(
        write, graph, tuning, work_dir=work, max_float_nodes=config.max_float_nodes,
        threads=threads,
    )  # fmt: skip
    record_rounding = rounded.get(best)
    best.replace(out_path)
    record = {
        "tune_inputs": sum(len(next(iter(feed.values()))) for feed in tuning.feeds),
        "tune_target": round(tuning.target, 6),
        "tune_score_all_int8": round(first, 6),
        "float_nodes": [node.to_dict() for node in tried[:count]],
        # tried after those and not kept: the tune score did not rise
        "tried": [node.to_dict() for node in tried[count:]],
    }
    chosen = tried[:count]
    return StaticResult(
        [*fixed, *ort_compat.with_activations(model, [n.name for n in chosen])],
        record,
        record_rounding,
    )


def _rounding_record(layers: Sequence[rounding.LayerRounding]) -> dict[str, Any]:
    """The report's summary of a re-rounding: how many layers, and their summed output error on
    the calibration data with nearest and with compensated rounding."""
    nearest = sum(layer.nearest for layer in layers)
    error = sum(layer.error for layer in layers)
    return {
        "method": "gptq",
        "layers": len(layers),
        "calibration_output_error_nearest": round(nearest, 6),
        "calibration_output_error": round(error, 6),
        "layers_improved": sum(layer.error < layer.nearest for layer in layers),
    }


def _quantize_ort(
    graph: Path,
    out_path: Path,
    config: QuantConfig,
    feeds: Sequence[dict[str, np.ndarray]],
    exclude: list[str],
    options: dict[str, Any],
) -> None:
    from onnxruntime.quantization import QuantFormat, quantize_static

    quantize_static(
        str(graph),
        str(out_path),
        _TextReader(feeds),
        quant_format=QuantFormat.QDQ,
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        nodes_to_exclude=exclude,
        extra_options=dict(options),
        **_types(config),
    )


def _types(config: QuantConfig) -> dict[str, Any]:
    """onnxruntime's calibration method, activation and weight types named by ``config``."""
    from onnxruntime.quantization import CalibrationMethod, QuantType

    return {
        "calibrate_method": getattr(CalibrationMethod, _METHODS[config.calibration_method]),
        "activation_type": getattr(QuantType, _QUANT_TYPES[config.activation_type]),
        "weight_type": getattr(QuantType, _QUANT_TYPES[config.weight_type]),
    }


def static_info(config: QuantConfig, result: StaticResult) -> dict[str, Any]:
    """The manifest's ``quantization`` fields of a static QDQ graph made with ``config``."""
    info: dict[str, Any] = {
        "format": "QDQ",
        "rules": config.qdq_rules,
        "activation_type": config.activation_type,
        "weight_type": config.weight_type,
        "per_channel": config.per_channel,
        "reduce_range": config.reduce_range,
        "avx2_saturation_workaround": config.avx2_saturation_workaround,
        "calibration_method": config.calibration_method,
        "calibration_size": config.calibration_size,
        "float_nodes": config.float_nodes,
        "kept_fp32": result.kept_fp32,
    }
    if config.calibration_method == "percentile":
        info["calibration_percentile"] = config.calibration_percentile
    if result.sensitivity is not None:
        info["sensitivity"] = result.sensitivity
    info["weight_rounding"] = config.weight_rounding
    if result.rounding is not None:
        info["rounding"] = result.rounding
    return info


def convert_fp16(graph: Path, out_path: Path) -> None:
    """fp16 weights and activations with fp32 inputs and outputs; the ops in
    ``ort_compat.FP16_KEEP_FP32_OPS`` stay fp32."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(
        onnx.load(str(graph)), keep_io_types=True, op_block_list=list(ort_compat.FP16_KEEP_FP32_OPS)
    )
    onnx.save(model, str(out_path))
