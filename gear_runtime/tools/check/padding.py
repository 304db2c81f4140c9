"""Is padding safe for this model? Run it both ways and compare (``gr.check_padding``).

``execute(pad=True)`` runs a request on a larger gear with its inputs right-padded and trims
the outputs. That is exact only when the real positions of every output do not read the
padded ones: causal attention with the padding masked (attention_mask padded with 0) is
safe; a mean over the padded axis, or non-causal attention without a mask, is not. No
static analysis can promise it in general, so this module measures it: for request sizes
between and inside the gears, it runs the SOURCE model at the exact size and the gear model
padded, and compares the trimmed outputs.

Lean on a multi-GB model: every output is compared in chunks of ``CHUNK_ELEMENTS`` (floats
with ``allclose``, integers and booleans exactly), so no full-size temporary is built; the
padded run's outputs are views of the executor's own buffers and the source run's are
dropped before the next request: the peak is the two sessions and one output set of each.
Requests are checked against the gears (and the source model against the gear file) before
anything is run.

The JSON of a report (``check-padding --json``, :meth:`PaddingReport.to_json`), schema
``"gear-runtime-check-padding/1"``::

    {"schema": "gear-runtime-check-padding/1", "safe": true, "rtol": 1e-4, "atol": 1e-5,
     "pad_values": {"attention_mask": 0, ...}, "samples": [[5, 5, 5, 16], ...],
     "outputs": [{"name": "logits", "safe": true, "verdict": "safe",
                  "max_abs_diff": 0.0, "max_rel_diff": 0.0, "failed_samples": [],
                  "shape_mismatch": null | {"sample": [...], "padded": [...],
                                            "exact": [...]},
                  "zero_reference_diffs": 0, "valid_axis_hint": null | 4}, ...]}

A relative difference is taken where the exact value is a finite non-zero number: relative to
an exact 0 it is no number (dividing by a tiny guard instead gave ~1e308, which says
nothing), so the values that differ where the exact output is 0 are counted apart
(``zero_reference_diffs``). An output that differs only past the request's length along one
axis (a prefill's KV cache padded to a fixed length, its pad slots holding the pad tokens'
K / V) gets that axis as ``valid_axis_hint``: what ``--valid NAME:AXIS`` would compare.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gear_runtime.errors import GearMismatchError, InputError
from gear_runtime.gearfile.padding import PaddingVerdict, record_verdict, verdict_of
from gear_runtime.progress import progress_bar
from gear_runtime.spec import GearSpec
from gear_runtime.tools.common import jsonout
from gear_runtime.tools.common.source import ort_type

InputsFn = Callable[[Mapping[str, tuple[int, ...]]], Mapping[str, np.ndarray]]

SCHEMA = jsonout.schema_name("check-padding", 1)
#: Elements compared at a time (2 MB per float64 temporary of a chunk).
CHUNK_ELEMENTS = 1 << 18
#: The most request sizes one check runs.
MAX_SAMPLES = 10_000


@dataclass
class OutputCheck:
    """One output over every sample: the largest differences and how many samples failed."""

    name: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    failed: list[tuple[int, ...]] = field(default_factory=list)
    #: a sample whose trimmed output has another shape than the source's, and both shapes.
    shape_mismatch: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
    #: not compared at all (``ignore_outputs``)
    ignored: bool = False
    #: compared only over the first request-length entries along this axis (``valid``)
    valid_axis: int | None = None
    #: values that differ (beyond ``atol``) where the exact output is 0, over all samples
    zero_reference: int = 0
    #: the axes along which every failed sample agrees over its first request-length
    #: entries (None: no failed sample yet); see :attr:`valid_hint`
    hint_axes: list[int] | None = None
    #: each axis's length, to pick the hint among several (see :attr:`valid_hint`)
    shape: tuple[int, ...] = ()

    @property
    def safe(self) -> bool:
        return self.ignored or (not self.failed and self.shape_mismatch is None)

    @property
    def valid_hint(self) -> int | None:
        """The axis ``valid`` would compare this failed output along: every failed sample
        agrees over its first request-length entries there (a cache padded to a fixed length
        differs only in its pad slots); None when there is none, or nothing to hint."""
        if self.safe or self.shape_mismatch is not None or not self.hint_axes:
            return None
        # several axes can qualify (a slice of one head may agree too): the longest is the
        # one a fixed-length cache is padded along
        return max(self.hint_axes, key=lambda a: (self.shape[a], -a))

    @property
    def verdict(self) -> str:
        if self.ignored:
            return "ignored (not compared)"
        if self.shape_mismatch is not None:
            sample, got, want = self.shape_mismatch
            return f"UNSAFE: shape {got} padded vs {want} exact (request {sample})"
        if self.failed:
            zero = (f"; {self.zero_reference:,} value(s) differ where the exact output is 0"
                    if self.zero_reference else "")
            hint = self.valid_hint
            where = "" if hint is None else f"; only past the request's length along axis {hint}"
            return (f"UNSAFE: differs in {len(self.failed)} sample(s), first {self.failed[0]}"
                    f"{zero}{where}")
        return "safe" if self.valid_axis is None else f"safe (axis {self.valid_axis}: valid part)"

    @property
    def rel_text(self) -> str:
        """The largest relative difference as the table shows it: ``-`` where the only values
        that differ are where the exact output is 0 (no relative difference exists)."""
        if self.max_rel == 0 and self.zero_reference:
            return "-"
        return f"{self.max_rel:.3g}"

    def to_json(self) -> dict[str, Any]:
        mismatch = None
        if self.shape_mismatch is not None:
            sample, got, want = self.shape_mismatch
            mismatch = {"sample": list(sample), "padded": list(got), "exact": list(want)}
        return {"name": self.name, "safe": self.safe, "verdict": self.verdict,
                "max_abs_diff": _finite(self.max_abs), "max_rel_diff": _finite(self.max_rel),
                "failed_samples": [list(s) for s in self.failed], "shape_mismatch": mismatch,
                "ignored": self.ignored, "valid_axis": self.valid_axis,
                "zero_reference_diffs": self.zero_reference,
                "valid_axis_hint": self.valid_hint}


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

    def verdict(self) -> PaddingVerdict:
        """The verdict ``record=True`` writes into the gear file."""
        return verdict_of(
            self.safe, valid={o.name: o.valid_axis for o in self.outputs
                              if o.valid_axis is not None},
            ignored=[o.name for o in self.outputs if o.ignored], pad_values=self.pad_values,
            rtol=self.rtol, atol=self.atol, samples=len(self.samples),
            unsafe_outputs=[o.name for o in self.outputs if not o.safe])

    def table(self) -> str:
        """A plain-text table: one row per output, then the verdict."""
        rows = [f"{'output':<20} {'max abs diff':>13} {'max rel diff':>13}  verdict"]
        for o in self.outputs:
            rows.append(f"{o.name:<20} {o.max_abs:>13.3g} {o.rel_text:>13}  {o.verdict}")
        pads = ", ".join(f"{n}={v}" for n, v in self.pad_values.items())
        rows.append(f"{len(self.samples)} request sizes, pad values {pads}; rtol {self.rtol:g},"
                    f" atol {self.atol:g}: padding is {'SAFE' if self.safe else 'UNSAFE'}")
        rows += [_hint_line(o.name, o.valid_hint) for o in self.outputs
                 if o.valid_hint is not None]
        return "\n".join(rows)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values (schema in the module doc; inf / NaN as null)."""
        return {"schema": SCHEMA, "safe": self.safe, "rtol": self.rtol, "atol": self.atol,
                "pad_values": dict(self.pad_values),
                "samples": [list(s) for s in self.samples],
                "outputs": [o.to_json() for o in self.outputs]}


def _hint_line(name: str, axis: int) -> str:
    """What to do about an output that differs only past the request's length along ``axis``."""
    return (f"{name} differs only past the request's length along axis {axis}: a cache padded "
            "to a fixed length? If the model that reads it masks those slots, compare the "
            f"valid part: --valid {name}:{axis} (check_padding(valid={{{name!r}: {axis}}}))")


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


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
                  seed: int = 0, progress: bool = False, valid: Mapping[str, int] | None = None,
                  ignore_outputs: Sequence[str] = (), record: bool = False) -> PaddingReport:
    """Compare ``execute(pad=True)`` of ``gear_file`` with ``source_model`` (a path or an
    onnx.ModelProto: the dynamic model it was compiled from) run at each request's exact size.

    ``samples``: request sizes as dynamic-value tuples (ints for one-value models; default
    :func:`default_samples`). ``pad_values`` as for ``create_executor``. ``inputs(shapes)``
    makes the inputs of one request (default :func:`default_inputs`). A float output agrees
    when the trimmed padded output has the source's shape and ``allclose(rtol, atol)`` holds
    (NaN equal to NaN); an integer or boolean output when it is equal. Returns a
    :class:`PaddingReport` (``.safe``, ``.table()``, ``.to_json()``). A request no gear
    covers is GearMismatchError (145013), raised before anything runs; a source model whose
    inputs or outputs are not the gear file's is InputError; so is a check with no request
    to run (a static model: never padded), which never reports SAFE. ``progress``: a bar on stderr
    (a terminal only) while the samples run.

    For a cache output padded to a fixed length (a prefill's KV cache: its pad slots hold
    the pad tokens' K / V, which the decode masks), ``valid={"present_kv": 4}`` compares
    only the first L entries along axis 4, L the request's largest dynamic value (its
    sequence length); ``ignore_outputs`` are not compared at all. Unknown names or axes
    are InputError.

    ``record``: write the verdict (SAFE / UNSAFE, with ``valid`` and ``ignore_outputs``) into
    the gear file's metadata (:mod:`gear_runtime.gearfile.padding`, the file resealed):
    loading it then never pads a model found UNSAFE (``PaddingUnsafeError``). The check
    itself pads whatever an earlier record says.
    """
    import onnxruntime as ort

    from gear_runtime.runtime.model import load

    # the bar starts before the loads: on a multi-GB model loading both takes longer than
    # the samples; its total is known once the gear file's spec gives the requests
    with progress_bar(2, "check-padding", progress, unit="step") as bar:
        with _loading(bar, "loading the gear file"):
            model = load(os.fspath(gear_file))
        with model:
            spec = model.spec
            requests = _requests(spec, samples)
            if not requests:  # no verdict without a run: never a vacuous SAFE
                raise InputError(_nothing_to_check(spec))
            bar.total = len(requests) + 2
            # measured padded, whatever an earlier record or declaration says
            ex = model.create_executor(pad_values=pad_values, pad_safe=True)
            dtypes = model.info.input_dtype_map
            make = inputs or default_inputs(dtypes, seed)
            source = source_model.SerializeToString() if hasattr(source_model,
                                                                 "SerializeToString") else \
                os.fspath(source_model)
            with _loading(bar, "loading the source"):
                session = _source_session(ort, source, model)
            checks = _output_checks(model, valid or {}, ignore_outputs)
            for request in requests:
                bar.set_postfix_str("request " + ",".join(map(str, request)), refresh=False)
                _check_request(ex, session, model, checks, request,
                               make(spec.shapes_for(request)), rtol, atol)
                bar.update(1)
            report = PaddingReport(requests, checks, rtol, atol,
                                   {n: v.item() for n, v in ex.pad_values.items()})
    if record:  # the model closed: the file is replaced under no open session
        record_verdict(os.fspath(gear_file), report.verdict())
    return report


def _nothing_to_check(spec: GearSpec) -> str:
    """Why a check has no request to run: padding could not be checked."""
    if spec.mode == "static":
        return ("check-padding: this is a static model (one gear, its fixed shapes): it is "
                "never padded, so there is nothing to check (execute(pad=True) refuses any "
                "other shape)")
    return (f"check-padding: no request size lies inside or between the gears "
            f"({'; '.join(','.join(map(str, g)) for g in spec.gears)}); give --samples")


def _output_checks(model: Any, valid: Mapping[str, int],
                   ignore: Sequence[str]) -> list[OutputCheck]:
    """One check per output, with ``valid`` axes and ``ignore``d outputs (names and axes
    checked against the model: InputError)."""
    names, rank = model.output_names, {n: len(model.output_shape(0, k))
                                        for k, n in enumerate(model.output_names)}
    for name in [*valid, *ignore]:
        if name not in names:
            raise InputError(f"check-padding: the model has no output {name!r}; outputs: "
                             f"{', '.join(names)}")
    for name, axis in valid.items():
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < rank[name]:
            raise InputError(f"check-padding: valid axis of {name!r} is {axis!r}; expected "
                             f"an integer in [0, {rank[name] - 1}] (its rank is {rank[name]})")
    return [OutputCheck(n, ignored=n in ignore, valid_axis=valid.get(n)) for n in names]


@contextlib.contextmanager
def _loading(bar: Any, what: str) -> Iterator[None]:
    """One step of ``bar``: ``what`` shown while the block runs, counted when it ends."""
    bar.set_postfix_str(what, refresh=True)
    yield
    bar.update(1)


def _check_request(ex: Any, session: Any, model: Any, checks: list[OutputCheck],
                   request: tuple[int, ...], feeds: Mapping[str, np.ndarray], rtol: float,
                   atol: float) -> None:
    """Run one request both ways and fold it into ``checks``; its outputs die on return
    (one output set of each side alive at a time)."""
    got = ex.execute(dict(feeds), pad=True, copy=False)  # views: compared at once
    want = _run_source(session, model, feeds)
    for check, g, w in zip(checks, got, want, strict=True):
        if check.ignored:
            continue
        g, w = np.asarray(g), np.asarray(w)
        if check.valid_axis is not None and g.shape == w.shape:
            g, w = g[_prefix(check.valid_axis, request)], w[_prefix(check.valid_axis, request)]
        failed = len(check.failed)
        _compare(check, request, g, w, rtol, atol)
        if len(check.failed) > failed and check.valid_axis is None and g.shape == w.shape:
            _narrow_hint(check, request, g, w, rtol, atol)


def _prefix(axis: int, request: tuple[int, ...]) -> tuple[slice, ...]:
    """The index of the first request-length entries along ``axis`` (``valid``'s part)."""
    return (slice(None),) * axis + (slice(0, max(request)),)


def _narrow_hint(check: OutputCheck, request: tuple[int, ...], got: np.ndarray,
                 want: np.ndarray, rtol: float, atol: float) -> None:
    """Keep, of ``check``'s candidate axes (every axis at the first failed sample), those
    longer than the request along which this failed sample agrees over its first
    request-length entries: the axes ``valid`` would make it pass along."""
    axes = range(got.ndim) if check.hint_axes is None else check.hint_axes
    check.shape = tuple(got.shape)
    check.hint_axes = [a for a in axes if got.shape[a] > max(request) and _fold(
        got[_prefix(a, request)], want[_prefix(a, request)], rtol, atol)[0]]


def _source_session(ort: Any, source: Any, model: Any) -> Any:
    """The source model's CPU session, checked against the gear file: the same input names,
    dtypes and ranks, and its outputs (by name); InputError naming what differs."""
    so = ort.SessionOptions()
    so.log_severity_level = 4  # errors reach the caller as InputError, not on stderr
    # No arena: outputs of several request sizes would each grow it (its chunks are kept);
    # without it each run's outputs are freed when dropped, so one set is alive at a time.
    so.enable_cpu_mem_arena = False
    try:
        session = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own types: not a model it can load
        raise InputError(f"the source model cannot be loaded by ONNX Runtime: "
                         f"{str(exc).splitlines()[0][:300]}") from None
    spec, info = model.spec, model.info
    want = {n: (np.dtype(dt), len(s)) for n, dt, s in zip(
        spec.input_names, info.input_dtypes, spec.input_shapes, strict=True)}
    have = {}
    for i in session.get_inputs():
        dtype = _ORT_TYPES.get(i.type)
        have[i.name] = (dtype, len(i.shape) if i.shape is not None else -1)
    diffs = [f"{n} {_describe(have.get(n))} (the gear file's: {_describe(w)})"
             for n, w in want.items() if have.get(n) != w]
    diffs += [f"{n} is not an input of the gear file" for n in have if n not in want]
    outputs = {o.name for o in session.get_outputs()}
    missing = [n for n in model.output_names if n not in outputs]
    if diffs or missing:
        what = "; ".join(diffs + ([f"outputs {', '.join(missing)} missing"] if missing else []))
        raise InputError(f"the source model does not match the gear file (inputs {what}); "
                         "give the model the gear file was compiled from")
    return session


def _describe(entry: tuple[Any, int] | None) -> str:
    if entry is None:
        return "missing"
    dtype, rank = entry
    return f"{dtype if dtype is not None else 'of another type'} rank {rank}"


#: ONNX Runtime's type string -> dtype, for the dtypes a source input may have (the string
#: itself: tools/source.ort_type, its one home).
_ORT_TYPES = {ort_type(d): d for d in map(np.dtype, (
    "float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint64", "uint32",
    "uint16", "uint8", "bool"))}


def _run_source(session: Any, model: Any, feeds: Mapping[str, np.ndarray]) -> list[Any]:
    try:
        return session.run(model.output_names, dict(feeds))
    except Exception as exc:  # the inputs fit the gear file but not this model
        raise InputError(f"the source model does not match the gear file (inputs "
                         f"{', '.join(f'{n} {tuple(a.shape)}' for n, a in feeds.items())} "
                         f"fail on it: {str(exc).splitlines()[0][:300]})") from None


def _requests(spec: GearSpec, samples: Sequence[Sequence[int] | int] | None
              ) -> list[tuple[int, ...]]:
    """The samples as full value tuples, each checked (values >= 1, covered by a gear)
    before anything is allocated for it."""
    if samples is None:
        return default_samples(spec)
    if len(samples) > MAX_SAMPLES:
        raise InputError(f"{len(samples)} samples; at most {MAX_SAMPLES} per check")
    out = []
    for s in samples:
        t = _sample(s)
        if len(t) == 1 and spec.values_per_gear > 1:  # one size for every varying value
            t = _widen(spec, t[0])
        if len(t) != spec.values_per_gear:
            raise InputError(f"sample {s!r} has {len(t)} values, the model's gears have "
                             f"{spec.values_per_gear}")
        if not any(all(g >= v for g, v in zip(gear, t, strict=True)) for gear in spec.gears):
            raise GearMismatchError(f"sample {t} is covered by no gear (the gears: "
                                    f"{'; '.join(','.join(map(str, g)) for g in spec.gears)})"
                                    "; a sample must fit in some gear")
        out.append(t)
    return out


def _sample(s: Sequence[int] | int) -> tuple[int, ...]:
    """One sample as ints >= 1 (no bool, no float): InputError naming it otherwise."""
    values = (s,) if isinstance(s, int | np.integer) else tuple(s)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise InputError(f"sample {s!r}: request values are integers >= 1")
    return tuple(int(v) for v in values)


def _widen(spec: GearSpec, size: int) -> tuple[int, ...]:
    """One size for a model with tied values: every value that varies between gears takes
    it, the others keep their (constant) value."""
    first = spec.gears[0]
    return tuple(size if any(g[v] != first[v] for g in spec.gears) else first[v]
                 for v in range(spec.values_per_gear))


def _compare(check: OutputCheck, request: tuple[int, ...], got: np.ndarray, want: np.ndarray,
             rtol: float, atol: float) -> None:
    """Fold one sample's output into ``check``, chunk by chunk in the outputs' dtypes."""
    if got.shape != want.shape:
        if check.shape_mismatch is None:
            check.shape_mismatch = (request, got.shape, want.shape)
        return
    if got.size == 0:
        return
    agree, diff, rel, zero = _fold(got, want, rtol, atol)
    check.max_abs = max(check.max_abs, diff)
    check.max_rel = max(check.max_rel, rel)
    check.zero_reference += zero
    if not agree:
        check.failed.append(request)


def _fold(got: np.ndarray, want: np.ndarray, rtol: float,
          atol: float) -> tuple[bool, float, float, int]:
    """Compare two arrays of one shape chunk by chunk in their dtypes: whether they agree
    (integers and booleans equal, floats ``allclose``), the largest absolute and relative
    difference and the values that differ where ``want`` is 0 (:func:`_differences`)."""
    exact = got.dtype.kind in "biu" and want.dtype.kind in "biu"
    g_flat, w_flat = got.reshape(-1), want.reshape(-1)  # views where contiguous
    agree, max_abs, max_rel, zero = True, 0.0, 0.0, 0
    for start in range(0, g_flat.size, CHUNK_ELEMENTS):
        g = g_flat[start:start + CHUNK_ELEMENTS]
        w = w_flat[start:start + CHUNK_ELEMENTS]
        diff, rel, zeros = _differences(g, w, 0.0 if exact else atol)
        max_abs, max_rel, zero = max(max_abs, diff), max(max_rel, rel), zero + zeros
        if exact:
            agree &= bool(np.array_equal(g, w))
        else:
            agree &= bool(np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
    return agree, max_abs, max_rel, zero


def _differences(g: np.ndarray, w: np.ndarray, atol: float = 0.0) -> tuple[float, float, int]:
    """Of one chunk: the largest absolute difference (NaN against NaN is none, NaN against a
    number an infinite one); the largest relative one where the exact value ``w`` is a
    finite non-zero number; and how many values differ by more than ``atol`` where ``w`` is
    0, which have no relative difference (allclose's test there is ``|g| <= atol``)."""
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf: handled below
        diff = np.abs(g64 - w64)
    diff[(g64 == w64) | (np.isnan(g64) & np.isnan(w64))] = 0.0  # inf == inf, NaN vs NaN
    diff[np.isnan(diff)] = np.inf
    ref = np.abs(w64)
    measured = np.isfinite(ref) & (ref > 0)
    with np.errstate(over="ignore"):  # past float64 next to a subnormal: inf, as it is
        rel = np.divide(diff, ref, out=np.zeros_like(diff), where=measured)
    zero = int(np.count_nonzero((w64 == 0) & (diff > atol)))
    return float(diff.max()), float(rel.max()), zero
