"""Early-exit classifiers: exit heads on a frozen encoder, exported as ONNX segments.

``edgeinfer export minilm -o OUT --task classify --early-exit --exit-every K --train-data bbc``
attaches an exit head (mean pooling over real tokens + linear) after every K-th layer (and the
last one, which is the full-depth head), trains the heads with the backbone frozen on the BBC
News topics, exports one ONNX graph per block of layers (each returning the hidden states for
the next segment and its exit logits), optionally quantizes each segment to dynamic int8 behind
the accuracy gate, calibrates the exit threshold on the validation split
(``early_exit_calibrate``) and writes the package. See docs/early_exit.md.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import AccuracyGateError, ConfigError
from edgeinfer.export import convert, package, quantize
from edgeinfer.export.early_exit_calibrate import (
    MAX_SEQ_LEN,
    calibrate_policies,
    labelled_split,
    trace_split,
)
from edgeinfer.export.early_exit_vision import MNIST_CNN
from edgeinfer.manifest import Manifest, file_entries

if TYPE_CHECKING:
    from edgeinfer.export.pipeline import ExportOptions, _Run

__all__ = ["check_options", "exit_layers", "export_early_exit", "segment_name"]

log = logging.getLogger(__name__)

# Head training: full-batch Adam on pooled features of the frozen backbone (seconds on a CPU).
_HEAD_STEPS = 300
_HEAD_LR = 1e-2
_HEAD_WEIGHT_DECAY = 1e-4
_FEATURE_BATCH = 32


def check_options(options: ExportOptions) -> None:
    """Validate the early-exit fields of ``options`` (raises ``ConfigError``)."""
    if options.task != "classify":
        raise ConfigError("--early-exit needs --task classify")
    if options.source == MNIST_CNN:
        if options.train_data not in (None, "mnist"):
            raise ConfigError(f"{MNIST_CNN} trains on --train-data mnist (the built-in digits)")
        if options.quantize != "none":
            raise ConfigError(
                f"{MNIST_CNN} segments ship fp32 (dynamic int8 makes convolutions slower on "
                "CPUs): pass --quantize none"
            )
    elif options.train_data != "bbc":
        raise ConfigError("--early-exit needs --train-data bbc (the built-in BBC News topics)")
    if options.exit_every < 1:
        raise ConfigError(f"exit_every must be >= 1, got {options.exit_every}")
    if options.quantize not in ("none", "int8"):
        raise ConfigError("early-exit segments are exported fp32 (none) or dynamic int8")
    if options.early_exit_articles is not None and options.early_exit_articles < 1:
        raise ConfigError(f"early_exit_articles must be >= 1, got {options.early_exit_articles}")


def exit_layers(num_layers: int, every: int) -> list[int]:
    """The 1-based layers after which an exit head sits: every ``every``-th, and the last."""
    if every < 1:
        raise ConfigError(f"exit_every must be >= 1, got {every}")
    layers = list(range(every, num_layers + 1, every))
    if not layers or layers[-1] != num_layers:
        layers.append(num_layers)
    return layers


def segment_name(index: int) -> str:
    """The package file of segment ``index``."""
    return f"segment_{index}.onnx"


def _modules(source_path: Path, labels: int, layers: list[int]) -> tuple[Any, list[Any]]:
    """The frozen encoder and one torch segment module per exit (heads untrained)."""
    import torch
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(str(source_path), attn_implementation="eager").eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    hidden_size = int(encoder.config.hidden_size)

    class Segment(torch.nn.Module):
        """Layers ``start..stop-1`` (+ embeddings when first), then mean pooling + head."""

        def __init__(self, start: int, stop: int, last: bool) -> None:
            super().__init__()
            self.first, self.last = start == 0, last
            self.embeddings: Any = encoder.embeddings if self.first else None
            self.layers = torch.nn.ModuleList(encoder.encoder.layer[start:stop])
            self.head = torch.nn.Linear(hidden_size, labels)

        def body(self, x: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            # x: input_ids [B, S] int64 (first segment) or hidden [B, S, D] float32
            hidden = (
                self.embeddings(input_ids=x, token_type_ids=token_type_ids) if self.first else x
            )
            mask = attention_mask.to(hidden.dtype)  # [B, S]
            additive = (1.0 - mask[:, None, None, :]) * torch.finfo(hidden.dtype).min
            for layer in self.layers:
                hidden = layer(hidden, attention_mask=additive)[0]
            pooled = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
            return hidden, pooled  # [B, S, D], [B, D]

        def forward(self, x: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            hidden, pooled = self.body(x, attention_mask, token_type_ids)
            logits = self.head(pooled)  # [B, C]
            return logits if self.last else (hidden, logits)

    bounds = list(zip([0, *layers[:-1]], layers, strict=True))
    segments = [Segment(a, b, i == len(bounds) - 1) for i, (a, b) in enumerate(bounds)]
    return encoder, segments


def _features(segments: list[Any], tokenizer: Any, texts: list[str]) -> list[np.ndarray]:
    """Pooled features at every exit for ``texts``: one float32 [N, D] array per exit."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # less padding per batch
    per_exit: list[list[np.ndarray]] = [[] for _ in segments]
    with torch.inference_mode():
        for start in range(0, len(order), _FEATURE_BATCH):
            chunk = [texts[i] for i in order[start : start + _FEATURE_BATCH]]
            batch = tokenizer(
                chunk, padding=True, truncation=True, max_length=MAX_SEQ_LEN, return_tensors="pt"
            )
            state = batch["input_ids"]
            for k, segment in enumerate(segments):
                state, pooled = segment.body(
                    state, batch["attention_mask"], torch.zeros_like(batch["input_ids"])
                )
                per_exit[k].append(pooled.numpy())
    inverse = np.argsort(order)
    return [np.concatenate(parts)[inverse] for parts in per_exit]


def _train_heads(segments: list[Any], features: list[np.ndarray], labels: np.ndarray) -> None:
    """Fit each exit head (softmax regression) on its layer's pooled features, seeded."""
    import torch

    target = torch.from_numpy(labels)
    for segment, x in zip(segments, features, strict=True):
        torch.manual_seed(0)
        head = segment.head
        head.reset_parameters()
        inputs = torch.from_numpy(x)
        optimizer = torch.optim.Adam(
            head.parameters(), lr=_HEAD_LR, weight_decay=_HEAD_WEIGHT_DECAY
        )
        for _ in range(_HEAD_STEPS):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(head(inputs), target)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        for p in head.parameters():
            p.requires_grad_(False)


def _export_segments(segments: list[Any], out_dir: Path) -> list[Path]:
    """One fp32 ONNX graph per segment, batch and sequence dimensions dynamic."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    ids = torch.ones((2, 8), dtype=torch.int64)
    mask = torch.ones((2, 8), dtype=torch.int64)
    hidden = segments[0].body(ids, mask, torch.zeros_like(ids))[0]
    paths = []
    for index, segment in enumerate(segments):
        path = out_dir / segment_name(index)
        if index == 0:
            args: tuple[Any, ...] = (ids, mask, torch.zeros_like(ids))
            inputs = ["input_ids", "attention_mask", "token_type_ids"]
        else:
            args, inputs = (hidden, mask), ["hidden_states", "attention_mask"]
        outputs = ["logits"] if segment.last else ["hidden_states_out", "logits"]
        axes = {name: {0: "batch", 1: "sequence"} for name in [*inputs, *outputs]}
        axes["logits"] = {0: "batch"}
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's note
            torch.onnx.export(
                segment,
                args,
                str(path),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=convert.OPSET,
                dynamo=False,
            )
        paths.append(path)
    return paths


def _stage(
    folder: Path, graphs: list[Path], tokenizer: Path, fields: dict[str, Any], extra: bytes
) -> None:
    """Lay out an early-exit package: segments, tokenizer, report and the manifest."""
    folder.mkdir(parents=True, exist_ok=False)
    names = [segment_name(i) for i in range(len(graphs))]
    for graph, name in zip(graphs, names, strict=True):
        shutil.copy2(graph, folder / name)
    shutil.copy2(tokenizer, folder / package.TOKENIZER_NAME)
    (folder / "report.json").write_bytes(extra)
    io = {
        **fields["io"],
        **package.read_io(folder / names[0]),
        "graph": names[0],
        "tokenizer": package.TOKENIZER_NAME,
    }
    files = file_entries(folder, [*names, package.TOKENIZER_NAME, "report.json"])
    Manifest(**{**fields, "io": io, "files": files}).write(folder)


def export_early_exit(run: _Run, partial: Path) -> None:
    """Train exit heads, export segments, gate int8, calibrate the threshold, write ``partial``."""
    import torch
    from transformers import AutoTokenizer

    options, work = run.options, run.work
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    train = labelled_split("train", limit=options.early_exit_articles)
    validation = labelled_split("validation", limit=options.early_exit_articles)
    topics = train.topics
    num_layers = int(run.source.config["num_hidden_layers"])
    layers = exit_layers(num_layers, options.exit_every)

    with run.stage("train-exits"):
        _, segments = _modules(run.source.path, len(topics), layers)
        tokenizer = AutoTokenizer.from_pretrained(str(run.source.path))  # type: ignore[no-untyped-call]
        features = _features(segments, tokenizer, train.texts)
        _train_heads(segments, features, train.labels)
    with run.stage("segments"):
        graphs = {"fp32": _export_segments(segments, work / "fp32")}
        tokenizer_file = work / package.TOKENIZER_NAME
        tokens = convert.prepare_tokenizer(run.source, tokenizer_file)
        if options.quantize == "int8":
            graphs["int8"] = [work / "int8" / g.name for g in graphs["fp32"]]
            (work / "int8").mkdir()
            for src, dst in zip(graphs["fp32"], graphs["int8"], strict=True):
                quantize.quantize_dynamic_int8(src, dst, run.quant)

    def fields(precision: str, early_exit: dict[str, Any], gate: dict[str, Any]) -> dict[str, Any]:
        base = run.fields(precision, gate, tokens)
        base["io"] = {**base["io"], "labels": topics, "max_seq_len": MAX_SEQ_LEN}
        return {**base, "early_exit": early_exit}

    spec = {
        "segments": [
            {"graph": segment_name(i), "layers": [a + 1, b], "exit_layer": b}
            for i, (a, b) in enumerate(zip([0, *layers[:-1]], layers, strict=True))
        ],
        "num_layers": num_layers,
        "threshold": 2.0,  # placeholder for candidate packages: run every layer
    }
    with run.stage("gate"):
        traces = {}
        for precision, paths in graphs.items():
            folder = work / "candidates" / precision
            _stage(folder, paths, tokenizer_file, fields(precision, spec, {}), b"{}\n")
            traces[precision] = trace_split(folder, validation, threads=options.threads)
        full = {p: t.accuracy_at(2.0) for p, t in traces.items()}
        for precision, accuracy in full.items():
            run.report.variants[precision] = {"precision": precision, "full_accuracy": accuracy}
        chosen = "int8" if "int8" in graphs else "fp32"
        if chosen == "int8" and full["int8"] < full["fp32"] - options.max_accuracy_loss:
            message = (
                f"int8 segments reach {full['int8']:.4f} validation accuracy vs fp32 "
                f"{full['fp32']:.4f}: more than the max accuracy loss {options.max_accuracy_loss}"
            )
            if not options.keep_best:
                raise AccuracyGateError(message + "; pass --keep-best to ship fp32")
            run.report.warnings.append(message + "; kept fp32 (--keep-best)")
            chosen = "fp32"
        run.report.chosen = chosen
    with run.stage("thresholds"):
        calibration = calibrate_policies(traces[chosen], options.max_accuracy_loss)
    with run.stage("package"):
        early_exit = {
            **spec,
            **calibration,
            "batch_policy": "leave",
            "train": {"data": "bbc", "split": "train", "texts": len(train.texts)},
            "validation": {
                "data": "bbc",
                "split": "validation",
                "texts": len(validation.texts),
                "articles_limit": options.early_exit_articles,
            },
        }
        gate = {
            "metric": "accuracy",
            "reference": "fp32-segments",
            "eval_data": "builtin:bbc-news-validation",
            "max_accuracy_loss": options.max_accuracy_loss,
            "fp32": full["fp32"],
            "value": full[chosen],
        }
        report = (json.dumps(run.report.to_dict(), indent=2) + "\n").encode()
        _stage(partial, graphs[chosen], tokenizer_file, fields(chosen, early_exit, gate), report)
        package.commit(partial, Path(options.out), overwrite=options.overwrite)
