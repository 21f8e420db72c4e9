"""The engine's bounded step: how many prompt tokens a newcomer may run between two decode
steps of the running streams (``ContinuousBatchConfig.prefill_chunk_tokens``), measured.

Four clients, each sending requests back to back (greedy, eos ignored, ``--tokens`` new tokens
each), so newcomers keep joining while the others decode; prompts are ~30-token chats, or the
same after a ~200-token passage (``long``). Per chunk size: per-stream inter-token p50/p99
(every gap between two tokens of one request, pooled), TTFT p50/p99 (submission to first
token) and the aggregate (every token of every request over the wall time, end to end), beside
our own single stream (the default ``edgeinfer.load`` path, one client, the same requests).
The chunk sizes and the single stream take turns round by round in one process (one session
per load), so a busy machine slows them alike.

    python benchmarks/step_budget.py PKG [--chunks 8,16,32,64,256] [--rounds 3] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig, SamplingConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

SUBJECTS = ["lighthouse keeper", "mountain guide", "village baker", "forest ranger"]
PASSAGE = (
    "The plant runs three lines. Line one fills glass bottles, line two fills cans, line "
    "three labels and packs both. Valves are numbered from the tank outwards; a pressure "
    "above six bar means the operator stops the line and calls the shift lead. "
) * 4


def _requests(gen: Generator, *, long: bool, per_client: int) -> list[list[list[int]]]:
    """Each client's prompts as token ids (a chat each)."""
    head = PASSAGE + "\n\n" if long else ""
    return [
        [
            gen.encode([{"role": "user", "content": f"{head}Write a story about a {s} ({i})."}])
            for i in range(per_client)
        ]
        for s in SUBJECTS
    ]


def _run(gen: Generator, clients: list[list[list[int]]], tokens: int) -> dict[str, Any]:
    """Every client's requests back to back, the clients at once; the gaps, TTFTs and rate."""
    gaps: list[float] = []
    ttfts: list[float] = []
    count = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients))

    def client(prompts: list[list[int]]) -> None:
        barrier.wait()
        for ids in prompts:
            submitted = time.perf_counter()
            seq = gen.engine.submit(
                ids, max_new_tokens=tokens, sampling=SamplingConfig(), stop_token_ids=frozenset()
            )
            arrivals = []
            for _ in seq:
                arrivals.append(time.perf_counter())
            with lock:
                ttfts.append((arrivals[0] - submitted) * 1e3)
                gaps.extend(np.diff(arrivals) * 1e3)
                count[0] += len(arrivals)

    threads = [threading.Thread(target=client, args=(c,)) for c in clients]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return {"gaps": gaps, "ttfts": ttfts, "tokens_per_s": count[0] / wall}


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    gaps = np.concatenate([r["gaps"] for r in runs])
    ttfts = np.concatenate([r["ttfts"] for r in runs])
    return {
        "inter_token_p50_ms": round(float(np.percentile(gaps, 50)), 1),
        "inter_token_p99_ms": round(float(np.percentile(gaps, 99)), 1),
        "ttft_p50_ms": round(float(np.percentile(ttfts, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttfts, 99)), 1),
        "tokens_per_s": round(float(np.median([r["tokens_per_s"] for r in runs])), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--chunks", default="8,16,32,64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--per-client", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    manifest, config = Manifest.read(args.package), RuntimeConfig(threads=args.threads)
    solo = Generator(args.package, manifest, config=config, context_length=512)
    four = Generator(
        args.package,
        manifest,
        config=config,
        context_length=512,
        batching=ContinuousBatchConfig(max_sequences=4),
    )
    result: dict[str, Any] = {"load_before": os.getloadavg(), "cpus": os.cpu_count()}
    for long in (False, True):
        clients = _requests(four, long=long, per_client=args.per_client)
        runs: dict[str, list[dict[str, Any]]] = {"single": [], **{str(c): [] for c in chunks}}
        for _ in range(args.rounds):
            runs["single"].append(_run(solo, [[p for c in clients for p in c]], args.tokens))
            for chunk in chunks:
                four.engine.prefill_chunk = chunk  # between runs: the engine is idle
                runs[str(chunk)].append(_run(four, clients, args.tokens))
        summary = {name: _summary(r) for name, r in runs.items()}
        single = summary["single"]["tokens_per_s"]
        for name in map(str, chunks):
            summary[name]["vs_single"] = round(summary[name]["tokens_per_s"] / single, 2)
        result["long" if long else "short"] = {
            "prompt_tokens": [len(c[0]) for c in clients],
            "by_chunk": summary,
        }
    result["load_after"] = os.getloadavg()
    solo.close()
    four.close()
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
