"""What the export kept: the task's own metric against the PyTorch fp32 reference, and speed.

Candidates are evaluated through the real runtime (``edgeinfer.load`` on a staged package), so the
gate measures exactly what a device will run, tokenizer and post-processing included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.export.passes.reference import TorchReference
from edgeinfer.export.source import Source
from edgeinfer.package_io import ExitSegmentsIO, ImageClassifierIO, TextClassifierIO
from edgeinfer.runtime import Model, load

__all__ = [
    "DECIDED_MARGIN",
    "Accuracy",
    "agreement",
    "compare",
    "load_candidate",
    "qdq_problems",
    "run_model",
    "torch_reference",
]

# fp32 ONNX vs PyTorch differs only by float reassociation: ~1e-6 in cosine, ~1e-5 in probability.
PARITY_MIN_COSINE = 0.9999
PARITY_MAX_PROB_DIFF = 1e-3
# The minimum cosine may fall this many times further than the mean: one hard text must not
# fail a good model, but a broken one must.
MIN_COSINE_SLACK = 3.0
# Image gates count views where fp32's top-1 probability leads the runner-up by >= 0.1: on a
# near-tie any rounding flips the answer, and agreement there measures noise, not the model.
DECIDED_MARGIN = 0.1


@dataclass(frozen=True)
class Accuracy:
    """A candidate's agreement with the reference on held inputs.

    ``metric`` is ``cosine`` (embeddings: ``mean``/``min`` over texts), ``label_agreement``
    or ``top1_agreement`` (classifiers: ``mean`` is the share of equal labels, ``min`` the
    same). Raw graphs are judged output by output (``export/gates``).
    """

    metric: str
    mean: float
    min: float
    count: int
    max_prob_diff: float | None = None

    def passes(self, max_accuracy_loss: float) -> bool:
        """Whether the loss stays within ``max_accuracy_loss`` (a fraction, 0.01 = 1 %)."""
        if self.metric == "cosine":
            return (
                self.mean >= 1.0 - max_accuracy_loss
                and self.min >= 1.0 - MIN_COSINE_SLACK * max_accuracy_loss
            )
        return self.mean >= 1.0 - max_accuracy_loss

    def is_parity(self) -> bool:
        """Whether an fp32 graph reproduces the reference (conversion is lossless)."""
        if self.metric == "cosine":
            return self.min >= PARITY_MIN_COSINE
        # with no decided input (count 0) the probabilities alone show parity
        decided = self.mean == 1.0 or self.count == 0
        return decided and (self.max_prob_diff or 0.0) <= PARITY_MAX_PROB_DIFF

    def to_dict(self, max_accuracy_loss: float) -> dict[str, Any]:
        """JSON-ready, with whether it passes the gate."""
        out: dict[str, Any] = {
            "metric": self.metric,
            "mean": round(self.mean, 6),
            "min": round(self.min, 6),
            "count": self.count,
            "passed": self.passes(max_accuracy_loss),
        }
        if self.max_prob_diff is not None:
            out["max_prob_diff"] = round(self.max_prob_diff, 6)
        return out


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
    if isinstance(io, (TextClassifierIO, ExitSegmentsIO, ImageClassifierIO)):
        labels = list(io.labels)
        results = model.classify(inputs, batch_size=16)
        return np.array([[r.scores[label] for label in labels] for r in results], np.float32)
    return model.embed(list(inputs), batch_size=16)


def agreement(reference: np.ndarray, candidate: np.ndarray) -> tuple[Accuracy, float]:
    """Top-1 agreement of probabilities [N, C] on the decided inputs (the gate: fp32 leads by
    ``DECIDED_MARGIN``) and on all inputs (reported)."""
    ranked = np.sort(reference, axis=1)
    decided = ranked[:, -1] - ranked[:, -2] >= DECIDED_MARGIN  # [N]
    agree = (reference.argmax(1) == candidate.argmax(1)).astype(np.float64)
    accuracy = Accuracy(
        metric="top1_agreement",
        mean=float(agree[decided].mean()) if decided.any() else 0.0,
        min=float(agree[decided].min()) if decided.any() else 0.0,
        count=int(decided.sum()),
        max_prob_diff=float(np.abs(reference - candidate).max()),
    )
    return accuracy, float(agree.mean())


def compare(task: str, reference: np.ndarray, candidate: np.ndarray) -> Accuracy:
    """Score ``candidate`` against ``reference`` with the task's metric."""
    if task == "classify":
        agree = (reference.argmax(1) == candidate.argmax(1)).astype(np.float64)
        return Accuracy(
            metric="label_agreement",
            mean=float(agree.mean()),
            min=float(agree.min()),
            count=len(agree),
            max_prob_diff=float(np.abs(reference - candidate).max()),
        )
    cosines = np.sum(reference * candidate, axis=1)  # both L2-normalized: [N]
    return Accuracy(
        metric="cosine", mean=float(cosines.mean()), min=float(cosines.min()), count=len(cosines)
    )


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
