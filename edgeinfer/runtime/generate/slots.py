"""The KV cache of several sequences decoded together: per layer one key and one value buffer
[rows, H_kv, C, D], row ``r`` one sequence's cache, plus the attention mask [rows, C].

A batched decode step of ``B`` sequences binds the first ``B`` rows of every buffer (a
contiguous view, no copy) as the graph's past *and* present, as ``kvcache.KVCache`` does for
one sequence; the prefill of one sequence binds its row alone. So the occupied rows are kept
at the front: when a sequence leaves, the ones after it move up (their used positions copied).

Memory per sequence is what it uses. Each buffer is anonymous ``mmap`` memory: the kernel
gives a page only when a run writes it, a row's pages are handed back (``madvise``
``MADV_DONTNEED``) when its sequence leaves, so an idle slot costs nothing and a sequence of
``n`` tokens holds ``n`` positions' pages, not the capacity ``C``. A released row may instead
keep what it holds (``release(row, keep=ids)``): a one-slot engine's next prompt that starts
with those ids is prefilled from where they end, as a chat's next turn or a shared system
prompt is. ``C`` (the same for every row)
grows in steps of ``kvcache.GROWTH_TOKENS`` when a request needs more, as one sequence's cache
does; attention's work grows with ``C``, so it starts small.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.package_io import DecoderIO
from edgeinfer.runtime.generate.kvcache import GROWTH_TOKENS, KV_DTYPES

__all__ = ["SlotCache"]


class SlotCache:
    """Preallocated keys and values for up to ``rows`` sequences (CPU memory).

    Args:
        io: the package's decoder io.
        rows: sequences at most.
        limit: the most positions one row may ever hold (context length + the spare one).
    """

    def __init__(self, io: DecoderIO, *, rows: int, limit: int) -> None:
        self.io = io
        self.rows = rows
        self.limit = limit
        self.dtype = np.dtype(KV_DTYPES[io.kv_dtype])
        self.bytes_per_token = (
            2 * io.num_layers * io.num_kv_heads * io.head_dim * self.dtype.itemsize
        )
        self.lengths = [0] * rows  # positions in use per row (the mask's ones)
        self._kept: list[list[int]] = [[] for _ in range(rows)]  # a released row's ids
        self.generation = 0  # bumped on every reallocation: bindings over old buffers are stale
        self._maps: list[mmap.mmap] = []
        self.buffers: list[np.ndarray] = []
        self._allocate(min(GROWTH_TOKENS, limit))

    def _allocate(self, capacity: int) -> None:
        """Fresh buffers of ``capacity`` positions, every row's used positions copied over."""
        heads, dim = self.io.num_kv_heads, self.io.head_dim
        shape = (self.rows, heads, capacity, dim)
        size = int(np.prod(shape)) * self.dtype.itemsize
        # Private: MADV_DONTNEED then frees the pages (a shared mapping would keep them).
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        maps = [mmap.mmap(-1, size, flags=flags) for _ in range(2 * self.io.num_layers)]
        buffers = [np.frombuffer(m, self.dtype).reshape(shape) for m in maps]
        for new, old in zip(buffers, self.buffers, strict=False):
            for row, used in enumerate(self.lengths):
                held = max(used, len(self._kept[row]))
                if held:
                    new[row, :, :held] = old[row, :, :held]
        mask = np.zeros((self.rows, capacity), np.int64)
        for row, used in enumerate(self.lengths):
            mask[row, :used] = 1
        # The old maps are unmapped when the last view of them goes (the engine's bindings
        # over them are rebuilt: ``generation``).
        self._maps, self.buffers, self.mask = maps, buffers, mask
        self.capacity = capacity
        self.generation += 1

    @property
    def nbytes(self) -> int:
        """Bytes of KV the rows in use hold (the pages they wrote)."""
        return sum(self.lengths) * self.bytes_per_token

    def ensure(self, positions: int) -> None:
        """Room for ``positions`` in every row (grows all buffers, keeping what rows hold)."""
        if positions <= self.capacity:
            return
        if positions > self.limit:
            raise ConfigError(f"a sequence holds at most {self.limit} positions, not {positions}")
        self._allocate(min(self.limit, -(-positions // GROWTH_TOKENS) * GROWTH_TOKENS))

    def views(self, rows: slice) -> tuple[list[np.ndarray], np.ndarray]:
        """The buffers and the mask of ``rows`` (contiguous views: bind them, never copies)."""
        return [b[rows] for b in self.buffers], self.mask[rows]

    def bind(self, binding: Any, rows: slice) -> None:
        """Bind ``rows`` of every buffer as past and present of ``binding``, and their mask."""
        import onnxruntime as ort

        buffers, mask = self.views(rows)
        binding.bind_ortvalue_input("attention_mask", ort.OrtValue.ortvalue_from_numpy(mask))
        pairs = zip(self.io.past_names, self.io.present_names, strict=True)
        for layer, (past, present) in enumerate(pairs):
            for kind in (0, 1):
                value = ort.OrtValue.ortvalue_from_numpy(buffers[2 * layer + kind])
                binding.bind_ortvalue_input(past[kind], value)
                binding.bind_ortvalue_output(present[kind], value)

    def open(self, row: int, end: int) -> None:
        """Let the next run of ``row`` read and write positions 0..end-1."""
        used = self.lengths[row]
        if end > used:
            self.mask[row, used:end] = 1
        else:
            self.mask[row, end:used] = 0
        self.lengths[row] = end

    def move(self, source: int, target: int) -> None:
        """Copy row ``source``'s used positions and mask into row ``target`` (a lower row)."""
        used = self.lengths[source]
        self._kept[target] = []
        for buffer in self.buffers:
            buffer[target, :, :used] = buffer[source, :, :used]
        self.open(target, 0)
        self.open(target, used)

    def take(self, row: int, ids: Sequence[int] = ()) -> int:
        """Forget the ids whose keys/values ``row`` kept at its release; how many first ids of
        ``ids`` they were (a new sequence starts on it: it reuses those, overwrites the rest)."""
        kept, self._kept[row] = self._kept[row], []
        pairs = zip(kept, ids, strict=False)
        return next(
            (i for i, (held, new) in enumerate(pairs) if held != new), min(len(kept), len(ids))
        )

    def write(self, row: int, kv: np.ndarray) -> None:
        """Put ``kv`` [2 * layers, H_kv, n, D] (``read``'s layout) into positions 0..n-1 of
        ``row`` (the buffers hold them: ``ensure`` first)."""
        for buffer, rows in zip(self.buffers, kv, strict=True):
            buffer[row, :, : rows.shape[1]] = rows

    def read(self, row: int, length: int) -> np.ndarray:
        """A copy of positions 0..length-1 of ``row``: [2 * layers, H_kv, length, D], keys
        then values per layer (what the on-disk prefix store keeps)."""
        return np.stack([buffer[row, :, :length] for buffer in self.buffers])

    def release(self, row: int, *, keep: list[int] | None = None) -> None:
        """Forget ``row``: its mask cleared, its pages handed back to the kernel; ``keep``:
        the ids whose keys/values its first positions hold stay there instead (``take``)."""
        self.open(row, 0)
        self._kept[row] = keep or []
        if keep:
            return
        row_bytes = self.buffers[0][0].nbytes
        start, end = row * row_bytes, (row + 1) * row_bytes
        start = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the row only
        end = end // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            for m in self._maps:
                m.madvise(mmap.MADV_DONTNEED, start, end - start)
