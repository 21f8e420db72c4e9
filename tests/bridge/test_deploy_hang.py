"""Deploys cannot hang the device: a signed package whose graph never finishes, or allocates far
past the check's memory limit at warm-up, fails its deploy within the limit while the old
package serves; the next deploy installs; SIGTERM ends the bridge during a hung check; a
bridge SIGKILLed during one leaves no check running, and its restart leaves nothing on disk.

Each test runs a real bridge process (``deploy_process.py``: the library bridge as ``edgeinfer
serve --deploy-dir`` runs it) over a real mosquitto, deploys with raw messages as ``edgeinfer
deploy`` sends them, and waits on the retained statuses. The bridge's CPU and memory while the
hung check runs are printed (``-s``), with the check child's own CPU from the status.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import Mosquitto
from deploy_harness import Operator, chunk_message, device_state, keypair, sign, vm_hwm_kb
from hostile_packages import benign_encoder, endless_encoder, memory_bomb_encoder

from edgeinfer.bridge import Client, Connection, sign_package
from edgeinfer.manifest import Manifest

REPO = Path(__file__).resolve().parents[2]
NAME = "enc"
HUNG_LIMIT_S = 3.0  # the check's limit where a test waits for it to pass (signed in the release)
DEVICE_LIMIT_S = 120.0  # ... the device's own: a benign check never meets it, whatever the load
HELD_LIMIT_S = 600.0  # ... where the test ends the bridge while the check hangs
CAP_MB = 256  # the check's memory limit of the memory bomb's bridge
BOMB_BYTES = 1 << 30  # what the bomb's warm-up fills: 4x the cap, little for this machine


@dataclass
class Device:
    """A bridge process taking deploys into ``folder``, with an operator on its ota topics."""

    broker: Mosquitto
    tmp: Path
    device: str
    origin: Path
    key: Path
    pub: Path
    limits: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None = None
    operator: Operator | None = None

    @property
    def folder(self) -> Path:
        return self.tmp / "deployed"

    def start(self) -> Device:
        command = [sys.executable, str(REPO / "tests" / "bridge" / "deploy_process.py")]
        command += ["--broker", self.broker.url, "--device", self.device, "--name", NAME]
        command += ["--deploy-dir", str(self.folder), "--trusted-key", str(self.pub)]
        command += ["--origin", str(self.origin), *self.limits]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(command, env=env)
        device_state(self.broker.port, self.device, "online")
        if self.operator is None:
            self.operator = Operator(self.broker.port, devices=(self.device,))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def release(self, package: Path, version: int) -> Path:
        options = ("--version", str(version), "--name", NAME)
        return sign(package, self.key, *options, devices=(self.device,))

    def send(self, package: Path, nonce: str) -> None:
        """begin, every chunk, commit: as ``edgeinfer deploy`` sends them."""
        assert self.operator is not None
        begun = self.operator.begin(package, nonce, name=NAME, device=self.device)
        assert begun["state"] == "receiving", begun
        for ref in self.operator.plan(package):
            message = chunk_message(package, begun["deploy_id"], ref, nonce=nonce)
            self.operator.send(message, topic="chunk", device=self.device)
        commit = {"op": "commit", "deploy_id": begun["deploy_id"], "nonce": nonce, "round": 0}
        self.operator.send(commit, device=self.device)

    def deploy(self, package: Path, nonce: str) -> dict[str, Any]:
        """The deploy's final status (active or failed)."""
        self.send(package, nonce)
        assert self.operator is not None
        return self.operator.wait(nonce, "active", "failed", "refused")

    def serves(self, package: Path) -> bool:
        """Whether the bridge's status names ``package`` and a request is answered."""
        connection = Connection(broker=self.broker.url, client_id=f"c-{os.urandom(4).hex()}")
        with Client(connection=connection, device_id=self.device) as client:
            reply = client.request(NAME, text="pump pressure rising")
        status = device_state(self.broker.port, self.device, "online")
        digest = status["models"][NAME]["digest"]
        return bool(reply["ok"]) and digest == Manifest.read(package).digest

    def close(self) -> None:
        if self.operator is not None:
            self.operator.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _device(broker: Mosquitto, tmp_path: Path, name: str, *limits: str) -> Iterator[Device]:
    key, pub = keypair(tmp_path / "keys", "release")
    origin = benign_encoder(tmp_path / "v1")
    sign(origin, key, "--version", "1", "--name", NAME, devices=(name,))
    device = Device(broker, tmp_path, name, origin, key, pub, limits)
    yield device.start()
    device.close()


@pytest.fixture
def hung_device(broker: Mosquitto, tmp_path: Path) -> Iterator[Device]:
    """A bridge whose check's limit is DEVICE_LIMIT_S (a release may sign a lower one)."""
    yield from _device(broker, tmp_path, "hang-fails", "--check-timeout-s", str(DEVICE_LIMIT_S))


@pytest.fixture
def held_device(broker: Mosquitto, tmp_path: Path) -> Iterator[Device]:
    """A bridge whose check's limit outlasts the test: the check hangs until it is ended."""
    yield from _device(
        broker, tmp_path, f"hang-held-{os.urandom(2).hex()}", "--check-timeout-s",
        str(HELD_LIMIT_S),
    )  # fmt: skip


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _wait_gone(pid: int) -> None:
    """Wait for process ``pid`` to end: its pidfd becomes readable (a hang guard of 60 s)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], 60)
        assert ready, f"process {pid} is still running"
    finally:
        os.close(fd)


def _left(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")} if folder.exists() else set()


def _checking(device: Device, nonce: str) -> dict[str, Any]:
    assert device.operator is not None
    return device.operator.wait(nonce, "checking")


def test_an_endless_graph_fails_its_deploy_and_the_next_one_installs(hung_device: Device) -> None:
    device = hung_device
    # the endless release signs the short limit; the benign one is checked under the device's,
    # so a loaded machine's slow start of the check child cannot fail it
    endless = endless_encoder(device.tmp / "v2")
    sign_package(
        endless, device.key, devices=(device.device,), name=NAME, version=2,
        check_timeout_s=HUNG_LIMIT_S,
    )  # fmt: skip
    benign = device.release(benign_encoder(device.tmp / "v3", seed=3), 3)

    device.send(endless, "n-endless")
    checking = _checking(device, "n-endless")
    cpu_before, wall_before = _cpu_s(device.pid), time.monotonic()
    assert device.operator is not None
    failed = device.operator.wait("n-endless", "active", "failed")
    bridge_cores = (_cpu_s(device.pid) - cpu_before) / (time.monotonic() - wall_before)
    print(
        f"\nwhile the endless check ran: bridge {bridge_cores:.3f} cores, RSS "
        f"{_rss_kb(device.pid) / 1024:.0f} MiB (peak {vm_hwm_kb(device.pid) / 1024:.0f}); "
        f"the check child: {failed['check']}"
    )
    assert checking["check_timeout_s"] == HUNG_LIMIT_S
    assert (failed["state"], failed["reason"]) == ("failed", "check_limit")
    assert f"smoke check timed out after {HUNG_LIMIT_S:g} s" in failed["message"]
    assert device.serves(device.origin)  # the old package kept serving
    assert not any(name.startswith(NAME) for name in _left(device.folder)), "v2 left a folder"

    installed = device.deploy(benign, "n-benign")  # the channel takes the next deploy
    assert installed["state"] == "active", installed
    assert device.serves(benign)
    release_id = json.loads((benign / "manifest.sig").read_text())["release"]
    kept = f"{NAME}/{release_id['manifest_sha256'][:16]}-v3"
    assert {p for p in _left(device.folder) if p.count("/") <= 1} == {
        NAME,
        f"{NAME}/state.json",
        kept,
    }


def test_sigterm_ends_the_bridge_during_a_hung_check(held_device: Device) -> None:
    device = held_device
    device.send(device.release(endless_encoder(device.tmp / "v2"), 2), "n-held")
    child = _checking(device, "n-held")["check_pid"]
    assert child in _children(device.pid), "the check runs in a child process"
    assert device.proc is not None
    asked = time.monotonic()
    device.proc.send_signal(signal.SIGTERM)
    code = device.proc.wait(timeout=60)  # a hang guard: the old bridge never exits
    print(f"\nSIGTERM during the hung check: exited {code} after {time.monotonic() - asked:.2f} s")
    assert code == 0
    _wait_gone(child)
    assert _left(device.folder) == set()  # its folder was removed on the way out


def test_a_limit_the_release_signs_applies_below_the_devices(held_device: Device) -> None:
    device = held_device
    endless = endless_encoder(device.tmp / "v2")
    sign_package(
        endless, device.key, devices=(device.device,), name=NAME, version=2,
        check_timeout_s=HUNG_LIMIT_S,
    )  # fmt: skip
    failed = device.deploy(endless, "n-signed")
    assert (failed["state"], failed["reason"]) == ("failed", "check_limit")
    assert f"timed out after {HUNG_LIMIT_S:g} s" in failed["message"]
    assert device.serves(device.origin)


def test_a_sigkilled_bridge_leaves_nothing_after_its_restart(held_device: Device) -> None:
    device = held_device
    device.send(device.release(endless_encoder(device.tmp / "v2"), 2), "n-killed")
    child = _checking(device, "n-killed")["check_pid"]
    assert child in _children(device.pid)
    assert device.proc is not None
    device.proc.kill()
    device.proc.wait()
    _wait_gone(child)  # the check dies with the bridge (no orphan burning the cores)
    assert any(p.startswith(f"{NAME}/") for p in _left(device.folder))  # what the kill left
    device_state(device.broker.port, device.device, "offline")  # the Last Will
    device.start()
    assert _left(device.folder) == set()
    assert device.serves(device.origin)
    benign = device.release(benign_encoder(device.tmp / "v3", seed=3), 3)
    assert device.deploy(benign, "n-after")["state"] == "active"


def test_a_memory_bomb_fails_its_check_at_the_cap(broker: Mosquitto, tmp_path: Path) -> None:
    limits = ("--check-timeout-s", str(HELD_LIMIT_S), "--check-memory-mb", str(CAP_MB))
    for device in _device(broker, tmp_path, "bomb", *limits):
        bomb = device.release(memory_bomb_encoder(tmp_path / "v2", bomb_bytes=BOMB_BYTES), 2)
        peak_before = vm_hwm_kb(device.pid)
        failed = device.deploy(bomb, "n-bomb")
        print(f"\nthe bomb's check: {failed['check']}; bridge peak RSS "
              f"{peak_before / 1024:.0f} -> {vm_hwm_kb(device.pid) / 1024:.0f} MiB")  # fmt: skip
        assert (failed["state"], failed["reason"]) == ("failed", "check_limit")
        assert f"exceeded {CAP_MB} MiB" in failed["message"]
        assert failed["check"]["max_rss_mb"] < BOMB_BYTES >> 20  # stopped, not filled
        assert device.serves(device.origin)
        benign = device.release(benign_encoder(tmp_path / "v3", seed=3), 3)
        assert device.deploy(benign, "n-next")["state"] == "active"
