"""A real Node-RED (4.1, pinned by nodered/package-lock.json; ``npm ci`` there, tools/setup.sh
does) running nodered/flows.json headless (nodered/settings.js: no editor, no admin API): mqtt
out with ``msg.responseTopic`` and ``msg.correlationData`` to the bridge, mqtt in on the reply
topic, over MQTT v5. The flow takes its work from ``nodered-test/ask`` and reports on
``nodered-test/answers``, ``nodered-test/availability`` (what it read on the device's
availability topic) and ``nodered-test/loop`` (a closed loop's round trips); ``NodeRed`` is the
test's side of those topics.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from interop_harness import HANG_S, NODE
from mosquitto import LOOPBACK, Mosquitto, free_port

FLOW_DIR = Path(__file__).resolve().parent / "nodered"
RED = FLOW_DIR / "node_modules" / "node-red" / "red.js"
TOPICS = ("nodered-test/answers", "nodered-test/availability", "nodered-test/loop")


def require_nodered() -> None:
    if NODE is None:
        pytest.skip("node is not installed: the Node-RED tests need Node.js")
    if not RED.is_file():
        pytest.fail(
            "Node-RED is not installed: run `npm ci` in tests/interop/nodered (tools/setup.sh does)"
        )


class NodeRed:
    """The test's side of the flow: asks go in, what the flow reports comes out, in order."""

    def __init__(self, broker: Mosquitto) -> None:
        from paho.mqtt.client import Client as PahoClient
        from paho.mqtt.enums import CallbackAPIVersion

        self._seen: dict[str, queue.Queue[bytes]] = {topic: queue.Queue() for topic in TOPICS}
        self._client = PahoClient(CallbackAPIVersion.VERSION2, client_id="nodered-test")
        self._client.on_message = lambda c, u, m: self._seen[m.topic].put(m.payload)
        self._client.connect(LOOPBACK, broker.port)
        self._client.loop_start()
        self._client.subscribe([(topic, 1) for topic in TOPICS])

    def ask(self, **ask: Any) -> None:
        """Hand the flow an ask, retained (it reads it once it has subscribed, however late);
        the flow turns it into a request. ``answer`` then clears it."""
        payload = json.dumps(ask)
        self._client.publish("nodered-test/ask", payload, qos=1, retain=True).wait_for_publish(
            HANG_S
        )

    def _next(self, topic: str) -> bytes:
        try:
            return self._seen[topic].get(timeout=HANG_S)
        except queue.Empty:
            pytest.fail(f"Node-RED sent nothing to {topic}")

    def answer(self, topic: str = "nodered-test/answers") -> Any:
        """What the flow made of the next reply (``nodered-test/loop``: of a whole closed
        loop); the ask is then cleared (asked once)."""
        payload = self._next(topic)
        self._client.publish("nodered-test/ask", b"", qos=1, retain=True).wait_for_publish(HANG_S)
        return json.loads(payload)

    def availability(self) -> bytes:
        """The next message the flow read on the device's availability topic."""
        return self._next("nodered-test/availability")

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


@contextmanager
def running_nodered(folder: Path, broker: Mosquitto) -> Iterator[NodeRed]:
    """Node-RED with the flow, connected to ``broker``; stopped (SIGTERM) afterwards."""
    require_nodered()
    assert NODE is not None
    folder.mkdir(parents=True)
    shutil.copy(FLOW_DIR / "flows.json", folder / "flows.json")  # Node-RED writes next to it
    reports = NodeRed(broker)
    env = {
        **os.environ,
        "MQTT_HOST": LOOPBACK,
        "MQTT_PORT": str(broker.port),
        "NODE_RED_PORT": str(free_port()),
    }
    command = [
        NODE,
        str(RED),
        "--userDir",
        str(folder),
        "--settings",
        str(FLOW_DIR / "settings.js"),
    ]
    with (folder / "nodered.log").open("wb") as log:
        proc = subprocess.Popen(
            [*command, str(folder / "flows.json")], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        yield reports
    finally:
        reports.close()
        proc.terminate()
        try:
            proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
