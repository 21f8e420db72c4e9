"""Many long texts in one call: graph runs bounded by a token budget, and the memory a burst
took given back afterwards (it used to stay: 64 texts of 4,000 characters left MiniLM's
process ~465 MB larger for good)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.runtime.kinds.text import MAX_TOKENS_PER_RUN, _runs


@pytest.mark.parametrize("lengths", [[3] * 40, [256] * 20, [5, 9, 200, 256, 256, 700], [4000]])
def test_runs_keep_order_and_the_budget(lengths: list[int]) -> None:
    rows = [np.zeros(n, np.int64) for n in sorted(lengths)]
    runs = _runs(list(range(len(rows))), rows, batch_size=32)
    assert [i for run in runs for i in run] == list(range(len(rows)))  # each once, in order
    for run in runs:
        assert len(run) <= 32
        padded = len(run) * max(rows[i].shape[0] for i in run)
        assert len(run) == 1 or padded <= MAX_TOKENS_PER_RUN  # one row always runs


_BURST = """
import sys, edgeinfer
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
m = edgeinfer.load(sys.argv[1], config=edgeinfer.RuntimeConfig(spin_wait=False))
m.embed(["warm"])
before = rss_mb()
vectors = m.embed([("reading %d " % i) * 400 for i in range(64)])  # 64 x ~4,000 characters
assert vectors.shape == (64, 384)
m.embed(["a short one after"])
print(before, rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_burst_of_long_texts_gives_its_memory_back(minilm_int8: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _BURST, str(minilm_int8)], capture_output=True, text=True, check=True
    )
    before, after = map(float, out.stdout.split())
    assert after - before < 64, (before, after)  # was +465 MB, kept until the process ended
