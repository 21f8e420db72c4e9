"""The trials under way on a device, one per served name, and what their verdicts change.

A deploy whose release is signed with ``trial`` and that replaces a package already serving
goes live as a ``TrialModel`` (``trial.py``); its state file names the release as on trial
(so a restart serves the previous package). The verdict comes back as a ``TrialEndJob`` on
the deploy thread: ``committed`` (the new package serves alone; the previous one is kept on
disk for a rollback) or ``rolled_back`` with the failing signal as ``reason``. A signed
rollback, a stop or a newer trial ends a trial without a verdict.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from edgeinfer.bridge.ota.jobs import TrialEndJob
from edgeinfer.bridge.ota.release import Release
from edgeinfer.bridge.ota.state import NameState
from edgeinfer.bridge.ota.trial import TrialModel, Verdict
from edgeinfer.bridge.ota.trial_policy import TrialPolicy, policy_for
from edgeinfer.errors import DeployRefusedError

__all__ = ["Trials", "trial_kind"]


def trial_kind(model: Any) -> str:
    """The kind whose trial defaults a model gets: classify, detect, embed, tensor, generate."""
    if model.task == "raw":
        return "tensor"
    if model.manifest.io.kind == "image-detector":
        return "detect"
    return str(model.task)


class Trials:
    """The running trials by name; ``put`` hands each verdict to the deploy thread."""

    def __init__(self, put: Callable[[TrialEndJob], None]) -> None:
        self._put = put
        self._running: dict[str, TrialModel] = {}
        self._lock = threading.Lock()  # begin (paho's thread) reads; the deploy thread writes

    def policy(self, release: Release, model: Any, previous: Any) -> TrialPolicy | None:
        """The trial ``release`` asks for when ``model`` replaces ``previous`` (``None``:
        none: not signed with one, or nothing serves the name yet to compare with)."""
        if release.trial is None or previous is None:
            return None
        return policy_for(trial_kind(model), release.trial)

    def refuse_during(self, name: str) -> None:
        """Refuse a new deploy of ``name`` while its last one is on trial."""
        with self._lock:
            if name in self._running:
                raise DeployRefusedError(
                    "in_trial",
                    f"{name!r} is serving a package on trial; deploy again once it committed "
                    "or rolled back (its ota/status says which)",
                )

    def start(
        self, name: str, new: Any, previous: Any, policy: TrialPolicy, about: Mapping[str, Any]
    ) -> TrialModel:
        """Begin the trial of ``new`` against ``previous``; the model to serve."""
        context = tuple(about.items())

        def verdict(trial: TrialModel, judged: Verdict) -> None:
            self._put(TrialEndJob(name, trial, judged, context))

        trial = TrialModel(new, previous, policy=policy, on_verdict=verdict)
        with self._lock:
            self._running[name] = trial
        return trial

    def end(self, name: str) -> None:
        """End ``name``'s trial, if any, without a verdict (a rollback, a stop)."""
        with self._lock:
            trial = self._running.pop(name, None)
        if trial is not None:
            trial.close()

    def take(self, job: TrialEndJob) -> bool:
        """Whether ``job``'s trial still runs (it is then ended); a stale verdict is not."""
        with self._lock:
            running = self._running.get(job.name)
            if running is None or running is not job.trial:
                return False
            del self._running[job.name]
        running.close()  # its shadow thread is ending: it sent this verdict
        return True

    def stop(self) -> None:
        """End every trial (the state files still say *trial*: a restart rolls back)."""
        with self._lock:
            names = list(self._running)
        for name in names:
            self.end(name)


def after_verdict(state: NameState, verdict: Verdict) -> NameState:
    """The name's state once its trial's ``verdict`` is applied."""
    if verdict.passed:
        return replace(state, trial=None)
    return replace(state, active=state.previous, previous=state.active, trial=None)
