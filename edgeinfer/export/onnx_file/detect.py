"""The ``detect`` form of a user's graph: a YOLO-style detector as an ``image-detector``
package. Pictures are letterboxed to the graph's size, RGB, scaled to 0-1 (ultralytics'
preprocessing) unless ``--image`` (or the recipe's ``[onnx.image]``) says otherwise; the gate
matches the candidate's detections (decoded and NMS'd by the runtime, as a device runs them)
to fp32's on held photos: F1 (``export/gates/detections.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.gates.detections import match_f1
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.onnx_file.forms import Form
from edgeinfer.export.vision.preprocessing import spec_from_table
from edgeinfer.package_io import ImageDetectorIO, PackageIO
from edgeinfer.runtime import DetectModel, Model
from edgeinfer.runtime.kinds.detect import DecodeConfig, Decoded, Layout, layout_of, yolox_anchors
from edgeinfer.runtime.model import narrow
from edgeinfer.runtime.tasks import Detection, prepare_images

__all__ = ["DetectForm"]

_PROBE_ITEMS = 3
# ultralytics' preprocessing: letterboxed, RGB, 0-255 values / 255.
_ULTRALYTICS = {"mean": [0.0] * 3, "std": [255.0] * 3, "resize": "letterbox"}


def _decoded(found: list[Detection]) -> Decoded:
    """Detections as arrays, labels by name."""
    return Decoded(
        boxes=np.array([d.box for d in found], np.float32).reshape(-1, 4),
        scores=np.array([d.score for d in found], np.float32),
        labels=np.array([d.label for d in found], object),
    )


class DetectForm(Form):
    """One float [1, 3, H, W] input, a YOLO-style output [1, 4+C, N] or [1, N, 4+1+C]."""

    def load(self) -> None:
        run = self.run
        shape = tuple(self.inputs[0].shape)
        out = tuple(self.outputs[0].shape)
        if len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in (*shape[2:], *out)):
            raise ConfigError(
                f"--task detect takes a graph of images [1, 3, H, W] with a fixed YOLO-style "
                f"output [1, 4+C, N] or [1, N, 4+1+C]; this one takes {list(shape)} and gives "
                f"{list(out)}"
            )
        given = self._image_table()
        self.spec = spec_from_table(
            _ULTRALYTICS | given, height=int(shape[2]), width=int(shape[3]),
            resize_modes=("letterbox", "stretch"),
        )  # fmt: skip
        if not given:
            run.report.warnings.append(
                "detector pictures are letterboxed to the graph's size, RGB, scaled to 0-1 "
                "(ultralytics' preprocessing; --image sets others)"
            )
        self.held, self.calibration = self._photos(self.spec)
        self.layout = self._layout(tuple(int(d) for d in out))
        attributes = min(int(out[1]), int(out[2]))
        classes = attributes - (4 if self.layout == "attributes-first" else 5)
        self.labels = self._labels(classes)

    def _layout(self, out: tuple[int, ...]) -> Layout:
        """The output's layout; an anchors-first output with one anchor per cell of YOLOX's
        grids is ``yolox`` when the original graph's box sizes come out as logarithms (some
        negative on a held photo: a decoded box never has a negative size)."""
        layout = layout_of(out)
        if layout != "anchors-first" or out[1] != yolox_anchors(self.spec.height, self.spec.width):
            return layout
        import onnxruntime as ort

        original = self.run.source.path / str(self.run.source.onnx_file)
        session = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
        pixels = prepare_images(self.held[:1], image=self.spec)
        sizes = session.run(None, {self.inputs[0].name: pixels})[0][0, :, 2:4]  # [N, 2]
        if (sizes < 0).any():
            self.run.report.warnings.append(
                f"{out[1]} anchors with log box sizes: a YOLOX head, decoded on its "
                "stride 8/16/32 grids"
            )
            return "yolox"
        return layout

    def io(self, graph: Path) -> PackageIO:
        inputs, outputs = package.read_io(graph)
        return ImageDetectorIO(
            graph=package.GRAPH_NAME,
            inputs=inputs,
            outputs=outputs,
            labels=self.labels,
            image=self.spec,
            layout=self.layout,
        )

    def evaluate(self, model: Model) -> list[Decoded]:
        detector = narrow(model, DetectModel)
        return [_decoded(detector.detect(view)[0]) for view in self.held]

    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        name = self.outputs[0].name
        reason = f"{name} of a detector package: its detections after NMS, matched to fp32's"
        pairs = list(zip(reference, candidate, strict=True))
        score = match_f1(name, reason, pairs, score_threshold=DecodeConfig().score_threshold)
        return Verdict((score,)), {}, f"{len(self.held)} held photos"

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        name = self.inputs[0].name
        return [{name: prepare_images(view[None], image=self.spec)} for view in self.calibration]

    def probe(self, model: Model) -> Callable[[], object]:
        views, detector = list(self.held[:_PROBE_ITEMS]), narrow(model, DetectModel)
        return lambda: detector.detect(views)

    def smoke_inputs(self) -> list[Any]:
        return list(self.held[:8])
