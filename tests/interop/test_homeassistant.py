"""Home Assistant conventions of ``edgeinfer serve --availability --ha-discovery homeassistant``:
every discovery config checked against the schema Home Assistant documents for MQTT discovery of
a sensor (single-component discovery), its templates rendered with Jinja2 against the real status
and metrics messages, and the plain availability topic's Last Will after a ``kill -9``.

The schema, from Home Assistant's MQTT integration docs: the config topic is
``<discovery_prefix>/<component>/[<node_id>/]<object_id>/config`` with ids of ``[a-zA-Z0-9_-]``;
the payload is a JSON object of the component's documented options; a sensor needs
``state_topic``; ``device`` (which needs ``unique_id`` on the entity) needs ``identifiers`` or
``connections``; ``availability`` (a list of ``{topic, payload_available,
payload_not_available, value_template}``) and ``availability_topic`` exclude each other;
``state_class`` is ``measurement``, ``total`` or ``total_increasing``; ``entity_category`` is
``config`` or ``diagnostic``; the ``duration`` device class takes d, h, min, s or ms.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from interop_harness import DEVICE, first_messages, rr, start_serve, wait_for
from mosquitto import running_mosquitto

sandbox = pytest.importorskip("jinja2.sandbox")

PREFIX = "homeassistant"
_TOPIC = re.compile(rf"^{PREFIX}/(sensor)/(?:[a-zA-Z0-9_-]+/)?[a-zA-Z0-9_-]+/config$")
# Options Home Assistant documents for an MQTT sensor (discovery takes exactly these).
SENSOR_OPTIONS = {
    "availability", "availability_mode", "availability_template", "availability_topic",
    "default_entity_id", "device", "device_class", "enabled_by_default", "encoding",
    "entity_category", "entity_picture", "expire_after", "force_update", "icon",
    "json_attributes_template", "json_attributes_topic", "last_reset_value_template", "name",
    "object_id", "options", "origin", "payload_available", "payload_not_available", "platform",
    "qos", "state_class", "state_topic", "suggested_display_precision", "unique_id",
    "unit_of_measurement", "value_template",
}  # fmt: skip
DEVICE_OPTIONS = {
    "configuration_url", "connections", "hw_version", "identifiers", "manufacturer", "model",
    "model_id", "name", "serial_number", "suggested_area", "sw_version", "via_device",
}  # fmt: skip
AVAILABILITY_OPTIONS = {"topic", "payload_available", "payload_not_available", "value_template"}
DURATION_UNITS = {"d", "h", "min", "s", "ms"}


def schema_errors(topic: str, config: Any) -> list[str]:
    """What in one discovery message breaks Home Assistant's documented sensor schema."""
    errors = []
    if not _TOPIC.match(topic):
        errors.append(f"topic {topic!r} is not {PREFIX}/sensor/[node/]object/config")
    if not isinstance(config, dict):
        return [*errors, "the payload is not a JSON object"]
    errors += [f"unknown option {key!r}" for key in set(config) - SENSOR_OPTIONS]
    if not isinstance(config.get("state_topic"), str) or not config["state_topic"]:
        errors.append("a sensor needs state_topic")
    device = config.get("device")
    if device is not None:
        if not isinstance(config.get("unique_id"), str):
            errors.append("a device needs the entity's unique_id")
        if not isinstance(device, dict) or not (
            device.get("identifiers") or device.get("connections")
        ):
            errors.append("device needs identifiers or connections")
        elif set(device) - DEVICE_OPTIONS:
            errors.append(f"unknown device options {set(device) - DEVICE_OPTIONS}")
    if "availability" in config and "availability_topic" in config:
        errors.append("availability and availability_topic exclude each other")
    for entry in config.get("availability", []):
        if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str):
            errors.append(f"availability entry {entry!r} needs a topic")
        elif set(entry) - AVAILABILITY_OPTIONS:
            errors.append(f"unknown availability options {set(entry) - AVAILABILITY_OPTIONS}")
    if config.get("state_class", "measurement") not in ("measurement", "total", "total_increasing"):
        errors.append(f"state_class {config['state_class']!r}")
    if config.get("entity_category", "diagnostic") not in ("config", "diagnostic"):
        errors.append(f"entity_category {config['entity_category']!r}")
    if (
        config.get("device_class") == "duration"
        and config.get("unit_of_measurement") not in DURATION_UNITS
    ):
        errors.append("a duration needs a unit of d, h, min, s or ms")
    if config.get("qos", 0) not in (0, 1, 2):
        errors.append(f"qos {config['qos']!r}")
    origin = config.get("origin")
    if origin is not None and not isinstance(origin.get("name"), str):
        errors.append("origin needs a name")
    return errors


def render(template: str, payload: bytes) -> str:
    """A template as Home Assistant renders it: ``value_json`` is the payload's JSON."""
    env = sandbox.ImmutableSandboxedEnvironment()
    return str(env.from_string(template).render(value_json=json.loads(payload), value=payload))


def test_discovery_configs_are_valid_and_availability_has_its_will(
    tmp_path: Path, minilm_int8: Path, smollm2: Path
) -> None:
    with running_mosquitto(tmp_path / "mosquitto") as broker:
        served = start_serve(
            broker,
            [minilm_int8, smollm2],
            tmp_path / "serve.log",
            *("--availability", "--ha-discovery", PREFIX, "--metrics-interval-s", "0.5"),
        )
        try:
            (reply,) = rr(
                broker.port,
                *(
                    "-t",
                    f"edgeinfer/{DEVICE}/minilm-int8/req",
                    "-e",
                    f"edgeinfer/{DEVICE}/reply/ha",
                ),
                *("-m", json.dumps({"id": "ha-1", "text": "pressure rising fast"})),
            )
            assert reply["ok"]
            published = [
                line.split(b" ", 1)
                for line in first_messages(broker.port, f"{PREFIX}/#", count=8, verbose=True)
            ]
            configs = {topic.decode(): json.loads(payload) for topic, payload in published}
            for topic, config in configs.items():
                assert schema_errors(topic, config) == [], (topic, config)
            assert len({c["unique_id"] for c in configs.values()}) == len(configs) == 8
            status = first_messages(broker.port, f"edgeinfer/{DEVICE}/status")[0]
            metrics = first_messages(broker.port, f"edgeinfer/{DEVICE}/metrics")[0]
            states = {}
            for config in configs.values():
                message = status if config["state_topic"].endswith("/status") else metrics
                states[config["name"]] = render(config["value_template"], message)
                if "json_attributes_template" in config:
                    attributes = json.loads(render(config["json_attributes_template"], status))
                    assert attributes["digest"] and attributes["task"]
                (availability,) = config["availability"]
                assert availability["topic"] == f"edgeinfer/{DEVICE}/availability"
            assert states["minilm-int8 status"] == states["smollm2 status"] == "serving"
            assert float(states["minilm-int8 latency p50"]) > 0
            assert float(states["minilm-int8 latency p99"]) >= float(
                states["minilm-int8 latency p50"]
            )
            assert int(states["minilm-int8 queue depth"]) == 0
            online = first_messages(broker.port, f"edgeinfer/{DEVICE}/availability")
            assert online == [b"online"]
            served.proc.send_signal(signal.SIGKILL)  # no goodbye: the Will speaks
            served.proc.wait()
            assert wait_for(broker.port, availability["topic"], lambda p: p == b"offline")
        finally:
            served.stop()
