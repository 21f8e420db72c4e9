"""Resident memory of a generate package with 1, 4 and 8 sequences decoded at once: the
increase over the idle engine against the KV bytes those sequences hold.

Each sequence gets the same chat prompt and 400 new tokens (eos ignored); once every one has
decoded ``--tokens`` tokens, VmRSS and the engine's KV bytes are read together, then the
sequences are cancelled (their pages go back) before the next count. The idle figure is read
after a first round at the largest count, so it holds the fixed costs (onnxruntime's arena at
that batch) and each row what its streams add.

    python benchmarks/concurrent_memory.py --package PKG [--counts 1,4,8] [--tokens 200]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgeinfer.bench.footprint import memory_usage
from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig, SamplingConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, required=True)
    parser.add_argument("--counts", default="1,4,8")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    gen = Generator(
        args.package,
        Manifest.read(args.package),
        config=RuntimeConfig(threads=args.threads),
        context_length=args.tokens + 512,
        batching=ContinuousBatchConfig(max_sequences=max(counts)),
    )
    gen.warm_up(2)
    engine = gen.engine
    assert engine is not None
    ids = gen.encode(PROMPT)
    idle, rows = 0, []
    # A first round at the largest count warms onnxruntime's arena for that batch (it keeps
    # its peak): the idle figure then holds every fixed cost, the rows what each stream adds.
    for count in [max(counts), *counts]:
        seqs = [
            engine.submit(
                ids, max_new_tokens=400, sampling=SamplingConfig(), stop_token_ids=frozenset()
            )
            for _ in range(count)
        ]
        streams = [iter(s) for s in seqs]
        for stream in streams:
            for _ in range(args.tokens):
                next(stream)
        rss, kv = memory_usage().rss_bytes, engine.slots.nbytes
        if idle:
            rows.append(
                {
                    "sequences": count,
                    "rss_increase_mb": round((rss - idle) / 2**20, 1),
                    "kv_mb": round(kv / 2**20, 1),
                    "difference_mb": round((rss - idle - kv) / 2**20, 1),
                }
            )
        for seq in seqs:
            seq.cancel()
        for stream in streams:
            for _ in stream:
                pass
        idle = idle or memory_usage().rss_bytes
    gen.close()
    print(json.dumps({"idle_rss_mb": round(idle / 2**20, 1), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
