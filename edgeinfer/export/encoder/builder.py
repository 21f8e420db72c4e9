"""Text encoders (embeddings, classifiers) from a Hugging Face folder, through optimum-onnx.

One variant pipeline for the source and for every student (``students/``): convert (optimum)
-> parity of the fp32 graph with the folder's own PyTorch outputs on held text -> ONNX
Runtime's transformer fusions -> int8 (dynamic, or static QDQ calibrated on text) -> each
variant's metric against the source's (the teacher's) PyTorch fp32 reference.

With students asked for, every candidate (the teacher's variants too, for a fair comparison)
is also measured on a domain no student trained on (``data/domains.py``: technical prose)
and gated on both texts, the worse one deciding; a third split of that domain is measured
for the report only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError, ParityError
from edgeinfer.export import package
from edgeinfer.export.builder import GraphBuilder
from edgeinfer.export.context import Candidate
from edgeinfer.export.data.domains import HELD_OUT, technical_text
from edgeinfer.export.data.text import builtin_text, read_text_file, text_feeds
from edgeinfer.export.encoder.students import pareto
from edgeinfer.export.encoder.students.shrink import Student, train_students
from edgeinfer.export.gates.verdict import OutputScore, Verdict
from edgeinfer.export.labels import default_labels
from edgeinfer.export.options import ShrinkOptions
from edgeinfer.export.passes import convert, optimize, quantize, validate
from edgeinfer.export.source import Source, resolve_source
from edgeinfer.package_io import PackageIO, TextClassifierIO, TextEncoderIO

__all__ = ["EncoderBuilder"]

# Three short and three long held texts (headline + sentence, whole article): the speed probe.
_PROBE_TEXTS = 6


class EncoderBuilder(GraphBuilder):
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
            read_text_file(opts.eval_data)
            if opts.eval_data
            else builtin_text("held", opts.held_count)
        )
        tokenizer = run.work / package.TOKENIZER_NAME
        self.tokens = convert.prepare_tokenizer(run.source, tokenizer)
        self.side_files = {package.TOKENIZER_NAME: tokenizer}
        # Held texts of the held-out domain (students only): name -> (texts, teacher outputs);
        # "off_domain" is gated, "off_domain_report" only reported.
        self.off: dict[str, tuple[list[str], np.ndarray]] = {}
        self._variants(run.source)
        if self.shrink is not None:
            for student in train_students(run, self.shrink):
                self._variants(resolve_source(str(student.folder)), student)
            with run.stage("pareto"):
                pareto.measure(run, self.held)

    def _variants(self, source: Source, student: Student | None = None) -> None:
        """The pipeline of one model folder (the source, or a student trained from it): its
        fp32 and int8 candidates, each measured against the source's PyTorch reference."""
        run = self.run
        prefix = f"{student.name}-" if student else ""
        suffix = f"-{student.layers}L" if student else ""  # stage names of a student
        work = student.folder.parent if student else run.work
        ship = student is not None or self.shrink is None
        extra = {"student": student.structure} if student else {}
        with run.stage(f"convert{suffix}"):
            raw = convert.to_onnx(source, run.task, work / "onnx")
        with run.stage(f"reference{suffix}"):
            own = validate.torch_reference(source, run.task, self.held)
            if student is None:
                self.reference = own
                if self.shrink is not None:
                    self._off_domain_references(source)
        with run.stage(f"parity{suffix}"):
            label = student.name if student else source.name
            parity = self._evaluate(self.candidate(f"{prefix}onnx-fp32", raw, "fp32"), own)
            loss = run.max_accuracy_loss
            run.note(f"{prefix}onnx-fp32", precision="fp32", accuracy=parity.to_dict(loss))
            if not parity.is_parity():
                raise ParityError(
                    f"the fp32 ONNX graph does not reproduce {label} "
                    f"({parity.metric} mean {parity.mean:.6f}, min {parity.min:.6f}); "
                    "this is an exporter bug, please report it with the model folder"
                )
        with run.stage(f"optimize{suffix}"):
            fused = work / "fused.onnx"
            fused_ops = optimize.optimize(source, raw, fused)
            wanted = ship and not self._quantized
            fp32 = run.add(self.candidate(f"{prefix}fp32", fused, "fp32", requested=wanted))
            fp32.extra = extra
            self._measure(fp32)
            run.note(fp32.name, fused_ops=fused_ops, **extra)
        if self._quantized:
            with run.stage(f"quantize{suffix}"):
                int8 = run.add(self._int8(fused, fp32, name=f"{prefix}int8"))
                int8.requested, int8.extra = ship, extra
                self._measure(int8)

    @property
    def _quantized(self) -> bool:
        return self.run.quant.mode != "none"

    def _int8(self, fused: Path, fp32: Candidate, name: str) -> Candidate:
        run, quant = self.run, self.run.quant
        graph = fused.with_name(f"{name}.onnx")
        if quant.mode == "int8":
            quantize.quantize_dynamic_int8(fused, graph, quant)
        else:
            texts = (
                read_text_file(run.options.calibration)
                if run.options.calibration
                else builtin_text("calibration", quant.calibration_size)
            )
            quant = run.calibrated(len(texts))
            feeds = text_feeds(run.stage_candidate(fp32), texts)
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
        return self.candidate(name, graph, "int8", requested=True, quantization=info)

    def graph_io(self, graph: Path) -> PackageIO:
        source = self.run.source
        inputs, outputs = package.read_io(graph)
        if self.run.task == "embed":
            return TextEncoderIO(
                graph=package.GRAPH_NAME,
                tokenizer=package.TOKENIZER_NAME,
                inputs=inputs,
                outputs=outputs,
                max_seq_len=source.max_seq_len,
                embedding_dim=int(source.config["hidden_size"]),
            )
        classes = outputs[0].shape[-1]
        if not isinstance(classes, int):
            classes = len(source.config.get("id2label") or {}) or 2
        return TextClassifierIO(
            graph=package.GRAPH_NAME,
            tokenizer=package.TOKENIZER_NAME,
            inputs=inputs,
            outputs=outputs,
            max_seq_len=source.max_seq_len,
            labels=default_labels(source.config, classes),
        )

    def _off_domain_references(self, teacher: Source) -> None:
        """The teacher's PyTorch outputs on the held-out domain's choice and report splits
        (as many texts as the in-domain eval text holds, at most)."""
        count = len(self.held)
        for name, texts in (
            ("off_domain", technical_text("choice", count)),
            ("off_domain_report", technical_text("report", count)),
        ):
            self.off[name] = (texts, validate.torch_reference(teacher, self.run.task, texts))

    def _evaluate(
        self, candidate: Candidate, reference: np.ndarray, texts: list[str] | None = None
    ) -> Verdict:
        """The candidate's outputs on ``texts`` (the held text by default), through the
        runtime, against ``reference`` (PyTorch's outputs on the same text)."""
        folder = self.run.stage_candidate(candidate)
        with validate.load_candidate(folder, self.run.threads) as model:
            outputs = validate.run_model(model, self.held if texts is None else texts)
        return validate.compare(self.run.task, reference, outputs)

    def _measure(self, candidate: Candidate) -> None:
        accuracy = self._evaluate(candidate, self.reference)
        summary = (
            f"{candidate.name} {accuracy.metric} mean {accuracy.mean:.4f} / min "
            f"{accuracy.min:.4f} vs PyTorch fp32"
        )
        if not self.off:
            self.run.measured(candidate, accuracy, summary)
            return
        loss = self.run.max_accuracy_loss
        off = {
            name: self._evaluate(candidate, ref, texts) for name, (texts, ref) in self.off.items()
        }
        gated = off["off_domain"]
        summary = (
            f"{summary}; off-domain ({HELD_OUT} text, never trained on) mean "
            f"{gated.mean:.4f} / min {gated.min:.4f}"
        )
        report = off["off_domain_report"].to_dict(loss)
        del report["passed"]  # measured for the report: nothing is chosen on it
        self.run.measured(
            candidate,
            Verdict(
                (*_renamed(accuracy, "in_domain"), *_renamed(gated, "off_domain")),
                metric=accuracy.metric,
            ),
            summary,
            in_domain=accuracy.to_dict(loss),
            off_domain={**gated.to_dict(loss), "data": f"builtin:{HELD_OUT}-choice"},
            off_domain_report={**report, "data": f"builtin:{HELD_OUT}-report"},
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
        off = {"off_domain_data": f"builtin:{HELD_OUT}"} if self.off else {}
        return {
            "metric": chosen.measured.metric,
            "reference": "pytorch-fp32",
            "eval_data": str(opts.eval_data) if opts.eval_data else "builtin:bbc-news-held",
            **off,
            "max_accuracy_loss": loss,
            "fp32": self.run.candidates["fp32"].measured.details,
            "value": chosen.measured.details,
        }

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return list(self.held[:3])


def _renamed(verdict: Verdict, output: str) -> tuple[OutputScore, ...]:
    """``verdict``'s scores under another output name (the off-domain texts' beside the
    held texts': the gate passes only when both do)."""
    return tuple(dataclasses.replace(score, output=output) for score in verdict.scores)
