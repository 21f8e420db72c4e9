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

``--clock graph-cpu`` times the same runs on the engines' own clock instead of the wall: the
CPU seconds of their graph runs (one intra-op thread, so onnxruntime computes on the engine's
thread and ``time.thread_time`` counts all of it; no spinning). A token's time is that clock
when the engine accepted it, a submission's the clock when it was queued, so the gaps, TTFTs
and rates count graph work only (no Python, no waiting for a core) and barely move with the
machine's load; ``graph_runs_per_token`` counts the runs. The wall clock of a quiet machine
with more threads differs by a factor, not in the ranking.

    python benchmarks/step_budget.py PKG [--chunks 8,16,32,64,256] [--rounds 3] [--tokens 64]
        [--clock wall|graph-cpu] [--prompts short,long]
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
from edgeinfer.runtime.generate.sequence import Sequence

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


class GraphClock:
    """CPU seconds of ``gen``'s graph runs so far (its engine's thread computes them: one
    intra-op thread), and how many runs."""

    def __init__(self, gen: Generator) -> None:
        self.seconds, self.runs = 0.0, 0
        runs = gen.engine._runs
        run = runs._run

        def timed(binding: Any) -> None:
            started = time.thread_time()
            run(binding)
            self.seconds += time.thread_time() - started
            self.runs += 1

        runs._run = timed  # type: ignore[method-assign]

    def __call__(self) -> float:
        return self.seconds


def _run(
    gen: Generator, clients: list[list[list[int]]], tokens: int, clock: GraphClock | None
) -> dict[str, Any]:
    """Every client's requests back to back, the clients at once; the gaps, TTFTs and rate
    (on ``clock``, else the wall as each token reaches its client)."""
    gaps: list[float] = []
    ttfts: list[float] = []
    count = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients))
    now = clock or time.perf_counter

    def client(prompts: list[list[int]]) -> None:
        barrier.wait()
        for ids in prompts:
            seq = gen.engine.add(
                Sequence(
                    ids,
                    max_new_tokens=tokens,
                    sampling=SamplingConfig(),
                    stop_token_ids=frozenset(),
                    clock=now,
                )
            )
            arrivals = [time.perf_counter() for _ in seq]
            if clock is not None:  # when the engine accepted each, on its clock
                arrivals = seq.token_s
            with lock:
                ttfts.append((arrivals[0] - seq.started) * 1e3)
                gaps.extend(np.diff(arrivals) * 1e3)
                count[0] += len(arrivals)

    threads = [threading.Thread(target=client, args=(c,)) for c in clients]
    started, runs = now(), clock.runs if clock is not None else 0
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = {"gaps": gaps, "ttfts": ttfts, "tokens_per_s": count[0] / (now() - started)}
    if clock is not None:
        result["graph_runs_per_token"] = (clock.runs - runs) / count[0]
    return result


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    gaps = np.concatenate([r["gaps"] for r in runs])
    ttfts = np.concatenate([r["ttfts"] for r in runs])
    return {
        "inter_token_p50_ms": round(float(np.percentile(gaps, 50)), 1),
        "inter_token_p99_ms": round(float(np.percentile(gaps, 99)), 1),
        "ttft_p50_ms": round(float(np.percentile(ttfts, 50)), 1),
        "ttft_p99_ms": round(float(np.percentile(ttfts, 99)), 1),
        "tokens_per_s": round(float(np.median([r["tokens_per_s"] for r in runs])), 1),
        **(
            {
                "graph_runs_per_token": round(
                    float(np.mean([r["graph_runs_per_token"] for r in runs])), 3
                )
            }
            if "graph_runs_per_token" in runs[0]
            else {}
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--chunks", default="8,16,32,64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--per-client", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=("wall", "graph-cpu"), default="wall")
    parser.add_argument("--prompts", default="short,long")
    args = parser.parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    on_cpu = args.clock == "graph-cpu"
    config = (
        RuntimeConfig(threads=1, spin_wait=False) if on_cpu else RuntimeConfig(threads=args.threads)
    )
    manifest = Manifest.read(args.package)
    solo = Generator(args.package, manifest, config=config, context_length=512)
    four = Generator(
        args.package,
        manifest,
        config=config,
        context_length=512,
        batching=ContinuousBatchConfig(max_sequences=4),
    )
    clocks = (GraphClock(solo), GraphClock(four)) if on_cpu else (None, None)
    result: dict[str, Any] = {
        "clock": args.clock,
        "load_before": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    for long in (kind == "long" for kind in args.prompts.split(",")):
        clients = _requests(four, long=long, per_client=args.per_client)
        runs: dict[str, list[dict[str, Any]]] = {"single": [], **{str(c): [] for c in chunks}}
        for _ in range(args.rounds):
            every = [[p for c in clients for p in c]]
            runs["single"].append(_run(solo, every, args.tokens, clocks[0]))
            for chunk in chunks:
                four.engine.prefill_chunk = chunk  # between runs: the engine is idle
                runs[str(chunk)].append(_run(four, clients, args.tokens, clocks[1]))
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
