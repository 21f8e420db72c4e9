"""Twenty bridges on one REAL mosquitto, in this process (twenty bridge subprocesses would not
fit two cores), each with its own deploy folder and live traffic, and rollouts in waves:

- a release that passes its smoke check but embeds some live texts elsewhere: the first wave
  rolls it back by itself (its trial's shadow comparison) and the rollout aborts before the rest;
- a good release, its operator (``edgeinfer rollout`` in a subprocess) killed with SIGKILL mid
  rollout and run again: it resumes, no device gets the release twice, none is skipped, and a
  device offline at its turn gets it when it comes back (``--offline wait``);
- through both, every request sent is answered, once.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from bridge_harness import LOOPBACK, Mosquitto
from fleet_harness import CLASS, NAME, Device, Releases, Traffic, releases, summary
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgeinfer.bridge import Connection
from edgeinfer.bridge.fleet.progress import DONE, Progress, RolloutBusyError, rollout_lock
from edgeinfer.bridge.fleet.rollout import RolloutPlan, rollout
from edgeinfer.bridge.ota.signing import generate_keypair
from edgeinfer.manifest import Manifest

REPO = Path(__file__).resolve().parents[2]
FLEET = 20
OFFLINE = "gw-19"  # last in order: it is not in the first waves


class Recorder:
    """Every deploy status any device publishes, in order (device, deploy_id, state)."""

    def __init__(self, port: int) -> None:
        self.seen: queue.Queue[tuple[str, str, str]] = queue.Queue()
        ready = threading.Event()
        self.client = PahoClient(CallbackAPIVersion.VERSION2, client_id="recorder",
                                 protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
        self.client.on_connect = lambda c, *a: c.subscribe("edgeinfer/+/ota/status", 1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect(LOOPBACK, port)
        self.client.loop_start()
        assert ready.wait(10)

    def _on_message(self, client: object, userdata: object, message: object) -> None:
        status = json.loads(message.payload)  # type: ignore[attr-defined]
        device = message.topic.split("/")[1]  # type: ignore[attr-defined]
        self.seen.put((device, str(status.get("deploy_id")), str(status.get("state"))))

    def states(self, deploy_id: str) -> Counter[tuple[str, str]]:
        """(device, state) -> how often, for one deploy."""
        return Counter((d, s) for d, i, s in list(self.seen.queue) if i == deploy_id)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@dataclass
class Fleet:
    broker: Mosquitto
    packages: Releases
    devices: dict[str, Device]
    recorder: Recorder
    state_dir: Path
    traffic: Traffic

    def plan(self, **options: object) -> RolloutPlan:
        base: dict[str, object] = {"compatible": CLASS, "start": 2, "factor": 2.0,
                                   "max_failure_share": 0.2, "min_count": 2,
                                   "device_timeout_s": 120.0, "offline_wait_s": 120.0}  # fmt: skip
        return RolloutPlan(**{**base, **options})  # type: ignore[arg-type]

    def connection(self) -> Connection:
        return Connection(broker=self.broker.url, client_id=f"operator-{os.urandom(3).hex()}")


def _deploy_id(package: Path) -> str:
    release = json.loads((package / "manifest.sig").read_text())["release"]
    return f"{NAME}-{release['manifest_sha256'][:16]}-v{release['version']}"


@pytest.fixture(scope="module")
def fleet(broker: Mosquitto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    key, pub, _ = generate_keypair(tmp / "keys" / "release")
    packages = releases(tmp / "pkgs", key, versions=(3, 2))  # the bad one goes first
    recorder = Recorder(broker.port)
    devices = {}
    for n in range(FLEET):
        device = Device(f"gw-{n:02d}", tmp / f"gw-{n:02d}", broker.url, pub, packages.origin)
        devices[device.device_id] = device.start()
        device.connect()
    devices[OFFLINE].stop()  # its retained status: offline, still of the class
    traffic = Traffic(list(devices.values())).start()
    try:
        yield Fleet(broker, packages, devices, recorder, tmp / "rollouts", traffic)
    finally:
        traffic.stop()
        recorder.close()
        for device in devices.values():
            device.stop()
            if device.client is not None:
                device.client.close()


def test_a_release_live_traffic_catches_rolls_back_in_the_first_wave_and_aborts(
    fleet: Fleet,
) -> None:
    origin = Manifest.read(fleet.packages.origin).digest
    report = rollout(fleet.packages.bad, connection=fleet.connection(),
                     state_dir=fleet.state_dir, plan=fleet.plan())  # fmt: skip
    by_id = {d.device_id: d for d in report.devices}
    first = report.waves[0]["devices"]
    assert report.state == "aborted" and len(first) == 2 and len(by_id) == FLEET
    for device_id in first:
        assert by_id[device_id].state == "rolled_back", by_id[device_id]
        assert by_id[device_id].reason == "trial_agreement"
    rest = [d for d in report.devices if d.device_id not in first]
    assert {d.state for d in rest} == {"skipped"}  # the offline one too: nothing was sent
    # Only the first wave ever served the bad package; every device serves the origin now.
    served_bad = {
        d for d, s in fleet.recorder.states(_deploy_id(fleet.packages.bad)) if s == "trial"
    }
    assert served_bad == set(first)
    for device_id, device in fleet.devices.items():
        if device.bridge is not None:
            assert device.serves() == origin
            assert by_id[device_id].serves == origin


def _operator(fleet: Fleet) -> tuple[subprocess.Popen[str], queue.Queue[str | None]]:
    """``edgeinfer rollout`` in a subprocess, and its progress lines as it prints them (None
    once it closed its output); the lines are kept in operator.log too."""
    command = [sys.executable, "-m", "edgeinfer", "rollout", str(fleet.packages.good),
               "--state-dir", str(fleet.state_dir), "--compatible", CLASS, "--start", "2",
               "--factor", "2", "--device-timeout-s", "120", "--broker", fleet.broker.url,
               "--offline-wait-s", "120"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    operator = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def read(out: IO[str]) -> None:
        with (fleet.state_dir.parent / "operator.log").open("w") as log:
            for line in out:
                log.write(line)
                lines.put(line.rstrip("\n"))
        lines.put(None)

    assert operator.stdout is not None
    threading.Thread(target=read, args=(operator.stdout,), daemon=True).start()
    return operator, lines


def _wait_done(lines: queue.Queue[str | None], done: int) -> None:
    """Until the operator has printed ``done`` devices done (it prints a device's step, e.g.
    ``gw-03: committed``, once it has recorded it; a hang guard of 300 s)."""
    give_up = time.monotonic() + 300
    finished: set[str] = set()
    while len(finished) < done:
        try:
            line = lines.get(timeout=max(0.0, give_up - time.monotonic()))
        except queue.Empty:
            raise AssertionError("the operator made no progress") from None
        assert line is not None, "the operator ended before it was killed"
        device, _, step = line.partition(": ")
        if step.split(" ")[0] in DONE:
            finished.add(device)


def test_a_killed_operator_resumes_none_twice_none_skipped_offline_device_on_return(
    fleet: Fleet,
) -> None:
    good = Manifest.read(fleet.packages.good).digest
    operator, lines = _operator(fleet)
    try:
        _wait_done(lines, 2)  # the first wave is done; the second under way
        with pytest.raises(RolloutBusyError):  # the same name cannot run twice at once
            with rollout_lock(fleet.state_dir, NAME):
                pass
    finally:
        operator.send_signal(signal.SIGKILL)
        operator.wait(30)
    progress = Progress(fleet.state_dir)
    try:
        at_kill = progress.devices(NAME)
    finally:
        progress.close()
    assert 2 <= sum(r.done for r in at_kill) < FLEET  # killed mid-rollout, not after it

    offline = fleet.devices[OFFLINE]
    seen_waiting = threading.Event()  # the rollout has recorded it waiting, offline
    if {r.device_id: r.state for r in at_kill}.get(OFFLINE) == "waiting":
        seen_waiting.set()  # recorded by the killed operator: the resumed run leaves it so

    def on_step(device: str, step: str) -> None:  # called once the step is recorded
        if device == OFFLINE and step.startswith("waiting"):
            seen_waiting.set()

    def back_when_waiting() -> None:  # comes back once the rollout has seen it offline
        if seen_waiting.wait(300):
            offline.start()

    returner = threading.Thread(target=back_when_waiting, daemon=True)
    returner.start()
    report = rollout(
        fleet.packages.good,
        connection=fleet.connection(),
        state_dir=fleet.state_dir,
        plan=fleet.plan(),
        on_step=on_step,
    )  # the lock came free
    returner.join(60)
    assert report.state == "done", report.as_dict()
    assert report.counts() == {"committed": FLEET}, report.as_dict()
    trials = fleet.recorder.states(_deploy_id(fleet.packages.good))
    for device_id, device in fleet.devices.items():
        assert trials[(device_id, "trial")] == 1, trials  # deployed once, killed or not
        assert trials[(device_id, "committed")] == 1
        assert device.serves() == good
    assert {d.serves for d in report.devices} == {good}
    fleet.traffic.stop()  # its last requests answered: then count
    counts = summary(list(fleet.devices.values()))
    assert counts["sent"] > 0 and counts["answered"] == counts["sent"], counts
    assert counts["twice"] == 0 and counts["errors"] == 0, counts
