"""Round 3's F4: one request that fails in the run (a token id past an embedding table) must
not fail the good requests batched with it: a failed batch runs request by request."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.errors import BackendError, ClosedError
from gear_runtime.runtime.dispatch import GearDispatcher
from gear_runtime.serving.batcher import Batcher, BatchPlan

GEARS = (1, 2, 4, 8)


def plan() -> BatchPlan:
    spec = gr.GearSpec.from_atc("x:-1,3", dynamic_batch_size=",".join(map(str, GEARS)))
    made, why = BatchPlan.for_model(GearDispatcher(spec), [((b, 3),) for b in GEARS])
    assert why == ""
    return made


def run_with(error: type[Exception]):
    """A run that fails any batch holding a row of -1 (what a kernel refuses)."""
    runs: list[int] = []

    async def run(requests):
        rows = np.concatenate([r[0] for r in requests])
        runs.append(len(requests))
        await asyncio.sleep(0)
        if (rows < 0).any():
            raise error("indices element out of data bounds")
        return None, [[r[0] * 2] for r in requests]

    return run, runs


@pytest.mark.parametrize("error", [BackendError, RuntimeError])
def test_only_the_bad_request_of_a_batch_fails(error) -> None:
    run, runs = run_with(error)
    batcher = Batcher(plan(), run, max_delay_s=0.05, slots=1, on_batch=lambda r, n: None,
                      wait_when_idle=True)

    async def main():
        good = [np.full((1, 3), i, np.float32) for i in range(6)]
        bad = np.full((1, 3), -1, np.float32)
        results = await asyncio.gather(*(batcher.submit([a]) for a in [*good[:3], bad, *good[3:]]),
                                       return_exceptions=True)
        await batcher.close()
        return good, results

    good, results = asyncio.run(main())
    assert isinstance(results[3], error)
    for arr, res in zip(good, [*results[:3], *results[4:]], strict=True):
        np.testing.assert_array_equal(res[1][0], arr * 2)
    assert runs[0] == 7 and runs[1:] == [1] * 7  # the batch, then each request alone


def test_a_closing_server_fails_the_batch_at_once() -> None:
    run, runs = run_with(ClosedError)
    batcher = Batcher(plan(), run, max_delay_s=0.05, slots=1, on_batch=lambda r, n: None,
                      wait_when_idle=True)

    async def main():
        arrays = [np.full((1, 3), -1, np.float32) for _ in range(3)]
        results = await asyncio.gather(*(batcher.submit([a]) for a in arrays),
                                       return_exceptions=True)
        await batcher.close()
        return results

    assert all(isinstance(r, ClosedError) for r in asyncio.run(main()))
    assert runs == [3]


def test_data_a_kernel_refuses_is_a_400_naming_it_not_a_500(tmp_path) -> None:
    """A token id past an embedding table, through the server: ORT's INVALID_ARGUMENT at run
    time is the request's fault (its shape and dtype were checked), so the answer is 400
    with ORT's reason, the good request batched beside it 200."""
    import json
    import sys
    from pathlib import Path

    import onnx
    from onnx import TensorProto, helper

    sys.path.insert(0, str(Path(__file__).parent))
    from serving_support import live, request

    from gear_runtime.errors import DataRefusedError, InputError
    from gear_runtime.serving import ServeOptions, build_server

    table = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "t")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["t", "ids"], ["y"])], "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 3])],
        initializer=[table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = str(tmp_path / "embed.gear.onnx")
    gr.compile(model, gr.GearSpec.from_atc("ids:-1,2", dynamic_batch_size="1,2"), path,
               progress=False)
    ex = gr.load(path).create_executor()
    with pytest.raises(DataRefusedError, match="refused the request's data.*out of data bounds"):
        ex.execute({"ids": np.array([[1, 99]], np.int64)})
    assert issubclass(DataRefusedError, InputError) and issubclass(DataRefusedError,
                                                                  BackendError)
    server = build_server([path], options=ServeOptions(executors=1, batching=False))
    with live(server) as running:
        def infer(ids):
            body = {"inputs": [{"name": "ids", "shape": [1, 2], "datatype": "INT64",
                                "data": ids}]}
            return request(running.port, "POST", "/v2/models/embed/infer",
                           json.dumps(body).encode(), {"Content-Type": "application/json"})
        status, _, answer = infer([1, 99])
        assert status == 400 and b"out of data bounds" in answer
        assert infer([1, 2])[0] == 200
