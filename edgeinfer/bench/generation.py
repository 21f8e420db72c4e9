"""``edgeinfer bench`` for generate packages: time to first token, decode tokens/s,
inter-token p50/p95/p99, the Python overhead per token and the memory-bandwidth roofline.

Batch 1, the same prompt, token count and thread count for every contender. The roofline is
this machine's read bandwidth (a ReduceSum over 512 MiB in onnxruntime at the same thread count)
divided by the weight bytes a decode step reads; the achieved fraction says how close the
package runs to what the memory allows. The PyTorch baseline is Hugging Face ``generate``
(greedy, KV cache on) on the package's source model in fp32.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import DecoderIO

__all__ = [
    "bench_package",
    "bytes_per_token",
    "read_bandwidth_gbs",
    "run_generation_bench",
    "source_spec",
]

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
    from edgeinfer.runtime.generate import Generator

    manifest = Manifest.read(package)
    io = manifest.io_as(DecoderIO)
    # A 512-token window holds the prompt and the decoded tokens without a full-size KV cache.
    window = min(512, io.context_length)
    gen = Generator(package, manifest, config=RuntimeConfig(threads=threads), context_length=window)
    ids = gen.encode(PROMPT)
    if len(ids) + tokens > window:
        raise ConfigError(
            f"{len(ids)} prompt tokens + {tokens} decode tokens exceed the {window}-token window"
        )
    for _ in range(2):  # warm-up: kernel selection, allocations
        gen.generate(PROMPT, max_new_tokens=4)
    gen.forget_prefix()  # the warm-up left this prompt in the cache: time a cold prefill
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
    weight_bytes = bytes_per_token(package / io.graph)
    roofline = bandwidth * 1e9 / weight_bytes
    ms = np.array(steps) * 1e3
    return {
        "inter_token_samples_ms": [round(float(v), 4) for v in ms],
        "package": str(package),
        "precision": manifest.precision,
        "graph_mb": round((package / io.graph).stat().st_size / 1e6, 1),
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


def source_spec(package: Path) -> str:
    """The source a generate package was exported from (a builtin name or a folder)."""
    described = Manifest.read(package).source
    spec = described["name"] if described.get("builtin") else described.get("path")
    if not spec:
        raise ConfigError(f"{package} does not record where its source model is")
    return str(spec)


def run_generation_bench(
    packages: list[Path], *, threads: int, tokens: int, torch_source: str | None
) -> dict[str, Any]:
    """Measure ``packages`` (and Hugging Face ``generate`` on ``torch_source``) in one run."""
    if tokens < 1:
        raise ConfigError(f"tokens must be >= 1, got {tokens}")
    bandwidth = read_bandwidth_gbs(threads)
    rows = [bench_package(p, threads=threads, tokens=tokens, bandwidth=bandwidth) for p in packages]
    out: dict[str, Any] = {
        "threads": threads,
        "tokens": tokens,
        "read_bandwidth_gbs": round(bandwidth, 2),
        "packages": rows,
    }
    if torch_source:
        from edgeinfer.export.reference import hf_generate_speed

        out["torch"] = hf_generate_speed(torch_source, PROMPT, threads=threads, tokens=tokens)
        for row in rows:
            row["speedup_vs_torch"] = round(
                row["decode_tokens_per_s"] / out["torch"]["decode_tokens_per_s"], 2
            )
    return out
