"""Dynamic batching vs batch-1 serving at N concurrent callers (MiniLM int8 by default).

Three ways to serve the same closed-loop load (each caller sends its next request when its
previous one is answered), all on one ``Model``:

* single:   one caller, batch 1 - the single-request latency reference;
* batch-1:  N callers, requests served one at a time at batch 1 (a lock in front of the model);
            also "batch-1 concurrent": N callers running onnxruntime concurrently at batch 1;
* dynamic:  N callers through ``BatchConfig`` dynamic batching.

Requests are BBC News headlines (short texts, 8-20 tokens, as sensor/command/query traffic).

    .venv/bin/python benchmarks/dynamic_batching.py --package PKG [--callers 8] [--json]

Targets (exit 1 when missed): dynamic throughput >= 2x the better batch-1 baseline, and
dynamic p99 <= 2x the single-request p99.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import edgeinfer
from edgeinfer import BatchConfig


def _headlines(count: int) -> list[str]:
    from edgeinfer.export.calibrate import bbc_articles

    lines = [text.strip().splitlines()[0].strip() for _, text in bbc_articles()]
    return [line for line in lines if line][:count]


def _serve(
    call: Callable[[str], Any], texts: list[str], callers: int, per_caller: int
) -> dict[str, Any]:
    """Closed loop: ``callers`` threads, each sending ``per_caller`` requests back to back."""
    latencies_ms: list[list[float]] = [[] for _ in range(callers)]

    def caller(index: int) -> None:
        for i in range(per_caller):
            text = texts[(index * per_caller + i) % len(texts)]
            started = time.perf_counter()
            call(text)
            latencies_ms[index].append((time.perf_counter() - started) * 1e3)

    started = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(caller, range(callers)))
    wall_s = time.perf_counter() - started
    flat = np.concatenate([np.array(x) for x in latencies_ms])
    return {
        "callers": callers,
        "requests": int(flat.size),
        "throughput_rps": flat.size / wall_s,
        "p50_ms": float(np.percentile(flat, 50)),
        "p99_ms": float(np.percentile(flat, 99)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--package", type=Path, required=True, help="an embed package")
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=480, help="per configuration")
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--max-batch-size", type=int, default=None, help="default: --callers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    texts = _headlines(2000)
    per_caller = max(1, args.requests // args.callers)

    plain = edgeinfer.load(args.package)
    plain.embed(texts[:64], batch_size=1)  # warm every sequence length the load will use
    single = _serve(plain.embed, texts, 1, args.requests)
    lock = threading.Lock()

    def serialized(text: str) -> Any:
        with lock:
            return plain.embed(text)

    batch1 = _serve(serialized, texts, args.callers, per_caller)
    concurrent = _serve(plain.embed, texts, args.callers, per_caller)
    config = BatchConfig(
        max_batch_size=args.max_batch_size or args.callers, max_wait_ms=args.max_wait_ms
    )
    batched = edgeinfer.load(args.package, batching=config)
    _serve(batched.embed, texts, args.callers, 8)  # warm the batch shapes
    dynamic = _serve(batched.embed, texts, args.callers, per_caller)
    snap = batched.metrics().latency_ms["embed"]
    dynamic["queue_p50_ms"] = snap["queue"].p50_ms
    dynamic["compute_p50_ms"] = snap["compute"].p50_ms
    batched.close()

    baseline = max(batch1["throughput_rps"], concurrent["throughput_rps"])
    speedup = dynamic["throughput_rps"] / baseline
    p99_ratio = dynamic["p99_ms"] / single["p99_ms"]
    ok = speedup >= 2.0 and p99_ratio <= 2.0
    report = {
        "package": str(args.package),
        "single": single,
        "batch1_serialized": batch1,
        "batch1_concurrent": concurrent,
        "dynamic": dynamic,
        "throughput_vs_best_batch1": speedup,
        "p99_vs_single_p99": p99_ratio,
        "p99_vs_batch1_serialized_p99": dynamic["p99_ms"] / batch1["p99_ms"],
        "targets_met": ok,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if ok else 1
    print(f"{'mode':<22}{'callers':>8}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for name, r in (
        ("single (batch 1)", single),
        ("batch-1 serialized", batch1),
        ("batch-1 concurrent", concurrent),
        ("dynamic batching", dynamic),
    ):
        print(
            f"{name:<22}{r['callers']:>8}{r['throughput_rps']:>10.1f}"
            f"{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}"
        )
    print(
        f"dynamic: queue p50 {dynamic['queue_p50_ms']:.2f} ms, compute p50 "
        f"{dynamic['compute_p50_ms']:.2f} ms"
    )
    print(
        f"throughput {speedup:.2f}x the best batch-1 serving (target >= 2x); "
        f"p99 {p99_ratio:.2f}x the single-request p99 (target <= 2x), "
        f"{report['p99_vs_batch1_serialized_p99']:.2f}x the batch-1 serving p99"
    )
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
