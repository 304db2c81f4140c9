"""Is padding safe for this model? Run it both ways and compare (``gr.check_padding``).

``execute(pad=True)`` runs a request on a larger gear with its inputs right-padded and trims
the outputs. That is exact only when the real positions of every output do not read the
padded ones: causal attention with the padding masked (attention_mask padded with 0) is
safe; a mean over the padded axis, or non-causal attention without a mask, is not. No
static analysis can promise it in general, so this module measures it: for request sizes
between and inside the gears, it runs the SOURCE model at the exact size and the gear model
padded, and compares the trimmed outputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gear_runtime.errors import InputError
from gear_runtime.spec import GearSpec

InputsFn = Callable[[Mapping[str, tuple[int, ...]]], Mapping[str, np.ndarray]]


@dataclass
class OutputCheck:
    """One output over every sample: the largest differences and how many samples failed."""

    name: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    failed: list[tuple[int, ...]] = field(default_factory=list)
    #: a sample whose trimmed output has another shape than the source's, and both shapes.
    shape_mismatch: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    @property
    def safe(self) -> bool:
        return not self.failed and self.shape_mismatch is None

    @property
    def verdict(self) -> str:
        if self.shape_mismatch is not None:
            sample, got, want = self.shape_mismatch
            return f"UNSAFE: shape {got} padded vs {want} exact (request {sample})"
        if self.failed:
            return f"UNSAFE: differs in {len(self.failed)} sample(s), first {self.failed[0]}"
        return "safe"


@dataclass
class PaddingReport:
    """What :func:`check_padding` found: per output, and the samples it ran."""

    samples: list[tuple[int, ...]]
    outputs: list[OutputCheck]
    rtol: float
    atol: float
    pad_values: dict[str, Any]

    @property
    def safe(self) -> bool:
        """True when every output agreed on every sample (within rtol / atol)."""
        return all(o.safe for o in self.outputs)

    def table(self) -> str:
        """A plain-text table: one row per output, then the verdict."""
        rows = [f"{'output':<20} {'max abs diff':>13} {'max rel diff':>13}  verdict"]
        for o in self.outputs:
            rows.append(f"{o.name:<20} {o.max_abs:>13.3g} {o.max_rel:>13.3g}  {o.verdict}")
        pads = ", ".join(f"{n}={v}" for n, v in self.pad_values.items())
        rows.append(f"{len(self.samples)} request sizes, pad values {pads}; rtol {self.rtol:g},"
                    f" atol {self.atol:g}: padding is {'SAFE' if self.safe else 'UNSAFE'}")
        return "\n".join(rows)


def default_samples(spec: GearSpec) -> list[tuple[int, ...]]:
    """Request sizes inside and between the gears: for every gear, each value that varies
    between gears taken as 1, half the gear's value plus one and the gear's value minus one
    (values that move together in every gear move together here; values that are the same
    in every gear stay). Exact gears are left out (they run unpadded)."""
    gears = [tuple(g) for g in spec.gears]
    varying = [v for v in range(spec.values_per_gear) if len({g[v] for g in gears}) > 1]
    out: list[tuple[int, ...]] = []
    for gear in gears:
        for shrink in (lambda x: 1, lambda x: x // 2 + 1, lambda x: x - 1):
            sample = list(gear)
            for v in varying:
                sample[v] = max(1, shrink(gear[v]))
            t = tuple(sample)
            if t not in out and t not in gears:
                out.append(t)
    return out


def default_inputs(dtypes: Mapping[str, np.dtype], seed: int = 0) -> InputsFn:
    """Seeded inputs for any shapes: floats standard normal; integer inputs whose name says
    mask all ones, position all 0..n-1 along the last axis, anything else in [0, 10);
    bools True."""
    def make(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in shapes.items():
            dt = np.dtype(dtypes[name])
            lower = name.lower()
            if dt.kind == "f":
                out[name] = rng.standard_normal(shape).astype(dt)
            elif dt.kind == "b" or "mask" in lower:
                out[name] = np.ones(shape, dt)
            elif "position" in lower and len(shape) > 0:
                out[name] = np.ascontiguousarray(
                    np.broadcast_to(np.arange(shape[-1], dtype=dt), shape))
            else:
                out[name] = rng.integers(0, 10, size=shape).astype(dt)
        return out
    return make


def check_padding(gear_file: str | os.PathLike[str], source_model: Any, *,
                  samples: Sequence[Sequence[int] | int] | None = None,
                  pad_values: Mapping[str, Any] | None = None,
                  inputs: InputsFn | None = None, rtol: float = 1e-4, atol: float = 1e-5,
                  seed: int = 0) -> PaddingReport:
    """Compare ``execute(pad=True)`` of ``gear_file`` with ``source_model`` (a path or an
    onnx.ModelProto: the dynamic model it was compiled from) run at each request's exact size.

    ``samples``: request sizes as dynamic-value tuples (ints for one-value models; default
    :func:`default_samples`). ``pad_values`` as for ``create_executor``. ``inputs(shapes)``
    makes the inputs of one request (default :func:`default_inputs`). An output agrees when
    the trimmed padded output has the source's shape and ``allclose(rtol, atol)`` holds.
    Returns a :class:`PaddingReport` (``.safe``, ``.table()``). A request no gear covers is
    GearMismatchError (145013).
    """
    import onnxruntime as ort

    from gear_runtime.runtime.model import load

    with load(os.fspath(gear_file)) as model:
        ex = model.create_executor(pad_values=pad_values)
        spec = model.spec
        requests = _requests(spec, samples)
        dtypes = dict(zip(spec.input_names, model.info.input_dtypes, strict=True))
        make = inputs or default_inputs(dtypes, seed)
        source = source_model.SerializeToString() if hasattr(source_model,
                                                             "SerializeToString") else \
            os.fspath(source_model)
        session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
        checks = [OutputCheck(n) for n in model.output_names]
        for request in requests:
            feeds = dict(make(spec.shapes_for(request)))
            got = ex.execute(feeds, pad=True)
            want = session.run(model.output_names, feeds)
            for check, g, w in zip(checks, got, want, strict=True):
                _compare(check, request, np.asarray(g), np.asarray(w), rtol, atol)
        return PaddingReport(requests, checks, rtol, atol,
                             {n: v.item() for n, v in ex.pad_values.items()})


def _requests(spec: GearSpec, samples: Sequence[Sequence[int] | int] | None
              ) -> list[tuple[int, ...]]:
    if samples is None:
        return default_samples(spec)
    out = []
    for s in samples:
        t = (s,) if isinstance(s, int | np.integer) else tuple(int(v) for v in s)
        if len(t) == 1 and spec.values_per_gear > 1:  # one size for every varying value
            t = _widen(spec, t[0])
        if len(t) != spec.values_per_gear:
            raise InputError(f"sample {s!r} has {len(t)} values, the model's gears have "
                             f"{spec.values_per_gear}")
        out.append(t)
    return out


def _widen(spec: GearSpec, size: int) -> tuple[int, ...]:
    """One size for a model with tied values: every value that varies between gears takes
    it, the others keep their (constant) value."""
    first = spec.gears[0]
    return tuple(size if any(g[v] != first[v] for g in spec.gears) else first[v]
                 for v in range(spec.values_per_gear))


def _compare(check: OutputCheck, request: tuple[int, ...], got: np.ndarray, want: np.ndarray,
             rtol: float, atol: float) -> None:
    if got.shape != want.shape:
        if check.shape_mismatch is None:
            check.shape_mismatch = (request, got.shape, want.shape)
        return
    if got.size == 0:
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(g - w)
    check.max_abs = max(check.max_abs, float(np.nanmax(diff)))
    rel = diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny)
    check.max_rel = max(check.max_rel, float(np.nanmax(rel)))
    if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
        check.failed.append(request)

