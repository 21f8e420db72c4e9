"""``edgeinfer export SRC -o OUT``: build a model package on a workstation."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import console, print_json

__all__ = ["export"]


class TaskChoice(str, Enum):
    auto = "auto"
    embed = "embed"
    classify = "classify"
    generate = "generate"


class QuantChoice(str, Enum):
    none = "none"
    int8 = "int8"
    int8_static = "int8-static"
    fp16 = "fp16"


class CalibrationChoice(str, Enum):
    minmax = "minmax"
    entropy = "entropy"
    percentile = "percentile"


def export(
    source: Annotated[
        str,
        typer.Argument(help="builtin (minilm, efficientnet-lite0, ...) or a local HF model folder"),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="package folder to write")],
    task: Annotated[TaskChoice, typer.Option(help="what the package does")] = TaskChoice.auto,
    target: Annotated[
        str,
        typer.Option(
            help="hardware preset: cpu-avx2, cpu-vnni, cpu-arm64, npu-qnn, npu-openvino, "
            "gpu-cuda, gpu-tensorrt (docs/targets.md)"
        ),
    ] = "cpu-avx2",
    quantize: Annotated[
        QuantChoice | None, typer.Option(help="precision (default: the target's)")
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="calibration data: text (.txt lines, .jsonl with 'text'); images (a folder, "
            "an image, a .npy uint8 [N,H,W,3]) or 'builtin'"
        ),
    ] = None,
    calibration_method: Annotated[
        CalibrationChoice | None,
        typer.Option(help="int8-static activation ranges (default: the target's)"),
    ] = None,
    eval_data: Annotated[
        Path | None, typer.Option(help="held text for the accuracy gate (default: built-in)")
    ] = None,
    max_accuracy_loss: Annotated[
        float, typer.Option(help="allowed loss vs PyTorch fp32 (0.01: mean cosine >= 0.99)")
    ] = 0.01,
    keep_best: Annotated[
        bool, typer.Option(help="if the requested variant fails, ship the best one that passes")
    ] = False,
    force_quantize: Annotated[
        bool, typer.Option(help="ship int8 even when it measures slower than fp32")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="replace an existing package at OUT")] = False,
    threads: Annotated[int | None, typer.Option(help="threads for the latency check")] = None,
    early_exit: Annotated[
        bool, typer.Option(help="classify: exit heads + segments (docs/early_exit.md)")
    ] = False,
    exit_every: Annotated[int, typer.Option(help="early exit: a head every K layers")] = 2,
    train_data: Annotated[
        str | None, typer.Option(help="early exit: labelled data for the heads (bbc)")
    ] = None,
    min_ep_coverage: Annotated[
        float | None,
        typer.Option(help="fail (exit 1) if the target's first provider takes less of the FLOPs"),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Convert, optimize, quantize and accuracy-check a model into a package."""
    from edgeinfer.config import QuantConfig
    from edgeinfer.errors import ExportError
    from edgeinfer.export.pipeline import ExportOptions
    from edgeinfer.export.pipeline import export as run_export

    options = ExportOptions(
        source=source,
        out=out,
        task=task.value,
        target=target,
        quantize=quantize.value if quantize else QuantConfig.for_target(target).mode,
        calibration=calibration,
        calibration_method=calibration_method.value if calibration_method else None,
        eval_data=eval_data,
        max_accuracy_loss=max_accuracy_loss,
        keep_best=keep_best,
        force_quantize=force_quantize,
        overwrite=overwrite,
        threads=threads,
        early_exit=early_exit,
        exit_every=exit_every,
        train_data=train_data,
        min_ep_coverage=min_ep_coverage,
    )

    def progress(stage: str, seconds: float) -> None:
        console.print(f"[green]✓[/] {stage:<10} {seconds:6.1f} s")

    try:
        with console.status(f"exporting {source} …"):
            report = run_export(options, progress=progress)
    except ExportError as exc:
        if json_output and getattr(exc, "report", None):
            print_json(exc.report)  # type: ignore[attr-defined]  # what was measured before it failed
        raise
    if json_output:
        print_json(report.to_dict())
        return
    if early_exit:
        console.print(f"wrote [bold]{out}[/]: {report.chosen} segments with exit heads")
        return
    chosen = report.variants[report.chosen or "fp32"]
    acc = chosen["accuracy"]
    speed = chosen.get("speedup_vs_fp32")
    console.print(
        f"wrote [bold]{out}[/]: {report.chosen}, {acc['metric']} mean {acc['mean']:.4f} "
        f"min {acc['min']:.4f} vs PyTorch fp32" + (f", {speed:.2f}x fp32 speed" if speed else "")
    )
    for warning in report.warnings:
        console.print(f"[yellow]warning[/]: {warning}")
