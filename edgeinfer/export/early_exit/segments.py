"""What the two early-exit builders share: segment candidates, their validation traces, the
gate (full-depth accuracy of int8 segments vs fp32) and the exit-rule calibration."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

from edgeinfer.export.builders.base import Builder
from edgeinfer.export.context import Candidate, Quality
from edgeinfer.export.early_exit_calibrate import NEVER_EXIT, SplitTrace, calibrate_policies
from edgeinfer.export.options import EarlyExitOptions
from edgeinfer.package_io import ExitSegmentsIO

__all__ = ["SegmentsBuilder"]


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
    def trace(self, candidate: Candidate) -> SplitTrace:
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
                passed = name == "fp32" or full[name] >= full["fp32"] - loss
                run.note(name, full_accuracy=full[name])
                run.measured(
                    candidate,
                    Quality(
                        metric="accuracy",
                        passed=passed,
                        score=full[name],
                        summary=(
                            f"{name} segments reach {full[name]:.4f} validation accuracy at full "
                            f"depth (fp32 {full['fp32']:.4f})"
                        ),
                        details={"mean": full[name], "fp32": full["fp32"]},
                    ),
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
