"""A deployed package's check, bounded: load, warm-up and smoke cases in a child process
(``checker.py``) with a time limit and a memory limit, so that no package can hang or starve
the bridge.

A graph that never finishes (a ``Loop`` whose condition stays true) cannot be interrupted
inside onnxruntime's session creation or warm-up from another thread, so the check runs where
it can be killed: a child in its own process group, ``SIGKILL``ed when the time limit passes
or the bridge stops. Only a package whose check passed is then loaded in the bridge (the same
warm-up and smoke inputs the child just ran within the limit).

The memory limit is ``RLIMIT_DATA``, which the child sets on itself before reading the package:
it counts the heap and every private writable mapping (onnxruntime's arena grows with malloc),
but not address space merely reserved (``PROT_NONE``: glibc's per-thread arenas reserve 64 MiB
each) nor the read-only mapped weights, so the cap means "memory this check may dirty".
``RLIMIT_AS`` would count those reservations and fail healthy packages at a cap that means
little; a cgroup needs a delegated hierarchy most devices do not give a service. The child's
own baseline (Python, numpy, onnxruntime: ~95 MiB of data) counts toward the cap.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer import errors
from edgeinfer.bridge.models import batching_for
from edgeinfer.errors import BridgeError, CheckLimitError, PackageError

if TYPE_CHECKING:
    from edgeinfer.runtime.model import Model

__all__ = [
    "DEFAULT_CHECK_TIMEOUT_S",
    "MEMORY_SHARE",
    "BoundedCheck",
    "CheckLimits",
    "CheckReport",
    "LoadOptions",
    "available_bytes",
]

log = logging.getLogger(__name__)

# SmolLM2 int8 (the largest fast builtin) loads, warms up and passes its smoke check in ~3 s on
# a loaded 2-core x86: 120 s leaves a device 40 times slower; longer than that is a hang.
DEFAULT_CHECK_TIMEOUT_S = 120.0
# The new package is loaded beside the one serving until the swap: its check may take this
# share of the memory available then; the rest stays for the requests served meanwhile.
MEMORY_SHARE = 0.75
_MAX_RESULT_BYTES = 64 * 1024  # one JSON line of a few fields; more is not a result
_CHILD = "edgeinfer.bridge.ota.checker"
# Error classes a child's result may name that take just a message (any other: PackageError).
_BY_CODE: dict[str, type[errors.EdgeInferError]] = {
    cls.code: cls
    for cls in (
        errors.PackageError,
        errors.ManifestError,
        errors.IntegrityError,
        errors.ProviderError,
        errors.InferenceError,
        errors.ConfigError,
        errors.InputError,
    )
}


def available_bytes() -> int:
    """The memory this device has available now: ``MemAvailable``, or less where a cgroup
    limit leaves less beside this process (Linux; elsewhere 4 GiB is assumed)."""
    from edgeinfer.runtime import memory

    available = 4 << 30
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    limit = memory.limit_bytes()
    if limit is not None:
        available = min(available, max(0, limit - memory.anonymous_bytes()))
    return available


@dataclass(frozen=True)
class LoadOptions:
    """How the bridge loads a deployed package, so that its check loads it the same way (the
    same sessions, the same warm-up: a generate package's warm-up runs every slot at once).

    Args:
        threads: intra-op threads (``None``: onnxruntime's choice).
        generations: continuous-batching slots of a generate package whose graph batches
            (1: one generation at a time).
        kv_budget_bytes: the KV those slots may need together (``None``: no bound).
        file_backed_prepacks: as ``RuntimeConfig.file_backed_prepacks``.
        memory_budget_bytes: as ``RuntimeConfig.memory_budget_bytes``.
    """

    threads: int | None = None
    generations: int = 1
    kv_budget_bytes: int | None = None
    file_backed_prepacks: bool = False
    memory_budget_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The options as the check's child reads them."""
        return asdict(self)

    def load(self, package: Path) -> Model:
        """``edgeinfer.load`` of ``package`` with these options (verified, warmed up)."""
        import edgeinfer

        manifest = edgeinfer.Manifest.read(package)
        batching = batching_for(
            manifest, generations=self.generations, kv_budget_bytes=self.kv_budget_bytes
        )
        runtime = edgeinfer.RuntimeConfig(
            spin_wait=False,  # a check shares the cores with the requests served meanwhile
            file_backed_prepacks=self.file_backed_prepacks,
            memory_budget_bytes=self.memory_budget_bytes,
        )
        return edgeinfer.load(
            package, threads=self.threads, verify=True, config=runtime,
            continuous_batching=batching,
        )  # fmt: skip


@dataclass(frozen=True)
class CheckLimits:
    """The bounds of one check.

    Args:
        timeout_s: wall-clock seconds for load, warm-up and smoke cases together.
        memory_bytes: data memory the check may use; ``None``: ``MEMORY_SHARE`` of the memory
            available when it starts.
    """

    timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise errors.ConfigError(f"the check's timeout_s must be > 0, got {self.timeout_s}")
        if self.memory_bytes is not None and self.memory_bytes < 64 << 20:
            raise errors.ConfigError(
                f"the check's memory limit must be >= 64 MiB (Python alone needs that), "
                f"got {self.memory_bytes} bytes"
            )

    def tightened(self, timeout_s: float | None, memory_mb: int | None) -> CheckLimits:
        """These limits, lowered to a release's own (``Release.check_timeout_s``,
        ``check_memory_mb``) where it signs lower ones: a signer can tighten a device's
        limits, never lift them."""
        timeout = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        memory = self.memory_bytes
        if memory_mb is not None:
            memory_bytes = memory_mb << 20
            memory = memory_bytes if memory is None else min(memory, memory_bytes)
        return CheckLimits(timeout_s=timeout, memory_bytes=memory)

    def memory_now(self) -> int:
        """The memory cap of a check starting now."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        return max(64 << 20, int(available_bytes() * MEMORY_SHARE))


@dataclass(frozen=True)
class CheckReport:
    """What a check's child used (from ``wait4``): wall and CPU seconds, peak RSS."""

    wall_s: float
    cpu_s: float
    max_rss_bytes: int
    timeout_s: float
    memory_bytes: int

    def fields(self) -> dict[str, Any]:
        """The report as a status field."""
        return {
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "max_rss_mb": round(self.max_rss_bytes / 2**20, 1),
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_bytes >> 20,
        }


def _read_until(fd: int, deadline: float) -> bytes | None:
    """What the child writes to ``fd`` until it closes it, at most ``_MAX_RESULT_BYTES``;
    ``None`` when ``deadline`` passes first."""
    got = bytearray()
    while len(got) <= _MAX_RESULT_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:
            return bytes(got)
        got += data
    return bytes(got)


def _error(result: Mapping[str, Any], folder: Path, memory_bytes: int) -> errors.EdgeInferError:
    """The edgeinfer error a child's failed result stands for."""
    message = str(result.get("message", "no message"))
    if result.get("memory"):
        return CheckLimitError(
            "memory",
            f"{folder.name}: its check exceeded {memory_bytes >> 20} MiB ({message}); the "
            "package needs more memory than this device gives a check",
        )
    cls = _BY_CODE.get(str(result.get("code")), PackageError)
    return cls(f"{folder.name} fails its check: {message}")


class BoundedCheck:
    """Runs one check at a time in a child process; ``kill`` ends the one running now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._closed = False
        self.last: CheckReport | None = None  # the last check's usage, passed or not

    def run(
        self,
        folder: Path,
        limits: CheckLimits,
        *,
        load: LoadOptions | None = None,
        on_start: Callable[[int, int], None] = lambda pid, memory_bytes: None,
    ) -> CheckReport:
        """Load (with ``load``), warm up and smoke-check ``folder`` within ``limits``;
        ``on_start(pid, memory_bytes)`` once the child runs.

        Raises:
            CheckLimitError: it ran past the time limit, or an allocation past the memory cap
                failed it.
            PackageError (or the error class the child raised): the package failed its check,
                or crashed the check process.
            BridgeError: the bridge stopped during the check.
        """
        self.last = None
        memory_bytes = limits.memory_now()
        request = {
            "package": str(folder),
            "memory_bytes": memory_bytes,
            "parent_pid": os.getpid(),
            "load": (load or LoadOptions()).to_json(),
        }
        started = time.monotonic()
        with self._lock:
            if self._closed:
                raise BridgeError("the bridge is stopping: no check starts now")
            try:
                child = self._child = subprocess.Popen(
                    [sys.executable, "-m", _CHILD],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    start_new_session=True,  # its own process group: killed whole
                )
            except OSError as exc:  # no process could start (memory, a process limit)
                raise BridgeError(f"cannot start the check process: {exc}") from exc
        assert child.stdin is not None and child.stdout is not None  # both are pipes
        on_start(child.pid, memory_bytes)
        try:
            child.stdin.write(json.dumps(request).encode() + b"\n")
            child.stdin.close()
        except BrokenPipeError:  # it died at once; its exit status says how
            pass
        raw = _read_until(child.stdout.fileno(), started + limits.timeout_s)
        self._kill(child)  # done or not: nothing of it outlives the check
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        child.stdout.close()
        with self._lock:
            self._child = None
            stopped = self._closed
        report = CheckReport(
            wall_s=time.monotonic() - started,
            cpu_s=usage.ru_utime + usage.ru_stime,
            max_rss_bytes=usage.ru_maxrss * 1024,
            timeout_s=limits.timeout_s,
            memory_bytes=memory_bytes,
        )
        self.last = report
        log.info("check of %s: %s", folder.name, report.fields())
        if stopped:
            raise BridgeError(f"the bridge stopped during the check of {folder.name}")
        if raw is None:
            raise CheckLimitError(
                "time",
                f"{folder.name}: smoke check timed out after {limits.timeout_s:g} s (load, "
                "warm-up and smoke cases did not finish); the check was killed",
            )
        return self._outcome(raw, child.returncode, folder, report)

    def _outcome(self, raw: bytes, code: int, folder: Path, report: CheckReport) -> CheckReport:
        try:
            result = json.loads(raw)
        except ValueError:
            result = None
        if isinstance(result, dict) and result.get("ok") is True:
            return report
        if isinstance(result, dict):
            raise _error(result, folder, report.memory_bytes)
        how = f"died of {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        raise PackageError(
            f"{folder.name}: the check process {how} without a result (the package crashes "
            f"its loader, or needed more than the check's {report.memory_bytes >> 20} MiB)"
        )

    @staticmethod
    def _kill(child: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone already
            pass

    def kill(self) -> None:
        """End the check running now (its ``run`` raises ``BridgeError``) and refuse new
        ones: the bridge is stopping."""
        with self._lock:
            self._closed = True
            child = self._child
        if child is not None:
            self._kill(child)
