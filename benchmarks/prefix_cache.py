"""Time to first token with and without the prefix KV cache, same run, same generator.

A ~200-token system prompt is shared by every request; each request adds its own question.
"Cold" prefills the whole prompt (the cache held something else); "warm" finds the system
prompt's keys and values in the cache and prefills only the question.

    python benchmarks/prefix_cache.py PKG [--threads 2] [--rounds 10]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

SYSTEM = (
    "You are the maintenance assistant of a bottling plant. Answer in one short sentence. "
    "Line one fills glass bottles, line two fills cans, line three labels and packs both. "
    "Valves are numbered from the tank outwards; pressure above six bar means stop the line. "
    "Operators report faults by station number; escalate electrical faults to the shift lead. "
) * 3
QUESTIONS = ["Where is valve seven?", "Is line three running?", "Who handles a blown fuse?"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    gen = Generator(
        args.package,
        Manifest.read(args.package),
        config=RuntimeConfig(threads=args.threads),
        context_length=512,
    )
    prompts = [gen.encode(SYSTEM + " " + q) for q in QUESTIONS]
    cold, warm, reused = [], [], []
    for i in range(args.rounds):
        ids = prompts[i % len(prompts)]
        gen.forget_prefix()
        started = time.perf_counter()
        gen.prefill(ids)
        cold.append((time.perf_counter() - started) * 1e3)
        ids = prompts[(i + 1) % len(prompts)]  # same system prompt, another question
        started = time.perf_counter()
        gen.prefill(ids)
        warm.append((time.perf_counter() - started) * 1e3)
        reused.append(gen.prefix_reused)
    print(f"prompt {len(prompts[0])} tokens, {int(np.median(reused))} reused from the cache")
    print(
        f"time to first token p50: cold {np.median(cold):.1f} ms, "
        f"warm {np.median(warm):.1f} ms ({np.median(cold) / np.median(warm):.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
