"""Deploys on the device: signed releases, chunked, checked, loaded, swapped, rolled back.

Messages (MsgPack, from ``edgeinfer deploy``/``rollback``) come on two topics that a device's
request ACL (``P/D/+/req``) does not match, each with its size checked before decoding::

    P/D/ota/ctl    at most MAX_CONTROL_BYTES
      {"op": "begin", "name", "manifest": <manifest.json bytes>, "signature": {... "release"},
       "chunk_bytes", "nonce", "round"}         release checked (release.py), staging opened
      {"op": "commit", "deploy_id", "nonce", "round"}   verify, bounded check, load, swap
      {"op": "rollback", "order": {...}, "signature": {...}, "nonce", "round"}   signed order
      {"op": "status"}                           the last status again
    P/D/ota/chunk  at most the planned chunk size + file name + CHUNK_ENVELOPE_BYTES
      {"op": "chunk", "deploy_id", "index", "file", "offset", "sha256", "data": <bytes>}

``begin``, ``chunk`` and ``status`` are cheap and handled in paho's thread; ``commit`` and
``rollback`` load models, so they run on the deploy thread; a commit first checks the package
in a bounded child process (``check.py``), and ``stop`` kills it. Each step's outcome goes to
``P/D/ota/status`` (``deploy_status``: retained for steps taken, refusals answered once and
not retained). The swap happens only once the new state is durable (``deploy_state``), so
the status always says what serves, before and after a restart. On disk: ``staging/`` (one
deploy at a time), ``NAME/<release id>/`` for the active and the previous package only, and
``NAME/state.json``. A start removes what an interrupted deploy left (a package folder no state
file points at, temporary files, a staging folder that is not resumable).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeinfer.bridge.models import ModelTable, PublishStatus, ServedModel, is_topic_level
from edgeinfer.bridge.ota.check import BoundedCheck
from edgeinfer.bridge.ota.deploy_config import DeployConfig, default_smoke_check
from edgeinfer.bridge.ota.jobs import CommitJob, JobQueue, PendingDeploy, RollbackJob, TrialEndJob
from edgeinfer.bridge.ota.release import Release, RollbackOrder, signed_manifest
from edgeinfer.bridge.ota.staging import MAX_CHUNK_BYTES, MAX_CONTROL_BYTES, Staging
from edgeinfer.bridge.ota.state import Kept, Names, remove_partial
from edgeinfer.bridge.ota.status import DeployStatus
from edgeinfer.bridge.ota.trials import Trials, after_verdict
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.errors import ConfigError, DeployRefusedError, EdgeInferError
from edgeinfer.manifest import Manifest

__all__ = ["DeployConfig", "Deployer", "default_smoke_check"]

log = logging.getLogger(__name__)

_MAX_MISSING_LISTED = 1024  # indexes in one status message (the rest follow after a resend)
# How long ``stop`` waits for the deploy step under way once its check is killed: a load of a
# package whose check passed within its limit (the thread is a daemon: the process exits).
DEFAULT_STOP_TIMEOUT_S = 5.0


class Deployer:
    """Apply deploy messages to a model table; publish each outcome with ``publish``."""

    def __init__(
        self,
        config: DeployConfig,
        *,
        device_id: str,
        models: ModelTable,
        origins: Mapping[str, Path],
        publish: PublishStatus,
        on_swap: Callable[[], None] = lambda: None,
    ) -> None:
        self.config, self.device_id, self.models = config, device_id, models
        self._on_swap = on_swap
        self.status = DeployStatus(publish)
        config.folder.mkdir(parents=True, exist_ok=True)
        self.staging = Staging(config.folder)
        try:  # what an interrupted deploy left
            self.staging.remove_unresumable()
            remove_partial(config.folder, skip=self.staging.folder.name)
        except OSError as exc:  # a read-only disk: serve anyway; deploys will fail on it
            log.warning(
                "cannot remove what an interrupted deploy left in %s: %s", config.folder, exc
            )
        self._lock = threading.Lock()  # staging and _begin: paho's thread and the deploy thread
        self._begin: PendingDeploy | None = None
        self._activated: str | None = None  # the deploy id that went live last
        self._ended: dict[Any, BaseException] = {}  # the deploy a failed chunk write ended
        self.names = Names(config.folder, origins=origins, trusted=config.trusted)
        self._jobs = JobQueue()
        self.trials = Trials(self._jobs.put)
        self._check = BoundedCheck()
        # A daemon: a load under way when ``stop`` gives up must not keep the process alive.
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-deploy", daemon=True)

    @property
    def max_message_bytes(self) -> int:
        """The largest chunk message a device buffers (the bridge's packet limit follows)."""
        return MAX_CHUNK_BYTES

    # -- lifecycle ---------------------------------------------------------------------------
    def restore(self) -> dict[str, ServedModel]:
        """Load what was deployed before a restart (``NAME/state.json``), by name."""
        return self.names.restore(self.config.loader, skip=self.staging.folder.name)

    def start(self) -> None:
        """Start the deploy thread."""
        self._thread.start()

    def stop(self, *, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Stop within about ``timeout_s``: queued steps are dropped, a check under way is
        killed (its deploy fails; its folder is removed now or at the next start), and a load
        under way gets ``timeout_s`` to finish."""
        self._jobs.close()
        self.trials.stop()
        self._check.kill()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning(
                "the deploy step under way did not end within %g s; stopping without it "
                "(the next start removes what it left)",
                timeout_s,
            )

    def served(self) -> dict[str, dict[str, Any]]:
        """Per served name: package digest, version, signer, previous (for the status topic)."""
        return {
            name: {"digest": str(m.manifest.digest), "task": m.task, **self.names.served(name)}
            for name, m in self.models.items()
        }

    # -- paho's thread -------------------------------------------------------------------------
    def handle_control(self, payload: bytes) -> None:
        """One message of ``P/D/ota/ctl``; never raises."""
        message = self._decoded(payload, MAX_CONTROL_BYTES, "ctl")
        if message is None:
            return
        about = {k: message.get(k) for k in ("deploy_id", "nonce", "round")}
        try:
            self._on_control(message)
        except (EdgeInferError, OSError) as exc:  # OSError: the disk refused a write
            self.status.refuse(exc, about)

    def handle_chunk(self, payload: bytes) -> None:
        """One message of ``P/D/ota/chunk``; never raises."""
        message = self._decoded(payload, self.staging.max_message_bytes, "chunk")
        if message is None:
            return
        about = {k: message.get(k) for k in ("deploy_id", "nonce")}
        try:
            with self._lock:
                self.staging.take(message)
        except EdgeInferError as exc:
            self.status.refuse(exc, {**about, "refused_chunk": message.get("index")})
        except OSError as exc:  # the disk is full: this deploy is over
            with self._lock:
                self.staging.discard()
            self._ended = {message.get("deploy_id"): exc}
            self.status.fail(exc, about)

    def _decoded(self, payload: bytes, max_bytes: int, topic: str) -> dict[str, Any] | None:
        if len(payload) > max_bytes:  # before decoding: nothing of it is parsed or copied
            message = f"a {len(payload)}-byte message; ota/{topic} takes at most {max_bytes} now"
            self.status.refuse(DeployRefusedError("too_large", message), {"topic": topic})
            return None
        try:
            return proto.decode_reply(payload, fmt="msgpack")
        except ValueError as exc:
            self.status.refuse(ConfigError(f"undecodable deploy message: {exc}"), {"topic": topic})
            return None

    def _on_control(self, message: Mapping[str, Any]) -> None:
        op = message.get("op")
        if op == "begin":
            self._on_begin(message)
        elif op == "status":
            self.status.again()
        elif op == "commit":
            about = (message.get(k) for k in ("deploy_id", "nonce", "round"))
            self._jobs.put(CommitJob(*about))
        elif op == "rollback":  # a re-sent or replayed order is refused in turn (replay)
            order, signer = RollbackOrder.verified(message, self.config.trusted)
            self._jobs.put(RollbackJob(order, signer, message.get("nonce"), message.get("round")))
        else:
            raise ConfigError(f"unknown deploy op {op!r}")

    def _on_begin(self, message: Mapping[str, Any]) -> None:
        name, manifest_bytes = message.get("name"), message.get("manifest")
        chunk_bytes = message.get("chunk_bytes")
        if (
            not isinstance(name, str)
            or not is_topic_level(name)
            or name == self.staging.folder.name
        ):
            raise ConfigError(f"deploy name {name!r} is not a valid topic level (nor 'staging')")
        self.trials.refuse_during(name)
        if not isinstance(manifest_bytes, bytes) or not isinstance(chunk_bytes, int):
            raise ConfigError("a begin message needs 'manifest' bytes and 'chunk_bytes'")
        signature = message.get("signature") or {}
        release, signer = Release.verified(manifest_bytes, signature, self.config.trusted)
        manifest = signed_manifest(manifest_bytes)
        release.check(
            device_id=self.device_id,
            compatible=self.config.compatible,
            name=name,
            manifest=manifest,
            max_bytes=self.config.max_package_bytes,
        )
        self.names.check_floor(name, release)
        total = sum(e.bytes for e in manifest.files.values())
        free = shutil.disk_usage(self.config.folder).free
        if total > free:  # reason "disk", as when a write runs out of space
            raise OSError(errno.ENOSPC, f"{total} bytes do not fit the {free} free here")
        deploy_id = f"{name}-{release.release_id}"
        with self._lock:
            try:
                self.staging.open(
                    deploy_id,
                    manifest_bytes=manifest_bytes,
                    signature=dict(signature),
                    files=manifest.files,
                    chunk_bytes=chunk_bytes,
                )
            except OSError:
                self.staging.discard()
                raise
            self._begin = PendingDeploy(
                deploy_id, name, signer, manifest.digest, release.version, release
            )
        self._receiving(nonce=message.get("nonce"), round=message.get("round"))

    def _receiving(self, **extra: Any) -> None:
        missing = self.staging.missing()
        about = self._begin.about() if self._begin is not None else {}
        self.status.step(
            "receiving",
            **about,
            total=len(self.staging.plan),
            missing_count=len(missing),
            missing=missing[:_MAX_MISSING_LISTED],
            **extra,
        )

    # -- the deploy thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while (job := self._jobs.take()) is not None:
            about = job.about()
            try:
                if isinstance(job, CommitJob):
                    self._commit(about)
                elif isinstance(job, TrialEndJob):
                    self._end_trial(job, about)
                else:
                    self._rollback(job.order, job.signer, about)
            except DeployRefusedError as exc:
                self.status.refuse(exc, about)
            except Exception as exc:  # the old model keeps serving; say why
                traceback = not isinstance(exc, EdgeInferError)  # a bug: show where
                log.warning("deploy step failed: %s", exc, exc_info=traceback)
                self.status.fail(exc, about)

    def _commit(self, about: dict[str, Any]) -> None:
        if about["deploy_id"] == self._activated:  # a redelivered commit: done already
            self.status.again()
            return
        why = self._ended.get(about["deploy_id"])
        if why is not None:  # the commit of a deploy a full disk ended: say so
            self.status.refuse(why, about)
            return
        with self._lock:  # seal: from here no chunk or begin touches this package
            if about["deploy_id"] != self.staging.deploy_id:
                raise DeployRefusedError(
                    "not_receiving", f"commit of {about['deploy_id']!r}, not being received"
                )
            if self.staging.missing():
                self._receiving(
                    nonce=about["nonce"],
                    round=about["round"],
                    message="commit before every chunk came; send the missing ones",
                )
                return
            begin = self._begin
            assert begin is not None  # staging holds a deploy only after a begin
            self.names.check_floor(begin.name, begin.release)
            target = self.config.folder / begin.name / begin.release.release_id
            try:
                shutil.rmtree(target, ignore_errors=True)  # a swap that failed left it
                target.parent.mkdir(parents=True, exist_ok=True)
                self.staging.folder.rename(target)
            finally:
                self.staging.discard()
        about.update(name=begin.name, digest=begin.digest, version=begin.version)
        about["signer"] = begin.signer
        state = self.names.get(begin.name)
        kept = Kept(str(target), begin.digest, begin.signer, begin.version, target.name)
        new = replace(state, active=kept, previous=state.active, floor_version=kept.version)
        new.floor_release = kept.release_id
        try:
            self.status.step("verifying", **about)
            Manifest.read(target).verify(target)  # names and sha256 checked again, on disk
            self._bounded_check(target, begin.release, about)
            model = self._load_checked(target, about)
            previous = self.models.get(begin.name)
            policy = self.trials.policy(begin.release, model, previous)
            new.trial = None if policy is None else kept.release_id
            self.names.commit(begin.name, new)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            with contextlib.suppress(OSError):  # a first deploy's name folder, left empty
                target.parent.rmdir()
            raise
        self._activated = about["deploy_id"]
        if policy is None:
            self._serve(begin.name, model, about, "active")
            return
        trial = self.trials.start(begin.name, model, previous, policy, about)
        self._serve(begin.name, trial, {**about, "trial": policy.as_dict()}, "trial")

    def _end_trial(self, job: TrialEndJob, about: dict[str, Any]) -> None:
        """Apply a trial's verdict: serve the new package alone, or the previous again."""
        if not self.trials.take(job):
            return  # a rollback or a newer deploy ended that trial first
        verdict = job.verdict
        self.names.commit(job.name, after_verdict(self.names.get(job.name), verdict))
        about["trial"] = verdict.fields()
        if verdict.passed:
            self._serve(job.name, job.trial.new, about, "committed")
            return
        back = self.names.get(job.name).active  # what serves again: the previous package
        about.update(trial_digest=about.get("digest"), trial_version=about.get("version"))
        about.update(reason=verdict.reason, digest=back.digest if back else None)
        about.update(version=back.version if back else None)
        self._serve(job.name, job.trial.previous, about, "rolled_back")

    def _bounded_check(self, folder: Path, release: Release, about: dict[str, Any]) -> None:
        """Load, warm up and smoke-check ``folder`` in a child within the limits (the
        release's, where it signs lower ones); its usage goes into ``about``."""
        limits = self.config.limits.tightened(release.check_timeout_s, release.check_memory_mb)

        def checking(pid: int, memory_bytes: int) -> None:  # once the child runs
            self.status.step("checking", **about, check_timeout_s=limits.timeout_s,
                             check_memory_mb=memory_bytes >> 20, check_pid=pid)  # fmt: skip

        try:
            self._check.run(folder, limits, load=self.config.check_load, on_start=checking)
        finally:
            if self._check.last is not None:
                about["check"] = self._check.last.fields()

    def _load_checked(self, folder: Path, about: Mapping[str, Any]) -> ServedModel:
        self.status.step("loading", **about)
        model = self.config.loader(folder)  # load() verifies, starts sessions and warms up
        self.status.step("smoke_check", **about)
        self.config.smoke_check(model)
        return model

    def _rollback(self, order: RollbackOrder, signer: str, about: dict[str, Any]) -> None:
        order.check(device_id=self.device_id, compatible=self.config.compatible)
        state = self.names.get(order.name)
        if order.issued_ms <= state.rollback_issued_ms:
            raise DeployRefusedError("replay", "this rollback order (or a later one) was applied")
        back = state.previous
        if (
            back is None
            or order.digest not in (None, back.digest)
            or order.version not in (None, back.version)
        ):
            raise DeployRefusedError(
                "no_previous",
                f"{order.name!r} keeps no previous package {order.digest or order.version}; "
                f"it keeps {back.digest if back else 'none'}",
            )
        about.update(name=order.name, digest=back.digest, version=back.version, signer=signer)
        self.trials.end(order.name)  # an order ends a trial: the package it names serves
        model = self._load_checked(Path(back.path), about)
        new = replace(state, active=back, previous=state.active, trial=None)
        new.rollback_issued_ms = order.issued_ms
        self.names.commit(order.name, new)
        self._serve(order.name, model, about, "rolled_back")
        self._activated = None

    def _serve(self, name: str, model: ServedModel, about: Mapping[str, Any], word: str) -> None:
        """Serve ``model`` for ``name`` from the next request on (its state is durable)."""
        self.models.swap(name, model)
        self._on_swap()  # P/D/status first: who sees the deploy status sees it updated
        self.status.step(word, **about)
