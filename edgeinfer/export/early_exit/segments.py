"""What the two early-exit builders share: segment files, segment candidates, their validation
traces, the gate (full-depth accuracy of int8 segments vs fp32) and the exit-rule calibration
(the default rule and threshold chosen on the validation split's curve)."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

from edgeinfer.export.builder import Builder
from edgeinfer.export.context import Candidate
from edgeinfer.export.gates.verdict import OutputScore, Verdict
from edgeinfer.export.options import EarlyExitOptions
from edgeinfer.package_io import ExitSegmentsIO
from edgeinfer.runtime.kinds.early_exit import EXIT_POLICIES
from edgeinfer.runtime.kinds.exit_curve import NEVER_EXIT, ExitTrace, sweep

__all__ = ["SegmentsBuilder", "calibrate_policies", "segment_name"]


def segment_name(index: int) -> str:
    """The package file of segment ``index``."""
    return f"segment_{index}.onnx"


class SegmentsBuilder(Builder):
    """A classifier exported as segments with exit heads (docs/early_exit.md)."""

    tasks = ("classify",)
    options_type = EarlyExitOptions

    def exit_options(self, *, default_train: str) -> EarlyExitOptions:
        """The asked options, completed with the recipe's ``[early_exit]`` defaults."""
        given = self.run.options.builder
        asked = given if isinstance(given, EarlyExitOptions) else EarlyExitOptions()
        recipe = self.run.source.recipe
        defaults = recipe.early_exit if recipe is not None else {}
        return EarlyExitOptions(
            exit_every=asked.exit_every or int(defaults.get("exit_every", 2)),
            train_data=asked.train_data or str(defaults.get("train", default_train)),
            limit=asked.limit,
        )

    def segments_candidate(
        self,
        precision: str,
        graphs: list[Path],
        io: ExitSegmentsIO,
        spec: dict[str, Any],
        *,
        extra_files: dict[str, Path] | None = None,
        tokens: dict[str, int | None] | None = None,
        quantization: dict[str, Any] | None = None,
    ) -> Candidate:
        """A candidate of ``graphs`` (one per segment) whose exit rule is not calibrated yet:
        every input runs to the full-depth head."""
        return self.run.add(
            Candidate(
                name=precision,
                precision=precision,
                files={**{g.name: g for g in graphs}, **(extra_files or {})},
                io=io,
                quantization=quantization or {"mode": "none"},
                tokens=tokens or {},
                early_exit={**spec, "threshold": NEVER_EXIT},
                requested=precision == ("int8" if self.run.quant.mode == "int8" else "fp32"),
            )
        )

    @abc.abstractmethod
    def trace(self, candidate: Candidate) -> ExitTrace:
        """Every validation input through every segment of the staged ``candidate``."""

    def calibrate(self, details: dict[str, Any]) -> None:
        """Trace every candidate on the validation split, gate int8 on its full-depth accuracy
        against fp32, and calibrate each candidate's exit rule on its own trace."""
        run = self.run
        loss = run.max_accuracy_loss
        with run.stage("thresholds"):
            traces = {name: self.trace(c) for name, c in run.candidates.items()}
            full = {name: t.accuracy_at(NEVER_EXIT) for name, t in traces.items()}
            for name, candidate in run.candidates.items():
                run.note(name, full_accuracy=full[name])
                score = OutputScore(
                    output="segments",
                    metric="accuracy",
                    reason="early-exit segments: validation accuracy at full depth, vs fp32's",
                    value=full[name],
                    count=len(traces[name].labels),
                    parity=full[name] >= full["fp32"],
                    floor=full["fp32"] - loss,
                    details={"fp32": full["fp32"]},
                )
                run.measured(
                    candidate,
                    Verdict((score,), metric="accuracy"),
                    f"{name} segments reach {full[name]:.4f} validation accuracy at full "
                    f"depth (fp32 {full['fp32']:.4f})",
                )
                candidate.early_exit = {
                    **(candidate.early_exit or {}),
                    **calibrate_policies(traces[name], loss),
                    "batch_policy": "leave",
                    **details,
                }

    def accuracy(self, chosen: Candidate) -> dict[str, Any]:
        spec = chosen.early_exit or {}
        return {
            "metric": "accuracy",
            "reference": "fp32-segments",
            "eval_data": f"builtin:{spec.get('validation', {}).get('data')}-validation",
            "max_accuracy_loss": self.run.max_accuracy_loss,
            "fp32": self.run.candidates["fp32"].measured.score,
            "value": chosen.measured.score,
        }


def calibrate_policies(trace: ExitTrace, max_accuracy_loss: float) -> dict[str, Any]:
    """Sweep every exit rule and choose the default rule and threshold: the fastest (fewest
    mean layers, which is deterministic where the measured latency is noisy; ties: the more
    accurate, then max_softmax before entropy before patience, then the more cautious
    threshold) whose ``losses`` — the share of inputs the full depth gets right and it gets
    wrong — are within ``max_accuracy_loss``. Inputs an early head gets right and the full
    depth wrong earn no credit: netting them out lets the sweep pick the point where such
    gains were luckiest on validation, which then misses the budget on new data.

    Returns the manifest fields ``policy``, ``threshold``, ``max_accuracy_loss``,
    ``full_depth``, ``default``, ``curve`` (the default rule's) and ``curves`` (every rule's).
    """
    exits = len(trace.exit_layers)
    curves = {p: [trace.point(t, p) for t in sweep(p, exits)] for p in EXIT_POLICIES}
    full = trace.point(NEVER_EXIT)

    def within(point: dict[str, float]) -> bool:
        return point["losses"] <= max_accuracy_loss + 1e-9

    def cost(item: tuple[str, dict[str, float]]) -> tuple[float, ...]:
        policy, point = item
        cautious = -point["threshold"] if policy == "entropy" else point["threshold"]
        rank = EXIT_POLICIES.index(policy)
        return (point["mean_layers"], -point["accuracy"], rank, -cautious)

    passing = [(p, pt) for p, curve in curves.items() for pt in curve if within(pt)]
    policy, best = min(passing, key=cost)  # never empty: the full-depth point is swept
    return {
        "policy": policy,
        "threshold": best["threshold"],
        "max_accuracy_loss": max_accuracy_loss,
        "criterion": "losses",
        "full_depth": full,
        "default": best,
        "curve": curves[policy],
        "curves": curves,
    }
