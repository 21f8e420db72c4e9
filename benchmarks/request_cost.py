"""What one request costs the bridge process, counted rather than timed: deterministic under load.

Starts mosquitto and ``edgeinfer serve PKG`` (QoS 1, its journal in a temporary folder), warms
it up, then sends N sequential requests from a plain paho client in this process and reports
what the bridge process spent on them, per request:

* ``--valgrind``: instructions (callgrind's ``Ir``) of every thread of the bridge process (paho's
  network thread, the journal's thread, the worker), counters zeroed after the warm-up and
  dumped after the last reply (``callgrind_control``); the same count on a loaded machine.
  A tiny package keeps the model's share small (``tests/fast_packages.py`` ``tiny_encoder``).
* otherwise: CPU time (user + system, ``/proc/PID/stat``) of the bridge process.

Run it against two checkouts (``PYTHONPATH=TREE``) for a before/after that the machine's load
does not move. Usage::

    python benchmarks/request_cost.py --package PKG [--requests 200] [--valgrind] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from client_isolation import cpu_s
from mqtt_roundtrip import mosquitto

DEVICE = "cost"
REPLY = "edgeinfer/clients/cost-client/reply"


class Requester:
    """A plain paho v5 client sending one request at a time and waiting for its reply."""

    def __init__(self, port: int) -> None:
        from paho.mqtt.client import Client
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

        self.got = threading.Event()
        self.replies: list[dict[str, Any]] = []
        ready = threading.Event()
        v5 = MQTTProtocolVersion.MQTTv5
        self.client = Client(CallbackAPIVersion.VERSION2, client_id="cost-client", protocol=v5)
        self.client.on_connect = lambda c, *a: c.subscribe(REPLY, qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not ready.wait(30):
            raise RuntimeError("the client did not subscribe")

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.replies.append(json.loads(message.payload))
        self.got.set()

    def ask(self, model: str, request_id: str, *, timeout_s: float) -> bool:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = REPLY
        props.CorrelationData = request_id.encode()
        body = json.dumps({"id": request_id, "text": f"pump {request_id} pressure high"})
        self.got.clear()
        self.client.publish(f"edgeinfer/{DEVICE}/{model}/req", body, qos=1, properties=props)
        return self.got.wait(timeout_s)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def instructions(dump: Path) -> int:
    """The ``Ir`` total of a callgrind dump file."""
    text = dump.read_text()
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no totals in {dump}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--valgrind", action="store_true", help="count instructions")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    model = args.package.resolve().name
    # Under callgrind a request takes ~50x longer: the wait is a hang guard only.
    wait_s = 1500.0 if args.valgrind else 30.0
    with tempfile.TemporaryDirectory(prefix="edgeinfer-cost-") as tmp:
        out = Path(tmp) / "callgrind.out"
        serve = [sys.executable, "-m", "edgeinfer", "serve", str(args.package)]
        with mosquitto(Path(tmp)) as broker:
            serve += ["--broker", broker, "--device-id", DEVICE, "--client-id", "cost-bridge"]
            serve += ["--threads", "1", "--metrics-interval-s", "0"]
            if args.valgrind:
                valgrind = shutil.which("valgrind") or "valgrind"
                serve = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", *serve]
            env = {**os.environ, "EDGEINFER_STATE_DIR": str(Path(tmp) / "state")}
            bridge = subprocess.Popen(
                serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                requester = Requester(int(broker.rsplit(":", 1)[1]))
                give_up = time.monotonic() + wait_s
                while not requester.ask(model, "ready", timeout_s=2.0):  # until subscribed
                    if time.monotonic() > give_up or bridge.poll() is not None:
                        raise RuntimeError("the bridge did not answer")
                for i in range(args.warmup):
                    requester.ask(model, f"warm-{i}", timeout_s=wait_s)
                if args.valgrind:
                    subprocess.run(["callgrind_control", "-z", str(bridge.pid)], check=True)
                started_cpu = cpu_s(bridge.pid)
                started = time.perf_counter()
                for i in range(args.requests):
                    if not requester.ask(model, f"r-{i}", timeout_s=wait_s):
                        raise RuntimeError(f"no reply to r-{i}")
                elapsed = time.perf_counter() - started
                spent_cpu = cpu_s(bridge.pid) - started_cpu
                if args.valgrind:
                    subprocess.run(["callgrind_control", "-d", str(bridge.pid)], check=True)
                requester.close()
                ok = sum(1 for r in requester.replies if r.get("ok"))
            finally:
                bridge.terminate()
                bridge.wait(120)
        dumps = sorted(Path(tmp).glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
        counted = [d for d in dumps if d.name != out.name]  # the dump after the requests
        result: dict[str, Any] = {
            "package": model,
            "requests": args.requests,
            "ok_replies": ok,
            "cpu_ms_per_request": spent_cpu / args.requests * 1e3,
            "wall_ms_per_request": elapsed / args.requests * 1e3,
            "load_average": os.getloadavg(),
        }
        if args.valgrind and counted:
            result["instructions_per_request"] = instructions(counted[0]) / args.requests
            if args.json:  # for callgrind_annotate
                shutil.copy(counted[0], args.json.with_suffix(".callgrind"))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
