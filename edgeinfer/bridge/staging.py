"""Where a deployed package is assembled: one staging folder, chunks written in place.

A package travels as numbered chunks: its files in name order, each cut every
``chunk_bytes`` (``chunk_plan``). The bridge writes each accepted chunk at its offset in
``ROOT/staging/`` and appends ``index sha256`` to ``ROOT/staging.log``; a deploy that stops
(either side disconnects, the bridge restarts) resumes with the chunks the log names whose
bytes still hash right. One staging folder at a time: a new deploy replaces it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.manifest import MANIFEST_NAME, FileEntry, check_member_name

__all__ = ["DEFAULT_CHUNK_BYTES", "ChunkRef", "Staging", "chunk_plan"]

# 256 KiB: far under any broker's message limit, few enough messages for a 100 MB package.
DEFAULT_CHUNK_BYTES = 256 * 1024


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
        plan = chunk_plan(files, chunk_bytes)
        meta = {
            "deploy_id": deploy_id,
            "chunk_bytes": chunk_bytes,
            "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        }
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
            (self.folder / "manifest.sig").write_text(json.dumps(dict(signature)))
            self._meta.write_text(json.dumps(meta))
            self._log.write_text("")
            self.received = set()
        self.deploy_id, self.plan = deploy_id, plan

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

    def write(self, ref: ChunkRef, data: bytes, digest: str) -> None:
        """Write an accepted chunk at its place and log it."""
        with self._path(ref.file).open("r+b") as f:
            f.seek(ref.offset)
            f.write(data)
        with self._log.open("a") as log:
            log.write(f"{ref.index} {digest}\n")
        self.received.add(ref.index)

    def missing(self) -> list[int]:
        """Indexes of the chunks not received yet."""
        return [ref.index for ref in self.plan if ref.index not in self.received]

    def discard(self) -> None:
        """Delete the staging folder and its records."""
        shutil.rmtree(self.folder, ignore_errors=True)
        for path in (self._log, self._meta):
            path.unlink(missing_ok=True)
        self.deploy_id, self.plan, self.received = None, [], set()
