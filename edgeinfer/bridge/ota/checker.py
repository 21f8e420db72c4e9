"""The child process of a deploy's bounded check: ``python -m edgeinfer.bridge.ota.checker``.

It reads one JSON request line on stdin, ``{"package", "memory_bytes", "parent_pid", "load"}``
(``load``: ``LoadOptions``, how the bridge will load it), and
before anything of the package is read: caps its own data memory (``RLIMIT_DATA``, see
``check.py`` for why not ``RLIMIT_AS``), asks the kernel to kill it when the bridge dies
(Linux ``PR_SET_PDEATHSIG``), and lowers its priority below the requests the old package
serves meanwhile. Then it loads the package as ``edgeinfer.load`` does (every file's sha256
verified, sessions started and warmed up as the bridge will; a decoder's tokenizer,
SentencePiece included, parsed here too) and runs its smoke cases (when it has them). It
writes one JSON line to the stdout it was started with (the libraries' prints go to stderr)::

    {"ok": true, "load_ms": float, "smoke_ms": float}
    {"ok": false, "code": <an EdgeInferError code>, "message": str, "memory": bool}

``memory`` says the failure was an allocation the cap refused. The parent (``check.py``) kills
the process group when the time limit passes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

MAX_REQUEST_BYTES = 64 * 1024  # a path and two numbers
# A check yields the cores to the requests the old package keeps serving (0 normal, 19 least).
CHECK_NICENESS = 10
_PR_SET_PDEATHSIG = 1
# What onnxruntime, numpy and the C++ tokenizers say when an allocation is refused.
_ALLOCATION_WORDS = ("bad_alloc", "bad allocation", "failed to allocate", "cannot allocate")


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when the bridge's deploy thread ends (a SIGKILLed bridge
    leaves no check running); elsewhere the parent's timeout is the only bound."""
    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name:
        ctypes.CDLL(name, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the bridge died before the request above took effect
        os._exit(1)


def _out_of_memory(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MemoryError) or any(
            word in str(seen).lower() for word in _ALLOCATION_WORDS
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _check(package: Path, options: dict[str, Any]) -> dict[str, Any]:
    from edgeinfer.bridge.ota.check import LoadOptions
    from edgeinfer.runtime import smoke

    started = time.perf_counter()
    model = LoadOptions(**options).load(package)
    loaded = time.perf_counter()
    if model.manifest.smoke and model.manifest.smoke.get("cases"):
        smoke.check(model)
    done = time.perf_counter()
    return {"ok": True, "load_ms": (loaded - started) * 1e3, "smoke_ms": (done - loaded) * 1e3}


def _failure(exc: BaseException) -> dict[str, Any]:
    from edgeinfer.errors import EdgeInferError

    code = exc.code if isinstance(exc, EdgeInferError) else "package"
    message = str(exc) if isinstance(exc, EdgeInferError) else f"{type(exc).__name__}: {exc}"
    return {"ok": False, "code": code, "message": message, "memory": _out_of_memory(exc)}


def main() -> int:
    """Run one check as the request on stdin says; the result goes to the original stdout."""
    result_fd = os.dup(1)
    os.dup2(2, 1)  # a library's print cannot corrupt the result line
    request = json.loads(sys.stdin.readline(MAX_REQUEST_BYTES))
    _die_with_parent(int(request["parent_pid"]))
    memory = request.get("memory_bytes")
    if memory is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (int(memory), int(memory)))
    os.nice(CHECK_NICENESS)
    try:
        result = _check(Path(request["package"]), dict(request.get("load") or {}))
    except Exception as exc:  # every failure is the package's: report it, typed
        result = _failure(exc)
    with os.fdopen(result_fd, "w") as out:
        out.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
