"""The gear file format and its reader: clear GearFileErrors for anything that is not a valid
gear file, consistency checks against the stored spec, helpers, and ``describe``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import CONV_BATCH_SPEC, PREFILL_SPEC, conv_model, passthrough_model, prefill_model
from onnx import helper, numpy_helper

import gear_runtime as gr
from gear_runtime.compiler import compile_model
from gear_runtime.errors import GearFileError, InputError
from gear_runtime.gearfile.digest import reseal
from gear_runtime.gearfile.format import (
    FORMAT_VERSION,
    META_FORMAT,
    META_HYBRID,
    META_KIND,
    META_SPEC,
    format_output_dims,
    parse_output_dims,
    spec_from_json,
    spec_to_json,
)
from gear_runtime.gearfile.reader import read_gear_file
from gear_runtime.tools.check.inspect import describe


@pytest.fixture(scope="module")
def case_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("gf") / "prefill.gear.onnx"
    return compile_model(prefill_model(), gr.GearSpec.from_atc(**PREFILL_SPEC), path,
                         progress=False)


@pytest.fixture(scope="module")
def sink_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("gf") / "conv.sink.gear.onnx"
    return compile_model(conv_model(), gr.GearSpec.from_atc(**CONV_BATCH_SPEC), path, sink=True,
                         progress=False)


def tampered(src: str, tmp_path: Path, change: Callable[[onnx.ModelProto], None]) -> Path:
    model = onnx.load(src)
    change(model)
    out = tmp_path / "tampered.gear.onnx"
    out.write_bytes(reseal(model))  # so the reader's own checks are what refuses it
    return out


def set_meta(model: onnx.ModelProto, key: str, value: str | None) -> None:
    kept = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if value is not None:
        model.metadata_props.add(key=key, value=value)


def case_node(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Case")


def set_attr(node: onnx.NodeProto, name: str, value: object) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


# ---- files that are not gear files ------------------------------------------------------------
def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GearFileError) as err:
        read_gear_file(tmp_path / "nope.gear.onnx")
    assert "nope.gear.onnx" in str(err.value) and "cannot be read" in str(err.value)
    assert err.value.code == "145002"


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(GearFileError, match="cannot be read"):
        read_gear_file(tmp_path)


@pytest.mark.parametrize("data", [b"\xff\xfe\x00garbage", b"not an onnx model at all\n"])
def test_non_onnx_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(data)
    with pytest.raises(GearFileError, match=r"junk\.onnx.*(not an ONNX model|not a gear file)"):
        read_gear_file(path)


def test_plain_dynamic_onnx_without_gear_metadata_is_refused(tmp_path: Path) -> None:
    """A plain ONNX file with dynamic dims has no gears to run: say to compile it."""
    path = tmp_path / "plain.onnx"
    onnx.save(conv_model(), path)
    with pytest.raises(GearFileError, match=r"plain\.onnx' is not a gear file .*not a static "
                                            r"model: input\(s\) data \[-1, 3, -1, -1\].*"
                                            r"compile it"):
        read_gear_file(path)


# ---- gear files that do not hold together -------------------------------------------------------
def test_wrong_format_version(case_file: str, tmp_path: Path) -> None:
    bad = tampered(case_file, tmp_path, lambda m: set_meta(m, META_FORMAT, "99"))
    with pytest.raises(GearFileError, match=r"format version '99', this reader reads version '2'"):
        read_gear_file(bad)


@pytest.mark.parametrize(("key", "value", "words"), [
    (META_SPEC, "{not json", "not a valid spec"),
    (META_SPEC, '{"mode": "batch"}', "not a valid spec"),
    (META_SPEC, "[1, 2]", "a JSON object expected, got list"),
    (META_SPEC, "[" * 100_000 + "]" * 100_000, "not a valid spec"),   # RecursionError inside
    (META_SPEC, '{"mode": "batch", "input_names": "ab", "input_shapes": [[-1, 4]], '
                '"gears": [[1], [2]], "hybrid": false}', "input_names must be a sequence of str"),
    (META_SPEC, '{"mode": "dims", "input_names": ["input_ids"], "input_shapes": [[1, -1]], '
                '"gears": [[8]], "hybrid": "0"}', "'hybrid' must be true or false, got '0'"),
    (META_KIND, "tree", "'tree', expected one of"),
    (META_HYBRID, "1", "hybrid"),
])
def test_bad_metadata(case_file: str, tmp_path: Path, key: str, value: str, words: str) -> None:
    bad = tampered(case_file, tmp_path, lambda m: set_meta(m, key, value))
    with pytest.raises(GearFileError, match=words):
        read_gear_file(bad)


def _drop_branch(m: onnx.ModelProto) -> None:
    node = case_node(m)
    attr = next(a for a in node.attribute if a.name == "branches")
    del attr.graphs[1]


def _relabel(m: onnx.ModelProto) -> None:
    attr = next(a for a in case_node(m).attribute if a.name == "branches")
    attr.graphs[2].name = "Batch_1"


def _bad_passthrough(m: onnx.ModelProto) -> None:
    attr = next(a for a in case_node(m).attribute if a.name == "branches")
    attr.graphs[0].node.append(helper.make_node("Identity", [], [],
                                                name="ascend_mbatch_passthrough_x"))


def _truncate_table(m: onnx.ModelProto) -> None:
    t = next(t for t in m.graph.initializer if t.name == "ascend_mbatch_gear_table")
    t.raw_data = b"\x01\x02\x03"


def _rename_index(m: onnx.ModelProto) -> None:
    next(n for n in m.graph.node if n.op_type == "MapIndex").output[0] = "idx"


def _bump_table(m: onnx.ModelProto) -> None:
    t = next(t for t in m.graph.initializer if t.name == "ascend_mbatch_gear_table")
    values = numpy_helper.to_array(t).copy()
    values[0] = 9
    t.CopyFrom(numpy_helper.from_array(values, t.name))


@pytest.mark.parametrize(("change", "words"), [
    (lambda m: set_attr(case_node(m), "pred_value_1", [16, 16, 16, 5]),
     r"pred_value_1 is \[16, 16, 16, 5\], the spec's gear 1 is \(16, 16, 16, 4\)"),
    (lambda m: set_attr(case_node(m), "batch_num", 3), "batch_num is 3"),
    (lambda m: set_attr(case_node(m), "dynamic_type", "batch"), "dynamic_type is 'batch'"),
    (lambda m: set_attr(case_node(m), "user_designate_shape_order", ["a"]),
     "user_designate_shape_order"),
    (_drop_branch, "3 branches for 4 gears"),
    (_relabel, r"gear 1 \(Batch_1\) appears twice"),
    (lambda m: set_attr(case_node(m), "dynamic_output_dims", ["0,0,1,12,128"]),
     "output dims missing"),
    (_bump_table, r"gear table 'ascend_mbatch_gear_table' is \[9, 8, 8, 4,"),
    (lambda m: m.graph.node.remove(case_node(m)), "one MapIndex and one Case"),
    # attributes of another type, unreadable tensors, bytes that are not UTF-8
    (lambda m: set_attr(case_node(m), "user_designate_shape_order", 5),
     "Case attribute 'user_designate_shape_order' is of type INT, expected STRINGS"),
    (lambda m: set_attr(case_node(m), "dynamic_type", [1, 2]),
     "'dynamic_type' is of type INTS, expected STRING"),
    (lambda m: set_attr(case_node(m), "dynamic_output_dims", [1, 2]),
     "'dynamic_output_dims' is of type INTS, expected STRINGS"),
    (lambda m: set_attr(case_node(m), "pred_value_0", "8,8,8,4"),
     "'pred_value_0' is of type STRING, expected INTS"),
    (lambda m: set_attr(case_node(m), "branches", helper.make_graph([], "Batch_0", [], [])),
     "'branches' is of type GRAPH, expected GRAPHS"),
    (lambda m: set_attr(case_node(m), "dynamic_graph", 3),
     "'dynamic_graph' is of type INT, expected GRAPH"),
    (lambda m: set_attr(case_node(m), "user_designate_shape_order", [b"\xff"]),
     "user_designate_shape_order is"),
    (lambda m: set_attr(case_node(m), "dynamic_output_dims", [b"\xff"]),
     "dynamic_output_dims: invalid literal"),
    (_truncate_table, "gear table 'ascend_mbatch_gear_table' cannot be read"),
    (_bad_passthrough, "passthrough node 'ascend_mbatch_passthrough_x' is not a one-input"),
    (_rename_index, r"MapIndex writes \['idx'\], expected \['ascend_mbatch_branch_index'\]"),
])
def test_inconsistent_case_file(case_file: str, tmp_path: Path,
                                change: Callable[[onnx.ModelProto], None], words: str) -> None:
    bad = tampered(case_file, tmp_path, change)
    with pytest.raises(GearFileError, match=words) as err:
        read_gear_file(bad).branches  # noqa: B018 - a branch is checked on first use
    assert str(bad) in str(err.value)


def test_inconsistent_sink_file(sink_file: str, tmp_path: Path) -> None:
    def relabel(m: onnx.ModelProto) -> None:
        for node in m.graph.node:
            if node.op_type == "If":
                stack = [node]
                while stack:
                    n = stack.pop()
                    for a in n.attribute:
                        if a.g.name == "Batch_2":
                            a.g.name = "Batch_0"
                        stack.extend(x for x in a.g.node if x.op_type == "If")

    with pytest.raises(GearFileError, match="appears twice"):
        read_gear_file(tampered(sink_file, tmp_path, relabel))
    for dims in ("{", "[" * 100_000):
        with pytest.raises(GearFileError, match="not a JSON list"):
            read_gear_file(tampered(sink_file, tmp_path, lambda m, dims=dims: set_meta(
                m, "gear_runtime.dynamic_output_dims", dims)))

    def bump_table(m: onnx.ModelProto) -> None:
        node = next(n for n in m.graph.node if list(n.output) == ["ascend_mbatch_gear_table"])
        values = numpy_helper.to_array(node.attribute[0].t).copy()
        values[1, 0] = 5
        node.attribute[0].t.CopyFrom(numpy_helper.from_array(values, node.attribute[0].t.name))

    with pytest.raises(GearFileError, match=r"gear table 'ascend_mbatch_gear_table' is "
                                            r"\[\[1\], \[5\], \[8\]\], the spec gives "
                                            r"\[\[1\], \[4\], \[8\]\]"):
        read_gear_file(tampered(sink_file, tmp_path, bump_table))


# ---- what the reader returns -----------------------------------------------------------------
def test_reader_fields(case_file: str) -> None:
    gf = read_gear_file(case_file)
    spec = gr.GearSpec.from_atc(**PREFILL_SPEC)
    assert gf.spec == spec and gf.kind == "case" and gf.model_bytes is None
    assert gf.input_names == spec.input_names
    assert gf.input_dtypes == (np.dtype("int64"),) * 3 + (np.dtype("float32"),)
    assert gf.output_names == ("logits", "next_token")
    assert gf.output_dtypes == (np.dtype("float32"), np.dtype("int64"))
    assert gf.output_shapes[1] == ((1, 20, 128), (1, 20))
    assert gf.info.output_size(1, 0) == 20 * 128 * 4 and gf.info.output_size(1, 1) == 20 * 8
    assert set(gf.weights) == {t.name for t in prefill_model().graph.initializer}
    assert not any(n.startswith("ascend_mbatch_") for n in gf.weights)
    for b in gf.branches:
        assert [o.name for o in b.graph.output] == ["logits", "next_token"]
        assert not any(o.domain == "ge.gear_runtime" for o in b.opset_import)


def test_output_index_errors_are_input_errors(case_file: str) -> None:
    gf = read_gear_file(case_file)
    with pytest.raises(InputError, match="gear index 4 is out of range: the model has 4 gears"):
        gf.info.output_size(4, 0)
    with pytest.raises(InputError, match="output index 2 is out of range"):
        gf.info.output_shape(0, 2)
    with pytest.raises(InputError):
        gf.info.output_size(-1, 0)


def test_passthrough_outputs_survive_both_kinds(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="2,3")
    for sink in (False, True):
        gf = read_gear_file(compile_model(passthrough_model(), spec,
                                          tmp_path / f"p{sink}.gear.onnx", sink=sink,
                                          progress=False))
        assert gf.output_names == ("y", "x", "w")
        assert gf.output_shapes == (((2, 4), (2, 4), (4,)), ((3, 4), (3, 4), (4,)))
        for b in gf.branches:
            assert [o.name for o in b.graph.output] == ["y", "x", "w"]
            assert not any(n.name.startswith("ascend_mbatch_passthrough") for n in b.graph.node)


# ---- helpers ------------------------------------------------------------------------------------
def test_spec_json_round_trip() -> None:
    for args in (PREFILL_SPEC, CONV_BATCH_SPEC):
        spec = gr.GearSpec.from_atc(**args)
        assert spec_from_json(spec_to_json(spec)) == spec


def test_output_dims_round_trip_and_errors() -> None:
    shapes = (((1, 10), ()), ((4, 10), ()))
    items = format_output_dims(shapes)
    assert items == ["0,0,1,10", "0,1", "1,0,4,10", "1,1"]
    assert parse_output_dims(items, 2, 2) == shapes
    for bad, words in [(["0,0,1", "0,0,2", "0,1", "1,0", "1,1"], "given twice"),
                       (["0,0", "0,1", "1,0"], "missing"),
                       (["0,5,1", "0,0", "0,1", "1,0", "1,1"], "out of range"),
                       (["0,0,-1", "0,1", "1,0", "1,1"], "negative"),
                       (["7"], "no gear and output index")]:
        with pytest.raises(ValueError, match=words):
            parse_output_dims(bad, 2, 2)


def test_describe(case_file: str, sink_file: str) -> None:
    text = describe(case_file)
    for words in ["format      2, kind case", "mode        dims", "4 gears",
                  "input_ids       int64    [1,-1]", "image_embeds    float32  [-1,64]",
                  "16,16,16,4", "logits[1,20,128] next_token[1,20]", "hybrid      no",
                  "sink        no", "files:", "weights     12 tensors"]:
        assert words in text, words
    order = [text.index(n) for n in ("input_ids ", "attention_mask ", "position_ids ",
                                     "image_embeds ")]
    assert order == sorted(order)
    sink = describe(sink_file)
    assert "sink        yes" in sink and "mode        batch" in sink
    assert "data[8,3,32,32]" in sink and "logits[8,10]" in sink
    assert FORMAT_VERSION == "2"
