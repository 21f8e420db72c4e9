"""Arrays on the wire, and vectors in replies. Pure: numpy only, no paho, no model.

A wire array is ``{"dtype": "float32", "shape": [1, 512], "data": <bytes>}``: the raw
little-endian, C-order bytes (a MsgPack ``bin``; in JSON a base64 string). Replies write
float vectors either as JSON numbers in their shortest round-tripping float32 form (``0.1``,
not ``0.10000000149011612``) or, when asked (``"encoding": "float32-base64"``), as base64 of
their little-endian float32 bytes: a 384-float embedding is ~4.7 KB of text or 2 KB of base64.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from edgeinfer.bridge.wire import values

__all__ = [
    "DTYPES",
    "ENCODINGS",
    "FLOAT32_BASE64",
    "MAX_ARRAY_DIMS",
    "MAX_ARRAY_ELEMENTS",
    "SHORTEST",
    "decode_array",
    "encode_array",
    "from_base64",
    "vectors_json",
    "vectors_value",
]

# The dtypes a graph takes or returns that the wire carries (little-endian on the wire).
DTYPES: Final = frozenset(
    {"float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"}
)
SHORTEST: Final = "shortest"
FLOAT32_BASE64: Final = "float32-base64"
ENCODINGS: Final = (SHORTEST, FLOAT32_BASE64)
MAX_ARRAY_DIMS: Final = 8
# Elements an array's shape may name, zero-sized dimensions aside: the bytes of a non-empty
# array are bounded by the payload limit anyway; this bounds the shape of an empty one
# ([0, 2**63] would make numpy raise) and keeps every count inside int64.
MAX_ARRAY_ELEMENTS: Final = 2**31


def from_base64(text: str) -> bytes | None:
    """The bytes of a base64 string, or ``None`` when it is not valid base64."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _shape(shape: Any) -> list[int] | None:
    """``shape`` as dimensions when it is a valid, bounded wire shape, else ``None``."""
    if not isinstance(shape, list) or len(shape) > MAX_ARRAY_DIMS:
        return None
    dims = [values.integer(n, low=0, high=MAX_ARRAY_ELEMENTS) for n in shape]
    if any(n is None for n in dims):
        return None
    checked = [n for n in dims if n is not None]
    return checked if math.prod(max(n, 1) for n in checked) <= MAX_ARRAY_ELEMENTS else None


def decode_array(value: Any, *, what: str) -> np.ndarray | str:
    """A wire array as a read-only numpy array, or the reason it is not a valid one."""
    if not isinstance(value, Mapping):
        return f"{what} must be an object {{dtype, shape, data}}"
    dtype, shape, data = value.get("dtype"), value.get("shape"), value.get("data")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        return f"{what}.dtype must be one of {sorted(DTYPES)}"
    dims = _shape(shape)
    if dims is None:
        return (
            f"{what}.shape must be a list of at most {MAX_ARRAY_DIMS} integers >= 0 naming at "
            f"most {MAX_ARRAY_ELEMENTS} elements"
        )
    if isinstance(data, str):  # JSON carries the bytes as base64
        data = from_base64(data)
        if data is None:
            return f"{what}.data is not valid base64"
    if not isinstance(data, bytes):
        return f"{what}.data must be bytes (MsgPack bin) or a base64 string (JSON)"
    wire = np.dtype(str(dtype)).newbyteorder("<")
    if math.prod(dims) * wire.itemsize != len(data):
        return (
            f"{what}: shape {dims} of {dtype} needs {math.prod(dims) * wire.itemsize} bytes, "
            f"got {len(data)}"
        )
    array = np.frombuffer(data, dtype=wire).reshape(dims)
    return array.astype(wire.newbyteorder("="), copy=False)


def encode_array(array: np.ndarray, *, binary: bool) -> dict[str, Any]:
    """An array as a wire array: raw bytes for MsgPack (``binary``), else base64 text."""
    normal = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    raw = normal.tobytes()
    data: bytes | str = raw if binary else base64.b64encode(raw).decode("ascii")
    return {"dtype": normal.dtype.name, "shape": list(normal.shape), "data": data}


def vectors_json(rows: list[np.ndarray], *, encoding: str) -> bytes:
    """The JSON text of a list of float vectors, written without Python floats.

    ``shortest``: each value's shortest float32 repr (numpy's, in C; JSON numbers);
    ``float32-base64``: one base64 string per vector. Raises ``ValueError`` on NaN/inf.
    """
    if encoding == FLOAT32_BASE64:
        items = [b'"' + base64.b64encode(_le32(row).tobytes()) + b'"' for row in rows]
        return b"[" + b",".join(items) + b"]"
    parts = []
    for row in rows:
        values = np.asarray(row, np.float32)
        if not np.isfinite(values).all():
            raise ValueError("a vector holds NaN or infinite values: not representable in JSON")
        # Straight to ASCII bytes (no str objects): a float32's shortest form is at most 15
        # characters (sign, 9 digits, point, a 4-character exponent), so 16 never cuts one.
        parts.append(b"[" + b",".join(values.astype("S16").tolist()) + b"]")
    return b"[" + b",".join(parts) + b"]"


def vectors_value(rows: list[np.ndarray], *, encoding: str) -> list[Any]:
    """The same vectors for MsgPack: base64 strings, or float32 lists (packed as float32)."""
    if encoding == FLOAT32_BASE64:
        return [base64.b64encode(_le32(row).tobytes()).decode("ascii") for row in rows]
    return [np.asarray(row, np.float32).tolist() for row in rows]


def _le32(row: np.ndarray) -> np.ndarray:
    """``row`` as contiguous little-endian float32."""
    return np.ascontiguousarray(row, dtype=np.dtype("<f4"))
