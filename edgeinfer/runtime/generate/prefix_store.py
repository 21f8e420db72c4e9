"""The on-disk prefix KV store: a prompt prefix's keys and values, kept across restarts.

One ``.npz`` file per prefix (``np.savez``, read back with ``allow_pickle=False``: no pickle
ever), named by a sha256 over the package digest, the KV geometry and dtype, and the prefix's
token ids. The file holds ``kv`` [2 * layers, H_kv, n, D] (the package's KV dtype), the ``ids``
and a JSON ``header`` repeating the fingerprint, checked again on load: a renamed or colliding
file is refused. The keys/values go into the graph's attention as they are, so each file also
carries an HMAC-SHA256 ``tag`` over header, ids and keys/values under the folder's device key
(``runtime.cache.integrity``, as the prepack cache): a file written by anyone without the key
(copied from another device, planted by another account) is refused and deleted. Writes go to
a temporary file first, then ``os.replace``: a reader sees a whole file or none. The zip's
CRC-32 catches a corrupted or truncated file; whatever cannot be read is logged, deleted and
recomputed by the caller: generation never fails because of the store (a cache key that is not
this user's private file is a ``ConfigError`` saying what to remove).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.package_io import DecoderIO
from edgeinfer.runtime.cache.integrity import CacheKey
from edgeinfer.runtime.generate.chat import Prompt, fill_message

__all__ = ["PrefixStore", "system_text"]

log = logging.getLogger(__name__)

_FORMAT = 2  # bump when the file layout changes: old files then miss instead of misreading
_PURPOSE = "prefix-kv"  # what a prefix file's tag is for (runtime.cache.integrity)
_SUFFIX = ".npz"


class PrefixStore:
    """Prefix keys/values of one package in a folder, bounded in bytes (oldest used evicted).

    Args:
        directory: the folder (created on the first save); several packages may share it.
        package_digest: ``Manifest.digest`` of the package the keys/values came from.
        io: the package's decoder io (``num_layers``, ``num_kv_heads``, ``head_dim``).
        max_bytes: the folder's size bound over all its prefix files.
    """

    def __init__(
        self, directory: Path, *, package_digest: str, io: DecoderIO, max_bytes: int
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._cache_key: CacheKey | None = None
        self._layers = io.num_layers
        self._heads = io.num_kv_heads
        self._head_dim = io.head_dim
        self._dtype = io.kv_dtype
        self._fingerprint = {
            "format": _FORMAT,
            "package": package_digest,
            "num_layers": self._layers,
            "num_kv_heads": self._heads,
            "head_dim": self._head_dim,
            "dtype": io.kv_dtype,
            "kv_layout": io.kv_layout,
        }

    def path(self, ids: Sequence[int]) -> Path:
        """The file that holds (or would hold) the keys/values of ``ids``."""
        digest = hashlib.sha256(json.dumps(self._fingerprint, sort_keys=True).encode())
        digest.update(np.asarray(ids, dtype="<i8").tobytes())
        return self.directory / f"prefix-{digest.hexdigest()[:40]}{_SUFFIX}"

    def load(self, ids: Sequence[int]) -> np.ndarray | None:
        """The keys/values [2 * layers, H_kv, n, D] of ``ids``, or None (absent or unusable:
        an unusable file is logged and deleted)."""
        path = self.path(ids)
        try:
            with np.load(path, allow_pickle=False) as data:
                raw_header = bytes(data["header"])
                header = json.loads(raw_header.decode())
                stored_ids = data["ids"]
                kv: np.ndarray = data["kv"]
                tag = bytes(data["tag"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            # ValueError covers JSON/unicode errors and a damaged .npy header too.
            self._discard(path, f"unreadable ({exc})")
            return None
        expected = (2 * self._layers, self._heads, len(ids), self._head_dim)
        if header != self._fingerprint or stored_ids.tolist() != list(ids):
            self._discard(path, "made for another package, geometry or prefix")
            return None
        if kv.shape != expected or kv.dtype != np.dtype(self._dtype):
            self._discard(path, f"holds {kv.dtype}{kv.shape}, expected {self._dtype}{expected}")
            return None
        if not self._key().verify(tag, _PURPOSE, *_parts(raw_header, stored_ids, kv)):
            self._discard(path, "not tagged by this device's cache key")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the eviction order is by last use
        return kv

    def save(self, ids: Sequence[int], kv: np.ndarray) -> None:
        """Store the keys/values [2 * layers, H_kv, n, D] of ``ids`` atomically, then evict
        the least recently used files past ``max_bytes``. A failure is logged, not raised."""
        if kv.nbytes > self.max_bytes:
            log.info(
                "prefix of %d tokens (%d bytes) exceeds max_bytes; not stored", len(ids), kv.nbytes
            )
            return
        path = self.path(ids)
        raw_header = json.dumps(self._fingerprint, sort_keys=True).encode()
        stored_ids, kv = np.asarray(ids, np.int64), np.ascontiguousarray(kv)
        tag = self._key().tag(_PURPOSE, *_parts(raw_header, stored_ids, kv))
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".prefix-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                np.savez(
                    f,
                    kv=kv,
                    ids=stored_ids,
                    header=np.frombuffer(raw_header, np.uint8),
                    tag=np.frombuffer(tag, np.uint8),
                )
            os.replace(tmp, path)
            tmp = None
            self._evict(keep=path)
        except OSError as exc:
            log.warning("cannot store the prefix KV in %s: %s", self.directory, exc)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _evict(self, *, keep: Path) -> None:
        """Delete the least recently used prefix files until the folder fits ``max_bytes``."""
        entries = []
        for path in self.directory.glob(f"prefix-*{_SUFFIX}"):
            with contextlib.suppress(OSError):  # another process may delete it meanwhile
                stat = path.stat()
                entries.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path != keep:
                with contextlib.suppress(OSError):
                    path.unlink()
                total -= size

    def _key(self) -> CacheKey:
        """The folder's device key (read, or made with the folder, on first use).

        Raises:
            ConfigError: the key file is not this user's private key (what to remove).
        """
        if self._cache_key is None:
            self._cache_key = CacheKey.of_folder(self.directory)
        return self._cache_key

    def _discard(self, path: Path, why: str) -> None:
        log.warning("prefix KV file %s is %s; deleting it, the prefix is recomputed", path, why)
        with contextlib.suppress(OSError):
            path.unlink()


def _parts(header: bytes, ids: np.ndarray, kv: np.ndarray) -> tuple[bytes, bytes, memoryview]:
    """What a prefix file's tag covers: its header, ids (little-endian int64) and keys/values
    (C order, as stored)."""
    return header, ids.astype("<i8").tobytes(), np.ascontiguousarray(kv).data.cast("B")


def system_text(chat_format: Mapping[str, Any] | None, prompt: Prompt) -> str | None:
    """The text of the chat template's start plus the system message (the prompt's own or the
    template's default) when ``prompt`` is a chat that has one: the prefix worth storing."""
    if isinstance(prompt, str) or not prompt or chat_format is None:
        return None
    if "jinja" in chat_format:  # no per-message pattern to cut the system part with
        return None
    system = prompt[0].get("content") if prompt[0].get("role") == "system" else None
    system = system if system is not None else chat_format.get("default_system")
    if not isinstance(system, str):
        return None
    return str(chat_format["prefix"]) + fill_message(str(chat_format["message"]), "system", system)
