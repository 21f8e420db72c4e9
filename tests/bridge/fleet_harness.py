"""Fleet test helpers: tiny torch-free encoder releases (one good, one that passes its smoke
check but answers differently on live traffic) and a fleet of bridges on one broker, all in
this process (twenty bridge subprocesses, each loading onnxruntime, would not fit two cores),
each with its own deploy folder, device id and client sending live requests.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from fast_packages import SPECIAL, WORDS, tiny_encoder

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Client, Connection, DeployConfig, TrustedKeys
from edgeinfer.bridge.ota.release import sign_package
from edgeinfer.errors import EdgeInferError
from edgeinfer.manifest import Manifest, file_entries
from edgeinfer.runtime import smoke

NAME = "enc"
CLASS = "plant-gw"
# Words whose embeddings the bad release changes: most live texts have one (6 of 30 words,
# four a text: 59 %), smoke texts none.
PERTURBED = ("alarm", "tank", "level", "flow", "steady", "fast")
SMOKE_TEXTS = ("pump pressure rising", "valve closed", "motor vibration high")
# Small windows so a trial ends in seconds; min_shadow and the share make ~20 compared answers.
TRIAL = {"window_s": 1.0, "max_window_s": 60.0, "min_requests": 20, "min_shadow": 8,
         "shadow_share": 0.5}  # fmt: skip


def load(path: Path) -> Any:
    """Load a package as a device does, without spinning (it shares two cores)."""
    return edgeinfer.load(path, config=edgeinfer.RuntimeConfig(spin_wait=False))


def _with_smoke(folder: Path) -> Path:
    manifest = Manifest.read(folder)
    field_, _ = smoke.record(load(folder), list(SMOKE_TEXTS))
    replace(manifest, smoke=field_).write(folder)
    return folder


def _relist(folder: Path, note: str) -> Path:
    (folder / "notes.txt").write_text(note)
    manifest = Manifest.read(folder)
    names = [*manifest.files, "notes.txt"]
    replace(manifest, files=dict(file_entries(folder, list(dict.fromkeys(names))))).write(folder)
    return folder


def _perturb(folder: Path) -> None:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(folder / "model.onnx")
    table = next(t for t in model.graph.initializer if t.name == "E")
    rows = numpy_helper.to_array(table).copy()
    rng = np.random.default_rng(99)
    for word in PERTURBED:
        rows[len(SPECIAL) + WORDS.index(word)] = rng.normal(size=rows.shape[1]) * 4
    table.CopyFrom(numpy_helper.from_array(rows, "E"))
    onnx.save(model, folder / "model.onnx")


@dataclass(frozen=True)
class Releases:
    """The origin every device serves first, and two signed releases for class CLASS."""

    origin: Path
    good: Path
    bad: Path


def releases(
    tmp: Path, key: Path, *, trial: dict[str, Any] | None = None, versions: tuple[int, int] = (2, 3)
) -> Releases:
    """origin (unsigned), good (same graph, a new digest) and bad (``PERTURBED`` words embed
    elsewhere; its smoke cases pass), signed as ``versions`` with ``trial``."""
    origin = _with_smoke(tiny_encoder(tmp / "origin"))
    good = _relist(shutil.copytree(origin, tmp / "good"), "v2")
    bad = shutil.copytree(origin, tmp / "bad")
    _perturb(bad)
    _relist(bad, "v3")
    for package, version in zip((good, bad), versions, strict=True):
        sign_package(package, key, compatible=CLASS, name=NAME, version=version,
                     trial=TRIAL if trial is None else trial)  # fmt: skip
    return Releases(origin, good, bad)


def live_text(rng: random.Random) -> str:
    """A request like the plant's: four words (three in five hit ``PERTURBED``)."""
    return " ".join(rng.choice(WORDS) for _ in range(4))


@dataclass
class Device:
    """One bridge of the fleet and the client that sends it live traffic."""

    device_id: str
    folder: Path
    url: str
    trusted: Path
    origin: Path
    bridge: Bridge | None = None
    client: Client | None = None
    sent: int = 0
    answered: Counter[str] = field(default_factory=Counter)  # request id -> replies
    errors: int = 0
    error_codes: Counter[str] = field(default_factory=Counter)

    def start(self) -> Device:
        """Start (or restart) the bridge on its deploy folder."""
        origin = load(self.origin)
        bridge = Bridge(
            {NAME: origin},
            config=BridgeConfig(
                connection=Connection(broker=self.url, client_id=f"b-{self.device_id}"),
                device_id=self.device_id,
                metrics_interval_s=0,
                worker_threads=1,
            ),
            deploy=DeployConfig(
                folder=self.folder,
                trusted=TrustedKeys.load([self.trusted]),
                loader=load,
                compatible=(CLASS,),
                check_timeout_s=60,
            ),
            origins={NAME: self.origin},
        )
        assert bridge.deployer is not None
        for served, restored in bridge.deployer.restore().items():
            bridge.models.swap(served, restored)
        self.bridge = bridge.start()
        return self

    def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
            self.bridge = None

    def serves(self) -> str:
        """The digest this device's bridge serves now."""
        assert self.bridge is not None
        return str(self.bridge.models.get(NAME).manifest.digest)  # type: ignore[union-attr]

    def connect(self) -> None:
        connection = Connection(broker=self.url, client_id=f"c-{self.device_id}")
        self.client = Client(connection=connection, device_id=self.device_id).connect()

    def ask(self, rng: random.Random, n: int) -> None:
        """Send ``n`` live requests and wait for each reply (counted per request id)."""
        assert self.client is not None
        for _ in range(n):
            self.sent += 1
            request_id = f"{self.device_id}-{self.sent}"
            try:
                reply = self.client.request(NAME, text=live_text(rng), request_id=request_id)
            except EdgeInferError:
                self.errors += 1
                continue
            self.answered[str(reply.get("id", request_id))] += 1
            if not reply.get("ok"):
                self.errors += 1
                self.error_codes[str((reply.get("error") or {}).get("code"))] += 1


class Traffic:
    """Live requests to every device that is up, from ``threads`` threads (each its own
    devices), until ``stop``."""

    def __init__(self, devices: list[Device], *, threads: int = 4) -> None:
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(devices[i::threads], i), daemon=True)
            for i in range(threads)
        ]

    def start(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def _loop(self, devices: list[Device], seed: int) -> None:
        rng = random.Random(seed)
        while not self._stop.is_set():
            for device in devices:
                if device.bridge is not None and device.client is not None:
                    device.ask(rng, 2)

    def stop(self) -> None:
        """Stop sending; return once every request sent was answered (or failed)."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(60)


def summary(devices: list[Device]) -> dict[str, Any]:
    """Sent, answered and answered-twice (a second reply the client dropped) over the fleet."""
    answered = sum(len(d.answered) for d in devices)
    twice = sum(d.client.duplicate_replies for d in devices if d.client is not None)
    codes: Counter[str] = sum((d.error_codes for d in devices), Counter())
    return {"sent": sum(d.sent for d in devices), "answered": answered, "twice": twice,
            "errors": sum(d.errors for d in devices), "error_codes": dict(codes)}  # fmt: skip


def state_file(device: Device) -> dict[str, Any]:
    """The device's state file for NAME."""
    return dict(json.loads((device.folder / NAME / "state.json").read_text()))
