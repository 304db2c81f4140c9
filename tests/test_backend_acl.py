"""The acl backend against the pyACL double (tests/doubles/fake_acl.py); no NPU involved.

What is shown: load and gear discovery for the three modes (the spec equals what the fake
model declares), the per-gear output-shape table, runs of every gear with checkable outputs,
exactly ONE host-to-device memcpy of the merged span per run (plus one per separate span),
the dims call per mode, an int64 dims input, ACL's sub-buffer rule (every buffer in the
device block 64-aligned with ALIGN_UP(len, 32) + 32 bytes; packed layouts refused), failing
ACL calls -> BackendError with the call and the code, release of every resource, the error
when pyACL is missing, and the whole path through ``gr.load(..., backend="acl")``, where an
out-of-gear request fails before any ACL call.
"""

from __future__ import annotations

import gc
import sys
import threading
import types

import numpy as np
import pytest
from doubles import fake_acl
from doubles.layout import plan_layout, stage
from doubles.races import close_during_run

import gear_runtime as gr
from gear_runtime.backends import acl as acl_backend
from gear_runtime.errors import BackendError, BackendUnavailableError, GearFileError

# The ACL documentation's dims example: three inputs, four -1 dims, three gears.
DIMS_INPUTS = [("data", [1, 1, 40, -1], "float32"), ("label", [1, -1], "float32"),
               ("mask", [-1, -1], "int32")]
DIMS_GEARS = [(20, 20, 1, 1), (40, 40, 2, 2), (80, 60, 4, 4)]
BATCH_INPUTS = [("x", [-1, 3, 4], "float32"), ("ids", [-1, 2], "int64")]
BATCH_GEARS = [(1,), (4,), (8,)]
HW_INPUTS = [("img", [1, 3, -1, -1], "float16")]
HW_GEARS = [(8, 8), (16, 24)]

MODELS = {
    "dims": (DIMS_INPUTS, DIMS_GEARS),
    "batch": (BATCH_INPUTS, BATCH_GEARS),
    "image_size": (HW_INPUTS, HW_GEARS),
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> fake_acl.FakeAcl:
    double = fake_acl.FakeAcl()
    monkeypatch.setitem(sys.modules, "acl", double.module)
    return double


def write(tmp_path, mode: str, dims_dtype: str = "int32") -> str:
    inputs, gears = MODELS[mode]
    return fake_acl.write_om(tmp_path / f"{mode}.om", inputs, mode, gears, dims_dtype)


def expected_outputs(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The fake model's rule, written out independently of the double."""
    return [arrays[0].astype(np.float32) * 2 + 1,
            np.concatenate([a.astype(np.float32).ravel() for a in arrays])]


def inputs_for(spec: gr.GearSpec, dtypes, gear: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 10).astype(dt)
            for s, dt in zip(spec.shapes(gear).values(), dtypes, strict=True)]


def session_for(model: acl_backend.AclModel, fusion_size: int = 131072):
    """A session on the layout GearModel would plan: the model's layout_options."""
    info = model.info
    layout = plan_layout(info.input_nbytes(), info.spec.values_per_gear, fusion_size,
                         **model.layout_options)
    return layout, model.create_session(layout)


def run(model, layout, session, gear: int, seed: int = 0) -> tuple[list, list]:
    info = model.info
    arrays = inputs_for(info.spec, info.input_dtypes, gear, seed)
    stage(session.staging, layout, info.spec, info.input_dtypes, gear, arrays)
    return arrays, session.run_gear(gear)


# ---- load and discovery ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["dims", "batch", "image_size"])
def test_discovered_spec_is_what_the_model_declares(fake, tmp_path, mode):
    inputs, gears = MODELS[mode]
    model = acl_backend.open_model(write(tmp_path, mode))
    spec = model.info.spec
    assert spec.mode == mode
    assert spec.input_names == tuple(n for n, _, _ in inputs)
    assert spec.input_shapes == tuple(tuple(s) for _, s, _ in inputs)
    assert spec.gears == tuple(gears)
    assert model.info.input_dtypes == tuple(np.dtype(d) for _, _, d in inputs)
    assert model.info.output_names == ("y", "cat")
    model.close()


def test_dims_spec_matches_the_documented_example(fake, tmp_path):
    """ACL docs: data(1,1,40,-1) label(1,-1) mask(-1,-1), gear 0 = 1,1,40,20,1,20,1,1."""
    model = acl_backend.open_model(write(tmp_path, "dims"))
    assert model.info.spec.full_dims(0) == (1, 1, 40, 20, 1, 20, 1, 1)
    assert model.info.spec == gr.GearSpec.from_atc(
        input_shape="data:1,1,40,-1;label:1,-1;mask:-1,-1",
        dynamic_dims="20,20,1,1;40,40,2,2;80,60,4,4")
    model.close()


# A static input ATC's --input_shape leaves out (GE multi_batch_clone_pass.cc,
# CheckAndParseDynamicData: only the -1 inputs must be listed; the dims then hold only those).
PARTIAL_INPUTS = [("scale", [1, 4], "float32"), ("x", [1, -1], "float32"),
                  ("m", [-1, 2], "int32")]
PARTIAL_GEARS = [(8, 1), (16, 2)]


@pytest.mark.parametrize("given", [None, "m:-1,2;x:1,-1"])
def test_a_partial_input_shape_in_dims_mode_loads_and_runs(fake, tmp_path, given):
    path = fake_acl.write_om(tmp_path / "partial.om", PARTIAL_INPUTS, "dims", PARTIAL_GEARS,
                             input_shape_order=["m", "x"] if given else ["x", "m"])
    model = acl_backend.open_model(path, input_shape=given)
    spec = model.info.spec
    listed = ("m", "x") if given else ("x", "m")
    assert spec.input_names == (*listed, "scale")  # the listed inputs first, then the static
    assert spec.shapes(1)["scale"] == (1, 4)
    layout, session = session_for(model)
    for g in range(spec.gear_count):
        arrays, outs = run(model, layout, session, g, seed=g)
        by_name = dict(zip(spec.input_names, arrays, strict=True))
        want = expected_outputs([by_name[n] for n, _, _ in PARTIAL_INPUTS])
        for got, exp in zip(outs, want, strict=True):
            np.testing.assert_array_equal(got, exp)
    # ACL got the listed inputs' dims only, in --input_shape order
    (*_, dims), = fake.state.calls_named("mdl.set_input_dynamic_dims")[-1:]
    assert dims["dimCount"] == 4 and len(dims["dims"]) == 4
    model.close()


def test_a_partial_input_shape_must_list_every_dynamic_input(fake, tmp_path):
    path = fake_acl.write_om(tmp_path / "partial.om", PARTIAL_INPUTS, "dims", PARTIAL_GEARS,
                             input_shape_order=["x", "m"])
    with pytest.raises(gr.GearSpecError, match=r"leaves out \['m'\]"):
        acl_backend.open_model(path, input_shape="x:1,-1")
    with pytest.raises(ValueError, match="every dynamic one"):
        fake_acl.write_om(tmp_path / "bad.om", PARTIAL_INPUTS, "dims", PARTIAL_GEARS,
                          input_shape_order=["x"])


@pytest.mark.parametrize("mode", ["dims", "batch", "image_size"])
def test_output_shapes_per_gear(fake, tmp_path, mode):
    model = acl_backend.open_model(write(tmp_path, mode))
    spec = model.info.spec
    for g in range(spec.gear_count):
        shapes = list(spec.shapes(g).values())
        total = sum(int(np.prod(s)) for s in shapes)
        assert model.info.output_shapes[g] == (shapes[0], (total,))
    # read with get_cur_output_dims after setting each gear once, on a scratch dataset
    assert len(fake.state.calls_named("mdl.get_cur_output_dims")) == 2 * spec.gear_count
    model.close()


def test_missing_file_and_static_model_are_file_errors(fake, tmp_path):
    with pytest.raises(GearFileError, match="does not exist"):
        acl_backend.open_model(str(tmp_path / "nope.om"))
    bad = tmp_path / "bad.om"
    bad.write_text("not json")
    with pytest.raises(BackendError, match=r"acl\.mdl\.load_from_file") as info:
        acl_backend.open_model(str(bad))
    assert info.value.code == str(fake_acl.ACL_ERROR_INVALID_FILE)
    assert fake.state.leaks() == dict.fromkeys(fake.state.leaks(), 0)


# ---- running ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["dims", "batch", "image_size"])
def test_every_gear_runs_with_one_merged_memcpy(fake, tmp_path, mode):
    model = acl_backend.open_model(write(tmp_path, mode))
    layout, session = session_for(model)
    for g in range(model.info.spec.gear_count):
        before = len(fake.state.memcpys)
        arrays, outputs = run(model, layout, session, g, seed=g)
        for got, want in zip(outputs, expected_outputs(arrays), strict=True):
            np.testing.assert_array_equal(got, want)
        assert tuple(o.shape for o in outputs) == model.info.output_shapes[g]
        copies = fake.state.memcpys[before:]
        h2d = [c for c in copies if c.kind == fake_acl.ACL_MEMCPY_HOST_TO_DEVICE]
        start, end = layout.merged_span(g)
        assert layout.separate(g) == []  # every buffer is small: all fused
        assert len(h2d) == 1 and h2d[0].count == end - start > 0
        d2h = [c for c in copies if c.kind == fake_acl.ACL_MEMCPY_DEVICE_TO_HOST]
        assert len(d2h) == 2  # one per output
        assert all(c.pinned for c in h2d + d2h)  # from the pinned staging, to pinned outputs
        assert fake.state.executions[-1] == (model.model_id, g)
    session.close()
    model.close()


def test_the_dims_call_of_each_mode(fake, tmp_path):
    """Each gear's dataset gets its set_* once, when the session is made; a run makes none
    (GE's SetDynamicDims is one aclrtMemcpy per value: per run they would come on top of the
    ONE merged copy), and still runs the gear it is asked for."""
    calls = {}
    for mode in MODELS:
        model = acl_backend.open_model(write(tmp_path, mode))
        n = len(fake.state.calls)
        layout, session = session_for(model)
        made = [(name, args[2:]) for name, args in fake.state.calls[n:]
                if name.startswith("mdl.set_")]
        assert len(made) == model.info.spec.gear_count
        calls[mode] = made[1]
        n = len(fake.state.calls)
        for g in (1, 0, 1):
            arrays, outputs = run(model, layout, session, g)
            np.testing.assert_array_equal(outputs[0], expected_outputs(arrays)[0])
            assert fake.state.executions[-1][1] == g
        assert not [c for c, _ in fake.state.calls[n:] if c.startswith("mdl.set_")]
        model.close()
    dims_index = len(DIMS_INPUTS)  # the dims input is the model's last input
    assert calls["dims"] == ("mdl.set_input_dynamic_dims", (dims_index, {
        "name": "", "dimCount": 8, "dims": [1, 1, 40, 40, 1, 40, 2, 2]}))
    assert calls["batch"] == ("mdl.set_dynamic_batch_size", (len(BATCH_INPUTS), 4))
    assert calls["image_size"] == ("mdl.set_dynamic_hw_size", (len(HW_INPUTS), 16, 24))


def test_a_failing_set_call_fails_the_session_with_call_and_code(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "dims"))
    fake.state.fail["mdl.set_input_dynamic_dims"] = 507011
    with pytest.raises(BackendError, match=r"acl\.mdl\.set_input_dynamic_dims.*gear 0") as info:
        session_for(model)
    assert info.value.code == "507011"
    del fake.state.fail["mdl.set_input_dynamic_dims"]
    layout, session = session_for(model)
    arrays, outputs = run(model, layout, session, 0)
    np.testing.assert_array_equal(outputs[0], expected_outputs(arrays)[0])
    model.close()


def test_separate_inputs_get_one_memcpy_each(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "dims"))
    # a fusion size below the data input's size: it is copied on its own
    layout, session = session_for(model, fusion_size=256)
    g = 2
    before = len(fake.state.memcpys)
    arrays, outputs = run(model, layout, session, g)
    np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])
    h2d = [c for c in fake.state.memcpys[before:] if c.kind == fake_acl.ACL_MEMCPY_HOST_TO_DEVICE]
    start, end = layout.merged_span(g)
    spans = [(start, end)] if end > start else []
    spans += [tuple(s) for s in layout.separate(g)]
    assert len(layout.separate(g)) >= 1
    assert sorted(c.count for c in h2d) == sorted(e - s for s, e in spans)
    model.close()


def test_int64_dims_input_gets_its_own_buffer(fake, tmp_path):
    """A model whose ascend_mbatch_shape_data is int64 (GE's older offline width): the
    layout's int32 slot is too small, so the dims input gets a session buffer of the model's
    size, which set_* fills in the model's width (execute reads the dims from there)."""
    model = acl_backend.open_model(write(tmp_path, "batch", dims_dtype="int64"))
    assert model.dims_nbytes == 8
    layout, session = session_for(model)
    for g in (2, 0, 1):
        arrays, outputs = run(model, layout, session, g, seed=g)
        np.testing.assert_array_equal(outputs[0], expected_outputs(arrays)[0])
        assert fake.state.executions[-1][1] == g
    model.close()


def test_outputs_are_reused_views_until_the_next_run(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "batch"))
    layout, session = session_for(model)
    _, first = run(model, layout, session, 0, seed=1)
    kept = first[0].copy()
    _, again = run(model, layout, session, 0, seed=2)
    assert np.shares_memory(first[0], again[0])
    assert not np.array_equal(kept, again[0])
    model.close()


def test_a_session_used_from_another_thread_sets_the_context(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "batch"))
    layout, session = session_for(model)
    run(model, layout, session, 0)
    n = len(fake.state.calls_named("rt.set_context"))
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=run(model, layout, session, 1)))
    worker.start()
    worker.join()
    assert len(fake.state.calls_named("rt.set_context")) == n + 1
    arrays, outputs = result["out"]
    np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])
    model.close()


def test_two_models_driven_from_one_thread_each_run_in_their_own_context(fake, tmp_path):
    """ACL runs a model in the context it was loaded in; contexts are per thread, so a thread
    that alternates between two models must switch contexts every time (the double answers
    107004, "model not in current context", otherwise)."""
    first = acl_backend.open_model(write(tmp_path, "batch"))
    second = acl_backend.open_model(write(tmp_path, "image_size"))
    assert first.context != second.context
    sessions = [(m, *session_for(m)) for m in (first, second)]
    for model, layout, session in [*sessions, *sessions]:
        arrays, outputs = run(model, layout, session, 1)
        np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])
        assert fake.current_context() == model.context
    first.close()
    second.close()
    assert fake.state.leaks() == dict.fromkeys(fake.state.leaks(), 0)


class PaddedLayout:
    """A layout that keeps ACL's carving rule (64-aligned starts, ALIGN_UP(len,32)+32 bytes
    each) and merges nothing: every input and the dims are copied on their own."""

    def __init__(self, input_nbytes, dims_count):
        self._n = input_nbytes
        self.dims_nbytes = 4 * dims_count
        self._off, self._dims, self.total_bytes = [], [], 0
        for row in input_nbytes:
            pos, offs = 0, []
            for n in [*row, self.dims_nbytes]:
                offs.append(pos)
                pos += ((n + 31) // 32 * 32 + 32 + 63) // 64 * 64
            self._off.append(offs[:-1])
            self._dims.append(offs[-1])
            self.total_bytes = max(self.total_bytes, pos)

    def offset(self, g, i):
        return self._off[g][i]

    def nbytes(self, g, i):
        return self._n[g][i]

    def dims_offset(self, g):
        return self._dims[g]

    def merged_span(self, g):
        return (0, 0)

    def separate(self, g):
        spans = [(o, o + n) for o, n in zip(self._off[g], self._n[g], strict=True)]
        return [*spans, (self._dims[g], self._dims[g] + self.dims_nbytes)]


def test_a_layout_without_merging(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "batch"))
    info = model.info
    layout = PaddedLayout(info.input_nbytes(), info.spec.values_per_gear)
    session = model.create_session(layout)
    before = len(fake.state.memcpys)
    arrays, outputs = run(model, layout, session, 1)
    np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])
    h2d = [c for c in fake.state.memcpys[before:] if c.kind == fake_acl.ACL_MEMCPY_HOST_TO_DEVICE]
    assert len(h2d) == 3  # two inputs and the dims, one copy each
    model.close()


def test_acl_asks_for_padded_layouts_and_refuses_packed_ones(fake, tmp_path):
    """The sub-buffer rule is the layout's job (AclModel.layout_options); a packed layout
    (plan_layout's defaults: 192-byte inputs back to back) is refused, nothing leaks."""
    assert acl_backend.AclModel.layout_options == {"alignment": 64, "tail_padding": 32}
    model = acl_backend.open_model(write(tmp_path, "batch"))
    loaded = fake.state.leaks()
    info = model.info
    packed = plan_layout(info.input_nbytes(), info.spec.values_per_gear)
    with pytest.raises(BackendError, match=r"ALIGN_UP\(len,32\)\+32") as err:
        model.create_session(packed)
    # gear 0: x (48 bytes) at 0 needs 64 + 32 = 96 bytes, ids starts at 64
    assert "'x' of gear 0 at offset 0 (48 bytes)" in err.value.message
    assert "96 bytes (ALIGN_UP(len,32)+32) before offset 64" in err.value.message
    assert "tail_padding" in err.value.message
    assert fake.state.leaks() == loaded
    model.close()


def test_a_layout_planned_for_other_sizes_is_refused(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "dims"))
    loaded = fake.state.leaks()
    rows = [list(r) for r in model.info.input_nbytes()]
    rows[2][1] -= 4  # label of gear 2: 4 bytes short
    layout = plan_layout(rows, model.info.spec.values_per_gear, **model.layout_options)
    end = layout.offset(2, 1) + rows[2][1]
    with pytest.raises(BackendError, match="staging layout does not fit the model") as info:
        model.create_session(layout)
    assert (f"input 'label' of gear 2 gets {rows[2][1]} bytes ending at {end} of "
            f"{layout.total_bytes}, it needs {rows[2][1] + 4}") in info.value.message
    assert fake.state.leaks() == loaded
    model.close()


def input_slots(fake: fake_acl.FakeAcl, dataset: int) -> tuple[int, list[tuple[int, int, int]]]:
    """The device block holding ``dataset``'s buffers and each buffer's (offset in it, length,
    slot: bytes up to the next buffer's start or the block's end), read from the double."""
    state = fake.state
    bufs = sorted(state.buffers[b] for b in state.datasets[dataset])
    bases = {max(p for p in state.device if p <= addr) for addr, _ in bufs}
    assert len(bases) == 1, "the inputs and the dims share one aclrtMalloc block"
    base = bases.pop()
    end = base + len(state.device[base])
    starts = [addr for addr, _ in bufs[1:]] + [end]
    return base, [(addr - base, n, nxt - addr)
                  for (addr, n), nxt in zip(bufs, starts, strict=True)]


@pytest.mark.parametrize("mode", ["dims", "batch", "image_size"])
@pytest.mark.parametrize("fusion", [131072, 256, -1])
def test_every_sub_buffer_keeps_acls_carving_rule(fake, tmp_path, mode, fusion):
    """Through gr.load (GearModel plans with layout_options, the user's fusion size still
    decides what merges): in the device block of every gear's input dataset, each buffer
    starts 64-aligned and owns >= ALIGN_UP(len, 32) + 32 bytes, the last one included: the
    block is exactly layout.total_bytes, with no spare bytes at its end."""
    model = gr.load(write(tmp_path, mode), backend="acl", input_fusion_size=fusion)
    layout = model.layout
    assert (layout.alignment, layout.tail_padding) == (64, 32)
    packed = plan_layout(model.info.input_nbytes(), model.spec.values_per_gear, fusion)
    fused = [layout.fused(i) for i in range(layout.input_count)]
    assert layout.merged == packed.merged
    assert fused == [packed.fused(i) for i in range(packed.input_count)]
    # 131072: every buffer is small, all merge; 256: the largest input is separate; -1: none
    assert all(fused) if fusion == 131072 else not all(fused)
    ex = model.create_executor()
    datasets = set()
    for g in range(model.gear_count):
        arrays = inputs_for(model.spec, model.info.input_dtypes, g, seed=g)
        outputs = ex.execute(arrays)
        for got, want in zip(outputs, expected_outputs(arrays), strict=True):
            np.testing.assert_array_equal(got, want)
        _, dataset_in, _ = fake.state.calls_named("mdl.execute")[-1]
        datasets.add(dataset_in)
    assert len(datasets) == model.gear_count  # one input dataset per gear
    for dataset in datasets:
        base, slots = input_slots(fake, dataset)
        assert base % 64 == 0
        assert len(fake.state.device[base]) == layout.total_bytes
        assert len(slots) == len(model.input_names) + 1  # the inputs and the dims
        for offset, n, slot in slots:
            assert offset % 64 == 0, (offset, n)
            assert slot >= (n + 31) // 32 * 32 + 32, (offset, n, slot)
    model.close()


def test_runs_of_one_model_id_are_serialised(fake, tmp_path):
    """pyACL execute: threads sharing a model id must lock memcpy -> execute as one step."""
    model = acl_backend.open_model(write(tmp_path, "batch"))
    layout, session = session_for(model)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (run(model, layout, session, 0), done.set()))
    with model.lock:
        worker.start()
        assert not done.wait(0.2)  # blocked while another run holds the model
        assert fake.state.calls_named("mdl.execute") == []
    worker.join()
    assert done.is_set() and len(fake.state.calls_named("mdl.execute")) == 1
    model.close()


# ---- failures and lifetime -------------------------------------------------------------------
@pytest.mark.parametrize(("call", "name"), [
    ("mdl.execute", "acl.mdl.execute"),
    ("rt.memcpy", "acl.rt.memcpy"),
])
def test_a_failing_call_is_a_backend_error_with_call_and_code(fake, tmp_path, call, name):
    model = acl_backend.open_model(write(tmp_path, "dims"))
    layout, session = session_for(model)
    fake.state.fail[call] = 507011
    with pytest.raises(BackendError, match=name.replace(".", r"\.")) as info:
        run(model, layout, session, 0)
    assert info.value.code == "507011"
    assert "507011" in str(info.value)
    del fake.state.fail[call]
    arrays, outputs = run(model, layout, session, 0)  # the session still works afterwards
    np.testing.assert_array_equal(outputs[0], expected_outputs(arrays)[0])
    model.close()


@pytest.mark.parametrize("call", ["rt.set_device", "mdl.load_from_file", "mdl.get_dynamic_batch",
                                  "mdl.get_cur_output_dims", "rt.malloc"])
def test_a_failure_while_loading_releases_everything(fake, tmp_path, call):
    fake.state.fail[call] = 100000
    with pytest.raises(BackendError, match=r"acl\." + call.replace(".", r"\.")) as info:
        acl_backend.open_model(write(tmp_path, "dims"))
    assert info.value.code == "100000"
    assert fake.state.leaks() == dict.fromkeys(fake.state.leaks(), 0)


def test_a_failure_while_creating_a_session_releases_its_memory(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "dims"))
    loaded = fake.state.leaks()
    fake.state.fail["mdl.add_dataset_buffer"] = 100000
    with pytest.raises(BackendError, match=r"acl\.mdl\.add_dataset_buffer"):
        session_for(model)
    assert fake.state.leaks() == loaded
    model.close()


def test_close_releases_everything_and_is_idempotent(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "image_size"))
    layout, session = session_for(model)
    _, second = session_for(model)  # left open: model.close() closes it
    run(model, layout, session, 1)
    session.close()
    session.close()
    model.close()
    model.close()
    assert fake.state.leaks() == dict.fromkeys(fake.state.leaks(), 0)
    for closed in (session, second):
        with pytest.raises(BackendError, match="closed"):
            closed.run_gear(0)


def test_closing_the_model_waits_for_a_run_in_flight(fake, tmp_path):
    """model.close() from another thread must not unload or free under a run: it waits for
    the model's lock; a run that was waiting for the lock then finds its session closed."""
    model = acl_backend.open_model(write(tmp_path, "batch"))
    layout, session = session_for(model)
    arrays = inputs_for(model.info.spec, model.info.input_dtypes, 1)
    stage(session.staging, layout, model.info.spec, model.info.input_dtypes, 1, arrays)
    result = close_during_run(model, lambda: [o.copy() for o in session.run_gear(1)],
                              lambda: fake.state.calls_named("mdl.unload") == [])
    if isinstance(result, BackendError):  # the close went first
        assert "closed" in result.message
    else:  # the run went first, on a model that was still loaded
        np.testing.assert_array_equal(result[1], expected_outputs(arrays)[1])
    assert fake.state.leaks() == dict.fromkeys(fake.state.leaks(), 0)


def test_closing_the_model_releases_it_even_when_a_session_fails_to_close(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "dims"))
    _, session = session_for(model)  # left open (kept alive): the model's close closes it
    fake.state.fail["rt.free"] = 507899
    with pytest.raises(BackendError, match=r"acl\.rt\.free") as info:
        model.close()
    assert info.value.code == "507899"
    leaks = fake.state.leaks()
    assert leaks["device"] > 0  # what rt.free refused to free
    assert {k: v for k, v in leaks.items() if k != "device"} == dict.fromkeys(
        (k for k in leaks if k != "device"), 0)  # the model, its context and the rest: released


def test_a_dropped_session_frees_its_memory(fake, tmp_path):
    model = acl_backend.open_model(write(tmp_path, "batch"))
    loaded = fake.state.leaks()
    session_for(model)  # never closed, dropped at once
    gc.collect()
    assert fake.state.leaks() == loaded
    model.close()


def test_acl_init_once_per_process(fake, tmp_path):
    path = write(tmp_path, "batch")
    acl_backend.open_model(path).close()
    acl_backend.open_model(path).close()
    assert len(fake.state.calls_named("init")) == 1


def test_no_pyacl_is_backend_unavailable_naming_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "acl", None)  # `import acl` raises ImportError
    import gear_runtime  # noqa: F401  (works without pyACL)

    path = fake_acl.write_om(tmp_path / "m.om", *MODELS["batch"][:1], "batch", BATCH_GEARS)
    with pytest.raises(BackendUnavailableError, match="CANN") as info:
        gr.load(path, backend="acl")
    assert "pyACL" in str(info.value) and "set_env.sh" in str(info.value)
    with pytest.raises(ImportError):  # also an ImportError, for `except ImportError` users
        acl_backend.open_model(path)


# ---- the double rejects what pyACL rejects ---------------------------------------------------
def test_the_double_rejects_what_acl_rejects(fake, tmp_path):
    acl = fake.module
    assert acl.rt.malloc(16, 0) == (0, fake_acl.ACL_ERROR_UNINITIALIZE)  # before acl.init
    assert acl.init() == 0 and acl.init() == fake_acl.ACL_ERROR_REPEAT_INITIALIZE
    path = write(tmp_path, "dims")
    assert acl.mdl.load_from_file(path)[1] == fake_acl.ACL_ERROR_RT_CONTEXT_NULL  # no device
    assert acl.rt.set_device(0) == 0
    model_id, ret = acl.mdl.load_from_file(path)
    assert ret == 0
    dims_ptr, _ = acl.rt.malloc(16, 0)
    ds = acl.mdl.create_dataset()
    for _ in range(len(DIMS_INPUTS)):
        acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(dims_ptr, 16))
    acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(dims_ptr, 16))
    index = len(DIMS_INPUTS)

    def set_dims(dims, count=None):
        return acl.mdl.set_input_dynamic_dims(model_id, ds, index, {
            "name": "", "dimCount": len(dims) if count is None else count, "dims": dims})

    assert set_dims([1, 1, 40, 20, 1, 20, 1, 1]) == 0
    assert set_dims([], 0) == fake_acl.ACL_ERROR_INVALID_PARAM  # dimCount 0
    # pyACL reads only the first dimCount values: GE then sees 7 dims for 8 (145012)
    assert set_dims([1, 1, 40, 20, 1, 20, 1, 1], 7) == \
        fake_acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
    assert set_dims([1, 1, 40, 20, 1, 20, 1]) == fake_acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
    assert set_dims([2, 1, 40, 20, 1, 20, 1, 1]) == \
        fake_acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID  # a static dim differs
    assert set_dims([1, 1, 40, 30, 1, 20, 1, 1]) == fake_acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert acl.mdl.set_dynamic_batch_size(model_id, ds, index, 0) == \
        fake_acl.ACL_ERROR_INVALID_PARAM  # batch 0
    host, _ = acl.rt.malloc_host(8)
    assert acl.rt.memcpy(dims_ptr, 16, host, 32, 1) == fake_acl.ACL_ERROR_INVALID_PARAM  # > max
    assert acl.rt.memcpy(host, 8, dims_ptr, 8, 1) == fake_acl.ACL_ERROR_INVALID_PARAM  # kind
    other, _ = acl.rt.create_context(0)  # now bound to this thread instead of the default
    assert acl.mdl.execute(model_id, ds, ds) == fake_acl.ACL_ERROR_RT_MODEL_CONTEXT
    assert acl.mdl.unload(model_id) == fake_acl.ACL_ERROR_RT_MODEL_CONTEXT
    errors: list[int] = []
    worker = threading.Thread(target=lambda: errors.append(acl.rt.memcpy(dims_ptr, 8, host, 8, 1)))
    worker.start()
    worker.join()
    assert errors == [fake_acl.ACL_ERROR_RT_CONTEXT_NULL]  # a fresh thread has no context
    assert acl.rt.free(dims_ptr) == 0
    assert acl.rt.memcpy(dims_ptr, 8, host, 8, 1) == fake_acl.ACL_ERROR_INVALID_PARAM  # freed
    assert acl.rt.destroy_context(other) == 0
    assert acl.rt.memcpy(host, 8, host, 8, 0) == fake_acl.ACL_ERROR_RT_CONTEXT_NULL  # unbound


def test_the_double_copies_to_pageable_memory_only_where_it_is_mapped(fake):
    """The synchronous aclrtMemcpy takes pageable host memory (no condition on the page;
    CANN's aclnn samples copy results into a std::vector): the double copies into memory
    mapped writable in this process, records that it was not pinned, and refuses an
    unmapped address and a read-only mapping as a destination."""
    import mmap
    acl = fake.module
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    dev, _ = acl.rt.malloc(64, 0)
    pinned, _ = acl.rt.malloc_host(64)
    src = np.arange(16, dtype=np.float32)
    assert acl.rt.memcpy(dev, 64, src.ctypes.data, 64, 1) == 0  # pageable source
    got = np.zeros(16, np.float32)
    assert acl.rt.memcpy(got.ctypes.data, 64, dev, 64, 2) == 0  # pageable destination
    np.testing.assert_array_equal(got, src)
    assert acl.rt.memcpy(pinned, 64, dev, 64, 2) == 0
    assert [c.pinned for c in fake.state.memcpys[-3:]] == [False, False, True]
    with mmap.mmap(-1, 4096, prot=mmap.PROT_READ) as ro:
        address = np.frombuffer(ro, np.uint8).ctypes.data
        assert acl.rt.memcpy(address, 64, dev, 64, 2) == fake_acl.ACL_ERROR_INVALID_PARAM
        assert acl.rt.memcpy(dev, 64, address, 64, 1) == 0  # readable: a source
    assert acl.rt.memcpy(0x10, 64, dev, 64, 2) == fake_acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.free(dev) == 0 and acl.rt.free_host(pinned) == 0


def test_the_double_parses_the_dims_dict_as_pyacl_does(fake, tmp_path):
    """pyACL's C extension takes a dict whose 'dims' is a list (PyList_Check) of Python ints
    (PyLong type check): a tuple, numpy integers or floats raise before any ACL call."""
    acl = fake.module
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    model_id, _ = acl.mdl.load_from_file(write(tmp_path, "dims"))
    ptr, _ = acl.rt.malloc(64, 0)
    ds = acl.mdl.create_dataset()
    for _ in range(len(DIMS_INPUTS) + 1):
        acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(ptr, 64))
    good = [1, 1, 40, 20, 1, 20, 1, 1]

    def set_dims(dims, count=8, name=""):
        return acl.mdl.set_input_dynamic_dims(model_id, ds, len(DIMS_INPUTS), {
            "name": name, "dimCount": count, "dims": dims})

    assert set_dims(good) == 0
    for bad in (tuple(good), np.array(good), [np.int64(v) for v in good],
                [float(v) for v in good], good[:7]):
        with pytest.raises(TypeError):
            set_dims(bad)
    with pytest.raises(TypeError):
        set_dims(good, count=np.int64(8))
    with pytest.raises(TypeError):
        acl.mdl.set_input_dynamic_dims(model_id, ds, len(DIMS_INPUTS), good)  # not a dict
    assert fake.state.calls_named("mdl.set_input_dynamic_dims")[-1][3] == good


@pytest.mark.parametrize(("length", "width"), [(8, 4), (12, 4), (16, 8), (40, 8)])
def test_the_double_writes_the_dims_in_the_width_ge_chooses(fake, tmp_path, length, width):
    """GeExecutor::SetDynamicDims writes uint64 values when the data buffer holds 8 bytes per
    value, else uint32 ones, whatever the model's dims dtype (ge_executor.cc)."""
    acl = fake.module
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    inputs = [("x", [1, -1], "float32"), ("m", [-1, 2], "float32")]
    path = fake_acl.write_om(tmp_path / "w.om", inputs, "dims", [(5, 6), (7, 8)])
    model_id, _ = acl.mdl.load_from_file(path)
    ptr, _ = acl.rt.malloc(64, 0)
    ds = acl.mdl.create_dataset()
    for _ in range(2):
        acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(ptr + 32, 16))
    acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(ptr, length))
    dims = {"name": "", "dimCount": 4, "dims": [1, 7, 8, 2]}
    assert acl.mdl.set_input_dynamic_dims(model_id, ds, 2, dims) == 0
    mem, off = fake._find_device(ptr, 16)
    written = np.frombuffer(bytes(mem[off:off + 2 * width]), dtype=f"<u{width}")
    assert written.tolist() == [7, 8]
    ds_short = acl.mdl.create_dataset()
    for n in (16, 16, 7):
        acl.mdl.add_dataset_buffer(ds_short, acl.create_data_buffer(ptr, n))
    assert acl.mdl.set_input_dynamic_dims(model_id, ds_short, 2, dims) == \
        fake_acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID  # under 4 bytes per value


# ---- the dims follow ATC's --input_shape order, not the input index --------------------------
#: model inputs A then B; ATC's --input_shape listed B first: "B:1,-1;A:-1,3"
ORDER_INPUTS = [("A", [-1, 3], "float32"), ("B", [1, -1], "int32")]
ORDER_GEARS = [(4, 2), (8, 5)]  # (B's -1, A's -1), in --input_shape order


def order_model(tmp_path, inputs=ORDER_INPUTS, gears=ORDER_GEARS) -> str:
    return fake_acl.write_om(tmp_path / "order.om", inputs, "dims", gears,
                             input_shape_order=["B", "A"])


def model_order_outputs(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """The fake's rule over the MODEL's inputs (A is input 0): y = 2A + 1, cat = A, B."""
    return [a.astype(np.float32) * 2 + 1,
            np.concatenate([a.astype(np.float32).ravel(), b.astype(np.float32).ravel()])]


def test_dims_follow_the_input_shape_order_not_the_input_index(fake, tmp_path):
    model = acl_backend.open_model(order_model(tmp_path))
    spec = model.info.spec
    assert spec.input_names == ("B", "A")
    assert spec.shapes(0) == {"B": (1, 4), "A": (2, 3)}
    assert spec.shapes(1) == {"B": (1, 8), "A": (5, 3)}
    assert model.info.input_dtypes == (np.dtype(np.int32), np.dtype(np.float32))
    model.close()


def test_a_model_in_input_shape_order_runs_every_gear_with_the_right_buffers(fake, tmp_path):
    model = gr.load(order_model(tmp_path), backend="acl")
    ex = model.create_executor()
    rng = np.random.default_rng(3)
    for g, (b_len, a_rows) in enumerate(ORDER_GEARS):
        a = rng.standard_normal((a_rows, 3)).astype(np.float32)
        b = rng.integers(-9, 9, (1, b_len)).astype(np.int32)
        outputs = ex.execute({"A": a, "B": b})
        for got, want in zip(outputs, model_order_outputs(a, b), strict=True):
            np.testing.assert_array_equal(got, want)
        assert fake.state.executions[-1][1] == g
    # the last run was gear 1: full dims in --input_shape order, B's (1, 8) then A's (5, 3)
    assert fake.state.calls_named("mdl.set_input_dynamic_dims")[-1][3]["dims"] == [1, 8, 5, 3]
    model.close()


#: A and B of the same rank and static dims: the gears' full dims fit both orders
AMBIGUOUS_INPUTS = [("A", [1, -1], "float32"), ("B", [1, -1], "float32")]
AMBIGUOUS_GEARS = [(4, 2), (8, 5)]


def test_an_order_the_dims_cannot_tell_is_refused_until_input_shape_is_given(fake, tmp_path):
    path = order_model(tmp_path, AMBIGUOUS_INPUTS, AMBIGUOUS_GEARS)
    with pytest.raises(GearFileError, match="input_shape=") as info:
        acl_backend.open_model(path)
    assert "'A'" in str(info.value) and "'B'" in str(info.value)
    assert fake.state.leaks() == dict.fromkeys(fake.state.leaks(), 0)
    model = gr.load(path, backend="acl", input_shape="B:1,-1;A:1,-1")
    assert list(model.input_names) == ["B", "A"]
    ex = model.create_executor()
    a, b = np.arange(2, dtype=np.float32)[None], np.arange(4, dtype=np.float32)[None]
    for got, want in zip(ex.execute({"A": a, "B": b}), model_order_outputs(a, b), strict=True):
        np.testing.assert_array_equal(got, want)
    model.close()


def test_an_input_shape_that_does_not_fit_the_model_is_refused(fake, tmp_path):
    path = order_model(tmp_path)
    for bad in ("B:1,-1", "B:1,-1;A:-1,3;C:1", "B:1,-1;A:-1,4", "B:1,-1,1;A:-1,3"):
        with pytest.raises(gr.GearSpecError, match="input_shape"):
            acl_backend.open_model(path, input_shape=bad)
    assert fake.state.leaks() == dict.fromkeys(fake.state.leaks(), 0)


def test_the_dims_buffer_is_sized_so_ge_writes_the_models_width(fake, tmp_path):
    """GE writes 8 bytes per value when the dims data buffer holds 8 per value. A model that
    reports a padded size for its int32 dims input must still get int32 dims: the backend
    sizes that buffer count * itemsize of the input's own dtype."""
    inputs, gears = MODELS["dims"]
    path = fake_acl.write_om(tmp_path / "padded.om", inputs, "dims", gears, dims_size=96)
    model = acl_backend.open_model(path)
    assert model.dims_nbytes == 4 * 4
    layout, session = session_for(model)
    for g in (2, 0, 1):
        arrays, outputs = run(model, layout, session, g, seed=g)
        np.testing.assert_array_equal(outputs[1], expected_outputs(arrays)[1])
        assert fake.state.executions[-1][1] == g
    model.close()


# ---- the module imported as `acl` must be pyACL ----------------------------------------------
def test_a_foreign_module_named_acl_is_refused_naming_its_file(monkeypatch, tmp_path):
    """PyPI's unrelated `acl` package (a network ACL parser) imports as `acl` too."""
    foreign = types.ModuleType("acl")
    foreign.__file__ = "/site-packages/acl/__init__.py"
    foreign.parse = lambda text: text
    monkeypatch.setitem(sys.modules, "acl", foreign)
    path = fake_acl.write_om(tmp_path / "m.om", *MODELS["batch"][:1], "batch", BATCH_GEARS)
    with pytest.raises(BackendUnavailableError) as info:
        gr.load(path, backend="acl")
    text = str(info.value)
    assert "/site-packages/acl/__init__.py" in text and "pyACL" in text
    assert "set_env.sh" in text and "pip uninstall acl" in text


# ---- through gr.load and the executor (needs the C++ core) -----------------------------------
def test_through_gr_load_and_the_executor(fake, tmp_path):
    model = gr.load(write(tmp_path, "dims"), backend="acl", device_id=0)
    assert model.backend == "acl" and model.gears == DIMS_GEARS
    ex = model.create_executor()
    for g in range(model.gear_count):
        arrays = inputs_for(model.spec, model.info.input_dtypes, g, seed=g)
        outputs = ex.execute(dict(zip(model.input_names, arrays, strict=True)))
        for got, want in zip(outputs, expected_outputs(arrays), strict=True):
            np.testing.assert_array_equal(got, want)
        assert fake.state.executions[-1][1] == g
    model.close()


def test_an_out_of_gear_request_fails_before_any_acl_call(fake, tmp_path):
    model = gr.load(write(tmp_path, "dims"), backend="acl")
    ex = model.create_executor()
    n = len(fake.state.calls)
    bad = [np.zeros((1, 1, 40, 30), np.float32), np.zeros((1, 20), np.float32),
           np.zeros((1, 1), np.int32)]
    with pytest.raises(gr.GearMismatchError) as info:
        ex.execute(bad)
    assert info.value.code == "145013"
    with pytest.raises(gr.GearMismatchError):
        ex.set_dynamic_dims([1, 1, 40, 30, 1, 20, 1, 1])
    assert fake.state.calls[n:] == []  # no memcpy, no set_*, no execute
    model.close()


# ---- AIPP models: refused at load ----------------------------------------------------------------
@pytest.mark.parametrize(("aipp", "said"), [
    ({0: 1}, "static AIPP"),
    ({0: 2, 1: 3}, "dynamic AIPP"),
])
def test_a_model_built_with_aipp_is_refused_at_load(fake, tmp_path, aipp, said):
    inputs, gears = MODELS["batch"]
    path = fake_acl.write_om(tmp_path / "aipp.om", inputs, "batch", gears, aipp=aipp)
    with pytest.raises(GearFileError, match=f"input 'x' has {said}.*--insert_op_conf"):
        acl_backend.open_model(path)
    assert fake.state.calls_named("mdl.get_aipp_type")
    # nothing held: the next load works
    model = acl_backend.open_model(write(tmp_path, "batch"))
    assert model.info.spec.gears == tuple(gears)
    model.close()


def test_a_failing_aipp_query_is_a_backend_error(fake, tmp_path):
    fake.state.fail["mdl.get_aipp_type"] = 145000
    with pytest.raises(BackendError, match=r"acl\.mdl\.get_aipp_type"):
        acl_backend.open_model(write(tmp_path, "batch"))


# ---- pyACL holds the GIL while the NPU runs ----------------------------------------------------
def test_the_double_holds_the_gil_through_execute_as_pyacl_does(fake, tmp_path):
    """pyACL's execute and memcpy wraps never release the GIL (mdl_wrap.cpp, rt_memory.cpp):
    while a run is on the NPU, no other Python thread of the process moves. The double does
    the same, so no test here can show threads overlapping where pyACL would not; parallel
    runs on Ascend need processes (docs/ascend.md)."""
    import threading
    import time
    model = acl_backend.open_model(write(tmp_path, "batch"))
    layout, session = session_for(model)
    fake.state.device_seconds = 0.2
    ticks, stop = [], threading.Event()

    def ticker() -> None:  # a pure-Python thread: an event loop, another request
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.05)
    begin = time.perf_counter()
    run(model, layout, session, 0)
    end = time.perf_counter()
    stop.set()
    t.join()
    assert end - begin >= 0.2
    gaps = np.diff([x for x in ticks if begin - 0.01 <= x <= end + 0.01])
    assert gaps.size and gaps.max() >= 0.15  # the ticker stood still while the NPU ran
    model.close()


# ---- a static .om (no gears: a decode step at fixed shapes) ----------------------------------
STATIC_INPUTS = [("x", [2, 3, 4], "float32"), ("ids", [2, 2], "int64")]


def test_a_static_om_loads_with_its_one_gear_and_runs_with_one_merged_copy(fake, tmp_path):
    """An .om atc built without gears has no ascend_mbatch_shape_data: it loads as a static
    model (mode "static", one gear ()), runs with no set_* at all, one merged copy in."""
    path = fake_acl.write_om(tmp_path / "decode.om", STATIC_INPUTS, "static", [()])
    model = acl_backend.open_model(path)
    spec = model.info.spec
    assert spec.mode == "static" and spec.gears == ((),)
    assert spec.input_shapes == ((2, 3, 4), (2, 2))
    layout, session = session_for(model)
    before = len(fake.state.memcpys)
    arrays, outputs = run(model, layout, session, 0)
    for got, want in zip(outputs, expected_outputs(arrays), strict=True):
        np.testing.assert_array_equal(got, want)
    h2d = [c for c in fake.state.memcpys[before:] if c.kind == fake_acl.ACL_MEMCPY_HOST_TO_DEVICE]
    assert len(h2d) == 1
    assert not [c for c, _ in fake.state.calls if c.startswith("mdl.set_")]
    model.close()


def test_a_static_om_through_load_and_execute(fake, tmp_path):
    path = fake_acl.write_om(tmp_path / "decode.om", STATIC_INPUTS, "static", [()])
    with gr.load(path, backend="acl") as model:
        assert model.mode == "static" and model.gears == [()]
        ex = model.create_executor()
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        ids = np.ones((2, 2), np.int64)
        y, cat = ex.execute({"x": x, "ids": ids})
        np.testing.assert_array_equal(y, x * 2 + 1)
        with pytest.raises(gr.GearRuntimeError, match="axis 0 is 1 but the model fixes it to 2"):
            ex.execute({"x": np.zeros((1, 3, 4), np.float32), "ids": ids})


def test_a_dynamic_shape_om_without_gears_is_refused(fake, tmp_path):
    path = fake_acl.write_om(tmp_path / "dyn.om", [("x", [-1, 4], "float32")], "static", [()])
    with pytest.raises(GearFileError, match="dynamic-shape .om.*input_shape_range"):
        acl_backend.open_model(path)


def test_resident_state_stays_in_npu_memory(fake, tmp_path):
    """create_executor(state=) on acl: the state's two buffers live on the device, a step
    copies only its other inputs in (ONE merged copy) and its other outputs out; the state
    crosses PCIe only for set_state / ex.state / reset_state. The double's model makes
    y = 2x + 1, so with state {x: y} each step doubles-plus-one the resident x."""
    path = fake_acl.write_om(tmp_path / "decode.om", STATIC_INPUTS, "static", [()])
    with gr.load(path, backend="acl") as model:
        ex = model.create_executor(state={"x": "y"})
        assert ex.input_names == ["ids"] and ex.output_names == ["cat"]
        x0 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        ids = np.full((2, 2), 7, np.int64)
        ex.set_state("x", x0)
        want = x0
        for _ in range(3):
            before = len(fake.state.memcpys)
            (cat,) = ex.execute({"ids": ids})
            copies = fake.state.memcpys[before:]
            np.testing.assert_array_equal(cat, np.concatenate([want.ravel(), ids.ravel()]))
            kinds = [c.kind for c in copies]
            assert kinds.count(fake_acl.ACL_MEMCPY_HOST_TO_DEVICE) == 1  # ids, merged
            assert kinds.count(fake_acl.ACL_MEMCPY_DEVICE_TO_HOST) == 1  # cat, not y
            assert all(c.count != x0.nbytes for c in copies)  # the state never crossed
            want = want * 2 + 1
        np.testing.assert_array_equal(ex.state["x"], want)
        ex.reset_state()
        np.testing.assert_array_equal(ex.state["x"], np.zeros_like(x0))
        (cat,) = ex.execute({"ids": ids})
        np.testing.assert_array_equal(cat[:24], np.zeros(24, np.float32))


def test_a_failed_step_leaves_the_device_state_as_it_was(fake, tmp_path):
    path = fake_acl.write_om(tmp_path / "decode.om", STATIC_INPUTS, "static", [()])
    with gr.load(path, backend="acl") as model:
        ex = model.create_executor(state={"x": "y"})
        x0 = np.ones((2, 3, 4), np.float32)
        ex.set_state("x", x0)
        fake.state.fail["mdl.execute"] = 507011
        with pytest.raises(BackendError):
            ex.execute({"ids": np.zeros((2, 2), np.int64)})
        del fake.state.fail["mdl.execute"]
        np.testing.assert_array_equal(ex.state["x"], x0)  # not committed
        ex.execute({"ids": np.zeros((2, 2), np.int64)})
        np.testing.assert_array_equal(ex.state["x"], x0 * 2 + 1)


def test_large_outputs_kept_by_the_caller_land_in_recycled_memory(fake, tmp_path):
    """execute(copy=True) of a large output (>= 64 KiB) copies it from the device straight
    into memory the session's OutputPool recycles once the caller dropped the last array
    (one device-to-host memcpy, not one into the pinned buffer and another out of it): the
    same block serves the next call (no fresh pages to fault in), never while an array of
    it is alive."""
    path = fake_acl.write_om(tmp_path / "big.om", [("x", [-1, 8192], "float32")], "batch",
                             [(1,), (4,)])
    ex = gr.load(path, backend="acl").create_executor()
    x = np.random.default_rng(0).standard_normal((4, 8192)).astype(np.float32)
    before = len(fake.state.memcpys)
    y, cat = ex.execute({"x": x})
    np.testing.assert_array_equal(y, x * 2 + 1)
    d2h = [c for c in fake.state.memcpys[before:] if c.kind == fake_acl.ACL_MEMCPY_DEVICE_TO_HOST]
    assert sorted(c.dst for c in d2h) == sorted([y.ctypes.data, cat.ctypes.data])
    assert [c.pinned for c in d2h] == [False, False]
    kept, address = y, y.ctypes.data
    y2, _ = ex.execute({"x": x + 1})
    second = y2.ctypes.data
    assert second != address  # the first is still held: never written again
    np.testing.assert_array_equal(kept, x * 2 + 1)
    del kept, y, y2, cat
    y3, cat3 = ex.execute({"x": x})
    pool = ex.session._owned_pool  # counted: malloc may hand a freed address back too
    assert (pool.allocated, pool.reused) == (4, 2)  # y and cat of two calls held, then reused
    np.testing.assert_array_equal(y3, x * 2 + 1)


def test_an_output_given_as_a_numpy_buffer_is_copied_from_the_device_into_it(fake, tmp_path):
    """out= with a host array: the output's one device-to-host memcpy lands in the caller's
    array (pageable memory, as aclrtMemcpy allows), not in the pinned buffer and then again
    into the caller's; the other output goes to the pinned buffer as before."""
    path = fake_acl.write_om(tmp_path / "m.om", [("x", [-1, 16], "float32")], "batch",
                             [(1,), (4,)])
    ex = gr.load(path, backend="acl").create_executor()
    x = np.arange(64, dtype=np.float32).reshape(4, 16)
    mine = np.full((4, 16), -1, np.float32)
    before = len(fake.state.memcpys)
    y, cat = ex.execute({"x": x}, out={"y": mine})
    assert y is mine
    np.testing.assert_array_equal(mine, x * 2 + 1)
    np.testing.assert_array_equal(cat, x.ravel())
    d2h = [c for c in fake.state.memcpys[before:] if c.kind == fake_acl.ACL_MEMCPY_DEVICE_TO_HOST]
    assert [(c.dst == mine.ctypes.data, c.pinned) for c in d2h] == [(True, False),
                                                                     (False, True)]
