"""``edgeinfer export``: source -> ONNX -> parity -> fusion -> quantize -> gate -> package.

Each stage is timed and reported through ``progress``; a failed check raises a typed error and
leaves nothing at the output path.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeinfer import __version__, placement
from edgeinfer.config import CalibrationMethod, QuantConfig, QuantMode
from edgeinfer.errors import (
    AccuracyGateError,
    ConfigError,
    ExportError,
    ParityError,
    SlowerQuantizationError,
)
from edgeinfer.export import calibrate, convert, optimize, package, quantize, validate
from edgeinfer.export.source import VISION_BUILTINS, Source, resolve_source

__all__ = ["ExportOptions", "ExportReport", "export"]

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class ExportOptions:
    """What ``edgeinfer export`` is asked to do (the CLI's flags, validated).

    ``max_accuracy_loss`` is a fraction: for embeddings the mean cosine to PyTorch fp32 must
    stay >= 1 - loss (and the minimum >= 1 - 3 x loss); for classifiers the label agreement
    must stay >= 1 - loss.
    """

    source: str
    out: Path
    task: str = "auto"
    target: str = "cpu-avx2"
    quantize: QuantMode = "int8"
    calibration: Path | None = None
    # int8-static: minmax, entropy or percentile; None keeps the target preset's.
    calibration_method: CalibrationMethod | None = None
    eval_data: Path | None = None
    max_accuracy_loss: float = 0.01
    keep_best: bool = False
    force_quantize: bool = False
    overwrite: bool = False
    threads: int | None = None
    held_count: int = 200
    # generate only: the quantized variants to try (default: every one in
    # ``generate_pipeline.VARIANTS``); the gate is perplexity +3 % and agreement 95 %.
    variants: tuple[str, ...] | None = None
    # classify only (docs/early_exit.md): exit heads after every ``exit_every``-th layer,
    # trained on ``train_data`` ("bbc", the built-in BBC News topics); ``early_exit_articles``
    # caps the articles per split for quick builds (tests).
    early_exit: bool = False
    exit_every: int = 2
    train_data: str | None = None
    early_exit_articles: int | None = None
    # the EP-coverage gate (docs/providers.md): the target's first provider must take at
    # least this fraction of the estimated FLOPs on this machine; None skips the check.
    min_ep_coverage: float | None = None

    def __post_init__(self) -> None:
        if self.early_exit:
            from edgeinfer.export.early_exit import check_options

            check_options(self)
        if not 0.0 <= self.max_accuracy_loss < 1.0:
            raise ConfigError(f"max_accuracy_loss must be in [0, 1), got {self.max_accuracy_loss}")
        if self.task not in ("auto", "embed", "classify", "generate"):
            raise ConfigError(f"unknown task {self.task!r}: use auto, embed, classify or generate")
        if self.min_ep_coverage is not None and (self.min_ep_coverage < 0 or self.early_exit):
            raise ConfigError("min_ep_coverage must be >= 0 and is not checked on early-exit")
        if self.held_count < 1:
            raise ConfigError(f"held_count must be >= 1, got {self.held_count}")
        if self.variants is not None:
            from edgeinfer.export.generate_pipeline import VARIANTS

            unknown = [v for v in self.variants if v not in VARIANTS]
            if unknown or not self.variants:
                raise ConfigError(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")


@dataclass
class ExportReport:
    """What the export did and measured; written as ``report.json`` into the package."""

    source: dict[str, Any]
    task: str
    target: str
    out: str
    stages: list[dict[str, Any]] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    chosen: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {
            "source": self.source,
            "task": self.task,
            "target": self.target,
            "out": self.out,
            "stages": self.stages,
            "variants": self.variants,
            "chosen": self.chosen,
            "warnings": self.warnings,
        }


@contextmanager
def timed_stage(report: ExportReport, progress: Progress | None, name: str) -> Iterator[None]:
    """Time the block as export stage ``name``: into the report, and to ``progress``."""
    started = time.perf_counter()
    yield
    seconds = time.perf_counter() - started
    report.stages.append({"name": name, "seconds": round(seconds, 3)})
    if progress:
        progress(name, seconds)


def _versions() -> dict[str, str]:
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
    }


class _Run:
    """One export in progress: the options, a work folder, the report and the stage clock."""

    def __init__(self, options: ExportOptions, work: Path, progress: Progress | None) -> None:
        self.options = options
        self.work = work
        self.progress = progress
        preset = QuantConfig.for_target(options.target)
        if not options.target.startswith("cpu-"):
            raise ConfigError(
                f"target {options.target} is built for image classifiers so far "
                "(docs/targets.md); text models take the cpu-* targets"
            )
        self.quant = replace(
            preset,
            mode=options.quantize,
            calibration_method=options.calibration_method or preset.calibration_method,
        )
        self.source: Source = resolve_source(options.source)
        task = convert.detect_task(self.source) if options.task == "auto" else options.task
        if task not in (*convert.OPTIMUM_TASKS, "generate"):
            raise ConfigError(
                f"export of task {task!r} is not supported yet; supported: "
                f"{', '.join(convert.OPTIMUM_TASKS)}"
            )
        self.task = task
        self.source_info = self.source.describe()  # hashes the weights: once per export
        self.report = ExportReport(
            source=self.source_info, task=task, target=options.target, out=str(options.out)
        )

    def stage(self, name: str) -> AbstractContextManager[None]:
        return timed_stage(self.report, self.progress, name)

    def fields(
        self, precision: str, accuracy: dict[str, Any], tokens: dict[str, Any]
    ) -> dict[str, Any]:
        io: dict[str, Any] = {"max_seq_len": self.source.max_seq_len}
        if self.task == "embed":
            io.update(
                embedding_dim=int(self.source.config["hidden_size"]), pooling="mean", normalize=True
            )
        else:
            id2label = self.source.config.get("id2label") or {}
            io["labels"] = [str(id2label[k]) for k in sorted(id2label, key=int)]
        quant: dict[str, Any] = {"mode": "none"}
        if precision == "int8":
            quant = {
                "mode": "int8-dynamic" if self.quant.mode == "int8" else "int8-static",
                "per_channel": self.quant.per_channel,
                "reduce_range": self.quant.reduce_range,
                "ops": list(self.quant.ops_to_quantize),
            }
            if self.quant.mode == "int8-static":
                quant.update(
                    calibration_method=self.quant.calibration_method,
                    calibration_size=self.quant.calibration_size,
                )
        return {
            "name": self.source.name,
            "task": self.task,
            "source": self.source_info,
            "created_by": _versions(),
            "target": self.options.target,
            "precision": precision,
            "quantization": quant,
            "providers": list(self.quant.providers),
            "io": io,
            "tokens": tokens,
            "accuracy": accuracy,
        }


def export(options: ExportOptions, *, progress: Progress | None = None) -> ExportReport:
    """Run the export described by ``options`` and return its report.

    Raises:
        ConfigError, MissingDependencyError, ConversionError, ParityError,
        AccuracyGateError (exit 1 in the CLI), SlowerQuantizationError (exit 1 in the CLI).
    """
    out = Path(options.out)
    if out.exists() and not options.overwrite:
        raise ConfigError(f"{out} already exists; pass --overwrite to replace it")
    partial = package.partial_path(out)
    shutil.rmtree(partial, ignore_errors=True)  # left by an export that was killed
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-export-") as tmp, _quiet_libraries():
        if options.early_exit and options.source == "mnist-cnn":  # built here: no source folder
            from edgeinfer.export.early_exit_vision import export_mnist_cnn

            report = ExportReport(
                source={"builtin": options.source},
                task="classify",
                target=options.target,
                out=str(out),
            )
            try:
                export_mnist_cnn(options, report, Path(tmp), partial, progress)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            return report
        if options.source in VISION_BUILTINS:  # image classifiers: export/vision.py
            from edgeinfer.export.vision import export_vision

            return export_vision(options, Path(tmp), partial, progress)
        run = _Run(options, Path(tmp), progress)
        if options.min_ep_coverage is not None and run.task == "generate":
            raise ConfigError("min_ep_coverage is checked on embed and classify packages only")
        try:
            if run.task == "generate":
                from edgeinfer.export.generate_pipeline import export_generate

                export_generate(run, partial)
            elif options.early_exit:
                from edgeinfer.export.early_exit import export_early_exit

                export_early_exit(run, partial)
            else:
                _export(run, partial)
        except ExportError as exc:
            exc.report = run.report.to_dict()  # type: ignore[attr-defined]  # for --json output
            shutil.rmtree(partial, ignore_errors=True)
            raise
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return run.report


class _DropRootWarnings(logging.Filter):
    """onnxruntime's quantizer reports every untyped tensor with ``logging.warning`` on the
    root logger (hundreds of lines for a fused graph); keep errors only. A filter on the root
    logger sees only records logged on it directly, so edgeinfer's own warnings still pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


@contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Silence the export libraries' chatter (deprecation notes, tracer warnings, ORT's C++
    log) for the duration of an export; our stage lines and warnings stay."""
    import onnxruntime
    from transformers.utils import logging as hf_logging

    root_filter = _DropRootWarnings()
    optimum_logger = logging.getLogger("optimum")
    previous = (hf_logging.get_verbosity(), optimum_logger.level)
    logging.getLogger().addFilter(root_filter)
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    optimum_logger.setLevel(logging.ERROR)
    onnxruntime.set_default_logger_severity(3)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(root_filter)
        hf_logging.set_verbosity(previous[0])
        optimum_logger.setLevel(previous[1])
        onnxruntime.set_default_logger_severity(2)


def _export(run: _Run, partial: Path) -> None:
    options, work, task = run.options, run.work, run.task
    held = (
        calibrate.read_text_file(options.eval_data)
        if options.eval_data
        else calibrate.builtin_text("held", options.held_count)
    )
    tokenizer = work / package.TOKENIZER_NAME

    with run.stage("convert"):
        raw = convert.to_onnx(run.source, task, work / "onnx")
        tokens = convert.prepare_tokenizer(run.source, tokenizer)
    with run.stage("reference"):
        reference = validate.torch_reference(run.source, task, held)

    def evaluate(name: str, graph: Path, precision: str) -> validate.Accuracy:
        folder = work / "candidates" / name
        package.stage(
            folder, graph=graph, tokenizer=tokenizer, fields=run.fields(precision, {}, tokens)
        )
        model = validate.load_candidate(folder, options.threads)
        accuracy = validate.compare(task, reference, validate.run_model(model, held))
        run.report.variants[name] = {
            "precision": precision,
            "accuracy": accuracy.to_dict(options.max_accuracy_loss),
        }
        return accuracy

    with run.stage("parity"):
        parity = evaluate("onnx-fp32", raw, "fp32")
        if not parity.is_parity():
            raise ParityError(
                f"the fp32 ONNX graph does not reproduce {run.source.name} "
                f"({parity.metric} mean {parity.mean:.6f}, min {parity.min:.6f}); "
                "this is an exporter bug, please report it with the model folder"
            )
    with run.stage("optimize"):
        fused_graph = work / "fused.onnx"
        fused_ops = optimize.optimize(run.source, raw, fused_graph)
        candidates = {"fp32": (fused_graph, evaluate("fp32", fused_graph, "fp32"))}
        run.report.variants["fp32"]["fused_ops"] = fused_ops
    if run.quant.mode != "none":
        with run.stage("quantize"):
            int8_graph = work / "int8.onnx"
            if run.quant.mode == "int8":
                quantize.quantize_dynamic_int8(fused_graph, int8_graph, run.quant)
            else:
                calib_texts = (
                    calibrate.read_text_file(options.calibration)
                    if options.calibration
                    else calibrate.builtin_text("calibration", run.quant.calibration_size)
                )
                run.quant = replace(run.quant, calibration_size=len(calib_texts))
                quantize.quantize_static_int8(
                    fused_graph,
                    int8_graph,
                    run.quant,
                    feeds=_calibration_feeds(work / "candidates" / "fp32", calib_texts),
                    work_dir=work,
                )
            candidates["int8"] = (int8_graph, evaluate("int8", int8_graph, "int8"))
    with run.stage("gate"):
        chosen = _choose(run, candidates, held)
    with run.stage("package"):
        graph, accuracy = candidates[chosen]
        run.report.chosen = chosen
        gate = {
            "metric": accuracy.metric,
            "reference": "pytorch-fp32",
            "eval_data": str(options.eval_data) if options.eval_data else "builtin:bbc-news-held",
            "max_accuracy_loss": options.max_accuracy_loss,
            "fp32": candidates["fp32"][1].to_dict(options.max_accuracy_loss),
            "value": accuracy.to_dict(options.max_accuracy_loss),
        }
        report_bytes = (json.dumps(run.report.to_dict(), indent=2) + "\n").encode()
        package.stage(
            partial,
            graph=graph,
            tokenizer=tokenizer,
            fields=run.fields(chosen, gate, tokens),
            extra_files={"report.json": report_bytes},
        )
        if options.min_ep_coverage is not None:
            placement.gate(
                partial, providers=run.quant.providers, min_coverage=options.min_ep_coverage
            )
        package.commit(partial, Path(options.out), overwrite=options.overwrite)


def _choose(
    run: _Run, candidates: dict[str, tuple[Path, validate.Accuracy]], held: list[str]
) -> str:
    """Pick the variant to ship: the requested one if it passes the gate and is not slower
    than fp32; else, with ``keep_best``, the most accurate one that passes."""
    options = run.options
    wanted = "int8" if "int8" in candidates else "fp32"
    problems: dict[str, str] = {}
    for name, (_, accuracy) in candidates.items():
        if not accuracy.passes(options.max_accuracy_loss):
            problems[name] = (
                f"{name} {accuracy.metric} mean {accuracy.mean:.4f} / min {accuracy.min:.4f} "
                f"misses the gate (max accuracy loss {options.max_accuracy_loss})"
            )
    if "int8" in candidates:
        models = {
            name: validate.load_candidate(run.work / "candidates" / name, options.threads)
            for name in candidates
        }
        # Three short and three long held texts (headline + sentence, whole article).
        latency = validate.median_latency_ms(models, held[:6])
        for name, ms in latency.items():
            run.report.variants[name]["latency_ms_6_texts"] = round(ms, 3)
        speedup = latency["fp32"] / latency["int8"]
        run.report.variants["int8"]["speedup_vs_fp32"] = round(speedup, 3)
        if speedup < 1.0:
            slower = (
                f"int8 is slower than fp32 on this machine ({latency['int8']:.2f} ms vs "
                f"{latency['fp32']:.2f} ms for 6 held texts, medians)"
            )
            if options.force_quantize:
                run.report.warnings.append(f"{slower}; shipped anyway (--force-quantize)")
            else:
                problems.setdefault("int8", f"{slower}; pass --force-quantize to ship it anyway")
    if wanted not in problems:
        return wanted
    passing = [n for n in candidates if n not in problems]
    if options.keep_best and passing:
        best = max(passing, key=lambda n: candidates[n][1].mean)
        run.report.warnings.append(f"{problems[wanted]}; --keep-best kept {best}")
        log.warning("%s; --keep-best kept %s", problems[wanted], best)
        return best
    message = "; ".join(problems.values())
    if wanted == "int8" and "slower" in problems["int8"] and "gate" not in problems["int8"]:
        raise SlowerQuantizationError(message)
    raise AccuracyGateError(
        message
        + (
            ""
            if options.keep_best
            else "; pass --keep-best to ship the most accurate variant that passes"
        )
    )


def _calibration_feeds(fp32_package: Path, texts: list[str]) -> list[dict[str, Any]]:
    """Tokenize calibration texts one per run (unpadded), with the package's own tokenizer."""
    import numpy as np

    from edgeinfer.runtime.tokenizer import TextTokenizer

    manifest = json.loads((fp32_package / "manifest.json").read_text())
    tok = TextTokenizer(
        fp32_package / package.TOKENIZER_NAME,
        max_seq_len=int(manifest["io"]["max_seq_len"]),
        pad_id=int(manifest["tokens"]["pad"]),
        dtype=np.dtype(np.int64),
    )
    names = {spec["name"] for spec in manifest["io"]["inputs"]}
    feeds = []
    for text in texts:
        ids, mask = tok.encode([text])
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feeds.append({k: v for k, v in feed.items() if k in names})
    return feeds
