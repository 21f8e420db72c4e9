"""Deploy and rollback over a real mosquitto while a device sends 20 requests/s: nothing
dropped, nothing answered by a package that failed a check; a tampered chunk, a wrong-key
signature, a package naming a file outside itself and a failing smoke check are each refused
with the old model still serving; a broken deploy resumes with the missing chunks only.

The smoke check is the package's own (``edgeinfer.runtime.smoke``): the failing package is a
real one whose recorded smoke outputs were changed before signing, as a broken export would
record them.
"""

from __future__ import annotations

import hashlib
import json
import queue
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import CountingModel, Harness, Mosquitto
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

import edgeinfer
from edgeinfer.bridge import (
    Bridge,
    BridgeConfig,
    Connection,
    DeployConfig,
    TrustedKeys,
    deploy_package,
)
from edgeinfer.bridge import protocol as proto
from edgeinfer.bridge.signing import sign_package
from edgeinfer.bridge.staging import chunk_plan
from edgeinfer.cli import main
from edgeinfer.manifest import MANIFEST_NAME, Manifest, file_entries
from edgeinfer.runtime.smoke import check

DEVICE = "field-7"


def variant(
    source: Path, out: Path, *, extra: dict[str, bytes], key: Path | None, bad_smoke: bool = False
) -> Path:
    """A copy of ``source`` with extra listed files (a new digest), signed with ``key``;
    ``bad_smoke``: its recorded smoke embeddings point the other way."""
    shutil.copytree(source, out)
    for name, data in extra.items():
        (out / name).write_bytes(data)
    manifest = Manifest.read(out)
    files = {**manifest.files, **file_entries(out, list(extra))}
    smoke = manifest.smoke
    if bad_smoke and smoke is not None:
        cases = [{**c, "vector": [-x for x in c["vector"]]} for c in smoke["cases"]]
        smoke = {**smoke, "cases": cases}
    replace(manifest, files=files, smoke=smoke).write(out)
    if key is not None:
        assert main(["sign", str(out), "--key", str(key)]) == 0
    return out


class Operator:
    """Plain paho on the deploy topics: publishes raw deploy messages, collects statuses."""

    def __init__(self, port: int) -> None:
        self.statuses: queue.Queue[dict[str, Any]] = queue.Queue()
        ready = threading.Event()
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2, client_id="operator", protocol=MQTTProtocolVersion.MQTTv5
        )
        self.client.on_connect = lambda c, *a: c.subscribe(f"edgeinfer/{DEVICE}/deploy/status", 1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = lambda c, u, m: self.statuses.put(json.loads(m.payload))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert ready.wait(10)

    def send(self, message: dict[str, Any]) -> None:
        self.client.publish(
            f"edgeinfer/{DEVICE}/deploy/req", proto.packb(message), qos=1
        ).wait_for_publish(10)

    def wait(self, nonce: str, *states: str) -> dict[str, Any]:
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            status = self.statuses.get(timeout=60)
            if status.get("nonce") == nonce and status["state"] in states:
                return status
        raise AssertionError(f"no status {states} for {nonce}")

    def begin(self, package: Path, nonce: str, name: str = "minilm") -> dict[str, Any]:
        manifest_bytes = (package / MANIFEST_NAME).read_bytes()
        signature = json.loads((package / "manifest.sig").read_text())
        deploy_id = f"{name}-{hashlib.sha256(manifest_bytes).hexdigest()[:16]}"
        self.send(
            {
                "op": "begin",
                "deploy_id": deploy_id,
                "name": name,
                "nonce": nonce,
                "manifest": manifest_bytes,
                "signature": signature,
                "chunk_bytes": 1 << 18,
            }
        )
        return {"deploy_id": deploy_id, "status": self.wait(nonce, "receiving", "failed")}

    def chunk(
        self,
        package: Path,
        deploy_id: str,
        ref: Any,
        *,
        data: bytes | None = None,
        sha: str | None = None,
    ) -> None:
        with (package / ref.file).open("rb") as f:
            f.seek(ref.offset)
            real = f.read(ref.size)
        data = real if data is None else data
        self.send(
            {
                "op": "chunk",
                "deploy_id": deploy_id,
                "index": ref.index,
                "file": ref.file,
                "offset": ref.offset,
                "data": data,
                "sha256": sha or hashlib.sha256(data).hexdigest(),
            }
        )

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def keypair(folder: Path, name: str) -> tuple[Path, Path]:
    assert main(["keygen", "-o", str(folder / name)]) == 0
    return folder / f"{name}.key", folder / f"{name}.pub"


@pytest.mark.slow
def test_deploy_and_rollback_under_load(
    broker: Mosquitto, minilm_int8: Path, harness: Harness, tmp_path: Path
) -> None:
    good_key, good_pub = keypair(tmp_path / "keys", "release")
    bad_key, _ = keypair(tmp_path / "keys", "stranger")
    v1 = variant(minilm_int8, tmp_path / "v1", extra={}, key=good_key)
    v2 = variant(minilm_int8, tmp_path / "v2", extra={"notes.txt": b"v2"}, key=good_key)
    smoke_fails = variant(
        minilm_int8, tmp_path / "v3", extra={"notes.txt": b"v3"}, key=good_key, bad_smoke=True
    )
    stranger = variant(minilm_int8, tmp_path / "v4", extra={"notes.txt": b"v4"}, key=bad_key)
    tampered = variant(minilm_int8, tmp_path / "v5", extra={"notes.txt": b"v5"}, key=good_key)
    loaded: list[tuple[str, CountingModel]] = []  # (digest, model) of every load

    def loader(path: Path) -> CountingModel:
        model = edgeinfer.load(path, config=edgeinfer.RuntimeConfig(spin_wait=False))
        counting = CountingModel(model)
        loaded.append((Manifest.read(path).digest, counting))
        return counting

    def smoke(model: CountingModel) -> None:  # the package's own check, on the real model
        check(model.model)

    first = loader(v1)
    deploy_dir = tmp_path / "deployed"
    bridge = Bridge(
        {"minilm": first},
        config=BridgeConfig(
            connection=Connection(broker=broker.url, client_id="b-deploy"),
            device_id=DEVICE,
            metrics_interval_s=0,
        ),
        deploy=DeployConfig(
            folder=deploy_dir,
            trusted=TrustedKeys.load([good_pub]),
            loader=loader,
            smoke_check=smoke,
        ),
        origins={"minilm": v1},
    ).start()
    harness.bridges.append(bridge)
    client = harness.client(broker, device_id=DEVICE)
    operator = Operator(broker.port)
    futures: list[Any] = []
    stop = threading.Event()

    def traffic() -> None:  # 20 requests/s, each with its own id, for the whole test
        i = 0
        while not stop.wait(0.05):
            futures.append(client.submit("minilm", text=f"reading {i}", attempt_timeout_s=10))
            i += 1

    sender = threading.Thread(target=traffic)
    sender.start()
    cli = ["--broker", broker.url, "--device-id", DEVICE, "--as", "minilm", "--timeout-s", "120"]
    try:
        # A deploy broken after half its chunks resumes with the missing half only.
        started = operator.begin(v2, "n-resume")
        plan = chunk_plan(Manifest.read(v2).files, 1 << 18)
        for ref in plan[: len(plan) // 2]:
            operator.chunk(v2, started["deploy_id"], ref)
        outcome = deploy_package(
            v2,
            connection=Connection(broker=broker.url, client_id="op-2"),
            device_id=DEVICE,
            name="minilm",
            chunk_bytes=1 << 18,
        )
        assert outcome.ok and outcome.chunks_sent == len(plan) - len(plan) // 2
        v2_digest = Manifest.read(v2).digest
        assert bridge.status()["models"]["minilm"]["digest"] == v2_digest
        assert bridge.status()["models"]["minilm"]["signer"] == outcome.status["signer"]

        # Refused: a failing smoke check, a key the bridge does not trust.
        assert main(["deploy", str(smoke_fails), *cli]) == 1
        assert main(["deploy", str(stranger), *cli]) == 1
        assert bridge.status()["models"]["minilm"]["digest"] == v2_digest

        # A chunk whose sha256 does not match is refused; one re-hashed after tampering is
        # accepted as a chunk but the file then fails the signed manifest at commit.
        begun = operator.begin(tampered, "n-tamper")
        plan = chunk_plan(Manifest.read(tampered).files, 1 << 18)
        operator.chunk(tampered, begun["deploy_id"], plan[0], sha="0" * 64)
        status = operator.wait("n-tamper", "receiving")
        while "refused_chunk" not in status:
            status = operator.wait("n-tamper", "receiving")
        assert status["refused_chunk"] == 0 and 0 in status["missing"]
        for ref in plan:
            data = None if ref.index else bytes(ref.size)  # chunk 0: zeros, honestly hashed
            operator.chunk(tampered, begun["deploy_id"], ref, data=data)
        operator.send({"op": "commit", "deploy_id": begun["deploy_id"], "nonce": "n-tamper"})
        failed = operator.wait("n-tamper", "failed", "active")
        assert failed["state"] == "failed" and "sha256" in failed["message"]

        # A signed manifest naming a file outside the package is refused at begin.
        escape = variant(minilm_int8, tmp_path / "v6", extra={}, key=None)
        data = json.loads((escape / MANIFEST_NAME).read_text())
        data["files"]["../outside.onnx"] = data["files"].pop("model.onnx")
        data["io"]["graph"] = "../outside.onnx"
        (escape / MANIFEST_NAME).write_text(json.dumps(data))
        assert main(["sign", str(escape), "--key", str(good_key)]) == 2  # sign refuses it too
        sign_package(escape, good_key)  # signed anyway, by a careless or stolen key
        refused = operator.begin(escape, "n-escape")["status"]
        assert refused["state"] == "failed" and "plain relative path" in refused["message"]
        assert bridge.status()["models"]["minilm"]["digest"] == v2_digest

        # Rollback: the package served before the deploy serves again.
        assert main(["rollback", "minilm", *cli[:4], "--timeout-s", "120"]) == 0
        assert bridge.status()["models"]["minilm"]["digest"] == Manifest.read(v1).digest
    finally:
        stop.set()
        sender.join()
        operator.close()
    replies = [f.result(60) for f in futures]
    assert len(replies) >= 20 and all(r["ok"] for r in replies)  # none dropped or failed
    refused_digests = {Manifest.read(p).digest for p in (smoke_fails, stranger, tampered)}
    assert all(m.calls == 0 for d, m in loaded if d in refused_digests)
    answered = sum(m.calls for _, m in loaded)
    assert answered == len(replies)  # each request answered once, by a package that passed
    # Disk: the deployed v2 (now 'previous') and nothing else; no staging left behind.
    assert sorted(p.name for p in (deploy_dir / "minilm").iterdir()) == sorted(
        ["state.json", v2_digest[:16]]
    )
    assert not (deploy_dir / "staging").exists()
