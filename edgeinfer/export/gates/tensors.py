"""Outputs with no known meaning: a scale-aware error, channel by channel, and exact agreement
for integer outputs.

One relative L2 over a whole tensor is dominated by its largest channel (a detector's box
coordinates hide its ruined scores) and a relative error per element by near-zero values.
Here each channel's RMS error is divided by that channel's own RMS (floored at a thousandth
of the largest channel's, so a channel of near-zeros is judged on the tensor's scale); the
mean over channels gates, and the worst channel may be ``MIN_SLACK`` times further off.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeinfer.export.gates.verdict import OutputScore, Sample

__all__ = ["channel_axis", "exact", "tensor_error"]

# A channel whose RMS is below this share of the largest channel's is judged on that floor.
_FLOOR_SHARE = 1e-3
# An fp32 rewrite (optimized graph) reassociates floats: ~1e-6 per channel; 1e-4 is a bug.
_PARITY_ERROR = 1e-4


def channel_axis(shape: tuple[int, ...]) -> int | None:
    """The axis whose entries are channels of their own scale: none for scalars and vectors,
    the last of [N, C], axis 1 of [N, C, H, W...], the shorter of the two of [N, A, B] (a
    detector's attributes, an encoder's positions)."""
    rank = len(shape)
    if rank <= 1:
        return None
    if rank == 2:
        return 1
    if rank >= 4:
        return 1
    return 1 if shape[1] < shape[2] else 2


def tensor_error(output: str, reason: str, samples: Sequence[Sample]) -> OutputScore:
    """Per-channel normalized RMS error over every held call, reported as a score
    (``channel_agreement``: 1 - the mean channel error; 1.0 reproduces fp32)."""
    squared_error: dict[int, float] = {}
    squared_ref: dict[int, float] = {}
    counts: dict[int, int] = {}
    for sample in samples:
        want = sample.want.astype(np.float64)
        got = sample.got.astype(np.float64)
        axis = channel_axis(tuple(want.shape))
        if axis is None:
            want, got, axis = want.reshape(1, -1), got.reshape(1, -1), 0
        want, got = np.moveaxis(want, axis, 0), np.moveaxis(got, axis, 0)
        per_error = ((got - want) ** 2).reshape(len(want), -1).sum(axis=1)
        per_ref = (want**2).reshape(len(want), -1).sum(axis=1)
        size = want[0].size
        for channel in range(len(want)):
            squared_error[channel] = squared_error.get(channel, 0.0) + float(per_error[channel])
            squared_ref[channel] = squared_ref.get(channel, 0.0) + float(per_ref[channel])
            counts[channel] = counts.get(channel, 0) + size
    channels = sorted(counts)
    rms_ref = np.array([np.sqrt(squared_ref[c] / counts[c]) for c in channels])
    rms_error = np.array([np.sqrt(squared_error[c] / counts[c]) for c in channels])
    floor = max(float(rms_ref.max()) * _FLOOR_SHARE, 1e-12)
    errors = rms_error / np.maximum(rms_ref, floor)  # [channels]
    worst = int(errors.argmax())
    return OutputScore(
        output=output,
        metric="channel_agreement",
        reason=reason,
        value=1.0 - float(errors.mean()),
        worst=1.0 - float(errors.max()),
        count=len(samples),
        parity=float(errors.max()) <= _PARITY_ERROR,
        details={
            "mean_channel_error": round(float(errors.mean()), 6),
            "worst_channel": channels[worst],
            "worst_channel_error": round(float(errors.max()), 6),
            "channels": len(channels),
        },
    )


def exact(output: str, reason: str, samples: Sequence[Sample]) -> OutputScore:
    """The share of equal elements (integer or boolean outputs: ids, labels, flags)."""
    equal = sum(int(np.sum(s.want == s.got)) for s in samples)
    total = sum(s.want.size for s in samples)
    share = equal / total if total else 1.0
    return OutputScore(
        output=output,
        metric="exact",
        reason=reason,
        value=share,
        count=len(samples),
        parity=share == 1.0,
        details={"elements": total},
    )
