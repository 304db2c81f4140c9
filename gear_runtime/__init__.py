"""gear_runtime: run models compiled with dynamic gears (CANN GE dynamic batch / image size /
dims), on Ascend through pyACL or MindSpore Lite, and anywhere through ONNX Runtime.

    spec = gr.GearSpec.from_atc(input_shape="data:-1,3,224,224", dynamic_batch_size="1,8,16")
    gr.compile("model.onnx", spec, "model.gear.onnx")
    model = gr.load("model.gear.onnx")
    ex = model.create_executor()
    outputs = ex.execute({"data": batch})

Backends are imported lazily: importing this package needs none of pyACL, MindSpore Lite or a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gear_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    ClosedError,
    CompileError,
    DynamicInputLengthError,
    ExecutorBusyError,
    GearFileError,
    GearMismatchError,
    GearRuntimeError,
    GearSpecError,
    InputError,
    PaddingUnsafeError,
)
from gear_runtime.spec import GearSpec

if TYPE_CHECKING:
    from gear_runtime.backends.base import DeviceBuffer
    from gear_runtime.runtime.executor import Executor
    from gear_runtime.runtime.model import GearModel

from gear_runtime.version import __version__

__all__ = [
    "__version__",
    "BackendError",
    "BackendUnavailableError",
    "ClosedError",
    "CompileError",
    "DeviceBuffer",
    "DynamicInputLengthError",
    "ExecutorBusyError",
    "Executor",
    "GearFileError",
    "GearMismatchError",
    "PaddingUnsafeError",
    "GearModel",
    "GearRuntimeError",
    "GearSpec",
    "GearSpecError",
    "InputError",
    "check_padding",
    "compile",
    "load",
    "plan_gears",
]


def compile(model: Any, spec: GearSpec, output: str, hybrid: bool = False,  # noqa: A001
            sink: bool = False, **kwargs: Any) -> str:
    """Compile a dynamic ONNX model into one gear file (``compiler.compile_model``).

    ``check_padding=True`` (or a dict of :func:`check_padding`'s keywords, e.g.
    ``{"valid": {"present_kv": 4}}``): then run check-padding on the written file against
    ``model`` (a probe of request sizes between the gears) and record its verdict in the
    file (``record=True``): a model found UNSAFE is never padded when loaded."""
    from gear_runtime.compiler import compile_model

    probe = kwargs.pop("check_padding", False)
    written = compile_model(model, spec, output, hybrid=hybrid, sink=sink, **kwargs)
    if probe is not False and probe is not None:
        from gear_runtime.tools.check.padding import check_padding as _check

        options = dict(probe) if isinstance(probe, dict) else {}
        if not isinstance(probe, dict) and probe is not True:
            raise InputError(f"check_padding must be True or a dict of check_padding's "
                             f"keywords, got {probe!r}")
        _check(written, model, record=True, **options)
    return written


def load(path: str, backend: str = "onnxruntime", **options: Any) -> GearModel:
    """Load a gear model on ``backend``; see :func:`gear_runtime.runtime.model.load`."""
    from gear_runtime.runtime.model import load as _load

    return _load(path, backend=backend, **options)


def __getattr__(name: str) -> Any:  # lazy re-exports keep `import gear_runtime` light
    if name == "GearModel":
        from gear_runtime.runtime.model import GearModel

        return GearModel
    if name == "Executor":
        from gear_runtime.runtime.executor import Executor

        return Executor
    if name == "DeviceBuffer":
        from gear_runtime.backends.base import DeviceBuffer

        return DeviceBuffer
    if name == "check_padding":
        from gear_runtime.tools.check.padding import check_padding

        return check_padding
    if name == "plan_gears":
        from gear_runtime.tools.plan import plan_gears

        return plan_gears
    raise AttributeError(f"module 'gear_runtime' has no attribute {name!r}")
