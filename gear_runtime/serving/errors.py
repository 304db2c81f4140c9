"""The serving errors, in gear_runtime's one hierarchy, and their HTTP status.

Every error the server answers with is a :class:`~gear_runtime.errors.GearRuntimeError`, so
the response body ``{"error": "[code] message", "code": code}`` carries the same GE code a
service would see in process. :func:`http_status` is the one table from error to status.
"""

from __future__ import annotations

from gear_runtime.errors import (
    ACL_ERROR_GE_EXEC_MODEL_ID_INVALID,
    ClosedError,
    GearRuntimeError,
    InputError,
)


class ModelNotFoundError(GearRuntimeError, LookupError):
    """No model of that name (or version) is served. Code 145003: what ACL answers for a
    model id it does not know."""

    default_code = ACL_ERROR_GE_EXEC_MODEL_ID_INVALID


class PayloadTooLargeError(InputError):
    """The request body (or its decompressed form) is larger than the server accepts."""


class QueueFullError(GearRuntimeError, RuntimeError):
    """The model's queue holds ``--max-queue`` requests already: retry later (HTTP 503)."""


#: Seconds a client is told to wait after a 503 (queue full or shutting down).
RETRY_AFTER_S = 1


def http_status(exc: BaseException) -> int:
    """The HTTP status for ``exc``: 404 unknown model, 413 oversized body, 400 bad input
    (every InputError: datatype, shape, 145012, out-of-gear 145013), 503 queue full or
    shutting down, 500 anything else (a failure of the server, not of the request)."""
    if isinstance(exc, ModelNotFoundError):
        return 404
    if isinstance(exc, PayloadTooLargeError):
        return 413
    if isinstance(exc, InputError):
        return 400
    if isinstance(exc, QueueFullError | ClosedError):
        return 503
    return 500


def error_code(exc: BaseException) -> str:
    """The label an error is counted under: its GE code, else its class name."""
    code = getattr(exc, "code", "")
    return code if isinstance(code, str) and code else type(exc).__name__
