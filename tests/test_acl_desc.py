"""The acl backend's description -> GearSpec functions, on their own: no pyACL, no double.

What pyACL reports (names, dims with -1, dtypes, sizes, the gear lists) goes in as plain
values; the spec or a GearFileError naming the model comes out.
"""

from __future__ import annotations

import numpy as np
import pytest

from gear_runtime.backends.acl import desc
from gear_runtime.errors import BackendError, GearFileError, GearSpecError

F32 = np.dtype(np.float32)


def tensors(**dims: tuple[int, ...]) -> desc.Tensors:
    return desc.Tensors(tuple(dims), tuple(dims.values()), (F32,) * len(dims),
                        (1 << 20,) * len(dims))


def test_dims_of_reads_an_acl_dims_dict_and_refuses_anything_else() -> None:
    assert desc.dims_of({"name": "x", "dimCount": 2, "dims": [3, -1, 99]}, "what") == (3, -1)
    with pytest.raises(BackendError, match="what: pyACL returned"):
        desc.dims_of([3, 4], "what")


def test_hw_pairs_nested_or_flat() -> None:
    assert desc.hw_pairs({"hwCount": 2, "hw": [[224, 224], [448, 320]]}) == [(224, 224),
                                                                               (448, 320)]
    assert desc.hw_pairs({"hwCount": 2, "hw": [224, 224, 448, 320]}) == [(224, 224), (448, 320)]
    with pytest.raises(GearFileError, match="reports 2 gears"):
        desc.hw_pairs({"hwCount": 2, "hw": [224, 224, 448]})


def test_declared_order_checks_names_and_static_dims() -> None:
    inputs = tensors(x=(1, -1), m=(-1, -1))
    assert desc.declared_order(inputs, None, "m.om") == (0, 1)
    assert desc.declared_order(inputs, (["m", "x"], [(-1, -1), (1, -1)]), "m.om") == (1, 0)
    with pytest.raises(GearSpecError, match="names \\['x', 'y'\\]"):
        desc.declared_order(inputs, (["x", "y"], [(1, -1), (-1, -1)]), "m.om")
    with pytest.raises(GearSpecError, match="gives 'x' the shape \\[2, -1\\]"):
        desc.declared_order(inputs, (["x", "m"], [(2, -1), (-1, -1)]), "m.om")


def test_dims_spec_marks_positions_that_are_minus_one_or_differ() -> None:
    inputs = tensors(x=(1, -1), m=(-1, -1))
    spec = desc.dims_spec(inputs, (0, 1), [(1, 20, 1, 1), (1, 40, 2, 2)], "m.om")
    assert spec.mode == "dims" and spec.input_names == ("x", "m")
    assert spec.input_shapes == ((1, -1), (-1, -1))
    assert spec.gears == ((20, 1, 1), (40, 2, 2))
    with pytest.raises(GearFileError, match="gear 1 of 'm.om' has 3 dims"):
        desc.dims_spec(inputs, (0, 1), [(1, 20, 1, 1), (1, 40, 2)], "m.om")
    with pytest.raises(GearFileError, match="static dim 0 of 'm.om' is 1"):
        desc.dims_spec(inputs, (0, 1), [(3, 20, 1, 1), (3, 40, 2, 2)], "m.om")


def test_infer_order_takes_the_one_fitting_order_and_refuses_ambiguity() -> None:
    # only m first fits: x's static 1 cannot sit where the gears give 20 / 40
    inputs = tensors(x=(1, -1), m=(-1, 5))
    assert desc.infer_order(inputs, [(20, 5, 1, 7), (40, 5, 1, 9)], "m.om") == (1, 0)
    with pytest.raises(GearFileError, match="fit no order"):
        desc.infer_order(inputs, [(20, 6, 1, 7)], "m.om")
    same = tensors(a=(-1,), b=(-1,))
    with pytest.raises(GearFileError, match="several orders.*pass input_shape="):
        desc.infer_order(same, [(1, 2), (3, 4)], "m.om")


def test_listed_spec_needs_a_dynamic_axis_where_the_mode_says() -> None:
    spec = desc.listed_spec(tensors(img=(-1, 3, 8, 8)), (0,), "batch", [(1,), (4,)], "m.om")
    assert spec.mode == "batch" and spec.gears == ((1,), (4,))
    with pytest.raises(GearFileError, match="no input has a -1 dim"):
        desc.listed_spec(tensors(img=(1, 3, 8, 8)), (0,), "batch", [(1,)], "m.om")
    with pytest.raises(GearFileError, match="-1 beyond dim 0"):
        desc.listed_spec(tensors(img=(-1, 3, -1, 8)), (0,), "batch", [(1,)], "m.om")


def test_checked_output_shapes_fit_the_output_buffer() -> None:
    outputs = desc.Tensors(("y",), ((4, 8),), (F32,), (4 * 8 * 4,))
    assert desc.checked_output_shapes(outputs, [(2, 8)], 0) == ((2, 8),)
    with pytest.raises(GearFileError, match="output 'y' of gear 1 has shape \\(8, 8\\)"):
        desc.checked_output_shapes(outputs, [(8, 8)], 1)
    with pytest.raises(GearFileError, match="has shape \\(-1, 8\\)"):
        desc.checked_output_shapes(outputs, [(-1, 8)], 0)
