"""How a bridge takes deploys (``DeployConfig``): where, trusting whom, checked how."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.bridge.models import ServedModel
from edgeinfer.bridge.ota.check import DEFAULT_CHECK_TIMEOUT_S, CheckLimits, LoadOptions
from edgeinfer.bridge.ota.signing import TrustedKeys

__all__ = ["DeployConfig", "default_smoke_check"]


def default_smoke_check(model: Any) -> None:
    """The package's own smoke check (inputs recorded at export with expected outputs)."""
    from edgeinfer.runtime import smoke

    smoke.check(model)


def _default_loader(path: Path) -> ServedModel:
    import edgeinfer

    return edgeinfer.load(path)


@dataclass(frozen=True)
class DeployConfig:
    """How a bridge takes deploys.

    Args:
        folder: where staging and deployed packages live (previous + active + staging only).
        trusted: the public keys (and revoked key ids) signatures are checked against.
        loader: loads and warms a package folder (default ``edgeinfer.load``).
        smoke_check: raises when a loaded package does not reproduce its recorded outputs.
        max_package_bytes: larger packages are refused at ``begin``.
        compatible: device classes this device belongs to (``sign --compatible``).
        check_timeout_s: wall-clock seconds a new package's check (load, warm-up, smoke
            cases, in a child process) may take; past it the check is killed and the deploy
            fails (``check_limit``). A release may sign a lower one.
        check_memory_bytes: data memory that check may use (``RLIMIT_DATA``); ``None``: 3/4
            of the memory available when it starts. A release may sign a lower one.
        check_load: how the check's child loads the package: as ``loader`` does (threads,
            a generate package's slots), so that it warms up the same way.
    """

    folder: Path
    trusted: TrustedKeys
    loader: Callable[[Path], ServedModel] = _default_loader
    smoke_check: Callable[[Any], None] = default_smoke_check
    max_package_bytes: int = 4 << 30
    compatible: tuple[str, ...] = ()
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    check_memory_bytes: int | None = None
    check_load: LoadOptions = field(default_factory=LoadOptions)

    def __post_init__(self) -> None:
        CheckLimits(timeout_s=self.check_timeout_s, memory_bytes=self.check_memory_bytes)

    @property
    def limits(self) -> CheckLimits:
        """The check's limits on this device."""
        return CheckLimits(timeout_s=self.check_timeout_s, memory_bytes=self.check_memory_bytes)
