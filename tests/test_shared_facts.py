"""Facts the C++ core and the Python package both state, kept equal: the GE codes and error
kinds the core raises (csrc/errors.h vs gear_runtime/errors.py), the largest gear value
(csrc/gear_table.h vs gear_runtime/spec/rules.py).

The headers are read as text: each fact has its home in the language that uses it, and a
change on one side fails here until the other follows.
"""

from __future__ import annotations

import re
from pathlib import Path

import gear_runtime.errors as errors
from gear_runtime.spec.rules import MAX_GEAR_VALUE

CSRC = Path(__file__).resolve().parent.parent / "csrc"


def constants(header: str, kind: str) -> dict[str, str]:
    """``inline constexpr <kind> kName = value;`` of a header: name -> value text."""
    text = (CSRC / header).read_text()
    pattern = rf"inline constexpr {kind}\s+(k\w+)\s*=\s*([^;]+);"
    return {m[1]: m[2].strip().strip('"') for m in re.finditer(pattern, text)}


def test_the_cores_codes_are_the_packages() -> None:
    codes = constants("errors.h", r"const char\*")
    assert codes["kCodeParamInvalid"] == errors.ACL_ERROR_GE_PARAM_INVALID
    assert codes["kCodeInputLength"] == errors.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
    assert codes["kCodeGearMismatch"] == errors.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert {k for k in codes if k.startswith("kCode")} == {
        "kCodeParamInvalid", "kCodeInputLength", "kCodeGearMismatch"}


def test_the_cores_kinds_are_exactly_the_packages() -> None:
    """Every kind the core raises maps to its class, and the table holds no other."""
    kinds = {v for k, v in constants("errors.h", r"const char\*").items()
             if k.startswith("kKind")}
    assert kinds == set(errors.KINDS)
    assert errors.KINDS["input"] is errors.InputError
    assert errors.KINDS["length"] is errors.DynamicInputLengthError
    assert errors.KINDS["mismatch"] is errors.GearMismatchError
    assert errors.KINDS["spec"] is errors.GearSpecError
    for kind, cls in errors.KINDS.items():
        assert type(errors.make_error(kind, "m")) is cls


def test_the_largest_gear_value_is_one_number() -> None:
    assert int(constants("gear_table.h", "int64_t")["kMaxGearValue"]) == MAX_GEAR_VALUE
