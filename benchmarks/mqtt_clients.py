"""Sequential embeds from other clients: MQTT.js with default sockets, with TCP_NODELAY, with
replies subscribed at QoS 0, and the Python ``edgeinfer.bridge.Client``, in one run.

It starts its own mosquitto and ``edgeinfer serve`` (mqtt_roundtrip.py's helpers) and runs the
variants in interleaved rounds (each round: every variant, ``--per-round`` timed requests after a
warm-up), so a change in the machine's load hits them all alike. MQTT.js is the interop tests'
client (tests/interop/mqttjs_client.mjs; ``npm ci`` in tests/interop installs it). Prints JSON:
round trip at the client, p50/p99 ms per variant, and the CPU.

Usage::

    python benchmarks/mqtt_clients.py --package PKG [--rounds 5] [--per-round 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from mqtt_roundtrip import DEVICE, bridge, client, mosquitto, stats

MQTTJS = Path(__file__).resolve().parents[1] / "tests" / "interop" / "mqttjs_client.mjs"
# name -> MQTT.js options (None: the Python Client).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "mqttjs_default": {"nodelay": False, "replyQos": 1},
    "mqttjs_nodelay": {"nodelay": True, "replyQos": 1},
    "mqttjs_qos0_replies": {"nodelay": False, "replyQos": 0},
    "python_client": None,
}
WARMUP = 20  # requests before timing: connections, caches and the allocator settle


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def report(result: dict[str, Any], path: Path | None) -> int:
    """Print ``result`` as JSON (and write it to ``path``); the exit status."""
    text = json.dumps(result, indent=2)
    print(text)
    if path is not None:
        path.write_text(text + "\n")
    return 0


def mqttjs_round(
    broker: str, model: str, name: str, options: dict[str, Any], n: int
) -> list[float]:
    node = shutil.which("node")
    if node is None:
        raise SystemExit("node is not installed (the MQTT.js variants need Node.js)")
    plan = {
        "url": broker,
        "protocol": 5,
        "clientId": f"{name}-{time.monotonic_ns()}",
        "device": DEVICE,
        "mode": "latency",
        "model": model,
        "count": n,
        "warmup": WARMUP,
        **options,
    }
    done = subprocess.run(
        [node, str(MQTTJS), json.dumps(plan)], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"MQTT.js failed: {done.stderr[-2000:]}")
    return [float(v) for v in json.loads(done.stdout.strip().splitlines()[-1])["ms"]]


def python_round(broker: str, model: str, n: int, round_no: int) -> list[float]:
    with client(broker, f"bench-python-{round_no}") as c:
        for i in range(WARMUP):
            c.request(model, text=f"warm up {i}")
        ms = []
        for i in range(n):
            started = time.perf_counter()
            c.request(model, text=f"sensor reading {i}")
            ms.append((time.perf_counter() - started) * 1e3)
    return ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, required=True, help="an embed package")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    model = args.package.resolve().name
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="edgeinfer-mqtt-clients-") as tmp:
        with mosquitto(Path(tmp)) as broker, bridge(args.package, broker, 32, 1, None):
            with client(broker, "bench-wait") as c:  # until the bridge has subscribed
                c.request(model, text="warm up", attempt_timeout_s=1.0, retries=120, backoff=1.0)
            for round_no in range(args.rounds):
                for name, options in VARIANTS.items():
                    if options is None:
                        samples[name] += python_round(broker, model, args.per_round, round_no)
                    else:
                        samples[name] += mqttjs_round(broker, model, name, options, args.per_round)
    result = {
        "cpu": cpu_name(),
        "package": model,
        "requests_per_variant": args.rounds * args.per_round,
        "round_trip_ms": {name: stats(values) for name, values in samples.items()},
    }
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
