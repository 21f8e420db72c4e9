"""The deploy status topic (``P/D/ota/status``): what a device says about deploys.

The outcome of each step of a deploy or rollback that was taken is published *retained*
(a late subscriber sees where the device stands); ``failed`` says a step under way failed
and the old model serves. A refused message is answered ``{"state": "refused", "reason"}``,
*not* retained, and only once per kind among the recent ones (reason, nonce, round, topic),
so a flood of junk neither replaces the status of a deploy in progress nor gets a status per
message.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from edgeinfer.bridge.models import PublishStatus
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.errors import DeployRefusedError, EdgeInferError

__all__ = ["DeployStatus", "reason_of"]

log = logging.getLogger(__name__)

_RECENT_REFUSALS = 64  # kinds remembered: junk alternating between kinds stays answered once


def reason_of(exc: BaseException) -> str:
    """A status's ``reason``: a refusal's reason, an error's code, ``disk`` for a write the
    disk refused, ``internal`` for a bug."""
    if isinstance(exc, DeployRefusedError):
        return exc.reason
    if isinstance(exc, EdgeInferError):
        return exc.code
    return "disk" if isinstance(exc, OSError) else "internal"


class DeployStatus:
    """Publishes deploy statuses with ``publish(status, retain)``."""

    def __init__(self, publish: PublishStatus) -> None:
        self._publish = publish
        self.last: dict[str, Any] = {}  # the last retained status
        self._refused: OrderedDict[tuple[Any, ...], None] = OrderedDict()

    def step(self, state: str, *, retain: bool = True, **fields: Any) -> None:
        """Publish a step's status (``None`` fields left out)."""
        status = {
            "v": proto.PROTOCOL_VERSION,
            "state": state,
            **{k: v for k, v in fields.items() if v is not None},
        }
        if retain:
            self.last = status
            self._refused.clear()
        log.info("deploy: %s", status)
        self._publish(status, retain)

    def again(self) -> None:
        """The last retained status once more, not retained (for ``status`` and re-sends)."""
        self._publish(self.last or {"v": proto.PROTOCOL_VERSION, "state": "idle"}, False)

    def fail(self, exc: BaseException, about: Mapping[str, Any]) -> None:
        """A step that was under way failed (retained): the old model keeps serving."""
        self.step("failed", **about, reason=reason_of(exc), message=str(exc))

    def refuse(self, exc: BaseException, about: Mapping[str, Any]) -> None:
        """Answer a refused message, unless a recent refusal was of the same kind."""
        key = (reason_of(exc), *(about.get(k) for k in ("nonce", "round", "topic")))
        if key in self._refused:
            log.debug("deploy message refused again: %s", exc)
            return
        self._refused[key] = None
        if len(self._refused) > _RECENT_REFUSALS:
            self._refused.popitem(last=False)
        log.warning("deploy message refused: %s", exc)
        self.step("refused", retain=False, **about, reason=key[0], message=str(exc))
