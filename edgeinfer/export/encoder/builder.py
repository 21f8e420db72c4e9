"""Text encoders (embeddings, classifiers) from a Hugging Face folder, through optimum-onnx.

convert (optimum) -> PyTorch fp32 reference on held text -> fp32 parity -> ONNX Runtime's
transformer fusions -> int8 (dynamic, or static QDQ calibrated on text) -> the task's metric
against the reference for every candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError, ParityError
from edgeinfer.export import (
    calibrate,
    convert,
    optimize,
    package,
    pareto,
    preprocessing,
    quantize,
    shrink,
    validate,
)
from edgeinfer.export.builders.base import Builder
from edgeinfer.export.context import Candidate, Quality
from edgeinfer.export.options import ShrinkOptions
from edgeinfer.package_io import PackageIO, TextClassifierIO, TextEncoderIO

__all__ = ["EncoderBuilder"]

# Three short and three long held texts (headline + sentence, whole article): the speed probe.
_PROBE_TEXTS = 6


class EncoderBuilder(Builder):
    """Embedding and classification encoders (BERT family) from a model folder."""

    name = "encoder"
    tasks = ("embed", "classify")
    options_type = ShrinkOptions

    def build(self) -> None:
        run, opts = self.run, self.run.options
        # With students asked for, the teacher's variants are reference points, not shipped.
        self.shrink = opts.builder if isinstance(opts.builder, ShrinkOptions) else None
        if run.quant.mode == "fp16":
            raise ConfigError("text encoders export fp32 or int8 on cpu-* targets, not fp16")
        self.held = (
            calibrate.read_text_file(opts.eval_data)
            if opts.eval_data
            else calibrate.builtin_text("held", opts.held_count)
        )
        self.tokenizer = run.work / package.TOKENIZER_NAME
        with run.stage("convert"):
            raw = convert.to_onnx(run.source, run.task, run.work / "onnx")
            self.tokens = convert.prepare_tokenizer(run.source, self.tokenizer)
        with run.stage("reference"):
            self.reference = validate.torch_reference(run.source, run.task, self.held)
        with run.stage("parity"):
            parity = self._evaluate(self._candidate("onnx-fp32", raw, "fp32"))
            run.note("onnx-fp32", precision="fp32", accuracy=parity.to_dict(run.max_accuracy_loss))
            if not parity.is_parity():
                raise ParityError(
                    f"the fp32 ONNX graph does not reproduce {run.source.name} "
                    f"({parity.metric} mean {parity.mean:.6f}, min {parity.min:.6f}); "
                    "this is an exporter bug, please report it with the model folder"
                )
        with run.stage("optimize"):
            fused = run.work / "fused.onnx"
            fused_ops = optimize.optimize(run.source, raw, fused)
            wanted = not self._quantized and self.shrink is None
            fp32 = run.add(self._candidate("fp32", fused, "fp32", requested=wanted))
            self._measure(fp32)
            run.note("fp32", fused_ops=fused_ops)
        if self._quantized:
            with run.stage("quantize"):
                int8 = self._int8(fused, fp32)
                int8.requested = self.shrink is None
                self._measure(run.add(int8))
        if self.shrink is not None:
            shrink.add_students(self, self.shrink)

    @property
    def _quantized(self) -> bool:
        return self.run.quant.mode != "none"

    def _int8(self, fused: Path, fp32: Candidate, name: str = "int8") -> Candidate:
        run, quant = self.run, self.run.quant
        graph = fused.with_name(f"{name}.onnx")
        if quant.mode == "int8":
            quantize.quantize_dynamic_int8(fused, graph, quant)
        else:
            texts = (
                calibrate.read_text_file(run.options.calibration)
                if run.options.calibration
                else calibrate.builtin_text("calibration", quant.calibration_size)
            )
            run.quant = quant = replace(quant, calibration_size=len(texts))
            feeds = calibrate.text_feeds(run.stage_candidate(fp32), texts)
            quantize.quantize_static_int8(fused, graph, quant, feeds=feeds, work_dir=run.work)
        info: dict[str, Any] = {
            "mode": "int8-dynamic" if quant.mode == "int8" else "int8-static",
            "per_channel": quant.per_channel,
            "reduce_range": quant.reduce_range,
            "ops": list(quant.ops_to_quantize),
        }
        if quant.mode == "int8-static":
            info.update(
                calibration_method=quant.calibration_method,
                calibration_size=quant.calibration_size,
            )
        return self._candidate(name, graph, "int8", requested=True, quantization=info)

    def _candidate(
        self,
        name: str,
        graph: Path,
        precision: str,
        *,
        requested: bool = False,
        quantization: dict[str, Any] | None = None,
    ) -> Candidate:
        source = self.run.source
        inputs, outputs = package.read_io(graph)
        io: PackageIO
        if self.run.task == "embed":
            io = TextEncoderIO(
                graph=package.GRAPH_NAME,
                tokenizer=package.TOKENIZER_NAME,
                inputs=inputs,
                outputs=outputs,
                max_seq_len=source.max_seq_len,
                embedding_dim=int(source.config["hidden_size"]),
            )
        else:
            classes = outputs[0].shape[-1]
            if not isinstance(classes, int):
                classes = len(source.config.get("id2label") or {}) or 2
            io = TextClassifierIO(
                graph=package.GRAPH_NAME,
                tokenizer=package.TOKENIZER_NAME,
                inputs=inputs,
                outputs=outputs,
                max_seq_len=source.max_seq_len,
                labels=preprocessing.default_labels(source.config, classes),
            )
        return Candidate(
            name=name,
            precision=precision,
            files={package.GRAPH_NAME: graph, package.TOKENIZER_NAME: self.tokenizer},
            io=io,
            quantization=quantization or {"mode": "none"},
            tokens=self.tokens,
            requested=requested,
        )

    def _evaluate(self, candidate: Candidate) -> validate.Accuracy:
        """The candidate's outputs through the runtime against the PyTorch reference."""
        folder = self.run.stage_candidate(candidate)
        with validate.load_candidate(folder, self.run.threads) as model:
            outputs = validate.run_model(model, self.held)
        return validate.compare(self.run.task, self.reference, outputs)

    def _measure(self, candidate: Candidate) -> None:
        accuracy = self._evaluate(candidate)
        loss = self.run.max_accuracy_loss
        summary = (
            f"{candidate.name} {accuracy.metric} mean {accuracy.mean:.4f} / min "
            f"{accuracy.min:.4f} vs PyTorch fp32"
        )
        self.run.measured(
            candidate,
            Quality(
                metric=accuracy.metric,
                passed=accuracy.passes(loss),
                score=accuracy.mean,
                summary=summary,
                details=accuracy.to_dict(loss),
            ),
        )

    def prefer(self, passing: list[Candidate]) -> Candidate:
        if self.shrink is None:
            return passing[0]
        return pareto.fastest(passing, self.run.report.variants)

    def probe(self, candidate: Candidate) -> Callable[[], object]:
        model = validate.load_candidate(self.run.stage_candidate(candidate), self.run.threads)
        texts = self.held[:_PROBE_TEXTS]
        return lambda: [validate.run_model(model, [text]) for text in texts]

    def accuracy(self, chosen: Candidate) -> dict[str, Any]:
        opts, loss = self.run.options, self.run.max_accuracy_loss
        return {
            "metric": chosen.measured.metric,
            "reference": "pytorch-fp32",
            "eval_data": str(opts.eval_data) if opts.eval_data else "builtin:bbc-news-held",
            "max_accuracy_loss": loss,
            "fp32": self.run.candidates["fp32"].measured.details,
            "value": chosen.measured.details,
        }

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.held[:3])
