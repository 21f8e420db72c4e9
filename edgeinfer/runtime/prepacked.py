"""Prepacked weights in files (``RuntimeConfig(file_backed_prepacks=True)``).

At load, onnxruntime's CPU kernels copy each constant weight matrix into the layout they
compute with ("prepacking": ``MatMulNBits``' int8 blocks with their scales and block sums,
fp32 ``MatMul``'s packed panels). For SmolLM2-135M int8 that is ~170 MB of anonymous memory,
which the kernel can neither drop nor re-read: under a memory limit below it (a cgroup, a
small board) the process is killed. With this option the first load on a machine writes the
graph, optimized, with its prepacks into a cache folder (onnxruntime's
``session.save_external_prepacked_constant_initializers``), and every load maps that file: the
prepacks are clean file pages, which a memory limit evicts and re-reads, so a process under
pressure slows down instead of being killed.

A prepack's layout depends on the CPU's instruction set (onnxruntime's MLAS picks kernels by
AVX2 / AVX-512 / VNNI / AMX, NEON / dot product / i8mm) and on onnxruntime's version, so an
entry is keyed by both, and by the package (its manifest digest) and graph it was built from:
another CPU, another onnxruntime or another package never reads it; it builds its own. This is
why the prepacks are made on the device rather than at export: the export machine is rarely
the device, and a prepack made for one CPU must never run on another. A folder keeps the eight
most recently used entries; one that cannot be written (read-only or full disk) leaves the
package's own graph loading as without the option.

A cache cannot change what a verified package computes (docs/cache.md):

- the folder must be this user's and writable by no one else (a symbolic link to it is
  followed, and the folder it names is checked); else the package's own graph loads;
- an entry's record (``entry.json``: the package digest, graph, CPU and onnxruntime it was built
  for, every file's sha256 and size) carries an HMAC-SHA256 tag under the folder's device key
  (``runtime.cache.integrity``): a record written or changed by anyone without the key (another
  package's entry copied over this one's with its sha256 recomputed, a copy from another
  device) is refused, removed and built again, as is an entry that is a symbolic link;
- what onnxruntime maps is what was checked: the entry's files are hard-linked into a fresh
  private folder and checked there (a link, another user's file, a size other than the
  record's or, with ``RuntimeConfig.verify``, a sha256 other than the record's is refused),
  and the session loads from that folder, so a file renamed over the entry's between the check
  and the load is never read. The folder goes once the session is built (the mapping keeps
  the file). On a file system without hard links the files are checked and loaded in place.

Left open, said plainly: the same user can read the key and forge an entry, or write into an
entry's file (its own inode, read-only but its owner's) while a session maps it; that is the
trust the package folder itself is given. Without ``verify`` the files' sizes are checked, not
their content, as for the package's own files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgeinfer.config import RuntimeConfig, default_cache_dir
from edgeinfer.manifest import Manifest
from edgeinfer.runtime import memory
from edgeinfer.runtime.cache.integrity import NOFOLLOW, CacheKey, check_private_folder, is_own

__all__ = ["cpu_fingerprint", "graph_to_load"]

log = logging.getLogger(__name__)

_ENTRY = "entry.json"
_PURPOSE = "prepacked-entry"  # what an entry record's tag is for (runtime.cache.integrity)
# Tensors under this size stay inside the graph file (scales of tiny layers, shapes): a page
# of their own each would cost more than it saves.
_MIN_EXTERNAL_BYTES = 1024
_CPU = "CPUExecutionProvider"
# Entries kept per cache folder, the most recently used: a gateway's models and the versions a
# deploy swaps between, without letting every past version's copy fill the disk.
_KEEP_ENTRIES = 8
# A build or a load's link folder this old was left by a killed process (a build takes
# seconds to minutes, a load's links live while its session starts).
_STALE_S = 3600.0
_OPEN_FLAGS = os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
_CHUNK_BYTES = 2**20


class _Refused(Exception):
    """An entry that must not be loaded; the message says why."""


def cpu_fingerprint() -> str:
    """What a prepack's layout may depend on: the machine, and the CPU's feature flags
    (``flags`` on x86, ``Features`` on Arm, from ``/proc/cpuinfo``; the processor's name
    elsewhere)."""
    machine = platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return f"{machine}:{platform.processor()}"
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return f"{machine}:{' '.join(sorted(set(value.split())))}"
    return f"{machine}:{platform.processor()}"


@contextmanager
def graph_to_load(
    graph: Path, *, providers: list[str], config: RuntimeConfig, options: Callable[[], Any]
) -> Iterator[tuple[Path, Path]]:
    """While the session is built: the graph file to give onnxruntime, and the lasting name
    of that same file (the ``.data`` beside it is what the session maps).

    With ``config.file_backed_prepacks`` on the CPU provider alone, the cache's checked copy
    of ``graph`` with this CPU's prepacks (built on the first load, by a session with
    ``options()``, onnxruntime ``SessionOptions`` as the package's graph is loaded with);
    else, or when no copy can be built or used here, ``graph`` itself, twice."""
    found = None
    if config.file_backed_prepacks and providers == [_CPU]:
        root = config.prepack_cache_dir or default_cache_dir() / "prepacked"
        try:
            found = _pinned(graph, root, config=config, options=options)
        # OSError: a read-only or full disk; ConfigError: a folder others may write or a key
        # that cannot be trusted; onnxruntime raises its own classes when it cannot write.
        # Either way the package's own graph loads as it would without the option.
        except Exception as exc:
            log.warning(
                "cannot use prepacked weights in %s (%s): loading %s with its prepacks in "
                "anonymous memory; give RuntimeConfig(prepack_cache_dir=...) a writable folder "
                "of your own",
                root,
                exc,
                graph.name,
            )
    if found is None:
        yield graph, graph
        return
    entry, pin = found
    try:
        yield pin / graph.name, entry / graph.name
    finally:
        if pin != entry:
            shutil.rmtree(pin, ignore_errors=True)


def _pinned(
    graph: Path, root: Path, *, config: RuntimeConfig, options: Callable[[], Any]
) -> tuple[Path, Path]:
    """``graph``'s entry under ``root`` (built when missing or refused) and the folder that
    holds its checked files."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    root = root.resolve()
    check_private_folder(root)
    key = CacheKey.of_folder(root)
    identity = _identity(graph)
    name = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    entry = root / f"{graph.stem}-{name}"
    if os.path.lexists(entry):
        try:
            pin = _pin(entry, graph.name, identity, key, verify=config.verify)
        except _Refused as exc:
            log.warning("the prepacked copy %s cannot be used (%s): building it again", entry, exc)
            _remove(entry)
        else:
            os.utime(entry / _ENTRY)  # its last use: the least recently used entries go first
            return entry, pin
    _build(graph, entry, identity, key, options())
    _prune(root, keep=entry)
    try:
        return entry, _pin(entry, graph.name, identity, key, verify=config.verify)
    except _Refused as exc:
        raise OSError(f"the fresh build {entry} fails its own check: {exc}") from exc


def _identity(graph: Path) -> dict[str, str]:
    """What an entry is built for: the package (its manifest digest) and which of its
    graphs, this CPU, this onnxruntime."""
    import onnxruntime as ort

    return {
        "package": Manifest.read(graph.parent).digest,
        "graph": graph.name,
        "onnxruntime": ort.__version__,
        "cpu": cpu_fingerprint(),
    }


def _canonical(identity: Any, files: Any) -> bytes:
    """The bytes an entry record's tag covers."""
    body = {"identity": identity, "files": files}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _pin(entry: Path, graph: str, identity: dict[str, str], key: CacheKey, *, verify: bool) -> Path:
    """A fresh private folder holding hard links of ``entry``'s files, each checked against
    the entry's authenticated record (``entry`` itself where links cannot be made).

    Raises:
        _Refused: the entry is not a whole, intact build of ``graph`` for ``identity`` tagged
            with ``key``.
    """
    files = _record(entry, graph, identity, key)
    pin = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".load-{entry.name}-"))
    try:
        held = pin if _link(entry, pin, files) else entry
        for name, want in files.items():
            _check_file(held / name, want, verify=verify)
    except BaseException:
        shutil.rmtree(pin, ignore_errors=True)
        raise
    if held == entry:
        shutil.rmtree(pin, ignore_errors=True)
    return held


def _record(
    entry: Path, graph: str, identity: dict[str, str], key: CacheKey
) -> dict[str, dict[str, Any]]:
    """The files ``entry``'s record lists, once its tag, identity and names are right."""
    if entry.is_symlink() or not entry.is_dir():
        raise _Refused("it is a link or not a folder")
    try:
        recorded = json.loads((entry / _ENTRY).read_text(encoding="utf-8"))
        tag = bytes.fromhex(recorded["tag"])
        files, found = recorded["files"], recorded["identity"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _Refused(f"its record: {exc!r}") from exc
    if not key.verify(tag, _PURPOSE, _canonical(found, files)):
        raise _Refused("its record was not written here: its tag does not match this folder's key")
    if found != identity:
        raise _Refused("its record is for another package, graph, CPU or onnxruntime")
    if not isinstance(files, dict) or graph not in files:
        raise _Refused("its record lists no graph")
    for name, want in files.items():
        if "/" in name or name in ("", ".", "..") or not isinstance(want, dict):
            raise _Refused(f"its record lists {name!r}")
    return files


def _link(entry: Path, pin: Path, names: Any) -> bool:
    """Hard-link each of ``names`` from ``entry`` into ``pin`` (a link as the link itself);
    False when this file system cannot (the files are then checked and loaded in place)."""
    for name in names:
        try:
            os.link(entry / name, pin / name, follow_symlinks=False)
        except OSError as exc:
            log.debug("cannot hard-link %s (%s): checking it in place", entry / name, exc)
            return False
    return True


def _check_file(path: Path, want: dict[str, Any], *, verify: bool) -> None:
    """Refuse ``path`` unless it is a regular file of this user with the recorded size (and,
    with ``verify``, sha256), read through the one descriptor that is checked."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:  # missing, or a symbolic link (ELOOP)
        raise _Refused(f"{path.name}: {exc.strerror}") from exc
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or not is_own(found):
            raise _Refused(f"{path.name} is not a regular file of this user")
        if found.st_size != want.get("bytes"):
            raise _Refused(
                f"{path.name} holds {found.st_size} bytes, its record {want.get('bytes')}"
            )
        if verify and _sha256_fd(fd) != want.get("sha256"):
            raise _Refused(f"{path.name}'s sha256 differs from its record's")
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> str:
    """The hex sha256 of the open file ``fd`` from its start."""
    digest = hashlib.sha256()
    with open(fd, "rb", closefd=False) as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _build(graph: Path, entry: Path, identity: dict[str, str], key: CacheKey, so: Any) -> None:
    """Load ``graph`` once with onnxruntime writing the optimized graph and its prepacks into
    a fresh folder, make the files read-only, record their sha256 with the record's tag, then
    move the folder to ``entry`` (atomically: a process that loads meanwhile never sees half a
    build)."""
    import onnxruntime as ort

    build = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}-"))
    try:
        so.enable_profiling = False  # a build is not a request
        so.optimized_model_filepath = str(build / graph.name)
        for option, value in (
            ("session.optimized_model_external_initializers_file_name", f"{graph.name}.data"),
            (
                "session.optimized_model_external_initializers_min_size_in_bytes",
                str(_MIN_EXTERNAL_BYTES),
            ),
            ("session.save_external_prepacked_constant_initializers", "1"),
        ):
            so.add_session_config_entry(option, value)
        log.info("writing %s's prepacked weights for this CPU to %s", graph.name, entry)
        ort.InferenceSession(str(graph), sess_options=so, providers=[_CPU])  # saves as it loads
        memory.release_heap()  # that session's anonymous prepacks, freed
        files: dict[str, dict[str, Any]] = {}
        for path in sorted(build.iterdir()):
            path.chmod(0o444)  # a stray write fails; the owner may still chmod (module doc)
            with path.open("rb") as f:
                files[path.name] = {"sha256": _sha256_fd(f.fileno()), "bytes": path.stat().st_size}
        tag = key.tag(_PURPOSE, _canonical(identity, files))
        record = {"identity": identity, "files": files, "tag": tag.hex()}
        (build / _ENTRY).write_text(json.dumps(record, indent=2), encoding="utf-8")
        try:
            os.rename(build, entry)
        except OSError:
            if not (entry / _ENTRY).is_file():  # not another process's finished build
                raise
            shutil.rmtree(build, ignore_errors=True)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise


def _remove(entry: Path) -> None:
    """Remove an entry: a link as a link (never what it names), a folder with its files."""
    if entry.is_symlink() or not entry.is_dir():
        entry.unlink(missing_ok=True)
    else:
        shutil.rmtree(entry, ignore_errors=True)


def _prune(root: Path, *, keep: Path) -> None:
    """Remove all but the ``_KEEP_ENTRIES`` most recently used entries under ``root`` (never
    ``keep``), and what killed processes left (builds and link folders older than
    ``_STALE_S``). A process that still maps a removed entry's files keeps reading them (the
    kernel frees them when it unmaps); a later load of that graph builds it again."""
    entries: list[tuple[float, Path]] = []
    now = time.time()
    for path in root.iterdir():
        if path.is_symlink() or not path.is_dir() or path == keep:
            continue
        stale = path.name.startswith(".")
        used_s = _mtime_s(path if stale else path / _ENTRY)
        if used_s is None:  # removed meanwhile, or not an entry
            continue
        if not stale:
            entries.append((used_s, path))
        elif now - used_s > _STALE_S:
            shutil.rmtree(path, ignore_errors=True)
    entries.sort(reverse=True)
    for _, old in entries[_KEEP_ENTRIES - 1 :]:
        _remove(old)


def _mtime_s(path: Path) -> float | None:
    """When ``path`` last changed, or None when it is gone."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None
