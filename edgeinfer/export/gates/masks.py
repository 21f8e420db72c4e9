"""Segmentation masks (``image-segmenter`` packages): the candidate's masks, decoded by the
runtime as a device decodes them, matched to fp32's on each held picture. Each candidate mask,
best first, takes the unmatched fp32 mask of its label that it overlaps most (mask IoU); the
score is the IoU summed over matched pairs divided by all masks of either side (matched pairs
counted once), so a lost or an extra mask costs as much as a wrong one. Masks are compared in
the picture's pixels.

Its bar is wider than the run's budget: an int8 rounding moves a mask's edge by a pixel
where the logit crosses the threshold, and a 40 x 40 mask that grows by one pixel all round
loses ~10 % IoU while saying the same thing. ``MASK_SLACK`` times the budget (0.95 at the
default 1 %) still fails a mask that is lost, split or moved.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.export.gates.verdict import OutputScore
from edgeinfer.runtime.kinds.segment import Segment

__all__ = ["MASK_SLACK", "MIN_MASKS", "mask_iou", "pair_iou"]

MASK_SLACK = 5.0
# fp32 masks below which the verdict is weak: a handful of masks cannot show a quantization
# that loses one mask in ten.
MIN_MASKS = 10


def pair_iou(a: Segment, b: Segment) -> float:
    """Mask IoU of two segments of one picture (each mask over its own box)."""
    left, top = min(a.offset[0], b.offset[0]), min(a.offset[1], b.offset[1])
    right = max(a.offset[0] + a.mask.shape[1], b.offset[0] + b.mask.shape[1])
    bottom = max(a.offset[1] + a.mask.shape[0], b.offset[1] + b.mask.shape[0])
    canvas = np.zeros((2, bottom - top, right - left), bool)
    for plane, seg in zip(canvas, (a, b), strict=True):
        x, y = seg.offset[0] - left, seg.offset[1] - top
        plane[y : y + seg.mask.shape[0], x : x + seg.mask.shape[1]] = seg.mask
    union = int(np.logical_or(*canvas).sum())
    return float(np.logical_and(*canvas).sum()) / union if union else 1.0


def _matched(want: Sequence[Segment], got: Sequence[Segment]) -> list[float]:
    """The IoU of each matched (candidate, fp32) pair, greedily, candidate's best first."""
    free = [True] * len(want)
    ious = []
    for seg in got:
        best, where = 0.0, -1
        for index, ref in enumerate(want):
            if free[index] and ref.label == seg.label:
                value = pair_iou(ref, seg)
                if value > best:
                    best, where = value, index
        if where >= 0:
            free[where] = False
            ious.append(best)
    return ious


def mask_iou(
    output: str,
    reason: str,
    pairs: Sequence[tuple[Sequence[Segment], Sequence[Segment]]],
    *,
    max_accuracy_loss: float,
) -> OutputScore:
    """Matched mask IoU of the candidate against fp32 over every held picture."""
    total = wanted = found = matched = 0
    iou_sum = 0.0
    for want, got in pairs:
        ious = _matched(want, got)
        wanted, found, matched = wanted + len(want), found + len(got), matched + len(ious)
        iou_sum += sum(ious)
        total += len(want) + len(got) - len(ious)
    value = iou_sum / total if total else 1.0
    return OutputScore(
        output=output,
        metric="mask_iou",
        reason=reason,
        value=value,
        count=len(pairs),
        parity=value >= 1.0 - 1e-6 and wanted == found == matched,
        details={
            "fp32_masks": wanted,
            "masks": found,
            "matched": matched,
            "matched_mean_iou": round(iou_sum / matched, 6) if matched else None,
            "pictures": len(pairs),
        },
        floor=max(0.0, 1.0 - MASK_SLACK * max_accuracy_loss),
        decided_by=wanted,
        min_items=MIN_MASKS,
        evidence=f"{wanted} fp32 masks in {len(pairs)} pictures",
    )
