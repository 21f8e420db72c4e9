"""Batch-1 latency of ONNX image graphs side by side (an int8 QDQ graph and its fp32 source),
measured in interleaved blocks so that machine noise hits every graph alike.

    python benchmarks/graph_speed.py fp32.onnx int8.onnx [--runs 200] [--threads 1]

Prints each graph's median and p90 in ms, its speed-up over the first graph, the CPU's int8
flags and the load average (``os.getloadavg``) before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")


def _cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return [flag for flag in _FLAGS if flag in have]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graphs", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--block", type=int, default=10, help="runs per graph per turn")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    sessions = [
        ort.InferenceSession(str(g), options, providers=["CPUExecutionProvider"])
        for g in args.graphs
    ]
    first = sessions[0].get_inputs()[0]
    shape = [1 if not isinstance(d, int) else d for d in first.shape]
    feed = {first.name: np.random.default_rng(0).normal(size=shape).astype(np.float32)}
    for session in sessions:  # warm-up
        session.run(None, feed)
    times: list[list[float]] = [[] for _ in sessions]
    load_before = os.getloadavg()[0]
    while len(times[0]) < args.runs:
        for session, spent in zip(sessions, times, strict=True):
            for _ in range(args.block):
                start = time.perf_counter()
                session.run(None, feed)
                spent.append((time.perf_counter() - start) * 1000)
    load_after = os.getloadavg()[0]
    base = float(np.median(times[0]))
    print(f"cpu flags: {' '.join(_cpu_flags())}; threads {args.threads}; runs {len(times[0])}")
    print(f"load average {load_before:.1f} before, {load_after:.1f} after")
    for graph, spent in zip(args.graphs, times, strict=True):
        median, p90 = float(np.median(spent)), float(np.percentile(spent, 90))
        print(f"{graph.name}: median {median:.2f} ms, p90 {p90:.2f} ms, {base / median:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
