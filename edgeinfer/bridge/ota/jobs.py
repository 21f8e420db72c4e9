"""The deploy channel's typed state: the deploy being received and the steps queued for the
deploy thread (``commit`` and ``rollback`` load models, so they never run in paho's thread)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from edgeinfer.bridge.ota.release import Release, RollbackOrder

__all__ = ["CommitJob", "Job", "JobQueue", "PendingDeploy", "RollbackJob", "TrialEndJob"]


@dataclass(frozen=True)
class PendingDeploy:
    """A deploy whose ``begin`` was taken: its signed release and who signed it."""

    deploy_id: str
    name: str
    signer: str
    digest: str
    version: int
    release: Release

    def about(self) -> dict[str, Any]:
        """Its fields in a status."""
        return {"deploy_id": self.deploy_id, "name": self.name, "version": self.version}


@dataclass(frozen=True)
class CommitJob:
    """Check, load and swap in the deploy ``deploy_id`` once every chunk came."""

    deploy_id: Any  # as the message said: checked against the deploy being received
    nonce: Any = None
    round: Any = None

    def about(self) -> dict[str, Any]:
        """The fields every status of this step carries."""
        return {"deploy_id": self.deploy_id, "nonce": self.nonce, "round": self.round}


@dataclass(frozen=True)
class RollbackJob:
    """Serve ``order.name``'s kept previous package again (``order`` is verified)."""

    order: RollbackOrder
    signer: str
    nonce: Any = None
    round: Any = None

    def about(self) -> dict[str, Any]:
        """The fields every status of this step carries."""
        return {"deploy_id": None, "nonce": self.nonce, "round": self.round}


@dataclass(frozen=True)
class TrialEndJob:
    """Commit or roll back ``name`` as its trial's ``verdict`` says (``trial.py``)."""

    name: str
    trial: Any  # the TrialModel that judged: applied only while it still serves ``name``
    verdict: Any
    context: tuple[tuple[str, Any], ...]  # the deploy's status fields

    def about(self) -> dict[str, Any]:
        """The fields every status of this step carries: the deploy's."""
        return dict(self.context)


Job = CommitJob | RollbackJob | TrialEndJob


class JobQueue:
    """Steps for the deploy thread, in order; ``close`` wakes it to end."""

    def __init__(self) -> None:
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def put(self, job: Job) -> None:
        """Queue ``job`` (dropped once the queue is closed: the bridge is stopping)."""
        with self._cond:
            if not self._closed:
                self._jobs.append(job)
                self._cond.notify_all()

    def take(self) -> Job | None:
        """The next job, waiting for one; ``None`` once closed (queued ones are dropped)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or bool(self._jobs))
            return None if self._closed else self._jobs.popleft()

    def close(self) -> None:
        """Take no more jobs and wake the thread waiting in ``take``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
