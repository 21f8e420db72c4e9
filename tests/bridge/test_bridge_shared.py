"""Two bridges in one shared-subscription group split the load; each request is answered once."""

from __future__ import annotations

from bridge_harness import Harness, Mosquitto

REQUESTS = 60


def test_two_bridges_in_a_shared_group_split_the_load(broker: Mosquitto, harness: Harness) -> None:
    first, model_a = harness.bridge(
        broker, device_id="fleet", shared_group="workers", client_id="bridge-fleet-a"
    )
    second, model_b = harness.bridge(
        broker, device_id="fleet", shared_group="workers", client_id="bridge-fleet-b"
    )
    assert first.config.subscription == "$share/workers/edgeinfer/fleet/+/req"
    client = harness.client(broker, device_id="fleet")
    # No re-sends (a long attempt timeout): any second reply would be the group's fault.
    futures = [
        client.submit("minilm", text=f"job {i}", attempt_timeout_s=120, retries=0)
        for i in range(REQUESTS)
    ]
    replies = [f.result(timeout=120) for f in futures]
    assert all(r["ok"] for r in replies)
    assert sorted(r["id"] for r in replies) == sorted({r["id"] for r in replies})
    assert client.duplicate_replies == 0
    assert model_a.calls + model_b.calls == REQUESTS
    assert model_a.calls > 0 and model_b.calls > 0  # both bridges served
    assert set(model_a.texts).isdisjoint(model_b.texts)  # nothing served twice
    # Each bridge has its own retained status topic inside the group.
    assert first.config.status_topic != second.config.status_topic
