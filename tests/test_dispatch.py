"""THE gear dispatcher (gear_runtime/runtime/dispatch.py): one answer to "which gear".

Every executor's C++ core shares its one table (so it agrees on every lookup), its
costs are the model's (elements, or an attached profile), its batch table is what the
server's batcher batches to, and each of those fails a test here when it goes wrong: a batch
table that picks the largest gear, one that ignores the profile, an executor that does not
take the dispatcher's costs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.backends import null
from gear_runtime.runtime.dispatch import GearDispatcher
from gear_runtime.runtime.model import GearModel

BATCH = dict(input_shape="data:-1,3", dynamic_batch_size="1,2,4,8")
DIMS = dict(input_shape="x:1,-1;m:-1,-1", dynamic_dims="20,1,1;40,2,2;80,4,4")


def spec_of(kind: dict) -> gr.GearSpec:
    return gr.GearSpec.from_atc(**kind)


def null_model(spec: gr.GearSpec) -> GearModel:
    return GearModel(null.open_model(None, spec=spec))


# ---- which gear -------------------------------------------------------------------------------
def test_costs_are_input_elements_of_every_gear_and_any_request() -> None:
    spec = spec_of(DIMS)
    d = GearDispatcher(spec)
    want = [float(sum(math.prod(s) for s in spec.shapes(g).values()))
            for g in range(spec.gear_count)]
    assert d.costs == tuple(want) and d.cost_source == "elements"
    assert d.elements((30, 3, 2)) == 30 + 3 * 2  # a request, not a gear: the planner's view
    with pytest.raises(gr.DynamicInputLengthError):
        d.elements((30, 3))


def test_every_executor_shares_the_models_one_table() -> None:
    """One C++ table per model: every executor's core holds the dispatcher's own instance
    (not a copy, not a rebuild), a profile makes a new one that only later executors take,
    and an executor's padded runs pick exactly the dispatcher's cover over a grid of
    requests (with element costs and with a profile)."""
    spec = spec_of(DIMS)
    model = null_model(spec)
    for profile in (None, [5.0, 1.0, 3.0]):
        model.attach_profile(profile)
        d = model.dispatcher
        executors = [model.create_executor(), model.create_executor()]
        assert all(ex._core.dispatch is d.table for ex in executors)
        ex = executors[0]
        for request in itertools.product(range(1, 90, 7), range(1, 6), range(1, 6)):
            s, r, c = request
            arrays = {"x": np.zeros((1, s), np.float32), "m": np.zeros((r, c), np.float32)}
            try:
                want = d.cover(request)
            except gr.GearMismatchError:
                with pytest.raises(gr.GearMismatchError):
                    ex.execute(arrays, pad=True)
                continue
            ex.execute(arrays, pad=True)
            assert ex.last_gear == want, (request, profile)
        rows = np.array(list(itertools.product(range(0, 90, 7), range(6), range(6))))
        many = d.cover_many(rows)
        for r, g in zip(rows.tolist(), many.tolist(), strict=True):
            assert g == (d.cover(r) if g >= 0 else -1)
    first = model.dispatcher.table
    model.attach_profile(None)
    assert model.dispatcher.table is not first
    assert executors[0]._core.dispatch is first  # made before: keeps the table it was made with


def test_a_state_executor_shares_the_table_over_its_staged_inputs() -> None:
    """The table over a subset of inputs is built once per subset and shared as well."""
    d = GearDispatcher(spec_of(dict(input_shape="x:1,-1;s:4", dynamic_dims="2;8")), [3.0, 1.0])
    over = d.over([0])
    assert d.over([0]) is over and d.over([0, 1]) is d.table
    assert over.costs == d.costs == (3.0, 1.0)  # the dispatcher's costs, not recomputed
    assert over.cover([1]) == 1  # gear 8 measured cheaper than gear 2, which covers 1 too
    with pytest.raises(gr.GearSpecError, match="differ only in the values of the inputs left"):
        d.over([1])  # the dynamic axis is x's: without x, nothing tells the gears apart


def test_a_profile_changes_the_cover_and_only_later_executors_take_it() -> None:
    spec = spec_of(DIMS)
    model = null_model(spec)
    before = model.create_executor(pad_values={"x": 0.0})
    assert model.dispatcher.cover((30, 2, 2)) == 1  # by elements: the smallest covering
    first = model.dispatcher
    model.attach_profile([1.0, 9.0, 2.0])  # gear (40,2,2) measured slower than (80,4,4)
    assert model.dispatcher is not first and model.dispatcher.cost_source == "profile"
    assert model.dispatcher.cover((30, 2, 2)) == 2
    after = model.create_executor()
    request = {"x": np.zeros((1, 30), np.float32), "m": np.zeros((2, 2), np.float32)}
    after.execute(request, pad=True)
    before.execute(request, pad=True)
    assert (before.last_gear, after.last_gear) == (1, 2)
    assert model.gear_costs() == [1.0, 9.0, 2.0]


def test_gear_of_asks_the_dispatcher() -> None:
    model = null_model(spec_of(DIMS))
    assert model.gear_of((40, 2, 2)) == 1
    with pytest.raises(gr.GearMismatchError, match=r"legal gears, nearest first: \(40, 2, 2\)"):
        model.gear_of((40, 2, 3))
    with pytest.raises(gr.InputError, match="integers"):
        model.gear_of((40.5, 2, 2))


def test_extract_is_the_cores_getcurdynamicdims() -> None:
    d = GearDispatcher(spec_of(BATCH))
    assert d.extract([np.zeros((5, 3), np.float32)]) == (5,)
    with pytest.raises(gr.DynamicInputLengthError):
        d.extract([np.zeros((5, 4), np.float32)])
    with pytest.raises(gr.InputError, match="must be a numpy.ndarray"):
        d.extract([[[0.0] * 3]])


def test_bad_configuration_is_refused_up_front() -> None:
    with pytest.raises(gr.InputError, match="2 gear costs for 4 gears"):
        GearDispatcher(spec_of(BATCH), [1.0, 2.0])
    with pytest.raises(gr.InputError, match="finite"):
        GearDispatcher(spec_of(BATCH), [1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(gr.InputError, match="integers"):
        GearDispatcher(spec_of(BATCH)).cover_many(np.zeros((2, 1)))


# ---- the batch table --------------------------------------------------------------------------
def test_the_batch_table_holds_the_rows_on_the_smallest_gear() -> None:
    """Rows 1..8 on gears 1, 2, 4, 8: each on the smallest gear holding it. A table that picks
    the largest gear (or any other) fails here."""
    d = GearDispatcher(spec_of(BATCH))
    assert d.batch_sizes == (1, 2, 4, 8) and d.max_batch_rows == 8
    assert d.batch_table() == (0, 0, 1, 2, 2, 3, 3, 3, 3)
    assert [d.batch_gear(r) for r in range(1, 9)] == [0, 1, 2, 2, 3, 3, 3, 3]
    for rows in (0, 9):
        with pytest.raises(gr.GearMismatchError):
            d.batch_gear(rows)
    with pytest.raises(gr.InputError, match="batch-mode"):
        GearDispatcher(spec_of(DIMS)).batch_gear(1)


def test_the_batch_table_follows_the_profile() -> None:
    """Gear 8 measured faster than gear 4: 3 and 4 rows... 4 is exact (itself), 3 goes to 8."""
    d = GearDispatcher(spec_of(BATCH), [1.0, 2.0, 5.0, 3.0])
    assert d.batch_table() == (0, 0, 1, 3, 2, 3, 3, 3, 3)


def test_a_gear_of_two_billion_rows_needs_no_table_of_its_size() -> None:
    spec = gr.GearSpec.from_atc(input_shape="data:-1", dynamic_batch_size="1,2147483647")
    d = GearDispatcher(spec)
    assert d.batch_gear(2) == 1 and d.batch_gear(1) == 0


def test_the_server_batches_to_the_dispatchers_table(monkeypatch) -> None:
    """The served model's batch plan is its model's dispatcher: with a profile attached
    before serving, 3 rows run on the gear the profile says is cheapest."""
    pytest.importorskip("orjson")
    from gear_runtime.serving.metrics import Metrics
    from gear_runtime.serving.options import ServeOptions
    from gear_runtime.serving.served import ServedModel

    spec = spec_of(BATCH)
    model = GearModel(null.open_model(None, spec=spec,
                                      outputs={"y": [(b, 3) for b in (1, 2, 4, 8)]}))
    model.attach_profile([1.0, 2.0, 5.0, 3.0])
    served = ServedModel("m", model, ServeOptions(executors=1), Metrics())
    try:
        assert served.plan is not None and served.plan.dispatcher is model.dispatcher
        assert served.plan.gear_for(3) == 3 and served.plan.gear_for(4) == 2
    finally:
        served.pool.close()
