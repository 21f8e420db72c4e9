"""Deploys on the device: signed, chunked packages assembled, checked, loaded, swapped.

Messages come on ``P/D/deploy/req`` (MsgPack, from ``edgeinfer deploy``/``rollback``)::

    {"op": "begin", "deploy_id", "name", "manifest": <manifest.json bytes>, "signature": {...},
     "chunk_bytes"}                                   signature checked first, staging opened
    {"op": "chunk", "deploy_id", "index", "file", "offset", "sha256", "data": <bytes>}
    {"op": "commit", "deploy_id"}                     verify, load + warm, smoke check, swap
    {"op": "rollback", "name"}                        serve the previous package again
    {"op": "status"}                                  publish the deploy status again

``begin``, ``chunk`` and ``status`` are cheap and handled in paho's thread (a chunk is a hash
and one write); ``commit`` and ``rollback`` load models, so they run on the deploy thread.
Each step's outcome is published, retained, on ``P/D/deploy/status``. Any failed step leaves
the old model serving. On disk under the deploy folder: ``staging/`` (one deploy at a time)
and per served name ``NAME/<digest>/`` for the active and the previous package only, with
``NAME/state.json`` saying which is which (so a restarted bridge serves what was deployed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.bridge import protocol as proto
from edgeinfer.bridge.serving import ModelTable, ServedModel
from edgeinfer.bridge.signing import TrustedKeys, read_signature
from edgeinfer.bridge.staging import Staging
from edgeinfer.errors import ConfigError, EdgeInferError, IntegrityError
from edgeinfer.manifest import Manifest

__all__ = ["DeployConfig", "Deployer", "default_smoke_check"]

log = logging.getLogger(__name__)

_MAX_MISSING_LISTED = 1024  # indexes in one status message (the rest follow after a resend)


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
        trusted: the public keys whose signatures are accepted.
        loader: loads and warms a package folder (default ``edgeinfer.load``).
        smoke_check: raises when a loaded package does not reproduce its recorded outputs.
        max_package_bytes: larger packages are refused at ``begin``.
    """

    folder: Path
    trusted: TrustedKeys
    loader: Callable[[Path], ServedModel] = _default_loader
    smoke_check: Callable[[Any], None] = default_smoke_check
    max_package_bytes: int = 4 << 30


@dataclass
class _Slot:
    """What serves one name: the active package and the one before it."""

    active: dict[str, Any] | None = None
    previous: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Deployer:
    """Apply deploy messages to a model table; publish each outcome with ``publish``."""

    def __init__(
        self,
        config: DeployConfig,
        *,
        models: ModelTable,
        origins: Mapping[str, Path],
        publish: Callable[[dict[str, Any]], None],
        on_swap: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.models = models
        self._publish = publish
        self._on_swap = on_swap
        config.folder.mkdir(parents=True, exist_ok=True)
        self.staging = Staging(config.folder)
        self._begin: dict[str, Any] = {}
        self._activated: dict[str, Any] = {}  # the last deploy that went live
        self._rollback_nonce: Any = None  # the last rollback asked for (re-sends ignored)
        self._slots: dict[str, _Slot] = {}
        for name, path in origins.items():
            self._slots[name] = _Slot(active=self._describe(path, signer=self._signer_of(path)))
        self._jobs: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-deploy")
        self.last_status: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def restore(self) -> dict[str, ServedModel]:
        """Load the packages deployed before a restart (``NAME/state.json``), by name."""
        restored: dict[str, ServedModel] = {}
        for state in sorted(self.config.folder.glob("*/state.json")):
            slot = _Slot(**json.loads(state.read_text()))
            if slot.active is None:
                continue
            try:
                restored[state.parent.name] = self.config.loader(Path(slot.active["path"]))
            except EdgeInferError as exc:
                log.error("cannot serve the deployed %s again: %s", state.parent.name, exc)
                continue
            self._slots[state.parent.name] = slot
        return restored

    def start(self) -> None:
        """Start the deploy thread."""
        self._thread.start()

    def stop(self) -> None:
        """Finish the deploy step in progress, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def served(self) -> dict[str, dict[str, Any]]:
        """Per served name: package digest, signer and folder (for the status topic)."""
        out = {}
        for name, model in self.models.items():
            slot = self._slots.get(name) or _Slot()
            out[name] = {
                "digest": str(model.manifest.digest),
                "task": model.task,
                "signer": (slot.active or {}).get("signer"),
                "previous": (slot.previous or {}).get("digest"),
            }
        return out

    # -- paho's thread -------------------------------------------------------------------------
    def handle(self, payload: bytes) -> None:
        """One deploy message (MsgPack); never raises."""
        try:
            message = proto.decode_reply(payload, fmt="msgpack")
        except ValueError as exc:
            self._status("failed", message=f"undecodable deploy message: {exc}")
            return
        op = message.get("op")
        try:
            if op == "begin":
                self._on_begin(message)
            elif op == "chunk":
                self._on_chunk(message)
            elif op == "status":
                self._publish(self.last_status or {"state": "idle"})
            elif op in ("commit", "rollback"):
                if op == "rollback" and message.get("nonce") == self._rollback_nonce:
                    return  # a re-sent rollback: the first one is applied or under way
                self._rollback_nonce = message.get("nonce") if op == "rollback" else None
                with self._cond:
                    self._jobs.append(message)
                    self._cond.notify_all()
            else:
                self._status("failed", message=f"unknown deploy op {op!r}")
        except (EdgeInferError, OSError) as exc:  # OSError: the disk refused a write
            self._status(
                "failed",
                deploy_id=message.get("deploy_id"),
                name=message.get("name"),
                nonce=message.get("nonce"),
                round=message.get("round"),
                message=f"{getattr(exc, 'code', 'disk')}: {exc}",
            )

    def _on_begin(self, message: Mapping[str, Any]) -> None:
        deploy_id, name = str(message.get("deploy_id")), message.get("name")
        manifest_bytes, chunk_bytes = message.get("manifest"), message.get("chunk_bytes")
        if not isinstance(name, str) or not name or set(name) & set("/+#\0"):
            raise ConfigError(f"deploy name {name!r} is not a valid topic level")
        if not isinstance(manifest_bytes, bytes) or not isinstance(chunk_bytes, int):
            raise ConfigError("a begin message needs 'manifest' bytes and 'chunk_bytes'")
        if not 1024 <= chunk_bytes <= 16 << 20:
            raise ConfigError("chunk_bytes must be in 1 KiB .. 16 MiB")
        signer = self.config.trusted.verify(manifest_bytes, message.get("signature"))
        try:
            manifest = Manifest.from_dict(json.loads(manifest_bytes))
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"the signed manifest is not valid JSON: {exc}") from exc
        total = sum(e.bytes for e in manifest.files.values())
        if total > self.config.max_package_bytes:
            raise ConfigError(
                f"the package has {total} bytes; this bridge takes at most "
                f"{self.config.max_package_bytes}"
            )
        if shutil.disk_usage(self.config.folder).free < total:
            raise ConfigError(f"not enough disk for {total} bytes under {self.config.folder}")
        self.staging.open(
            deploy_id,
            manifest_bytes=manifest_bytes,
            signature=dict(message.get("signature") or {}),
            files=manifest.files,
            chunk_bytes=chunk_bytes,
        )
        self._begin = {
            "deploy_id": deploy_id,
            "name": name,
            "signer": signer,
            "digest": manifest.digest,
            "nonce": message.get("nonce"),
        }
        self._receiving(round=message.get("round"))

    def _receiving(self, **extra: Any) -> None:
        missing = self.staging.missing()
        about = {k: self._begin.get(k) for k in ("deploy_id", "name", "nonce")}
        self._status(
            "receiving",
            **about,
            total=len(self.staging.plan),
            missing_count=len(missing),
            missing=missing[:_MAX_MISSING_LISTED],
            **extra,
        )

    def _on_chunk(self, message: Mapping[str, Any]) -> None:
        deploy_id, index = message.get("deploy_id"), message.get("index")
        if deploy_id != self.staging.deploy_id or not isinstance(index, int):
            raise ConfigError(
                f"chunk for deploy {deploy_id!r}, which is not being received; send 'begin' first"
            )
        if not 0 <= index < len(self.staging.plan):
            raise ConfigError(f"chunk index {index} is outside the plan")
        ref, raw = self.staging.plan[index], message.get("data")
        data = raw if isinstance(raw, bytes) else b""
        digest = hashlib.sha256(data).hexdigest()
        where = (message.get("file"), message.get("offset"), len(data))
        if where != (ref.file, ref.offset, ref.size) or digest != message.get("sha256"):
            self._receiving(
                refused_chunk=index,
                message=(
                    f"chunk {index} refused: its sha256 or place does not match; send it again"
                ),
            )
            return
        self.staging.write(ref, data, digest)

    # -- the deploy thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or bool(self._jobs))
                if not self._jobs:
                    return
                job = self._jobs.pop(0)
            try:
                if job.get("op") == "commit":
                    self._commit(str(job.get("deploy_id")), job.get("round"))
                else:
                    self._rollback(str(job.get("name")), job.get("nonce"), job.get("round"))
            except Exception as exc:  # the old model keeps serving; say why
                if isinstance(exc, EdgeInferError):
                    log.warning("deploy step refused: %s", exc)
                else:
                    log.exception("deploy step failed")
                self._status(
                    "failed",
                    round=job.get("round"),
                    deploy_id=job.get("deploy_id"),
                    name=job.get("name"),
                    nonce=job.get("nonce"),
                    message=f"{getattr(exc, 'code', type(exc).__name__)}: {exc}",
                )

    def _commit(self, deploy_id: str, round_: Any) -> None:
        if deploy_id == self._activated.get("deploy_id"):  # a redelivered commit: done already
            self._status("active", **{**self._activated, "round": round_})
            return
        if deploy_id != self.staging.deploy_id:
            raise ConfigError(f"commit of deploy {deploy_id!r}, which is not being received")
        if self.staging.missing():
            self._receiving(
                round=round_, message="commit before every chunk arrived; send the missing ones"
            )
            return
        begin = {**self._begin, "round": round_}
        try:
            self._status("verifying", **begin)
            manifest = Manifest.read(self.staging.folder)  # names checked again, on disk
            manifest.verify(self.staging.folder)
            model = self._load_checked(self.staging.folder, begin)
        except EdgeInferError as exc:
            self.staging.discard()
            self._status("failed", **begin, message=f"{exc.code}: {exc}")
            return
        target = self.config.folder / begin["name"] / manifest.digest[:16]
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.staging.folder.rename(target)
        self.staging.discard()
        self._swap(begin["name"], model, self._describe(target, signer=begin["signer"]))
        self._activated = begin
        self._status("active", **begin)

    def _load_checked(self, folder: Path, about: Mapping[str, Any]) -> ServedModel:
        self._status("loading", **about)
        model = self.config.loader(folder)  # load() verifies, starts sessions and warms up
        self._status("smoke_check", **about)
        self.config.smoke_check(model)
        return model

    def _rollback(self, name: str, nonce: Any, round_: Any) -> None:
        slot = self._slots.get(name)
        if slot is None or slot.previous is None:
            raise ConfigError(f"{name!r} has no previous package to roll back to")
        about = {
            "name": name,
            "digest": slot.previous["digest"],
            "nonce": nonce,
            "round": round_,
            "signer": slot.previous.get("signer"),
        }
        try:
            model = self._load_checked(Path(slot.previous["path"]), about)
        except EdgeInferError as exc:
            self._status("failed", **about, message=f"rollback refused: {exc.code}: {exc}")
            return
        self._swap(name, model, slot.previous, rollback=True)
        self._status("rolled_back", **about)

    def _swap(
        self, name: str, model: ServedModel, package: dict[str, Any], *, rollback: bool = False
    ) -> None:
        """Serve ``name`` with ``model`` from the next request on; keep one previous package."""
        slot = self._slots.setdefault(name, _Slot())
        old_active, old_previous = slot.active, slot.previous
        slot.active, slot.previous = package, old_active
        self.models.swap(name, model)
        if not rollback and old_previous is not None:
            self._delete_owned(old_previous)
        (self.config.folder / name).mkdir(parents=True, exist_ok=True)
        state = {"active": slot.active, "previous": slot.previous}
        (self.config.folder / name / "state.json").write_text(json.dumps(state, indent=2))
        self._on_swap()

    def _delete_owned(self, package: Mapping[str, Any]) -> None:
        """Delete a package folder this deployer wrote (never a folder it was started with)."""
        path = Path(package["path"]).resolve()
        if path.is_relative_to(self.config.folder.resolve()) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)

    def _describe(self, path: Path, *, signer: str | None) -> dict[str, Any]:
        return {"path": str(path), "digest": Manifest.read(path).digest, "signer": signer}

    def _signer_of(self, path: Path) -> str | None:
        """Who signed a package served from the command line, when a trusted key did."""
        record = read_signature(path)
        if record is None:
            return None
        try:
            return self.config.trusted.verify((path / "manifest.json").read_bytes(), record)
        except EdgeInferError:
            return None

    def _status(self, state: str, **fields: Any) -> None:
        status = {
            "v": proto.PROTOCOL_VERSION,
            "state": state,
            **{k: v for k, v in fields.items() if v is not None},
        }
        self.last_status = status
        log.info("deploy: %s", status)
        self._publish(status)
