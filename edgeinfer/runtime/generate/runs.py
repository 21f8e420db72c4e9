"""The engine's graph runs over its ``SlotCache``, one IOBinding kept per shape of run:

- ``step``: a decode step of the first ``B`` rows, one token each, attention on one row
  (``extra_row`` 0): the same computation for a row whether it runs alone or beside others;
- ``forward``: several tokens on one row (``extra_row`` 1): a prompt chunk, a prompt-lookup
  draft's verification, or a drafting sequence's one-token step (the bits of a verification,
  so its drafts never change its tokens; see ``export/decoder/graph.py``).

Inputs and outputs of a step are preallocated and written in place; a forward's output is
sized by onnxruntime per run. Bindings over buffers that ``SlotCache`` reallocated are rebuilt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import InferenceError, RunTimeoutError
from edgeinfer.runtime.generate.slots import SlotCache

if TYPE_CHECKING:
    from edgeinfer.runtime.generate.decoding import DecoderGraph

__all__ = ["Runs"]


class Runs:
    """Graph runs of ``graph``'s session over ``slots``.

    Args:
        graph: the loaded decoder graph (session and io).
        slots: the engine's KV rows.
    """

    def __init__(self, graph: DecoderGraph, slots: SlotCache) -> None:
        io = graph.io
        self._io, self._session, self.slots = io, graph._session, slots
        self._limit = graph.limit  # run_timeout_s stops every run
        rows = slots.rows
        # A step's inputs and outputs, row r for the sequence on row r.
        self.token = np.zeros((rows, 1), np.int64)  # input_ids: [B, 1]
        self.position = np.zeros((rows, 1), np.int64)  # position_ids: [B, 1]
        self.best = np.zeros((rows, 1), np.int64)  # argmax: [B, 1]
        self.logits = np.zeros((rows, 1, io.vocab_size), np.float32)  # logits: [B, 1, V]
        self._one, self._zero = np.ones(1, np.int64), np.zeros(1, np.int64)
        self._steps: dict[tuple[int, bool], Any] = {}  # (batch, greedy) -> binding
        self._forwards: dict[tuple[int, str], Any] = {}  # (row, output) -> binding
        self._generation = slots.generation
        self.seconds = 0.0  # time inside onnxruntime

    def step(self, batch: int, *, greedy: bool) -> None:
        """Run rows 0..batch-1 one token each (``token``/``position`` written first, the rows'
        masks opened); ``greedy`` (a graph with an argmax output): into ``best`` only, else
        into ``logits`` too."""
        self._rebind_if_moved()
        binding = self._steps.get((batch, greedy))
        if binding is None:
            binding = self._steps[(batch, greedy)] = self._step_binding(batch, greedy)
        self._run(binding)

    def forward(
        self, row: int, ids: Sequence[int], start: int, *, rows: int, output: str
    ) -> np.ndarray:
        """Run ``ids`` at positions ``start``.. on ``row``; ``output`` ("logits" or the argmax
        output) of the last ``rows`` of them: [rows, V] or [rows]."""
        self._rebind_if_moved()
        binding = self._forwards.get((row, output))
        if binding is None:
            binding = self._binding(row, row + 1, extra_row=True, output=output)
            self._forwards[(row, output)] = binding
        end = start + len(ids)
        binding.bind_cpu_input("input_ids", np.asarray(ids, np.int64)[None])  # [1, S]
        binding.bind_cpu_input("position_ids", np.arange(start, end, dtype=np.int64)[None])
        if self._io.logits_input:
            binding.bind_cpu_input(self._io.logits_input, np.array([rows], np.int64))
        self.slots.open(row, end)
        binding.bind_output(output)  # unallocated again: onnxruntime sizes it for this run
        self._run(binding)
        result: np.ndarray = binding.get_outputs()[0].numpy()[0]  # [R, V] or [R]
        return result[-rows:]

    def _rebind_if_moved(self) -> None:
        if self._generation != self.slots.generation:  # the buffers were reallocated
            self._steps.clear()
            self._forwards.clear()
            self._generation = self.slots.generation

    def _run(self, binding: Any) -> None:
        started = time.perf_counter()
        try:
            self._limit.call(lambda options: self._session.run_with_iobinding(binding, options))
        except RunTimeoutError:
            raise
        except Exception as exc:  # ORT raises its own pybind classes
            raise InferenceError(f"onnxruntime failed to run the decoder: {exc}") from exc
        self.seconds += time.perf_counter() - started

    def _binding(self, first: int, last: int, *, extra_row: bool, output: str | None = None) -> Any:
        """A binding over rows first..last-1 of the cache; ``output`` (a forward's, sized per
        run) bound first: output 0."""
        io, binding = self._io, self._session.io_binding()
        if output is not None:
            binding.bind_output(output)
        self.slots.bind(binding, slice(first, last))
        if io.logits_input:
            binding.bind_cpu_input(io.logits_input, self._one)
        if io.extra_row_input:  # a graph without it runs one sequence only (engine.py)
            binding.bind_cpu_input(io.extra_row_input, self._one if extra_row else self._zero)
        return binding

    def _step_binding(self, batch: int, greedy: bool) -> Any:
        import onnxruntime as ort

        binding = self._binding(0, batch, extra_row=False)
        binding.bind_cpu_input("input_ids", self.token[:batch])
        binding.bind_cpu_input("position_ids", self.position[:batch])
        argmax = self._io.argmax_output
        if argmax:
            best = ort.OrtValue.ortvalue_from_numpy(self.best[:batch])
            binding.bind_ortvalue_output(argmax, best)
        if not greedy or not argmax:
            logits = ort.OrtValue.ortvalue_from_numpy(self.logits[:batch])
            binding.bind_ortvalue_output("logits", logits)
        return binding
