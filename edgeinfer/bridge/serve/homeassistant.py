"""Home Assistant conventions: a plain ``online``/``offline`` availability topic, and MQTT
discovery messages that make each served model's sensors appear by themselves.

**Availability** (``BridgeConfig.availability``): ``P/D/availability`` holds a retained plain
``online`` or ``offline`` (what Home Assistant and Node-RED expect without a template). MQTT gives
each connection one Last Will, and the bridge's own is the JSON status, so the plain topic is
held by a second, idle connection (client id ``CLIENT_ID-availability``) whose Will is
``offline``: when the process dies, both Wills fire.

**Discovery** (``BridgeConfig.ha_discovery_prefix``, usually ``homeassistant``): after every
connect the bridge publishes, retained, one sensor config per served model and measure to
``PREFIX/sensor/NODE/OBJECT/config`` (Home Assistant's single-component discovery schema): the
model's status (``serving`` / ``not served``, from ``P/D/status``, with its digest and signer as
attributes), its latency p50 and p99 (ms) and its queue depth (from ``P/D/metrics``'s
``per_model``). Every sensor names the device (one per bridge) and its availability: the plain
topic when it is on, else the JSON status with a template.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import replace
from importlib import metadata
from typing import TYPE_CHECKING, Any, Final

from edgeinfer.bridge.connection import connect_async, new_paho_client
from edgeinfer.bridge.serve.settings import BridgeConfig

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient
    from paho.mqtt.client import ConnectFlags
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["AvailabilityLink", "discovery_messages"]

log = logging.getLogger(__name__)

ONLINE: Final = b"online"
OFFLINE: Final = b"offline"
# Home Assistant's node and object ids: letters, digits, underscore and hyphen only.
_NOT_ID: Final = re.compile(r"[^a-zA-Z0-9_-]")
# measure -> (label, unit, template of per_model[NAME] in P/D/metrics); status is separate.
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


def discovery_messages(config: BridgeConfig, models: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """(topic, retained JSON payload) of every discovery config for ``models`` (name -> task)."""
    version = _version()
    node = _object_id("edgeinfer", config.topic_prefix, config.device_id)
    device = {
        "identifiers": [node],
        "name": f"edgeinfer {config.device_id}",
        "manufacturer": "edgeinfer",
        "model": "edgeinfer serve",
        "sw_version": version,
    }
    if config.availability:
        availability: dict[str, Any] = {"topic": config.availability_topic}
    else:
        availability = {"topic": config.status_topic, "value_template": "{{ value_json.state }}"}
    common = {
        "device": device,
        "origin": {"name": "edgeinfer", "sw_version": version},
        "availability": [{**availability, "payload_available": "online"}],
        "qos": 1,
    }
    metrics = f"{config.base}/metrics"
    messages = []
    for name, task in sorted(models.items()):
        key = json.dumps(name)  # a Jinja string literal (JSON escapes are Jinja's)
        configs = {
            "status": {
                "name": f"{name} status",
                "state_topic": config.status_topic,
                "value_template": (
                    f"{{{{ 'serving' if {key} in (value_json.models or {{}}) else 'not served' }}}}"
                ),
                "json_attributes_topic": config.status_topic,
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
            configs[measure] = sensor
        for measure, sensor in configs.items():
            object_id = _object_id(config.device_id, name, measure)
            payload = {**sensor, "unique_id": f"{node}_{_object_id(name, measure)}", **common}
            topic = f"{config.ha_discovery_prefix}/sensor/{node}/{object_id}/config"
            messages.append((topic, json.dumps(payload).encode()))
    return messages


class AvailabilityLink:
    """The plain availability topic, on a connection of its own (its Last Will: ``offline``).

    ``start`` connects it (it publishes ``online`` after each connect); ``stop`` publishes
    ``offline`` and disconnects.
    """

    def __init__(self, config: BridgeConfig) -> None:
        own_id = f"{config.connection.client_id[:115]}-availability"
        self._connection = replace(config.connection, client_id=own_id, session_expiry_s=0)
        self.topic = config.availability_topic
        self._client: PahoClient = new_paho_client(self._connection)
        self._client.will_set(self.topic, OFFLINE, qos=1, retain=True)
        self._client.on_connect = self._on_connect
        self._started = False

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

    def stop(self, *, timeout_s: float) -> None:
        """Say ``offline`` (the Will says it when this cannot), disconnect."""
        if not self._started:
            return
        if self._client.is_connected():
            info = self._client.publish(self.topic, OFFLINE, qos=1, retain=True)
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError):
                log.warning("could not publish 'offline'; the Last Will will")
        self._client.disconnect()
        self._client.loop_stop()
