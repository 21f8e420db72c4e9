"""Home Assistant conventions: plain ``online``/``offline`` availability topics, and MQTT
discovery messages that make each served model's sensors appear by themselves, one device for
a whole shared group.

**Availability** (``BridgeConfig.availability``): ``P/D/availability`` holds a retained plain
``online`` or ``offline`` (what Home Assistant and Node-RED expect without a template). MQTT gives
each connection one Last Will, and the bridge's own is the JSON status, so the plain topic is
held by a second, idle connection (client id ``CLIENT_ID-availability``) whose Will is
``offline``: when the process dies, both Wills fire. In a shared group the topic is the
group's: every member's Will says ``offline`` there, and a member that is still up puts
``online`` back the moment it reads someone else's ``offline`` (it reads ``offline`` for one
round trip when one member of several dies; each member's own state is ``P/D/status/CLIENT_ID``).

**Discovery** (``BridgeConfig.ha_discovery_prefix``, usually ``homeassistant``): after every
connect the bridge publishes, retained, one sensor config per served model, measure and member
to ``PREFIX/sensor/NODE/OBJECT/config`` (Home Assistant's single-component discovery schema):
the model's status (``serving`` / ``not served``, from the member's status, with its digest and
signer as attributes), its latency p50 and p99 (ms) and its queue depth (from the member's
metrics' ``per_model``). All name one device per ``P/D``. Alone, a bridge is the only member
and its sensors' availability is the plain topic when it is on, else the JSON status with a
template. In a shared group (``GroupMembers``) each member learns the others from their
retained ``P/D/status/CLIENT_ID`` and publishes every member's sensors with one availability
list over all the members' statuses, ``availability_mode: any``: the configs are a function of
the member set alone, so every member writes the same bytes (the device does not follow the last
writer), and an entity is unavailable only when every member is gone.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final, Protocol

from edgeinfer.bridge.connection import connect_async, new_paho_client
from edgeinfer.bridge.serve.settings import BridgeConfig

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient
    from paho.mqtt.client import ConnectFlags, MQTTMessage
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

    from edgeinfer.bridge.models import ModelTable

__all__ = ["AvailabilityLink", "Discovery", "GroupMembers", "discovery_messages"]

log = logging.getLogger(__name__)


class Publish(Protocol):
    """How the bridge publishes (``Outbox.publish``: a refused publish is logged)."""

    def __call__(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> object: ...


ONLINE: Final = b"online"
OFFLINE: Final = b"offline"
# Home Assistant's node and object ids: letters, digits, underscore and hyphen only.
_NOT_ID: Final = re.compile(r"[^a-zA-Z0-9_-]")
# measure -> (label, unit, template of per_model[NAME] in the metrics); status is separate.
_MEASURES: Final = {
    "latency_p50": ("latency p50", "ms", "latency_ms.p50"),
    "latency_p99": ("latency p99", "ms", "latency_ms.p99"),
    "queue_depth": ("queue depth", None, "queue_depth"),
}


def _version() -> str:
    try:
        return metadata.version("edgeinfer")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _object_id(*parts: str) -> str:
    return _NOT_ID.sub("_", "_".join(parts))


def _availability(config: BridgeConfig, members: tuple[str, ...]) -> dict[str, Any]:
    """The ``availability`` options: every member's status (any one online will do) in a
    group; alone, the plain topic when it is kept, else the JSON status."""
    as_json = {"value_template": "{{ value_json.state }}", "payload_available": "online"}
    if config.shared_group:
        sources = [{"topic": config.member_status_topic(m), **as_json} for m in members]
        return {"availability": sources, "availability_mode": "any"}
    if config.availability:
        return {
            "availability": [{"topic": config.availability_topic, "payload_available": "online"}]
        }
    return {"availability": [{"topic": config.status_topic, **as_json}]}


def _model_sensors(name: str, task: str, status: str, metrics: str) -> dict[str, dict[str, Any]]:
    """measure -> sensor options of one model, read from one member's status and metrics."""
    key = json.dumps(name)  # a Jinja string literal (JSON escapes are Jinja's)
    sensors: dict[str, dict[str, Any]] = {
        "status": {
            "name": f"{name} status",
            "state_topic": status,
            "value_template": (
                f"{{{{ 'serving' if {key} in (value_json.models or {{}}) else 'not served' }}}}"
            ),
            "json_attributes_topic": status,
            "json_attributes_template": (
                f"{{{{ (value_json.models or {{}}).get({key}, {{}}) | tojson }}}}"
            ),
            "icon": "mdi:brain" if task != "generate" else "mdi:text-box-outline",
        }
    }
    for measure, (label, unit, path) in _MEASURES.items():
        sensor: dict[str, Any] = {
            "name": f"{name} {label}",
            "state_topic": metrics,
            "value_template": f"{{{{ value_json.per_model[{key}].{path} }}}}",
            "state_class": "measurement",
            "entity_category": "diagnostic",
        }
        if unit is not None:
            sensor.update(unit_of_measurement=unit, device_class="duration")
        sensors[measure] = sensor
    return sensors


def discovery_messages(
    config: BridgeConfig, models: Mapping[str, str], *, members: Iterable[str] = ()
) -> list[tuple[str, bytes]]:
    """(topic, retained JSON payload) of every discovery config for ``models`` (name -> task).

    ``members``: the client ids of the shared group's members (this bridge's is added); the
    same set gives the same bytes whichever member computes them. Alone, this bridge only.
    """
    version = _version()
    node = _object_id("edgeinfer", config.topic_prefix, config.device_id)
    own = config.connection.client_id
    group = tuple(sorted({own, *members})) if config.shared_group else (own,)
    common = {
        "device": {
            "identifiers": [node],
            "name": f"edgeinfer {config.device_id}",
            "manufacturer": "edgeinfer",
            "model": "edgeinfer serve",
            "sw_version": version,
        },
        "origin": {"name": "edgeinfer", "sw_version": version},
        **_availability(config, group),
        "qos": 1,
    }
    messages = []
    for member in group:
        # alone: no member in the names and ids (they stay what they were before groups)
        tag = (member,) if config.shared_group else ()
        status, metrics = config.member_status_topic(member), config.member_metrics_topic(member)
        for name, task in sorted(models.items()):
            for measure, sensor in _model_sensors(name, task, status, metrics).items():
                if tag:
                    sensor["name"] = f"{sensor['name']} ({member})"
                object_id = _object_id(config.device_id, *tag, name, measure)
                unique_id = f"{node}_{_object_id(*tag, name, measure)}"
                payload = {**sensor, "unique_id": unique_id, **common}
                topic = f"{config.ha_discovery_prefix}/sensor/{node}/{object_id}/config"
                messages.append((topic, json.dumps(payload).encode()))
    return messages


class Discovery:
    """The discovery configs one bridge publishes: after every connect, and again whenever it
    learns a new group member (``took``). Used on paho's network thread only."""

    def __init__(self, config: BridgeConfig, *, models: ModelTable, publish: Publish) -> None:
        self._config = config
        self._models = models
        self._publish_one = publish
        self._members = GroupMembers(config) if config.shared_group else None

    def connected(self, client: PahoClient) -> None:
        """Publish the configs; in a group, read the members' statuses (retained: at once)."""
        if self._members is not None:
            client.subscribe(self._members.topic_filter, qos=1)
        self._publish()

    def took(self, message: MQTTMessage) -> bool:
        """Whether ``message`` was a group member's status (handled here: a new member's
        sensors are published, with the availability list grown on every sensor)."""
        if self._members is None or not self._members.owns(message.topic):
            return False
        if self._members.saw(message):
            self._publish()
        return True

    def _publish(self) -> None:
        tasks = {name: model.task for name, model in self._models.items()}
        members = () if self._members is None else self._members.members
        for topic, payload in discovery_messages(self._config, tasks, members=members):
            self._publish_one(topic, payload, qos=1, retain=True)


class GroupMembers:
    """The members of a shared group, learned from their retained ``P/D/status/CLIENT_ID``
    (a member that went offline stays one: its status is still there, and so are its
    sensors). Used on paho's network thread only."""

    def __init__(self, config: BridgeConfig) -> None:
        self._prefix = config.member_status_topic("")
        self.topic_filter = f"{self._prefix}#"
        self.members: set[str] = {config.connection.client_id}

    def owns(self, topic: str) -> bool:
        """Whether ``topic`` is a member's status."""
        return topic.startswith(self._prefix) and len(topic) > len(self._prefix)

    def saw(self, message: MQTTMessage) -> bool:
        """Note the member whose status this is; True when it is a new one."""
        member = message.topic[len(self._prefix) :]
        if member in self.members or not message.payload:  # an empty one: a status cleared
            return False
        self.members.add(member)
        return True


class AvailabilityLink:
    """The plain availability topic, on a connection of its own (its Last Will: ``offline``).

    ``start`` connects it (it publishes ``online`` after each connect); ``stop`` publishes
    ``offline`` and disconnects. In a shared group it also reads the (group's) topic and puts
    ``online`` back when another member's Will or goodbye said ``offline``.
    """

    def __init__(self, config: BridgeConfig) -> None:
        own_id = f"{config.connection.client_id[:115]}-availability"
        self._connection = replace(config.connection, client_id=own_id, session_expiry_s=0)
        self.topic = config.availability_topic
        self._group = config.shared_group is not None
        self._client: PahoClient = new_paho_client(self._connection)
        self._client.will_set(self.topic, OFFLINE, qos=1, retain=True)
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._started = False
        self._stopping = False

    def start(self) -> None:
        """Connect in the background (once)."""
        if not self._started:
            self._started = True
            connect_async(self._client, self._connection)
            self._client.loop_start()

    def _on_connect(
        self,
        client: PahoClient,
        userdata: Any,
        flags: ConnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            log.error("the availability connection was refused: %s", reason)
            return
        client.publish(self.topic, ONLINE, qos=1, retain=True)
        if self._group:  # after the publish: the retained message it reads back is current
            client.subscribe(self.topic, qos=1)

    def _on_message(self, client: PahoClient, userdata: Any, message: MQTTMessage) -> None:
        if message.payload == OFFLINE and not self._stopping:  # another member left; we serve
            client.publish(self.topic, ONLINE, qos=1, retain=True)

    def stop(self, *, timeout_s: float) -> None:
        """Say ``offline`` (the Will says it when this cannot), disconnect."""
        if not self._started:
            return
        self._stopping = True
        if self._client.is_connected():
            info = self._client.publish(self.topic, OFFLINE, qos=1, retain=True)
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError):
                log.warning("could not publish 'offline'; the Last Will will")
        self._client.disconnect()
        self._client.loop_stop()
