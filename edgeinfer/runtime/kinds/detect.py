"""``DetectModel``: ``image-detector`` packages, detections from a YOLO-style graph output on
the device: picture -> letterbox (or stretch) -> graph -> decode -> NMS -> boxes in
the picture's own pixels.

Two layouts are common in single-graph detectors (ultralytics exports):

- ``attributes-first`` ``[1, 4+C, N]`` (YOLOv8/v11): per anchor cx, cy, w, h, then C class
  scores;
- ``anchors-first`` ``[1, N, 4+1+C]`` (YOLOv5): per anchor cx, cy, w, h, an objectness, then C
  class scores (an anchor's score is objectness x class score);
- ``yolox`` ``[1, N, 4+1+C]`` (YOLOX as its export writes it): the same attributes, but the
  box is still relative to its grid cell: one anchor per cell of strides 8, 16 and 32, the
  centre ``(offset + cell) x stride``, the size ``exp(log size) x stride``.

Boxes come out as ``[K, 4]`` x1, y1, x2, y2 in the graph's input pixels, with their scores
``[K]`` and labels ``[K]`` (class indices), best first.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import InputError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ImageDetectorIO, ImageSegmenterIO, ImageSpec
from edgeinfer.runtime.kinds import pictures
from edgeinfer.runtime.model import Model
from edgeinfer.runtime.tasks import Detection, prepare_images

__all__ = [
    "DecodeConfig",
    "Decoded",
    "DetectModel",
    "Layout",
    "decode",
    "decode_rows",
    "iou",
    "layout_of",
    "nms",
    "yolox_anchors",
]

Layout = Literal["attributes-first", "anchors-first", "yolox"]

# YOLOX's heads: one anchor per cell of each of these grids (its P3-P5 feature maps).
_YOLOX_STRIDES = (8, 16, 32)


@dataclass(frozen=True)
class DecodeConfig:
    """How raw anchors become detections.

    Args:
        score_threshold: anchors scoring below are dropped (0.25: ultralytics' default).
        iou_threshold: a box overlapping a better one of its class by more is suppressed
            (0.45: ultralytics' default).
        max_detections: detections kept per image at most (300: ultralytics' default).
        agnostic: suppress across labels (ultralytics' ``agnostic_nms``; off by default:
            class-aware).
    """

    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 300
    agnostic: bool = False

    @classmethod
    def of(cls, io: ImageDetectorIO | ImageSegmenterIO) -> DecodeConfig:
        """NMS as a detector's or segmenter's manifest says."""
        return cls(io.score_threshold, io.iou_threshold, io.max_detections, io.agnostic)


@dataclass(frozen=True)
class Decoded:
    """One image's detections, best first: boxes [K, 4] xyxy, scores [K], labels [K]."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray


def layout_of(shape: tuple[int, ...]) -> Layout:
    """The layout of a ``[1, A, N]`` or ``[1, N, A]`` output: anchors outnumber attributes."""
    if len(shape) != 3 or min(shape[1:]) < 5:
        raise InputError(
            f"a detector output is [1, 4+C, N] or [1, N, 4+1+C]; this one is {list(shape)}"
        )
    return "attributes-first" if shape[1] < shape[2] else "anchors-first"


def yolox_anchors(height: int, width: int) -> int:
    """How many anchors a YOLOX head has at a ``height`` x ``width`` input."""
    return sum((height // s) * (width // s) for s in _YOLOX_STRIDES)


def _yolox_cells(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Each anchor's grid cell [N, 2] (x, y) and stride [N, 1], in the head's order."""
    cells, strides = [], []
    for stride in _YOLOX_STRIDES:
        ys, xs = np.mgrid[0 : height // stride, 0 : width // stride]
        cells.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
        strides.append(np.full((xs.size, 1), stride))
    return (
        np.concatenate(cells).astype(np.float32),
        np.concatenate(strides).astype(np.float32),
    )


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Intersection over union of one xyxy box [4] with each of ``boxes`` [K, 4] (1.0 for an
    equal box, of no area too)."""
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    # two equal boxes of no area (clipped flat at the picture's edge) are the same box
    same = np.all(boxes == box, axis=1)
    return np.asarray(np.where(union > 0, inter / np.maximum(union, 1e-9), same.astype(float)))


def decode_rows(
    anchors: np.ndarray, *, objectness: bool, config: DecodeConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Anchors [N, 4+C] (or [N, 4+1+C] with ``objectness``) -> the boxes [M, 4] xyxy, scores
    [M] and labels [M] of those scoring at least ``config.score_threshold``, and which anchors
    they are (``keep`` [N] bool)."""
    classes = anchors[:, 5:] * anchors[:, 4:5] if objectness else anchors[:, 4:]
    labels = classes.argmax(axis=1)  # [N]
    scores = classes[np.arange(len(classes)), labels]
    keep = scores >= config.score_threshold
    centre, size_wh = anchors[keep, :2], anchors[keep, 2:4]
    boxes = np.concatenate([centre - size_wh / 2, centre + size_wh / 2], axis=1)
    return boxes, scores[keep], labels[keep], keep


def decode(
    output: np.ndarray,
    config: DecodeConfig,
    layout: Layout | None = None,
    *,
    size: tuple[int, int] | None = None,
) -> Decoded:
    """The detections of one image's output ``[1, A, N]`` / ``[1, N, A]``; ``size`` (the
    graph's input height, width) places a ``yolox`` output's anchors on their grids."""
    layout = layout or layout_of(tuple(output.shape))
    anchors = output[0].T if layout == "attributes-first" else output[0]  # [N, A]
    anchors = anchors.astype(np.float32)
    if layout == "yolox":
        if size is None or yolox_anchors(*size) != len(anchors):
            raise InputError(
                f"a yolox output of {len(anchors)} anchors needs the graph's input size "
                f"(got {size}): strides 8, 16, 32 give one anchor per grid cell"
            )
        cells, strides = _yolox_cells(*size)
        anchors = anchors.copy()
        anchors[:, :2] = (anchors[:, :2] + cells) * strides
        anchors[:, 2:4] = np.exp(anchors[:, 2:4]) * strides
    boxes, scores, labels, _ = decode_rows(
        anchors, objectness=layout != "attributes-first", config=config
    )
    chosen = nms(boxes, scores, labels, config)
    return Decoded(boxes=boxes[chosen], scores=scores[chosen], labels=labels[chosen])


def nms(
    boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, config: DecodeConfig
) -> np.ndarray:
    """Non-maximum suppression (class-aware unless ``config.agnostic``): the indices kept,
    best first, at most ``max_detections``."""
    order = np.argsort(-scores, kind="stable")
    kept: list[int] = []
    suppressed = np.zeros(len(order), bool)
    for rank, index in enumerate(order):
        if suppressed[rank]:
            continue
        kept.append(int(index))
        if len(kept) == config.max_detections:
            break
        rest = order[rank + 1 :]
        same = (labels[rest] == labels[index]) | config.agnostic
        overlap = iou(boxes[index], boxes[rest]) > config.iou_threshold
        suppressed[rank + 1 :] |= same & overlap
    return np.array(kept, np.int64)


class DetectModel(Model):
    """A ``detect`` package (``image-detector``): object detections per image, NMS on the
    device. ``DetectModel.load`` loads one (a ``PackageError`` for another kind);
    ``edgeinfer.load`` returns one for such a package."""

    TASK = "detect"
    IO_KINDS = ("image-detector",)

    def __init__(self, path: Path, manifest: Manifest, *, config: RuntimeConfig) -> None:
        super().__init__(path, manifest, config=config)
        self._io = manifest.io_as(ImageDetectorIO)
        self._graph = self._open_graph(self._io.graph)
        self.providers = self._graph.providers
        self._decoding = DecodeConfig.of(self._io)

    def detect(self, images: Any, *, score_threshold: float | None = None) -> list[list[Detection]]:
        """Each image's detections (paths, Pillow images, uint8 RGB arrays), best first, boxes
        x1, y1, x2, y2 in each image's own pixels; NMS as the manifest says
        (``score_threshold`` overrides its threshold). See docs/onnx.md."""
        items = pictures.items(images)
        config = self._decoding
        if score_threshold is not None:
            config = dataclasses.replace(config, score_threshold=score_threshold)
        return [self._one(item, index, config) for index, item in enumerate(items)]

    def _one(self, item: Any, index: int, config: DecodeConfig) -> list[Detection]:
        picture = pictures.as_pil(item, index).convert("RGB")
        pixels = prepare_images(pictures.fit(picture, self._io.image)[None], image=self._io.image)
        started = time.perf_counter()
        output = self._graph.run({self._io.inputs[0].name: pixels})[0]  # [1, A, N] / [1, N, A]
        elapsed_ms = (time.perf_counter() - started) * 1e3
        self._metrics.observe("detect", "compute", elapsed_ms)
        size = (self._io.image.height, self._io.image.width)
        found = decode(output, config, self._io.layout, size=size)
        boxes = _to_picture(found.boxes, picture.size, self._io.image)  # [K, 4]
        labels = self._io.labels
        return [
            Detection(box=(b[0], b[1], b[2], b[3]), label=labels[int(k)], score=float(s))
            for b, k, s in zip(boxes.tolist(), found.labels, found.scores, strict=True)
        ]


def _to_picture(boxes: np.ndarray, size: tuple[int, int], image: ImageSpec) -> np.ndarray:
    """Boxes [K, 4] in the graph's input pixels -> the picture's (``size``: width, height),
    clipped to it."""
    w, h = size
    if image.resize == "letterbox":
        scale, left, top = pictures.letterbox(w, h, image)
        shifted = boxes - np.array([left, top, left, top], np.float32)
        out = shifted / scale
    else:  # stretch
        out = boxes * np.array([w / image.width, h / image.height] * 2, np.float32)
    return np.clip(out, 0, np.array([w, h, w, h], np.float32))
