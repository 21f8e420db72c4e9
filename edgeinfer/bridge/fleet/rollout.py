"""Staged rollouts: one signed release to many devices, in waves, stopping itself when it hurts.

``rollout(PKG, ...)`` picks the devices (an id list, or every device whose status names the
``compatible`` class), splits them into waves (``start`` devices, then ``factor`` times more
each wave; at most ``max_per_minute`` deploys begun in any minute) and deploys each wave with
``deploy_package``. A release signed with ``trial`` is judged by each device on its own
traffic; the rollout waits for every device's verdict (``committed`` or ``rolled_back``, at
most ``device_timeout_s``) before the next wave. Once ``min_count`` devices are done and more
than ``max_failure_share`` of them failed (rolled back, refused, failed, timed out), the
rollout aborts: the devices not begun are ``skipped``. A device offline at its turn waits to
the end of the waves (``offline="wait"``, at most ``offline_wait_s``) or is left out
(``"skip"``).

Progress is recorded in ``state_dir`` (``progress.py``) before each step, so a rollout run
again after its operator died resumes: done devices are not touched; a device that may have
seen its deploy is asked first (its retained ``ota/status``), and gets it only if it never
did. Instructions to devices are the signed release (no new trust): nothing else is sent.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from edgeinfer.bridge.connection import Connection
from edgeinfer.bridge.fleet.inventory import FleetWatch
from edgeinfer.bridge.fleet.progress import DeviceRow, Progress, rollout_lock
from edgeinfer.bridge.ota.publish import deploy_package
from edgeinfer.bridge.ota.release import Release, read_signature
from edgeinfer.errors import ConfigError, EdgeInferError

__all__ = ["DeviceResult", "RolloutPlan", "RolloutReport", "rollout"]

_FAILED = frozenset({"rolled_back", "failed", "refused", "timeout"})
_VERDICTS = frozenset({"committed", "rolled_back", "failed"})
_UNDER_WAY = frozenset({"receiving", "verifying", "checking", "loading", "smoke_check", "trial"})
_MAX_PARALLEL = 8  # deploys of one wave at once: each is a broker connection and a few threads


@dataclass(frozen=True)
class RolloutPlan:
    """Which devices, in which waves, and when to stop (see the module docstring)."""

    devices: tuple[str, ...] = ()
    compatible: str | None = None
    start: int = 1
    factor: float = 2.0
    max_per_minute: int = 60
    max_failure_share: float = 0.2
    min_count: int = 1
    device_timeout_s: float = 300.0
    offline: str = "wait"
    offline_wait_s: float = 300.0

    def __post_init__(self) -> None:
        if bool(self.devices) == bool(self.compatible):
            raise ConfigError("name the devices (--device-id, repeatable) or a --compatible class")
        numbers = (self.factor, self.max_failure_share, self.device_timeout_s,
                   self.offline_wait_s)  # fmt: skip
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers):
            raise ConfigError("rollout factor, share and timeouts must be finite numbers")
        if self.start < 1 or self.factor < 1 or self.max_per_minute < 1 or self.min_count < 1:
            raise ConfigError("--start, --max-per-minute, --min-count >= 1 and --factor >= 1")
        if not 0 <= self.max_failure_share <= 1 or self.device_timeout_s <= 0:
            raise ConfigError("--max-failure-share is in [0, 1]; --device-timeout-s > 0")
        if self.offline not in ("wait", "skip"):
            raise ConfigError(f"--offline is 'wait' or 'skip', not {self.offline!r}")

    def waves(self, devices: Sequence[str]) -> list[list[str]]:
        """``devices`` in waves of ``start``, ``start * factor``, ... (rounded up)."""
        waves, size, at = [], float(self.start), 0
        while at < len(devices):
            count = max(1, math.ceil(size))
            waves.append(list(devices[at : at + count]))
            at, size = at + count, size * self.factor
        return waves


@dataclass(frozen=True)
class DeviceResult:
    """One device's part: its wave, what happened, and what it serves at the end."""

    device_id: str
    wave: int
    state: str
    reason: str | None
    attempts: int
    sent_ms: int | None
    ended_ms: int | None
    serves: str | None  # the digest its status reports for the name at the end


@dataclass(frozen=True)
class RolloutReport:
    """A rollout's outcome: ``state`` done or aborted, its waves and every device."""

    name: str
    release_id: str
    digest: str
    state: str
    waves: list[dict[str, Any]]
    devices: list[DeviceResult]

    def counts(self) -> dict[str, int]:
        """Devices per final state."""
        found: dict[str, int] = {}
        for d in self.devices:
            found[d.state] = found.get(d.state, 0) + 1
        return found

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "name": self.name,
            "release_id": self.release_id,
            "digest": self.digest,
            "state": self.state,
            "counts": self.counts(),
            "waves": self.waves,
            "devices": [asdict(d) for d in self.devices],
        }


def _release(package: Path) -> tuple[Release, str]:
    from edgeinfer.manifest import Manifest

    record = read_signature(package)
    body = None if record is None else record.get("release")
    if not isinstance(body, dict):
        raise ConfigError(f"{package} is not signed as a release; run `edgeinfer sign` first")
    release = Release(**{**body, "devices": tuple(body.get("devices", ()))})
    return release, Manifest.read(package).digest


class _Run:
    """One run of a rollout (a fresh one or a resumed one)."""

    def __init__(
        self,
        package: Path,
        release: Release,
        *,
        connection: Connection,
        plan: RolloutPlan,
        progress: Progress,
        watch: FleetWatch,
        topic_prefix: str,
        on_step: Callable[[str, str], None],
    ) -> None:
        self.package, self.release, self.plan = package, release, plan
        self.name, self.deploy_id = release.name, f"{release.name}-{release.release_id}"
        self.connection, self.progress, self.watch = connection, progress, watch
        self.prefix, self._on_step = topic_prefix, on_step
        self._begun: deque[float] = deque()  # when the last deploys began (the rate)

    def mark(self, device: str, state: str, reason: str | None = None) -> None:
        self.progress.mark(self.name, device, state, reason=reason)
        self._on_step(device, state if reason is None else f"{state} ({reason})")

    def online(self, device: str) -> bool:
        view = self.watch.device(device)
        return view is not None and view.state == "online" and view.availability != "offline"

    def _pace(self) -> None:
        """Wait until one more deploy may begin within ``max_per_minute``."""
        while len(self._begun) >= self.plan.max_per_minute:
            wait_s = self._begun[0] + 60.0 - time.monotonic()
            if wait_s <= 0:
                self._begun.popleft()
            else:
                time.sleep(wait_s)
        self._begun.append(time.monotonic())

    def known(self, device: str) -> dict[str, Any] | None:
        """What the device says about this release: its deploy status, or a served version."""
        view = self.watch.device(device)
        if view is None:
            return None
        if view.deploy.get("deploy_id") == self.deploy_id:
            return view.deploy
        served = view.models.get(self.name) or {}
        if served.get("version") == self.release.version:
            return {"state": "committed", "reason": "already_served"}
        return None

    def deploy(self, device: str) -> None:
        """Deploy to ``device`` (unless it has the release already) and wait for its verdict."""
        status = self.known(device)
        if status is None or status.get("state") == "receiving":
            self._pace()
            self.progress.sending(self.name, device)
            self._on_step(device, "sending")
            try:
                status = deploy_package(
                    self.package,
                    connection=replace(self.connection, client_id=self._client_id(device)),
                    device_id=device,
                    topic_prefix=self.prefix,
                    name=self.name,
                    timeout_s=self.plan.device_timeout_s,
                ).status
            except EdgeInferError as exc:
                self.mark(device, "timeout", str(exc))
                return
        self.settle(device, status)

    def _client_id(self, device: str) -> str:
        return f"{self.connection.client_id}-{device}"[:128]

    def settle(self, device: str, status: dict[str, Any]) -> None:
        """Record the device's final state, waiting for its trial's verdict first."""
        state = str(status.get("state"))
        if state in _UNDER_WAY:
            self.mark(device, "trial")
            found = self.watch.wait_for(lambda: self._verdict(device),
                                        timeout_s=self.plan.device_timeout_s)  # fmt: skip
            if found is None:
                self.mark(device, "timeout", "no verdict from the device in time")
                return
            status, state = found, str(found.get("state"))
        if state in ("active", "committed"):
            self.mark(device, "committed", status.get("reason"))
        else:  # rolled_back, failed, refused
            self.mark(device, state if state in _FAILED else "failed", status.get("reason"))

    def _verdict(self, device: str) -> dict[str, Any] | None:
        view = self.watch.device(device)
        if view is None or view.deploy.get("deploy_id") != self.deploy_id:
            return None
        return view.deploy if view.deploy.get("state") in _VERDICTS else None

    def wave(self, rows: list[DeviceRow]) -> None:
        """Deploy one wave's devices that are not done (offline ones wait or are left out)."""
        ready = []
        for row in rows:
            if row.done:
                continue
            if row.state in ("pending", "waiting") and not self.online(row.device_id):
                offline = "waiting" if self.plan.offline == "wait" else "offline"
                if row.state != offline:
                    self.mark(row.device_id, offline, "offline at its turn")
                continue
            ready.append(row.device_id)
        if ready:
            with ThreadPoolExecutor(min(_MAX_PARALLEL, len(ready))) as pool:
                list(pool.map(self.deploy, ready))

    def failing(self) -> bool:
        rows = [r for r in self.progress.devices(self.name) if r.done]
        failed = sum(r.state in _FAILED for r in rows)
        return len(rows) >= self.plan.min_count and failed > self.plan.max_failure_share * len(rows)

    def late(self) -> None:
        """The devices that were offline at their turn: as they come back, within
        ``offline_wait_s``; those that do not are ``offline``."""
        deadline = time.monotonic() + self.plan.offline_wait_s
        while waiting := [r for r in self.progress.devices(self.name) if r.state == "waiting"]:

            def back_online(rows: list[DeviceRow] = waiting) -> list[DeviceRow] | None:
                return [r for r in rows if self.online(r.device_id)] or None

            back = self.watch.wait_for(back_online, timeout_s=max(0.0, deadline - time.monotonic()))
            if back is None:
                for row in waiting:
                    self.mark(row.device_id, "offline", "did not come back in time")
                return
            self.wave(back)


def rollout(
    package: Path,
    *,
    connection: Connection,
    state_dir: Path,
    plan: RolloutPlan,
    topic_prefix: str = "edgeinfer",
    connect_timeout_s: float = 10.0,
    on_step: Callable[[str, str], None] = lambda device, step: None,
) -> RolloutReport:
    """Roll the signed release ``package`` out to ``plan``'s devices, or resume the rollout
    of the same release recorded in ``state_dir``; return the report.

    Raises:
        RolloutBusyError: a rollout of the same name runs now.
        ConfigError: the package is not a signed release; no device matches the plan.
        BrokerAuthError, BrokerUnavailableError: the broker refused or did not answer.
    """
    package = Path(package)
    release, digest = _release(package)
    with rollout_lock(state_dir, release.name):
        progress = Progress(state_dir)
        watch = FleetWatch(connection, topic_prefix=topic_prefix,
                           connect_timeout_s=connect_timeout_s)  # fmt: skip
        try:
            watch.settle()
            run = _Run(package, release, connection=connection, plan=plan, progress=progress,
                       watch=watch, topic_prefix=topic_prefix, on_step=on_step)  # fmt: skip
            _start_or_resume(run, progress, watch)
            return _drive(run, progress, watch, digest)
        finally:
            watch.close()
            progress.close()


def _start_or_resume(run: _Run, progress: Progress, watch: FleetWatch) -> None:
    recorded = progress.rollout(run.name)
    if recorded and recorded["release_id"] == run.release.release_id:
        return  # resume: the same devices, in the same waves
    plan = run.plan
    devices = list(plan.devices) or [
        d.device_id for d in watch.devices() if plan.compatible in d.compatible
    ]
    if not devices:
        raise ConfigError(f"no device's status names the class {plan.compatible!r}")
    progress.begin(run.name, release_id=run.release.release_id, package=str(run.package),
                   plan=asdict(plan), waves=plan.waves(devices))  # fmt: skip


def _drive(run: _Run, progress: Progress, watch: FleetWatch, digest: str) -> RolloutReport:
    rows = progress.devices(run.name)
    state = "done"
    for wave in sorted({r.wave for r in rows}):
        if run.failing():
            state = "aborted"
            break
        run.wave([r for r in progress.devices(run.name) if r.wave == wave])
    if state == "done" and run.failing():
        state = "aborted"
    if state == "aborted":
        for row in progress.devices(run.name):
            if row.state in ("pending", "waiting"):
                run.mark(row.device_id, "skipped", "the rollout aborted")
    else:
        run.late()
    progress.finish(run.name, state)
    watch.settle(timeout_s=2.0)
    return _report(run, progress.devices(run.name), watch, digest, state)


def _report(
    run: _Run, rows: list[DeviceRow], watch: FleetWatch, digest: str, state: str
) -> RolloutReport:
    waves = []
    for wave in sorted({r.wave for r in rows}):
        members = [r for r in rows if r.wave == wave]
        sent = [r.sent_ms for r in members if r.sent_ms is not None]
        ended = [r.ended_ms for r in members if r.ended_ms and r.sent_ms]  # of those begun
        waves.append({"wave": wave, "devices": [r.device_id for r in members],
                      "started_ms": min(sent, default=None),
                      "ended_ms": max(ended, default=None)})  # fmt: skip
    results = []
    for r in rows:
        view = watch.device(r.device_id)
        served = (view.models.get(run.name) or {}).get("digest") if view else None
        results.append(DeviceResult(r.device_id, r.wave, r.state, r.reason, r.attempts,
                                    r.sent_ms, r.ended_ms, served))  # fmt: skip
    return RolloutReport(run.name, run.release.release_id, digest, state, waves, results)
