"""Round 3's smaller findings (F9/F10): each refused with a clear error now."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import gear_runtime as gr
from gear_runtime.errors import InputError
from gear_runtime.serving.protocol import decode_request, split_body
from tests.models import conv_model


@pytest.fixture(scope="module")
def batch_model(tmp_path_factory: pytest.TempPathFactory) -> gr.GearModel:
    folder = tmp_path_factory.mktemp("b")
    onnx.save(conv_model(), folder / "conv.onnx")
    spec = gr.GearSpec.from_atc("data:-1,3,8,8", dynamic_batch_size="1,2")
    gr.compile(str(folder / "conv.onnx"), spec, str(folder / "conv.gear.onnx"), progress=False)
    return gr.load(str(folder / "conv.gear.onnx"))


@pytest.mark.parametrize("flag", [True, np.bool_(True), False])
def test_a_bool_is_no_batch_size(batch_model, flag) -> None:
    ex = batch_model.create_executor()
    with pytest.raises(InputError, match="batch must be (integers, got a bool|a sequence of )"):
        ex.set_dynamic_batch_size(flag)
    ex.set_dynamic_batch_size(2)  # still takes an int
    ex.set_dynamic_batch_size(np.int64(1))


@pytest.mark.parametrize("header", ["1_0", "+5", " 0x1", "1e1", "-1", "١"])
def test_the_json_length_header_takes_decimal_digits_only(header) -> None:
    with pytest.raises(InputError, match="not a non-negative integer"):
        split_body(b"x" * 20, header)
    assert split_body(b"x" * 20, "10")[0] == b"x" * 10


def test_a_tensor_with_data_and_binary_data_size_is_refused() -> None:
    doc = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0],
                       "parameters": {"binary_data_size": 4}}]}
    text = json.dumps(doc).encode()
    with pytest.raises(InputError, match='both "data" and a binary_data_size'):
        decode_request(text + np.float32(2).tobytes(), str(len(text)))


def test_gzip_bodies_are_read_whole_or_refused() -> None:
    import gzip
    import zlib

    from gear_runtime.serving.app import inflate
    from gear_runtime.serving.errors import PayloadTooLargeError

    two = gzip.compress(b"first ") + gzip.compress(b"second")
    assert inflate(two, "gzip", 100) == b"first second"  # before: b"first " (rest dropped)
    with pytest.raises(InputError, match="truncated"):
        inflate(gzip.compress(b"x" * 100)[:-12], "gzip", 1000)
    with pytest.raises(InputError, match="bytes after the end of its deflate stream"):
        inflate(zlib.compress(b"abc") + b"junk", "deflate", 100)
    with pytest.raises(PayloadTooLargeError):
        inflate(gzip.compress(b"a" * 60) + gzip.compress(b"b" * 60), "gzip", 100)
    with pytest.raises(InputError, match="not valid gzip"):
        inflate(gzip.compress(b"a") + b"\x00garbage", "gzip", 100)


@pytest.mark.parametrize("opset", [1000, 0])
def test_compile_refuses_an_opset_onnx_does_not_know(tmp_path, opset) -> None:
    model = conv_model()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = opset
    onnx.save(model, tmp_path / "future.onnx")
    spec = gr.GearSpec.from_atc("data:-1,3,8,8", dynamic_batch_size="1,2")
    with pytest.raises(gr.CompileError, match=f"opset {opset}; this onnx .* knows opsets 1"):
        gr.compile(str(tmp_path / "future.onnx"), spec, str(tmp_path / "f.gear.onnx"),
                   progress=False)
