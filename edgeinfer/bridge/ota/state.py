"""What a deploy folder remembers per served name, written so that a crash or a full disk
never leaves it unreadable.

``DIR/NAME/state.json``::

    {"active": <kept>, "previous": <kept> | null, "floor_version": int | null,
     "floor_release": "<release id>" | null, "rollback_issued_ms": int,
     "trial": "<release id>" | null}

with ``<kept>`` = ``{"path", "digest", "signer", "version", "release_id"}``. ``floor_version``
is the highest version ever accepted for the name: deploys must be above it, and a rollback
never lowers it. Every write is atomic (``write_atomic``: a temporary file, fsync, rename,
fsync of the folder), so a reader sees the old state or the new one, whole. A state file that
is empty, truncated or garbage anyway (a disk fault, a hand edit) is rebuilt from the package
folders next to it, with a warning, never a crash: the highest version kept serves (the
floor is the highest version on disk: the newest accepted package is always kept).
``trial`` names an active package still in its trial window (``trial.py``): a restart serves
the previous package instead (an unproven package never outlives its trial).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeinfer.bridge.ota.release import Release, package_signer, read_signature
from edgeinfer.bridge.ota.signing import TrustedKeys
from edgeinfer.errors import DeployRefusedError, EdgeInferError
from edgeinfer.manifest import MANIFEST_NAME, Manifest

__all__ = [
    "STATE_NAME",
    "Kept",
    "NameState",
    "Names",
    "describe",
    "load_state",
    "prune",
    "remove_partial",
    "write_atomic",
]

log = logging.getLogger(__name__)

STATE_NAME = "state.json"
_KEPT = ("active", "previous")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash or ``ENOSPC`` leaves the old file or the
    new one, never a part: write ``.NAME.tmp``, fsync, rename over, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class Kept:
    """One package a name keeps (active or previous): its folder and identity."""

    path: str
    digest: str
    signer: str | None = None
    version: int | None = None
    release_id: str | None = None


@dataclass
class NameState:
    """What serves one name, what it goes back to, and the version floor."""

    active: Kept | None = None
    previous: Kept | None = None
    floor_version: int | None = None
    floor_release: str | None = None
    rollback_issued_ms: int = 0
    trial: str | None = None  # the active package's release id while it is on trial
    recovered: bool = field(default=False, compare=False)  # rebuilt from the folders

    def to_json(self) -> bytes:
        """The state file's bytes."""
        data = {k: v for k, v in asdict(self).items() if k != "recovered"}
        return (json.dumps(data, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> NameState:
        """Parse a state file (``ValueError`` when it is not one)."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        try:
            active, previous = (Kept(**data[k]) if data.get(k) else None for k in _KEPT)
            return cls(
                active=active,
                previous=previous,
                floor_version=data.get("floor_version"),
                floor_release=data.get("floor_release"),
                rollback_issued_ms=int(data.get("rollback_issued_ms", 0)),
                trial=data.get("trial"),
            )
        except (TypeError, KeyError) as exc:
            raise ValueError(f"malformed: {exc}") from exc

    def kept_paths(self) -> set[Path]:
        """The folders this state points at."""
        return {Path(k.path).resolve() for k in (self.active, self.previous) if k is not None}


def describe(folder: Path, *, signer: str | None = None) -> Kept:
    """A kept package's record from its folder (version from its release, when signed)."""
    manifest = Manifest.read(folder)
    record = read_signature(folder) or {}
    release = record.get("release")
    version = release.get("version") if isinstance(release, dict) else None
    return Kept(
        path=str(folder),
        digest=manifest.digest,
        signer=signer if signer is not None else record.get("key_id"),
        version=version if isinstance(version, int) else None,
        release_id=folder.name if isinstance(version, int) else None,
    )


def _rebuilt(folder: Path) -> NameState:
    """The state of ``folder`` from the package folders in it (highest version active)."""
    found: list[Kept] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if not (child / MANIFEST_NAME).is_file():
            continue
        try:
            found.append(describe(child))
        except EdgeInferError as exc:
            log.warning("%s is not a readable package (%s); it is not served", child, exc)
    found.sort(key=lambda k: k.version if k.version is not None else -1, reverse=True)
    state = NameState(recovered=True)
    if found:
        state.active = found[0]
        state.previous = found[1] if len(found) > 1 else None
        state.floor_version, state.floor_release = found[0].version, found[0].release_id
    return state


def load_state(folder: Path) -> NameState:
    """``folder/state.json`` (empty when there is none); rebuilt from the package folders,
    with a warning, when it is empty, truncated or not a state file."""
    path = folder / STATE_NAME
    try:
        return NameState.from_json(path.read_bytes())
    except FileNotFoundError:  # nothing deployed yet (a folder here is a swap that failed)
        return NameState()
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        state = _rebuilt(folder)
        log.warning(
            "%s is unreadable (%s); rebuilt from the package folders: %s serves",
            path,
            exc,
            state.active.path if state.active else "the command-line package",
        )
        return state


def prune(folder: Path, state: NameState) -> None:
    """Delete what ``state`` does not point at in ``folder``: package folders a crash or a
    failed swap left, and temporary files."""
    keep = state.kept_paths()
    for child in folder.iterdir():
        if child.is_dir() and child.resolve() not in keep:
            log.info("removing %s (no longer kept)", child)
            shutil.rmtree(child, ignore_errors=True)
        elif child.name.startswith(".") and child.name.endswith(".tmp"):
            child.unlink(missing_ok=True)


def remove_partial(root: Path, *, skip: str) -> None:
    """At a start: delete what an interrupted deploy left under each name in ``root`` (the
    folder ``skip`` is not a name): package folders its state does not point at (a check,
    load or swap a crash cut short) and temporary files; a name that never committed a state
    is removed whole."""
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != skip):
        if (folder / STATE_NAME).exists():
            prune(folder, load_state(folder))
        else:
            log.info("removing %s (no deploy under this name was committed)", folder)
            shutil.rmtree(folder, ignore_errors=True)


class Names:
    """The state of every served name in a deploy folder (``DIR/NAME/state.json``), starting
    from the packages given on the command line (``origins``)."""

    def __init__(self, root: Path, *, origins: Mapping[str, Path], trusted: TrustedKeys) -> None:
        self.root = root
        self._states: dict[str, NameState] = {}
        for name, path in origins.items():
            signer, version = package_signer(path, trusted)
            kept = replace(describe(path), signer=signer, version=version)
            self._states[name] = NameState(active=kept, floor_version=version)

    def get(self, name: str) -> NameState:
        """The state of ``name`` (empty when nothing serves it)."""
        return self._states.get(name, NameState())

    def check_floor(self, name: str, release: Release) -> None:
        """Refuse a release whose version is not above every one accepted for ``name``."""
        floor = self.get(name).floor_version
        if floor is not None and release.version == floor:
            raise DeployRefusedError(
                "replay", f"version {floor} of {name!r} was accepted already; sign a new version"
            )
        if floor is not None and release.version < floor:
            raise DeployRefusedError(
                "downgrade",
                f"version {release.version} of {name!r} is older than {floor}, which this "
                "device accepted; sign the package with a newer --version",
            )

    def commit(self, name: str, new: NameState) -> None:
        """Make ``new`` the durable state of ``name`` (``OSError`` when it is not)."""
        folder = self.root / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / STATE_NAME, new.to_json())
        except OSError:
            on_disk = load_state(folder).active  # what a restart would serve
            if on_disk is None or new.active is None or on_disk.path != new.active.path:
                raise  # not durable: nothing changes
        self._states[name] = new
        prune(folder, new)  # the package before the previous, and anything a crash left

    def restore(self, loader: Callable[[Path], Any], *, skip: str) -> dict[str, Any]:
        """Load what serves each name after a restart (its active package, else its previous,
        else the command-line one), by name; the folder ``skip`` is not a name."""
        restored: dict[str, Any] = {}
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != skip):
            if not (folder / STATE_NAME).exists():
                continue
            state, origin = load_state(folder), self.get(folder.name)
            if state.trial is not None and state.previous is not None:
                log.warning("%s: %s was on trial when the bridge stopped; its previous serves",
                            folder.name, state.trial)  # fmt: skip
                state.active, state.previous = state.previous, state.active
            state.trial = None
            versions = [origin.floor_version, state.floor_version]
            versions += [k.version for k in (state.active, state.previous) if k is not None]
            state.floor_version = max((v for v in versions if v is not None), default=None)
            for kept in (state.active, state.previous):
                if kept is None:
                    continue
                try:
                    restored[folder.name] = loader(Path(kept.path))
                except EdgeInferError as exc:
                    log.error("cannot serve %s for %s again: %s", kept.path, folder.name, exc)
                    continue
                if kept is state.previous:  # the active one is broken: its previous serves
                    state.active, state.previous = state.previous, None
                break
            else:
                log.error("%s: nothing deployed loads; the command-line package serves", folder)
                state.active, state.previous = origin.active, None
            try:
                self.commit(folder.name, state)
            except OSError as exc:  # serves anyway; the next start decides the same again
                log.warning("cannot rewrite %s: %s", folder / STATE_NAME, exc)
                self._states[folder.name] = state
        return restored

    def served(self, name: str) -> dict[str, Any]:
        """``name``'s part of the status topic: signer, version and previous package."""
        state = self.get(name)
        active, previous = state.active, state.previous
        return {
            "signer": active.signer if active else None,
            "version": active.version if active else None,
            "previous": previous.digest if previous else None,
            "previous_version": previous.version if previous else None,
        }
