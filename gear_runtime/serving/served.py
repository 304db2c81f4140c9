"""A served model: the loaded gear model, its pool of executors (serving/pool.py), and its
batcher (serving/batcher.py).

Executors are bound to threads: the pool has N worker threads and each creates ONE executor
on its first task and keeps it for its whole life, so an executor is never entered by two
threads (the executor would refuse with ExecutorBusyError) and on CUDA its graphs are
captured on the thread that replays them. Requests are checked against the model before they
queue, so a request the model can check up front never spoils a batch and never reaches an
executor; one that fails only in the run (a token id past an embedding table) makes its
batch run request by request (:class:`~gear_runtime.serving.batcher.Batcher`), so it alone
fails.

A served model counts the requests using it (:meth:`ServedModel.use`): a model replaced or
unloaded through the model repository is closed only once its last request is answered.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from gear_runtime.backends import facts
from gear_runtime.errors import ClosedError, GearMismatchError, InputError
from gear_runtime.serving.batcher import NOT_HERE, Batcher, BatchPlan, run_batch
from gear_runtime.serving.deadline import Deadline
from gear_runtime.serving.errors import QueueFullError
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.options import DEFAULT_SEQUENCE_SLOTS, ServeOptions, request_limit
from gear_runtime.serving.pool import ExecutorPool, PoolBatches
from gear_runtime.serving.protocol import MODEL_VERSION, InferRequest, datatype_of
from gear_runtime.serving.sequences import SequenceSlots, sequence_control
from gear_runtime.serving.start import StartModel, merged_shape, request_arrays
from gear_runtime.serving.stats import ModelStats, RunTiming


class ServedModel:
    """One model behind the server: metadata, request checks, execution (batched or not)."""

    def __init__(self, name: str, model: Any, options: ServeOptions, metrics: Metrics,
                 path: str | None = None, version: str = MODEL_VERSION) -> None:
        self.name, self.model, self.options, self.metrics = name, model, options, metrics
        self.path, self.version = path, version
        #: set by a model repository's Triton layout (serving/triton_config.py): every
        #: version served under the name (metadata), the version policy (configuration),
        #: and False where config.pbtxt says max_batch_size 0 (axis 0 is then no batch
        #: axis to clients, and the configuration's dims keep it)
        self.versions: tuple[str, ...] = (version,)
        self.version_policy: dict[str, Any] = {"latest": {"num_versions": 1}}
        self.batch_axis = True
        spec = model.spec
        state = dict(options.state)
        #: the state pairs' names: neither a request nor an answer carries them
        self.state_names = set(state) | set(state.values())
        keep = [i for i, n in enumerate(spec.input_names) if n not in state]
        self._names = [spec.input_names[i] for i in keep]
        self._dtypes = [np.dtype(model.info.input_dtypes[i]) for i in keep]
        self._datatypes = [datatype_of(d) for d in self._dtypes]
        self._shapes = [tuple(spec.input_shapes[i]) for i in keep]
        #: every input's rank, summed: a dynamic_dims of this length is full dims
        self._ranks = sum(len(s) for s in spec.input_shapes)
        #: the outputs a request is answered with (model order, state outputs left out)
        self.output_names = [n for n in model.output_names if n not in self.state_names]
        self.max_request_bytes = options.max_body_bytes or request_limit(model)
        self.stats = ModelStats(name, version)
        #: the sequence slots of a stateful model (None: stateless, served by the pool)
        self.sequences: SequenceSlots | None = None
        #: the start model (None: a start runs the step model like any step)
        self.start: StartModel | None = None
        if state:
            self.sequences = sequences = SequenceSlots(
                model, state, options.max_sequences or DEFAULT_SEQUENCE_SLOTS, name,
                options.sequence_idle_s, on_event=partial(metrics.sequence, name),
                in_place=options.in_place_state, max_waiting=options.max_queue)
            metrics.track_sequences(name, lambda: sequences.live)
            if options.sequence_start is not None:
                self.start = StartModel(options.sequence_start, model, state,
                                        self.output_names, options)
        # a stateful model's requests run on their sequences' executors: its pool has one
        # thread and never makes an executor
        self.pool = ExecutorPool(model, 1 if state else options.executors, name)
        self.plan, _ = BatchPlan.for_model(model.dispatcher, model.info.output_shapes)
        self.batcher: Batcher | None = None
        if options.batching and self.plan is not None and not state:
            batches = PoolBatches(self.pool, self._timed_batch, self.plan.gear_for)
            self.batcher = Batcher(self.plan, batches,
                                   max_delay_s=options.max_batch_delay_ms / 1000,
                                   slots=options.executors, on_batch=self._count_batch,
                                   wait_when_idle=options.batch_wait_when_idle)
        self._users = 0
        self._unused: asyncio.Event | None = None
        metrics.track_queue(name, self.queue_depth)
        if not state:
            self.pool.warm_up()

    def queue_depth(self) -> int:
        """Requests admitted and not yet running."""
        return (self.pool.waiting + (len(self.batcher) if self.batcher else 0)
                + (self.sequences.waiting if self.sequences else 0))

    def gear_label(self, gear: int | None) -> str:
        """The metrics label of gear index ``gear``: its dims, or "dynamic" (hybrid miss)."""
        return "dynamic" if gear is None else ",".join(map(str, self.model.gears[gear]))

    @contextmanager
    def use(self) -> Iterator[ServedModel]:
        """Count one request using this model for the time of the ``with``."""
        self._users += 1
        try:
            yield self
        finally:
            self._users -= 1
            if not self._users and self._unused is not None:
                self._unused.set()

    async def retire(self) -> None:
        """Close once the requests using the model now are answered (a hot swap or an
        unload: the model is already out of the server's table, so no new request comes)."""
        if self._users:
            self._unused = asyncio.Event()
            await self._unused.wait()
        await self.close()

    def refuse_waiting(self) -> None:
        """Past the drain deadline: requests not started yet fail with ClosedError (503);
        those running finish."""
        self.pool.refusing = True
        if self.sequences is not None:
            self.sequences.refusing = True
        if self.batcher is not None:
            self.batcher.fail_waiting(ClosedError(
                "the server is shutting down (past its drain deadline): retry on another "
                "replica"))

    # ---- what the model is ---------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        """v2 model metadata, with the gears (and whether requests are batched) as
        parameters; -1 marks an axis that differs between gears."""
        info = self.model.info
        outputs = [{"name": n, "datatype": datatype_of(dt), "shape": shape}
                   for n, dt, shape in zip(info.output_names, info.output_dtypes,
                                           self._output_shapes(), strict=True)
                   if n not in self.state_names]
        inputs = [{"name": n, "datatype": d, "shape": list(s)}
                  for n, d, s in zip(self._names, self._datatypes, self._shapes, strict=True)]
        params: dict[str, Any] = {"mode": self.model.mode,
                                  "gears": [list(g) for g in self.model.gears],
                                  "batching": self.batcher is not None,
                                  "pad": self.options.pad and self.batcher is None}
        if self.batcher is not None:
            params["max_batch_delay_ms"] = self.options.max_batch_delay_ms
        if self.sequences is not None:
            params["sequences"] = {"max": self.sequences.size,
                                   "idle_seconds": self.sequences.idle_s,
                                   "state": dict(self.options.state)}
            if self.start is not None:  # what a sequence_start request carries
                params["sequences"]["start"] = self.start.describe()
        return {"name": self.name, "versions": list(self.versions),
                "platform": f"gear_runtime_{self.model.backend}", "inputs": inputs,
                "outputs": outputs, "parameters": params}

    def _output_shapes(self) -> list[list[int]]:
        info = self.model.info
        return [merged_shape([g[k] for g in info.output_shapes])
                for k in range(len(info.output_names))]

    def config(self) -> dict[str, Any]:
        """The model configuration in Triton's schema (ModelConfig of model_config.proto, as
        Triton's HTTP API writes it). ``max_batch_size`` is the largest batch gear when the
        model batches on axis 0 of every input and output (then ``dims`` leave the batch
        out, as Triton's do), else 0; the batch gears are the dynamic batcher's preferred
        sizes; the gears and the mode are parameters."""
        plan = self.plan
        batched = self.batch_axis and plan is not None and all(a == 0 for a in
                                                               plan.output_axes)
        skip = 1 if batched else 0
        info = self.model.info
        inputs = [{"name": n, "data_type": f"TYPE_{d}", "dims": list(s[skip:])}
                  for n, d, s in zip(self._names, self._datatypes, self._shapes, strict=True)]
        outputs = [{"name": n, "data_type": f"TYPE_{datatype_of(dt)}", "dims": shape[skip:]}
                   for n, dt, shape in zip(info.output_names, info.output_dtypes,
                                           self._output_shapes(), strict=True)
                   if n not in self.state_names]
        config: dict[str, Any] = {
            "name": self.name, "platform": f"gear_runtime_{self.model.backend}",
            "backend": "gear_runtime", "version_policy": self.version_policy,
            "max_batch_size": plan.max_rows if batched and plan is not None else 0,
            "input": inputs, "output": outputs,
            "instance_group": [{"name": self.name,
                                "kind": facts(self.model.backend).instance_kind,
                                "count": self.options.executors}],
            "parameters": {"mode": {"string_value": self.model.mode},
                           "gears": {"string_value": ";".join(
                               ",".join(map(str, g)) for g in self.model.gears)},
                           "pad": {"string_value": str(self.options.pad and
                                                       self.batcher is None).lower()}},
        }
        if self.sequences is not None:
            config["sequence_batching"] = self._sequence_config()
            if self.start is not None:
                config["parameters"]["sequence_start"] = {
                    "string_value": json.dumps(self.start.describe())}
        if self.batcher is not None:
            config["dynamic_batching"] = {
                "preferred_batch_size": list(self.batcher.plan.sizes),
                "max_queue_delay_microseconds": round(self.options.max_batch_delay_ms * 1000)}
        return config

    def _sequence_config(self) -> dict[str, Any]:
        """Triton's ``sequence_batching`` with implicit state (model_config.proto): the
        direct strategy (one slot per live sequence), the idle limit, each state pair."""
        info, spec = self.model.info, self.model.spec
        index = {n: i for i, n in enumerate(spec.input_names)}
        assert self.sequences is not None
        return {"direct": {}, "max_sequence_idle_microseconds":
                round(self.sequences.idle_s * 1e6),
                "state": [{"input_name": i, "output_name": o,
                           "data_type": f"TYPE_{datatype_of(info.input_dtypes[index[i]])}",
                           "dims": list(spec.input_shapes[index[i]]),
                           "initial_state": [{"name": f"{i}_zeros", "zero_data": True,
                                              "data_type": "TYPE_"
                                              + datatype_of(info.input_dtypes[index[i]]),
                                              "dims": list(spec.input_shapes[index[i]])}]}
                          for i, o in self.options.state]}

    # ---- running -------------------------------------------------------------------------
    def rows(self, request: InferRequest) -> int:
        """The rows a request holds (Triton's inference count): its batch in batch mode."""
        if self.model.mode == "batch":
            first = request.inputs.get(self._names[0])
            if first is not None and first.ndim:
                return int(first.shape[0])
        return 1

    @property
    def saturated(self) -> bool:
        """Its queue is full: a request now would get 503 [queue_full]. Readiness does not
        read it (one client's backlog must not take the server out for everyone); a
        sequence's requests obey the same bound in SequenceSlots."""
        return self.queue_depth() >= self.options.max_queue

    async def infer(self, request: InferRequest, deadline: Deadline | None = None
                    ) -> tuple[RunTiming, list[np.ndarray]]:
        """Run ``request``: (how it ran, outputs in model order). InputError (400) for a
        request that does not fit the model, QueueFullError (503) when the queue is full,
        the deadline's error (serving/deadline.py) when ``deadline`` passes while it waits
        in a queue (or passed before it reached one)."""
        if deadline is not None and deadline.passed():
            raise deadline.error()
        control = None
        if self.sequences is not None:
            control = sequence_control(request.parameters)
            if control.start and self.start is not None:  # the prompt, on the start model
                self.check_outputs(request)
                arrays = self.start.inputs(request)
                return await self.sequences.call(control, partial(self.start.run, arrays,
                                                                  self.stats), deadline)
        arrays = self._inputs(request)
        self.check_outputs(request)
        dims = self._dims(request)
        if self.sequences is not None:
            if dims is not None:
                raise InputError(f"model {self.name!r} is static: its one gear takes no "
                                 '"dynamic_dims"')
            assert control is not None  # read above, with the sequences
            return await self.sequences.call(control, partial(self._run_one, arrays, None),
                                             deadline)
        if self.saturated:
            raise QueueFullError(f"model {self.name!r} has {self.queue_depth()} requests "
                                 f"waiting (--max-queue {self.options.max_queue}); retry later")
        if self.batcher is not None and dims is None:
            self._check_batch(arrays)
            return await self.batcher.submit(arrays, deadline)
        run, gear = partial(self._run_one, arrays, dims), self._gear_of(arrays, dims)
        done = self.pool.run_here(run, gear)  # a short gear, the pool idle: no thread hop
        return await self.pool.call(run, gear, deadline) if done is NOT_HERE else done

    def _gear_of(self, arrays: list[np.ndarray], dims: list[int] | None) -> int | None:
        """The gear the executor will run ``arrays`` on (``dims`` set, if any: that gear,
        padded or not; else the exact match, or padded the covering gear), as the
        executor's rules pick it: what lending the run to the loop is judged by. None where
        no gear is known beforehand (none fits: the run fails, or a hybrid model runs its
        dynamic-shape graph), and such a run is never lent."""
        dispatcher = self.model.dispatcher
        try:
            if dims is not None:
                if len(dims) == dispatcher.spec.values_per_gear and len(dims) != self._ranks:
                    return dispatcher.match(dims)  # the dynamic values alone
                return dispatcher.match(dispatcher.values_from_full_dims(dims))
            values = dispatcher.extract(arrays)
            return dispatcher.cover(values) if self.options.pad else dispatcher.match(values)
        except Exception:  # the run itself reports what is wrong, with its own error
            return None

    def _inputs(self, request: InferRequest) -> list[np.ndarray]:
        """The request's arrays in model input order, names and datatypes checked."""
        return request_arrays(request, self._names, self._datatypes, f"model {self.name!r}")

    def check_outputs(self, request: InferRequest) -> None:
        """InputError for a requested output the model does not answer."""
        if request.outputs is None:
            return
        unknown = [n for n in request.outputs if n not in self.output_names]
        if unknown:
            raise InputError(f"model {self.name!r} has no output {unknown[0]!r}; its outputs "
                             f"are {', '.join(self.output_names)}")

    @staticmethod
    def _dims(request: InferRequest) -> list[int] | None:
        """The request parameter ``dynamic_dims`` (as set_dynamic_dims takes), if any."""
        dims = request.parameters.get("dynamic_dims")
        if dims is None:
            return None
        if not isinstance(dims, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63
                for d in dims):
            shown = repr(dims) if len(repr(dims)) <= 200 else repr(dims)[:200] + "..."
            raise InputError('parameter "dynamic_dims" must be a list of integers in '
                             f"0..2**63-1, got {shown}")
        return dims

    def _check_batch(self, arrays: Sequence[np.ndarray]) -> None:
        """The executor's checks, made before the request joins a batch (a bad request
        never spoils one): the dispatcher's GetCurDynamicDims (ranks, static dims, one batch
        size for all inputs: 145012, the core's rule), then rows the batch table serves
        (145013)."""
        (n,) = self.model.dispatcher.extract(arrays)
        assert self.batcher is not None  # only requests that join a batch are checked here
        plan = self.batcher.plan
        if not 1 <= n <= plan.max_rows:
            raise GearMismatchError(
                f"batch size {n} fits no gear of model {self.name!r}: requests are batched "
                f"into the gears {', '.join(map(str, plan.sizes))}, so 1..{plan.max_rows} "
                "rows are served")

    def _run_one(self, arrays: list[np.ndarray], dims: list[int] | None,
                 ex: Any) -> tuple[RunTiming, list[np.ndarray]]:
        """One request on executor ``ex`` (its thread): the set dims are cleared after, so
        the executor's next request starts clean."""
        started = time.perf_counter()
        if dims is None:
            outputs = self._execute(ex, arrays)
        else:
            ex.set_dynamic_dims(dims)
            try:
                outputs = self._execute(ex, arrays)
            finally:
                ex.clear_dynamic_dims()
        gear = ex.last_gear
        rows = self.model.gears[gear][0] if self.model.mode == "batch" and gear is not None \
            else 1
        timing = RunTiming(gear, rows, started, 0.0, time.perf_counter() - started, 0.0)
        self.stats.executed(timing)
        return timing, outputs

    def _execute(self, ex: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if not self.options.pad:
            return ex.execute(arrays)
        outputs = ex.execute(arrays, pad=True)
        request, gear = getattr(ex, "last_request_dims", None), ex.last_dynamic_dims
        if request is not None and gear is not None and ex.last_gear is not None:
            self.metrics.padded(self.name, self.gear_label(ex.last_gear),
                                math.prod(request) / max(1, math.prod(gear)))
        return outputs

    def _timed_batch(self, requests: list[list[np.ndarray]],
                     ex: Any) -> tuple[RunTiming, list[list[np.ndarray]]]:
        """run_batch on executor ``ex``, timed: gathering, execute, splitting."""
        started = time.perf_counter()
        marks: list[float] = []

        def execute(inputs: list[np.ndarray]) -> list[np.ndarray]:
            marks.append(time.perf_counter())
            outputs = ex.execute(inputs)
            marks.append(time.perf_counter())
            return outputs

        assert self.batcher is not None  # runs the batcher's batches only
        plan = self.batcher.plan
        gear, split = run_batch(execute, plan, requests)
        done = time.perf_counter()
        return RunTiming(gear, plan.sizes[gear], started, marks[0] - started,
                         marks[1] - marks[0], done - marks[1]), split

    def _count_batch(self, timing: RunTiming, rows: int) -> None:
        self.metrics.batch(self.name, self.gear_label(timing.gear), rows, timing.gear_rows)
        self.stats.executed(timing)

    async def close(self) -> None:
        """Stop batching, wait for running work, close the executors and the model(s)."""
        if self.batcher is not None:
            await self.batcher.close()
        await asyncio.to_thread(self.pool.close)
        if self.sequences is not None:
            await asyncio.to_thread(self.sequences.close)
        if self.start is not None:
            self.start.close()
        self.model.close()

