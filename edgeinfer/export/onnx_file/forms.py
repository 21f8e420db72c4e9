"""What the ``onnx-file`` builder does differently for each form of graph: images in
(``image-classifier``), token ids in (``text-classifier``/``text-encoder``), anything else
(``raw``, state carried per stream).

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
from edgeinfer.export.data import tensors
from edgeinfer.export.data.photos import builtin_images, read_images, split_images
from edgeinfer.export.data.text import builtin_text, read_text_file, split_texts, text_feeds
from edgeinfer.export.gates.choice import Choice, choose, judge
from edgeinfer.export.gates.declared import parse_declared
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.labels import default_labels, read_labels
from edgeinfer.export.onnx_file.user_graph import state_pairs
from edgeinfer.export.options import OnnxFileOptions
from edgeinfer.export.passes import convert
from edgeinfer.export.passes.validate import Accuracy, agreement, compare, run_model
from edgeinfer.export.vision.preprocessing import spec_from_processor, spec_from_table
from edgeinfer.package_io import (
    ImageClassifierIO,
    ImageSpec,
    PackageIO,
    RawIO,
    StateSpec,
    TensorSpec,
    TextClassifierIO,
    TextEncoderIO,
)
from edgeinfer.runtime import Model
from edgeinfer.runtime.tasks import prepare_images

__all__ = ["Form", "ImageForm", "RawForm", "TextForm"]

_PROBE_ITEMS = 3
# Calls of tensor data calibrated on at most: MinMax ranges settle long before.
_MAX_CALIBRATION_CALLS = 4096
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

    @abc.abstractmethod
    def load(self) -> None:
        """Read the held (and calibration) data."""

    @abc.abstractmethod
    def io(self, graph: Path) -> PackageIO:
        """The package io of ``graph`` (the original or a rewritten one)."""

    @abc.abstractmethod
    def evaluate(self, model: Model) -> Any:
        """The candidate's outputs on the held data."""

    @abc.abstractmethod
    def score(
        self, reference: Any, candidate: Any
    ) -> tuple[Accuracy | Verdict, dict[str, Any], str]:
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


def _classes(outputs: tuple[TensorSpec, ...]) -> int | None:
    dim = outputs[0].shape[-1] if outputs and outputs[0].shape else None
    return dim if isinstance(dim, int) and dim > 0 else None


class ImageForm(Form):
    """One float [N, 3, H, W] input, class logits out: an ``image-classifier`` package."""

    def load(self) -> None:
        run, opts = self.run, self.run.options
        self.spec = self._spec()
        rotate = bool(run.source.recipe and run.source.recipe.data.get("views") == "rotated")
        user = self._user_calibration()
        own = read_images(user, size=self.spec) if user else None
        if opts.eval_data:
            self.held = read_images(opts.eval_data, size=self.spec)
        elif own is not None:
            own, self.held = split_images(own)
            self.eval_name = f"{user} (held part)"
        else:
            self.held = builtin_images("gate", opts.held_count, size=self.spec, rotate=rotate)
            self.eval_name = "builtin:photo-views" + ("-rotated" if rotate else "")
        count = run.quant.calibration_size
        self.calibration = (
            own
            if own is not None
            else builtin_images("calibration", count, size=self.spec, rotate=rotate)
        )
        self.labels = self._labels(_classes(self.outputs) or 0)

    def _spec(self) -> ImageSpec:
        source, shape = self.run.source, self.inputs[0].shape
        recipe = source.recipe
        table = dict(recipe.onnx.get("image", {})) if recipe else {}
        processor = source.path / "preprocessor_config.json"
        if not table and processor.is_file():
            return spec_from_processor(processor)
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
        )

    def evaluate(self, model: Model) -> np.ndarray:
        return run_model(model, self.held)

    def score(self, reference: Any, candidate: Any) -> tuple[Accuracy, dict[str, Any], str]:
        accuracy, all_views = agreement(reference, candidate)
        where = f"{accuracy.count} decided views ({all_views:.4f} on all {len(self.held)})"
        return accuracy, {"all_views": round(all_views, 6), "views": len(self.held)}, where

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        name = self.inputs[0].name
        return [{name: prepare_images(view[None], image=self.spec)} for view in self.calibration]

    def probe(self, model: Model) -> Callable[[], object]:
        views = self.held[:_PROBE_ITEMS]
        return lambda: [model.classify(view[None]) for view in views]

    def smoke_inputs(self) -> list[Any]:
        return list(self.held[:8])


class TextForm(Form):
    """Token ids in (``input_ids``, with the folder's tokenizer.json): embeddings or labels."""

    def load(self) -> None:
        run, opts = self.run, self.run.options
        source = run.source
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

    def score(self, reference: Any, candidate: Any) -> tuple[Accuracy, dict[str, Any], str]:
        accuracy = compare(self.run.task, reference, candidate)
        return accuracy, {}, f"{accuracy.count} held texts"

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        return text_feeds(staged, self.calibration)

    def probe(self, model: Model) -> Callable[[], object]:
        texts = self.held[:_PROBE_ITEMS]
        return lambda: [run_model(model, [text]) for text in texts]

    def smoke_inputs(self) -> list[Any]:
        return list(self.held[:3])


class RawForm(Form):
    """Any graph: named tensors in and out; the state of a stateful graph per stream."""

    def load(self) -> None:
        opts = self.run.options
        self.pairs = self._pairs()
        state = {name for name, _ in self.pairs}
        user = self._user_calibration()
        stateful = bool(self.pairs)
        own = tensors.read_streams(user, self.inputs, stateful=stateful) if user else None
        if opts.eval_data:
            self.held = tensors.read_streams(opts.eval_data, self.inputs, stateful=stateful)
        elif own is not None:
            own, self.held = tensors.split_held(own)
            self.eval_name = f"{user} (held part)"
        else:
            raise ConfigError(
                "a raw export is checked on your inputs: pass --eval-data FILE.npz|DIR (and "
                "--calibration for int8-static), one array per input name (docs/onnx.md)"
            )
        self.calibration = own or []
        for stream in [*self.held, *self.calibration]:
            for call in stream:
                if state & set(call):
                    raise ConfigError(
                        f"the data holds state inputs {sorted(state & set(call))}: leave them "
                        "out, every stream's state starts as zeros"
                    )
        self.state = self._measure_state()
        self.eval_name += f" ({tensors.describe(self.held)['calls']} calls)"

    def _pairs(self) -> list[tuple[str, str]]:
        recipe = self.run.source.recipe
        given = self.options.state or (tuple(recipe.onnx.get("state", ())) if recipe else ())
        return state_pairs(self.inputs, self.outputs, given)

    def _zeros(self) -> dict[str, np.ndarray]:
        shapes = {s.name: s for s in self.inputs}
        out = {}
        for name, _ in self.pairs:
            spec = shapes[name]
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
            out[name] = np.zeros(shape, np.dtype(spec.dtype))
        return out

    def _measure_state(self) -> tuple[StateSpec, ...]:
        """Each state's shape, as the graph returns it on the first held call."""
        if not self.pairs:
            return ()
        import onnxruntime

        graph = self.run.source.path / str(self.run.source.onnx_file)
        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        first = session.run(None, {**self.held[0][0], **self._zeros()})
        values = dict(zip(names, first, strict=True))
        return tuple(
            StateSpec(input=i, output=o, dtype=str(values[o].dtype), shape=tuple(values[o].shape))
            for i, o in self.pairs
        )

    def io(self, graph: Path) -> PackageIO:
        inputs, outputs = package.read_io(graph)
        return RawIO(graph=package.GRAPH_NAME, inputs=inputs, outputs=outputs, state=self.state)

    def evaluate(self, model: Model) -> list[dict[str, np.ndarray]]:
        """Every held call's outputs, state outputs included, call by call (shapes may differ
        between calls): each stream's state starts as zeros and is carried as the runtime's
        streams carry it."""
        outputs: list[dict[str, np.ndarray]] = []
        for stream in self.held:
            state = {s.input: np.zeros(s.shape, np.dtype(s.dtype)) for s in self.state}
            for call in stream:
                outputs.append(model.run({**call, **state}))
                state = {i: outputs[-1][o] for i, o in self.pairs}
        return outputs

    def choices(self, reference: list[dict[str, np.ndarray]]) -> tuple[Choice, ...]:
        """Each output's metric (chosen once, on fp32's first held call)."""
        if not hasattr(self, "_choices"):
            self._choices = choose(
                kind="raw",
                feeds=self.held[0][0],
                reference=reference[0],
                state={o: i for i, o in self.pairs},
                declared=parse_declared(self.options.metrics),
            )
        return self._choices

    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        calls = [call for stream in self.held for call in stream]
        verdict = judge(
            self.choices(reference), feeds=calls, reference=reference, candidate=candidate
        )
        return verdict, {}, f"{len(calls)} held calls"

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        """Every calibration call with the state the graph really had there (run in fp32)."""
        if not self.calibration:
            raise ConfigError("int8-static needs --calibration data (tensors, docs/onnx.md)")
        import onnxruntime

        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        feeds = []
        for stream in self.calibration:
            state = self._zeros()
            for call in stream:
                feed = {**call, **state}
                feeds.append(feed)
                values = dict(zip(names, session.run(None, feed), strict=True))
                state = {i: values[o] for i, o in self.pairs}
        return feeds[:_MAX_CALIBRATION_CALLS]

    def probe(self, model: Model) -> Callable[[], object]:
        calls = self.held[0][:8]

        def run() -> object:
            outputs = [model.run(call, stream="probe") for call in calls]
            model.end_stream("probe")
            return outputs

        return run

    def smoke_inputs(self) -> list[Any]:
        return [call for stream in self.held for call in stream][:3]
