"""Clients are isolated: two plain-paho devices on a real mosquitto, one attacking the other.

A request's identity is (reply address, model, id) plus its content digest, so a device that
re-sends another's id gets its own answer (never the other's, marked ``replay``), and a device
that claims an id first does not poison the owner's request. A cancel reaches only the
canceller's own generation. A device flooding generations gets ``busy`` while a quiet one's
requests are all answered (round robin per reply address; a full queue pushes out the
flooder's newest). Each of these failed against the bridge keyed by (model, id) with one FIFO
queue; benchmarks/client_isolation.py measures the quiet device's latency and the bridge's
RSS and CPU under each attack.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bridge_harness import Harness, Mosquitto, PahoPeer, wait_until

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection


@pytest.fixture
def devices(broker: Mosquitto, request: pytest.FixtureRequest) -> Iterator[list[PahoPeer]]:
    """Two devices, each reading only its own reply topic (the broker's ACL in production)."""
    name = request.node.name.replace("[", "-").replace("]", "")
    pair = [PahoPeer(broker.port, f"{name}-{who}", fmt="json") for who in ("owner", "other")]
    yield pair
    for device in pair:
        device.close()


def _vector(reply: dict[str, Any]) -> np.ndarray:
    assert reply["ok"], reply
    return np.asarray(reply["result"][0])


def test_a_resent_id_from_another_client_gets_its_own_answer(
    broker: Mosquitto, harness: Harness, devices: list[PahoPeer]
) -> None:
    owner, other = devices
    harness.bridge(broker, device_id="iso-replay")
    mine = owner.final(owner.send("iso-replay", "minilm", {"id": "r1", "text": "valve 7 open"}))
    theirs = other.final(other.send("iso-replay", "minilm", {"id": "r1", "text": "who is r1"}))
    assert "replay" not in theirs  # not the owner's answer from the store
    np.testing.assert_allclose(_vector(theirs), harness.model.embed(["who is r1"])[0], atol=1e-6)
    np.testing.assert_allclose(_vector(mine), harness.model.embed(["valve 7 open"])[0], atol=1e-6)
    # Its r1 is its own request now: the owner's text under it is another request of its.
    same = {"id": "r1", "text": "valve 7 open"}
    again = other.final(other.send("iso-replay", "minilm", same, correlation=b"again"))
    assert again["error"]["code"] == "id_reused"


def test_an_id_claimed_first_by_another_client_does_not_poison_the_owner(
    broker: Mosquitto, harness: Harness, devices: list[PahoPeer]
) -> None:
    owner, attacker = devices
    harness.bridge(broker, device_id="iso-claim")
    attacker.final(attacker.send("iso-claim", "minilm", {"id": "r2", "text": "attacker text"}))
    mine = owner.final(owner.send("iso-claim", "minilm", {"id": "r2", "text": "owner text"}))
    assert "replay" not in mine
    np.testing.assert_allclose(_vector(mine), harness.model.embed(["owner text"])[0], atol=1e-6)
    # The owner's own re-send is a re-send (same content); other content under it is refused.
    resent = owner.final(
        owner.send("iso-claim", "minilm", {"id": "r2", "text": "owner text"}, correlation=b"re")
    )
    assert resent["replay"] is True and resent["result"] == mine["result"]
    reused = owner.final(
        owner.send("iso-claim", "minilm", {"id": "r2", "text": "changed"}, correlation=b"new")
    )
    assert reused["error"]["code"] == "id_reused" and "fresh id" in reused["error"]["message"]


class PermitModel:
    """The real tiny decoder; each generation waits for a permit before its first token."""

    def __init__(self, model: edgeinfer.Model) -> None:
        self.model, self.task, self.manifest = model, model.task, model.manifest
        self.permits = threading.Semaphore(0)
        self.started = threading.Semaphore(0)
        self.prompts: list[Any] = []

    def stream(self, prompt: Any, **kwargs: Any) -> Iterator[Any]:
        self.prompts.append(prompt)
        self.started.release()
        assert self.permits.acquire(timeout=60)
        yield from self.model.stream(prompt, **kwargs)


@pytest.fixture
def gated(broker: Mosquitto, fast_decoder: Path) -> Iterator[tuple[Bridge, PermitModel]]:
    model = PermitModel(edgeinfer.load(fast_decoder, threads=1))
    config = BridgeConfig(
        connection=Connection(broker=broker.url, client_id="b-iso-gen"),
        device_id="iso-gen",
        metrics_interval_s=0,
        max_generations=1,
        max_generate_queue=4,
    )
    bridge = Bridge({"tiny": model}, config=config).start()
    yield bridge, model
    model.permits.release(100)  # nothing left waiting at the stop
    bridge.stop()
    model.model.close()


def test_a_stranger_cannot_cancel_a_generation(
    gated: tuple[Bridge, PermitModel], devices: list[PahoPeer]
) -> None:
    bridge, model = gated
    owner, stranger = devices
    running = owner.send("iso-gen", "tiny", {"id": "g1", "prompt": "a", "max_new_tokens": 6})
    assert model.started.acquire(timeout=60)
    queued = owner.send("iso-gen", "tiny", {"id": "g2", "prompt": "b", "max_new_tokens": 6})
    wait_until(lambda: bridge.worker.lane("tiny").depth == 1)
    for target in ("g1", "g2"):
        cancel = {"id": f"x-{target}", "cancel": target}
        refused = stranger.final(stranger.send("iso-gen", "tiny", cancel))
        assert refused["result"] == {"cancelled": target, "state": "unknown"}
    own = owner.final(owner.send("iso-gen", "tiny", {"id": "c2", "cancel": "g2"}))
    assert own["result"] == {"cancelled": "g2", "state": "queued"}
    model.permits.release(2)
    assert owner.final(running)["result"]["stop_reason"] in ("eos", "length")
    assert owner.final(queued)["result"]["stop_reason"] == "cancelled"
    assert model.prompts == ["a"]  # the owner's cancelled g2 never ran


def test_a_flooding_client_gets_busy_and_a_quiet_one_is_always_served(
    gated: tuple[Bridge, PermitModel], devices: list[PahoPeer]
) -> None:
    bridge, model = gated
    quiet, flooder = devices
    lane = bridge.worker.lane("tiny")

    def flood(ident: str) -> bytes:
        body = {"id": ident, "prompt": "flood", "max_new_tokens": 2}
        return flooder.send("iso-gen", "tiny", body)

    def busy(correlations: list[bytes]) -> int:
        codes = [m.get("error", {}).get("code") for c in correlations for m in flooder.of(c)]
        return codes.count("busy")

    for round_ in range(10):
        sent: list[bytes] = [flood(f"f{round_}-0")]
        wait_until(lambda: lane.running == 1 and lane.depth == 0)  # waiting for its permit
        sent += [flood(f"f{round_}-{j}") for j in range(1, 6)]
        # One running, four queued: the sixth is refused, and the queue stays full (the model
        # waits for permits) when the quiet device asks.
        assert flooder.final(sent[-1])["error"]["code"] == "busy"
        mine = quiet.send("iso-gen", "tiny", {"id": f"q{round_}", "prompt": "quiet"})
        wait_until(partial(lambda c, s: bool(quiet.of(c)) or busy(s) == 2, mine, sent))
        assert not quiet.of(mine), quiet.of(mine)  # queued (the flooder's newest pushed out)
        model.permits.release(5)  # the running one and the four queued, the quiet one's too
        assert quiet.final(mine)["ok"]
        assert [flooder.final(c)["ok"] for c in sent] == [True] * 4 + [False] * 2
        assert busy(sent) == 2
