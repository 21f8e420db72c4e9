"""One benchmark candidate in its own process, driven over stdin/stdout with JSON lines.

A process per candidate keeps cold start and peak memory honest (nothing shared, nothing
already imported) and lets the runner interleave the candidates' measurement blocks, so that a
noisy machine slows every candidate alike. Commands: ``measure`` {runs} -> {latencies_ms},
``quit``. The first line sent is the spec; the first line answered is the load report.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main", "open_channel", "serve"]

Reply = Callable[[dict[str, Any]], None]


def open_channel() -> Reply:
    """Keep the real stdout for the protocol and send anything else written to fd 1 (a C
    library's output included) to stderr; returns the function that writes one reply."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(data: dict[str, Any]) -> None:
        channel.write(json.dumps(data) + "\n")
        channel.flush()

    return reply


def serve(reply: Reply, measure: Callable[[int, int], dict[str, Any]]) -> None:
    """Answer each ``measure`` command (``measure(runs, warmup)``) until ``quit``."""
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "quit":
            break
        reply(measure(int(command["runs"]), int(command["warmup"])))


def _package_runner(spec: dict[str, Any]) -> Callable[[list[str]], object]:
    from edgeinfer import ClassifyModel, ConfigError, EmbedModel, load
    from edgeinfer.package_io import ImageClassifierIO

    model = load(spec["path"], threads=spec["threads"])
    io = model.manifest.io
    if isinstance(model, ClassifyModel) and isinstance(io, ImageClassifierIO):  # seeded noise
        import numpy as np

        shape = (len(spec["texts"]), io.image.height, io.image.width, 3)
        images = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
        return lambda texts: model.classify(images, batch_size=len(images))
    if isinstance(model, ClassifyModel):
        return lambda texts: model.classify(texts, batch_size=len(texts))
    if isinstance(model, EmbedModel):
        return lambda texts: model.embed(texts, batch_size=len(texts))
    raise ConfigError(f"bench runs embed and classify packages; {spec['path']} is {model.task!r}")


def _torch_runner(spec: dict[str, Any]) -> Callable[[list[str]], object]:
    from pathlib import Path

    from edgeinfer.export.passes.reference import TorchReference

    return TorchReference.for_package(Path(spec["path"]), threads=spec["threads"]).run


def main() -> int:
    """Serve one candidate until ``quit``; return the exit code."""
    reply = open_channel()  # anything a library prints while loading goes to stderr
    spec = json.loads(sys.stdin.readline())
    texts: list[str] = spec["texts"]
    started = time.perf_counter()
    run = _torch_runner(spec) if spec["kind"] == "torch" else _package_runner(spec)
    run(texts)
    reply({"cold_start_ms": (time.perf_counter() - started) * 1e3})

    def measure(runs: int, warmup: int) -> dict[str, Any]:
        latencies = []
        for _ in range(warmup):
            run(texts)
        for _ in range(runs):
            t0 = time.perf_counter()
            run(texts)
            latencies.append((time.perf_counter() - t0) * 1e3)
        # ru_maxrss is in KiB on Linux: the peak resident memory of this candidate's process.
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"latencies_ms": latencies, "peak_rss_bytes": peak_rss}

    serve(reply, measure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
