"""Numbers and topic names from the wire, checked before any use. Pure: stdlib only.

A decoded JSON or MsgPack value can be any size or type: a 400-digit integer overflows
``float()``, a list is unhashable in a set look-up, ``True`` is an ``int``. Every numeric field
of a request passes through one of these, which return ``None`` instead of raising, so a
hostile value costs one ``bad_request`` reply and nothing else.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

__all__ = [
    "MAX_INT",
    "MAX_TOPIC_BYTES",
    "finite",
    "id_in_bytes",
    "id_text",
    "integer",
    "text",
    "valid_topic",
]

# Integers on the wire fit a signed 64-bit value (what MsgPack and onnxruntime carry).
MAX_INT: Final = 2**63 - 1


def finite(value: Any, *, low: float = -math.inf, high: float = math.inf) -> float | None:
    """``value`` as a finite float in ``[low, high]``, else ``None`` (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def integer(value: Any, *, low: int = -MAX_INT - 1, high: int = MAX_INT) -> int | None:
    """``value`` as an int in ``[low, high]``, else ``None`` (floats and bools are not ints)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if low <= value <= high else None


def text(value: Any, *, max_chars: int) -> str | None:
    """``value`` when it is a string of 1..``max_chars`` characters, else ``None``."""
    return value if isinstance(value, str) and 0 < len(value) <= max_chars else None


# A topic name's bytes (MQTT: a UTF-8 string of at most 65,535 bytes).
MAX_TOPIC_BYTES = 65_535


def valid_topic(topic: str) -> bool:
    """Whether ``topic`` can be published to: non-empty UTF-8 without wildcards or NUL."""
    if not topic or any(c in topic for c in "+#\0"):
        return False
    try:
        return len(topic.encode("utf-8")) <= MAX_TOPIC_BYTES
    except UnicodeEncodeError:  # a lone surrogate from a JSON "\ud800"
        return False


# An ``"id": "..."`` string near the start of a payload that could not be parsed (bad JSON, too
# large): 4 KiB is past where any client writes its id, and bounds the scan.
_ID_SCAN_BYTES: Final = 4096
_ID_PATTERN: Final = re.compile(rb'"id"\s*:\s*"((?:[^"\\]|\\.)*)"')


def id_text(value: Any, *, max_chars: int) -> str:
    """An unusable ``id`` as text a client can match (its JSON for a non-string), truncated."""
    if isinstance(value, str):
        return value[:max_chars]
    try:
        shown = json.dumps(value, allow_nan=True, default=repr)
    except (ValueError, RecursionError):  # a deeply nested value
        shown = type(value).__name__
    return shown[:max_chars]


def id_in_bytes(payload: bytes, *, max_chars: int) -> str | None:
    """The text of the first ``"id": "..."`` in a payload's first bytes, or ``None``."""
    found = _ID_PATTERN.search(payload[:_ID_SCAN_BYTES])
    if found is None:
        return None
    raw = found.group(1).decode("utf-8", "replace")
    try:
        raw = json.loads(f'"{raw}"')  # undo JSON escapes where they are whole
    except ValueError:
        pass
    return raw[:max_chars] or None
