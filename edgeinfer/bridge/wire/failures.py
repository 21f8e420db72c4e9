"""The one map from an exception raised while serving a request to its wire error, and back
on the client side (``raise_for_error``: an error reply to a ``ReplyError``).

The worker and the generation lanes both answer through it, so one failure gets one code
wherever it happens: what the caller can fix (an input the model refuses, a bad sampling
value, an encoded image without Pillow on the device) is ``bad_request`` with the reason; a
graph run stopped at its limit is ``run_timeout`` (``--run-timeout``), or ``deadline_exceeded``
when the request's own deadline stopped it (or passed before its graph ran); anything else
is ``internal``, with edgeinfer's own error code when it is one of ours, and logged with its
traceback when it is not (a bug to report).
"""

from __future__ import annotations

import logging
from typing import Any

from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.errors import (
    ConfigError,
    EdgeInferError,
    InputError,
    MissingDependencyError,
    ReplyError,
    RunTimeoutError,
)

__all__ = ["raise_for_error", "wire_error"]

log = logging.getLogger(__name__)

# Errors in what the request asked for: the caller can change the request and succeed.
_CALLER_ERRORS = (InputError, ConfigError, MissingDependencyError)
# RunTimeoutError.source -> the wire code: which limit stopped the run.
_STOPPED = {"run_timeout_s": proto.RUN_TIMEOUT, "deadline": proto.DEADLINE_EXCEEDED}


def wire_error(exc: Exception, *, request_id: str) -> tuple[str, str]:
    """(code, message) of the error reply for ``exc``, raised serving ``request_id``."""
    if isinstance(exc, _CALLER_ERRORS):
        return proto.BAD_REQUEST, str(exc)
    if isinstance(exc, RunTimeoutError):
        log.warning("request %r stopped: %s", request_id, exc)
        return _STOPPED[exc.source], str(exc)
    if isinstance(exc, EdgeInferError):
        log.warning("request %r failed: %s: %s", request_id, exc.code, exc)
        return proto.INTERNAL, f"{exc.code}: {exc}"
    log.error("request %r failed unexpectedly", request_id, exc_info=exc)
    return proto.INTERNAL, "internal error (the bridge's log has the traceback)"


def raise_for_error(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` when it says ``ok``; else ``ReplyError`` carrying its wire code."""
    if reply.get("ok") is True:
        return reply
    raise ReplyError(reply)
