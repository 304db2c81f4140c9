"""Gear specs from ATC / MindSpore Lite config files, and back.

Three sections are recognised (any others, e.g. ``[acl_init_options]``, are ignored):

``[acl_build_options]`` (a Qwen prefill service's config_prefill.ini) and ``[ge_graph_options]``
    ATC or GE option names, values optionally in quotes::

        input_format="ND"
        input_shape="input_ids:1,-1;attention_mask:1,-1"
        ge.dynamicDims="32,32;512,512"

    Keys: ``input_shape`` / ``ge.inputShape``, ``dynamic_dims`` / ``ge.dynamicDims``,
    ``dynamic_batch_size`` / ``ge.dynamicBatchSize``, ``dynamic_image_size`` /
    ``ge.dynamicImageSize``, ``input_format`` / ``ge.inputFormat``, and the hybrid keys
    ``ge.dynamicNodeType`` / ``ge.compileHybridMode``. They are read exactly as GE options
    (:func:`gear_runtime.spec.parse.ge_option_fields`: an empty value is unset; hybrid
    needs all four of inputShape, dynamicDims, dynamicNodeType="1", compileHybridMode="1").

``[ascend_context]`` (MindSpore Lite converter)
    ``input_shape=input.1:[-1,3,224,224]`` (brackets optional, inputs separated by ``;``) and
    ``dynamic_dims=[1~4],[8],[16]``: each bracket group is one gear, ``a~b`` in a one-value
    group expands to every integer of [a, b] as separate gears (that example is 6 gears).
    For several -1 a group is ``[v1,v2,...]``; a range inside a multi-value group is REJECTED
    (E10001): neither "zip" nor "product" is documented by MindSpore Lite, and guessing would
    silently compile gears nobody asked for, so write such gears out. MindSpore Lite documents
    ascend_context ``dynamic_dims`` as "dynamic BatchSize and dynamic resolution", so the mode
    follows the shape: one value per gear with every -1 on dim 0 -> batch mode; two values per
    gear with every dynamic input 4-D and -1 exactly on H, W (``input_format``, NCHW default)
    -> image_size mode; anything else -> dims mode. ``dynamic_batch_size`` /
    ``dynamic_image_size`` keys (MindSpore Lite's older acl options) take ATC syntax. A value
    without any ``[`` is read as ATC syntax too.

The file is read with configparser: interpolation off, keys case-preserving, ``=`` the only
delimiter, duplicate sections/keys an error, ``[DEFAULT]`` an ordinary (ignored) section.
Exactly one recognised section may carry gear options. Every GE rule of
:func:`~gear_runtime.spec.parse.atc_fields` applies; every problem is a GearSpecError.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from typing import Any, cast

from gear_runtime.errors import GearSpecError
from gear_runtime.files import read_regular_file, reason
from gear_runtime.spec.parse import (
    _HW_AXES,
    _OPTION_OF_MODE,
    PRECISION_MODE_V2_KEYS,
    SpecFields,
    _check_max_gears,
    _fail,
    _gear_value,
    _gears_text,
    _hw_dynamic,
    _pieces,
    _q,
    atc_fields,
    atc_flags,
    ge_option_fields,
    parse_input_shape,
)
from gear_runtime.spec.rules import DEFAULT_MAX_GEARS, check_precision_mode

__all__ = ["SECTIONS", "config_fields", "config_sections", "config_text"]

#: The sections looked for, in this order.
SECTIONS: tuple[str, ...] = ("acl_build_options", "ascend_context", "ge_graph_options")

# ATC / GE spellings of the gear keys of [acl_build_options] / [ge_graph_options] -> GE key.
_GE_KEYS: dict[str, str] = {
    "input_shape": "ge.inputShape", "ge.inputShape": "ge.inputShape",
    "dynamic_dims": "ge.dynamicDims", "ge.dynamicDims": "ge.dynamicDims",
    "dynamic_batch_size": "ge.dynamicBatchSize", "ge.dynamicBatchSize": "ge.dynamicBatchSize",
    "dynamic_image_size": "ge.dynamicImageSize", "ge.dynamicImageSize": "ge.dynamicImageSize",
    "input_format": "ge.inputFormat", "ge.inputFormat": "ge.inputFormat",
    "ge.dynamicNodeType": "ge.dynamicNodeType",
    "ge.compileHybridMode": "ge.compileHybridMode",
}
_ASCEND_KEYS = ("input_shape", "dynamic_dims", "dynamic_batch_size", "dynamic_image_size",
                "input_format")
#: Where a config may set the precision (MindSpore Lite reads [acl_init_options] at init, the
#: seed's config sets ge.exec.precision_mode there, apart from the gear section), and how.
_PRECISION_SECTIONS = ("acl_init_options", "acl_build_options", "ascend_context",
                       "ge_session_options", "ge_graph_options")
_PRECISION_KEYS = ("precision_mode", "ge.exec.precision_mode")
# Keys whose presence makes a section "carry gear options" (every spelling of input_shape and
# of the three gear options; _ASCEND_KEYS spells them as _GE_KEYS does).
_GEAR_KEYS = frozenset(k for k, v in _GE_KEYS.items()
                       if v in ("ge.inputShape", "ge.dynamicDims", "ge.dynamicBatchSize",
                                "ge.dynamicImageSize"))

#: Largest config file read (they are a few hundred bytes; /dev/zero would never end).
MAX_CONFIG_BYTES = 2**20

_NO_DEFAULT_SECTION = "\x00gear_runtime: no DEFAULT section\x00"  # makes [DEFAULT] ordinary
_GROUPS = re.compile(r"\s*\[[^\[\]]*\]\s*(?:,\s*\[[^\[\]]*\]\s*)*")


# ---- reading ----------------------------------------------------------------------------------
def _read(path: object) -> tuple[str, configparser.ConfigParser]:
    """Read and ini-parse ``path``; GearSpecError for every way that can fail."""
    try:
        fspath = os.fspath(cast("str | os.PathLike[str]", path))  # else the TypeError below
    except TypeError:
        _fail("E10001", f"config path must be a str or os.PathLike, got {_q(path)}")
    name = os.fsdecode(fspath)
    try:
        raw = read_regular_file(fspath, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        _fail("E10001", f"config file {_q(name)} does not exist")
    except OSError as e:  # a FIFO, a device, a folder, a huge file, a NUL in the path
        _fail("E10001", f"config file {_q(name)} cannot be read: {reason(e)}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        _fail("E10001", f"config file {_q(name)} is not UTF-8 text: {e}")
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",), strict=True,
                                       default_section=_NO_DEFAULT_SECTION)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep key case
    try:
        parser.read_string(text, source=name)
    except configparser.Error as e:
        _fail("E10001", f"config file {_q(name)} is not a valid ini file: {e}")
    return name, parser


def _unquote(value: str | None) -> str:
    """Strip surrounding whitespace and one pair of matching quotes (a Qwen prefill
    service's converter config quotes its values)."""
    v = (value or "").strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        v = v[1:-1]
    return v.strip()


def config_fields(path: str | os.PathLike[str], max_gears: int = DEFAULT_MAX_GEARS,
                  ) -> SpecFields:
    """A spec's fields from an ATC / MindSpore Lite config file (see the module docstring for
    the forms).

    GearSpecError (with GE's code where GE has one, else E10001) when the file is missing or
    unreadable, is not ini, has none of :data:`SECTIONS` (the message lists them), has gear
    options in more than one of them, or holds gear options GE would reject.
    """
    _check_max_gears(max_gears)
    name, parser = _read(path)
    present = [s for s in SECTIONS if parser.has_section(s)]
    if not present:
        _fail("E10001", f"config file {_q(name)} has none of the sections {list(SECTIONS)} "
                        f"(found {parser.sections()})")
    carrying = [s for s in present if any(k in _GEAR_KEYS for k in parser[s])]
    if not carrying:
        _fail("E10001", f"config file {_q(name)}: section(s) {present} set none of "
                        f"{sorted(_GEAR_KEYS)}")
    if len(carrying) > 1:
        _fail("E10009", f"config file {_q(name)}: sections {carrying} both set gear options; "
                        "keep them in one section")
    section = carrying[0]
    items = {k: _unquote(v) for k, v in parser[section].items()}
    try:
        if section == "ascend_context":
            fields = _from_ascend_context(items, max_gears)
        else:
            fields = ge_option_fields(_ge_options(items), max_gears=max_gears)
    except GearSpecError as e:
        raise GearSpecError(f"config file {name!r} [{section}]: {e.message}",
                            code=e.code) from None
    return fields._replace(precision_mode=_precision(parser, name))


def config_without_gears(path: str | os.PathLike[str]) -> tuple[bool, str | None]:
    """Whether the config file at ``path`` sets no gear option at all (a static model's
    runtime config: the seed's decode step has its precision there and no gears), and the
    precision mode it sets (None: none). GearSpecError for a file it cannot read, or a
    precision it refuses."""
    name, parser = _read(path)
    gears = any(k in _GEAR_KEYS for s in SECTIONS if parser.has_section(s) for k in parser[s])
    return not gears, _precision(parser, name)


def config_sections(path: str | os.PathLike[str]) -> list[str]:
    """The sections of the config file at ``path``, read as :func:`config_fields` reads it
    (GearSpecError for a file it cannot read)."""
    return _read(path)[1].sections()


def _precision(parser: configparser.ConfigParser, name: str) -> str | None:
    """The precision mode a config sets in any of :data:`_PRECISION_SECTIONS` (None: none);
    E10001 when two places set different ones, or for precision_mode_v2 (see
    :data:`~gear_runtime.spec.parse.PRECISION_MODE_V2_KEYS`)."""
    found: dict[str, str] = {}
    for section in _PRECISION_SECTIONS:
        if not parser.has_section(section):
            continue
        for key, raw in parser[section].items():
            where = f"config file {_q(name)} [{section}] {key}"
            if key in PRECISION_MODE_V2_KEYS:
                _fail("E10001", f"{where}: precision_mode_v2 is not supported here (this "
                                "runtime reads precision_mode); write precision_mode instead")
            if key in _PRECISION_KEYS:
                value = check_precision_mode(_unquote(raw), where)
                if value is not None:
                    found[where] = value
    if len(set(found.values())) > 1:
        _fail("E10001", "the precision mode is set to different values: "
                        + ", ".join(f"{w} = {v!r}" for w, v in found.items()))
    return next(iter(found.values()), None)


def _ge_options(items: Mapping[str, str]) -> dict[str, str]:
    """[acl_build_options] / [ge_graph_options] keys -> GE options (both spellings accepted)."""
    out: dict[str, str] = {}
    source: dict[str, str] = {}
    for key, value in items.items():
        ge_key = _GE_KEYS.get(key)
        if ge_key is None:
            continue  # every other option (op_select_implmode, ...): not ours
        if ge_key in out:
            _fail("E10001", f"{key} and {source[ge_key]} both set {ge_key}; keep one")
        out[ge_key], source[ge_key] = value, key
    return out


# ---- [ascend_context] -------------------------------------------------------------------------
def _ascend_input_shape(text: str) -> str:
    """``name:[d,...];...`` -> ATC ``name:d,...;...`` (entries without brackets kept)."""
    entries = []
    for entry in _pieces(text):
        name, colon, dims = entry.rpartition(":")
        dims = dims.strip()
        if colon and len(dims) >= 2 and dims[0] == "[" and dims[-1] == "]":
            dims = dims[1:-1]
        entries.append(f"{name}{colon}{dims}")
    return ";".join(entries)


def _ascend_number(value: str, item: str) -> int:
    n = _gear_value(item)
    if n is None:
        _fail("E10001", f"dynamic_dims {_q(value)}: {_q(item)} is not a non-negative integer "
                        "written in digits")
    return n


def _ascend_gears(value: str, max_gears: int) -> list[tuple[int, ...]]:
    """``[1~4],[8],[16]`` / ``[64,64],[96,128]`` -> gears, ranges expanded (bounded first)."""
    if not _GROUPS.fullmatch(value):
        _fail("E10001", f"dynamic_dims {_q(value)} is not a list of bracket groups; expected "
                        "e.g. \"[1~4],[8],[16]\" or \"[64,64],[96,128]\"")
    gears: list[tuple[int, ...]] = []
    for group in re.findall(r"\[([^\[\]]*)\]", value):
        items = [s.strip() for s in group.split(",")]
        ranged = [s for s in items if "~" in s]
        if ranged and len(items) > 1:
            _fail("E10001", f"dynamic_dims {_q(value)}: group {_q('[' + group + ']')} mixes a "
                            "range with other values; a range a~b is only allowed alone in its "
                            "group, write multi-value gears out one by one")
        if not ranged:
            gears.append(tuple(_ascend_number(value, s) for s in items))
            continue
        lo_text, _, hi_text = items[0].partition("~")
        lo = _ascend_number(value, lo_text.strip())
        hi = _ascend_number(value, hi_text.strip())
        if lo > hi:
            _fail("E10001", f"dynamic_dims {_q(value)}: range {_q(items[0])} is empty; expected "
                            "a~b with a <= b")
        if len(gears) + hi - lo + 1 > max_gears:  # bound BEFORE expanding ([1~10**18])
            _fail("E10036", f"dynamic_dims {_q(value)}: range {_q(items[0])} expands to "
                            f"{hi - lo + 1} gears; at most {max_gears} are supported "
                            "(max_gears)")
        gears.extend((v,) for v in range(lo, hi + 1))
    return gears


def _ascend_mode(shapes: tuple[tuple[int, ...], ...], width: int, input_format: str) -> str:
    """MindSpore Lite's reading of ascend_context dynamic_dims: batch, image size or dims."""
    dynamic = [s for s in shapes if -1 in s]
    if width == 1 and all(d != -1 or axis == 0 for s in dynamic for axis, d in enumerate(s)):
        return "batch"
    hw = _HW_AXES.get(input_format or "NCHW")
    if width == 2 and hw is not None and all(_hw_dynamic(s, hw) for s in dynamic):
        return "image_size"
    return "dims"


def _from_ascend_context(items: Mapping[str, str], max_gears: int) -> SpecFields:
    args = {k: items[k] for k in _ASCEND_KEYS if items.get(k)}  # empty = unset, as in GE
    shape = _ascend_input_shape(args.pop("input_shape", ""))
    dims = args.get("dynamic_dims")
    if dims is not None and "[" in dims:
        others = [k for k in ("dynamic_batch_size", "dynamic_image_size") if k in args]
        if others:  # same rule and code as atc_fields, before any further parsing
            _fail("E10009", f"dynamic_dims and {others[0]} are both set; they are mutually "
                            "exclusive")
        gears = _ascend_gears(dims, max_gears)
        if shape and "~" not in shape:  # else atc_fields reports E10004 / E10040 below
            _, shapes = parse_input_shape(shape)
            width = len(gears[0]) if gears else 0
            mode = _ascend_mode(shapes, width, args.get("input_format", ""))
            del args["dynamic_dims"]
            key = _OPTION_OF_MODE[mode]
            try:
                return atc_fields(shape, max_gears=max_gears, hybrid=False, **args,
                                  **{key: _gears_text(mode, gears)})
            except GearSpecError as e:  # quote what the user wrote, not only our translation
                raise GearSpecError(f"dynamic_dims {_q(dims)}, read as {key}: {e.message}",
                                    code=e.code) from None
    return atc_fields(shape, max_gears=max_gears, hybrid=False, **args)


# ---- writing ----------------------------------------------------------------------------------
def config_text(spec: Any) -> str:
    """Ini text that :func:`config_fields` reads back as ``spec`` (hybrid included; pass
    ``max_gears`` when reading a spec of more than DEFAULT_MAX_GEARS gears).

    A non-hybrid spec is written as ``[acl_build_options]`` in that prefill config's style (quoted
    values, ``ge.dynamicDims`` for dims mode); a hybrid spec as ``[ge_graph_options]`` with
    the two hybrid keys. GearSpecError when the spec cannot be written (see
    :func:`~gear_runtime.spec.parse.atc_flags`; also names with non-printable characters,
    which an ini line cannot hold, and hybrid outside dims mode, which GE cannot express).
    """
    atc = atc_flags(spec)  # validates names and the round trip of the values themselves
    bad = next((n for n in spec.input_names if not n.isprintable()), None)
    if bad is not None:
        _fail("E10001", f"input name {_q(bad)} has a non-printable character; a config line "
                        "cannot hold it")
    if spec.hybrid:
        if spec.mode != "dims":
            _fail("E10001", f"a hybrid spec must be in dims mode to be written (GE recognises "
                            f"hybrid only with ge.dynamicDims), got mode {spec.mode!r}")
        lines = ["[ge_graph_options]"]
        if spec.input_format is not None:
            lines.append(f'ge.inputFormat="{spec.input_format}"')
        if spec.precision_mode is not None:
            lines.append(f'ge.exec.precision_mode="{spec.precision_mode}"')
        lines += [f'ge.inputShape="{atc["input_shape"]}"',
                  f'ge.dynamicDims="{atc["dynamic_dims"]}"',
                  'ge.dynamicNodeType="1"', 'ge.compileHybridMode="1"']
    else:
        key = _OPTION_OF_MODE[spec.mode]
        written = "ge.dynamicDims" if key == "dynamic_dims" else key
        lines = ["[acl_build_options]"]
        if spec.input_format is not None:
            lines.append(f'input_format="{spec.input_format}"')
        if spec.precision_mode is not None:
            lines.append(f'precision_mode="{spec.precision_mode}"')
        lines += [f'input_shape="{atc["input_shape"]}"', f'{written}="{atc[key]}"']
    return "\n".join(lines) + "\n"
