"""The exact result cache: keys, and the two tiers put together.

Key: sha256 over a format tag, the package digest, the task, every output-changing parameter
and the normalized input (token ids for text; dtype, shape and raw bytes for any array). Only
deterministic requests may be cached; embed and classify always are.

An in-memory LRU in front of an optional SQLite file (``stores.py``); values are encoded for
disk by the task's ``Codec`` (``runtime/tasks.py``). The cache never fails inference: a store
error is logged and read as a miss.

A row of the SQLite file is served only if it was written on this device: its value carries an
HMAC-SHA256 tag under the cache folder's device key (``integrity.py``) over the row's key
(itself the digest of this package, task, parameters and input) and the encoded value, so a
row written by anyone without the key (another account, a file copied from another device,
another package's answer under this input's key) is a miss, and is deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from edgeinfer.config import CacheConfig
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import TextEncoderIO
from edgeinfer.runtime.cache.integrity import TAG_BYTES, CacheKey
from edgeinfer.runtime.cache.stores import (
    MemoryStore,
    SqliteStore,
)
from edgeinfer.runtime.tasks import ClassificationCodec, Codec, EmbeddingCodec

__all__ = ["ResultCache", "array_key_bytes"]

log = logging.getLogger(__name__)

V = TypeVar("V")
# Bump when the encoding of stored values changes: old entries then simply never match.
# v2: a value on disk starts with its tag.
KEY_FORMAT = b"edgeinfer-result-v2"
_PURPOSE = "result"  # what a row's tag is for (integrity.py)
# Token ids are hashed as little-endian int64 whatever integer type the graph takes.
_TOKEN_DTYPE = np.dtype("<i8")


def array_key_bytes(array: np.ndarray) -> bytes:
    """The normalized bytes of an input array: dtype, shape and little-endian contents."""
    normal = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    header = f"{normal.dtype.str}:{normal.shape}:".encode()
    return header + normal.tobytes()


class ResultCache(Generic[V]):
    """The exact cache of one package and task: memory LRU, then (optionally) SQLite.

    Args:
        digest: the package digest (``Manifest.digest``).
        task: ``embed`` or ``classify``.
        params: every parameter that changes the output, beyond the input itself.
        codec: the task's value encoding.
        config: capacities, TTL, and whether and where to persist.
    """

    def __init__(
        self,
        *,
        digest: str,
        task: str,
        params: Mapping[str, object],
        codec: Codec[V],
        config: CacheConfig,
    ) -> None:
        prefix = hashlib.sha256(KEY_FORMAT)
        prefix.update(json.dumps([digest, task, sorted(params.items())], default=str).encode())
        self._prefix = prefix
        self._codec = codec
        self.memory: MemoryStore[V] = MemoryStore(
            capacity_bytes=config.memory_bytes, ttl_s=config.ttl_s
        )
        self.disk: SqliteStore | None = None
        if config.persist:
            path = config.db_path(digest)
            try:
                self._tags = CacheKey.of_folder(path.parent)
            except (ConfigError, OSError) as exc:  # a key that cannot be trusted, or made
                log.warning("result cache: %s; running without the SQLite file", exc)
            else:
                self.disk = SqliteStore(path, capacity_bytes=config.disk_bytes, ttl_s=config.ttl_s)

    @classmethod
    def for_package(cls, manifest: Manifest, *, config: CacheConfig) -> ResultCache[Any]:
        """The cache of an ``embed`` or ``classify`` package, with the task's codec and the
        output-changing parameters that live in the manifest rather than in the files."""
        codec: Codec[Any]
        if manifest.task == "embed":
            codec = EmbeddingCodec()
        elif manifest.task == "classify":
            codec = ClassificationCodec()
        else:
            raise ConfigError(f"no result cache for {manifest.task!r} packages yet")
        io = manifest.io
        params: dict[str, Any] = (
            {"normalize": io.normalize, "pooling": io.pooling}
            if isinstance(io, TextEncoderIO)
            else {}
        )
        return ResultCache[Any](
            digest=manifest.digest, task=manifest.task, params=params, codec=codec, config=config
        )

    def key(self, token_ids: np.ndarray) -> bytes:
        """The 32-byte key of one text, from its token ids [S] (any integer dtype)."""
        h = self._prefix.copy()
        # The length is implied by the byte count: no header needed for 1-D ids.
        h.update(token_ids.astype(_TOKEN_DTYPE, copy=False).tobytes())
        return h.digest()

    def tensor_key(self, array: np.ndarray) -> bytes:
        """The 32-byte key of a tensor input: its dtype, shape and raw bytes."""
        h = self._prefix.copy()
        h.update(b"tensor:" + array_key_bytes(array))
        return h.digest()

    def get(self, key: bytes) -> tuple[V, str] | None:
        """``(value, tier)`` with tier ``memory`` or ``disk``, or ``None`` on a miss."""
        found = self.memory.get(key)
        if found is not None:
            return found[0], "memory"
        if self.disk is None:
            return None
        stored = self.disk.get(key)
        if stored is None:
            return None
        tag, encoded = stored[0][:TAG_BYTES], stored[0][TAG_BYTES:]
        if not self._tags.verify(tag, _PURPOSE, key, encoded):
            log.warning(
                "result cache %s: a row not written with this device's key was deleted",
                self.disk.path,
            )
            self.disk.delete(key)
            return None
        try:
            value = self._codec.decode(encoded)
        except (ValueError, KeyError, TypeError) as exc:  # a damaged row of ours: a miss
            log.warning("result cache: undecodable entry ignored: %s", exc)
            return None
        self.memory.put_many([(key, value, len(encoded))], stored_s=stored[1])
        return value, "disk"

    def put_many(self, items: Sequence[tuple[bytes, V]]) -> None:
        """Store freshly computed values in both tiers."""
        now = time.time()
        encoded = [(key, value, self._codec.encode(value)) for key, value in items]
        self.memory.put_many([(k, v, len(e)) for k, v, e in encoded], stored_s=now)
        if self.disk is not None:
            tagged = [(k, self._tags.tag(_PURPOSE, k, e) + e) for k, _, e in encoded]
            self.disk.put_many([(k, t, len(t)) for k, t in tagged], stored_s=now)

    def clear(self) -> None:
        """Empty both tiers."""
        self.memory.clear()
        if self.disk is not None:
            self.disk.clear()

    def close(self) -> None:
        """Close the SQLite file."""
        if self.disk is not None:
            self.disk.close()
