"""The model description -> a GearSpec: pure functions of what pyACL reported (names, dims,
dtypes, sizes, the gear lists), no ACL call, each tested on its own.

ACL describes a dynamic-gear ``.om`` by its inputs (``-1`` on the dynamic axes), its outputs
(at the largest gear) and one gear list: batch sizes, (h, w) pairs, or per gear the FULL
flattened dims of all inputs, in ATC's ``--input_shape`` order (dataNameOrder in GE's
model_om2.cpp), which no ACL query returns: given (``input_shape=``) or inferred here.
Every inconsistency is a GearFileError naming the model file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gear_runtime.errors import BackendError, GearFileError, GearSpecError
from gear_runtime.gearfile.info import nbytes_of
from gear_runtime.spec import GearSpec
from gear_runtime.spec.rules import Mode

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Tensors:
    """What the description says about the user inputs or the outputs, in model order."""

    names: tuple[str, ...]
    dims: tuple[Shape, ...]  # -1 on dynamic axes (inputs), largest gear (outputs)
    dtypes: tuple[np.dtype, ...]
    sizes: tuple[int, ...]  # bytes; for inputs and outputs: the largest gear

    def described(self) -> dict[str, Shape]:
        """Every tensor's described dims, in model order (for messages)."""
        return dict(zip(self.names, self.dims, strict=True))

    def names_in(self, order: Sequence[int]) -> list[str]:
        return [self.names[p] for p in order]


def dims_of(d: Any, what: str) -> Shape:
    """The dims of an aclmdlIODims dict ({'name', 'dimCount', 'dims'}); BackendError naming
    ``what`` when pyACL returned something else."""
    try:
        return tuple(int(x) for x in list(d["dims"])[: int(d["dimCount"])])
    except (KeyError, TypeError, ValueError):
        raise BackendError(f"{what}: pyACL returned {d!r}, not an aclmdlIODims dict") from None


def hw_pairs(hw: dict[str, Any]) -> list[tuple[int, int]]:
    """aclmdlHW's ``hw[128][2]``: pyACL gives a list of [h, w] (a flat list is accepted)."""
    count, raw = int(hw.get("hwCount", 0)), list(hw.get("hw", []))
    if count and raw and isinstance(raw[0], list | tuple):
        return [(int(p[0]), int(p[1])) for p in raw[:count]]
    if len(raw) < 2 * count:
        raise GearFileError(f"acl.mdl.get_dynamic_hw reports {count} gears but gives {raw!r}")
    return [(int(raw[2 * i]), int(raw[2 * i + 1])) for i in range(count)]


def declared_order(inputs: Tensors, declared: tuple[Sequence[str], Sequence[Shape]] | None,
                   path: str) -> tuple[int, ...]:
    """Positions in ``inputs``: the ``input_shape`` order (``declared``: its names and shapes;
    None: model order), then the inputs it does not list, in model order.

    ATC accepts an input_shape that leaves inputs out (GE's multi_batch_clone_pass.cc,
    CheckAndParseDynamicData: in dims mode every input with a -1 must be listed, see
    :func:`check_dims_listing`; in batch / image-size mode unlisted ones are appended). ACL's
    dims then follow the listed inputs only (:func:`listed_count`). GearSpecError for a name
    the model lacks, a name twice, or a rank / static dim that differs."""
    names, dims = inputs.names, inputs.dims
    if declared is None:
        return tuple(range(len(names)))
    order, shapes = declared
    unknown = [n for n in order if n not in names]
    if unknown or len(set(order)) != len(order):
        raise GearSpecError(f"input_shape names {list(order)}, but {path!r} has the "
                            f"inputs {list(names)}")
    unlisted = [p for p, n in enumerate(names) if n not in order]
    for name, shape in zip(order, shapes, strict=True):
        model = dims[names.index(name)]
        if len(shape) != len(model) or any(
                a >= 0 and b >= 0 and a != b for a, b in zip(shape, model, strict=True)):
            raise GearSpecError(f"input_shape gives {name!r} the shape {list(shape)}, but "
                                f"{path!r} describes it as {list(model)}")
    return tuple(names.index(n) for n in order) + tuple(unlisted)


def check_dims_listing(inputs: Tensors, order: Sequence[int], listed: int, path: str) -> None:
    """Dims mode: GearSpecError unless every input with a -1 is among the ``listed`` first of
    ``order`` (CheckAndParseDynamicData: "All dynamic nodes must be set in --input_shape")."""
    dynamic = [inputs.names[p] for p in order[listed:] if -1 in inputs.dims[p]]
    if dynamic:
        raise GearSpecError(f"input_shape {inputs.names_in(order[:listed])} leaves out "
                            f"{dynamic}, which {path!r} describes with -1 dims "
                            f"({inputs.described()}): ATC --dynamic_dims needs every dynamic "
                            "input listed")


def listed_count(inputs: Tensors, declared: tuple[Sequence[str], Sequence[Shape]] | None,
                 ) -> int:
    """How many inputs (the first of :func:`declared_order`'s order) ACL's dims cover."""
    return len(inputs.names) if declared is None else len(declared[0])


def listed_spec(inputs: Tensors, order: Sequence[int], mode: Mode,
                gears: Sequence[tuple[int, ...]], path: str) -> GearSpec:
    """Batch / image-size spec: the -1 dims of get_input_dims mark the dynamic axes."""
    dims = [inputs.dims[p] for p in order]
    if not any(-1 in d for d in dims):
        raise GearFileError(f"{path!r} lists {mode} gears {list(gears)} but no input "
                            f"has a -1 dim: {inputs.described()}")
    if mode == "batch" and any(-1 in d[1:] for d in dims):
        raise GearFileError(f"dynamic batch model {path!r} has -1 beyond dim 0: "
                            f"{inputs.described()}")
    return make_spec(inputs, order, mode, dims, gears, path)


def dims_spec(inputs: Tensors, order: Sequence[int], full: Sequence[Shape],
              path: str, listed: int | None = None) -> GearSpec:
    """Dims spec from each gear's ``full`` flattened dims, which follow the first ``listed``
    inputs of ``order`` (the ``input_shape`` order, or :func:`infer_listing`'s; default: all).
    A position is dynamic when the description says -1 there or the gears disagree. The
    inputs after ``listed`` are static: they join the spec with their described shapes."""
    listed = len(order) if listed is None else listed
    rest = [tuple(inputs.dims[p]) for p in order[listed:]]
    dims = [inputs.dims[p] for p in order[:listed]]
    flat = [d for s in dims for d in s]
    for g, f in enumerate(full):
        if len(f) != len(flat):
            raise GearFileError(f"gear {g} of {path!r} has {len(f)} dims {list(f)}, "
                                f"but its inputs have {len(flat)} ({inputs.described()})")
    dynamic = [p for p in range(len(flat))
               if flat[p] == -1 or len({f[p] for f in full}) > 1]
    for p in range(len(flat)):
        if p not in dynamic and flat[p] != full[0][p]:
            raise GearFileError(f"static dim {p} of {path!r} is {flat[p]} in the "
                                f"description but {full[0][p]} in its gears")
    marked = [-1 if p in dynamic else d for p, d in enumerate(flat)]
    shapes, at = [], 0
    for d in dims:
        shapes.append(tuple(marked[at:at + len(d)]))
        at += len(d)
    return make_spec(inputs, order, "dims", [*shapes, *rest],
                     [tuple(f[p] for p in dynamic) for f in full], path)


def infer_listing(inputs: Tensors, full: Sequence[Shape],
                  path: str) -> tuple[tuple[int, ...], int]:
    """(order, listed) when the gears' ``full`` dims tell the order without ``input_shape``:
    all inputs (:func:`infer_order`), else only the inputs with a -1 (ATC's partial
    --input_shape, see :func:`declared_order`), the static ones after them. GearFileError as
    :func:`infer_order` when neither fits."""
    dynamic = [p for p, d in enumerate(inputs.dims) if -1 in d]
    width = len(full[0]) if full else 0
    if 0 < len(dynamic) < len(inputs.names) and \
            sum(len(inputs.dims[p]) for p in dynamic) == width:
        sub = Tensors(*(tuple(getattr(inputs, f)[p] for p in dynamic)
                        for f in ("names", "dims", "dtypes", "sizes")))
        inner = infer_order(sub, full, path)
        static = [p for p in range(len(inputs.names)) if p not in dynamic]
        return tuple(dynamic[q] for q in inner) + tuple(static), len(dynamic)
    return infer_order(inputs, full, path), len(inputs.names)


def infer_order(inputs: Tensors, full: Sequence[Shape], path: str) -> tuple[int, ...]:
    """The order of the inputs that the gears' ``full`` dims follow, when the dims tell it.

    An order fits when, cut into the inputs' ranks, every gear's dims equal each input's
    static described dims. Orders that give every input the same shapes in every gear are
    the same to ACL (the flattened dims are equal), so the first such (model order when it
    fits) is taken. Several fits with different shapes, or none: GearFileError.
    """
    fits = fitting_orders(inputs.dims, full)
    if not fits:
        raise GearFileError(
            f"the gears of {path!r} ({[list(f) for f in full]}) fit no order of its "
            f"inputs {inputs.described()}")
    if len(fits) > 1:
        (one, _), (two, _) = fits[:2]
        raise GearFileError(
            f"{path!r}: ACL orders the dims by ATC's --input_shape, which the model "
            f"does not report, and its gears fit several orders of its inputs, e.g. "
            f"{inputs.names_in(one)} and {inputs.names_in(two)}: pass input_shape= (the "
            f"--input_shape it was compiled with) to gr.load")
    return fits[0][0]


def make_spec(inputs: Tensors, order: Sequence[int], mode: Mode,
              shapes: Sequence[Sequence[int]], gears: Sequence[tuple[int, ...]],
              path: str) -> GearSpec:
    """The GearSpec (inputs in ``order``); GearFileError when the gears do not form one."""
    try:
        return GearSpec(mode, tuple(inputs.names_in(order)),
                        tuple(tuple(s) for s in shapes),
                        tuple(gears))
    except GearSpecError as exc:
        raise GearFileError(f"{path!r}: the gears it lists do not form a valid spec: "
                            f"{exc.message}", code=exc.code) from exc


def checked_output_shapes(outputs: Tensors, dims: Sequence[Shape],
                          gear: int) -> tuple[Shape, ...]:
    """``dims`` (one per output, gear ``gear``) after checking each fits its output buffer
    (the description's size) and has no -1; GearFileError naming the output otherwise."""
    for k, shape in enumerate(dims):
        nbytes = nbytes_of(shape, outputs.dtypes[k])
        if any(d < 0 for d in shape) or nbytes > outputs.sizes[k]:
            raise GearFileError(
                f"output {outputs.names[k]!r} of gear {gear} has shape {shape} "
                f"({nbytes} bytes); the model's output buffer is {outputs.sizes[k]} "
                "bytes")
    return tuple(tuple(s) for s in dims)


#: Orders of the inputs tried when inferring ACL's dims order, before giving up
MAX_ORDER_STEPS = 100_000


def fitting_orders(dims: Sequence[tuple[int, ...]], full: Sequence[tuple[int, ...]],
                    ) -> list[tuple[tuple[int, ...], tuple[Any, ...]]]:
    """Orders of the inputs (described ``dims``, -1 where dynamic) that every gear's ``full``
    dims fit, as (order, shapes per gear) with distinct shapes: at most two (enough to call
    the order ambiguous). Depth-first in model order, so model order comes first if it fits.
    GearFileError when the search grows past a bound (many interchangeable inputs)."""
    found: list[tuple[tuple[int, ...], tuple[Any, ...]]] = []
    steps = 0

    def fits(p: int, at: int) -> bool:
        return all(at + len(dims[p]) <= len(f) and all(
            d < 0 or f[at + a] == d for a, d in enumerate(dims[p])) for f in full)

    def walk(order: list[int], at: int) -> None:
        nonlocal steps
        steps += 1
        if steps > MAX_ORDER_STEPS:
            raise GearFileError("the order of the dims could not be inferred (too many "
                                "possible orders): pass input_shape= to gr.load")
        if len(order) == len(dims):
            shapes = shapes_in(order, dims, full)
            if at == len(full[0]) and all(s != shapes for _, s in found):
                found.append((tuple(order), shapes))
            return
        for p in range(len(dims)):
            if len(found) < 2 and p not in order and fits(p, at):
                walk([*order, p], at + len(dims[p]))

    walk([], 0)
    return found


def shapes_in(order: Sequence[int], dims: Sequence[tuple[int, ...]],
               full: Sequence[tuple[int, ...]]) -> tuple[Any, ...]:
    """Per gear, each input's shape (by model position) when ``full`` follows ``order``."""
    out = []
    for f in full:
        shapes: dict[int, tuple[int, ...]] = {}
        at = 0
        for p in order:
            shapes[p] = tuple(f[at:at + len(dims[p])])
            at += len(dims[p])
        out.append(tuple(shapes[p] for p in range(len(dims))))
    return tuple(out)
