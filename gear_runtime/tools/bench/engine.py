"""Per-gear benchmark engine (``gear-runtime bench`` and the demo use it).

For every gear it measures, in the same run and on the same inputs:

* ``execute``: what a service calls: ``Executor.execute(inputs)`` (dims derived from the
  inputs' shapes, exact match, merged staging, run, outputs copied out);
* ``bare``: the backend's own run of the same gear on the executor's pre-bound buffers
  (``BenchSession.run_bound``: no staging, no matching, no output copy). ``execute - bare``
  is the runtime's own overhead per call;
* ``naive``: the naive way to serve a gear: ``session.run(None, feeds)`` on the model's own
  ORT session, each input fed separately from Python, outputs allocated by ORT (with
  resident state, ``state=``, the state inputs too: a cache copied in and out per run);
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
import operator
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsIndex, cast

import numpy as np

from gear_runtime.backends import FACTS
from gear_runtime.backends.bench_hooks import BenchModel, BenchSession
from gear_runtime.errors import InputError
from gear_runtime.progress import progress_bar
from gear_runtime.tools.bench.context import (
    machine_context,
    model_context,
    rss_bytes,
    versions,
)
from gear_runtime.tools.bench.report import (
    MAX_ITERATIONS,
    RUNNERS,
    BenchReport,
    GearBench,
    Stats,
    first_dim,
)
from gear_runtime.tools.common.inputs import check_request_shapes, synthetic_inputs
from gear_runtime.tools.common.source import check_source_inputs

if TYPE_CHECKING:
    import onnx

    from gear_runtime.runtime.executor import Executor
    from gear_runtime.runtime.model import GearModel

InputsFn = Callable[["GearModel", int], Mapping[str, np.ndarray]]

#: The load option that sets a backend's intra-op threads (``threads=`` of :func:`bench_model`).
#: backend -> the load option --threads sets (from the backends' facts)
THREADS_OPTION = {b: f.threads_option for b, f in FACTS.items() if f.threads_option}


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
    session's :meth:`BenchSession.run_bound` (the pre-bound backend run ``execute`` wraps)
    and ``naive_run(feeds)`` :meth:`BenchModel.naive_run` (the model's own runtime, fed from
    Python), where the backend offers these optional hooks
    (:mod:`gear_runtime.backends.bench_hooks`). Backends without them, and sink files, get
    no bare / naive columns."""
    session, backend = executor.session, model.backend_model
    hooks = session if isinstance(session, BenchSession) else None
    extras = backend if isinstance(backend, BenchModel) else None
    if hooks is not None:
        output_bytes = hooks.output_nbytes()
    else:  # what any backend must hold at least: each output at its largest gear
        output_bytes = sum(max(model.output_size(g, k) for g in range(model.gear_count))
                           for k in range(len(model.output_names)))
    return _Handles(bare_run=hooks.run_bound if hooks and hooks.has_bare_run else None,
                    naive_run=extras.naive_run if extras and extras.has_naive_run else None,
                    staging_bytes=int(session.staging.nbytes), output_buffer_bytes=output_bytes,
                    providers=extras.execution_providers if extras else None,
                    path=extras.gear_file_path if extras else None)


# ---- inputs -----------------------------------------------------------------------------------
def default_inputs(model: GearModel, gear: int, seed: int = 0,
                   fill: str = "random") -> dict[str, np.ndarray]:
    """Generic valid-looking inputs of gear ``gear`` for any gear model (seed ``seed + gear``):
    :func:`gear_runtime.tools.common.inputs.synthetic_inputs` (``random``: floats standard normal,
    integers 1, bools True). Pass ``inputs=`` to :func:`bench_model` for models that need
    real data."""
    dtypes = model.info.input_dtype_map
    return synthetic_inputs(dtypes, model.spec.shapes(gear), fill, seed + gear)


def _reference_session(reference: str | os.PathLike[str] | onnx.ModelProto, model: GearModel,
                       shapes: Sequence[Mapping[str, Sequence[int]]],
                       threads: int | None) -> Any:
    """An ORT session of the original dynamic model, checked to take the gear model's inputs
    (names, dtypes, and the ``shapes`` it will be fed)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4  # its errors come back as exceptions; ORT's log is a 2nd line
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
    check_source_inputs(sess, model.info.input_dtype_map,
                        shapes, "the reference model")
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
        # no __index__: the TypeError caught below
        return int(item) if isinstance(item, str) else operator.index(cast(SupportsIndex, item))
    except (TypeError, ValueError):
        return None


# ---- the engine -------------------------------------------------------------------------------
def bench_model(model: GearModel | str | os.PathLike[str], *,
                gears: str | Sequence[int] | None = None, iterations: int = 100,
                warmup: int = 10, threads: int | None = None,
                reference: str | os.PathLike[str] | onnx.ModelProto | None = None,
                inputs: InputsFn | None = None, backend: str = "onnxruntime",
                progress: bool = True, seed: int = 0, copy: bool = True,
                providers: Sequence[str] | None = None,
                request: Mapping[str, Sequence[int]] | None = None, pad: bool = False,
                fill: str = "random",
                load_options: Mapping[str, Any] | None = None,
                batchsize: int | None = None,
                select: Callable[[Executor], None] | None = None,
                max_bytes: int | None = None, state: Mapping[str, str] | None = None,
                in_place_state: bool = False) -> BenchReport:
    """Benchmark every selected gear of ``model`` (a GearModel or a gear file path; with
    ``backend`` acl / mindspore_lite, the backend's own .om / MindIR, ``load_options``
    carrying what it needs: ``device_id``, ``config``, ``input_shape``).

    ``threads`` sets ORT's intra-op threads of every session involved (when the model is
    loaded here and for the reference); ``providers``: ORT's execution providers of the
    model loaded here. ``reference``: the original dynamic ONNX model (the ``dynamic``
    column; none without it). ``inputs(model, gear)`` gives the inputs of a gear (default
    :func:`default_inputs` with ``fill``). ``request``: instead of every gear, time the
    request of these shapes (synthetic inputs, ``fill``) on the gear it selects: its exact
    gear, or with ``pad=True`` the covering one it is padded to. ``copy``: what ``execute``
    is timed with (True: outputs the caller keeps, as services get by default; False: views
    of the executor's buffers, no output copy); ``pad``: ``execute(pad=True)``.
    ``select``: the one gear to time, as a call that sets it on an executor
    (``set_dynamic_batch_size(8)``: ais_bench's --dymBatch / --dymHW / --dymDims); not
    with ``gears`` or ``request``.
    ``batchsize``: ais_bench's --batchsize, the items per run its throughput counts
    (:class:`~gear_runtime.tools.bench.report.AisBenchSummary`; default: per gear, the first
    dim of the first input); nothing that runs changes with it. ``max_bytes``: the
    executor's memory budget (``create_executor(max_bytes=)``). ``state`` /
    ``in_place_state``: the executor's resident state pairs (``create_executor(state=,
    in_place_state=)``): ``execute`` and ``bare`` run with the state resident, as a service
    runs a decode step (its value runs on from step to step, zeros first), while ``naive``
    and ``dynamic`` are fed every input, the state's made like the others.
    ``progress``: a bar on stderr, only when stderr is a terminal (never in a log). Raises
    InputError for bad arguments and when the inputs do not select the gear they were made
    for.
    """
    if not isinstance(iterations, int) or not 1 <= iterations <= MAX_ITERATIONS:
        raise InputError(f"iterations must be an integer in 1..{MAX_ITERATIONS}, got "
                         f"{iterations!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise InputError(f"warmup must be an integer >= 0, got {warmup!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InputError(f"threads must be an integer >= 1, got {threads!r}")
    if batchsize is not None and (not isinstance(batchsize, int) or isinstance(batchsize, bool)
                                  or batchsize < 1):
        raise InputError(f"batchsize must be an integer >= 1, got {batchsize!r}")
    machine = machine_context()  # the load average before this run adds to it
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    # What this call opens it closes: on Ascend a loaded model holds device memory until then.
    with contextlib.ExitStack() as owned:
        if isinstance(model, str | os.PathLike):
            from gear_runtime.runtime.model import load

            path = os.fspath(model)
            options: dict[str, Any] = dict(load_options or {})
            if threads is not None and backend in THREADS_OPTION:
                options[THREADS_OPTION[backend]] = threads
            if providers is not None:
                options["providers"] = list(providers)
            model = owned.enter_context(load(path, backend=backend, **options))
        else:
            path = repr(model)
        rss = rss_bytes()
        executor = owned.enter_context(
            model.create_executor(max_bytes=max_bytes) if state is None else
            model.create_executor(max_bytes=max_bytes, state=dict(state),
                                  in_place_state=in_place_state))
        make_inputs = inputs or (lambda m, g: default_inputs(m, g, seed, fill))
        if select is not None:
            selected = [_selected_gear(model, executor, gears, request, select)]
            checked = [model.spec.shapes(g) for g in selected]
        elif request is None:
            selected = parse_gears(gears, model.gear_count)
            checked = [model.spec.shapes(g) for g in selected]
        else:
            selected, make_inputs = _request_gear(model, executor, gears, request, pad, fill,
                                                  seed)
            checked = [{n: v.shape for n, v in make_inputs(model, selected[0]).items()}]
        handles = _backend_handles(model, executor)

        ref_session, ref_name = None, None
        if reference is not None:
            ref_session = _reference_session(reference, model, checked, threads)
            ref_name = os.fspath(reference) if isinstance(reference, str | os.PathLike) else "proto"

        report = BenchReport(model=path, backend=model.backend, mode=model.mode,
                             iterations=iterations, warmup=warmup, threads=threads,
                             reference=ref_name, rss_after_load_bytes=rss,
                             staging_bytes=handles.staging_bytes,
                             output_buffer_bytes=handles.output_buffer_bytes, copy=copy,
                             state=_state_facts(executor))
        settings = {"backend": model.backend, "providers": handles.providers,
                    "threads": threads, "warmup": warmup, "iterations": iterations,
                    "copy": copy, "seed": seed, "gears": selected, "reference": ref_name,
                    "pad": pad, "fill": fill if inputs is None else "inputs=",
                    "state": executor.state_names or None, "in_place_state": in_place_state,
                    "request": None if request is None else {n: [int(d) for d in s]
                                                             for n, s in request.items()}}
        report.context = {"started": started, "machine": machine, "settings": settings,
                          "versions": versions(),
                          "model": model_context(handles.path or _path_or_none(path), model)}
        with progress_bar(len(selected) * (warmup + iterations), "bench", progress) as bar:
            for g in selected:
                report.gears.append(_bench_gear(model, executor, handles, ref_session, g,
                                                dict(make_inputs(model, g)), iterations, warmup,
                                                bar, copy, pad, batchsize))
        return report


def _selected_gear(model: GearModel, executor: Executor, gears: str | Sequence[int] | None,
                   request: Mapping[str, Sequence[int]] | None,
                   select: Callable[[Executor], None]) -> int:
    """The gear ``select`` sets on ``executor`` (its errors: 145013 for dims of no gear),
    cleared again; InputError when gears or request shapes are chosen too."""
    if request is not None or (gears is not None and not (
            isinstance(gears, str) and gears.strip().lower() == "all")):
        raise InputError("a gear set with --dymBatch / --dymHW / --dymDims is the one gear "
                         "timed: drop --gears and --shapes / --dymShape")
    select(executor)
    dims = executor.dynamic_dims
    executor.clear_dynamic_dims()
    if dims is None:
        raise InputError("the gear flag set no dims")
    return model.gear_of(dims)


def _request_gear(model: GearModel, executor: Executor, gears: str | Sequence[int] | None,
                  request: Mapping[str, Sequence[int]], pad: bool, fill: str,
                  seed: int) -> tuple[list[int], InputsFn]:
    """The one gear the request of shapes ``request`` runs on, and its inputs: InputError
    when gears are chosen too, or when no gear runs it (a hybrid file's dynamic graph is not
    a gear)."""
    if gears is not None and not (isinstance(gears, str) and gears.strip().lower() == "all"):
        raise InputError(f"gears {gears!r} and request shapes exclude each other: the request "
                         "selects its gear")
    dtypes = model.info.input_dtype_map
    names = executor.input_names  # a resident state is not part of a request
    if sorted(request) != sorted(names):
        besides = " besides its state" if executor.state_names else ""
        raise InputError(f"request shapes name {sorted(request)}; give every input of the "
                         f"model{besides}: {', '.join(names)}")
    check_request_shapes(model, request, "request shapes")
    feeds = synthetic_inputs({n: dtypes[n] for n in names}, request, fill, seed)
    executor.execute(feeds, pad=pad)
    gear = executor.last_gear
    if gear is None:
        raise InputError(f"no gear runs the request {dict(request)} (a hybrid file ran it on "
                         "its dynamic-shape graph); bench times gears: give shapes a gear "
                         "covers, with --pad to pad them")
    resident = {n: model.spec.shapes(gear)[n] for n in executor.state_names}
    feeds.update(synthetic_inputs({n: dtypes[n] for n in resident}, resident, fill, seed))
    return [gear], lambda m, g: feeds


def _state_facts(executor: Executor) -> list[dict[str, Any]]:
    """Per resident state pair of ``executor``: its names, how it is kept and its bytes."""
    modes = executor.state_modes
    return [{"input": n, "output": out, "mode": modes[n],
             "bytes": int(np.prod(executor.state[n].shape)) * executor.state[n].dtype.itemsize}
            for n, out in executor.state_names.items()]


def _path_or_none(path: str) -> str | None:
    return path if os.path.isfile(path) else None


def _bench_gear(model: GearModel, executor: Executor, handles: _Handles, ref_session: Any,
                g: int, feeds: dict[str, np.ndarray], iterations: int, warmup: int,
                bar: Any, copy: bool = True, pad: bool = False,
                batchsize: int | None = None) -> GearBench:
    """Time one gear: execute / bare / naive / dynamic interleaved per iteration
    (``batchsize``: ais_bench's, None for the first dim of the first input fed). ``feeds``
    holds every input of the model: ``execute`` takes those the executor does not keep
    resident, the others are fed every input."""
    full, feeds = feeds, {n: feeds[n] for n in executor.input_names}
    executor.execute(feeds, copy=copy, pad=pad)
    if executor.last_gear != g:  # the inputs must select this gear, or the row would lie
        raise InputError(f"the inputs given for gear {g} {model.gears[g]} selected gear "
                         f"{executor.last_gear}; give inputs with gear {g}'s shapes "
                         f"{model.spec.shapes(g)}")
    if ref_session is not None:
        try:
            ref_session.run(None, full)
        except Exception as exc:  # ORT's own types (InvalidArgument, Fail...): one clear line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"the reference model does not match the gear file: it fails on "
                             f"gear {g}'s inputs ({first})") from None
    runners: list[tuple[str, Callable[[], Any]]] = [
        ("execute", lambda: executor.execute(feeds, copy=copy, pad=pad))]
    if handles.bare_run is not None:
        bare_run = handles.bare_run
        runners.append(("bare", lambda: bare_run(g)))
    if handles.naive_run is not None:
        naive_run = handles.naive_run
        runners.append(("naive", lambda: naive_run(full)))
    if ref_session is not None:
        runners.append(("dynamic", lambda: ref_session.run(None, full)))

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
    output_bytes = sum(model.output_size(g, k) for k, n in enumerate(model.output_names)
                       if n in executor.output_names)  # a resident state's are not returned
    items = model.gears[g][0] if model.mode == "batch" else None
    return GearBench(gear=g, dims=tuple(model.gears[g]), shapes=shapes, items=items,
                     execute=Stats.of_ns(samples["execute"]), bare=stats("bare"),
                     overhead_us=overhead, naive=stats("naive"), dynamic=stats("dynamic"),
                     input_bytes=input_bytes, output_bytes=output_bytes,
                     samples_ns={n: samples[n] for n in RUNNERS if n in samples},
                     batchsize=batchsize or first_dim({n: v.shape for n, v in feeds.items()},
                                                      executor.input_names))


__all__ = ["InputsFn", "bench_model", "default_inputs", "parse_gears"]
