"""Image classifiers from PyTorch: a recipe's network (a factory and its state dict), or a
Hugging Face image-classification folder (ViT, ConvNeXt, MobileNet, ...: config.json, weights,
preprocessor_config.json).

PyTorch -> fp32 ONNX (parity-checked) -> onnxruntime's pre-processing -> int8 (static QDQ,
calibrated on images; or dynamic) or fp16 -> top-1 agreement with PyTorch fp32 on the built-in
image views (``data/photos.py``), resized as the package's ``ImageSpec`` says. See docs/vision.md
and docs/targets.md.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError, MissingDependencyError, ParityError
from edgeinfer.export import package
from edgeinfer.export.builder import GraphBuilder
from edgeinfer.export.context import Candidate
from edgeinfer.export.data.photos import builtin_images, read_images, split_images
from edgeinfer.export.gates.probabilities import DECIDED_MARGIN, top1_agreement
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.labels import default_labels, read_labels
from edgeinfer.export.passes import ort_compat, quantize
from edgeinfer.export.passes.sensitivity import Tuning, run_outputs
from edgeinfer.export.passes.validate import load_candidate, run_model
from edgeinfer.export.vision.preprocessing import spec_from_processor, spec_from_table
from edgeinfer.package_io import ImageClassifierIO, PackageIO
from edgeinfer.runtime import ClassifyModel
from edgeinfer.runtime.model import narrow
from edgeinfer.runtime.tasks import prepare_images

__all__ = ["VisionBuilder"]

# Opset 17: every onnxruntime from 1.15 on runs it, QNN and OpenVINO included.
OPSET = 17
_PROBE_VIEWS = 3


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs: np.ndarray = exp / exp.sum(axis=1, keepdims=True)
    return probs


class VisionBuilder(GraphBuilder):
    """A recipe's PyTorch image classifier into an ``image-classifier`` package."""

    name = "vision"
    tasks = ("classify",)
    cpu_only = False

    def build(self) -> None:
        run, opts = self.run, self.run.options
        source = run.source
        recipe = source.recipe
        if recipe is not None and recipe.vision:
            self.spec: dict[str, Any] = dict(recipe.vision)
            size = int(self.spec["image_size"])
            self.image = spec_from_table(self.spec, height=size, width=size)
        elif recipe is None and source.config:
            self.spec = {}
            processor = source.path / "preprocessor_config.json"
            self.image = spec_from_processor(processor)
        else:
            raise ConfigError(f"{source.name} has no [vision] section in its recipe")
        if run.quant.engine_cache_dir:
            self.extra["engine_cache_dir"] = run.quant.engine_cache_dir
        self.views = (
            read_images(opts.eval_data, size=self.image)
            if opts.eval_data
            else builtin_images("gate", opts.held_count, size=self.image)
        )
        with run.stage("convert"):
            model = self._torch_model()
            raw = run.work / "raw.onnx"
            self._to_onnx(model, raw)
        with run.stage("reference"):
            self.reference = self._torch_probabilities(model, self.views)
        with run.stage("parity"):
            accuracy, all_views = self._evaluate(self.candidate("onnx-fp32", raw, "fp32"))
            if not accuracy.is_parity() or all_views < 1.0:
                raise ParityError(
                    f"the fp32 ONNX graph does not reproduce {run.source.name} (top-1 agreement "
                    f"{all_views:.4f}, max probability difference "
                    f"{accuracy.scores[0].details['max_prob_diff']}); "
                    "this is an exporter bug, please report it"
                )
        with run.stage("optimize"):
            fp32_graph = run.work / "fp32.onnx"
            ort_compat.preprocess(raw, fp32_graph)
            if run.quant.fixed_batch is not None:
                ort_compat.fix_batch(fp32_graph, fp32_graph, batch=run.quant.fixed_batch)
            quantized = run.quant.mode != "none"
            fp32 = self.candidate("fp32", fp32_graph, "fp32", requested=not quantized)
            self._measure(run.add(fp32))
        if quantized:
            with run.stage("quantize"):
                self._measure(run.add(self._quantized(fp32_graph)))

    def _torch_model(self) -> Any:
        """The network in eval mode: a Hugging Face folder's, or the recipe's factory with its
        state dict loaded (weights_only, strict)."""
        if not self.spec:
            return _hf_logits(self.run.source.path)
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
        state = torch.load(weights, weights_only=True, map_location="cpu")
        model.load_state_dict(state, strict=True)
        return model.eval()

    def _to_onnx(self, model: Any, out: Path) -> None:
        import torch

        with warnings.catch_warnings():  # the tracer's constant-folding notes
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (torch.zeros(1, 3, self.image.height, self.image.width),),
                str(out),
                input_names=["pixel_values"],
                output_names=["logits"],
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,
            )

    def _pixels(self, views: np.ndarray) -> np.ndarray:
        """uint8 [N, H, W, 3] -> the graph's pixel_values [N, 3, H, W], as the runtime makes."""
        return prepare_images(views, image=self.image)

    def _torch_probabilities(self, model: Any, views: np.ndarray) -> np.ndarray:
        import torch

        pixels = torch.from_numpy(self._pixels(views))
        with torch.no_grad():
            logits = [model(pixels[i : i + 16]).numpy() for i in range(0, len(pixels), 16)]
        return _softmax(np.concatenate(logits))  # [N, C]

    def _quantized(self, fp32_graph: Path) -> Candidate:
        run = self.run
        quant = run.quant
        name = "fp16" if quant.mode == "fp16" else "int8"
        graph = run.work / f"{name}.onnx"
        info: dict[str, Any] = {"mode": quant.mode}
        if quant.mode == "fp16":
            quantize.convert_fp16(fp32_graph, graph)
        elif quant.mode == "int8":
            quantize.quantize_dynamic_cnn(fp32_graph, graph, quant)
        else:
            calib, tune = self._calibration_and_tune()
            quant = run.calibrated(len(calib))
            feeds = [{"pixel_values": self._pixels(view[None])} for view in calib]
            tuning = self._tuning(fp32_graph, tune) if quant.float_nodes == "sensitivity" else None
            result = quantize.quantize_static_cnn(
                fp32_graph, graph, quant, feeds=feeds, tuning=tuning, threads=run.threads
            )
            info.update(quantize.static_info(quant, result))
            if result.sensitivity is not None:
                run.note(name, sensitivity=result.sensitivity)
        if name == "int8":
            info.update(per_channel=quant.per_channel, reduce_range=quant.reduce_range)
        if quant.fixed_batch is not None:
            info["fixed_batch"] = quant.fixed_batch
        return self.candidate(name, graph, name, requested=True, quantization=info)

    def _calibration_and_tune(self) -> tuple[np.ndarray, np.ndarray]:
        """The calibration images and the tune images that choose the nodes kept in float:
        the built-in splits, or a user's calibration images with their last quarter held."""
        opts, quant = self.run.options, self.run.quant
        if opts.calibration and str(opts.calibration) != "builtin":
            images = read_images(opts.calibration, size=self.image)
            if quant.float_nodes != "sensitivity":
                return images, images[:0]
            return split_images(images)
        calib = builtin_images("calibration", quant.calibration_size, size=self.image)
        if quant.float_nodes != "sensitivity":
            return calib, calib[:0]
        return calib, builtin_images("tune", self.run.options.held_count, size=self.image)

    def _tuning(self, fp32_graph: Path, views: np.ndarray) -> Tuning:
        """The tune images judged as the gate judges: top-1 agreement with fp32 on the
        decided ones, to reach halfway from the gate's bar to 1; nodes ranked by KL."""
        batch = self.run.quant.fixed_batch or 16
        feeds = [
            {"pixel_values": self._pixels(views[i : i + batch])}
            for i in range(0, len(views), batch)
        ]
        fp32 = _softmax(np.concatenate(run_outputs(fp32_graph, feeds, threads=self.run.threads)))
        bar = 1.0 - self.run.max_accuracy_loss

        def kl(outputs: list[np.ndarray]) -> float:
            probs = _softmax(np.concatenate(outputs))
            return float(np.mean(np.sum(fp32 * (np.log(fp32 + 1e-12) - np.log(probs + 1e-12)), 1)))

        def score(outputs: list[np.ndarray]) -> float:
            return top1_agreement(fp32, _softmax(np.concatenate(outputs)))[0].mean

        return Tuning(feeds=feeds, loss=kl, score=score, target=bar + (1.0 - bar) / 2)

    def graph_io(self, graph: Path) -> PackageIO:
        inputs, outputs = package.read_io(graph)
        return ImageClassifierIO(
            graph=package.GRAPH_NAME,
            inputs=inputs,
            outputs=outputs,
            labels=self._labels(int(outputs[0].shape[-1])),
            image=self.image,
        )

    def _labels(self, count: int) -> tuple[str, ...]:
        """The recipe's labels file, else the config's id2label, else LABEL_i."""
        recipe = self.run.source.recipe
        if recipe is not None and self.spec.get("labels"):
            return read_labels(recipe.resource(self.spec["labels"]), count=count)
        return default_labels(self.run.source.config, count)

    def _evaluate(self, candidate: Candidate) -> tuple[Verdict, float]:
        with load_candidate(self.run.stage_candidate(candidate), self.run.threads) as model:
            return top1_agreement(self.reference, run_model(model, self.views))

    def _measure(self, candidate: Candidate) -> None:
        accuracy, all_views = self._evaluate(candidate)
        summary = (
            f"{candidate.name} top-1 agreement with PyTorch fp32 {accuracy.mean:.4f} on "
            f"{accuracy.count} decided views ({all_views:.4f} on all {len(self.views)})"
        )
        self.run.measured(
            candidate, accuracy, summary, all_views=round(all_views, 6), views=len(self.views)
        )

    def probe(self, candidate: Candidate) -> Callable[[], object] | None:
        if not self.run.options.target.startswith("cpu-"):
            return None  # an accelerator's speed is not this machine's
        model = load_candidate(self.run.stage_candidate(candidate), self.run.threads)
        views, classifier = self.views[:_PROBE_VIEWS], narrow(model, ClassifyModel)
        return lambda: [classifier.classify(view[None]) for view in views]

    def slower_hint(self, candidate: Candidate) -> str:
        return "; try --quantize int8-static" if self.run.quant.mode == "int8" else ""

    def accuracy(self, chosen: Candidate) -> dict[str, Any]:
        opts, variants = self.run.options, self.run.report.variants
        return {
            "metric": "top1_agreement",
            "reference": "pytorch-fp32",
            "eval_data": str(opts.eval_data) if opts.eval_data else "builtin:photo-views",
            "decided_margin": DECIDED_MARGIN,
            "max_accuracy_loss": self.run.max_accuracy_loss,
            "fp32": variants["fp32"]["accuracy"],
            "value": variants[chosen.name]["accuracy"],
        }

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.views[:8])


def _hf_logits(folder: Path) -> Any:
    """A Hugging Face image classifier as a module that returns its logits (for the tracer)."""
    import torch
    from transformers import AutoModelForImageClassification

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = AutoModelForImageClassification.from_pretrained(str(folder))

        def forward(self, pixel_values: Any) -> Any:
            return self.model(pixel_values=pixel_values).logits

    return Logits().eval()
