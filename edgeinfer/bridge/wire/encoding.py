"""Replies and requests as bytes: JSON, or MsgPack when installed. Pure: no paho, no model.

A reply's ``result`` is a ``Body``, encoded at most once per wire format and spliced after the
small head fields (``encode_reply``), so a repeated id or a cache hit reuses its bytes.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Body", "encode", "encode_reply", "msgpack", "msgpack_available", "packb"]


def msgpack() -> Any:
    """The optional ``msgpack`` module (untyped, so imported as ``Any``)."""
    return importlib.import_module("msgpack")


def packb(value: Any, *, single_float: bool = False) -> bytes:
    """``value`` as MsgPack bytes; ``single_float`` packs floats as float32 (model outputs)."""
    return bytes(msgpack().packb(value, use_bin_type=True, use_single_float=single_float))


def msgpack_available() -> bool:
    """Whether the optional ``msgpack`` package can be imported."""
    try:
        msgpack()
    except ImportError:
        return False
    return True


def encode(payload: Mapping[str, Any], *, fmt: str = "json") -> bytes:
    """Encode a reply (or a request, on the client side) as JSON or MsgPack bytes."""
    if fmt == "msgpack":
        return packb(dict(payload))
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


class Body:
    """A reply's ``result``, encoded at most once per wire format and spliced into replies.

    ``encoder(fmt)`` writes the result when the caller does it faster than ``json``/``msgpack``
    would on ``value`` (float vectors: ``arrays.vectors_json``). A repeated id or a cache hit
    reuses the encoded bytes.
    """

    __slots__ = ("_encoded", "_encoder", "value")

    def __init__(self, value: Any = None, *, encoder: Callable[[str], bytes] | None = None) -> None:
        self.value = value
        self._encoder = encoder
        self._encoded: dict[str, bytes] = {}

    def encoded(self, fmt: str) -> bytes:
        """The result's bytes in ``fmt`` (a race may encode it twice; both are equal)."""
        data = self._encoded.get(fmt)
        if data is None:
            if self._encoder is not None:
                data = self._encoder(fmt)
            elif fmt == "msgpack":
                data = packb(self.value)
            else:
                data = json.dumps(self.value, separators=(",", ":"), allow_nan=False).encode()
            self._encoded[fmt] = data
        return data

    @property
    def nbytes(self) -> int:
        """Bytes held by the encodings so far (for the reply cache's bound)."""
        return sum(len(b) for b in self._encoded.values()) or len(self.encoded("json"))


def encode_reply(head: Mapping[str, Any], body: Body, *, fmt: str) -> bytes:
    """A reply: the small ``head`` fields encoded now, then ``"result"`` spliced in."""
    if fmt == "msgpack":
        packer = msgpack().Packer(use_bin_type=True)
        parts = [packer.pack_map_header(len(head) + 1)]
        for key, value in head.items():
            parts += [packer.pack(key), packer.pack(value)]
        parts += [packer.pack("result"), body.encoded("msgpack")]
        return b"".join(parts)
    text = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    return text[:-1] + b',"result":' + body.encoded("json") + b"}"
