"""The mindspore_lite backend against the MindSpore Lite double (tests/doubles/fake_mslite.py).

What is shown: the spec comes from a Qwen prefill service's converter config (or spec=), build
on Ascend with the device id, the per-gear output-shape table (from resize + get_outputs, or
from a predict on zeros when the shapes are only known after a run), runs of every gear with
checkable outputs read from zero-copy views of the staging, ``resize`` only when the gear
changes, inputs matched by name (or by position), failing calls -> BackendError with the call
and the code, a missing mindspore_lite -> BackendUnavailableError, and through ``gr.load(...,
backend="mindspore_lite")``: an out-of-gear request fails with our GearMismatchError BEFORE any
resize / predict (the gap docs/ge-notes.md section 9 names), and hybrid mode runs the dynamic-
shape graph on a miss.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from doubles import fake_mslite
from doubles.layout import plan_layout, stage
from doubles.races import close_during_run

import gear_runtime as gr
from gear_runtime.backends import mindspore_lite as ms_backend
from gear_runtime.errors import (
    BackendError,
    BackendUnavailableError,
    CompileError,
    GearFileError,
    GearSpecError,
)

# a Qwen prefill service's config_prefill.ini, with smaller numbers
CONFIG = """\
[acl_init_options]
ge.exec.precision_mode=force_fp32

[acl_build_options]
input_format="ND"
input_shape="input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,8"
ge.dynamicDims="4,4,4,2;8,8,8,2;16,16,16,2"
"""
INPUTS = [("input_ids", [1, -1], "int32"), ("attention_mask", [1, -1], "int32"),
          ("position_ids", [4, 1, -1], "int32"), ("image_embeds", [-1, 8], "float16")]
# what the converter compiled, written out by hand (independent of GearSpec)
GEARS = [[[1, n], [1, n], [4, 1, n], [2, 8]] for n in (4, 8, 16)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> fake_mslite.FakeMslite:
    double = fake_mslite.FakeMslite()
    monkeypatch.setitem(sys.modules, "mindspore_lite", double.module)
    return double


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "config_prefill.ini"
    path.write_text(CONFIG)
    return str(path)


def write(tmp_path, inputs=INPUTS, gears=GEARS, **kw) -> str:
    return fake_mslite.write_mindir(tmp_path / "prefill.mindir", inputs, gears, **kw)


def expected_outputs(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [arrays[0].astype(np.float32) * 2 + 1,
            np.concatenate([a.astype(np.float32).ravel() for a in arrays])]


def inputs_for(spec: gr.GearSpec, dtypes, gear: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 100, s).astype(dt)
            for s, dt in zip(spec.shapes(gear).values(), dtypes, strict=True)]


def session_for(model: ms_backend.MsliteModel):
    info = model.info
    layout = plan_layout(info.input_nbytes(), info.spec.values_per_gear)
    return layout, model.create_session(layout)


def run(model, layout, session, gear: int, seed: int = 0):
    info = model.info
    arrays = inputs_for(info.spec, info.input_dtypes, gear, seed)
    stage(session.staging, layout, info.spec, info.input_dtypes, gear, arrays)
    return arrays, session.run_gear(gear)


# ---- load ------------------------------------------------------------------------------------
def test_spec_from_the_converter_config(fake, tmp_path, config):
    model = ms_backend.open_model(write(tmp_path), config=config, device_id=3)
    assert model.info.spec == gr.GearSpec.from_config(config)
    assert [tuple(map(tuple, g)) for g in GEARS] == [
        tuple(model.info.spec.shapes(g).values()) for g in range(3)]
    (context,) = fake.state.contexts
    assert context.target == ["ascend"] and context.ascend.device_id == 3
    assert model.info.input_dtypes == tuple(np.dtype(d) for _, _, d in INPUTS)
    assert model.info.output_names == ("y", "cat")


def test_output_shapes_from_resize_without_predicting(fake, tmp_path, config):
    model = ms_backend.open_model(write(tmp_path), config=config)
    for g, shapes in enumerate(GEARS):
        total = sum(int(np.prod(s)) for s in shapes)
        assert model.info.output_shapes[g] == (tuple(shapes[0]), (total,))
    assert fake.state.calls_named("predict") == []
    assert fake.state.calls_named("resize") == GEARS  # each gear once, in order


def test_output_shapes_known_only_after_a_run_are_read_from_a_warmup(fake, tmp_path, config):
    model = ms_backend.open_model(write(tmp_path, output_shapes_after_resize=False),
                                  config=config)
    assert model.info.output_shapes[1] == ((1, 8), (8 + 8 + 32 + 16,))
    assert len(fake.state.calls_named("predict")) == 3  # one zero-input warm-up per gear


def test_spec_argument_instead_of_config(fake, tmp_path, config):
    spec = gr.GearSpec.from_config(config)
    model = ms_backend.open_model(write(tmp_path), spec=spec)
    assert model.info.spec is spec


@pytest.mark.parametrize("kwargs", [{}, {"config": "x", "spec": "y"}])
def test_the_gears_are_required_exactly_once(fake, tmp_path, kwargs):
    with pytest.raises(GearSpecError, match="config="):
        ms_backend.open_model(write(tmp_path), **kwargs)


def test_missing_file_and_misfit_model(fake, tmp_path, config):
    with pytest.raises(GearFileError, match="does not exist"):
        ms_backend.open_model(str(tmp_path / "none.mindir"), config=config)
    with pytest.raises(CompileError, match="3 inputs"):
        ms_backend.open_model(write(tmp_path, INPUTS[:3], [g[:3] for g in GEARS]), config=config)
    wrong_rank = [("input_ids", [-1], "int32"), *INPUTS[1:]]
    with pytest.raises(CompileError, match="input_ids"):
        ms_backend.open_model(write(tmp_path, wrong_rank), config=config)


def test_a_layout_planned_for_other_sizes_is_refused(fake, tmp_path, config):
    model = ms_backend.open_model(write(tmp_path), config=config)
    rows = [list(r) for r in model.info.input_nbytes()]
    rows[1][2] -= 4  # position_ids of gear 1: 4 bytes short
    layout = plan_layout(rows, model.info.spec.values_per_gear)
    end = layout.offset(1, 2) + rows[1][2]
    with pytest.raises(BackendError, match="staging layout does not fit the model") as info:
        model.create_session(layout)
    assert (f"input 'position_ids' of gear 1 gets {rows[1][2]} bytes ending at {end} of "
            f"{layout.total_bytes}, it needs {rows[1][2] + 4}") in info.value.message


# ---- running ---------------------------------------------------------------------------------
def test_every_gear_runs_from_zero_copy_views_of_the_staging(fake, tmp_path, config):
    model = ms_backend.open_model(write(tmp_path), config=config)
    layout, session = session_for(model)
    for g in range(3):
        n = len(fake.state.calls)
        arrays, outputs = run(model, layout, session, g, seed=g)
        for got, want in zip(outputs, expected_outputs(arrays), strict=True):
            np.testing.assert_array_equal(got, want)
        fed = [a for name, a in fake.state.calls[n:] if name == "set_data_from_numpy"]
        assert len(fed) == 4 and all(np.shares_memory(a, session.staging) for a in fed)


def test_resize_only_when_the_gear_changes(fake, tmp_path, config):
    model = ms_backend.open_model(write(tmp_path), config=config)  # ends on gear 2
    layout, session = session_for(model)
    n = len(fake.state.calls_named("resize"))
    for g in [2, 0, 0, 1, 1, 1, 0, 2, 2]:
        arrays, outputs = run(model, layout, session, g)
        np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])
    assert fake.state.calls_named("resize")[n:] == [GEARS[0], GEARS[1], GEARS[0], GEARS[2]]
    # two sessions share the model's current gear: no resize when it is already right
    _, other = session_for(model)
    run(model, layout, other, 2)
    assert len(fake.state.calls_named("resize")) == n + 4


def test_inputs_matched_by_name_when_the_model_orders_them_differently(fake, tmp_path, config):
    order = [2, 0, 3, 1]
    path = write(tmp_path, [INPUTS[j] for j in order], [[g[j] for j in order] for g in GEARS])
    model = ms_backend.open_model(path, config=config)
    assert model.order == tuple(order.index(i) for i in range(4))
    layout, session = session_for(model)
    arrays, outputs = run(model, layout, session, 1)
    want = expected_outputs([arrays[j] for j in order])  # the model's input 0 is position_ids
    for got, w in zip(outputs, want, strict=True):
        np.testing.assert_array_equal(got, w)


def test_the_warmup_feeds_a_reordered_model_in_its_own_order(fake, tmp_path, config):
    """Output shapes known only after a run, inputs in another order: the zero inputs of the
    warm-up go in MODEL order (set_data_from_numpy checks every dtype and size)."""
    order = [2, 0, 3, 1]
    path = write(tmp_path, [INPUTS[j] for j in order], [[g[j] for j in order] for g in GEARS],
                 output_shapes_after_resize=False)
    model = ms_backend.open_model(path, config=config)
    fed = fake.state.calls_named("predict")
    assert fed[1] == [GEARS[1][j] for j in order]
    y_shape = tuple(GEARS[1][order[0]])  # y follows the model's input 0: position_ids
    assert model.info.output_shapes[1] == (y_shape, (8 + 8 + 32 + 16,))


def test_inputs_matched_by_position_when_the_names_differ(fake, tmp_path, config):
    renamed = [(f"input_{i}", s, d) for i, (_, s, d) in enumerate(INPUTS)]
    model = ms_backend.open_model(write(tmp_path, renamed), config=config)
    assert model.order == (0, 1, 2, 3)
    layout, session = session_for(model)
    arrays, outputs = run(model, layout, session, 0)
    np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])


@pytest.mark.parametrize("call", ["predict", "resize"])
def test_a_failing_call_is_a_backend_error_with_call_and_code(fake, tmp_path, config, call):
    model = ms_backend.open_model(write(tmp_path), config=config)
    layout, session = session_for(model)
    fake.state.fail[call] = "ACL model execute failed, ret 507011"
    with pytest.raises(BackendError, match=f"Model.{call}") as info:
        run(model, layout, session, 0)
    assert info.value.code == "507011"
    del fake.state.fail[call]
    arrays, outputs = run(model, layout, session, 0)  # recovers; resizes again after a failure
    np.testing.assert_array_equal(outputs[0], expected_outputs(arrays)[0])


def test_a_failing_build_is_a_backend_error(fake, tmp_path, config):
    fake.state.fail["build_from_file"] = "device 0 is busy"
    with pytest.raises(BackendError, match="build_from_file.*busy"):
        ms_backend.open_model(write(tmp_path), config=config)


def test_closed_sessions_and_models_refuse_to_run(fake, tmp_path, config):
    model = ms_backend.open_model(write(tmp_path), config=config)
    layout, session = session_for(model)
    session.close()
    with pytest.raises(BackendError, match="closed"):
        session.run_gear(0)
    _, other = session_for(model)
    model.close()
    model.close()
    with pytest.raises(BackendError, match="closed"):
        other.run_gear(0)


def test_closing_the_model_waits_for_a_run_in_flight(fake, tmp_path, config):
    """model.close() from another thread must not drop the Model under a predict: it waits
    for the model's lock; a run that was waiting then finds the model closed."""
    model = ms_backend.open_model(write(tmp_path), config=config)
    layout, session = session_for(model)
    arrays = inputs_for(model.info.spec, model.info.input_dtypes, 0)
    stage(session.staging, layout, model.info.spec, model.info.input_dtypes, 0, arrays)
    # a BackendError or the outputs, never an AttributeError
    result = close_during_run(model, lambda: session.run_gear(0),
                              lambda: model.model is not None)
    if isinstance(result, BackendError):  # the close went first
        assert "closed" in result.message
    else:
        np.testing.assert_array_equal(result[1], expected_outputs(arrays)[1])


def test_no_mindspore_lite_is_backend_unavailable(monkeypatch, tmp_path, config):
    monkeypatch.setitem(sys.modules, "mindspore_lite", None)
    with pytest.raises(BackendUnavailableError, match="mindspore_lite") as info:
        gr.load(write(tmp_path), backend="mindspore_lite", config=config)
    assert "install" in str(info.value)


# ---- the double fails where MindSpore Lite fails ---------------------------------------------
def test_the_double_fails_out_of_gear_deep_inside_resize(fake, tmp_path):
    mslite = fake.module
    model = mslite.Model()
    model.build_from_file(write(tmp_path), mslite.ModelType.MINDIR, mslite.Context())
    inputs = model.get_inputs()
    with pytest.raises(RuntimeError, match="Shape Conflict"):
        model.resize(inputs, [[1, 100], [1, 100], [4, 1, 100], [2, 8]])
    with pytest.raises(RuntimeError, match="Shape Conflict"):
        model.predict(inputs)  # never resized: -1 dims
    model.resize(inputs, GEARS[0])
    with pytest.raises(RuntimeError, match="data type"):
        model.get_inputs()[3].set_data_from_numpy(np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match="size"):
        model.resize(inputs, GEARS[0][:2])


# ---- through gr.load and the executor (needs the C++ core) -----------------------------------
def test_through_gr_load_and_the_executor(fake, tmp_path, config):
    model = gr.load(write(tmp_path), backend="mindspore_lite", config=config)
    assert model.backend == "mindspore_lite" and model.gear_count == 3
    ex = model.create_executor()
    for g in (0, 2, 1):
        arrays = inputs_for(model.spec, model.info.input_dtypes, g, seed=g)
        outputs = ex.execute(dict(zip(model.input_names, arrays, strict=True)))
        for got, want in zip(outputs, expected_outputs(arrays), strict=True):
            np.testing.assert_array_equal(got, want)
    model.close()


def test_an_out_of_gear_request_fails_before_resize_or_predict(fake, tmp_path, config):
    """Seed 004's gap: a 100-token prompt. MindSpore Lite would fail inside resize with
    "Shape Conflict"; the executor refuses first, naming the gears."""
    model = gr.load(write(tmp_path), backend="mindspore_lite", config=config)
    ex = model.create_executor()
    n = len(fake.state.calls)
    prompt = [np.zeros((1, 100), np.int32), np.zeros((1, 100), np.int32),
              np.zeros((4, 1, 100), np.int32), np.zeros((2, 8), np.float16)]
    with pytest.raises(gr.GearMismatchError) as info:
        ex.execute(prompt)
    assert info.value.code == "145013"
    assert "(4, 4, 4, 2)" in str(info.value) or "4,4,4,2" in str(info.value)
    assert fake.state.calls[n:] == []  # no resize, no set_data_from_numpy, no predict
    model.close()


def test_hybrid_mode_runs_the_dynamic_graph_on_a_miss(fake, tmp_path):
    cfg = tmp_path / "hybrid.ini"
    cfg.write_text("[ge_graph_options]\n"
                   "ge.inputShape=input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;"
                   "image_embeds:-1,8\n"
                   "ge.dynamicDims=4,4,4,2;8,8,8,2;16,16,16,2\n"
                   "ge.dynamicNodeType=1\nge.compileHybridMode=1\n")
    model = gr.load(write(tmp_path, hybrid=True), backend="mindspore_lite", config=str(cfg))
    assert model.hybrid
    ex = model.create_executor()
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 9, s).astype(dt) for s, dt in
              zip([(1, 5), (1, 5), (4, 1, 5), (3, 8)], model.info.input_dtypes, strict=True)]
    outputs = ex.execute(arrays)  # (5, 5, 5, 3) is no gear: the dynamic-shape graph runs
    for got, want in zip(outputs, expected_outputs(arrays), strict=True):
        np.testing.assert_array_equal(got, want)
    assert ex.last_gear is None
    assert fake.state.calls_named("resize")[-1] == [[1, 5], [1, 5], [4, 1, 5], [3, 8]]
    arrays = inputs_for(model.spec, model.info.input_dtypes, 0)
    outputs = ex.execute(arrays)  # back on a gear: resized to it again
    np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])
    assert ex.last_gear == 0 and fake.state.calls_named("resize")[-1] == GEARS[0]
    model.close()


# ---- what the real API does that a lenient double would hide --------------------------------
def test_outputs_survive_a_run_of_another_session_of_the_model(fake, tmp_path, config):
    """get_data_to_numpy is zero-copy over the model's output memory, which the next predict
    overwrites; a session's outputs must stay valid until ITS next run, whatever another
    session of the same model runs meanwhile."""
    model = ms_backend.open_model(write(tmp_path), config=config)
    layout, first = session_for(model)
    _, second = session_for(model)
    arrays, outputs = run(model, layout, first, 0, seed=1)
    run(model, layout, second, 0, seed=2)
    for got, want in zip(outputs, expected_outputs(arrays), strict=True):
        np.testing.assert_array_equal(got, want)
    model.close()


def test_hybrid_outputs_survive_a_later_run(fake, tmp_path):
    path = write(tmp_path, hybrid=True)
    spec = gr.GearSpec.from_atc(input_shape="input_ids:1,-1;attention_mask:1,-1;"
                                "position_ids:4,1,-1;image_embeds:-1,8",
                                dynamic_dims="4,4,4,2;8,8,8,2;16,16,16,2")
    spec = gr.GearSpec(spec.mode, spec.input_names, spec.input_shapes, spec.gears, hybrid=True)
    model = ms_backend.open_model(path, spec=spec)
    _, session = session_for(model)
    rng = np.random.default_rng(4)
    arrays = [rng.integers(0, 9, s).astype(dt) for s, dt in
              zip([(1, 5), (1, 5), (4, 1, 5), (3, 8)], model.info.input_dtypes, strict=True)]
    outputs = session.run_dynamic(arrays)
    _, other = session_for(model)
    other.run_dynamic([a + 1 for a in arrays])  # another session, same output sizes
    for got, want in zip(outputs, expected_outputs(arrays), strict=True):
        np.testing.assert_array_equal(got, want)
    model.close()


def test_a_gear_with_a_zero_dim_is_refused_at_load_naming_it(fake, tmp_path):
    """ModelImpl::Resize rejects every dim <= 0, so such a gear can never run."""
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1", dynamic_dims="0;4")
    path = fake_mslite.write_mindir(tmp_path / "z.mindir", [("x", [1, -1], "float32")],
                                    [[[1, 0]], [[1, 4]]])
    with pytest.raises(GearSpecError, match=r"gear 0 .*\(0,\).*dim <= 0"):
        ms_backend.open_model(path, spec=spec)
    assert fake.state.calls_named("resize") == []


def test_a_hybrid_request_with_a_zero_dim_is_an_input_error(fake, tmp_path):
    spec = gr.GearSpec.from_atc(input_shape="x:1,-1", dynamic_dims="2;4")
    spec = gr.GearSpec(spec.mode, spec.input_names, spec.input_shapes, spec.gears, hybrid=True)
    path = fake_mslite.write_mindir(tmp_path / "h.mindir", [("x", [1, -1], "float32")],
                                    [[[1, 2]], [[1, 4]]], hybrid=True)
    model = ms_backend.open_model(path, spec=spec)
    _, session = session_for(model)
    n = len(fake.state.calls_named("resize"))
    with pytest.raises(gr.InputError, match="x"):
        session.run_dynamic([np.zeros((1, 0), np.float32)])
    assert len(fake.state.calls_named("resize")) == n
    model.close()


def test_the_double_is_as_strict_as_mindspore_lite(fake, tmp_path):
    """get_outputs gives TensorMeta (no data); set_data_from_numpy / get_data_to_numpy are
    zero-copy; resize refuses a dim <= 0 before looking at the gears."""
    mslite = fake.module
    model = mslite.Model()
    model.build_from_file(write(tmp_path), mslite.ModelType.MINDIR, mslite.Context())
    metas = model.get_outputs()
    assert all(isinstance(m, mslite.TensorMeta) for m in metas)
    assert not any(hasattr(m, "get_data_to_numpy") for m in metas)
    inputs = model.get_inputs()
    with pytest.raises(RuntimeError, match="Invalid shape"):
        model.resize(inputs, [[1, 0], [1, 4], [4, 1, 4], [2, 8]])
    model.resize(inputs, GEARS[0])
    inputs = model.get_inputs()
    arrays = [np.zeros(s, np.float16 if i == 3 else np.int32) for i, s in enumerate(GEARS[0])]
    for t, a in zip(inputs, arrays, strict=True):
        t.set_data_from_numpy(a)
    arrays[0][:] = 7  # written after set_data_from_numpy: predict still sees it
    out = model.predict(inputs)
    y = out[0].get_data_to_numpy()
    assert (y == 15).all()
    arrays[0][:] = 1
    model.predict(inputs)
    assert (y == 3).all()  # the earlier result's memory was reused


# ---- the gears the converter recorded (Model.get_model_info) ------------------------------------
RECORDED = ("input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,8",
            "4,4,4,2;8,8,8,2;16,16,16,2")


def test_a_model_that_records_its_gears_needs_no_config(fake, tmp_path):
    """The converter keeps [acl_build_options] input_shape / ge.dynamicDims in the MindIR
    (converter.cc RecordSupportedDynamicDims): loaded with neither config= nor spec=, the
    gears are those; through gr.load and an executor too."""
    path = write(tmp_path, recorded=RECORDED)
    model = ms_backend.open_model(path)
    assert list(model.info.spec.gears) == [(4, 4, 4, 2), (8, 8, 8, 2), (16, 16, 16, 2)]
    assert fake.state.calls_named("get_model_info") == ["input_shape", "dynamic_dims"]
    loaded = gr.load(path, backend="mindspore_lite")
    arrays = inputs_for(loaded.spec, loaded.info.input_dtypes, 1)
    got = loaded.create_executor().execute(dict(zip(loaded.input_names, arrays, strict=True)))
    np.testing.assert_array_equal(got[0], expected_outputs(arrays)[0])
    loaded.close()


def test_given_gears_are_checked_against_the_recorded_ones(fake, tmp_path, config):
    path = write(tmp_path, recorded=RECORDED)
    assert ms_backend.open_model(path, config=config).info.spec.gear_count == 3  # the same
    other = gr.GearSpec.from_atc(input_shape=RECORDED[0],
                                 dynamic_dims="4,4,4,2;8,8,8,2;32,32,32,2")
    with pytest.raises(CompileError, match=r"converted with the gears .*\(16, 16, 16, 2\).* "
                                           r"gives .*\(32, 32, 32, 2\)"):
        ms_backend.open_model(path, spec=other)


def test_what_a_model_records_must_parse_and_may_be_missing(fake, tmp_path, monkeypatch):
    with pytest.raises(CompileError, match="records gears that do not parse"):
        ms_backend.open_model(write(tmp_path, recorded=(RECORDED[0], "4,4;8")))
    with pytest.raises(GearSpecError, match="the model records none"):
        ms_backend.open_model(write(tmp_path))  # converted without ge.dynamicDims
    # a MindSpore Lite without get_model_info (older releases): the gears must be given
    monkeypatch.delattr(fake.module.Model, "get_model_info")
    with pytest.raises(GearSpecError, match="the model records none"):
        ms_backend.open_model(write(tmp_path, recorded=RECORDED))


def test_kept_and_given_outputs_are_copied_once_out_of_the_models_memory(fake, tmp_path):
    """execute(copy=True) of a large output copies it from the Model's output memory
    straight into a pooled array the caller keeps, and out= with a numpy buffer straight
    into that buffer: the session's own output buffers are never written on the way (one
    host copy, not two)."""
    path = fake_mslite.write_mindir(tmp_path / "big.mindir", [("x", [-1, 8192], "float32")],
                                    [[[1, 8192]], [[4, 8192]]])
    model = gr.load(path, backend="mindspore_lite",
                    spec=gr.GearSpec.from_atc("x:-1,8192", dynamic_batch_size="1,4"))
    ex = model.create_executor()
    own_y, own_cat = ex.session._outputs[1]  # the session's buffers of gear 1
    x = np.arange(4 * 8192, dtype=np.float32).reshape(4, 8192)
    y, cat = ex.execute({"x": x})
    np.testing.assert_array_equal(y, x * 2 + 1)
    np.testing.assert_array_equal(cat, x.ravel())
    assert ex.session._owned_pool.allocated == 2  # y and cat
    assert not own_y.any() and not own_cat.any()  # nothing went through them
    mine = np.zeros((4, 8192), np.float32)
    y2, cat2 = ex.execute({"x": x}, out={"y": mine}, copy=False)
    assert y2 is mine and cat2 is own_cat
    np.testing.assert_array_equal(mine, x * 2 + 1)
    np.testing.assert_array_equal(own_cat, x.ravel())
    assert not own_y.any()
    model.close()
