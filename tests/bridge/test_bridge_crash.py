"""``kill -9`` of the bridge mid-request, QoS 1: every accepted request is answered exactly once
after the restart (same client id), and a duplicate sent after the restart gets the journal's
answer (``"replay": true``) without running again.

The bridge is a real process (crash_bridge.py) on a real mosquitto; the device is plain paho
with a persistent session. The bridge's requests never finish before the kill (``--hold``:
a generation stops after its first streamed chunk, a tensor request inside ``run``), so each
one is in flight when the bridge dies. The test waits on what it can see: the streamed chunks
(or the journal's rows), the final replies, and at the end a fence message the device sends
itself after the bridge has exited (the broker delivers it after everything the bridge sent).

Before the journal, paho acknowledged each request on receipt, so the broker had nothing to
redeliver after the kill and no final reply ever came (the generate test fails on that code).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bridge_harness import LOOPBACK, Mosquitto, wait_until
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeinfer.bridge.wire import arrays
from edgeinfer.bridge.wire import protocol as proto

SCRIPT = Path(__file__).with_name("crash_bridge.py")
REPO = Path(__file__).resolve().parents[2]
REQUESTS = 3
TOPIC = "edgeinfer/crash/m/req"


class Device:
    """Plain paho v5 with a persistent session: every message it gets, per correlation."""

    def __init__(self, port: int) -> None:
        self.reply_topic = "edgeinfer/clients/crash-device/reply"
        self.got: defaultdict[bytes, list[dict[str, Any]]] = defaultdict(list)
        self._cond = threading.Condition()
        ready = threading.Event()
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2,
            client_id="crash-device",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.on_connect = lambda c, *a: c.subscribe(self.reply_topic, qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect(LOOPBACK, port, clean_start=False, properties=props)
        self.client.loop_start()
        assert ready.wait(10)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        correlation = bytes(message.properties.CorrelationData)
        reply = {} if not message.payload else proto.decode_reply(message.payload)
        with self._cond:
            self.got[correlation].append(reply)
            self._cond.notify_all()

    def send(self, body: dict[str, Any]) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = str(body["id"]).encode()
        payload = json.dumps(body).encode()
        self.client.publish(TOPIC, payload, qos=1, properties=props).wait_for_publish(10)

    def of(self, correlation: str) -> list[dict[str, Any]]:
        with self._cond:
            return list(self.got[correlation.encode()])

    def finals(self, correlation: str) -> list[dict[str, Any]]:
        return [m for m in self.of(correlation) if "chunk" not in m]

    def fence(self) -> None:
        """Send itself a message through the broker and wait for it: whatever the broker had
        for this device before (the exited bridge's replies) has been delivered."""
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = b"fence"
        self.client.publish(self.reply_topic, b"", qos=1, properties=props).wait_for_publish(10)
        wait_until(lambda: bool(self.of("fence")))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class BridgeProcess:
    """crash_bridge.py as a process, with its RSS and CPU time read from /proc."""

    def __init__(self, broker: Mosquitto, package: Path, *, hold: bool) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        command = [sys.executable, str(SCRIPT), broker.url, str(package)]
        self.proc = subprocess.Popen(
            [*command, *(["--hold"] if hold else [])],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        said = []  # log lines before "ready" (a restart's reconnect notice, say) are kept
        for line in self.proc.stdout:  # blocks until "ready" or the process ends
            if line.strip() == "ready":
                break
            said.append(line)
        else:
            raise AssertionError("the bridge ended before it was ready:\n" + "".join(said))
        self.peak_rss_mb = 0.0
        self.sample()

    def sample(self) -> dict[str, float]:
        """RSS (MiB, also kept as the peak) and CPU time (s) so far."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line[:6] == "VmRSS:")
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        self.peak_rss_mb = max(self.peak_rss_mb, rss_kb / 1024)
        return {"rss_mb": rss_kb / 1024, "cpu_s": cpu_s}

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM: finish, mark offline, exit (everything it published is acknowledged)."""
        self.proc.terminate()
        assert self.proc.wait(60) == 0


@pytest.fixture
def device(own_broker: Mosquitto) -> Any:
    peer = Device(own_broker.port)
    yield peer
    peer.close()


def _pending_rows(state: Path) -> int:
    journals = list((state / "bridge").glob("journal-*.sqlite3"))
    if not journals:
        return 0
    with sqlite3.connect(journals[0]) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM requests WHERE answered_ms IS NULL").fetchone()
    return int(count)


def _crash_and_restart(
    broker: Mosquitto,
    package: Path,
    device: Device,
    bodies: list[dict[str, Any]],
    in_flight: Any,
) -> None:
    """Send ``bodies``, wait until ``in_flight()``, kill -9, restart, check once-each."""
    ids = [str(body["id"]) for body in bodies]
    held = BridgeProcess(broker, package, hold=True)
    for body in bodies:
        device.send(body)
    wait_until(in_flight, timeout_s=120)
    before_kill = held.sample()
    held.kill9()

    restarted = BridgeProcess(broker, package, hold=False)
    wait_until(lambda: all(device.finals(i) for i in ids), timeout_s=120)
    after_answers = restarted.sample()
    device.send(bodies[0])  # a duplicate after the restart: the journal's answer, once
    wait_until(lambda: len(device.finals(ids[0])) == 2, timeout_s=60)
    restarted.stop()
    device.fence()

    for rid in ids:
        finals = device.finals(rid)
        fresh = [m for m in finals if not m.get("replay")]
        assert len(fresh) == 1 and fresh[0]["ok"], finals  # answered exactly once
        assert fresh[0]["id"] == rid
    repeat = device.finals(ids[0])
    assert len(repeat) == 2 and repeat[1]["replay"] is True
    assert {k: v for k, v in repeat[1].items() if k != "replay"} == repeat[0]
    assert all(len(device.finals(rid)) == 1 for rid in ids[1:])
    # The bridge process's footprint, for the record (pytest -rP shows it); not a threshold.
    print(f"bridge before kill -9: {before_kill}; after re-answering: {after_answers}")


def test_kill_9_mid_generation_every_request_answered_once_after_restart(
    own_broker: Mosquitto, tiny_package: Path, device: Device
) -> None:
    bodies = [
        {"id": f"gen-{i}", "prompt": f"story {i}", "max_new_tokens": 12} for i in range(REQUESTS)
    ]
    # In flight: each generation streamed a chunk (batched together: 3 at once), none finished.
    chunked = lambda: all(device.of(str(b["id"])) for b in bodies)  # noqa: E731
    _crash_and_restart(own_broker, tiny_package, device, bodies, chunked)
    for body in bodies:
        final = device.finals(str(body["id"]))[0]
        assert final["done"] is True and final["result"]["stop_reason"] in ("length", "eos")


def test_kill_9_mid_tensor_request_every_request_answered_once_after_restart(
    own_broker: Mosquitto,
    fast_raw: Path,
    device: Device,
    state_dir: Path,
) -> None:
    x = arrays.encode_array(np.ones((1, 4), np.float32), binary=False)
    bodies = [{"id": f"t-{i}", "inputs": {"x": x}} for i in range(REQUESTS)]
    # In flight: all three recorded in the journal (one running, two queued), none answered.
    recorded = lambda: _pending_rows(state_dir) == REQUESTS  # noqa: E731
    _crash_and_restart(own_broker, fast_raw, device, bodies, recorded)
    for body in bodies:
        out = device.finals(str(body["id"]))[0]["result"]["out"]
        assert np.allclose(arrays.decode_array(out, what="out"), 2.0)  # out = 0 + 2x
    assert _pending_rows(state_dir) == 0
