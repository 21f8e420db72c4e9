"""The quantized lm_head's top-K refinement: exact logits for the few tokens that can win.

A ``MatMulNBits`` head at accuracy level 4 quantizes the final hidden state to int8 per block
before its integer dot products; over a 49k vocabulary that moves the logits by ~0.1 and flips
the argmax at near-ties (SmolLM2: next-token agreement 94.9 % with fp32, below the gate). Its
level-1 kernel (fp32 activations) dequantizes the whole table per run and is 5x slower. So the
fast head ranks all tokens, and for the ``K`` best of each row the graph recomputes the logit in
fp32 from 8-bit rows (``GatherBlockQuantized`` dequantizes just those rows) and writes it back in
place: the argmax and every likely token's logit are then exact up to the weights' 8-bit
rounding, whatever the ranking head's own precision.

The rows come from the 8-bit embedding table when the head is tied to it (the ranking head may
then be a smaller copy: 2 or 4 bits), else from the 8-bit head's own initializers.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from edgeinfer.errors import ConversionError
from edgeinfer.export.package import save_graph

__all__ = ["REFINE_TOKENS", "refine_head", "split_head"]

# The true argmax is among the ranking head's 64 best on every held position seen (a 2-bit
# ranking head is off by ~1 logit; the 64th best trails the best by several logits).
REFINE_TOKENS = 64
_EMBED = "/embed/GatherBlockQuantized"
# The most weight bytes one piece of a split head holds: onnxruntime prepacks a weight in one
# allocation, and a load that maps prepacks from a file (``runtime.prepacked``) still builds
# each one on the heap before it takes the file's copy, so the largest weight is the load's
# transient: Gemma 3's 262k-row 4-bit head is 84 MB of weights, ~100 MB prepacked.
SPLIT_WEIGHT_BYTES = 8 * 2**20


class _Rows(NamedTuple):
    """Where the 8-bit rows [V, d] are: data, scales (reshaped as the gather needs) and the
    ``GatherBlockQuantized`` attributes."""

    data: str
    scales: str
    block: int
    quantize_axis: int
    blocked: bool  # data is [V, d/block, block] (a MatMulNBits B), not [V, d]


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _rows(graph: Any, head: Any, hidden: int) -> _Rows | None:
    """The 8-bit source of the head's rows: the embedding table when the head is tied to it
    (the exporter quantizes the head only from the tied table), else an 8-bit head itself."""
    attrs = _attrs(head)
    embed = next((n for n in graph.node if n.name == _EMBED), None)
    if embed is not None and (attrs.get("bits") != 8 or embed.input[0] == head.input[1]):
        e = _attrs(embed)
        if int(e.get("bits", 0)) == 8:
            if embed.input[0] == head.input[1]:  # shared: the head's [V, d/b, b] blocks
                return _Rows(head.input[1], embed.input[2], int(e["block_size"]), 2, True)
            return _Rows(embed.input[0], embed.input[2], int(e["block_size"]), 1, False)
    if attrs.get("bits") == 8 and hidden % int(attrs["block_size"]) == 0:
        return _Rows(head.input[1], head.input[2], int(attrs["block_size"]), 2, True)
    return None


def refine_head(
    graph_path: Path, out_path: Path, *, tokens: int = REFINE_TOKENS, tied: bool = True
) -> None:
    """Write ``graph_path`` with its ``MatMulNBits`` lm_head refined to ``out_path``.

    ``tied``: the head is the embedding table (its rows may come from the 8-bit embedding).
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(graph_path))
    graph = model.graph
    head = next((n for n in graph.node if n.name.startswith("/lm_head/")), None)
    if head is None or head.op_type != "MatMulNBits" or len(head.input) < 3:
        raise ConversionError(f"{graph_path} has no MatMulNBits lm_head to refine")
    attrs = _attrs(head)
    vocab, hidden = int(attrs["N"]), int(attrs["K"])
    if not tied and attrs.get("bits") != 8:
        raise ConversionError(f"{graph_path}: an untied head refines from itself: make it 8-bit")
    source = _rows(graph, head, hidden)
    if source is None:
        raise ConversionError(f"{graph_path} has no 8-bit copy of the lm_head to refine from")
    hidden_state, raw = head.input[0], head.output[0]  # [B, R, d], [B, R, V]
    approx = f"{raw}_approx"
    head.output[0] = approx

    def const(name: str, value: np.ndarray) -> str:
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    n = "/lm_head/refine"
    scales = source.scales
    nodes = [
        helper.make_node(
            "TopK",
            [approx, const(f"{n}/k", np.array([tokens], np.int64))],
            [f"{n}/top_values", f"{n}/top_ids"],  # [B, R, K]
            name=f"{n}/TopK",
            axis=-1,
        )
    ]
    if source.blocked and source.scales == head.input[2]:  # MatMulNBits scales: [V * d/b]
        scales = f"{n}/scales"
        shape = const(f"{n}/scales_shape", np.array([vocab, -1, 1], np.int64))
        nodes.append(
            helper.make_node("Reshape", [head.input[2], shape], [scales], name=f"{n}/Reshape")
        )
    rows = f"{n}/rows"  # [B, R, K, d]
    nodes.append(
        helper.make_node(
            "GatherBlockQuantized",
            [source.data, f"{n}/top_ids", scales],
            [f"{n}/blocks" if source.blocked else rows],
            name=f"{n}/GatherBlockQuantized",
            domain="com.microsoft",
            bits=8,
            block_size=source.block,
            gather_axis=0,
            quantize_axis=source.quantize_axis,
        )
    )
    if source.blocked:  # [B, R, K, d/b, b] -> [B, R, K, d]
        flat = const(f"{n}/rows_shape", np.array([0, 0, 0, hidden], np.int64))
        nodes.append(helper.make_node("Reshape", [f"{n}/blocks", flat], [rows], name=f"{n}/Flat"))
    axis = const(f"{n}/axis", np.array([-1], np.int64))
    nodes += [
        helper.make_node("Unsqueeze", [hidden_state, axis], [f"{n}/column"], name=f"{n}/Column"),
        helper.make_node("MatMul", [rows, f"{n}/column"], [f"{n}/dots"], name=f"{n}/MatMul"),
        helper.make_node("Squeeze", [f"{n}/dots", axis], [f"{n}/exact"], name=f"{n}/Squeeze"),
        helper.make_node(
            "ScatterElements",
            [approx, f"{n}/top_ids", f"{n}/exact"],
            [raw],
            name=f"{n}/ScatterElements",
            axis=-1,
        ),
    ]
    index = list(graph.node).index(head) + 1
    for offset, node in enumerate(nodes):
        graph.node.insert(index + offset, node)
    save_graph(model, out_path)


def split_head(graph_path: Path, out_path: Path, *, max_bytes: int = SPLIT_WEIGHT_BYTES) -> None:
    """Write ``graph_path`` with its ``MatMulNBits`` lm_head split along the vocabulary into
    pieces of at most ``max_bytes`` of weights, their logits concatenated, to ``out_path``.

    The same dot products in the same blocks: the logits are those of the whole head. Only a
    head whose weights no other node reads can be split (a tied 8-bit head is the embedding's
    table: its pieces would be a second copy)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(graph_path))
    graph = model.graph
    head = next(
        (n for n in graph.node if n.name.startswith("/lm_head/") and n.op_type == "MatMulNBits"),
        None,
    )
    if head is None or len(head.input) != 3:
        raise ConversionError(f"{graph_path} has no MatMulNBits lm_head (weights, scales) to split")
    if any(head.input[1] in n.input for n in graph.node if n is not head):
        raise ConversionError(f"{graph_path}: the lm_head's weights are read by other nodes too")
    attrs = _attrs(head)
    inits = {i.name: i for i in graph.initializer}
    weights = numpy_helper.to_array(inits[head.input[1]])  # [N, K/block, block * bits / 8]
    vocab = int(attrs["N"])
    scales = numpy_helper.to_array(inits[head.input[2]]).reshape(vocab, -1)
    pieces = -(-weights.nbytes // max_bytes)
    if pieces < 2:
        save_graph(model, out_path)
        return
    bounds = np.linspace(0, vocab, pieces + 1).astype(np.int64)
    nodes, outputs = [], []
    for index, (start, stop) in enumerate(itertools.pairwise(bounds.tolist())):
        name = f"{head.name}_part{index}"
        for source, part in ((head.input[1], weights), (head.input[2], scales)):
            piece = np.ascontiguousarray(part[start:stop])
            graph.initializer.append(
                numpy_helper.from_array(
                    piece.reshape(-1) if part is scales else piece, f"{source}_part{index}"
                )
            )
        outputs.append(f"{head.output[0]}_part{index}")
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [head.input[0], f"{head.input[1]}_part{index}", f"{head.input[2]}_part{index}"],
                [outputs[-1]],
                name=name,
                domain="com.microsoft",
                **{**attrs, "N": int(stop - start)},
            )
        )
    nodes.append(
        helper.make_node("Concat", outputs, [head.output[0]], name=f"{head.name}_concat", axis=-1)
    )
    index = list(graph.node).index(head)
    graph.node.remove(head)
    for offset, node in enumerate(nodes):
        graph.node.insert(index + offset, node)
    for name in head.input[1:]:
        graph.initializer.remove(inits[name])
    save_graph(model, out_path)
