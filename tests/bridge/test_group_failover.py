"""A shared group survives a dead member: two real ``edgeinfer serve`` processes in one
``--shared-group`` on a real mosquitto, one killed with -9 and not restarted; every request of a
client that follows the retry rule (re-send the same id after ``attempt_timeout_s``) is answered,
once.

Before group members started clean with a session that ends with the connection, the broker
kept the dead member's persistent session (one hour) and queued its round-robin share there,
re-sends included: about a quarter of the requests sent after the kill never got an answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bridge_harness import LOOPBACK, Mosquitto
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgeinfer.bridge import Client, Connection

REPO = Path(__file__).resolve().parents[2]
DEVICE = "fleet"
BEFORE_KILL = 10
AFTER_KILL = 40
# The retry rule: a reply takes milliseconds here, so a re-send means the attempt was lost.
ATTEMPT_TIMEOUT_S = 2.0
RETRIES = 3


class Member:
    """``edgeinfer serve`` as a group member process, with its own journal folder."""

    def __init__(self, broker: Mosquitto, package: Path, *, name: str, state: Path) -> None:
        command = [
            sys.executable, "-m", "edgeinfer", "serve", str(package), "--broker", broker.url,
            "--device-id", DEVICE, "--shared-group", "workers", "--client-id", name,
            "--metrics-interval-s", "0", "--threads", "1",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "EDGEINFER_STATE_DIR": str(state)}
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def wait_serving(self) -> None:
        assert self.proc.stdout is not None
        said = []
        for line in self.proc.stdout:  # blocks until it serves, or the process ends
            if line.startswith("serving"):
                return
            said.append(line)
        raise AssertionError(f"the member exited ({self.proc.wait()}): {''.join(said)}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _offline(broker: Mosquitto, member: str) -> threading.Event:
    """Set once the member's retained status says offline (its Last Will, after a kill)."""
    seen = threading.Event()

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        if message.payload and json.loads(message.payload).get("state") == "offline":
            seen.set()

    watcher = PahoClient(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    watcher.on_connect = lambda c, *a: c.subscribe(f"edgeinfer/{DEVICE}/status/{member}", qos=1)
    watcher.on_message = on_message
    watcher.connect(LOOPBACK, broker.port)
    watcher.loop_start()
    threading.Thread(target=lambda: (seen.wait(60), watcher.loop_stop()), daemon=True).start()
    return seen


def _send(client: Client, first: int, count: int) -> list[dict[str, object]]:
    futures = [
        client.submit(
            "tiny-encoder",
            text=f"job {i}",
            request_id=f"job-{i}",
            attempt_timeout_s=ATTEMPT_TIMEOUT_S,
            retries=RETRIES,
        )
        for i in range(first, first + count)
    ]
    return [f.result(timeout=120) for f in futures]


def test_a_killed_member_loses_no_request(
    own_broker: Mosquitto, fast_encoder: Path, tmp_path: Path
) -> None:
    members = [
        Member(own_broker, fast_encoder, name=f"member-{n}", state=tmp_path / n) for n in "ab"
    ]
    connection = Connection(broker=own_broker.url, client_id="group-device")
    try:
        for member in members:
            member.wait_serving()
        with Client(connection=connection, device_id=DEVICE) as client:
            replies = _send(client, 0, BEFORE_KILL)
            gone = _offline(own_broker, "member-a")
            members[0].kill9()  # not restarted
            assert gone.wait(30)  # the broker has seen the link go: its Last Will is out
            replies += _send(client, BEFORE_KILL, AFTER_KILL)
            duplicates = client.duplicate_replies
    finally:
        for member in members:
            member.stop()
    total = BEFORE_KILL + AFTER_KILL
    failed = [r for r in replies if r.get("ok") is not True]
    assert not failed, failed[:3]
    assert sorted(str(r["id"]) for r in replies) == sorted(f"job-{i}" for i in range(total))
    assert duplicates == 0  # nothing answered twice
