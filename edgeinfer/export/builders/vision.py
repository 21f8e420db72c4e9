"""Image classifiers from PyTorch: the recipe names the network (a factory and its state dict).

PyTorch -> fp32 ONNX (parity-checked) -> onnxruntime's pre-processing -> int8 (static QDQ,
calibrated on images; or dynamic) or fp16 -> top-1 agreement with PyTorch fp32 on the built-in
image views (``images.py``). See docs/vision.md and docs/targets.md.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError, MissingDependencyError, ParityError
from edgeinfer.export import images, ort_compat, package, quantize
from edgeinfer.export.builders.base import Builder
from edgeinfer.export.context import Candidate, Quality
from edgeinfer.export.validate import Accuracy, load_candidate
from edgeinfer.package_io import ImageClassifierIO, ImageSpec
from edgeinfer.runtime import Model

__all__ = ["VisionBuilder"]

# Opset 17: every onnxruntime from 1.15 on runs it, QNN and OpenVINO included.
OPSET = 17
# The gate counts views where fp32's top-1 probability leads the runner-up by >= 0.1: on a
# near-tie any rounding flips the answer, and agreement there measures noise, not the model.
DECIDED_MARGIN = 0.1
_PROBE_VIEWS = 3


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs: np.ndarray = exp / exp.sum(axis=1, keepdims=True)
    return probs


def _probabilities(model: Model, views: np.ndarray) -> np.ndarray:
    """The runtime's class probabilities [N, C] for uint8 views, in label order."""
    labels = list(model.manifest.io_as(ImageClassifierIO).labels)
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


class VisionBuilder(Builder):
    """A recipe's PyTorch image classifier into an ``image-classifier`` package."""

    name = "vision"
    tasks = ("classify",)
    cpu_only = False

    def build(self) -> None:
        run, opts = self.run, self.run.options
        recipe = run.source.recipe
        if recipe is None or not recipe.vision:
            raise ConfigError(f"{run.source.name} has no [vision] section in its recipe")
        self.spec = recipe.vision
        size = int(self.spec["image_size"])
        self.image = ImageSpec(
            height=size,
            width=size,
            mean=tuple(float(v) for v in self.spec["mean"]),
            std=tuple(float(v) for v in self.spec["std"]),
        )
        self.views = (
            images.read_images(opts.eval_data, size=size)
            if opts.eval_data
            else images.builtin_images("gate", opts.held_count, size=size)
        )
        with run.stage("convert"):
            model = self._torch_model()
            raw = run.work / "raw.onnx"
            self._to_onnx(model, raw, size)
        with run.stage("reference"):
            self.reference = self._torch_probabilities(model, self.views)
        with run.stage("parity"):
            accuracy, all_views = self._evaluate(self._candidate("onnx-fp32", raw, "fp32"))
            if not accuracy.is_parity() or all_views < 1.0:
                raise ParityError(
                    f"the fp32 ONNX graph does not reproduce {run.source.name} (top-1 agreement "
                    f"{all_views:.4f}, max probability difference {accuracy.max_prob_diff}); "
                    "this is an exporter bug, please report it"
                )
        with run.stage("optimize"):
            fp32_graph = run.work / "fp32.onnx"
            ort_compat.preprocess(raw, fp32_graph)
            if run.quant.fixed_batch is not None:
                ort_compat.fix_batch(fp32_graph, fp32_graph, batch=run.quant.fixed_batch)
            quantized = run.quant.mode != "none"
            self._measure(run.add(self._candidate("fp32", fp32_graph, "fp32", not quantized)))
        if quantized:
            with run.stage("quantize"):
                self._measure(run.add(self._quantized(fp32_graph, size)))

    def _torch_model(self) -> Any:
        """The recipe's network in eval mode, its state dict loaded (weights_only, strict)."""
        try:
            import torch

            module, _, attribute = str(self.spec["factory"]).partition(":")
            factory: Any = importlib.import_module(module)
        except ImportError as exc:
            recipe = self.run.source.recipe
            hint = recipe.install_hint() if recipe else "install the network's package"
            raise MissingDependencyError(str(self.spec["factory"]), install=hint) from exc
        for part in attribute.split("."):
            factory = getattr(factory, part)
        model = factory(*self.spec.get("args", []))
        weights = self.run.source.path / str(self.spec["weights"])
        model.load_state_dict(torch.load(weights, weights_only=True, map_location="cpu"))
        return model.eval()

    def _to_onnx(self, model: Any, out: Path, size: int) -> None:
        import torch

        with warnings.catch_warnings():  # the tracer's constant-folding notes
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (torch.zeros(1, 3, size, size),),
                str(out),
                input_names=["pixel_values"],
                output_names=["logits"],
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,
            )

    def _pixels(self, views: np.ndarray) -> np.ndarray:
        """uint8 [N, H, W, 3] -> normalized float32 [N, 3, H, W] (the graph's pixel_values)."""
        mean = np.asarray(self.image.mean, np.float32)
        std = np.asarray(self.image.std, np.float32)
        pixels = (views.astype(np.float32) - mean) / std
        return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))

    def _torch_probabilities(self, model: Any, views: np.ndarray) -> np.ndarray:
        import torch

        pixels = torch.from_numpy(self._pixels(views))
        with torch.no_grad():
            logits = [model(pixels[i : i + 16]).numpy() for i in range(0, len(pixels), 16)]
        return _softmax(np.concatenate(logits))  # [N, C]

    def _quantized(self, fp32_graph: Path, size: int) -> Candidate:
        run = self.run
        quant, opts = run.quant, run.options
        name = "fp16" if quant.mode == "fp16" else "int8"
        graph = run.work / f"{name}.onnx"
        info: dict[str, Any] = {"mode": quant.mode}
        if quant.mode == "fp16":
            quantize.convert_fp16(fp32_graph, graph)
        elif quant.mode == "int8":
            quantize.quantize_dynamic_cnn(fp32_graph, graph, quant)
        else:
            calib = (
                images.read_images(opts.calibration, size=size)
                if opts.calibration and str(opts.calibration) != "builtin"
                else images.builtin_images("calibration", quant.calibration_size, size=size)
            )
            run.quant = quant = replace(quant, calibration_size=len(calib))
            feeds = [{"pixel_values": self._pixels(view[None])} for view in calib]
            kept = quantize.quantize_static_cnn(fp32_graph, graph, quant, feeds=feeds)
            info.update(
                format="QDQ",
                rules=quant.qdq_rules,
                activation_type=quant.activation_type,
                weight_type=quant.weight_type,
                calibration_method=quant.calibration_method,
                calibration_size=quant.calibration_size,
                kept_fp32=kept,
            )
        if name == "int8":
            info.update(per_channel=quant.per_channel, reduce_range=quant.reduce_range)
        if quant.fixed_batch is not None:
            info["fixed_batch"] = quant.fixed_batch
        return self._candidate(name, graph, name, True, info)

    def _candidate(
        self,
        name: str,
        graph: Path,
        precision: str,
        requested: bool = False,
        quantization: dict[str, Any] | None = None,
    ) -> Candidate:
        inputs, outputs = package.read_io(graph)
        extra = {}
        if self.run.quant.engine_cache_dir:
            extra["engine_cache_dir"] = self.run.quant.engine_cache_dir
        return Candidate(
            name=name,
            precision=precision,
            files={package.GRAPH_NAME: graph},
            io=ImageClassifierIO(
                graph=package.GRAPH_NAME,
                inputs=inputs,
                outputs=outputs,
                # ImageNet-1k class indices: the weight package ships no class names.
                labels=tuple(str(i) for i in range(int(outputs[0].shape[-1]))),
                image=self.image,
            ),
            quantization=quantization or {"mode": "none"},
            extra=extra,
            requested=requested,
        )

    def _evaluate(self, candidate: Candidate) -> tuple[Accuracy, float]:
        with load_candidate(self.run.stage_candidate(candidate), self.run.threads) as model:
            return _agreement(self.reference, _probabilities(model, self.views))

    def _measure(self, candidate: Candidate) -> None:
        accuracy, all_views = self._evaluate(candidate)
        loss = self.run.max_accuracy_loss
        self.run.measured(
            candidate,
            Quality(
                metric="top1_agreement",
                passed=accuracy.passes(loss),
                score=accuracy.mean,
                summary=(
                    f"{candidate.name} top-1 agreement with PyTorch fp32 {accuracy.mean:.4f} on "
                    f"{accuracy.count} decided views ({all_views:.4f} on all "
                    f"{len(self.views)})"
                ),
                details={
                    **accuracy.to_dict(loss),
                    "all_views": round(all_views, 6),
                    "views": len(self.views),
                },
            ),
        )

    def probe(self, candidate: Candidate) -> Callable[[], object] | None:
        if not self.run.options.target.startswith("cpu-"):
            return None  # an accelerator's speed is not this machine's
        model = load_candidate(self.run.stage_candidate(candidate), self.run.threads)
        views = self.views[:_PROBE_VIEWS]
        return lambda: [model.classify(view[None]) for view in views]

    def slower_hint(self, candidate: Candidate) -> str:
        return "; try --quantize int8-static" if self.run.quant.mode == "int8" else ""

    def accuracy(self, chosen: Candidate) -> dict[str, Any]:
        opts, variants = self.run.options, self.run.report.variants
        return {
            "metric": "top1_agreement",
            "reference": "pytorch-fp32",
            "eval_data": str(opts.eval_data) if opts.eval_data else "builtin:sklearn-sample-views",
            "decided_margin": DECIDED_MARGIN,
            "max_accuracy_loss": self.run.max_accuracy_loss,
            "fp32": variants["fp32"]["accuracy"],
            "value": variants[chosen.name]["accuracy"],
        }

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.views[:8])
