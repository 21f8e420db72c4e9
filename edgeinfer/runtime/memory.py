"""Keeping a loaded model's resident memory to what it uses (Linux; elsewhere these do nothing).

Two kinds of pages outlive their use when a generate package loads:

- freed heap: parsing the tokenizer's JSON and the graph's protobuf frees tens of MB that
  glibc's malloc keeps for reuse; ``release_heap`` hands them back to the kernel;
- mapped weights: onnxruntime maps a package's aligned external weights (``model.onnx.data``)
  and reads them whole to prepack them into its own layout. The originals it keeps afterwards
  (block scales, the embedding table it gathers rows from) are read again a row at a time at
  most, so ``drop_file_pages`` drops their pages once the session is built and marks them for
  random access: a row read later maps its own page from the page cache, not the 64 KiB the
  kernel maps around a fault by default.

A mapping is dropped only while it holds no page of its own (``Anonymous: 0`` in smaps: nothing
was ever written to it), so ``MADV_DONTNEED`` discards nothing but clean file pages.

What a memory limit leaves: ``limit_bytes`` reads the tightest cgroup limit this process runs
under (v2 ``memory.max`` of its group and those above; v1 ``hierarchical_memory_limit``), and
``anonymous_bytes`` what of this process the kernel can neither drop nor re-read (RssAnon: the
heap, KV caches, prepacks held in memory). File pages are left out: a limit evicts them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "Mapping",
    "anonymous_bytes",
    "drop_file_pages",
    "limit_bytes",
    "mappings",
    "release_heap",
]

_MADV_RANDOM = 1  # no read-around: a gathered row maps its own page, not 64 KiB around it
_MADV_DONTNEED = 4
_CGROUP = Path("/sys/fs/cgroup")
_UNLIMITED = 2**60  # cgroup v1 writes "no limit" as 2^63 rounded down to a page


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def release_heap() -> None:
    """Return the heap's free pages to the kernel (glibc's ``malloc_trim``)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:  # musl and other C libraries have none: nothing to return
        trim(0)


class Mapping(NamedTuple):
    """One mapping of this process's address space (a region of ``/proc/self/smaps``)."""

    start: int
    end: int
    path: str  # the mapped file's path; "" for anonymous memory
    private: bool
    file: tuple[int, int]  # the mapped file's (device, inode); (0, 0) for anonymous memory
    rss_bytes: int  # resident
    anonymous_bytes: int  # resident and private to this process: written, or never a file's


def mappings() -> list[Mapping]:
    """This process's mappings with their resident sizes; empty where there is no smaps."""
    found: list[Mapping] = []
    header: tuple[int, int, str, bool, tuple[int, int]] | None = None
    rss_kib = 0
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split(maxsplit=5)
                if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    name = fields[5].rstrip("\n") if len(fields) == 6 else ""
                    major, minor = (int(x, 16) for x in fields[3].split(":"))
                    file = (os.makedev(major, minor), int(fields[4]))
                    header = (start, end, name, fields[1].endswith("p"), file)
                elif header is not None and fields[0] == "Rss:":
                    rss_kib = int(fields[1])
                elif header is not None and fields[0] == "Anonymous:":
                    found.append(Mapping(*header, rss_kib * 1024, int(fields[1]) * 1024))
                    header = None
    except OSError:
        return []
    return found


def drop_file_pages(path: Path) -> int:
    """Drop the resident pages of this process's unwritten mappings of the file ``path``
    names (by its path, or by device and inode: the mapping may have been made through
    another name of it, a hard link since removed); returns the number of mappings dropped."""
    madvise = getattr(_libc(), "madvise", None)
    if madvise is None or not path.is_file():
        return 0
    found = path.stat()
    target, named = (found.st_dev, found.st_ino), os.path.realpath(path)
    ranges = [
        (m.start, m.end)
        for m in mappings()
        if (m.file == target or m.path == named) and m.private and m.anonymous_bytes == 0
    ]
    for start, end in ranges:
        for advice in (_MADV_RANDOM, _MADV_DONTNEED):
            madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice)
    return len(ranges)


def limit_bytes() -> int | None:
    """The tightest cgroup memory limit over this process's group and the groups above it;
    ``None`` when there is none (or this is not Linux)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # cgroup v2: memory.max of the group and every parent
            folder = _CGROUP / group.lstrip("/")
            while _CGROUP in folder.parents or folder == _CGROUP:
                found.append(_read_limit(folder / "memory.max"))
                if folder == _CGROUP:
                    break
                folder = folder.parent
        elif "memory" in controllers.split(","):  # v1: the kernel folds the parents in
            stat = _CGROUP / "memory" / group.lstrip("/") / "memory.stat"
            if not stat.is_file():  # a container sees its own group as the root
                stat = _CGROUP / "memory" / "memory.stat"
            found.append(_stat_value(stat, "hierarchical_memory_limit"))
    limits = [v for v in found if v is not None and v < _UNLIMITED]
    return min(limits) if limits else None


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" or not text.isdigit() else int(text)


def _stat_value(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def anonymous_bytes() -> int:
    """This process's anonymous resident memory (RssAnon); 0 where the kernel does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
