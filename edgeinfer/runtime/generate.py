"""Text generation on a decoder package, gpt-fast style: ``prefill`` -> ``decode_one_token`` ->
``generate``.

The KV cache is allocated once for the context and bound as the graph's past *and* present, so
every step writes one position in place. The per-token inputs (``input_ids``, ``position_ids``,
the all-ones ``attention_mask``) and the ``logits`` output are preallocated too: a decode step
writes two integers, rebinds the mask's length and runs the graph.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import PrefixCacheConfig, RuntimeConfig, SamplingConfig
from edgeinfer.errors import (
    ConfigError,
    ContextLengthExceededError,
    InferenceError,
    InputError,
    PackageError,
)
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.chat import Prompt, fill_message, render_chat
from edgeinfer.runtime.kvcache import KVCache, device_for
from edgeinfer.runtime.prefix_store import PrefixStore
from edgeinfer.runtime.sampling import Sampler
from edgeinfer.runtime.session import session_options
from edgeinfer.runtime.streaming import (
    GenerationResult,
    StreamState,
    TextChunk,
    first_stop,
    held_back,
)
from edgeinfer.runtime.tokenizer import Detokenizer

__all__ = ["Generator"]


class Generator:
    """Generate text with a ``generate`` package on onnxruntime.

    Thread-safe: requests run one at a time (one KV cache); a stream holds the generator until
    it is exhausted or closed.

    Args:
        path: the package folder.
        manifest: its manifest (already verified by the caller when wanted).
        config: providers and threads.
        context_length: tokens of KV to allocate (prompt + generated); ``None`` takes the
            package's context length. Lower it to save memory on small devices.
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
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if manifest.task != "generate":
            raise PackageError(f"{path} is a {manifest.task!r} package, not a generate package")
        io = manifest.io
        self.manifest = manifest
        self.context_length = int(context_length or io["context_length"])
        if not 1 < self.context_length <= int(io["context_length"]):
            raise ConfigError(
                f"context_length must be in [2, {io['context_length']}], got {context_length}"
            )
        try:
            self._session = ort.InferenceSession(
                str(Path(path) / io["graph"]),
                sess_options=session_options(config),
                providers=eps.with_options(
                    eps.resolve(config.providers or tuple(manifest.providers)), package=Path(path)
                ),
            )
            self._tok = Tokenizer.from_file(str(Path(path) / io["tokenizer"]))
        except Exception as exc:  # ORT and tokenizers raise their own classes
            raise PackageError(f"cannot load the generate package {path}: {exc}") from exc
        self.stop_token_ids = frozenset(int(t) for t in io["stop_token_ids"])
        self.chat_format: dict[str, Any] | None = io.get("chat_format")
        bos = manifest.tokens.get("bos")
        # A plain-text prompt starts with BOS when the tokenizer adds one (chat templates
        # write their own).
        self._bos = [int(bos)] if io.get("add_bos_token") and bos is not None else []
        self.cache = KVCache(
            io, capacity=self.context_length, device=device_for(self._session.get_providers())
        )
        vocab = int(io["vocab_size"])
        # Preallocated decode inputs/outputs, written in place each step.
        self._token = np.zeros((1, 1), np.int64)  # input_ids: [1, 1]
        self._position = np.zeros((1, 1), np.int64)  # position_ids: [1, 1]
        self._mask = np.ones((1, self.context_length), np.int64)  # attention_mask: [1, C]
        self._logits = np.zeros((1, 1, vocab), np.float32)  # logits: [1, 1, V]
        self._decode = self._session.io_binding()
        self.cache.bind(self._decode)
        self._decode.bind_cpu_input("input_ids", self._token)
        self._decode.bind_cpu_input("position_ids", self._position)
        self._decode.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self._logits))
        self._prefill = self._session.io_binding()
        self._prefill.bind_output("logits")  # bound first: output 0 (rebound per prompt)
        self.cache.bind(self._prefill)
        self.providers: list[str] = list(self._session.get_providers())
        # One cache, one sequence at a time: a request holds it until its stream ends (a stream
        # left unfinished releases it when closed or collected).
        self._lock = threading.Lock()
        # Prefix KV cache: the ids whose keys/values the cache holds at positions 0..n-1. A
        # prompt that starts with them (a fixed system prompt, a chat's earlier turns) prefills
        # only the rest; the keys/values of position p depend on tokens 0..p alone.
        self._cached_ids: list[int] = []
        self.prefix_reused = 0  # tokens the last prefill took from the cache
        self.prefix_from_disk = 0  # tokens the last request loaded from the prefix store
        self._store = (
            None
            if prefix_cache is None
            else PrefixStore(
                prefix_cache.folder,
                package_digest=manifest.digest,
                io=io,
                max_bytes=prefix_cache.max_bytes,
            )
        )
        self.run_seconds = 0.0
        for _ in range(config.warmup_runs):  # kernel selection and allocations before requests
            self.prefill([0])  # token 0 exists in every vocabulary
            self.decode_one_token(0, 1)
        self.run_seconds = 0.0  # time spent inside onnxruntime, for the bench's overhead figure

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

    # -- the hot path --------------------------------------------------------------------------

    def _run(self, binding: Any) -> None:
        started = time.perf_counter()
        try:
            self._session.run_with_iobinding(binding)
        except Exception as exc:  # ORT raises its own pybind classes
            raise InferenceError(f"onnxruntime failed to run the decoder: {exc}") from exc
        self.run_seconds += time.perf_counter() - started

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Fill the cache with the prompt and return its last logits [V]. The longest prefix
        already in the cache is reused (at least the last token is always run: its logits)."""
        reuse = 0
        for cached, new in zip(self._cached_ids, ids[:-1], strict=False):
            if cached != new:
                break
            reuse += 1
        tokens = np.asarray(ids[reuse:], np.int64)[None]  # input_ids: [1, S - reuse]
        positions = np.arange(reuse, len(ids), dtype=np.int64)[None]  # position_ids
        self._prefill.bind_cpu_input("input_ids", tokens)
        self._prefill.bind_cpu_input("position_ids", positions)
        self._prefill.bind_cpu_input("attention_mask", self._mask[:, : len(ids)])
        self._prefill.bind_output("logits")  # [1, S, V]: ORT allocates it for this prompt
        self._cached_ids = []  # a failed run leaves the cache undefined
        self._run(self._prefill)
        self._cached_ids, self.prefix_reused = list(ids), reuse
        logits: np.ndarray = self._prefill.get_outputs()[0].numpy()  # [1, S - reuse, V]
        last: np.ndarray = logits[0, -1]
        return last

    def forget_prefix(self) -> None:
        """Make the next prefill start from position 0 (a cold time to first token)."""
        self._cached_ids = []

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
            self.prefix_from_disk = len(ids) if self._restore_prefix(ids) else 0
            if self._cached_ids[: len(ids)] != ids:
                self.prefill(ids)
            self._store_prefix(ids)
            return len(ids)

    def _system_ids(self, prompt: Prompt, ids: Sequence[int]) -> list[int]:
        """The ids of the chat template's start plus the system message, when ``prompt`` is a
        chat with one (its own or the template's default) and ``ids`` start with them."""
        if isinstance(prompt, str) or not prompt or self.chat_format is None:
            return []
        if "jinja" in self.chat_format:  # no per-message pattern to cut the system part with
            return []
        system = prompt[0].get("content") if prompt[0].get("role") == "system" else None
        system = system if system is not None else self.chat_format.get("default_system")
        if not isinstance(system, str):
            return []
        text = str(self.chat_format["prefix"]) + fill_message(
            str(self.chat_format["message"]), "system", system
        )
        head = list(self._tok.encode(text, add_special_tokens=False).ids)
        return head if list(ids[: len(head)]) == head and len(head) < len(ids) else []

    def _restore_prefix(self, ids: Sequence[int]) -> bool:
        """Load the keys/values of ``ids`` from the prefix store into the cache, unless the
        cache holds them already; True when they came from disk."""
        if self._store is None or not ids or self._cached_ids[: len(ids)] == list(ids):
            return False
        kv = self._store.load(ids)
        if kv is None:
            return False
        self._cached_ids = []  # a failed write leaves the cache undefined
        self.cache.write_prefix(kv)
        self._cached_ids = list(ids)
        return True

    def _store_prefix(self, ids: Sequence[int]) -> None:
        """Save the keys/values of ``ids`` when the cache holds them and the store does not."""
        if self._store is None or not ids or self._cached_ids[: len(ids)] != list(ids):
            return
        if not self._store.path(ids).exists():
            self._store.save(ids, self.cache.read_prefix(len(ids)))

    def decode_one_token(self, token: int, position: int) -> np.ndarray:
        """Feed ``token`` at ``position`` (its KV is written in place), return logits [V]."""
        self._token[0, 0] = token
        self._position[0, 0] = position
        self._decode.bind_cpu_input("attention_mask", self._mask[:, : position + 1])
        del self._cached_ids[position:]
        self._run(self._decode)
        self._cached_ids.append(token)
        row: np.ndarray = self._logits[0, 0]
        return row

    def tokens(
        self,
        ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig,
        deadline: float | None = None,
    ) -> Iterator[int]:
        """Yield generated token ids (eos included) until eos, ``max_new_tokens`` or the
        ``deadline`` (a ``time.perf_counter()`` value)."""
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(ids) + max_new_tokens > self.context_length:
            raise ContextLengthExceededError(
                prompt_tokens=len(ids),
                max_new_tokens=max_new_tokens,
                context_length=self.context_length,
            )
        sample = Sampler(sampling)
        token = sample(self.prefill(ids))
        for position in range(len(ids), len(ids) + max_new_tokens - 1):
            yield token
            if token in self.stop_token_ids:
                return
            if deadline is not None and time.perf_counter() >= deadline:
                return
            token = sample(self.decode_one_token(token, position))
        yield token

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
            yield from self._stream(prompt, max_new_tokens, sampling, stop, timeout_s, state)

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
            sampling: greedy by default.
            stop: strings that end the generation (not included in the text).
            timeout_s: stop after this many seconds (finish_reason ``deadline``).

        Raises:
            ContextLengthExceededError: before any work, when the request cannot fit.
        """
        state = StreamState()
        with self._lock:
            for _ in self._stream(prompt, max_new_tokens, sampling, stop, timeout_s, state):
                pass
        text = self.decode(state.ids)
        if state.finish == "stop":
            text = text[: min(i for i in (text.find(s) for s in stop if s) if i >= 0)]
        return GenerationResult(
            text=text,
            token_ids=tuple(state.ids),
            prompt_tokens=state.prompt_tokens,
            finish_reason=state.finish,
            ttft_ms=state.ttft_s * 1e3,
            decode_tokens_per_s=state.decode_rate(),
        )

    def _stream(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        sampling: SamplingConfig | None,
        stop: Sequence[str],
        timeout_s: float | None,
        state: StreamState,
    ) -> Iterator[TextChunk]:
        started = time.perf_counter()
        stops = [s for s in stop if s]
        ids = self.encode(prompt)
        state.prompt_tokens = len(ids)
        system = self._system_ids(prompt, ids) if self._store is not None else []
        self.prefix_from_disk = len(system) if self._restore_prefix(system) else 0
        try:
            yield from self._generate(
                ids, max_new_tokens, sampling, stops, timeout_s, state, started
            )
        finally:
            self._store_prefix(system)  # after the answer: the write never delays a token

    def _generate(
        self,
        ids: list[int],
        max_new_tokens: int,
        sampling: SamplingConfig | None,
        stops: list[str],
        timeout_s: float | None,
        state: StreamState,
        started: float,
    ) -> Iterator[TextChunk]:
        deadline = None if timeout_s is None else started + timeout_s
        detok = Detokenizer(self._tok)
        text, emitted, pending = "", 0, 0
        state.finish = "length"
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
            state.ids.append(token)
            pending += 1
            text += detok.push(token)
            cut = first_stop(text, stops, emitted)
            safe = cut if cut is not None else len(text) - held_back(text, stops)
            if safe > emitted:
                yield TextChunk(text=text[emitted:safe], token_ids=tuple(state.ids[-pending:]))
                emitted, pending = safe, 0
            if cut is not None:
                state.finish = "stop"
                return
        else:
            if deadline is not None and time.perf_counter() >= deadline:
                state.finish = "deadline"
        text = self.decode(state.ids)  # the whole text: a trailing partial character included
        tail = first_stop(text, stops, emitted)
        if tail is not None:
            state.finish = "stop"
        end = len(text) if tail is None else tail
        if end > emitted or pending:
            yield TextChunk(
                text=text[emitted:end], token_ids=tuple(state.ids[-pending:] if pending else ())
            )
