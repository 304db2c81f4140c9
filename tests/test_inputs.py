"""One list-to-array rule (gear_runtime/runtime/inputs.py) for the executor and the server.

Every case runs through both callers: ``Executor.execute`` with a Python list, and the v2
protocol's JSON decoding (``serving/protocol.decode_request``) with the same values. They
must agree on the verdict and, when accepted, on the array. A caller that grows a rule of its
own (the server accepting what the executor refuses, or the reverse) fails here.
"""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.backends import null
from gear_runtime.runtime.inputs import list_to_array
from gear_runtime.runtime.model import GearModel

#: (label, dtype, the 4 values of a [1, 4] input, the error's text or None when accepted)
CASES: list[tuple[str, str, list[Any], str | None]] = [
    ("floats into float32", "float32", [0.5, 0.7, -2.0, 1e30], None),
    ("ints into float32, exact", "float32", [1, 2, -3, 2**24], None),
    ("an int float32 cannot hold", "float32", [1, 2, 3, 2**24 + 1],
     "holds the integer 16777217, which the model's float32 input cannot hold exactly"),
    ("ints into float16, exact and not", "float16", [1, 2, 2048, 2049],
     "holds the integer 2049"),
    ("float32 overflow", "float32", [1e39, 0.0, 0.0, 0.0],
     "holds the value 1e+39, out of range for the model's float32 input"),
    ("ints into float64 beyond 64 bits, exact", "float64", [2**70, 1, 2, 3], None),
    ("floats into int64", "int64", [0.7, 1.0, 2.0, 3.0],
     "holds float values (first: 0.7); the model's input is int64"),
    ("bools into int64", "int64", [True, False, True, True], "holds bool values"),
    ("ints into bool", "bool", [1, 0, 1, 0], "holds integer values"),
    ("bools into bool", "bool", [True, False, True, True], None),
    ("strings", "int64", ["1", "2", "3", "4"], "holds string values"),
    ("beyond int64", "int64", [2**63, 0, 0, 0], "holds the value 9223372036854775808"),
    ("uint64 top", "uint64", [2**64 - 1, 0, 1, 2], None),
    ("uint8 wrap-around", "uint8", [300, 0, 1, 2], "holds the value 300, out of range"),
    ("negative into uint8", "uint8", [-1, 0, 1, 2], "holds the value -1, out of range"),
    ("None", "float32", [None, None, None, None], "holds a NoneType value (None)"),
    ("None among ints", "int64", [1, None, 2, 3], "holds a NoneType value (None)"),
]

#: Values JSON cannot carry: the executor alone (the server never sees them).
PYTHON_ONLY: list[tuple[str, str, list[Any], str]] = [
    ("Fraction", "float32", [Fraction(1, 2)] * 4, "holds a Fraction value (Fraction(1, 2))"),
    ("Decimal", "float32", [Decimal("0.5")] * 4, "holds a Decimal value (Decimal('0.5'))"),
    ("Fraction into int64", "int64", [Fraction(1, 1)] * 4, "holds a Fraction value"),
]

DATATYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64",
             "uint64": "UINT64", "uint8": "UINT8", "bool": "BOOL"}


def executor_for(dtype: str) -> gr.Executor:
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1", dynamic_dims="4;16")
    return GearModel(null.open_model(None, spec=spec, input_dtypes=[dtype])).create_executor()


def via_executor(dtype: str, values: list[Any]) -> np.ndarray:
    ex = executor_for(dtype)
    ex.execute({"x": [values]})
    layout, staging = ex.model.layout, ex.session.staging
    off, n = layout.offset(0, 0), layout.nbytes(0, 0)
    return staging[off:off + n].view(np.dtype(dtype)).reshape(1, 4).copy()


def via_protocol(dtype: str, values: list[Any]) -> np.ndarray:
    from gear_runtime.serving.protocol import decode_request

    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": DATATYPES[dtype],
                        "data": values}]}
    return decode_request(json.dumps(body).encode()).inputs["x"]


@pytest.mark.parametrize("label, dtype, values, error", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("via", [via_executor, via_protocol], ids=["executor", "server"])
def test_one_rule_for_lists(via, label, dtype, values, error) -> None:
    if error is None:
        got = via(dtype, values)
        assert got.dtype == np.dtype(dtype) and got.shape == (1, 4)
        np.testing.assert_array_equal(got, np.asarray([values], dtype=object).astype(dtype))
        return
    with pytest.raises(gr.InputError) as info:
        via(dtype, values)
    assert "input 'x'" in str(info.value) and error in str(info.value), label
    assert info.value.code == "145000"


@pytest.mark.parametrize("label, dtype, values, error", PYTHON_ONLY,
                         ids=[c[0] for c in PYTHON_ONLY])
def test_python_objects_are_refused_naming_the_input(label, dtype, values, error) -> None:
    with pytest.raises(gr.InputError) as info:
        via_executor(dtype, values)
    assert "input 'x'" in str(info.value) and error in str(info.value), label


def test_a_row_of_none_in_a_wider_input() -> None:
    """#20: [[None] * 16] was an AttributeError inside the list check."""
    ex = executor_for("float32")
    with pytest.raises(gr.InputError, match="input 'x' holds a NoneType value"):
        ex.execute({"x": [[None] * 16]})


@pytest.mark.parametrize("pad, error", [
    (None, "pad_values: input 'x' holds a NoneType value"),
    (Fraction(1, 2), "pad_values: input 'x' holds a Fraction value"),
    (0.5, None),
    (0, None),  # an int a float input holds exactly: 0.0
    ([0.5], "pad value of input 'x' must be one float32 value"),
])
def test_pad_values_follow_the_list_rule(pad, error) -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1", dynamic_dims="4;16")
    model = GearModel(null.open_model(None, spec=spec, input_dtypes=["float32"]))
    if error is not None:
        with pytest.raises(gr.InputError, match=error.replace("(", r"\(")):
            model.create_executor(pad_values={"x": pad})
        return
    assert model.create_executor(pad_values={"x": pad}).pad_values["x"] == np.float32(pad)


def test_the_rule_keeps_the_nesting_and_takes_the_inputs_width() -> None:
    a = list_to_array("x", [[0.7, 1], [2, 3]], np.float16)
    assert a.dtype == np.float16 and a.shape == (2, 2)
    assert list_to_array("x", [], np.int32).dtype == np.int32


def test_name_checks_are_one_rule() -> None:
    ex = executor_for("float32")
    with pytest.raises(gr.InputError, match="missing: x; unknown: y"):
        ex.execute({"y": [[0.0] * 4]})
    with pytest.raises(gr.InputError, match="pad_values names unknown inputs: y"):
        ex.model.create_executor(pad_values={"y": 0})
