"""The bridge's wire protocol: request/reply encode and decode. Pure: no paho, no model, no clock.

A request is a JSON object (or MsgPack, when the MQTT v5 content type says so)::

    {"id": "r-17", "text": "..."}                      one input
    {"id": "r-18", "texts": ["...", "..."],            several inputs
     "params": {"truncate": true},
     "timeout_ms": 50}                                  or "deadline_ms": <absolute epoch ms>
    {"id": "r-19", "text": "...", "reply_to": "t/x"}   MQTT 3.1.1: where to send the reply

A reply carries ``id``, ``ok``, ``model``, ``precision``, ``result``, ``cached``, ``exit_layer``,
``queue_ms``, ``compute_ms``, ``slack_ms``, or ``error: {code, message}``. docs/mqtt.md is the
full contract. ``decode_request`` never raises on bad bytes: it returns an ``ErrorReply`` that the
bridge sends back, so malformed input costs one reply and nothing else.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

__all__ = [
    "BAD_REQUEST",
    "BUSY",
    "CONTENT_JSON",
    "CONTENT_MSGPACK",
    "DEADLINE_EXCEEDED",
    "ERROR_CODES",
    "INTERNAL",
    "MAX_ID_CHARS",
    "MAX_TEXTS",
    "PAYLOAD_TOO_LARGE",
    "UNKNOWN_MODEL",
    "ErrorReply",
    "Request",
    "decode_reply",
    "decode_request",
    "encode",
    "error_reply",
    "msgpack_available",
    "wire_format",
]

BAD_REQUEST: Final = "bad_request"
PAYLOAD_TOO_LARGE: Final = "payload_too_large"
UNKNOWN_MODEL: Final = "unknown_model"
DEADLINE_EXCEEDED: Final = "deadline_exceeded"
BUSY: Final = "busy"
INTERNAL: Final = "internal"
ERROR_CODES: Final = (
    BAD_REQUEST, PAYLOAD_TOO_LARGE, UNKNOWN_MODEL, DEADLINE_EXCEEDED, BUSY, INTERNAL,
)

CONTENT_JSON: Final = "application/json"
CONTENT_MSGPACK: Final = "application/msgpack"
_MSGPACK_TYPES: Final = frozenset(
    {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
)
# Ids are echoed and kept in the de-duplication store; a bound keeps that store's memory bounded.
MAX_ID_CHARS: Final = 200
# Texts per request: one request must not hold the worker for long (split bigger jobs).
MAX_TEXTS: Final = 64
_KNOWN_PARAMS: Final = frozenset({"truncate"})


def _msgpack() -> Any:
    """The optional ``msgpack`` module (untyped, so imported as ``Any``)."""
    return importlib.import_module("msgpack")


def msgpack_available() -> bool:
    """Whether the optional ``msgpack`` package can be imported."""
    try:
        _msgpack()
    except ImportError:
        return False
    return True


def wire_format(content_type: str | None) -> str:
    """The payload format a content type asks for: ``"msgpack"`` or ``"json"`` (the default)."""
    if content_type and content_type.split(";")[0].strip().lower() in _MSGPACK_TYPES:
        return "msgpack"
    return "json"


@dataclass(frozen=True)
class Request:
    """One decoded inference request.

    Attributes:
        id: the caller's request id (the de-duplication key, echoed in the reply).
        model: the model name from the topic.
        texts: the inputs, at least one.
        truncate: cut texts longer than the model's window (else they are a ``bad_request``).
        deadline_ms: absolute epoch ms after which the answer is useless; ``None``: no deadline.
        reply_to: the topic for the reply (v5 ResponseTopic, or the payload's ``reply_to``).
        correlation: v5 CorrelationData to echo, or ``None``.
        fmt: ``"json"`` or ``"msgpack"``: the reply is written in the request's format.
        received_ms: epoch ms when the bridge received it.
    """

    id: str
    model: str
    texts: tuple[str, ...]
    truncate: bool = True
    deadline_ms: float | None = None
    reply_to: str | None = None
    correlation: bytes | None = None
    fmt: str = "json"
    received_ms: float = 0.0


@dataclass(frozen=True)
class ErrorReply:
    """A request that cannot be served, with what is needed to answer it anyway."""

    code: str
    message: str
    id: str | None = None
    model: str | None = None
    reply_to: str | None = None
    correlation: bytes | None = None
    fmt: str = "json"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The reply payload as a dict (before encoding)."""
        return error_reply(self.id, self.code, self.message, model=self.model, **self.extra)


def error_reply(
    request_id: str | None, code: str, message: str, *, model: str | None = None, **extra: Any
) -> dict[str, Any]:
    """An error reply payload: ``{"id", "ok": false, "model", "error": {"code", "message"}}``."""
    return {"id": request_id, "ok": False, "model": model,
            "error": {"code": code, "message": message}, **extra}


def encode(payload: Mapping[str, Any], *, fmt: str = "json") -> bytes:
    """Encode a reply (or a request, on the client side) as JSON or MsgPack bytes."""
    if fmt == "msgpack":
        return bytes(_msgpack().packb(dict(payload), use_bin_type=True))
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def _loads(payload: bytes, fmt: str) -> Any:
    """Parse bytes; raise ``ValueError`` (with a short reason) when they are not valid."""
    if fmt == "msgpack":
        try:
            return _msgpack().unpackb(payload, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types on bad input
            raise ValueError(f"not valid MsgPack ({type(exc).__name__})") from exc
    try:
        return json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, a 5000-digit integer
        raise ValueError(f"not valid JSON ({type(exc).__name__})") from exc


def decode_reply(payload: bytes, *, fmt: str = "json") -> dict[str, Any]:
    """Decode a reply payload (client side); raise ``ValueError`` when it is not an object."""
    data = _loads(payload, fmt)
    if not isinstance(data, dict):
        raise ValueError("a reply must be an object")
    return data


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` when it is not a finite number (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _texts(data: Mapping[str, Any]) -> tuple[str, ...] | str:
    """The request's inputs, or the reason they are invalid."""
    if ("text" in data) == ("texts" in data):
        return "give exactly one of 'text' (a string) or 'texts' (a list of strings)"
    raw = [data["text"]] if "text" in data else data["texts"]
    if not isinstance(raw, list) or not raw:
        return "'texts' must be a non-empty list of strings"
    if len(raw) > MAX_TEXTS:
        return f"at most {MAX_TEXTS} texts per request, got {len(raw)}"
    if not all(isinstance(t, str) and t.strip() for t in raw):
        return "every text must be a non-empty string"
    return tuple(raw)


def _deadline(data: Mapping[str, Any], received_ms: float) -> float | str | None:
    """The absolute deadline in epoch ms, ``None`` for none, or the reason it is invalid."""
    if "deadline_ms" in data and "timeout_ms" in data:
        return "give at most one of 'deadline_ms' and 'timeout_ms'"
    if "deadline_ms" in data:
        deadline = _number(data["deadline_ms"])
        return "'deadline_ms' must be a number (epoch ms)" if deadline is None else deadline
    if "timeout_ms" in data:
        timeout = _number(data["timeout_ms"])
        if timeout is None or timeout <= 0:
            return "'timeout_ms' must be a positive number"
        return received_ms + timeout
    return None


def decode_request(
    payload: bytes,
    *,
    model: str,
    content_type: str | None = None,
    response_topic: str | None = None,
    correlation: bytes | None = None,
    max_payload_bytes: int,
    received_ms: float,
) -> Request | ErrorReply:
    """Decode one request; never raises on bad input.

    Args:
        payload: the MQTT message payload.
        model: the model name taken from the topic.
        content_type: the v5 ContentType property (MsgPack when it names MsgPack).
        response_topic: the v5 ResponseTopic property; the payload's ``reply_to`` is the fallback.
        correlation: the v5 CorrelationData property, echoed in the reply.
        max_payload_bytes: larger payloads get ``payload_too_large`` without being parsed.
        received_ms: epoch ms of arrival (``timeout_ms`` counts from here).

    Returns:
        a ``Request``, or an ``ErrorReply`` carrying the best-known id and reply topic.
    """
    fmt = wire_format(content_type)
    base = ErrorReply(BAD_REQUEST, "", model=model, reply_to=response_topic,
                      correlation=correlation, fmt=fmt)

    def fail(code: str, message: str, **known: Any) -> ErrorReply:
        return replace(base, code=code, message=message, **known)

    if fmt == "msgpack" and not msgpack_available():
        return fail(BAD_REQUEST, "MsgPack is not installed on this bridge; send JSON", fmt="json")
    if len(payload) > max_payload_bytes:
        return fail(PAYLOAD_TOO_LARGE,
                    f"payload is {len(payload)} bytes; the limit is {max_payload_bytes}")
    try:
        data = _loads(payload, fmt)
    except ValueError as exc:
        return fail(BAD_REQUEST, str(exc))
    if not isinstance(data, dict):
        return fail(BAD_REQUEST, "a request must be an object")
    reply_to = response_topic
    if reply_to is None and "reply_to" in data:
        topic = data["reply_to"]
        if isinstance(topic, str) and topic and not any(c in topic for c in "+#\0"):
            reply_to = topic
    raw_id = data.get("id")
    request_id = raw_id if isinstance(raw_id, str) and 0 < len(raw_id) <= MAX_ID_CHARS else None
    known: dict[str, Any] = {"id": request_id, "reply_to": reply_to}
    if request_id is None:
        return fail(BAD_REQUEST, f"'id' must be a string of 1..{MAX_ID_CHARS} characters",
                    reply_to=reply_to)
    texts = _texts(data)
    if isinstance(texts, str):
        return fail(BAD_REQUEST, texts, **known)
    params = data.get("params", {})
    if not isinstance(params, dict) or not set(params) <= _KNOWN_PARAMS:
        return fail(BAD_REQUEST, f"'params' must be an object with keys in {sorted(_KNOWN_PARAMS)}",
                    **known)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        return fail(BAD_REQUEST, "'params.truncate' must be true or false", **known)
    deadline = _deadline(data, received_ms)
    if isinstance(deadline, str):
        return fail(BAD_REQUEST, deadline, **known)
    if reply_to is None:
        return fail(BAD_REQUEST, "no reply topic: set the v5 ResponseTopic or 'reply_to'",
                    **known)
    return Request(id=request_id, model=model, texts=texts, truncate=truncate,
                   deadline_ms=deadline, reply_to=reply_to, correlation=correlation, fmt=fmt,
                   received_ms=received_ms)
