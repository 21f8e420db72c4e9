"""Decode speed of generate packages vs Hugging Face ``generate`` (PyTorch fp32), one run.

The measurement itself is ``edgeinfer.bench.generation`` (also behind ``edgeinfer bench`` on a
generate package); this script compares several packages side by side.

    python benchmarks/generate_speed.py PKG [PKG ...] --baseline smollm2-135m --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edgeinfer.bench.generation import run_generation_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--baseline", default=None, help="source for the PyTorch baseline")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out: dict[str, Any] = run_generation_bench(
        args.packages, threads=args.threads, tokens=args.tokens, torch_source=args.baseline
    )
    rows, bandwidth = out["packages"], out["read_bandwidth_gbs"]
    for row in rows:
        row.pop("inter_token_samples_ms")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"threads {args.threads}, read bandwidth {bandwidth:.1f} GB/s")
    for row in rows:
        print(
            f"{row['precision']:>28}  {row['graph_mb']:7.1f} MB  TTFT {row['ttft_ms']:6.1f} ms  "
            f"{row['decode_tokens_per_s']:6.1f} tok/s  p50/p95/p99 "
            f"{row['inter_token_ms']['p50']}/{row['inter_token_ms']['p95']}/"
            f"{row['inter_token_ms']['p99']} ms  overhead {row['python_overhead_us_per_token']} µs"
            f"  roofline {row['roofline_tokens_per_s']} tok/s ({row['roofline_fraction']:.0%})"
            + (f"  {row['speedup_vs_torch']}x torch" if "speedup_vs_torch" in row else "")
        )
    if "torch" in out:
        t = out["torch"]
        print(f"{t['baseline']:>28}  TTFT {t['ttft_ms']} ms  {t['decode_tokens_per_s']} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
