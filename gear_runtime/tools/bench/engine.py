"""Per-gear benchmark engine (``gear-runtime bench`` and the demo use it).

For every gear it measures, in the same run and on the same inputs:

* ``execute``: what a service calls: ``Executor.execute(inputs)`` (dims derived from the
  inputs' shapes, exact match, merged staging, run, outputs copied out);
* ``bare``: the backend's own run of the same gear on the executor's pre-bound buffers
  (``BackendSession.run_bound``: no staging, no matching, no output copy). ``execute - bare``
  is the runtime's own overhead per call;
* ``naive``: the naive way to serve a gear: ``session.run(None, feeds)`` on the model's own
  ORT session, each input fed separately from Python, outputs allocated by ORT;
* ``dynamic``: a separate plain ONNX Runtime session of the ORIGINAL dynamic-shape model on
  the same inputs (when it is given: ``reference=``). ``dynamic / execute`` is the gear
  executor's speed-up.

The four runs of one iteration are interleaved, so slow drifts of the machine (frequency,
other processes) hit every column alike, and their order is shuffled every iteration (seeded),
so no column always runs right after another one (warm caches, a spinning thread pool); the
overhead is the median of the per-iteration differences ``execute_i - bare_i``.

A run's JSON (:meth:`BenchReport.to_dict`) carries its context: the machine (CPU model,
cores, load average at the start), the settings (threads, warm-up, iterations, copy mode,
backend and providers), the versions and the model (files, size, digest, gears), and per gear
every runner's raw per-iteration times besides their statistics, so that two runs can be
compared later (:mod:`gear_runtime.tools.bench.compare`, ``gear-runtime bench --compare``).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import operator
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gear_runtime.errors import BackendUnavailableError, InputError
from gear_runtime.tools.textfmt import format_bytes
from gear_runtime.tools.textfmt import format_table as text_table

if TYPE_CHECKING:
    import onnx

    from gear_runtime.runtime.executor import Executor
    from gear_runtime.runtime.model import GearModel

InputsFn = Callable[["GearModel", int], Mapping[str, np.ndarray]]

#: The JSON layout written by :meth:`BenchReport.to_dict` (read back by bench_compare).
SCHEMA = "gear-runtime-bench/2"
#: The runners in the order tables, JSON and plots show them.
RUNNERS = ("execute", "bare", "naive", "dynamic")


# ---- statistics -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stats:
    """Latency statistics of one runner on one gear, in milliseconds."""

    p50: float
    p90: float
    p99: float
    mean: float
    min: float

    @classmethod
    def of_ns(cls, samples_ns: Sequence[int]) -> Stats:
        """Stats of per-call durations in nanoseconds (at least one sample)."""
        ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(float(p50), float(p90), float(p99), float(ms.mean()), float(ms.min()))

    def to_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean,
                "min": self.min}


@dataclass(frozen=True)
class GearBench:
    """One gear's results. Times in ms; ``overhead_us`` in microseconds; bytes for memory."""

    gear: int
    dims: tuple[int, ...]
    shapes: dict[str, tuple[int, ...]]
    #: items per run (the batch) in dynamic batch mode; None where no batch dim exists.
    items: int | None
    execute: Stats
    bare: Stats | None
    overhead_us: float | None
    naive: Stats | None
    dynamic: Stats | None
    #: bytes this gear stages (its inputs + the dims buffer) and returns (its outputs).
    input_bytes: int
    output_bytes: int
    #: per runner, every timed iteration's duration in ns, in the order they ran.
    samples_ns: dict[str, list[int]] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Items/s in batch mode, else runs/s (from the mean latency of ``execute``)."""
        return (self.items or 1) * 1e3 / self.execute.mean

    @property
    def throughput_unit(self) -> str:
        return "items/s" if self.items is not None else "runs/s"

    @property
    def speedup_vs_dynamic(self) -> float | None:
        """p50 of the original dynamic model / p50 of execute (> 1: the gear is faster)."""
        return self.dynamic.p50 / self.execute.p50 if self.dynamic is not None else None

    @property
    def speedup_vs_naive(self) -> float | None:
        """p50 of the naive per-input session.run / p50 of execute."""
        return self.naive.p50 / self.execute.p50 if self.naive is not None else None

    def to_dict(self) -> dict[str, Any]:
        """Each figure once: ``<runner>_ms`` statistics (None where the runner did not run)
        and ``samples_ns``, the raw per-iteration times of every runner that ran."""
        def opt(s: Stats | None) -> dict[str, float] | None:
            return s.to_dict() if s is not None else None

        return {
            "gear": self.gear,
            "dims": list(self.dims),
            "shapes": {n: list(s) for n, s in self.shapes.items()},
            "items": self.items,
            "execute_ms": self.execute.to_dict(),
            "throughput": {"value": self.throughput, "unit": self.throughput_unit},
            "bare_ms": opt(self.bare),
            "overhead_us": self.overhead_us,
            "naive_ms": opt(self.naive),
            "dynamic_ms": opt(self.dynamic),
            "speedup_vs_dynamic": self.speedup_vs_dynamic,
            "speedup_vs_naive": self.speedup_vs_naive,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "samples_ns": {k: list(map(int, v)) for k, v in self.samples_ns.items()},
        }


@dataclass
class BenchReport:
    """A whole benchmark run: the setup, memory, and one :class:`GearBench` per gear."""

    model: str
    backend: str
    mode: str
    iterations: int
    warmup: int
    threads: int | None
    #: where the dynamic column came from: a file path, "proto", or None.
    reference: str | None
    rss_after_load_bytes: int | None
    staging_bytes: int
    output_buffer_bytes: int
    gears: list[GearBench] = field(default_factory=list)
    #: execute(copy=...): True returns outputs the caller keeps, False views (no copy).
    copy: bool = True
    #: machine, settings, versions and model of the run (see :func:`run_context`).
    context: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: ``schema``, ``context`` (the setup lives there only), ``memory``
        and ``gears``."""
        return {
            "schema": SCHEMA,
            "context": self.context,
            "memory": {"rss_after_load_bytes": self.rss_after_load_bytes,
                       "executor_staging_bytes": self.staging_bytes,
                       "executor_output_bytes": self.output_buffer_bytes},
            "gears": [g.to_dict() for g in self.gears],
        }

    def table(self) -> str:
        """The human table: one row per gear, then the memory and setup lines."""
        return format_table(self)


# ---- what the comparison columns run -----------------------------------------------------------
@dataclass
class _Handles:
    """What the comparison columns need from the backend; None where it has no such thing."""

    bare_run: Callable[[int], Any] | None
    naive_run: Callable[[Mapping[str, np.ndarray]], Any] | None
    staging_bytes: int
    output_buffer_bytes: int
    #: ORT's execution providers of the model's session (None on other backends).
    providers: list[str] | None = None
    #: the gear file the backend loaded, when the backend says.
    path: str | None = None


def _backend_handles(model: GearModel, executor: Executor) -> _Handles:
    """The comparison columns, from public interfaces only: ``bare_run(g)`` is the executor's
    session's :meth:`BackendSession.run_bound` (the pre-bound backend run ``execute`` wraps)
    where the backend has such a split; ``naive_run(feeds)`` is
    :meth:`BackendModel.naive_run` (the model's own runtime, fed from Python). Backends
    without them, and sink files, get no bare / naive columns."""
    session, backend = executor.session, model.backend_model
    output_bytes = session.output_nbytes()
    if output_bytes is None:  # what any backend must hold at least: each output at its largest
        output_bytes = sum(max(model.output_size(g, k) for g in range(model.gear_count))
                           for k in range(len(model.output_names)))
    return _Handles(bare_run=session.run_bound if session.has_bare_run else None,
                    naive_run=backend.naive_run if backend.has_naive_run else None,
                    staging_bytes=int(session.staging.nbytes), output_buffer_bytes=output_bytes,
                    providers=backend.execution_providers, path=backend.gear_file_path)


# ---- inputs and memory ------------------------------------------------------------------------
def default_inputs(model: GearModel, gear: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Generic valid-looking inputs for any gear model: floats standard normal (seeded),
    integers 1 (a valid index into any table of two or more rows, and a mask of ones),
    bools True. Pass ``inputs=`` to :func:`bench_model` for models that need real data.
    """
    rng = np.random.default_rng(seed + gear)
    shapes = model.spec.shapes(gear)
    out: dict[str, np.ndarray] = {}
    for name, dtype in zip(model.input_names, model.info.input_dtypes, strict=True):
        dt = np.dtype(dtype)
        if np.issubdtype(dt, np.floating):
            out[name] = rng.standard_normal(shapes[name]).astype(dt)
        else:  # ints and bools
            out[name] = np.ones(shapes[name], dtype=dt)
    return out


def rss_bytes() -> int | None:
    """Resident set size of this process (psutil when installed, else /proc), or None."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.Process().memory_info().rss)
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# ---- the context of a run ---------------------------------------------------------------------
def machine_context() -> dict[str, Any]:
    """The machine now: CPU model, logical cores (all, and those this process may use), the
    1/5/15-minute load average (None where the OS has none) and the platform."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "usable_cores": usable,
            "load_average": load, "platform": platform.platform()}


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8",
                                             errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def versions() -> dict[str, str | None]:
    """Versions of what the timings depend on (None: not installed)."""
    from gear_runtime.version import __version__

    ort_version = None
    with contextlib.suppress(ImportError):
        import onnxruntime

        ort_version = onnxruntime.__version__
    return {"gear_runtime": __version__, "onnxruntime": ort_version, "numpy": np.__version__,
            "python": platform.python_version()}


def model_files(path: str) -> list[str]:
    """The gear file and the data files it names (absolute paths, in a fixed order)."""
    from gear_runtime.gearfile.reader import read_gear_file

    return [os.path.abspath(f) for f in read_gear_file(path).files]


def files_digest(files: Sequence[str]) -> str:
    """A fast digest of the files' bytes, prefixed with its algorithm: ``xxh3_128:<hex>``
    when xxhash is installed, else ``blake2b:<hex>``. Each file's length goes in first, so
    moving bytes from one file to the next changes the digest."""
    try:
        import xxhash

        h: Any = xxhash.xxh3_128()
        name = "xxh3_128"
    except ImportError:
        h, name = hashlib.blake2b(digest_size=16), "blake2b"
    for f in files:
        h.update(os.path.getsize(f).to_bytes(8, "little"))
        with open(f, "rb") as src:
            while chunk := src.read(1 << 22):
                h.update(chunk)
    return f"{name}:{h.hexdigest()}"


def model_context(path: str | None, model: GearModel) -> dict[str, Any]:
    """What identifies the model: path, files, total bytes, digest, mode and gears (path,
    files, bytes and digest None when the gear file is not known)."""
    files = model_files(path) if path is not None and os.path.isfile(path) else None
    return {"path": os.path.abspath(path) if path is not None else None, "files": files,
            "bytes": sum(os.path.getsize(f) for f in files) if files else None,
            "digest": files_digest(files) if files else None, "mode": model.mode,
            "gears": [list(g) for g in model.gears]}


def _reference_session(reference: str | os.PathLike[str] | onnx.ModelProto,
                       names: Sequence[str], threads: int | None) -> Any:
    """An ORT session of the original dynamic model, checked to take the gear model's inputs."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads is not None:
        so.intra_op_num_threads = threads
    if isinstance(reference, str | os.PathLike):
        if not Path(reference).is_file():
            raise InputError(f"reference model {os.fspath(reference)!r} does not exist")
        source: Any = os.fspath(reference)
    else:
        source = reference.SerializeToString()
    try:
        sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own exception types: one message naming the file
        raise InputError(f"reference model could not be loaded by onnxruntime: {exc}") from None
    ref_inputs = [i.name for i in sess.get_inputs()]
    if sorted(ref_inputs) != sorted(names):
        raise InputError(f"reference model inputs {ref_inputs} differ from the gear model's "
                         f"inputs {list(names)}")
    return sess


def parse_gears(text: str | Sequence[int] | None, gear_count: int) -> list[int]:
    """``"all"`` / None -> every gear; ``"0,2"`` or ``[0, 2]`` -> those (checked, in order).

    InputError for anything else: an index out of range, or one that is not an integer (a
    float such as 1.5 is refused, never truncated to another gear).
    """
    if text is None or (isinstance(text, str) and text.strip().lower() == "all"):
        return list(range(gear_count))
    expected = f"expected 'all' or indices like 0,2 in 0..{gear_count - 1}"
    try:
        items = ([p.strip() for p in text.split(",") if p.strip()] if isinstance(text, str)
                 else list(text))
    except TypeError:  # not iterable, e.g. a bare 2
        raise InputError(f"gears: {text!r} is not a gear list; {expected}") from None
    gears: list[int] = []
    for item in items:
        g = _gear_index(item)
        if g is None:
            raise InputError(f"gears: {item!r} is not a gear index; {expected}")
        if not 0 <= g < gear_count:
            raise InputError(f"gears: index {g} is out of range: the model has {gear_count} "
                             f"gears (0..{gear_count - 1})")
        if g not in gears:
            gears.append(g)
    if not gears:
        raise InputError(f"gears: no gear given in {text!r}; expected 'all' or indices like 0,2")
    return gears


def _gear_index(item: object) -> int | None:
    """``item`` as an index: the text of an integer, or an integer; None for anything else
    (1.5 and True are not indices: int() would quietly make them gear 1)."""
    if isinstance(item, bool):
        return None
    try:
        return int(item) if isinstance(item, str) else operator.index(item)
    except (TypeError, ValueError):
        return None


# ---- the engine -------------------------------------------------------------------------------
def bench_model(model: GearModel | str | os.PathLike[str], *,
                gears: str | Sequence[int] | None = None, iterations: int = 100,
                warmup: int = 10, threads: int | None = None,
                reference: str | os.PathLike[str] | onnx.ModelProto | None = None,
                inputs: InputsFn | None = None, backend: str = "onnxruntime",
                progress: bool = True, seed: int = 0, copy: bool = True) -> BenchReport:
    """Benchmark every selected gear of ``model`` (a GearModel or a gear file path).

    ``threads`` sets ORT's intra-op threads of every session involved (when the model is
    loaded here and for the reference). ``reference``: the original dynamic ONNX model (the
    ``dynamic`` column; none without it). ``inputs(model, gear)``
    gives the inputs of a gear (default :func:`default_inputs`). ``copy``: what ``execute``
    is timed with (True: outputs the caller keeps, as services get by default; False: views
    of the executor's buffers, no output copy). ``progress``: a bar on stderr, only when
    stderr is a terminal (never in a log). Raises InputError for bad arguments and when the
    inputs do not select the gear they were made for.
    """
    if not isinstance(iterations, int) or iterations < 1:
        raise InputError(f"iterations must be an integer >= 1, got {iterations!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise InputError(f"warmup must be an integer >= 0, got {warmup!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InputError(f"threads must be an integer >= 1, got {threads!r}")
    machine = machine_context()  # the load average before this run adds to it
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    # What this call opens it closes: on Ascend a loaded model holds device memory until then.
    with contextlib.ExitStack() as owned:
        if isinstance(model, str | os.PathLike):
            from gear_runtime.runtime.model import load

            path = os.fspath(model)
            options: dict[str, Any] = {}
            if threads is not None and backend == "onnxruntime":
                options["intra_op_num_threads"] = threads
            model = owned.enter_context(load(path, backend=backend, **options))
        else:
            path = repr(model)
        rss = rss_bytes()
        selected = parse_gears(gears, model.gear_count)
        executor = owned.enter_context(model.create_executor())
        handles = _backend_handles(model, executor)

        ref_session, ref_name = None, None
        if reference is not None:
            ref_session = _reference_session(reference, model.input_names, threads)
            ref_name = os.fspath(reference) if isinstance(reference, str | os.PathLike) else "proto"

        report = BenchReport(model=path, backend=model.backend, mode=model.mode,
                             iterations=iterations, warmup=warmup, threads=threads,
                             reference=ref_name, rss_after_load_bytes=rss,
                             staging_bytes=handles.staging_bytes,
                             output_buffer_bytes=handles.output_buffer_bytes, copy=copy)
        settings = {"backend": model.backend, "providers": handles.providers,
                    "threads": threads, "warmup": warmup, "iterations": iterations,
                    "copy": copy, "seed": seed, "gears": selected, "reference": ref_name}
        report.context = {"started": started, "machine": machine, "settings": settings,
                          "versions": versions(),
                          "model": model_context(handles.path or _path_or_none(path), model)}
        make_inputs = inputs or (lambda m, g: default_inputs(m, g, seed))
        with progress_bar(len(selected) * (warmup + iterations), "bench", progress) as bar:
            for g in selected:
                report.gears.append(_bench_gear(model, executor, handles, ref_session, g,
                                                dict(make_inputs(model, g)), iterations, warmup,
                                                bar, copy))
        return report


def _path_or_none(path: str) -> str | None:
    return path if os.path.isfile(path) else None


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (a log file, a pipe or a closed stream is not)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def progress_bar(total: int, desc: str, progress: bool) -> Any:
    """A tqdm bar on stderr, drawn only when ``progress`` and stderr is a terminal: in a log
    (stdout and stderr in one file) a bar's carriage returns land in the middle of lines."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="it", file=sys.stderr, leave=False,
                disable=not progress or not stderr_is_terminal())


def _bench_gear(model: GearModel, executor: Executor, handles: _Handles, ref_session: Any,
                g: int, feeds: dict[str, np.ndarray], iterations: int, warmup: int,
                bar: Any, copy: bool = True) -> GearBench:
    """Time one gear: execute / bare / naive / dynamic interleaved per iteration."""
    executor.execute(feeds, copy=copy)
    if executor.last_gear != g:  # the inputs must select this gear, or the row would lie
        raise InputError(f"the inputs given for gear {g} {model.gears[g]} selected gear "
                         f"{executor.last_gear}; give inputs with gear {g}'s shapes "
                         f"{model.spec.shapes(g)}")
    runners: list[tuple[str, Callable[[], Any]]] = [
        ("execute", lambda: executor.execute(feeds, copy=copy))]
    if handles.bare_run is not None:
        bare_run = handles.bare_run
        runners.append(("bare", lambda: bare_run(g)))
    if handles.naive_run is not None:
        naive_run = handles.naive_run
        runners.append(("naive", lambda: naive_run(feeds)))
    if ref_session is not None:
        runners.append(("dynamic", lambda: ref_session.run(None, feeds)))

    clock = time.perf_counter_ns
    samples: dict[str, list[int]] = {name: [] for name, _ in runners}
    order = np.random.default_rng(g)
    for i in range(warmup + iterations):
        # "bare" runs on what execute staged (before the loop, or earlier in this iteration:
        # only this executor writes its staging and it always stages gear g's inputs), so it
        # computes the same thing whatever the order.
        for k in order.permutation(len(runners)):
            name, run = runners[k]
            t0 = clock()
            run()
            t1 = clock()
            if i >= warmup:
                samples[name].append(t1 - t0)
        bar.update(1)

    def stats(name: str) -> Stats | None:
        return Stats.of_ns(samples[name]) if name in samples else None

    overhead = None
    if "bare" in samples:
        diffs = np.subtract(samples["execute"], samples["bare"])
        overhead = float(np.median(diffs)) / 1e3
    shapes = model.spec.shapes(g)
    input_bytes = sum(int(v.nbytes) for v in feeds.values()) + 4 * model.spec.values_per_gear
    output_bytes = sum(model.output_size(g, k) for k in range(len(model.output_names)))
    items = model.gears[g][0] if model.mode == "batch" else None
    return GearBench(gear=g, dims=tuple(model.gears[g]), shapes=shapes, items=items,
                     execute=Stats.of_ns(samples["execute"]), bare=stats("bare"),
                     overhead_us=overhead, naive=stats("naive"), dynamic=stats("dynamic"),
                     input_bytes=input_bytes, output_bytes=output_bytes,
                     samples_ns={n: samples[n] for n in RUNNERS if n in samples})


# ---- output -------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(report: BenchReport) -> str:
    """Fixed-width table: latency percentiles, throughput, overhead, comparison columns."""
    header = ["gear", "dims", "p50 ms", "p90 ms", "p99 ms", "throughput", "bare p50",
              "overhead us", "naive p50", "x naive", "dynamic p50", "x dynamic"]
    rows = [header]
    for r in report.gears:
        rows.append([
            str(r.gear), ",".join(map(str, r.dims)),
            _fmt(r.execute.p50, ".3f"), _fmt(r.execute.p90, ".3f"), _fmt(r.execute.p99, ".3f"),
            f"{r.throughput:,.0f} {r.throughput_unit}",
            _fmt(r.bare.p50 if r.bare else None, ".3f"), _fmt(r.overhead_us, ".1f"),
            _fmt(r.naive.p50 if r.naive else None, ".3f"), _fmt(r.speedup_vs_naive, ".2f"),
            _fmt(r.dynamic.p50 if r.dynamic else None, ".3f"),
            _fmt(r.speedup_vs_dynamic, ".2f"),
        ])
    lines = text_table(rows, right=lambda c: c >= 2, rule=True)
    threads = report.threads if report.threads is not None else "ORT default"
    lines += [
        "",
        f"model: {report.model} ({report.backend}, {report.mode} mode), "
        f"{report.iterations} iterations after {report.warmup} warm-up, threads: {threads}",
        *column_notes(report.copy, report.reference),
        f"memory: process RSS after load {format_bytes(report.rss_after_load_bytes)}; executor "
        f"staging {format_bytes(report.staging_bytes)} + outputs "
        f"{format_bytes(report.output_buffer_bytes)}",
    ]
    return "\n".join(lines)


def column_notes(copy: bool, reference: str | None) -> list[str]:
    """What each column of the table includes: the lines printed under it."""
    if copy:
        execute = ("execute(copy=True) = gear match + input staging + backend run + outputs "
                   "returned in arrays the caller keeps")
        overhead = "includes the output copy (without it: --no-copy)"
    else:
        execute = ("execute(copy=False) = gear match + input staging + backend run; outputs "
                   "are views of the executor's buffers")
        overhead = "no output copy"
    return [
        f"{execute}; p50/p90/p99 and throughput are of execute",
        "bare = the backend's run of the same gear on the executor's pre-bound buffers "
        "(no staging, no copy)",
        f"overhead us = median over iterations of (execute - bare): {overhead}",
        "naive = session.run(None, feeds) on the model's session; dynamic = ONNX Runtime on the "
        f"original dynamic model ({reference or 'not known: pass --reference'}); "
        "x = their p50 / execute p50",
    ]


#: One colour per runner, the same in every plot.
RUNNER_COLORS = {"execute": "tab:blue", "bare": "tab:green", "naive": "tab:orange",
                 "dynamic": "tab:red"}


def plot_report(report: BenchReport, path: str | os.PathLike[str]) -> Path:
    """Write a PNG of two panels, both on a log latency scale so that slow outliers do not
    flatten fast gears: left, per gear and runner the median (dot) with its p90 (bar) and p99
    (cross) markers; right, the distribution of every iteration per gear and runner (box:
    quartiles; whiskers: p5-p95; beyond them each iteration as a dot).

    Raises BackendUnavailableError naming the package when matplotlib is not installed, and
    InputError when the file cannot be written.
    """
    plt = pyplot()
    runners = [n for n in RUNNERS if all(getattr(r, n) is not None for r in report.gears)]
    labels = [f"{r.gear}: {','.join(map(str, r.dims))}" for r in report.gears]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(11.0, 2.4 * len(labels) + 4), 4.8))
    x = np.arange(len(labels))
    width = 0.8 / len(runners)
    for k, name in enumerate(runners):
        pos = x + (k - (len(runners) - 1) / 2) * width
        _percentile_markers(left, pos, [getattr(r, name) for r in report.gears], name)
        samples = [np.asarray(r.samples_ns.get(name, []), dtype=np.float64) / 1e6
                   for r in report.gears]
        if all(len(v) for v in samples):
            draw_boxes(right, pos, samples, width * 0.85, RUNNER_COLORS[name])
    for ax in (left, right):
        log_ms_axis(ax)
        ax.set_xticks(x, labels, rotation=20 if len(labels) > 4 else 0)
        ax.set_xlabel("gear: dynamic dims")
        ax.grid(axis="y", which="both", alpha=0.3)
    left.set_ylabel("latency ms (log)")
    left.set_title("median (dot), p90 (bar), p99 (cross)")
    right.set_title("every iteration: box p25-p75, whiskers p5-p95")
    _runner_legend(left, runners)
    fig.suptitle(_report_title(report), fontsize=10)
    fig.tight_layout()
    return save_figure(plt, fig, path)


def _percentile_markers(ax: Any, pos: np.ndarray, stats: Sequence[Stats], name: str) -> None:
    """Median, p90 and p99 of one runner per gear, joined by a thin line (median to p99)."""
    color = RUNNER_COLORS[name]
    p50, p90, p99 = (np.array([getattr(s, q) for s in stats]) for q in ("p50", "p90", "p99"))
    ax.vlines(pos, p50, p99, colors=color, linewidth=1, alpha=0.6)
    ax.plot(pos, p50, "o", color=color, markersize=7, label=name)
    ax.plot(pos, p90, "_", color=color, markersize=14, markeredgewidth=2)
    ax.plot(pos, p99, "x", color=color, markersize=7)


def draw_boxes(ax: Any, pos: np.ndarray, samples: Sequence[np.ndarray], width: float,
           color: str) -> None:
    """One box per gear of every iteration's latency (whiskers p5-p95, outliers as dots)."""
    parts = ax.boxplot(samples, positions=pos, widths=width, whis=(5, 95), patch_artist=True,
                       manage_ticks=False, flierprops={"marker": ".", "markersize": 3,
                                                       "markerfacecolor": color,
                                                       "markeredgecolor": color, "alpha": 0.5},
                       medianprops={"color": "black", "linewidth": 1.5})
    for box in parts["boxes"]:
        box.set_facecolor(color)
        box.set_alpha(0.55)
    for line in parts["medians"]:
        line.set_gid("median")


def log_ms_axis(ax: Any) -> None:
    """A log latency axis labelled in plain numbers at 1-2-5 steps (0.1, 0.2, 0.5, 1 ...):
    matplotlib's default labels only the powers of ten, often one or none in range."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _runner_legend(ax: Any, runners: Sequence[str]) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=RUNNER_COLORS[n], marker="o", linestyle="", label=n)
               for n in runners]
    handles += [Line2D([], [], color="gray", marker=m, linestyle="", markersize=s, label=q,
                       markeredgewidth=2 if m == "_" else 1)
                for m, s, q in (("o", 7, "p50"), ("_", 14, "p90"), ("x", 7, "p99"))]
    ax.legend(handles=handles, fontsize=8, ncol=2)


def _report_title(report: BenchReport) -> str:
    machine = report.context.get("machine", {})
    threads = report.threads if report.threads is not None else "ORT default"
    return (f"gear-runtime bench: {Path(report.model).name} ({report.backend}), "
            f"{report.iterations} iterations, threads {threads}, copy={report.copy}"
            + (f"\n{machine.get('cpu')}, {machine.get('usable_cores')} cores"
               if machine else ""))


def save_figure(plt: Any, fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as a PNG at ``path`` and close it; InputError when it cannot be written."""
    out = Path(path)
    try:
        fig.savefig(out, format="png", dpi=100)
    except OSError as exc:
        raise InputError(f"cannot write the plot to {os.fspath(out)!r}: {exc}") from None
    finally:
        plt.close(fig)
    return out


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a clear error naming what to install."""
    try:
        import matplotlib
    except ImportError:
        raise BackendUnavailableError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib "
            "(or pip install 'gear_runtime[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_plotting() -> None:
    """Raise the missing-matplotlib error now (before a long benchmark), else nothing."""
    pyplot()


__all__ = [
    "BenchReport",
    "GearBench",
    "Stats",
    "bench_model",
    "check_plotting",
    "default_inputs",
    "column_notes",
    "draw_boxes",
    "log_ms_axis",
    "files_digest",
    "format_table",
    "machine_context",
    "model_context",
    "parse_gears",
    "plot_report",
    "progress_bar",
    "pyplot",
    "rss_bytes",
    "save_figure",
    "versions",
]
