"""Which nodes of a static QDQ graph to keep in float: the fewest that let it pass its gate.

Used by ``quantize.quantize_static_cnn`` when a preset says ``float_nodes="sensitivity"`` (any
static QDQ target built with onnxruntime's generic rules: the CPU presets, ``npu_openvino``).
Three disjoint image sets take part: calibration fixes the ranges, a *tune* set (this module's
``Tuning``) ranks the nodes and decides how many stay float, the gate's own set judges the
result afterwards, so the gate never measures on data that chose anything.

1. **Rank.** For each node with weights of the fully quantized graph, a copy where only that
   node reads its fp32 weights and bias (what excluding it changes: its input is still rounded
   when its producer is quantized). The node's gain is how much that lowers the tune loss (KL
   divergence of the classes for a classifier). One session per node, no re-calibration.
   Each step's score below is measured as the runtime runs the graph: a gain that onnxruntime
   takes back (``ort_compat.FLOAT_COPY_DISABLED``) shows there and the node goes on.
2. **Exclude in order.** Re-quantize with the best-ranked node kept float
   (``nodes_to_exclude``), then the two best, ..., until the tune score (the gate's own metric)
   reaches the target, at most ``max_float_nodes``; each step's score is in the report.

Each kept node costs speed: its share of the graph's multiply-accumulates is reported beside
its gain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.export.passes import ort_compat

__all__ = [
    "RANKED_OPS",
    "FloatNode",
    "Tuning",
    "choose_float_nodes",
    "float_copy",
    "macs_shares",
    "rank_nodes",
    "run_outputs",
]

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
Outputs = list[np.ndarray]  # the graph's first output, one array per tune feed
# The nodes whose float copy is tried: those with weights to round.
RANKED_OPS = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class Tuning:
    """The tune set and how it is judged.

    Args:
        feeds: the graph's inputs, one dict per run (no image of the calibration or the gate).
        loss: the candidate's outputs -> a loss against fp32 (lower is better), to rank nodes.
        score: the candidate's outputs -> the gate's metric on the tune set (higher is better).
        target: the score to reach (the gate's bar plus a margin).
    """

    feeds: Sequence[Feeds]
    loss: Callable[[Outputs], float]
    score: Callable[[Outputs], float]
    target: float


@dataclass(frozen=True)
class FloatNode:
    """One node kept in float: its ``gain`` (tune loss lowered by floating it alone), its
    ``cost`` (share of the graph's multiply-accumulates) and the tune ``score`` once it and
    every node before it are float."""

    name: str
    op_type: str
    gain: float
    cost: float
    score: float

    def to_dict(self) -> dict[str, Any]:
        """The report's entry."""
        return {
            "node": self.name,
            "op_type": self.op_type,
            "tune_loss_gain": round(self.gain, 6),
            "macs_share": round(self.cost, 6),
            "tune_score_after": round(self.score, 6),
        }


def run_outputs(
    model: Any, feeds: Sequence[Feeds], *, threads: int | None, disabled: Sequence[str] = ()
) -> Outputs:
    """The first output of ``model`` (a path or a ModelProto) on each feed, in a session
    without the ``disabled`` graph optimizers."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(
        source, options, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
    )
    return [session.run(None, feed)[0] for feed in feeds]


def float_copy(qdq: Any, fp32_weights: dict[str, Any], node_name: str) -> Any:
    """A copy of ``qdq`` where ``node_name`` reads its fp32 weights and bias: what
    ``nodes_to_exclude`` changes for it (its activations stay rounded where its neighbours
    are quantized)."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    node = next(n for n in graph.node if n.name == node_name)
    for index, name in enumerate(node.input):
        dq = producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        original = dq.input[0].removesuffix("_quantized")
        if original in fp32_weights:
            weight = onnx.TensorProto()
            weight.CopyFrom(fp32_weights[original])
            weight.name = f"{original}_float"
            graph.initializer.append(weight)
            node.input[index] = weight.name
    return model


def rank_nodes(
    qdq_graph: Path, fp32_graph: Path, tuning: Tuning, *, threads: int | None = None
) -> list[tuple[str, str, float]]:
    """(node, op type, gain) of every ``RANKED_OPS`` node of ``qdq_graph``, best gain first;
    only nodes whose float copy lowers the tune loss."""
    import onnx

    qdq = onnx.load(str(qdq_graph))
    weights = {i.name: i for i in onnx.load(str(fp32_graph)).graph.initializer}
    base = tuning.loss(run_outputs(qdq, tuning.feeds, threads=threads))
    gains = []
    for node in qdq.graph.node:
        if node.op_type not in RANKED_OPS:
            continue
        copy = float_copy(qdq, weights, node.name)
        outputs = run_outputs(
            copy, tuning.feeds, threads=threads, disabled=ort_compat.FLOAT_COPY_DISABLED
        )
        gain = base - tuning.loss(outputs)
        if gain > 0:
            gains.append((node.name, node.op_type, gain))
    return sorted(gains, key=lambda g: -g[2])


def macs_shares(fp32_graph: Path) -> dict[str, float]:
    """Each Conv/Gemm/MatMul node's share of the graph's multiply-accumulates (batch 1)."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(fp32_graph)))
    shapes = {
        v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
        for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]
    }
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    macs: dict[str, float] = {}
    for node in model.graph.node:
        weight = weights.get(node.input[1]) if len(node.input) > 1 else None
        out = shapes.get(node.output[0])
        if weight is None or out is None or node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        if node.op_type == "Conv":  # every output element sums C_in/group x kH x kW products
            macs[node.name] = float(np.prod(out)) * float(np.prod(weight[1:]))
        else:  # [K, N] (or [N, K]) weights, one row of the batch-1 input
            macs[node.name] = float(np.prod(weight))
    total = sum(macs.values()) or 1.0
    return {name: value / total for name, value in macs.items()}


def choose_float_nodes(
    quantize: Callable[[Sequence[str], Path], None],
    fp32_graph: Path,
    tuning: Tuning,
    *,
    work_dir: Path,
    max_float_nodes: int,
    threads: int | None = None,
) -> tuple[list[FloatNode], int, float, Path]:
    """The fewest top-ranked nodes to keep float for ``tuning.target``.

    ``quantize(exclude, out)`` writes the static QDQ graph with ``exclude`` in float. Returns
    every node tried (in rank order, with its gain, cost and the tune score once it and those
    before it are float), how many of them are kept, the tune score of the fully quantized
    graph, and the graph chosen: the first that reaches the target, else the best-scoring one
    (fewest nodes among equals).
    """
    start = work_dir / "sensitivity-0.onnx"
    quantize([], start)
    first = tuning.score(run_outputs(start, tuning.feeds, threads=threads))
    best: tuple[float, int, Path] = (first, 0, start)
    kept: list[FloatNode] = []
    if first >= tuning.target:
        return kept, 0, first, start
    shares = macs_shares(fp32_graph)
    for name, op_type, gain in rank_nodes(start, fp32_graph, tuning, threads=threads):
        if len(kept) == max_float_nodes:
            break
        graph = work_dir / f"sensitivity-{len(kept) + 1}.onnx"
        quantize([*(k.name for k in kept), name], graph)
        score = tuning.score(run_outputs(graph, tuning.feeds, threads=threads))
        kept.append(FloatNode(name, op_type, gain, shares.get(name, 0.0), score))
        log.info("kept %s in float: tune score %.4f", name, score)
        if score > best[0]:
            best = (score, len(kept), graph)
        if score >= tuning.target:
            break
    return kept, best[1], first, best[2]
