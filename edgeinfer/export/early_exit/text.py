"""Early-exit text classifiers (the ``exit-heads`` builder): exit heads trained on a frozen
text encoder, exported as ONNX segments.

``edgeinfer export SRC -o OUT --task classify --early-exit [--exit-every K]`` attaches a head
(mean pooling over real tokens + linear) after every K-th layer and after the last one (the
full-depth head), trains the heads with the backbone frozen on the labelled BBC News topics
(``data/topics.py``), exports one ONNX graph per block of layers (the hidden states for the
next segment and its exit logits), optionally quantizes each segment to dynamic int8 behind
the gate, and calibrates the exit rule on the validation split.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.context import Candidate
from edgeinfer.export.data.topics import MAX_SEQ_LEN, TEXT_DATA, LabelledSplit, labelled_split
from edgeinfer.export.early_exit.segments import SegmentsBuilder, segment_name
from edgeinfer.export.passes import convert, quantize
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO
from edgeinfer.runtime.kinds.early_exit import SegmentRunner
from edgeinfer.runtime.kinds.exit_curve import ExitTrace, trace_inputs
from edgeinfer.runtime.tokenizer import TextTokenizer

__all__ = [
    "ExitHeadsBuilder",
    "exit_layers",
    "export_segments",
    "pooled_features",
    "segment_modules",
    "trace_split",
    "train_heads",
]

# Head training: full-batch Adam on pooled features of the frozen backbone (seconds on a CPU).
_HEAD_STEPS = 300
_HEAD_LR = 1e-2
_HEAD_WEIGHT_DECAY = 1e-4
_FEATURE_BATCH = 32


def exit_layers(num_layers: int, every: int) -> list[int]:
    """The 1-based layers after which an exit head sits: every ``every``-th, and the last."""
    if every < 1:
        raise ConfigError(f"exit_every must be >= 1, got {every}")
    layers = list(range(every, num_layers + 1, every))
    if not layers or layers[-1] != num_layers:
        layers.append(num_layers)
    return layers


def segment_modules(source_path: Path, labels: int, layers: list[int]) -> tuple[Any, list[Any]]:
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


def pooled_features(segments: list[Any], tokenizer: Any, texts: list[str]) -> list[np.ndarray]:
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


def train_heads(segments: list[Any], features: list[np.ndarray], labels: np.ndarray) -> None:
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


def export_segments(segments: list[Any], out_dir: Path) -> list[Path]:
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


def trace_split(package: Path, split: LabelledSplit, *, threads: int | None = None) -> ExitTrace:
    """Run every text of ``split`` alone (batch 1, as a device sees requests) through all
    segments of the early-exit package at ``package``, timing each segment."""
    manifest = Manifest.read(package)
    runner = SegmentRunner(package, manifest, config=RuntimeConfig(threads=threads, warmup_runs=0))
    tokenizer = TextTokenizer.for_package(package, manifest)
    runner.trace(*tokenizer.encode(["warm up"]))
    return trace_inputs(runner, (tokenizer.encode([text]) for text in split.texts), split.labels)


class ExitHeadsBuilder(SegmentsBuilder):
    """A text classifier (an encoder folder or builtin) with exit heads."""

    name = "exit-heads"

    def build(self) -> None:
        import torch
        from transformers import AutoTokenizer

        run = self.run
        options = self.exit_options(default_train="bbc-news")
        if options.train_data not in TEXT_DATA:
            raise ConfigError(
                f"text exit heads train on the built-in BBC News topics (--train-data bbc-news), "
                f"not {options.train_data!r}"
            )
        if run.quant.mode not in ("none", "int8"):
            raise ConfigError("early-exit segments are exported fp32 (none) or dynamic int8")
        if run.threads is not None:
            torch.set_num_threads(run.threads)
        train = labelled_split("train", limit=options.limit)
        self.validation = labelled_split("validation", limit=options.limit)
        num_layers = int(run.source.config["num_hidden_layers"])
        layers = exit_layers(num_layers, int(options.exit_every or 2))
        with run.stage("train-exits"):
            _, segments = segment_modules(run.source.path, len(train.topics), layers)
            tokenizer = AutoTokenizer.from_pretrained(str(run.source.path))  # type: ignore[no-untyped-call]
            features = pooled_features(segments, tokenizer, train.texts)
            train_heads(segments, features, train.labels)
        with run.stage("segments"):
            graphs = {"fp32": export_segments(segments, run.work / "fp32")}
            tokenizer_file = run.work / package.TOKENIZER_NAME
            tokens = convert.prepare_tokenizer(run.source, tokenizer_file)
            if run.quant.mode == "int8":
                (run.work / "int8").mkdir()
                graphs["int8"] = [run.work / "int8" / g.name for g in graphs["fp32"]]
                for src, dst in zip(graphs["fp32"], graphs["int8"], strict=True):
                    quantize.quantize_dynamic_int8(src, dst, run.quant)
        spec = {
            "segments": [
                {"graph": segment_name(i), "layers": [a + 1, b], "exit_layer": b}
                for i, (a, b) in enumerate(zip([0, *layers[:-1]], layers, strict=True))
            ],
            "num_layers": num_layers,
        }
        for precision, paths in graphs.items():
            inputs, _ = package.read_io(paths[0])
            _, outputs = package.read_io(paths[-1])
            io = ExitSegmentsIO(
                graphs=tuple(p.name for p in paths),
                inputs=inputs,
                outputs=outputs,
                labels=tuple(train.topics),
                input="text",
                tokenizer=package.TOKENIZER_NAME,
                max_seq_len=MAX_SEQ_LEN,
            )
            quantization: dict[str, Any] = {"mode": "none"}
            if precision == "int8":
                quantization = {"mode": "int8-dynamic", "per_channel": run.quant.per_channel}
            self.segments_candidate(
                precision,
                paths,
                io,
                spec,
                extra_files={package.TOKENIZER_NAME: tokenizer_file},
                tokens=tokens,
                quantization=quantization,
            )
        self.calibrate(
            {
                "train": {"data": "bbc-news", "split": "train", "texts": len(train.texts)},
                "validation": {
                    "data": "bbc-news",
                    "split": "validation",
                    "texts": len(self.validation.texts),
                    "articles_limit": options.limit,
                },
            }
        )

    def trace(self, candidate: Candidate) -> ExitTrace:
        folder = self.run.stage_candidate(candidate)
        return trace_split(folder, self.validation, threads=self.run.threads)

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.validation.texts[:3])
