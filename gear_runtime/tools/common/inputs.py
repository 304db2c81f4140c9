"""Synthetic inputs, for running and benchmarking a gear file without preparing .npy files:
request shapes in trtexec's form (``--shapes name:1x3x224x224,...``) and arrays of the
model's dtypes filled at random or with a constant (``--fill``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gear_runtime.errors import InputError

if TYPE_CHECKING:
    from gear_runtime.runtime.model import GearModel

#: What ``--fill`` may ask for. ``random``: floats standard normal (seeded); integers 1 (a
#: valid index into any table of two or more rows, and an attention mask of ones) and bools
#: True, so that embedding lookups and masks stay valid. ``zeros`` / ``ones``: every element.
FILLS = ("random", "zeros", "ones")


def parse_shapes(text: str, flag: str = "--shapes") -> dict[str, tuple[int, ...]]:
    """``"a:1x3x224x224,b:1x64"`` -> ``{"a": (1, 3, 224, 224), "b": (1, 64)}`` (trtexec's
    ``--shapes``; each entry split at its LAST ':', as names may hold one; ``a:`` is a
    scalar). InputError naming ``flag`` and the entry for anything else: a missing name, a
    dim that is not a positive integer, a name given twice."""
    shapes: dict[str, tuple[int, ...]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, dims = entry.rpartition(":")
        if not sep or not name:
            raise InputError(f"{flag} entry {entry!r} must be NAME:DIMS, e.g. input_ids:1x64 "
                             "(dims separated by 'x')")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
        except ValueError:
            raise InputError(f"{flag} entry {entry!r}: the dims {dims!r} must be positive "
                             "integers separated by 'x', e.g. 1x3x224x224") from None
        if any(d < 1 for d in shape):
            raise InputError(f"{flag} entry {entry!r}: every dim must be >= 1")
        if name in shapes:
            raise InputError(f"{flag}: input {name!r} is given twice")
        shapes[name] = shape
    if not shapes:
        raise InputError(f"{flag} is empty; give NAME:DIMS entries separated by ','")
    return shapes


def parse_dym_shape(text: str) -> dict[str, tuple[int, ...]]:
    """ais_bench's ``--dymShape "a:1,3,224,224;b:1,64"`` as :func:`parse_shapes`' dict (its
    rules and errors, naming --dymShape)."""
    entries = [e.strip() for e in text.split(";") if e.strip()]
    return parse_shapes(",".join(f"{n}:{'x'.join(d.split(','))}" for n, _, d in
                                 (e.rpartition(":") for e in entries)), "--dymShape")


def check_request_shapes(model: GearModel, shapes: Mapping[str, Sequence[int]],
                         flag: str = "--shapes") -> None:
    """InputError naming ``flag`` unless every shape is one the model can be asked to run:
    an input it has, of its rank, no dim beyond the largest gear's (a hybrid model, which
    runs any shape, within the buffer limit of :func:`gear_runtime.runtime.model.load`)."""
    from gear_runtime.runtime.model import buffer_limit

    spec = model.spec
    for name, shape in shapes.items():
        if name not in spec.input_names:
            raise InputError(f"{flag}: the model has no input {name!r}; its inputs are "
                             f"{', '.join(spec.input_names)}")
        k = spec.input_names.index(name)
        if len(shape) != len(spec.input_shapes[k]):
            raise InputError(f"{flag} {name}: {len(shape)} dims {list(shape)}; the input has "
                             f"{len(spec.input_shapes[k])} ({list(spec.input_shapes[k])}, -1 "
                             "dynamic)")
        dtype = np.dtype(model.info.input_dtypes[k])
        if spec.hybrid:
            nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if nbytes > buffer_limit():
                raise InputError(f"{flag} {name}: {list(shape)} is {nbytes} bytes, beyond the "
                                 f"buffer limit of {buffer_limit()} bytes")
            continue
        largest = np.max([spec.shapes(g)[name] for g in range(spec.gear_count)], axis=0)
        if any(d > m for d, m in zip(shape, largest, strict=True)):
            raise InputError(f"{flag} {name}: {list(shape)} is larger than every gear (the "
                             f"largest is {[int(m) for m in largest]}); no gear can run it")


def synthetic_inputs(dtypes: Mapping[str, np.dtype], shapes: Mapping[str, Sequence[int]],
                     fill: str = "random", seed: int = 0) -> dict[str, np.ndarray]:
    """One array per name of ``dtypes`` (in its order), of that dtype and the shape
    ``shapes`` gives it, filled as :data:`FILLS` says. InputError for an unknown ``fill``."""
    if fill not in FILLS:
        raise InputError(f"fill {fill!r} is unknown; expected one of {', '.join(FILLS)}")
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, dtype in dtypes.items():
        dt, shape = np.dtype(dtype), tuple(shapes[name])
        if fill == "zeros":
            out[name] = np.zeros(shape, dtype=dt)
        elif fill == "ones" or not np.issubdtype(dt, np.floating):
            out[name] = np.ones(shape, dtype=dt)
        else:
            out[name] = rng.standard_normal(shape).astype(dt)
    return out


__all__ = ["FILLS", "check_request_shapes", "parse_shapes", "synthetic_inputs"]
