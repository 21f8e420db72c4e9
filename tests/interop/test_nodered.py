"""A real Node-RED flow (nodered_harness.py: mqtt out + mqtt in, MQTT v5, the request's
ResponseTopic and CorrelationData set from ``msg.responseTopic`` and ``msg.correlationData``)
against a two-member shared group of ``edgeinfer serve``: answered, the device's availability
seen, answered again after ``kill -9`` of one member, ``offline`` once both are gone."""

from __future__ import annotations

from pathlib import Path

from interop_harness import running_group
from nodered_harness import NodeRed, running_nodered


def answered(red: NodeRed, model: str, request_id: str) -> None:
    red.ask(id=request_id, text="pressure rising fast", model=model)
    answer = red.answer()
    assert answer["correlation"] == request_id  # msg.correlationData, as the bridge echoed it
    assert answer["contentType"] == "application/json"
    assert answer["reply"]["ok"], answer
    assert answer["reply"]["id"] == request_id
    assert len(answer["reply"]["result"][0]) > 0


def test_a_nodered_flow_is_answered_by_the_group_and_sees_its_availability(
    tmp_path: Path, fast_encoder: Path
) -> None:
    model = fast_encoder.name
    with running_group(tmp_path, fast_encoder) as (broker, members):
        with running_nodered(tmp_path / "nodered", broker) as red:
            assert red.availability() == b"online"  # the retained one
            answered(red, model, "nodered-1")
            members["bridge-a"].kill9()
            # the group's topic: the Will's offline, put back by the member still serving
            assert [red.availability(), red.availability()] == [b"offline", b"online"]
            answered(red, model, "nodered-2")
            members["bridge-b"].kill9()
            assert red.availability() == b"offline"
