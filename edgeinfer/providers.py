"""Execution providers: short aliases, what this device has, and the order to try them in.

The rule is simple and logged: take the requested providers (or the package's preferred order)
in order, keep the ones this onnxruntime build has, and always end with CPU. A requested
provider that is missing is a warning, not an error, unless nothing but CPU was asked for
and CPU itself is missing (which no onnxruntime build does).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from edgeinfer.errors import ConfigError, ProviderError

__all__ = ["ALIASES", "available", "resolve", "to_ort_name"]

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
ALIASES = {
    "cpu": CPU,
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "dml": "DmlExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
}


def to_ort_name(provider: str) -> str:
    """Map an alias (``cuda``) or an ORT name (``CUDAExecutionProvider``) to the ORT name."""
    if provider in ALIASES.values():
        return provider
    try:
        return ALIASES[provider.lower()]
    except KeyError:
        raise ConfigError(
            f"unknown execution provider {provider!r}: use one of {', '.join(ALIASES)} "
            "or a full onnxruntime provider name"
        ) from None


def available() -> list[str]:
    """The execution providers this onnxruntime build can create, in ORT's priority order."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def resolve(requested: Iterable[str], *, have: Iterable[str] | None = None) -> list[str]:
    """Return the ORT provider names to use, in order, ending with CPU.

    Args:
        requested: aliases or ORT names in order of preference.
        have: the providers this device has (default: ``available()``).
    """
    have_set = set(available() if have is None else have)
    chosen: list[str] = []
    for name in (to_ort_name(p) for p in requested):
        if name in chosen:
            continue
        if name in have_set:
            chosen.append(name)
        else:
            log.warning("execution provider %s is not available here; falling back", name)
    if CPU not in chosen:
        if CPU not in have_set:
            raise ProviderError(
                f"none of the requested providers can run here (have: {sorted(have_set)})"
            )
        chosen.append(CPU)
    return chosen
