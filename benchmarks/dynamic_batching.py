"""Dynamic batching vs batch-1 serving at N concurrent callers (MiniLM int8 by default).

Three ways to serve the same closed-loop load (each caller sends its next request when its
previous one is answered), all on one ``Model``:

* single:   one caller, batch 1 - the single-request latency reference;
* batch-1:  N callers, requests served one at a time at batch 1 (a lock in front of the model);
            also "batch-1 concurrent": N callers running onnxruntime concurrently at batch 1;
* dynamic:  N callers through ``BatchConfig`` dynamic batching.

Requests are BBC News headlines (short texts, 5-14 tokens, as command/query traffic), or
with ``--texts sensor`` sensor-like readings of 10 tokens.

    .venv/bin/python benchmarks/dynamic_batching.py --package PKG [--callers 8] [--json]

The modes run in interleaved rounds (each round serves every mode once), so a shared,
noisy machine loads them alike. The script also times one batch of N texts against N batch-1
calls (the graph's own batching gain, the ceiling for any batcher).

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
    from edgeinfer.export.data.text import bbc_articles

    lines = [text.strip().splitlines()[0].strip() for _, text in bbc_articles()]
    return [line for line in lines if line][:count]


def _sensor_lines(count: int) -> list[str]:
    """Sensor-like readings ("line 3 valve 12 4.2 bar", 10 tokens): the shortest inputs,
    where per-call overhead weighs most."""
    rng = np.random.default_rng(0)
    return [
        f"line {rng.integers(1, 9)} valve {rng.integers(1, 40)} {rng.uniform(0, 9):.1f} bar"
        for _ in range(count)
    ]


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
    return {"callers": callers, "latencies_ms": flat, "wall_s": wall_s}


def _graph_ceiling(model: Any, texts: list[str], size: int, rounds: int) -> dict[str, float]:
    """Per-text speedup of one batch of ``size`` over ``size`` batch-1 calls (interleaved):
    the most any batching can give on this machine."""
    one, many = [], []
    for i in range(rounds):
        chunk = texts[i * size : (i + 1) * size]
        started = time.perf_counter()
        for text in chunk:
            model.embed(text)
        one.append((time.perf_counter() - started) / size)
        started = time.perf_counter()
        model.embed(chunk, batch_size=size)
        many.append(time.perf_counter() - started)
    t1, tn = float(np.median(one)) * 1e3, float(np.median(many)) * 1e3
    return {"batch1_ms": t1, f"batch{size}_ms": tn, "per_text_speedup": size * t1 / tn}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--package", type=Path, required=True, help="an embed package")
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=480, help="per configuration")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--max-batch-size", type=int, default=None, help="default: --callers")
    parser.add_argument("--bucket-tokens", type=int, default=32)
    parser.add_argument("--no-adaptive-wait", action="store_true")
    parser.add_argument("--workers", type=int, default=1, help="batches run at once")
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--texts", choices=("headlines", "sensor"), default="headlines")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    texts = _headlines(2000) if args.texts == "headlines" else _sensor_lines(2000)
    per_round = max(args.callers, args.requests // args.rounds)
    per_caller = per_round // args.callers

    plain = edgeinfer.load(args.package, threads=args.threads)
    plain.embed(texts[:64], batch_size=1)  # warm every sequence length the load will use
    config = BatchConfig(
        max_batch_size=args.max_batch_size or args.callers,
        max_wait_ms=args.max_wait_ms,
        bucket_tokens=args.bucket_tokens,
        adaptive_wait=not args.no_adaptive_wait,
        workers=args.workers,
    )
    batched = edgeinfer.load(args.package, threads=args.threads, batching=config)
    _serve(batched.embed, texts, args.callers, 8)  # warm the batch shapes
    lock = threading.Lock()

    def serialized(text: str) -> Any:
        with lock:
            return plain.embed(text)

    modes: dict[str, tuple[Callable[[str], Any], int]] = {
        "single": (plain.embed, 1),
        "batch1_serialized": (serialized, args.callers),
        "batch1_concurrent": (plain.embed, args.callers),
        "dynamic": (batched.embed, args.callers),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    for _ in range(args.rounds):  # interleaved: every mode sees the same machine load
        for name, (call, callers) in modes.items():
            count = per_round if callers == 1 else per_caller
            runs[name].append(_serve(call, texts, callers, count))
    results = {name: _merge(parts) for name, parts in runs.items()}
    single, batch1, concurrent, dynamic = (results[name] for name in modes)
    snap = batched.metrics().latency_ms["embed"]
    dynamic["queue_p50_ms"] = snap["queue"].p50_ms
    dynamic["compute_p50_ms"] = snap["compute"].p50_ms
    batched.close()
    ceiling = _graph_ceiling(plain, texts, args.callers, rounds=20)

    baseline = max(batch1["throughput_rps"], concurrent["throughput_rps"])
    speedup = dynamic["throughput_rps"] / baseline
    p99_ratio = dynamic["p99_ms"] / single["p99_ms"]
    ok = speedup >= 2.0 and p99_ratio <= 2.0
    report = {
        "package": str(args.package),
        "config": {"threads": args.threads, **vars(config)},
        **results,
        "graph_ceiling": ceiling,
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
    n = args.callers
    print(
        f"graph ceiling: batch of {n} {ceiling[f'batch{n}_ms']:.2f} ms vs {n} x "
        f"{ceiling['batch1_ms']:.2f} ms at batch 1: {ceiling['per_text_speedup']:.2f}x per text "
        f"(the p99 target needs {n / 2:.0f}x: with {n} closed-loop callers latency = {n} / "
        "throughput)"
    )
    print(
        f"throughput {speedup:.2f}x the best batch-1 serving (target >= 2x); "
        f"p99 {p99_ratio:.2f}x the single-request p99 (target <= 2x), "
        f"{report['p99_vs_batch1_serialized_p99']:.2f}x the batch-1 serving p99"
    )
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's rounds as one result: total requests over total time, pooled percentiles."""
    flat = np.concatenate([p["latencies_ms"] for p in parts])
    return {
        "callers": parts[0]["callers"],
        "requests": int(flat.size),
        "throughput_rps": flat.size / sum(p["wall_s"] for p in parts),
        "p50_ms": float(np.percentile(flat, 50)),
        "p99_ms": float(np.percentile(flat, 99)),
    }


if __name__ == "__main__":
    sys.exit(main())
