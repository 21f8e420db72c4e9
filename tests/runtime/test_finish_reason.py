"""The finish reason is decided once, by the sequence, at the token that ends it, and the
stream's last chunk carries it: a caller reads it there instead of deciding again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeinfer.config import ContinuousBatchConfig, RuntimeConfig, SamplingConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.sequence import Sequence
from edgeinfer.runtime.generate.streaming import TextStream

PROMPT = "The market rose"


@pytest.fixture(params=["solo", "engine"])
def gen(request: pytest.FixtureRequest, tiny_package: Path) -> Iterator[Generator]:
    batching = ContinuousBatchConfig(max_sequences=2) if request.param == "engine" else None
    loaded = Generator(
        tiny_package,
        Manifest.read(tiny_package),
        config=RuntimeConfig(threads=1),
        context_length=128,
        batching=batching,
    )
    yield loaded
    loaded.close()


class _Clock:
    """Time that jumps past the deadline once the sequence holds ``at`` tokens."""

    def __init__(self, deadline: float, at: int) -> None:
        self.deadline, self.at = deadline, at
        self.seq: Sequence | None = None

    def __call__(self) -> float:
        held = 0 if self.seq is None else len(self.seq.generated)
        return self.deadline + 1.0 if held >= self.at else self.deadline - 1.0


def _sequence(gen: Generator, clock: _Clock, *, max_new_tokens: int) -> Sequence:
    seq = Sequence(
        gen.encode(PROMPT),
        max_new_tokens=max_new_tokens,
        sampling=SamplingConfig(),
        stop_token_ids=frozenset(),
        text=TextStream(gen._tok, ()),
        deadline=clock.deadline,
        clock=clock,
    )
    clock.seq = seq
    return seq


@pytest.mark.parametrize(("passes_at", "reason"), [(8, "length"), (5, "deadline")])
def test_a_deadline_passing_at_the_last_token_is_a_length_stop(
    gen: Generator, passes_at: int, reason: str
) -> None:
    """The deadline passes right at the 8th and last token: the generation stopped at
    max_new_tokens (``length``); passing at the 5th, it is the deadline that stopped it. The
    same on the default load (an engine of one slot) and with continuous batching, and only
    the last chunk says it."""
    seq = gen.engine.add(_sequence(gen, _Clock(deadline=100.0, at=passes_at), max_new_tokens=8))
    chunks = list(seq.chunks())
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + [reason]
    assert sum(len(c.token_ids) for c in chunks) == min(passes_at, 8)


def _eos_after_three(gen: Generator) -> tuple[int, ...]:
    """Make the prompt's 4th greedy token an eos; the 3 before it are the answer."""
    tokens = gen.generate(PROMPT, max_new_tokens=12).token_ids
    cut = next(i for i in range(3, 12) if tokens[i] not in tokens[:i])
    gen.stop_token_ids = frozenset({tokens[cut]})
    return tokens[:cut]


@pytest.mark.parametrize("reason", ["length", "stop", "eos", "deadline"])
def test_the_last_chunk_of_every_stream_carries_the_finish_reason(
    gen: Generator, reason: str
) -> None:
    options: dict[str, object] = {"max_new_tokens": 12}
    if reason == "stop":
        options["stop"] = [gen.generate(PROMPT, max_new_tokens=12).text[6:9]]
    elif reason == "eos":
        _eos_after_three(gen)
    elif reason == "deadline":
        options["timeout_s"] = 0.0
    chunks = list(gen.stream(PROMPT, **options))  # type: ignore[arg-type]
    result = gen.generate(PROMPT, **options)  # type: ignore[arg-type]
    assert result.finish_reason == reason
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + [reason]
    assert "".join(c.text for c in chunks) == result.text
    assert tuple(t for c in chunks for t in c.token_ids) == result.token_ids
