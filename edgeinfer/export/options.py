"""What ``edgeinfer export`` is asked to do: the options every builder shares, and each
builder's own typed options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from edgeinfer.config import QUANT_MODES, CalibrationMethod, QuantMode
from edgeinfer.errors import ConfigError
from edgeinfer.export.gates.declared import parse_declared

__all__ = [
    "BuilderOptions",
    "DecoderOptions",
    "EarlyExitOptions",
    "ExportOptions",
    "OnnxFileOptions",
    "ShrinkOptions",
]

TASKS = ("auto", "embed", "classify", "generate", "raw", "detect", "segment")


@dataclass(frozen=True)
class EarlyExitOptions:
    """A classifier that stops at the first confident exit head (docs/early_exit.md).

    Args:
        exit_every: a head after every K-th layer (text encoders; the CNN has one per block);
            None takes the recipe's (2 without one).
        train_data: labelled data the heads train on (``bbc-news``, ``mnist``); None takes
            the recipe's.
        limit: items per split at most (quick builds in tests); None uses every one.
    """

    exit_every: int | None = None
    train_data: str | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.exit_every is not None and self.exit_every < 1:
            raise ConfigError(f"exit_every must be >= 1, got {self.exit_every}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")


@dataclass(frozen=True)
class DecoderOptions:
    """Generation exports.

    Args:
        variants: the quantized variants to try (default: all of the decoder builder's);
            the fastest that passes the gate ships.
        context_length: KV positions the package allocates at most (default: the model's
            window, capped at 2048 for small devices).
        kv_dtype: the KV cache's element type: "float32", or "float16" (attention in float16,
            half the cache's memory; long contexts on small devices).
    """

    variants: tuple[str, ...] | None = None
    context_length: int | None = None
    kv_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.variants is not None and not self.variants:
            raise ConfigError("variants must name at least one variant, or be None")
        if self.context_length is not None and self.context_length < 2:
            raise ConfigError(f"context_length must be >= 2, got {self.context_length}")
        if self.kv_dtype not in ("float32", "float16"):
            raise ConfigError(f"kv_dtype must be float32 or float16, got {self.kv_dtype!r}")


@dataclass(frozen=True)
class ShrinkOptions:
    """Smaller, faster students of a text encoder, each a candidate of the export
    (docs/shrink.md): fewer layers (distillation), fewer heads and FFN neurons (pruning),
    trained to reproduce the source model, then converted, quantized and gated against the
    source model in fp32 like any variant.

    Args:
        layers: the student depths to build (one student each, e.g. ``(3, 4)``); empty keeps
            the source's depth (pruning alone).
        prune_heads: the share of every layer's attention heads removed (0: none).
        prune_ffn: the share of every layer's FFN neurons removed (0: none).
        train_data: unlabeled text the students train on (``.txt`` lines, ``.jsonl`` with
            ``text``); None: the built-in mix of BBC News (its calibration side) and dialogue,
            never the gate's text nor the held-out technical domain (``data/domains.py``).
        train_count: texts taken from it at most (3,000: an epoch of a 4-layer MiniLM
            student takes about a minute on two cores at 128 tokens).
        epochs: passes over the training text.
        seq_len: tokens per training text at most; None: the model's window (what the
            package serves).
        seed: seeds the batch order and every random choice of the training.
    """

    layers: tuple[int, ...] = ()
    prune_heads: float = 0.0
    prune_ffn: float = 0.0
    train_data: Path | None = None
    train_count: int = 3000
    epochs: int = 3
    seq_len: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.layers and not self.prune_heads and not self.prune_ffn:
            raise ConfigError("shrinking needs --distill-layers, --prune-heads or --prune-ffn")
        if any(n < 1 for n in self.layers) or len(set(self.layers)) != len(self.layers):
            raise ConfigError(f"layers must be distinct counts >= 1, got {self.layers}")
        for name in ("prune_heads", "prune_ffn"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("train_count", "epochs", "seq_len"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


# The keys of a recipe's [onnx.image] table (export/vision/preprocessing.py); ``size`` (WxH)
# fixes a graph's dynamic input, ``fill`` is a letterbox's border value (detect, segment).
_IMAGE_KEYS = (
    "color", "mean", "std", "resize", "shorter_side", "interpolation", "pad", "size", "fill",
)  # fmt: skip
# ``--nms KEY=VALUE`` of a detector: the ImageDetectorIO field each key sets.
NMS_KEYS = {
    "score": "score_threshold", "iou": "iou_threshold", "max": "max_detections",
    "agnostic": "agnostic",
}  # fmt: skip


@dataclass(frozen=True)
class OnnxFileOptions:
    """Exports of an ONNX file (docs/onnx.md).

    Args:
        labels: a text file with one class name per line, in output order (classifiers);
            None: the folder's ``labels.txt``, its config's ``id2label``, else ``LABEL_i``.
        state: ``INPUT=OUTPUT`` pairs of a stateful graph (raw); empty: found by name
            (``state`` -> ``stateN``, ``past*`` -> ``present*``, ``h0`` -> ``hn``).
        metrics: ``OUTPUT=METRIC`` gate metrics of a raw graph's outputs (``export/gates``;
            ``sequence:BLANK`` names the CTC blank); empty: chosen from the outputs.
        image: ``KEY=VALUE`` preprocessing of an image graph (``--preprocess``), over the
            recipe's ``[onnx.image]`` or the default (``color``, ``mean``/``std`` as
            comma-separated 0-255 values, ``resize``, ``shorter_side``, ``interpolation``,
            ``pad``, ``fill``, ``size`` WxH for a graph of any size; docs/onnx.md).
        nms: ``KEY=VALUE`` non-maximum suppression of a detector (``score``, ``iou``, ``max``,
            ``agnostic``); empty: ultralytics' defaults (0.25, 0.45, 300, class-aware).
    """

    labels: Path | None = None
    state: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    image: tuple[str, ...] = ()
    nms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for item in self.state:
            if item.count("=") != 1 or item.startswith("=") or item.endswith("="):
                raise ConfigError(f"state {item!r} must be INPUT=OUTPUT")
        parse_declared(self.metrics)
        self.image_table()
        self.nms_table()

    def image_table(self) -> dict[str, Any]:
        """``image`` as a recipe's ``[onnx.image]`` table."""
        table: dict[str, Any] = {}
        for item in self.image:
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in _IMAGE_KEYS or not value.strip():
                raise ConfigError(
                    f"--preprocess {item!r} must be KEY=VALUE with KEY one of "
                    f"{', '.join(_IMAGE_KEYS)}"
                )
            try:
                if key in ("mean", "std"):
                    table[key] = [float(v) for v in value.split(",")]
                elif key == "shorter_side":
                    table[key] = int(value)
                elif key == "size":
                    table[key] = _size(value)
                elif key == "fill":
                    table[key] = _bounded(int(value), 0, 255, item)
                else:
                    table[key] = value.strip()
            except ValueError as exc:
                raise ConfigError(f"--preprocess {item!r}: {exc}") from exc
        return table

    def nms_table(self) -> dict[str, Any]:
        """``nms`` as ``ImageDetectorIO`` fields."""
        table: dict[str, Any] = {}
        for item in self.nms:
            key, _, value = item.partition("=")
            field_name = NMS_KEYS.get(key.strip())
            if field_name is None or not value.strip():
                raise ConfigError(
                    f"--nms {item!r} must be KEY=VALUE with KEY one of {', '.join(NMS_KEYS)}"
                )
            try:
                if key == "agnostic":
                    if value.strip().lower() not in ("true", "false", "1", "0"):
                        raise ValueError("agnostic is true or false")
                    table[field_name] = value.strip().lower() in ("true", "1")
                elif key == "max":
                    table[field_name] = _bounded(int(value), 1, 100_000, item)
                else:
                    table[field_name] = _bounded(float(value), 0.0, 1.0, item)
            except ValueError as exc:
                raise ConfigError(f"--nms {item!r}: {exc}") from exc
        return table


def _size(value: str) -> list[int]:
    """``WxH`` as [height, width]."""
    width, sep, height = value.strip().lower().partition("x")
    if not sep:
        raise ValueError("size is WIDTHxHEIGHT, e.g. size=640x640")
    dims = [_bounded(int(height), 1, 8192, value), _bounded(int(width), 1, 8192, value)]
    return dims


def _bounded(value: Any, low: Any, high: Any, item: str) -> Any:
    """``value`` when ``low <= value <= high`` (NaN never is), else ``ValueError``."""
    if not low <= value <= high:
        raise ValueError(f"{value} is outside [{low}, {high}]")
    return value


BuilderOptions = Union[EarlyExitOptions, DecoderOptions, OnnxFileOptions, ShrinkOptions]  # noqa: UP007


@dataclass(frozen=True)
class ExportOptions:
    """What ``edgeinfer export`` is asked to do (the CLI's flags, validated).

    ``None`` means "the builtin recipe's default, else the target's". ``max_accuracy_loss`` is a
    fraction: for embeddings the mean cosine to PyTorch fp32 must stay >= 1 - loss (and the
    minimum >= 1 - 3 x loss); for classifiers the label agreement >= 1 - loss.

    Args:
        builder: the chosen builder's own options (``EarlyExitOptions`` turns a classifier into
            exit segments; ``DecoderOptions`` for generation; ``ShrinkOptions`` adds distilled
            or pruned students of a text encoder).
        min_ep_coverage: the target's first provider must take at least this fraction of the
            estimated FLOPs on this machine (docs/providers.md); None skips the check.
    """

    source: str
    out: Path
    task: str = "auto"
    target: str = "cpu-avx2"
    quantize: QuantMode | None = None
    calibration: Path | None = None
    calibration_method: CalibrationMethod | None = None
    eval_data: Path | None = None
    max_accuracy_loss: float | None = None
    keep_best: bool = False
    force_quantize: bool = False
    overwrite: bool = False
    threads: int | None = None
    held_count: int = 200
    min_ep_coverage: float | None = None
    builder: BuilderOptions | None = None

    def __post_init__(self) -> None:
        loss = self.max_accuracy_loss
        if loss is not None and not 0.0 <= loss < 1.0:
            raise ConfigError(f"max_accuracy_loss must be in [0, 1), got {loss}")
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}: use {', '.join(TASKS)}")
        if self.quantize is not None and self.quantize not in QUANT_MODES:
            raise ConfigError(f"unknown quantization {self.quantize!r}: use {QUANT_MODES}")
        if self.min_ep_coverage is not None and not 0.0 <= self.min_ep_coverage <= 1.0:
            raise ConfigError(f"min_ep_coverage must be in [0, 1], got {self.min_ep_coverage}")
        if self.held_count < 1:
            raise ConfigError(f"held_count must be >= 1, got {self.held_count}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
