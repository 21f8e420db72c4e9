"""A retained request is refused (an error to its reply topic that says not to retain
requests), cleared from the broker, and never run — not at the next start of a bridge with a
new client id either (a new session is sent the topic's retained message on subscribing).

Real mosquitto, three bridges one after another, each with a new client id. Each bridge is
fenced with a live request: the broker sends a subscription's retained messages right after
the SUBACK, before anything published later, so a retained request still there would have been
answered (or, before this change, run) before the live one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_harness import Harness, Mosquitto, PahoPeer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

import edgeinfer
from edgeinfer.bridge.wire import protocol as proto

TOPIC = "edgeinfer/ret/minilm/req"


@pytest.fixture
def harness(fast_encoder: Path) -> Iterator[Harness]:
    model = edgeinfer.load(fast_encoder, config=edgeinfer.RuntimeConfig(spin_wait=False))
    h = Harness(model)
    yield h
    h.close()


def _publish_retained(peer: PahoPeer, request_id: str) -> bytes:
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = peer.topic
    props.CorrelationData = request_id.encode()
    body = json.dumps({"id": request_id, "text": f"retained {request_id}"}).encode()
    peer.client.publish(TOPIC, body, qos=1, retain=True, properties=props).wait_for_publish(10)
    return request_id.encode()


def _fenced(peer: PahoPeer, fence_id: str) -> None:
    assert peer.final(peer.send("ret", "minilm", {"id": fence_id, "text": fence_id}))["ok"]


def test_a_retained_request_is_refused_cleared_and_never_run(
    broker: Mosquitto, harness: Harness
) -> None:
    peer = PahoPeer(broker.port, "retainer", fmt="json")
    try:
        before = _publish_retained(peer, "kept-before")  # waiting on the topic for a bridge
        first, counting1 = harness.bridge(broker, device_id="ret", client_id="ret-1")
        refused = peer.final(before)
        assert refused["ok"] is False and refused["error"]["code"] == proto.BAD_REQUEST
        assert "retain" in refused["error"]["message"] and refused["id"] == "kept-before"
        _fenced(peer, "fence-1")
        during = _publish_retained(peer, "kept-during")  # while subscribed (v5: as published)
        assert peer.final(during)["error"]["code"] == proto.BAD_REQUEST
        first.stop()

        for n in (2, 3):  # new client ids: new sessions, each sent what is retained
            bridge, counting = harness.bridge(broker, device_id="ret", client_id=f"ret-{n}")
            _fenced(peer, f"fence-{n}")
            assert counting.calls == 1 and counting.texts[f"fence-{n}"] == 1
            bridge.stop()
        assert counting1.calls == 1  # its fence only
        assert len(peer.of(before)) == 1 and len(peer.of(during)) == 1  # refused once each
    finally:
        peer.close()
