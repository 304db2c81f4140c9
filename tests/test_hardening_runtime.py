"""Issue 48's runtime findings, each pinned: out= arrays that alias what a run reads or writes
are refused; ex.state hands out views; an executor's (and a CLI run's synthetic inputs')
total memory is capped before anything is allocated; static models get compile's graph and
dtype checks at load; check-padding's exit codes; a kernel refusing a client's data is an
InputError on the state / out= path as on the plain one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import gear_runtime as gr
from gear_runtime.errors import (
    DataRefusedError,
    GearFileError,
    GearRuntimeError,
    InputError,
    MemoryBudgetError,
)
from tests.cli_support import assert_one_line_error, run_cli

OPSET = 17


def _save(tmp_path: Path, graph: onnx.GraphProto, name: str = "m.onnx",
          check: bool = True) -> str:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    path = tmp_path / name
    onnx.save(model, path)
    return str(path)


def _f32(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


@pytest.fixture()
def state_path(tmp_path: Path) -> str:
    """Static: present = past + x, y = past * 10, z = past + 1 (every value a [2] float)."""
    ten = helper.make_tensor("ten", TensorProto.FLOAT, [], [10.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["past", "x"], ["present"]),
         helper.make_node("Mul", ["past", "ten"], ["y"]),
         helper.make_node("Add", ["past", "one"], ["z"])],
        "state", [_f32("x", [2]), _f32("past", [2])],
        [_f32("y", [2]), _f32("z", [2]), _f32("present", [2])], [ten, one])
    return _save(tmp_path, graph)


def _state_ex(path: str):
    ex = gr.load(path).create_executor(state={"past": "present"})
    ex.set_state("past", np.array([1.0, 1.0], np.float32))
    return ex


X = {"x": np.array([10.0, 10.0], np.float32)}


# ---- 1. out= aliasing ------------------------------------------------------------------------
def test_out_into_the_executors_own_state_is_refused(state_path: str) -> None:
    ex = _state_ex(state_path)
    with pytest.raises(InputError, match=r"out\['y'\].*state 'past'"):
        ex.execute(X, out={"y": ex.state["past"]})
    np.testing.assert_array_equal(ex.state["past"], [1.0, 1.0])  # nothing ran


def test_out_into_a_kept_state_reference_that_became_the_written_buffer_is_refused(
        state_path: str) -> None:
    ex = _state_ex(state_path)
    kept = ex.state["past"]
    ex.execute(X)  # now ``kept`` is the buffer the next run writes
    with pytest.raises(InputError, match=r"out\['y'\].*state 'past'"):
        ex.execute(X, out={"y": kept})


def test_one_array_for_two_outputs_is_refused(state_path: str) -> None:
    ex = _state_ex(state_path)
    buf = np.zeros(2, np.float32)
    with pytest.raises(InputError, match=r"out\['z'\].*out\['y'\]"):
        ex.execute(X, out={"y": buf, "z": buf})


def test_overlapping_views_of_one_array_are_refused(state_path: str) -> None:
    ex = _state_ex(state_path)
    buf = np.zeros(3, np.float32)
    with pytest.raises(InputError, match=r"out\['z'\].*out\['y'\]"):
        ex.execute(X, out={"y": buf[:2], "z": buf[1:]})
    # disjoint views of one array are fine
    buf = np.zeros(4, np.float32)
    y, z = ex.execute(X, out={"y": buf[:2], "z": buf[2:]})
    np.testing.assert_array_equal(buf, [10, 10, 2, 2])


def test_a_copy_false_output_of_the_same_executor_is_refused(state_path: str) -> None:
    ex = _state_ex(state_path)
    _, z = ex.execute(X, copy=False)
    with pytest.raises(InputError, match=r"out\['y'\].*this executor's output"):
        ex.execute(X, out={"y": z})


def test_out_sharing_memory_with_an_input_of_the_run_is_refused(state_path: str) -> None:
    ex = _state_ex(state_path)
    x = np.array([10.0, 10.0], np.float32)
    with pytest.raises(InputError, match=r"out\['y'\].*input 'x'"):
        ex.execute({"x": x}, out={"y": x})


def test_out_aliasing_on_a_stateless_executor_is_refused(state_path: str) -> None:
    ex = gr.load(state_path).create_executor()
    buf = np.zeros(2, np.float32)
    feeds = {**X, "past": np.ones(2, np.float32)}
    with pytest.raises(InputError, match=r"out\['z'\].*out\['y'\]"):
        ex.execute(feeds, out={"y": buf, "z": buf})
    with pytest.raises(InputError, match=r"out\['y'\].*input 'past'"):
        ex.execute(feeds, out={"y": feeds["past"]})


def test_out_into_another_executors_state_still_hands_over(state_path: str) -> None:
    model = gr.load(state_path)
    pex, dex = model.create_executor(), model.create_executor(state={"past": "present"})
    pex.execute({**X, "past": np.ones(2, np.float32)}, out={"present": dex.state["past"]})
    np.testing.assert_array_equal(dex.state["past"], [11.0, 11.0])
    y, _ = dex.execute(X)
    np.testing.assert_array_equal(y, [110.0, 110.0])


# ---- 2. ex.state hands out views ----------------------------------------------------------
def test_a_state_made_read_only_by_the_caller_does_not_break_the_executor(
        state_path: str) -> None:
    ex = _state_ex(state_path)
    a = ex.state["past"]
    a.flags.writeable = False
    ex.set_state("past", np.array([3.0, 3.0], np.float32))
    np.testing.assert_array_equal(ex.state["past"], [3.0, 3.0])
    ex.reset_state()
    np.testing.assert_array_equal(ex.state["past"], [0.0, 0.0])
    y, _ = ex.execute(X)
    np.testing.assert_array_equal(y, [0.0, 0.0])
    view = ex.state["past"]
    assert view.flags.writeable and view.flags.c_contiguous  # still an out= target
    view[:] = 5.0  # zero-copy: writing it writes the state
    np.testing.assert_array_equal(ex.execute(X)[0], [50.0, 50.0])


# ---- 3. a total memory budget -------------------------------------------------------------
def _big_static(tmp_path: Path, rows: int) -> str:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "big",
                              [_f32("x", [rows, 1])], [_f32("y", [rows, 1])])
    return _save(tmp_path, graph, "big.onnx")


def test_an_executor_over_the_memory_budget_is_refused_before_allocating(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2**31 x 1 float32: 8 GiB of staging and 8 GiB of output, each under the 16 GiB
    # per-buffer cap; refused before a byte is allocated
    model = gr.load(_big_static(tmp_path, 2**31))
    with pytest.raises(GearRuntimeError,
                       match=r"17179869184 bytes.*max_bytes=N.*GEAR_RUNTIME_MAX_BYTES"):
        model.create_executor(max_bytes=2**30)
    monkeypatch.setenv("GEAR_RUNTIME_MAX_BYTES", str(2**30))
    with pytest.raises(MemoryBudgetError, match=r"budget of 1073741824 bytes"):
        model.create_executor()
    small = gr.load(_big_static(tmp_path, 4))
    monkeypatch.setenv("GEAR_RUNTIME_MAX_BYTES", "32")  # 16 staging + 16 output: fits
    small.create_executor()
    with pytest.raises(GearRuntimeError, match="max_bytes"):
        small.create_executor(max_bytes=31)
    with pytest.raises(InputError, match="max_bytes"):
        small.create_executor(max_bytes=0)
    monkeypatch.setenv("GEAR_RUNTIME_MAX_BYTES", "lots")
    with pytest.raises(InputError, match="GEAR_RUNTIME_MAX_BYTES"):
        small.create_executor()


def test_state_buffers_count_in_the_budget(state_path: str) -> None:
    model = gr.load(state_path)
    # staging 8 (x), outputs y, z 8 each, state 2 x 8: 40 bytes (the state output: none)
    model.create_executor(state={"past": "present"}, max_bytes=40)
    with pytest.raises(GearRuntimeError, match="max_bytes"):
        model.create_executor(state={"past": "present"}, max_bytes=39)


def test_cli_run_refuses_an_executor_over_the_budget(tmp_path: Path, capsys) -> None:
    path = _big_static(tmp_path, 2**31)
    code, _, err = run_cli(capsys, "run", path, "--max-memory", str(2**30))
    assert code == 2
    assert_one_line_error(err, "17179869184 bytes", "--max-memory", "GEAR_RUNTIME_MAX_BYTES")


@pytest.mark.parametrize("command", ["run", "bench"])
def test_cli_refuses_synthetic_inputs_over_the_budget(tmp_path: Path, capsys,
                                                      command: str) -> None:
    # 2**20 x 1 float32: the executor's 8 MiB fit in 9 MiB; with the 4 MiB input (drawn in
    # float64: 8 MiB more) the run needs 20 MiB
    path = _big_static(tmp_path, 2**20)
    code, _, err = run_cli(capsys, command, path, "--max-memory", str(9 * 2**20))
    assert code == 2
    assert_one_line_error(err, "synthetic inputs x[1048576, 1]", "20971520 bytes",
                          "--max-memory")
    code, _, err = run_cli(capsys, command, path, "--max-memory", str(21 * 2**20),
                           *(["--iterations", "2", "--warmup", "1"] if command == "bench"
                             else ["--output-dir", tmp_path / "out"]))
    assert code == 0, err


# ---- 4. / 5. static models get compile's checks ----------------------------------------------
def test_a_static_model_listing_an_output_twice_is_refused_at_load(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dup",
                              [_f32("x", [2])], [_f32("y", [2]), _f32("y", [2])])
    path = _save(tmp_path, graph, check=False)
    with pytest.raises(GearFileError, match=r"'y'.*more than once"):
        gr.load(path)


@pytest.mark.parametrize(("elem", "dtype_name"), [(TensorProto.BFLOAT16, "bfloat16"),
                                                  (TensorProto.STRING, "string")])
@pytest.mark.parametrize("where", ["input", "output"])
def test_a_static_model_of_a_dtype_the_runtime_cannot_run_is_refused_at_load(
        tmp_path: Path, elem: int, dtype_name: str, where: str) -> None:
    if where == "input":
        nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)]
        ins, outs = [helper.make_tensor_value_info("x", elem, [2])], [_f32("y", [2])]
    else:
        nodes = [helper.make_node("Cast", ["x"], ["y"], to=elem)]
        ins, outs = [_f32("x", [2])], [helper.make_tensor_value_info("y", elem, [2])]
    path = _save(tmp_path, helper.make_graph(nodes, "odd", ins, outs))
    with pytest.raises(GearFileError, match=rf"{where} '[xy]'.*{dtype_name}.*supported"):
        gr.load(path)


# ---- 6. check-padding's exit codes ------------------------------------------------------------
def test_check_padding_of_a_static_model_is_could_not_check(tmp_path: Path, capsys) -> None:
    path = _big_static(tmp_path, 4)
    code, _, err = run_cli(capsys, "check-padding", path, path, "--no-progress")
    assert code == 2
    assert_one_line_error(err, "static")


def test_check_padding_internal_error_is_not_unsafe(tmp_path: Path, capsys,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from gear_runtime.tools.check import padding

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(padding, "check_padding", broken)
    path = _big_static(tmp_path, 4)
    code, _, err = run_cli(capsys, "check-padding", path, path)
    assert code == 2
    assert_one_line_error(err, "boom")


# ---- 7. a kernel refusing the data is an InputError on every path --------------------------
@pytest.fixture()
def gather_path(tmp_path: Path) -> str:
    """Static: y = Gather(table[4, 2], ids), present = past + 1 (a token embedding)."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [4, 2], [0.0] * 8)
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"]),
         helper.make_node("Add", ["past", "one"], ["present"])],
        "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1]),
                   _f32("past", [2])],
        [_f32("y", [1, 2]), _f32("present", [2])], [table, one])
    return _save(tmp_path, graph)


def test_a_bad_token_id_is_an_input_error_on_a_stateful_executor(gather_path: str) -> None:
    model = gr.load(gather_path)
    bad = {"ids": np.array([99], np.int64)}
    with pytest.raises(DataRefusedError):  # the stateless rule, for reference
        model.create_executor().execute({**bad, "past": np.zeros(2, np.float32)})
    ex = model.create_executor(state={"past": "present"})
    with pytest.raises(DataRefusedError, match="refused the request's data"):
        ex.execute(bad)
    np.testing.assert_array_equal(ex.state["past"], [0.0, 0.0])  # the state kept
    ex.execute({"ids": np.array([1], np.int64)})
    np.testing.assert_array_equal(ex.state["past"], [1.0, 1.0])
    with pytest.raises(DataRefusedError):  # out= too
        ex.execute(bad, out={"y": np.zeros((1, 2), np.float32)})
