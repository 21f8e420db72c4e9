"""A 20 Hz control loop over MQTT: sensor -> bridge (50 ms deadline) -> actuator.

    python examples/control_loop.py --broker mqtt://127.0.0.1:1883 --package pkg/minilm-int8

A simulated pressure sensor publishes one reading every 50 ms as an MQTT v5 request with an
absolute deadline 50 ms after it was taken. The bridge (``edgeinfer.bridge.Bridge``, the same
server ``edgeinfer serve`` runs, started in this process against the broker given by
``--broker``) classifies each reading; an actuator thread acts on each reply: it opens the relief
valve, throttles the inlet or holds. A reply that is late, an error (``deadline_exceeded``,
``busy``) or missing makes the actuator fall back to ``hold``. At the end the script prints the
deadline hit rate (ok replies back within the deadline) and latency percentiles.

What "classify" means here, honestly: the MiniLM package is an embedding model with no trained
classification head. The bridge serves it through a small adapter, ``NearestReference``, that
embeds a few labelled reference texts once and labels each reading by the reference with the
highest cosine similarity (its ``scores`` are those similarities, not probabilities). The sensor
knows the state it simulated, so the script also prints how often the label matched it.

Needs a running MQTT v5 broker (``apt-get install mosquitto``; ``mosquitto -p 1883``). Exit code:
0 when every reading was accounted for exactly once and the hit rate is at least
``--min-hit-rate`` (default 0: report only), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Client, Connection
from edgeinfer.errors import RequestTimeoutError

PERIOD_S = 0.05  # 20 Hz
DEADLINE_MS = 50.0  # an answer is useful until the next reading is taken
DEVICE = "control-loop"
MODEL = "pressure"

# label -> reference texts; the label is also the actuator's action.
REFERENCES = {
    "open_relief_valve": [
        "pressure is too high and rising fast",
        "overpressure alarm, pressure above the safe limit",
    ],
    "throttle_inlet": [
        "pressure is too low and falling",
        "pressure dropping below the minimum",
    ],
    "hold": [
        "pressure is normal and steady",
        "pressure stable within the normal range",
    ],
}
# The simulated state of a reading -> the action a correct classification leads to.
EXPECTED = {"high": "open_relief_valve", "low": "throttle_inlet", "normal": "hold"}


class NearestReference:
    """Serve an embedding model as a classifier: the label of the nearest reference text.

    Satisfies the bridge's ``ServedModel``: ``task`` is ``classify``, and ``classify`` returns
    one ``ClassificationResult`` per text whose ``scores`` are cosine similarities per label.
    """

    task = "classify"

    def __init__(self, model: edgeinfer.Model, references: dict[str, list[str]]) -> None:
        self._model = model
        self.manifest = model.manifest
        self._labels = [label for label, texts in references.items() for _ in texts]
        # [R, D] float32, unit length (the package L2-normalizes its embeddings)
        self._references = model.embed([t for texts in references.values() for t in texts])

    def embed_with_info(
        self, texts: Sequence[str], *, truncate: bool = True
    ) -> list[edgeinfer.EmbeddingResult]:
        return self._model.embed_with_info(texts, truncate=truncate)

    def classify(
        self, texts: Sequence[str], *, truncate: bool = True
    ) -> list[edgeinfer.ClassificationResult]:
        vectors = self._model.embed(texts, truncate=truncate)  # [N, D]
        similarity = vectors @ self._references.T  # [N, R] cosine
        results = []
        for row in similarity:
            best: dict[str, float] = {}
            for label, value in zip(self._labels, row.tolist(), strict=True):
                best[label] = max(value, best.get(label, -1.0))
            ranked = dict(sorted(best.items(), key=lambda kv: kv[1], reverse=True))
            label = next(iter(ranked))
            results.append(
                edgeinfer.ClassificationResult(label=label, score=ranked[label], scores=ranked)
            )
        return results


class Sensor:
    """A pressure that drifts through normal, high and low phases (seeded, reproducible)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._bar = 5.0
        self._trend = 0.0

    def read(self) -> tuple[str, str]:
        """(state, the reading as text)."""
        if self._rng.random() < 0.1:  # the process changes course now and then
            self._trend = self._rng.choice([-0.4, 0.0, 0.4])
        self._bar = min(9.5, max(0.5, self._bar + self._trend + self._rng.gauss(0, 0.05)))
        if self._bar > 7.0:
            state, words = "high", "too high and rising fast"
        elif self._bar < 3.0:
            state, words = "low", "too low and falling"
        else:
            state, words = "normal", "normal and steady"
        return state, f"line 3 pressure {self._bar:.1f} bar, {words}"


class Outcome(NamedTuple):
    """What the actuator got for one reading."""

    reading: int  # the reading's number
    state: str
    latency_ms: float
    reply: dict[str, Any] | None  # None: no reply at all


class Actuator:
    """Acts on each reply in its own thread; late, failed or missing answers fall back to hold."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Outcome | None] = queue.Queue()
        self.actions: Counter[str] = Counter()
        self.outcomes: list[Outcome] = []
        self._thread = threading.Thread(target=self._run, name="actuator")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.inbox.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (outcome := self.inbox.get()) is not None:
            self.outcomes.append(outcome)
            reply = outcome.reply
            if reply is None or not reply.get("ok"):
                self.actions["hold (fallback: no answer)"] += 1
            elif outcome.latency_ms > DEADLINE_MS:
                self.actions["hold (fallback: answer too late)"] += 1
            else:
                self.actions[reply["result"][0]["label"]] += 1


def run_loop(client: Client, actuator: Actuator, *, seconds: float, seed: int) -> int:
    """Take a reading every 50 ms and send it; each reply goes to the actuator. Returns sent."""
    sensor = Sensor(seed)
    readings = round(seconds / PERIOD_S)
    delivered = threading.Semaphore(0)  # one release per outcome handed to the actuator
    next_at = time.monotonic()
    for i in range(readings):
        state, text = sensor.read()
        taken = time.perf_counter()
        deadline_ms = time.time() * 1e3 + DEADLINE_MS  # absolute epoch ms
        future = client.submit(
            MODEL,
            text=text,
            request_id=f"reading-{i}",
            deadline_ms=deadline_ms,
            # One attempt: a re-send would come long after the answer stopped being useful.
            attempt_timeout_s=1.0,
            retries=0,
            busy_wait_s=0,
        )

        def done(
            f: Future[dict[str, Any]], i: int = i, state: str = state, taken: float = taken
        ) -> None:
            latency_ms = (time.perf_counter() - taken) * 1e3
            try:
                reply: dict[str, Any] | None = f.result()
            except RequestTimeoutError:
                reply = None
            actuator.inbox.put(Outcome(i, state, latency_ms, reply))
            delivered.release()

        future.add_done_callback(done)
        next_at += PERIOD_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    for _ in range(readings):  # every future resolves: a reply, or RequestTimeoutError after 1 s
        if not delivered.acquire(timeout=30):
            break  # cannot happen while the client lives; the report then shows the gap
    return readings


def report(outcomes: list[Outcome], actions: Counter[str], sent: int) -> tuple[int, float]:
    """Print the hit rate, latency percentiles and actions; return (accounted, hit rate)."""
    accounted = len({o.reading for o in outcomes})
    hits = [o for o in outcomes if o.reply and o.reply.get("ok") and o.latency_ms <= DEADLINE_MS]
    codes = Counter(
        "no_reply" if o.reply is None else "ok" if o.reply.get("ok") else o.reply["error"]["code"]
        for o in outcomes
    )
    answered = [(o, o.reply) for o in outcomes if o.reply is not None and o.reply.get("ok")]
    latency = np.array([o.latency_ms for o, _ in answered] or [np.nan])
    compute = np.array([r["compute_ms"] for _, r in answered] or [np.nan])
    agree = sum(r["result"][0]["label"] == EXPECTED[o.state] for o, r in answered)
    hit_rate = len(hits) / sent if sent else 0.0
    print(
        f"readings sent: {sent} at {1 / PERIOD_S:.0f} Hz, deadline {DEADLINE_MS:.0f} ms; "
        f"accounted for: {accounted}/{sent}; replies: {dict(sorted(codes.items()))}"
    )
    print(f"deadline hit rate: {100 * hit_rate:.1f}% ({len(hits)}/{sent} ok within the deadline)")
    p50, p95, p99 = np.percentile(latency, [50, 95, 99])
    print(
        f"latency ms (reading taken -> reply at the actuator): p50 {p50:.2f} p95 {p95:.2f} "
        f"p99 {p99:.2f} max {latency.max():.2f}; bridge compute p50 "
        f"{np.percentile(compute, 50):.2f}"
    )
    print(f"actions: {dict(sorted(actions.items()))}")
    print(f"label matched the simulated state: {agree}/{len(answered)}")
    return accounted, hit_rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="mqtt://127.0.0.1:1883", help="an MQTT v5 broker")
    parser.add_argument("--package", type=Path, default=Path("pkg/minilm-int8"))
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the loop runs")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads")
    parser.add_argument("--seed", type=int, default=7, help="the simulated sensor's seed")
    parser.add_argument(
        "--min-hit-rate",
        type=float,
        default=0.0,
        help="exit 1 below this deadline hit rate (0..1; default: report only)",
    )
    args = parser.parse_args(argv)

    # No spinning: the broker, the sensor and the bridge share this machine's cores.
    model = edgeinfer.load(
        args.package, threads=args.threads, config=edgeinfer.RuntimeConfig(spin_wait=False)
    )
    served = NearestReference(model, REFERENCES)
    run_id = f"{os.getpid()}-{time.monotonic_ns() % 10**6}"  # fresh sessions for every run
    bridge_config = BridgeConfig(
        connection=Connection(
            broker=args.broker, client_id=f"control-loop-bridge-{run_id}", session_expiry_s=10
        ),
        device_id=DEVICE,
        metrics_interval_s=0,
    )
    actuator = Actuator()
    with Bridge({MODEL: served}, config=bridge_config) as bridge:
        connection = Connection(
            broker=args.broker, client_id=f"control-loop-sensor-{run_id}", session_expiry_s=10
        )
        with Client(connection=connection, device_id=DEVICE) as client:
            warm = client.request(MODEL, text="pressure is normal", attempt_timeout_s=10)
            if not warm.get("ok"):
                print(f"the bridge did not answer the warm-up request: {warm}")
                return 1
            actuator.start()
            try:
                sent = run_loop(client, actuator, seconds=args.seconds, seed=args.seed)
            finally:
                actuator.stop()
        counts = bridge.worker.snapshot()["counts"]
    accounted, hit_rate = report(actuator.outcomes, actuator.actions, sent)
    print(f"bridge counts: {dict(sorted(counts.items()))}")
    once = accounted == sent == len(actuator.outcomes)
    return 0 if once and hit_rate >= args.min_hit_rate else 1


if __name__ == "__main__":
    raise SystemExit(main())
