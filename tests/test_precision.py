"""GE's precision_mode as the spec reads it, as the gear file records it, and as each backend
applies it or says what it runs instead (docs/precision.md).

A default that changes results is stated and tested: OpenVINO asks for f32 on every device
(its CPU plugin's own default is bf16 on CPUs with AVX512_BF16/AMX), ONNX Runtime's CUDA EP
gets use_tf32=0 (its default rounds float32 MatMul/Conv to TF32), and the OpenVINO backend is
compared to ORT at 1e-5.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from cli_support import run_cli
from models import HEAVY_SPEC, heavy_model, random_inputs, run_model

import gear_runtime as gr
from gear_runtime.backends.onnxruntime_cuda import provider_list
from gear_runtime.errors import GearSpecError
from gear_runtime.spec.rules import PRECISION_LOWERED, PRECISION_MODES


def _spec(mode: str | None = None) -> gr.GearSpec:
    return gr.GearSpec.from_atc(**HEAVY_SPEC, precision_mode=mode)


def _compiled(tmp_path: Path, mode: str | None = None) -> tuple[object, str]:
    model = heavy_model(width=512, layers=4)
    out = str(tmp_path / f"h-{mode}.gear.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gr.compile(model, _spec(mode), out, progress=False)
    return model, out


# ---- the spec ----------------------------------------------------------------------------------
def test_every_ge_mode_is_read_and_anything_else_is_e10001() -> None:
    assert set(PRECISION_LOWERED) == set(PRECISION_MODES) and len(PRECISION_MODES) == 9
    for mode in PRECISION_MODES:
        assert _spec(mode).precision_mode == mode
    assert _spec(" force_fp32 ").precision_mode == "force_fp32"
    assert _spec("").precision_mode is None and _spec().precision_mode is None
    for bad in ("fp32", "FORCE_FP32", "force_fp32;", "origin"):
        with pytest.raises(GearSpecError) as info:
            _spec(bad)
        assert info.value.code == "E10001" and repr(bad) in str(info.value)
        assert "force_fp32" in str(info.value)  # the valid values are listed


def test_ge_options_and_both_spellings() -> None:
    base = {"ge.inputShape": "x:-1,4", "ge.dynamicBatchSize": "1,2"}
    for key in ("ge.exec.precision_mode", "precision_mode"):
        assert gr.GearSpec.from_ge_options({**base, key: "force_fp16"}).precision_mode == \
            "force_fp16"
    with pytest.raises(GearSpecError, match="disagree"):
        gr.GearSpec.from_ge_options({**base, "ge.exec.precision_mode": "force_fp16",
                                     "precision_mode": "force_fp32"})
    with pytest.raises(GearSpecError, match="precision_mode_v2.*not supported"):
        gr.GearSpec.from_ge_options({**base, "ge.exec.precision_mode_v2": "fp16"})


def test_the_seeds_config_sets_it_in_its_own_section(tmp_path: Path) -> None:
    """Seed 004's config_prefill.ini: [acl_init_options] ge.exec.precision_mode=force_fp32 beside
    the gear section. It was dropped as "not ours" before; it is the spec's now."""
    path = tmp_path / "config_prefill.ini"
    path.write_text('[acl_init_options]\nge.exec.precision_mode=force_fp32\n\n'
                    '[acl_build_options]\ninput_format="ND"\n'
                    'input_shape="input_ids:1,-1;attention_mask:1,-1"\n'
                    'ge.dynamicDims="32,32;512,512"\n')
    spec = gr.GearSpec.from_config(path)
    assert spec.precision_mode == "force_fp32" and spec.gears == ((32, 32), (512, 512))
    back = tmp_path / "back.ini"
    back.write_text(spec.to_config())
    assert gr.GearSpec.from_config(back) == spec
    path.write_text(path.read_text() + 'precision_mode="force_fp16"\n')
    with pytest.raises(GearSpecError, match="different values.*force_fp32.*force_fp16"):
        gr.GearSpec.from_config(path)


def test_atc_flags_round_trip_it() -> None:
    spec = _spec("allow_mix_precision")
    assert spec.to_atc()["precision_mode"] == "allow_mix_precision"
    assert gr.GearSpec.from_atc(**spec.to_atc()) == spec


# ---- the gear file, inspect, compile --------------------------------------------------------
def test_the_gear_file_records_it_and_inspect_shows_it(tmp_path: Path, capsys) -> None:
    _, path = _compiled(tmp_path, "force_fp32")
    assert gr.load(path).spec.precision_mode == "force_fp32"
    code, out, _ = run_cli(capsys, "inspect", path)
    assert code == 0 and "precision   force_fp32" in out
    _, plain = _compiled(tmp_path)
    assert gr.load(plain).spec.precision_mode is None
    code, out, _ = run_cli(capsys, "inspect", plain)
    assert "precision   not given" in out and "force_fp16" in out  # what an .om would run


def test_compile_takes_atcs_flag(tmp_path: Path, capsys) -> None:
    import onnx
    src = tmp_path / "h.onnx"
    onnx.save(heavy_model(width=64, layers=1), src)
    out = tmp_path / "h.gear.onnx"
    code, text, _ = run_cli(capsys, "compile", str(src), "--input_shape=x:-1,64",
                            "--dynamic_batch_size=1,2", "--precision_mode=force_fp32",
                            "-o", str(out))
    assert code == 0 and "precision_mode force_fp32" in text
    assert gr.load(str(out)).spec.precision_mode == "force_fp32"
    code, _, err = run_cli(capsys, "compile", str(src), "--input_shape=x:-1,64",
                           "--dynamic_batch_size=1,2", "--precision_mode=fp32", "-o", str(out))
    assert code != 0 and "E10001" in err and "'fp32'" in err


# ---- ONNX Runtime --------------------------------------------------------------------------
def test_ort_cpu_runs_float32_and_says_so_for_a_lowering_mode(tmp_path: Path) -> None:
    original, path = _compiled(tmp_path, "force_fp16")
    with pytest.warns(RuntimeWarning, match="force_fp16.*f16 on Ascend.*float32 on the CPU"):
        model = gr.load(path)
    feeds = random_inputs(original, _spec().shapes(1), seed=1)
    np.testing.assert_allclose(model.create_executor().execute(feeds)[0],
                               run_model(original, feeds)[0], rtol=1e-6, atol=1e-6)
    _, kept = _compiled(tmp_path, "force_fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a float32-keeping mode says nothing
        gr.load(kept)


def test_the_cuda_provider_gets_tf32_off_unless_the_mode_lowers_float32() -> None:
    cuda = "CUDAExecutionProvider"
    assert provider_list([cuda], 0, False) == [(cuda, {"device_id": "0", "use_tf32": "0"})]
    assert provider_list([cuda], 0, False, tf32=True)[0][1]["use_tf32"] == "1"
    # the user's own choice stays
    assert provider_list([(cuda, {"use_tf32": "1"})], 0, False)[0][1]["use_tf32"] == "1"


# ---- OpenVINO ---------------------------------------------------------------------------------
@pytest.fixture
def ov():
    return pytest.importorskip("openvino")


def test_openvino_asks_for_f32_by_default_and_matches_ort_at_1e5(tmp_path: Path, ov) -> None:
    original, path = _compiled(tmp_path)
    model = gr.load(path, backend="openvino")
    backend = model.backend_model
    assert backend.properties["INFERENCE_PRECISION_HINT"] == "f32" and backend.precision == "f32"
    compiled = backend.gears if backend.gears is not None else backend.per_gear[0]
    assert str(compiled.get_property("INFERENCE_PRECISION_HINT")) in ("<Type: 'float32'>",
                                                                     "f32", "float32")
    ex = model.create_executor()
    for g in range(_spec().gear_count):
        feeds = random_inputs(original, _spec().shapes(g), seed=g)
        np.testing.assert_allclose(ex.execute(feeds)[0], run_model(original, feeds)[0],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode, hint", [("force_fp32", "f32"), ("allow_fp32_to_fp16", "f32"),
                                        ("force_fp16", "f16"), ("allow_mix_precision", "f16"),
                                        ("allow_mix_precision_bf16", "bf16")])
def test_openvino_maps_the_mode_to_its_precision_hint(tmp_path: Path, ov, mode, hint) -> None:
    _, path = _compiled(tmp_path, mode)
    assert gr.load(path, backend="openvino").backend_model.properties[
        "INFERENCE_PRECISION_HINT"] == hint


def test_openvino_config_given_by_the_user_wins(tmp_path: Path, ov) -> None:
    _, path = _compiled(tmp_path)
    backend = gr.load(path, backend="openvino",
                      config={"INFERENCE_PRECISION_HINT": "bf16"}).backend_model
    assert backend.properties["INFERENCE_PRECISION_HINT"] == "bf16" and backend.precision == "bf16"


def test_openvino_npu_and_num_threads_rules(ov) -> None:
    from gear_runtime.backends import openvino as ovb
    assert ovb.precision_hint("GPU.1", None) == "f32"
    assert ovb.precision_hint("NPU", None) is None  # it computes in f16 whatever is asked
    assert ovb.precision_hint("NPU", "force_fp16") is None
    with pytest.raises(gr.BackendError, match="force_fp32.*NPU computes in float16"):
        ovb.precision_hint("NPU", "force_fp32")
    with pytest.raises(gr.InputError, match="num_threads=2 is a CPU option.*'GPU'"):
        ovb.check_options(ov, "GPU", "source", 2, "LATENCY")


# ---- MindSpore Lite ----------------------------------------------------------------------------
def test_mindspore_lite_gets_the_config_and_the_ge_provider(tmp_path: Path, monkeypatch) -> None:
    from doubles import fake_mslite
    double = fake_mslite.FakeMslite()
    monkeypatch.setitem(sys.modules, "mindspore_lite", double.module)
    mindir = fake_mslite.write_mindir(tmp_path / "m.mindir", [("x", [1, -1], "int32")],
                                      [[[1, 4]], [[1, 8]]])
    acl = tmp_path / "acl.ini"
    acl.write_text('[acl_init_options]\nge.exec.precision_mode=force_fp32\n'
                   '[acl_build_options]\ninput_shape="x:1,-1"\nge.dynamicDims="4;8"\n')
    ge = tmp_path / "ge.ini"
    ge.write_text('[ge_graph_options]\nge.inputShape="x:1,-1"\nge.dynamicDims="4;8"\n')
    gr.load(mindir, backend="mindspore_lite", config=str(acl))
    gr.load(mindir, backend="mindspore_lite", config=str(ge))
    spec = gr.GearSpec.from_atc("x:1,-1", dynamic_dims="4;8", precision_mode="force_fp16")
    gr.load(mindir, backend="mindspore_lite", spec=spec)
    assert double.state.builds == [
        (str(acl), None, ""),  # its runtime options are MindSpore Lite's to read
        (str(ge), None, "ge"),  # [ge_graph_options] is read by the GE delegate only
        ("", {"ascend_context": {"precision_mode": "force_fp16"}}, "")]


def test_a_static_mindir_keeps_its_configs_precision_mode(tmp_path: Path, monkeypatch) -> None:
    """A static MindIR (no gears) with the seed decode's kind of config, a precision mode and
    no gear option: its spec, made from the model's own shapes, carries that mode (what
    inspect and serve's /config report); without a config it has none."""
    from doubles import fake_mslite
    double = fake_mslite.FakeMslite()
    monkeypatch.setitem(sys.modules, "mindspore_lite", double.module)
    mindir = fake_mslite.write_mindir(tmp_path / "s.mindir", [("x", [1, 4], "int32")],
                                      [[[1, 4]]])
    ini = tmp_path / "decode.ini"
    ini.write_text("[ge_graph_options]\nge.exec.precision_mode=force_fp32\n")
    model = gr.load(mindir, backend="mindspore_lite", config=str(ini))
    assert model.gears == [()] and model.spec.precision_mode == "force_fp32"
    assert gr.load(mindir, backend="mindspore_lite").spec.precision_mode is None


def test_a_hybrid_or_sink_file_is_refused_on_the_npu(tmp_path: Path, ov) -> None:
    model = heavy_model(width=64, layers=1)
    spec = gr.GearSpec.from_atc("x:-1,64", dynamic_dims="1;2")  # hybrid needs dims mode
    for kind in ("hybrid", "sink"):
        out = str(tmp_path / f"{kind}.gear.onnx")
        gr.compile(model, spec, out, progress=False, **{kind: True})
        with pytest.raises(gr.BackendError, match=f"a {kind} gear file.*NPU cannot compile"):
            gr.load(out, backend="openvino", device="NPU")
