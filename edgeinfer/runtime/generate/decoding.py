"""The decoding loop of a decoder package, gpt-fast style: ``prefill`` -> ``decode_one_token``
(or ``verify`` a prompt-lookup draft) -> ``tokens``.

The KV cache is sized to the request and bound as the graph's past *and* present, so every step
writes its positions in place; the cache also owns the attention mask (ones over the positions
in use). A decode step writes two integers (token, position) and one mask element into
preallocated arrays, runs the graph and reads its output from a preallocated buffer: the
logits [V], or, for greedy decoding of a graph with an argmax output, one integer. Graphs with
a ``logits_input`` compute logits only for the positions asked for (the prompt's last one, or
every verified one).

A one-token step runs attention on its one row (``extra_row`` 0): the computation a batched
step of the continuous-batching engine runs for each of its sequences (onnxruntime takes
several sequences one row each only), so a request's greedy tokens are the same bits whether
it is decoded here, alone in the engine or beside others. A request that drafts by prompt
lookup runs its one-token steps on two rows instead (``wide``: the last one repeated), the
computation of a many-row verification, so its drafts never change its tokens; one row and
two sum in another order, so its greedy answer may differ from the plain one at near-ties
(see ``export/decoder/graph.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import RuntimeConfig, SamplingConfig
from edgeinfer.errors import (
    ConfigError,
    ContextLengthExceededError,
    InferenceError,
    PackageError,
    RunTimeoutError,
)
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import DecoderIO
from edgeinfer.runtime import memory
from edgeinfer.runtime.generate.kvcache import KVCache, device_for
from edgeinfer.runtime.generate.lookup import PromptLookup, accept_greedy
from edgeinfer.runtime.generate.sampling import Sampler
from edgeinfer.runtime.session import open_session
from edgeinfer.runtime.watchdog import RunLimit

__all__ = ["Decoder", "DecoderGraph"]


class DecoderGraph:
    """A decoder package's graph on onnxruntime: the session, its io and limits, no cache
    (the continuous-batching engine and ``Decoder`` each bind their own).

    Args:
        path: the package folder.
        manifest: its manifest.
        config: providers and threads.
        context_length: the most tokens a sequence may hold; ``None`` takes the package's.
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        context_length: int | None = None,
    ) -> None:
        if manifest.task != "generate":
            raise PackageError(f"{path} is a {manifest.task!r} package, not a generate package")
        io = self.io = manifest.io_as(DecoderIO)
        self.manifest = manifest
        self.context_length = int(context_length or io.context_length)
        if not 1 < self.context_length <= io.context_length:
            raise ConfigError(
                f"context_length must be in [2, {io.context_length}], got {context_length}"
            )
        providers = eps.resolve(config.providers or tuple(manifest.providers))
        try:
            self._session, graph = open_session(
                Path(path) / io.graph, providers=providers, config=config
            )
        except Exception as exc:  # ORT raises its own pybind classes
            raise PackageError(f"cannot load the generate package {path}: {exc}") from exc
        _check_names(self._session, io, path)
        memory.release_heap()  # the graph's protobuf, parsed and freed
        # External weights next to the graph are mapped; what prepacking read is not needed.
        memory.drop_file_pages(graph.with_name(graph.name + ".data"))
        self.providers: list[str] = list(self._session.get_providers())
        self.device = device_for(self.providers)
        # Every run of this session (the batched engine's too) stops at run_timeout_s. Not at
        # a request's deadline: a batched step serves other sequences (the lanes check those).
        self.limit = RunLimit(timeout_s=config.run_timeout_s, graph=io.graph)
        self.stop_token_ids = frozenset(io.stop_token_ids)


class Decoder(DecoderGraph):
    """A ``DecoderGraph`` (the same arguments) with its KV cache: one sequence at a time,
    step by step, for the KV and parity invariants and the export's checks (requests are
    served by ``engine.Engine``)."""

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        context_length: int | None = None,
    ) -> None:
        import onnxruntime as ort

        super().__init__(path, manifest, config=config, context_length=context_length)
        io = self.io
        # One spare position: the graph writes the keys/values of one row past the last token.
        self.cache = KVCache(io, limit=self.context_length + 1, device=self.device)
        # Preallocated decode inputs and outputs, written in place each step.
        self._token = np.zeros((1, 1), np.int64)  # input_ids: [1, 1]
        self._position = np.zeros((1, 1), np.int64)  # position_ids: [1, 1]
        self._logits = np.zeros((1, 1, io.vocab_size), np.float32)  # logits: [1, 1, V]
        self._best = np.zeros((1, 1), np.int64)  # argmax: [1, 1]
        # Flat views of the three: a step writes and reads Python ints, no numpy scalars.
        self._slots = [a.data.cast("B").cast("q") for a in (self._token, self._position)]
        self._best_slot = self._best.data.cast("B").cast("q")
        # Decode bindings over the same inputs and cache, per computation (one row; two rows,
        # ``wide``): one reads the logits, the other (greedy, on graphs with an argmax output)
        # the chosen token only.
        self._decode: dict[bool, Any] = {}
        self._greedy: dict[bool, Any] = {}
        for wide in (False, True):
            decode = self._decode[wide] = self._binding(wide=wide)
            decode.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self._logits))
            greedy = self._greedy[wide] = self._binding(wide=wide) if io.argmax_output else decode
            if io.argmax_output:
                best = ort.OrtValue.ortvalue_from_numpy(self._best)
                greedy.bind_ortvalue_output(io.argmax_output, best)
        # Multi-token runs (prefill, verification): the output is allocated per run.
        self._forward_bindings = {
            name: self._session.io_binding() for name in ("logits", io.argmax_output) if name
        }
        for name, binding in self._forward_bindings.items():
            binding.bind_output(name)  # bound first: output 0
            self.cache.bind(binding)
            self._bind_extra_row(binding, rows=1)
        self.prefix_reused = 0  # tokens the last prefill took from the cache
        self.run_seconds = 0.0  # time spent inside onnxruntime, for the bench's overhead figure
        self.lookup: PromptLookup | None = None  # the last request's prompt lookup

    def _binding(self, *, wide: bool) -> Any:
        """A one-token binding: the preallocated token and position, the cache and mask;
        attention on one row, or two (``wide``)."""
        binding = self._session.io_binding()
        self.cache.bind(binding)
        binding.bind_cpu_input("input_ids", self._token)
        binding.bind_cpu_input("position_ids", self._position)
        if self.io.logits_input:
            binding.bind_cpu_input(self.io.logits_input, np.ones(1, np.int64))
        self._bind_extra_row(binding, rows=int(wide))
        return binding

    def _bind_extra_row(self, binding: Any, *, rows: int) -> None:
        """Attention's extra row: 1 for many-token runs (a prefill, a verification: the bits
        of a wide one-token step, see ``export/decoder/graph.py``), 0 for a plain step."""
        if self.io.extra_row_input:
            binding.bind_cpu_input(self.io.extra_row_input, np.full(1, rows, np.int64))

    def warm_up(self, runs: int) -> None:
        """Kernel selection and allocations before requests: ``runs`` one-token prefills and
        decode steps (``run_seconds`` does not count them)."""
        for _ in range(runs):
            self.prefill([0])  # token 0 exists in every vocabulary
            for wide in (False, True):
                self.decode_one_token(0, 1, wide=wide)
                self.decode_greedy(0, 1, wide=wide)
        self.run_seconds = 0.0

    # -- the steps -----------------------------------------------------------------------------

    def _run(self, binding: Any) -> None:
        started = time.perf_counter()
        try:
            self.limit.call(lambda options: self._session.run_with_iobinding(binding, options))
        except Exception as exc:  # ORT raises its own pybind classes
            self.cache.ids = []  # a failed (or stopped) run leaves the cache undefined
            if isinstance(exc, RunTimeoutError):
                raise
            raise InferenceError(f"onnxruntime failed to run the decoder: {exc}") from exc
        self.run_seconds += time.perf_counter() - started

    def _forward(self, ids: Sequence[int], start: int, rows: int, output: str) -> np.ndarray:
        """Run ``ids`` at positions ``start``.. over the cached keys/values; ``output`` ("logits"
        or the argmax output) of the last ``rows`` new positions: [rows, V] or [rows]."""
        binding, end = self._forward_bindings[output], start + len(ids)
        del self.cache.ids[start:]  # positions from start on are rewritten
        self.cache.reserve(end)
        binding.bind_cpu_input("input_ids", np.asarray(ids, np.int64)[None])  # [1, S]
        binding.bind_cpu_input("position_ids", np.arange(start, end, dtype=np.int64)[None])
        if self.io.logits_input:
            binding.bind_cpu_input(self.io.logits_input, np.array([rows], np.int64))
        binding.bind_output(output)  # unallocated again: ORT sizes it for this run
        self._run(binding)
        self.cache.ids.extend(ids)
        result: np.ndarray = binding.get_outputs()[0].numpy()[0]  # [R, V] or [R]
        return result[-rows:]

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Fill the cache with the prompt and return its last logits [V]. The longest prefix
        already in the cache is reused (at least the last token is always run: its logits)."""
        reuse = self._reusable(ids)
        row: np.ndarray = self._forward(ids[reuse:], reuse, 1, "logits")[0]
        return row

    def _reusable(self, ids: Sequence[int]) -> int:
        """How many of ``ids`` the cache holds already (never the last one)."""
        reuse = 0
        for cached, new in zip(self.cache.ids, ids[:-1], strict=False):
            if cached != new:
                break
            reuse += 1
        self.prefix_reused = reuse
        return reuse

    def forget_prefix(self) -> None:
        """Make the next prefill start from position 0 (a cold time to first token)."""
        self.cache.ids = []

    def _step(self, binding: Any, token: int, position: int) -> None:
        """Run ``token`` at ``position`` through a one-token binding."""
        ids = self.cache.ids
        if len(ids) != position:
            del ids[position:]
        self.cache.reserve(position + 1)
        token_slot, position_slot = self._slots
        token_slot[0], position_slot[0] = token, position
        self._run(binding)
        ids.append(token)

    def decode_one_token(self, token: int, position: int, *, wide: bool = False) -> np.ndarray:
        """Feed ``token`` at ``position`` (its KV is written in place), return logits [V].
        ``wide``: attention on two rows, the bits of a verification (prompt lookup)."""
        self._step(self._decode[wide], token, position)
        row: np.ndarray = self._logits[0, 0]
        return row

    def decode_greedy(self, token: int, position: int, *, wide: bool = False) -> int:
        """Feed ``token`` at ``position``; the most likely next token (``wide``: see
        ``decode_one_token``)."""
        if self._greedy[wide] is self._decode[wide]:
            return int(self.decode_one_token(token, position, wide=wide).argmax())
        self._step(self._greedy[wide], token, position)
        best: int = self._best_slot[0]
        return best

    def verify(self, token: int, draft: Sequence[int], position: int) -> list[int]:
        """Feed ``token`` at ``position`` and ``draft`` after it in one pass; the greedy
        tokens it yields (the accepted drafts, then the model's own choice)."""
        rows = len(draft) + 1
        if self.io.argmax_output:
            best = self._forward([token, *draft], position, rows, self.io.argmax_output)
        else:
            best = self._forward([token, *draft], position, rows, "logits").argmax(axis=1)
        chosen = accept_greedy(best, draft)
        del self.cache.ids[position + len(chosen) :]  # the rejected drafts' positions
        return chosen

    def tokens(
        self,
        ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig,
        deadline: float | None = None,
    ) -> Iterator[int]:
        """Yield generated token ids (eos included) until eos, ``max_new_tokens`` or the
        ``deadline`` (a ``time.perf_counter()`` value). Greedy decoding drafts tokens by
        prompt lookup when ``sampling.draft_tokens`` asks (its steps are then ``wide``, so the
        drafts never change its tokens)."""
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(ids) + max_new_tokens > self.context_length:
            raise ContextLengthExceededError(
                prompt_tokens=len(ids),
                max_new_tokens=max_new_tokens,
                context_length=self.context_length,
            )
        sample = Sampler(sampling)
        greedy = sample.greedy
        lookup = self.lookup = (
            PromptLookup(ids, max_tokens=sampling.draft_tokens)
            if greedy and sampling.draft_tokens
            else None
        )
        token = sample(self.prefill(ids))
        position, left = len(ids), max_new_tokens  # where `token` goes; tokens still to yield
        while True:
            yield token
            left -= 1
            if token in self.stop_token_ids or left == 0:
                return
            if deadline is not None and time.perf_counter() >= deadline:
                return
            # The draft leaves room for the model's own token after it.
            if lookup is not None and (draft := lookup.draft(token, left - 1)):
                chosen = self.verify(token, draft, position)
                lookup.record(len(draft), chosen)
                position += len(chosen)
                for token in chosen[:-1]:  # the last one is yielded at the loop's top
                    yield token
                    left -= 1
                    if token in self.stop_token_ids:
                        return
                token = chosen[-1]
            elif greedy:
                token = self.decode_greedy(token, position, wide=lookup is not None)
                position += 1
            else:
                token = sample(self.decode_one_token(token, position))
                position += 1


def _check_names(session: Any, io: DecoderIO, path: Path) -> None:
    """The graph's inputs are exactly those the manifest's io names (the runtime binds each),
    and its named outputs exist: a manifest that disagrees is refused here, not at a run."""
    fixed = {"input_ids", "attention_mask", "position_ids"}
    named = {io.logits_input, io.extra_row_input} - {None}
    expected = fixed | named | {name for pair in io.past_names for name in pair}
    graph_inputs = {i.name for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    wanted_outputs = {"logits", *([io.argmax_output] if io.argmax_output else [])}
    wanted_outputs |= {name for pair in io.present_names for name in pair}
    problems = [f"graph input {n!r} is not in the manifest's io" for n in graph_inputs - expected]
    problems += [
        f"the manifest's io names input {n!r}, not in the graph" for n in expected - graph_inputs
    ]
    problems += [
        f"the manifest's io names output {n!r}, not in the graph" for n in wanted_outputs - outputs
    ]
    if problems:
        listed = "; ".join(sorted(problems))
        raise PackageError(
            f"{path}: the manifest does not match its decoder graph ({listed}); "
            "re-export the package with this edgeinfer"
        )
