"""Text generation on a decoder package: prompts (plain or chat), the decoding loop of
``decoding.Decoder``, streamed text with stop strings, and the prefix KV cache (in memory, and
on disk for system prompts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeinfer.config import PrefixCacheConfig, RuntimeConfig, SamplingConfig
from edgeinfer.errors import ContextLengthExceededError, InputError, PackageError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import DecoderIO
from edgeinfer.runtime import memory
from edgeinfer.runtime.generate import prefix_store
from edgeinfer.runtime.generate.chat import Prompt, render_chat
from edgeinfer.runtime.generate.decoding import Decoder
from edgeinfer.runtime.generate.streaming import (
    GenerationResult,
    StreamState,
    TextChunk,
    TextStream,
)

__all__ = ["Generator"]


class Generator(Decoder):
    """Generate text with a ``generate`` package on onnxruntime.

    Thread-safe: requests run one at a time (one KV cache); a stream holds the generator until
    it is exhausted or closed.

    Args:
        path: the package folder.
        manifest: its manifest (already verified by the caller when wanted).
        config: providers and threads.
        context_length: the most tokens a request may hold (prompt + generated); ``None``
            takes the package's context length. The KV cache holds what requests use, up to it.
        prefix_cache: keep system prompts' keys/values on disk across restarts (a chat's
            system message automatically, any text through ``warm_prefix``); ``None``: the
            prefix cache lives in memory only.
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        context_length: int | None = None,
        prefix_cache: PrefixCacheConfig | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        try:  # first: its JSON's parse garbage goes back before the weights come in
            self._tok = Tokenizer.from_file(str(Path(path) / manifest.io_as(DecoderIO).tokenizer))
        except Exception as exc:  # tokenizers raises a bare Exception on parse errors
            raise PackageError(f"cannot load the generate package {path}: {exc}") from exc
        memory.release_heap()
        super().__init__(path, manifest, config=config, context_length=context_length)
        self.chat_format: dict[str, Any] | None = self.io.chat_format
        bos = manifest.tokens.get("bos")
        # A plain-text prompt starts with BOS when the tokenizer adds one (chat templates
        # write their own).
        self._bos = [int(bos)] if self.io.add_bos_token and bos is not None else []
        # One cache, one sequence at a time: a request holds it until its stream ends (a stream
        # left unfinished releases it when closed or collected).
        self._lock = threading.Lock()
        self.prefix_from_disk = 0  # tokens the last request loaded from the prefix store
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
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        return self._bos + ids if isinstance(prompt, str) else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens dropped)."""
        return str(self._tok.decode(list(ids)))

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
        state = StreamState()
        with self._lock:
            yield from self._stream(prompt, max_new_tokens, sampling, stop, timeout_s, state, True)

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
            sampling: greedy (with prompt lookup) by default.
            stop: strings that end the generation (not included in the text).
            timeout_s: stop after this many seconds (finish_reason ``deadline``).

        Raises:
            ContextLengthExceededError: before any work, when the request cannot fit.
        """
        state = StreamState()
        with self._lock:
            chunks = self._stream(prompt, max_new_tokens, sampling, stop, timeout_s, state, False)
            text = "".join(chunk.text for chunk in chunks)
        return GenerationResult(
            text=text,
            token_ids=tuple(state.ids),
            prompt_tokens=state.prompt_tokens,
            finish_reason=state.finish,
            ttft_ms=state.ttft_s * 1e3,
            decode_tokens_per_s=state.decode_rate(),
        )

    def warm_prefix(self, prefix: str) -> int:
        """Put the keys/values of ``prefix`` (a fixed instruction every prompt starts with)
        into the cache: from the prefix store when it holds them, else prefilled and stored.
        Returns the prefix's token count. End ``prefix`` where tokenization cannot merge
        across (a newline, a special token), or the prompts' ids will not start with its ids.
        """
        with self._lock:
            ids = self.encode(prefix)
            if len(ids) >= self.context_length:
                raise ContextLengthExceededError(
                    prompt_tokens=len(ids), max_new_tokens=1, context_length=self.context_length
                )
            from_disk = prefix_store.restore(self._store, self.cache, ids)
            self.prefix_from_disk = len(ids) if from_disk else 0
            if self.cache.ids[: len(ids)] != ids:
                self.prefill(ids)
            prefix_store.save(self._store, self.cache, ids)
            return len(ids)

    def _system_ids(self, prompt: Prompt, ids: Sequence[int]) -> list[int]:
        """The ids of the chat template's start plus the system message, when ``prompt`` is a
        chat with one and ``ids`` start with them."""
        text = prefix_store.system_text(self.chat_format, prompt)
        if text is None:
            return []
        head = list(self._tok.encode(text, add_special_tokens=False).ids)
        return head if list(ids[: len(head)]) == head and len(head) < len(ids) else []

    def _stream(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        sampling: SamplingConfig | None,
        stop: Sequence[str],
        timeout_s: float | None,
        state: StreamState,
        live: bool,
    ) -> Iterator[TextChunk]:
        started = time.perf_counter()
        deadline = None if timeout_s is None else started + timeout_s
        ids = self.encode(prompt)
        state.prompt_tokens = len(ids)
        system = self._system_ids(prompt, ids) if self._store is not None else []
        from_disk = prefix_store.restore(self._store, self.cache, system)
        self.prefix_from_disk = len(system) if from_disk else 0
        text = TextStream(self._tok, stop, live=live)  # generate(): the text once, at the end
        state.ids = text.ids
        state.finish = "length"
        try:
            for token in self.tokens(
                ids,
                max_new_tokens=max_new_tokens,
                sampling=sampling or SamplingConfig(),
                deadline=deadline,
            ):
                state.tick(started)
                if token in self.stop_token_ids:
                    state.finish = "eos"
                    break
                chunk = text.push(token)
                if chunk is not None:
                    yield chunk
                if text.stopped:
                    state.finish = "stop"
                    return
            else:
                if deadline is not None and time.perf_counter() >= deadline:
                    state.finish = "deadline"
            last = text.finish(self.decode(text.ids))  # a trailing partial character included
            state.finish = "stop" if text.stopped else state.finish
            if last is not None:
                yield last
        finally:
            prefix_store.save(self._store, self.cache, system)  # the write never delays a token
