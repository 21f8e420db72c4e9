"""Every onnxruntime-version workaround of the export, in one place, each with its reason.

Measured with onnxruntime 1.32 on a 2-core x86-64 AVX2 CPU without VNNI (the AVX2 workarounds)
and on an AVX-512 VNNI Xeon (the sensitivity pass's). When onnxruntime changes, this module is
the one to re-check (``tests/vision`` fails if a workaround breaks).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "DECODER_WEIGHT_TYPE",
    "FLOAT_COPY_DISABLED",
    "FP16_KEEP_FP32_OPS",
    "UNTYPED_AS_FLOAT",
    "avx2_weight_overrides",
    "fix_batch",
    "float_input_nodes",
    "inline_attribute_data",
    "preprocess",
    "preprocess_any",
    "qnn_preprocess",
    "with_activations",
]

# The transformer optimizer's output holds contrib ops (Attention, SkipLayerNorm) whose
# outputs have no inferred type; the quantizer then stops with "tensor type unknown" unless it
# is told to assume float (1 = onnx.TensorProto.FLOAT).
UNTYPED_AS_FLOAT: Mapping[str, int] = MappingProxyType({"DefaultTensorType": 1})

# Decoder MatMul weights are *unsigned*. With signed per-channel weights every column spans
# the full [-127, 127] range, and onnxruntime's AVX2 u8 x s8 ``MatMulInteger`` kernel saturates
# its int16 pairwise sums (255 x 127 x 2 > 32767): on SmolLM2 perplexity went from 32 to 1e7
# and next-token agreement to 0.06 %. An isolated ``MatMulInteger`` with those weights was off
# by 21487 from the exact integer product (onnxruntime 1.32, AMD EPYC without VNNI);
# ``reduce_range`` is not applied to per-channel MatMul weights there. Per-tensor scales leave
# most weights small, so saturation is rare there, which is why only per-channel broke. The
# u8 x u8 kernel has no such saturation.
DECODER_WEIGHT_TYPE = "QUInt8"

# The fp16 converter keeps these ops in fp32: reductions whose sums can pass fp16's 65504,
# ops whose outputs need fp32 resolution (probabilities, coordinates), all cheap next to the
# convolutions. (On x86, onnxruntime's CPU provider has fp16 kernels for none of this CNN's
# ops: its InsertCastTransformer runs Conv, Clip and Gemm in fp32 between Casts, which is why
# an fp16 package runs on the CPU at all, for parity, and never faster there.)
FP16_KEEP_FP32_OPS = (
    "GlobalAveragePool",
    "ReduceMean",
    "Softmax",
    "TopK",
    "Resize",
    "Range",
    "NonMaxSuppression",
)


def preprocess(graph: Path, out_path: Path, *, contrib_ops: bool = False) -> None:
    """onnxruntime's recommended pre-processing before quantization: symbolic shape inference,
    its graph optimizations (constant folding folds the exporter's "same" padding into the
    convolutions) and ONNX shape inference.

    Workaround, ``contrib_ops``: symbolic shape inference fails on the transformer optimizer's
    fused contrib ops, so it is skipped for those graphs; the rest still runs.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(graph), str(out_path), skip_symbolic_shape=contrib_ops)


def preprocess_any(graph: Path, out_path: Path) -> None:
    """``preprocess`` for a graph from anywhere (a user's file): with symbolic shape inference
    when it works, without it when it does not.

    Workaround: onnxruntime's symbolic shape inference raises on graphs it does not know
    (control flow such as ``If`` branches on a sample rate, some contrib ops);
    ONNX's own shape inference and the optimizations still apply without it.

    Workaround: when it fails it saves its half-inferred model, with an external-data file named
    by a fresh uuid, into the current directory and leaves that file there; it runs from a
    scratch directory instead. Node attributes' external tensors are read inline first
    (``inline_attribute_data``).
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target = str(out_path.resolve())
    with tempfile.TemporaryDirectory(prefix="edgeinfer-shapes-") as scratch:
        source = str(inline_attribute_data(graph, Path(scratch) / graph.name).resolve())
        cwd = os.getcwd()
        os.chdir(scratch)
        try:
            quant_pre_process(source, target)
        except Exception:  # any failure of the optional symbolic pass
            quant_pre_process(source, target, skip_symbolic_shape=True)
        finally:
            os.chdir(cwd)


def inline_attribute_data(graph: Path, out_path: Path) -> Path:
    """``graph``, or a copy at ``out_path`` whose node attributes hold their tensors inline
    (initializers stay in the file beside it) when some of them lie in external data.

    Workaround: onnxruntime's pre-processing (``quant_pre_process``) re-saves the model into a
    scratch folder with only the initializers external; a ``Constant`` node's value left in
    external data (Paddle exports keep every weight there) then points to a file that was
    never written there, and it stops with onnx's "should be stored in ... but it is not
    regular file".
    """
    import onnx

    from edgeinfer.export import package

    bare = onnx.load(str(graph), load_external_data=False)
    external = onnx.TensorProto.EXTERNAL
    if all(t.data_location != external for t in package.node_tensors(bare.graph)):
        return graph
    beside = any(t.data_location == external for t in bare.graph.initializer)
    model = onnx.load(str(graph))  # every tensor read into memory
    onnx.save(model, str(out_path), save_as_external_data=beside,
              location=f"{out_path.name}.data", size_threshold=1024)  # fmt: skip
    return out_path


def avx2_weight_overrides(model: Any) -> dict[str, list[dict[str, Any]]]:
    """7-bit weights for every convolution and Gemm that onnxruntime runs as an int8 GEMM.

    Workaround: the AVX2 u8 x s8 kernel (no VNNI) sums pairs of products into int16
    (``vpmaddubsw``) and saturates once two uint8 activations near 255 meet two weights near
    127 (255 x 127 x 2 > 32767). ReLU6 networks put many activations at the top of their range.
    Probe on 100 small crops of the built-in photos, EfficientNet-Lite0: full 8-bit weights
    kept 38 % top-1 agreement with fp32 (logit correlation 0.85); the same graph without
    saturation (session option ``session.x64quantprecision=1``, slower than fp32 here) 73 %
    (correlation 0.99). ``reduce_range`` on every weight gave 58 %: it also halves the depthwise
    weights, whose kernel does not saturate and whose 9 taps per channel need the 8th bit. So
    only GEMM-backed weights get 7 bits (per-channel, through tensor overrides); with the stem
    in fp32 too (``float_input_nodes``) that probe reached 78 % (gate numbers: docs/vision.md).
    """
    overrides: dict[str, list[dict[str, Any]]] = {}
    for node in model.graph.node:
        if node.op_type == "Conv":
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if group == 1:
                overrides[node.input[1]] = [{"axis": 0, "reduce_range": True}]
        elif node.op_type in ("Gemm", "MatMul") and len(node.input) > 1:
            overrides[node.input[1]] = [{"reduce_range": True}]
    return overrides


# The sensitivity pass's float copies run without onnxruntime's ``WeightBiasQuantization``
# optimizer: it gives a Conv or Gemm that reads a dequantized input and float weights, and
# feeds a QuantizeLinear, per-tensor int8 weights at session start (onnxruntime 1.20 on). A
# node kept float by ``nodes_to_exclude`` meets it too where its output goes straight to a
# quantized consumer: the pass measures each exclusion in a default session, so such a node
# shows no gain there and the next one is tried.
FLOAT_COPY_DISABLED = ("WeightBiasQuantization",)


def with_activations(model: Any, names: Sequence[str]) -> list[str]:
    """``names`` and the activation (Clip, Relu) that each one feeds alone.

    Workaround: a Conv excluded alone keeps its ReLU6 quantized, and then feeds a
    QuantizeLinear: onnxruntime gives it per-tensor weights (``FLOAT_COPY_DISABLED``), worse
    than the per-channel ones it had. EfficientNet-Lite0, one depthwise convolution excluded
    alone: tune agreement 97.3 % -> 75.9 %. Excluded with its activation, both run in float.
    """
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    by_name = {n.name: n for n in model.graph.node}
    out = []
    for name in names:
        out.append(name)
        after = consumers.get(by_name[name].output[0], [])
        if len(after) == 1 and after[0].op_type in ("Clip", "Relu"):
            out.append(after[0].name)
    return out


def float_input_nodes(model: Any) -> list[str]:
    """Nodes that read a graph input directly (a CNN's stem convolution): left in fp32.

    Workaround, same cause as ``avx2_weight_overrides``: the stem sees the whole image range,
    and its 27 taps per filter lost the most at 7 bits (same probe, crops where fp32 is
    decided: agreement 91.5 % -> 96.3 % with the stem in fp32); it is ~3 % of the FLOPs.
    """
    inputs = {i.name for i in model.graph.input}
    return [n.name for n in model.graph.node if n.op_type == "Conv" and n.input[0] in inputs]


def qnn_preprocess(graph: Path, out_path: Path) -> bool:
    """onnxruntime's ``qnn_preprocess_model`` on ``graph``; True when it wrote ``out_path``.

    Workaround: it fails with "cannot convert dictionary update sequence element" on a model
    that carries ``metadata_props`` (it updates a dict with the protobuf entries), and
    ``quant_pre_process`` writes one; the props only describe earlier tools, so they go.
    """
    import onnx
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    model = onnx.load(str(graph))
    del model.metadata_props[:]
    return bool(qnn_preprocess_model(model, str(out_path)))


def fix_batch(graph: Path, out_path: Path, *, batch: int) -> None:
    """Write ``graph`` with its symbolic batch dimension set to ``batch`` everywhere, then
    re-infer shapes so every tensor has a static shape (NPU compilers need them)."""
    import onnx
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_dim_param_fixed

    model = onnx.load(str(graph))
    names = {
        d.dim_param
        for v in [*model.graph.input, *model.graph.output]
        for d in v.type.tensor_type.shape.dim
        if d.dim_param
    }
    for name in names:
        make_dim_param_fixed(model.graph, name, batch)
    fix_output_shapes(model)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.save(model, str(out_path))
