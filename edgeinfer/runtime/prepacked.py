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
entry is keyed by both, and by the graph's and its weights' sha256: another CPU, another
onnxruntime or another package never reads it; it builds its own. This is why the prepacks are
made on the device rather than at export: the export machine is rarely the device, and a prepack
made for one CPU must never run on another. Each entry lists its files' sha256, checked before
onnxruntime reads them (with ``RuntimeConfig.verify``); a damaged or half-written entry is
rebuilt, and one that cannot be written (read-only or full disk) leaves the package's own graph
loading as without the option. A folder keeps the eight most recently used entries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer.config import RuntimeConfig, default_cache_dir
from edgeinfer.manifest import Manifest, sha256_file
from edgeinfer.runtime import memory

__all__ = ["cpu_fingerprint", "graph_to_load"]

log = logging.getLogger(__name__)

_ENTRY = "entry.json"
# Tensors under this size stay inside the graph file (scales of tiny layers, shapes): a page
# of their own each would cost more than it saves.
_MIN_EXTERNAL_BYTES = 1024
_CPU = "CPUExecutionProvider"
# Entries kept per cache folder, the most recently used: a gateway's models and the versions a
# deploy swaps between, without letting every past version's copy fill the disk.
_KEEP_ENTRIES = 8


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


def graph_to_load(
    graph: Path, *, providers: list[str], config: RuntimeConfig, options: Callable[[], Any]
) -> Path:
    """The graph file to give onnxruntime: with ``config.file_backed_prepacks`` on the CPU
    provider alone, the cache's copy of ``graph`` with this CPU's prepacks (built on the first
    load, by a session with ``options()``, onnxruntime ``SessionOptions`` as the package's
    graph is loaded with); else, or when no copy can be built here, ``graph`` itself."""
    if not config.file_backed_prepacks or providers != [_CPU]:
        return graph
    import onnxruntime as ort

    root = config.prepack_cache_dir or default_cache_dir() / "prepacked"
    identity = {
        "graph": _package_digests(graph),
        "onnxruntime": ort.__version__,
        "cpu": cpu_fingerprint(),
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    entry = root / f"{graph.stem}-{key}"
    if _usable(entry, graph.name, identity, verify=config.verify):
        os.utime(entry / _ENTRY)  # its last use: the least recently used entries go first
        return entry / graph.name
    try:
        root.mkdir(parents=True, exist_ok=True)
        _build(graph, entry, identity, options())
        _prune(root, keep=entry)
    # OSError: a read-only or full disk; onnxruntime raises its own classes when it cannot
    # write. Either way the package's own graph loads as it would without the option.
    except Exception as exc:
        log.warning(
            "cannot write prepacked weights to %s (%s): loading %s with its prepacks in "
            "anonymous memory; give RuntimeConfig(prepack_cache_dir=...) a writable folder",
            root,
            exc,
            graph.name,
        )
        return graph
    return entry / graph.name


def _package_digests(graph: Path) -> dict[str, str]:
    """The sha256 the package's manifest gives the graph and its external data."""
    files = Manifest.read(graph.parent).files
    names = [graph.name, f"{graph.name}.data"]
    return {name: files[name].sha256 for name in names if name in files}


def _usable(entry: Path, graph: str, identity: dict[str, Any], *, verify: bool) -> bool:
    """Whether ``entry`` is a whole build of ``graph`` for ``identity`` whose files are intact;
    any other entry there (damaged, half removed, a record of another shape) is removed, to be
    built again."""
    if not entry.exists():
        return False
    damage = _damage(entry, graph, identity, verify=verify)
    if damage is None:
        return True
    log.warning("the prepacked copy %s is damaged (%s): building it again", entry, damage)
    shutil.rmtree(entry, ignore_errors=True)
    return False


def _damage(entry: Path, graph: str, identity: dict[str, Any], *, verify: bool) -> str | None:
    """What is wrong with ``entry``'s record or files, or None."""
    try:
        recorded = json.loads((entry / _ENTRY).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"its record: {exc}"
    files = recorded.get("files") if isinstance(recorded, dict) else None
    if not isinstance(files, dict) or graph not in files:
        return "its record lists no files"
    if recorded.get("identity") != identity:
        return "its record is for another graph, CPU or onnxruntime"
    for name, want in files.items():
        path = entry / name
        if not (isinstance(want, dict) and "/" not in name and path.is_file()):
            return str(name)
        if path.stat().st_size != want.get("bytes") or (
            verify and sha256_file(path) != want.get("sha256")
        ):
            return str(name)
    return None


def _build(graph: Path, entry: Path, identity: dict[str, Any], so: Any) -> None:
    """Load ``graph`` once with onnxruntime writing the optimized graph and its prepacks into
    a fresh folder, record the files' sha256, then move the folder to ``entry`` (atomically:
    a process that loads meanwhile never sees half a build)."""
    import onnxruntime as ort

    build = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}-"))
    try:
        so.enable_profiling = False  # a build is not a request
        so.optimized_model_filepath = str(build / graph.name)
        for key, value in (
            ("session.optimized_model_external_initializers_file_name", f"{graph.name}.data"),
            (
                "session.optimized_model_external_initializers_min_size_in_bytes",
                str(_MIN_EXTERNAL_BYTES),
            ),
            ("session.save_external_prepacked_constant_initializers", "1"),
        ):
            so.add_session_config_entry(key, value)
        log.info("writing %s's prepacked weights for this CPU to %s", graph.name, entry)
        ort.InferenceSession(str(graph), sess_options=so, providers=[_CPU])  # saves as it loads
        memory.release_heap()  # that session's anonymous prepacks, freed
        files = {
            path.name: {"sha256": sha256_file(path), "bytes": path.stat().st_size}
            for path in sorted(build.iterdir())
        }
        record = {"identity": identity, "files": files}
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


def _prune(root: Path, *, keep: Path) -> None:
    """Remove all but the ``_KEEP_ENTRIES`` most recently used entries under ``root`` (never
    ``keep``). A process that still maps a removed entry's files keeps reading them (the
    kernel frees them when it unmaps); a later load of that graph builds it again."""
    entries = [e for e in root.iterdir() if (e / _ENTRY).is_file() and e != keep]
    entries.sort(key=lambda e: (e / _ENTRY).stat().st_mtime_ns, reverse=True)
    for old in entries[_KEEP_ENTRIES - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
