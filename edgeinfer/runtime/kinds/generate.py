"""``GenerateModel``: a ``decoder`` package's KV-cached text generation and streaming, over
``generate.Generator`` (docs/generation.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.config import ContinuousBatchConfig, PrefixCacheConfig, RuntimeConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate.chat import Prompt
from edgeinfer.runtime.generate.generator import Generator
from edgeinfer.runtime.generate.streaming import GenerateOptions, GenerationResult, TextChunk
from edgeinfer.runtime.model import Model

if TYPE_CHECKING:
    from typing_extensions import Unpack  # annotations only: no runtime dependency

__all__ = ["GenerateModel"]


class GenerateModel(Model):
    """A ``generate`` package: KV-cached text generation and streaming. ``GenerateModel.load``
    loads one (a ``PackageError`` for another kind); ``edgeinfer.load`` returns one for such a
    package."""

    TASK = "generate"
    IO_KINDS = ("decoder",)
    OPTIONS = ("prefix_cache", "continuous_batching")

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        prefix_cache: PrefixCacheConfig | None = None,
        continuous_batching: ContinuousBatchConfig | None = None,
    ) -> None:
        super().__init__(path, manifest, config=config)
        self._generator = Generator(
            path,
            manifest,
            config=config,
            prefix_cache=prefix_cache,
            batching=continuous_batching,
        )
        self.providers = self._generator.providers

    def generate(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> GenerationResult:
        """Complete ``prompt`` (text, or chat messages rendered with the package's template).
        ``options``: ``max_new_tokens`` (128), ``sampling`` (greedy), ``stop`` strings and
        ``timeout_s`` (see ``Generator.generate``).

        Stops at the end-of-text token, a ``stop`` string, ``max_new_tokens`` or ``timeout_s``.
        Raises ``ContextLengthExceededError`` before any work when the prompt plus
        ``max_new_tokens`` exceeds the package's context length.
        """
        return self._generator.generate(prompt, **options)

    def stream(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> Iterator[TextChunk]:
        """As ``generate``, yielding text as it is decoded (never half a character)."""
        return self._generator.stream(prompt, **options)

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids as ``generate`` runs them (chat messages through the
        package's template, a plain prompt after BOS when the tokenizer adds one)."""
        return self._generator.encode(prompt)

    def warm_prefix(self, prefix: str) -> int:
        """Load (or prefill and store) the keys/values of text every prompt starts with;
        returns its token count. A chat's system message needs no call: it is kept
        automatically. See ``docs/generation.md``."""
        return self._generator.warm_prefix(prefix)

    @property
    def max_sequences(self) -> int:
        """Generations this model decodes at once: ``continuous_batching``'s slots, else 1."""
        return self._generator.max_sequences

    def generation_stats(self) -> dict[str, Any] | None:
        """Continuous batching now: active and waiting sequences, tokens/s over the last
        10 s, inter-token p50/p99 and queue-wait p50 (ms), KV bytes; ``None`` without it."""
        return self._generator.generation_stats()

    def close(self) -> None:
        """Stop the continuous-batching thread (requests still running end with an error)."""
        self._generator.close()

    def _warm_up(self, runs: int) -> None:
        self._generator.warm_up(runs)
