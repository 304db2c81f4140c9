"""The serving errors, in gear_runtime's one hierarchy, and their HTTP status.

Every error the server answers with is a :class:`~gear_runtime.errors.GearRuntimeError`, so
the response body ``{"error": "[code] message", "code": code}`` carries the same GE code a
service would see in process. :func:`http_status` is the one table from error to status
(the gRPC status follows from it).

Codes: a name the server has no model for is 145002 (GE's "model file path invalid": the
name leads to no model file), a model that exists but is not loaded (unloaded through the
repository, or the server shutting down) is 145003 (GE's "model id invalid": what ACL answers
for an unloaded model id), a malformed request 145000, a request of the wrong shape 145012 or
out of the gears 145013, and 503s for a full queue or too many connections carry no GE code
(GE has none for them): ``"code"`` is then the reason, ``"queue_full"`` / ``"overloaded"``.
"""

from __future__ import annotations

from gear_runtime.errors import (
    ACL_ERROR_GE_EXEC_MODEL_ID_INVALID,
    ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID,
    ClosedError,
    CompileError,
    GearFileError,
    GearRuntimeError,
    GearSpecError,
    InputError,
)


class StatusError(GearRuntimeError):
    """An error that carries its HTTP status itself (a route's 404 / 405; an answer another
    worker gave, kept as it was)."""

    status = 500


class PeerAnswerError(StatusError):
    """The error another worker answered a forwarded request with (serving/peers.py): its
    status, code and message are passed on unchanged; that worker counted and logged it."""

    def __init__(self, message: str, code: str | None = None, status: int = 500) -> None:
        super().__init__(message, code)
        self.status = status

    def __reduce__(self) -> tuple[type[PeerAnswerError], tuple[str, str, int]]:
        return (type(self), (self.message, self.code, self.status))


class ModelNotFoundError(GearRuntimeError, LookupError):
    """No model of that name (or version) is served, nor in the model repository. Code
    145002: the name leads to no model file."""

    default_code = ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID


class ModelNotLoadedError(GearRuntimeError, LookupError):
    """A model of the repository that is not loaded (never, or unloaded). Code 145003: what
    ACL answers for a model id that is not loaded."""

    default_code = ACL_ERROR_GE_EXEC_MODEL_ID_INVALID


class PayloadTooLargeError(InputError):
    """The request body (or its decompressed form) is larger than the server accepts."""


class HeadersTooLargeError(PayloadTooLargeError):
    """The request line and headers are larger than the server accepts (HTTP 431)."""


class RequestTimeoutError(InputError):
    """The client did not send its headers or its body in time (HTTP 408)."""


class UnavailableError(GearRuntimeError, RuntimeError):
    """The server cannot take the request now: retry later (HTTP 503 + Retry-After)."""


class QueueFullError(UnavailableError):
    """The model's queue holds ``--max-queue`` requests already."""

    default_code = "queue_full"


class OverloadedError(UnavailableError):
    """The server holds ``--max-connections`` connections already."""

    default_code = "overloaded"


class RequestExpiredError(UnavailableError):
    """A request still waiting in its model's queue when its deadline passed (the request
    parameter ``timeout``, in microseconds, as Triton names it): dropped before it ran and
    answered as Triton answers it, 503 / UNAVAILABLE "Request timeout expired"."""

    default_code = "request_timeout"


class DeadlineExceededError(RequestExpiredError):
    """A gRPC call whose deadline passed while its request waited in the queue: answered
    DEADLINE_EXCEEDED (HTTP 408 in the one status table), what the client's own deadline
    reports."""


class ModelConfigError(GearFileError):
    """A model of the repository whose Triton ``config.pbtxt`` cannot be served as written
    (a field that contradicts the gear file, or that describes another kind of model)."""


#: Seconds a client is told to wait after a 503 (queue full or shutting down).
RETRY_AFTER_S = 1

#: error class -> HTTP status, most specific first (the first match wins).
_STATUS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    ((ModelNotFoundError, ModelNotLoadedError), 404),
    ((RequestTimeoutError, DeadlineExceededError), 408),
    (HeadersTooLargeError, 431),
    (PayloadTooLargeError, 413),
    # a bad request, or a model file (loaded through the repository) that cannot be served
    ((InputError, GearFileError, GearSpecError, CompileError), 400),
    ((UnavailableError, ClosedError), 503),
)


def http_status(exc: BaseException) -> int:
    """The HTTP status for ``exc``: 404 unknown or unloaded model, 408 too slow, 413 / 431
    too large, 400 bad input (every InputError: datatype, shape, 145012, out-of-gear 145013;
    a bad model file to load), 503 queue full, too many connections or shutting down, 500
    anything else (a failure of the server, not of the request)."""
    if isinstance(exc, StatusError):
        return exc.status
    for kinds, status in _STATUS:
        if isinstance(exc, kinds):
            return status
    return 500


def error_code(exc: BaseException) -> str:
    """The label an error is counted under: its GE code, else its class name."""
    code = getattr(exc, "code", "")
    return code if isinstance(code, str) and code else type(exc).__name__
