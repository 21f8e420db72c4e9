"""A reply's v5 properties packed by ``ReplyProperties`` are the bytes paho packs for them, and
read back the same through paho's own methods."""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeinfer.bridge.serve.reply_properties import ReplyProperties
from edgeinfer.bridge.wire import protocol as proto

# None: no correlation data; b"": an empty one (still sent); 120 and 130 bytes put the
# properties' length on either side of 127 (a 1- or 2-byte length); 65535: the largest.
CORRELATIONS = [None, b"", b"r-17", b"c" * 120, bytes(range(130)), b"\xff" * 65535]


@pytest.mark.parametrize("content_type", [proto.CONTENT_JSON, proto.CONTENT_MSGPACK])
@pytest.mark.parametrize("correlation", CORRELATIONS, ids=lambda c: f"{c and len(c)}")
def test_packed_as_paho_packs(content_type: str, correlation: bytes | None) -> None:
    paho = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    paho.ContentType = content_type
    if correlation is not None:
        paho.CorrelationData = correlation
    ours = ReplyProperties(content_type, correlation)
    assert ours.pack() == paho.pack()
    assert ours.json() == paho.json()
    assert str(ours) == str(paho)
    assert ours.ContentType == content_type
    assert getattr(ours, "CorrelationData", None) == correlation


def test_read_back_by_paho() -> None:
    ours = ReplyProperties(proto.CONTENT_JSON, b"r-9")
    read, _ = Properties(PacketTypes.PUBLISH).unpack(ours.pack())  # type: ignore[no-untyped-call]
    assert (read.ContentType, read.CorrelationData) == (proto.CONTENT_JSON, b"r-9")
