"""The KV cache: one buffer per layer for keys and one for values, written in place by the
graph, sized to the request.

The decoder graph's ``GroupQueryAttention`` appends the new keys/values at the current position
when its ``past`` input and ``present`` output are the same memory, so each buffer is bound as
both through IOBinding: no per-token concatenation, no copy of the cache, ever. The buffers hold
what the requests need, not the package's whole context: a request that needs more grows them
once (to the next multiple of ``GROWTH_TOKENS``, the cached prefix copied over). The cache
also owns the ``attention_mask`` [1, capacity]: ones over the positions a run reads and writes,
zeros after them (the graph takes the valid length from its sum), so a decode step writes one
integer instead of binding a new mask. On a CUDA or
TensorRT session the buffers live in GPU memory (``device="cuda"``), so decoding never moves
the cache between host and device either. The element type is the package's (``kv_dtype``:
float32, or float16 for half the memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError, PackageError
from edgeinfer.package_io import DecoderIO

__all__ = ["GROWTH_TOKENS", "KV_DTYPES", "KVCache", "device_for"]

# Providers whose kernels read and write CUDA device memory.
_CUDA_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})
KV_DTYPES = {"float32": np.float32, "float16": np.float16}
# Buffers grow in steps of 256 tokens: a chat's turns grow them a few times at most, and 256
# tokens of SmolLM2-135M's fp32 KV are 11.8 MB.
GROWTH_TOKENS = 256


def device_for(providers: list[str]) -> str:
    """``"cuda"`` when the session's first provider runs on an NVIDIA GPU, else ``"cpu"``."""
    return "cuda" if providers and providers[0] in _CUDA_PROVIDERS else "cpu"


class KVCache:
    """Preallocated keys and values for a batch of one sequence.

    Args:
        io: the package's decoder io (``num_kv_heads``, ``head_dim``, ``kv_dtype``, the past and
            present names).
        capacity: tokens to allocate now (``None``: ``GROWTH_TOKENS``); ``ensure`` grows the
            buffers up to ``limit``.
        limit: the most tokens the cache may ever hold (the generator's context length);
            ``None``: ``capacity``.
        device: ``"cpu"`` (numpy-owned buffers) or ``"cuda"`` (buffers in GPU 0's memory).
    """

    def __init__(
        self,
        io: DecoderIO,
        *,
        capacity: int | None = None,
        limit: int | None = None,
        device: str = "cpu",
    ) -> None:
        if io.kv_layout != "shared-buffer":
            raise PackageError(
                f"KV layout {io.kv_layout!r} is not supported by this runtime; "
                "re-export the package with this edgeinfer"
            )
        if io.kv_dtype not in KV_DTYPES:
            raise PackageError(
                f"KV dtype {io.kv_dtype!r} is not supported by this runtime "
                f"({', '.join(KV_DTYPES)}); re-export the package with this edgeinfer"
            )
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"KV cache device must be cpu or cuda, got {device!r}")
        capacity = capacity or GROWTH_TOKENS
        self.limit = limit or capacity
        self.past_names = io.past_names
        self.present_names = io.present_names
        self.device = device
        self.dtype = np.dtype(KV_DTYPES[io.kv_dtype])
        self._head_shape = (io.num_kv_heads, io.head_dim)
        self._bindings: list[Any] = []
        # The token ids whose keys/values positions 0..n-1 hold: a prompt that starts with
        # them (a system prompt, a chat's earlier turns) is prefilled from position n.
        self.ids: list[int] = []
        self._values: list[Any] = []
        self._allocate(min(max(capacity, 1), self.limit))

    def _allocate(self, capacity: int, keep: int = 0) -> None:
        """Fresh buffers of ``capacity`` tokens holding the first ``keep`` positions of the old
        ones, bound wherever the old ones were."""
        import onnxruntime as ort

        heads, dim = self._head_shape
        shape = (1, heads, capacity, dim)  # [1, H_kv, C, D]
        old = [self._host(i)[:, :, :keep] for i in range(len(self._values))]
        # On CPU the numpy arrays own the memory and the OrtValues are views of it (no copy);
        # on CUDA each array is copied to the device once and the OrtValue owns it.
        arrays = [np.zeros(shape, self.dtype) for _ in range(2 * len(self.past_names))]
        for array, rows in zip(arrays, old, strict=False):
            array[:, :, :keep] = rows
        self.mask = np.zeros((1, capacity), np.int64)  # attention_mask: [1, C]
        self.mask[0, :keep] = 1
        self._mask_value = ort.OrtValue.ortvalue_from_numpy(self.mask)
        self._mask_slot = self.mask.data.cast("B").cast("q")
        self._open = keep  # positions whose mask is 1
        self.capacity = capacity
        self._values = [ort.OrtValue.ortvalue_from_numpy(a, self.device, 0) for a in arrays]
        self._arrays = arrays if self.device == "cpu" else []  # CUDA: the host copies go
        for binding in self._bindings:
            self._bind(binding)

    def ensure(self, tokens: int) -> None:
        """Make room for ``tokens`` positions; the positions of ``ids`` are kept and every
        binding follows the new buffers."""
        if tokens <= self.capacity:
            return
        if tokens > self.limit:
            raise ConfigError(f"the KV cache holds at most {self.limit} tokens, not {tokens}")
        grown = min(self.limit, -(-tokens // GROWTH_TOKENS) * GROWTH_TOKENS)
        self._allocate(grown, keep=len(self.ids))

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache (all layers, keys and values)."""
        return sum(int(np.prod(v.shape())) for v in self._values) * self.dtype.itemsize

    def bind(self, binding: Any) -> None:
        """Bind every buffer as the past input and the present output of ``binding``, now and
        after every growth."""
        self._bindings.append(binding)
        self._bind(binding)

    def reserve(self, end: int) -> None:
        """Let the next run read and write positions 0..end-1 (the mask's ones); the buffers
        keep one spare position (the decoder graph writes one past the last token)."""
        if end + 1 > self.capacity:
            self.ensure(end + 1)
        if end == self._open + 1:  # a decode step: one more position
            self._mask_slot[self._open] = 1
        elif end > self._open:
            self.mask[0, self._open : end] = 1
        elif end < self._open:
            self.mask[0, end : self._open] = 0
        self._open = end

    def _bind(self, binding: Any) -> None:
        binding.bind_ortvalue_input("attention_mask", self._mask_value)
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

    def write_prefix(self, kv: np.ndarray, ids: list[int]) -> None:
        """Write ``kv`` [2 * layers, H_kv, n, D] (from ``read_prefix``), the keys/values of
        ``ids``, into positions 0..n-1."""
        self.ids = []  # a failed write leaves the cache undefined
        self.ensure(kv.shape[2])
        for i, rows in zip(range(len(self._values)), kv, strict=True):
            buffer = self._host(i)
            buffer[0, :, : rows.shape[1]] = rows
            if self.device == "cuda":
                self._values[i].update_inplace(buffer)  # one host-to-device copy per buffer
        self.ids = list(ids)
