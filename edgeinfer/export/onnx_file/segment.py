"""The ``segment`` form of a user's graph, an ``image-segmenter`` package: a YOLO-seg graph
(a YOLO head whose last K rows are mask coefficients, and a mask prototype output [1, K, h, w])
as instances, or a per-pixel classifier (first output [1, C, h, w]) as semantic masks. The
gate matches the candidate's masks, decoded by the runtime, to fp32's on held photos: mask
IoU (``export/gates/masks.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.gates.masks import mask_iou
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.onnx_file import evidence
from edgeinfer.export.onnx_file.detect import YoloForm
from edgeinfer.package_io import ImageSegmenterIO, PackageIO
from edgeinfer.runtime import Model, SegmentModel
from edgeinfer.runtime.model import narrow

__all__ = ["InstanceForm", "SemanticForm"]

_PROBE_ITEMS = 3
# a one-channel map [1, 1, h, w] is two classes: the pixels at or under 0.5 and those over it
_FOREGROUND = ("background", "foreground")


class _Segmenter(YoloForm):
    """What both modes share: the runtime's masks on held photos, gated on mask IoU."""

    task = "segment"

    def evaluate(self, model: Model) -> list[Any]:
        segmenter = narrow(model, SegmentModel)
        return [segmenter.segment(view)[0] for view in self.held]

    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        name = self.outputs[0].name
        reason = f"{name} of a segmenter package: its masks in picture pixels, matched to fp32's"
        pairs = list(zip(reference, candidate, strict=True))
        score = mask_iou(name, reason, pairs, max_accuracy_loss=self.run.max_accuracy_loss)
        return Verdict((score,)), {"evidence": self.evidence()}, f"{len(self.held)} held photos"

    def probe(self, model: Model) -> Callable[[], object]:
        views, segmenter = list(self.held[:_PROBE_ITEMS]), narrow(model, SegmentModel)
        return lambda: segmenter.segment(views)

    def _io(self, graph: Path, **fields: Any) -> ImageSegmenterIO:
        inputs, outputs = package.read_io(graph)
        return ImageSegmenterIO(
            graph=package.GRAPH_NAME, inputs=inputs, outputs=outputs, labels=self.labels,
            image=self.spec, **fields,
        )  # fmt: skip


class InstanceForm(_Segmenter):
    """A YOLO-seg graph: boxes, labels, scores and a mask each (``mode`` "instances")."""

    def _read_head(self, graph: Path) -> None:
        shapes = [spec.shape for spec in self.facts.outputs[1:] if len(spec.shape) == 4]
        count = shapes[0][1] if shapes else None
        if not isinstance(count, int) or count < 1:
            raise ConfigError(
                f"{self.outputs[0].name} {list(self.outputs[0].shape)} is a YOLO head without "
                "a mask prototype output [1, K, h, w]: export it with --task detect"
            )
        self.coefficients = count
        super()._read_head(graph)
        if self.layout == "yolox":
            raise ConfigError("a YOLOX head has no mask coefficients: export it with --task detect")

    def io(self, graph: Path) -> PackageIO:
        protos = evidence.prototype_output(package.read_io(graph)[1], self.coefficients)
        return self._io(
            graph,
            mode="instances",
            layout="attributes-first" if self.layout == "attributes-first" else "anchors-first",
            coefficients=self.coefficients,
            prototypes=None if protos is None else protos.name,
            **self.nms,
        )


class SemanticForm(_Segmenter):
    """A per-pixel classifier [1, C, h, w]: one mask per label present (``mode`` "semantic");
    pictures stretched to the graph's size with ImageNet's mean and std unless ``--preprocess``
    says otherwise. One channel (C = 1) is a foreground probability map: background and
    foreground unless ``--labels`` names the two."""

    def load(self) -> None:
        shape, out = tuple(self.inputs[0].shape), tuple(self.outputs[0].shape)
        if len(shape) != 4 or len(out) != 4 or not isinstance(out[1], int) or out[1] < 1:
            raise ConfigError(
                f"--task segment takes a YOLO-seg graph or a per-pixel classifier of images "
                f"[1, 3, H, W] -> [1, C, h, w]; this one gives {list(out)}: --task raw"
            )
        self._read_pictures({"resize": "stretch"})
        self.nms = {}
        channels = int(out[1])
        if channels == 1 and self.options.labels is None and self.facts.names() is None:
            self.labels = _FOREGROUND  # U-2-Net's one saliency map [1, 1, h, w], and the like
        else:
            self.labels = self._head_labels(2 if channels == 1 else channels)

    def _read_head(self, graph: Path) -> None:
        """A per-pixel classifier has no head to read."""

    def evidence(self) -> dict[str, Any]:
        return {**self.facts.to_dict(), "mode": "semantic"}

    def io(self, graph: Path) -> PackageIO:
        return self._io(graph, mode="semantic")
