"""What the export kept: the task's own metric against the PyTorch fp32 reference, and speed.

Candidates are evaluated through the real runtime (``edgeinfer.load`` on a staged package), so the
gate measures exactly what a device will run, tokenizer and post-processing included.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import PackageError
from edgeinfer.export.gates.embeddings import embedding_cosine
from edgeinfer.export.gates.probabilities import label_agreement
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.passes.reference import TorchReference
from edgeinfer.export.source import Source
from edgeinfer.package_io import ExitSegmentsIO, ImageClassifierIO, TextClassifierIO
from edgeinfer.runtime import ClassifyModel, EmbedModel, Model, load

__all__ = ["compare", "load_candidate", "qdq_problems", "run_model", "torch_reference"]


def torch_reference(source: Source, task: str, texts: Sequence[str]) -> np.ndarray:
    """The source model's own outputs in PyTorch fp32, 16 texts per batch."""
    reference = TorchReference(source, task)
    return np.concatenate(
        [reference.run(list(texts[i : i + 16])) for i in range(0, len(texts), 16)]
    )


def run_model(model: Model, inputs: Sequence[Any] | np.ndarray) -> np.ndarray:
    """The candidate's outputs in the reference's form: embeddings [N, D] of texts, or class
    probabilities [N, C] of texts or images, in label order."""
    io = model.manifest.io
    if isinstance(model, ClassifyModel) and isinstance(
        io, (TextClassifierIO, ExitSegmentsIO, ImageClassifierIO)
    ):
        labels = list(io.labels)
        results = model.classify(inputs, batch_size=16)
        return np.array([[r.scores[label] for label in labels] for r in results], np.float32)
    if isinstance(model, EmbedModel):
        return model.embed(list(inputs), batch_size=16)
    raise PackageError(f"{model.path.name} is a {model.task!r} package: no embeddings or labels")


def compare(task: str, reference: np.ndarray, candidate: np.ndarray) -> Verdict:
    """Score ``candidate`` against ``reference`` with the task's metric: label agreement of
    class probabilities, or the cosine of embeddings."""
    if task == "classify":
        return label_agreement(reference, candidate)
    return embedding_cosine(reference, candidate)


def load_candidate(folder: Path, threads: int | None) -> Model:
    """Load a staged candidate package the way a device would (spin off: several are alive)."""
    return load(folder, verify=False, config=RuntimeConfig(threads=threads, spin_wait=False))


_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def qdq_problems(graph: Path) -> list[str]:
    """Why ``graph`` is not a pure-QDQ graph with fixed shapes (empty list: it is one).

    Checks: ``onnx.checker`` passes; every input, output and inferred tensor has a static
    shape; every float tensor a compute node reads comes from a ``DequantizeLinear``; every
    compute node's output goes only to ``QuantizeLinear`` nodes; graph inputs go only to a
    ``QuantizeLinear`` and graph outputs come from a ``DequantizeLinear``.
    """
    import onnx

    model = onnx.load(str(graph))
    problems: list[str] = []
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        problems.append(f"onnx.checker: {exc}")
    inferred = onnx.shape_inference.infer_shapes(model)
    values = [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]
    for value in values:
        dims = value.type.tensor_type.shape.dim
        if not dims and value.type.tensor_type.elem_type != 0:
            continue  # a scalar (scales, zero points)
        if any(d.dim_param or d.dim_value < 1 for d in dims):
            problems.append(f"tensor {value.name} has a dynamic shape")
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in _QDQ_OPS:
            continue
        for name in node.input:
            source = producer.get(name)
            if (
                name
                and name not in initializers
                and (source is None or source.op_type != "DequantizeLinear")
            ):
                problems.append(
                    f"{node.op_type} {node.name} reads {name} not from a DequantizeLinear"
                )
        for name in node.output:
            if any(c.op_type != "QuantizeLinear" for c in consumers.get(name, [])):
                problems.append(
                    f"{node.op_type} {node.name} feeds a node other than QuantizeLinear"
                )
    for value in model.graph.input:
        if any(c.op_type != "QuantizeLinear" for c in consumers.get(value.name, [])):
            problems.append(f"graph input {value.name} is read unquantized")
    for value in model.graph.output:
        source = producer.get(value.name)
        if source is None or source.op_type != "DequantizeLinear":
            problems.append(f"graph output {value.name} does not come from a DequantizeLinear")
    return problems
