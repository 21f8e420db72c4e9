"""Bounds on what deploy messages can make a device do, over a real mosquitto: an oversized
message is refused by its length before it is decoded (the bridge's peak memory is reported),
thousands of chunks outside the plan neither replace a healthy deploy's retained status nor
touch its staging, and a chunk sent again and again is logged once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import Harness, Mosquitto
from deploy_harness import (
    DEVICE,
    Operator,
    Rig,
    chunk_message,
    device_state,
    keypair,
    vm_hwm_kb,
)

from edgeinfer.bridge.wire import protocol as proto

pytestmark = pytest.mark.slow

JUNK = 3000  # out-of-plan chunks, as the attack that overwrote a deploy's status sent


@pytest.fixture
def rig(broker: Mosquitto, harness: Harness, tmp_path: Path, minilm_int8: Path) -> Iterator[Rig]:
    made = Rig.open(broker, harness, tmp_path, minilm_int8)
    yield made
    made.close()


def _statuses_until(operator: Operator, nonce: str) -> list[dict[str, Any]]:
    """Every status the operator got, up to the first with ``nonce`` (a hang guard of 120 s
    each): a marker sent after a flood on the same topic comes after the flood's answers."""
    seen = [operator.statuses.get(timeout=120)]
    while seen[-1].get("nonce") != nonce:
        seen.append(operator.statuses.get(timeout=120))
    return seen


def test_an_oversized_deploy_message_is_refused_before_decoding(
    broker: Mosquitto, harness: Harness, minilm_int8: Path, tmp_path: Path
) -> None:
    """``edgeinfer serve`` as a process: a 4 MiB message on ota/ctl and on ota/chunk (over
    their limits, under the packet size the bridge announces) is refused (``too_large``) by
    its length; a 200 MiB one never reaches the bridge (the broker drops it: MQTT v5 Maximum
    Packet Size); requests keep being answered. VmHWM is reported, not asserted."""
    _, pub = keypair(tmp_path / "keys", "release")
    device = "limits"
    command = [sys.executable, "-m", "edgeinfer", "serve", str(minilm_int8), "--broker"]
    command += [broker.url, "--device-id", device, "--metrics-interval-s", "0"]
    command += ["--deploy-dir", str(tmp_path / "deployed"), "--trusted-key", str(pub)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    operator = Operator(broker.port, devices=(device,))

    def refused(topic: str, payload: bytes) -> dict[str, Any]:
        operator.publish(f"edgeinfer/{device}/ota/{topic}", payload)
        return operator.statuses.get(timeout=120)

    try:
        device_state(broker.port, device, "online")
        client = harness.client(broker, device_id=device)
        assert client.request("minilm-int8", text="warm up")["ok"]
        before_kb = vm_hwm_kb(proc.pid)
        for topic in ("ctl", "chunk"):
            status = refused(topic, proto.packb({"op": "begin", "manifest": bytes(4 << 20)}))
            assert (status["state"], status["reason"], status["topic"]) == (
                "refused",
                "too_large",
                topic,
            )
        operator.publish(f"edgeinfer/{device}/ota/chunk", bytes(200 << 20))
        status = refused("ctl", b"not msgpack")  # after the 200 MiB one, on the same link
        assert (status["state"], status["reason"]) == ("refused", "config")
        after_kb = vm_hwm_kb(proc.pid)
        print(f"bridge VmHWM: {before_kb / 1024:.0f} MB before, {after_kb / 1024:.0f} MB after")
        assert client.request("minilm-int8", text="still serving")["ok"]
    finally:
        operator.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_chunks_outside_the_plan_leave_a_healthy_deploy_alone(rig: Rig) -> None:
    v2 = rig.release(2)
    begun = rig.operator.begin(v2, "n-healthy")
    deploy_id, plan = begun["deploy_id"], rig.operator.plan(v2)
    assert rig.operator.retained()["nonce"] == "n-healthy"
    for i in range(JUNK):  # past the plan, for this deploy and for made-up ones
        ids = (deploy_id, f"made-up-{i % 7}")
        message = chunk_message(v2, ids[i % 2], plan[-1], index=len(plan) + i, nonce="n-junk")
        rig.operator.client.publish(f"edgeinfer/{DEVICE}/ota/chunk", proto.packb(message), qos=1)
    rig.operator.chunk(v2, deploy_id, plan[0], sha256="0" * 64, nonce="n-last")  # in order
    answered = [s for s in _statuses_until(rig.operator, "n-last") if s["nonce"] == "n-junk"]
    assert sorted(s["reason"] for s in answered) == ["not_receiving", "too_large"]  # once each
    retained = rig.operator.retained()
    assert (retained["state"], retained["nonce"]) == ("receiving", "n-healthy")
    assert (rig.tmp / "deployed" / "staging.log").read_text() == ""
    assert rig.serves(rig.origin)
    assert rig.deploy(v2)["state"] == "active"  # the healthy deploy completes
    assert rig.serves(v2)


def test_a_chunk_sent_again_and_again_is_logged_once(rig: Rig) -> None:
    v2 = rig.release(2)
    begun = rig.operator.begin(v2, "n-resend")
    plan = rig.operator.plan(v2)
    small = min(plan, key=lambda ref: ref.size)  # notes.txt: a few bytes
    message = proto.packb(chunk_message(v2, begun["deploy_id"], small, nonce="n-resend"))
    for _ in range(JUNK):
        rig.operator.client.publish(f"edgeinfer/{DEVICE}/ota/chunk", message, qos=1)
    rig.operator.chunk(v2, begun["deploy_id"], plan[0], sha256="0" * 64, nonce="n-last")
    seen = _statuses_until(rig.operator, "n-last")
    assert not [s for s in seen if s.get("nonce") == "n-resend"]  # taken once, then ignored
    log = (rig.tmp / "deployed" / "staging.log").read_text().splitlines()
    assert [line.split()[0] for line in log] == [str(small.index)]
    assert rig.serves(rig.origin)
    assert rig.deploy(v2)["state"] == "active"
    assert rig.serves(v2)
