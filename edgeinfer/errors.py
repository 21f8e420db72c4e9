"""The one exception tree of edgeinfer.

Every error that edgeinfer raises on purpose is an ``EdgeInferError``. Third-party errors
(onnxruntime, tokenizers, torch, paho) are translated at the boundary with ``raise ... from exc``
so that callers catch one tree and still see the cause.

::

    EdgeInferError                  code
    ├── ConfigError                 config         bad argument, unknown task/target/source
    │   └── UnsupportedCallError    unsupported_call  a call the package's kind does not have
    ├── MissingDependencyError      missing_extra  an optional extra is not installed
    ├── PackageError                package        a model package cannot be used
    │   ├── ManifestError           manifest       manifest.json missing, malformed, wrong schema
    │   ├── IntegrityError          integrity      a file's sha256 or size differs from the manifest
    │   └── CheckLimitError         check_limit    a deployed package's check ran past its time
    │                                              or memory limit (``limit``: time | memory)
    ├── ProviderError               provider       no requested execution provider can run
    ├── InputError                  bad_input      an input the model cannot take (empty, too long)
    │   ├── ContextLengthExceededError  context_length  prompt + max_new_tokens > the context
    │   └── MemoryBudgetError       memory_budget  a request's KV cache would not fit the memory
    │                                              budget (``RuntimeConfig.memory_budget_bytes``
    │                                              or the cgroup's limit)
    ├── InferenceError              inference      onnxruntime failed while running a graph
    │   └── RunTimeoutError         run_timeout    a run passed its limit and was stopped
    │                                              (``source``: run_timeout_s | deadline)
    ├── BridgeError                 bridge         the MQTT bridge or its client failed
    │   ├── BrokerAuthError         broker_auth    the broker refused the login (user, password)
    │   ├── BrokerUnavailableError  broker_unavailable  no broker connection within the timeout
    │   ├── ReplyError              reply_error    the bridge answered with an error reply
    │   ├── RequestTimeoutError     request_timeout  no reply came in time (after every re-send)
    │   └── DeployRefusedError      deploy_refused  a device refused a deploy or rollback
    │                                               (``reason``: downgrade, replay, ...)
    └── ExportError                 export         `edgeinfer export` failed
        ├── ConversionError         conversion     the source could not be converted to ONNX
        ├── ParityError             parity         fp32 ONNX differs from the source model
        ├── AccuracyGateError       accuracy_gate  a quantized variant lost more than allowed
        ├── SlowerQuantizationError quant_slower   int8 ran slower than fp32 on this machine
        └── EpCoverageError         ep_coverage    the accelerator provider takes too little

The CLI maps ``AccuracyGateError``, ``SlowerQuantizationError`` and ``EpCoverageError`` (a
check that failed) to exit code 1 and every other ``EdgeInferError`` to exit code 2.
``BrokerUnavailableError``, ``RequestTimeoutError`` and ``RunTimeoutError`` are also built-in
``TimeoutError``s, so callers that caught those still do; ``UnsupportedCallError`` is also an
``AttributeError``, so ``hasattr(model, "generate")`` and ``getattr(model, "max_sequences", 1)``
answer as for any object without the member.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "AccuracyGateError",
    "BridgeError",
    "BrokerAuthError",
    "BrokerUnavailableError",
    "CheckLimitError",
    "ConfigError",
    "ContextLengthExceededError",
    "ConversionError",
    "DeployRefusedError",
    "EdgeInferError",
    "EpCoverageError",
    "ExportError",
    "InferenceError",
    "InputError",
    "IntegrityError",
    "ManifestError",
    "MemoryBudgetError",
    "MissingDependencyError",
    "PackageError",
    "ParityError",
    "ProviderError",
    "ReplyError",
    "RequestTimeoutError",
    "RunTimeoutError",
    "SlowerQuantizationError",
    "UnsupportedCallError",
]


class EdgeInferError(Exception):
    """Base class of every error edgeinfer raises; ``code`` is stable and machine-readable."""

    code = "edgeinfer"


class ConfigError(EdgeInferError, ValueError):
    """An argument or configuration value is invalid."""

    code = "config"


class UnsupportedCallError(ConfigError, AttributeError):
    """A call that the loaded package's kind does not have (``classify`` on a ``raw``
    package); the message names the class that has it."""

    code = "unsupported_call"


class MissingDependencyError(EdgeInferError, ImportError):
    """An optional dependency is missing; the message gives the exact ``pip install`` line."""

    code = "missing_extra"

    def __init__(self, module: str, extra: str = "", *, install: str | None = None) -> None:
        how = install or f"it comes with the {extra!r} extra: pip install 'edgeinfer[{extra}]'"
        super().__init__(f"{module!r} is not installed; {how}")
        self.module = module
        self.extra = extra


class PackageError(EdgeInferError):
    """A model package cannot be used."""

    code = "package"


class ManifestError(PackageError):
    """``manifest.json`` is missing, malformed or of an unsupported schema."""

    code = "manifest"


class IntegrityError(PackageError):
    """A package file does not match the sha256 or size recorded in the manifest."""

    code = "integrity"


class CheckLimitError(PackageError):
    """A package's bounded check (load, warm-up, smoke cases in a child process) ran past its
    time or memory limit and was stopped; ``limit`` says which."""

    code = "check_limit"

    def __init__(self, limit: Literal["time", "memory"], message: str) -> None:
        super().__init__(message)
        self.limit: Literal["time", "memory"] = limit


class ProviderError(EdgeInferError):
    """None of the requested execution providers can run on this device."""

    code = "provider"


class InputError(EdgeInferError, ValueError):
    """An input the model cannot take (empty, wrong type, too long)."""

    code = "bad_input"


class InferenceError(EdgeInferError):
    """onnxruntime failed while loading or running a graph."""

    code = "inference"


class RunTimeoutError(InferenceError, TimeoutError):
    """A graph run passed its limit and onnxruntime stopped it (``runtime.watchdog``); the
    session stays usable. ``source`` says which limit: ``run_timeout_s``
    (``RuntimeConfig.run_timeout_s``) or ``deadline`` (the caller's, a request's deadline);
    ``ran`` is False when the deadline had passed before the run could start."""

    code = "run_timeout"

    def __init__(self, *, graph: str, limit_s: float, source: str, ran: bool) -> None:
        if source == "deadline":
            what = (
                f"was stopped after {limit_s:.3f} s: the deadline passed"
                if ran
                else "was not run: the deadline had passed"
            )
            advice = "give the request a later deadline, or send a smaller input"
        else:
            what = (
                f"ran past its limit of {limit_s:.3f} s (RuntimeConfig.run_timeout_s) and was "
                "stopped"
            )
            advice = (
                "this input makes the graph run too long: send a smaller one, or raise the limit "
                "(RuntimeConfig.run_timeout_s, `edgeinfer serve --run-timeout`) if the package "
                "is meant to take that long"
            )
        super().__init__(f"onnxruntime's run of {graph} {what}; {advice}")
        self.graph = graph
        self.limit_s = limit_s
        self.source = source
        self.ran = ran


class ExportError(EdgeInferError):
    """``edgeinfer export`` failed. ``report`` holds what the export measured before it
    failed (the ``report.json`` it would have written), for ``edgeinfer export --json``."""

    code = "export"
    report: dict[str, Any] | None = None


class ConversionError(ExportError):
    """The source model could not be converted to ONNX."""

    code = "conversion"


class ParityError(ExportError):
    """The fp32 ONNX graph does not reproduce the source model within tolerance."""

    code = "parity"


class AccuracyGateError(ExportError):
    """Every candidate variant lost more accuracy than the gate allows."""

    code = "accuracy_gate"


class SlowerQuantizationError(ExportError):
    """The quantized variant ran slower than fp32 on this machine."""

    code = "quant_slower"


class EpCoverageError(ExportError):
    """The first (accelerator) execution provider takes less of the graph than required."""

    code = "ep_coverage"

    def __init__(
        self, *, provider: str, coverage: float, min_coverage: float, cpu_coverage: float | None
    ) -> None:
        cpu = "" if cpu_coverage is None else f" (the CPU takes {cpu_coverage:.1%})"
        super().__init__(
            f"{provider} takes {coverage:.1%} of the estimated FLOPs{cpu}, less than the "
            f"required {min_coverage:.1%}; see `edgeinfer inspect PKG --providers "
            "... --placement` for the ops it leaves to the CPU, change the target preset, or "
            "lower --min-ep-coverage"
        )
        self.provider = provider
        self.coverage = coverage
        self.min_coverage = min_coverage


class ContextLengthExceededError(InputError):
    """The prompt's tokens plus ``max_new_tokens`` exceed the package's context length; raised
    before any graph runs."""

    code = "context_length"

    def __init__(self, *, prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
        super().__init__(
            f"the prompt has {prompt_tokens} tokens and max_new_tokens is {max_new_tokens}: "
            f"{prompt_tokens + max_new_tokens} > the context length {context_length}; "
            "shorten the prompt or lower max_new_tokens"
        )
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length


class MemoryBudgetError(InputError):
    """A request's KV cache would take more memory than the budget leaves (the budget less
    what the process already holds and cannot give back); raised before any graph runs, so a
    limit is never met by an OOM kill mid-request."""

    code = "memory_budget"

    def __init__(self, *, needed_bytes: int, free_bytes: int, budget_bytes: int, fits: int) -> None:
        super().__init__(
            f"this request needs {needed_bytes / 2**20:.1f} MiB more for its KV cache; the "
            f"memory budget of {budget_bytes / 2**20:.0f} MiB leaves "
            f"{max(free_bytes, 0) / 2**20:.1f} MiB: ask for at most {max(fits, 0)} tokens "
            "(prompt + max_new_tokens), or raise the limit (RuntimeConfig.memory_budget_bytes, "
            "the cgroup's memory.max)"
        )
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.budget_bytes = budget_bytes
        self.fits = fits


class BridgeError(EdgeInferError):
    """The MQTT bridge (``edgeinfer serve``) or its client (``edgeinfer.bridge.Client``) failed."""

    code = "bridge"


class BrokerAuthError(BridgeError):
    """The MQTT broker refused the connection: wrong or missing credentials, not authorized."""

    code = "broker_auth"


class BrokerUnavailableError(BridgeError, TimeoutError):
    """No connection to the MQTT broker within the timeout (down, unreachable, TLS failed)."""

    code = "broker_unavailable"


class RequestTimeoutError(BridgeError, TimeoutError):
    """No reply to a bridge request came in time, after every re-send."""

    code = "request_timeout"


class ReplyError(BridgeError):
    """The bridge answered a request with an error reply (``Client.request(...,
    raise_on_error=True)`` or ``raise_for_error``): ``wire_code`` is the reply's
    ``error.code`` (``busy``, ``bad_request``, ``deadline_exceeded``, ...; docs/mqtt.md),
    ``reply`` the whole reply."""

    code = "reply_error"

    def __init__(self, reply: dict[str, Any]) -> None:
        given = reply.get("error")
        error: dict[str, Any] = given if isinstance(given, dict) else {}
        self.wire_code = str(error.get("code", "internal"))
        self.reply = reply
        super().__init__(
            f"request {reply.get('id')!r} to {reply.get('model')!r} failed: {self.wire_code}: "
            f"{error.get('message', '')}"
        )


# Why a device refused a deploy or a rollback (``DeployRefusedError.reason``).
DeployRefusal = Literal[
    "unsigned",  # no signature with release metadata (version, devices, name, ...)
    "untrusted",  # signed by a key the device does not trust, directly or by rotation
    "revoked",  # signed by (or through) a revoked key
    "bad_signature",  # the signature does not verify over what it claims to sign
    "expired",  # the signed release or rollback is past its expiry
    "downgrade",  # an older version than one this device already accepted
    "replay",  # a release, version or rollback this device already took
    "wrong_device",  # signed for other devices (or another compatible class)
    "wrong_target",  # built for hardware this device cannot run (npu-*, gpu-*)
    "wrong_name",  # signed to be served under another name
    "too_large",  # more bytes than signed or allowed, or an oversized message
    "not_receiving",  # a chunk or commit for a deploy that is not in progress
    "no_previous",  # a rollback to a package this device does not keep
    "in_trial",  # a deploy of a name whose last deploy is still in its trial window
]


class DeployRefusedError(BridgeError):
    """A device refused a deploy or a rollback; ``reason`` says why and travels in the
    device's deploy status (``reason`` field), so scripts and tests can act on it."""

    code = "deploy_refused"

    def __init__(self, reason: DeployRefusal, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason: DeployRefusal = reason
