"""What one graph run of the continuous-batching engine costs: a decode step of 1..N rows (one
token each, the engine's ``Runs.step``) and a prompt chunk of S tokens on one row
(``Runs.forward``), in CPU milliseconds of the run itself.

One intra-op thread and no spinning, so onnxruntime computes on the calling thread and
``time.thread_time`` counts the whole run and nothing else: the figures barely move with the
machine's load (the wall clock of a loaded machine does), and their ratios hold on a quiet one
with more threads. The shapes take turns run by run. ``--profile`` adds onnxruntime's per-op
split of a step at 1 and at N rows (median microseconds per node over the runs, summed by op
type; wall time inside the ops, so it is noisier than the CPU figures).

    python benchmarks/step_cost.py PKG [--rows 4] [--chunks 1,8,16,32,64] [--runs 30]
        [--profile DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

PROMPT = [{"role": "user", "content": "Write a story about a lighthouse keeper and the sea."}]


def _load(package: Path, rows: int, profile: Path | None) -> Generator:
    config = RuntimeConfig(threads=1, spin_wait=False, profile_dir=profile)
    batching = ContinuousBatchConfig(max_sequences=rows)
    return Generator(
        package, Manifest.read(package), config=config, context_length=512, batching=batching
    )


def _costs(gen: Generator, rows: int, chunks: list[int], runs: int) -> dict[str, list[float]]:
    """CPU seconds of each run: ``step:B`` for B = 1..rows, ``chunk:S`` per chunk size."""
    engine = gen.engine
    graph, slots = engine._runs, engine.slots  # the engine is idle: its thread waits
    prompt = gen.encode(PROMPT)
    slots.ensure(len(prompt) + max(chunks) + 2)
    for row in range(rows):  # every row holds the prompt: the steps attend over it
        graph.forward(row, prompt, 0, rows=1, output="logits")
    spare = list(range(1000, 1000 + max(chunks)))  # any ids: a chunk's cost is its shape's
    seconds: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(runs):
        for batch in range(1, rows + 1):
            for row in range(batch):
                graph.token[row, 0] = prompt[-1]
                graph.position[row, 0] = len(prompt)
                slots.open(row, len(prompt) + 1)
            started = time.thread_time()
            graph.step(batch, greedy=True)
            seconds[f"step:{batch}"].append(time.thread_time() - started)
        for size in chunks:  # on the last row, over its prompt: written again each time
            started = time.thread_time()
            graph.forward(rows - 1, spare[:size], len(prompt), rows=1, output="logits")
            seconds[f"chunk:{size}"].append(time.thread_time() - started)
    return seconds


def _by_op(trace: Path, runs: int) -> dict[str, float]:
    """Median microseconds per node over the last ``runs`` runs, summed by op type."""
    events = json.loads(trace.read_text())
    first = [e for e in events if e.get("name") == "model_run"][-runs]["ts"]
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    op: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["ts"] >= first:
            if event["name"].endswith("_kernel_time"):
                per_node[event["name"]].append(event["dur"])
                op[event["name"]] = event["args"]["op_name"]
    totals: collections.Counter[str] = collections.Counter()
    for name, durations in per_node.items():
        totals[op[name]] += statistics.median(durations)
    return {name: round(us) for name, us in totals.most_common(8)}


def _profiled(package: Path, rows: int, runs: int, folder: Path) -> dict[str, Any]:
    """The per-op split of a step at 1 and at ``rows`` rows, one session each."""
    split = {}
    for batch in sorted({1, rows}):
        out = folder / f"rows{batch}"
        out.mkdir(parents=True, exist_ok=True)
        gen = _load(package, batch, out)
        graph, slots, prompt = gen.engine._runs, gen.engine.slots, gen.encode(PROMPT)
        for row in range(batch):
            graph.forward(row, prompt, 0, rows=1, output="logits")
        for _ in range(runs):
            for row in range(batch):
                graph.token[row, 0], graph.position[row, 0] = prompt[-1], len(prompt)
                slots.open(row, len(prompt) + 1)
            graph.step(batch, greedy=True)
        trace = Path(gen.engine._runs._session.end_profiling())
        gen.close()
        split[f"step:{batch}"] = _by_op(trace, runs)
    return split


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--chunks", default="1,8,16,32,64")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    gen = _load(args.package, args.rows, None)
    load_before = os.getloadavg()
    seconds = _costs(gen, args.rows, chunks, args.runs)
    gen.close()
    one = min(seconds["step:1"])
    result: dict[str, Any] = {"load_before": load_before, "load_after": os.getloadavg()}
    result["cpu_ms"] = {
        name: {
            "min": round(min(v) * 1e3, 2),
            "median": round(float(np.median(v)) * 1e3, 2),
            "vs_step_1_min": round(min(v) / one, 2),
        }
        for name, v in seconds.items()
    }
    if args.profile is not None:
        result["by_op_us"] = _profiled(args.package, args.rows, args.runs, args.profile)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
