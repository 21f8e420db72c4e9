"""The one scheduler of a generate package: sequences decoded together, one graph run per step
for all of them (as llama.cpp's server slots and onnxruntime-genai do); a load without
continuous batching is an engine of one slot, so every request takes this path.

Decoding a small model is bound by reading its weights once per step; reading them once for
four sequences costs little more than for one. The engine owns one thread and the decoder's
session (one copy of the weights and prepacks); each request is a ``Sequence`` with its own KV
row in a ``SlotCache``. The thread loops:

1. admit a waiting sequence when a slot is free and the KV budget holds its request (prompt +
   max_new_tokens positions); on its first run it takes what its row kept (a one-slot engine
   keeps a finished sequence's keys/values: the next prompt that starts the same prefills
   from where they end) or the prefix store holds (a chat's system prompt, from disk);
2. run one chunk (``prefill_chunk_tokens``) of the newcomer's prompt on its row alone, so the
   others wait at most one chunk between two tokens, never a whole long prompt; with none
   decoding, up to ``lone_prefill_tokens`` (none waits; each run reads every weight, and
   attention's transient memory grows with a run's tokens). Logits and keys/values are the
   same bits however a prompt is grouped into runs (``export/decoder/graph.py``);
3. run one decode step of every admitted sequence at once: a batch of one token per sequence,
   each with its own position and mask row; greedy rows read the graph's argmax, sampled rows
   their logits through their own sampler;
4. hand each sequence its token; a finished or cancelled one leaves (its row freed, the last
   row moved into the gap).

Sequences join and leave at token boundaries. A one-token step runs attention without the
extra row (``extra_row`` 0, see ``export/decoder/graph.py``), as ``decoding.Decoder``'s plain
steps do: the same computation whether a sequence is decoded alone, with others or on a load
without batching, so a sequence's greedy text does not depend on the load. Prompt lookup
(``SamplingConfig.draft_tokens``) drafts in a one-slot engine only: onnxruntime's
``GroupQueryAttention`` takes several sequences only one new token each (``runs.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Ids
from typing import TYPE_CHECKING, Any

from edgeinfer.config import ContinuousBatchConfig, SamplingConfig
from edgeinfer.errors import (
    ConfigError,
    ContextLengthExceededError,
    EdgeInferError,
    InferenceError,
    MemoryBudgetError,
    PackageError,
)
from edgeinfer.runtime.generate.lookup import PromptLookup, accept_greedy
from edgeinfer.runtime.generate.meter import Meter
from edgeinfer.runtime.generate.runs import Runs
from edgeinfer.runtime.generate.sequence import Sequence
from edgeinfer.runtime.generate.slots import SlotCache
from edgeinfer.runtime.generate.streaming import TextStream

if TYPE_CHECKING:
    from edgeinfer.runtime.generate.decoding import DecoderGraph
    from edgeinfer.runtime.generate.prefix_store import PrefixStore

__all__ = ["Engine"]

log = logging.getLogger(__name__)


class Engine:
    """Decode up to ``config.max_sequences`` sequences of ``graph``'s session together.

    Args:
        graph: the loaded decoder graph (its session, io and limits).
        config: slots, KV budget and prefill chunk.
        decode: token ids -> text (a sequence's last chunk).
        store: the prefix store a sequence's ``keep_prefix`` ids are restored from and saved
            to; ``None``: none.
    """

    def __init__(
        self,
        graph: DecoderGraph,
        config: ContinuousBatchConfig,
        *,
        decode: Callable[[list[int]], str],
        store: PrefixStore | None = None,
    ) -> None:
        io = graph.io
        self.max_sequences = config.sequences
        if not io.extra_row_input and self.max_sequences > 1:
            raise PackageError(
                f"the package {graph.manifest.name!r} decodes one sequence at a time (its graph "
                "has no extra_row input); re-export it with this edgeinfer to decode several "
                "at once, or load it without continuous batching"
            )
        if graph.device != "cpu":
            raise ConfigError(
                "generation runs on the CPU provider for now (the engine's KV rows live in "
                "host memory); load the generate package with providers=['cpu']"
            )
        self._graph, self._decode, self._store = graph, decode, store
        self.slots = SlotCache(io, rows=self.max_sequences, limit=graph.context_length + 1)
        self._runs = Runs(graph, self.slots)
        budget = config.kv_budget_bytes
        self.kv_budget_positions = None if budget is None else budget // self.slots.bytes_per_token
        self.prefill_chunk = config.prefill_chunk_tokens
        self.lone_prefill = config.lone_prefill_tokens
        # One slot: a finished sequence's keys/values stay for the next prompt that starts the
        # same, and greedy requests may draft (prompt lookup). Several: an idle slot costs
        # nothing, and a batched step takes one token per sequence.
        self._solo = self.max_sequences == 1
        self._waiting: deque[Sequence] = deque()
        self._decoding: list[Sequence] = []  # row i: self._decoding[i]
        self._filling: Sequence | None = None  # row len(_decoding), prompt filled up to _filled
        self._filled: int | None = None  # None: its first chunk has not run
        self._forget = False  # drop what the rows kept before the next sequence starts
        self._cond = threading.Condition()
        self._stopping = False
        self.meter = Meter()
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-batch", daemon=True)
        self._thread.start()

    @property
    def run_seconds(self) -> float:
        """Seconds spent inside onnxruntime since the warm-up."""
        return self._runs.seconds

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
        stops = self._graph.stop_token_ids if stop_token_ids is None else stop_token_ids
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
            ConfigError: max_new_tokens < 1 or an empty prompt.
            MemoryBudgetError: a request that alone needs more KV than the budget.
            ContextLengthExceededError: prompt + max_new_tokens exceed the context.
        """
        if seq.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {seq.max_new_tokens}")
        if not seq.ids:
            raise ConfigError("a sequence needs at least one prompt token")
        if len(seq.ids) + seq.max_new_tokens > self._graph.context_length:
            raise ContextLengthExceededError(
                prompt_tokens=len(seq.ids),
                max_new_tokens=seq.max_new_tokens,
                context_length=self._graph.context_length,
            )
        budget, per_token = self.kv_budget_positions, self.slots.bytes_per_token
        if budget is not None and seq.needed_positions > budget:
            raise MemoryBudgetError(
                needed_bytes=seq.needed_positions * per_token,
                free_bytes=budget * per_token,
                budget_bytes=budget * per_token,
                fits=budget - 1,  # prompt + max_new_tokens, beside the graph's spare position
            )
        with self._cond:
            if self._stopping:
                raise EdgeInferError("the model is closed; load it again")
            self._waiting.append(seq)
            self._cond.notify_all()
        return seq

    def forget_prefix(self) -> None:
        """Make the next sequence prefill from position 0 (a cold time to first token)."""
        with self._cond:
            self._forget = True

    def stats(self) -> dict[str, Any]:
        """What the engine runs now and how fast: active and waiting sequences, aggregate
        tokens/s over the last 10 s, inter-token p50/p99 and queue-wait p50 (ms), KV bytes."""
        return {
            "max_sequences": self.max_sequences,
            "active": len(self._decoding) + (self._filling is not None),
            "waiting": len(self._waiting),
            **self.meter.summary(),
            "kv_bytes": self.slots.nbytes,
        }

    def warm_up(self, runs: int) -> None:
        """Kernel selection and allocations: a one-token prompt alone, then every slot at once
        (a drafting step too in a one-slot engine)."""
        lookup = SamplingConfig(draft_tokens=1 if self._solo else 0)
        for _ in range(runs):
            for count in sorted({1, self.max_sequences}):
                batch = [self.submit([0], max_new_tokens=2, sampling=lookup) for _ in range(count)]
                for seq in batch:
                    list(seq)
        self.forget_prefix()
        self._runs.seconds = 0.0
        self.meter.clear()

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
                log.exception("generation: a graph run failed")
                error = exc if isinstance(exc, EdgeInferError) else InferenceError(str(exc))
                with self._cond:
                    self._fail_all(error, waiting=False)

    def _fail_all(self, error: EdgeInferError, *, waiting: bool = True) -> None:
        active = [*self._decoding, *([self._filling] if self._filling else [])]
        queued = list(self._waiting) if waiting else []
        for seq in (*active, *queued):
            seq.end(error)
        for row in range(self.slots.rows):
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
        self.meter.admitted(now - seq.started)
        if self._forget:
            for row in range(self.slots.rows):
                self.slots.take(row)
            self._forget = False
        self.slots.ensure(seq.needed_positions)
        self._filling, self._filled = seq, None

    def _finish_unstarted(self, seq: Sequence) -> None:
        seq.end(chunk=seq.close(self._decode) if not seq.cancelled.is_set() else None)

    def _begin(self, seq: Sequence, row: int) -> int:
        """Where ``seq``'s prompt starts running on ``row``: after what the row kept or the
        prefix store holds of it (never its last token: its logits are needed)."""
        reuse = self.slots.take(row, seq.ids[:-1])
        prefix = seq.ids[: seq.keep_prefix]
        if self._store is not None and prefix and reuse < len(prefix):
            kv = self._store.load(prefix)
            if kv is not None:
                self.slots.write(row, kv)
                seq.from_disk = len(prefix)
                reuse = min(len(prefix), len(seq.ids) - 1)
        seq.reused = reuse
        drafts = seq.sample.config.draft_tokens
        if self._solo and seq.sample.greedy and drafts:
            seq.lookup = PromptLookup(seq.ids, max_tokens=drafts)
        return reuse

    def _prefill_chunk(self) -> None:
        seq = self._filling
        assert seq is not None
        row = len(self._decoding)
        if seq.cancelled.is_set():
            self._filling = None
            self.slots.release(row)
            seq.end()
            return
        start = self._begin(seq, row) if self._filled is None else self._filled
        # None decodes, none waits: long runs (a run's fixed cost, reading every weight, is ~6
        # prompt tokens' compute: benchmarks/step_cost.py), bounded for attention's transient
        # memory; runs end at multiples of their size.
        step = self.prefill_chunk if self._decoding else self.lone_prefill
        end = min(len(seq.ids), (start // step + 1) * step)
        logits = self._runs.forward(row, seq.ids[start:end], start, rows=1, output="logits")
        self._filled = end
        if end < len(seq.ids):
            return
        self._filling = None
        self._decoding.append(seq)
        self._deliver(row, seq.sample(logits[0]))

    def _decode_step(self) -> None:
        for row in reversed(range(len(self._decoding))):  # a cancelled one leaves first
            if self._decoding[row].cancelled.is_set():
                self._leave(row)
        if not self._decoding:
            return
        lookup = self._decoding[0].lookup
        if lookup is not None:  # a one-slot engine: the drafting sequence is alone
            self._draft_step(self._decoding[0], lookup)
            return
        batch, runs, argmax = len(self._decoding), self._runs, self._graph.io.argmax_output
        for row, seq in enumerate(self._decoding):
            position = seq.position
            runs.token[row, 0] = seq.generated[-1]
            runs.position[row, 0] = position
            self.slots.open(row, position + 1)
        greedy = all(seq.sample.greedy for seq in self._decoding)
        runs.step(batch, greedy=greedy and bool(argmax))
        for row in reversed(range(batch)):  # leaving moves the last row: walk from the end
            seq = self._decoding[row]
            if seq.sample.greedy and argmax:
                token = int(runs.best[row, 0])
            else:
                token = seq.sample(runs.logits[row, 0])
            self._deliver(row, token)

    def _draft_step(self, seq: Sequence, lookup: PromptLookup) -> None:
        """One step of a greedy sequence that drafts by prompt lookup: its token and the draft
        run together (a wide one-row run when there is no draft), the accepted tokens out."""
        token, position = seq.generated[-1], seq.position
        left = seq.max_new_tokens - len(seq.generated)  # the draft leaves room for one more
        draft = lookup.draft(token, left - 1)
        argmax = self._graph.io.argmax_output
        ids, output = [token, *draft], argmax or "logits"
        best = self._runs.forward(0, ids, position, rows=len(ids), output=output)
        chosen = accept_greedy(best if argmax else best.argmax(axis=1), draft)
        if draft:
            lookup.record(len(draft), chosen)
        for token in chosen:
            self._deliver(0, token)
            if seq.done:  # it left
                return

    def _deliver(self, row: int, token: int) -> None:
        seq = self._decoding[row]
        chunk = seq.accept(token)
        self.meter.token(seq.token_s)
        seq.put(token, chunk)
        if seq.done:  # its row is free (and its prefix stored) before the caller hears
            last = seq.close(self._decode)
            self._leave(row)
            seq.end(chunk=last)

    def _leave(self, row: int) -> None:
        """Free ``row``: the last decoding row moves into it, the prefilling one after it."""
        seq = self._decoding[row]
        if seq.cancelled.is_set() and not seq.done:
            seq.end()
        self._save_prefix(seq, row)
        last = len(self._decoding) - 1
        if row != last:
            self.slots.move(last, row)
            self._decoding[row] = self._decoding[last]
        self._decoding.pop()
        # The positions written: the prompt and every token fed back (not the last one).
        self.slots.release(last, keep=[*seq.ids, *seq.generated[:-1]] if self._solo else None)
        if self._filling is not None:  # its row follows the decoding ones
            self.slots.move(last + 1, last)
            self.slots.release(last + 1)

    def _save_prefix(self, seq: Sequence, row: int) -> None:
        """Store the keys/values of ``seq``'s ``keep_prefix`` ids when the store lacks them
        (after its last token went out: the write never delays it)."""
        prefix = seq.ids[: seq.keep_prefix]
        if self._store is not None and prefix and not self._store.path(prefix).exists():
            self._store.save(prefix, self.slots.read(row, len(prefix)))
