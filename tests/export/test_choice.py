"""Which variant an export ships: the gate first, then the builder's preference (for decoders
the fastest, the more accurate among near ties), then the speed guard against fp32."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgeinfer.errors import AccuracyGateError, SlowerQuantizationError
from edgeinfer.export.context import Candidate, Quality
from edgeinfer.export.decoder.builder import DecoderBuilder
from edgeinfer.export.run import choose
from edgeinfer.package_io import TextEncoderIO


class Variants:
    """A builder with the decoder's preference (the choice reads nothing else from a
    builder); ``timed``: it also gives a speed probe, which these tests only use under the
    fixed clock of ``int8_measured_slower`` (timing real no-op calls would be noise)."""

    def __init__(self, run: Any, *, timed: bool) -> None:
        self.run, self.timed = run, timed

    prefer = DecoderBuilder.prefer

    def probe(self, candidate: Candidate) -> Callable[[], object] | None:
        return (lambda: None) if self.timed else None

    def slower_hint(self, candidate: Candidate) -> str:
        return ""


IO = TextEncoderIO(
    graph="model.onnx",
    tokenizer="tokenizer.json",
    inputs=(),
    outputs=(),
    max_seq_len=8,
    embedding_dim=4,
)


def run_with(variants: dict[str, tuple[Any, ...]], **options: Any) -> Any:
    """name -> (tokens/s, agreement, passes the gate[, package bytes: 100 if not given]);
    every name but fp32 is requested."""
    candidates = {}
    report = SimpleNamespace(variants={}, warnings=[], chosen=None)
    for name, (speed, agreement, passed, *size) in variants.items():
        candidates[name] = Candidate(
            name=name,
            precision=name,
            files={"model.onnx": Path("model.onnx")},
            io=IO,
            quantization={},
            requested=name != "fp32",
            quality=Quality("next_token_agreement", passed, agreement, f"{name} measured"),
        )
        report.variants[name] = {"tokens_per_s": speed, "bytes": size[0] if size else 100}
    opts = SimpleNamespace(
        **{"keep_best": False, "force_quantize": False, "target": "cpu-avx2", **options}
    )
    run = SimpleNamespace(
        candidates=candidates,
        report=report,
        options=opts,
        keep_best=opts.keep_best,
        max_accuracy_loss=0.05,
        note=lambda name, **details: report.variants[name].update(details),
    )
    return run


def chosen(run: Any, *, timed: bool = False) -> str:
    return choose(run, Variants(run, timed=timed)).name  # type: ignore[arg-type]


def test_fastest_passing_wins_and_near_ties_go_to_accuracy() -> None:
    variants = {
        "fp32": (25.0, 1.0, True),
        "a": (100.0, 0.90, False),  # fastest, fails the gate
        "b": (66.0, 0.955, True),
        "c": (64.0, 0.968, True),  # within 5 % of b: the more accurate one ships
    }
    assert chosen(run_with(variants)) == "c"
    variants["c"] = (50.0, 0.968, True)  # now clearly slower
    assert chosen(run_with(variants)) == "b"


def test_among_near_ties_the_smaller_package_wins() -> None:
    variants = {
        "fp32": (25.0, 1.0, True, 650),
        "small": (64.0, 0.955, True, 150),  # within 5 % of the fastest, half its bytes
        "large": (66.0, 0.967, True, 290),
    }
    assert chosen(run_with(variants)) == "small"
    variants["small"] = (50.0, 0.955, True, 150)  # clearly slower: speed first
    assert chosen(run_with(variants)) == "large"


def test_no_passing_variant_fails_or_keeps_fp32() -> None:
    variants = {"fp32": (25.0, 1.0, True), "a": (90.0, 0.9, False)}
    with pytest.raises(AccuracyGateError, match="--keep-best"):
        chosen(run_with(variants))
    run = run_with(variants, keep_best=True)
    assert chosen(run) == "fp32" and "--keep-best kept fp32" in run.report.warnings[0]


@pytest.mark.usefixtures("int8_measured_slower")
def test_slower_than_fp32_is_refused_unless_forced() -> None:
    variants = {"fp32": (25.0, 1.0, True), "a": (20.0, 0.99, True)}
    with pytest.raises(SlowerQuantizationError, match="--force-quantize"):
        chosen(run_with(variants), timed=True)
    forced = run_with(variants, force_quantize=True)
    assert chosen(forced, timed=True) == "a" and "shipped anyway" in forced.report.warnings[0]
    kept = run_with(variants, keep_best=True)
    assert chosen(kept, timed=True) == "fp32"


@pytest.mark.usefixtures("int8_measured_slower")
def test_accelerator_targets_skip_the_cpu_speed_guard() -> None:
    variants = {"fp32": (25.0, 1.0, True), "a": (20.0, 0.99, True)}
    assert chosen(run_with(variants, target="gpu-cuda"), timed=True) == "a"
