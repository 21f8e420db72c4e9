"""Dropping a mapped file's pages: resident memory goes down, the data stays readable, and a
page written through a private mapping is never dropped. Each measured in a fresh process
(tests/isolated.py): what another test freed or kept would move the counts."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from isolated import in_fresh_process, status_kb

from edgeinfer.runtime import memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux smaps")


def _drop_mapped_pages(path: Path) -> dict[str, Any]:
    """In a fresh process: map 8 MiB of ``path`` privately, read it all, drop its pages."""
    data = np.arange(8 * 2**20, dtype=np.uint8)  # 8 MiB
    data.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="c")  # private, as onnxruntime maps weights
    read_back = int(mapped.sum(dtype=np.int64)) == int(data.sum(dtype=np.int64))  # every page
    before = status_kb("RssFile")
    dropped = memory.drop_file_pages(path)
    after = status_kb("RssFile")
    intact = bool(np.array_equal(mapped[::4096], data[::4096]))  # read back from the file
    mapped[0] = 7  # a private copy of the first page now: the mapping is no longer clean
    return {
        "read": read_back,
        "dropped": dropped,
        "freed_kb": before - after,
        "intact": intact,
        "dirty_dropped": memory.drop_file_pages(path),
        "kept": int(mapped[0]),
    }


def test_dropped_pages_leave_memory_and_come_back_on_read(tmp_path: Path) -> None:
    got = in_fresh_process(_drop_mapped_pages, tmp_path / "weights.bin")
    assert got["read"] and got["dropped"] == 1
    assert got["freed_kb"] >= 6 * 1024  # most of the 8 MiB left the process
    assert got["intact"]
    assert got["dirty_dropped"] == 0 and got["kept"] == 7


def _release_heap() -> tuple[int, int]:
    """In a fresh process: anonymous KiB freed by ``release_heap`` after 40 MB of small blocks
    are freed but every hundredth is kept; and how many were kept."""
    blocks = [bytearray(4096) for _ in range(10_000)]  # 40 MB from malloc
    kept = blocks[::100]  # pinned through the heap: malloc cannot shrink it from the top
    del blocks
    before = status_kb("RssAnon")
    memory.release_heap()
    return before - status_kb("RssAnon"), len(kept)


def test_release_heap_returns_freed_memory() -> None:
    freed_kb, kept = in_fresh_process(_release_heap)
    assert freed_kb >= 20 * 1024  # the freed pages between the kept blocks
    assert kept == 100


def test_a_mapping_made_through_a_removed_hard_link_is_dropped_by_the_other_name(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "weights.bin"
    np.arange(4 * 2**20, dtype=np.uint8).tofile(kept)
    (tmp_path / "private").mkdir()
    link = tmp_path / "private" / "weights.bin"
    os.link(kept, link)  # as runtime.prepacked hands onnxruntime a checked link
    mapped = np.memmap(link, dtype=np.uint8, mode="c")
    assert int(mapped[::4096].sum(dtype=np.int64)) >= 0  # pages read
    link.unlink()
    assert memory.drop_file_pages(kept) == 1
