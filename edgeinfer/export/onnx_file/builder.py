"""An ONNX file a user already holds (exported by their training stack, or a ready model such
as a voice-activity detector), as a package.

check (``onnx.checker``, strict shape inference, onnxruntime loads it) -> the original graph's
outputs on held inputs (the reference: the user's fp32 ONNX itself) -> onnxruntime's
hardware-independent optimizations (parity with the original) -> quantization for the target
(dynamic int8 on CPUs, static QDQ calibrated on the user's data for NPUs or when asked, fp16 for
GPUs) -> the gate against the original on held inputs -> package. The graph's form decides
the package kind (``forms.py``): images, token ids or any tensors (``raw``).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeinfer.config import QuantMode
from edgeinfer.errors import ConfigError, ParityError
from edgeinfer.export import package, speed
from edgeinfer.export.builder import GraphBuilder
from edgeinfer.export.context import Candidate
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.onnx_file import evidence, macs, user_graph
from edgeinfer.export.onnx_file.detect import DetectForm, YoloForm
from edgeinfer.export.onnx_file.forms import Form, ImageForm, TextForm
from edgeinfer.export.onnx_file.raw import RawForm
from edgeinfer.export.onnx_file.segment import InstanceForm, SemanticForm
from edgeinfer.export.options import OnnxFileOptions
from edgeinfer.export.passes import ort_compat, quantize
from edgeinfer.export.passes.validate import load_candidate
from edgeinfer.package_io import PackageIO

__all__ = ["MIN_INT8_SHARE", "MIXED", "OnnxFileBuilder", "detect_task"]

log = logging.getLogger(__name__)
# A dynamic int8 that runs less than this share of the MACs in int8 (a CNN's classifier head
# alone) is "mixed": neither the size nor the speed of int8.
MIN_INT8_SHARE = 0.5
MIXED = "mixed"


def detect_task(inputs: Any, outputs: Any) -> str:
    """``--task auto`` for a graph: image or token-id graphs with class logits [N, C]
    classify, image graphs with a YOLO head [1, 4+C, N] detect (segment with a mask
    prototype output after it), token-id graphs with other outputs embed, everything else is
    raw."""
    form = user_graph.input_form(inputs)
    logits = len(outputs) == 1 and len(outputs[0].shape) == 2
    if form == "image" and logits:
        return "classify"
    if form == "image" and evidence.is_yolo_head(tuple(outputs[0].shape)):
        head = tuple(outputs[0].shape)
        rows = min(d for d in head[1:] if isinstance(d, int))
        protos = evidence.prototype_output(tuple(outputs), rows - 5)
        task = "segment" if protos is not None else "detect"
        log.warning("--task auto: %s %s reads as a YOLO head: --task %s", outputs[0].name,
                    list(head), task)  # fmt: skip
        return task
    if form == "text":
        return "embed" if len(outputs[0].shape) == 3 else "classify"
    return "raw"


def _nothing_quantized(graph: Path, mode: str) -> str:
    """Why a graph ships fp32 when the quantizer changed none of its nodes, and what to do."""
    import onnx

    ops = {node.op_type for node in onnx.load(graph, load_external_data=False).graph.node}
    if mode == "int8" and ops & {"Conv", "ConvTranspose"}:
        dynamic = ", ".join(quantize.DYNAMIC_OPS)
        return (
            f"{graph.name} has no operator dynamic int8 quantizes ({dynamic}; its convolutions "
            "stay fp32): shipped fp32; pass --quantize int8-static to quantize them on "
            "calibration data"
        )
    return f"{graph.name} has no operator the {mode} quantizer takes: shipped fp32"


def _quantized_ops(graph: Path) -> int:
    """How many nodes of ``graph`` (subgraphs included) run in integers."""
    import onnx

    def count(nodes: Any) -> int:
        total = 0
        for node in nodes:
            total += "Integer" in node.op_type or "Quant" in node.op_type
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    total += count(attribute.g.node)
        return total

    return count(onnx.load(str(graph)).graph.node)


class OnnxFileBuilder(GraphBuilder):
    """Any ONNX graph into an image-classifier, image-detector, image-segmenter, text or raw
    package."""

    name = "onnx-file"
    tasks = ("classify", "embed", "raw", "detect", "segment")
    cpu_only = False
    options_type = OnnxFileOptions

    def build(self) -> None:
        run = self.run
        original = run.source.path / str(run.source.onnx_file)
        with run.stage("check"):
            user_graph.check(original)
            inputs, outputs = package.read_io(original)
            self.form = self._form(inputs, outputs)
            self.form.load()
            graph = self.form.fixed_graph(original)
            self.side_files, self.tokens = self.form.files, self.form.tokens
        with run.stage("reference"):
            self.reference = self._evaluate(self.candidate("onnx-fp32", graph, "fp32"))
        with run.stage("optimize"):
            fp32_graph = run.work / "fp32.onnx"
            user_graph.optimize(graph, fp32_graph)
            if run.quant.fixed_batch is not None and isinstance(self.form, ImageForm):
                ort_compat.fix_batch(fp32_graph, fp32_graph, batch=run.quant.fixed_batch)
            given = self._given_integers(original)
            quantized = run.quant.mode != "none" and not given
            base = (
                self.candidate("as-given", fp32_graph, "int8", requested=True,
                               quantization={"mode": "as-given", "integer_nodes": given})
                if given
                else self.candidate("fp32", fp32_graph, "fp32", requested=not quantized)
            )  # fmt: skip
            fp32 = run.add(base)
            accuracy = self._measure(fp32)
            if not accuracy.is_parity():
                raise ParityError(
                    f"the optimized fp32 graph does not reproduce {original.name} "
                    f"({fp32.measured.summary}); this is an onnxruntime optimizer bug, please "
                    "report it with the model"
                )
        if quantized:
            with run.stage("quantize"):
                candidate = self._quantized(fp32_graph, fp32, run.quant.mode)
                if _quantized_ops(candidate.files[package.GRAPH_NAME]) or candidate.name == "fp16":
                    self._measure(run.add(candidate))
                    if candidate.precision == MIXED and self._can_calibrate():
                        self._measure(run.add(self._quantized(fp32_graph, fp32, "int8-static")))
                else:
                    fp32.requested = True
                    run.report.warnings.append(_nothing_quantized(original, run.quant.mode))

    def _can_calibrate(self) -> bool:
        """Whether static int8 can be tried beside a dynamic one that quantized little: a CPU
        target (an accelerator's preset decides its own) and pictures to calibrate on."""
        cpu = self.run.options.target.startswith("cpu-")
        return cpu and isinstance(self.form, (ImageForm, YoloForm))

    def _given_integers(self, original: Path) -> int:
        """How many nodes of the user's graph already run in integers (0: a float graph); a
        quantized graph ships as given, never quantized again."""
        count = _quantized_ops(original)
        if count:
            self.run.report.warnings.append(
                f"{original.name} is already quantized ({count} integer or QDQ nodes): shipped "
                f"as given (precision int8), not quantized again"
                + (f" by --quantize {self.run.quant.mode}" if self.run.quant.mode != "none" else "")
            )
        return count

    def _form(self, inputs: Any, outputs: Any) -> Form:
        task, name = self.run.task, self.run.source.onnx_file
        form = user_graph.input_form(inputs)
        if task == "raw":
            return RawForm(self.run, inputs, outputs)
        if task == "detect":
            return DetectForm(self.run, inputs, outputs)
        if task == "segment":
            yolo = evidence.is_yolo_head(tuple(outputs[0].shape))
            return (InstanceForm if yolo else SemanticForm)(self.run, inputs, outputs)
        if form == "text":
            return TextForm(self.run, inputs, outputs)
        if form == "image" and task == "classify":
            if len(outputs[0].shape) != 2:
                raise ConfigError(
                    f"{name}'s first output {outputs[0].name} {list(outputs[0].shape)} is not "
                    "class logits [N, C]; export it with --task raw"
                )
            return ImageForm(self.run, inputs, outputs)
        taken = ", ".join(f"{s.name} {s.dtype} {list(s.shape)}" for s in inputs)
        raise ConfigError(
            f"--task {task} takes a graph of token ids (input_ids, with its tokenizer.json) or "
            f"of images [N, 3, H, W] for classify; {name} takes {taken}: export it with "
            "--task raw"
        )

    def _quantized(self, fp32_graph: Path, fp32: Candidate, mode: QuantMode) -> Candidate:
        """The ``mode`` variant of ``fp32_graph`` (int8 ones with their share of int8 MACs;
        a dynamic one that leaves most of them in fp32 is ``MIXED``, not int8)."""
        run = self.run
        quant = run.quant if mode == run.quant.mode else replace(run.quant, mode=mode)
        tried = mode != run.quant.mode  # static beside a dynamic that quantized little
        name = {"fp16": "fp16", "int8": "int8"}.get(mode, "int8-static" if tried else "int8")
        graph = run.work / f"{name}.onnx"
        info: dict[str, Any] = {"mode": quant.mode}
        if quant.mode == "fp16":
            quantize.convert_fp16(fp32_graph, graph)
        elif quant.mode == "int8":
            quantize.quantize_dynamic_any(fp32_graph, graph, quant)
            info.update(mode="int8-dynamic", per_channel=quant.per_channel)
        else:
            upgraded = run.work / "fp32-qdq-opset.onnx"
            old = user_graph.upgrade_opset(fp32_graph, upgraded)
            if old is not None:
                fp32_graph = upgraded
                info["upgraded_from_opset"] = old
                run.report.warnings.append(
                    f"opset {old} upgraded to {user_graph.QDQ_MIN_OPSET} before static int8 "
                    "(QDQ needs it); the fp32 variant keeps the original opset"
                )
            feeds = self.form.calibration_feeds(fp32_graph, run.stage_candidate(fp32))
            quant = replace(quant, calibration_size=len(feeds))
            if not tried:
                run.calibrated(len(feeds))
            result = quantize.quantize_static_cnn(fp32_graph, graph, quant, feeds=feeds)
            info.update(quantize.static_info(quant, result))
        if mode == "fp16":
            return self.candidate(name, graph, name, requested=True, quantization=info)
        share = macs.mac_share(graph)
        info.update(share.to_dict())
        precision = "int8" if share.share >= MIN_INT8_SHARE or mode != "int8" else MIXED
        if precision == MIXED:
            run.report.warnings.append(
                f"dynamic int8 quantized {share.share:.2%} of the multiply-accumulates (its "
                "convolutions stay fp32): labelled mixed, not int8"
                + ("; int8-static tried beside it" if self._can_calibrate()
                   else "; pass --quantize int8-static to quantize them on calibration data")
            )  # fmt: skip
        return self.candidate(name, graph, precision, requested=True, quantization=info)

    def graph_files(self, name: str, graph: Path) -> dict[str, Path]:
        """The graph and its external data files (a user's graph may keep its weights beside
        it), those as copies: staging hard-links a candidate's files, and onnx refuses to load
        external data with more than one link."""
        files = super().graph_files(name, graph)
        for location in package.external_data_files(graph):
            if Path(location).name != location:
                raise ConfigError(
                    f"{graph.name} keeps weights in {location}, not beside it: save it with "
                    "its external data in the graph's own folder"
                )
            copy = self.run.work / "external" / name / location
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(graph.parent / location, copy)
            files[location] = copy
        return files

    def graph_io(self, graph: Path) -> PackageIO:
        return self.form.io(graph)

    def _evaluate(self, candidate: Candidate) -> Any:
        with load_candidate(self.run.stage_candidate(candidate), self.run.threads) as model:
            return self.form.evaluate(model)

    def _measure(self, candidate: Candidate) -> Verdict:
        accuracy, details, where = self.form.score(self.reference, self._evaluate(candidate))
        value = accuracy.summary(self.run.max_accuracy_loss)
        self.run.measured(
            candidate, accuracy, f"{candidate.name} {value} vs the fp32 ONNX on {where}", **details
        )
        return accuracy

    def prefer(self, passing: list[Candidate]) -> Candidate:
        """The fastest passing variant: the first, unless a later one runs faster with
        confidence (timed in interleaved pairs on this machine)."""
        best = passing[0]
        for other in passing[1:]:
            best_probe, other_probe = self.probe(best), self.probe(other)
            if best_probe is None or other_probe is None:
                break
            measured = speed.compare(best_probe, other_probe)
            faster = measured.low > 1.0
            self.run.report.warnings.append(
                f"{best.name} and {other.name} both pass: {other.name} runs "
                f"{measured.ratio:.2f}x {best.name}'s speed; shipped "
                f"{other.name if faster else best.name}"
            )
            best = other if faster else best
        return best

    def probe(self, candidate: Candidate) -> Callable[[], object] | None:
        if not self.run.options.target.startswith("cpu-"):
            return None  # an accelerator's speed is not this machine's
        model = load_candidate(self.run.stage_candidate(candidate), self.run.threads)
        return self.form.probe(model)

    def slower_hint(self, candidate: Candidate) -> str:
        if self.run.quant.mode == "int8" and isinstance(self.form, ImageForm):
            return "; try --quantize int8-static"
        return ""

    def accuracy(self, chosen: Candidate) -> dict[str, Any]:
        variants = self.run.report.variants
        return {
            "metric": chosen.measured.metric,
            "reference": "onnx-fp32",
            "eval_data": self.form.eval_name,
            "max_accuracy_loss": self.run.max_accuracy_loss,
            "fp32": variants.get("fp32", {}).get("accuracy"),  # None: the graph was quantized
            "value": variants[chosen.name]["accuracy"],
        }

    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        return self.form.smoke_inputs()
