"""Memory measured in a fresh interpreter: resident and anonymous bytes move with everything a
process holds, so a test that asserts them measures where no other test's garbage, threads or
allocator caches live (a pytest worker runs hundreds of tests before it).

``in_fresh_process(function, *args)`` runs a module-level ``function`` of a test module in a
new interpreter (multiprocessing's ``spawn``: nothing inherited but ``sys.path``) and returns
what it returns, its measurements; the test asserts on them. An exception in the child is
raised here with the child's traceback as its cause.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Result = TypeVar("Result")
# A child loads numpy, onnxruntime and a package before it measures: seconds; a hung one fails.
TIMEOUT_S = 300.0


def in_fresh_process(function: Callable[..., Result], /, *args: Any) -> Result:
    """``function(*args)`` run in a new interpreter; its return value (picklable)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result(timeout=TIMEOUT_S)


def status_kb(field: str) -> int:
    """This process's ``field`` of /proc/self/status (``RssAnon``, ``RssFile``, ``VmHWM``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")
