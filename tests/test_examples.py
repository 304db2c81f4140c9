"""The built-in prefill example: deterministic, valid ONNX, a real (causal) prefill, its config."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import gear_runtime as gr
from gear_runtime.errors import InputError
from gear_runtime.examples import prefill


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    return ort.InferenceSession(prefill.build_prefill_model().SerializeToString(),
                                providers=["CPUExecutionProvider"])


def test_build_is_deterministic_and_seeded() -> None:
    a = prefill.build_prefill_model().SerializeToString()
    assert a == prefill.build_prefill_model().SerializeToString()
    assert a != prefill.build_prefill_model(seed=1).SerializeToString()


def test_model_interface_matches_the_seed_config() -> None:
    model = prefill.build_prefill_model()
    inputs = {i.name: i for i in model.graph.input}
    assert tuple(inputs) == prefill.INPUT_NAMES
    elem = {n: i.type.tensor_type.elem_type for n, i in inputs.items()}
    assert elem == {"input_ids": onnx.TensorProto.INT64, "attention_mask": onnx.TensorProto.INT64,
                    "position_ids": onnx.TensorProto.INT64,
                    "image_embeds": onnx.TensorProto.FLOAT}
    dims = {n: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for n, i in inputs.items()}
    assert dims["position_ids"] == [4, 1, "seq_len"]
    assert dims["image_embeds"] == ["num_image_tokens", prefill.HIDDEN]
    assert [o.name for o in model.graph.output] == list(prefill.OUTPUT_NAMES)


def test_config_parses_to_four_sequence_gears(tmp_path) -> None:
    model_path, config_path = prefill.write_example(tmp_path)
    assert model_path.is_file() and config_path.read_text() == prefill.PREFILL_CONFIG
    spec = gr.GearSpec.from_config(str(config_path))
    assert spec.mode == "dims"
    assert spec.input_names == prefill.INPUT_NAMES
    assert spec.gears == tuple((s, s, s, 16) for s in prefill.SEQ_GEARS)
    assert spec.shapes(0) == {"input_ids": (1, 32), "attention_mask": (1, 32),
                              "position_ids": (4, 1, 32), "image_embeds": (16, prefill.HIDDEN)}
    assert onnx.load(str(model_path)).graph.name == "gear_runtime_example_prefill"


def test_prefill_config_follows_other_sizes() -> None:
    text = prefill.prefill_config(hidden=128, seq_gears=(8, 16), image_tokens=4)
    assert 'image_embeds:-1,128"' in text and 'ge.dynamicDims="8,8,8,4;16,16,16,4"' in text


@pytest.mark.parametrize("seq", [*prefill.SEQ_GEARS, 100])
def test_runs_every_gear_and_other_lengths(session, seq: int) -> None:
    feeds = prefill.inputs_for_shapes(prefill.example_shapes(seq), seed=seq)
    logits, next_token = session.run(None, feeds)
    assert logits.shape == (1, seq, prefill.VOCAB) and logits.dtype == np.float32
    assert next_token.shape == (1, seq) and next_token.dtype == np.int64
    assert np.all(np.isfinite(logits))
    np.testing.assert_array_equal(next_token, logits.argmax(-1))
    assert len(np.unique(next_token)) > 1  # not a degenerate constant model


def test_attention_is_causal_and_reads_the_image(session) -> None:
    feeds = prefill.inputs_for_shapes(prefill.example_shapes(32), seed=3)
    base = session.run(None, feeds)[0]
    later = dict(feeds, input_ids=feeds["input_ids"].copy())
    later["input_ids"][0, 20] = (later["input_ids"][0, 20] + 1) % prefill.VOCAB
    changed = session.run(None, later)[0]
    np.testing.assert_array_equal(changed[0, :20], base[0, :20])  # the past cannot see it
    assert not np.allclose(changed[0, 20:], base[0, 20:])
    image = dict(feeds, image_embeds=feeds["image_embeds"] + 1.0)
    assert not np.allclose(session.run(None, image)[0][0, 0], base[0, 0])


def test_attention_mask_hides_padded_keys(session) -> None:
    feeds = prefill.inputs_for_shapes(prefill.example_shapes(32), seed=4)
    feeds["attention_mask"][0, 30:] = 0
    base = session.run(None, feeds)[0]
    other = dict(feeds, input_ids=feeds["input_ids"].copy())
    other["input_ids"][0, 30] = (other["input_ids"][0, 30] + 5) % prefill.VOCAB
    # position 31 sees key 30 only through the mask: masked, so its logits stay (nearly) equal
    np.testing.assert_allclose(session.run(None, other)[0][0, 31], base[0, 31], atol=1e-4)


def test_example_inputs_are_valid() -> None:
    shapes = prefill.example_shapes(64)
    feeds = prefill.inputs_for_shapes(shapes, seed=0)
    assert {n: a.shape for n, a in feeds.items()} == shapes
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < prefill.VOCAB
    assert np.all(feeds["attention_mask"] == 1)
    np.testing.assert_array_equal(feeds["position_ids"][2, 0], np.arange(64))
    assert feeds["image_embeds"].dtype == np.float32
    again = prefill.inputs_for_shapes(shapes, seed=0)
    assert all(np.array_equal(feeds[n], again[n]) for n in feeds)


def test_example_inputs_for_a_spec_gear(tmp_path) -> None:
    _, config = prefill.write_example(tmp_path)
    spec = gr.GearSpec.from_config(str(config))
    feeds = prefill.example_inputs(spec, 3, seed=1)
    assert {n: a.shape for n, a in feeds.items()} == spec.shapes(3)


def test_unknown_input_name_is_an_input_error() -> None:
    with pytest.raises(InputError, match="pixel_values"):
        prefill.inputs_for_shapes({"pixel_values": (1, 3)})


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="heads"):
        prefill.build_prefill_model(hidden=30, heads=4)
