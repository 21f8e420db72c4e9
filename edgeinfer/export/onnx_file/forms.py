"""What the ``onnx-file`` builder does differently for each form of graph: images in
(``image-classifier``), token ids in (``text-classifier``/``text-encoder``), anything else
(``raw``, state carried per stream: ``raw.py``).

A form knows its package io, its held and calibration data (never the same samples: the
user's eval data, else a held part of their calibration data, else the built-in held set),
how to run a candidate on the held data through the runtime, and the gate's metric.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.context import ExportContext
from edgeinfer.export.data.captchas import captcha_views
from edgeinfer.export.data.photos import ImageSplit, builtin_images, read_images, split_images
from edgeinfer.export.data.text import builtin_text, read_text_file, split_texts, text_feeds
from edgeinfer.export.gates.probabilities import top1_agreement
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.labels import default_labels, read_labels
from edgeinfer.export.onnx_file.user_graph import ends_in_softmax
from edgeinfer.export.options import OnnxFileOptions
from edgeinfer.export.passes import convert
from edgeinfer.export.passes.validate import compare, run_model
from edgeinfer.export.vision.preprocessing import spec_from_processor, spec_from_table
from edgeinfer.package_io import (
    ImageClassifierIO,
    ImageSpec,
    PackageIO,
    Scores,
    TensorSpec,
    TextClassifierIO,
    TextEncoderIO,
)
from edgeinfer.runtime import ClassifyModel, Model
from edgeinfer.runtime.model import narrow
from edgeinfer.runtime.tasks import prepare_images

__all__ = ["Form", "ImageForm", "TextForm"]

_PROBE_ITEMS = 3
_BUILTIN = "builtin"


class Form(abc.ABC):
    """A graph's inputs and outputs as one package kind, with its data and its gate."""

    def __init__(
        self, run: ExportContext, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
    ) -> None:
        self.run, self.inputs, self.outputs = run, inputs, outputs
        given = run.options.builder
        self.options = given if isinstance(given, OnnxFileOptions) else OnnxFileOptions()
        self.files: dict[str, Path] = {}
        self.tokens: dict[str, int | None] = {}
        self.eval_name = str(run.options.eval_data or _BUILTIN)

    def _user_calibration(self) -> Path | None:
        given = self.run.options.calibration
        return given if given is not None and str(given) != _BUILTIN else None

    def _labels(self, count: int) -> tuple[str, ...]:
        """--labels, the recipe's list, the folder's labels.txt, its config, else LABEL_i."""
        source, recipe = self.run.source, self.run.source.recipe
        if self.options.labels is not None:
            return read_labels(self.options.labels, count=count)
        if recipe is not None and recipe.onnx.get("labels"):
            return read_labels(recipe.resource(recipe.onnx["labels"]), count=count)
        if (source.path / "labels.txt").is_file():
            return read_labels(source.path / "labels.txt", count=count)
        return default_labels(source.config, count)

    def _image_table(self) -> dict[str, Any]:
        """The recipe's ``[onnx.image]`` settings, ``--preprocess`` over them."""
        recipe = self.run.source.recipe
        table = dict(recipe.onnx.get("image", {})) if recipe else {}
        return table | self.options.image_table()

    def _photos(self, spec: ImageSpec) -> tuple[np.ndarray, np.ndarray]:
        """(held, calibration) photos at ``spec``: --eval-data, else a held part of the
        user's --calibration, else the built-in held views (the recipe's ``[data] views``:
        turned by 0/90/180/270 degrees, or click captchas on the photos); never the same
        samples."""
        opts = self.run.options
        recipe = self.run.source.recipe
        views = str(recipe.data.get("views", "photos")) if recipe else "photos"
        user = self._user_calibration()
        own = read_images(user, size=spec) if user else None
        if opts.eval_data:
            held = read_images(opts.eval_data, size=spec)
        elif own is not None:
            own, held = split_images(own)
            self.eval_name = f"{user} (held part)"
        else:
            held = _builtin_views(views, "gate", opts.held_count, spec)
            self.eval_name = {"photos": "builtin:photo-views",
                              "rotated": "builtin:photo-views-rotated",
                              "click-captchas": "builtin:click-captchas"}[views]  # fmt: skip
        if own is None:
            own = _builtin_views(views, "calibration", self.run.quant.calibration_size, spec)
        return held, own

    @abc.abstractmethod
    def load(self) -> None:
        """Read the held (and calibration) data."""

    def fixed_graph(self, original: Path) -> Path:
        """The graph the export starts from (``load`` ran): the user's own, unless this form
        fixes its input's dims."""
        return original

    @abc.abstractmethod
    def io(self, graph: Path) -> PackageIO:
        """The package io of ``graph`` (the original or a rewritten one)."""

    @abc.abstractmethod
    def evaluate(self, model: Model) -> Any:
        """The candidate's outputs on the held data."""

    @abc.abstractmethod
    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        """The gate's accuracy, the report's extra details, and where it was measured."""

    @abc.abstractmethod
    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        """The inputs of ``graph`` (the fp32 graph, ``staged`` as a package) for static
        calibration, one run each."""

    @abc.abstractmethod
    def probe(self, model: Model) -> Callable[[], object]:
        """One unit of work for the speed guard."""

    @abc.abstractmethod
    def smoke_inputs(self) -> list[Any]:
        """A few held inputs for the package's smoke check."""


def _builtin_views(views: str, split: ImageSplit, count: int, spec: ImageSpec) -> np.ndarray:
    """The built-in pictures of a split: photo views (turned with "rotated") or click
    captchas."""
    if views == "click-captchas":
        return captcha_views(split, count, size=spec)
    if views not in ("photos", "rotated"):
        raise ConfigError(f"[data] views {views!r}: use photos, rotated or click-captchas")
    return builtin_images(split, count, size=spec, rotate=views == "rotated")


def _scores(run: ExportContext) -> Scores:
    """ "probabilities" for a user's graph that ends in a softmax (never softmaxed again);
    read on the original, which every candidate computes (a quantized one ends in Q/DQ)."""
    original = run.source.path / str(run.source.onnx_file)
    return "probabilities" if ends_in_softmax(original) else "logits"


def _classes(outputs: tuple[TensorSpec, ...]) -> int | None:
    dim = outputs[0].shape[-1] if outputs and outputs[0].shape else None
    return dim if isinstance(dim, int) and dim > 0 else None


class ImageForm(Form):
    """One float [N, 3, H, W] input, class logits out: an ``image-classifier`` package."""

    def load(self) -> None:
        self.spec = self._spec()
        self.held, self.calibration = self._photos(self.spec)
        self.labels = self._labels(_classes(self.outputs) or 0)

    def _spec(self) -> ImageSpec:
        source, shape = self.run.source, self.inputs[0].shape
        table = self._image_table()
        processor = source.path / "preprocessor_config.json"
        recipe = source.recipe
        if processor.is_file() and not (recipe and recipe.onnx.get("image")):
            spec = spec_from_processor(processor)
            if not table:
                return spec
            # --preprocess settings over the processor's (its size stays)
            keys = ("mean", "std", "color", "resize", "shorter_side", "interpolation", "pad")
            base = {key: getattr(spec, key) for key in keys}
            return spec_from_table(base | table, height=spec.height, width=spec.width)
        height, width = shape[2], shape[3]
        if not (isinstance(height, int) and isinstance(width, int) and height and width):
            raise ConfigError(
                f"{source.onnx_file} takes images of any size {list(shape)}: put a "
                "preprocessor_config.json (size, image_mean, image_std) beside it"
            )
        if not table:
            self.run.report.warnings.append(
                "no preprocessor_config.json beside the graph: images are normalized with "
                "ImageNet's mean and std (docs/onnx.md says how to set yours)"
            )
        return spec_from_table(table, height=height, width=width)

    def io(self, graph: Path) -> PackageIO:
        inputs, outputs = package.read_io(graph)
        return ImageClassifierIO(
            graph=package.GRAPH_NAME,
            inputs=inputs,
            outputs=outputs,
            labels=self.labels,
            image=self.spec,
            scores=_scores(self.run),
        )

    def evaluate(self, model: Model) -> np.ndarray:
        return run_model(model, self.held)

    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        accuracy, all_views = top1_agreement(reference, candidate)
        where = f"{accuracy.count} decided views ({all_views:.4f} on all {len(self.held)})"
        return accuracy, {"all_views": round(all_views, 6), "views": len(self.held)}, where

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        name = self.inputs[0].name
        return [{name: prepare_images(view[None], image=self.spec)} for view in self.calibration]

    def probe(self, model: Model) -> Callable[[], object]:
        views, classifier = self.held[:_PROBE_ITEMS], narrow(model, ClassifyModel)
        return lambda: [classifier.classify(view[None]) for view in views]

    def smoke_inputs(self) -> list[Any]:
        return list(self.held[:8])


def _refuse_fixed_length(inputs: tuple[TensorSpec, ...], name: str) -> None:
    """A graph whose token inputs take a fixed length (``input_ids`` [1, 64]) or a mask that is
    not token-shaped (a float [B, 1, 1, S]) cannot take a tokenizer's rows of any length:
    refuse with the way forward instead of onnxruntime's "Got: 4 Expected: 64"."""
    for spec in inputs:
        fixed = len(spec.shape) >= 2 and isinstance(spec.shape[-1], int) and spec.shape[-1] > 0
        odd_mask = "mask" in spec.name and (len(spec.shape) != 2 or spec.dtype != "int64")
        if fixed or odd_mask:
            raise ConfigError(
                f"{name}'s input {spec.name} {spec.dtype} {list(spec.shape)} is not token ids "
                "of any length: a fixed-length graph; export it with --task raw and --eval-data "
                "holding its inputs as it takes them (docs/onnx.md), or re-export it with a "
                "dynamic sequence axis and int64 [batch, sequence] inputs"
            )


class TextForm(Form):
    """Token ids in (``input_ids``, with the folder's tokenizer.json): embeddings or labels."""

    def load(self) -> None:
        run, opts = self.run, self.run.options
        source = run.source
        _refuse_fixed_length(self.inputs, str(source.onnx_file))
        if not (source.path / "tokenizer.json").is_file():
            raise ConfigError(
                f"{source.onnx_file} takes token ids: put its tokenizer.json beside it"
            )
        self.tokenizer = run.work / package.TOKENIZER_NAME
        self.tokens = convert.prepare_tokenizer(source, self.tokenizer)
        self.files = {package.TOKENIZER_NAME: self.tokenizer}
        user = self._user_calibration()
        own = read_text_file(user) if user else None
        if opts.eval_data:
            self.held = read_text_file(opts.eval_data)
        elif own is not None:
            own, self.held = split_texts(own)
            self.eval_name = f"{user} (held part)"
        else:
            self.held = builtin_text("held", opts.held_count)
            self.eval_name = "builtin:bbc-news-held"
        self.calibration = own or builtin_text("calibration", run.quant.calibration_size)
        if run.task == "classify":
            self.labels = self._labels(_classes(self.outputs) or 0)

    def io(self, graph: Path) -> PackageIO:
        inputs, outputs = package.read_io(graph)
        max_seq_len = self.run.source.max_seq_len or 512
        if self.run.task == "classify":
            return TextClassifierIO(
                graph=package.GRAPH_NAME,
                tokenizer=package.TOKENIZER_NAME,
                inputs=inputs,
                outputs=outputs,
                max_seq_len=max_seq_len,
                labels=self.labels,
                scores=_scores(self.run),
            )
        rank, dim = len(outputs[0].shape), outputs[0].shape[-1]
        if rank not in (2, 3) or not isinstance(dim, int):
            raise ConfigError(
                f"{self.run.source.onnx_file}'s first output {outputs[0].name} "
                f"{list(outputs[0].shape)} is neither token states [B, S, D] nor vectors [B, D]"
            )
        return TextEncoderIO(
            graph=package.GRAPH_NAME,
            tokenizer=package.TOKENIZER_NAME,
            inputs=inputs,
            outputs=outputs,
            max_seq_len=max_seq_len,
            embedding_dim=dim,
            pooling="mean" if rank == 3 else "none",
        )

    def evaluate(self, model: Model) -> np.ndarray:
        return run_model(model, self.held)

    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        accuracy = compare(self.run.task, reference, candidate)
        return accuracy, {}, f"{accuracy.count} held texts"

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        return text_feeds(staged, self.calibration)

    def probe(self, model: Model) -> Callable[[], object]:
        texts = self.held[:_PROBE_ITEMS]
        return lambda: [run_model(model, [text]) for text in texts]

    def smoke_inputs(self) -> list[Any]:
        return list(self.held[:3])
