"""Early-exit text classifiers: exit heads trained on a frozen encoder, exported as segments.

``edgeinfer export SRC -o OUT --task classify --early-exit [--exit-every K]`` attaches a head
after every K-th layer (and the last), trains the heads with the backbone frozen on the labelled
BBC News topics, exports one ONNX graph per block of layers, optionally quantizes each segment
to dynamic int8 behind the gate, and calibrates the exit rule on the validation split.
"""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.export import convert, package, quantize, text_exits
from edgeinfer.export.builders.exits import SegmentsBuilder
from edgeinfer.export.context import Candidate
from edgeinfer.export.early_exit_calibrate import (
    MAX_SEQ_LEN,
    TEXT_DATA,
    SplitTrace,
    labelled_split,
    trace_split,
)
from edgeinfer.package_io import ExitSegmentsIO

__all__ = ["ExitHeadsBuilder"]


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
        layers = text_exits.exit_layers(num_layers, int(options.exit_every or 2))
        with run.stage("train-exits"):
            _, segments = text_exits.segment_modules(run.source.path, len(train.topics), layers)
            tokenizer = AutoTokenizer.from_pretrained(str(run.source.path))  # type: ignore[no-untyped-call]
            features = text_exits.pooled_features(segments, tokenizer, train.texts)
            text_exits.train_heads(segments, features, train.labels)
        with run.stage("segments"):
            graphs = {"fp32": text_exits.export_segments(segments, run.work / "fp32")}
            tokenizer_file = run.work / package.TOKENIZER_NAME
            tokens = convert.prepare_tokenizer(run.source, tokenizer_file)
            if run.quant.mode == "int8":
                (run.work / "int8").mkdir()
                graphs["int8"] = [run.work / "int8" / g.name for g in graphs["fp32"]]
                for src, dst in zip(graphs["fp32"], graphs["int8"], strict=True):
                    quantize.quantize_dynamic_int8(src, dst, run.quant)
        spec = {
            "segments": [
                {"graph": text_exits.segment_name(i), "layers": [a + 1, b], "exit_layer": b}
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

    def trace(self, candidate: Candidate) -> SplitTrace:
        folder = self.run.stage_candidate(candidate)
        return trace_split(folder, self.validation, threads=self.run.threads)

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.validation.texts[:3])
