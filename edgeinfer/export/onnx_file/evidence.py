"""What a user's graph says about its outputs before a metric judges them.

Three sources, each written into the report beside the metric it led to:

- the graph: each output's shape after shape inference (symbolic dims resolved once the input
  is fixed) and its ancestry, the last node that changes values (through reshapes and
  transposes; a ``Concat``'s parts each), so a ``Sigmoid`` or ``Softmax`` says "scores";
- the model's metadata (ultralytics writes ``task``, ``imgsz`` and ``names``);
- fp32's values on held inputs (ranges; ``detector_head`` reads a YOLO head's rows).

``detector_head`` is what ``--task detect`` and ``--task segment`` check before they judge
anything: a head whose "class scores" leave [0, 1], that holds more classes than the model has
names, or that comes with a mask prototype output is refused with the reason and the command
that fits.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.package_io import TensorSpec

__all__ = [
    "GraphFacts",
    "HeadEvidence",
    "detector_head",
    "is_yolo_head",
    "prototype_output",
    "read_graph",
]

# Nodes that move values without changing them: a Sigmoid before them still holds.
_MOVES = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Transpose")
# A score read as a probability may overshoot [0, 1] by float noise only.
_SCORE_SLACK = 1e-3


@dataclass(frozen=True)
class GraphFacts:
    """The graph's outputs (shapes as shape inference leaves them), each output's ancestry
    and the metadata that names what it is."""

    outputs: tuple[TensorSpec, ...]
    ancestry: dict[str, tuple[str, ...]]
    metadata: dict[str, str]

    @property
    def task(self) -> str | None:
        """The exporter's task (ultralytics: detect, segment, classify, pose, obb)."""
        return self.metadata.get("task")

    def names(self) -> tuple[str, ...] | None:
        """Class names from the metadata (ultralytics' ``names``: "{0: 'person', ...}")."""
        text = self.metadata.get("names")
        if not text:
            return None
        try:
            names = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return None
        if isinstance(names, dict) and sorted(names) == list(range(len(names))):
            return tuple(str(names[i]) for i in range(len(names)))
        if isinstance(names, (list, tuple)):
            return tuple(str(n) for n in names)
        return None

    def image_size(self) -> tuple[int, int] | None:
        """(height, width) from the metadata (ultralytics' ``imgsz``: "[640, 640]")."""
        text = self.metadata.get("imgsz")
        try:
            size = ast.literal_eval(text) if text else None
        except (ValueError, SyntaxError):
            return None
        if isinstance(size, int):
            size = [size, size]
        if (
            isinstance(size, (list, tuple))
            and len(size) == 2
            and all(isinstance(v, int) and 0 < v <= 8192 for v in size)
        ):
            return int(size[0]), int(size[1])
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the report."""
        keep = {k: v for k, v in self.metadata.items() if k in ("task", "imgsz", "stride")}
        return {
            "outputs": {
                spec.name: {"shape": list(spec.shape), "from": list(self.ancestry[spec.name])}
                for spec in self.outputs
            },
            **({"metadata": keep} if keep else {}),
        }


def read_graph(graph: Path) -> GraphFacts:
    """``graph``'s outputs after ONNX shape inference, their ancestry and metadata."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:
        pass  # the declared shapes stay (``user_graph.check`` already ran strict inference)
    producers = {out: node for node in model.graph.node for out in node.output}
    outputs = tuple(_spec(value) for value in model.graph.output)
    ancestry = {spec.name: _ancestry(spec.name, producers) for spec in outputs}
    metadata = {p.key: p.value for p in model.metadata_props}
    return GraphFacts(outputs=outputs, ancestry=ancestry, metadata=metadata)


def _spec(value: Any) -> TensorSpec:
    import onnx

    tensor = value.type.tensor_type
    dims = tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim
    )
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    return TensorSpec(name=value.name, dtype=dtype, shape=dims)


def _ancestry(name: str, producers: dict[str, Any]) -> tuple[str, ...]:
    """The op that last changed ``name``'s values; a Concat's parts, each (in order)."""

    def last(value: str) -> str:
        node = producers.get(value)
        while node is not None and node.op_type in _MOVES:
            node = producers.get(node.input[0])
        return "input" if node is None else str(node.op_type)

    node = producers.get(name)
    while node is not None and node.op_type in _MOVES:
        node = producers.get(node.input[0])
    if node is not None and node.op_type == "Concat":
        return tuple(last(part) for part in node.input)
    return (last(name),)


def is_yolo_head(shape: tuple[int | str, ...]) -> bool:
    """Whether ``shape`` reads as a YOLO head: [1, A, N] or [1, N, A], A >= 5 attributes and
    N anchors (a symbolic N, or at least 4 per attribute)."""
    if len(shape) != 3:
        return False
    fixed = [d for d in shape[1:] if isinstance(d, int) and d > 0]
    if not fixed or min(fixed) < 5:
        return False
    return len(fixed) == 1 or max(fixed) >= 4 * min(fixed)


def prototype_output(outputs: tuple[TensorSpec, ...], coefficients: int) -> TensorSpec | None:
    """An output of mask prototypes [1, K, h, w] whose K is at most ``coefficients`` (the head
    rows left after the box and one class)."""
    for spec in outputs[1:]:
        shape = spec.shape
        if len(shape) == 4 and isinstance(shape[1], int) and 0 < shape[1] <= coefficients:
            return spec
    return None


@dataclass(frozen=True)
class HeadEvidence:
    """A YOLO head read on fp32's held outputs: its rows, their ranges and what they are."""

    output: str
    attributes: int
    anchors: int
    classes: int
    coefficients: int
    box_range: tuple[float, float]
    score_range: tuple[float, float]
    names: int | None
    prototypes: str | None
    ancestry: tuple[str, ...]
    images: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the report."""
        return {
            "output": self.output,
            "attributes": self.attributes,
            "anchors": self.anchors,
            "classes": self.classes,
            "mask_coefficients": self.coefficients,
            "box_range": [round(v, 4) for v in self.box_range],
            "score_range": [round(v, 4) for v in self.score_range],
            "names_in_metadata": self.names,
            "prototype_output": self.prototypes,
            "from": list(self.ancestry),
            "images": self.images,
        }


def detector_head(
    facts: GraphFacts,
    values: list[np.ndarray],
    *,
    objectness: bool,
    task: str,
    coefficients: int = 0,
) -> HeadEvidence:
    """Read fp32's first outputs ``values`` (one [1, A, N] / [1, N, A] per held image) as a YOLO
    head with ``coefficients`` mask rows after the class scores; refuse (``ConfigError``, the
    reason and the command that fits) a layout that is not what ``task`` serves."""
    head = facts.outputs[0]
    rows = np.concatenate([_rows(v) for v in values], axis=1)  # [A, N x images]
    attributes = rows.shape[0]
    first = 5 if objectness else 4
    classes = attributes - first - coefficients
    names = facts.names()
    protos = prototype_output(facts.outputs, attributes - first - 1)
    scores = rows[first - 1 if objectness else first : first + classes]
    evidence = HeadEvidence(
        output=head.name,
        attributes=attributes,
        anchors=rows.shape[1] // max(len(values), 1),
        classes=classes,
        coefficients=coefficients,
        box_range=(float(rows[:4].min()), float(rows[:4].max())),
        score_range=(float(scores.min()), float(scores.max())) if scores.size else (0.0, 0.0),
        names=None if names is None else len(names),
        prototypes=None if protos is None else protos.name,
        ancestry=facts.ancestry.get(head.name, ()),
        images=len(values),
    )
    _refuse_misfit(evidence, facts, task)
    return evidence


def _rows(value: np.ndarray) -> np.ndarray:
    """A head's output [1, A, N] or [1, N, A] as rows [A, N]."""
    attributes_first = value.shape[1] < value.shape[2]
    return np.asarray(value[0] if attributes_first else value[0].T, np.float64)


def _refuse_misfit(head: HeadEvidence, facts: GraphFacts, task: str) -> None:
    """A ``ConfigError`` naming what does not fit ``task`` and the command that does."""
    where = f"{head.output} [{head.attributes} x {head.anchors}]"
    if task == "detect" and (head.prototypes is not None or facts.task == "segment"):
        protos = head.prototypes or "the metadata's task 'segment'"
        raise ConfigError(
            f"{where} comes with mask prototypes ({protos}): a YOLO-seg head, whose rows after "
            "the box and class scores are mask coefficients, not classes; export it with "
            "--task segment (or --task raw to keep its tensors)"
        )
    if task == "segment" and head.prototypes is None:
        raise ConfigError(
            f"{where} has no mask prototype output [1, K, h, w]: export it with --task detect"
        )
    if head.classes < 1:
        raise ConfigError(
            f"{where} leaves {head.classes} class rows after the box"
            + (f" and {head.coefficients} mask coefficients" if head.coefficients else "")
            + ": not a YOLO head; export it with --task raw"
        )
    low, high = head.score_range
    if low < -_SCORE_SLACK or high > 1 + _SCORE_SLACK:
        raise ConfigError(
            f"{where}'s class scores span [{low:.3g}, {high:.3g}] on {head.images} held "
            "pictures, outside [0, 1]: they are not sigmoid scores of a YOLO head"
            + (" (the graph's metadata says task 'segment': --task segment)"
               if facts.task == "segment" else "")
            + "; export it with --task raw"
        )  # fmt: skip
    if head.names is not None and head.names != head.classes:
        raise ConfigError(
            f"{where} holds {head.classes} class rows, but the graph's metadata names "
            f"{head.names} classes: its other rows are not classes; export it with "
            "--task segment (mask coefficients) or --task raw"
        )
