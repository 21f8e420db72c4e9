"""Continuous batching: several sequences of one decoder package decoded together, one graph
run per step for all of them (as llama.cpp's server slots and onnxruntime-genai do).

Decoding a small model is bound by reading its weights once per step; reading them once for
four sequences costs little more than for one. The engine owns one thread and the decoder's
session (one copy of the weights and prepacks); each request is a ``Sequence`` with its own KV
row in a ``SlotCache``. The thread loops:

1. admit a waiting sequence when a slot is free and the KV budget holds its request (prompt +
   max_new_tokens positions);
2. run one chunk (``prefill_chunk_tokens``) of the newcomer's prompt on its row alone, so the
   others wait at most one chunk between two tokens, never a whole long prompt;
3. run one decode step of every admitted sequence at once: a batch of one token per sequence,
   each with its own position and mask row; greedy rows read the graph's argmax, sampled rows
   their logits through their own sampler;
4. hand each sequence its token; a finished or cancelled one leaves (its row freed, the last
   row moved into the gap).

Sequences join and leave at token boundaries. A one-token step runs attention without the
extra row (``extra_row`` 0, see ``export/decoder/graph.py``), as ``decoding.Decoder``'s plain
steps do: the same computation whether a sequence is decoded alone, with others or on a load
without batching, so a sequence's greedy text does not depend on the load. Prompt lookup is
not used here: onnxruntime's ``GroupQueryAttention`` takes several sequences only one new
token each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Ids
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.config import ContinuousBatchConfig, SamplingConfig
from edgeinfer.errors import (
    ConfigError,
    ContextLengthExceededError,
    EdgeInferError,
    InferenceError,
    PackageError,
)
from edgeinfer.runtime.generate.sequence import Sequence
from edgeinfer.runtime.generate.slots import SlotCache
from edgeinfer.runtime.generate.streaming import TextStream

if TYPE_CHECKING:
    from edgeinfer.runtime.generate.decoding import Decoder

__all__ = ["Engine"]

log = logging.getLogger(__name__)

_WINDOW_S = 10.0  # tokens/s over the last 10 s


class Engine:
    """Decode up to ``config.max_sequences`` sequences of ``decoder``'s session together.

    Args:
        decoder: the loaded decoder (its session and io; its own one-sequence cache is not used).
        config: slots, KV budget and prefill chunk.
        decode: token ids -> text (a sequence's last chunk).
    """

    def __init__(
        self,
        decoder: Decoder,
        config: ContinuousBatchConfig,
        *,
        decode: Callable[[list[int]], str],
    ) -> None:
        io = decoder.io
        if not io.extra_row_input:
            raise PackageError(
                f"the package {decoder.manifest.name!r} decodes one sequence at a time (its graph "
                "has no extra_row input); re-export it with this edgeinfer to decode several "
                "at once, or load it without continuous batching"
            )
        if decoder.cache.device != "cpu":
            raise ConfigError(
                "continuous batching runs on the CPU provider for now; load the package "
                "without it on a GPU"
            )
        self._decoder, self._session, self._decode = decoder, decoder._session, decode
        self.max_sequences = config.sequences
        self.slots = SlotCache(io, rows=self.max_sequences, limit=decoder.context_length + 1)
        budget = config.kv_budget_bytes
        self.kv_budget_positions = None if budget is None else budget // self.slots.bytes_per_token
        self.prefill_chunk = config.prefill_chunk_tokens
        rows = self.max_sequences
        self._token = np.zeros((rows, 1), np.int64)
        self._position = np.zeros((rows, 1), np.int64)
        self._best = np.zeros((rows, 1), np.int64)
        self._logits = np.zeros((rows, 1, io.vocab_size), np.float32)
        self._one, self._zero = np.ones(1, np.int64), np.zeros(1, np.int64)
        self._steps: dict[tuple[int, bool], Any] = {}  # (batch, greedy) -> binding
        self._fills: dict[int, Any] = {}  # row -> prefill binding
        self._bound_generation = self.slots.generation
        self._waiting: deque[Sequence] = deque()
        self._decoding: list[Sequence] = []  # row i: self._decoding[i]
        self._filling: Sequence | None = None  # row len(_decoding), prompt filled up to _filled
        self._filled = 0
        self._cond = threading.Condition()
        self._stopping = False
        self.run_seconds = 0.0
        # Metrics: inter-token gaps, queue waits (ms) and token times.
        self._gaps: deque[float] = deque(maxlen=4096)
        self._waits: deque[float] = deque(maxlen=512)
        self._produced: deque[float] = deque(maxlen=4096)  # when each token came
        self.tokens = 0
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-batch", daemon=True)
        self._thread.start()

    # -- the callers' side ---------------------------------------------------------------------

    def submit(
        self,
        ids: Ids[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop_token_ids: frozenset[int] | None = None,
        text: TextStream | None = None,
        deadline: float | None = None,
    ) -> Sequence:
        """Queue a sequence of prompt ``ids``; iterate it (``for token in seq`` or
        ``seq.chunks()``) for its output. ``stop_token_ids`` ``None``: the package's."""
        stops = self._decoder.stop_token_ids if stop_token_ids is None else stop_token_ids
        return self.add(
            Sequence(
                ids,
                max_new_tokens=max_new_tokens,
                sampling=sampling,
                stop_token_ids=stops,
                text=text,
                deadline=deadline,
            )
        )

    def add(self, seq: Sequence) -> Sequence:
        """Queue ``seq`` (built by the caller); returns it.

        Raises:
            ConfigError: max_new_tokens < 1, an empty prompt, or a request that alone needs
                more KV than the budget.
            ContextLengthExceededError: prompt + max_new_tokens exceed the context.
        """
        if seq.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {seq.max_new_tokens}")
        if not seq.ids:
            raise ConfigError("a sequence needs at least one prompt token")
        if len(seq.ids) + seq.max_new_tokens > self._decoder.context_length:
            raise ContextLengthExceededError(
                prompt_tokens=len(seq.ids),
                max_new_tokens=seq.max_new_tokens,
                context_length=self._decoder.context_length,
            )
        budget = self.kv_budget_positions
        if budget is not None and seq.needed_positions > budget:
            raise ConfigError(
                f"the request needs {seq.needed_positions * self.slots.bytes_per_token} bytes of "
                f"KV cache, over the {budget * self.slots.bytes_per_token}-byte budget; ask for "
                "fewer max_new_tokens or raise kv_budget_bytes"
            )
        with self._cond:
            if self._stopping:
                raise EdgeInferError("the model is closed; load it again")
            self._waiting.append(seq)
            self._cond.notify_all()
        return seq

    def stats(self) -> dict[str, Any]:
        """What the engine runs now and how fast: active and waiting sequences, aggregate
        tokens/s over the last 10 s, inter-token p50/p99 and queue-wait p50 (ms), KV bytes."""
        now = time.perf_counter()
        recent = sum(1 for t in list(self._produced) if now - t <= _WINDOW_S)
        # list(): one C-level copy each, taken whole while the engine's thread appends
        gaps, waits = np.array(list(self._gaps) or [0.0]), np.array(list(self._waits) or [0.0])
        return {
            "max_sequences": self.max_sequences,
            "active": len(self._decoding) + (self._filling is not None),
            "waiting": len(self._waiting),
            "tokens": self.tokens,
            "tokens_per_s": round(recent / _WINDOW_S, 2),
            "inter_token_ms_p50": round(float(np.percentile(gaps, 50)), 3),
            "inter_token_ms_p99": round(float(np.percentile(gaps, 99)), 3),
            "queue_wait_ms_p50": round(float(np.percentile(waits, 50)), 3),
            "kv_bytes": self.slots.nbytes,
        }

    def warm_up(self, runs: int) -> None:
        """Kernel selection and allocations: a one-token prompt alone, then every slot at once."""
        for _ in range(runs):
            for count in (1, self.max_sequences):
                batch = [
                    self.submit([0], max_new_tokens=2, sampling=SamplingConfig())
                    for _ in range(count)
                ]
                for seq in batch:
                    list(seq)
        self.run_seconds = 0.0
        self._gaps.clear()
        self._waits.clear()
        self._produced.clear()
        self.tokens = 0

    def close(self) -> None:
        """Stop the thread; waiting and running sequences end with an error."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    # -- the engine's thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._stopping or bool(self._waiting or self._decoding or self._filling)
                )
                if self._stopping:
                    self._fail_all(EdgeInferError("the model was closed; load it again"))
                    return
                self._admit()
            try:
                if self._filling is not None:
                    self._prefill_chunk()
                if self._decoding:
                    self._decode_step()
            except Exception as exc:  # a failed run leaves the rows undefined: end them all
                log.exception("continuous batching: a graph run failed")
                error = exc if isinstance(exc, EdgeInferError) else InferenceError(str(exc))
                with self._cond:
                    self._fail_all(error, waiting=False)

    def _fail_all(self, error: EdgeInferError, *, waiting: bool = True) -> None:
        active = [*self._decoding, *([self._filling] if self._filling else [])]
        queued = list(self._waiting) if waiting else []
        for seq in (*active, *queued):
            seq.end(error)
        for row in range(len(active)):
            self.slots.release(row)
        self._decoding, self._filling = [], None
        if waiting:
            self._waiting.clear()

    def _admit(self) -> None:
        """Drop cancelled and expired waiting sequences; start the next one when it fits."""
        now = time.perf_counter()
        while self._waiting and (self._waiting[0].cancelled.is_set() or self._waiting[0].expired()):
            self._finish_unstarted(self._waiting.popleft())
        if self._filling is not None or not self._waiting:
            return
        if len(self._decoding) >= self.max_sequences:
            return
        seq = self._waiting[0]
        if self.kv_budget_positions is not None:
            held = sum(s.needed_positions for s in self._decoding)
            if held + seq.needed_positions > self.kv_budget_positions:
                return
        self._waiting.popleft()
        self._waits.append((now - seq.started) * 1e3)
        self.slots.ensure(seq.needed_positions)
        self._filling, self._filled = seq, 0

    def _finish_unstarted(self, seq: Sequence) -> None:
        seq.end(chunk=seq.close(self._decode) if not seq.cancelled.is_set() else None)

    def _rebind_if_moved(self) -> None:
        if self._bound_generation != self.slots.generation:  # the buffers were reallocated
            self._steps.clear()
            self._fills.clear()
            self._bound_generation = self.slots.generation

    def _run(self, binding: Any) -> None:
        started = time.perf_counter()
        try:
            self._session.run_with_iobinding(binding)
        except Exception as exc:  # ORT raises its own pybind classes
            raise InferenceError(f"onnxruntime failed to run the decoder: {exc}") from exc
        self.run_seconds += time.perf_counter() - started

    def _prefill_chunk(self) -> None:
        seq = self._filling
        assert seq is not None
        if seq.cancelled.is_set():
            self._filling = None
            self.slots.release(len(self._decoding))
            seq.end()
            return
        self._rebind_if_moved()
        row = len(self._decoding)
        start = self._filled
        end = min(len(seq.ids), start + self.prefill_chunk)
        binding = self._fills.get(row)
        if binding is None:
            binding = self._fills[row] = self._new_binding(slice(row, row + 1), extra_row=True)
        binding.bind_cpu_input("input_ids", np.asarray(seq.ids[start:end], np.int64)[None])
        binding.bind_cpu_input("position_ids", np.arange(start, end, dtype=np.int64)[None])
        self.slots.open(row, end)
        binding.bind_output("logits")  # unallocated again: onnxruntime sizes it for this run
        self._run(binding)
        self._filled = end
        if end < len(seq.ids):
            return
        logits = binding.get_outputs()[0].numpy()[0, -1]
        self._filling = None
        self._decoding.append(seq)
        self._deliver(len(self._decoding) - 1, seq.sample(logits))

    def _new_binding(self, rows: slice, *, extra_row: bool) -> Any:
        io, binding = self._decoder.io, self._session.io_binding()
        if extra_row:  # a prefill: its logits are allocated per run, bound first (output 0)
            binding.bind_output("logits")
        self.slots.bind(binding, rows)
        if io.logits_input:
            binding.bind_cpu_input(io.logits_input, self._one)
        assert io.extra_row_input is not None  # checked in __init__
        binding.bind_cpu_input(io.extra_row_input, self._one if extra_row else self._zero)
        return binding

    def _step_binding(self, batch: int, greedy: bool) -> Any:
        import onnxruntime as ort

        binding = self._steps.get((batch, greedy))
        if binding is None:
            binding = self._new_binding(slice(0, batch), extra_row=False)
            binding.bind_cpu_input("input_ids", self._token[:batch])
            binding.bind_cpu_input("position_ids", self._position[:batch])
            argmax = self._decoder.io.argmax_output
            if argmax:
                binding.bind_ortvalue_output(
                    argmax, ort.OrtValue.ortvalue_from_numpy(self._best[:batch])
                )
            if not greedy or not argmax:
                logits = ort.OrtValue.ortvalue_from_numpy(self._logits[:batch])
                binding.bind_ortvalue_output("logits", logits)
            self._steps[(batch, greedy)] = binding
        return binding

    def _decode_step(self) -> None:
        for row in reversed(range(len(self._decoding))):  # a cancelled one leaves first
            if self._decoding[row].cancelled.is_set():
                self._leave(row)
        if not self._decoding:
            return
        self._rebind_if_moved()
        batch = len(self._decoding)
        for row, seq in enumerate(self._decoding):
            position = seq.position
            self._token[row, 0] = seq.generated[-1]
            self._position[row, 0] = position
            self.slots.open(row, position + 1)
        greedy = all(seq.sample.greedy for seq in self._decoding)
        self._run(self._step_binding(batch, greedy and bool(self._decoder.io.argmax_output)))
        for row in reversed(range(batch)):  # leaving moves the last row: walk from the end
            seq = self._decoding[row]
            if seq.sample.greedy and self._decoder.io.argmax_output:
                token = int(self._best[row, 0])
            else:
                token = seq.sample(self._logits[row, 0])
            self._deliver(row, token)

    def _deliver(self, row: int, token: int) -> None:
        seq = self._decoding[row]
        chunk = seq.accept(token)
        times = seq.token_s
        if len(times) > 1:
            self._gaps.append((times[-1] - times[-2]) * 1e3)
        self.tokens += 1
        self._produced.append(times[-1])
        seq.put(token, chunk)
        if seq.done:
            seq.end(chunk=seq.close(self._decode))
            self._leave(row)

    def _leave(self, row: int) -> None:
        """Free ``row``: the last decoding row moves into it, the prefilling one after it."""
        seq = self._decoding[row]
        if seq.cancelled.is_set() and not seq.done:
            seq.end()
        last = len(self._decoding) - 1
        if row != last:
            self.slots.move(last, row)
            self._decoding[row] = self._decoding[last]
        self._decoding.pop()
        self.slots.release(last)
        if self._filling is not None:  # its row follows the decoding ones
            self.slots.move(last + 1, last)
            self.slots.release(last + 1)
