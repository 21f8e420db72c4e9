"""One export in progress, as builders see it: the options, the resolved source, the target's
quantization preset, a work folder, the stage clock, the candidates and the report.

The builder fills ``candidates`` (each with its measured quality); ``run.py`` chooses one and
writes the package. Everything every export shares lives here once: stage timing and progress,
the manifest fields (``created_by`` included), the staging of candidates as real packages.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeinfer import __version__
from edgeinfer.config import QuantConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.source import Source
from edgeinfer.package_io import PackageIO

__all__ = ["Candidate", "ExportContext", "ExportReport", "Progress", "Quality", "created_by"]

Progress = Callable[[str, float], None]
# The budget when neither the user nor the recipe names one: 1 % (cosine, agreement).
DEFAULT_MAX_ACCURACY_LOSS = 0.01


@dataclass(frozen=True)
class Quality:
    """A candidate against the gate: the task's metric, whether it passes, a score where
    higher is more accurate (``--keep-best`` takes the highest), one line for messages and the
    JSON details for the report."""

    metric: str
    passed: bool
    score: float
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the report."""
        return {
            "metric": self.metric,
            "passed": self.passed,
            "summary": self.summary,
            **self.details,
        }


@dataclass
class Candidate:
    """One variant the export may ship: its files (package name -> built file), its typed io
    and the manifest fields that differ between variants.

    ``requested``: a variant the user asked for (the fp32 fallback is not, unless nothing was
    quantized); ``quality`` is set once the builder measured it.
    """

    name: str
    precision: str
    files: dict[str, Path]
    io: PackageIO
    quantization: dict[str, Any]
    tokens: dict[str, int | None] = field(default_factory=dict)
    early_exit: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    requested: bool = False
    quality: Quality | None = None

    @property
    def measured(self) -> Quality:
        """The quality, which every candidate has by the time the choice is made."""
        if self.quality is None:
            raise ConfigError(f"candidate {self.name} was never measured (a builder bug)")
        return self.quality


@dataclass
class ExportReport:
    """What the export did and measured; written as ``report.json`` into the package."""

    source: dict[str, Any]
    task: str
    target: str
    out: str
    builder: str = ""
    stages: list[dict[str, Any]] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    chosen: str | None = None
    warnings: list[str] = field(default_factory=list)
    pareto: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report (``pareto``: every candidate's accuracy and latency, when the
        export measured them)."""
        extra = {"pareto": self.pareto} if self.pareto else {}
        return {
            "source": self.source,
            "task": self.task,
            "target": self.target,
            "out": self.out,
            "builder": self.builder,
            "stages": self.stages,
            "variants": self.variants,
            "chosen": self.chosen,
            "warnings": self.warnings,
            **extra,
        }


def created_by() -> dict[str, str]:
    """The versions that built a package (the manifest's ``created_by``)."""
    import onnx
    import onnxruntime
    import torch
    import transformers

    return {
        "edgeinfer": __version__,
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


class ExportContext:
    """The state of one export that its builder reads and fills.

    Args:
        options: what was asked.
        work: a scratch folder, removed after the export.
        source: the resolved source model.
        task: the task being built.
        builder: the builder's registry name (for the report).
        cpu_only: whether that builder builds for ``cpu-*`` targets only.
        progress: called with (stage, seconds) after each stage.
    """

    def __init__(
        self,
        options: ExportOptions,
        *,
        work: Path,
        source: Source,
        task: str,
        builder: str,
        cpu_only: bool,
        progress: Progress | None = None,
    ) -> None:
        self.options, self.work, self.source, self.task = options, work, source, task
        self.progress = progress
        if cpu_only and not options.target.startswith("cpu-"):
            raise ConfigError(
                f"target {options.target} is built for image classifiers so far "
                f"(docs/targets.md); {builder} exports take the cpu-* targets"
            )
        recipe = source.recipe
        preset = QuantConfig.for_target(options.target)
        # The one place the default precision is decided: asked > recipe > target preset.
        defaults = recipe.export if recipe else {}
        mode = options.quantize or defaults.get("quantize")
        method = options.calibration_method or defaults.get("calibration_method")
        self.quant = replace(
            preset,
            mode=mode or preset.mode,
            calibration_method=method or preset.calibration_method,
            calibration_percentile=float(
                defaults.get("calibration_percentile", preset.calibration_percentile)
            ),
            # a recipe's float nodes where the target may keep any (not the QNN HTP)
            float_nodes=defaults.get("float_nodes", preset.float_nodes)
            if preset.qdq_rules == "ort"
            else preset.float_nodes,
            weight_rounding=defaults.get("weight_rounding", preset.weight_rounding)
            if preset.qdq_rules == "ort"
            else preset.weight_rounding,
        )
        # A recipe may ship the most accurate variant that passes when its requested one is
        # refused (a model whose int8 is slower than fp32 on some CPUs).
        self.keep_best = options.keep_best or bool(defaults.get("keep_best", False))
        loss = options.max_accuracy_loss
        if loss is None and recipe is not None:
            loss = recipe.gate.get("max_accuracy_loss")
        self.max_accuracy_loss = float(DEFAULT_MAX_ACCURACY_LOSS if loss is None else loss)
        self.source_info = source.describe()  # hashes the weights: once per export
        self.report = ExportReport(
            source=self.source_info,
            task=task,
            target=options.target,
            out=str(options.out),
            builder=builder,
        )
        self.candidates: dict[str, Candidate] = {}
        # Files the package carries besides the chosen variant's (a plot of the report).
        self.attachments: dict[str, bytes] = {}

    def calibrated(self, count: int) -> QuantConfig:
        """The preset from now on records ``count``: the samples a static quantization really
        calibrated on (fewer than asked when the data holds fewer); returns it."""
        self.quant = replace(self.quant, calibration_size=count)
        return self.quant

    @property
    def threads(self) -> int | None:
        """Threads for the candidates' sessions and the speed guard."""
        return self.options.threads

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as export stage ``name``: into the report, and to ``progress``."""
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.report.stages.append({"name": name, "seconds": round(seconds, 3)})
        if self.progress:
            self.progress(name, seconds)

    def add(self, candidate: Candidate) -> Candidate:
        """Register a candidate (its report entry starts with its precision and, when it has
        any, its quantization: mode, calibration, share of int8 MACs)."""
        self.candidates[candidate.name] = candidate
        entry = self.report.variants.setdefault(candidate.name, {})
        entry["precision"] = candidate.precision
        if candidate.quantization:
            entry["quantization"] = candidate.quantization
        return candidate

    def note(self, name: str, **details: Any) -> None:
        """Add measurements of variant ``name`` to the report."""
        self.report.variants.setdefault(name, {}).update(details)

    def measured(
        self, candidate: Candidate, verdict: Verdict, summary: str, **details: Any
    ) -> Quality:
        """Judge ``candidate`` by ``verdict`` against the run's budget — the one place a
        gate's verdict becomes a ``Quality`` — with ``summary`` for messages and ``details``
        beside the verdict's in the report; record it (on the candidate and in the report)
        and return it."""
        loss = self.max_accuracy_loss
        # a quantized variant passes on enough evidence only; an fp32 rewrite needs none
        weak = verdict.weak and candidate.precision != "fp32"
        quality = Quality(
            metric=verdict.metric,
            passed=verdict.passes(loss) and not weak,
            score=verdict.mean,
            summary=summary,
            details={**verdict.to_dict(loss), **details},
        )
        candidate.quality = quality
        self.note(candidate.name, accuracy=quality.to_dict())
        return quality

    def fields(self, candidate: Candidate, accuracy: dict[str, Any]) -> dict[str, Any]:
        """The manifest fields of ``candidate`` other than ``files``."""
        return {
            "name": self.source.name,
            "task": self.task,
            "source": self.source_info,
            "created_by": created_by(),
            "target": self.options.target,
            "precision": candidate.precision,
            "quantization": candidate.quantization,
            "providers": list(self.quant.providers),
            "io": candidate.io,
            "tokens": candidate.tokens,
            "accuracy": accuracy,
            "early_exit": candidate.early_exit,
            "extra": candidate.extra,
        }

    def stage_candidate(self, candidate: Candidate) -> Path:
        """``candidate`` laid out as a real package under the work folder (for evaluating it
        through the runtime exactly as a device runs it); returns the folder."""
        folder = self.work / "candidates" / candidate.name
        if not folder.exists():
            package.stage(folder, files=candidate.files, fields=self.fields(candidate, {}))
        return folder
