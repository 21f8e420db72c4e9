"""Text generation on a decoder package: prompts (plain or chat) in, streamed text with stop
strings out, every request a sequence of the one scheduler (``engine.Engine``; one slot
without continuous batching), the prefix KV cache in memory and on disk for system prompts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.config import (
    ContinuousBatchConfig,
    PrefixCacheConfig,
    RuntimeConfig,
    SamplingConfig,
)
from edgeinfer.errors import (
    ConfigError,
    ContextLengthExceededError,
    InputError,
)
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import DecoderIO
from edgeinfer.runtime import memory
from edgeinfer.runtime.generate import prefix_store
from edgeinfer.runtime.generate.chat import Prompt, render_chat
from edgeinfer.runtime.generate.decoding import DecoderGraph
from edgeinfer.runtime.generate.engine import Engine
from edgeinfer.runtime.generate.lm_tokenizer import load_tokenizer
from edgeinfer.runtime.generate.lookup import PromptLookup
from edgeinfer.runtime.generate.sequence import Sequence as Request
from edgeinfer.runtime.generate.streaming import GenerationResult, TextChunk, TextStream

__all__ = ["Generator"]

log = logging.getLogger(__name__)

# What serving one request allocates besides its KV (logits, the sampler's arrays, Python's
# objects), kept free under the memory budget.
_RESERVE_BYTES = 8 * 2**20


def _room_bytes(budget_bytes: int) -> int:
    """What ``budget_bytes`` leaves beside the process's anonymous memory now."""
    return budget_bytes - memory.anonymous_bytes() - _RESERVE_BYTES


class Generator:
    """Generate text with a ``generate`` package on onnxruntime.

    Thread-safe. Every request is a sequence of the one scheduler, ``engine.Engine``: with
    ``batching`` up to ``max_sequences`` requests are decoded together; without it the engine
    has one slot (requests take turns, a finished one's keys/values stay for the next prompt
    that starts the same, greedy requests may draft by prompt lookup). A stream holds nothing:
    an abandoned one frees its slot. Greedy tokens are the same either way (see ``engine``).

    Args:
        path: the package folder.
        manifest: its manifest (already verified by the caller when wanted).
        config: providers and threads.
        context_length: the most tokens a request may hold (prompt + generated); ``None``
            takes the package's context length. The KV cache holds what requests use, up to it.
        prefix_cache: keep system prompts' keys/values on disk across restarts (a chat's
            system message automatically, any text through ``warm_prefix``); ``None``: the
            prefix cache lives in memory only.
        batching: decode several requests at once (continuous batching); ``None``: one at a
            time. The package's graph must take ``extra_row`` (exported by this edgeinfer).
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        context_length: int | None = None,
        prefix_cache: PrefixCacheConfig | None = None,
        batching: ContinuousBatchConfig | None = None,
    ) -> None:
        if batching is not None and prefix_cache is not None:
            raise ConfigError(
                "the prefix cache keeps one sequence's keys/values; with continuous batching "
                "each request prefills its own prompt: load with one of the two"
            )

        # first: a tokenizer.json's parse garbage goes back before the weights come in
        self._tok = load_tokenizer(Path(path), manifest.io_as(DecoderIO))
        memory.release_heap()
        graph = DecoderGraph(path, manifest, config=config, context_length=context_length)
        self.io, self.manifest, self.providers = graph.io, manifest, graph.providers
        self.context_length, self.stop_token_ids = graph.context_length, graph.stop_token_ids
        self.chat_format: dict[str, Any] | None = self.io.chat_format
        bos = manifest.tokens.get("bos")
        # A plain-text prompt starts with BOS when the tokenizer adds one (chat templates
        # write their own).
        self._bos = [int(bos)] if self.io.add_bos_token and bos is not None else []
        self._store = (
            None
            if prefix_cache is None
            else prefix_store.PrefixStore(
                prefix_cache.folder,
                package_digest=manifest.digest,
                io=self.io,
                max_bytes=prefix_cache.max_bytes,
            )
        )
        self._last: Request | None = None  # the latest request (its prefix figures)
        # What the process may still grow into: requests wait (or are refused) before they
        # would pass it.
        budget = self.memory_budget_bytes = config.memory_budget_bytes or memory.limit_bytes()
        if budget is not None and _room_bytes(budget) < budget // 4:
            log.warning(
                "%s holds %.0f MiB of anonymous memory under a memory budget of %.0f MiB: "
                "little room for KV caches, and the kernel kills a process whose anonymous "
                "memory passes a cgroup's limit; %s",
                Path(path).name,
                memory.anonymous_bytes() / 2**20,
                budget / 2**20,
                "raise the limit"
                if config.file_backed_prepacks
                else "RuntimeConfig(file_backed_prepacks=True) (serve --file-backed-prepacks) "
                "moves onnxruntime's prepacked weights into evictable file pages",
            )
        slots = batching or ContinuousBatchConfig(max_sequences=1)
        if slots.kv_budget_bytes is None and budget is not None:
            room = max(_room_bytes(budget), 1)  # nothing left: every request refused, clearly
            slots = dataclasses.replace(slots, kv_budget_bytes=room)
        self.engine = Engine(graph, slots, decode=self.decode, store=self._store)

    # -- prompt --------------------------------------------------------------------------------

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text of ``messages`` under the package's chat template."""
        if self.chat_format is None:
            raise InputError("this package has no chat template; pass a plain prompt string")
        return render_chat(self.chat_format, messages)

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids (a message list goes through the chat template first)."""
        text = prompt if isinstance(prompt, str) else self.render_chat(prompt)
        if not text:
            raise InputError("the prompt is empty")
        ids = self._tok.encode(text)
        return self._bos + ids if isinstance(prompt, str) else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens dropped)."""
        return self._tok.decode(ids)

    # -- the public calls ----------------------------------------------------------------------

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        sampling: SamplingConfig | None = None,
        stop: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> Iterator[TextChunk]:
        """Generate and yield text as it comes (see ``generate`` for the arguments)."""
        request = self._request(prompt, max_new_tokens, sampling, stop, timeout_s, live=True)
        yield from self.engine.add(request).chunks()

    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        sampling: SamplingConfig | None = None,
        stop: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> GenerationResult:
        """Generate a completion of ``prompt`` (a string, or chat messages).

        Args:
            prompt: text, or ``[{"role": ..., "content": ...}, ...]`` for the chat template.
            max_new_tokens: the most tokens to generate; prompt + this must fit the context.
            sampling: greedy by default (the same tokens with ``batching`` or without).
            stop: strings that end the generation (not included in the text).
            timeout_s: stop after this many seconds (finish_reason ``deadline``).

        Raises:
            ContextLengthExceededError: before any work, when the request cannot fit.
        """
        request = self._request(prompt, max_new_tokens, sampling, stop, timeout_s, live=False)
        text = "".join(chunk.text for chunk in self.engine.add(request).chunks())
        state = request.state
        return GenerationResult(
            text=text,
            token_ids=tuple(state.ids),
            prompt_tokens=state.prompt_tokens,
            finish_reason=state.finish,
            ttft_ms=state.ttft_s * 1e3,
            decode_tokens_per_s=state.decode_rate(),
        )

    def warm_up(self, runs: int) -> None:
        """Kernel selection and allocations before requests (see ``Engine.warm_up``)."""
        self.engine.warm_up(runs)

    def close(self) -> None:
        """Stop the engine's thread (requests still running end with an error)."""
        self.engine.close()

    @property
    def max_sequences(self) -> int:
        """Generations decoded at once: the engine's slots (1 without ``batching``)."""
        return self.engine.max_sequences

    def generation_stats(self) -> dict[str, Any] | None:
        """The engine's figures now (``Engine.stats``) with ``batching``; ``None`` without."""
        return None if self.engine.max_sequences == 1 else self.engine.stats()

    @property
    def prefix_reused(self) -> int:
        """Prompt tokens the latest request did not run: kept from the request before it,
        or loaded from the prefix store."""
        return 0 if self._last is None else self._last.reused

    @property
    def prefix_from_disk(self) -> int:
        """Prompt tokens the latest request loaded from the prefix store."""
        return 0 if self._last is None else self._last.from_disk

    @property
    def lookup(self) -> PromptLookup | None:
        """The latest request's prompt lookup (its drafted and accepted counts), when it
        drafted."""
        return None if self._last is None else self._last.lookup

    @property
    def run_seconds(self) -> float:
        """Seconds spent inside onnxruntime since the warm-up."""
        return self.engine.run_seconds

    def forget_prefix(self) -> None:
        """Make the next request prefill from position 0 (a cold time to first token)."""
        self.engine.forget_prefix()

    def warm_prefix(self, prefix: str) -> int:
        """Put the keys/values of ``prefix`` (a fixed instruction every prompt starts with)
        into the cache: from the prefix store when it holds them, else prefilled and stored.
        Returns the prefix's token count. End ``prefix`` where tokenization cannot merge
        across (a newline, a special token), or the prompts' ids will not start with its ids.
        """
        if self.engine.max_sequences > 1:
            raise ConfigError(
                "warm_prefix keeps one sequence's cache; it is not available with continuous "
                "batching (each request prefills its own prompt)"
            )
        ids = self.encode(prefix)
        if len(ids) >= self.context_length:
            raise ContextLengthExceededError(
                prompt_tokens=len(ids), max_new_tokens=1, context_length=self.context_length
            )
        # One token after the prefix: the slot then keeps the prefix's keys/values.
        seq = Request(
            ids,
            max_new_tokens=1,
            sampling=SamplingConfig(),
            stop_token_ids=frozenset(),
            keep_prefix=len(ids),
        )
        self._last = seq
        list(self.engine.add(seq))
        return len(ids)

    def _system_ids(self, prompt: Prompt, ids: Sequence[int]) -> list[int]:
        """The ids of the chat template's start plus the system message, when ``prompt`` is a
        chat with one and ``ids`` start with them."""
        text = prefix_store.system_text(self.chat_format, prompt)
        if text is None:
            return []
        head = self._tok.encode(text)
        return head if list(ids[: len(head)]) == head and len(head) < len(ids) else []

    def _request(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        sampling: SamplingConfig | None,
        stop: Sequence[str],
        timeout_s: float | None,
        *,
        live: bool,
    ) -> Request:
        """The request's sequence: its ids, sampler, text stream and stop rules."""
        started = time.perf_counter()
        ids = self.encode(prompt)
        keep = len(self._system_ids(prompt, ids)) if self._store is not None else 0
        request = self._last = Request(
            ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling or SamplingConfig(),
            stop_token_ids=self.stop_token_ids,
            text=TextStream(self._tok, stop, live=live),  # generate(): the text at the end
            deadline=None if timeout_s is None else started + timeout_s,
            started=started,
            keep_prefix=keep,
        )
        return request
