#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and onnxruntime-gpu already installed: it installs
# nothing and takes a few minutes (most of it TensorRT's first engine build, cached after).
#   - parity: every embed/classify package on CUDA and on TensorRT (fp16 enabled) against the
#     same package on CPU: min cosine of the outputs >= 0.999 (fp16 keeps ~3 decimal digits);
#     a generate package: greedy tokens on the GPU vs on CPU (reported, not gated: fp16
#     rounding may flip a near-tie late in a sequence);
#   - a timing table: p50 latency per provider, interleaved (each provider back to back per
#     round), the speedup vs CPU in the same run, and decode tokens/s for a generate package.
# Exit codes: 0 parity holds, 1 a parity check failed, 2 no CUDA provider (or bad usage).
# Usage: tools/gpu_check.sh [--cpu-only] [--rounds N] [--tokens N] PKG [PKG ...]
#   --cpu-only runs the same code on the CPU provider alone (a dry run for machines without a
#   GPU): it proves the script, not the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" - "$@" <<'PYCODE'
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import edgeinfer
from edgeinfer.manifest import Manifest

GPU = ["CUDAExecutionProvider", "TensorrtExecutionProvider"]
CPU = "CPUExecutionProvider"
MIN_COSINE = 0.999  # fp16 activations keep about 3 significant digits
TEXTS = [
    "the match ended in a draw after extra time",
    "shares fell sharply after the quarterly report",
    "a new phone was launched with a larger battery",
    "parliament voted on the budget late on tuesday",
]
PROMPT = "The three most common uses of edge computing are"

parser = argparse.ArgumentParser(prog="tools/gpu_check.sh")
parser.add_argument("packages", nargs="+", type=Path)
parser.add_argument("--cpu-only", action="store_true", help="dry run on the CPU provider alone")
parser.add_argument("--rounds", type=int, default=20, help="timed rounds per provider")
parser.add_argument("--tokens", type=int, default=32, help="tokens to generate")
args = parser.parse_args()

have = ort.get_available_providers()
providers = [CPU] if args.cpu_only else [CPU, *[p for p in GPU if p in have]]
if not args.cpu_only and "CUDAExecutionProvider" not in have:
    print(f"no CUDA provider in this onnxruntime ({have}): this script installs nothing; "
          "pip install onnxruntime-gpu, or run with --cpu-only for a dry run", file=sys.stderr)
    sys.exit(2)
print(f"onnxruntime {ort.__version__}; providers checked: {', '.join(providers)}")
if args.cpu_only:
    print("DRY RUN (--cpu-only): no GPU was used; the numbers below are CPU only")


def cosine_min(a, b):
    a, b = np.asarray(a, np.float64).reshape(len(a), -1), np.asarray(b, np.float64).reshape(len(b), -1)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def run_once(model, task):
    if task == "embed":
        return model.embed(TEXTS)
    return np.array([[r.scores[k] for k in sorted(r.scores)] for r in model.classify(TEXTS)])


rows, failed = [], False
for pkg in args.packages:
    manifest = Manifest.read(pkg)
    models, outputs = {}, {}
    for p in providers:
        start = time.perf_counter()
        model = edgeinfer.load(pkg, providers=[p])
        load_s = time.perf_counter() - start  # TensorRT: includes the engine build or cache load
        if model.providers[0] != p:
            print(f"{pkg.name}: {p} fell back to {model.providers[0]}; skipped", file=sys.stderr)
            continue
        models[p] = (model, load_s)
    if manifest.task == "generate":
        timings = {}
        for p, (model, load_s) in models.items():
            result = model.generate(PROMPT, max_new_tokens=args.tokens)
            outputs[p] = list(result.token_ids)
            timings[p] = (result.decode_tokens_per_s, result.ttft_ms, load_s)
        for p, (tps, ttft, load_s) in timings.items():
            same = sum(a == b for a, b in zip(outputs[p], outputs[CPU]))
            agree = f"{same}/{len(outputs[CPU])} greedy tokens = CPU"
            rows.append((pkg.name, p, f"{tps:.1f} tok/s", f"ttft {ttft:.0f} ms", f"load {load_s:.1f} s", agree))
        continue
    for p, (model, _) in models.items():
        outputs[p] = run_once(model, manifest.task)
    times = {p: [] for p in models}
    for _ in range(args.rounds):  # interleaved: every provider once per round
        for p, (model, _) in models.items():
            start = time.perf_counter()
            run_once(model, manifest.task)
            times[p].append((time.perf_counter() - start) * 1e3)
    cpu_p50 = float(np.median(times[CPU]))
    for p, (model, load_s) in models.items():
        p50 = float(np.median(times[p]))
        cos = cosine_min(outputs[CPU], outputs[p])
        ok = cos >= MIN_COSINE
        failed |= not ok
        rows.append((pkg.name, p, f"p50 {p50:.2f} ms", f"{cpu_p50 / p50:.2f}x CPU",
                     f"load {load_s:.1f} s", f"min cosine {cos:.5f} {'ok' if ok else 'FAIL'}"))

widths = [max(len(r[i]) for r in rows) for i in range(6)] if rows else []
for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
print(json.dumps({"cpu_only": args.cpu_only, "providers": providers, "parity_ok": not failed}))
sys.exit(1 if failed else 0)
PYCODE
