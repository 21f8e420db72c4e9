"""The typed ``io`` of a package: one frozen dataclass per package kind (``io.kind``).

The runtime picks the class that serves a package from ``io.kind`` alone; it never looks at
which keys happen to exist. Each kind lists exactly the fields its runtime reads, so a manifest
is validated once, when it is read, and a missing or misspelt field is a ``ManifestError`` that
names it instead of a ``KeyError`` deep inside a request.

Kinds::

    text-encoder      one graph + tokenizer -> pooled, optionally normalized vectors
    text-classifier   one graph + tokenizer -> labels with probabilities
    exit-segments     one graph per block of layers with exit heads (texts or images)
    image-classifier  one graph, pixels in -> labels with probabilities
    image-detector    one YOLO-style graph, pixels in -> boxes, labels, scores (NMS on device)
    image-segmenter   one graph, pixels in -> masks: YOLO-seg instances or per-pixel classes
    decoder           one decoder graph with past/present KV + tokenizer -> generated text
    raw               any graph: named tensors in and out, state carried per stream
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from edgeinfer.errors import ManifestError

__all__ = [
    "IO_KINDS",
    "DecoderIO",
    "ExitSegmentsIO",
    "ImageClassifierIO",
    "ImageDetectorIO",
    "ImageSegmenterIO",
    "ImageSpec",
    "PackageIO",
    "RawIO",
    "Scores",
    "StateSpec",
    "TensorSpec",
    "TextClassifierIO",
    "TextEncoderIO",
    "io_from_dict",
    "io_to_dict",
]

# What a classifier graph's first output holds: "logits" (softmaxed on the device) or
# "probabilities" (the graph ends in a softmax: reported as they are, never softmaxed again).
Scores = Literal["logits", "probabilities"]


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: its name, element type and shape (symbolic dims by name)."""

    name: str
    dtype: str
    shape: tuple[str | int, ...]


@dataclass(frozen=True)
class ImageSpec:
    """How a picture becomes the graph's input.

    First its size: ``resize`` "crop" cuts the largest center region of the graph's aspect
    ratio and scales it to ``height`` x ``width``; "stretch" scales the whole picture to that
    size; "letterbox" scales it to fit and pads the rest with gray (114, as YOLO trains),
    the picture centred (``pad`` "center", ultralytics) or in the top-left corner ("top-left",
    YOLOX);
    "shorter-side" scales it so that its shorter side is ``shorter_side`` pixels, then cuts
    the center ``height`` x ``width``. ``interpolation`` names the filter. Then its
    values: channels in ``color`` order (callers pass RGB; "BGR" graphs get them reversed),
    each ``(pixel - mean) / std`` on 0-255 values, in the graph's channel order.
    """

    height: int
    width: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    layout: Literal["NCHW"] = "NCHW"
    color: Literal["RGB", "BGR"] = "RGB"
    resize: Literal["crop", "stretch", "shorter-side", "letterbox"] = "crop"
    shorter_side: int | None = None
    interpolation: Literal["bilinear", "bicubic", "lanczos"] = "bilinear"
    pad: Literal["center", "top-left"] = "center"
    fill: int = 114  # ultralytics' letterbox gray


@dataclass(frozen=True)
class TextEncoderIO:
    """Texts -> vectors: ``pooling`` over the graph's token states [B, S, D] (mean over real
    tokens, or the first token's), or "none" for a graph that returns vectors [B, D]; then
    L2 ``normalize``."""

    kind: ClassVar[str] = "text-encoder"
    graph: str
    tokenizer: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_seq_len: int
    embedding_dim: int
    pooling: Literal["mean", "cls", "none"] = "mean"
    normalize: bool = True


@dataclass(frozen=True)
class TextClassifierIO:
    """Texts -> ``labels`` (the graph's logits in label order; ``scores``: what they are)."""

    kind: ClassVar[str] = "text-classifier"
    graph: str
    tokenizer: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_seq_len: int
    labels: tuple[str, ...]
    scores: Scores = "logits"


@dataclass(frozen=True)
class ExitSegmentsIO:
    """A classifier cut into ``graphs`` (one per block of layers, in order), each returning its
    exit head's logits; the manifest's ``early_exit`` field holds the exit rule. ``input`` says
    what segment 0 takes: token ids (with ``tokenizer`` and ``max_seq_len``) or float images of
    ``image_shape`` [C, H, W] with intensities in ``pixel_range``."""

    kind: ClassVar[str] = "exit-segments"
    graphs: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...]
    input: Literal["text", "image"]
    tokenizer: str | None = None
    max_seq_len: int | None = None
    image_shape: tuple[int, ...] | None = None
    pixel_range: tuple[float, float] | None = None

    @property
    def graph(self) -> str:
        """The first segment (what takes the input)."""
        return self.graphs[0]


@dataclass(frozen=True)
class ImageClassifierIO:
    """Images -> ``labels``; ``image`` says how pixels become the graph's input, ``scores``
    what the graph's first output holds."""

    kind: ClassVar[str] = "image-classifier"
    graph: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...]
    image: ImageSpec
    scores: Scores = "logits"


@dataclass(frozen=True)
class ImageDetectorIO:
    """Images -> detections: the graph's first output is YOLO-style, ``layout``
    "attributes-first" [1, 4+C, N], "anchors-first" [1, N, 4+1+C] or "yolox" (the same, boxes
    relative to their grid cells: ``runtime/detect.py``);
    ``image`` says how pixels become its input ("letterbox" or "stretch"); NMS keeps
    detections of ``score_threshold`` or more, overlapping by at most ``iou_threshold`` per
    label (across labels when ``agnostic``), ``max_detections`` per image. The defaults are
    ultralytics' (``predict``: conf 0.25, iou 0.45 in its ONNX examples, max_det 300,
    class-aware)."""

    kind: ClassVar[str] = "image-detector"
    graph: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...]
    image: ImageSpec
    layout: Literal["attributes-first", "anchors-first", "yolox"]
    score_threshold: float = 0.25  # ultralytics' default
    iou_threshold: float = 0.45  # ultralytics' default
    max_detections: int = 300  # ultralytics' default
    agnostic: bool = False  # ultralytics' default: class-aware


@dataclass(frozen=True)
class ImageSegmenterIO:
    """Images -> masks in the picture's pixels. ``mode`` "instances": a YOLO-seg graph whose
    first output is a YOLO head (``layout``) with ``coefficients`` mask rows after the class
    scores and whose ``prototypes`` output [1, K, h, w] they weigh; boxes, labels and scores
    after NMS (as ``ImageDetectorIO``), each with its mask (sigmoid >= ``mask_threshold``,
    cropped to its box). "semantic": the first output scores every pixel [1, C, h, w]; each
    label present is one mask (the pixels whose best class it is)."""

    kind: ClassVar[str] = "image-segmenter"
    graph: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    labels: tuple[str, ...]
    image: ImageSpec
    mode: Literal["instances", "semantic"]
    layout: Literal["attributes-first", "anchors-first"] | None = None
    coefficients: int = 0
    prototypes: str | None = None
    score_threshold: float = 0.25  # ultralytics' default
    iou_threshold: float = 0.45  # ultralytics' default
    max_detections: int = 300  # ultralytics' default
    agnostic: bool = False  # ultralytics' default: class-aware
    mask_threshold: float = 0.5  # ultralytics' (sigmoid of the mask logit)


@dataclass(frozen=True)
class DecoderIO:
    """A decoder graph whose past and present KV are bound to one preallocated buffer
    (``kv_layout`` "shared-buffer"), with its tokenizer, stop tokens and chat template."""

    kind: ClassVar[str] = "decoder"
    graph: str
    tokenizer: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_seq_len: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    source_context_length: int
    kv_layout: str
    past_names: tuple[tuple[str, str], ...]
    present_names: tuple[tuple[str, str], ...]
    stop_token_ids: tuple[int, ...]
    chat_format: dict[str, Any] | None = None
    chat_template: str | None = None
    add_bos_token: bool = False  # a plain-text prompt starts with the BOS token
    kv_dtype: str = "float32"  # the past/present element type: float32 or float16
    # The int64 input that picks the positions whose logits the graph computes (prefill: the
    # last; verification: every drafted one); None: logits for every position.
    logits_input: str | None = None
    # The int64 output [B, R] with the argmax of each computed logits row (greedy decoding
    # reads one integer per token instead of 49k floats); None: the graph has none.
    argmax_output: str | None = None
    # The int64 input [1] that turns attention's extra row off (0) for batched one-token steps
    # of several sequences; None: a graph that decodes one sequence at a time.
    extra_row_input: str | None = None
    # A SentencePiece model giving the same ids as ``tokenizer`` (a few MB where a large
    # vocabulary's tokenizer.json costs hundreds); None: tokenizer.json only.
    light_tokenizer: str | None = None


@dataclass(frozen=True)
class StateSpec:
    """A state a stateful graph reads from ``input`` and returns updated as ``output``; it
    starts as zeros of ``dtype`` and ``shape`` (measured at export) on every new stream."""

    input: str
    output: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class RawIO:
    """Any graph: named tensors in, named tensors out. For a stateful graph (a voice-activity
    detector, a streaming recognizer) ``state`` pairs its state inputs with the outputs that
    update them; the runtime carries them from one call to the next of the same stream."""

    kind: ClassVar[str] = "raw"
    graph: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    state: tuple[StateSpec, ...] = ()


PackageIO = Union[  # noqa: UP007  # a runtime value (typing.get_args), not only an annotation
    TextEncoderIO,
    TextClassifierIO,
    ExitSegmentsIO,
    ImageClassifierIO,
    ImageDetectorIO,
    ImageSegmenterIO,
    DecoderIO,
    RawIO,
]
IO_KINDS: dict[str, type[Any]] = {cls.kind: cls for cls in get_args(PackageIO)}


def io_to_dict(io: PackageIO) -> dict[str, Any]:
    """The JSON form of ``io``: its fields plus ``kind`` (tuples as lists)."""
    return {"kind": io.kind, **_json(dataclasses.asdict(io))}


def _json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def io_from_dict(data: Any) -> PackageIO:
    """Parse and validate the manifest's ``io`` object (``ManifestError`` names what is wrong)."""
    if not isinstance(data, dict):
        raise ManifestError("manifest io must be an object")
    kind = data.get("kind")
    cls = IO_KINDS.get(str(kind))
    if cls is None:
        raise ManifestError(
            f"manifest io.kind {kind!r} is not one this edgeinfer serves "
            f"({', '.join(IO_KINDS)}); upgrade edgeinfer or re-export the package"
        )
    fields = {k: v for k, v in data.items() if k != "kind"}
    parsed: PackageIO = _build(cls, fields, f"io ({kind})")
    return parsed


def _build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    """An instance of dataclass ``cls`` from ``data``, every field checked against its type."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ManifestError(f"manifest {where} has unknown fields {unknown}; re-export it")
    values = {}
    for name, field in fields.items():
        if name in data:
            values[name] = _value(hints[name], data[name], f"{where}.{name}")
        elif field.default is dataclasses.MISSING:
            raise ManifestError(f"manifest {where} lacks the field {name!r}; re-export it")
    return cls(**values)


def _value(hint: Any, value: Any, where: str) -> Any:
    """``value`` checked against the annotation ``hint`` (lists become tuples)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        for option in args:
            try:
                return _value(option, value, where)
            except ManifestError:
                continue
        raise ManifestError(f"manifest {where} = {value!r} has the wrong type")
    if origin is Literal:
        if value not in args:
            raise ManifestError(f"manifest {where} = {value!r} is not one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ManifestError(f"manifest {where} must be a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ManifestError(f"manifest {where} must have {len(args)} items")
        return tuple(
            _value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if origin is dict:
        if not isinstance(value, dict):
            raise ManifestError(f"manifest {where} must be an object")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ManifestError(f"manifest {where} must be an object")
        return _build(hint, value, where)  # type: ignore[arg-type]  # a dataclass type
    if hint is type(None):
        if value is not None:
            raise ManifestError(f"manifest {where} must be null")
        return None
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any or (isinstance(value, hint) and not (hint is int and isinstance(value, bool))):
        return value
    raise ManifestError(f"manifest {where} must be {getattr(hint, '__name__', hint)}")
