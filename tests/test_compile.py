"""The gear compiler: spec-vs-model checks, per-gear branches equal to the original model,
GE's Case structure, the stock-ORT-runnable sink form, hybrid mode, output shapes, size."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import (
    CASES,
    CONV_IMAGE_SPEC,
    PREFILL_SPEC,
    assert_same,
    conv_model,
    custom_op_model,
    heavy_model,
    nonzero_model,
    prefill_model,
    random_inputs,
    reshape_model,
    run_model,
    sum_model,
    two_batch_model,
)
from onnx import helper, numpy_helper

import gear_runtime as gr
from gear_runtime import progress as progress_mod
from gear_runtime.compiler import build as compiler_mod
from gear_runtime.compiler import compile_gears, compile_model
from gear_runtime.errors import CompileError
from gear_runtime.gearfile.format import ACL_DYNAMIC_TENSOR_NAME, BRANCH_SUFFIX, DOMAIN
from gear_runtime.gearfile.reader import GearFile, read_gear_file


def spec_of(case: str) -> gr.GearSpec:
    return gr.GearSpec.from_atc(**CASES[case][1])


def with_weights(gf: GearFile, model: onnx.ModelProto) -> onnx.ModelProto:
    """A branch (or the dynamic model) with its shared weights attached as initializers,
    the weights' values inline (runnable from any folder)."""
    out = gf.runnable(model)
    for t in out.graph.initializer:
        if t.name in gf.external:
            t.CopyFrom(numpy_helper.from_array(gf.weight_array(t.name), t.name))
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory):
    """(case, sink, hybrid) -> (source model, spec, path, report); compiled once per module."""
    cache: dict[tuple[str, bool, bool], tuple] = {}
    base = tmp_path_factory.mktemp("gears")

    def get(case: str, sink: bool = False, hybrid: bool = False):
        key = (case, sink, hybrid)
        if key not in cache:
            model = CASES[case][0]()
            spec = spec_of(case)
            path = base / f"{case}-{int(sink)}-{int(hybrid)}.gear.onnx"
            report = compile_gears(model, spec, path, sink=sink, hybrid=hybrid, progress=False)
            cache[key] = (model, spec, str(path), report)
        return cache[key]

    return get


# ---- spec vs model ----------------------------------------------------------------------------
@pytest.mark.parametrize(("input_shape", "code", "words"), [
    ("image:-1,3,32,32", "E10016", ["'image'", "not an input", "data"]),
    ("conv.weight:-1,3,3,3", "E10016", ["'conv.weight'", "weight"]),
    ("data:-1,3,32", "E19999", ["'data'", "3 dims", "4 dims", "[N,3,H,W]"]),
    ("data:-1,4,32,32", "E19999", ["'data'", "axis 1", "says 4", "fixes it to 3"]),
])
def test_spec_mismatch_errors(tmp_path: Path, input_shape: str, code: str,
                              words: list[str]) -> None:
    spec = gr.GearSpec.from_atc(input_shape=input_shape, dynamic_batch_size="1,2")
    with pytest.raises(CompileError) as err:
        compile_model(conv_model(), spec, tmp_path / "x.gear.onnx", progress=False)
    assert err.value.code == code
    for w in words:
        assert w in str(err.value)
    assert not (tmp_path / "x.gear.onnx").exists()


def test_minus_one_on_a_static_dim_is_refused(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="data:1,-1,-1,-1", dynamic_dims="3,8,8;3,16,16")
    with pytest.raises(CompileError, match=r"'data' axis 1: input_shape marks it dynamic "
                                           r"\(-1\) but the model fixes it to 3"):
        compile_model(conv_model(), spec, tmp_path / "x.gear.onnx", progress=False)


def test_every_model_input_must_be_in_input_shape(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="a:-1,4", dynamic_batch_size="1,2")
    with pytest.raises(CompileError, match=r"model input 'b' \[N,4\] is not in input_shape"):
        compile_model(two_batch_model(), spec, tmp_path / "x.gear.onnx", progress=False)


def test_symbolic_model_dim_accepts_a_static_spec_value(tmp_path: Path) -> None:
    # N is symbolic in the model; the spec may fix it (1) while H, W take gears
    spec = gr.GearSpec.from_atc(**CONV_IMAGE_SPEC)
    gf = read_gear_file(compile_model(conv_model(), spec, tmp_path / "i.gear.onnx",
                                      progress=False))
    batch = [b.graph.input[0].type.tensor_type.shape.dim[0].dim_value for b in gf.branches]
    assert batch == [1, 1, 1]


@pytest.mark.parametrize(("shape", "gears", "code", "words"), [
    ((1, 3, 8, 8), ((),), "E10001", "no -1"),
    ((-1, 3, 8, 8), (), "E10035", "no gears"),
])
def test_hand_built_specs_are_rechecked(tmp_path: Path, shape: tuple, gears: tuple,
                                        code: str, words: str) -> None:
    spec = gr.GearSpec("batch", ("data",), (shape,), gears)
    for sink in (False, True):
        with pytest.raises(CompileError, match=words) as err:
            compile_model(conv_model(), spec, tmp_path / "x.gear.onnx", sink=sink,
                          progress=False)
        assert err.value.code == code


def test_spec_order_may_differ_from_model_order(tmp_path: Path) -> None:
    model = prefill_model()
    spec = gr.GearSpec.from_atc(
        input_shape="image_embeds:-1,64;position_ids:4,1,-1;attention_mask:1,-1;input_ids:1,-1",
        dynamic_dims="4,8,8,8;2,16,16,16")
    for sink in (False, True):
        gf = read_gear_file(compile_model(model, spec, tmp_path / f"o{sink}.gear.onnx",
                                          sink=sink, progress=False))
        assert gf.input_names == spec.input_names
        assert gf.input_dtypes[0] == np.float32 and gf.input_dtypes[3] == np.int64
        for i in range(2):
            feeds = random_inputs(model, spec.shapes(i), seed=i)
            want = run_model(model, feeds)
            assert [vi.name for vi in gf.branches[i].graph.input] == list(spec.input_names)
            assert_same(run_model(with_weights(gf, gf.branches[i]), feeds), want)
            if sink:
                *outs, dims = run_model(gf.model_bytes or b"", feeds)
                assert_same(outs, want)
                assert tuple(dims.tolist()) == spec.gears[i]


def test_reserved_names_are_refused(tmp_path: Path) -> None:
    model = two_batch_model()
    model.graph.node[0].output[0] = ACL_DYNAMIC_TENSOR_NAME
    model.graph.output[0].name = ACL_DYNAMIC_TENSOR_NAME
    spec = gr.GearSpec.from_atc(input_shape="a:-1,4;b:-1,4", dynamic_batch_size="1,2")
    with pytest.raises(CompileError, match="reserved"):
        compile_model(model, spec, tmp_path / "x.gear.onnx", progress=False)


def _relu_model(input_type: int, outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", input_type, ["N", 4])], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("model", "words"), [
    (_relu_model(onnx.TensorProto.FLOAT, []), "the model has no outputs"),
    (_relu_model(onnx.TensorProto.UNDEFINED,
                 [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
     "model input 'x' has no supported element type"),
    (_relu_model(onnx.TensorProto.FLOAT,
                 [helper.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)]),
     "model output 'y' has no supported element type"),
])
def test_models_a_gear_file_cannot_hold(tmp_path: Path, model: onnx.ModelProto,
                                        words: str) -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    for sink in (False, True):
        with pytest.raises(CompileError, match=words):
            compile_model(model, spec, tmp_path / "x.gear.onnx", sink=sink, progress=False)
    assert not list(tmp_path.iterdir())


def test_bad_model_argument(tmp_path: Path) -> None:
    spec = spec_of("conv_batch")
    with pytest.raises(CompileError, match="does not exist"):
        compile_model(tmp_path / "missing.onnx", spec, tmp_path / "x.gear.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\x00 not a model")
    with pytest.raises(CompileError, match="not a readable ONNX model"):
        compile_model(junk, spec, tmp_path / "x.gear.onnx")
    with pytest.raises(CompileError, match="GearSpec"):
        compile_model(conv_model(), "data:-1,3,32,32", tmp_path / "x.gear.onnx")  # type: ignore[arg-type]


# ---- every gear's branch equals the original model --------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_branches_match_the_original_model(compiled, case: str) -> None:
    model, spec, path, _ = compiled(case)
    gf = read_gear_file(path)
    assert gf.gear_count == spec.gear_count
    for i in range(spec.gear_count):
        branch = with_weights(gf, gf.branches[i])
        onnx.checker.check_model(branch, full_check=True)
        feeds = random_inputs(model, spec.shapes(i), seed=i)
        want = run_model(model, feeds, gf.output_names)
        got = run_model(branch, feeds, gf.output_names)
        assert_same(got, want)
        assert tuple(g.shape for g in got) == gf.output_shapes[i]
        for k, g in enumerate(got):
            assert gf.info.output_size(i, k) == g.nbytes


def test_branches_are_static_renamed_and_hold_no_weights(compiled) -> None:
    model, spec, path, _ = compiled("prefill")
    gf = read_gear_file(path)
    weights = {t.name for t in model.graph.initializer}
    for i, b in enumerate(gf.branches):
        g = b.graph
        assert g.name == f"Batch_{i}"
        assert not g.initializer
        assert {n: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
                for n, vi in ((vi.name, vi) for vi in g.input)} == spec.shapes(i)
        assert all(n.name.endswith(f"{BRANCH_SUFFIX}{i}") for n in g.node)
        kept = set(spec.input_names) | set(gf.output_names) | weights
        for node in g.node:
            for o in node.output:
                assert o in kept or o.endswith(f"{BRANCH_SUFFIX}{i}")
        # every intermediate shape is static after re-inference with the gear's dims
        for vi in g.value_info:
            assert all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim), vi.name
        assert set(gf.weight_names_of(b)) <= weights


def test_control_flow_subgraphs_follow_the_renaming(compiled) -> None:
    _, _, path, _ = compiled("control_flow")
    gf = read_gear_file(path)
    node = next(n for n in gf.branches[1].graph.node if n.op_type == "If")
    then_g = next(a.g for a in node.attribute if a.name == "then_branch")
    # the subgraph reads the renamed outer value h and the shared weight w
    assert list(then_g.node[0].input) == [f"h{BRANCH_SUFFIX}1", "w"]


# ---- output shapes ----------------------------------------------------------------------------
def test_data_propagation_makes_reshape_outputs_static_without_running(compiled) -> None:
    _, spec, path, report = compiled("reshape")
    assert report.ran_on_ort == []
    gf = read_gear_file(path)
    assert gf.output_shapes == tuple(((b, s * 16),) for b, s in spec.gears)


def test_unknown_shapes_fall_back_to_one_real_run(compiled) -> None:
    _, spec, path, report = compiled("sqrt_slice")
    assert report.ran_on_ort == [0, 1, 2]
    gf = read_gear_file(path)
    assert gf.output_shapes == (((2, 2),), ((2, 3),), ((2, 4),))
    assert gf.info.output_size(2, 0) == 2 * 4 * 4


def test_the_fallback_builds_one_session_for_all_gears(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    built = []
    real = ort.InferenceSession

    def counting(*args: object, **kwargs: object) -> object:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", counting)
    report = compile_gears(CASES["sqrt_slice"][0](), spec_of("sqrt_slice"),
                           tmp_path / "s.gear.onnx", progress=False)
    assert report.ran_on_ort == [0, 1, 2] and len(built) == 1


def test_an_output_shape_that_cannot_be_determined_is_an_error(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    with pytest.raises(CompileError, match=r"gear 0 .*must run on ONNX Runtime to find them, "
                                           r"but ONNX Runtime cannot load the source model: .*Foo"):
        compile_model(custom_op_model(), spec, tmp_path / "x.gear.onnx", progress=False)


def test_an_output_shape_that_depends_on_the_input_values_is_an_error(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    with pytest.raises(CompileError, match=r"gear 0 .*output 'y' is \(2, 0\) with zero inputs "
                                           r"but \(2, 4\) with float inputs of one: its shape "
                                           r"depends on the input values"):
        compile_model(nonzero_model(), spec, tmp_path / "x.gear.onnx", progress=False)
    assert not list(tmp_path.iterdir())


# ---- the GE structure -------------------------------------------------------------------------
def test_case_structure_follows_ge(compiled) -> None:
    _, spec, path, _ = compiled("prefill")
    model = onnx.load(path)
    onnx.checker.check_model(model)
    g = model.graph
    assert [vi.name for vi in g.input] == [*spec.input_names, ACL_DYNAMIC_TENSOR_NAME]
    largest = spec.largest_shapes()
    for vi in g.input[:-1]:
        assert tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) == largest[vi.name]
    dims_in = g.input[-1].type.tensor_type
    assert dims_in.elem_type == onnx.TensorProto.INT32
    assert [d.dim_value for d in dims_in.shape.dim] == [spec.values_per_gear]
    map_index, case = g.node
    assert (map_index.op_type, map_index.domain) == ("MapIndex", DOMAIN)
    assert (case.op_type, case.domain) == ("Case", DOMAIN)
    attrs = {a.name: helper.get_attribute_value(a) for a in case.attribute}
    assert attrs["batch_num"] == 4
    assert attrs["pred_value_2"] == [32, 32, 32, 4]
    assert [s.decode() for s in attrs["user_designate_shape_order"]] == list(spec.input_names)
    assert attrs["dynamic_type"] == b"dims"
    assert attrs["insert_by_mbatch"] == 1
    assert [b.name for b in attrs["branches"]] == [f"Batch_{i}" for i in range(4)]
    assert b"0,0,1,12,128" in attrs["dynamic_output_dims"]
    assert b"3,1,1,68" in attrs["dynamic_output_dims"]
    table = next(t for t in g.initializer if t.name == "ascend_mbatch_gear_table")
    np.testing.assert_array_equal(numpy_helper.to_array(table),
                                  np.asarray(spec.gears, np.int32).reshape(-1))
    # root outputs: dynamic dims symbolic, common ones static
    logits = g.output[0].type.tensor_type.shape.dim
    assert logits[0].dim_value == 1 and logits[1].dim_param and logits[2].dim_value == 128
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["gear_runtime.format"] == "2"
    assert meta["gear_runtime.kind"] == "case" and meta["gear_runtime.hybrid"] == "0"
    assert {o.domain: o.version for o in model.opset_import} == {"": 17, DOMAIN: 1}


def test_weights_are_stored_once(tmp_path: Path) -> None:
    model = heavy_model()
    src = tmp_path / "heavy.onnx"
    onnx.save(model, src)
    spec = gr.GearSpec.from_atc(input_shape="x:-1,512",
                                dynamic_batch_size=",".join(str(b) for b in range(1, 21)))
    out = compile_model(str(src), spec, tmp_path / "heavy.gear.onnx", progress=False)
    assert isinstance(out, str) and out == str(tmp_path / "heavy.gear.onnx")
    ratio = os.path.getsize(out) / os.path.getsize(src)
    assert ratio <= 1.1, f"20-gear file is {ratio:.3f}x the model"
    model_file = onnx.load(out)
    assert sum(1 for t in model_file.graph.initializer if t.name.startswith("w")) == 4


def test_files_over_2gib_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler_mod, "MAX_FILE_BYTES", 1000)
    with pytest.raises(CompileError, match="limited to 2 GiB"):
        compile_model(heavy_model(), spec_of("heavy"), tmp_path / "h.gear.onnx", progress=False)
    assert not list(tmp_path.iterdir())


def _no_gear_compiled(*args: object) -> None:
    raise AssertionError("a gear was compiled before the refusal")


@pytest.mark.parametrize(("model", "output", "sink", "words"), [
    (conv_model(opset=10), "x.gear.onnx", True, "sink mode needs ai.onnx opset >= 11"),
    (conv_model(), "missing/x.gear.onnx", False, "directory .* does not exist"),
])
def test_refusals_come_before_any_gear_is_compiled(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   model: onnx.ModelProto, output: str,
                                                   sink: bool, words: str) -> None:
    monkeypatch.setattr(compiler_mod, "infer_gear", _no_gear_compiled)
    with pytest.raises(CompileError, match=words):
        compile_model(model, spec_of("conv_batch"), tmp_path / output, sink=sink,
                      progress=False)


@pytest.mark.parametrize(("patch", "error"), [
    ("open", PermissionError(13, "Permission denied")),      # a read-only directory
    ("replace", OSError(28, "No space left on device")),
    ("replace", KeyboardInterrupt()),                         # not an OSError: re-raised
])
def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       patch: str, error: BaseException) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(compiler_mod.os, patch, fail)
    expected = CompileError if isinstance(error, OSError) else type(error)
    with pytest.raises(expected) as err:
        compile_model(conv_model(), spec_of("conv_batch"), tmp_path / "x.gear.onnx",
                      progress=False)
    if expected is CompileError:
        assert f"cannot write '{tmp_path / 'x.gear.onnx'}': {error.strerror}" in str(err.value)
    assert not list(tmp_path.iterdir())


# ---- sink: runnable by stock ONNX Runtime -----------------------------------------------------
@pytest.mark.parametrize("case", ["conv_batch", "conv_image", "prefill", "reshape",
                                  "control_flow", "passthrough"])
def test_sink_file_runs_in_plain_onnxruntime(compiled, case: str) -> None:
    model, spec, path, _ = compiled(case, sink=True)
    onnx.checker.check_model(path, full_check=True)
    gf = read_gear_file(path)
    assert gf.kind == "sink" and gf.model_bytes == Path(path).read_bytes()
    names = [*gf.output_names, ACL_DYNAMIC_TENSOR_NAME]
    for i in range(spec.gear_count):
        feeds = random_inputs(model, spec.shapes(i), seed=10 + i)
        got = run_model(gf.model_bytes, feeds, names)
        assert_same(got[:-1], run_model(model, feeds, gf.output_names))
        assert got[-1].dtype == np.int32
        assert tuple(got[-1].tolist()) == spec.gears[i]
        # the standalone branches of a sink file work like those of a case file
        assert_same(run_model(with_weights(gf, gf.branches[i]), feeds), got[:-1])


def test_sink_miss_returns_empty_outputs_and_the_dims(compiled) -> None:
    model, _, path, _ = compiled("prefill", sink=True)
    shapes = {"input_ids": (1, 10), "attention_mask": (1, 10), "position_ids": (4, 1, 10),
              "image_embeds": (4, 64)}
    logits, token, dims = run_model(Path(path).read_bytes(), random_inputs(model, shapes))
    assert logits.shape == (0, 0, 128) and logits.dtype == np.float32
    assert token.shape == (0, 0) and token.dtype == np.int64
    assert dims.tolist() == [10, 10, 10, 4]


def test_sink_batch_mode_inputs_that_disagree_miss(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="a:-1,4;b:-1,4", dynamic_batch_size="2,4")
    path = compile_model(two_batch_model(), spec, tmp_path / "two.gear.onnx", sink=True,
                         progress=False)
    a = np.ones((2, 4), np.float32)
    y, dims = run_model(Path(path).read_bytes(), {"a": a, "b": np.ones((4, 4), np.float32)})
    assert y.shape[0] == 0 and dims.tolist() == [2]
    y, dims = run_model(Path(path).read_bytes(), {"a": a, "b": a})
    np.testing.assert_array_equal(y, 2 * a)


def test_sink_scalar_outputs(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size="1,2")
    path = compile_model(sum_model(), spec, tmp_path / "s.gear.onnx", sink=True, progress=False)
    assert read_gear_file(path).output_shapes == (((1, 4), ()), ((2, 4), ()))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y, total, dims = run_model(Path(path).read_bytes(), {"x": x})
    assert total.shape == () and total == 28 and dims.tolist() == [2]
    y, total, dims = run_model(Path(path).read_bytes(), {"x": np.ones((3, 4), np.float32)})
    assert y.shape == (0, 4) and total.shape == (0,) and dims.tolist() == [3]


@pytest.mark.parametrize("opset", [11, 18])
def test_sink_routing_for_old_and_new_reduce_signatures(tmp_path: Path, opset: int) -> None:
    model = conv_model(opset=opset)
    spec = spec_of("conv_batch")
    path = compile_model(model, spec, tmp_path / "c.gear.onnx", sink=True, progress=False)
    for i, (n,) in enumerate(spec.gears):
        feeds = random_inputs(model, spec.shapes(i), seed=i)
        *outs, dims = run_model(Path(path).read_bytes(), feeds)
        assert_same(outs, run_model(model, feeds))
        assert dims.tolist() == [n]
    *outs, dims = run_model(Path(path).read_bytes(),
                            random_inputs(model, {"data": (3, 3, 32, 32)}))
    assert outs[0].shape == (0, 10) and dims.tolist() == [3]


def test_sink_routes_every_gear_of_a_deep_tree(tmp_path: Path) -> None:
    model = conv_model()
    gears = [1, 2, 3, 5, 6, 7, 9]   # 7 gears: an unbalanced-size tree, misses in the gaps
    spec = gr.GearSpec.from_atc(input_shape="data:-1,3,8,8",
                                dynamic_batch_size=",".join(map(str, gears)))
    data = Path(compile_model(model, spec, tmp_path / "d.gear.onnx", sink=True,
                              progress=False)).read_bytes()
    for n in range(0, 11):
        feeds = random_inputs(model, {"data": (n, 3, 8, 8)}, seed=n)
        out, dims = run_model(data, feeds)
        assert dims.tolist() == [n]
        if n in gears:
            assert_same([out], run_model(model, feeds))
        else:
            assert out.shape == (0, 10)


# ---- hybrid -----------------------------------------------------------------------------------
def test_hybrid_dynamic_model_runs_out_of_gear_shapes(compiled) -> None:
    model, spec, path, _ = compiled("prefill", hybrid=True)
    gf = read_gear_file(path)
    assert gf.hybrid and gf.spec.hybrid and gf.dynamic is not None
    dyn = with_weights(gf, gf.dynamic)
    onnx.checker.check_model(dyn, full_check=True)
    shapes = {"input_ids": (1, 11), "attention_mask": (1, 11), "position_ids": (4, 1, 11),
              "image_embeds": (3, 64)}
    feeds = random_inputs(model, shapes, seed=5)
    assert_same(run_model(dyn, feeds), run_model(model, feeds))
    # still every gear in its own static branch
    assert len(gf.branches) == spec.gear_count


def test_every_case_file_keeps_the_source_graph_sink_only_when_hybrid(compiled) -> None:
    model, spec, path, _ = compiled("prefill")
    gf = read_gear_file(path)
    assert gf.dynamic is not None and not gf.hybrid  # kept for ORT's one session, not run
    feeds = random_inputs(model, spec.shapes(1), seed=3)
    assert_same(run_model(with_weights(gf, gf.dynamic), feeds), run_model(model, feeds))
    assert read_gear_file(compiled("prefill", sink=True)[2]).dynamic is None


def test_hybrid_sink_miss_runs_the_dynamic_graph(compiled) -> None:
    model, spec, path, _ = compiled("reshape", sink=True, hybrid=True)  # dims: GE's hybrid
    data = Path(path).read_bytes()
    for shape in [(3, 5, 8), (2, 8, 8)]:   # a miss, then a hit
        feeds = random_inputs(model, {"x": shape}, seed=3)
        *outs, dims = run_model(data, feeds)
        assert_same(outs, run_model(model, feeds))
        assert dims.tolist() == list(shape[:2])
    gf = read_gear_file(path)
    assert gf.dynamic is not None and gf.hybrid


@pytest.mark.parametrize("case", ["conv_batch", "conv_image"])
@pytest.mark.parametrize("how", ["argument", "spec"])
def test_hybrid_outside_dims_mode_is_refused(tmp_path: Path, case: str, how: str) -> None:
    """GE has hybrid mode only with ge.dynamicDims: batch / image-size hybrid is refused
    before anything is compiled or written."""
    spec = spec_of(case)
    if how == "spec":
        spec = gr.GearSpec(spec.mode, spec.input_names, spec.input_shapes, spec.gears,
                           hybrid=True, input_format=spec.input_format)
    out = tmp_path / "h.gear.onnx"
    with pytest.raises(CompileError, match=f"hybrid mode needs a dims spec.*{spec.mode} mode") \
            as err:
        compile_gears(conv_model(), spec, out, hybrid=how == "argument", progress=False)
    assert err.value.code == "E10001"
    assert not out.exists()


def test_hybrid_from_the_spec(tmp_path: Path) -> None:
    spec = gr.GearSpec.from_ge_options({
        "ge.inputShape": "x:-1,-1,8", "ge.dynamicDims": "1,4;2,8",
        "ge.dynamicNodeType": "1", "ge.compileHybridMode": "1"})
    assert spec.hybrid
    gf = read_gear_file(compile_model(reshape_model(), spec, tmp_path / "r.gear.onnx",
                                      progress=False))
    assert gf.dynamic is not None


# ---- progress and scale -----------------------------------------------------------------------
def test_progress_bar_only_on_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of("conv_batch")
    compile_model(conv_model(), spec, tmp_path / "a.gear.onnx")       # stderr is not a TTY
    assert "compile" not in capsys.readouterr().err
    monkeypatch.setattr(progress_mod, "stderr_is_terminal", lambda: True)
    compile_model(conv_model(), spec, tmp_path / "b.gear.onnx")
    assert "compile:" in capsys.readouterr().err
    compile_model(conv_model(), spec, tmp_path / "c.gear.onnx", progress=False)
    assert "compile" not in capsys.readouterr().err


def test_top_level_compile_forwards(tmp_path: Path) -> None:
    out = gr.compile(conv_model(), spec_of("conv_batch"), str(tmp_path / "t.gear.onnx"),
                     sink=True, progress=False)
    assert read_gear_file(out).kind == "sink"


@pytest.mark.parametrize("sink", [False, True])
def test_100_gears_compile_in_reasonable_time(tmp_path: Path, sink: bool) -> None:
    # measured: ~0.07 s (case) / ~0.12 s (sink) on the 2-core dev box; the bound is generous
    model = prefill_model()
    dims = ";".join(f"{s},{s},{s},4" for s in range(1, 101))
    spec = gr.GearSpec.from_atc(input_shape=PREFILL_SPEC["input_shape"], dynamic_dims=dims)
    report = compile_gears(model, spec, tmp_path / "p100.gear.onnx", sink=sink, progress=False)
    assert report.ran_on_ort == []
    assert report.seconds < 30, report
    gf = read_gear_file(report.path)
    assert gf.gear_count == 100 and gf.output_shapes[99][0] == (1, 104, 128)
    if sink:
        feeds = random_inputs(model, spec.shapes(57), seed=57)
        *outs, got_dims = run_model(gf.model_bytes or b"", feeds)
        assert_same(outs, run_model(model, feeds))
        assert got_dims.tolist() == [58, 58, 58, 4]


def test_the_root_takes_the_branches_over_instead_of_copying_them(monkeypatch) -> None:
    """Compile's memory peak: the Case node gets each branch moved in (the list handed over
    is emptied as it goes, so a branch is never held twice for long) and the root model is
    built in place (no copy of the finished graph). A 200k-node source peaked at 1.6 GB
    before (docs/benchmarks.md)."""
    from gear_runtime.compiler import route

    seen = {}
    real = route.build_case_model

    def spy(source, info, spec, branches, shapes, dynamic):
        seen["count"] = len(branches)
        root = real(source, info, spec, branches, shapes, dynamic)
        seen["left"] = len(branches)
        return root

    monkeypatch.setattr("gear_runtime.compiler.build.build_case_model", spy)
    import tempfile
    from pathlib import Path

    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "r.gear.onnx")
        gr.compile(model, gr.GearSpec.from_atc("x:-1,2", dynamic_batch_size="1,2,4"), out,
                   progress=False)
        assert seen == {"count": 3, "left": 0}
        loaded = gr.load(out)
        x = np.array([[-1.0, 2.0]] * 4, np.float32)
        np.testing.assert_array_equal(loaded.create_executor().execute({"x": x})[0],
                                      np.maximum(x, 0))
