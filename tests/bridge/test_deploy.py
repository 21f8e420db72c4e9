"""Deploy and rollback over a real mosquitto while a device sends 20 requests/s: nothing
dropped, nothing answered by a package that failed a check; a tampered chunk, a wrong-key
signature, a package naming a file outside itself and a failing smoke check are each refused
with the old model still serving; a broken deploy resumes with the missing chunks only.

The smoke check is the package's own (``edgeinfer.runtime.smoke``): the failing package is a
real one whose recorded smoke outputs were changed before signing, as a broken export would
record them. The attacks on releases (downgrade, replay, wrong device, ...) are in
test_deploy_refusals.py, rollbacks in test_deploy_rollback.py, message and log bounds in
test_deploy_limits.py, a full disk in test_deploy_disk.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import CountingModel, Harness, Mosquitto
from deploy_harness import DEVICE, Operator, keypair, real_loader, release, smoke, variant

from edgeinfer.bridge import (
    Bridge,
    BridgeConfig,
    Connection,
    DeployConfig,
    TrustedKeys,
    deploy_package,
    sign_package,
)
from edgeinfer.cli import main
from edgeinfer.manifest import MANIFEST_NAME, Manifest


@pytest.mark.slow
def test_deploy_and_rollback_under_load(
    broker: Mosquitto, minilm_int8: Path, harness: Harness, tmp_path: Path
) -> None:
    good_key, good_pub = keypair(tmp_path / "keys", "release")
    bad_key, _ = keypair(tmp_path / "keys", "stranger")

    v1 = variant(minilm_int8, tmp_path / "v1", key=good_key, sign_options=("--version", "1"))
    v2 = release(minilm_int8, tmp_path, 2, key=good_key)
    smoke_fails = release(minilm_int8, tmp_path, 3, key=good_key, bad_smoke=True)
    stranger = release(minilm_int8, tmp_path, 4, key=bad_key)
    tampered = release(minilm_int8, tmp_path, 5, key=good_key)
    loaded: list[tuple[str, CountingModel]] = []  # (digest, model) of every load

    def loader(path: Path) -> CountingModel:
        counting = real_loader(path)
        loaded.append((Manifest.read(path).digest, counting))
        return counting

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
        plan = operator.plan(v2)
        for ref in plan[: len(plan) // 2]:
            operator.chunk(v2, started["deploy_id"], ref)
        outcome = deploy_package(
            v2,
            connection=Connection(broker=broker.url, client_id="op-2"),
            device_id=DEVICE,
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
        deploy_id, plan = begun["deploy_id"], operator.plan(tampered)
        operator.chunk(tampered, deploy_id, plan[0], sha256="0" * 64, nonce="n-tamper")
        status = operator.wait("n-tamper", "refused")
        assert status["reason"] == "integrity" and status["refused_chunk"] == 0
        for ref in plan:
            changes = {"data": bytes(ref.size)} if ref.index == 0 else {}  # zeros, hashed
            operator.chunk(tampered, deploy_id, ref, **changes)
        operator.send({"op": "commit", "deploy_id": deploy_id, "nonce": "n-tamper"})
        failed = operator.wait("n-tamper", "failed", "active")
        assert failed["state"] == "failed" and "sha256" in failed["message"]

        # A signed manifest naming a file outside the package is refused at begin.
        escape = variant(minilm_int8, tmp_path / "v6", key=None)
        data = json.loads((escape / MANIFEST_NAME).read_text())
        data["files"]["../outside.onnx"] = data["files"].pop("model.onnx")
        data["io"]["graph"] = "../outside.onnx"
        (escape / MANIFEST_NAME).write_text(json.dumps(data))
        signing = ["sign", str(escape), "--key", str(good_key), "--device-id", DEVICE]
        assert main(signing) == 2  # sign refuses it too
        sign_package(escape, good_key, devices=[DEVICE])  # anyway, by a careless or stolen key
        refused = operator.begin(escape, "n-escape")
        assert refused["state"] == "refused" and "plain relative path" in refused["message"]
        assert bridge.status()["models"]["minilm"]["digest"] == v2_digest

        # Rollback: the package served before the deploy serves again.
        rollback = ["rollback", "minilm", *cli[:4], "--key", str(good_key), "--timeout-s", "120"]
        assert main(rollback) == 0
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
    v2_folder = json.loads((v2 / "manifest.sig").read_text())["release"]["manifest_sha256"]
    assert sorted(p.name for p in (deploy_dir / "minilm").iterdir()) == sorted(
        ["state.json", f"{v2_folder[:16]}-v2"]
    )
    assert not (deploy_dir / "staging").exists()
