"""Metadata edited on purpose and resealed (``gear_runtime.gearfile.reseal``, the documented way
to change a gear file) is checked against the gear shapes at load: output axes that padding
would trim along must follow their dynamic value in every gear. A contradiction is a
GearFileError naming the output, never an IndexError at execute or a silently trimmed output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import heavy_model
from onnx import TensorProto, helper

import gear_runtime as gr
import gear_runtime.gearfile
from gear_runtime.gearfile import digest
from gear_runtime.gearfile.format import META_OUTPUT_AXES


def _relu_model() -> onnx.ModelProto:
    """``y = Relu(x)``, x float32 [A, B]: with spec ``x:-1,-1`` axis 0 of y follows value 0
    and axis 1 value 1."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["A", "B"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["A", "B"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def dims_file(tmp_path: Path) -> Path:
    path = tmp_path / "relu.gear.onnx"
    gr.compile(_relu_model(), gr.GearSpec.from_atc(input_shape="x:-1,-1",
                                                   dynamic_dims="2,3;4,6"),
               str(path), progress=False)
    return path


def _reseal_axes(path: Path, axes: object) -> None:
    model = onnx.load(str(path), load_external_data=False)
    for p in model.metadata_props:
        if p.key == META_OUTPUT_AXES:
            p.value = json.dumps(axes)
    path.write_bytes(gear_runtime.gearfile.reseal(model))  # the name the README gives


def test_the_readme_name_is_the_function() -> None:
    assert gear_runtime.gearfile.reseal is digest.reseal


def test_the_compiled_record_is_what_the_shapes_say(dims_file: Path) -> None:
    with gr.load(str(dims_file)) as model:
        assert model.output_dynamic_axes == [{0: 0, 1: 1}]


@pytest.mark.parametrize(("axes", "words"), [
    ([{"99": 0}], "axis 99 is recorded to follow dynamic value 0, but in gear 0 .* it has no "
                  "axis 99"),
    ([{"0": 1}], "axis 0 is recorded to follow dynamic value 1, but in gear 0 \\(2, 3\\) its "
                 "shape is \\(2, 3\\): its axis 0 is 2"),
    ([{"1": 0}], "axis 1 is recorded to follow dynamic value 0"),
    ([{"0": 0, "1": 0}], "axis 1 is recorded to follow dynamic value 0"),
])
def test_axes_that_contradict_the_gear_shapes_are_refused_naming_the_output(
        dims_file: Path, axes: object, words: str) -> None:
    _reseal_axes(dims_file, axes)
    with pytest.raises(gr.GearFileError, match=f"output 'y': {words}"):
        gr.load(str(dims_file))


def test_an_axis_left_out_on_purpose_loads_and_is_returned_whole(dims_file: Path) -> None:
    _reseal_axes(dims_file, [{"0": 0}])  # trim rows only
    with gr.load(str(dims_file)) as model:
        ex = model.create_executor()
        x = np.arange(2, dtype=np.float32).reshape(1, 2)
        (y,) = ex.execute({"x": x}, pad=True)
        assert ex.last_gear == 0 and y.shape == (1, 3)  # axis 1 is the gear's, whole
        np.testing.assert_array_equal(y, [[0, 1, 0]])


def test_the_issue_case_a_batch_output_is_not_cut_to_one_column(tmp_path: Path) -> None:
    """Resealed ``[{"1": 0}]`` on a batch model used to trim a (1, 64) output to (1, 1)."""
    path = tmp_path / "h.gear.onnx"
    gr.compile(heavy_model(width=64, layers=1), gr.GearSpec.from_atc(
        input_shape="x:-1,64", dynamic_batch_size="1,4"), str(path), progress=False)
    _reseal_axes(path, [{"1": 0}])
    with pytest.raises(gr.GearFileError, match="output 'y': axis 1 is recorded to follow"):
        gr.load(str(path))
