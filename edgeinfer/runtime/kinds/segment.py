"""``SegmentModel``: ``image-segmenter`` packages, masks in the picture's own pixels.

Two modes (``ImageSegmenterIO.mode``):

- ``instances`` (YOLO-seg, ultralytics' ``-seg`` exports): the first output is a YOLO head
  whose rows after the class scores are K mask coefficients, the second the mask prototypes
  [1, K, h, w]. Picture -> letterbox -> graph -> decode + NMS (as ``DetectModel``) -> each
  kept box's mask: sigmoid(coefficients . prototypes), upsampled to the graph's input,
  cropped to its box, then to the picture's pixels, >= ``mask_threshold``;
- ``semantic`` (a per-pixel classifier, [1, C, h, w] scores): each pixel's best class at the
  graph's resolution, then to the picture's pixels; every label present is one mask, scored
  by its mean probability. One channel (C = 1, a saliency or matting map p) is the two
  classes 1 - p and p: foreground where p > 0.5.

Each ``Segment`` keeps its mask only over its box (``mask`` bool [h, w] from ``offset``, the
box rounded out and widened to every pixel the upsampled mask holds):
300 instances of a 4096 x 4096 frame as full-frame masks would take 5 GB.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ImageSegmenterIO, ImageSpec
from edgeinfer.runtime.kinds import pictures
from edgeinfer.runtime.kinds.detect import DecodeConfig, Decoded, decode_rows, nms
from edgeinfer.runtime.model import Model
from edgeinfer.runtime.tasks import prepare_images

__all__ = ["Segment", "SegmentModel", "instance_masks", "semantic_masks"]


@dataclass(frozen=True)
class Segment:
    """One mask: its ``label`` and ``score``, its ``box`` x1, y1, x2, y2 and ``mask`` (bool
    [h, w], the picture's pixels from ``offset`` (x, y): its box rounded out to whole
    pixels)."""

    box: tuple[float, float, float, float]
    label: str
    score: float
    offset: tuple[int, int]
    mask: np.ndarray

    @property
    def area(self) -> int:
        """Pixels in the mask."""
        return int(self.mask.sum())

    def rle(self) -> dict[str, list[int]]:
        """The mask as COCO's uncompressed run-length encoding: ``size`` [h, w] and
        ``counts``, alternating runs of 0s and 1s in column-major order, 0s first
        (``pycocotools.mask.frPyObjects`` reads it)."""
        flat = self.mask.T.reshape(-1).astype(np.int8)  # column-major
        edges = np.flatnonzero(np.diff(flat)) + 1
        bounds = np.concatenate([[0], edges, [flat.size]])
        counts = np.diff(bounds).tolist()
        if flat.size and flat[0]:
            counts = [0, *counts]
        return {"size": list(self.mask.shape), "counts": [int(c) for c in counts]}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: label, score, box, offset and the mask as ``rle``."""
        return {
            "label": self.label,
            "score": round(self.score, 6),
            "box": [round(v, 2) for v in self.box],
            "offset": list(self.offset),
            "mask": self.rle(),
        }

    def full(self, width: int, height: int) -> np.ndarray:
        """The mask on the whole picture: bool [height, width]."""
        out = np.zeros((height, width), bool)
        x, y = self.offset
        h, w = self.mask.shape
        out[y : y + h, x : x + w] = self.mask[: max(height - y, 0), : max(width - x, 0)]
        return out


def _resize(plane: np.ndarray, width: int, height: int, *, nearest: bool = False) -> np.ndarray:
    """A float32 (or label) plane [h, w] resized to [height, width]."""
    image = pictures.pil()
    resampling = image.Resampling.NEAREST if nearest else image.Resampling.BILINEAR
    mode = "I" if nearest else "F"
    values = plane.astype(np.int32 if nearest else np.float32)
    return np.asarray(image.fromarray(values, mode=mode).resize((width, height), resampling))


def _content(size: tuple[int, int], image: ImageSpec) -> tuple[int, int, int, int]:
    """Where the picture (``size``: width, height) lies in the graph's input: left, top, width,
    height."""
    w, h = size
    if image.resize != "letterbox":
        return 0, 0, image.width, image.height
    scale, left, top = pictures.letterbox(w, h, image)
    return left, top, round(w * scale), round(h * scale)


def _to_picture(plane: np.ndarray, size: tuple[int, int], image: ImageSpec, **kw: Any) -> Any:
    """A plane at the graph's input size [H, W] -> the picture's pixels [h, w]."""
    left, top, width, height = _content(size, image)
    region = plane[top : top + height, left : left + width]
    return _resize(region, size[0], size[1], **kw)


def _boxes_to_picture(boxes: np.ndarray, size: tuple[int, int], image: ImageSpec) -> np.ndarray:
    """Boxes [K, 4] in the graph's input pixels -> the picture's, clipped to it."""
    w, h = size
    left, top, width, height = _content(size, image)
    scale = np.array([w / width, h / height] * 2, np.float32)
    out = (boxes - np.array([left, top, left, top], np.float32)) * scale
    return np.clip(out, 0, np.array([w, h, w, h], np.float32))


def _crop(mask: np.ndarray, box: np.ndarray) -> tuple[tuple[int, int], np.ndarray]:
    """``mask`` [h, w] over ``box`` rounded out to whole pixels and widened to every pixel
    the mask holds (upsampling spreads it past the box's edge): (offset, cropped)."""
    x1, y1 = int(np.floor(box[0])), int(np.floor(box[1]))
    x2, y2 = int(np.ceil(box[2])), int(np.ceil(box[3]))
    ys, xs = np.nonzero(mask)
    if len(xs):
        x1, y1 = min(x1, int(xs.min())), min(y1, int(ys.min()))
        x2, y2 = max(x2, int(xs.max()) + 1), max(y2, int(ys.max()) + 1)
    return (x1, y1), mask[y1:y2, x1:x2].copy()


def instance_masks(
    head: np.ndarray, protos: np.ndarray, io: ImageSegmenterIO, config: DecodeConfig,
    size: tuple[int, int],
) -> tuple[Decoded, list[tuple[tuple[int, int], np.ndarray]]]:  # fmt: skip
    """A YOLO-seg image's detections and their masks in the picture's pixels (``size``:
    width, height) from its head [1, A, N] and prototypes [1, K, h, w]."""
    anchors = head[0].T if io.layout == "attributes-first" else head[0]  # [N, A]
    anchors = anchors.astype(np.float32)
    coefficients = anchors[:, anchors.shape[1] - io.coefficients :]  # [N, K]
    rows = anchors[:, : anchors.shape[1] - io.coefficients]
    boxes, scores, labels, keep = decode_rows(rows, objectness=io.layout == "anchors-first",
                                              config=config)  # fmt: skip
    chosen = nms(boxes, scores, labels, config)
    found = Decoded(boxes=boxes[chosen], scores=scores[chosen], labels=labels[chosen])
    k, mh, mw = protos.shape[1:]
    logits = coefficients[keep][chosen] @ protos[0].reshape(k, -1).astype(np.float32)  # [D, hw]
    masks = []
    picture_boxes = _boxes_to_picture(found.boxes, size, io.image)
    for logit, box, picture_box in zip(logits, found.boxes, picture_boxes, strict=True):
        plane = _resize(logit.reshape(mh, mw), io.image.width, io.image.height)
        columns, rows = np.arange(plane.shape[1]), np.arange(plane.shape[0])[:, None]
        # ultralytics' crop_mask: the pixels whose index lies in [x1, x2) and [y1, y2)
        inside = (columns >= box[0]) & (columns < box[2]) & (rows >= box[1]) & (rows < box[3])
        probability = np.where(inside, 1.0 / (1.0 + np.exp(-plane)), 0.0)
        picture = _to_picture(probability, size, io.image) >= io.mask_threshold
        masks.append(_crop(picture, picture_box))
    return dataclasses.replace(found, boxes=picture_boxes), masks


def semantic_masks(
    scores: np.ndarray, io: ImageSegmenterIO, size: tuple[int, int]
) -> list[tuple[int, float, tuple[int, int], np.ndarray, np.ndarray]]:
    """Each label present in per-pixel ``scores`` [1, C, h, w]: (label index, mean
    probability, offset, mask over its box, box) in the picture's pixels."""
    planes = scores[0].astype(np.float64)  # [C, h, w]
    if len(planes) == 1:  # one foreground map (U-2-Net's): [1 - p, p], sigmoid if logits
        p = planes[0] if 0 <= planes.min() and planes.max() <= 1 else 1 / (1 + np.exp(-planes[0]))
        planes = np.stack([1.0 - p, p])
    sums = planes.sum(axis=0)
    if planes.min() < 0 or not np.allclose(sums, 1.0, atol=1e-3):  # logits: softmax them
        planes = np.exp(planes - planes.max(axis=0))
        planes /= planes.sum(axis=0)
    best = planes.argmax(axis=0)  # [h, w]
    confidence = planes.max(axis=0)
    at_input = _resize(best, io.image.width, io.image.height, nearest=True)
    labels = _to_picture(at_input, size, io.image, nearest=True)  # [h, w] of the picture
    out = []
    for label in np.unique(labels):
        mask = labels == label
        ys, xs = np.nonzero(mask)
        box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
        offset, cropped = _crop(mask, box)
        score = float(confidence[best == label].mean()) if (best == label).any() else 0.0
        out.append((int(label), score, offset, cropped, box))
    return out


class SegmentModel(Model):
    """A ``segment`` package (``image-segmenter``): masks per image, in its own pixels.
    ``SegmentModel.load`` loads one; ``edgeinfer.load`` returns one for such a package."""

    TASK = "segment"
    IO_KINDS = ("image-segmenter",)

    def __init__(self, path: Path, manifest: Manifest, *, config: RuntimeConfig) -> None:
        super().__init__(path, manifest, config=config)
        self._io = manifest.io_as(ImageSegmenterIO)
        self._graph = self._open_graph(self._io.graph)
        self.providers = self._graph.providers
        self._decoding = DecodeConfig.of(self._io)

    def segment(self, images: Any) -> list[list[Segment]]:
        """Each image's masks (paths, Pillow images, uint8 RGB arrays): instances best first,
        or one per label present (semantic), in each image's own pixels. See docs/onnx.md."""
        return [self._one(item, index) for index, item in enumerate(pictures.items(images))]

    def _one(self, item: Any, index: int) -> list[Segment]:
        picture = pictures.as_pil(item, index).convert("RGB")
        pixels = prepare_images(pictures.fit(picture, self._io.image)[None], image=self._io.image)
        started = time.perf_counter()
        outputs = self._graph.run({self._io.inputs[0].name: pixels})
        self._metrics.observe("segment", "compute", (time.perf_counter() - started) * 1e3)
        labels = self._io.labels
        if self._io.mode == "semantic":
            return [
                Segment(box=(b[0], b[1], b[2], b[3]), label=labels[k], score=s, offset=o, mask=m)
                for k, s, o, m, b in (
                    (k, s, o, m, box.tolist())
                    for k, s, o, m, box in semantic_masks(outputs[0], self._io, picture.size)
                )
            ]
        protos = outputs[self._graph.output_names.index(str(self._io.prototypes))]
        found, masks = instance_masks(outputs[0], protos, self._io, self._decoding, picture.size)
        return [
            Segment(box=(b[0], b[1], b[2], b[3]), label=labels[int(k)], score=float(s),
                    offset=offset, mask=mask)
            for b, k, s, (offset, mask) in zip(found.boxes.tolist(), found.labels, found.scores,
                                                masks, strict=True)
        ]  # fmt: skip
