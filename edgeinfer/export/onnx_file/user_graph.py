"""A user's ONNX graph: checked, described (inputs, outputs, what it takes, its state) and
optimized for any CPU before it is quantized.

The checks run before anything else, so a damaged or unsupported file is refused with a clear
message (exit 2) instead of failing half-way: ``onnx.checker`` (full), strict shape inference,
and an onnxruntime session (the runtime that will serve it must load it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from edgeinfer.errors import ConfigError, ConversionError
from edgeinfer.export.passes import ort_compat
from edgeinfer.package_io import TensorSpec

__all__ = [
    "InputForm",
    "check",
    "ends_in_softmax",
    "fix_input",
    "input_form",
    "metadata",
    "optimize",
    "state_pairs",
    "upgrade_opset",
]

log = logging.getLogger(__name__)

InputForm = Literal["image", "text", "tensor"]
# QDQ needs DequantizeLinear's per-channel ``axis`` (opset 13); older graphs are converted first.
QDQ_MIN_OPSET = 13
# Output names that carry an input's state to the next call: input name -> candidates.
_STATE_SUFFIXES = ("N", "n", "_out", "_new", ".out", "_next", "out")


def check(graph: Path) -> None:
    """Refuse a graph that ``onnx.checker``, shape inference or onnxruntime rejects."""
    import onnx
    import onnxruntime

    name = graph.name
    try:
        model = onnx.load(str(graph))
    except Exception as exc:  # protobuf raises DecodeError and others
        raise ConfigError(f"{name} is not an ONNX model: {type(exc).__name__}: {exc}") from exc
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ConfigError(f"{name} fails onnx.checker: {str(exc).strip()[:500]}") from exc
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        raise ConfigError(f"{name} fails ONNX shape inference: {str(exc).strip()[:500]}") from exc
    try:
        onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own pybind classes
        raise ConfigError(
            f"onnxruntime {onnxruntime.__version__} cannot load {name}: {str(exc)[:500]}"
        ) from exc


def metadata(graph: Path) -> dict[str, str]:
    """The graph's ``metadata_props`` (key -> value)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


# Nodes that pass their input's values through unchanged (a softmax before them still holds).
_PASS_THROUGH = ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast")


def ends_in_softmax(graph: Path) -> bool:
    """Whether the graph's first output is a ``Softmax`` (through reshapes): probabilities,
    which a classifier reports as they are."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    producers = {out: node for node in model.graph.node for out in node.output}
    node = producers.get(model.graph.output[0].name)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producers.get(node.input[0])
    return node is not None and node.op_type == "Softmax"


def input_form(inputs: Sequence[TensorSpec], state: Sequence[str] = ()) -> InputForm:
    """What the graph takes: ``image`` (one float [N, 3, H, W] input), ``text`` (token ids
    named ``input_ids``) or any other ``tensor``."""
    fed = [spec for spec in inputs if spec.name not in state]
    names = {spec.name: spec for spec in fed}
    ids = names.get("input_ids")
    if ids is not None and ids.dtype in ("int64", "int32"):
        return "text"
    if len(fed) == 1 and fed[0].dtype == "float32" and len(fed[0].shape) == 4:
        if fed[0].shape[1] == 3:
            return "image"
    return "tensor"


def state_pairs(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], given: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """The (state input, state output) pairs: ``given`` as ``IN=OUT``; else found by name (an
    output named like the input plus ``N``/``_out``/..., ``past*`` -> ``present*``,
    ``h0`` -> ``hn``) with the same element type and rank."""
    ins = {spec.name: spec for spec in inputs}
    outs = {spec.name: spec for spec in outputs}
    if given:
        pairs = []
        for item in given:
            name_in, sep, name_out = item.partition("=")
            if not sep or name_in not in ins or name_out not in outs:
                raise ConfigError(
                    f"state {item!r} must be INPUT=OUTPUT with names of the graph: inputs "
                    f"{sorted(ins)}, outputs {sorted(outs)}"
                )
            pairs.append((name_in, name_out))
        return pairs
    pairs = []
    for name, spec in ins.items():
        candidates = [name + suffix for suffix in _STATE_SUFFIXES]
        if name.startswith("past"):
            candidates.append("present" + name[4:])
        if name.endswith("0"):
            candidates.append(name[:-1] + "n")
        for candidate in candidates:
            out = outs.get(candidate)
            if out is not None and out.dtype == spec.dtype and len(out.shape) == len(spec.shape):
                pairs.append((name, candidate))
                break
    return pairs


def optimize(graph: Path, out: Path) -> None:
    """onnxruntime's hardware-independent optimizations (constant folding, redundant nodes,
    fusions every CPU runs) and shape inference: ``ort_compat.preprocess``."""
    ort_compat.preprocess_any(graph, out)


def fix_input(graph: Path, out: Path, *, name: str, shape: tuple[int, ...]) -> None:
    """Write ``graph`` with input ``name`` fixed to ``shape`` (its symbolic dims replaced) and
    every output's dims resolved: ONNX shape inference, then onnxruntime's symbolic shape
    inference for what that leaves (a YOLO head's anchors follow the input's size)."""
    import onnx
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_input_shape_fixed

    model = onnx.load(str(graph))
    make_input_shape_fixed(model.graph, name, list(shape))
    model = onnx.shape_inference.infer_shapes(model)
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        model = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception as exc:  # its own errors on ops it does not know: ONNX's shapes stay
        log.info("symbolic shape inference of %s failed: %s", graph.name, exc)
    fix_output_shapes(model)
    onnx.save(model, str(out))


def upgrade_opset(graph: Path, out: Path) -> int | None:
    """Write ``graph`` converted to opset ``QDQ_MIN_OPSET`` (``onnx.version_converter``) to
    ``out`` when its opset is older; returns the old opset, None when it needs no upgrade."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(graph))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= QDQ_MIN_OPSET:
        return None
    try:
        upgraded = version_converter.convert_version(model, QDQ_MIN_OPSET)
        onnx.checker.check_model(upgraded)
    except Exception as exc:  # the converter raises RuntimeError and its own errors
        raise ConversionError(
            f"{graph.name} is opset {opset}; static int8 (QDQ) needs opset {QDQ_MIN_OPSET} and "
            f"onnx.version_converter could not convert it ({str(exc)[:300]}): re-export it at "
            f"opset {QDQ_MIN_OPSET} or later, or use --quantize int8 (dynamic)"
        ) from exc
    onnx.save(upgraded, str(out))
    log.info("%s upgraded from opset %d to %d for QDQ", graph.name, opset, QDQ_MIN_OPSET)
    return int(opset)
