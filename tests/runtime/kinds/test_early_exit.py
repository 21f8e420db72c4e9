"""Exit rules beyond max softmax: entropy and PABEE patience, their calibration and the runtime
choice of rule (crafted logits, then the real text package)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export.early_exit.segments import calibrate_policies
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.kinds.early_exit import (
    EXIT_POLICIES,
    SegmentRunner,
    first_exit,
    normalized_entropy,
    passes,
    validate_threshold,
)
from edgeinfer.runtime.kinds.exit_curve import ExitTrace
from edgeinfer.runtime.tokenizer import TextTokenizer

TEXTS = [
    "Shares in the bank fell after profits missed forecasts.",
    "The striker scored twice as the champions won the cup final on Saturday.",
    "Ministers will publish the bill before the general election.",
    "A new mobile phone chip promises longer battery life.",
    "The film won three awards at the ceremony on Sunday night.",
]


def _probs(rows: list[list[float]]) -> np.ndarray:
    """Logits [B, C] whose softmax is exactly ``rows``."""
    return np.log(np.asarray(rows, dtype=np.float64)).astype(np.float32)


def _label(label: int, p: float = 0.6, classes: int = 4) -> list[float]:
    rest = (1.0 - p) / (classes - 1)
    return [p if c == label else rest for c in range(classes)]


def test_normalized_entropy_spans_zero_to_one() -> None:
    uniform = _probs([[0.25] * 4])
    peaked = _probs([[0.97, 0.01, 0.01, 0.01]])
    assert normalized_entropy(uniform)[0] == pytest.approx(1.0, abs=1e-6)
    h = -(0.97 * math.log(0.97) + 3 * 0.01 * math.log(0.01)) / math.log(4)
    assert normalized_entropy(peaked)[0] == pytest.approx(h, abs=1e-5)
    assert passes(peaked, h + 1e-3, "entropy").tolist() == [True]
    assert passes(peaked, h - 1e-3, "entropy").tolist() == [False]


def test_entropy_rule_exits_at_the_first_head_under_the_threshold() -> None:
    sharp, vague = [0.97, 0.01, 0.01, 0.01], [0.25] * 4
    exits = [
        _probs([vague, sharp, vague]),
        _probs([sharp, sharp, vague]),
        _probs([vague, vague, vague]),
    ]
    assert first_exit(exits, 0.5, "entropy").tolist() == [1, 0, 2]
    assert first_exit(exits, 1.0, "entropy").tolist() == [0, 0, 0]  # everything is <= 1
    assert first_exit(exits, -1.0, "entropy").tolist() == [2, 2, 2]  # nothing is < 0


def test_patience_rule_counts_consecutive_agreeing_heads() -> None:
    # rows: labels per head (4 heads)
    labels = [
        [0, 0, 1, 1],  # agrees at heads 0-1: streak 2 at head 1
        [0, 1, 1, 2],  # streak 2 at head 2
        [0, 1, 2, 2],  # streak 2 only at the last head
        [3, 3, 3, 0],  # streak 3 at head 2
    ]
    exits = [_probs([_label(row[h]) for row in labels]) for h in range(4)]
    assert first_exit(exits, 1, "patience").tolist() == [0, 0, 0, 0]
    assert first_exit(exits, 2, "patience").tolist() == [1, 2, 3, 1]
    assert first_exit(exits, 3, "patience").tolist() == [3, 3, 3, 2]
    assert first_exit(exits, 4, "patience").tolist() == [3, 3, 3, 3]
    # confidence does not matter to patience: the same labels at p=0.99 exit the same way
    sure = [_probs([_label(row[h], 0.99) for row in labels]) for h in range(4)]
    assert first_exit(sure, 2, "patience").tolist() == [1, 2, 3, 1]


def test_thresholds_are_validated_per_rule() -> None:
    assert validate_threshold(0.9) == 0.9
    assert validate_threshold(-0.5, "entropy") == -0.5
    assert validate_threshold(3, "patience") == 3.0
    for bad, policy in [(-0.1, "max_softmax"), (1.5, "patience"), (0, "patience")]:
        with pytest.raises(ConfigError):
            validate_threshold(bad, policy)
    with pytest.raises(ConfigError, match="unknown exit policy"):
        validate_threshold(0.5, "margin")
    with pytest.raises(ConfigError, match="finite"):
        validate_threshold(float("nan"), "entropy")


def _trace(
    exit_labels: list[list[int]], truth: list[int], confidence: list[list[float]]
) -> ExitTrace:
    """A trace of N inputs over E heads: head e predicts ``exit_labels[e][n]`` with
    probability ``confidence[e][n]``; each head takes 1 ms."""
    logits = np.stack(
        [
            _probs([_label(lab, p) for lab, p in zip(labs, conf, strict=True)])
            for labs, conf in zip(exit_labels, confidence, strict=True)
        ]
    )
    heads, n = logits.shape[:2]
    return ExitTrace(
        logits=logits,
        segment_ms=np.ones((heads, n)),
        labels=np.asarray(truth, dtype=np.int64),
        exit_layers=[2 * (e + 1) for e in range(heads)],
    )


def test_calibration_picks_the_fastest_rule_within_the_budget() -> None:
    truth = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    # head 0 is right on 8/10 but sure of its two mistakes; head 1 and head 2 are always right
    head0 = [0, 1, 2, 3, 0, 1, 2, 3, 3, 2]
    trace = _trace(
        [head0, truth, truth],
        truth,
        [[0.6] * 8 + [0.95, 0.95], [0.9] * 10, [0.9] * 10],
    )
    result = calibrate_policies(trace, max_accuracy_loss=0.0)
    assert set(result["curves"]) == set(EXIT_POLICIES)
    assert result["full_depth"]["accuracy"] == 1.0 and result["full_depth"]["mean_layers"] == 6.0
    # max softmax and entropy exit the sure mistakes at head 0, so they need the full depth for
    # 100 %; patience 2 stops at head 1 where heads 0 and 1 agree (8 of 10) and sends the two
    # disagreements on to head 2: the fastest rule with no accuracy loss
    assert result["policy"] == "patience" and result["threshold"] == 2.0
    assert result["default"] == {
        "threshold": 2.0,
        "accuracy": 1.0,
        "mean_layers": 4.4,
        "mean_latency_ms": 2.2,
        "losses": 0.0,  # no input the full depth gets right is answered wrong
    }
    assert result["curve"] == result["curves"]["patience"]
    # the first head alone loses 2 of 10: within a 20-point budget, not within 15 points
    loose = calibrate_policies(trace, max_accuracy_loss=0.2)
    assert loose["default"]["mean_layers"] == 2.0 and loose["default"]["accuracy"] == 0.8
    assert loose["default"]["losses"] == pytest.approx(0.2)
    assert loose["policy"] == "max_softmax"  # ties go to max softmax
    assert calibrate_policies(trace, max_accuracy_loss=0.15)["default"]["mean_layers"] > 2.0


def test_gains_of_early_heads_earn_no_credit() -> None:
    truth = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    # head 0 fixes two full-depth mistakes and makes two of its own: no net drop, 20 % losses
    head0 = [0, 1, 2, 3, 0, 1, 2, 3, 1, 2]
    last = [3, 2, 2, 3, 0, 1, 2, 3, 0, 1]
    trace = _trace([head0, last], truth, [[0.9] * 10, [0.9] * 10])
    first = trace.point(0.0)
    assert first["accuracy"] == trace.point(2.0)["accuracy"] == 0.8
    assert first["losses"] == pytest.approx(0.2)
    assert calibrate_policies(trace, max_accuracy_loss=0.1)["default"]["mean_layers"] == 4.0


def _runner(package: Path) -> tuple[SegmentRunner, TextTokenizer]:
    manifest = Manifest.read(package)
    runner = SegmentRunner(package, manifest, config=RuntimeConfig(threads=2, warmup_runs=0))
    tokenizer = TextTokenizer.for_package(package, manifest)
    return runner, tokenizer


@pytest.mark.slow
def test_every_rule_gives_the_same_exits_batched_and_traced(early_exit_package: Path) -> None:
    runner, tokenizer = _runner(early_exit_package)
    ids, mask = tokenizer.encode(TEXTS)
    trace = runner.trace(ids, mask)
    for policy, taus in [("entropy", (0.05, 0.3, 0.7)), ("patience", (1, 2, 3))]:
        for tau in taus:
            expected = first_exit(trace.logits, tau, policy).tolist()
            for batch_policy in ("leave", "all"):
                got, _ = runner.run(
                    ids, mask, threshold=tau, policy=batch_policy, exit_policy=policy
                )
                assert got.tolist() == expected, (policy, tau, batch_policy)


@pytest.mark.slow
def test_model_classify_takes_an_exit_policy(early_exit_package: Path) -> None:
    spec = Manifest.read(early_exit_package).early_exit
    assert spec is not None
    assert spec["policy"] in EXIT_POLICIES
    assert set(spec["curves"]) == set(EXIT_POLICIES)
    with edgeinfer.load(early_exit_package, threads=2) as model:
        first = model.classify(TEXTS, exit_policy="patience", exit_threshold=1)
        assert [r.exit_layer for r in first] == [2] * len(TEXTS)
        full = model.classify(TEXTS, exit_policy="entropy", exit_threshold=-1)
        assert [r.exit_layer for r in full] == [6] * len(TEXTS)
        two = model.classify(TEXTS, exit_policy="patience", exit_threshold=2)
        assert all(r.exit_layer in (4, 6) for r in two)
        other = next(p for p in EXIT_POLICIES if p != spec["policy"])
        with pytest.raises(ConfigError, match="pass exit_threshold"):
            model.classify(TEXTS, exit_policy=other)
        with pytest.raises(ConfigError, match="whole number"):
            model.classify(TEXTS, exit_policy="patience", exit_threshold=0.5)
