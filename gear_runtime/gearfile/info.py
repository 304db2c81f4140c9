"""ModelInfo: what a loaded gear model is, whatever the backend (DavinciModel's gear maps).

The gear file reader builds it from a gear file; the device backends build it from their
runtime's model description (an ``.om``, a MindIR). Everything above (the runtime, the tools,
the server) reads a model through it. The one place output sizes and the output axes that
follow a dynamic value are computed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.gearfile.format import OutputAxes
from gear_runtime.gearfile.padding import PaddingVerdict
from gear_runtime.spec import GearSpec


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded gear model is, whatever the backend (DavinciModel's gear maps).

    ``output_shapes[g][k]`` is output ``k``'s static shape in gear ``g``; it keys the executor's
    output buffers and is checked against what the backend really produced.
    """

    spec: GearSpec
    input_dtypes: tuple[np.dtype, ...]
    output_names: tuple[str, ...]
    output_dtypes: tuple[np.dtype, ...]
    output_shapes: tuple[tuple[tuple[int, ...], ...], ...]
    hybrid: bool = False
    sink: bool = False
    #: per output ``{axis: index of the dynamic value its size follows}`` as the compiler
    #: recorded it; None: not recorded (GearModel derives it from ``output_shapes``).
    output_dynamic_axes: tuple[dict[int, int], ...] | None = None
    #: the padding verdict the gear file records (gearfile/padding.py); None: none
    padding: PaddingVerdict | None = None

    def output_shape(self, gear: int, index: int) -> tuple[int, ...]:
        """Static shape of output ``index`` in gear ``gear`` (GE's gear -> output shape map).
        InputError when either index is out of range."""
        return self.output_shapes[self.spec.gear_number(gear, "model")][self.output_index(index)]

    def output_size(self, gear: int, index: int) -> int:
        """Bytes of output ``index`` in gear ``gear`` (GE's GetGearAndRealOutSizeInfo): the one
        place output sizes are computed. InputError when either index is out of range."""
        return nbytes_of(self.output_shape(gear, index), self.output_dtypes[int(index)])

    def output_index(self, index: object) -> int:
        """``index`` as an output index; InputError naming the outputs when it is not one."""
        n = len(self.output_names)
        if not isinstance(index, int | np.integer) or isinstance(index, bool) \
                or not 0 <= index < n:
            raise InputError(f"output index {index!r} is out of range: the model has {n} "
                             f"outputs ({', '.join(self.output_names)})")
        return int(index)

    @property
    def input_dtype_map(self) -> dict[str, np.dtype]:
        """Input name -> dtype, in input order."""
        return dict(zip(self.spec.input_names, self.input_dtypes, strict=True))

    def input_nbytes(self) -> list[list[int]]:
        """[gear][input] bytes of every input in every gear: what the staging layout needs."""
        out = []
        for g in range(self.spec.gear_count):
            shapes = self.spec.shapes(g)
            out.append([nbytes_of(shapes[n], dt)
                        for n, dt in zip(self.spec.input_names, self.input_dtypes, strict=True)])
        return out


def nbytes_of(shape: Sequence[int], dtype: np.dtype) -> int:
    """Bytes of an array of ``shape`` and ``dtype``, in exact integers (numpy's int64
    product could wrap around for a crafted shape before a size limit sees it)."""
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


#: A run at values where the values tied in every gear differ: (the values, per output its
#: shape). What tells which of them an axis follows when the gears cannot.
Probe = tuple[Sequence[int], Sequence[Sequence[int]]]


def axes_from_shapes(gears: Sequence[Sequence[int]],
                     output_shapes: Sequence[Sequence[Sequence[int]]],
                     symbolic: Sequence[dict[int, int]] | None = None,
                     probe: Probe | None = None) -> OutputAxes:
    """Per output ``{axis: value index}`` from the per-gear output shapes
    (``output_shapes[g][k]``) and, when given, what symbolic inference says (``symbolic[k]``)
    and a probe run (:data:`Probe`); see the module doc for the rule. An axis that follows
    several values equal in every gear (square image gears: H == W) follows the one
    inference names, else the one whose size it has in the probe (none: it follows no single
    value, and is not recorded), else the first (without a probe: values the model itself
    needs equal, such as input_ids' and attention_mask's lengths, trim alike)."""
    if not output_shapes:
        return ()
    count = len(output_shapes[0])
    out = []
    for k in range(count):
        shapes = [tuple(output_shapes[g][k]) for g in range(len(gears))]
        named = symbolic[k] if symbolic is not None and k < len(symbolic) else {}
        seen = None if probe is None else (probe[0], tuple(probe[1][k]))
        out.append(_axes_of(gears, shapes, named, seen))
    return tuple(out)


def ambiguous_axes(gears: Sequence[Sequence[int]],
                   output_shapes: Sequence[Sequence[Sequence[int]]],
                   axes: OutputAxes,
                   symbolic: Sequence[dict[int, int]] | None = None
                   ) -> list[tuple[int, int, list[int]]]:
    """(output, axis, the values it may follow) of every axis of ``axes`` recorded to follow
    the first of several values equal in every gear that inference (``symbolic``) does not
    name: what compile warns about when no probe ran to tell them apart."""
    found = []
    for k, recorded in enumerate(axes):
        shapes = [tuple(output_shapes[g][k]) for g in range(len(gears))]
        named = symbolic[k] if symbolic is not None and k < len(symbolic) else {}
        for axis in sorted(recorded):
            fits = _fits(gears, shapes, axis)
            if len(fits) > 1 and named.get(axis) not in fits:
                found.append((k, axis, fits))
    return found


def _fits(gears: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]],
          axis: int) -> list[int]:
    """The values ``axis`` follows in every gear."""
    width = len(gears[0]) if gears else 0
    return [v for v in range(width) if _misfit(gears, shapes, axis, v) is None]


def _axes_of(gears: Sequence[Sequence[int]], shapes: list[tuple[int, ...]],
             named: dict[int, int],
             probe: tuple[Sequence[int], tuple[int, ...]] | None = None) -> dict[int, int]:
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        return {}  # rank changes between gears: nothing to trim by prefix
    axes: dict[int, int] = {}
    for axis in range(rank):
        sizes = [s[axis] for s in shapes]
        fits = _fits(gears, shapes, axis)
        if not fits:
            continue
        if len(gears) > 1 and len(set(sizes)) > 1:
            if named.get(axis) in fits:
                fits = [named[axis]]
            elif len(fits) > 1 and probe is not None:  # the run where tied values differ
                values, shape = probe
                fits = [v for v in fits if axis < len(shape) and shape[axis] == values[v]]
            if fits:
                axes[axis] = fits[0]
        elif len(gears) == 1 and named.get(axis) in fits:
            # One gear cannot tell a coincidence from a dependency: inference must name it.
            axes[axis] = named[axis]
    return axes


def _misfit(gears: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]], axis: int,
            value: int) -> int | None:
    """The first gear in which ``axis`` of an output (shape ``shapes[g]`` in gear ``g``) does
    NOT follow dynamic value ``value`` (the axis is missing, or its size is not the gear's
    value); None when it follows it in every gear. The one rule of "an axis follows a value"."""
    for g, (gear, shape) in enumerate(zip(gears, shapes, strict=True)):
        if not (0 <= axis < len(shape) and 0 <= value < len(gear) and shape[axis] == gear[value]):
            return g
    return None


def check_output_axes(gears: Sequence[Sequence[int]],
                      output_shapes: Sequence[Sequence[Sequence[int]]],
                      output_names: Sequence[str], axes: OutputAxes) -> None:
    """ValueError naming the first output of ``axes`` (per output ``{axis: value index}``, as
    recorded in a file) with an axis that does not follow its value in every gear: padding
    would trim it wrongly (or index past the output's rank)."""
    for k, (name, recorded) in enumerate(zip(output_names, axes, strict=True)):
        shapes = [tuple(output_shapes[g][k]) for g in range(len(gears))]
        for axis, value in sorted(recorded.items()):
            g = _misfit(gears, shapes, axis, value)
            if g is not None:
                size = (f"its axis {axis} is {shapes[g][axis]}" if 0 <= axis < len(shapes[g])
                        else f"it has no axis {axis}")
                raise ValueError(
                    f"output {name!r}: axis {axis} is recorded to follow dynamic value "
                    f"{value}, but in gear {g} {tuple(gears[g])} its shape is {shapes[g]}: "
                    f"{size}, not the gear's value")
