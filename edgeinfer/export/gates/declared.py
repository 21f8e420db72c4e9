"""``--metric OUTPUT=METRIC``: the metric a user declares for an output (``choice.py`` says
what each one measures)."""

from __future__ import annotations

from collections.abc import Sequence

from edgeinfer.errors import ConfigError

__all__ = ["METRICS", "parse_declared"]

METRICS = ("detections", "sequence", "probabilities", "embedding", "state", "tensor", "exact")


def parse_declared(items: Sequence[str]) -> dict[str, tuple[str, int]]:
    """``OUTPUT=METRIC`` (``sequence:BLANK`` names the CTC blank) -> output -> (metric,
    blank)."""
    declared = {}
    for item in items:
        output, sep, spec = item.partition("=")
        metric, _, blank = spec.partition(":")
        if not sep or not output or metric not in METRICS:
            raise ConfigError(
                f"--metric {item!r} must be OUTPUT=METRIC with METRIC one of {', '.join(METRICS)}"
            )
        if blank and (metric != "sequence" or not blank.isdigit()):
            raise ConfigError(f"--metric {item!r}: only sequence takes :BLANK, a class index")
        declared[output] = (metric, int(blank or 0))
    return declared
