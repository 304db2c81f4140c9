"""Large inputs bound in place: on ONNX Runtime's CPU, an input of at least
``IN_PLACE_INPUT_BYTES`` that a plain request does not pad is read by ORT where the caller has
it (as ORT's own ``run`` reads numpy inputs) instead of being copied into staging.

The core-level rules run on the C++ core and on the oracle alike; the ORT-level tests check
that the staging slot of such an input is never written (a sentinel stays), that the answers
are right whichever way each request went, and that the bindings the core's direct runs use
keep reading staging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import native_pair as native
import numpy as np
import oracle
import pytest
from test_core import DIMS, build
from test_direct_run import feeds_for, runs_for

import gear_runtime as gr
from gear_runtime.backends.onnxruntime import IN_PLACE_INPUT_BYTES
from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec

IMPLS = [native, oracle]


# ---- the core ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_a_large_input_is_checked_but_not_copied(mod: Any) -> None:
    """x of gear (40, 2) is 160 bytes, mask 32: above 100 bytes only x stays where it is; the
    gear then has no direct run (it reads staging), so execute leaves it to the executor."""
    core, staging = build(mod, DIMS)
    runs = runs_for(core)
    core.in_place_bytes = 100
    feeds = feeds_for((40, 2))
    gear, placed = core.execute(feeds, None, False, False)
    assert gear == 1 and placed == {0: feeds["x"]} and placed[0] is feeds["x"]
    assert core.last_in_place == (0,) and runs[1][0].calls == 0
    x_at, mask_at = core.layout.offset(1, 0), core.layout.offset(1, 1)
    assert not staging[x_at:x_at + 160].any()  # x not copied
    np.testing.assert_array_equal(staging[mask_at:mask_at + 32].view(np.float32), 7)
    core.in_place_bytes = 0  # off: everything staged, the direct run made
    gear, outs = core.execute(feeds, None, False, False)
    assert gear == 1 and outs is not None and core.last_in_place == ()
    np.testing.assert_array_equal(staging[x_at:x_at + 160].view(np.float32), np.arange(40))


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_padded_strided_and_python_path_inputs_are_always_staged(mod: Any) -> None:
    core, staging = build(mod, DIMS)
    runs_for(core)
    core.in_place_bytes = 16
    # padded: x of 30 runs on gear (40, 2); mask [2, 4] is the gear's shape: in place
    feeds = {"x": np.arange(30, dtype=np.float32)[None], "mask": np.ones((2, 4), np.float32)}
    gear, placed = core.execute(feeds, None, True, False)
    assert gear == 1 and list(placed) == [1] and placed[1] is feeds["mask"]
    assert core.last_in_place == (1,)
    x_at = core.layout.offset(1, 0)
    np.testing.assert_array_equal(staging[x_at:x_at + 160].view(np.float32),
                                  np.r_[np.arange(30), np.zeros(10)])
    # one strided array: the request is copied into temporaries first, so nothing is in place
    strided = np.arange(80, dtype=np.float32).reshape(1, 80)[:, ::2]
    gear, outs = core.execute({**feeds_for((40, 2)), "x": strided}, None, False, False)
    assert gear == 1 and outs is not None and core.last_in_place == ()
    # stage(): the Python rules' path (converted arrays): never in place
    assert core.stage(list(feeds_for((40, 2)).values())) == 1 and core.last_in_place == ()


@pytest.mark.parametrize("mod", IMPLS, ids=["native", "oracle"])
def test_an_input_sharing_memory_with_written_buffers_is_copied(mod: Any) -> None:
    """set_written: memory the backend's runs write (its output buffers). An input that
    overlaps any of it, even by one byte, is copied into staging; one next to it is not."""
    core, staging = build(mod, DIMS)
    runs_for(core)
    core.in_place_bytes = 100
    outputs = np.zeros(400, np.float32)  # stands for the session's output buffer
    core.set_written([outputs])
    x_at = core.layout.offset(1, 0)
    for view in (outputs[:40], outputs[39:79], outputs[360:]):  # inside, at both ends
        view[:] = np.arange(40)
        feeds = {**feeds_for((40, 2)), "x": view.reshape(1, 40)}
        gear, outs = core.execute(feeds, None, False, False)
        assert gear == 1 and type(outs) is list and core.last_in_place == ()
        np.testing.assert_array_equal(staging[x_at:x_at + 160].view(np.float32), np.arange(40))
    beside = np.zeros(440, np.float32)[400:]  # another array: not written by the runs
    gear, placed = core.execute({**feeds_for((40, 2)), "x": beside.reshape(1, 40)}, None,
                                False, False)
    assert list(placed) == [0]
    core.set_written([])  # none: the output buffer itself may be bound in place again
    gear, placed = core.execute({**feeds_for((40, 2)), "x": outputs[:40].reshape(1, 40)},
                                None, False, False)
    assert list(placed) == [0]
    for bad in ((outputs,), [outputs[::2]], [[1, 2]]):
        with pytest.raises(InputError, match="written"):
            core.set_written(bad)


# ---- ONNX Runtime on the CPU ------------------------------------------------------------------
BIG = IN_PLACE_INPUT_BYTES // 4  # float32 elements of an input at the threshold


def _compile_sum(tmp: Path, nodes: list[Any], initializers: list[Any] | None = None) -> str:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "sum2",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "s"]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, "s"])],
        initializer=initializers or [])
    source = tmp / "sum2.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(source))
    spec = GearSpec.from_atc(input_shape="a:1,-1;b:1,-1", dynamic_dims=f"4,4;{BIG},{BIG}")
    return str(gr.compile(str(source), spec, str(tmp / "sum2.gear.onnx"), progress=False))


@pytest.fixture(scope="module")
def sum_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """y = a + b, z = -a over [1, s] float32, gears s = 4 and s = BIG (512 KiB per input and
    per output: the outputs are pooled with copy=True)."""
    from onnx import helper

    return _compile_sum(tmp_path_factory.mktemp("inplace"), [
        helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("Neg", ["a"], ["z"])])


def _sentinel(ex: Any, gear: int) -> tuple[slice, ...]:
    """Fill the staging slots of both inputs of ``gear`` with 0xAB bytes; their slices."""
    layout, staging = ex.session.layout, ex.session.staging
    slots = tuple(slice(layout.offset(gear, j), layout.offset(gear, j) + layout.nbytes(gear, j))
                  for j in range(2))
    for s in slots:
        staging[s] = 0xAB
    return slots


def _pair(seed: int, n: int = BIG) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, n)).astype(np.float32),
            rng.standard_normal((1, n)).astype(np.float32))


def test_large_inputs_are_read_where_the_caller_has_them(sum_file: str) -> None:
    with gr.load(sum_file) as model:
        ex = model.create_executor()
        assert ex.session.in_place_input_bytes == IN_PLACE_INPUT_BYTES
        slots = _sentinel(ex, 1)
        for seed, copy, form in ((0, True, dict), (1, False, dict), (2, True, list),
                                 (3, False, list), (4, True, dict)):
            a, b = _pair(seed)  # new arrays each time: new addresses to bind
            feeds = {"a": a, "b": b} if form is dict else [a, b]
            y, z = ex.execute(feeds, copy=copy)
            np.testing.assert_array_equal(y, a + b)
            np.testing.assert_array_equal(z, -a)
            assert ex.last_gear == 1
        staging = ex.session.staging
        assert all((staging[s] == 0xAB).all() for s in slots)  # neither input was copied
        kept, _ = ex.execute(dict(zip("ab", _pair(5), strict=True)))
        again, _ = ex.execute(dict(zip("ab", _pair(6), strict=True)))
        assert not np.shares_memory(kept, again)  # copy=True: pooled arrays the caller keeps


def test_staged_runs_after_in_place_ones_read_staging(sum_file: str) -> None:
    """The bindings of the core's direct runs and of pooled copy=True runs are never pointed
    at a caller's array: requests staged after in-place ones (strided, so copied) are right,
    and an in-place run after them rebinds to its own arrays."""
    with gr.load(sum_file) as model:
        ex = model.create_executor()
        for step in range(3):
            for copy in (True, False):
                a, b = _pair(10 * step + copy)
                wide = np.repeat(a, 2, axis=1)[:, ::2]  # equal to a, strided: staged
                assert not wide.flags.c_contiguous
                y, _ = ex.execute({"a": a, "b": b}, copy=copy)  # in place
                np.testing.assert_array_equal(y, a + b)
                b2 = b + 1
                y, z = ex.execute({"a": wide, "b": b2}, copy=copy)  # staged
                np.testing.assert_array_equal(y, a + b2)
                np.testing.assert_array_equal(z, -a)
                small = np.ones((1, 4), np.float32)
                y, _ = ex.execute([small, small], copy=copy)  # gear 0, its direct run
                np.testing.assert_array_equal(y, 2 * small)


def test_a_padded_large_input_is_staged(sum_file: str) -> None:
    with gr.load(sum_file) as model:
        ex = model.create_executor()
        slots = _sentinel(ex, 1)
        a, b = _pair(7, BIG - 8)
        y, z = ex.execute({"a": a, "b": b}, pad=True)
        np.testing.assert_array_equal(y, a + b)
        np.testing.assert_array_equal(z, -a)
        assert ex.last_dynamic_dims == (BIG, BIG) and ex.last_request_dims == (BIG - 8,) * 2
        assert not (ex.session.staging[slots[0]] == 0xAB).all()  # padded into its slot


def test_state_executors_stage_every_input(tmp_path: Path) -> None:
    from gear_runtime.examples import causal_lm

    decode = causal_lm.write_pair(tmp_path)[1]
    with gr.load(str(decode)) as model:
        assert model.create_executor()._core.in_place_bytes == IN_PLACE_INPUT_BYTES
        assert model.create_executor(state=causal_lm.STATE)._core.in_place_bytes == 0


def test_an_output_fed_back_as_an_input_is_copied_first(tmp_path: Path) -> None:
    """``z`` (``a`` reversed) of a copy=False run is a view of the executor's output buffer:
    fed back as ``a`` in place, ORT would reverse it onto itself (the second half reading
    what the first half already wrote). It is staged instead."""
    from onnx import helper, numpy_helper

    ints = {k: numpy_helper.from_array(np.array(v, np.int64), k)
            for k, v in (("st", [-1]), ("en", [-2**62]), ("ax", [1]), ("sp", [-1]))}
    path = _compile_sum(tmp_path, [helper.make_node("Slice", ["a", "st", "en", "ax", "sp"],
                                                    ["z"]),
                                   helper.make_node("Add", ["a", "b"], ["y"])],
                        list(ints.values()))
    with gr.load(path) as model:
        ex = model.create_executor()
        a, b = _pair(8)
        y, z = ex.execute({"a": a, "b": b}, copy=False)
        np.testing.assert_array_equal(z, a[:, ::-1])
        fed = z.copy()
        y2, z2 = ex.execute({"a": z, "b": b}, copy=False)  # z: the output buffer itself
        np.testing.assert_array_equal(z2, fed[:, ::-1])
        np.testing.assert_array_equal(y2, fed + b)


def test_the_arrays_bound_are_the_ones_the_core_checked(sum_file: str) -> None:
    """The core hands the executor the very arrays it checked, not the request read again:
    another thread replacing an input right after the core's check (here: the core's
    execute wrapped to do so) changes nothing this call runs on."""
    with gr.load(sum_file) as model:
        ex = model.create_executor()
        a, b = _pair(9)
        request = {"a": a, "b": b}
        seen = []
        core_execute, run = ex._execute_c, ex.session.run_gear_in_place

        def racing(inputs: Any, preset: Any, pad: bool, copy: bool) -> Any:
            done = core_execute(inputs, preset, pad, copy)
            inputs["a"] = np.zeros_like(a)  # replaced once the core has checked it
            return done

        def recording(gear: int, placed: dict[int, np.ndarray], copy: bool) -> Any:
            seen.append(dict(placed))
            return run(gear, placed, copy)

        ex._execute_c = racing
        ex.session.run_gear_in_place = recording  # type: ignore[method-assign]
        y, z = ex.execute(request)
        assert seen[0][0] is a and seen[0][1] is b
        np.testing.assert_array_equal(y, a + b)
        np.testing.assert_array_equal(z, -a)
