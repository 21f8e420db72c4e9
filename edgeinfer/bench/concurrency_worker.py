"""One engine with ``concurrency`` generation slots in its own process, driven over JSON lines
(the protocol of ``edgeinfer.bench.worker``): a generate package on the runtime's continuous
batching engine, or a GGUF file on llama.cpp's server (the ``xllamacpp`` wheel) with as many
parallel slots, continuous batching on.

A run starts one stream per prompt, each in its own Python thread, released together by a
barrier; each stream clocks its own submission and the arrival of every token
(``time.perf_counter``, one clock for the process). Greedy, eos ignored: every stream
generates ``tokens + 1`` tokens (the first from its prefill). The load report carries each
``references`` prompt's output run alone: the solo outputs the concurrent runs must equal.

llama.cpp's ``Server.handle_completions`` releases the GIL while its server loop (its own
thread) decodes every slot's token in one batch; with ``stream`` on it calls back once per
streamed chunk. A token that ends mid-UTF-8 character is held back and sent with the next, so
a chunk can carry more than one token: ``held_back`` counts those (their arrival is their
chunk's). The wheel does not give every token id (a held-back token's is merged into the next),
so llama.cpp's output is its text; ours is its token ids.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeinfer.bench.generation_worker import greedy_request, llamacpp_server
from edgeinfer.bench.worker import open_channel, serve
from edgeinfer.errors import EdgeInferError

__all__ = ["main"]


@dataclass
class Stream:
    """One stream of a run: when it was submitted and when each token arrived (seconds on the
    process's ``perf_counter``), what it generated, and the tokens that arrived in another
    token's chunk."""

    submitted_s: float
    arrivals_s: list[float]
    output: list[int] | str
    generated: int
    held_back: int = 0


Start = Callable[[list[int]], Stream]  # prompt ids -> the finished stream


def _package(spec: dict[str, Any]) -> Start:
    from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig, SamplingConfig
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate.generator import Generator

    path, tokens, slots = Path(spec["path"]), int(spec["tokens"]), int(spec["concurrency"])
    longest = max(len(p) for p in [*spec["prompts"], *spec["references"]])
    gen = Generator(
        path,
        Manifest.read(path),
        config=RuntimeConfig(threads=int(spec["threads"])),
        context_length=longest + tokens + 1,
        # One stream: the default load() (its engine of one slot), the reference of the rest.
        batching=None if slots == 1 else ContinuousBatchConfig(max_sequences=slots),
    )
    engine = gen.engine

    def start(ids: list[int]) -> Stream:
        submitted = time.perf_counter()
        sequence = engine.submit(
            ids,
            max_new_tokens=tokens + 1,
            sampling=SamplingConfig(),  # greedy
            stop_token_ids=frozenset(),  # eos not honoured: every stream runs its length
        )
        arrivals, out = [], []
        for token in sequence:
            arrivals.append(time.perf_counter())
            out.append(int(token))
        return Stream(submitted, arrivals, out, len(out))

    return start


def _llamacpp(spec: dict[str, Any]) -> Start:
    tokens = int(spec["tokens"])
    longest = max(len(p) for p in [*spec["prompts"], *spec["references"]])
    server = llamacpp_server(
        Path(spec["path"]),
        slots=int(spec["concurrency"]),
        slot_tokens=longest + tokens + 2,  # each slot holds a whole stream
        threads=int(spec["threads"]),
    )

    def start(ids: list[int]) -> Stream:
        arrivals: list[float] = []
        text: list[str] = []
        final: dict[str, Any] = {}

        def on_chunk(chunk: dict[str, Any]) -> bool:
            now = time.perf_counter()
            choices = chunk.get("choices")
            if not choices:  # an error reply
                final["error"] = chunk.get("error", chunk)
                return True  # stop the stream
            text.append(choices[0].get("text", ""))
            if choices[0].get("finish_reason") is None:  # a chunk carrying token(s)
                arrivals.append(now)
            else:  # the last chunk: the finish reason and the token count
                final.update(chunk)
            return False

        request = greedy_request(ids, tokens, stream=True)
        submitted = time.perf_counter()
        server.handle_completions(request, on_chunk)
        if "error" in final or "usage" not in final:
            raise EdgeInferError(f"llama.cpp failed: {final.get('error', final)}")
        generated = int(final["usage"]["completion_tokens"])
        return Stream(submitted, arrivals, "".join(text), generated, generated - len(arrivals))

    return start


def run_streams(start: Start, prompts: list[list[int]]) -> list[Stream]:
    """One stream per prompt, each in its own thread, released together; in prompt order."""
    barrier = threading.Barrier(len(prompts))
    streams: list[Stream | None] = [None] * len(prompts)
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            barrier.wait()
            streams[index] = start(prompts[index])
        except BaseException as exc:  # re-raised in the caller's thread below
            barrier.abort()  # the others are not left waiting for it
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:  # the first real error, not a stream the abort released
        raise next(
            (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
        )
    return [s for s in streams if s is not None]


def main() -> int:
    """Serve one engine until ``quit``; return the exit code."""
    reply = open_channel()  # llama.cpp's C code writes to fd 1: it goes to stderr
    spec = json.loads(sys.stdin.readline())
    started = time.perf_counter()
    start = _llamacpp(spec) if spec["kind"] == "llamacpp" else _package(spec)
    cold_start_ms = (time.perf_counter() - started) * 1e3
    solo = [run_streams(start, [p])[0].output for p in spec["references"]]
    reply({"cold_start_ms": cold_start_ms, "solo": solo})
    prompts: list[list[int]] = spec["prompts"]

    def measure(runs: int, warmup: int) -> dict[str, Any]:
        for _ in range(warmup):
            run_streams(start, prompts)
        return {"runs": [[asdict(s) for s in run_streams(start, prompts)] for _ in range(runs)]}

    serve(reply, measure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
