"""Invariants of generation on the tiny decoder: KV-cached == full recompute, streamed ==
non-streamed, seeded sampling reproducible, the context limit exact, stops honoured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeinfer.config import RuntimeConfig, SamplingConfig
from edgeinfer.errors import ConfigError, ContextLengthExceededError, InputError
from edgeinfer.export.decoder.lm import full_logits
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.decoding import Decoder
from edgeinfer.runtime.generate.sampling import Sampler
from edgeinfer.runtime.generate.streaming import TextStream

PROMPTS = ["The market rose", "Chelsea won the cup after a long season of"]
CHAT = [{"role": "user", "content": "Name three rivers in Europe."}]


def greedy_by_recompute(package: Path, ids: list[int], count: int) -> list[int]:
    """Greedy tokens with no KV cache: the whole sequence from position 0 at every step."""
    manifest = Manifest.read(package)
    session = ort.InferenceSession(str(package / manifest.io.graph))
    seq, out = list(ids), []
    for _ in range(count):
        token = int(np.argmax(full_logits(session, manifest.io, seq)[-1]))
        out.append(token)
        seq.append(token)
    return out


@pytest.mark.parametrize("prompt", [*PROMPTS, CHAT])
def test_kv_cached_greedy_equals_full_recompute(
    tiny: Generator, steps: Decoder, fast_decoder: Path, prompt: object
) -> None:
    ids = tiny.encode(prompt)  # type: ignore[arg-type]
    cached = [int(t) for t in steps.tokens(ids, max_new_tokens=24, sampling=SamplingConfig())]
    assert cached == greedy_by_recompute(fast_decoder, ids, len(cached))


def test_kv_cached_logits_match_full_recompute(
    tiny: Generator, steps: Decoder, fast_decoder: Path
) -> None:
    manifest = Manifest.read(fast_decoder)
    session = ort.InferenceSession(str(fast_decoder / manifest.io.graph))
    ids = tiny.encode(PROMPTS[1])
    seq = list(ids)
    step = steps.prefill(ids)
    for position in range(len(ids), len(ids) + 8):
        full = full_logits(session, manifest.io, seq)[-1]
        np.testing.assert_allclose(step, full, rtol=1e-4, atol=1e-4)
        token = int(np.argmax(step))
        seq.append(token)
        step = steps.decode_one_token(token, position)


def test_cache_is_written_in_place_up_to_the_last_position(tiny: Generator) -> None:
    kv = tiny.engine.slots
    keys_before = kv.buffers[0]
    ids = tiny.encode(PROMPTS[0])
    result = tiny.generate(PROMPTS[0], max_new_tokens=10)
    keys, values = kv.buffers[0], kv.buffers[1]
    assert keys is keys_before  # the same buffer: allocated once
    used = len(ids) + len(result.token_ids) - 1  # the last token is sampled, never fed
    assert np.abs(keys[0, :, :used]).sum(axis=(0, 2)).min() > 0
    # A one-token step runs its one row: nothing is written past the last fed token (a
    # prefill's spare row, one position past the prompt, is the first step's position).
    assert not keys[0, :, used:].any() and not values[0, :, used:].any()


@pytest.mark.parametrize(
    "sampling", [SamplingConfig(), SamplingConfig(temperature=0.9, top_p=0.9, seed=7)]
)
@pytest.mark.parametrize("prompt", [PROMPTS[0], CHAT])
def test_streamed_text_equals_generated_text(
    tiny: Generator, prompt: object, sampling: SamplingConfig
) -> None:
    chunks = list(tiny.stream(prompt, max_new_tokens=40, sampling=sampling))  # type: ignore[arg-type]
    result = tiny.generate(prompt, max_new_tokens=40, sampling=sampling)  # type: ignore[arg-type]
    assert "".join(c.text for c in chunks) == result.text
    assert tuple(t for c in chunks for t in c.token_ids) == result.token_ids


def test_incremental_detokenization_never_splits_a_character(tiny: Generator) -> None:
    text = "Zürich — 東京 costs 5 € 🙂 naïve"
    ids = tiny.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    stream = TextStream(tiny._tok, stops=())
    pieces = [chunk.text for chunk in map(stream.push, ids) if chunk is not None]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert len(pieces) < len(ids)  # a character's first bytes waited for its last ones


def test_seed_makes_sampling_reproducible(tiny: Generator) -> None:
    def run(seed: int) -> tuple[int, ...]:
        sampling = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95, seed=seed)
        return tiny.generate(PROMPTS[0], max_new_tokens=16, sampling=sampling).token_ids

    assert run(1) == run(1)
    assert len({run(seed) for seed in range(4)}) > 1


def test_sampler_filters_reduce_to_greedy() -> None:
    logits = np.random.default_rng(0).normal(size=100).astype(np.float32)
    best = int(np.argmax(logits))
    assert Sampler(SamplingConfig(temperature=1.0, top_k=1, seed=3))(logits) == best
    assert Sampler(SamplingConfig(temperature=1.0, top_p=1e-6, seed=3))(logits) == best
    draws = {Sampler(SamplingConfig(temperature=1.0, top_k=5, seed=s))(logits) for s in range(50)}
    assert draws <= set(np.argsort(logits)[-5:].tolist()) and len(draws) > 1


def test_context_error_fires_exactly_at_the_boundary(tiny: Generator) -> None:
    ids = tiny.encode(PROMPTS[1])
    room = tiny.context_length - len(ids)
    with pytest.raises(ContextLengthExceededError) as caught:
        tiny.generate(PROMPTS[1], max_new_tokens=room + 1)
    assert caught.value.code == "context_length" and isinstance(caught.value, InputError)
    assert tiny.run_seconds == 0.0  # refused before any graph ran
    result = tiny.generate(PROMPTS[1], max_new_tokens=room)
    assert result.prompt_tokens + len(result.token_ids) <= tiny.context_length
    if result.finish_reason == "length":
        assert len(result.token_ids) == room


def test_stop_string_cuts_stream_and_result(tiny: Generator) -> None:
    full = tiny.generate(PROMPTS[0], max_new_tokens=30).text
    stop = full[10:13]
    result = tiny.generate(PROMPTS[0], max_new_tokens=30, stop=[stop])
    assert result.finish_reason == "stop"
    assert result.text == full[: full.find(stop)]
    assert "".join(c.text for c in tiny.stream(PROMPTS[0], max_new_tokens=30, stop=[stop])) == (
        result.text
    )


def test_eos_ends_generation(fast_decoder: Path) -> None:
    manifest = Manifest.read(fast_decoder)
    plain = Generator(fast_decoder, manifest, config=RuntimeConfig(threads=1), context_length=128)
    tokens = plain.generate(PROMPTS[0], max_new_tokens=12).token_ids
    cut = next(i for i in range(2, 12) if tokens[i] not in tokens[:i])
    io = dataclasses.replace(manifest.io, stop_token_ids=(tokens[cut],))
    gen = Generator(
        fast_decoder,
        dataclasses.replace(manifest, io=io),
        config=RuntimeConfig(threads=1),
        context_length=128,
    )
    result = gen.generate(PROMPTS[0], max_new_tokens=12)
    assert result.finish_reason == "eos" and result.token_ids == tokens[:cut]


def test_deadline_and_length_finish_reasons(tiny: Generator) -> None:
    assert tiny.generate(PROMPTS[0], max_new_tokens=20, timeout_s=0.0).finish_reason == "deadline"
    result = tiny.generate(PROMPTS[0], max_new_tokens=5)
    assert result.finish_reason == "length" and len(result.token_ids) == 5


def test_chat_template_renders_the_package_format(tiny: Generator) -> None:
    text = tiny.render_chat(CHAT)
    assert text == (
        "<|im_start|>system\nYou are a tiny test model<|im_end|>\n"
        "<|im_start|>user\nName three rivers in Europe.<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(InputError):
        tiny.render_chat([])


def test_manifest_records_decoder_geometry(tiny_package: Path) -> None:
    manifest = Manifest.read(tiny_package)
    io = manifest.io
    assert manifest.task == "generate"
    assert (io.num_layers, io.num_kv_heads, io.head_dim) == (2, 2, 16)
    assert len(io.past_names) == len(io.present_names) == io.num_layers
    inputs = {spec.name for spec in io.inputs}
    assert {"input_ids", "attention_mask", "position_ids", *io.past_names[1]} <= inputs
    assert manifest.tokens["eos"] in io.stop_token_ids
    assert "{% for message in messages %}" in io.chat_template


def test_bad_arguments_are_config_errors(tiny: Generator, fast_decoder: Path) -> None:
    with pytest.raises(ConfigError):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ConfigError):
        tiny.generate(PROMPTS[0], max_new_tokens=0)
    with pytest.raises(ConfigError):
        Generator(
            fast_decoder,
            Manifest.read(fast_decoder),
            config=RuntimeConfig(threads=1),
            context_length=10**6,
        )


def test_load_serves_generation_through_the_model_facade(fast_decoder: Path) -> None:
    """``edgeinfer.load`` on a generate package: verified, warm, and the same tokens as the
    Generator underneath; embed/classify and caching refuse it clearly."""
    import edgeinfer

    model = edgeinfer.load(fast_decoder, threads=1)
    assert model.task == "generate" and model.cold_start_ms > 0
    assert model.providers[-1] == "CPUExecutionProvider"
    result = model.generate("The market rose", max_new_tokens=8)
    streamed = "".join(chunk.text for chunk in model.stream("The market rose", max_new_tokens=8))
    assert streamed == result.text
    with pytest.raises(ConfigError, match="no embed"):
        model.embed("not an encoder")
    with pytest.raises(ConfigError, match="cache serves embed and classify packages"):
        edgeinfer.load(fast_decoder, cache=edgeinfer.CacheConfig(persist=False))


def test_prefix_kv_cache_reuses_a_shared_prompt_prefix(
    tiny: Generator, steps: Decoder, fast_decoder: Path
) -> None:
    """A prompt that starts with the ids already in the cache prefills only the rest, and
    gives exactly what a fresh generator gives; a different prompt reuses nothing."""
    fresh = Generator(
        fast_decoder,
        Manifest.read(fast_decoder),
        config=RuntimeConfig(threads=1),
        context_length=128,
    )
    system = tiny.encode("You are a terse assistant on a factory floor. Answer in one line.")
    first = system + tiny.encode(" Where is valve seven?")
    second = system + tiny.encode(" Is line three running?")
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    # The step-by-step decoder's cache.
    steps.prefill(first)
    reused = steps.prefill(second).copy()
    assert steps.prefix_reused == common >= len(system) - 1
    steps.forget_prefix()
    np.testing.assert_allclose(reused, steps.prefill(second), atol=1e-5)
    # The one-slot engine keeps the last request's keys/values the same way.
    tiny.generate(tiny.decode(first), max_new_tokens=4)
    prompt = tiny.decode(second)
    again = tiny.generate(prompt, max_new_tokens=12)
    assert tiny.prefix_reused == common
    assert again.text == fresh.generate(prompt, max_new_tokens=12).text
    tiny.generate("Completely different words", max_new_tokens=4)
    assert tiny.prefix_reused == 0
    tiny.generate(prompt, max_new_tokens=4)
    tiny.forget_prefix()
    tiny.generate(prompt, max_new_tokens=4)
    assert tiny.prefix_reused == 0
