"""The thresholds of a deploy's trial window, signed in its release, and how two packages'
answers to one request are compared.

A release signed with ``trial`` (``edgeinfer sign --trial``) is served in a trial after the
swap: the device keeps the previous package loaded, runs it in the shadow of a bounded share of
its live requests and compares (``trial.py``). The release's ``trial`` object names the
thresholds it changes; the rest come from the defaults of the package's kind::

    {"window_s", "max_window_s", "min_requests", "min_shadow", "shadow_share",
     "max_error_rate", "max_p99_ratio", "min_agreement", "min_cosine"}

Answers agree when: classify, the same top label; detect, the same labels, each box matched
with an IoU of at least 0.5; embed and tensor, a cosine of at least ``min_cosine``.
Generation is judged on error rate and latency only (its answers are not re-run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError

__all__ = ["TrialPolicy", "agree", "policy_for"]

_IOU_MATCH = 0.5  # the usual detection match (PASCAL VOC)


@dataclass(frozen=True)
class TrialPolicy:
    """When a trial passes, fails, or gives up.

    Args:
        window_s: the trial lasts at least this long before it may pass.
        max_window_s: no verdict by then (too little traffic): roll back, unproven.
        min_requests: requests the new package must answer before it may pass.
        min_shadow: requests also answered by the previous package, to compare.
        shadow_share: the previous package's compute at most this share of the new one's
            (so serving latency grows by about this much at most).
        max_error_rate: share of requests the new package may fail (input errors aside).
        max_p99_ratio: the new package's p99 latency over the previous one's, at most.
        min_agreement: share of compared answers that must agree.
        min_cosine: vectors agree at this cosine or above (embed, tensor).
    """

    window_s: float = 60.0
    max_window_s: float = 900.0
    min_requests: int = 50
    min_shadow: int = 20
    shadow_share: float = 0.1
    max_error_rate: float = 0.02
    max_p99_ratio: float = 1.5
    min_agreement: float = 0.95
    min_cosine: float = 0.99

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"trial {f.name} must be a number, not {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"trial {f.name} must be a finite number >= 0, not {value}")
        if self.shadow_share > 1 or self.min_agreement > 1 or self.min_cosine > 1:
            raise ConfigError("trial shadow_share, min_agreement and min_cosine are at most 1")
        if self.max_window_s < self.window_s:
            raise ConfigError("trial max_window_s must be at least window_s")
        if not isinstance(self.min_requests, int) or not isinstance(self.min_shadow, int):
            raise ConfigError("trial min_requests and min_shadow are whole numbers")

    def as_dict(self) -> dict[str, Any]:
        """Every threshold by name (for statuses and reports)."""
        return asdict(self)


# Why these differ: an int8 classifier may flip a borderline label (agreement 0.9); an
# embedding must keep its direction; generation has no shadow (its answers are not re-run).
_KIND_DEFAULTS: dict[str, TrialPolicy] = {
    "classify": TrialPolicy(min_agreement=0.9),
    "detect": TrialPolicy(min_agreement=0.9),
    "embed": TrialPolicy(min_agreement=0.95, min_cosine=0.98),
    "tensor": TrialPolicy(min_cosine=0.999),
    "generate": TrialPolicy(min_shadow=0, shadow_share=0.0),
}


def policy_for(kind: str, signed: Mapping[str, Any] | None) -> TrialPolicy:
    """The policy of a trial of a ``kind`` package (``classify``, ``detect``, ``embed``,
    ``tensor``, ``generate``): its kind's defaults with the signed ``trial`` fields."""
    base = _KIND_DEFAULTS.get(kind, TrialPolicy())
    signed = dict(signed or {})
    unknown = set(signed) - {f.name for f in fields(TrialPolicy)}
    if unknown:
        raise ConfigError(f"unknown trial thresholds {sorted(unknown)}")
    policy = replace(base, **signed)
    if kind == "generate" and policy.min_shadow:
        raise ConfigError("a generate package's trial has no shadow: min_shadow must be 0")
    return policy


def _cosine(a: Any, b: Any) -> float:
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.shape != y.shape:
        return -1.0
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    if norm == 0.0:
        return 1.0 if not x.any() and not y.any() else 0.0
    return float(np.dot(x, y) / norm)


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    x0, y0 = max(a[0], b[0]), max(a[1], b[1])
    x1, y1 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _same_detections(new: Sequence[Any], old: Sequence[Any]) -> bool:
    if sorted(d.label for d in new) != sorted(d.label for d in old):
        return False
    left = list(old)
    for d in new:
        match = next(
            (o for o in left if o.label == d.label and _iou(d.box, o.box) >= _IOU_MATCH), None
        )
        if match is None:
            return False
        left.remove(match)
    return True


def agree(method: str, new: Any, old: Any, policy: TrialPolicy) -> list[bool]:
    """Per item of one request (a text, an image, one call's outputs), whether the new
    package's answer ``new`` agrees with the previous one's ``old`` (``method``: the model
    method both answered)."""
    if method != "run" and len(new) != len(old):
        return [False] * max(len(new), len(old))  # a different number of answers
    if method == "embed_with_info":
        pairs = zip(new, old, strict=True)
        return [_cosine(n.vector, o.vector) >= policy.min_cosine for n, o in pairs]
    if method == "classify":
        return [n.label == o.label for n, o in zip(new, old, strict=True)]
    if method == "detect":
        return [_same_detections(n, o) for n, o in zip(new, old, strict=True)]
    if method == "run":
        names = sorted(set(new) | set(old))
        return [all(_cosine(new.get(k, []), old.get(k, [])) >= policy.min_cosine for k in names)]
    raise ConfigError(f"a trial cannot compare {method!r} answers")
