"""``edgeinfer bench`` for generate packages: time to first token, decode tokens/s,
inter-token p50/p95/p99, the Python overhead per token and the memory-bandwidth roofline.

Batch 1, the same prompt, token count and thread count for every contender. The roofline is
this machine's read bandwidth (a ReduceSum over 512 MiB in onnxruntime at the same thread count)
divided by the weight bytes a decode step reads; the achieved fraction says how close the
package runs to what the memory allows. The PyTorch baseline is Hugging Face ``generate``
(greedy, KV cache on) on the package's source model in fp32.

The llama.cpp baseline runs a GGUF file through the ``xllamacpp`` wheel (the ``llamacpp``
extra) on the same prompt token ids, greedy, eos ignored: its own timings give the time to first
token (prompt processing) and the decode rate. Every engine runs in its own process (peak RSS,
cold start and file bytes are its own), and the rounds are interleaved so that a noisy machine
slows every engine alike; the table gives the medians over the rounds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import DecoderIO

__all__ = [
    "bytes_per_token",
    "prompt_ids",
    "read_bandwidth_gbs",
    "run_generation_bench",
    "source_gguf",
    "source_spec",
]

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
# Read one row per token, not whole: the embedding table and the rotary tables.
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
        if init.name.startswith(_NOT_READ_PER_TOKEN):
            continue
        external = {e.key: e.value for e in init.external_data}
        if "length" in external:  # weights in the package's external data file
            total += int(external["length"])
        else:
            total += len(init.raw_data) or onnx.numpy_helper.to_array(init).nbytes
    return total


def prompt_ids(package: Path, messages: Sequence[Mapping[str, str]] = PROMPT) -> list[int]:
    """A bench prompt as the package encodes it: ``messages`` through its chat template, or
    the last message's text (with BOS when its tokenizer adds one) when it has none."""
    from edgeinfer.runtime.generate.chat import render_chat
    from edgeinfer.runtime.generate.lm_tokenizer import load_tokenizer

    manifest = Manifest.read(package)
    io = manifest.io_as(DecoderIO)
    tok = load_tokenizer(package, io)
    chat = io.chat_format
    text = render_chat(chat, messages) if chat else messages[-1]["content"]
    bos = manifest.tokens.get("bos")
    head = [int(bos)] if not chat and io.add_bos_token and bos is not None else []
    return head + tok.encode(text)


def _summary(
    loaded: dict[str, Any], runs: list[dict[str, Any]], rss: dict[str, int]
) -> dict[str, Any]:
    """Medians over the interleaved rounds (time to first token, decode tokens/s), the file
    bytes, cold start and RSS of one engine: after loading, after the last round, peak."""
    return {
        "ttft_ms": round(float(np.median([r["ttft_ms"] for r in runs])), 1),
        "decode_tokens_per_s": round(float(np.median([r["decode_tokens_per_s"] for r in runs])), 1),
        "file_mb": round(loaded["file_bytes"] / 1e6, 1),
        "cold_start_ms": round(float(loaded["cold_start_ms"]), 1),
        "loaded_rss_mb": round(loaded["loaded_rss_bytes"] / 2**20, 1),
        "rss_after_run_mb": round(rss["rss_bytes"] / 2**20, 1),
        "peak_rss_mb": round(rss["peak_rss_bytes"] / 2**20, 1),
    }


def _package_row(
    package: Path,
    loaded: dict[str, Any],
    runs: list[dict[str, Any]],
    rss: dict[str, int],
    bandwidth: float,
) -> dict[str, Any]:
    manifest = Manifest.read(package)
    ms = np.array([s for r in runs for s in r["inter_token_ms"]])
    rate = float(np.median([r["decode_tokens_per_s"] for r in runs]))
    graph = manifest.io.graph
    weight_bytes = bytes_per_token(package / graph)
    roofline = bandwidth * 1e9 / weight_bytes
    return {
        "inter_token_samples_ms": [round(float(v), 4) for v in ms],
        "package": str(package),
        "precision": manifest.precision,
        "graph_mb": round(  # the graph and its external weights
            sum((package / n).stat().st_size for n in manifest.files if n.startswith(graph)) / 1e6,
            1,
        ),
        **_summary(loaded, runs, rss),
        "inter_token_ms": {
            p: round(float(np.percentile(ms, q)), 2)
            for p, q in (("p50", 50), ("p95", 95), ("p99", 99))
        },
        "python_overhead_us_per_token": round(
            float(np.median([r["python_overhead_us_per_token"] for r in runs])), 1
        ),
        "weight_mb_per_token": round(weight_bytes / 1e6, 1),
        "roofline_tokens_per_s": round(roofline, 1),
        "roofline_fraction": round(rate / roofline, 3),
    }


def _measure(
    engines: list[tuple[str, Path]], ids: list[int], *, threads: int, tokens: int, rounds: int
) -> list[tuple[dict[str, Any], list[dict[str, Any]], dict[str, int]]]:
    """Each engine in its own process, the rounds interleaved: (load report, runs, RSS now and
    at its peak after the last round)."""
    from edgeinfer.bench.runner import Candidate, interleaved_rounds

    candidates = [Candidate(p.name, kind, p) for kind, p in engines]  # type: ignore[arg-type]
    measured = interleaved_rounds(
        candidates,
        threads,
        module="edgeinfer.bench.generation_worker",
        extra={"prompt_ids": ids, "tokens": tokens},
        rounds=rounds,
    )
    return [
        (
            loaded,
            [run for reply in replies for run in reply["runs"]],
            {key: int(replies[-1][key]) for key in ("rss_bytes", "peak_rss_bytes")},
        )
        for loaded, replies in measured
    ]


def source_gguf(package: Path) -> Path:
    """The GGUF file a generate package was exported from (the llama.cpp baseline's default)."""
    from edgeinfer.export import recipes

    described = Manifest.read(package).source
    recipe = recipes.find(str(described.get("name"))) if described.get("builtin") else None
    folder = recipe.locate() if recipe is not None else Path(str(described.get("path")))
    ggufs = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
    if not ggufs:
        raise ConfigError(
            f"{package}'s source ({folder}) is no GGUF file; name one: --baseline llama.cpp:FILE"
        )
    found: Path = ggufs[0]
    return found


def source_spec(package: Path) -> str:
    """The source a generate package was exported from (a builtin name or a folder)."""
    described = Manifest.read(package).source
    spec = described["name"] if described.get("builtin") else described.get("path")
    if not spec:
        raise ConfigError(f"{package} does not record where its source model is")
    return str(spec)


def run_generation_bench(
    packages: list[Path],
    *,
    threads: int,
    tokens: int,
    torch_source: str | None,
    llamacpp: list[Path] | None = None,
    rounds: int = 3,
) -> dict[str, Any]:
    """Measure ``packages`` (and llama.cpp on each GGUF of ``llamacpp``, and Hugging Face
    ``generate`` on ``torch_source``) in one run: the same prompt ids (the first package's
    encoding of ``PROMPT``), one process per engine, ``rounds`` interleaved rounds."""
    if tokens < 1 or rounds < 1:
        raise ConfigError(f"tokens and rounds must be >= 1, got {tokens} and {rounds}")
    bandwidth = read_bandwidth_gbs(threads)
    ids = prompt_ids(packages[0])
    engines = [("package", p) for p in packages] + [("llamacpp", g) for g in llamacpp or []]
    measured = _measure(engines, ids, threads=threads, tokens=tokens, rounds=rounds)
    rows = [
        {**_package_row(p, *m, bandwidth), "prompt_tokens": len(ids)}
        for p, m in zip(packages, measured, strict=False)
    ]
    reference = measured[0][0]["token_ids"]
    out: dict[str, Any] = {
        "threads": threads,
        "tokens": tokens,
        "rounds": rounds,
        "prompt_tokens": len(ids),
        "read_bandwidth_gbs": round(bandwidth, 2),
        "packages": rows,
    }
    if llamacpp:
        out["llamacpp"] = [
            {
                "engine": "llama.cpp",
                "gguf": str(gguf),
                **_summary(*m),
                # greedy on the same model: the first tokens agree unless a near-tie flips
                "same_first_tokens": _common_prefix(m[0]["token_ids"], reference),
            }
            for gguf, m in zip(llamacpp, measured[len(packages) :], strict=True)
        ]
        for row in rows:
            row["speedup_vs_llamacpp"] = [
                round(row["decode_tokens_per_s"] / c["decode_tokens_per_s"], 2)
                for c in out["llamacpp"]
            ]
    if torch_source:
        from edgeinfer.export.passes.reference import hf_generate_speed

        out["torch"] = hf_generate_speed(torch_source, PROMPT, threads=threads, tokens=tokens)
        for row in rows:
            row["speedup_vs_torch"] = round(
                row["decode_tokens_per_s"] / out["torch"]["decode_tokens_per_s"], 2
            )
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count
