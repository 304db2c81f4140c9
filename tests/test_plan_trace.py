"""Trace files for ``plan``: every documented form, the layout the source model's symbolic dim
names give, and a clear error (file, line, expected form) for every bad line."""

from __future__ import annotations

import json
import time

import onnx
import pytest
from onnx import TensorProto, helper

import gear_runtime as gr
from gear_runtime.errors import InputError
from gear_runtime.tools.plan.trace import MAX_LINE_CHARS, TraceLayout, layout_of, read_trace

HF_SHAPE = "input_ids:1,-1;attention_mask:1,-1;position_ids:1,-1"


def hf_prefill() -> onnx.ModelProto:
    """The three inputs of a Hugging Face causal LM export, all on ``sequence_length``."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch_size",
                                                                   "sequence_length"])
              for n in ("input_ids", "attention_mask", "position_ids")]
    graph = helper.make_graph(
        [helper.make_node("Add", ["input_ids", "attention_mask"], ["s"]),
         helper.make_node("Add", ["s", "position_ids"], ["logits"])], "hf", inputs,
        [helper.make_tensor_value_info("logits", TensorProto.INT64,
                                       ["batch_size", "sequence_length"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def hf_layout() -> TraceLayout:
    spec = gr.GearSpec.from_atc(input_shape=HF_SHAPE, dynamic_dims="1,1,1;2,2,2")
    return layout_of(spec, hf_prefill())


def write(tmp_path, lines) -> str:
    path = tmp_path / "trace.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_symbolic_names_tie_the_dynamic_values() -> None:
    layout = hf_layout()
    assert layout.width == 3 and layout.groups == ((0, 1, 2),)
    assert layout.names == ("sequence_length",)
    assert layout.labels == ("input_ids[1]", "attention_mask[1]", "position_ids[1]")
    assert layout.expand([79]) == (79, 79, 79)


@pytest.mark.parametrize("line", ["79", "79,79,79", "[79]", "[79, 79, 79]", "79.0",
                                  '{"dims": [79]}', '{"dims": [79, 79, 79]}',
                                  '{"sequence_length": 79}'])
def test_every_documented_form_reads_the_same_request(tmp_path, line) -> None:
    assert read_trace(write(tmp_path, ["sequence_length", line, "", line]), hf_layout()) == [
        (79, 79, 79)] * 2


def test_untied_values_and_a_named_object_with_two_names(tmp_path) -> None:
    from gear_runtime.examples import prefill

    spec = gr.GearSpec.from_atc(input_shape="input_ids:1,-1;attention_mask:1,-1;"
                                "position_ids:4,1,-1;image_embeds:-1,64",
                                dynamic_dims="1,1,1,1;2,2,2,2")
    layout = layout_of(spec, prefill.build_prefill_model())
    assert len(layout.groups) == 2 and layout.groups[0] == (0, 1, 2)
    path = write(tmp_path, ["79,16", json.dumps(dict(zip(layout.names, [80, 16],
                                                         strict=True)))])
    assert read_trace(path, layout) == [(79, 79, 79, 16), (80, 80, 80, 16)]


@pytest.mark.parametrize(("line", "why"), [
    ("1985;1986", "not a number"),
    ("79,79", "2 values"),
    ("[1.7]", "not an integer"),
    ("[true]", "not an integer"),
    ("[1e999]", "not an integer"),
    ("1e999", "not an integer"),
    ("NaN", "not an integer"),
    ('[NaN]', "not a request value"),
    ("0", "out of range"),
    ("-3", "out of range"),
    ("2147483648", "out of range"),
    ('{"seq": 79}', "unknown 'seq'"),
    ('{"dims": 79}', "must be a list"),
    ("[" * 100_000 + "]" * 100_000, "longer than"),
    ("[" * 1000 + "]" * 1000, "nested deeper"),
    ('"79"', "not an integer"),
])
def test_a_bad_line_is_named_with_the_expected_form(tmp_path, line, why) -> None:
    path = write(tmp_path, ["79", line])
    with pytest.raises(InputError, match=why) as err:
        read_trace(path, hf_layout())
    assert "line 2" in str(err.value) and "sequence_length" in str(err.value)


def test_rows_of_different_widths_without_a_layout(tmp_path) -> None:
    with pytest.raises(InputError, match="line 2: 2 values where line 1 has 1"):
        read_trace(write(tmp_path, ["5", "5,6"]))


def test_an_empty_trace_says_what_a_line_holds(tmp_path) -> None:
    with pytest.raises(InputError, match="holds no requests; expected one per line"):
        read_trace(write(tmp_path, ["", "  "]), hf_layout())


def test_an_input_the_model_lacks(tmp_path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="tokens:1,-1", dynamic_dims="1;2")
    with pytest.raises(InputError, match="the model's inputs are input_ids"):
        layout_of(spec, hf_prefill())


def test_a_huge_line_costs_bounded_time(tmp_path) -> None:
    path = tmp_path / "huge.txt"
    path.write_text("79\n" + "9," * 5_000_000 + "\n", encoding="utf-8")
    start = time.perf_counter()
    with pytest.raises(InputError, match=f"longer than {MAX_LINE_CHARS}"):
        read_trace(str(path), hf_layout())
    assert time.perf_counter() - start < 5
