"""GearSpec from ATC / MindSpore Lite config files, and spec_to_config round trips."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import gear_runtime as gr
from gear_runtime.errors import GearSpecError
from gear_runtime.spec import spec_from_config, spec_to_config
from gear_runtime.spec.config import SECTIONS

# Seed 004, section 1.1: configs/config_prefill.ini, all 7 lines, LF endings.
SEED004_INI = """[acl_init_options]
ge.exec.precision_mode=force_fp32

[acl_build_options]
input_format="ND"
input_shape="input_ids:1,-1;attention_mask:1,-1;position_ids:4,1,-1;image_embeds:-1,2560"
ge.dynamicDims="32,32,32,16;512,512,512,16;1024,1024,1024,16;2048,2048,2048,16"
"""


@pytest.fixture()
def write(tmp_path: Path):
    """Write ini text to a fresh file and return its path."""
    counter = iter(range(10**6))

    def _write(text: str | bytes) -> Path:
        path = tmp_path / f"config_{next(counter)}.ini"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path

    return _write


def rejects(code: str, quoted: str, path, **kwargs) -> GearSpecError:
    with pytest.raises(GearSpecError) as info:
        spec_from_config(path, **kwargs)
    err = info.value
    assert type(err) is GearSpecError
    assert err.code == code, str(err)
    assert quoted in err.message, f"{quoted!r} not quoted in: {err.message}"
    return err


# ---- [acl_build_options] ------------------------------------------------------------------------
def test_seed_004_config_prefill(write) -> None:
    assert len(SEED004_INI.splitlines()) == 7
    spec = gr.GearSpec.from_config(str(write(SEED004_INI)))
    assert spec.mode == "dims" and spec.input_format == "ND" and spec.hybrid is False
    assert spec.input_names == ("input_ids", "attention_mask", "position_ids", "image_embeds")
    assert spec.gear_count == 4 and spec.values_per_gear == 4
    assert spec.shapes(0) == {"input_ids": (1, 32), "attention_mask": (1, 32),
                              "position_ids": (4, 1, 32), "image_embeds": (16, 2560)}
    assert spec.largest_shapes() == {"input_ids": (1, 2048), "attention_mask": (1, 2048),
                                     "position_ids": (4, 1, 2048), "image_embeds": (16, 2560)}
    assert spec.largest_shapes() == spec.shapes(3)


@pytest.mark.parametrize(("body", "mode", "gears"), [
    ('input_shape="a:-1,3"\ndynamic_batch_size="1,2,4"', "batch", ((1,), (2,), (4,))),
    ("input_shape=i:1,3,-1,-1\ndynamic_image_size=8,8;16,16", "image_size", ((8, 8), (16, 16))),
    ("input_shape='a:1,-1'\ndynamic_dims='3;5'", "dims", ((3,), (5,))),
    ("ge.inputShape=a:1,-1\nge.dynamicDims=3;5", "dims", ((3,), (5,))),
])
def test_acl_build_options_accepts_atc_and_ge_spellings(write, body, mode, gears) -> None:
    spec = spec_from_config(write(f"[acl_build_options]\nop_select_implmode=x\n{body}\n"))
    assert spec.mode == mode and spec.gears == gears


def test_keys_are_case_preserving_and_other_sections_are_ignored(write) -> None:
    text = ("[acl_init_options]\nge.dynamicDims=1;2\n[DEFAULT]\ninput_shape=z:-1\n"
            "[acl_build_options]\nGE.DYNAMICDIMS=9;9\nge.inputShape=a:-1\nge.dynamicDims=4;6\n")
    spec = spec_from_config(write(text))
    assert spec.input_names == ("a",) and spec.gears == ((4,), (6,))


def test_config_values_keep_percent_signs_no_interpolation(write) -> None:
    spec = spec_from_config(write("[acl_build_options]\ninput_shape=a%b:-1\n"
                                  "dynamic_dims=1;2\n"))
    assert spec.input_names == ("a%b",)


# ---- [ascend_context] ---------------------------------------------------------------------------
def test_ascend_context_range_expands_to_one_gear_per_integer(write) -> None:
    spec = spec_from_config(write("[ascend_context]\ninput_shape=input.1:[-1,3,224,224]\n"
                                  "dynamic_dims=[1~4],[8],[16]\n"))
    assert spec.gears == ((1,), (2,), (3,), (4,), (8,), (16,))
    assert spec.mode == "batch"  # MindSpore Lite: "dynamic BatchSize" for one -1 on N
    assert spec.shapes(5) == {"input.1": (16, 3, 224, 224)}


def test_ascend_context_two_values_on_h_w_is_image_size(write) -> None:
    spec = spec_from_config(write("[ascend_context]\ninput_format=NHWC\n"
                                  "input_shape=x:[1,-1,-1,3]\n"
                                  "dynamic_dims=[64,64],[19200,960]\n"))
    assert spec.mode == "image_size" and spec.input_format == "NHWC"
    assert spec.shapes(1) == {"x": (1, 19200, 960, 3)}


def test_ascend_context_several_inputs_is_dims_mode(write) -> None:
    spec = spec_from_config(write("[ascend_context]\ninput_shape=a:[1,-1];b:[-1,2];c:4\n"
                                  "dynamic_dims=[1,2], [3,4] ,[ 5,6 ]\n"))
    assert spec.mode == "dims" and spec.gears == ((1, 2), (3, 4), (5, 6))
    assert spec.shapes(0) == {"a": (1, 1), "b": (2, 2), "c": (4,)}


def test_ascend_context_one_value_not_on_n_is_dims_mode(write) -> None:
    spec = spec_from_config(write("[ascend_context]\ninput_shape=a:[1,-1]\n"
                                  "dynamic_dims=[2~3],[7]\n"))
    assert spec.mode == "dims" and spec.gears == ((2,), (3,), (7,))


def test_ascend_context_takes_atc_syntax_too(write) -> None:
    spec = spec_from_config(write("[ascend_context]\ninput_shape=a:1,-1\n"
                                  "dynamic_dims=2;3\n"))
    assert spec.mode == "dims" and spec.gears == ((2,), (3,))
    spec = spec_from_config(write("[ascend_context]\ninput_shape=a:[-1,3]\n"
                                  "dynamic_batch_size=2,3\n"))
    assert spec.mode == "batch" and spec.gears == ((2,), (3,))


@pytest.mark.parametrize(("dims", "code", "quoted"), [
    ("[1~2,8],[4,8]", "E10001", "'[1~2,8]'"),  # a range inside a multi-value group: rejected
    ("[4~1],[8]", "E10001", "'4~1'"),
    ("[1~x],[8]", "E10001", "'x'"),
    ("[-1],[8]", "E10001", "'-1'"),
    ("[1],[8]]", "E10001", "'[1],[8]]'"),
    ("[1] [8]", "E10001", "'[1] [8]'"),
    ("[]", "E10001", "''"),
    ("[1~3],[2]", "E10039", "[2]"),
    ("[7]", "E10035", "[7]"),
    ("[1~200]", "E10036", "'1~200'"),
])
def test_ascend_context_errors(write, dims, code, quoted) -> None:
    path = write(f"[ascend_context]\ninput_shape=a:[-1,3]\ndynamic_dims={dims}\n")
    err = rejects(code, quoted, path)
    assert "[ascend_context]" in err.message and str(path) in err.message


def test_ascend_context_huge_range_is_refused_before_expanding(write) -> None:
    path = write("[ascend_context]\ninput_shape=a:[-1,3]\n"
                 "dynamic_dims=[1~1000000000000000000]\n")
    start = time.perf_counter()
    rejects("E10036", "1~1000000000000000000", path)
    assert time.perf_counter() - start < 1.0
    assert spec_from_config(write("[ascend_context]\ninput_shape=a:[-1,3]\n"
                                  "dynamic_dims=[1~256]\n"), max_gears=256).gear_count == 256


def test_ascend_context_with_batch_and_bracket_dims_is_e10009(write) -> None:
    rejects("E10009", "dynamic_batch_size",
            write("[ascend_context]\ninput_shape=a:[-1,3]\ndynamic_dims=[1],[2]\n"
                  "dynamic_batch_size=1,2\n"))


# ---- [ge_graph_options] and hybrid --------------------------------------------------------------
GE_GRAPH = ("[ge_graph_options]\nge.inputShape=data:1,1,40,-1;label:1,-1;mask:-1,-1\n"
            "ge.dynamicDims=20,20,1,1;40,40,2,2;80,60,4,4\n")


def test_ge_graph_options_hybrid_exactly_when_all_four_are_set(write) -> None:
    plain = spec_from_config(write(GE_GRAPH))
    assert plain.hybrid is False and plain.shapes(2)["mask"] == (4, 4)
    both = GE_GRAPH + "ge.dynamicNodeType=1\nge.compileHybridMode=1\n"
    assert spec_from_config(write(both)).hybrid is True
    assert spec_from_config(write(GE_GRAPH + "ge.dynamicNodeType=1\n")).hybrid is False
    assert spec_from_config(write(GE_GRAPH + "ge.compileHybridMode=1\n")).hybrid is False
    off = GE_GRAPH + "ge.dynamicNodeType=0\nge.compileHybridMode=1\n"
    assert spec_from_config(write(off)).hybrid is False


# ---- file-level errors --------------------------------------------------------------------------
def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "config.ini"
    rejects("E10001", str(missing), missing)


@pytest.mark.parametrize("path", [None, 3, b"\x00".decode() + "x", ["a.ini"]])
def test_bad_paths_are_gear_spec_errors(path) -> None:
    with pytest.raises(GearSpecError):
        spec_from_config(path)


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    rejects("E10001", str(tmp_path), tmp_path)


@pytest.mark.parametrize(("text", "code", "quoted"), [
    ("input_shape=a:-1\n", "E10001", "not a valid ini"),
    ("[acl_build_options]\ninput_shape\n", "E10001", "not a valid ini"),
    ("[acl_build_options]\ninput_shape=a:-1\ninput_shape=b:-1\n", "E10001", "input_shape"),
    ("[ascend_context]\n[ascend_context]\n", "E10001", "ascend_context"),
    ("[acl_init_options]\nge.exec.precision_mode=force_fp32\n", "E10001", "acl_build_options"),
    ("[acl_build_options]\nprecision_mode=x\n", "E10001", "none of"),
    ("[acl_build_options]\ninput_shape=a:-1\nge.inputShape=a:-1\ndynamic_dims=1;2\n", "E10001",
     "ge.inputShape"),
    ("[acl_build_options]\ninput_shape=a:-1\ndynamic_dims=1;2\n"
     "[ascend_context]\ninput_shape=a:[-1]\n", "E10009", "ascend_context"),
    ("[acl_build_options]\ninput_shape=a:1,-1\ndynamic_dims=20\n", "E10035", "'20'"),
    ("[acl_build_options]\ninput_shape=a:1,-1\ndynamic_dims=\"\"\n", "E10001", "none of"),
    ("[acl_build_options]\ndynamic_dims=1;2\n", "E10004", "input_shape"),
    ("[ge_graph_options]\nge.inputShape=a:-1,3\nge.dynamicBatchSize=1,x\n", "E10003", "'x'"),
])
def test_config_errors(write, text, code, quoted) -> None:
    rejects(code, quoted, write(text))


def test_no_recognised_section_lists_what_was_looked_for(write) -> None:
    err = rejects("E10001", "acl_init_options", write("[acl_init_options]\nx=1\n"))
    for section in SECTIONS:
        assert section in err.message


def test_non_utf8_file_is_a_gear_spec_error(write) -> None:
    rejects("E10001", "UTF-8", write(b"[acl_build_options]\ninput_shape=\xff:-1\n"))


def test_utf8_bom_is_accepted(write) -> None:
    spec = spec_from_config(write("\ufeff[acl_build_options]\ninput_shape=a:-1\n"
                                  "dynamic_dims=1;2\n"))
    assert spec.gears == ((1,), (2,))


# ---- spec_to_config -----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    {"input_shape": "data:1,1,40,-1;label:1,-1;mask:-1,-1",
     "dynamic_dims": "20,20,1,1;40,40,2,2;80,60,4,4"},
    {"input_shape": "data:-1,3,224,224", "dynamic_batch_size": "1,8,16"},
    {"input_shape": "img:1,-1,-1,3", "dynamic_image_size": "224,224;448,448",
     "input_format": "NHWC"},
    {"input_shape": "k:;ns:\"q\":-1,2", "dynamic_dims": "0;3", "input_format": "ND"},
])
def test_to_config_round_trips(write, kwargs) -> None:
    spec = gr.GearSpec.from_atc(**kwargs)
    text = spec.to_config()
    assert text.startswith("[acl_build_options]\n")
    assert gr.GearSpec.from_config(str(write(text))) == spec


def test_seed_004_round_trips_through_to_config(write) -> None:
    spec = spec_from_config(write(SEED004_INI))
    text = spec_to_config(spec)
    assert 'ge.dynamicDims="32,32,32,16;512,512,512,16;1024,1024,1024,16;2048,2048,2048,16"' \
        in text
    assert spec_from_config(write(text)) == spec


def test_hybrid_spec_is_written_as_ge_graph_options_and_round_trips(write) -> None:
    spec = spec_from_config(write(GE_GRAPH + "ge.dynamicNodeType=1\nge.compileHybridMode=1\n"))
    text = spec_to_config(spec)
    assert text.startswith("[ge_graph_options]\n")
    assert spec_from_config(write(text)) == spec


def test_large_specs_round_trip_with_their_max_gears(write) -> None:
    spec = gr.GearSpec.from_atc("a:-1", dynamic_batch_size=",".join(map(str, range(150))),
                                max_gears=256)
    path = write(spec_to_config(spec))
    rejects("E10036", "150 gears", path)
    assert spec_from_config(path, max_gears=256) == spec


@pytest.mark.parametrize(("spec", "quoted"), [
    (gr.GearSpec("batch", ("a",), ((-1,),), ((1,), (2,)), hybrid=True), "'batch'"),
    (gr.GearSpec("dims", ("a\nb",), ((-1,),), ((1,), (2,))), "'a\\nb'"),
    (gr.GearSpec("dims", ("a;b",), ((-1,),), ((1,), (2,))), "'a;b'"),
])
def test_to_config_refuses_what_cannot_be_written(spec, quoted) -> None:
    with pytest.raises(GearSpecError) as info:
        spec_to_config(spec)
    assert quoted in info.value.message
