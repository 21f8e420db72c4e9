"""Attacks on deploys over a real mosquitto, each refused with its reason code while the old
model keeps serving requests: an older or equal version, a captured deploy replayed to the
same or another device, a package for other hardware or another served name, an expired
release, more bytes than signed, a signature without release metadata, a revoked key; and
a rotated key that is accepted.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_harness import Harness, Mosquitto
from deploy_harness import (
    DEVICE,
    Operator,
    Rig,
    Sniffer,
    deploy_bridge,
    keypair,
    resign,
    serves,
    sign,
    variant,
)

from edgeinfer.bridge.ota.signing import Signer
from edgeinfer.manifest import MANIFEST_NAME, Manifest

pytestmark = pytest.mark.slow


@pytest.fixture
def rig(broker: Mosquitto, harness: Harness, tmp_path: Path, minilm_int8: Path) -> Iterator[Rig]:
    made = Rig.open(broker, harness, tmp_path, minilm_int8)
    yield made
    made.close()


def test_an_older_version_is_refused_as_a_downgrade(rig: Rig) -> None:
    v5 = rig.release(5)
    assert rig.deploy(v5)["state"] == "active"
    status = rig.deploy(rig.release(3))
    assert (status["state"], status["reason"]) == ("refused", "downgrade")
    assert rig.serves(v5)


def test_another_package_with_the_version_already_taken_is_refused(rig: Rig) -> None:
    v5 = rig.release(5)
    assert rig.deploy(v5)["state"] == "active"
    status = rig.deploy(rig.release(5, tag="-other"))
    assert (status["state"], status["reason"]) == ("refused", "replay")
    assert rig.serves(v5)


def test_a_captured_deploy_replayed_to_the_same_device_is_refused(rig: Rig) -> None:
    sniffer = Sniffer(rig.broker.port)
    v2 = rig.release(2)
    try:
        assert rig.deploy(v2)["state"] == "active"
        sniffer.replay(rig.operator, to_device=DEVICE, nonce="replayed")  # begin, chunks, commit
    finally:
        sniffer.close()
    status = rig.operator.wait("replayed", "refused", "receiving", "active")
    assert (status["state"], status["reason"]) == ("refused", "replay")
    assert rig.serves(v2)
    assert not (rig.tmp / "deployed" / "staging").exists()  # nothing of it was staged


def test_a_deploy_captured_for_one_device_is_refused_by_another(
    rig: Rig, broker: Mosquitto, harness: Harness, tmp_path: Path, minilm_int8: Path
) -> None:
    other = deploy_bridge(
        broker, harness, tmp_path / "other", trusted=[rig.pub], origin=minilm_int8, device="field-8"
    )
    other_client = harness.client(broker, device_id="field-8")
    sniffer, watcher = Sniffer(broker.port), Operator(broker.port, devices=("field-8",))
    try:
        v2 = rig.release(2)
        assert rig.deploy(v2)["state"] == "active"
        sniffer.replay(rig.operator, to_device="field-8", nonce="to-field-8")
        status = watcher.wait("to-field-8", "refused", "receiving", "active")
    finally:
        sniffer.close()
        watcher.close()
    assert (status["state"], status["reason"]) == ("refused", "wrong_device")
    assert serves(other_client, other, Manifest.read(minilm_int8).digest)
    assert rig.serves(v2)


def test_a_package_for_hardware_this_device_lacks_is_refused(rig: Rig) -> None:
    npu = rig.release(2, target="npu-qnn")  # exported for a Qualcomm NPU; this host is a CPU
    status = rig.deploy(npu)
    assert (status["state"], status["reason"]) == ("refused", "wrong_target")
    assert rig.serves(rig.origin)


def test_a_package_deployed_under_another_name_is_refused(rig: Rig, tiny_package: Path) -> None:
    generator = variant(tiny_package, rig.tmp / "gen", key=None)
    sign(generator, rig.key, "--version", "2")  # signed to serve as its own name
    status = rig.deploy(generator, name="minilm")  # ... deployed over the embedder
    assert (status["state"], status["reason"]) == ("refused", "wrong_name")
    assert rig.serves(rig.origin)


def test_an_expired_release_is_refused(rig: Rig) -> None:
    old = rig.release(2)
    signed = json.loads((old / "manifest.sig").read_text())["release"]["signed_ms"]
    resign(old, rig.key, expires_ms=signed - 1)  # a release whose expiry passed
    status = rig.deploy(old)
    assert (status["state"], status["reason"]) == ("refused", "expired")
    assert rig.serves(rig.origin)


def test_more_bytes_than_signed_are_refused(rig: Rig) -> None:
    def total(package: Path) -> int:
        return sum(e.bytes for e in Manifest.read(package).files.values())

    v2, v3 = rig.release(2), rig.release(3)
    status = rig.deploy(
        resign(v3, rig.key, total_bytes=total(v3) - 1)
    )  # the plan is bigger than the signed size: refused at begin
    assert (status["state"], status["reason"]) == ("refused", "too_large")

    begun = rig.operator.begin(v2, "n-big")  # a valid deploy; chunks past the signed bytes
    deploy_id, plan = begun["deploy_id"], rig.operator.plan(v2)
    last = plan[-1]
    rig.operator.chunk(v2, deploy_id, last, index=len(plan), nonce="n-past")
    past = rig.operator.wait("n-past", "refused")
    rig.operator.chunk(v2, deploy_id, plan[0], data=os.urandom(plan[0].size + 1), nonce="n-long")
    longer = rig.operator.wait("n-long", "refused")
    assert (past["reason"], longer["reason"]) == ("too_large", "too_large")
    assert (rig.tmp / "deployed" / "staging.log").read_text() == ""  # no chunk was taken
    assert rig.serves(rig.origin)


def test_a_signature_without_release_metadata_is_refused(rig: Rig) -> None:
    old_style = variant(rig.origin, rig.tmp / "old-style", key=None)
    manifest_bytes = (old_style / MANIFEST_NAME).read_bytes()
    private = Signer.load(rig.key).private_key  # as edgeinfer signed before releases
    record = {
        "alg": "ed25519",
        "key_id": Signer.load(rig.key).key_id,
        "signature": base64.b64encode(private.sign(manifest_bytes)).decode(),
    }
    (old_style / "manifest.sig").write_text(json.dumps(record))
    status = rig.operator.begin(old_style, "n-old")
    assert (status["state"], status["reason"]) == ("refused", "unsigned")
    assert rig.serves(rig.origin)


def test_a_rotated_key_is_accepted_and_a_revoked_one_refused(
    broker: Mosquitto, harness: Harness, tmp_path: Path, minilm_int8: Path
) -> None:
    keys = tmp_path / "keys"
    root, root_pub = keypair(keys, "root")
    rotated, _ = keypair(keys, "2025", rotate_from=root)  # endorsed by root: root.cert chain
    stolen, _ = keypair(keys, "stolen", rotate_from=root)
    endorsed_by_stolen, _ = keypair(keys, "sneaky", rotate_from=stolen)
    stolen_id = Signer.load(stolen).key_id
    rig = Rig.open(
        broker, harness, tmp_path, minilm_int8, trusted=[root_pub], revoked=frozenset({stolen_id})
    )
    try:
        v2 = rig.release(2, key=rotated)
        status = rig.deploy(v2)
        assert status["state"] == "active" and status["signer"] == Signer.load(rotated).key_id
        for n, key in ((3, stolen), (4, endorsed_by_stolen)):
            status = rig.deploy(rig.release(n, key=key))
            assert (status["state"], status["reason"]) == ("refused", "revoked")
        assert rig.serves(v2)
    finally:
        rig.close()
