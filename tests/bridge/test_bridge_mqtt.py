"""The bridge against a real mosquitto: round trips, correlation, busy, deadlines, de-dup, fuzz."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
from bridge_harness import FakeClock, Harness, Mosquitto, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

import edgeinfer
from edgeinfer.bridge import Bridge, Client
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.errors import ReplyError


@pytest.fixture(scope="module")
def served(broker: Mosquitto, module_harness: Harness) -> tuple[Bridge, Any, Client]:
    """One v5 bridge (small payload limit, so that oversize is cheap) and one v5 client."""
    bridge, counting = module_harness.bridge(broker, device_id="dev", max_payload_bytes=8192)
    return bridge, counting, module_harness.client(broker, device_id="dev")


def assert_ok_embedding(reply: dict[str, Any], model: Any, texts: list[str]) -> None:
    assert reply["ok"] is True, reply
    assert (reply["v"], reply["model"], reply["precision"]) == (1, "minilm", "int8")
    assert reply["cached"] is False and reply["exit_layer"] is None
    assert reply["compute_ms"] > 0
    expected = model.embed(texts)
    np.testing.assert_allclose(np.asarray(reply["result"]), expected, atol=1e-6)


@pytest.mark.parametrize("bridge_protocol", ["5", "3.1.1"])
@pytest.mark.parametrize("client_protocol", ["5", "3.1.1"])
def test_round_trip_v5_and_v311(
    broker: Mosquitto, harness: Harness, bridge_protocol: str, client_protocol: str
) -> None:
    device = f"rt-{bridge_protocol}-{client_protocol}".replace(".", "")
    harness.bridge(broker, device_id=device, protocol=bridge_protocol)
    client = harness.client(broker, device_id=device, protocol=client_protocol)
    reply = client.request("minilm", texts=["a sensor reading", "valve open"], timeout_ms=60_000)
    assert_ok_embedding(reply, harness.model, ["a sensor reading", "valve open"])
    assert reply["slack_ms"] > 0


def test_msgpack_round_trip(
    served: tuple[Bridge, Any, Client], broker: Mosquitto, module_harness: Harness
) -> None:
    pytest.importorskip("msgpack")
    client = module_harness.client(broker, device_id="dev", fmt="msgpack")
    assert_ok_embedding(client.request("minilm", text="compact"), module_harness.model, ["compact"])


class RawPeer:
    """A bare paho v5 client that publishes exactly what it is given and keeps every reply."""

    def __init__(self, broker: Mosquitto, name: str) -> None:
        self.topic = f"edgeinfer/clients/raw-{name}/reply"  # the reply convention
        self.replies: list[tuple[dict[str, Any], Any]] = []
        self._cond = threading.Condition()
        self._ready = threading.Event()
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2,
            client_id=f"raw-{name}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.on_connect = lambda c, *a: c.subscribe(self.topic, qos=1)
        self.client.on_subscribe = lambda *a: self._ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        assert self._ready.wait(10)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        fmt = proto.wire_format(getattr(message.properties, "ContentType", None))
        with self._cond:
            self.replies.append((proto.decode_reply(message.payload, fmt=fmt), message.properties))
            self._cond.notify_all()

    def send(self, topic: str, payload: bytes, correlation: bytes | None = None) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.topic
        if correlation is not None:
            props.CorrelationData = correlation
        self.client.publish(topic, payload, qos=1, properties=props).wait_for_publish(10)

    def wait_for(self, count: int) -> list[tuple[dict[str, Any], Any]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.replies) >= count, timeout=30), self.replies
            return list(self.replies)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def raw(broker: Mosquitto, request: pytest.FixtureRequest) -> Any:
    peer = RawPeer(broker, request.node.name.replace("[", "-").replace("]", ""))
    yield peer
    peer.close()


def test_correlation_data_and_content_type_are_echoed(
    served: tuple[Bridge, Any, Client], raw: RawPeer
) -> None:
    correlation = bytes(range(256))  # binary, not text
    raw.send("edgeinfer/dev/minilm/req", b'{"id": "corr-1", "text": "hello"}', correlation)
    raw.send("edgeinfer/dev/minilm/req", b"not json", b"corr-2")
    (ok, ok_props), (bad, bad_props) = sorted(
        raw.wait_for(2), key=lambda r: r[0]["ok"], reverse=True
    )
    assert ok["ok"] and ok["id"] == "corr-1" and ok_props.CorrelationData == correlation
    assert ok_props.ContentType == proto.CONTENT_JSON
    assert bad["error"]["code"] == proto.BAD_REQUEST and bad_props.CorrelationData == b"corr-2"


def test_unknown_model_is_answered(served: tuple[Bridge, Any, Client]) -> None:
    reply = served[2].request("no-such-model", text="x")
    assert reply["error"]["code"] == proto.UNKNOWN_MODEL and reply["id"] is not None
    with pytest.raises(ReplyError) as raised:  # or as a typed error, when asked
        served[2].request("no-such-model", text="x", raise_on_error=True)
    assert raised.value.wire_code == proto.UNKNOWN_MODEL and raised.value.reply["ok"] is False
    assert served[2].request("minilm", text="x", raise_on_error=True)["ok"] is True


def test_an_input_the_model_refuses_is_a_bad_request(served: tuple[Bridge, Any, Client]) -> None:
    client = served[2]
    too_long = "a " * 1500  # 1500 tokens: far past the model's window, and truncation is off
    reply = client.request("minilm", text=too_long, params={"truncate": False})
    assert reply["error"]["code"] == proto.BAD_REQUEST and reply["id"] is not None
    assert client.request("minilm", text=too_long)["ok"]  # truncated by default


def test_full_queue_answers_busy_at_once(broker: Mosquitto, harness: Harness) -> None:
    bridge, counting = harness.bridge(broker, device_id="busy", max_queue=2)
    client = harness.client(broker, device_id="busy")
    bridge.worker.pause()
    futures = [
        client.submit("minilm", text=f"t{i}", attempt_timeout_s=60, busy_wait_s=0) for i in range(5)
    ]
    wait_until(lambda: sum(f.done() for f in futures) == 3)  # answered while the worker waits
    busy = [f.result() for f in futures if f.done()]
    assert all(r["error"]["code"] == proto.BUSY for r in busy)
    assert counting.calls == 0 and bridge.worker.queue_depth == 2
    bridge.worker.resume()
    replies = [f.result(30) for f in futures]
    assert sum(r["ok"] for r in replies) == 2 and counting.calls == 2


def test_expired_deadline_is_answered_without_running_the_model(
    broker: Mosquitto, harness: Harness
) -> None:
    clock = FakeClock()
    bridge, counting = harness.bridge(broker, device_id="late", clock_ms=clock)
    client = harness.client(broker, device_id="late")
    reply = client.request("minilm", text="too late", deadline_ms=clock() - 1000)
    assert reply["error"]["code"] == proto.DEADLINE_EXCEEDED
    # A deadline that passes while the request waits in the queue: still not run.
    bridge.worker.pause()
    future = client.submit(
        "minilm", text="expires in the queue", timeout_ms=100, attempt_timeout_s=60
    )
    wait_until(lambda: bridge.worker.queue_depth == 1)
    clock.advance(101)  # past the 100 ms timeout, on the bridge's clock
    bridge.worker.resume()
    assert future.result(30)["error"]["code"] == proto.DEADLINE_EXCEEDED
    assert counting.calls == 0
    assert client.request("minilm", text="in time", timeout_ms=60_000)["ok"]
    assert counting.calls == 1


def test_a_request_past_its_message_expiry_is_dropped_unstarted(
    broker: Mosquitto, harness: Harness
) -> None:
    # No timeout_ms in the payload: the Client's MQTT v5 Message Expiry Interval (the time
    # until it gives up, 30 s here) is the only bound the bridge knows.
    clock = FakeClock()
    bridge, counting = harness.bridge(broker, device_id="expiry", clock_ms=clock)
    client = harness.client(broker, device_id="expiry")
    bridge.worker.pause()
    future = client.submit("minilm", text="nobody waits", attempt_timeout_s=30, retries=0)
    wait_until(lambda: bridge.worker.queue_depth == 1)
    clock.advance(30_001)  # past the message's expiry, on the bridge's clock
    bridge.worker.resume()
    assert future.result(30)["error"]["code"] == proto.DEADLINE_EXCEEDED
    assert counting.calls == 0 and bridge.worker.counts["expired"] == 1
    assert client.request("minilm", text="in time", attempt_timeout_s=30)["ok"]


def test_a_duplicate_id_runs_the_model_once(
    broker: Mosquitto, harness: Harness, raw: RawPeer
) -> None:
    bridge, counting = harness.bridge(broker, device_id="dup")
    body = b'{"id": "same", "text": "only once"}'
    bridge.worker.pause()  # the second copy arrives while the first is still queued
    raw.send("edgeinfer/dup/minilm/req", body, b"first")
    raw.send("edgeinfer/dup/minilm/req", body, b"second")
    wait_until(lambda: bridge.worker.counts["duplicate_dropped"] == 1)
    bridge.worker.resume()
    first = raw.wait_for(1)
    raw.send("edgeinfer/dup/minilm/req", body, b"third")  # after the reply: from the store
    replies = raw.wait_for(2)
    assert [p.CorrelationData for _, p in replies] == [b"first", b"third"]
    assert replies[0][0] == first[0][0] and "replay" not in first[0][0]
    assert replies[1][0] == {**first[0][0], "replay": True}  # the same answer, marked a replay
    assert counting.calls == 1 and counting.texts["only once"] == 1


@settings(
    max_examples=2000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    payload=st.one_of(
        st.binary(max_size=600),
        st.builds(
            lambda v: json.dumps(v).encode(), st.lists(st.integers()) | st.text() | st.none()
        ),
        st.builds(
            lambda d: json.dumps(d).encode(),
            st.fixed_dictionaries(
                {"id": st.integers() | st.none() | st.lists(st.text())},
                optional={"text": st.integers() | st.text()},
            ),
        ),
        st.builds(
            lambda d: json.dumps(d).encode(),
            st.fixed_dictionaries(
                {
                    "id": st.text(min_size=1, max_size=20),
                    "texts": st.lists(st.integers() | st.none() | st.just(""), min_size=1),
                }
            ),
        ),
        st.builds(
            lambda d: json.dumps(d).encode(),
            st.fixed_dictionaries(
                {
                    "id": st.text(min_size=1, max_size=20),
                    "text": st.just("x"),
                    "timeout_ms": st.integers(max_value=0) | st.text() | st.booleans(),
                }
            ),
        ),
        st.binary(min_size=8193, max_size=9000),
    ),
    content_type=st.sampled_from([None, proto.CONTENT_JSON, proto.CONTENT_MSGPACK]),
)
def test_malformed_oversize_and_wrong_type_payloads_get_error_replies(
    served: tuple[Bridge, Any, Client], payload: bytes, content_type: str | None
) -> None:
    if content_type == proto.CONTENT_MSGPACK and not proto.msgpack_available():
        content_type = None
    reply = served[2].send_raw("minilm", payload, content_type=content_type).result(30)
    assert reply["ok"] is False
    expected = proto.PAYLOAD_TOO_LARGE if len(payload) > 8192 else proto.BAD_REQUEST
    assert reply["error"]["code"] == expected, reply


def test_the_bridge_keeps_serving_after_the_fuzzing(served: tuple[Bridge, Any, Client]) -> None:
    bridge, counting, client = served
    assert_ok_embedding(client.request("minilm", text="still here"), counting.model, ["still here"])
    assert bridge.connected and bridge.connects == 1


def test_status_is_retained_and_metrics_are_published(broker: Mosquitto, harness: Harness) -> None:
    bridge, _ = harness.bridge(broker, device_id="ops", metrics_interval_s=0.2)
    client = harness.client(broker, device_id="ops")
    assert client.request("minilm", text="count me")["ok"]
    seen: dict[str, bytes] = {}
    done = threading.Event()
    watcher = PahoClient(
        CallbackAPIVersion.VERSION2, client_id="watcher", protocol=MQTTProtocolVersion.MQTTv5
    )

    def on_message(c: Any, u: Any, message: Any) -> None:
        seen[message.topic] = message.payload
        if len(seen) == 2:
            done.set()

    watcher.on_connect = lambda c, *a: c.subscribe(
        [("edgeinfer/ops/status", 1), ("edgeinfer/ops/metrics", 0)]
    )
    watcher.on_message = on_message
    watcher.connect("127.0.0.1", broker.port)
    watcher.loop_start()
    try:
        assert done.wait(30), seen
    finally:
        watcher.disconnect()
        watcher.loop_stop()
    status = json.loads(seen["edgeinfer/ops/status"])
    assert status["state"] == "online"
    assert status["models"]["minilm"]["digest"] == harness.model.manifest.digest
    # The topics table's keys, before any deploy too (nothing to roll back to: null).
    assert status["models"]["minilm"] == {
        "digest": harness.model.manifest.digest,
        "task": "embed",
        "signer": None,
        "version": None,
        "previous": None,
        "previous_version": None,
    }
    metrics = json.loads(seen["edgeinfer/ops/metrics"])
    assert metrics["counts"]["ok"] >= 1 and metrics["queue_depth"] == 0
    assert set(metrics["latency_ms"]["total_ms"]) == {"p50", "p95", "p99"}
    bridge.stop()
    offline = RawStatus(broker, "edgeinfer/ops/status")
    assert json.loads(offline.value)["state"] == "offline"


class RawStatus:
    """Reads a retained topic's current value."""

    def __init__(self, broker: Mosquitto, topic: str) -> None:
        got = threading.Event()
        self.value = b""
        client = PahoClient(
            CallbackAPIVersion.VERSION2,
            client_id="status-reader",
            protocol=MQTTProtocolVersion.MQTTv5,
        )

        def on_message(c: Any, u: Any, message: Any) -> None:
            self.value = message.payload
            got.set()

        client.on_connect = lambda c, *a: c.subscribe(topic, 1)
        client.on_message = on_message
        client.connect("127.0.0.1", broker.port)
        client.loop_start()
        try:
            assert got.wait(10)
        finally:
            client.disconnect()
            client.loop_stop()


def test_result_cache_hits_are_reported_cached(
    broker: Mosquitto, minilm_int8: Any, tmp_path: Any
) -> None:
    """With the runtime's result cache on, a repeated text is answered from it (no session run)
    and the reply says ``cached: true``."""
    cached_model = edgeinfer.load(
        minilm_int8, cache=edgeinfer.CacheConfig(persist=False, directory=tmp_path)
    )
    harness = Harness(cached_model)
    try:
        _, counting = harness.bridge(broker, device_id="cache")
        client = harness.client(broker, device_id="cache")
        first = client.request("minilm", text="pressure above limit", timeout_ms=60_000)
        second = client.request("minilm", text="pressure above limit", timeout_ms=60_000)
        assert first["ok"] and second["ok"]
        assert (first["cached"], second["cached"]) == (False, True)
        assert second["result"] == first["result"]
        assert counting.calls == 2  # the bridge asked twice; the cache answered the second
        snapshot = cached_model.metrics()
        assert snapshot.cache_misses["embed"] == 1
        assert snapshot.cache_hits["embed"]["memory"] == 1
    finally:
        harness.close()
