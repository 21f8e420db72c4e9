"""The request kinds: what each carries, parsed from a decoded object. Pure: no paho, no model.

``text`` (``text``/``texts``), ``image`` (``image``/``images``: a raw uint8 HWC wire array or an
encoded JPEG/PNG), ``tensor`` (``inputs``: named wire arrays, optional ``stream``), ``generate``
(``prompt`` or ``messages``, sampling, stops, two deadlines) and ``cancel`` (``cancel``: the id
of a generation to stop). Each parser returns its input, or a string saying what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from edgeinfer.bridge.wire import arrays, values
from edgeinfer.config import SamplingConfig

__all__ = [
    "KINDS",
    "MAX_IMAGES",
    "MAX_NEW_TOKENS",
    "MAX_TENSORS",
    "MAX_TEXTS",
    "MAX_TIMEOUT_MS",
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
# Timeouts a request may set: a day is longer than any answer a device waits for.
MAX_TIMEOUT_MS: Final = 86_400_000.0
MIN_TEMPERATURE: Final = SamplingConfig.MIN_TEMPERATURE
# field -> (low, high, type): SamplingConfig's ranges (top_k and seed: within int64).
_SAMPLING_RANGES: Final[dict[str, tuple[float, float, type]]] = {
    "temperature": (0.0, SamplingConfig.MAX_TEMPERATURE, float),
    "top_k": (0, 2**31 - 1, int),
    "top_p": (0.0, 1.0, float),
    "seed": (0, values.MAX_INT, int),
}
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
    stream: bool = True  # False: no chunks, the final message only (shell tools)


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
    target = values.text(data.get("cancel"), max_chars=MAX_NAME_CHARS)
    if target is None:
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
            known = isinstance(fmt, str) and fmt in _IMAGE_FORMATS
            if not known or not isinstance(blob, (bytes, str)) or not blob:
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
        if values.text(name, max_chars=MAX_NAME_CHARS) is None:
            return f"every input name must be a string of 1..{MAX_NAME_CHARS} characters"
        array = arrays.decode_array(value, what=f"inputs.{name}")
        if isinstance(array, str):
            return array
        arrays_in[name] = array
    stream = data.get("stream")
    if stream is not None and values.text(stream, max_chars=MAX_NAME_CHARS) is None:
        return f"'stream' must be a string of 1..{MAX_NAME_CHARS} characters"
    return TensorInput(arrays_in, stream)


def _generate(data: Mapping[str, Any]) -> GenerateInput | str:
    if ("prompt" in data) == ("messages" in data):
        return "give exactly one of 'prompt' (a string) or 'messages' (chat messages)"
    prompt: str | tuple[Mapping[str, str], ...]
    chat, stream = data.get("chat", False), data.get("stream", True)
    if not isinstance(chat, bool) or not isinstance(stream, bool):
        return "'chat' and 'stream' must be true or false"
    if "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            return "'prompt' must be a non-empty string"
        # "chat": the prompt is one user message, through the package's chat template.
        prompt = ({"role": "user", "content": data["prompt"]},) if chat else data["prompt"]
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
    max_new = values.integer(data.get("max_new_tokens", 128), low=1, high=MAX_NEW_TOKENS)
    if max_new is None:
        return f"'max_new_tokens' must be an integer in 1..{MAX_NEW_TOKENS}"
    sampling = _sampling(data.get("sampling"))
    if isinstance(sampling, str):
        return sampling
    stop = data.get("stop", [])
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stop)
    ):
        return f"'stop' must be a list of at most {MAX_STOPS} non-empty strings"
    first = data.get("first_token_timeout_ms")
    first_ms = None if first is None else values.finite(first, low=0.0, high=MAX_TIMEOUT_MS)
    if first is not None and not first_ms:
        return (
            "'first_token_timeout_ms' must be a positive number of ms, "
            f"at most {MAX_TIMEOUT_MS:.0f}"
        )
    return GenerateInput(
        prompt=prompt,
        max_new_tokens=max_new,
        sampling=sampling,
        stop=tuple(stop),
        first_token_timeout_ms=first_ms,
        stream=stream,
    )


def _sampling(given: Any) -> Mapping[str, Any] | str | None:
    """The sampling fields, each of its type and in its range, or the reason they are not.

    The ranges are ``SamplingConfig``'s, checked here so that a bad value is a
    ``bad_request`` naming the field, never an exception deep in the sampler."""
    if given is None:
        return None
    if not isinstance(given, Mapping) or not set(given) <= _SAMPLING_KEYS:
        return f"'sampling' must be an object with keys in {sorted(_SAMPLING_KEYS)}"
    checked: dict[str, Any] = {}
    for key, value in given.items():
        low, high, kind = _SAMPLING_RANGES[key]
        number = (
            values.integer(value, low=int(low), high=int(high))
            if kind is int
            else values.finite(value, low=low, high=high)
        )
        if number is None:
            noun = "an integer" if kind is int else "a number"
            return f"'sampling.{key}' must be {noun} in [{low:g}, {high:g}]"
        checked[key] = number
    temperature = checked.get("temperature", 0.0)
    if 0.0 < temperature < MIN_TEMPERATURE:
        return (
            f"'sampling.temperature' must be 0 (greedy) or at least {MIN_TEMPERATURE:g}: below "
            "that the draw is greedy in all but name"
        )
    top_p = checked.get("top_p", 1.0)
    if top_p <= 0.0:
        return "'sampling.top_p' must be in (0, 1]"
    return checked
