"""30 s of generate requests from a plain paho device, four decoded at once (continuous
batching), with ``kill -9`` of the broker in the middle: every request is answered, its chunks
come in order and complete, and the model ran once per id (re-sent requests are answered from
the de-duplication store, chunks included).

The device re-sends (same id, same correlation) when no final message came within 3 s, or
when the final came but a chunk is missing (a message the killed broker lost): the bridge
replays the stored chunks and final. The request schedule (one every 200 ms) and the kill and
restart times are the load pattern, not synchronization.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import LOOPBACK, Mosquitto
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection
from edgeinfer.bridge.wire import protocol as proto

SECONDS, EVERY_S, KILL_AT_S, RESTART_AT_S, RESEND_S = 30.0, 0.2, 10.0, 15.0, 3.0


class CountingGenerator:
    """The real tiny decoder, counting the generations started per prompt."""

    def __init__(self, model: edgeinfer.Model) -> None:
        self.model, self.task, self.manifest = model, model.task, model.manifest
        self.max_sequences = model.max_sequences
        self.runs: defaultdict[str, int] = defaultdict(int)

    def stream(self, prompt: str, **kwargs: Any) -> Any:
        self.runs[prompt] += 1
        return self.model.stream(prompt, **kwargs)


class Device:
    """Plain paho, persistent session, re-sends by the rules above."""

    def __init__(self, port: int) -> None:
        self.topic = "edgeinfer/clients/soak-device/reply"  # the reply convention
        self.lock = threading.Lock()
        self.arrivals: defaultdict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        self.sent: dict[str, tuple[bytes, float, int]] = {}  # id -> payload, last send, sends
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2,
            client_id="soak-device",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.reconnect_delay_set(1, 2)
        self.client.on_connect = lambda c, *a: c.subscribe(self.topic, qos=1)
        self.client.on_message = self.on_message
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect(LOOPBACK, port, clean_start=False, properties=props)
        self.client.loop_start()

    def on_message(self, client: Any, userdata: Any, message: Any) -> None:
        reply = proto.decode_reply(message.payload, fmt="msgpack")
        with self.lock:
            rid = str(reply["id"])
            self.arrivals[rid].append((self.sent[rid][2], reply))

    def publish(self, rid: str, payload: bytes) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.topic
        props.CorrelationData = rid.encode()
        props.ContentType = proto.CONTENT_MSGPACK
        with self.lock:
            sends = self.sent[rid][2] + 1 if rid in self.sent else 1
            self.sent[rid] = (payload, time.monotonic(), sends)
        self.client.publish("edgeinfer/soak/tiny/req", payload, qos=1, properties=props)

    def complete(self, rid: str) -> bool:
        with self.lock:
            got = [m for _, m in self.arrivals[rid]]
        finals = [m for m in got if "chunk" not in m]
        if not finals:
            return False
        return {m["chunk"] for m in got if "chunk" in m} == set(
            range(finals[0]["result"]["chunks"])
        )

    def resend_due(self) -> None:
        now = time.monotonic()
        with self.lock:
            due = [(rid, p) for rid, (p, last, _) in self.sent.items() if now - last > RESEND_S]
        for rid, payload in due:
            if not self.complete(rid):
                self.publish(rid, payload)


@pytest.mark.slow
def test_generate_stream_survives_kill_9(own_broker: Mosquitto, fast_decoder: Path) -> None:
    batching = edgeinfer.ContinuousBatchConfig(max_sequences=4)  # four decoded at once
    model = CountingGenerator(edgeinfer.load(fast_decoder, threads=1, continuous_batching=batching))
    config = BridgeConfig(
        connection=Connection(broker=own_broker.url, client_id="soak-bridge"),
        device_id="soak",
        metrics_interval_s=0,
        max_generate_queue=64,
        max_generations=4,
    )
    bridge = Bridge({"tiny": model}, config=config).start()
    device = Device(own_broker.port)
    try:
        started, i, killed, restarted = time.monotonic(), 0, False, False
        while (elapsed := time.monotonic() - started) < SECONDS:
            if not killed and elapsed >= KILL_AT_S:
                own_broker.kill9()
                killed = True
            if killed and not restarted and elapsed >= RESTART_AT_S:
                own_broker.start()
                restarted = True
            body = {"id": f"g-{i}", "prompt": f"reading {i}", "max_new_tokens": 24}
            device.publish(body["id"], proto.encode(body, fmt="msgpack"))
            device.resend_due()
            i += 1
            time.sleep(EVERY_S)
        give_up = time.monotonic() + 120
        while not all(device.complete(rid) for rid in list(device.sent)):
            assert time.monotonic() < give_up, "not every generation was answered"
            device.resend_due()
            time.sleep(0.2)
    finally:
        device.client.disconnect()
        device.client.loop_stop()
        bridge.stop()
    assert i >= 100 and bridge.connects >= 2  # a real stream, and the broker really went away
    for rid in device.sent:
        got = device.arrivals[rid]
        # One answer, repeated: a repeat from the store differs only by "replay": true.
        finals = [{k: v for k, v in m.items() if k != "replay"} for _, m in got if "chunk" not in m]
        assert all(f == finals[0] and f["ok"] for f in finals), finals
        first_pass = [m["chunk"] for sends, m in got if "chunk" in m and sends == 1]
        fresh = [n for k, n in enumerate(first_pass) if n not in first_pass[:k]]
        assert fresh == sorted(fresh), (rid, first_pass)  # in order as they came
        chunks = {m["chunk"]: m["text"] for _, m in got if "chunk" in m}
        assert "".join(chunks[k] for k in sorted(chunks)) == finals[0]["result"]["text"]
    assert set(model.runs.values()) == {1} and len(model.runs) == i  # once per id
