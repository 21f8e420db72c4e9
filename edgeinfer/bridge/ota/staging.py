"""Where a deployed package is assembled: one staging folder, chunks written in place.

A package travels as numbered chunks: its files in name order, each cut every
``chunk_bytes`` (``chunk_plan``). The bridge writes each accepted chunk at its offset in
``ROOT/staging/`` and appends ``index sha256`` to ``ROOT/staging.log``, once per index (a chunk
already verified is ignored when it comes again, so the log holds at most one line per
planned chunk); a deploy that stops (either side disconnects, the bridge restarts) resumes
with the chunks the log names whose bytes still hash right. Nothing outside the plan is
written: a chunk past the last index or longer than its place is refused. One staging folder
at a time: a new deploy replaces it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.bridge.ota.release import SIGNATURE_NAME
from edgeinfer.errors import ConfigError, DeployRefusedError, IntegrityError
from edgeinfer.manifest import MANIFEST_NAME, FileEntry, check_member_name

__all__ = [
    "CHUNK_ENVELOPE_BYTES",
    "DEFAULT_CHUNK_BYTES",
    "MAX_CHUNK_BYTES",
    "MAX_CONTROL_BYTES",
    "MIN_CHUNK_BYTES",
    "ChunkRef",
    "Staging",
    "chunk_plan",
]

# 256 KiB: far under any broker's message limit, few enough messages for a 100 MB package.
DEFAULT_CHUNK_BYTES = 256 * 1024
MIN_CHUNK_BYTES = 1024
MAX_CHUNK_BYTES = 16 << 20  # what a device buffers for one chunk message at most
# 256 KiB: a begin carries manifest.json (28 KB for MiniLM with its smoke outputs) and the
# signature; a control message 10x that is not one.
MAX_CONTROL_BYTES = 256 * 1024
# A chunk message's fields besides its data and file name (op, ids, index, offset, sha256,
# nonce: ~200 bytes in MsgPack), with room to spare.
CHUNK_ENVELOPE_BYTES = 1024


@dataclass(frozen=True)
class ChunkRef:
    """Chunk ``index``: ``size`` bytes of package file ``file`` at ``offset``."""

    index: int
    file: str
    offset: int
    size: int


def chunk_plan(files: Mapping[str, FileEntry], chunk_bytes: int) -> list[ChunkRef]:
    """Every chunk of a package, in order (files by name, each from offset 0)."""
    plan: list[ChunkRef] = []
    for name in sorted(files):
        size = files[name].bytes
        for offset in range(0, size, chunk_bytes):
            plan.append(ChunkRef(len(plan), name, offset, min(chunk_bytes, size - offset)))
    return plan


class Staging:
    """The staging folder of the deploy in progress (at most one) under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / "staging"
        self._log = root / "staging.log"
        self._meta = root / "staging.json"
        self.deploy_id: str | None = None
        self.plan: list[ChunkRef] = []
        self.received: set[int] = set()
        self.max_message_bytes = CHUNK_ENVELOPE_BYTES  # no deploy open: no chunk fits
        self._open: dict[str, Any] = {}

    def open(
        self,
        deploy_id: str,
        *,
        manifest_bytes: bytes,
        signature: Mapping[str, Any],
        files: Mapping[str, FileEntry],
        chunk_bytes: int,
    ) -> None:
        """Start (or resume, when the same deploy was staged before) assembling a package."""
        if not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
            raise ConfigError(f"chunk_bytes must be in {MIN_CHUNK_BYTES} .. {MAX_CHUNK_BYTES}")
        meta = {
            "deploy_id": deploy_id,
            "chunk_bytes": chunk_bytes,
            "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        }
        if meta == self._open:  # a re-sent begin of the deploy under way: nothing to redo
            return
        plan = chunk_plan(files, chunk_bytes)
        if self._same(meta):
            self.received = self._verified_log(plan)
        else:
            self.discard()
            self.folder.mkdir(parents=True)
            for name, entry in files.items():
                path = self._path(name)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("wb") as f:
                    f.truncate(entry.bytes)  # sparse until its chunks come
            (self.folder / MANIFEST_NAME).write_bytes(manifest_bytes)
            (self.folder / SIGNATURE_NAME).write_text(json.dumps(dict(signature)))
            self._meta.write_text(json.dumps(meta))
            self._log.write_text("")
            self.received = set()
        self.deploy_id, self.plan, self._open = deploy_id, plan, meta
        longest_name = max((len(name.encode()) for name in files), default=0)
        self.max_message_bytes = chunk_bytes + longest_name + CHUNK_ENVELOPE_BYTES

    def _same(self, meta: Mapping[str, Any]) -> bool:
        try:
            return bool(json.loads(self._meta.read_text()) == meta and self.folder.is_dir())
        except (OSError, ValueError):
            return False

    def _path(self, name: str) -> Path:
        return self.folder / check_member_name(name)

    def _verified_log(self, plan: list[ChunkRef]) -> set[int]:
        """The chunks the log names whose bytes on disk still have the logged sha256."""
        good: set[int] = set()
        for line in self._log.read_text().splitlines():
            index_text, _, digest = line.partition(" ")
            if not index_text.isdigit() or int(index_text) >= len(plan):
                continue
            ref = plan[int(index_text)]
            with self._path(ref.file).open("rb") as f:
                f.seek(ref.offset)
                if hashlib.sha256(f.read(ref.size)).hexdigest() == digest:
                    good.add(ref.index)
        return good

    def take(self, message: Mapping[str, Any]) -> bool:
        """Write a chunk message's data at its place and log it; ``False`` when that chunk
        was already verified (nothing written or logged).

        Raises:
            DeployRefusedError: ``not_receiving`` (another deploy) or ``too_large`` (an index
                past the plan, more bytes than its place holds).
            IntegrityError: its sha256 or place does not match (send it again).
        """
        index, data = message.get("index"), message.get("data")
        if self.deploy_id is None or message.get("deploy_id") != self.deploy_id:
            raise DeployRefusedError(
                "not_receiving",
                f"chunk for deploy {message.get('deploy_id')!r}, which is not "
                "being received; send 'begin' first",
            )
        if not isinstance(index, int) or not isinstance(data, bytes):
            raise ConfigError("a chunk needs an int 'index' and bytes 'data'")
        if not 0 <= index < len(self.plan) or len(data) > self.plan[index].size:
            raise DeployRefusedError(
                "too_large", f"chunk {index} ({len(data)} bytes) is outside the signed package"
            )
        ref = self.plan[index]
        if index in self.received:
            return False
        digest = hashlib.sha256(data).hexdigest()
        where = (message.get("file"), message.get("offset"), len(data))
        if where != (ref.file, ref.offset, ref.size) or digest != message.get("sha256"):
            raise IntegrityError(
                f"chunk {index} refused: its sha256 or place does not match; send it again"
            )
        self._write(ref, data, digest)
        return True

    def _write(self, ref: ChunkRef, data: bytes, digest: str) -> None:
        with self._path(ref.file).open("r+b") as f:
            f.seek(ref.offset)
            f.write(data)
        with self._log.open("a") as log:
            log.write(f"{ref.index} {digest}\n")
        self.received.add(ref.index)

    def remove_unresumable(self) -> None:
        """At a start: delete a staging folder that no deploy can resume (its records are
        missing or unreadable: an ``open`` cut short), or records without their folder."""
        try:
            meta = json.loads(self._meta.read_text())
            resumable = isinstance(meta, dict) and self._log.is_file() and self.folder.is_dir()
        except (OSError, ValueError):
            resumable = False
        if not resumable:
            self.discard()

    def missing(self) -> list[int]:
        """Indexes of the chunks not received yet."""
        return [ref.index for ref in self.plan if ref.index not in self.received]

    def discard(self) -> None:
        """Delete the staging folder and its records."""
        shutil.rmtree(self.folder, ignore_errors=True)
        for path in (self._log, self._meta):
            path.unlink(missing_ok=True)
        self.deploy_id, self.plan, self.received, self._open = None, [], set(), {}
        self.max_message_bytes = CHUNK_ENVELOPE_BYTES
