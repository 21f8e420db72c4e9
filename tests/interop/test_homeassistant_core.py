"""A real Home Assistant core (2024.3.3, homeassistant_core.py) discovers a two-member shared group
of ``edgeinfer serve`` as one device: its entities stay available through a ``kill -9`` of one
member, go unavailable when every member is gone, come back on a restart, and Home Assistant
logs no warning (template or other) along the way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from homeassistant_core import BARRIER, log_problems, registry, running_homeassistant
from interop_harness import DEVICE, rr, running_group, start_member

# installs Home Assistant into its own venv once (~1.5 min)
pytestmark = [pytest.mark.slow, pytest.mark.long]

ENTITIES = 2 * 4  # members x (status, latency p50, latency p99, queue depth) of one model


def ours(states: dict[str, str]) -> dict[str, str]:
    return {entity: state for entity, state in states.items() if entity != BARRIER}


def test_home_assistant_sees_one_device_available_while_any_member_serves(
    tmp_path: Path, fast_encoder: Path
) -> None:
    model = fast_encoder.name
    ha = tmp_path / "homeassistant"
    with running_group(tmp_path, fast_encoder) as (broker, members):
        with running_homeassistant(ha, broker) as states:
            (reply,) = rr(
                broker.port,
                *("-t", f"edgeinfer/{DEVICE}/{model}/req"),
                *("-e", f"edgeinfer/{DEVICE}/reply/ha", "-m", '{"id": "ha-1", "text": "hi"}'),
            )
            assert reply["ok"]
            states.wait(
                lambda s: (
                    len(ours(s)) == ENTITIES
                    and "unavailable" not in ours(s).values()
                    and list(ours(s).values()).count("serving") == 2
                ),  # each member's status sensor
                f"{ENTITIES} available entities, both members serving",
            )

            members["bridge-a"].kill9()
            # its Will (status offline) reached Home Assistant before the barrier did
            one_left = ours(states.barrier("one member killed"))
            assert "unavailable" not in one_left.values(), one_left

            members["bridge-b"].kill9()
            states.wait(
                lambda s: set(ours(s).values()) == {"unavailable"}, "every entity unavailable"
            )

            members["bridge-a"] = start_member(broker, fast_encoder, tmp_path, "bridge-a")
            states.wait(lambda s: "unavailable" not in ours(s).values(), "the entities back online")
            # read before the stop: at a stop, mqtt_statestream's own pending publishes
            # are reported as tasks that delay the shutdown
            problems = log_problems(ha)
    devices = [d for d in registry(ha, "device_registry")["devices"] if d["name"] != BARRIER]
    assert [d["identifiers"] for d in devices] == [[["mqtt", f"edgeinfer_edgeinfer_{DEVICE}"]]]
    entities = [
        e
        for e in registry(ha, "entity_registry")["entities"]
        if e["platform"] == "mqtt" and e["unique_id"] != BARRIER
    ]
    assert len(entities) == ENTITIES
    assert {e["device_id"] for e in entities} == {devices[0]["id"]}
    assert problems == []
