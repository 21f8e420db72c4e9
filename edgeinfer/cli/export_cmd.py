"""``edgeinfer export SRC -o OUT``: build a model package on a workstation."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from edgeinfer.cli.common import aliased, console, deprecated, print_json
from edgeinfer.errors import ConfigError

if TYPE_CHECKING:
    from edgeinfer.export.options import ShrinkOptions

__all__ = ["export", "pareto_table"]


class TaskChoice(str, Enum):
    auto = "auto"
    embed = "embed"
    classify = "classify"
    generate = "generate"
    raw = "raw"
    detect = "detect"
    segment = "segment"


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
        str | None,
        typer.Argument(
            help="a builtin (see --list), a local Hugging Face model folder, a GGUF folder, "
            "or an ONNX file (or a folder holding one; docs/onnx.md)"
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="package folder to write")] = None,
    list_builtins: Annotated[
        bool, typer.Option("--list", help="list the builtin models (models/) and exit")
    ] = False,
    task: Annotated[TaskChoice, typer.Option(help="what the package does")] = TaskChoice.auto,
    target: Annotated[
        str,
        typer.Option(
            help="hardware preset: cpu-avx2, cpu-vnni, cpu-arm64, npu-qnn, npu-openvino, "
            "gpu-cuda, gpu-tensorrt (docs/targets.md)"
        ),
    ] = "cpu-avx2",
    quantize: Annotated[
        QuantChoice | None,
        typer.Option(help="precision (default: the recipe's, else the target's)"),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="calibration data: text (.txt lines, .jsonl with 'text'); images (a folder, "
            "an image, a .npy uint8 [N,H,W,3]) or 'builtin'; tensors for raw ONNX graphs "
            "(.npz, .npy or a folder of them)"
        ),
    ] = None,
    calibration_method: Annotated[
        CalibrationChoice | None,
        typer.Option(help="int8-static activation ranges (default: the target's)"),
    ] = None,
    eval_data: Annotated[
        Path | None,
        typer.Option(
            help="held data for the accuracy gate, in the calibration forms (default: a held "
            "part of --calibration, else built-in)"
        ),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(help="ONNX classifiers: class names, one per line, in output order"),
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            help="raw ONNX graphs: a state INPUT=OUTPUT pair carried between calls "
            "(repeatable; default: found by name)"
        ),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            help="raw ONNX graphs: the gate's metric of an output, OUTPUT=METRIC (detections, "
            "sequence[:BLANK], probabilities, embedding, state, tensor, exact; repeatable; "
            "default: chosen from the outputs)"
        ),
    ] = None,
    preprocess: Annotated[
        list[str] | None,
        typer.Option(
            help="ONNX image graphs: preprocessing KEY=VALUE (color, mean, std, resize, "
            "shorter_side, interpolation, pad, fill, size=WxH; repeatable; docs/onnx.md)"
        ),
    ] = None,
    nms: Annotated[
        list[str] | None,
        typer.Option(
            help="ONNX detectors: non-maximum suppression KEY=VALUE (score, iou, max, agnostic; "
            "repeatable; default ultralytics': 0.25, 0.45, 300, class-aware)"
        ),
    ] = None,
    max_accuracy_loss: Annotated[
        float | None,
        typer.Option(help="allowed loss vs PyTorch fp32 (default: the recipe's, else 0.01)"),
    ] = None,
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
    exit_every: Annotated[
        int | None, typer.Option(help="early exit: a head every K layers (default: recipe's, 2)")
    ] = None,
    train_data: Annotated[
        str | None,
        typer.Option(
            help="early exit: labelled data for the heads (bbc-news, mnist); students: "
            "unlabeled text (.txt lines, .jsonl 'text'; default: built-in BBC News)"
        ),
    ] = None,
    distill_layers: Annotated[
        str | None,
        typer.Option(help="students with N layers distilled from the model (e.g. 4, or 3,4)"),
    ] = None,
    prune_heads: Annotated[
        float, typer.Option(help="students: remove this share of every layer's heads")
    ] = 0.0,
    prune_ffn: Annotated[
        float, typer.Option(help="students: remove this share of every layer's FFN neurons")
    ] = 0.0,
    distill_epochs: Annotated[
        int | None, typer.Option(help="students: training passes over the text (default 3)")
    ] = None,
    variants: Annotated[
        str | None,
        typer.Option(help="generate: comma-separated quantized variants to try (default: all)"),
    ] = None,
    kv_dtype: Annotated[
        str | None,
        typer.Option(help="generate: KV cache float32 (default) or float16 (half the memory)"),
    ] = None,
    min_ep_coverage: Annotated[
        float | None,
        typer.Option(help="fail (exit 1) if the target's first provider takes less of the FLOPs"),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    image: Annotated[
        list[str] | None, deprecated("--image", instead="--preprocess KEY=VALUE")
    ] = None,
) -> None:
    """Convert, optimize, quantize and accuracy-check a model into a package."""
    if list_builtins:
        _list(json_output)
        return
    if source is None or out is None:
        raise ConfigError("pass SOURCE and --out OUT (or --list to see the builtins)")
    from edgeinfer.errors import ExportError
    from edgeinfer.export.options import (
        BuilderOptions,
        DecoderOptions,
        EarlyExitOptions,
        ExportOptions,
        OnnxFileOptions,
    )
    from edgeinfer.export.run import export as run_export

    builder: BuilderOptions | None = None
    shrinking = distill_layers is not None or bool(prune_heads) or bool(prune_ffn)
    if early_exit and shrinking:
        raise ConfigError("--early-exit and --distill-layers / --prune-* are separate exports")
    if early_exit:
        builder = EarlyExitOptions(exit_every=exit_every, train_data=train_data)
    elif shrinking:
        builder = _shrink_options(
            distill_layers, prune_heads, prune_ffn, train_data, distill_epochs
        )
    elif exit_every is not None or train_data is not None or distill_epochs is not None:
        raise ConfigError(
            "--exit-every goes with --early-exit, --distill-epochs with --distill-layers or "
            "--prune-*, --train-data with either"
        )
    elif variants or kv_dtype:
        names = tuple(v.strip() for v in variants.split(",") if v) if variants else None
        builder = DecoderOptions(variants=names, kv_dtype=kv_dtype or "float32")
    # --image names a picture file in classify, detect, segment and profile.
    preprocess = aliased(preprocess, image, default=None, names="--preprocess / --image")
    if labels is not None or state or metric or preprocess or nms:
        if builder is not None:
            raise ConfigError(
                "--labels, --state, --metric, --preprocess and --nms export ONNX files: drop "
                "--early-exit, --variants and --distill-layers"
            )
        builder = OnnxFileOptions(
            labels=labels,
            state=tuple(state or ()),
            metrics=tuple(metric or ()),
            image=tuple(preprocess or ()),
            nms=tuple(nms or ()),
        )
    options = ExportOptions(
        source=source,
        out=out,
        task=task.value,
        target=target,
        quantize=quantize.value if quantize else None,
        calibration=calibration,
        calibration_method=calibration_method.value if calibration_method else None,
        eval_data=eval_data,
        max_accuracy_loss=max_accuracy_loss,
        keep_best=keep_best,
        force_quantize=force_quantize,
        overwrite=overwrite,
        threads=threads,
        min_ep_coverage=min_ep_coverage,
        builder=builder,
    )

    def progress(stage: str, seconds: float) -> None:
        console.print(f"[green]✓[/] {stage:<12} {seconds:6.1f} s")

    try:
        with console.status(f"exporting {source} …"):
            report = run_export(options, progress=progress)
    except ExportError as exc:
        if json_output and exc.report:
            print_json(exc.report)  # what was measured before it failed
        elif exc.report and exc.report.get("pareto"):  # every candidate, passing or not
            console.print(pareto_table(exc.report["pareto"]), soft_wrap=True)
        raise
    if json_output:
        print_json(report.to_dict())
        return
    chosen = report.variants[report.chosen or "fp32"]
    speed = chosen.get("speed", {})
    console.print(f"wrote [bold]{out}[/]: {chosen['accuracy']['summary']}" + _speed(speed))
    if report.pareto:
        console.print(pareto_table(report.pareto), soft_wrap=True)
    for warning in report.warnings:
        console.print(f"[yellow]warning[/]: {warning}")


def _speed(speed: dict[str, Any]) -> str:
    """The speed guard's ratio with its interval, for the closing line ('' when not timed)."""
    if not speed:
        return ""
    low, high = speed["interval"]
    return (
        f", {speed['speedup_vs_fp32']:.2f}x fp32 speed (99 % interval {low:.2f}-{high:.2f}, "
        f"{speed['pairs']} paired runs)"
    )


def _shrink_options(
    layers: str | None, heads: float, ffn: float, train_data: str | None, epochs: int | None
) -> ShrinkOptions:
    from edgeinfer.export.options import ShrinkOptions

    try:
        depths = tuple(int(n) for n in layers.split(",") if n.strip()) if layers else ()
    except ValueError as exc:
        raise ConfigError(
            f"--distill-layers takes layer counts like 4 or 3,4, not {layers!r}"
        ) from exc
    return ShrinkOptions(
        layers=depths,
        prune_heads=heads,
        prune_ffn=ffn,
        train_data=Path(train_data) if train_data else None,
        **({"epochs": epochs} if epochs is not None else {}),
    )


def pareto_table(rows: list[dict[str, Any]]) -> Table:
    """The export's candidates, fastest first: accuracy against batch-1 latency."""
    table = Table(
        title="candidates (accuracy vs the fp32 source on held text, the worse of in-domain and "
        "off-domain with students; batch-1 latency)"
    )
    columns = (
        "candidate",
        "layers",
        "heads",
        "ffn",
        "MB",
        "accuracy",
        "min",
        "in-domain",
        "off-domain",
        "gate",
        "short ms",
        "long ms",
        "vs fp32",
        "front",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for r in rows:
        table.add_row(
            r["name"],
            str(r["layers"]),
            str(r["heads"]),
            str(r["ffn"]),
            f"{r['graph_mb']:.1f}",
            f"{r['accuracy']:.4f}",
            f"{r['accuracy_min']:.4f}" if r["accuracy_min"] is not None else "—",
            _mean_min(r.get("in_domain")),
            _mean_min(r.get("off_domain")),
            "pass" if r["passed"] else "fail",
            f"{r['short_ms']:.2f}",
            f"{r['long_ms']:.2f}",
            f"{r['speedup_vs_fp32']:.2f}x",
            "●" if r["pareto_front"] else "",
        )
    return table


def _mean_min(text: dict[str, float] | None) -> str:
    """``mean / min`` of one of the gate's texts (exports with students), else a dash."""
    return "—" if text is None else f"{text['mean']:.4f} / {text['min']:.4f}"


def _list(json_output: bool) -> None:
    from edgeinfer.export.recipes import all_recipes

    recipes = all_recipes()
    if json_output:
        print_json(
            [
                {
                    "name": r.name,
                    "task": r.task,
                    "builder": r.builder,
                    "title": r.title,
                    "packages": list(r.packages),
                    "default": r.default,
                    **r.provenance,
                }
                for r in recipes
            ]
        )
        return
    table = Table(title="builtin models (models/)")
    for column in ("name", "task", "builder", "what", "licence"):
        table.add_column(column)
    for r in recipes:
        name = f"{r.name} (default)" if r.default else r.name
        table.add_row(name, r.task, r.builder, r.title, r.provenance.get("licence", ""))
    console.print(table)
