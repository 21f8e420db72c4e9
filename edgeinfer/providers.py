"""Execution providers: short aliases, what this device has, and the order to try them in.

The rule is simple and logged: take the requested providers (or the package's preferred order)
in order, keep the ones this onnxruntime build has, and always end with CPU. A requested
provider that is missing is a warning, not an error, unless nothing but CPU was asked for
and CPU itself is missing (which no onnxruntime build does).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from edgeinfer.errors import ConfigError, ProviderError

__all__ = [
    "ALIASES",
    "available",
    "install_hint",
    "provider_options",
    "resolve",
    "to_ort_name",
    "with_options",
]

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
# What brings each provider: most are separate onnxruntime wheels that replace the plain one.
_INSTALL = {
    "CUDAExecutionProvider": "pip install onnxruntime-gpu (in place of onnxruntime; CUDA 12 "
    "and cuDNN 9 on the device)",
    "TensorrtExecutionProvider": "pip install onnxruntime-gpu (in place of onnxruntime) and "
    "the TensorRT libraries (pip install tensorrt)",
    "OpenVINOExecutionProvider": "pip install onnxruntime-openvino in its own environment "
    "(it replaces onnxruntime): tools/openvino_env.sh builds one",
    "QNNExecutionProvider": "pip install onnxruntime-qnn (an add-on to onnxruntime >= 1.24.2, "
    "registered with onnxruntime.register_execution_provider_library)",
    "CoreMLExecutionProvider": "the plain onnxruntime wheel has it on macOS only",
    "DmlExecutionProvider": "pip install onnxruntime-directml (Windows, in place of onnxruntime)",
    "XnnpackExecutionProvider": "an onnxruntime build with --use_xnnpack (not on PyPI for x86)",
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


def install_hint(provider: str) -> str:
    """How to get ``provider`` (alias or ORT name) into this environment, as one sentence."""
    name = to_ort_name(provider)
    return _INSTALL.get(name, f"install an onnxruntime build that includes {name}")


def provider_options(provider: str, *, engine_cache_dir: Path | None = None) -> dict[str, str]:
    """The onnxruntime options edgeinfer sets for ``provider`` (empty: ORT's defaults).

    Args:
        provider: alias or ORT name.
        engine_cache_dir: TensorRT only: where built engines and kernel timings are kept.
    """
    name = to_ort_name(provider)
    if name == ALIASES["cuda"]:
        return {
            # Grow the arena by what is asked, not to the next power of two: on a Jetson the GPU
            # shares the board's RAM, and a doubling can hold hundreds of MB nothing uses.
            "arena_extend_strategy": "kSameAsRequested",
            # The default EXHAUSTIVE times every cuDNN conv algorithm for each new input shape
            # (seconds per shape on first use); cuDNN's heuristic pick costs nothing at start.
            "cudnn_conv_algo_search": "HEURISTIC",
        }
    if name == ALIASES["tensorrt"]:
        options = {
            "trt_fp16_enable": "1",  # tensor cores; tools/gpu_check.sh checks fp16 parity
            # An engine build takes minutes on a Jetson: build once, reuse on every start.
            "trt_engine_cache_enable": "1",
            # A rebuild (new shapes, new TensorRT) reuses the measured kernel timings.
            "trt_timing_cache_enable": "1",
        }
        if engine_cache_dir is not None:
            options["trt_engine_cache_path"] = str(engine_cache_dir)
            options["trt_timing_cache_path"] = str(engine_cache_dir)
        return options
    return {}


def with_options(providers: list[str], *, package: Path) -> list[tuple[str, dict[str, str]]]:
    """``providers`` (resolved ORT names) paired with their options for ``package``, the form
    ``InferenceSession(providers=...)`` takes; TensorRT's engine cache goes where the package's
    manifest says (``Manifest.engine_cache_dir``)."""
    engines: Path | None = None
    if ALIASES["tensorrt"] in providers:
        from edgeinfer.manifest import Manifest

        engines = Manifest.read(package).engine_cache_dir(package)
        engines.mkdir(parents=True, exist_ok=True)
    return [(p, provider_options(p, engine_cache_dir=engines)) for p in providers]


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
