"""How much of a graph's arithmetic runs in int8: the multiply-accumulates (MACs) of its
convolutions and matrix products, and the share of them that integer kernels compute.

A dynamic int8 export quantizes MatMul and Gemm only; on a convolutional network that is the
classifier head, a few per cent of the MACs, and calling the package "int8" would promise a
speed and a size it does not have. The share is read from the graph after ONNX shape
inference (a symbolic dim counts as 1): a node is int8 when its op is an integer kernel
(``ConvInteger``, ``MatMulInteger``, ``QLinear*``, ``DynamicQuantizeMatMul``, ...) or, in QDQ
form, when both its activation and its weight come out of ``DequantizeLinear``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MacShare", "mac_share"]

_CONVS = ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose")
_PRODUCTS = (
    "MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "QGemm",
)  # fmt: skip
_INTEGER_OPS = (
    "ConvInteger", "QLinearConv", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "QGemm",
)  # fmt: skip
# The weight input of each op (QLinear ops interleave scales and zero points).
_WEIGHT_INPUT = {"QLinearConv": 3, "QLinearMatMul": 3}


@dataclass(frozen=True)
class MacShare:
    """A graph's MACs per run and the int8 ones among them."""

    total: int
    int8: int

    @property
    def share(self) -> float:
        """The int8 share of the MACs (0 for a graph without convolutions or products)."""
        return self.int8 / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the manifest and the report."""
        return {"macs": self.total, "int8_macs": self.int8, "int8_mac_share": round(self.share, 4)}


def mac_share(graph: Path) -> MacShare:
    """The MACs of ``graph`` and how many of them run in int8."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:
        pass  # nodes without shapes count as unknown (0 MACs)
    shapes = {v.name: _dims(v) for v in [*model.graph.value_info, *model.graph.input,
                                          *model.graph.output]}  # fmt: skip
    shapes.update({t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer})
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    total = int8 = 0
    for node in model.graph.node:
        macs = _macs(node, shapes)
        total += macs
        if node.op_type in _INTEGER_OPS or _dequantized(node, producers):
            int8 += macs
    return MacShare(total=total, int8=int8)


def _dims(value: Any) -> tuple[int, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else 1
                 for d in value.type.tensor_type.shape.dim)  # fmt: skip


def _macs(node: Any, shapes: dict[str, tuple[int, ...]]) -> int:
    """Multiply-accumulates of one convolution or matrix product (0 for other ops, or when
    shape inference left its shapes unknown)."""
    if node.op_type not in _CONVS and node.op_type not in _PRODUCTS:
        return 0
    out = shapes.get(node.output[0])
    weight = (
        shapes.get(node.input[_WEIGHT_INPUT.get(node.op_type, 1)]) if len(node.input) > 1 else None
    )
    first = shapes.get(node.input[0])
    if not out or not weight or not first:
        return 0
    size = 1
    for d in out:
        size *= d
    if node.op_type in _CONVS:
        kernel = 1
        for d in weight[1:]:
            kernel *= d
        return size * kernel
    transposed = node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute)
    inner = first[-2] if transposed and len(first) >= 2 else first[-1]
    return size * inner


def _dequantized(node: Any, producers: dict[str, str]) -> bool:
    """A QDQ node: its activation and its weight both come out of ``DequantizeLinear``."""
    if node.op_type not in ("Conv", "MatMul", "Gemm", "ConvTranspose") or len(node.input) < 2:
        return False
    return all(producers.get(name) == "DequantizeLinear" for name in node.input[:2])
