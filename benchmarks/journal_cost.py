"""What the request journal costs a QoS 1 request: the record before the acknowledgement (on
the journal's thread, while the model runs: in the round trip only where it outlasts the
model) and the answer mark after the reply's PUBACK (batched), with fsync
(``synchronous=FULL``, the bridge's setting for records) and without (``NORMAL``: survives
``kill -9``, not a power cut).

The path is the bridge's own: ``Delivery.accept`` (lookup + record + submit, one row per commit:
the bridge's worst case, without a group commit) on a real SQLite
file in ``--dir`` (put it on the device's real storage: tmpfs or an overlay measure something
else), with a ~200-byte generate request and its v5 properties. Prints p50/p99 µs per record
and per answered request (marks committed in batches of ``--batch``), as JSON.

Usage::

    python benchmarks/journal_cost.py [--dir FOLDER] [--requests 2000] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.bridge.serve.delivery import Delivery
from edgeinfer.bridge.serve.journal import Answer, Inbound, Journal
from edgeinfer.bridge.wire import protocol as proto


def _inbound(i: int) -> Inbound:
    body = {"id": f"req-{i}", "prompt": "the sensor says the door is open", "max_new_tokens": 64}
    return Inbound(
        topic="edgeinfer/dev/m/req",
        payload=json.dumps(body).encode(),
        response_topic="edgeinfer/clients/c/reply",
        correlation=f"req-{i}".encode(),
        user_properties=(("tenant", "kitchen"),),
        message_expiry_s=60,
        received_ms=time.time() * 1e3,
    )


def _percentiles(samples_s: list[float]) -> dict[str, float]:
    us = np.asarray(samples_s) * 1e6
    return {
        "p50_us": round(float(np.percentile(us, 50)), 1),
        "p99_us": round(float(np.percentile(us, 99)), 1),
    }


def measure(folder: Path, *, durable: bool, requests: int, batch: int) -> dict[str, Any]:
    """Per-request record and answer costs of ``requests`` requests on a fresh journal."""
    journal = Journal(
        folder / f"journal-{'full' if durable else 'normal'}.sqlite3", durable=durable
    )
    delivery = Delivery(
        journal,
        decode=lambda inbound: proto.ErrorReply(proto.INTERNAL, "not decoded here"),
        submit=lambda decoded: None,
        send=lambda out: None,
        clock_ms=lambda: time.time() * 1e3,
        keep_s=3600.0,
        keep_answers=4096,
    )
    inbounds = [_inbound(i) for i in range(requests)]
    decoded = [
        proto.decode_request(
            inbound.payload,
            model="m",
            response_topic=inbound.response_topic,
            correlation=inbound.correlation,
            max_payload_bytes=1 << 16,
            received_ms=inbound.received_ms,
        )
        for inbound in inbounds
    ]
    records = []
    for inbound, request in zip(inbounds, decoded, strict=True):
        t0 = time.perf_counter()
        delivery.accept(inbound, request, 1)
        records.append(time.perf_counter() - t0)
    final = (
        b'{"v": 1, "id": "req", "ok": true, "done": true, "result": {"text": "'
        + b"x" * 300
        + b'"}}'
    )
    answers = []
    for start in range(0, requests, batch):
        keys = [("m", f"req-{i}") for i in range(start, min(start + batch, requests))]
        t0 = time.perf_counter()
        journal.answer([(key, Answer("json", final)) for key in keys], now_ms=time.time() * 1e3)
        answers.append((time.perf_counter() - t0) / len(keys))
    journal.close()
    return {"record": _percentiles(records), "answer_per_request": _percentiles(answers)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the journal files go")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=8, help="answers committed together")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        report = {
            mode: measure(Path(folder), durable=durable, requests=args.requests, batch=args.batch)
            for mode, durable in (("synchronous_full", True), ("synchronous_normal", False))
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
