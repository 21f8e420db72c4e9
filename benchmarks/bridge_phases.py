"""Where a bridge round trip goes, per thread: timestamps through each of N sequential requests.

The bridge runs in this process (a real ``Bridge`` on a real mosquitto, MiniLM int8, one
intra-op thread) with timing wrappers on its steps; the client is a separate process (plain
paho, MQTT v5, TCP_NODELAY, QoS 1) that stamps each request's send and reply. Both read
CLOCK_MONOTONIC, one clock for the whole machine, so the stamps line up across processes::

    client publish -> [network + broker] -> paho callback: decode -> submit (enqueue)
      -> [hand-off: the worker thread wakes] -> worker: compute -> serialize -> publish()
      -> [the network thread wakes, writes] -> [broker + network] -> client

Prints, per phase, p50/p99 ms over the requests, the sum of the phase medians next to the
round trip's median, and the CPU.

Usage::

    python benchmarks/bridge_phases.py --package PKG [--requests 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from mqtt_clients import cpu_name, report
from mqtt_roundtrip import DEVICE, mosquitto, stats

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection
from edgeinfer.bridge.serve import replies, worker
from edgeinfer.bridge.wire import protocol as proto

PHASES = (
    ("client -> bridge callback", "sent", "callback"),
    ("decode", "callback", "decoded"),
    ("journal row commit (QoS 1, before the PUBACK)", "record_start", "recorded"),
    ("submit (lookup, record, dedup, enqueue)", "decoded", "enqueued"),
    ("hand-off to the worker", "enqueued", "worker"),
    ("compute", "compute_start", "compute_end"),
    ("serialize", "compute_end", "serialized"),
    ("to publish()", "serialized", "publish_called"),
    ("publish() (queue, wake the network thread)", "publish_called", "published"),
    ("publish() called -> written by the network thread", "publish_called", "written"),
    ("written -> client callback (broker, client)", "written", "received"),
)

CLIENT = r"""
import json, socket, sys, threading, time
from paho.mqtt.client import Client
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

port, device, model, count = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
now = lambda: time.clock_gettime_ns(time.CLOCK_MONOTONIC)
got, ready, stamps = threading.Event(), threading.Event(), []
v5 = MQTTProtocolVersion.MQTTv5
c = Client(CallbackAPIVersion.VERSION2, client_id="phases-client", protocol=v5)
c.on_socket_open = lambda cl, u, s: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
topic = "edgeinfer/clients/phases-client/reply"
c.on_connect = lambda cl, *a: cl.subscribe(topic, qos=1)
c.on_subscribe = lambda *a: ready.set()
def on_message(cl, u, m):
    stamps[-1]["received"] = now()
    got.set()
c.on_message = on_message
c.connect("127.0.0.1", port)
c.loop_start()
ready.wait(30)
for i in range(count):
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = topic
    props.CorrelationData = str(i).encode()
    body = json.dumps({"id": f"p-{i}", "text": f"sensor reading number {i}: pressure nominal"})
    got.clear()
    stamps.append({"id": f"p-{i}", "sent": now()})
    c.publish(f"edgeinfer/{device}/{model}/req", body, qos=1, properties=props)
    got.wait(30)
c.disconnect(); c.loop_stop()
print(json.dumps(stamps))
"""


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Stamps:
    """Bridge-side stamps of the request in flight (requests are sequential: one at a time)."""

    def __init__(self) -> None:
        self.by_id: dict[str, dict[str, int]] = {}
        self.current: dict[str, int] = {}
        self.waiting_write = False
        self.lock = threading.Lock()

    def mark(self, name: str) -> None:
        with self.lock:
            self.current.setdefault(name, now_ns())


def instrument(bridge: Bridge, stamps: Stamps) -> None:
    """Timing wrappers on the bridge's steps (this benchmark only)."""

    def around(owner: Any, name: str, before: str | None, after: str | None) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before:
                stamps.mark(before)
            result = original(*args, **kwargs)
            if after:
                stamps.mark(after)
            return result

        setattr(owner, name, wrapped)

    original_handle = bridge._handle

    def handle(message: Any) -> None:
        with stamps.lock:
            stamps.current = {"callback": now_ns()}
        original_handle(message)

    original_decode = proto.decode_request

    def decode(*args: Any, **kwargs: Any) -> Any:
        decoded = original_decode(*args, **kwargs)
        stamps.mark("decoded")
        with stamps.lock:
            stamps.by_id[decoded.id] = stamps.current  # the same dict gets the later stamps
        return decoded

    bridge._handle = handle  # type: ignore[method-assign]
    proto.decode_request = decode  # type: ignore[assignment]
    # The delivery holds the worker's submit bound at construction: wrap the one it calls.
    around(bridge.delivery, "_submit", None, "enqueued")
    journal = bridge.delivery.journal
    if journal is not None:  # the row's commit (group commits: ``commit``; before: ``record``)
        around(
            journal,
            "commit" if hasattr(journal, "commit") else "record",
            "record_start",
            "recorded",
        )
    around(bridge.worker, "_serve", "worker", None)
    around(worker, "run_request", "compute_start", "compute_end")
    around(replies.Stored, "payload", None, "serialized")
    client = bridge._client
    original_publish = client.publish
    original_write = client._packet_write

    def publish(*args: Any, **kwargs: Any) -> Any:
        with stamps.lock:
            stamps.current.setdefault("publish_called", now_ns())
            stamps.waiting_write = True  # before: the network thread may write it at once
        result = original_publish(*args, **kwargs)
        stamps.mark("published")
        return result

    def packet_write() -> Any:
        result = original_write()
        with stamps.lock:
            if stamps.waiting_write and not client._out_packet:  # the reply is on the wire
                stamps.current.setdefault("written", now_ns())
                stamps.waiting_write = False
        return result

    client.publish = publish  # type: ignore[method-assign]
    client._packet_write = packet_write  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, required=True, help="an embed package")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    model = args.package.resolve().name
    served = edgeinfer.load(args.package, threads=1)
    stamps = Stamps()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-phases-") as tmp:
        with mosquitto(Path(tmp)) as broker:
            config = BridgeConfig(
                connection=Connection(broker=broker, client_id="phases-bridge"),
                device_id=DEVICE,
                metrics_interval_s=0,
                # A fresh journal: one kept from an earlier run would replay its answers.
                journal_dir=Path(tmp) / "state",
            )
            bridge = Bridge({model: served}, config=config)
            instrument(bridge, stamps)
            with bridge:
                port = broker.rsplit(":", 1)[1]
                done = subprocess.run(
                    [sys.executable, "-c", CLIENT, port, DEVICE, model, str(args.requests)],
                    capture_output=True,
                    text=True,
                    timeout=1200,
                )
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-3000:])
    client_stamps = json.loads(done.stdout)
    warm = client_stamps[50:]  # the first requests warm up the sessions and the allocator
    rows = []
    for s in warm:
        merged = {**stamps.by_id.get(s["id"], {}), **s}
        if "written" in merged and "received" in merged:
            rows.append(merged)
    phases = {
        name: stats([(r[end] - r[start]) / 1e6 for r in rows if start in r and end in r])
        for name, start, end in PHASES
    }
    round_trip = stats([(r["received"] - r["sent"]) / 1e6 for r in rows])
    overhead = stats(
        [(r["received"] - r["sent"] - (r["compute_end"] - r["compute_start"])) / 1e6 for r in rows]
    )
    result = {
        "cpu": cpu_name(),
        "package": model,
        "requests": len(rows),
        "phases_ms": phases,
        # The phases in a row (the overlapping "publish() called -> written" aside).
        "sum_of_phase_p50_ms": sum(
            phases[name]["p50"] or 0.0
            for name, _, _ in PHASES
            if name != "publish() (queue, wake the network thread)"
        ),
        "round_trip_ms": round_trip,
        "overhead_ms": overhead,
    }
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
