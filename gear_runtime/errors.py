"""The one exception hierarchy of gear_runtime, and the one place errors are mapped.

Every error carries ``.code``: the GE / ACL code it mirrors (``"E10035"``, ``"145013"``) so
that a service can log or branch on the same codes it would see on Ascend. The C++ core
raises by *kind* (see :data:`KINDS`); :func:`make_error` turns a kind into the class here, so
the mapping lives in one place for both layers (ONNX Runtime's Python layer does the same).
"""

from __future__ import annotations

# ACL / GE codes we mirror (docs/ge-notes.md sections 1-2 and 10; the C++ core's are in
# csrc/errors.h, kept equal by tests/test_shared_facts.py).
ACL_ERROR_GE_PARAM_INVALID = "145000"
ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID = "145002"
ACL_ERROR_GE_EXEC_MODEL_ID_INVALID = "145003"
ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID = "145012"
ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = "145013"


class GearRuntimeError(Exception):
    """Base of every error raised by gear_runtime.

    ``code`` is the GE/ACL code this error mirrors (a string; ``""`` when there is none).
    """

    default_code = ""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = self.default_code if code is None else str(code)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}" if self.code else self.message

    # keep code across pickling (multiprocessing services)
    def __reduce__(self) -> tuple[type[GearRuntimeError], tuple[object, ...]]:
        return (type(self), (self.message, self.code))


class GearSpecError(GearRuntimeError, ValueError):
    """A gear specification (atc flags, GE options, config file) that GE would reject."""


class CompileError(GearRuntimeError, ValueError):
    """The model and the spec do not fit together, or a gear could not be compiled."""


class GearFileError(GearRuntimeError, ValueError):
    """A file that is not a readable gear model (missing, corrupt, wrong format version)."""

    default_code = ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID


class InputError(GearRuntimeError, ValueError):
    """Inputs that cannot be executed: missing or unknown names, wrong dtype, wrong rank."""

    default_code = ACL_ERROR_GE_PARAM_INVALID


class DynamicInputLengthError(InputError):
    """The inputs' full dims have the wrong length, or a static dim differs (GE 145012)."""

    default_code = ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID


class GearMismatchError(InputError):
    """The dynamic dims match no gear of the model (GE 145013); never a silent gear 0."""

    default_code = ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID


class PaddingUnsafeError(GearMismatchError):
    """A request that matches no gear and needs padding, on a model whose padding verdict
    (recorded by ``check-padding --record``, or declared ``pad_safe=False``) is UNSAFE:
    padding would change its outputs (a recurrent state decayed by pad positions), so it is
    refused rather than answered wrongly. Run a request that matches a gear exactly,
    re-export the model padding-safe, or declare ``pad_safe=True`` if the check was wrong
    for your use. GE's code of a request that matches no gear (145013), as on Ascend."""


class BackendError(GearRuntimeError, RuntimeError):
    """A backend call failed; the message names the call, ``code`` is its return code."""


class DataRefusedError(BackendError, InputError):
    """The backend refused the request's DATA while running it (shapes and dtypes were
    right): an index out of range for a Gather, a value a kernel rejects. A bad request, not
    a failure of the server: HTTP 400 (it is an InputError), and still a BackendError for
    code that catches those."""


class MemoryBudgetError(GearRuntimeError, MemoryError):
    """What was asked for (an executor's buffers, a CLI run's synthetic inputs) needs more host
    memory in total than the budget allows; raised BEFORE anything is allocated, the message
    naming the sizes and how to raise the budget (``create_executor(max_bytes=)``,
    ``GEAR_RUNTIME_MAX_BYTES``, ``--max-memory``). A request of the user, not a failure of a
    backend: the CLI exits 2."""


class ExecutorBusyError(GearRuntimeError, RuntimeError):
    """Another thread is inside this executor (execute or set_*): an executor belongs to one
    thread at a time. Raised at once, before anything of the executor is touched, so the call
    in flight keeps its result. GE has no code for it (ACL's per-dataset dims simply race)."""


class ClosedError(GearRuntimeError, RuntimeError):
    """A closed model or executor was used again. Code 145003 (ACL_ERROR_GE_EXEC_MODEL_ID_INVALID):
    what ACL answers for a model id that was unloaded."""

    default_code = ACL_ERROR_GE_EXEC_MODEL_ID_INVALID


class BackendUnavailableError(GearRuntimeError, ImportError):
    """A backend whose runtime is not installed here; the message says what to install."""


class DirectRunFailed(Exception):
    """Internal, between the C++ core and the executor: a backend's direct run
    (``BackendSession.direct_runs``) raised; ``gear`` is the gear it ran, ``__cause__`` what it
    raised. The executor raises the backend's own error for it (``run_failed``) instead, so
    that a run's failure reads the same whichever way the gear ran."""

    def __init__(self, gear: int) -> None:
        super().__init__(f"the direct run of gear {gear} failed")
        self.gear = gear


#: The error kinds the C++ core raises (csrc/errors.h: kKind*) -> Python class. One table for
#: both layers; tests/test_shared_facts.py keeps its keys and the codes above equal to the
#: header's.
KINDS: dict[str, type[GearRuntimeError]] = {
    "spec": GearSpecError,
    "input": InputError,
    "length": DynamicInputLengthError,
    "mismatch": GearMismatchError,
}


def make_error(kind: str, message: str, code: str | None = None) -> GearRuntimeError:
    """Build the exception for ``kind`` (a key of :data:`KINDS`); unknown kinds -> base class."""
    return KINDS.get(kind, GearRuntimeError)(message, code)
