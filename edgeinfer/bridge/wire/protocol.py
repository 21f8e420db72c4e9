"""The bridge's wire protocol: request/reply encode and decode. Pure: no paho, no model, no clock.

A request is a JSON object (or MsgPack, when the MQTT v5 content type says so) with an ``id``,
an optional protocol version ``v`` (default 1), an optional ``kind`` (else implied by its
fields: ``text``/``texts``, ``image``/``images``, ``inputs``, ``prompt``/``messages``,
``cancel``; see ``kinds.py``), an optional deadline and, on MQTT 3.1.1, a ``reply_to``::

    {"id": "r-17", "text": "..."}                            text (embed, classify)
    {"id": "r-18", "image": {"format": "jpeg", "data": ...}}  image classifiers
    {"id": "r-19", "inputs": {"x": {dtype, shape, data}}, "stream": "mic-1"}   raw packages
    {"id": "r-20", "prompt": "...", "max_new_tokens": 64}    generate (streamed chunks)
    {"id": "r-21", "cancel": "r-20"}                         stop a generation

A reply carries ``v``, ``id``, ``ok``, ``model``, ``precision``, ``result``, ``cached``,
``exit_layer``, ``queue_ms``, ``compute_ms``, ``slack_ms``, or ``error: {code, message}``.
docs/mqtt.md is the full contract. ``decode_request`` never raises on bad bytes: it returns an
``ErrorReply`` that the bridge sends back, so malformed input costs one reply and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from edgeinfer.bridge.wire import kinds, values
from edgeinfer.bridge.wire.arrays import ENCODINGS, SHORTEST
from edgeinfer.bridge.wire.encoding import (
    Body,
    encode,
    encode_reply,
    msgpack,
    msgpack_available,
    packb,
)
from edgeinfer.bridge.wire.values import valid_topic

__all__ = [
    "BAD_REQUEST",
    "BUSY",
    "CANCELLED",
    "CONTENT_JSON",
    "CONTENT_MSGPACK",
    "DEADLINE_EXCEEDED",
    "ERROR_CODES",
    "ID_REUSED",
    "INTERNAL",
    "MAX_ID_CHARS",
    "PAYLOAD_TOO_LARGE",
    "PROTOCOL_VERSION",
    "RUN_TIMEOUT",
    "UNKNOWN_MODEL",
    "WRONG_KIND",
    "Body",
    "ErrorReply",
    "Request",
    "RequestKey",
    "decode_reply",
    "decode_request",
    "encode",
    "encode_reply",
    "error_reply",
    "msgpack_available",
    "packb",
    "wire_format",
]

# Requests may say ``"v": 1``; a newer version is refused rather than half understood.
PROTOCOL_VERSION: Final = 1
BAD_REQUEST: Final = "bad_request"
PAYLOAD_TOO_LARGE: Final = "payload_too_large"
UNKNOWN_MODEL: Final = "unknown_model"
WRONG_KIND: Final = "wrong_kind"
DEADLINE_EXCEEDED: Final = "deadline_exceeded"
BUSY: Final = "busy"
CANCELLED: Final = "cancelled"
ID_REUSED: Final = "id_reused"
RUN_TIMEOUT: Final = "run_timeout"
INTERNAL: Final = "internal"
ERROR_CODES: Final = (
    BAD_REQUEST,
    PAYLOAD_TOO_LARGE,
    UNKNOWN_MODEL,
    WRONG_KIND,
    DEADLINE_EXCEEDED,
    BUSY,
    CANCELLED,
    ID_REUSED,
    RUN_TIMEOUT,
    INTERNAL,
)

CONTENT_JSON: Final = "application/json"
CONTENT_MSGPACK: Final = "application/msgpack"
_MSGPACK_TYPES: Final = frozenset(
    {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
)
# Ids are echoed and kept in the de-duplication store; a bound keeps that store's memory bounded.
MAX_ID_CHARS: Final = 200


def wire_format(content_type: str | None) -> str:
    """The payload format a content type asks for: ``"msgpack"`` or ``"json"`` (the default)."""
    if content_type and content_type.split(";")[0].strip().lower() in _MSGPACK_TYPES:
        return "msgpack"
    return "json"


# A request's identity: (reply address, model, id). Two clients' ids never meet: each client
# reads only its own reply topic, so the reply address tells the clients apart.
RequestKey = tuple[str, str, str]


@dataclass(frozen=True)
class Request:
    """One decoded request.

    Attributes:
        id: the caller's request id (echoed in the reply; with ``reply_to`` and ``model``, the
            request's identity ``key``).
        model: the model name from the topic.
        kind: ``text``, ``image``, ``tensor``, ``generate`` or ``cancel``.
        input: the kind's input (``kinds.TextInput``, ...).
        deadline_ms: absolute epoch ms after which the answer is useless; ``None``: no deadline.
        reply_to: the topic for the reply (v5 ResponseTopic, or the payload's ``reply_to``).
        correlation: v5 CorrelationData to echo, or ``None``.
        fmt: ``"json"`` or ``"msgpack"``: the reply is written in the request's format.
        received_ms: epoch ms when the bridge received it.
        encoding: how float vectors are written: ``shortest`` or ``float32-base64``.
    """

    id: str
    model: str
    kind: str
    input: kinds.Input
    deadline_ms: float | None = None
    reply_to: str | None = None
    correlation: bytes | None = None
    fmt: str = "json"
    received_ms: float = 0.0
    encoding: str = SHORTEST

    @property
    def key(self) -> RequestKey:
        """The request's identity: ``(reply_to, model, id)``, never the id alone (another
        client's request with the same id is another request)."""
        return (self.reply_to or "", self.model, self.id)

    def error(self, code: str, message: str) -> ErrorReply:
        """The error ``code`` as this request's reply (its id, model, reply topic,
        correlation data and format)."""
        return ErrorReply(
            code,
            message,
            id=self.id,
            model=self.model,
            reply_to=self.reply_to,
            correlation=self.correlation,
            fmt=self.fmt,
        )


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
    """An error reply payload: ``{"v", "id", "ok": false, "model", "error": {code, message}}``."""
    return {
        "v": PROTOCOL_VERSION,
        "id": request_id,
        "ok": False,
        "model": model,
        "error": {"code": code, "message": message},
        **extra,
    }


def _loads(payload: bytes, fmt: str) -> Any:
    """Parse bytes; raise ``ValueError`` (with a short reason) when they are not valid."""
    if fmt == "msgpack":
        try:
            return msgpack().unpackb(payload, raw=False, strict_map_key=True)
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


# Deadlines as epoch ms: up to the year 2286 (any later one is a mistake, not a deadline).
MAX_DEADLINE_MS: Final = 1e13


def _deadline(data: Mapping[str, Any], received_ms: float) -> float | str | None:
    """The absolute deadline in epoch ms, ``None`` for none, or the reason it is invalid."""
    if "deadline_ms" in data and "timeout_ms" in data:
        return "give at most one of 'deadline_ms' and 'timeout_ms'"
    if "deadline_ms" in data:
        deadline = values.finite(data["deadline_ms"], low=0.0, high=MAX_DEADLINE_MS)
        if deadline is None:
            return f"'deadline_ms' must be a number of epoch ms in [0, {MAX_DEADLINE_MS:.0f}]"
        return deadline
    if "timeout_ms" in data:
        timeout = values.finite(data["timeout_ms"], low=0.0, high=kinds.MAX_TIMEOUT_MS)
        if not timeout:
            return (
                f"'timeout_ms' must be a positive number of ms, at most {kinds.MAX_TIMEOUT_MS:.0f}"
            )
        return received_ms + timeout
    return None


def _envelope(data: Mapping[str, Any]) -> tuple[str, str] | str:
    """(kind, encoding) of a request object, or the reason they are invalid."""
    version = values.integer(data.get("v", PROTOCOL_VERSION), low=1)
    if version is None:
        return "'v' must be a protocol version (an integer >= 1)"
    if version > PROTOCOL_VERSION:
        return (
            f"protocol version {version} is newer than this bridge's ({PROTOCOL_VERSION}); "
            "upgrade the bridge or send v1"
        )
    kind = kinds.infer_kind(data)
    if kind is None:
        return (
            f"say which kind of request this is: 'kind' in {list(kinds.KINDS)}, or exactly "
            "one of 'text'/'texts', 'image'/'images', 'inputs', 'prompt'/'messages', "
            "'cancel'"
        )
    encoding = data.get("encoding", SHORTEST)
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        return f"'encoding' must be one of {list(ENCODINGS)}"
    return kind, encoding


def _refusal(topic: str, policy: Callable[[str], str | None] | None) -> str | None:
    """Why ``topic`` cannot take a reply: ``policy``'s verdict (which checks the name too),
    or without one, whether it is a topic name at all."""
    if policy is not None:
        return policy(topic)
    if not valid_topic(topic):
        return "the reply topic must be a topic name (UTF-8, no '+', '#' or NUL, <= 65535 bytes)"
    return None


def _raw_id(payload: bytes) -> dict[str, str]:
    """``{"raw_id": ...}``: the id text found in bytes that could not be parsed (or none)."""
    found = values.id_in_bytes(payload, max_chars=MAX_ID_CHARS)
    return {} if found is None else {"raw_id": found}


def decode_request(
    payload: bytes,
    *,
    model: str,
    content_type: str | None = None,
    response_topic: str | None = None,
    correlation: bytes | None = None,
    max_payload_bytes: int,
    received_ms: float,
    reply_refusal: Callable[[str], str | None] | None = None,
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
        reply_refusal: why a reply topic may not be used (``BridgeConfig.reply_refusal``), or
            ``None`` when it may; a refused topic is never published to (the error reply goes
            to the errors topic). Without it every valid topic name is taken.

    Returns:
        a ``Request``, or an ``ErrorReply`` carrying the best-known id and reply topic.
    """
    fmt = wire_format(content_type)
    refusal = None if response_topic is None else _refusal(response_topic, reply_refusal)
    if refusal is not None:
        response_topic = None
    base = ErrorReply(
        BAD_REQUEST, "", model=model, reply_to=response_topic, correlation=correlation, fmt=fmt
    )

    def fail(code: str, message: str, **known: Any) -> ErrorReply:
        return replace(base, code=code, message=message, **known)

    if fmt == "msgpack" and not msgpack_available():
        return fail(BAD_REQUEST, "MsgPack is not installed on this bridge; send JSON", fmt="json")
    if len(payload) > max_payload_bytes:
        return fail(
            PAYLOAD_TOO_LARGE,
            f"payload is {len(payload)} bytes; the limit is {max_payload_bytes}",
            extra=_raw_id(payload),
        )
    try:
        data = _loads(payload, fmt)
    except ValueError as exc:
        return fail(BAD_REQUEST, str(exc), extra=_raw_id(payload))
    if not isinstance(data, dict):
        return fail(BAD_REQUEST, "a request must be an object")
    reply_to = response_topic
    if refusal is None and reply_to is None and "reply_to" in data:
        topic = data["reply_to"]
        refusal = (
            _refusal(topic, reply_refusal)
            if isinstance(topic, str)
            else "'reply_to' must be a topic name"
        )
        reply_to = topic if refusal is None else None
    raw_id = data.get("id")
    request_id = values.text(raw_id, max_chars=MAX_ID_CHARS)
    known: dict[str, Any] = {"id": request_id, "reply_to": reply_to}
    if refusal is not None:
        return fail(BAD_REQUEST, refusal, **known)
    if request_id is None:
        shown = {} if raw_id is None else {"raw_id": values.id_text(raw_id, max_chars=MAX_ID_CHARS)}
        return fail(
            BAD_REQUEST,
            f"'id' must be a string of 1..{MAX_ID_CHARS} characters",
            reply_to=reply_to,
            extra=shown,
        )
    envelope = _envelope(data)
    if isinstance(envelope, str):
        return fail(BAD_REQUEST, envelope, **known)
    kind, encoding = envelope
    parsed = kinds.parse_input(kind, data)
    if isinstance(parsed, str):
        return fail(BAD_REQUEST, parsed, **known)
    deadline = _deadline(data, received_ms)
    if isinstance(deadline, str):
        return fail(BAD_REQUEST, deadline, **known)
    if reply_to is None:
        return fail(BAD_REQUEST, "no reply topic: set the v5 ResponseTopic or 'reply_to'", **known)
    return Request(
        id=request_id,
        model=model,
        kind=kind,
        input=parsed,
        deadline_ms=deadline,
        reply_to=reply_to,
        correlation=correlation,
        fmt=fmt,
        received_ms=received_ms,
        encoding=encoding,
    )
