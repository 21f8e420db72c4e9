"""A shared group that loses a member: what its clients get.

Two ``edgeinfer serve`` processes in one ``--shared-group`` on a broker this script starts
(mosquitto, or aedes from npm), serving the tiny torch-free encoder of tests/fast_packages.py
(or ``--package``: a real model, whose compute lets a backlog overflow ``--max-queue``).
A plain paho device sends ``--requests`` QoS 1 requests at ``--rate`` per second, each with its
expiry (MQTT v5 Message Expiry Interval; on MQTT 3.1.1 ``timeout_ms`` in the payload) equal to
the time it waits in all, and follows the retry rule of docs/mqtt.md: the same id again after
``--attempt-timeout-s`` (doubling, ``--retries`` times). One member is killed with -9 at
``--kill-at-s``; with ``--restart-after-s`` it starts again that long after (same client id,
same journal). Reported: distinct ids answered ``ok``, re-sends, ``busy`` and
``deadline_exceeded`` replies, ``ok`` replies that came after their request's expiry, second
replies to an answered id, and the latency of the first ``ok`` (first send to reply) p50/p99/max.

Usage::

    python benchmarks/group_failover.py [--broker mosquitto|aedes] [--aedes-dir DIR]
        [--restart-after-s 10] [--package PKG] [--code REPO] [--json out.json]

``--code REPO`` runs the members from another checkout (an older commit, for a before/after).
aedes: ``npm install aedes@1.2.0 aedes-server-factory@0.2.1`` in ``--aedes-dir``; it speaks MQTT
3.1.1 only and has no shared subscriptions, so the run shows what a group gets there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mqtt_roundtrip import LOOPBACK, free_port, mosquitto, wait_port
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny package builder the tests use
DEVICE = "group"
MODEL = "tiny-encoder"
REPLY = "edgeinfer/clients/failover-device/reply"
AEDES = """
import { createServer } from 'node:net'
const { Aedes } = await import(process.argv[3])
const broker = await Aedes.createBroker()
createServer(broker.handle).listen(Number(process.argv[2]), '127.0.0.1')
"""


@contextmanager
def aedes(workdir: Path, modules: Path) -> Iterator[str]:
    script = workdir / "aedes.mjs"
    script.write_text(AEDES)
    port = free_port()
    entry = (modules / "node_modules" / "aedes" / "aedes.js").resolve().as_uri()
    proc = subprocess.Popen(["node", str(script), str(port), entry])
    try:
        wait_port(port, proc)  # type: ignore[arg-type]
        yield f"mqtt://{LOOPBACK}:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


class Member:
    """One ``edgeinfer serve`` group member; ``start`` again after a kill: same id, journal."""

    def __init__(self, broker: str, package: Path, name: str, state: Path, args: Any) -> None:
        self.command = [
            sys.executable, "-m", "edgeinfer", "serve", str(package), "--broker", broker,
            "--device-id", DEVICE, "--shared-group", "workers", "--client-id", name,
            "--metrics-interval-s", "0", "--threads", "1", "--protocol", args.protocol,
        ]  # fmt: skip
        code = str(args.code or ROOT)
        self.env = {**os.environ, "PYTHONPATH": code, "EDGEINFER_STATE_DIR": str(state)}
        self.cwd = code
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("serving"):
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain
                return
        raise RuntimeError(f"member exited: {self.proc.wait()}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


class Device:
    """Plain paho: sends, re-sends the same id after its attempt timeout, keeps every reply."""

    def __init__(self, port: int, args: Any) -> None:
        self.args = args
        self.v5 = args.protocol == "5"
        self.waits_s = [args.attempt_timeout_s * 2**k for k in range(args.retries + 1)]
        self.expiry_s = sum(self.waits_s)
        self.first_s: dict[str, float] = {}
        self.replies: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.resends = 0
        self._lock = threading.Lock()
        ready = threading.Event()
        version = MQTTProtocolVersion.MQTTv5 if self.v5 else MQTTProtocolVersion.MQTTv311
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2, client_id="failover-device", protocol=version
        )
        self.client.on_connect = lambda c, *a: c.subscribe(REPLY, qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect(LOOPBACK, port)
        self.client.loop_start()
        if not ready.wait(10):
            raise RuntimeError("the device could not subscribe")

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        reply = json.loads(message.payload)
        with self._lock:
            self.replies.setdefault(str(reply.get("id")), []).append((time.monotonic(), reply))

    def _publish(self, rid: str, left_s: float) -> None:
        body: dict[str, Any] = {"id": rid, "text": f"reading {rid}", "reply_to": REPLY}
        props = None
        if self.v5:
            props = Properties(PacketTypes.PUBLISH)
            props.ResponseTopic = REPLY
            props.CorrelationData = rid.encode()
            props.MessageExpiryInterval = max(1, round(left_s))
        else:
            body["timeout_ms"] = max(1.0, left_s * 1e3)
        topic = f"edgeinfer/{DEVICE}/{self.args.model}/req"
        self.client.publish(topic, json.dumps(body).encode(), qos=1, properties=props)

    def answered(self, rid: str) -> bool:
        with self._lock:
            return any(r.get("ok") is True for _, r in self.replies.get(rid, []))

    def run(self, requests: int, rate: float) -> None:
        """Send at ``rate``/s; re-send each unanswered id on its schedule until it expires."""
        start = time.monotonic()
        due: list[tuple[float, str, int]] = []  # (when, id, attempt)
        sent = 0
        while sent < requests or due:
            now = time.monotonic()
            if sent < requests and now >= start + sent / rate:
                rid = f"r{sent:04d}"
                self.first_s[rid] = now
                self._publish(rid, self.expiry_s)
                due.append((now + self.waits_s[0], rid, 1))
                sent += 1
            for item in [d for d in due if d[0] <= now]:
                due.remove(item)
                _, rid, attempt = item
                if self.answered(rid) or attempt > self.args.retries:
                    continue
                self.resends += 1
                self._publish(rid, self.first_s[rid] + self.expiry_s - now)
                due.append((now + self.waits_s[attempt], rid, attempt + 1))
            time.sleep(0.002)  # pacing of the send loop, not synchronization

    def report(self) -> dict[str, Any]:
        latencies, late, codes, extra = [], 0, Counter[str](), 0
        with self._lock:
            replies = {k: list(v) for k, v in self.replies.items()}
        for rid, sent_s in self.first_s.items():
            got = replies.get(rid, [])
            oks = [t for t, r in got if r.get("ok") is True]
            codes.update(str(r.get("error", {}).get("code")) for _, r in got if not r.get("ok"))
            late += sum(t > sent_s + self.expiry_s for t in oks)
            extra += max(0, len(got) - 1)
            if oks:
                latencies.append((min(oks) - sent_s) * 1e3)
        latencies.sort()

        def pick(q: float) -> float | None:
            if not latencies:
                return None
            return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)

        errors = {"busy", "deadline_exceeded"}
        return {
            "answered": len(latencies),
            "requests": len(self.first_s),
            "resends": self.resends,
            "busy": codes.get("busy", 0),
            "deadline_exceeded": codes.get("deadline_exceeded", 0),
            "other_errors": sum(v for k, v in codes.items() if k not in errors),
            "ok_after_expiry": late,
            "second_replies": extra,
            "latency_ms": {"p50": pick(0.5), "p99": pick(0.99), "max": pick(1.0)},
        }


def run(broker: str, package: Path, work: Path, args: Any) -> dict[str, Any]:
    members = [Member(broker, package, f"member-{n}", work / n, args) for n in "ab"]
    port = int(broker.rsplit(":", 1)[1])
    try:
        for member in members:
            member.start()
        device = Device(port, args)
        killer = threading.Timer(args.kill_at_s, members[0].kill9)
        killer.start()
        if args.restart_after_s:
            threading.Timer(args.kill_at_s + args.restart_after_s, members[0].start).start()
        device.run(args.requests, args.rate)
        # After the last expiry, anything still to come is late: wait for it, then count.
        give_up = max(device.first_s.values()) + device.expiry_s + 2.0
        time.sleep(max(0.0, give_up - time.monotonic()))
        device.client.disconnect()
        device.client.loop_stop()
        return device.report()
    finally:
        for member in members:
            member.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("mosquitto", "aedes"), default="mosquitto")
    parser.add_argument("--aedes-dir", type=Path, default=Path.cwd())
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--kill-at-s", type=float, default=3.0)
    parser.add_argument("--restart-after-s", type=float, default=0.0)
    parser.add_argument("--attempt-timeout-s", type=float, default=1.0)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--code", type=Path, default=None)
    parser.add_argument("--package", type=Path, default=None, help="default: the tiny encoder")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.protocol = "5" if args.broker == "mosquitto" else "3.1.1"
    from fast_packages import tiny_encoder

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        package = args.package.resolve() if args.package else tiny_encoder(work / MODEL)
        args.model = package.name
        broker_cm = mosquitto(work) if args.broker == "mosquitto" else aedes(work, args.aedes_dir)
        with broker_cm as broker:
            result = run(broker, package, work, args)
    result.update(
        broker=args.broker,
        protocol=args.protocol,
        restart_after_s=args.restart_after_s or None,
        code=str(args.code or ROOT),
        package=args.model,
        load=os.getloadavg(),
    )
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
