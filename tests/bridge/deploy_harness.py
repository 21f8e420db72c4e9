"""Deploy test helpers: signed package variants, keys, an operator and an eavesdropper in
plain paho on the ota topics, and bridges that take deploys (all over a REAL mosquitto).

Package variants hard-link the big files of the exported package (never written: a deploy
only reads them) and copy the manifest, which each variant rewrites.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bridge_harness import LOOPBACK, CountingModel, Harness, Mosquitto
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

import edgeinfer
from edgeinfer.bridge import (
    Bridge,
    BridgeConfig,
    Client,
    Connection,
    DeployConfig,
    TrustedKeys,
    deploy_package,
    rollback_package,
)
from edgeinfer.bridge.ota.signing import Signer
from edgeinfer.bridge.ota.staging import DEFAULT_CHUNK_BYTES, ChunkRef, chunk_plan
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.cli import main
from edgeinfer.manifest import MANIFEST_NAME, Manifest, file_entries

DEVICE = "field-7"


def keypair(folder: Path, name: str, *, rotate_from: Path | None = None) -> tuple[Path, Path]:
    """``edgeinfer keygen`` (``--rotate-from``): the private and public key paths."""
    rotate = ["--rotate-from", str(rotate_from)] if rotate_from else []
    assert main(["keygen", "-o", str(folder / name), *rotate]) == 0
    return folder / f"{name}.key", folder / f"{name}.pub"


def sign(package: Path, key: Path, *options: str, devices: tuple[str, ...] = (DEVICE,)) -> Path:
    """``edgeinfer sign PKG --key KEY --device-id D ... OPTIONS`` (must succeed)."""
    device_args = [a for d in devices for a in ("--device-id", d)]
    assert main(["sign", str(package), "--key", str(key), *device_args, *options]) == 0
    return package


def variant(
    source: Path,
    out: Path,
    *,
    key: Path | None,
    extra: dict[str, bytes] | None = None,
    bad_smoke: bool = False,
    target: str | None = None,
    sign_options: tuple[str, ...] = (),
) -> Path:
    """A copy of ``source`` with extra listed files (a new digest), another target or smoke
    outputs that point the other way (``bad_smoke``), signed for DEVICE with ``key``."""
    # Copied, never hard-linked: onnx refuses external data with more than one link, and a
    # link here would break every later test that loads the shared package's graph.
    shutil.copytree(source, out)
    for name, data in (extra or {}).items():
        (out / name).write_bytes(data)
    manifest = Manifest.read(out)
    files = {**manifest.files, **file_entries(out, list(extra or {}))}
    smoke = manifest.smoke
    if bad_smoke and smoke is not None:
        cases = [{**c, "vector": [-x for x in c["vector"]]} for c in smoke["cases"]]
        smoke = {**smoke, "cases": cases}
    replace(manifest, files=files, smoke=smoke, target=target or manifest.target).write(out)
    return out if key is None else sign(out, key, *sign_options)


def release(
    source: Path,
    folder: Path,
    version: int,
    *,
    key: Path | None,
    tag: str = "",
    sign_options: tuple[str, ...] = (),
    **options: Any,
) -> Path:
    """``folder/v{version}{tag}``: a variant of ``source`` with its own digest, signed as
    ``version`` (with ``sign_options``) for DEVICE."""
    return variant(
        source,
        folder / f"v{version}{tag}",
        key=key,
        extra={"notes.txt": f"v{version}{tag}".encode()},
        sign_options=("--version", str(version), *sign_options),
        **options,
    )


def resign(package: Path, key: Path, **release: Any) -> Path:
    """Sign ``package``'s current release again with ``release`` fields changed (an expiry in
    the past, a smaller size), as a signer with that key could."""
    record = json.loads((package / "manifest.sig").read_text())
    body = {**record["release"], **release}
    record = {**Signer.load(key).sign("release", body), "release": body}
    (package / "manifest.sig").write_text(json.dumps(record))
    return package


def chunk_message(package: Path, deploy_id: str, ref: ChunkRef, **changes: Any) -> dict[str, Any]:
    """The chunk message ``ref`` of ``package``, with ``changes`` (data, sha256, ...)."""
    with (package / ref.file).open("rb") as f:
        f.seek(ref.offset)
        data = f.read(ref.size)
    message = {
        "op": "chunk",
        "deploy_id": deploy_id,
        "index": ref.index,
        "file": ref.file,
        "offset": ref.offset,
        "data": data,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    message.update(changes)
    if "data" in changes and "sha256" not in changes:
        message["sha256"] = hashlib.sha256(changes["data"]).hexdigest()
    return message


def _paho(port: int, client_id: str) -> PahoClient:
    return PahoClient(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )


class Operator:
    """Plain paho on the ota topics: publishes raw deploy messages, collects every status of
    ``devices`` (retained or not) in order."""

    def __init__(self, port: int, *, devices: tuple[str, ...] = (DEVICE,)) -> None:
        self.port = port
        self.statuses: queue.Queue[dict[str, Any]] = queue.Queue()
        ready = threading.Event()
        self.client = _paho(port, f"operator-{os.urandom(4).hex()}")
        topics = [(f"edgeinfer/{d}/ota/status", 1) for d in devices]
        self.client.on_connect = lambda c, *a: c.subscribe(topics)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = lambda c, u, m: self.statuses.put(json.loads(m.payload))
        self.client.connect(LOOPBACK, port)
        self.client.loop_start()
        assert ready.wait(10)

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(60)

    def send(self, message: dict[str, Any], *, topic: str = "ctl", device: str = DEVICE) -> None:
        self.publish(f"edgeinfer/{device}/ota/{topic}", proto.packb(message))

    def wait(self, nonce: str, *states: str) -> dict[str, Any]:
        """The next status with ``nonce`` in one of ``states`` (a hang guard of 120 s)."""
        give_up = time.monotonic() + 120
        while time.monotonic() < give_up:
            status = self.statuses.get(timeout=120)
            if status.get("nonce") == nonce and status["state"] in states:
                return status
        raise AssertionError(f"no status {states} for {nonce}")

    def begin(
        self, package: Path, nonce: str, *, name: str = "minilm", device: str = DEVICE
    ) -> dict[str, Any]:
        """Send ``begin`` for ``package``; its first answer (receiving, refused or failed)."""
        self.send(
            {
                "op": "begin",
                "name": name,
                "nonce": nonce,
                "round": 0,
                "manifest": (package / MANIFEST_NAME).read_bytes(),
                "signature": json.loads((package / "manifest.sig").read_text()),
                "chunk_bytes": DEFAULT_CHUNK_BYTES,
            },
            device=device,
        )
        return self.wait(nonce, "receiving", "refused", "failed")

    def plan(self, package: Path) -> list[ChunkRef]:
        return chunk_plan(Manifest.read(package).files, DEFAULT_CHUNK_BYTES)

    def chunk(self, package: Path, deploy_id: str, ref: ChunkRef, **changes: Any) -> None:
        self.send(chunk_message(package, deploy_id, ref, **changes), topic="chunk")

    def retained(self, device: str = DEVICE) -> dict[str, Any]:
        """The retained ota/status as a new subscriber gets it."""
        got: queue.Queue[dict[str, Any]] = queue.Queue()
        client = _paho(self.port, f"late-{os.urandom(4).hex()}")
        client.on_connect = lambda c, *a: c.subscribe(f"edgeinfer/{device}/ota/status", 1)
        client.on_message = lambda c, u, m: got.put({**json.loads(m.payload), "_r": m.retain})
        client.connect(LOOPBACK, self.port)
        client.loop_start()
        try:
            status = got.get(timeout=30)
        finally:
            client.disconnect()
            client.loop_stop()
        assert status.pop("_r") is True
        return status

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Sniffer:
    """An eavesdropper on every device's ota/ctl and ota/chunk: keeps each payload in order."""

    def __init__(self, port: int) -> None:
        self.captured: list[tuple[str, bytes]] = []
        ready = threading.Event()
        self.client = _paho(port, f"sniffer-{os.urandom(4).hex()}")
        topics = [("edgeinfer/+/ota/ctl", 1), ("edgeinfer/+/ota/chunk", 1)]
        self.client.on_connect = lambda c, *a: c.subscribe(topics)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = lambda c, u, m: self.captured.append((m.topic, m.payload))
        self.client.connect(LOOPBACK, port)
        self.client.loop_start()
        assert ready.wait(10)

    def replay(self, operator: Operator, *, to_device: str, nonce: str) -> None:
        """Publish every captured message again to ``to_device``'s topics, under ``nonce``."""
        for topic, payload in list(self.captured):
            message = proto.decode_reply(payload, fmt="msgpack")
            operator.send({**message, "nonce": nonce}, topic=topic.split("/")[-1], device=to_device)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def device_state(port: int, device: str, state: str) -> dict[str, Any]:
    """``device``'s retained status once it says ``state`` (online, offline; a hang guard of
    120 s)."""
    seen: queue.Queue[dict[str, Any]] = queue.Queue()
    client = _paho(port, f"watch-{os.urandom(4).hex()}")
    client.on_connect = lambda c, *a: c.subscribe(f"edgeinfer/{device}/status", 1)
    client.on_message = lambda c, u, m: seen.put(json.loads(m.payload))
    client.connect(LOOPBACK, port)
    client.loop_start()
    try:
        while (status := seen.get(timeout=120)).get("state") != state:
            pass
    finally:
        client.disconnect()
        client.loop_stop()
    return status


def vm_hwm_kb(pid: int) -> int:
    """A process's peak resident memory (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc")


def real_loader(path: Path) -> CountingModel:
    """Load a deployed package for real (no spinning: it shares the cores with the test)."""
    return CountingModel(edgeinfer.load(path, config=edgeinfer.RuntimeConfig(spin_wait=False)))


def smoke(model: CountingModel) -> None:
    """The package's own smoke check, on the real model behind the counter."""
    from edgeinfer.runtime.smoke import check

    check(model.model)


def deploy_bridge(
    broker: Mosquitto,
    harness: Harness,
    folder: Path,
    *,
    trusted: list[Path],
    origin: Path,
    device: str = DEVICE,
    revoked: frozenset[str] = frozenset(),
    loader: Callable[[Path], Any] = real_loader,
    smoke_check: Callable[[Any], None] = smoke,
    model: Any = None,
    name: str = "minilm",
    login: dict[str, str] | None = None,
) -> Bridge:
    """A started bridge serving ``origin`` (the harness's model unless ``model``) under
    ``name`` that takes deploys into ``folder``; what was deployed there before serves again.
    ``login``: the broker's username and password."""
    bridge = Bridge(
        {name: model if model is not None else CountingModel(harness.model)},
        config=BridgeConfig(
            connection=Connection(broker=broker.url, client_id=f"b-{device}", **(login or {})),
            device_id=device,
            metrics_interval_s=0,
        ),
        deploy=DeployConfig(
            folder=folder,
            trusted=TrustedKeys.load(trusted, revoked=revoked),
            loader=loader,
            smoke_check=smoke_check,
        ),
        origins={name: origin},
    )
    assert bridge.deployer is not None
    for served, restored in bridge.deployer.restore().items():
        bridge.models.swap(served, restored)
    harness.bridges.append(bridge)
    return bridge.start()


def serves(client: Client, bridge: Bridge, digest: str) -> bool:
    """Whether ``bridge`` serves ``digest`` as minilm: its status says so, and a request is
    answered by that very model."""
    model = bridge.models.get("minilm")
    if not isinstance(model, CountingModel) or model.manifest.digest != digest:
        return False
    before = model.calls
    reply = client.request("minilm", text=f"still serving? {os.urandom(4).hex()}")
    status = bridge.status()["models"]["minilm"]
    return bool(reply["ok"]) and model.calls == before + 1 and status["digest"] == digest


@dataclass
class Rig:
    """One deploy test's world: a key the bridge trusts, a bridge serving the exported
    MiniLM as minilm from ``origin`` (``options``: ``deploy_bridge``'s), an operator and a
    device client."""

    broker: Mosquitto
    harness: Harness
    tmp: Path
    origin: Path
    key: Path
    options: dict[str, Any]
    operator: Operator
    client: Client
    bridge: Bridge = field(init=False)

    def __post_init__(self) -> None:
        self.bridge = self._bridge()

    @classmethod
    def open(
        cls, broker: Mosquitto, harness: Harness, tmp: Path, origin: Path, **options: Any
    ) -> Rig:
        key, pub = keypair(tmp / "keys", "release")
        options["trusted"] = [pub, *options.get("trusted", [])]
        client = harness.client(broker, device_id=DEVICE)
        return cls(broker, harness, tmp, origin, key, options, Operator(broker.port), client)

    def _bridge(self) -> Bridge:
        folder = self.tmp / "deployed"
        return deploy_bridge(self.broker, self.harness, folder, origin=self.origin, **self.options)

    @property
    def pub(self) -> Path:
        """The public key the bridge trusts."""
        return Path(self.options["trusted"][0])

    def _connection(self) -> Connection:
        return Connection(broker=self.broker.url, client_id=f"op-{os.urandom(4).hex()}")

    def release(self, version: int, **options: Any) -> Path:
        """A new release of the origin package as ``version``, signed with the rig's key."""
        return release(self.origin, self.tmp, version, key=options.pop("key", self.key), **options)

    def deploy(self, package: Path, *, name: str | None = None) -> dict[str, Any]:
        """``edgeinfer deploy``'s library call; the device's final status."""
        connection = self._connection()
        return deploy_package(
            package, connection=connection, device_id=DEVICE, name=name, timeout_s=120
        ).status

    def rollback(self, *, key: Path | None = None, **order: Any) -> dict[str, Any]:
        """``edgeinfer rollback``'s library call, signed with ``key`` (default: the rig's)."""
        connection, signer = self._connection(), key or self.key
        return rollback_package(
            "minilm", connection=connection, device_id=DEVICE, key=signer, timeout_s=120, **order
        ).status

    def serves(self, package: Path) -> bool:
        """Whether the bridge serves ``package`` and answers a request with it."""
        return serves(self.client, self.bridge, Manifest.read(package).digest)

    def restart(self) -> Bridge:
        """Stop the bridge; start a new one on the same deploy folder."""
        self.bridge.stop()
        self.bridge = self._bridge()
        return self.bridge

    def close(self) -> None:
        self.operator.close()
