"""GearSpec: the gears of a model, in GE's terms, independent of where they were written.

A spec is what ATC's ``--input_shape`` + one of ``--dynamic_batch_size`` /
``--dynamic_image_size`` / ``--dynamic_dims`` say (or the same in GE options or a config
file): the inputs in ``user_designate_shape_order`` with their shapes (``-1`` on dynamic
axes) and the list of gears, each a tuple of the dynamic values in GE order.

How a gear's values land on the inputs (GE's ParserDataToDynamicInfo) is precomputed once in
:attr:`GearSpec.dynamic_positions`, so every later stage (compiler, C++ core, executor) reads
the same mapping instead of re-deriving it.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gear_runtime.errors import GearSpecError, InputError
from gear_runtime.spec import config, parse
from gear_runtime.spec.rules import (
    DEFAULT_MAX_GEARS,
    MAX_DIM,
    MODES,
    OUT_OF_RANGE_CODE,
    STATIC_GEARS,
    Mode,
    check_gear_rows,
    check_precision_mode,
    gear_number,
    int_rows,
    iter_or_fail,
)


@dataclass(frozen=True)
class GearSpec:
    """The gears of a model.

    Attributes:
        mode: ``"batch"``, ``"image_size"`` or ``"dims"``.
        input_names: inputs in ``user_designate_shape_order`` (the order of input_shape).
        input_shapes: each input's shape with ``-1`` on its dynamic axes, same order.
        gears: each gear's dynamic values in GE order: ``(n,)`` in batch mode, ``(h, w)`` in
            image-size mode, one value per ``-1`` of input_shape (input order, then axis
            order) in dims mode.
        hybrid: GE's hybrid mode was asked for (ge.dynamicNodeType == "1" and
            ge.compileHybridMode == "1"): a miss runs the dynamic-shape graph.
        input_format: the ATC ``--input_format`` when given (``"NCHW"``, ``"NHWC"``, ``"ND"``).
        precision_mode: GE's ``precision_mode`` when given (one of
            :data:`~gear_runtime.spec.rules.PRECISION_MODES`); None: not given (GE's own
            default for an .om is force_fp16; the CPU backends run float32). Each backend
            applies it or says what it does instead (docs/precision.md).
        dynamic_positions: derived, not passed: ``(input index, axis, index into the gear
            tuple)`` for every ``-1`` of input_shapes, in input order then axis order.
    """

    mode: Mode
    input_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    gears: tuple[tuple[int, ...], ...]
    hybrid: bool = False
    input_format: str | None = None
    precision_mode: str | None = None
    dynamic_positions: tuple[tuple[int, int, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Cheap checks only (one pass over the values): what the parsers validate with GE's full
        # rules is re-checked here just enough that a directly built spec cannot hold values
        # that would break matching (negative or duplicate gears, duplicate input names) or
        # crash later stages.
        if self.mode not in MODES:
            raise GearSpecError(f"mode {self.mode!r} is not one of {MODES}", code="E10001")
        if isinstance(self.input_names, str) or not all(
                isinstance(n, str) for n in iter_or_fail(self.input_names, "input_names")):
            raise GearSpecError(f"input_names must be a sequence of str, got {self.input_names!r}",
                                code="E10001")
        object.__setattr__(self, "input_names", tuple(self.input_names))
        if len(set(self.input_names)) != len(self.input_names):  # shapes() would drop one
            dup = next(n for i, n in enumerate(self.input_names) if n in self.input_names[:i])
            raise GearSpecError(f"input_names names input {dup!r} twice; each input may appear "
                                "once", code="E10001")
        object.__setattr__(self, "input_shapes", int_rows(self.input_shapes, "input_shapes"))
        object.__setattr__(self, "gears", int_rows(self.gears, "gears"))
        if not isinstance(self.hybrid, bool):  # bool("0") is True: no silent hybrid mode
            raise GearSpecError(f"hybrid must be a bool, got {self.hybrid!r}", code="E10001")
        if self.input_format is not None and not isinstance(self.input_format, str):
            raise GearSpecError(f"input_format must be a str or None, got {self.input_format!r}",
                                code="E10001")
        object.__setattr__(self, "precision_mode", check_precision_mode(self.precision_mode))
        if len(self.input_names) != len(self.input_shapes):
            raise GearSpecError(
                f"{len(self.input_names)} input names but {len(self.input_shapes)} shapes",
                code="E10001")
        for name, shape in zip(self.input_names, self.input_shapes, strict=True):
            if any(d < -1 for d in shape):
                raise GearSpecError(f"input {name!r} shape {list(shape)}: dims must be >= 0 or "
                                    "-1 (dynamic)", code="E10002")
            big = next((d for d in shape if d > MAX_DIM), None)
            if big is not None:
                raise GearSpecError(f"input {name!r} shape {list(shape)}: dim {big} is out of "
                                    f"int64 range (at most {MAX_DIM})", code=OUT_OF_RANGE_CODE)
        object.__setattr__(self, "dynamic_positions", _dynamic_positions(self))
        if self.mode == "static":
            _check_static(self)
        width = self.values_per_gear
        check_gear_rows(self.gears, width,
                         f"{self.mode} mode over this input_shape needs {width}", "gears")

    # ---- derived facts -------------------------------------------------------------------
    @property
    def gear_count(self) -> int:
        return len(self.gears)

    @property
    def values_per_gear(self) -> int:
        """Length of one gear tuple (and of the ``ascend_mbatch_shape_data`` buffer)."""
        if not self.dynamic_positions:
            return 0
        return max(v for _, _, v in self.dynamic_positions) + 1

    def shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        """Every input's full static shape in gear ``i`` (input order).

        InputError (as ``GearModel.gear_of``) when ``i`` is not a gear index: out of range,
        negative, a bool or not an integer.
        """
        return self.shapes_for(self.gears[self.gear_number(i)])

    def shapes_for(self, values: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """Every input's full shape for the dynamic ``values`` (a gear's, or any request's:
        what a padded request or a planned gear has), input order. InputError unless
        ``values`` are :attr:`values_per_gear` integers."""
        try:
            if isinstance(values, str | bytes | bytearray):
                raise TypeError
            given = tuple(operator.index(v) for v in values)
        except TypeError:
            raise InputError(f"dynamic values must be a sequence of integers, got {values!r}"
                             ) from None
        if len(given) != self.values_per_gear:
            raise InputError(f"dynamic values {given} have {len(given)} values, the spec's "
                             f"gears have {self.values_per_gear}")
        shapes = [list(s) for s in self.input_shapes]
        for inp, axis, v in self.dynamic_positions:
            shapes[inp][axis] = given[v]
        return {n: tuple(s) for n, s in zip(self.input_names, shapes, strict=True)}

    def full_dims(self, i: int) -> tuple[int, ...]:
        """Gear ``i`` as aclmdlGetInputDynamicDims gives it: all input shapes flattened.
        InputError when ``i`` is not a gear index (see :meth:`shapes`)."""
        return tuple(d for s in self.shapes(i).values() for d in s)

    def largest_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per input, the element-wise max over gears: what GE sizes the Data inputs to.
        GearSpecError (E10035) for a directly built spec without gears."""
        if not self.gears:
            raise GearSpecError("the spec has no gears, so its inputs have no largest shapes",
                                code="E10035")
        out: dict[str, list[int]] = {n: list(s) for n, s in self.shapes(0).items()}
        for i in range(1, len(self.gears)):
            for n, s in self.shapes(i).items():
                out[n] = [max(a, b) for a, b in zip(out[n], s, strict=True)]
        return {n: tuple(s) for n, s in out.items()}

    def gear_index(self, values: Sequence[int]) -> int | None:
        """Index of the gear with exactly these dynamic values, or None (no fallback; values
        of the wrong length match no gear). InputError when ``values`` is not a sequence of
        integers: 20.5 is refused, not truncated to gear 20 (numpy integers are fine)."""
        try:
            if isinstance(values, (str, bytes, bytearray)):  # iterable, but not of gear values
                raise TypeError
            key = tuple(operator.index(v) for v in values)
        except TypeError:
            raise InputError(f"gear values must be a sequence of integers (one per dynamic "
                             f"value, {self.values_per_gear} here), got {values!r}") from None
        try:
            return self.gears.index(key)
        except ValueError:
            return None

    def gear_number(self, i: object, owner: str = "spec") -> int:
        """``i`` as an index into :attr:`gears`; InputError when it is not one (see
        :func:`gear_number`; ``owner`` names what has the gears in the message)."""
        return gear_number(i, len(self.gears), owner)

    # ---- constructors (the parsers live in gear_runtime.spec.parse / .config) -------------
    @classmethod
    def static(cls, input_names: Sequence[str],
               input_shapes: Sequence[Sequence[int]]) -> GearSpec:
        """The spec of a model with no dynamic axis: mode ``"static"``, one gear ``()``,
        every input at exactly its shape (GearSpecError for a ``-1``)."""
        return cls("static", tuple(input_names), tuple(tuple(s) for s in input_shapes),
                   STATIC_GEARS)

    @classmethod
    def from_atc(cls, input_shape: str, dynamic_batch_size: str | None = None,
                 dynamic_image_size: str | None = None, dynamic_dims: str | None = None,
                 input_format: str | None = None, max_gears: int = DEFAULT_MAX_GEARS,
                 hybrid: bool = False, precision_mode: str | None = None) -> GearSpec:
        """Spec from ATC flag values, validated with GE's rules, codes and order
        (:func:`gear_runtime.spec.parse.atc_fields`)."""
        return cls(*parse.atc_fields(input_shape, dynamic_batch_size=dynamic_batch_size,
                                     dynamic_image_size=dynamic_image_size,
                                     dynamic_dims=dynamic_dims, input_format=input_format,
                                     max_gears=max_gears, hybrid=hybrid,
                                     precision_mode=precision_mode))

    @classmethod
    def from_ge_options(cls, options: Mapping[str, str], max_gears: int = DEFAULT_MAX_GEARS,
                        ) -> GearSpec:
        """Spec from GE session/graph options (ge.inputShape, ge.dynamicDims, ...):
        :func:`gear_runtime.spec.parse.ge_option_fields`."""
        return cls(*parse.ge_option_fields(options, max_gears=max_gears))

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], max_gears: int = DEFAULT_MAX_GEARS,
                    ) -> GearSpec:
        """Spec from an ATC / MindSpore Lite config file (:mod:`gear_runtime.spec.config`)."""
        return cls(*config.config_fields(path, max_gears=max_gears))

    def to_atc(self) -> dict[str, str]:
        """The ATC flags that give back this spec: ``GearSpec.from_atc(**spec.to_atc())``
        (hybrid is not an ATC flag: it is dropped; :meth:`to_config` keeps it). GearSpecError
        when the spec cannot be written so that it reads back the same."""
        return parse.atc_flags(self)

    def to_config(self) -> str:
        """Ini text that :meth:`from_config` reads back as this spec (hybrid included)."""
        return config.config_text(self)

    def fields(self) -> parse.SpecFields:
        """What a parser returns for this spec (the constructor's arguments)."""
        return parse.SpecFields(self.mode, self.input_names, self.input_shapes, self.gears,
                                self.hybrid, self.input_format, self.precision_mode)


# The parsers as functions, for callers that want them so (``gear_runtime.spec`` exports them).
spec_from_atc = GearSpec.from_atc
spec_from_ge_options = GearSpec.from_ge_options
spec_from_config = GearSpec.from_config


def spec_to_atc(spec: GearSpec) -> dict[str, str]:
    """:meth:`GearSpec.to_atc` as a function; GearSpecError (E10001) for anything else."""
    if not isinstance(spec, GearSpec):
        raise GearSpecError(f"spec_to_atc needs a GearSpec, got {type(spec).__name__}",
                            code="E10001")
    return spec.to_atc()


def spec_to_config(spec: GearSpec) -> str:
    """:meth:`GearSpec.to_config` as a function; GearSpecError (E10001) for anything else."""
    if not isinstance(spec, GearSpec):
        raise GearSpecError(f"spec_to_config needs a GearSpec, got {type(spec).__name__}",
                            code="E10001")
    return spec.to_config()


def _check_static(spec: GearSpec) -> None:
    """A static spec has no -1 and exactly the one gear ``()`` (E10001 otherwise)."""
    dynamic = [n for n, s in zip(spec.input_names, spec.input_shapes, strict=True) if -1 in s]
    if dynamic:
        raise GearSpecError(f"a static spec has no dynamic axis, but input {dynamic[0]!r} has "
                            f"a -1: give it gears (batch, image_size or dims mode)",
                            code="E10001")
    if spec.gears != STATIC_GEARS:
        raise GearSpecError(f"a static spec has exactly one gear () (no dynamic values), got "
                            f"{[list(g) for g in spec.gears]}", code="E10001")


def _dynamic_positions(spec: GearSpec) -> tuple[tuple[int, int, int], ...]:
    """(input index, axis, index into the gear tuple) for every -1, in input_shape order.

    dims mode: the k-th -1 takes value k (ParserDataToDynamicInfo). batch mode: every -1 is
    the batch, value 0. image_size mode: in each input the first -1 is H (value 0), the
    second W (value 1).
    """
    out: list[tuple[int, int, int]] = []
    counter = 0
    for i, shape in enumerate(spec.input_shapes):
        seen_in_input = 0
        for axis, d in enumerate(shape):
            if d != -1:
                continue
            if spec.mode == "dims":
                out.append((i, axis, counter))
                counter += 1
            elif spec.mode == "batch":
                out.append((i, axis, 0))
            else:
                out.append((i, axis, min(seen_in_input, 1)))
            seen_in_input += 1
    return tuple(out)


