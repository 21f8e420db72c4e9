"""What a bridge says of itself on its retained status topic (``P/D/status``, a group
member's ``P/D/status/CLIENT_ID``): ``online`` with each served model's digest, task, signer
and versions, or ``offline`` (also its Last Will) with the same fields serving nothing, so
that every template reading the status finds them; both name the device's compatible classes,
so a fleet rollout still finds a device that is down."""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.bridge.models import ModelTable
from edgeinfer.bridge.ota.deploy import Deployer
from edgeinfer.bridge.wire import protocol as proto

__all__ = ["offline", "online"]

# The keys a deploying bridge's status has for each model, before anything was deployed.
_UNSIGNED = {"signer": None, "version": None, "previous": None, "previous_version": None}


def online(client_id: str, models: ModelTable, deployer: Deployer | None) -> dict[str, Any]:
    """The retained ``online`` status of the bridge ``client_id`` serving ``models``."""
    if deployer is not None:
        served = deployer.served()
    else:
        served = {
            name: {"digest": str(m.manifest.digest), "task": m.task, **_UNSIGNED}
            for name, m in models.items()
        }
    return _status("online", client_id, served, deployer)


def offline(client_id: str, deployer: Deployer | None) -> bytes:
    """The ``offline`` status (the Last Will's payload too), as JSON bytes."""
    return json.dumps(_status("offline", client_id, {}, deployer)).encode()


def _status(
    state: str, client_id: str, models: dict[str, Any], deployer: Deployer | None
) -> dict[str, Any]:
    compatible = [] if deployer is None else list(deployer.config.compatible)
    return {
        "v": proto.PROTOCOL_VERSION,
        "state": state,
        "client_id": client_id,
        "models": models,
        "compatible": compatible,
    }
