"""Two devices against one bridge, one attacking the other: what each gets, and what it costs.

It starts its own mosquitto and ``edgeinfer serve`` (a separate process: its RSS and CPU are
the bridge's alone) with a text package and a generate package, then runs three attacks with
two plain-paho devices, each reading only its own reply topic:

1. **replay**: the attacker re-sends each of the owner's ids (its own text, its own reply
   topic) after the owner's answer, and pre-claims the owner's next ids before the owner asks.
   Counted: answers a device got that were the other's (``replay: true`` on a first ask, or
   a vector that is not of its own text).
2. **cancel**: while the owner runs generations, the stranger sends ``cancel`` for each of
   them. Counted: the owner's generations that ended ``cancelled``.
3. **flood**: the flooder sends a generation every ``--flood-every-ms`` (default 30) while the
   quiet device sends ``--quiet`` (default 10) generations one after another. Reported: the
   quiet device's answers, ``busy`` replies and latency p50/p99, the flooder's ``busy`` share.

For each attack: the bridge's RSS (peak of 10 Hz samples) and CPU (user + system seconds over
the attack, and as a share of one core).

Usage::

    python benchmarks/client_isolation.py --text-package PKG --generate-package PKG
        [--requests 50] [--quiet 10] [--flood-every-ms 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mqtt_roundtrip import DEVICE, LOOPBACK, mosquitto, rss_mb, stats
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgeinfer.bridge.wire import protocol as proto


class Device:
    """A plain-paho device: requests with a v5 ResponseTopic; every reply kept by correlation."""

    def __init__(self, port: int, name: str) -> None:
        self.topic = f"edgeinfer/clients/{name}/reply"
        self.replies: dict[bytes, list[dict[str, Any]]] = {}
        self.sent_s: dict[bytes, float] = {}
        self.final_s: dict[bytes, float] = {}
        self._cond = threading.Condition()
        ready = threading.Event()
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2, client_id=name, protocol=MQTTProtocolVersion.MQTTv5
        )
        self.client.on_connect = lambda c, *a: c.subscribe(self.topic, qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect(LOOPBACK, port)
        self.client.loop_start()
        if not ready.wait(30):
            raise RuntimeError(f"{name} did not subscribe")

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        correlation = bytes(message.properties.CorrelationData)
        reply = proto.decode_reply(message.payload)
        with self._cond:
            self.replies.setdefault(correlation, []).append(reply)
            if "chunk" not in reply:
                self.final_s[correlation] = time.perf_counter()
            self._cond.notify_all()

    def send(self, model: str, body: dict[str, Any], *, tag: str = "") -> bytes:
        correlation = f"{body['id']}{tag}".encode()
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = self.topic
        props.CorrelationData = correlation
        self.sent_s[correlation] = time.perf_counter()
        self.client.publish(f"edgeinfer/{DEVICE}/{model}/req", json.dumps(body), qos=1,
                            properties=props)  # fmt: skip
        return correlation

    def final(self, correlation: bytes, timeout_s: float = 120) -> dict[str, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: correlation in self.final_s, timeout_s):
                raise RuntimeError(f"no final reply to {correlation!r}")
            return next(r for r in self.replies[correlation] if "chunk" not in r)

    def latency_ms(self, correlation: bytes) -> float:
        return (self.final_s[correlation] - self.sent_s[correlation]) * 1e3

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(pid: int, attack: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``attack`` with the bridge's RSS sampled at 10 Hz and its CPU counted."""
    peak, done = [rss_mb(pid) or 0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak.append(rss_mb(pid) or 0.0)

    sampler = threading.Thread(target=sample, daemon=True)
    cpu0, wall0 = cpu_s(pid), time.perf_counter()
    sampler.start()
    try:
        result = attack()
    finally:
        done.set()
        sampler.join()
    cpu, wall = cpu_s(pid) - cpu0, time.perf_counter() - wall0
    return {
        **result,
        "bridge": {
            "rss_mb_before": round(peak[0], 1),
            "rss_mb_peak": round(max(peak), 1),
            "cpu_s": round(cpu, 2),
            "wall_s": round(wall, 2),
            "cpu_share_of_one_core": round(cpu / wall, 3),
        },
    }


def attack_replay(owner: Device, attacker: Device, model: str, n: int) -> dict[str, Any]:
    foreign = 0
    for i in range(n):
        own = owner.final(owner.send(model, {"id": f"o{i}", "text": f"owner reading {i}"}))
        resent = attacker.final(attacker.send(model, {"id": f"o{i}", "text": "attacker"}))
        foreign += bool(resent.get("replay")) or resent.get("result") == own.get("result")
        attacker.final(attacker.send(model, {"id": f"p{i}", "text": "attacker claim"}))
        claimed = owner.final(owner.send(model, {"id": f"p{i}", "text": f"owner later {i}"}))
        foreign += bool(claimed.get("replay")) or not claimed.get("ok")
    return {"requests_per_device": 2 * n, "answers_of_the_other_device": foreign}


def attack_cancel(owner: Device, stranger: Device, model: str, n: int) -> dict[str, Any]:
    states: dict[str, int] = {}
    sent = []
    for i in range(n):
        sent.append(owner.send(model, {"id": f"g{i}", "prompt": "the valve", "max_new_tokens": 16}))
        refused = stranger.final(stranger.send(model, {"id": f"x{i}", "cancel": f"g{i}"}))
        state = refused.get("result", {}).get("state", "error")
        states[state] = states.get(state, 0) + 1
    reasons = [owner.final(c).get("result", {}).get("stop_reason") for c in sent]
    return {
        "owner_generations": n,
        "stranger_cancel_states": states,
        "owner_generations_cancelled": reasons.count("cancelled"),
    }


def attack_flood(
    quiet: Device, flooder: Device, model: str, n: int, every_ms: float
) -> dict[str, Any]:
    stop, flooded = threading.Event(), []

    def flood() -> None:
        i = 0
        while not stop.wait(every_ms / 1e3):
            flooded.append(
                flooder.send(model, {"id": f"f{i}", "prompt": "flood", "max_new_tokens": 32})
            )
            i += 1

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    time.sleep(1.0)  # the flood is established before the quiet device asks
    mine = []
    for i in range(n):
        correlation = quiet.send(model, {"id": f"q{i}", "prompt": "quiet", "max_new_tokens": 8})
        quiet.final(correlation)
        mine.append(correlation)
    stop.set()
    thread.join()
    answers = [quiet.final(c) for c in mine]
    codes = [flooder.final(c).get("error", {}).get("code") for c in flooded]
    return {
        "quiet_requests": n,
        "quiet_answered_ok": sum(bool(a.get("ok")) for a in answers),
        "quiet_busy": sum(a.get("error", {}).get("code") == "busy" for a in answers),
        "quiet_latency_ms": stats([quiet.latency_ms(c) for c in mine]),
        "flooder_requests": len(flooded),
        "flooder_busy": codes.count("busy"),
    }


@contextmanager
def serving(packages: list[Path], broker: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "serve", *map(str, packages), "--broker", broker,
         "--device-id", DEVICE, "--client-id", "isolation-bridge", "--threads", "1",
         "--metrics-interval-s", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-package", type=Path, required=True)
    parser.add_argument("--generate-package", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--quiet", type=int, default=10)
    parser.add_argument("--flood-every-ms", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    text, generate = args.text_package.resolve().name, args.generate_package.resolve().name
    with tempfile.TemporaryDirectory(prefix="edgeinfer-isolation-") as tmp:
        with mosquitto(Path(tmp)) as broker:
            port = int(broker.rsplit(":", 1)[1])
            with serving([args.text_package, args.generate_package], broker) as proc:
                a, b = Device(port, "device-a"), Device(port, "device-b")
                try:
                    warm = {"id": "warm", "text": "warm up"}
                    for _ in range(600):  # until the bridge has subscribed
                        c = a.send(text, warm, tag=str(time.monotonic_ns()))
                        try:
                            a.final(c, timeout_s=0.5)
                            break
                        except RuntimeError:
                            continue
                    results = {
                        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()},
                        "replay": measured(
                            proc.pid, lambda: attack_replay(a, b, text, args.requests)
                        ),
                        "cancel": measured(
                            proc.pid, lambda: attack_cancel(a, b, generate, args.requests // 5)
                        ),
                        "flood": measured(
                            proc.pid,
                            lambda: attack_flood(a, b, generate, args.quiet, args.flood_every_ms),
                        ),
                    }
                finally:
                    a.close()
                    b.close()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
