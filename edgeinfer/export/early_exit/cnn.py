"""An image classifier with exits (the ``exit-cnn`` builder): a small CNN with an exit head
after each conv block, trained here on the MNIST digits (``data/digits.py``), one fp32 ONNX graph
per block, the exit rule calibrated on the validation split (docs/early_exit.md).

Three blocks train jointly with their heads (seeded, seconds to a minute on a CPU); segments
ship fp32 (dynamic int8 makes convolutions slower on CPUs).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.context import Candidate
from edgeinfer.export.data.digits import IMAGE_SHAPE, DigitSplit, digit_split
from edgeinfer.export.early_exit.segments import SegmentsBuilder, segment_name
from edgeinfer.export.passes import convert
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO
from edgeinfer.runtime.kinds.early_exit import SegmentRunner
from edgeinfer.runtime.kinds.exit_curve import ExitTrace, trace_inputs

__all__ = [
    "EPOCHS",
    "ExitCnnBuilder",
    "export_blocks",
    "segment_modules",
    "trace_images",
    "train",
]

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


def train(segments: list[Any], data: DigitSplit, epochs: int) -> None:
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
    folder: Path, data: DigitSplit, *, threads: int | None = None, manifest: Manifest | None = None
) -> ExitTrace:
    """Run every image of ``data`` alone (batch 1) through all segments, timing each."""
    manifest = manifest or Manifest.read(folder)
    runner = SegmentRunner(folder, manifest, config=RuntimeConfig(threads=threads, warmup_runs=0))
    for _ in range(3):  # warm up the sessions' first runs (allocations)
        runner.trace(data.images[:1], None)
    return trace_inputs(runner, ((image[None], None) for image in data.images), data.labels)


class ExitCnnBuilder(SegmentsBuilder):
    """The digits CNN with an exit after every block (fp32: dynamic int8 makes convolutions
    slower on CPUs)."""

    name = "exit-cnn"
    cpu_only = True

    def build(self) -> None:
        import torch

        run = self.run
        options = self.exit_options(default_train="mnist")
        if options.train_data != "mnist":
            raise ConfigError(f"{run.source.name} trains on --train-data mnist (built-in digits)")
        if run.quant.mode != "none":
            raise ConfigError(
                f"{run.source.name} segments ship fp32 (dynamic int8 makes convolutions slower "
                "on CPUs): pass --quantize none"
            )
        if run.threads is not None:
            torch.set_num_threads(run.threads)
        training = digit_split("train", limit=options.limit)
        self.validation = digit_split("validation", limit=options.limit)
        with run.stage("train-exits"):
            segments = segment_modules(labels=10)
            train(segments, training, EPOCHS)
        with run.stage("segments"):
            graphs = export_blocks(segments, run.work / "fp32")
        spec = {
            "segments": [
                {"graph": g.name, "layers": [i + 1, i + 1], "exit_layer": i + 1}
                for i, g in enumerate(graphs)
            ],
            "num_layers": len(graphs),
            "input": "image",
        }
        inputs, _ = package.read_io(graphs[0])
        _, outputs = package.read_io(graphs[-1])
        io = ExitSegmentsIO(
            graphs=tuple(g.name for g in graphs),
            inputs=inputs,
            outputs=outputs,
            labels=tuple(str(d) for d in range(10)),
            input="image",
            image_shape=IMAGE_SHAPE,
            pixel_range=(0.0, 1.0),
        )
        self.segments_candidate("fp32", graphs, io, spec)
        self.calibrate(
            {
                "train": {
                    "data": "mnist",
                    "split": "train",
                    "images": len(training.labels),
                    "epochs": EPOCHS,
                },
                "validation": {
                    "data": "mnist",
                    "split": "validation",
                    "images": len(self.validation.labels),
                    "limit": options.limit,
                },
            }
        )

    def trace(self, candidate: Candidate) -> ExitTrace:
        folder = self.run.stage_candidate(candidate)
        return trace_images(folder, self.validation, threads=self.run.threads)

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.validation.images[:3])
