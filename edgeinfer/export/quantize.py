"""Quantization with onnxruntime's quantizer, driven by a ``QuantConfig`` preset.

Every onnxruntime-version workaround of the export lives in this module, each with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import QuantConfig

__all__ = ["quantize_dynamic_int8", "quantize_static_int8"]

log = logging.getLogger(__name__)

# Workaround: the transformer optimizer's output holds contrib ops (Attention, SkipLayerNorm)
# whose outputs have no inferred type; the quantizer then stops with "tensor type unknown"
# unless it is told to assume float.
_FLOAT = 1  # onnx.TensorProto.FLOAT
_EXTRA_OPTIONS = {"DefaultTensorType": _FLOAT}


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
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepped = work_dir / "preprocessed.onnx"
    # Workaround: symbolic shape inference fails on the fused contrib ops; ONNX shape inference
    # and the graph clean-up still run.
    quant_pre_process(str(graph), str(prepped), skip_symbolic_shape=True)
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

    Workaround: the weights are *unsigned* (QUInt8). With signed per-channel weights every
    column spans the full [-127, 127] range, and onnxruntime's AVX2 u8 x s8 ``MatMulInteger``
    kernel saturates its int16 pairwise sums (255 x 127 x 2 > 32767): on SmolLM2 perplexity
    went from 32 to 1e7 and next-token agreement to 0.06 %. An isolated ``MatMulInteger`` with
    those weights was off by 21487 from the exact integer product (onnxruntime 1.32, AMD EPYC
    without VNNI); ``reduce_range`` is not applied to per-channel MatMul weights. Per-tensor
    scales leave most weights small, so saturation is rare there, which is why only per-channel
    broke. The u8 x u8 kernel has no such saturation.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(graph),
        str(out_path),
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        weight_type=QuantType.QUInt8,
        nodes_to_exclude=list(exclude),
        extra_options={**_EXTRA_OPTIONS, "MatMulConstBOnly": True},
    )


def quantize_weight_only(
    graph: Path,
    out_path: Path,
    *,
    bits: int,
    block_size: int = 32,
    exclude: Sequence[str] = (),
    include: Sequence[str] | None = None,
    accuracy_level: int = 4,
) -> None:
    """Weight-only int8/int4 ``MatMulNBits`` (blockwise, symmetric) of a decoder graph.

    accuracy_level 4 lets the CPU kernel quantize activations to int8 per block and use integer
    dot products (VNNI/AVX2/sdot), the fastest path on CPUs; 1 keeps activations fp32 (weights
    dequantized per block), slower but exact up to the weights. Symmetric blocks: asymmetric
    ones wrote zero-point layouts that some onnxruntime builds failed to load (probe with
    onnxruntime-genai's builder).
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(graph))
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        nodes_to_exclude=list(exclude),
        nodes_to_include=list(include) if include is not None else None,
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(out_path))
