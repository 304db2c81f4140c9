"""The int32 dims buffer (``ascend_mbatch_shape_data``) is staged where a backend reads it,
and only there (``BackendModel.stages_dims``).

GE's merged copy appends the current dims to the inputs it moves to the device; a backend
that reads them there (the null backend records them as a device runtime would see them)
must find every gear's values written. ONNX Runtime runs the source graph at the gear's
static shapes and never reads them: its layout has no dims buffer, so nothing is written.
"""

from __future__ import annotations

import numpy as np
import pytest
from models import RESHAPE_SPEC, reshape_model

import gear_runtime as gr
from gear_runtime.backends import null
from gear_runtime.runtime.model import GearModel


def inputs_for(spec: gr.GearSpec, gear: int) -> list[np.ndarray]:
    rng = np.random.default_rng(gear)
    return [rng.standard_normal(s).astype(np.float32) for s in spec.shapes(gear).values()]


def test_a_backend_that_reads_the_dims_gets_them_written_for_every_gear() -> None:
    spec = gr.GearSpec.from_atc(**RESHAPE_SPEC)
    model = GearModel(null.open_model(None, spec=spec))
    assert model._backend.stages_dims
    assert model.layout.dims_nbytes == 4 * spec.values_per_gear
    ex = model.create_executor()
    for gear in reversed(range(spec.gear_count)):
        ex.execute(inputs_for(spec, gear))
        assert ex.session.staged_dims(gear) == spec.gears[gear]


def test_padded_runs_stage_the_gears_dims_not_the_requests() -> None:
    spec = gr.GearSpec.from_atc(**RESHAPE_SPEC)
    model = GearModel(null.open_model(None, spec=spec))
    ex = model.create_executor()
    (x,) = inputs_for(spec, 1)  # gear (2, 8): x [2, 8, 8]; a request of (2, 5) pads to it
    ex.execute([np.ascontiguousarray(x[:, :5])], pad=True)
    assert ex.last_request_dims == (2, 5) and ex.last_gear == 1
    assert ex.session.staged_dims(ex.last_gear) == spec.gears[ex.last_gear]


def test_onnx_runtime_stages_no_dims_buffer(tmp_path) -> None:
    spec = gr.GearSpec.from_atc(**RESHAPE_SPEC)
    path = gr.compile(reshape_model(), spec, str(tmp_path / "d.gear.onnx"), progress=False)
    with gr.load(path) as model:
        assert not model._backend.stages_dims and model.layout.dims_nbytes == 0
        ex = model.create_executor()
        staging = ex.session.staging
        staging[...] = 0xEE
        for gear in range(spec.gear_count):
            ex.execute(inputs_for(spec, gear))
            ends = [model.layout.offset(gear, i) + model.layout.nbytes(gear, i)
                    for i in range(len(spec.input_names))]
            assert (staging[max(ends):] == 0xEE).all()  # nothing staged after the inputs


@pytest.mark.parametrize("stages", [True, False])
def test_the_layout_follows_the_backend(stages, monkeypatch) -> None:
    spec = gr.GearSpec.from_atc(**RESHAPE_SPEC)
    monkeypatch.setattr(null.NullModel, "stages_dims", stages)
    model = GearModel(null.open_model(None, spec=spec))
    assert model.layout.dims_nbytes == (4 * spec.values_per_gear if stages else 0)
