"""One generation engine in its own process, driven over stdin/stdout with JSON lines (the
protocol of ``edgeinfer.bench.worker``): a generate package on onnxruntime, or a GGUF file on
llama.cpp (the ``xllamacpp`` wheel).

The spec names the engine, the prompt token ids (the same for every engine), the decode token
count and the threads. Each ``measure`` run is greedy: one cold prefill of the prompt (time to
first token), then ``tokens`` decode steps (tokens/s); eos is not honoured, so every engine
decodes the same count. The load report carries the engine's first greedy tokens, so the caller
can check that the engines compute the same thing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.bench.footprint import memory_usage
from edgeinfer.bench.worker import open_channel, serve
from edgeinfer.errors import EdgeInferError, MissingDependencyError

__all__ = ["greedy_request", "llamacpp_server", "main"]

Measure = Callable[[bool], dict[str, Any]]  # (with the token ids) -> one run


def _package(spec: dict[str, Any]) -> Measure:
    from edgeinfer.config import RuntimeConfig, SamplingConfig
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate.generator import Generator

    path, ids, tokens = Path(spec["path"]), list(spec["prompt_ids"]), int(spec["tokens"])
    prepacks = spec.get("prepack_cache_dir")  # file-backed prepacks, kept there
    config = RuntimeConfig(
        threads=int(spec["threads"]),
        file_backed_prepacks=prepacks is not None,
        prepack_cache_dir=None if prepacks is None else Path(prepacks),
    )
    gen = Generator(path, Manifest.read(path), config=config, context_length=len(ids) + tokens + 1)

    def measure(with_tokens: bool) -> dict[str, Any]:
        gen.forget_prefix()  # a cold prefill every run
        before = gen.run_seconds
        started = time.perf_counter()
        seq = gen.engine.submit(  # the path that serves the package: its engine
            ids, max_new_tokens=tokens + 1, sampling=SamplingConfig(), stop_token_ids=frozenset()
        )
        out = [int(t) for t in seq]
        times = seq.token_s
        wall = times[-1] - times[0]
        steps = np.diff(times)
        # Outside onnxruntime over the whole request (prefill included), per token.
        outside_s = max((times[-1] - started) - (gen.run_seconds - before), 0.0)
        return {
            "ttft_ms": (times[0] - started) * 1e3,
            "decode_tokens_per_s": tokens / wall,
            "inter_token_ms": [float(s) * 1e3 for s in steps],
            "python_overhead_us_per_token": outside_s / len(out) * 1e6,
            "token_ids": out,
        }

    return measure


def llamacpp_server(gguf: Path, *, slots: int, slot_tokens: int, threads: int) -> Any:
    """llama.cpp's server (the ``xllamacpp`` wheel) on ``gguf``: ``slots`` parallel slots of
    ``slot_tokens`` each (it splits ``n_ctx`` evenly across them), continuous batching on."""
    try:
        import xllamacpp
    except ImportError as exc:
        raise MissingDependencyError("xllamacpp", "llamacpp") from exc

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.n_parallel = slots
    params.cont_batching = True
    params.n_ctx = slots * slot_tokens
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    return xllamacpp.Server(params)


def greedy_request(ids: list[int], tokens: int, *, stream: bool) -> dict[str, Any]:
    """A completion request for llama.cpp: ``tokens`` decode tokens after the first, greedy,
    eos ignored, a cold prefill."""
    return {
        "prompt": ids,  # token ids: used as they are (no BOS added)
        "n_predict": tokens + 1,  # the first token comes from the prefill
        "samplers": ["top_k"],
        "top_k": 1,  # greedy
        "temperature": 0.0,
        "ignore_eos": True,
        "cache_prompt": False,  # a cold prefill every run
        "stream": stream,
    }


def _llamacpp(spec: dict[str, Any]) -> Measure:
    ids, tokens = list(spec["prompt_ids"]), int(spec["tokens"])
    server = llamacpp_server(
        Path(spec["path"]), slots=1, slot_tokens=len(ids) + tokens + 2, threads=int(spec["threads"])
    )
    request = greedy_request(ids, tokens, stream=False)

    def measure(with_tokens: bool) -> dict[str, Any]:
        # The ids come with the top-1 log-probabilities: a softmax over the vocabulary per
        # token, so only the untimed first run asks for them.
        reply = server.handle_completions({**request, "n_probs": 1 if with_tokens else 0})
        if "error" in reply or "timings" not in reply:
            raise EdgeInferError(f"llama.cpp failed: {reply.get('error', reply)}")
        timings = reply["timings"]
        # llama.cpp counts the token sampled from the prefill in predicted_n but starts its
        # decode clock after it: predicted_n - 1 decode steps ran in predicted_ms.
        steps = int(timings["predicted_n"]) - 1
        return {
            "ttft_ms": float(timings["prompt_ms"]),
            "decode_tokens_per_s": steps / float(timings["predicted_ms"]) * 1e3,
            "token_ids": [
                int(p["id"])
                for p in ((reply["choices"][0].get("logprobs") or {}).get("content") or [])
            ],
        }

    return measure


def _memory() -> dict[str, int]:
    """This process's resident memory now and its high-water mark (VmRSS, VmHWM: its own
    address space; ``ru_maxrss`` would keep the parent's peak across fork + exec)."""
    usage = memory_usage()
    return {"rss_bytes": usage.rss_bytes, "peak_rss_bytes": usage.peak_rss_bytes}


def main() -> int:
    """Serve one engine until ``quit``; return the exit code."""
    reply = open_channel()  # llama.cpp's C code writes to fd 1: it goes to stderr
    spec = json.loads(sys.stdin.readline())
    started = time.perf_counter()
    measure = _llamacpp(spec) if spec["kind"] == "llamacpp" else _package(spec)
    loaded_rss = _memory()["rss_bytes"]  # loaded, no request answered yet
    first = measure(True)
    path = Path(spec["path"])
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
    reply(
        {
            "cold_start_ms": (time.perf_counter() - started) * 1e3,
            "file_bytes": sum(p.stat().st_size for p in files),
            "token_ids": first["token_ids"],
            "loaded_rss_bytes": loaded_rss,
        }
    )

    def block(runs: int, warmup: int) -> dict[str, Any]:
        for _ in range(warmup):
            measure(False)
        return {"runs": [measure(False) for _ in range(runs)], **_memory()}

    serve(reply, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
