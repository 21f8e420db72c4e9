"""Early exit on held-out data: mean latency and accuracy at the default exit rule vs the full
depth. Text: BBC News on MiniLM, both input variants (headline + first sentence; full text cut
to 128 tokens). Vision (``--model mnist-cnn``): the MNIST CNN with an exit per conv block.

    .venv/bin/python benchmarks/early_exit.py --out pkg/ee-bench [--articles N] [--json F]
    .venv/bin/python benchmarks/early_exit.py --model mnist-cnn --out ee-cnn [--threads 1]

The vision run is ``edgeinfer bench PKG --early-exit-curve`` (edgeinfer/bench/early_exit_curve.py)
on a package this script builds; the text run is described below.

Builds (or reuses) an early-exit MiniLM package through the real export (heads trained on the
train split, threshold chosen on the validation split), then measures on the test split, which
neither step saw. The full-depth reference is the same package with a threshold above 1: every
segment runs and the last (layer 6) head answers, i.e. the full model plus two tiny exit heads
(mean pooling + a 384x5 linear each). Latency: one text per call (batch 1, as a device sees
requests), early exit and full depth alternating text by text so machine noise hits both alike.
Also compares the two batch policies on batches of 16 texts.
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
from edgeinfer.config import RuntimeConfig
from edgeinfer.export.data.topics import LabelledSplit, labelled_split
from edgeinfer.export.options import EarlyExitOptions, ExportOptions
from edgeinfer.export.run import export
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.batching import pad_rows
from edgeinfer.runtime.kinds.early_exit import SegmentRunner
from edgeinfer.runtime.kinds.exit_curve import NEVER_EXIT
from edgeinfer.runtime.tokenizer import TextTokenizer

BATCH = 16


def build(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    if out.exists() and not args.rebuild:
        Manifest.read(out).verify(out)
        return out
    vision = args.model == "mnist-cnn"
    export(
        ExportOptions(
            source=args.model,
            out=out,
            task="classify",
            quantize="none" if vision else args.quantize,
            builder=EarlyExitOptions(
                exit_every=None if vision else args.exit_every, limit=args.articles
            ),
            max_accuracy_loss=args.max_accuracy_loss,
            overwrite=True,
            threads=args.threads,
        ),
        progress=lambda stage, s: print(f"  {stage:<12} {s:7.1f} s", file=sys.stderr),
    )
    return out


def measure(model: edgeinfer.Model, split: LabelledSplit, tau: float) -> dict[str, Any]:
    labels = [split.topics[i] for i in split.labels]
    ms: dict[str, list[float]] = {"early_exit": [], "full_depth": []}
    correct: dict[str, list[bool]] = {"early_exit": [], "full_depth": []}
    layers: list[int] = []
    for text, label in zip(split.texts, labels, strict=True):
        for name, threshold in (("early_exit", tau), ("full_depth", NEVER_EXIT)):
            began = time.perf_counter()
            result = model.classify([text], exit_threshold=threshold)[0]
            ms[name].append((time.perf_counter() - began) * 1e3)
            correct[name].append(result.label == label)
            if name == "early_exit":
                layers.append(int(result.exit_layer or 0))
    acc = {name: float(np.mean(v)) for name, v in correct.items()}
    mean_ms = {name: float(np.mean(v)) for name, v in ms.items()}
    return {
        "texts": len(split.texts),
        "threshold": tau,
        "accuracy": acc,
        "accuracy_drop_points": round(100 * (acc["full_depth"] - acc["early_exit"]), 3),
        "mean_latency_ms": mean_ms,
        "median_latency_ms": {name: float(np.median(v)) for name, v in ms.items()},
        "speedup_mean": round(mean_ms["full_depth"] / mean_ms["early_exit"], 3),
        "mean_layers": float(np.mean(layers)),
        "exit_share": {str(k): layers.count(k) / len(layers) for k in sorted(set(layers))},
    }


def policies(model: edgeinfer.Model, split: LabelledSplit, tau: float) -> dict[str, float]:
    """Mean ms per batch of ``BATCH`` texts for each batch policy (same answers either way)."""
    config = RuntimeConfig(threads=model.config.threads, warmup_runs=0)
    runner = SegmentRunner(model.path, model.manifest, config=config)  # what classify runs
    tokenizer = TextTokenizer.for_package(model.path, model.manifest)
    ids, mask = tokenizer.encode(split.texts)
    rows = [ids[i, : int(n)] for i, n in enumerate(mask.sum(axis=1))]
    out: dict[str, list[float]] = {"leave": [], "all": []}
    for start in range(0, len(rows) - BATCH + 1, BATCH):
        batch_ids, batch_mask = pad_rows(rows[start : start + BATCH], pad_id=tokenizer.pad_id)
        for policy in ("leave", "all"):
            began = time.perf_counter()
            runner.run(batch_ids, batch_mask, threshold=tau, policy=policy)  # type: ignore[arg-type]
            out[policy].append((time.perf_counter() - began) * 1e3)
    return {f"{policy}_ms_per_batch": float(np.mean(v)) for policy, v in out.items()}


def vision(package: Path, args: argparse.Namespace) -> int:
    """The CNN: the early-exit curve on the held-out images, default vs full depth measured."""
    from edgeinfer.bench.early_exit_curve import run_curve

    result = run_curve(package, threads=args.threads, limit=args.articles)
    spec = Manifest.read(package).early_exit or {}
    result["validation_default"] = spec["default"]
    result["validation_full_depth"] = spec["full_depth"]
    print(json.dumps({k: v for k, v in result.items() if k != "curves"}, indent=2))
    m = result["measured"]
    print(
        f"mnist-cnn n={m['inputs']} {result['policy']} {result['threshold']:g}: accuracy "
        f"{m['accuracy']:.4f} vs {m['full_accuracy']:.4f} full (drop "
        f"{m['accuracy_drop_points']:.2f} points), mean latency {m['mean_ms']:.3f} ms vs "
        f"{m['full_mean_ms']:.3f} ms ({m['speedup']:.2f}x), mean blocks {m['mean_layers']:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["minilm", "mnist-cnn"], default="minilm")
    parser.add_argument("--out", default="pkg/early-exit-bench", help="package folder")
    parser.add_argument("--articles", type=int, default=None, help="articles per split (all)")
    parser.add_argument("--exit-every", type=int, default=2)
    parser.add_argument("--quantize", choices=["none", "int8"], default="int8")
    parser.add_argument("--max-accuracy-loss", type=float, default=0.005)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rebuild", action="store_true", help="re-export even if OUT exists")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)

    package = build(args)
    if args.model == "mnist-cnn":
        return vision(package, args)
    manifest = Manifest.read(package)
    spec = manifest.early_exit or {}
    tau = float(spec["threshold"])
    test = labelled_split("test", limit=args.articles)
    results: dict[str, Any] = {
        "package": str(package),
        "precision": manifest.precision,
        "exit_layers": [s["exit_layer"] for s in spec["segments"]],
        "validation_default": spec["default"],
        "validation_full_depth": spec["full_depth"],
    }
    with edgeinfer.load(package, threads=args.threads) as model:
        for variant in ("short", "full"):
            split = test.only(variant)  # type: ignore[arg-type]
            results[variant] = {**measure(model, split, tau), **policies(model, split, tau)}
    print(json.dumps(results, indent=2))
    for variant in ("short", "full"):
        r = results[variant]
        print(
            f"{variant:<5} n={r['texts']} tau={tau}: accuracy {r['accuracy']['early_exit']:.4f} "
            f"vs {r['accuracy']['full_depth']:.4f} full (drop {r['accuracy_drop_points']:.2f} "
            f"points), mean latency {r['mean_latency_ms']['early_exit']:.2f} ms vs "
            f"{r['mean_latency_ms']['full_depth']:.2f} ms ({r['speedup_mean']:.2f}x), "
            f"mean layers {r['mean_layers']:.2f}; batch of {BATCH}: leave "
            f"{r['leave_ms_per_batch']:.1f} ms, all {r['all_ms_per_batch']:.1f} ms"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
