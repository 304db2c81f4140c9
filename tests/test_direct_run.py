"""The hot path as one C++ call: ``ExecutorCore.execute`` reads a plain request, stages it and
makes the session's direct run of the gear (``BackendSession.direct_runs``); everything else
goes through the Python rules first, with the same answers and the same errors.

The core-level tests run on the C++ core and on the test oracle (tests/oracle.py) alike.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from pathlib import Path
from typing import Any

import native_pair as native
import numpy as np
import oracle
import pytest
from test_core import DIMS, build

import gear_runtime as gr
from gear_runtime.errors import BackendError, DirectRunFailed, GearMismatchError, InputError
from gear_runtime.spec import GearSpec

IMPLS = [native, oracle]


def feeds_for(gear: tuple[int, ...] = (20, 1)) -> dict[str, np.ndarray]:
    """A request of DIMS (x: [1, seq], mask: [batch, 4]) at ``gear``."""
    seq, batch = gear
    return {"x": np.arange(seq, dtype=np.float32).reshape(1, seq),
            "mask": np.full((batch, 4), 7, np.float32)}


class Recorder:
    """A direct run: counts its calls and writes ``value`` into its outputs."""

    def __init__(self, outputs: list[np.ndarray], value: float = 1.0) -> None:
        self.outputs, self.value, self.calls = outputs, value, 0

    def __call__(self, *args: Any) -> None:
        self.calls += 1
        self.args = args
        for o in self.outputs:
            o[...] = self.value + self.calls


def runs_for(core: Any, copyable: bool = True) -> list[tuple[Recorder, tuple, list, bool]]:
    outs = [[np.zeros((2, 3), np.float32), np.zeros(4, np.int64)] for _ in range(2)]
    runs = [(Recorder(o), ("arg", g), o, copyable) for g, o in enumerate(outs)]
    core.set_runs(runs)
    return runs


# ---- the core --------------------------------------------------------------------------------
@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_a_plain_request_is_staged_and_run_in_one_call(mod: Any) -> None:
    core, staging = build(mod, DIMS)
    runs = runs_for(core)
    for form in (feeds_for((40, 2)), list(feeds_for((40, 2)).values()),
                 tuple(feeds_for((40, 2)).values())):
        gear, outs = core.execute(form, None, False, False)
        assert gear == 1
        assert all(o is b for o, b in zip(outs, runs[1][2], strict=True))  # the run's arrays
    assert runs[1][0].calls == 3 and runs[1][0].args == ("arg", 1) and runs[0][0].calls == 0
    off = core.layout.offset(1, 0)
    np.testing.assert_array_equal(staging[off:off + 160].view(np.float32), np.arange(40))


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_copy_hands_out_fresh_arrays_of_the_runs_outputs(mod: Any) -> None:
    core, _ = build(mod, DIMS)
    runs = runs_for(core)
    gear, first = core.execute(feeds_for(), None, False, True)
    _, second = core.execute(feeds_for(), None, False, True)
    buffers = runs[0][2]
    for a, b, buf in zip(first, second, buffers, strict=True):
        assert a.dtype == buf.dtype and a.shape == buf.shape and a.flags.c_contiguous
        assert not np.shares_memory(a, buf) and not np.shares_memory(a, b)
    assert (first[0] == 2).all() and (second[0] == 3).all() and (buffers[0] == 3).all()


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_no_direct_run_stages_and_leaves_the_run_to_the_executor(mod: Any) -> None:
    core, _ = build(mod, DIMS)
    assert core.execute(feeds_for(), None, False, False) == (0, None)  # no runs set
    runs = runs_for(core, copyable=False)
    assert core.execute(feeds_for(), None, False, True) == (0, None)  # not copyable
    assert runs[0][0].calls == 0
    assert core.execute(feeds_for(), None, False, False)[1] is not None
    core.set_runs([None, runs[1]])
    assert core.execute(feeds_for(), None, False, False) == (0, None)
    core.set_runs(None)
    assert core.execute(feeds_for((40, 2)), None, False, False) == (1, None)


class Sub(np.ndarray):
    pass


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
@pytest.mark.parametrize("case", ["nested list", "subclass", "mapping", "missing", "extra",
                                  "count", "string", "generator"])
def test_anything_but_a_plain_request_is_left_to_the_python_rules(mod: Any, case: str) -> None:
    core, staging = build(mod, DIMS)
    runs = runs_for(core)
    feeds = feeds_for()
    request = {
        "nested list": {**feeds, "x": feeds["x"].tolist()},
        "subclass": {**feeds, "x": feeds["x"].view(Sub)},
        "mapping": collections.OrderedDict(feeds),
        "missing": {"x": feeds["x"]},
        "extra": {**feeds, "y": feeds["x"]},
        "count": [feeds["x"]],
        "string": "xm",
        "generator": (a for a in feeds.values()),
    }[case]
    assert core.execute(request, None, False, True) is None
    assert runs[0][0].calls == 0 and not staging.any()  # nothing staged, nothing run


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_strided_and_wrong_dtype_arrays_get_the_stage_rules(mod: Any) -> None:
    core, staging = build(mod, DIMS)
    runs_for(core)
    feeds = feeds_for()
    strided = np.arange(40, dtype=np.float32).reshape(1, 40)[:, ::2]
    assert not strided.flags.c_contiguous
    gear, _ = core.execute({**feeds, "x": strided}, None, False, False)
    off = core.layout.offset(gear, 0)
    np.testing.assert_array_equal(staging[off:off + 80].view(np.float32), strided.ravel())
    with pytest.raises(InputError, match="dtype"):
        core.execute({**feeds, "mask": feeds["mask"].astype(np.int32)}, None, False, False)


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_preset_and_pad_reach_the_stage(mod: Any) -> None:
    core, _ = build(mod, DIMS)
    runs_for(core)
    assert core.execute(feeds_for(), (20, 1), False, False)[0] == 0
    with pytest.raises(gr.DynamicInputLengthError, match="disagree with the dims set"):
        core.execute(feeds_for(), (40, 2), False, False)
    assert core.execute(feeds_for(), (40, 2), True, False)[0] == 1  # padded to the preset
    assert core.last_request == (20, 1)
    with pytest.raises(GearMismatchError):
        core.execute(feeds_for((30, 1)), None, False, False)
    assert core.execute(feeds_for((30, 1)), None, True, False)[0] == 1


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_a_failing_run_raises_its_own_error_and_names_the_gear(mod: Any) -> None:
    core, _ = build(mod, DIMS)

    def boom(*_: Any) -> None:
        raise RuntimeError("device lost")

    core.set_runs([(boom, (), [], True)] * 2)
    with pytest.raises(DirectRunFailed) as info:
        core.execute(feeds_for((40, 2)), None, False, False)
    assert info.value.gear == 1
    assert type(info.value.__cause__) is RuntimeError
    assert str(info.value.__cause__) == "device lost"

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    core.set_runs([(interrupt, (), [], True)] * 2)
    with pytest.raises(KeyboardInterrupt):  # not an error of the run: as raised
        core.execute(feeds_for(), None, False, False)


def test_a_run_that_replaces_the_runs_is_refused() -> None:
    """A run calling back into its core's set_runs (a buggy backend) would free the entry
    being run: refused, as the run's error; the table stays."""
    core, _ = build(native, DIMS)
    outputs = [np.zeros(2, np.float32)]

    def meddle(*_: Any) -> None:
        core.set_runs(None)

    core.set_runs([(meddle, (), outputs, True)] * 2)
    with pytest.raises(DirectRunFailed) as info:
        core.execute(feeds_for(), None, False, False)
    assert "from inside a direct run" in str(info.value.__cause__)
    core.set_runs([(lambda: None, (), outputs, True)] * 2)  # after the run: allowed again
    assert core.execute(feeds_for(), None, False, False)[1][0] is outputs[0]


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
@pytest.mark.parametrize("runs", [
    [None], "no list", (None, None), [("not callable", (), [], True)] * 2,
    [(print, (), [], True, "fifth")] * 2, [(print, [], [], True)] * 2,
    [(print, (), (), True)] * 2, [(print, (), [], 1)] * 2,
    [(print, (), [np.zeros((2, 2))[:, :1]], True)] * 2, [(print, (), [[1.0]], True)] * 2],
    ids=["count", "str", "tuple", "not callable", "five", "args list", "outputs tuple",
         "copyable int", "strided output", "list output"])
def test_bad_runs_are_refused(mod: Any, runs: Any) -> None:
    core, _ = build(mod, DIMS)
    with pytest.raises(InputError, match="direct run|runs must be"):
        core.set_runs(runs)


def test_a_key_whose_comparison_raises_propagates() -> None:
    """A dict key with the hash of an input name and an ``__eq__`` that raises: the lookup's
    exception comes out of execute as raised (no crash, nothing staged)."""
    core, staging = build(native, DIMS)

    class Evil(str):
        def __hash__(self) -> int:
            return hash("x")

        def __eq__(self, other: object) -> bool:
            raise ValueError("no comparing")

    feeds = feeds_for()
    with pytest.raises(ValueError, match="no comparing"):
        core.execute({Evil("q"): feeds["x"], "mask": feeds["mask"]}, None, False, False)
    assert not staging.any()


# ---- through the executor on ONNX Runtime ----------------------------------------------------
def sum_file(tmp_path: Path) -> str:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("Neg", ["a"], ["z"])],
        "sum2", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "s"]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, "s"])])
    source = tmp_path / "sum2.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(source))
    spec = GearSpec.from_atc(input_shape="a:1,-1;b:1,-1", dynamic_dims="4,4;8,8")
    return gr.compile(str(source), spec, str(tmp_path / "sum2.gear.onnx"), progress=False)


@pytest.fixture
def ort_executor(tmp_path: Path):
    with gr.load(sum_file(tmp_path)) as model:
        yield model.create_executor()


def forbid_session_runs(ex: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> None:
        raise AssertionError("the gear ran through the session's Python methods")
    monkeypatch.setattr(ex.session, "run_gear", refuse)
    monkeypatch.setattr(ex.session, "run_gear_owned", refuse)


def test_onnx_runtime_plain_requests_never_reach_the_sessions_methods(
        ort_executor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = ort_executor
    forbid_session_runs(ex, monkeypatch)
    a, b = np.arange(8, dtype=np.float32)[None], np.ones((1, 8), np.float32)
    for copy in (False, True):
        y, z = ex.execute({"a": a, "b": b}, copy=copy)
        np.testing.assert_array_equal(y, a + b)
        np.testing.assert_array_equal(z, -a)
        assert ex.last_gear == 1 and ex.last_dynamic_dims == (8, 8)
    kept, _ = ex.execute([a, b])
    view, _ = ex.execute([a, b], copy=False)
    assert not np.shares_memory(kept, view)  # copy=True: the caller's own array
    assert np.shares_memory(view, ex.session._outputs[1][0])  # copy=False: the buffer


def test_onnx_runtime_other_requests_still_run_right(ort_executor: Any) -> None:
    ex = ort_executor
    a = np.arange(4, dtype=np.float32)[None]
    y, _ = ex.execute({"a": a.tolist(), "b": a.view(Sub)})  # converted, then staged
    np.testing.assert_array_equal(y, 2 * a)
    y, _ = ex.execute(collections.OrderedDict(a=a, b=a), copy=False)
    np.testing.assert_array_equal(y, 2 * a)
    with pytest.raises(InputError, match="missing: b"):
        ex.execute({"a": a})
    with pytest.raises(InputError, match="unknown: c"):
        ex.execute({"a": a, "b": a, "c": a})


def test_a_failing_direct_run_is_the_backends_error(ort_executor: Any) -> None:
    ex = ort_executor
    a = np.ones((1, 4), np.float32)
    ex.execute([a, a])
    assert ex.last_gear == 0

    def boom(*_: Any) -> None:
        raise RuntimeError("kernel failed")

    ex._core.set_runs([(boom, (), [], True)] * 2)
    with pytest.raises(BackendError, match=r"onnxruntime run of gear 0 \(4, 4\) failed: "
                                           "kernel failed"):
        ex.execute([a, a])
    assert ex.last_gear is None


# ---- the GIL ---------------------------------------------------------------------------------
def test_a_large_stage_releases_the_gil_during_the_copy() -> None:
    """Another thread counts while this one stages 64 MiB: the count moves DURING each stage,
    as the copy lets go of the GIL (other threads run meanwhile).

    The counter gives the GIL back after every step (``sleep(0)``) and the switch interval is
    long, so this thread is never made to hand the GIL over between its own statements: the
    count can move only while this thread is inside a call that releases it. (A copy below
    256 KiB keeps the GIL, as a release and re-take costs more than it: that is a speed
    choice, timed in benchmarks/bench_core.py; a released GIL is not seen by a thread that
    takes longer to wake than such a copy lasts.)"""
    row = 16 << 20
    spec = GearSpec.from_atc(input_shape=f"x:-1,{row // 16}", dynamic_batch_size="1,16")
    core, _ = build(native, spec)
    data = np.ones((16, row // 16), np.float32)
    done, ticks = threading.Event(), [0]

    def count() -> None:
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0)  # hands the GIL back at once

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    thread = threading.Thread(target=count)
    moved = 0
    try:
        thread.start()
        for _ in range(20):
            before = ticks[0]
            core.stage([data])
            moved += ticks[0] != before
    finally:
        done.set()
        sys.setswitchinterval(interval)
        thread.join()
    assert moved >= 15, f"the count moved during {moved} of 20 stages"


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_more_inputs_than_the_stack_holds(mod: Any) -> None:
    """20 inputs (the binding keeps up to 16 on the stack, more on the heap): all staged."""
    names = [f"in{i}" for i in range(20)]
    spec = GearSpec.from_atc(input_shape=";".join(f"{n}:-1,2" for n in names),
                             dynamic_batch_size="1,3")
    core, staging = build(mod, spec)
    feeds = {n: np.full((3, 2), i, np.float32) for i, n in enumerate(names)}
    assert core.execute(feeds, None, False, False) == (1, None)
    for i in range(20):
        off = core.layout.offset(1, i)
        np.testing.assert_array_equal(staging[off:off + 24].view(np.float32), np.full(6, i))
