"""What the bridge serves: the kind each model of the table (``bridge/models.py``) takes,
per-device stream state for stateful models, and running one request on one model.

Models are duck-typed (``edgeinfer.Model`` fits): ``task`` and ``manifest`` always; then
``embed_with_info``/``classify`` (text), ``classify`` on uint8 images (image classifiers),
``detect`` on frames at their own size (detectors), ``segment`` likewise (segmenters: masks
as run-length counts),
``run(feeds, *, stream=None)`` (tensor: ``raw`` packages) or ``stream(prompt, ...)``
(generate, see ``generation.py``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.bridge.models import ServedModel
from edgeinfer.bridge.wire import arrays, kinds
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.frames import frames_to_batch, frames_to_pictures
from edgeinfer.errors import InputError
from edgeinfer.package_io import ImageClassifierIO

__all__ = ["Outcome", "StreamTable", "kind_of", "run_deadline_s", "run_request"]


# A package's io.kind -> the request kind it takes (text for the text kinds).
_REQUEST_KINDS = {
    "decoder": "generate",
    "raw": "tensor",
    "image-classifier": "image",
    "image-detector": "image",
    "image-segmenter": "image",
}


def kind_of(model: ServedModel) -> str:
    """The request kind a model takes: generate, tensor, image or text (from ``io.kind``)."""
    if model.task == "raw":
        return "tensor"
    return _REQUEST_KINDS.get(model.manifest.io.kind, "text")


def _image_spec(manifest: Any) -> Any:
    return manifest.io_as(ImageClassifierIO).image


@dataclass
class _Stream:
    model: Any
    last_s: float


@dataclass
class StreamTable:
    """Which device streams of stateful models are alive: at most ``max_streams`` per bridge,
    each forgotten after ``idle_s`` without a request. A forgotten stream's state is dropped
    by the model (``end_stream``), and its next request starts afresh (``"new": true``)."""

    max_streams: int = 256
    idle_s: float = 300.0
    clock_s: Callable[[], float] = time.monotonic
    _live: OrderedDict[tuple[str, str], _Stream] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def touch(self, name: str, model: Any, stream: str) -> bool:
        """Mark ``stream`` of ``name`` used now; True when it starts (or restarts) here."""
        now = self.clock_s()
        ended: list[tuple[Any, str]] = []
        with self._lock:
            for key, live in list(self._live.items()):  # oldest first: stop at a live one
                if now - live.last_s < self.idle_s:
                    break
                ended.append((live.model, key[1]))
                del self._live[key]
            entry = self._live.pop((name, stream)) if (name, stream) in self._live else None
            new = entry is None or entry.model is not model
            if entry is not None and new:  # the model was swapped: the old state is gone
                ended.append((entry.model, stream))
            self._live[(name, stream)] = _Stream(model, now)
            while len(self._live) > self.max_streams:
                (_, old), dropped = self._live.popitem(last=False)
                ended.append((dropped.model, old))
        for owner, old in ended:
            end = getattr(owner, "end_stream", None)
            if callable(end):
                end(old)
        return new

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)


@dataclass(frozen=True)
class Outcome:
    """A request's answer: the result body and the reply fields that depend on the kind."""

    body: proto.Body
    cached: bool = False
    exit_layer: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def _vectors(rows: list[np.ndarray], encoding: str) -> proto.Body:
    def encoder(fmt: str) -> bytes:
        if fmt == "json":
            return arrays.vectors_json(rows, encoding=encoding)
        value = arrays.vectors_value(rows, encoding=encoding)
        return proto.packb(value, single_float=True)

    return proto.Body(encoder=encoder)


def _labels(results: list[Any]) -> Outcome:
    layers = [r.exit_layer for r in results]
    items = [
        {"label": r.label, "score": r.score, "scores": r.scores, "exit_layer": layer}
        for r, layer in zip(results, layers, strict=True)
    ]
    exits = [layer for layer in layers if layer is not None]
    cached = bool(results) and all(r.cached for r in results)
    return Outcome(proto.Body(items), cached, max(exits) if exits else None)


def _detections(found: list[list[Any]]) -> list[dict[str, Any]]:
    """One item per image: its detections, best first, boxes in the frame's pixels."""
    return [
        {"detections": [{"label": d.label, "score": d.score, "box": list(d.box)} for d in image]}
        for image in found
    ]


def _segments(found: list[list[Any]]) -> list[dict[str, Any]]:
    """One item per image: its masks, best first, each as ``Segment.to_json`` (box in the
    frame's pixels, the mask as COCO run-length counts over its box from ``offset``)."""
    return [{"segments": [s.to_json() for s in image]} for image in found]


def _tensors(outputs: Mapping[str, np.ndarray]) -> proto.Body:
    def encoder(fmt: str) -> bytes:
        binary = fmt == "msgpack"
        value = {
            name: arrays.encode_array(np.asarray(a), binary=binary) for name, a in outputs.items()
        }
        return proto.Body(value).encoded(fmt)

    return proto.Body(encoder=encoder)


def run_deadline_s(deadline_ms: float | None, *, now_ms: float) -> float | None:
    """A request's deadline (epoch ms, compared with the worker's clock reading ``now_ms``)
    on ``time.monotonic()``'s clock, for ``runtime.watchdog.deadline``: a graph run still
    going then is stopped (``deadline_exceeded``). ``None``: the request has none."""
    if deadline_ms is None:
        return None
    return time.monotonic() + (deadline_ms - now_ms) / 1e3


def run_request(name: str, model: Any, request: proto.Request, streams: StreamTable) -> Outcome:
    """Run a text, image or tensor request on ``model`` (its kind already checked)."""
    given = request.input
    if isinstance(given, kinds.TextInput):
        if model.task == "embed":
            answers = model.embed_with_info(list(given.texts), truncate=given.truncate)
            cached = bool(answers) and all(a.cached for a in answers)
            return Outcome(_vectors([a.vector for a in answers], request.encoding), cached)
        return _labels(model.classify(list(given.texts), truncate=given.truncate))
    if isinstance(given, kinds.ImageInput) and model.manifest.io.kind == "image-detector":
        return Outcome(proto.Body(_detections(model.detect(frames_to_pictures(given.images)))))
    if isinstance(given, kinds.ImageInput) and model.manifest.io.kind == "image-segmenter":
        return Outcome(proto.Body(_segments(model.segment(frames_to_pictures(given.images)))))
    if isinstance(given, kinds.ImageInput):
        batch = frames_to_batch(given.images, image=_image_spec(model.manifest))  # [N, H, W, 3]
        return _labels(model.classify(batch))
    if isinstance(given, kinds.TensorInput):
        extra: dict[str, Any] = {}
        if given.stream is not None:
            extra["stream"] = {"id": given.stream, "new": streams.touch(name, model, given.stream)}
        outputs = model.run(dict(given.feeds), stream=given.stream)
        if not isinstance(outputs, Mapping):
            raise InputError("the model's run() did not return named outputs")
        return Outcome(_tensors(outputs), extra=extra)
    raise InputError(f"a {request.kind!r} request is not run here")
