"""Continuous batching on the tiny decoder: sequences decoded together give each one the
tokens it gets alone (greedy and seeded sampling), join and leave at token boundaries, free
their slot when abandoned, wait for a KV budget, and hold only their own KV rows."""

from __future__ import annotations

import dataclasses
import mmap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from isolated import in_fresh_process

from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig, SamplingConfig
from edgeinfer.errors import ConfigError, MemoryBudgetError, PackageError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import DecoderIO
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.decoding import DecoderGraph
from edgeinfer.runtime.generate.engine import Engine
from edgeinfer.runtime.generate.runs import Runs
from edgeinfer.runtime.generate.slots import SlotCache
from tests.engine_jobs import PROMPTS, all_at_once


def _batched(package: Path, **options: int) -> Generator:
    return Generator(
        package,
        Manifest.read(package),
        config=RuntimeConfig(threads=1),
        context_length=128,
        batching=ContinuousBatchConfig(**options),
    )


@pytest.fixture
def batched(fast_decoder: Path) -> Iterator[Generator]:
    gen = _batched(fast_decoder, max_sequences=3)
    yield gen
    gen.close()


def test_each_sequence_gets_its_solo_greedy_tokens_whatever_runs_beside_it(
    tiny: Generator, batched: Generator
) -> None:
    # The load without batching (one sequence at a time) is the reference.
    solo = [tiny.generate(p, max_new_tokens=24) for p in PROMPTS]
    # Six sequences on three slots, leaving at different steps: joins and leaves mid-stream.
    lengths = [24 - 3 * i for i in range(len(PROMPTS))]
    results: list[object] = [None] * len(PROMPTS)

    def run(i: int) -> None:
        results[i] = batched.generate(PROMPTS[i], max_new_tokens=lengths[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, result in enumerate(results):
        assert isinstance(result, type(solo[i]))
        assert result.token_ids == solo[i].token_ids[: lengths[i]], PROMPTS[i]
        assert result.finish_reason == ("length" if len(result.token_ids) == lengths[i] else "eos")
    assert batched.engine is not None and batched.engine.slots.nbytes == 0  # every row freed


def test_seeded_sampling_is_per_sequence(tiny: Generator, batched: Generator) -> None:
    sampling = SamplingConfig(temperature=0.9, top_k=40, seed=7)
    alone = [tiny.generate(p, max_new_tokens=16, sampling=sampling).token_ids for p in PROMPTS[:3]]
    jobs = [{"prompt": p, "max_new_tokens": 16, "sampling": sampling} for p in PROMPTS[:3]]
    together = all_at_once(batched, [{**j, "stop_token_ids": frozenset()} for j in jobs])
    for mine, ref in zip(together, alone, strict=True):
        assert tuple(mine[: len(ref)]) == ref


def test_sequences_are_decoded_together_not_one_after_another(batched: Generator) -> None:
    assert batched.engine is not None
    with batched.engine._cond:
        seqs = [
            batched.engine.submit(
                batched.encode(p),
                max_new_tokens=12,
                sampling=SamplingConfig(),
                stop_token_ids=frozenset(),
            )
            for p in PROMPTS[:3]
        ]
    for seq in seqs:
        assert len(list(seq)) == 12
    # When the engine decoded them: every first token before any sequence's last one.
    assert max(seq.token_s[0] for seq in seqs) < min(seq.token_s[-1] for seq in seqs)


def test_an_abandoned_stream_frees_its_slot(fast_decoder: Path) -> None:
    gen = _batched(fast_decoder, max_sequences=1)
    try:
        stream = gen.stream(PROMPTS[0], max_new_tokens=100, sampling=SamplingConfig())
        next(stream)
        stream.close()  # the caller walks away after one chunk
        # With one slot, this answer comes only once the abandoned sequence left it.
        result = gen.generate(PROMPTS[1], max_new_tokens=4)
        assert len(result.token_ids) <= 4
        assert gen.engine is not None and gen.engine.stats()["active"] == 0
    finally:
        gen.close()


def test_a_kv_budget_admits_what_fits_and_refuses_what_never_can(fast_decoder: Path) -> None:
    probe = _batched(fast_decoder, max_sequences=4)
    assert probe.engine is not None
    per_token = probe.engine.slots.bytes_per_token
    probe.close()
    ids_per_request = len(probe.encode(PROMPTS[0])) + 8 + 1
    # Room for two such requests at once: the other two wait, then all four finish.
    gen = _batched(fast_decoder, max_sequences=4, kv_budget_bytes=2 * ids_per_request * per_token)
    try:
        jobs = [{"prompt": PROMPTS[0], "max_new_tokens": 8, "stop_token_ids": frozenset()}] * 4
        outs = all_at_once(gen, [dict(j, sampling=SamplingConfig()) for j in jobs])
        assert all(out == outs[0] and len(out) == 8 for out in outs)
        with pytest.raises(MemoryBudgetError, match="ask for at most"):
            gen.generate(PROMPTS[0], max_new_tokens=100)
    finally:
        gen.close()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


def _slot_pages() -> dict[str, Any]:
    """In a fresh process: resident bytes of a 4-row slot cache reserved for 64k positions,
    after one row is written, and after its sequences are released."""
    layers, heads, dim = 2, 2, 64
    io = DecoderIO(
        graph="model.onnx",
        tokenizer="tokenizer.json",
        inputs=(),
        outputs=(),
        max_seq_len=1 << 16,
        num_layers=layers,
        num_kv_heads=heads,
        head_dim=dim,
        vocab_size=16,
        context_length=1 << 16,
        source_context_length=1 << 16,
        kv_layout="shared-buffer",
        past_names=tuple((f"k{i}", f"v{i}") for i in range(layers)),
        present_names=tuple((f"pk{i}", f"pv{i}") for i in range(layers)),
        stop_token_ids=(),
    )
    before = _rss_bytes()
    slots = SlotCache(io, rows=4, limit=1 << 16)
    slots.ensure(1 << 16)  # 4 rows x 64k positions x 2 KiB: 512 MiB reserved, none resident
    row_bytes = (1 << 16) * slots.bytes_per_token  # 128 MiB
    base = _rss_bytes()
    for buffer in slots.buffers:
        buffer[1] = 1.0  # row 1 written in full
    slots.open(1, 1 << 16)
    grown = _rss_bytes() - base
    held = slots.nbytes
    slots.move(1, 0)  # row 1's sequence moves up into row 0
    moved = all(float(buffer[0].min()) == 1.0 for buffer in slots.buffers)
    slots.release(1)
    slots.release(0)
    return {
        "row_bytes": row_bytes,
        "reserved": base - before,
        "grown": grown,
        "held": held,
        "moved": moved,
        "held_after": slots.nbytes,
        "left": _rss_bytes() - base,
        "zeros": all(float(buffer[0].max()) == 0.0 for buffer in slots.buffers),
    }


def test_a_slot_holds_pages_only_for_what_its_sequence_wrote() -> None:
    got = in_fresh_process(_slot_pages)
    row_bytes = got["row_bytes"]
    assert got["reserved"] < 0.05 * row_bytes  # the reservation itself costs no resident memory
    assert 0.95 * row_bytes <= got["grown"] <= 1.05 * row_bytes
    assert got["held"] == row_bytes and got["moved"]
    assert got["held_after"] == 0
    assert got["left"] < 0.05 * row_bytes  # the pages went back to the kernel
    assert got["zeros"]  # and read as zeros


def test_a_package_without_the_extra_row_input_is_refused_with_a_fix(fast_decoder: Path) -> None:
    manifest = Manifest.read(fast_decoder)
    graph = DecoderGraph(fast_decoder, manifest, config=RuntimeConfig(threads=1), context_length=64)
    graph.io = dataclasses.replace(graph.io, extra_row_input=None)  # an older export's io
    with pytest.raises(PackageError, match="re-export"):
        Engine(graph, ContinuousBatchConfig(max_sequences=2), decode=str)


def test_a_newcomer_runs_one_chunk_of_its_prompt_between_two_steps_of_the_others(
    fast_decoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bounded step: while a stream decodes, a newcomer's long prompt runs at most
    ``prefill_chunk_tokens`` tokens between two of its steps, never the whole prompt."""
    runs: list[tuple[str, int]] = []  # ("fill", tokens) or ("step", rows), in order
    real_forward, real_step = Runs.forward, Runs.step

    def forward(self: Runs, row: int, ids: Any, start: int, **kw: Any) -> Any:
        runs.append(("fill", len(ids)))
        return real_forward(self, row, ids, start, **kw)

    def step(self: Runs, batch: int, **kw: Any) -> None:
        runs.append(("step", batch))
        real_step(self, batch, **kw)

    monkeypatch.setattr(Runs, "forward", forward)
    monkeypatch.setattr(Runs, "step", step)
    gen = _batched(fast_decoder, max_sequences=2, prefill_chunk_tokens=4)
    try:
        first = gen.stream(PROMPTS[0], max_new_tokens=60)
        next(first)  # decoding
        runs.clear()
        long = " ".join(PROMPTS)
        assert len(gen.encode(long)) > 12  # several chunks
        gen.generate(long, max_new_tokens=2)
        first.close()
    finally:
        gen.close()
    fills = [tokens for kind, tokens in runs if kind == "fill"]
    assert sum(fills) == len(gen.encode(long)) and max(fills) <= 4
    between = 0  # prompt tokens run since the last step of both rows
    for kind, count in runs:
        between = between + count if kind == "fill" else 0
        assert between <= 4


def test_prefill_in_chunks_gives_the_same_tokens(tiny: Generator, fast_decoder: Path) -> None:
    gen = _batched(fast_decoder, max_sequences=2, prefill_chunk_tokens=3)
    try:
        other = gen.stream(PROMPTS[0], max_new_tokens=60)
        next(other)  # decoding: the long prompt runs in chunks between its steps
        long = " ".join(PROMPTS)
        assert gen.generate(long, max_new_tokens=12).token_ids == (
            tiny.generate(long, max_new_tokens=12).token_ids
        )
        other.close()
    finally:
        gen.close()


def _fills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The tokens of every prompt run (``Runs.forward``) from now on, in order."""
    fills: list[int] = []
    real_forward = Runs.forward

    def forward(self: Runs, row: int, ids: Any, start: int, **kw: Any) -> Any:
        fills.append(len(ids))
        return real_forward(self, row, ids, start, **kw)

    monkeypatch.setattr(Runs, "forward", forward)
    return fills


def test_a_prompt_runs_whole_when_no_other_sequence_decodes(
    fast_decoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody waits between two tokens: the newcomer's prompt, up to ``lone_prefill_tokens``,
    is one run, not chunks (each run reads every weight once)."""
    fills = _fills(monkeypatch)
    long = " ".join(PROMPTS)
    gen = _batched(fast_decoder, max_sequences=2, prefill_chunk_tokens=3)
    try:
        assert len(gen.encode(long)) <= ContinuousBatchConfig().lone_prefill_tokens
        gen.generate(long, max_new_tokens=2)
    finally:
        gen.close()
    assert fills == [len(gen.encode(long))]


def test_a_lone_prompt_longer_than_the_cap_runs_in_runs_of_the_cap(
    tiny: Generator, fast_decoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alone, a prompt runs ``lone_prefill_tokens`` at a time (attention's transient memory
    stays bounded by it), ending at its multiples, and gives the tokens of one run whole."""
    long = " ".join(PROMPTS)
    whole = tiny.generate(long, max_new_tokens=12).token_ids
    fills = _fills(monkeypatch)
    gen = _batched(fast_decoder, max_sequences=2, prefill_chunk_tokens=3, lone_prefill_tokens=5)
    try:
        assert gen.generate(long, max_new_tokens=12).token_ids == whole
    finally:
        gen.close()
    size = len(gen.encode(long))
    assert size > 10  # three runs at least
    assert fills == [5] * (size // 5) + ([size % 5] if size % 5 else [])


def test_continuous_batching_refuses_what_keeps_one_sequences_cache(
    fast_decoder: Path, tmp_path: Path
) -> None:
    from edgeinfer.config import PrefixCacheConfig

    with pytest.raises(ConfigError, match="prefix cache"):
        Generator(
            fast_decoder,
            Manifest.read(fast_decoder),
            config=RuntimeConfig(threads=1),
            prefix_cache=PrefixCacheConfig(directory=tmp_path),
            batching=ContinuousBatchConfig(max_sequences=2),
        )
    gen = _batched(fast_decoder, max_sequences=2)
    try:
        with pytest.raises(ConfigError, match="warm_prefix"):
            gen.warm_prefix("You are a valve controller.\n")
    finally:
        gen.close()


@pytest.mark.parametrize("name", ["not_an_input", None])
def test_a_manifest_that_misnames_the_extra_row_input_is_refused_at_load(
    fast_decoder: Path, name: str | None
) -> None:
    manifest = Manifest.read(fast_decoder)
    wrong = dataclasses.replace(manifest.io, extra_row_input=name)
    with pytest.raises(PackageError, match=r"does not match its decoder graph.*re-export"):
        Generator(
            fast_decoder,
            dataclasses.replace(manifest, io=wrong),
            config=RuntimeConfig(threads=1),
            context_length=64,
        )
