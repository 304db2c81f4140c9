"""The hostile API table: every bad argument to a public call of the contract (spec
constructors, compile and its options, load and each ONNX Runtime option, create_executor,
set_dynamic_*, execute's keywords, attach_profile, output_shape / output_size, gear_of) is a
GearRuntimeError subclass naming the argument, the value and what was expected -- never a
TypeError / ValueError / OverflowError / IndexError from deeper down (pybind11, ORT, float()).

Not here: the values of execute's inputs (lists of None, Fraction, Decimal; pad values), whose
one conversion rule has its own table; Python's own signature errors (a missing argument, an
unknown keyword), which stay Python's TypeError.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models import heavy_model

import gear_runtime as gr

SPEC = dict(input_shape="x:-1,16", dynamic_batch_size="1,2")
X = np.ones((1, 16), np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("api")
    path = str(folder / "h.gear.onnx")
    gr.compile(heavy_model(width=16, layers=1), gr.GearSpec.from_atc(**SPEC), path,
               progress=False)
    model = gr.load(path)
    yield {"path": path, "folder": folder, "model": model, "ex": model.create_executor()}
    model.close()


def _load(**kw: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda f: gr.load(f["path"], **kw)


def _compile(**kw: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda f: gr.compile(heavy_model(width=16, layers=1), gr.GearSpec.from_atc(**SPEC),
                                str(f["folder"] / "o.gear.onnx"), **kw)


#: what is called -> (the call, the error class, words the message must hold)
TABLE: dict[str, tuple[Callable[[dict[str, Any]], Any], type[gr.GearRuntimeError], str]] = {
    # ---- load: the path, the loader's own options, each ONNX Runtime option -----------------
    "load('a\\0b')": (lambda f: gr.load("a\0b"), gr.InputError, "path 'a\\\\x00b' is not a file "
                      "path: it holds a NUL"),
    "load(None)": (lambda f: gr.load(None), gr.InputError, "path must be a file path, got "
                   "NoneType"),
    "load(input_fusion_size='x')": (_load(input_fusion_size="x"), gr.InputError,
                                    "input_fusion_size must be an integer of bytes .* got 'x'"),
    "load(input_fusion_size=2**70)": (_load(input_fusion_size=2**70), gr.InputError,
                                      "input_fusion_size .* to 9223372036854775807, got "
                                      "1180591620717411303424"),
    "load(input_fusion_size=1.5)": (_load(input_fusion_size=1.5), gr.InputError,
                                    "input_fusion_size .* got 1.5"),
    "load(input_fusion_size=True)": (_load(input_fusion_size=True), gr.InputError,
                                     "input_fusion_size .* got True"),
    "load(max_buffer_bytes='x')": (_load(max_buffer_bytes="x"), gr.InputError,
                                   "max_buffer_bytes must be a positive integer"),
    "load(intra_op_num_threads='a')": (_load(intra_op_num_threads="a"), gr.InputError,
                                       "intra_op_num_threads must be an integer \\(0: ORT's "
                                       "default\\) from 0 to 4096, got 'a'"),
    "load(intra_op_num_threads=-1)": (_load(intra_op_num_threads=-1), gr.InputError,
                                      "intra_op_num_threads .* got -1"),
    "load(intra_op_num_threads=2**40)": (_load(intra_op_num_threads=2**40), gr.InputError,
                                         "intra_op_num_threads .* got 1099511627776"),
    "load(intra_op_num_threads=1.5)": (_load(intra_op_num_threads=1.5), gr.InputError,
                                       "intra_op_num_threads .* got 1.5"),
    "load(providers='CPUExecutionProvider')": (_load(providers="CPUExecutionProvider"),
                                               gr.InputError, "providers must be a list .* got "
                                               "'CPUExecutionProvider'"),
    "load(providers=5)": (_load(providers=5), gr.InputError, "providers must be a list .* got 5"),
    "load(providers=[3])": (_load(providers=[3]), gr.InputError,
                            "providers: 3 is neither a provider name nor"),
    "load(providers=[('CPUExecutionProvider',)])": (
        _load(providers=[("CPUExecutionProvider",)]), gr.InputError,
        "providers: \\('CPUExecutionProvider',\\) is neither"),
    "load(providers=[('CPUExecutionProvider', 3)])": (
        _load(providers=[("CPUExecutionProvider", 3)]), gr.InputError, "is neither"),
    "load(providers=['NoSuchProvider'])": (_load(providers=["NoSuchProvider"]),
                                           gr.BackendError, "has no NoSuchProvider"),
    "load(device_id='x')": (_load(device_id="x"), gr.InputError,
                            "device_id must be an integer from 0 to 2147483647, got 'x'"),
    "load(device_id=-1)": (_load(device_id=-1), gr.InputError, "device_id .* got -1"),
    "load(cuda_graph='yes')": (_load(cuda_graph="yes"), gr.InputError,
                               "cuda_graph must be True or False, got 'yes'"),
    "load(cuda_graph_fallback=None)": (_load(cuda_graph_fallback=None), gr.InputError,
                                       "cuda_graph_fallback must be True or False, got None"),
    "load(session_config='x')": (_load(session_config="x"), gr.InputError,
                                 "session_config must be a dict of str to str, got 'x'"),
    "load(session_config={1: 2})": (_load(session_config={1: 2}), gr.InputError,
                                    "session_config must map str to str .* entry 1: 2"),
    "load(session_config={'a\\0': 'b'})": (_load(session_config={"a\0": "b"}), gr.InputError,
                                           "no NUL characters"),
    "load(backend=3)": (_load(backend=3), gr.GearRuntimeError, "backend 3 is unknown"),
    "load(backend='null', providers=[])": (_load(backend="null", providers=[]),
                                           gr.InputError, "does not take these options"),
    # ---- the model's queries -----------------------------------------------------------------
    "output_shape('a', 0)": (lambda f: f["model"].output_shape("a", 0), gr.InputError, "'a'"),
    "output_shape(2**70, 0)": (lambda f: f["model"].output_shape(2**70, 0), gr.InputError,
                               "1180591620717411303424"),
    "output_shape(0, 7)": (lambda f: f["model"].output_shape(0, 7), gr.InputError,
                           "output index 7 is out of range: the model has 1 outputs"),
    "output_shape(0, None)": (lambda f: f["model"].output_shape(0, None), gr.InputError,
                              "output index None"),
    "output_size(0, 1.0)": (lambda f: f["model"].output_size(0, 1.0), gr.InputError,
                            "output index 1.0"),
    "gear_of((3,))": (lambda f: f["model"].gear_of((3,)), gr.GearMismatchError,
                      "dynamic dims \\(3,\\)"),
    "gear_of(1.0)": (lambda f: f["model"].gear_of(1.0), gr.InputError, "got 1.0"),
    "attach_profile('x')": (lambda f: f["model"].attach_profile("x"), gr.InputError,
                            "a profile is a BenchReport, .* got 'x'"),
    "attach_profile(5)": (lambda f: f["model"].attach_profile(5), gr.InputError, "got 5"),
    "attach_profile([1])": (lambda f: f["model"].attach_profile([1]), gr.InputError,
                            "one finite latency >= 0 per gear \\(2\\), got 1"),
    "attach_profile([1, 'a'])": (lambda f: f["model"].attach_profile([1, "a"]), gr.InputError,
                                 "the latency of gear 1 \\(2,\\) must be a finite number >= 0, "
                                 "got 'a'"),
    "attach_profile([1, None])": (lambda f: f["model"].attach_profile([1, None]), gr.InputError,
                                  "gear 1 .* got None"),
    "attach_profile([1, 10**400])": (lambda f: f["model"].attach_profile([1, 10**400]),
                                     gr.InputError, "gear 1 .* got 1000000"),
    "attach_profile([1, 1j])": (lambda f: f["model"].attach_profile([1, 1j]), gr.InputError,
                                "gear 1 .* got 1j"),
    "attach_profile([1, -1])": (lambda f: f["model"].attach_profile([1, -1]), gr.InputError,
                                "gear 1 .* got -1"),
    "attach_profile({5: 1})": (lambda f: f["model"].attach_profile({5: 1}), gr.InputError,
                               "5"),
    # ---- the executor ---------------------------------------------------------------------
    "set_dynamic_dims([2**63])": (lambda f: f["ex"].set_dynamic_dims([2**63]), gr.InputError,
                                  "dims holds 9223372036854775808, beyond any tensor dimension"),
    "set_dynamic_dims([-2**63-1])": (lambda f: f["ex"].set_dynamic_dims([-2**63 - 1]),
                                     gr.InputError, "dims holds -9223372036854775809"),
    "set_dynamic_dims(np.array([2**64-1], uint64))": (
        lambda f: f["ex"].set_dynamic_dims(np.array([2**64 - 1], np.uint64)), gr.InputError,
        "dims holds 18446744073709551615"),
    "set_dynamic_dims(5)": (lambda f: f["ex"].set_dynamic_dims(5), gr.InputError,
                            "dims must be a sequence of integers, got 5"),
    "set_dynamic_dims([1.0])": (lambda f: f["ex"].set_dynamic_dims([1.0]), gr.InputError,
                                "got \\[1.0\\]"),
    "set_dynamic_dims([2**31])": (lambda f: f["ex"].set_dynamic_dims([2**31]),
                                  gr.GearMismatchError, "2147483648"),
    "set_dynamic_batch_size(2**63)": (lambda f: f["ex"].set_dynamic_batch_size(2**63),
                                      gr.InputError, "batch holds 9223372036854775808"),
    "set_dynamic_batch_size('1')": (lambda f: f["ex"].set_dynamic_batch_size("1"),
                                    gr.InputError, "batch must be a sequence of integers"),
    "set_dynamic_image_size(1, 2)": (lambda f: f["ex"].set_dynamic_image_size(1, 2),
                                     gr.InputError, "set_dynamic_image_size needs a model "
                                     "compiled with dynamic image size"),
    "execute(pad='yes')": (lambda f: f["ex"].execute({"x": X}, pad="yes"), gr.InputError,
                           "pad must be True or False, got 'yes'"),
    "execute(pad=1)": (lambda f: f["ex"].execute({"x": X}, pad=1), gr.InputError,
                       "pad must be True or False, got 1"),
    "execute(copy=None)": (lambda f: f["ex"].execute({"x": X}, copy=None), gr.InputError,
                           "copy must be True or False, got None"),
    "execute(copy='no')": (lambda f: f["ex"].execute({"x": X}, copy="no"), gr.InputError,
                           "copy must be True or False, got 'no'"),
    "execute(None)": (lambda f: f["ex"].execute(None), gr.InputError, "inputs must be a dict"),
    "create_executor(pad_values=[1])": (lambda f: f["model"].create_executor(pad_values=[1]),
                                        gr.InputError, "pad_values must be a dict"),
    "create_executor(pad_values={'y': 1})": (
        lambda f: f["model"].create_executor(pad_values={"y": 1}), gr.InputError,
        "pad_values names unknown inputs: y"),
    # ---- compile and its options ------------------------------------------------------------
    "compile(3, ...)": (lambda f: gr.compile(3, gr.GearSpec.from_atc(**SPEC),
                                             str(f["folder"] / "o.gear.onnx")),
                        gr.CompileError, "model must be a file path, got int"),
    "compile('a\\0b', ...)": (lambda f: gr.compile("a\0b", gr.GearSpec.from_atc(**SPEC),
                                                   str(f["folder"] / "o.gear.onnx")),
                              gr.CompileError, "model 'a\\\\x00b' is not a file path"),
    "compile(folder, ...)": (lambda f: gr.compile(str(f["folder"]), gr.GearSpec.from_atc(**SPEC),
                                                  str(f["folder"] / "o.gear.onnx")),
                             gr.CompileError, "is not a regular file"),
    "compile(model, 'spec', ...)": (lambda f: gr.compile(heavy_model(), "spec", "o.gear.onnx"),
                                    gr.CompileError, "spec must be a GearSpec, got str"),
    "compile(hybrid='x')": (_compile(hybrid="x"), gr.CompileError,
                            "hybrid must be True or False, got 'x'"),
    "compile(sink=2)": (_compile(sink=2), gr.CompileError, "sink must be True or False, got 2"),
    "compile(progress='x')": (_compile(progress="x"), gr.CompileError,
                              "progress must be True or False"),
    "compile(external_data='yes')": (_compile(external_data="yes"), gr.CompileError,
                                     "external_data must be True or False, got 'yes'"),
    # ---- spec constructors ------------------------------------------------------------------
    "from_atc(input_shape=3)": (lambda f: gr.GearSpec.from_atc(input_shape=3,
                                                               dynamic_batch_size="1"),
                                gr.GearSpecError, "3"),
    "from_atc(dynamic_batch_size=[1, 2])": (
        lambda f: gr.GearSpec.from_atc(input_shape="x:-1,4", dynamic_batch_size=[1, 2]),
        gr.GearSpecError, "dynamic_batch_size"),
    "from_ge_options('x')": (lambda f: gr.GearSpec.from_ge_options("x"), gr.GearSpecError,
                             "GE options must be a mapping"),
    "from_config(3)": (lambda f: gr.GearSpec.from_config(3), gr.GearSpecError,
                       "config path must be a str"),
    "from_config('a\\0b')": (lambda f: gr.GearSpec.from_config("a\0b"), gr.GearSpecError,
                             "holds a NUL character"),
    "from_config(folder)": (lambda f: gr.GearSpec.from_config(str(f["folder"])),
                            gr.GearSpecError, "cannot be read: it is a directory"),
    "from_config('/dev/zero')": (lambda f: gr.GearSpec.from_config("/dev/zero"),
                                 gr.GearSpecError, "cannot be read: it is not a regular file"),
    "spec.shapes(2**70)": (lambda f: gr.GearSpec.from_atc(**SPEC).shapes(2**70),
                           gr.GearRuntimeError, "1180591620717411303424"),
    "spec.shapes('a')": (lambda f: gr.GearSpec.from_atc(**SPEC).shapes("a"),
                         gr.GearRuntimeError, "'a'"),
}


@pytest.mark.parametrize("call", list(TABLE))
def test_a_bad_argument_is_a_gear_runtime_error_naming_it(files, call: str) -> None:
    run, error, words = TABLE[call]
    with pytest.raises(gr.GearRuntimeError) as info:
        run(files)
    assert isinstance(info.value, error), (type(info.value), info.value)
    assert re.search(words, str(info.value)), str(info.value)


def test_a_config_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs FIFOs")
    fifo = tmp_path / "config.ini"
    os.mkfifo(fifo)
    with pytest.raises(gr.GearSpecError, match="not a regular file"):
        gr.GearSpec.from_config(str(fifo))  # would block forever on read


def test_the_executor_still_runs_after_the_refusals(files) -> None:
    """Refused calls change nothing: the shared executor is free and its dims unset."""
    ex = files["ex"]
    assert ex.dynamic_dims is None
    (y,) = ex.execute({"x": X}, pad=np.True_, copy=np.False_)  # numpy's bools are flags too
    assert y.shape == (1, 16)
