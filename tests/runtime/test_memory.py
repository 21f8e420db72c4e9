"""Dropping a mapped file's pages: resident memory goes down, the data stays readable, and a
page written through a private mapping is never dropped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.runtime import memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux smaps")


def _file_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def test_dropped_pages_leave_memory_and_come_back_on_read(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    data = np.arange(8 * 2**20, dtype=np.uint8)  # 8 MiB
    data.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="c")  # private, as onnxruntime maps weights
    assert int(mapped.sum(dtype=np.int64)) == int(data.sum(dtype=np.int64))  # every page read
    before = _file_rss_kb()
    assert memory.drop_file_pages(path) == 1
    assert before - _file_rss_kb() >= 6 * 1024  # most of the 8 MiB left this process
    np.testing.assert_array_equal(mapped[::4096], data[::4096])  # read back from the file
    mapped[0] = 7  # a private copy of the first page now: the mapping is no longer clean
    assert memory.drop_file_pages(path) == 0
    assert mapped[0] == 7


def _anon_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def test_release_heap_returns_freed_memory() -> None:
    blocks = [bytearray(4096) for _ in range(10_000)]  # 40 MB from malloc
    kept = blocks[::100]  # pinned through the heap: malloc cannot shrink it from the top
    del blocks
    before = _anon_rss_kb()
    memory.release_heap()
    assert before - _anon_rss_kb() >= 20 * 1024  # the freed pages between the kept blocks
    assert len(kept) == 100


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
