"""Time to first token with and without the prefix KV cache: cold vs in memory vs from disk,
interleaved in one run.

A ~200-token system prompt is shared by every chat request; each adds its own question.
"Cold" prefills the whole prompt (the cache held something else); "memory" finds the system
prompt's keys and values in the generator's cache and prefills only the question; "disk" is a
generator whose cache is empty, as after a restart, that loads them from its prefix store
(``PrefixCacheConfig``) first. TTFT = tokenize + (load) + prefill + first sample.

    python benchmarks/prefix_cache.py PKG [--threads 2] [--rounds 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from edgeinfer.config import PrefixCacheConfig, RuntimeConfig
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
    manifest = Manifest.read(args.package)
    # Two generators in one process: spinning intra-op threads would slow the other one down.
    config = RuntimeConfig(threads=args.threads, spin_wait=False)
    chats = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS
    ]
    ttft: dict[str, list[float]] = {"cold": [], "memory": [], "disk": []}
    reused: dict[str, list[int]] = {"memory": [], "disk": []}
    with tempfile.TemporaryDirectory() as folder:
        plain = Generator(args.package, manifest, config=config, context_length=512)
        stored = Generator(
            args.package,
            manifest,
            config=config,
            context_length=512,
            prefix_cache=PrefixCacheConfig(directory=Path(folder)),
        )
        stored.generate(chats[0], max_new_tokens=1)  # stores the system prompt
        for i in range(args.rounds):
            plain.forget_prefix()
            ttft["cold"].append(plain.generate(chats[i % 3], max_new_tokens=1).ttft_ms)
            ttft["memory"].append(plain.generate(chats[(i + 1) % 3], max_new_tokens=1).ttft_ms)
            reused["memory"].append(plain.prefix_reused)
            stored.forget_prefix()  # an empty cache, as after a restart
            ttft["disk"].append(stored.generate(chats[(i + 2) % 3], max_new_tokens=1).ttft_ms)
            reused["disk"].append(stored.prefix_from_disk)
        size = sum(p.stat().st_size for p in Path(folder).glob("prefix-*.npz"))
    cold = float(np.median(ttft["cold"]))
    print(
        f"prompt {len(plain.encode(chats[0]))} tokens; reused {int(np.median(reused['memory']))} "
        f"from memory, {int(np.median(reused['disk']))} from disk ({size / 1e6:.1f} MB file)"
    )
    parts = [f"{k} {np.median(v):.1f} ms ({cold / np.median(v):.1f}x)" for k, v in ttft.items()]
    print("time to first token p50: " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
