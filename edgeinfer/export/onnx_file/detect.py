"""The ``detect`` form of a user's graph: a YOLO-style detector as an ``image-detector``
package. Pictures are letterboxed to the graph's size, RGB, scaled to 0-1 (ultralytics'
preprocessing) unless ``--preprocess`` (or the recipe's ``[onnx.image]``) says otherwise; NMS as
``--nms`` says (ultralytics' defaults). The graph is read before it is judged
(``evidence.py``): a head whose scores leave [0, 1], that holds more classes than the model
names, or that comes with mask prototypes is refused with the command that fits. The gate
matches the candidate's detections (decoded and NMS'd by the runtime, as a device runs them)
to fp32's on held photos: F1 (``export/gates/detections.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.gates.detections import match_f1
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.onnx_file import evidence, user_graph
from edgeinfer.export.onnx_file.forms import Form
from edgeinfer.export.vision.preprocessing import spec_from_table
from edgeinfer.package_io import ImageDetectorIO, PackageIO
from edgeinfer.runtime import DetectModel, Model
from edgeinfer.runtime.kinds.detect import DecodeConfig, Decoded, Layout, layout_of, yolox_anchors
from edgeinfer.runtime.model import narrow
from edgeinfer.runtime.tasks import Detection, prepare_images

__all__ = ["DetectForm", "YoloForm"]

_PROBE_ITEMS = 3
# Held pictures whose fp32 outputs are read as evidence of what the head holds.
_EVIDENCE_PICTURES = 8
# ultralytics' preprocessing: letterboxed, RGB, 0-255 values / 255.
_ULTRALYTICS = {"mean": [0.0] * 3, "std": [255.0] * 3, "resize": "letterbox"}


def _decoded(found: list[Detection]) -> Decoded:
    """Detections as arrays, labels by name."""
    return Decoded(
        boxes=np.array([d.box for d in found], np.float32).reshape(-1, 4),
        scores=np.array([d.score for d in found], np.float32),
        labels=np.array([d.label for d in found], object),
    )


class YoloForm(Form):
    """One float [1, 3, H, W] input (fixed at export when the graph takes any size), a
    YOLO-style head as its first output: what detectors and instance segmenters share."""

    task = "detect"
    coefficients = 0  # mask coefficient rows after the class scores

    def load(self) -> None:
        run = self.run
        shape = tuple(self.inputs[0].shape)
        if len(shape) != 4 or len(self.outputs[0].shape) != 3:
            raise ConfigError(
                f"--task {self.task} takes a graph of images [1, 3, H, W] with a YOLO-style "
                f"output [1, 4+C, N] or [1, N, 4+1+C]; this one takes {list(shape)} and gives "
                f"{list(self.outputs[0].shape)}: export it with --task raw"
            )
        if not self._read_pictures(_ULTRALYTICS):
            run.report.warnings.append(
                "detector pictures are letterboxed to the graph's size with gray 114, RGB, "
                "scaled to 0-1 (ultralytics' preprocessing; --preprocess sets others)"
            )
        self.nms = self.options.nms_table()

    def _read_pictures(self, defaults: dict[str, Any]) -> bool:
        """The graph's facts, the pictures' spec (``defaults`` under ``--preprocess``) and the held
        and calibration photos at it; whether ``--preprocess`` (or the recipe) set anything."""
        run = self.run
        self.facts = evidence.read_graph(run.source.path / str(run.source.onnx_file))
        given = self._image_table()
        height, width = self._size(tuple(self.inputs[0].shape), given)
        self.spec = spec_from_table(
            defaults | given, height=height, width=width, resize_modes=("letterbox", "stretch"),
        )  # fmt: skip
        self.spec = dataclasses.replace(self.spec, fill=int(given.get("fill", self.spec.fill)))
        self.held, self.calibration = self._photos(self.spec)
        return bool(given)

    def _size(self, shape: tuple[Any, ...], given: dict[str, Any]) -> tuple[int, int]:
        """The graph's (height, width): its own, ``--preprocess size=WxH``, else the metadata's."""
        fixed = tuple(d if isinstance(d, int) and d > 0 else None for d in shape[2:])
        asked = given.get("size")
        if asked is not None:
            if None not in fixed and tuple(asked) != fixed:
                raise ConfigError(
                    f"--preprocess size={asked[1]}x{asked[0]}, but {self.inputs[0].name} takes "
                    f"{fixed[1]}x{fixed[0]} pictures: drop --preprocess size"
                )
            return int(asked[0]), int(asked[1])
        if None not in fixed:
            return int(shape[2]), int(shape[3])
        from_metadata = self.facts.image_size()
        if from_metadata is None:
            raise ConfigError(
                f"{self.inputs[0].name} {list(shape)} takes pictures of any size: pass "
                "--preprocess size=WxH (the size it was trained at, e.g. size=640x640)"
            )
        self.run.report.warnings.append(
            f"pictures of {from_metadata[1]}x{from_metadata[0]}: the graph's metadata imgsz "
            "(--preprocess size=WxH sets another)"
        )
        return from_metadata

    def fixed_graph(self, original: Path) -> Path:
        """``original`` with its input fixed at the pictures' size and its output dims
        resolved (itself when it has no symbolic dim); then the head is read and checked."""
        shape = (1, 3, self.spec.height, self.spec.width)
        graph = original
        if tuple(self.inputs[0].shape) != shape:
            graph = self.run.work / "input-fixed.onnx"
            user_graph.fix_input(original, graph, name=self.inputs[0].name, shape=shape)
            self.facts = dataclasses.replace(self.facts, outputs=evidence.read_graph(graph).outputs)
        self._read_head(graph)
        return graph

    def _read_head(self, graph: Path) -> None:
        import onnxruntime as ort

        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        pictures = self.held[:_EVIDENCE_PICTURES]
        runs = [session.run(None, {self.inputs[0].name: prepare_images(p[None], image=self.spec)})
                for p in pictures]  # fmt: skip
        heads = [outputs[0] for outputs in runs]
        out = tuple(int(d) for d in heads[0].shape)
        self.layout = self._layout(out, heads[0])
        self.head = evidence.detector_head(
            self.facts, heads, objectness=self.layout != "attributes-first", task=self.task,
            coefficients=self.coefficients,
        )  # fmt: skip
        self.labels = self._head_labels(self.head.classes)

    def _head_labels(self, classes: int) -> tuple[str, ...]:
        """--labels (and the folder's), else the metadata's names, else LABEL_i."""
        names = self.facts.names()
        if self.options.labels is None and names is not None:
            return names
        return self._labels(classes)

    def _layout(self, out: tuple[int, ...], head: np.ndarray) -> Layout:
        """The output's layout; an anchors-first output with one anchor per cell of YOLOX's
        grids is ``yolox`` when its box sizes come out as logarithms (some negative on a held
        photo: a decoded box never has a negative size)."""
        layout = layout_of(out)
        if layout != "anchors-first" or out[1] != yolox_anchors(self.spec.height, self.spec.width):
            return layout
        if (head[0, :, 2:4] < 0).any():
            self.run.report.warnings.append(
                f"{out[1]} anchors with log box sizes: a YOLOX head, decoded on its "
                "stride 8/16/32 grids"
            )
            return "yolox"
        return layout

    def decode_config(self) -> DecodeConfig:
        """NMS as the package will run it."""
        return dataclasses.replace(DecodeConfig(), **self.nms)

    def evidence(self) -> dict[str, Any]:
        """What the graph, its metadata and fp32's held outputs said (for the report)."""
        return {**self.facts.to_dict(), "head": self.head.to_dict(), "layout": self.layout}

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        name = self.inputs[0].name
        return [{name: prepare_images(view[None], image=self.spec)} for view in self.calibration]

    def smoke_inputs(self) -> list[Any]:
        return list(self.held[:8])


class DetectForm(YoloForm):
    """A YOLO head [1, 4+C, N] or [1, N, 4+1+C]: an ``image-detector``."""

    def io(self, graph: Path) -> PackageIO:
        inputs, outputs = package.read_io(graph)
        return ImageDetectorIO(
            graph=package.GRAPH_NAME,
            inputs=inputs,
            outputs=outputs,
            labels=self.labels,
            image=self.spec,
            layout=self.layout,
            **self.nms,
        )

    def evaluate(self, model: Model) -> list[Decoded]:
        detector = narrow(model, DetectModel)
        return [_decoded(detector.detect(view)[0]) for view in self.held]

    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        name = self.outputs[0].name
        reason = f"{name} of a detector package: its detections after NMS, matched to fp32's"
        pairs = list(zip(reference, candidate, strict=True))
        config = self.decode_config()
        score = match_f1(name, reason, pairs, score_threshold=config.score_threshold)
        where = f"{len(self.held)} held photos"
        return Verdict((score,)), {"evidence": self.evidence()}, where

    def probe(self, model: Model) -> Callable[[], object]:
        views, detector = list(self.held[:_PROBE_ITEMS]), narrow(model, DetectModel)
        return lambda: detector.detect(views)
