"""Jobs queued on a continuous-batching engine all at once, so that they are decoded together
(the engine tests and the one-answer tests share it)."""

from __future__ import annotations

import threading
from typing import Any

from edgeinfer.runtime.generate import Generator

# Prompts of different lengths and kinds for the tiny decoder.
PROMPTS = [
    "The market rose",
    "Once upon a time there was",
    "Rain fell on the",
    "A short list: one, two,",
    "Water boils at",
    "The committee said on Tuesday that",
]


def all_at_once(gen: Generator, jobs: list[dict[str, Any]]) -> list[list[int]]:
    """Submit every job (``prompt``: text or chat messages, and ``Engine.submit``'s keywords)
    before the engine admits any, then read each in its own thread: its token ids, an eos
    included."""
    assert gen.engine is not None
    out: list[list[int]] = [[] for _ in jobs]
    with gen.engine._cond:  # the engine's lock: nothing is admitted until all are queued
        seqs = [
            gen.engine.submit(
                gen.encode(job["prompt"]), **{k: v for k, v in job.items() if k != "prompt"}
            )
            for job in jobs
        ]

    def read(i: int) -> None:
        out[i] = list(seqs[i])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
