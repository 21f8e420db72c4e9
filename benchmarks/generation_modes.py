"""Decoding modes of one generate package in one interleaved run: greedy, greedy with prompt
lookup, and chat sampling (temperature 0.7, top-p 0.9), on input-grounded prompts (extract from
or summarize a held BBC article) and open ones.

Reports decode tokens/s per mode (median over the rounds), the ratios the docs quote (lookup vs
plain greedy on each prompt kind, sampling vs greedy), whether lookup's greedy text is identical
to plain greedy's, and the per-token Python overhead (time outside onnxruntime).

    python benchmarks/generation_modes.py PKG --threads 2 --tokens 64 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig, SamplingConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

OPEN = [
    "Write a short story about a lighthouse keeper.",
    "What are three tips for staying healthy in winter?",
    "Explain why the sky is blue to a ten-year-old.",
]
ASKS = [
    "Summarize the article above in three sentences.",
    "Quote the two sentences of the article above that matter most.",
    "List the people named in the article above and what each of them said.",
]
MODES = {
    "greedy": SamplingConfig(draft_tokens=0),
    "greedy+lookup": SamplingConfig(),
    "top-p": SamplingConfig(temperature=0.7, top_p=0.9, seed=7, draft_tokens=0),
}


def grounded_prompts(count: int) -> list[str]:
    """Held BBC articles (never used for calibration), each with an extracting request."""
    from edgeinfer.export.data.text import bbc_articles

    held = bbc_articles()[1::2]  # the held split's articles (calibration takes the others)
    step = max(1, len(held) // count)
    out = []
    for k, (_, article) in enumerate(held[::step][:count]):
        body = " ".join(article.split())[:1400]  # ~300 tokens: the article's first paragraphs
        out.append(f"{body}\n\n{ASKS[k % len(ASKS)]}")
    return out


def measure(
    gen: Generator, prompt: str, mode: str, tokens: int
) -> tuple[float, tuple[int, ...], float]:
    """One generation: decode tokens/s, the token ids, Python overhead us/token."""
    gen.forget_prefix()
    gen.run_seconds = 0.0
    started = time.perf_counter()
    result = gen.generate(
        [{"role": "user", "content": prompt}], max_new_tokens=tokens, sampling=MODES[mode]
    )
    wall = time.perf_counter() - started
    count = max(1, len(result.token_ids))
    return result.decode_tokens_per_s, result.token_ids, (wall - gen.run_seconds) / count * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--grounded", type=int, default=3, help="grounded prompts")
    args = parser.parse_args(argv)
    gen = Generator(
        args.package,
        Manifest.read(args.package),
        config=RuntimeConfig(threads=args.threads),
        context_length=1024,
    )
    prompts = {"grounded": grounded_prompts(args.grounded), "open": OPEN}
    rates: dict[tuple[str, str], list[float]] = {}
    overhead: list[float] = []
    texts: dict[tuple[str, int, str], tuple[int, ...]] = {}
    for items in prompts.values():  # warm-up: kernel selection, allocations
        measure(gen, items[0], "greedy", 8)
    for _ in range(args.rounds):
        for kind, items in prompts.items():
            for index, prompt in enumerate(items):
                for mode in MODES:
                    rate, ids, python_us = measure(gen, prompt, mode, args.tokens)
                    rates.setdefault((kind, mode), []).append(rate)
                    texts[(kind, index, mode)] = ids
                    if mode == "greedy":
                        overhead.append(python_us)
    median = {f"{k}/{m}": round(float(np.median(v)), 1) for (k, m), v in rates.items()}
    identical = {
        f"{kind}[{i}]": texts[(kind, i, "greedy")] == texts[(kind, i, "greedy+lookup")]
        for kind, items in prompts.items()
        for i in range(len(items))
    }
    out: dict[str, Any] = {
        "package": str(args.package),
        "threads": args.threads,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "decode_tokens_per_s": median,
        "lookup_speedup": {
            kind: round(median[f"{kind}/greedy+lookup"] / median[f"{kind}/greedy"], 3)
            for kind in prompts
        },
        "top_p_vs_greedy": {
            kind: round(median[f"{kind}/top-p"] / median[f"{kind}/greedy"], 3) for kind in prompts
        },
        "lookup_identical_greedy_text": identical,
        "python_overhead_us_per_token_greedy": round(float(np.median(overhead)), 1),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
