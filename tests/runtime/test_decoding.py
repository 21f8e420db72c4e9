"""The decoding loop's pieces on the tiny decoder: prompt lookup's drafts never change the
tokens of its (wide) greedy steps, the KV cache grows with the request, and the sampler keeps
exactly the top-k/top-p tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer.config import RuntimeConfig, SamplingConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator, decoding, engine, slots
from edgeinfer.runtime.generate.decoding import Decoder
from edgeinfer.runtime.generate.lookup import PromptLookup, accept_greedy
from edgeinfer.runtime.generate.sampling import Sampler

PLAIN = SamplingConfig(draft_tokens=0)
LOOKUP = SamplingConfig(draft_tokens=8)


class _NoDrafts(PromptLookup):
    """Prompt lookup that never finds a draft: every step is a one-token wide step."""

    def draft(self, token: int, room: int) -> list[int]:
        super().draft(token, room)
        return []


def _wide_greedy(gen: Generator, prompt: object, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``prompt``'s greedy answer in the computation prompt lookup runs, without drafts."""
    with monkeypatch.context() as patch:
        patch.setattr(engine, "PromptLookup", _NoDrafts)
        return gen.generate(prompt, max_new_tokens=48, sampling=LOOKUP)  # type: ignore[arg-type]


def test_prompt_lookup_drafts_what_followed_the_last_ngram() -> None:
    lookup = PromptLookup([5, 6, 7, 8, 9, 1, 2, 6, 7], max_tokens=3)
    assert lookup.draft(8, room=10) == [9, 1, 2]  # "6 7 8" occurred: 9 1 2 followed it
    assert lookup.draft(4, room=10) == []  # "7 8 4" and "8 4" never occurred
    lookup = PromptLookup([1, 2, 3, 1, 2], max_tokens=8)
    assert lookup.draft(3, room=2) == [1, 2]  # the room left caps the draft
    lookup.record(2, [1, 2, 3])  # both accepted: the draft grows
    assert lookup.length == 6 and (lookup.drafted, lookup.accepted) == (2, 2)
    lookup.record(6, [9])  # none accepted: back to one token
    assert lookup.length == 1


def test_greedy_acceptance_keeps_the_drafts_up_to_the_first_miss() -> None:
    assert accept_greedy(np.array([4, 5, 6]), [4, 5]) == [4, 5, 6]
    assert accept_greedy(np.array([4, 9, 6]), [4, 5]) == [4, 9]
    assert accept_greedy(np.array([7, 5, 6]), [4, 5]) == [7]


def test_verify_accepts_the_greedy_continuation(tiny: Generator, steps: Decoder) -> None:
    ids = tiny.encode("The market rose")
    token = int(steps.prefill(ids).argmax())
    plain = [token]  # the wide steps' greedy tokens: what a verification computes
    for position in range(len(ids), len(ids) + 7):
        plain.append(steps.decode_greedy(plain[-1], position, wide=True))
    steps.forget_prefix()
    steps.prefill(ids)
    # The true continuation is accepted whole, plus the model's next token after it.
    assert steps.verify(plain[0], plain[1:6], len(ids)) == plain[1:7]
    assert steps.cache.ids == [*ids, *plain[:6]]
    wrong = [plain[1], (plain[2] + 1) % 512, plain[3]]
    steps.forget_prefix()
    steps.prefill(ids)
    assert steps.verify(plain[0], wrong, len(ids)) == plain[1:3]  # cut at the wrong draft
    assert steps.cache.ids == [*ids, *plain[:2]]  # rejected positions are not kept
    assert steps.decode_greedy(plain[2], len(ids) + 2, wide=True) == plain[3]


@pytest.mark.parametrize(
    "prompt",
    [
        "The market rose",
        "the cup the cup the cup the cup the cup the cup the cup",
        [{"role": "user", "content": "Name three rivers in Europe."}],
    ],
)
def test_prompt_lookup_yields_its_greedy_steps_tokens(
    tiny: Generator, prompt: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _wide_greedy(tiny, prompt, monkeypatch)
    fast = tiny.generate(prompt, max_new_tokens=48, sampling=LOOKUP)  # type: ignore[arg-type]
    assert fast.token_ids == plain.token_ids and fast.text == plain.text


@pytest.mark.parametrize("oracle", [True, False])
def test_lookup_loop_yields_the_plain_tokens_whatever_the_drafts(
    tiny: Generator, steps: Decoder, monkeypatch: pytest.MonkeyPatch, oracle: bool
) -> None:
    """Drafts that are the true continuation are all accepted, wrong ones all rejected; the
    tokens stay the greedy steps' ones either way, up to max_new_tokens exactly."""
    ids = tiny.encode("Chelsea won the cup after a long season of")
    with monkeypatch.context() as patch:
        patch.setattr(decoding, "PromptLookup", _NoDrafts)
        plain = list(steps.tokens(ids, max_new_tokens=30, sampling=LOOKUP))

    class Drafter(PromptLookup):
        def draft(self, token: int, room: int) -> list[int]:
            super().draft(token, room)
            done = len(self._ids) - len(ids)  # generated tokens so far
            true = plain[done : done + min(room, 5)]
            return true if oracle else [(t + 1) % 512 for t in true]

    monkeypatch.setattr(decoding, "PromptLookup", Drafter)
    fast = list(steps.tokens(ids, max_new_tokens=30, sampling=LOOKUP))
    assert fast == plain
    assert steps.lookup is not None
    accepted = steps.lookup.accepted
    assert accepted == (steps.lookup.drafted if oracle else 0) and steps.lookup.drafted > 0


def test_kv_cache_grows_with_the_request(
    fast_decoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slots, "GROWTH_TOKENS", 16)
    small = Generator(
        fast_decoder,
        Manifest.read(fast_decoder),
        config=RuntimeConfig(threads=1),
        context_length=96,
    )
    assert small.engine.slots.capacity == 16
    keys = small.engine.slots.buffers[0]
    prompt = "Chelsea won the cup after a long season of"
    grown = small.generate(prompt, max_new_tokens=40, sampling=PLAIN)
    assert small.engine.slots.capacity == 64 and small.engine.slots.buffers[0] is not keys
    monkeypatch.setattr(slots, "GROWTH_TOKENS", 256)
    whole = Generator(
        fast_decoder,
        Manifest.read(fast_decoder),
        config=RuntimeConfig(threads=1),
        context_length=96,
    )
    assert whole.generate(prompt, max_new_tokens=40, sampling=PLAIN).token_ids == grown.token_ids


def _reference(logits: np.ndarray, config: SamplingConfig) -> np.ndarray:
    """The sampling distribution by the textbook recipe: float64, full sort."""
    scaled = logits.astype(np.float64) / config.temperature
    order = np.argsort(-scaled, kind="stable")
    if config.top_k:
        order = order[: config.top_k]
    probs = np.exp(scaled[order] - scaled[order].max())
    probs /= probs.sum()
    if config.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), config.top_p)) + 1
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    out = np.zeros(logits.shape[0])
    out[order] = probs
    return out


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=0.7, top_p=0.9, seed=1),
        SamplingConfig(temperature=1.0, top_k=20, seed=2),
        SamplingConfig(temperature=1.3, top_k=50, top_p=0.8, seed=3),
        SamplingConfig(temperature=0.8, seed=4),
    ],
)
def test_sampler_draws_from_the_reference_distribution(config: SamplingConfig) -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(3000) * 2.5).astype(np.float32)  # a long flat tail
    logits[rng.choice(3000, 8, replace=False)] += 9.0  # and a few likely tokens
    sampler = Sampler(config)
    draws = 6000
    counts = np.bincount([sampler(logits) for _ in range(draws)], minlength=3000) / draws
    reference = _reference(logits, config)
    assert not counts[reference == 0].any()  # never a token the filters drop
    # Total variation over the likely tokens one by one and the rest as one bucket: sampling
    # noise of 6000 draws is ~0.02.
    likely = reference > 0.005
    got = np.append(counts[likely], counts[~likely].sum())
    want = np.append(reference[likely], reference[~likely].sum())
    assert 0.5 * np.abs(got - want).sum() < 0.05


def test_float16_kv_cache_halves_the_cache_and_tracks_float32(
    tiny: Generator, steps: Decoder, fast_decoder_kv16: Path
) -> None:
    half = Decoder(
        fast_decoder_kv16,
        Manifest.read(fast_decoder_kv16),
        config=RuntimeConfig(threads=1),
        context_length=128,
    )
    gen = Generator(
        fast_decoder_kv16,
        Manifest.read(fast_decoder_kv16),
        config=RuntimeConfig(threads=1),
        context_length=128,
    )
    assert half.cache.dtype == np.float16 and half.cache.nbytes * 2 == steps.cache.nbytes
    assert gen.engine.slots.dtype == np.float16
    assert gen.engine.slots.bytes_per_token * 2 == tiny.engine.slots.bytes_per_token
    ids = tiny.encode("Chelsea won the cup after a long season of")
    np.testing.assert_allclose(half.prefill(ids), steps.prefill(ids), atol=2e-2)
    plain = gen.generate("The market rose", max_new_tokens=24, sampling=PLAIN)
    assert plain.token_ids == gen.generate("The market rose", max_new_tokens=24).token_ids
