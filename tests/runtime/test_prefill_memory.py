"""A long prompt alone runs in bounded runs (``lone_prefill_tokens``): attention's transient
memory grows with a run's tokens times the context, so the peak resident memory of a long
prompt on SmolLM2-135M int8 stays near its keys/values. Measured in a fresh process
(tests/isolated.py): another test's allocations would move the peak."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from isolated import in_fresh_process, status_kb

from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig, SamplingConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator
from tests.engine_jobs import PROMPTS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc peak RSS")

PROMPT_TOKENS = 2000  # of SmolLM2's 2048-token context


def _long_prompt_peak(package: Path, lone_prefill_tokens: int) -> dict[str, Any]:
    """In a fresh process: the peak resident growth while a ``PROMPT_TOKENS`` prompt runs
    alone, the keys/values it writes, and its first token."""
    gen = Generator(
        package,
        Manifest.read(package),
        config=RuntimeConfig(threads=2),
        context_length=2048,
        batching=ContinuousBatchConfig(max_sequences=2, lone_prefill_tokens=lone_prefill_tokens),
    )
    try:
        assert gen.engine is not None
        words = gen.encode(" ".join(PROMPTS))
        ids = (words * (PROMPT_TOKENS // len(words) + 1))[:PROMPT_TOKENS]
        list(gen.engine.submit(ids[:8], max_new_tokens=2, sampling=SamplingConfig()))
        gen.engine.forget_prefix()
        before = status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # the peak (VmHWM) starts again from the resident size
        seq = gen.engine.submit(ids, max_new_tokens=1, sampling=SamplingConfig())
        list(seq)
        return {
            "growth_kb": status_kb("VmHWM") - before,
            "kv_kb": seq.needed_positions * gen.engine.slots.bytes_per_token // 1024,
            "token": seq.generated[0],
        }
    finally:
        gen.close()


def test_a_long_prompt_alone_peaks_near_its_keys_and_values(smollm2_package: Path) -> None:
    """Measured (2000 tokens, 2 threads): 113 MiB peak growth in runs of 256 tokens, 166 MiB
    in one run, of which the keys/values are 88 MiB in both."""
    capped = in_fresh_process(
        _long_prompt_peak, smollm2_package, ContinuousBatchConfig().lone_prefill_tokens
    )
    whole = in_fresh_process(_long_prompt_peak, smollm2_package, PROMPT_TOKENS)
    assert capped["token"] == whole["token"]  # the same bits however the prompt is grouped
    assert capped["kv_kb"] == whole["kv_kb"]
    capped_kb, whole_kb = (got["growth_kb"] - got["kv_kb"] for got in (capped, whole))
    assert 0 < capped_kb < whole_kb / 2, (capped, whole)  # measured 25 MiB and 78 MiB
