"""What a signature binds a package to (a *release*), and signed rollback orders.

``edgeinfer sign PKG --key K --device-id plc7`` writes ``PKG/manifest.sig``: a ``release``
statement (``signing.py``) that names, besides the sha256 of the exact ``manifest.json`` bytes
(which list every file's sha256)::

    {"manifest_sha256", "name": served as, "version": monotonic int, "target": the manifest's,
     "devices": [ids] | [], "compatible": class | null, "total_bytes": sum of file bytes,
     "signed_ms", "expires_ms", "check_timeout_s"?: float, "check_memory_mb"?: int,
     "trial"?: {threshold: number}}

The optional check limits (left out when not signed, so devices that predate them take the
release) lower the device's own for this package's check (``check.py``), never raise them.
A release with ``trial`` (``{}``: its kind's defaults) is served in a trial window after the
swap and commits only when it passes (``trial.py``, ``trial_policy.py``).

A device takes a release only when it names the device (or its ``--compatible`` class), the
name it is deployed as, a target its providers run, a version above every one it accepted
for that name, and has not expired. A rollback is a signed order too: device(s), name, the
digest or version to go back to, a nonce, when it was issued and when it expires.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from edgeinfer import providers
from edgeinfer.bridge.ota.signing import Signer, TrustedKeys
from edgeinfer.bridge.ota.trial_policy import policy_for
from edgeinfer.config import QuantConfig
from edgeinfer.errors import ConfigError, DeployRefusedError, EdgeInferError, IntegrityError
from edgeinfer.manifest import MANIFEST_NAME, Manifest

__all__ = [
    "DEFAULT_EXPIRES_IN_DAYS",
    "SIGNATURE_NAME",
    "Release",
    "RollbackOrder",
    "package_signer",
    "read_signature",
    "sign_package",
    "sign_rollback",
    "signed_manifest",
    "target_runs_here",
]

SIGNATURE_NAME: Final = "manifest.sig"
# 30 days: a staged rollout reaches devices that connect weekly, and a release captured
# from the broker (or signed and never sent) is useless a month later.
DEFAULT_EXPIRES_IN_DAYS: Final = 30.0
# 15 minutes: a rollback is sent at once and answered in seconds; a captured one held back
# goes stale before anyone could use it against a later deploy.
DEFAULT_ROLLBACK_EXPIRES_S: Final = 900.0
_DAY_MS = 86_400_000
_OPTIONAL = ("check_timeout_s", "check_memory_mb", "trial")  # release fields signed only when given


def _positive_or_none(*values: Any) -> bool:
    return all(v is None or (isinstance(v, (int, float)) and v > 0) for v in values)


def _trial_ok(trial: Any) -> bool:
    """Whether a signed ``trial`` is thresholds a trial takes (``trial_policy``)."""
    if trial is None:
        return True
    if not isinstance(trial, Mapping):
        return False
    try:
        policy_for("", trial)
    except (ConfigError, TypeError):
        return False
    return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def target_runs_here(target: str, have: Iterable[str]) -> bool:
    """Whether a package built for ``target`` runs with the providers ``have`` (ORT names):
    ``cpu-*`` always; ``npu-*``/``gpu-*`` only with one of the preset's accelerators."""
    try:
        preset = QuantConfig.for_target(target)
    except ConfigError:
        return False
    accelerators = {providers.to_ort_name(p) for p in preset.providers} - {providers.CPU}
    return not accelerators or bool(accelerators & set(have))


def _audience(devices: Sequence[str], compatible: str | None) -> None:
    if not devices and not compatible:
        raise ConfigError(
            "say which devices may take it: --device-id ID (repeatable) or --compatible CLASS "
            "(the bridge's serve --compatible)"
        )


def _for_here(
    what: str,
    devices: Sequence[str],
    compatible: str | None,
    expires_ms: int,
    device_id: str,
    classes: Iterable[str],
) -> None:
    """Refuse a signed statement that has expired or names neither this device nor a class
    it belongs to."""
    if _now_ms() > expires_ms:
        raise DeployRefusedError("expired", f"{what} expired; sign a new one")
    if device_id not in devices and compatible not in set(classes):
        raise DeployRefusedError(
            "wrong_device",
            f"{what} is signed for devices {list(devices)} / class {compatible!r}, "
            f"not {device_id!r}",
        )


@dataclass(frozen=True)
class Release:
    """The signed metadata of a package (see the module docstring)."""

    manifest_sha256: str
    name: str
    version: int
    target: str
    devices: tuple[str, ...]
    compatible: str | None
    total_bytes: int
    signed_ms: int
    expires_ms: int
    check_timeout_s: float | None = None
    check_memory_mb: int | None = None
    trial: Mapping[str, Any] | None = None

    @property
    def release_id(self) -> str:
        """Names this release on disk and in statuses: ``<manifest sha256[:16]>-v<version>``."""
        return f"{self.manifest_sha256[:16]}-v{self.version}"

    def body(self) -> dict[str, Any]:
        """The statement body that is signed."""
        body = {**asdict(self), "devices": list(self.devices)}
        return {k: v for k, v in body.items() if not (k in _OPTIONAL and v is None)}

    @classmethod
    def verified(
        cls, manifest_bytes: bytes, record: Any, trusted: TrustedKeys
    ) -> tuple[Release, str]:
        """The release ``record`` signs for ``manifest_bytes``, and its signer.

        Raises:
            DeployRefusedError: ``unsigned`` (no release metadata: signed before edgeinfer
                had it), ``untrusted``, ``revoked`` or ``bad_signature``.
        """
        body = record.get("release") if isinstance(record, Mapping) else None
        if not isinstance(body, Mapping):
            raise DeployRefusedError(
                "unsigned",
                "the package's signature has no release metadata (version, devices, name); "
                "sign it again: edgeinfer sign PKG --key KEY --device-id ID",
            )
        signer = trusted.verify("release", body, record)
        try:
            release = cls(**{**body, "devices": tuple(str(d) for d in body["devices"])})
            ok = isinstance(release.version, int) and isinstance(release.total_bytes, int)
            ok = ok and _positive_or_none(release.check_timeout_s, release.check_memory_mb)
            ok = ok and _trial_ok(release.trial)
        except (TypeError, KeyError) as exc:
            raise DeployRefusedError("bad_signature", f"malformed release metadata: {exc}") from exc
        if not ok or release.manifest_sha256 != hashlib.sha256(manifest_bytes).hexdigest():
            raise DeployRefusedError(
                "bad_signature", "the signature is for another manifest.json; sign it again"
            )
        return release, signer

    def check(
        self,
        *,
        device_id: str,
        compatible: Iterable[str],
        name: str,
        manifest: Manifest,
        max_bytes: int,
    ) -> None:
        """Refuse (``DeployRefusedError``) a release that is not for this device and name,
        has expired, was built for hardware this device lacks, or is larger than signed or
        than ``max_bytes``."""
        what = f"release {self.release_id}"
        _for_here(what, self.devices, self.compatible, self.expires_ms, device_id, compatible)
        if name != self.name:
            raise DeployRefusedError(
                "wrong_name",
                f"release {self.release_id} is signed to serve as {self.name!r}, not {name!r}",
            )
        have = providers.available()
        if self.target != manifest.target or not target_runs_here(self.target, have):
            raise DeployRefusedError(
                "wrong_target",
                f"the package is built for {manifest.target!r}; this device has none of its "
                f"accelerators (it has {sorted(have)})",
            )
        total = sum(e.bytes for e in manifest.files.values())
        if total > min(self.total_bytes, max_bytes):
            raise DeployRefusedError(
                "too_large",
                f"the package has {total} bytes: {self.total_bytes} are signed, this device "
                f"takes at most {max_bytes}",
            )


def signed_manifest(manifest_bytes: bytes) -> Manifest:
    """The manifest of a verified release's bytes, parsed with the manifest's size and depth
    bounds (``ManifestError``: not a manifest)."""
    return Manifest.parse(manifest_bytes, source="the signed manifest")


def read_signature(package: Path) -> dict[str, Any] | None:
    """``package/manifest.sig`` as a dict, or ``None`` when the package is not signed."""
    path = Path(package) / SIGNATURE_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{path} is not a readable signature: {exc}") from exc
    if not isinstance(data, dict):
        raise IntegrityError(f"{path} is not a signature record")
    return data


def package_signer(package: Path, trusted: TrustedKeys) -> tuple[str | None, int | None]:
    """Who signed a package served from the command line and its release version, when a
    trusted key did (a signature made before release metadata names the signer only)."""
    try:
        record = read_signature(package)
        manifest_bytes = (Path(package) / MANIFEST_NAME).read_bytes()
        if record is None:
            return None, None
        if "release" not in record:
            return trusted.verify_raw(manifest_bytes, record), None
        release, signer = Release.verified(manifest_bytes, record, trusted)
    except (EdgeInferError, OSError):
        return None, None
    return signer, release.version


def sign_package(
    package: Path,
    key: Path,
    *,
    devices: Sequence[str] = (),
    compatible: str | None = None,
    name: str | None = None,
    version: int | None = None,
    expires_in_days: float = DEFAULT_EXPIRES_IN_DAYS,
    check_timeout_s: float | None = None,
    check_memory_mb: int | None = None,
    trial: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Sign ``package`` as a release and write ``package/manifest.sig``; return the record.

    Args:
        devices: device ids that may take it; or ``compatible``: a class of devices.
        name: the served name it may be deployed as (default: the manifest's name).
        version: a number above every earlier release of ``name`` (default: now, in epoch ms).
        expires_in_days: devices refuse it after this long.
        check_timeout_s: a device's check of it (load, warm-up, smoke cases) may take at
            most this long, where the device allows longer (``None``: the device's limit).
        check_memory_mb: the same for the check's memory (MiB).
        trial: serve it in a trial window with these thresholds (``{}``: the defaults of its
            kind) and commit only when it passes; ``None``: it commits at the swap.
    """
    _audience(devices, compatible)
    if expires_in_days <= 0:
        raise ConfigError("--expires-in-days must be > 0")
    if not _positive_or_none(check_timeout_s, check_memory_mb):
        raise ConfigError("check_timeout_s and check_memory_mb must be > 0 when given")
    if trial is not None:
        policy_for("", trial)  # ConfigError: says which threshold
    manifest_bytes = (Path(package) / MANIFEST_NAME).read_bytes()
    manifest = json.loads(manifest_bytes)  # what it says; `edgeinfer sign` verified it first
    now = _now_ms()
    release = Release(
        manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(),
        name=name or str(manifest["name"]),
        version=now if version is None else version,
        target=str(manifest["target"]),
        devices=tuple(devices),
        compatible=compatible,
        total_bytes=sum(int(e["bytes"]) for e in manifest["files"].values()),
        signed_ms=now,
        expires_ms=now + int(expires_in_days * _DAY_MS),
        check_timeout_s=check_timeout_s,
        check_memory_mb=check_memory_mb,
        trial=None if trial is None else dict(trial),
    )
    record = {**Signer.load(key).sign("release", release.body()), "release": release.body()}
    (Path(package) / SIGNATURE_NAME).write_text(json.dumps(record, indent=2) + "\n")
    return record


@dataclass(frozen=True)
class RollbackOrder:
    """A signed instruction: serve ``name``'s kept previous package (``digest`` or
    ``version``) again. ``issued_ms`` is its counter: a device takes only orders issued after
    the last one it applied, so a replayed order is refused."""

    name: str
    devices: tuple[str, ...]
    compatible: str | None
    digest: str | None
    version: int | None
    nonce: str
    issued_ms: int
    expires_ms: int

    @classmethod
    def verified(
        cls, message: Mapping[str, Any], trusted: TrustedKeys
    ) -> tuple[RollbackOrder, str]:
        """The order a rollback message carries, and its signer (``DeployRefusedError``:
        ``unsigned`` when it carries none, or as ``TrustedKeys.verify``)."""
        body = message.get("order")
        if not isinstance(body, Mapping):
            raise DeployRefusedError(
                "unsigned", "a rollback must be a signed order: edgeinfer rollback NAME --key KEY"
            )
        signer = trusted.verify("rollback", body, message.get("signature"))
        try:
            order = cls(**{**body, "devices": tuple(str(d) for d in body["devices"])})
        except (TypeError, KeyError) as exc:
            raise DeployRefusedError("bad_signature", f"malformed rollback order: {exc}") from exc
        return order, signer

    def check(self, *, device_id: str, compatible: Iterable[str]) -> None:
        """Refuse an order that is for other devices or has expired."""
        what = f"rollback order {self.nonce}"
        _for_here(what, self.devices, self.compatible, self.expires_ms, device_id, compatible)


def sign_rollback(
    key: Path,
    *,
    name: str,
    devices: Sequence[str] = (),
    compatible: str | None = None,
    digest: str | None = None,
    version: int | None = None,
    expires_in_s: float = DEFAULT_ROLLBACK_EXPIRES_S,
) -> dict[str, Any]:
    """A signed rollback message body: ``{"order": ..., "signature": ...}``."""
    _audience(devices, compatible)
    if (digest is None) == (version is None):
        raise ConfigError("name the package to go back to: its digest or its version (one)")
    now = _now_ms()
    order = RollbackOrder(
        name=name,
        devices=tuple(devices),
        compatible=compatible,
        digest=digest,
        version=version,
        nonce=os.urandom(8).hex(),
        issued_ms=now,
        expires_ms=now + int(expires_in_s * 1000),
    )
    body = {**asdict(order), "devices": list(order.devices)}
    return {"order": body, "signature": Signer.load(key).sign("rollback", body)}
