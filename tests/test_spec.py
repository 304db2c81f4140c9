"""GearSpec from ATC flags and GE options: GE's rules, codes and order
(docs/ge-notes.md section 1)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gear_runtime as gr
from gear_runtime.errors import GearSpecError
from gear_runtime.spec import (
    check_gears,
    parse_input_shape,
    spec_from_atc,
    spec_from_ge_options,
    spec_to_atc,
)

SEED000 = {"input_shape": "data:1,1,40,-1;label:1,-1;mask:-1,-1",
           "dynamic_dims": "20,20,1,1;40,40,2,2;80,60,4,4"}


def rejects(code: str, quoted: str, fn=spec_from_atc, /, *args, **kwargs) -> GearSpecError:
    """Call ``fn``; assert it raises exactly GearSpecError with ``code`` quoting ``quoted``."""
    with pytest.raises(GearSpecError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert type(err) is GearSpecError
    assert err.code == code, str(err)
    assert quoted in err.message, f"{quoted!r} not quoted in: {err.message}"
    return err


# ---- the documented example and the modes -------------------------------------------------------
def test_seed_000_dims_spec_maps_values_to_inputs_in_order() -> None:
    spec = gr.GearSpec.from_atc(**SEED000)
    assert spec.mode == "dims"
    assert spec.input_names == ("data", "label", "mask")
    assert spec.gears == ((20, 20, 1, 1), (40, 40, 2, 2), (80, 60, 4, 4))
    assert spec.shapes(0) == {"data": (1, 1, 40, 20), "label": (1, 20), "mask": (1, 1)}
    assert spec.shapes(2) == {"data": (1, 1, 40, 80), "label": (1, 60), "mask": (4, 4)}
    assert spec.full_dims(1) == (1, 1, 40, 40, 1, 40, 2, 2)


def test_batch_mode_puts_the_batch_on_every_n() -> None:
    spec = spec_from_atc("a:-1,3;b:-1,2;c:5", dynamic_batch_size="1,8,16")
    assert spec.mode == "batch" and spec.gears == ((1,), (8,), (16,))
    assert spec.shapes(1) == {"a": (8, 3), "b": (8, 2), "c": (5,)}


@pytest.mark.parametrize(("shape", "fmt", "expected"), [
    ("img:1,3,-1,-1", None, (1, 3, 32, 48)),
    ("img:1,3,-1,-1", "NCHW", (1, 3, 32, 48)),
    ("img:1,-1,-1,3", "NHWC", (1, 32, 48, 3)),
])
def test_image_size_mode_uses_the_h_and_w_axes_of_the_format(shape, fmt, expected) -> None:
    spec = spec_from_atc(shape, dynamic_image_size="16,16;32,48", input_format=fmt)
    assert spec.mode == "image_size" and spec.input_format == fmt
    assert spec.shapes(1)["img"] == expected


def test_zero_is_a_valid_gear_value_and_leading_zeros_read_as_numbers() -> None:
    spec = spec_from_atc("a:1,-1", dynamic_dims="0;08;16")
    assert spec.gears == ((0,), (8,), (16,))


def test_names_may_contain_colons_the_last_colon_splits() -> None:
    spec = spec_from_atc("ns:data:0:-1,4;x::2,-1", dynamic_dims="1,2;3,4")
    assert spec.input_names == ("ns:data:0", "x:")
    assert spec.input_shapes == ((-1, 4), (2, -1))


def test_scalar_input_is_written_name_colon_nothing() -> None:
    names, shapes = parse_input_shape("k:;a:-1")
    assert names == ("k", "a") and shapes == ((), (-1,))
    assert spec_from_atc("k:;a:-1", dynamic_dims="1;2").shapes(0) == {"k": (), "a": (1,)}


def test_whitespace_rules() -> None:
    # Stripped: whole values, ';' pieces (CANN docs write "20,20,1,1; 40,40,2,2"), names.
    spec = spec_from_atc("  a :1,-1; b:-1  ", dynamic_dims=" 1,2; 3,4 ;")
    assert spec.input_names == ("a", "b") and spec.gears == ((1, 2), (3, 4))
    # Rejected: whitespace inside a value list, as GE's digit checks do.
    rejects("E10001", "' 2'", spec_from_atc, "a:1,-1;b:-1", dynamic_dims="1, 2;3,4")
    rejects("E10002", "' 2'", spec_from_atc, "a:1, 2,-1", dynamic_dims="1;2")
    rejects("E10003", "' '", spec_from_atc, "a:-1", dynamic_batch_size="1, 2")


def test_empty_pieces_are_skipped_between_semicolons_and_in_batch_lists() -> None:
    assert spec_from_atc(";a:-1;;", dynamic_dims=";1;;2;").gears == ((1,), (2,))
    assert spec_from_atc("a:-1", dynamic_batch_size=",1,,2,").gears == ((1,), (2,))
    assert spec_from_atc("i:1,3,-1,-1", dynamic_image_size="1,2;;3,4;").gears == ((1, 2), (3, 4))


# ---- one test per rule / code -------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "code", "quoted"), [
    # E10035: fewer than 2 gears
    ({"input_shape": "a:1,-1", "dynamic_dims": "20"}, "E10035", "'20'"),
    ({"input_shape": "a:-1,3", "dynamic_batch_size": "8,"}, "E10035", "'8,'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16,16;"}, "E10035", "'16,16;'"),
    # E10039: duplicate gears (also after reading "08" as 8)
    ({"input_shape": "a:1,-1", "dynamic_dims": "20;20"}, "E10039", "[20]"),
    ({"input_shape": "a:-1", "dynamic_batch_size": "1,8,08"}, "E10039", "[8]"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16,16;16,16"}, "E10039", "[16, 16]"),
    # E10009: more than one gear option
    ({"input_shape": "a:-1", "dynamic_batch_size": "1,2", "dynamic_dims": "1;2"}, "E10009",
     "dynamic_batch_size and dynamic_dims"),
    ({"input_shape": "a:-1", "dynamic_image_size": "1,2;3,4", "dynamic_dims": ""}, "E10009",
     "dynamic_image_size and dynamic_dims"),
    # E10004: empty input_shape
    ({"input_shape": "", "dynamic_dims": "1;2"}, "E10004", "input_shape"),
    ({"input_shape": " ; ; ", "dynamic_dims": "1;2"}, "E10004", "input_shape"),
    # E10040: a shape range with gear options
    ({"input_shape": "a:1~4,-1", "dynamic_dims": "1;2"}, "E10040", "'a:1~4,-1'"),
    # E10002 / E10014 / E10013: input_shape values
    ({"input_shape": "a1,-1", "dynamic_dims": "1;2"}, "E10002", "'a1,-1'"),
    ({"input_shape": ":1,-1", "dynamic_dims": "1;2"}, "E10002", "':1,-1'"),
    ({"input_shape": "a:1.5,-1", "dynamic_dims": "1;2"}, "E10002", "'1.5'"),
    ({"input_shape": "a:1x,-1", "dynamic_dims": "1;2"}, "E10002", "'1x'"),
    ({"input_shape": "a:+1,-1", "dynamic_dims": "1;2"}, "E10002", "'+1'"),
    ({"input_shape": "a:-2,-1", "dynamic_dims": "1;2"}, "E10002", "'-2'"),
    ({"input_shape": "a:-0,-1", "dynamic_dims": "1;2"}, "E10002", "'-0'"),
    ({"input_shape": "a:x,-1", "dynamic_dims": "1;2"}, "E10014", "'x'"),
    ({"input_shape": "a:1,,-1", "dynamic_dims": "1;2"}, "E10014", "''"),
    ({"input_shape": "a:¹,-1", "dynamic_dims": "1;2"}, "E10014", "'¹'"),
    ({"input_shape": "a:99999999999999999999,-1", "dynamic_dims": "1;2"}, "E10013",
     "'99999999999999999999'"),
    ({"input_shape": "a:-1;a:-1", "dynamic_dims": "1,1;2,2"}, "E10001", "'a'"),
    # E10003: characters in batch / image values, format for image size, dims count
    ({"input_shape": "a:-1,3", "dynamic_batch_size": "1,x"}, "E10003", "'x'"),
    ({"input_shape": "a:-1,3", "dynamic_batch_size": "1;2"}, "E10003", "';'"),
    ({"input_shape": "a:-1,3", "dynamic_batch_size": "-1,2"}, "E10003", "'-'"),
    ({"input_shape": "a:-1,3", "dynamic_batch_size": "1.5,2"}, "E10003", "'.'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16,a;32,32"}, "E10003", "'a'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16,-16;32,32"}, "E10003", "'-'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16, 16;32,32"}, "E10003", "' 16'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16,16;32,32", "input_format": "ND"},
     "E10003", "'ND'"),
    ({"input_shape": "a:1,-1", "dynamic_dims": "1,2;3"}, "E10003", "'1,2'"),
    ({"input_shape": "a:-1,-1", "dynamic_dims": "1,2;3"}, "E10003", "'3'"),
    ({"input_shape": "a:-1,-1", "dynamic_dims": "1,2;3,,4"}, "E10003", "'3,,4'"),
    # E10012 / E10018 / E10031: batch mode shapes
    ({"input_shape": "k:;a:-1,3", "dynamic_batch_size": "1,2"}, "E10012", "'k'"),
    ({"input_shape": "a:-1,-1", "dynamic_batch_size": "1,2"}, "E10018", "'a'"),
    ({"input_shape": "a:1,-1;b:-1,2", "dynamic_batch_size": "1,2"}, "E10018", "'a'"),
    ({"input_shape": "a:1,3", "dynamic_batch_size": "1,2"}, "E10031", "'a:1,3'"),
    # E10019 / E10020: image size shapes and gear width
    ({"input_shape": "i:1,-1,-1", "dynamic_image_size": "1,2;3,4"}, "E10019", "'i'"),
    ({"input_shape": "i:-1,3,-1,-1", "dynamic_image_size": "1,2;3,4"}, "E10019", "'i'"),
    ({"input_shape": "i:1,-1,-1,3", "dynamic_image_size": "1,2;3,4"}, "E10019", "'i'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "1,2;3,4", "input_format": "NHWC"},
     "E10019", "'i'"),
    ({"input_shape": "i:1,3,4,4", "dynamic_image_size": "1,2;3,4"}, "E10019", "'i:1,3,4,4'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16,16,16;32,32"}, "E10020",
     "'16,16,16'"),
    ({"input_shape": "i:1,3,-1,-1", "dynamic_image_size": "16;32,32"}, "E10020", "'16'"),
    # E10001 / E10058: dims mode
    ({"input_shape": "a:1,3", "dynamic_dims": "1;2"}, "E10001", "'a:1,3'"),
    ({"input_shape": "a:-1,-1", "dynamic_dims": "1,x;2,3"}, "E10001", "'x'"),
    ({"input_shape": "a:1,-1", "dynamic_dims": "-1;2"}, "E10001", "'-1'"),
    ({"input_shape": "a:1,-1", "dynamic_dims": "1.0;2"}, "E10001", "'1.0'"),
    ({"input_shape": "a:1,-1", "dynamic_dims": "²;2"}, "E10001", "'²'"),
    ({"input_shape": "a:1,-1", "dynamic_dims": "99999999999999999999;2"}, "E10001",
     "'99999999999999999999'"),
    ({"input_shape": "a:1,-1", "dynamic_dims": ""}, "E10058", "''"),
    ({"input_shape": "a:1,-1", "dynamic_dims": " ;; "}, "E10058", "';;'"),
    # E10001: bad input_format
    ({"input_shape": "a:1,-1", "dynamic_dims": "1;2", "input_format": "nchw"}, "E10001",
     "'nchw'"),
])
def test_each_ge_rule_raises_its_code_and_quotes_the_text(kwargs, code, quoted) -> None:
    rejects(code, quoted, spec_from_atc, **kwargs)


def test_none_of_the_three_options_is_e10001_and_says_one_is_needed() -> None:
    err = rejects("E10001", "dynamic_dims", spec_from_atc, "a:-1,3")
    assert "exactly one" in err.message


def test_more_than_max_gears_is_e10036_and_max_gears_is_a_setting() -> None:
    many = ";".join(str(i) for i in range(1, 102))
    rejects("E10036", "101 gears", spec_from_atc, "a:1,-1", dynamic_dims=many)
    assert spec_from_atc("a:1,-1", dynamic_dims=many, max_gears=256).gear_count == 101
    assert spec_from_atc("a:-1", dynamic_batch_size="1,2,3", max_gears=3).gear_count == 3
    rejects("E10036", "at most 2", spec_from_atc, "a:-1", dynamic_batch_size="1,2,3",
            max_gears=2)
    assert gr.spec.DEFAULT_MAX_GEARS == 100


@pytest.mark.parametrize("bad", [1, 1.5, "100", True, None])
def test_max_gears_must_be_an_int_of_at_least_two(bad) -> None:
    rejects("E10001", repr(bad), spec_from_atc, "a:1,-1", dynamic_dims="1;2", max_gears=bad)


def test_ge_rule_order_decides_which_code_wins() -> None:
    # E10009 before anything about the values themselves.
    rejects("E10009", "dynamic_batch_size", spec_from_atc, "", dynamic_batch_size="x",
            dynamic_dims="y")
    # Batch: the input_shape checks (E10018/E10031) come before the character check E10003.
    rejects("E10031", "a:1,3", spec_from_atc, "a:1,3", dynamic_batch_size="x")
    # Image: shape check E10019 before characters E10003 before the pair count E10020.
    rejects("E10019", "'i'", spec_from_atc, "i:1,-1", dynamic_image_size="x")
    rejects("E10003", "'x'", spec_from_atc, "i:1,3,-1,-1", dynamic_image_size="1,2,3;x")
    # Dims: no -1 (E10001) before empty value (E10058); count (E10003) before digits (E10001).
    rejects("E10001", "a:1,3", spec_from_atc, "a:1,3", dynamic_dims="")
    rejects("E10003", "'x,y'", spec_from_atc, "a:1,-1", dynamic_dims="x,y;2")
    # Option checks before CheckDynamicParams: a bad value beats "fewer than 2 gears".
    rejects("E10001", "'x'", spec_from_atc, "a:1,-1", dynamic_dims="x")
    # CheckDynamicParams: E10035 before E10039 (one gear cannot be a duplicate).
    rejects("E10035", "'5'", spec_from_atc, "a:1,-1", dynamic_dims="5")


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"input_shape": 5, "dynamic_dims": "1;2"}, "input_shape"),
    ({"input_shape": "a:-1", "dynamic_dims": b"1;2"}, "dynamic_dims"),
    ({"input_shape": "a:-1", "dynamic_batch_size": ["1", "2"]}, "dynamic_batch_size"),
    ({"input_shape": "a:1,3,-1,-1", "dynamic_image_size": 3}, "dynamic_image_size"),
    ({"input_shape": "a:-1", "dynamic_dims": "1;2", "input_format": 1}, "input_format"),
    ({"input_shape": "a:-1", "dynamic_dims": "1;2", "hybrid": "yes"}, "hybrid"),
])
def test_non_string_arguments_are_gear_spec_errors(kwargs, name) -> None:
    rejects("E10001", name, spec_from_atc, **kwargs)


def test_hybrid_is_only_for_dims_mode() -> None:
    assert spec_from_atc("a:-1", dynamic_dims="1;2", hybrid=True).hybrid is True
    rejects("E10001", "dynamic_batch_size", spec_from_atc, "a:-1", dynamic_batch_size="1,2",
            hybrid=True)


# ---- check_gears: CheckDynamicParams on its own -------------------------------------------------
@pytest.mark.parametrize(("gears", "code", "quoted"), [
    ([(1,)], "E10035", "1 gear"),
    ([(1, 2), (3,)], "E10037", "[3]"),
    ([(1,), (-2,)], "E10038", "-2"),
    ([(1, 2), (1, 2)], "E10039", "[1, 2]"),
    ([(1,), ("x",)], "E10001", "x"),
    ([(1,), (2.5,)], "E10001", "2.5"),  # not truncated to 2
    ([(1,), ("3",)], "E10001", "'3'"),  # not parsed
    ([(1,), 2], "E10001", "2"),
])
def test_check_gears_codes(gears, code, quoted) -> None:
    rejects(code, quoted, check_gears, gears)


def test_check_gears_accepts_zero_and_returns_tuples() -> None:
    assert check_gears([[0, 1], [2, 3]]) == ((0, 1), (2, 3))
    rejects("E10036", "3 gears", check_gears, [(1,), (2,), (3,)], 2)


# ---- GearSpec's own cheap checks ----------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "code", "quoted"), [
    ({"gears": ((1,), (-1,))}, "E10038", "[-1]"),
    ({"gears": ((1,), (1,))}, "E10039", "[1]"),
    ({"gears": ((1, 2), (3, 4))}, "E10037", "[1, 2]"),
    ({"input_shapes": ((-2, -1),)}, "E10002", "'x'"),
    ({"input_shapes": ((1.5, -1),)}, "E10001", "1.5"),
    ({"input_shapes": (("3", -1),)}, "E10001", "'3'"),
    ({"gears": (1, 2)}, "E10001", "(1, 2)"),
    ({"input_names": "x"}, "E10001", "'x'"),
    ({"input_names": (1,)}, "E10001", "(1,)"),
    ({"input_names": ("x", "x"), "input_shapes": ((1, -1), (-1,)),
      "gears": ((1, 2), (3, 4))}, "E10001", "'x' twice"),
    ({"mode": "range"}, "E10001", "'range'"),
    ({"input_format": 3}, "E10001", "3"),
    ({"hybrid": "0"}, "E10001", "'0'"),
    ({"hybrid": 1}, "E10001", "hybrid must be a bool"),
])
def test_direct_construction_rejects_what_would_break_matching(kwargs, code, quoted) -> None:
    base = {"mode": "dims", "input_names": ("x",), "input_shapes": ((1, -1),),
            "gears": ((1,), (2,))}
    rejects(code, quoted, gr.GearSpec, **{**base, **kwargs})


def test_direct_construction_still_works_and_accepts_numpy_ints() -> None:
    spec = gr.GearSpec("dims", ["x"], [[np.int64(1), np.int32(-1)]], [[np.int64(4)], [8]])
    assert spec.input_shapes == ((1, -1),) and spec.gears == ((4,), (8,))
    assert all(type(v) is int for v in spec.input_shapes[0] + spec.gears[0])
    assert spec == spec_from_atc("x:1,-1", dynamic_dims="4;8")


# ---- GE options ---------------------------------------------------------------------------------
HYBRID = {"ge.inputShape": SEED000["input_shape"], "ge.dynamicDims": SEED000["dynamic_dims"],
          "ge.dynamicNodeType": "1", "ge.compileHybridMode": "1"}


def test_ge_options_give_the_same_spec_as_atc() -> None:
    opts = {"ge.inputShape": SEED000["input_shape"], "ge.dynamicDims": SEED000["dynamic_dims"],
            "ge.exec.precision_mode": "force_fp32"}
    assert gr.GearSpec.from_ge_options(opts) == gr.GearSpec.from_atc(
        **SEED000, precision_mode="force_fp32")  # the precision is the spec's too
    batch = spec_from_ge_options({"ge.inputShape": "a:-1,3", "ge.dynamicBatchSize": "1,4"})
    assert batch.mode == "batch" and batch.gears == ((1,), (4,))
    image = spec_from_ge_options({"ge.inputShape": "i:1,-1,-1,3", "ge.inputFormat": "NHWC",
                                  "ge.dynamicImageSize": "8,8;16,16"})
    assert image.mode == "image_size" and image.input_format == "NHWC"


def test_hybrid_is_recognised_exactly_when_all_four_conditions_hold() -> None:
    spec = spec_from_ge_options(HYBRID)
    assert spec.hybrid is True and spec.mode == "dims"
    assert spec_from_ge_options({k: f" {v} " for k, v in HYBRID.items()}).hybrid is True


@pytest.mark.parametrize(("key", "value"), [
    ("ge.dynamicNodeType", None), ("ge.dynamicNodeType", "0"), ("ge.dynamicNodeType", ""),
    ("ge.compileHybridMode", None), ("ge.compileHybridMode", "0"),
    ("ge.compileHybridMode", "true"), ("ge.compileHybridMode", "01"),
])
def test_hybrid_is_off_when_one_flag_is_missing_or_not_one(key, value) -> None:
    opts = dict(HYBRID)
    if value is None:
        del opts[key]
    else:
        opts[key] = value
    assert spec_from_ge_options(opts).hybrid is False


def test_hybrid_needs_input_shape_and_dynamic_dims() -> None:
    flags = {"ge.dynamicNodeType": "1", "ge.compileHybridMode": "1"}
    batch = spec_from_ge_options({"ge.inputShape": "a:-1", "ge.dynamicBatchSize": "1,2", **flags})
    assert batch.hybrid is False
    no_dims = {k: v for k, v in HYBRID.items() if k != "ge.dynamicDims"}
    rejects("E10001", "none of", spec_from_ge_options, no_dims)  # and then there is no spec
    no_shape = {k: v for k, v in HYBRID.items() if k != "ge.inputShape"}
    rejects("E10004", "input_shape", spec_from_ge_options, no_shape)


def test_ge_options_empty_value_is_unset_as_in_ge() -> None:
    opts = {"ge.inputShape": "a:-1", "ge.dynamicDims": "1;2", "ge.dynamicBatchSize": ""}
    assert spec_from_ge_options(opts).mode == "dims"


@pytest.mark.parametrize(("options", "code", "quoted"), [
    (["ge.inputShape"], "E10001", "list"),
    ({"ge.inputShape": "a:-1", "ge.dynamicDims": 12}, "E10001", "ge.dynamicDims"),
    ({"ge.inputShape": "a:-1", "ge.dynamicDims": "1;2", "ge.dynamicNodeType": 1}, "E10001",
     "ge.dynamicNodeType"),
    ({"ge.inputShape": "a:-1", "ge.dynamicDims": "1;2", "ge.inputFormat": "NCHW",
      "input_format": "NHWC"}, "E10001", "'NHWC'"),
    ({"ge.inputShape": "a:-1", "ge.dynamicDims": "1;2", "ge.dynamicBatchSize": "1,2"}, "E10009",
     "dynamic_batch_size and dynamic_dims"),
    ({"ge.inputShape": "a:-1", "ge.dynamicDims": "7"}, "E10035", "'7'"),
])
def test_ge_options_errors(options, code, quoted) -> None:
    rejects(code, quoted, spec_from_ge_options, options)


# ---- to_atc -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    SEED000,
    {"input_shape": "data:-1,3,224,224", "dynamic_batch_size": "1,8,16"},
    {"input_shape": "img:1,-1,-1,3", "dynamic_image_size": "224,224;448,448",
     "input_format": "NHWC"},
    {"input_shape": "k:;ns:x:-1,2", "dynamic_dims": "0;3", "input_format": "ND"},
])
def test_to_atc_round_trips(kwargs) -> None:
    spec = gr.GearSpec.from_atc(**kwargs)
    flags = spec.to_atc()
    assert gr.GearSpec.from_atc(**flags) == spec
    assert set(flags) == {"input_shape", *(k for k in kwargs if k != "input_shape")}


def test_to_atc_drops_hybrid_which_is_not_an_atc_flag() -> None:
    spec = spec_from_ge_options(HYBRID)
    assert spec_from_atc(**spec_to_atc(spec)) == dataclasses.replace(spec, hybrid=False)


@pytest.mark.parametrize(("spec", "code", "quoted"), [
    (gr.GearSpec("dims", ("a;b",), ((-1,),), ((1,), (2,))), "E10001", "'a;b'"),
    (gr.GearSpec("dims", (" a",), ((-1,),), ((1,), (2,))), "E10001", "' a'"),
    (gr.GearSpec("dims", ("a~b",), ((-1,),), ((1,), (2,))), "E10001", "'a~b'"),
    (gr.GearSpec("dims", ("a",), ((-1,),), ((1,),)), "E10035", "1 gear"),
    (gr.GearSpec("batch", ("a",), ((1, -1),), ((1,), (2,))), "E10018", "'a'"),
    (gr.GearSpec("image_size", ("a",), ((1, -1, -1, 3),), ((1, 1), (2, 2))), "E10019", "'a'"),
])
def test_to_atc_refuses_specs_that_would_not_read_back(spec, code, quoted) -> None:
    rejects(code, quoted, spec_to_atc, spec)


def test_to_atc_needs_a_gear_spec() -> None:
    rejects("E10001", "dict", spec_to_atc, {"input_shape": "a:-1"})


# ---- queries: shapes / full_dims / largest_shapes / gear_index ---------------------------------
def test_shapes_takes_numpy_integer_indices() -> None:
    spec = gr.GearSpec.from_atc(**SEED000)
    assert spec.shapes(np.int64(2)) == spec.shapes(2)
    assert spec.full_dims(np.int32(0)) == (1, 1, 40, 20, 1, 20, 1, 1)


@pytest.mark.parametrize(("index", "quoted"), [
    (3, "gear index 3 is out of range"), (-1, "gear index -1 is out of range"),
    (1.0, "1.0 is not an integer"), ("0", "'0' is not an integer"),
    (True, "True is not an integer"), (None, "None is not an integer"),
])
def test_shapes_and_full_dims_refuse_what_is_not_a_gear_index(index, quoted) -> None:
    spec = gr.GearSpec.from_atc(**SEED000)
    for query in (spec.shapes, spec.full_dims):
        with pytest.raises(gr.InputError) as info:
            query(index)
        assert type(info.value) is gr.InputError and info.value.code == "145000"
        assert quoted in info.value.message and "3 gears (0..2)" in info.value.message


def test_largest_shapes_of_a_spec_without_gears_is_a_spec_error() -> None:
    empty = gr.GearSpec("dims", ("x",), ((1, -1),), ())
    rejects("E10035", "no gears", empty.largest_shapes)
    with pytest.raises(gr.InputError, match="out of range: the spec has 0 gears$"):
        empty.shapes(0)


def test_gear_index_is_exact_and_never_guesses() -> None:
    spec = gr.GearSpec.from_atc(**SEED000)
    assert spec.gear_index((40, 40, 2, 2)) == 1
    assert spec.gear_index(np.array([80, 60, 4, 4], dtype=np.int64)) == 2
    assert spec.gear_index((40, 40, 2, 3)) is None  # no nearest gear
    assert spec.gear_index((40, 40, 2)) is None  # wrong length: no gear has it
    assert spec.gear_index(()) is None


@pytest.mark.parametrize("values", [
    (40.5, 40, 2, 2),  # would be truncated to gear 1 by int()
    (40.0, 40, 2, 2), ("40", "40", "2", "2"), "ab", b"\x14\x14\x01\x01", 20, None,
    np.array([40.0, 40.0, 2.0, 2.0]),
])
def test_gear_index_refuses_values_that_are_not_integers(values) -> None:
    spec = gr.GearSpec.from_atc(**SEED000)
    with pytest.raises(gr.InputError, match="gear values must be a sequence of integers") as info:
        spec.gear_index(values)
    assert type(info.value) is gr.InputError


def test_the_spec_package_exports_the_parsers() -> None:
    import gear_runtime.spec as spec_pkg
    for name in spec_pkg.__all__:
        assert getattr(spec_pkg, name) is not None, name
    assert spec_pkg.spec_from_atc == spec_pkg.GearSpec.from_atc
    assert spec_pkg.spec_from_config == spec_pkg.GearSpec.from_config
    assert spec_pkg.spec_from_atc("a:-1", dynamic_dims="1;2", hybrid=True).hybrid is True
