"""A reply's MQTT v5 PUBLISH properties, packed once: its ContentType and CorrelationData.

paho's ``Properties`` builds its tables of 27 property names for each instance and checks every
attribute set and every ``pack`` against them, replacing the spaces in each name at each look-up:
about 100 µs a reply on the 2-core VM, more than the JSON of a small result. A reply carries
these two properties only, so ``ReplyProperties`` writes their bytes once (MQTT v5 2.2.2: a
Variable Byte Integer length, then each property's identifier and its 2-byte-length value, in
paho's order); every other method (``str``, ``json``) is paho's, on paho's tables, which all
replies share read-only. A resend after a reconnect packs the same bytes again.

Imported by the outbox when the bridge starts (paho is the ``mqtt`` extra).
"""

from __future__ import annotations

import struct

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

__all__ = ["ReplyProperties"]

_LENGTH = struct.Struct("!H")  # a string's or binary value's length (at most 65535 bytes)


def _variable_int(value: int) -> bytes:
    """MQTT's Variable Byte Integer: 7 bits a byte, low first, the top bit says more follow."""
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


class ReplyProperties(Properties):
    """``Properties(PUBLISH)`` with ``ContentType`` and, unless ``None``, ``CorrelationData``."""

    _tables = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    names, types, properties = _tables.names, _tables.types, _tables.properties
    del _tables
    _CONTENT_TYPE = _variable_int(names["Content Type"])
    _CORRELATION = _variable_int(names["Correlation Data"])
    _packed: bytes

    def __init__(self, content_type: str, correlation: bytes | None) -> None:
        # object.__setattr__: paho's __setattr__ is the per-name check this class saves.
        set_field = object.__setattr__
        set_field(self, "packetType", PacketTypes.PUBLISH)
        set_field(self, "ContentType", content_type)
        text = content_type.encode()
        packed = self._CONTENT_TYPE + _LENGTH.pack(len(text)) + text
        if correlation is not None:
            set_field(self, "CorrelationData", correlation)
            packed += self._CORRELATION + _LENGTH.pack(len(correlation)) + correlation
        set_field(self, "_packed", _variable_int(len(packed)) + packed)

    def pack(self) -> bytes:
        """The properties as sent (the bytes paho's ``pack`` writes for them)."""
        return self._packed
