"""A real Home Assistant core for the interop tests: its own venv (``tools/homeassistant_env.sh``,
Home Assistant 2024.3.3 under its own package_constraints.txt), started headless as a subprocess
with a fresh config folder, its MQTT integration pointed at the test's mosquitto.

The MQTT integration has no YAML broker setup since 2022.12: it is a config entry, which Home
Assistant keeps in ``.storage/core.config_entries`` (what its config flow writes); the test writes
that file before the start. What Home Assistant makes of the discovery messages is read back
over MQTT through ``mqtt_statestream`` (a Home Assistant integration that publishes every
entity's state to ``hastate/DOMAIN/OBJECT/state``), and its device and entity registries from
``.storage`` after a clean stop.

``Barrier``: a sensor the test itself makes (discovery config, then a state), so that "Home
Assistant has handled every message published before this one" is an event, not a wait:
mosquitto delivers one subscriber's messages in order, and Home Assistant handles its MQTT
messages, and publishes their state changes, in that order.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from interop_harness import HANG_S
from mosquitto import LOOPBACK, Mosquitto

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = REPO / "tools" / "homeassistant_env.sh"
VENV = REPO / ".venv-homeassistant"
STATES = "hastate"
BARRIER = "edgeinfer_test_barrier"


def ensure_venv() -> Path:
    """``hass`` of the Home Assistant venv, made (once, ~1.5 min) by tools/homeassistant_env.sh."""
    done = subprocess.run([str(ENV_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        pytest.fail(
            f"tools/homeassistant_env.sh failed: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
    return VENV / "bin" / "hass"


def write_config(folder: Path, broker: Mosquitto) -> None:
    """A minimal configuration.yaml and the MQTT config entry for ``broker``."""
    (folder / ".storage").mkdir(parents=True)
    (folder / "configuration.yaml").write_text(
        "homeassistant:\n  name: edgeinfer-test\n"
        "logger:\n  default: warning\n"
        f"mqtt_statestream:\n  base_topic: {STATES}\n  publish_attributes: true\n"
    )
    entry = {
        "entry_id": "edgeinfertestmqttentry",
        "version": 1,
        "minor_version": 1,
        "domain": "mqtt",
        "title": LOOPBACK,
        "data": {"broker": LOOPBACK, "port": broker.port, "discovery": True},
        "options": {},
        "pref_disable_new_entities": False,
        "pref_disable_polling": False,
        "source": "user",
        "unique_id": None,
        "disabled_by": None,
    }
    entries = {
        "version": 1,
        "minor_version": 1,
        "key": "core.config_entries",
        "data": {"entries": [entry]},
    }
    (folder / ".storage" / "core.config_entries").write_text(json.dumps(entries))


class States:
    """Every entity state Home Assistant publishes (mqtt_statestream), the latest per entity."""

    def __init__(self, broker: Mosquitto) -> None:
        from paho.mqtt.client import Client as PahoClient
        from paho.mqtt.enums import CallbackAPIVersion

        self.latest: dict[str, str] = {}
        self._changed = threading.Condition()
        self._client = PahoClient(CallbackAPIVersion.VERSION2, client_id="ha-test-states")
        self._client.on_message = self._on_message
        self._subscribed = threading.Event()
        self._client.on_subscribe = lambda *_: self._subscribed.set()
        self._client.connect(LOOPBACK, broker.port)
        self._client.subscribe(f"{STATES}/sensor/+/state", qos=1)
        self._client.loop_start()
        assert self._subscribed.wait(HANG_S)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        entity = message.topic.split("/")[2]
        with self._changed:
            self.latest[entity] = message.payload.decode()
            self._changed.notify_all()

    def wait(self, done: Callable[[dict[str, str]], bool], what: str) -> dict[str, str]:
        """Until ``done(latest states)``; fails (saying ``what``) after the hang guard."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(self.latest), timeout=HANG_S):
                pytest.fail(f"Home Assistant never showed {what}: {self.latest}")
            return dict(self.latest)

    def publish(self, topic: str, payload: str, *, retain: bool = False) -> None:
        self._client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(HANG_S)

    def barrier(self, mark: str) -> dict[str, str]:
        """The states once Home Assistant handled everything published before this call."""
        # retained: the first one may come before Home Assistant subscribed to the topic
        self.publish(f"edgeinfer-test/{BARRIER}", mark, retain=True)
        return self.wait(lambda s: s.get(BARRIER) == mark, f"the barrier {mark!r}")

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def barrier_config() -> str:
    """The discovery config of the barrier sensor (entity ``sensor.edgeinfer_test_barrier``)."""
    return json.dumps(
        {
            "name": BARRIER,
            "object_id": BARRIER,
            "unique_id": BARRIER,
            "state_topic": f"edgeinfer-test/{BARRIER}",
        }
    )


@contextmanager
def running_homeassistant(folder: Path, broker: Mosquitto) -> Iterator[States]:
    """Home Assistant on ``broker``, its discovery working (the barrier sensor seen); yields its
    states; stops it cleanly (its registries then saved in ``folder/.storage``)."""
    hass = ensure_venv()
    write_config(folder, broker)
    states = States(broker)
    with (folder / "hass.out").open("wb") as out:
        proc = subprocess.Popen(
            [str(hass), "--config", str(folder), "--skip-pip"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        # retained: Home Assistant reads it once its discovery subscription is made
        states.publish(f"homeassistant/sensor/{BARRIER}/config", barrier_config(), retain=True)
        states.barrier("ready")
        yield states
    finally:
        states.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def registry(folder: Path, name: str) -> dict[str, Any]:
    """``.storage/core.NAME`` as Home Assistant saved it (its ``data``)."""
    data: dict[str, Any] = json.loads((folder / ".storage" / f"core.{name}").read_text())["data"]
    return data


def log_problems(folder: Path) -> list[str]:
    """Home Assistant's WARNING and ERROR log lines, less the two every start here logs (pip is
    skipped on purpose; Python 3.11 is deprecated from 2024.4 on)."""
    expected = ("Skipping pip installation", "Support for the running Python version")
    lines = (folder / "home-assistant.log").read_text().splitlines()
    return [
        line
        for line in lines
        if (" WARNING " in line or " ERROR " in line) and not any(e in line for e in expected)
    ]
