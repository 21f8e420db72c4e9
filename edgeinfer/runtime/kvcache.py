"""The KV cache: one buffer per layer for keys and one for values, allocated once for the
whole context and written in place by the graph.

The decoder graph's ``GroupQueryAttention`` appends the new keys/values at the current position
when its ``past`` input and ``present`` output are the same memory, so each buffer is bound as
both through IOBinding: no per-token concatenation, no copy of the cache, ever.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeinfer.errors import PackageError

__all__ = ["KVCache"]


class KVCache:
    """Preallocated keys and values for a batch of one sequence.

    Args:
        io: the manifest's ``io`` (``num_layers``, ``num_kv_heads``, ``head_dim``, the past and
            present names).
        capacity: tokens the cache holds (prompt + generated), at most the context length.
    """

    def __init__(self, io: dict[str, Any], *, capacity: int) -> None:
        import onnxruntime as ort

        if io.get("kv_layout") != "shared-buffer":
            raise PackageError(
                f"KV layout {io.get('kv_layout')!r} is not supported by this runtime; "
                "re-export the package with this edgeinfer"
            )
        self.capacity = capacity
        self.past_names: list[list[str]] = io["past_names"]
        self.present_names: list[list[str]] = io["present_names"]
        shape = (1, int(io["num_kv_heads"]), capacity, int(io["head_dim"]))  # [1, H_kv, C, D]
        # The numpy arrays own the memory; the OrtValues are views of it (no copy).
        self._arrays = [np.zeros(shape, np.float32) for _ in range(2 * len(self.past_names))]
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._arrays]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache (all layers, keys and values)."""
        return sum(a.nbytes for a in self._arrays)

    def bind(self, binding: Any) -> None:
        """Bind every buffer as the past input and the present output of ``binding``."""
        pairs = zip(self.past_names, self.present_names, strict=True)
        for layer, (past, present) in enumerate(pairs):
            for kind in (0, 1):
                value = self._values[2 * layer + kind]
                binding.bind_ortvalue_input(past[kind], value)
                binding.bind_ortvalue_output(present[kind], value)

    def layer(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The key and value buffers [1, H_kv, C, D] of layer ``index`` (views, for tests)."""
        return self._arrays[2 * index], self._arrays[2 * index + 1]
