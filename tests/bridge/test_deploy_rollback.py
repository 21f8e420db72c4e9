"""Rollbacks and deploy history over a real mosquitto: a rollback is a signed order (an
unsigned one or one by an untrusted key is refused), a replayed order is refused, rolling
back never re-opens the door to the old release, A -> B -> A serves A after a restart, and a
re-deploy after a rollback swaps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_harness import Harness, Mosquitto
from deploy_harness import DEVICE, Rig, Sniffer, keypair, sign

from edgeinfer.bridge.ota.state import load_state
from edgeinfer.manifest import Manifest

pytestmark = pytest.mark.slow


@pytest.fixture
def rig(broker: Mosquitto, harness: Harness, tmp_path: Path, minilm_int8: Path) -> Iterator[Rig]:
    made = Rig.open(broker, harness, tmp_path, minilm_int8)
    yield made
    made.close()


def test_an_unsigned_rollback_is_refused(rig: Rig) -> None:
    v2 = rig.release(2)
    assert rig.deploy(v2)["state"] == "active"
    rig.operator.send({"op": "rollback", "name": "minilm", "nonce": "n-bare", "round": 0})
    status = rig.operator.wait("n-bare", "refused", "rolled_back")
    assert (status["state"], status["reason"]) == ("refused", "unsigned")
    stranger, _ = keypair(rig.tmp / "keys", "stranger")
    status = rig.rollback(key=stranger)
    assert (status["state"], status["reason"]) == ("refused", "untrusted")
    assert rig.serves(v2)


def test_a_replayed_rollback_is_refused(rig: Rig) -> None:
    v2, v3 = rig.release(2), rig.release(3)
    assert rig.deploy(v2)["state"] == "active"
    sniffer = Sniffer(rig.broker.port)
    try:
        assert rig.rollback()["state"] == "rolled_back"  # back to the command-line package
        assert rig.serves(rig.origin)
        assert rig.deploy(v3)["state"] == "active"  # active v3, previous: the origin
        rollbacks = [(t, p) for t, p in sniffer.captured if t.endswith("/ota/ctl")]
        sniffer.captured = rollbacks
        sniffer.replay(rig.operator, to_device=DEVICE, nonce="replayed")
    finally:
        sniffer.close()
    status = rig.operator.wait("replayed", "refused", "rolled_back")
    assert (status["state"], status["reason"]) == ("refused", "replay")
    assert rig.serves(v3)


def test_rolling_back_never_lets_the_old_release_in_again(rig: Rig) -> None:
    v2 = rig.release(2)
    assert rig.deploy(v2)["state"] == "active"
    assert rig.rollback()["state"] == "rolled_back"
    status = rig.deploy(v2)  # the release rolled back from, sent again (or captured)
    assert (status["state"], status["reason"]) == ("refused", "replay")
    assert rig.serves(rig.origin)


def test_a_then_b_then_a_again_serves_a_after_a_restart(rig: Rig) -> None:
    a, b = rig.release(2), rig.release(3)
    assert rig.deploy(a)["state"] == "active"
    assert rig.deploy(b)["state"] == "active"
    sign(a, rig.key, "--version", "4")  # the same package, released again as version 4
    assert rig.deploy(a)["state"] == "active"
    assert rig.serves(a)
    rig.restart()
    assert rig.serves(a)
    state = load_state(rig.tmp / "deployed" / "minilm")
    assert state.active is not None and state.previous is not None
    assert Path(state.active.path).is_dir() and state.active.version == 4
    assert state.previous.digest == Manifest.read(b).digest
    kept = {p.name for p in (rig.tmp / "deployed" / "minilm").iterdir()}
    assert kept == {"state.json", Path(state.active.path).name, Path(state.previous.path).name}


def test_a_redeploy_after_a_rollback_swaps(rig: Rig) -> None:
    b = rig.release(2)
    assert rig.deploy(b)["state"] == "active"
    assert rig.rollback()["state"] == "rolled_back"
    assert rig.serves(rig.origin)
    sign(b, rig.key, "--version", "3")  # the fixed-forward release of the same package
    status = rig.deploy(b)
    assert status["state"] == "active" and status["version"] == 3
    assert rig.serves(b)
    assert not (rig.tmp / "deployed" / "staging").exists()
    retained = rig.operator.retained()
    assert retained["state"] == "active" and retained["nonce"] == status["nonce"]
    assert json.loads((b / "manifest.sig").read_text())["release"]["version"] == 3
