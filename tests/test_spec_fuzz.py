"""Property tests: random valid specs round-trip; arbitrary text only ever gives GearSpecError.

Every parser entry point is fed arbitrary unicode text and text built from the parser's own
alphabet; the only allowed outcomes are a GearSpec (which must then round-trip through
to_atc) or a GearSpecError carrying a code. Kept to a few seconds in all.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gear_runtime.errors import GearSpecError
from gear_runtime.spec import (
    GearSpec,
    spec_from_atc,
    spec_from_config,
    spec_from_ge_options,
    spec_to_atc,
    spec_to_config,
)

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
ALPHABET = "0123456789-,;:~[] \nab"
ATC_ARGS = ("input_shape", "dynamic_batch_size", "dynamic_image_size", "dynamic_dims",
            "input_format")
GE_KEYS = ("ge.inputShape", "ge.dynamicDims", "ge.dynamicBatchSize", "ge.dynamicImageSize",
           "ge.inputFormat", "input_format", "ge.dynamicNodeType", "ge.compileHybridMode")

texts = st.one_of(st.text(max_size=60), st.text(alphabet=ALPHABET, max_size=60))


# ---- random valid specs -------------------------------------------------------------------------
names_st = st.text(alphabet="abcxyz_.:0123456789/", min_size=1, max_size=8)


@st.composite
def valid_specs(draw: st.DrawFn) -> GearSpec:
    mode = draw(st.sampled_from(["dims", "batch", "image_size"]))
    names = draw(st.lists(names_st, min_size=1, max_size=4, unique=True))
    static = st.integers(0, 64)
    fmt = None
    if mode == "dims":
        shapes = [draw(st.lists(st.one_of(st.just(-1), static), max_size=4)) for _ in names]
        if not any(-1 in s for s in shapes):
            shapes[0] = [*shapes[0], -1]
        width = sum(s.count(-1) for s in shapes)
        fmt = draw(st.sampled_from([None, "ND", "NCHW"]))
    elif mode == "batch":
        shapes = [[draw(st.sampled_from([-1, 1, 4])),
                   *draw(st.lists(static, max_size=3))] for _ in names]
        shapes[0][0] = -1
        width = 1
    else:
        fmt = draw(st.sampled_from([None, "NCHW", "NHWC"]))
        h, w = (1, 2) if fmt == "NHWC" else (2, 3)
        shapes = []
        for i in range(len(names)):
            s = [draw(static) for _ in range(4)]
            if i == 0 or draw(st.booleans()):
                s[h] = s[w] = -1
            shapes.append(s)
        width = 2
    gears = draw(st.lists(st.tuples(*[st.integers(0, 5000)] * width), min_size=2, max_size=12,
                          unique=True))
    hybrid = mode == "dims" and draw(st.booleans())
    return GearSpec(mode, names, shapes, gears, hybrid=hybrid, input_format=fmt)


@FUZZ
@given(spec=valid_specs())
def test_random_valid_specs_round_trip_through_to_atc(spec: GearSpec) -> None:
    flags = spec_to_atc(spec)
    back = GearSpec.from_atc(**flags)
    assert back.mode == spec.mode and back.gears == spec.gears
    assert back.input_names == spec.input_names and back.input_shapes == spec.input_shapes
    assert back.input_format == spec.input_format and back.hybrid is False
    for i in range(spec.gear_count):
        assert back.shapes(i) == spec.shapes(i)


@FUZZ
@given(spec=valid_specs())
def test_random_valid_specs_round_trip_through_to_config(spec: GearSpec, tmp_path: Path) -> None:
    path = tmp_path / "spec.ini"
    path.write_text(spec_to_config(spec), encoding="utf-8")
    assert GearSpec.from_config(str(path)) == spec


# ---- arbitrary text -----------------------------------------------------------------------------
def only_spec_errors(fn, *args, **kwargs) -> GearSpec | None:
    """Run a parser: a GearSpec comes back (and must round-trip) or a GearSpecError with a code."""
    try:
        spec = fn(*args, **kwargs)
    except GearSpecError as err:
        assert type(err) is GearSpecError and err.code.startswith("E1"), repr(err)
        assert str(err)  # the message renders
        return None
    assert isinstance(spec, GearSpec)
    flags = spec_to_atc(spec)  # anything that parses can be written back ...
    assert spec_from_atc(**flags, max_gears=max(spec.gear_count, 2)) == \
        GearSpec(spec.mode, spec.input_names, spec.input_shapes, spec.gears,
                 input_format=spec.input_format)  # ... and reads back the same
    return spec


@pytest.mark.parametrize("arg", ATC_ARGS)
@FUZZ
@given(text=texts)
def test_arbitrary_text_in_one_atc_argument(arg: str, text: str) -> None:
    base = {"input_shape": "a:1,-1;b:-1,-1,3", "dynamic_dims": "1,2,3;4,5,6"}
    if arg in ("dynamic_batch_size", "dynamic_image_size"):
        base = {"input_shape": "i:-1,3,-1,-1" if arg == "dynamic_batch_size" else "i:1,3,-1,-1"}
    only_spec_errors(spec_from_atc, **{**base, arg: text})


@FUZZ
@given(shape=texts, mode=st.sampled_from(ATC_ARGS[1:4]), value=texts, fmt=st.none() | texts)
def test_arbitrary_text_in_every_atc_argument(shape: str, mode: str, value: str,
                                              fmt: str | None) -> None:
    only_spec_errors(spec_from_atc, shape, **{mode: value}, input_format=fmt)


@FUZZ
@given(shape=st.text(alphabet="0123456789-,;:ab", max_size=30),
       gears=st.text(alphabet="0123456789,;", max_size=30),
       mode=st.sampled_from(ATC_ARGS[1:4]))
def test_near_valid_text_parses_or_is_rejected_cleanly(shape: str, gears: str, mode: str) -> None:
    # A narrow alphabet reaches the deep rules (counts, duplicates, modes) far more often.
    only_spec_errors(spec_from_atc, shape, **{mode: gears})


# Token-level text: a well-formed spec for a random mode with at most one mutated token, so
# that generated text often parses (exercising the round trip in only_spec_errors) and often
# misses by exactly one rule (exercising each check on its own).
GOOD_VALUES = st.sampled_from(["1", "2", "3", "08", "0", "16", "64"])
BAD_TOKENS = st.sampled_from(["", "x", "-2", " 4", "1.5", "-1", "a", "+1", "1~2", "²", ";", ","])


@st.composite
def token_specs(draw: st.DrawFn) -> dict[str, str | None]:
    mode = draw(st.sampled_from(ATC_ARGS[1:4]))
    names = draw(st.lists(st.sampled_from(["a", "b", "c:d", "x.1", "n/2"]), min_size=1,
                          max_size=3, unique=True))
    if mode == "dynamic_dims":
        shapes = [draw(st.lists(st.sampled_from(["-1", "1", "3", "16"]), max_size=4))
                  for _ in names]
        width = sum(s.count("-1") for s in shapes)
    elif mode == "dynamic_batch_size":
        shapes = [["-1", *draw(st.lists(st.sampled_from(["3", "16"]), max_size=3))]
                  for _ in names]
        width = 1
    else:
        shapes = [["1", "3", "-1", "-1"] for _ in names]
        width = 2
    gears = [draw(st.lists(GOOD_VALUES, min_size=width, max_size=width))
             for _ in range(draw(st.integers(1, 5)))]
    fmt = draw(st.sampled_from([None, "NCHW", "ND"] if mode != "dynamic_image_size"
                               else [None, "NCHW"]))
    what = draw(st.sampled_from(["none", "none", "dim", "value", "drop", "dup", "name", "fmt"]))
    if what == "dim" and any(shapes):
        row = draw(st.sampled_from([s for s in shapes if s]))
        row[draw(st.integers(0, len(row) - 1))] = draw(BAD_TOKENS)
    elif what == "value" and width:
        gears[0][draw(st.integers(0, width - 1))] = draw(BAD_TOKENS)
    elif what == "drop" and width:
        gears[-1].pop()
    elif what == "dup":
        gears.append(list(gears[0]))
    elif what == "name":
        names[0] = draw(st.sampled_from(["", " ", "a;b", names[-1]]))
    elif what == "fmt":
        fmt = draw(st.sampled_from(["NHWC", "X", "", "nchw"]))
    shape = ";".join(f"{n}:{','.join(s)}" for n, s in zip(names, shapes, strict=True))
    sep = "," if mode == "dynamic_batch_size" else ";"
    return {"input_shape": shape, mode: sep.join(",".join(g) for g in gears),
            "input_format": fmt}


@FUZZ
@given(kwargs=token_specs())
def test_token_level_specs_parse_or_are_rejected_cleanly(kwargs: dict) -> None:
    only_spec_errors(spec_from_atc, **kwargs)


@FUZZ
@given(options=st.dictionaries(st.sampled_from(GE_KEYS) | st.text(max_size=5),
                               texts | st.integers() | st.none() | st.binary(max_size=4),
                               max_size=6))
def test_arbitrary_ge_options(options: dict) -> None:
    only_spec_errors(spec_from_ge_options, options)


SECTION_HEADERS = ("", "[acl_build_options]\n", "[ascend_context]\n", "[ge_graph_options]\n")
KEY_LINES = st.sampled_from(["input_shape=", "dynamic_dims=", "ge.dynamicDims=",
                             "dynamic_batch_size=", "dynamic_image_size=", "input_format=",
                             "ge.inputShape=", "ge.dynamicNodeType=1\nge.compileHybridMode="])


@st.composite
def config_texts(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.text(max_size=80)).encode("utf-8", "surrogatepass")
    if kind == 1:
        return draw(st.binary(max_size=60))
    body = "".join(f"{draw(KEY_LINES)}{draw(texts)}\n" for _ in range(draw(st.integers(0, 3))))
    return (draw(st.sampled_from(SECTION_HEADERS)) + body
            + draw(st.text(alphabet=ALPHABET + "=", max_size=40))).encode("utf-8",
                                                                       "surrogatepass")


_file_ids = itertools.count()


@FUZZ
@given(data=config_texts())
def test_arbitrary_config_files(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / f"fuzz_{next(_file_ids)}.ini"  # tmp_path is shared by all examples
    path.write_bytes(data)
    only_spec_errors(spec_from_config, path)
