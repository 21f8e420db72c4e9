"""Which variant a generate export ships: gate first, then speed, then accuracy among ties."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from edgeinfer.errors import AccuracyGateError, SlowerQuantizationError
from edgeinfer.export.generate_pipeline import _choose
from edgeinfer.export.lm import LMQuality


def run_with(variants: dict[str, dict[str, Any]], **options: bool) -> Any:
    opts = {"keep_best": False, "force_quantize": False, **options}
    report = SimpleNamespace(variants=variants, warnings=[])
    return SimpleNamespace(report=report, options=SimpleNamespace(**opts))


def variant(tokens_per_s: float, agreement: float, passed: bool) -> dict[str, Any]:
    return {
        "tokens_per_s": tokens_per_s,
        "agreement": agreement,
        "passed": passed,
        "perplexity": 32.0,
    }


MEASURED = {n: LMQuality(32.0, 1.0, 100) for n in ("fp32", "a", "b", "c")}


def test_fastest_passing_wins_and_near_ties_go_to_accuracy() -> None:
    variants = {
        "fp32": variant(25, 1.0, True),
        "a": variant(100, 0.90, False),  # fastest, fails the gate
        "b": variant(66, 0.955, True),
        "c": variant(64, 0.968, True),  # within 5 % of b: the more accurate one ships
    }
    assert _choose(run_with(variants), MEASURED) == "c"
    variants["c"]["tokens_per_s"] = 50  # now clearly slower
    assert _choose(run_with(variants), MEASURED) == "b"


def test_no_passing_variant_fails_or_keeps_fp32() -> None:
    variants = {"fp32": variant(25, 1.0, True), "a": variant(90, 0.9, False)}
    measured = {"fp32": MEASURED["fp32"], "a": MEASURED["a"]}
    with pytest.raises(AccuracyGateError):
        _choose(run_with(variants), measured)
    assert _choose(run_with(variants, keep_best=True), measured) == "fp32"


def test_slower_than_fp32_is_refused_unless_forced() -> None:
    variants = {"fp32": variant(25, 1.0, True), "a": variant(20, 0.99, True)}
    measured = {"fp32": MEASURED["fp32"], "a": MEASURED["a"]}
    with pytest.raises(SlowerQuantizationError):
        _choose(run_with(variants), measured)
    assert _choose(run_with(variants, force_quantize=True), measured) == "a"
