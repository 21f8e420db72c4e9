"""An image classifier with exits: the three-block CNN of ``cnn_exits`` trained here on the
MNIST digits (seeded), one fp32 graph per block, the exit rule calibrated on the validation
split (docs/early_exit.md)."""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.export import cnn_exits, package
from edgeinfer.export.builders.exits import SegmentsBuilder
from edgeinfer.export.context import Candidate
from edgeinfer.export.early_exit_calibrate import SplitTrace
from edgeinfer.package_io import ExitSegmentsIO

__all__ = ["ExitCnnBuilder"]


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
        train = cnn_exits.image_split("train", limit=options.limit)
        self.validation = cnn_exits.image_split("validation", limit=options.limit)
        with run.stage("train-exits"):
            segments = cnn_exits.segment_modules(labels=10)
            cnn_exits.train(segments, train, cnn_exits.EPOCHS)
        with run.stage("segments"):
            graphs = cnn_exits.export_blocks(segments, run.work / "fp32")
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
            image_shape=cnn_exits.IMAGE_SHAPE,
            pixel_range=(0.0, 1.0),
        )
        self.segments_candidate("fp32", graphs, io, spec)
        self.calibrate(
            {
                "train": {
                    "data": "mnist",
                    "split": "train",
                    "images": len(train.labels),
                    "epochs": cnn_exits.EPOCHS,
                },
                "validation": {
                    "data": "mnist",
                    "split": "validation",
                    "images": len(self.validation.labels),
                    "limit": options.limit,
                },
            }
        )

    def trace(self, candidate: Candidate) -> SplitTrace:
        folder = self.run.stage_candidate(candidate)
        return cnn_exits.trace_images(folder, self.validation, threads=self.run.threads)

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.validation.images[:3])
