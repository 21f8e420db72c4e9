"""Node-RED closed loop against ``edgeinfer serve``: round trip p50/p99 with replies at QoS 1
vs QoS 0 (``serve --qos``), interleaved rounds.

Node-RED's mqtt node (MQTT.js underneath) does not set TCP_NODELAY on its broker socket, so at
QoS 1 its PUBACK for a reply and its next request are two small writes in a row: Nagle holds
the second until the broker's delayed ACK of the first. The flow is tests/interop/nodered's
(a reply's arrival sends the next request; Node-RED times each round trip with ``Date.now()``,
1 ms resolution). The model is the tiny torch-free encoder of the fast lane (compute ~0.1 ms),
so the numbers are the MQTT path. The machine's load is printed with them.

Usage::

    python benchmarks/nodered_reply_qos.py [--requests 200] [--rounds 3] [--json out.json]

Needs mosquitto, node and ``npm ci`` in tests/interop/nodered.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "interop")]

from fast_packages import tiny_encoder  # noqa: E402
from interop_harness import start_serve  # noqa: E402
from mosquitto import running_mosquitto  # noqa: E402
from nodered_harness import running_nodered  # noqa: E402

from edgeinfer.bench.stats import summarize  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="round trips per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each QoS, interleaved")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    rtts: dict[int, list[float]] = {1: [], 0: []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        package = tiny_encoder(folder / "tiny-encoder")
        state = {"EDGEINFER_STATE_DIR": str(folder / "state")}
        with running_mosquitto(folder / "mosquitto") as broker:
            with running_nodered(folder / "nodered", broker) as red:
                for round_no in range(args.rounds):
                    for qos in (1, 0):
                        log = folder / f"serve-{round_no}-{qos}.log"
                        served = start_serve(broker, [package], log, "--qos", str(qos), env=state)
                        try:
                            tag = f"r{round_no}q{qos}"  # new ids: none is a journal duplicate
                            red.ask(id=tag, loop=args.requests, model=package.name, text="loop")
                            report = red.answer("nodered-test/loop")
                        finally:
                            served.stop()
                        rtts[qos] += report["rtt_ms"][1:]  # the first one: connection warm-up
    load = os.getloadavg()
    results: dict[str, object] = {
        f"replies_qos{qos}": dataclasses.asdict(summarize(values)) for qos, values in rtts.items()
    }
    results["load_1_5_15"] = [round(x, 2) for x in load]
    results["cpus"] = os.cpu_count()
    print(json.dumps(results, indent=2, default=str))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
