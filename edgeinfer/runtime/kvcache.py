"""The KV cache: one buffer per layer for keys and one for values, allocated once for the
whole context and written in place by the graph.

The decoder graph's ``GroupQueryAttention`` appends the new keys/values at the current position
when its ``past`` input and ``present`` output are the same memory, so each buffer is bound as
both through IOBinding: no per-token concatenation, no copy of the cache, ever. On a CUDA or
TensorRT session the buffers live in GPU memory (``device="cuda"``), so decoding never moves
the cache between host and device either.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError, PackageError
from edgeinfer.package_io import DecoderIO

__all__ = ["KVCache", "device_for"]

# Providers whose kernels read and write CUDA device memory.
_CUDA_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})


def device_for(providers: list[str]) -> str:
    """``"cuda"`` when the session's first provider runs on an NVIDIA GPU, else ``"cpu"``."""
    return "cuda" if providers and providers[0] in _CUDA_PROVIDERS else "cpu"


class KVCache:
    """Preallocated keys and values for a batch of one sequence.

    Args:
        io: the package's decoder io (``num_kv_heads``, ``head_dim``, the past and present
            names).
        capacity: tokens the cache holds (prompt + generated), at most the context length.
        device: ``"cpu"`` (numpy-owned buffers) or ``"cuda"`` (buffers in GPU 0's memory).
    """

    def __init__(self, io: DecoderIO, *, capacity: int, device: str = "cpu") -> None:
        import onnxruntime as ort

        if io.kv_layout != "shared-buffer":
            raise PackageError(
                f"KV layout {io.kv_layout!r} is not supported by this runtime; "
                "re-export the package with this edgeinfer"
            )
        self.capacity = capacity
        self.past_names = io.past_names
        self.present_names = io.present_names
        shape = (1, io.num_kv_heads, capacity, io.head_dim)  # [1, H_kv, C, D]
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"KV cache device must be cpu or cuda, got {device!r}")
        self.device = device
        # On CPU the numpy arrays own the memory and the OrtValues are views of it (no copy);
        # on CUDA each zeroed array is copied to the device once and the OrtValue owns it.
        self._arrays = [np.zeros(shape, np.float32) for _ in range(2 * len(self.past_names))]
        self._values = [ort.OrtValue.ortvalue_from_numpy(a, device, 0) for a in self._arrays]
        if device == "cuda":
            self._arrays = []  # the host copies are not the cache: free them

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache (all layers, keys and values)."""
        return sum(int(np.prod(v.shape())) * 4 for v in self._values)  # float32

    def bind(self, binding: Any) -> None:
        """Bind every buffer as the past input and the present output of ``binding``."""
        pairs = zip(self.past_names, self.present_names, strict=True)
        for layer, (past, present) in enumerate(pairs):
            for kind in (0, 1):
                value = self._values[2 * layer + kind]
                binding.bind_ortvalue_input(past[kind], value)
                binding.bind_ortvalue_output(present[kind], value)

    def layer(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The key and value buffers [1, H_kv, C, D] of layer ``index`` (views on CPU, host
        copies on CUDA; for tests)."""
        return self._host(2 * index), self._host(2 * index + 1)

    def _host(self, i: int) -> np.ndarray:
        return self._arrays[i] if self.device == "cpu" else self._values[i].numpy()

    def read_prefix(self, length: int) -> np.ndarray:
        """A copy of positions 0..length-1: [2 * layers, H_kv, length, D], keys then values
        per layer (what the on-disk prefix store keeps)."""
        return np.stack([self._host(i)[0, :, :length] for i in range(len(self._values))])

    def write_prefix(self, kv: np.ndarray) -> None:
        """Write ``kv`` [2 * layers, H_kv, n, D] (from ``read_prefix``) into positions 0..n-1."""
        for i, rows in zip(range(len(self._values)), kv, strict=True):
            buffer = self._host(i)
            buffer[0, :, : rows.shape[1]] = rows
            if self.device == "cuda":
                self._values[i].update_inplace(buffer)  # one host-to-device copy per buffer
