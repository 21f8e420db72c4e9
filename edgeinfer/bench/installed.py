"""What the runtime costs on disk: the installed distributions a requirement pulls in, and
their sizes as the installer recorded them (``edgeinfer inspect --footprint``, the aarch64
check). Stdlib only: it reads installed metadata, imports nothing it measures."""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RUNTIME_REQUIREMENT",
    "DistributionSize",
    "distribution_sizes",
    "loaded_distributions",
    "requirement_closure",
]

# What a device installs for the runtime on CPU: the core dependencies plus the `cpu` extra.
RUNTIME_REQUIREMENT = "edgeinfer[cpu]"
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")
# Imported by `site` at start-up through .pth files (setuptools', virtualenv's), not by the runtime.
_STARTUP_HOOKS = frozenset({"_distutils_hack", "_virtualenv"})


@dataclass(frozen=True)
class DistributionSize:
    """One installed distribution: its files as recorded at install time, summed."""

    name: str
    version: str
    bytes: int
    files: int


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _index(path: Sequence[str] | None) -> dict[str, metadata.Distribution]:
    """Installed distributions by normalized name; the first on the path wins, as for imports."""
    found: dict[str, metadata.Distribution] = {}
    search = list(path) if path is not None else sys.path
    for dist in metadata.distributions(path=search):
        name = dist.metadata["Name"]
        if name:  # a half-removed distribution can leave metadata without a name
            found.setdefault(_normalize(name), dist)
    return found


def distribution_sizes(
    names: Iterable[str], *, path: Sequence[str] | None = None
) -> list[DistributionSize]:
    """The installed size of each named distribution found on ``path`` (default: ``sys.path``).

    The size is the sum of the files the installer recorded (RECORD: code, libraries,
    compiled bytecode, metadata). Names not installed there are left out.
    """
    index = _index(path)
    sizes = []
    for name in dict.fromkeys(_normalize(n) for n in names):
        dist = index.get(name)
        if dist is None:
            continue
        files = [p for f in dist.files or () if (p := Path(str(dist.locate_file(f)))).is_file()]
        total = sum(p.stat().st_size for p in files)
        sizes.append(DistributionSize(dist.metadata["Name"], dist.version, total, len(files)))
    return sorted(sizes, key=lambda d: d.bytes, reverse=True)


def requirement_closure(
    requirement: str = RUNTIME_REQUIREMENT, *, path: Sequence[str] | None = None
) -> list[str]:
    """The installed distributions that ``requirement`` pulls in, itself included.

    Follows ``Requires-Dist`` through the requested extras. Environment markers other than
    ``extra`` are not evaluated: a requirement whose distribution is not installed is skipped,
    which is what its marker decided when it was installed.
    """
    index = _index(path)
    order: list[str] = []
    pending = [requirement]
    seen: dict[str, set[str]] = {}
    while pending:
        match = _REQUIREMENT.match(pending.pop())
        if match is None:
            continue
        name = _normalize(match.group(1))
        extras = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
        if name not in index or (name in seen and extras <= seen[name]):
            continue
        if name not in seen:
            order.append(name)
        seen[name] = seen.get(name, set()) | extras
        for line in index[name].requires or ():
            spec, _, marker = line.partition(";")
            wanted = set(_EXTRA_MARKER.findall(marker))
            if not wanted or wanted & seen[name]:
                pending.append(spec)
    return order


def loaded_distributions() -> list[str]:
    """The distributions whose top-level modules this process has imported (no stdlib)."""
    tops = {name.partition(".")[0] for name in list(sys.modules)}
    tops -= set(sys.stdlib_module_names) | set(sys.builtin_module_names) | _STARTUP_HOOKS
    owners = metadata.packages_distributions()
    return sorted({dist for top in tops for dist in owners.get(top, ())})
