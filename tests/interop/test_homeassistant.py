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
import subprocess
from pathlib import Path
from typing import Any

import pytest
from interop_harness import (
    DEVICE,
    GROUP,
    HANG_S,
    MEMBERS,
    SUB,
    first_messages,
    rr,
    running_group,
    start_serve,
    wait_for,
)
from mosquitto import LOOPBACK, Mosquitto, running_mosquitto

from edgeinfer.bridge.serve.homeassistant import discovery_messages

sandbox = pytest.importorskip("jinja2.sandbox")
StrictUndefined = pytest.importorskip("jinja2").StrictUndefined

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


def published_configs(broker: Mosquitto, *, count: int) -> dict[str, Any]:
    """The ``count`` retained discovery configs on ``broker`` (topic -> config), each checked
    against the schema, their unique ids distinct."""
    published = [
        line.split(b" ", 1)
        for line in first_messages(broker.port, f"{PREFIX}/#", count=count, verbose=True)
    ]
    configs = {topic.decode(): json.loads(payload) for topic, payload in published}
    for topic, config in configs.items():
        assert schema_errors(topic, config) == [], (topic, config)
    assert len({c["unique_id"] for c in configs.values()}) == len(configs) == count
    return configs


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
            configs = published_configs(broker, count=8)
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


def converged_configs(broker: Mosquitto, *, count: int, members: int) -> dict[str, Any]:
    """The discovery configs once there are ``count`` and each names ``members`` members (a
    member that started first knew only itself until it read the other's status)."""
    assert SUB is not None
    args = ["-h", LOOPBACK, "-p", str(broker.port), "-t", f"{PREFIX}/#", "-v", "-W", str(HANG_S)]
    latest: dict[str, Any] = {}
    with subprocess.Popen([SUB, *args], stdout=subprocess.PIPE) as sub:
        assert sub.stdout is not None
        for line in sub.stdout:
            topic, payload = line.rstrip(b"\n").split(b" ", 1)
            latest[topic.decode()] = json.loads(payload)
            if len(latest) == count and all(
                len(c["availability"]) == members for c in latest.values()
            ):
                sub.terminate()
                return latest
    pytest.fail(f"the configs never converged: {latest}")


def strict_render(template: str, payload: bytes) -> str:
    """``render``, failing on any field the payload lacks (Home Assistant logs a template
    warning for each)."""
    env = sandbox.ImmutableSandboxedEnvironment(undefined=StrictUndefined)
    return str(env.from_string(template).render(value_json=json.loads(payload), value=payload))


def test_group_configs_are_the_same_whichever_member_writes_them() -> None:
    from edgeinfer.bridge import BridgeConfig, Connection

    def config(member: str) -> BridgeConfig:
        connection = Connection(broker="mqtt://127.0.0.1:1883", client_id=member)
        return BridgeConfig(
            connection=connection, device_id=DEVICE, shared_group=GROUP, ha_discovery_prefix=PREFIX
        )

    models = {"minilm-int8": "embed", "smollm2": "generate"}
    first = discovery_messages(config("bridge-a"), models, members=["bridge-b"])
    second = discovery_messages(config("bridge-b"), models, members=["bridge-a", "bridge-b"])
    assert first == second
    assert len(first) == 2 * 2 * 4  # members x models x (status, p50, p99, queue depth)
    configs = [json.loads(payload) for _, payload in first]
    assert len({c["unique_id"] for c in configs}) == len(configs)
    assert {json.dumps(c["device"]) for c in configs} == {json.dumps(configs[0]["device"])}


def test_a_group_is_one_device_available_while_any_member_serves(
    tmp_path: Path, fast_encoder: Path
) -> None:
    model = fast_encoder.name
    with running_group(tmp_path, fast_encoder) as (broker, members):
        node = f"edgeinfer_edgeinfer_{DEVICE}"
        configs = converged_configs(broker, count=8, members=2)
        for topic, config in configs.items():
            assert schema_errors(topic, config) == [], (topic, config)
        assert len({c["unique_id"] for c in configs.values()}) == len(configs)
        assert {c["device"]["identifiers"][0] for c in configs.values()} == {node}
        statuses = [f"edgeinfer/{DEVICE}/status/{m}" for m in MEMBERS]
        for config in configs.values():
            assert config["availability_mode"] == "any"
            assert [a["topic"] for a in config["availability"]] == statuses
        by_member = {m: [c for c in configs.values() if m in c["unique_id"]] for m in MEMBERS}
        for member, own in by_member.items():
            assert len(own) == 4
            metrics = first_messages(broker.port, f"edgeinfer/{DEVICE}/metrics/{member}")[0]
            assert json.loads(metrics)["client_id"] == member
            for config in own:
                assert config["state_topic"].endswith(f"/{member}")
        group = f"edgeinfer/{DEVICE}/availability"
        assert first_messages(broker.port, group) == [b"online"]
        with subprocess.Popen(
            [SUB, "-h", LOOPBACK, "-p", str(broker.port), "-t", group, "-W", str(HANG_S)],
            stdout=subprocess.PIPE,
        ) as sub:
            assert sub.stdout is not None
            assert sub.stdout.readline() == b"online\n"  # the retained one
            members["bridge-a"].kill9()
            # its Will says offline for the group; the member still serving puts it back
            assert sub.stdout.readline() == b"offline\n"
            assert sub.stdout.readline() == b"online\n"
            sub.terminate()
        will = first_messages(broker.port, statuses[0])[0]
        assert json.loads(will)["state"] == "offline"
        status_sensor = next(
            c for c in by_member["bridge-a"] if c["name"].startswith(f"{model} status")
        )
        assert strict_render(status_sensor["value_template"], will) == "not served"
        assert json.loads(strict_render(status_sensor["json_attributes_template"], will)) == {}
        members["bridge-b"].kill9()
        assert wait_for(broker.port, group, lambda p: p == b"offline")
