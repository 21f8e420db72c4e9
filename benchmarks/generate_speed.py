"""Decode speed of generate packages vs Hugging Face ``generate`` (PyTorch fp32), one run.

Batch 1, the same prompt, token count and thread count for every contender. For each package:
time to first token, decode tokens/s, inter-token p50/p95/p99, the Python overhead per token
(time outside ``session.run``), and the memory-bandwidth roofline: this machine's read
bandwidth (a ReduceSum over 512 MiB in onnxruntime at the same thread count) divided by the
weight bytes read per token, and the fraction of it the package achieves.

    python benchmarks/generate_speed.py PKG [PKG ...] --baseline smollm2-135m --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
_NOT_READ_PER_TOKEN = ("model.embed_tokens.weight", "cos_cache", "sin_cache")


def read_bandwidth_gbs(threads: int, mib: int = 512) -> float:
    """Best-of-5 read bandwidth of onnxruntime summing a buffer far larger than the caches.

    The buffer is [rows, cols] reduced along its rows, so every thread reads its own rows (a
    1-D reduction runs on one thread and under-reports the bandwidth).
    """
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rows = 1024
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        "bandwidth",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options)
    x = np.ones((rows, mib * 2**20 // 4 // rows), np.float32)
    session.run(None, {"x": x})
    best = min(_timed(lambda: session.run(None, {"x": x})) for _ in range(5))
    return x.nbytes / best / 1e9


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bytes_per_token(graph: Path) -> int:
    """Initializer bytes a decode step reads: every weight but the embedding table (one row
    is gathered) and the rotary tables (one row each)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        if init.name not in _NOT_READ_PER_TOKEN:
            total += len(init.raw_data) or onnx.numpy_helper.to_array(init).nbytes
    return total


def bench_package(package: Path, *, threads: int, tokens: int, bandwidth: float) -> dict[str, Any]:
    """Decode ``tokens`` greedy steps through the runtime's own loop (eos not honoured)."""
    from edgeinfer.config import RuntimeConfig
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate import Generator

    manifest = Manifest.read(package)
    gen = Generator(package, manifest, config=RuntimeConfig(threads=threads), context_length=512)
    ids = gen.encode(PROMPT)
    for _ in range(2):  # warm-up: kernel selection, allocations
        gen.generate(PROMPT, max_new_tokens=4)
    started = time.perf_counter()
    token = int(np.argmax(gen.prefill(ids)))
    ttft_s = time.perf_counter() - started
    gen.run_seconds = 0.0
    steps = []
    begin = time.perf_counter()
    for position in range(len(ids), len(ids) + tokens):
        t0 = time.perf_counter()
        token = int(np.argmax(gen.decode_one_token(token, position)))
        steps.append(time.perf_counter() - t0)
    wall = time.perf_counter() - begin
    rate = tokens / wall
    weight_bytes = bytes_per_token(package / manifest.io["graph"])
    roofline = bandwidth * 1e9 / weight_bytes
    ms = np.array(steps) * 1e3
    return {
        "package": str(package),
        "precision": manifest.precision,
        "graph_mb": round((package / manifest.io["graph"]).stat().st_size / 1e6, 1),
        "prompt_tokens": len(ids),
        "ttft_ms": round(ttft_s * 1e3, 1),
        "decode_tokens_per_s": round(rate, 1),
        "inter_token_ms": {
            p: round(float(np.percentile(ms, q)), 2)
            for p, q in (("p50", 50), ("p95", 95), ("p99", 99))
        },
        "python_overhead_us_per_token": round((wall - gen.run_seconds) / tokens * 1e6, 1),
        "weight_mb_per_token": round(weight_bytes / 1e6, 1),
        "roofline_tokens_per_s": round(roofline, 1),
        "roofline_fraction": round(rate / roofline, 3),
    }


def bench_torch(source: str, *, threads: int, tokens: int) -> dict[str, Any]:
    """Hugging Face ``generate`` (greedy, KV cache on) on the source model in fp32."""
    import torch

    from edgeinfer.export.lm import load_decoder, prepare_decoder_tokenizer
    from edgeinfer.export.source import resolve_source
    from edgeinfer.runtime.generate import render_chat

    torch.set_num_threads(threads)
    src = resolve_source(source)
    model = load_decoder(src)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        info = prepare_decoder_tokenizer(src, Path(tmp) / "tokenizer.json")
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    text = render_chat(info["chat_format"], PROMPT)
    ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])

    def run(n: int) -> float:
        with torch.inference_mode():
            return _timed(
                lambda: model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    pad_token_id=2,
                )
            )

    run(4)
    first = min(run(1) for _ in range(2))
    total = run(tokens + 1)
    return {
        "baseline": f"transformers {source} fp32",
        "ttft_ms": round(first * 1e3, 1),
        "decode_tokens_per_s": round(tokens / (total - first), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--baseline", default=None, help="source for the PyTorch baseline")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    bandwidth = read_bandwidth_gbs(args.threads)
    rows = [
        bench_package(p, threads=args.threads, tokens=args.tokens, bandwidth=bandwidth)
        for p in args.packages
    ]
    out: dict[str, Any] = {"threads": args.threads, "read_bandwidth_gbs": round(bandwidth, 2)}
    out["packages"] = rows
    if args.baseline:
        out["torch"] = bench_torch(args.baseline, threads=args.threads, tokens=args.tokens)
        for row in rows:
            row["speedup_vs_torch"] = round(
                row["decode_tokens_per_s"] / out["torch"]["decode_tokens_per_s"], 2
            )
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
