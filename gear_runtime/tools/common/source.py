"""Does a plain ONNX model (a reference to time against) take the gear file's inputs, at every
gear's shapes? The rule of ``bench --reference``: checked on ONNX Runtime's view of the model
before any run, so that a wrong model is one clear error instead of ONNX Runtime's
InvalidArgument mid-run. (``check-padding`` feeds its source the request sizes, not the
gears': it checks names, dtypes and ranks itself, with :func:`ort_type`'s type strings.)"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gear_runtime.errors import InputError

#: numpy dtype names whose ONNX Runtime type string differs (``tensor(<name>)`` otherwise).
_ORT_NAMES = {"float32": "float", "float64": "double"}


def ort_type(dtype: np.dtype) -> str:
    """ONNX Runtime's type string of a numpy dtype: float32 -> ``tensor(float)``."""
    name = np.dtype(dtype).name
    return f"tensor({_ORT_NAMES.get(name, name)})"


def check_source_inputs(session: Any, dtypes: Mapping[str, np.dtype],
                        shapes: Iterable[Mapping[str, Sequence[int]]], what: str) -> None:
    """InputError "<what> does not match the gear file (inputs ...)" unless ``session`` (an
    ``onnxruntime.InferenceSession``) has exactly the inputs of ``dtypes`` (name -> dtype),
    each of that dtype, and accepts every gear's static shapes of ``shapes`` (its fixed dims
    equal, its rank the same; a symbolic dim takes any size)."""
    got = {i.name: i for i in session.get_inputs()}
    if sorted(got) != sorted(dtypes):
        raise InputError(f"{what} does not match the gear file (inputs {sorted(got)}; the gear "
                         f"file's are {sorted(dtypes)})")
    for name, dtype in dtypes.items():
        if got[name].type != ort_type(dtype):
            raise InputError(f"{what} does not match the gear file (input {name!r} is "
                             f"{got[name].type}; the gear file's is {ort_type(dtype)})")
    for gear in shapes:
        for name, shape in gear.items():
            if not _accepts(got[name].shape, shape):
                raise InputError(f"{what} does not match the gear file (input {name!r} has "
                                 f"shape {list(got[name].shape)}; the gear file feeds it "
                                 f"{list(shape)})")


def _accepts(declared: Sequence[Any] | None, shape: Sequence[int]) -> bool:
    if declared is None:  # no shape recorded: any
        return True
    return len(declared) == len(shape) and all(  # a str, None or negative dim is symbolic
        not isinstance(d, int) or d < 0 or d == s for d, s in zip(declared, shape, strict=True))


__all__ = ["check_source_inputs", "ort_type"]
