"""The request kinds: what each carries, parsed from a decoded object. Pure: no paho, no model.

``text`` (``text``/``texts``), ``image`` (``image``/``images``: a raw uint8 HWC wire array or an
encoded JPEG/PNG), ``tensor`` (``inputs``: named wire arrays, optional ``stream``), ``generate``
(``prompt`` or ``messages``, sampling, stops, two deadlines) and ``cancel`` (``cancel``: the id
of a generation to stop). Each parser returns its input, or a string saying what is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from edgeinfer.bridge import arrays

__all__ = [
    "KINDS",
    "MAX_IMAGES",
    "MAX_NEW_TOKENS",
    "MAX_TENSORS",
    "MAX_TEXTS",
    "CancelInput",
    "GenerateInput",
    "ImageInput",
    "TensorInput",
    "TextInput",
    "infer_kind",
    "parse_input",
]

KINDS: Final = ("text", "image", "tensor", "generate", "cancel")
# Texts per request: one request must not hold the worker for long (split bigger jobs).
MAX_TEXTS: Final = 64
# Images per request, for the same reason (a camera sends one frame at a time anyway).
MAX_IMAGES: Final = 16
MAX_TENSORS: Final = 32
# Tokens per generation: bounds how long one request holds the model.
MAX_NEW_TOKENS: Final = 4096
MAX_STOPS: Final = 8
MAX_NAME_CHARS: Final = 200
_IMAGE_FORMATS: Final = frozenset({"jpeg", "png"})
_SAMPLING_KEYS: Final = frozenset({"temperature", "top_k", "top_p", "seed"})
_FIELD_OF: Final = (
    ("text", "text"),
    ("texts", "text"),
    ("image", "image"),
    ("images", "image"),
    ("inputs", "tensor"),
    ("prompt", "generate"),
    ("messages", "generate"),
    ("cancel", "cancel"),
)


@dataclass(frozen=True)
class TextInput:
    """``texts`` for an embed or classify package; ``truncate`` cuts over-long texts."""

    texts: tuple[str, ...]
    truncate: bool = True


@dataclass(frozen=True)
class ImageInput:
    """Images as uint8 RGB [H, W, 3] arrays, or encoded (``format`` jpeg/png, ``data``)."""

    images: tuple[np.ndarray | tuple[str, bytes], ...]


@dataclass(frozen=True)
class TensorInput:
    """Named arrays for a ``raw`` package; ``stream`` keeps a stateful model's state."""

    feeds: Mapping[str, np.ndarray]
    stream: str | None = None


@dataclass(frozen=True)
class GenerateInput:
    """A prompt (text or chat messages), how to sample it and when to give up."""

    prompt: str | tuple[Mapping[str, str], ...]
    max_new_tokens: int = 128
    sampling: Mapping[str, Any] | None = None
    stop: tuple[str, ...] = ()
    first_token_timeout_ms: float | None = None


@dataclass(frozen=True)
class CancelInput:
    """Stop the generation with this id (its final message says ``cancelled``)."""

    target: str


Input = TextInput | ImageInput | TensorInput | GenerateInput | CancelInput


def infer_kind(data: Mapping[str, Any]) -> str | None:
    """The kind a request names (``kind``) or implies by its fields; ``None`` if ambiguous."""
    named = data.get("kind")
    if named is not None:
        return named if named in KINDS else None
    found = {kind for key, kind in _FIELD_OF if key in data}
    return found.pop() if len(found) == 1 else None


def parse_input(kind: str, data: Mapping[str, Any]) -> Input | str:
    """The request's input for ``kind``, or the reason it is invalid."""
    if kind == "text":
        return _text(data)
    if kind == "image":
        return _image(data)
    if kind == "tensor":
        return _tensor(data)
    if kind == "generate":
        return _generate(data)
    target = data.get("cancel")
    if not isinstance(target, str) or not 0 < len(target) <= MAX_NAME_CHARS:
        return f"'cancel' must be the id (1..{MAX_NAME_CHARS} characters) of a generation"
    return CancelInput(target)


def _one_or_many(data: Mapping[str, Any], one: str, many: str, limit: int) -> list[Any] | str:
    if (one in data) == (many in data):
        return f"give exactly one of '{one}' or '{many}' (a list)"
    items = [data[one]] if one in data else data[many]
    if not isinstance(items, list) or not items:
        return f"'{many}' must be a non-empty list"
    if len(items) > limit:
        return f"at most {limit} {many} per request, got {len(items)}"
    return items


def _text(data: Mapping[str, Any]) -> TextInput | str:
    raw = _one_or_many(data, "text", "texts", MAX_TEXTS)
    if isinstance(raw, str):
        return raw
    if not all(isinstance(t, str) and t.strip() for t in raw):
        return "every text must be a non-empty string"
    params = data.get("params", {})
    if not isinstance(params, Mapping) or not set(params) <= {"truncate"}:
        return "'params' must be an object with keys in ['truncate']"
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        return "'params.truncate' must be true or false"
    return TextInput(tuple(raw), truncate)


def _image(data: Mapping[str, Any]) -> ImageInput | str:
    raw = _one_or_many(data, "image", "images", MAX_IMAGES)
    if isinstance(raw, str):
        return raw
    images: list[np.ndarray | tuple[str, bytes]] = []
    for i, item in enumerate(raw):
        what = f"images[{i}]"
        if isinstance(item, Mapping) and "format" in item:
            fmt, blob = item.get("format"), item.get("data")
            if fmt not in _IMAGE_FORMATS or not isinstance(blob, (bytes, str)) or not blob:
                return f"{what} must be {{format: jpeg|png, data: bytes or base64}}"
            decoded = arrays.from_base64(blob) if isinstance(blob, str) else blob
            if decoded is None:
                return f"{what}.data is not valid base64"
            images.append((str(fmt), decoded))
            continue
        array = arrays.decode_array(item, what=what)
        if isinstance(array, str):
            return array
        if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
            return f"{what} must be uint8 RGB [H, W, 3], got {array.dtype} {list(array.shape)}"
        images.append(array)
    return ImageInput(tuple(images))


def _tensor(data: Mapping[str, Any]) -> TensorInput | str:
    feeds = data.get("inputs")
    if not isinstance(feeds, Mapping) or not feeds or len(feeds) > MAX_TENSORS:
        return f"'inputs' must be an object of 1..{MAX_TENSORS} named arrays"
    arrays_in: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            return "every input name must be a string of 1..200 characters"
        array = arrays.decode_array(value, what=f"inputs.{name}")
        if isinstance(array, str):
            return array
        arrays_in[name] = array
    stream = data.get("stream")
    if stream is not None and (not isinstance(stream, str) or not 0 < len(stream) <= 200):
        return "'stream' must be a string of 1..200 characters"
    return TensorInput(arrays_in, stream)


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def _generate(data: Mapping[str, Any]) -> GenerateInput | str:
    if ("prompt" in data) == ("messages" in data):
        return "give exactly one of 'prompt' (a string) or 'messages' (chat messages)"
    prompt: str | tuple[Mapping[str, str], ...]
    if "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            return "'prompt' must be a non-empty string"
        prompt = data["prompt"]
    else:
        messages = data["messages"]
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, Mapping)
                and set(m) == {"role", "content"}
                and all(isinstance(v, str) for v in m.values())
                for m in messages
            )
        ):
            return "'messages' must be a non-empty list of {role, content} strings"
        prompt = tuple(dict(m) for m in messages)
    max_new = data.get("max_new_tokens", 128)
    if isinstance(max_new, bool) or not isinstance(max_new, int):
        return f"'max_new_tokens' must be an integer in 1..{MAX_NEW_TOKENS}"
    if not 1 <= max_new <= MAX_NEW_TOKENS:
        return f"'max_new_tokens' must be an integer in 1..{MAX_NEW_TOKENS}"
    sampling = data.get("sampling")
    if sampling is not None and (
        not isinstance(sampling, Mapping) or not set(sampling) <= _SAMPLING_KEYS
    ):
        return f"'sampling' must be an object with keys in {sorted(_SAMPLING_KEYS)}"
    if sampling is not None and not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in sampling.values()
    ):
        return "'sampling' values must be numbers"
    if sampling is not None and not isinstance(sampling.get("seed", 0), int):
        return "'sampling.seed' must be an integer"
    stop = data.get("stop", [])
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stop)
    ):
        return f"'stop' must be a list of at most {MAX_STOPS} non-empty strings"
    first = data.get("first_token_timeout_ms")
    if first is not None and _positive(first) is None:
        return "'first_token_timeout_ms' must be a positive number"
    return GenerateInput(
        prompt=prompt,
        max_new_tokens=max_new,
        sampling=sampling,
        stop=tuple(stop),
        first_token_timeout_ms=None if first is None else float(first),
    )
