"""The served-model table that serving (``bridge/serve``) and deploys (``bridge/ota``) share,
what a served model is, and how a package is batched when served or checked: deploys import
this, never serving (the bridge composes the deployer; nothing in ``ota/`` reads ``serve/``).

A bridge serves a ``ModelTable``; a deploy swaps a new model into it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from edgeinfer.config import ContinuousBatchConfig
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import DecoderIO

__all__ = [
    "TOPIC_LEVEL_BAD",
    "ModelTable",
    "PublishStatus",
    "ServedModel",
    "batching_for",
    "is_topic_level",
]

log = logging.getLogger(__name__)

# Characters a topic level (a device id, a served name) cannot hold.
TOPIC_LEVEL_BAD = frozenset("/+#\0")


def is_topic_level(text: str) -> bool:
    """Whether ``text`` can be one MQTT topic level (a device id, a served name): not empty,
    none of ``/ + # NUL``."""
    return bool(text) and not TOPIC_LEVEL_BAD & set(text)


def batching_for(
    manifest: Manifest, *, generations: int, kv_budget_bytes: int | None
) -> ContinuousBatchConfig | None:
    """How a package is served, and checked before a deploy swaps it in, alike: a generate
    package whose graph batches decodes ``generations`` at once (within ``kv_budget_bytes``
    of KV); anything else, or ``generations`` < 2, one at a time (``None``)."""
    if manifest.task != "generate" or generations < 2:
        return None
    if not manifest.io_as(DecoderIO).extra_row_input:
        log.warning(
            "%s decodes one generation at a time (exported before continuous batching); "
            "re-export it to serve %d at once",
            manifest.name,
            generations,
        )
        return None
    return ContinuousBatchConfig(max_sequences=generations, kv_budget_bytes=kv_budget_bytes)


class ServedModel(Protocol):
    """What every served model has: ``edgeinfer.Model`` satisfies it."""

    @property
    def task(self) -> str:
        """``embed``, ``classify``, ``generate`` or ``raw``."""

    @property
    def manifest(self) -> Any:
        """The package manifest (``precision``, ``digest``, ``io``)."""


class ModelTable:
    """Model name -> the model serving it now. ``swap`` replaces one between requests: a
    request takes its model once, when it starts, so it is answered wholly by one model."""

    def __init__(self, models: Mapping[str, ServedModel]) -> None:
        self._models = dict(models)
        self._lock = threading.Lock()  # serializes writers; readers see a whole dict

    def get(self, name: str) -> ServedModel | None:
        """The model serving ``name`` now, or ``None``."""
        return self._models.get(name)

    def names(self) -> list[str]:
        """The served names, sorted."""
        return sorted(self._models)

    def swap(self, name: str, model: ServedModel) -> ServedModel | None:
        """Serve ``name`` with ``model`` from the next request on; return the one it replaces."""
        with self._lock:
            previous = self._models.get(name)
            self._models = {**self._models, name: model}  # copy-on-write: no torn reads
            return previous

    def items(self) -> list[tuple[str, ServedModel]]:
        """(name, model) pairs, sorted by name."""
        models = self._models
        return sorted(models.items())


# A deploy step's status and whether the broker keeps it (retained) for late subscribers.
PublishStatus = Callable[[dict[str, Any], bool], None]
