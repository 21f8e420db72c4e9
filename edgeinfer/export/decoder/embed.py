"""The decoder's token embedding in 8-bit blocks: ``GatherBlockQuantized`` instead of a float32
``Gather``.

An fp32 embedding table is most of a small LLM's package: Gemma 3 270M's 262,144 x 640 table is
671 MB of a 977 MB int8 graph. When the embedding is tied to an 8-bit ``MatMulNBits`` lm_head
(the head is the table, quantized in blocks along the hidden axis: exactly the layout a
row gather needs), the Gather reads the head's own initializers and the table costs no byte;
otherwise the table is quantized on its own (symmetric 8-bit blocks of 32, one fp32 scale each,
as ``MatMulNBits`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConversionError
from edgeinfer.export.package import save_graph

__all__ = ["quantize_embedding"]

_GATHER, _TABLE, _BLOCK = "/embed/Gather", "model.embed_tokens.weight", 32


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _shared_head(graph: Any, table: np.ndarray, inits: dict[str, Any]) -> Any | None:
    """The 8-bit ``MatMulNBits`` lm_head whose weights are ``table`` quantized, or None."""
    from onnx import numpy_helper

    head = next((n for n in graph.node if n.name.startswith("/lm_head/")), None)
    if head is None or head.op_type != "MatMulNBits" or len(head.input) != 3:
        return None
    attrs = _attrs(head)
    block = int(attrs.get("block_size", 0))
    if attrs.get("bits") != 8 or not block or table.shape[1] % block:
        return None
    vocab, hidden = table.shape
    q = numpy_helper.to_array(inits[head.input[1]]).astype(np.float32)  # [V, d/blk, blk]
    scales = numpy_helper.to_array(inits[head.input[2]]).reshape(vocab, hidden // block, 1)
    error = np.abs((q - 128) * scales - table.reshape(q.shape))
    return head if bool((error <= 1.01 * np.abs(scales) + 1e-12).all()) else None  # tied


def quantize_embedding(graph_path: Path, out_path: Path, *, block_size: int = _BLOCK) -> None:
    """Write ``graph_path`` with its embedding gathered from 8-bit blocks to ``out_path``
    (blocks of ``block_size`` when the table is quantized on its own)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(graph_path))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    gather = next((n for n in graph.node if n.name == _GATHER), None)
    if gather is None or gather.input[0] != _TABLE:
        raise ConversionError(f"{graph_path} has no float32 embedding Gather to quantize")
    table = numpy_helper.to_array(inits[_TABLE]).astype(np.float32)  # [V, d]
    vocab, hidden = table.shape
    head = _shared_head(graph, table, inits)
    block = int(_attrs(head)["block_size"]) if head is not None else block_size
    blocks = hidden // block
    new_nodes = []
    if head is not None:  # the head's [V, d/32, 32] bytes; its scales seen as [V, d/32, 1]
        data, axis = head.input[1], 2
        shape = numpy_helper.from_array(
            np.array([vocab, blocks, 1], np.int64), "/embed/scales_shape"
        )
        graph.initializer.append(shape)
        new_nodes.append(
            helper.make_node(
                "Reshape", [head.input[2], shape.name], ["/embed/scales"], name="/embed/Reshape"
            )
        )
        scales, gathered = "/embed/scales", "/embed/blocks"
    else:  # symmetric 8-bit blocks along the hidden axis, zero point 128 (the op's default)
        amax = np.abs(table.reshape(vocab, blocks, block)).max(-1)  # [V, d/32]
        step = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        q = np.rint(table.reshape(vocab, blocks, block) / step[..., None]) + 128
        graph.initializer.extend(
            [
                numpy_helper.from_array(q.reshape(vocab, hidden).astype(np.uint8), f"{_TABLE}_Q8"),
                numpy_helper.from_array(step, f"{_TABLE}_scales"),
            ]
        )
        data, axis, scales, gathered = f"{_TABLE}_Q8", 1, f"{_TABLE}_scales", gather.output[0]
    new_nodes.append(
        helper.make_node(
            "GatherBlockQuantized",
            [data, gather.input[1], scales],
            [gathered],
            name="/embed/GatherBlockQuantized",
            domain="com.microsoft",
            bits=8,
            block_size=block,
            gather_axis=0,
            quantize_axis=axis,
        )
    )
    if head is not None:  # [B, S, d/32, 32] -> [B, S, d]
        flat = numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "/embed/flat_shape")
        graph.initializer.append(flat)
        new_nodes.append(
            helper.make_node(
                "Reshape", [gathered, flat.name], [gather.output[0]], name="/embed/Flatten"
            )
        )
    index = list(graph.node).index(gather)
    graph.node.remove(gather)
    for offset, node in enumerate(new_nodes):
        graph.node.insert(index + offset, node)
    graph.initializer.remove(inits[_TABLE])
    save_graph(model, out_path)
