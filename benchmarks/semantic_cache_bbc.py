"""Semantic cache on labelled BBC News: calibrate τ to a false-hit budget, check it held out.

The workload: half of the articles were asked before (the cache holds "headline. first
sentence" with its answer); requests are either another view of one of those articles
(its headline alone, or sentences 2-3, 4-5 or 6-7 of its body: the same story asked
differently) or an article never
seen. The fresh answer to a request is its topic label (a perfect classifier's answer), so a
*false hit* is a semantic hit whose cached label differs from the request's own topic.

Requests are split at random into a calibration half, where τ is chosen as the lowest value
whose false-hit rate (false hits / hits) is within the budget at 95 % confidence, and a
held-out half, where the false-hit rate and hit rate at that τ are reported, measured with the
runtime's ``SemanticCache`` and the MiniLM int8 embedder.

    .venv/bin/python benchmarks/semantic_cache_bbc.py --embedder PKG [--budget 0.01] [--json]

Exit code 1 when the held-out false-hit rate exceeds the budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import edgeinfer
from edgeinfer.runtime.cache.semantic import SemanticCache, calibrate_threshold, threshold_curve


def _sentences(text: str) -> tuple[str, list[str]]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    body = " ".join(lines[1:])
    return lines[0], [s.strip().rstrip(".") + "." for s in body.split(". ") if s.strip()]


def _workload(seed: int) -> tuple[list[str], list[str], list[str], list[str]]:
    """(cached texts, their labels, request texts, their labels)."""
    from edgeinfer.export.data.text import bbc_articles

    articles = bbc_articles()
    order = np.random.default_rng(seed).permutation(len(articles))
    seen, unseen = order[: len(order) // 2], order[len(order) // 2 :]
    cached, cached_labels, requests, request_labels = [], [], [], []
    for i in seen:
        topic, text = articles[i]
        headline, sentences = _sentences(text)
        if len(sentences) < 7:
            continue
        cached.append(f"{headline}. {sentences[0]}")
        cached_labels.append(topic)
        # The same story asked differently: by its headline alone, or by later sentences.
        for view in ([headline], sentences[1:3], sentences[3:5], sentences[5:7]):
            requests.append(" ".join(view))
            request_labels.append(topic)
    for i in unseen:
        topic, text = articles[i]
        headline, sentences = _sentences(text)
        if sentences:
            requests.append(f"{headline}. {sentences[0]}")  # a story never asked before
            request_labels.append(topic)
    return cached, cached_labels, requests, request_labels


def _brute_force_ms(entries: int, dim: int) -> float:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((entries, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cache: SemanticCache[int] = SemanticCache(
        embed=lambda t: vectors[:0], threshold=0.9, max_entries=entries
    )
    cache.add(vectors, list(range(entries)))
    query = vectors[:1]
    timings = []
    for _ in range(200):
        started = time.perf_counter()
        cache.lookup(query)
        timings.append((time.perf_counter() - started) * 1e3)
    return float(np.median(timings))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--embedder", type=Path, required=True, help="MiniLM int8 package")
    parser.add_argument("--budget", type=float, default=0.01, help="allowed false-hit rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    cached, cached_labels, requests, request_labels = _workload(args.seed)
    embedder = edgeinfer.load(args.embedder)
    started = time.perf_counter()
    cached_vectors = embedder.embed(cached)  # [C, D]
    request_vectors = embedder.embed(requests)  # [R, D]
    embed_s = time.perf_counter() - started

    sims = request_vectors @ cached_vectors.T  # [R, C]
    best = sims.argmax(axis=1)
    similarity = sims[np.arange(len(requests)), best]
    same = np.array([cached_labels[j] == request_labels[i] for i, j in enumerate(best)])
    split = np.random.default_rng(args.seed + 1).permutation(len(requests))
    calib, held = split[: len(split) // 2], split[len(split) // 2 :]
    calibration = calibrate_threshold(similarity[calib], same[calib], false_hit_budget=args.budget)
    tau = calibration.threshold

    # Held out, through the runtime's own SemanticCache.
    cache: SemanticCache[str] = SemanticCache(
        embed=embedder.embed, threshold=tau, max_entries=len(cached)
    )
    cache.add(cached_vectors, cached_labels)
    found = cache.lookup(request_vectors[held])
    hits = [(hit[0], request_labels[i]) for hit, i in zip(found, held, strict=True) if hit]
    false_hits = sum(label != truth for label, truth in hits)
    held_hit_rate = len(hits) / len(held)
    held_false_rate = false_hits / len(hits) if hits else 0.0
    grid = [round(0.5 + 0.05 * i, 2) for i in range(10)] + [tau]
    held_curve = threshold_curve(similarity[held], same[held], sorted(set(grid)))
    ok = held_false_rate <= args.budget
    report: dict[str, Any] = {
        "embedder": str(args.embedder),
        "cached_texts": len(cached),
        "requests": len(requests),
        "calibration_requests": int(calib.size),
        "held_out_requests": int(held.size),
        "budget": args.budget,
        "threshold": tau,
        "calibration_at_threshold": calibration.chosen.__dict__,
        "held_out": {
            "hit_rate": held_hit_rate,
            "false_hit_rate": held_false_rate,
            "hits": len(hits),
            "false_hits": false_hits,
            "false_hits_per_request": false_hits / len(held),
        },
        "held_out_curve": [p.__dict__ for p in held_curve],
        "embed_s": embed_s,
        "brute_force_lookup_ms": {
            n: _brute_force_ms(n, cached_vectors.shape[1]) for n in (1_000, 10_000, 100_000)
        },
        "target_met": ok,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if ok else 1
    print(
        f"{len(cached)} cached texts, {len(requests)} requests "
        f"({calib.size} calibration, {held.size} held out); embedding took {embed_s:.0f} s"
    )
    print("held-out curve (false-hit rate = wrong answers among hits):")
    print(f"{'tau':>7}{'hit rate':>10}{'false-hit':>11}{'hits':>7}{'false':>7}")
    for p in held_curve:
        mark = "  <- calibrated" if p.threshold == tau else ""
        print(
            f"{p.threshold:>7.3f}{p.hit_rate:>10.1%}{p.false_hit_rate:>11.2%}"
            f"{p.hits:>7}{p.false_hits:>7}{mark}"
        )
    print(
        f"calibrated τ = {tau:.3f} for a {args.budget:.0%} budget "
        f"(calibration: {calibration.chosen.false_hit_rate:.2%} false hits, 95 % bound "
        f"{calibration.chosen.false_hit_upper:.2%}, hit rate {calibration.chosen.hit_rate:.1%})"
    )
    print(
        f"held out at τ (runtime SemanticCache): hit rate {held_hit_rate:.1%}, false-hit rate "
        f"{held_false_rate:.2%} ({false_hits}/{len(hits)})"
    )
    print(
        "brute-force lookup, 1 query: "
        + ", ".join(f"{n} entries {ms:.3f} ms" for n, ms in report["brute_force_lookup_ms"].items())
    )
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
