"""Exit heads on a frozen text encoder, exported as ONNX segments (the ``exit-heads``
builder's PyTorch part).

An exit head (mean pooling over real tokens + linear) sits after every K-th layer and after the
last one (the full-depth head). The heads train with the backbone frozen; each block of layers
becomes one ONNX graph returning the hidden states for the next segment and its exit logits.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export import convert
from edgeinfer.export.early_exit_calibrate import MAX_SEQ_LEN

__all__ = [
    "exit_layers",
    "export_segments",
    "pooled_features",
    "segment_modules",
    "segment_name",
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


def segment_name(index: int) -> str:
    """The package file of segment ``index``."""
    return f"segment_{index}.onnx"


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
