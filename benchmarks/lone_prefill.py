"""What the lone-run cap (``ContinuousBatchConfig.lone_prefill_tokens``) costs and saves: a long
prompt run alone (none decoding beside it) in runs of up to the cap, its peak resident growth
and its prefill time, each cap in a fresh process (a process keeps what an earlier run grew
its heap and onnxruntime's arena to). Caps take turns, round after round.

The peak is ``VmHWM`` reset (``/proc/self/clear_refs``) after the load and a short warm-up
prompt, less the resident size then; the keys/values the prompt writes are part of it (the
same at every cap). Times are the prompt's wall and process-CPU seconds (2 threads), so they
move with the machine's load: compare caps within one run.

Linux only (``/proc``).

    python benchmarks/lone_prefill.py PKG [--tokens 2000] [--caps 128,256,512,2048] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from edgeinfer.bench.footprint import memory_usage
from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig, SamplingConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

WORDS = "the pump valve is open and the line pressure is rising slowly in tank three".split()


def measure(package: Path, cap: int, tokens: int) -> dict[str, Any]:
    """One cap in this process: peak growth, keys/values and time of a ``tokens`` prompt."""
    manifest = Manifest.read(package)
    gen = Generator(
        package,
        manifest,
        config=RuntimeConfig(threads=2),
        context_length=tokens + 1,
        batching=ContinuousBatchConfig(max_sequences=2, lone_prefill_tokens=cap),
    )
    engine = gen.engine
    assert engine is not None
    words = gen.encode(" ".join(WORDS))
    ids = (words * (tokens // len(words) + 1))[:tokens]
    list(engine.submit(ids[:8], max_new_tokens=2, sampling=SamplingConfig()))
    engine.forget_prefix()
    before = memory_usage().rss_bytes
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    cpu, wall = time.process_time(), time.perf_counter()
    seq = engine.submit(ids, max_new_tokens=1, sampling=SamplingConfig())
    list(seq)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    got = {
        "cap": cap,
        "tokens": tokens,
        "peak_growth_mib": (memory_usage().peak_rss_bytes - before) / 2**20,
        "kv_mib": seq.needed_positions * engine.slots.bytes_per_token / 2**20,
        "wall_s": wall,
        "cpu_s": cpu,
    }
    gen.close()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--caps", default="128,256,512,2048")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: this cap only
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.package, args.one, args.tokens)))
        return
    rows: dict[int, list[dict[str, Any]]] = {int(c): [] for c in args.caps.split(",")}
    for _ in range(args.rounds):
        for cap in rows:
            command = [sys.executable, __file__, str(args.package), "--tokens", str(args.tokens)]
            done = subprocess.run([*command, "--one", str(cap)], capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(done.stderr[-2000:])
            rows[cap].append(json.loads(done.stdout))
    print("| cap | peak growth MiB | of it keys/values MiB | prefill wall s | prefill CPU s |")
    print("|---|---|---|---|---|")
    for cap, got in rows.items():
        peak = max(g["peak_growth_mib"] for g in got)
        wall = min(g["wall_s"] for g in got)
        cpu = min(g["cpu_s"] for g in got)
        print(f"| {cap} | {peak:.0f} | {got[0]['kv_mib']:.0f} | {wall:.2f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
