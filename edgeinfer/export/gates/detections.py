"""Detector outputs (YOLO-style ``[1, 4+C, N]`` / ``[1, N, 4+1+C]``): both fp32's and the
candidate's outputs are decoded and NMS'd as the device does (``runtime/detect.py``), then each
candidate detection, best first, is matched to an unmatched fp32 detection of the same label
with IoU >= 0.5. Precision, recall and F1 are over every held image; F1 gates."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.export.gates.verdict import OutputScore, Sample
from edgeinfer.runtime.kinds.detect import DecodeConfig, Decoded, decode, iou

__all__ = ["MIN_DETECTIONS", "detections", "looks_like_detections", "match_f1"]

# The usual match of detection benchmarks (PASCAL VOC, COCO's AP50).
MATCH_IOU = 0.5
# fp32 detections below which a detector's verdict is weak (F1 on 2 detections says nothing).
MIN_DETECTIONS = 10
# Box coordinates in input pixels exceed this; sigmoid scores never do.
_PIXEL_SCALE = 1.5


def looks_like_detections(values: np.ndarray) -> bool:
    """Whether ``values`` reads as a YOLO-style output: [1, A, N] or [1, N, A] with A >= 5
    attributes, anchors outnumbering them 4 to 1, box coordinates in pixels (beyond 1.5) and
    every other attribute a score in [0, 1]."""
    if values.ndim != 3 or values.shape[0] != 1 or values.dtype.kind != "f":
        return False
    attributes, anchors = sorted(values.shape[1:])
    if attributes < 5 or anchors < 4 * attributes:
        return False
    rows = values[0] if values.shape[1] == attributes else values[0].T  # [A, N]
    boxes, scores = rows[:4], rows[4:]
    return bool(np.abs(boxes).max() > _PIXEL_SCALE and scores.min() >= 0 and scores.max() <= 1)


def _matched(want: Decoded, got: Decoded) -> int:
    """Candidate detections that match an fp32 one (same label, IoU >= ``MATCH_IOU``)."""
    free = np.ones(len(want.labels), bool)
    matches = 0
    for box, label in zip(got.boxes, got.labels, strict=True):
        overlap = iou(box, want.boxes) if len(want.boxes) else np.zeros(0)
        overlap = np.where(free & (want.labels == label), overlap, 0.0)
        if overlap.size and overlap.max() >= MATCH_IOU:
            free[int(overlap.argmax())] = False
            matches += 1
    return matches


def detections(
    output: str, reason: str, samples: Sequence[Sample], *, config: DecodeConfig
) -> OutputScore:
    """F1 of the candidate's detections against fp32's over every held image."""
    pairs = [(decode(s.want, config), decode(s.got, config)) for s in samples]
    return match_f1(output, reason, pairs, score_threshold=config.score_threshold)


def match_f1(
    output: str,
    reason: str,
    pairs: Sequence[tuple[Decoded, Decoded]],
    *,
    score_threshold: float,
) -> OutputScore:
    """F1 of decoded detections (fp32's, the candidate's) per held image."""
    found = wanted = matched = 0
    for want, got in pairs:
        found += len(got.labels)
        wanted += len(want.labels)
        matched += _matched(want, got)
    precision = matched / found if found else float(wanted == 0)
    recall = matched / wanted if wanted else float(found == 0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return OutputScore(
        output=output,
        metric="detection_f1",
        reason=reason,
        value=f1,
        count=len(pairs),
        parity=matched == found == wanted,
        decided_by=wanted,
        min_items=MIN_DETECTIONS,
        evidence=f"{wanted} fp32 detections in {len(pairs)} pictures",
        details={
            "precision": round(precision, 6),
            "recall": round(recall, 6),
            "fp32_detections": wanted,
            "detections": found,
            "matched": matched,
            "score_threshold": score_threshold,
        },
    )
