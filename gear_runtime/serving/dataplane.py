"""The data plane: what every front end of the server does, whatever its transport (KServe's
``DataPlane``). The REST routes (serving/app.py, and its ASGI form) and the gRPC service
(serving/grpc_app.py) are thin over it: they decode their protocol's request, call the same
method here, and encode its answer or its error in their protocol. An inference is one
straight line in each front end::

    with plane.admit(model, arrived) as admission:     # 503 past the drain, counted
        request = decode(...)                          # the front end's codec
        outputs = await plane.infer(admission, request)
        reply = encode(request, outputs)               # the front end's codec

    health        is_ready, model_is_ready
    metadata      server_metadata, model(name).metadata() / .config()
    statistics    model_statistics (every worker's under serve --workers)
    inference     admit (the drain check, the model in use, counting), infer (run, or
                  forward to the worker that owns the request's sequence)
    repository    index, load_model, unload_model
    shutdown      begin_drain, refuse_waiting, close

Errors are raised, never answered here: the front end answers them, and ``count_error``
counts each one once, on the worker that met it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from gear_runtime.errors import ClosedError, GearRuntimeError, InputError
from gear_runtime.serving.deadline import request_deadline
from gear_runtime.serving.errors import (
    ModelNotFoundError,
    ModelNotLoadedError,
    PeerAnswerError,
    error_code,
    http_status,
)
from gear_runtime.serving.generation import ServedLlm, TextRequest
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.options import ServeOptions
from gear_runtime.serving.peers import Peers
from gear_runtime.serving.protocol import InferRequest
from gear_runtime.serving.repository import ModelRepository
from gear_runtime.serving.sequences import sequence_control
from gear_runtime.serving.served import ServedModel
from gear_runtime.serving.stats import RunTiming, merge_statistics

logger = logging.getLogger("gear_runtime.serving")


class Admission:
    """One inference request admitted to a model (:meth:`DataPlane.admit`): what counting it
    needs, filled in by :meth:`DataPlane.infer` as it runs."""

    __slots__ = ("admitted", "arrived", "forwarded", "grpc_remaining", "model", "request",
                 "timing")

    def __init__(self, model: ServedModel, arrived: float,
                 grpc_remaining: float | None) -> None:
        self.model, self.arrived, self.grpc_remaining = model, arrived, grpc_remaining
        #: the decoded request, once it is (None before)
        self.request: InferRequest | None = None
        #: when it was decoded (perf_counter seconds)
        self.admitted = 0.0
        #: how it ran here (None: not run here, yet or at all)
        self.timing: RunTiming | None = None
        #: sent to the worker that owns its sequence, which counts it
        self.forwarded = False


class DataPlane:
    """The served models, the flow every request takes, and the shutdown state."""

    def __init__(self, models: dict[str, ServedModel], options: ServeOptions,
                 metrics: Metrics, repository: ModelRepository | None = None,
                 llms: dict[str, ServedLlm] | None = None) -> None:
        self.models, self.options, self.metrics = models, options, metrics
        self.repository = repository
        #: name -> version -> model: every version served (``models`` holds the newest of
        #: each name, what a request naming no version gets)
        self.versions: dict[str, dict[str, ServedModel]] = {
            name: {m.version: m} for name, m in models.items()}
        #: the causal LM folders behind the text routes (serving/generation.py)
        self.llms: dict[str, ServedLlm] = dict(llms or {})
        #: not ready: set at the first SIGTERM (the drain) and at close
        self.closing = False
        #: past the drain deadline: inference is answered 503 (until then, answered)
        self.refusing = False
        #: name -> why a repository model is not loaded ("unloaded", a load's error)
        self.unavailable: dict[str, str] = {}
        #: the other workers, which own some sequences (None: one process serves them all)
        self.peers: Peers | None = None
        if options.workers > 1 and options.worker_dir is not None and \
                options.worker is not None:
            self.peers = Peers(options.worker_dir, options.worker, options.workers)
        self._repository_lock: asyncio.Lock | None = None
        self._retiring: set[asyncio.Task] = set()
        #: serve --workers: every worker has served once (see _workers_up)
        self._workers_up = options.worker is None or options.worker_dir is None

    # ---- health and metadata -------------------------------------------------------------
    def is_ready(self) -> bool:
        """Server readiness, one rule for every front end: not draining or closing, and
        under serve --workers every worker started. A client that connects while only some
        workers serve lands on those, and a keep-alive connection stays where it landed:
        the others would idle. Once all have served, a worker's restart does not make the
        server unready (the others serve meanwhile). Queue depth is not read: a full queue
        refuses the requests past it (503 queue_full, each alone), while a probe that
        failed on it would take the server out for every client, for one client's
        backlog."""
        return not self.closing and self.workers_up()

    def workers_up(self) -> bool:
        """Whether every worker of serve --workers has marked itself started (True for
        one process); remembered once true."""
        if not self._workers_up:
            from gear_runtime.serving.workers import started_path

            folder = self.options.worker_dir
            assert folder is not None
            self._workers_up = all(os.path.exists(started_path(folder, i))
                                   for i in range(self.options.workers))
        return self._workers_up

    def model_is_ready(self, model: ServedModel) -> bool:
        """A model's readiness: the server's drain and (serve --workers) every worker
        started, as for the server's; never its queue depth (see :meth:`is_ready`)."""
        return not self.closing and self.workers_up()

    def extensions(self) -> list[str]:
        """The protocol extensions this server implements (server metadata)."""
        found = ["binary_tensor_data", "parameters", "model_configuration", "statistics"]
        return found + (["model_repository"] if self.repository is not None else [])

    def server_metadata(self) -> dict[str, Any]:
        from gear_runtime.version import __version__

        return {"name": "gear_runtime", "version": __version__,
                "extensions": self.extensions()}

    def model(self, name: str, version: str = "") -> ServedModel:
        """The served model ``name`` at ``version`` ("": the newest served);
        ModelNotFoundError for a name or a version the server does not serve,
        ModelNotLoadedError for a repository model not loaded."""
        model = self.models.get(name)
        if model is not None and version in ("", model.version):
            return model
        if model is not None:
            other = self.versions.get(name, {}).get(version)
            if other is not None:
                return other
            raise ModelNotFoundError(f"model {name!r} has no version {version[:50]!r} "
                                     f"(versions served: {', '.join(model.versions)})")
        if self.repository is not None and name in self.repository:
            why = self.unavailable.get(name, "not loaded")
            raise ModelNotLoadedError(f"model {name!r} is not loaded ({why}); load it: POST "
                                      f"/v2/repository/models/{name}/load")
        raise ModelNotFoundError(f"unknown model {name[:200]!r}; models: "
                                 f"{', '.join(sorted(self.models)) or '(none)'}")

    def llm(self, name: str) -> ServedLlm:
        """The causal LM served as ``name``; ModelNotFoundError naming the ones served."""
        served = self.llms.get(name)
        if served is None:
            raise ModelNotFoundError(f"the model {name[:200]!r} does not exist; language "
                                     f"models: {', '.join(sorted(self.llms)) or '(none)'}")
        return served

    def start_generation(self, served: ServedLlm, request: TextRequest) -> Any:
        """Admit a text request (503 past the drain deadline) and start it: its
        :class:`~gear_runtime.serving.generation.Generation`."""
        if self.refusing:
            raise ClosedError("the server is shutting down (past its drain deadline)")
        return served.start(request)

    # ---- statistics ----------------------------------------------------------------------
    def model_statistics(self, name: str, version: str = "") -> dict[str, Any]:
        """``{"model_stats": [...]}``: one model's (``name``), or every model's (``""``);
        under ``serve --workers`` every worker's, summed (serving/metrics.py's snapshots)."""
        if name and not version:  # every version of the model, as Triton answers
            newest = self.model(name)
            models = list((self.versions.get(name) or {newest.version: newest}).values())
        else:
            models = [self.model(name, version)] if name else self.every_model()
        if not self.metrics.shared:
            return {"model_stats": [m.stats.snapshot() for m in models]}
        wanted = {(m.name, m.stats.version) for m in models}
        merged = merge_statistics(self.metrics.shared_stats())["model_stats"]
        return {"model_stats": [m for m in merged if (m["name"], m["version"]) in wanted]}

    def own_statistics(self) -> dict[str, Any]:
        """This process's statistics of every model (what a worker shares)."""
        return {"model_stats": [m.stats.snapshot() for m in self.every_model()]}

    def every_model(self) -> list[ServedModel]:
        """Every model served, every version, by name then version."""
        found = {id(m): m for name in sorted(self.models)
                 for m in [*self.versions.get(name, {}).values(), self.models[name]]}
        return list(found.values())

    # ---- inference -----------------------------------------------------------------------
    @contextmanager
    def admit(self, model: ServedModel, arrived: float,
              grpc_remaining: float | None = None) -> Iterator[Admission]:
        """One inference to ``model`` for the time of the ``with``, which decodes it, runs it
        (:meth:`infer`) and encodes its answer: ClosedError (503) past the drain deadline,
        the model in use meanwhile (a replaced model closes only after), and the outcome
        counted in the model's statistics once the ``with`` ends: what raised in it as a
        failure (raised on: the front end answers it), else the success of the run.
        ``arrived``: when the request arrived (perf_counter seconds); ``grpc_remaining``: the
        seconds its gRPC call had left then (its deadline)."""
        admission = Admission(model, arrived, grpc_remaining)
        with model.use():
            try:
                if self.refusing:  # draining answers what it receives until the deadline
                    raise ClosedError("the server is shutting down (past its drain deadline)")
                yield admission
            except Exception:
                if not admission.forwarded:  # counted by the owner, which ran it
                    model.stats.failed(time.perf_counter() - arrived)
                raise
        if admission.timing is not None:  # ran here, and answered
            assert admission.request is not None
            self.count_success(model, admission.request, arrived, admission.admitted,
                               admission.timing)

    async def infer(self, admission: Admission, request: InferRequest) -> list[np.ndarray]:
        """Run the decoded ``request`` of ``admission`` (:meth:`admit`): batched, pooled or
        on its sequence (a sequence another worker owns runs there); its outputs in model
        order. A request still queued at its deadline (its ``timeout`` parameter, or the
        gRPC call's) is dropped (serving/deadline.py)."""
        model = admission.model
        admission.request, admission.admitted = request, time.perf_counter()
        owner = self._owner(model, request)
        if owner is not None:
            admission.forwarded = True
            assert self.peers is not None  # an owner elsewhere: there are peers
            return await self.peers.forward(owner, model.name, request, model.output_names)
        deadline = request_deadline(request.parameters, admission.arrived,
                                    admission.grpc_remaining)
        admission.timing, outputs = await model.infer(request, deadline)
        return outputs

    def _owner(self, model: ServedModel, request: InferRequest) -> int | None:
        """The worker to forward ``request`` to: the owner of its sequence when that is
        another worker; None to run it here."""
        if self.peers is None or model.sequences is None:
            return None
        control = sequence_control(request.parameters)  # a bad id is refused here
        owner = self.peers.owner(control.id)
        if owner == self.peers.index:
            return None
        model.check_outputs(request)  # the owner answers every output; chosen here
        return owner

    def count_success(self, model: ServedModel, request: InferRequest, arrived: float,
                      admitted: float, timing: RunTiming) -> None:
        """Statistics and metrics of one answered inference."""
        answered = time.perf_counter()
        model.stats.succeeded(model.rows(request), admitted, answered, arrived, timing)
        label = timing.label or model.gear_label(timing.gear)
        self.metrics.request(model.name, label, answered - arrived)

    def count_error(self, exc: BaseException, model: str) -> int:
        """Count (and, for a fault of ours, log with its traceback) a request answered with
        ``exc``; its HTTP status. The answer of another worker is its own: counted and
        logged there."""
        status = http_status(exc)
        if isinstance(exc, PeerAnswerError):
            return status
        if status >= 500 and status != 503:
            logger.error("request failed", exc_info=exc)
        self.metrics.error(model, error_code(exc), status)
        return status

    # ---- the model repository ------------------------------------------------------------
    def repo(self) -> ModelRepository:
        """The model repository; InputError when the server has none."""
        if self.repository is None:
            raise InputError("this server has no model repository: start it with "
                             "--model-repository DIR to load and unload models")
        return self.repository

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model served or in the repository: name, version, state, reason (one
        entry per version served; a model not loaded has no version)."""
        names = set(self.models) | set(self.repository.names() if self.repository else [])
        out = []
        for name in sorted(names):
            served = self.versions.get(name) or \
                ({self.models[name].version: self.models[name]} if name in self.models else {})
            out += [{"name": name, "version": v, "state": "READY", "reason": ""}
                    for v in sorted(served, key=_version_order)]
            if not served and not ready_only:
                out.append({"name": name, "version": "", "state": "UNAVAILABLE",
                            "reason": self.unavailable.get(name, "not loaded")})
        return out

    def _lock(self) -> asyncio.Lock:
        if self._repository_lock is None:
            self._repository_lock = asyncio.Lock()
        return self._repository_lock

    async def load_model(self, name: str) -> None:
        """(Re)load ``name`` from the repository (every version its layout serves). The new
        versions serve every request from the moment they are ready; the ones they replace
        finish the requests they have, then close. A load that fails leaves the model
        served before (if any) as it was."""
        repo = self.repo()
        if self.closing:
            raise ClosedError("the server is shutting down")
        async with self._lock():
            try:
                entry = repo.entry(name)
                new = await asyncio.to_thread(entry.load, self.options, self.metrics)
            except GearRuntimeError as exc:
                if name not in self.models:
                    self.unavailable[name] = f"load failed: {exc}"
                self._track(name)  # a refused version was made: its gauges are taken back
                raise
            old = self.install(name, new)
        for model in old:
            self._retire(model)
        logger.info("model %r loaded: versions %s", name,
                    {v: str(m.path) for v, m in new.items()})

    def install(self, name: str, versions: dict[str, ServedModel]) -> list[ServedModel]:
        """Serve ``versions`` (version -> model, oldest first) as ``name`` from now on, the
        last one to requests naming no version; returns the models they replace (the
        caller retires them)."""
        old = list(self.versions.get(name, {}).values())
        if name in self.models and self.models[name] not in old:
            old.append(self.models[name])
        self.versions[name] = dict(versions)
        self.models[name] = list(versions.values())[-1]
        self.unavailable.pop(name, None)
        self._track(name)
        return old

    def _track(self, name: str) -> None:
        """The gauges of model ``name`` read its versions served (metrics are by name): a
        model made registers its own, also one refused after it was made."""
        models = list(self.versions.get(name, {}).values())
        if not models:
            self.metrics.untrack_queue(name)
            return
        self.metrics.track_queue(name, lambda: sum(m.queue_depth() for m in models))
        if any(m.sequences is not None for m in models):
            self.metrics.track_sequences(name, lambda: sum(
                m.sequences.live for m in models if m.sequences is not None))

    async def unload_model(self, name: str) -> None:
        """Stop serving ``name``: new requests get 404 (145003); the requests it has are
        answered, then it closes (this call returns after that)."""
        repo = self.repo()
        async with self._lock():
            model = self.models.pop(name, None)
            if model is None:
                if name not in repo:
                    raise ModelNotFoundError(f"unknown model {name[:200]!r}")
                return  # not loaded: nothing to do
            versions = self.versions.pop(name, {}) or {model.version: model}
            self.unavailable[name] = "unloaded"
            self.metrics.untrack_queue(name)
        await asyncio.gather(*(m.retire() for m in versions.values()))
        logger.info("model %r unloaded", name)

    def _retire(self, model: ServedModel) -> None:
        task = asyncio.get_running_loop().create_task(model.retire())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    # ---- shutdown ------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """The first SIGTERM: not ready from now on (a load balancer stops sending)."""
        self.closing = True

    def refuse_waiting(self) -> None:
        """Past the drain deadline: what waits for an executor, and every inference request
        from now on, is answered 503."""
        self.refusing = True
        for model in self.every_model():
            model.refuse_waiting()
        for served in self.llms.values():
            served.end_running()

    async def close(self) -> None:
        """Stop every model (batchers, executors, the models) and the connections to the
        other workers; idempotent."""
        self.closing = self.refusing = True
        models = self.every_model()
        self.models, self.versions = {}, {}
        llms, self.llms = self.llms, {}
        await asyncio.gather(*(m.close() for m in models),
                             *(m.close() for m in llms.values()), *self._retiring,
                             return_exceptions=True)
        if self.peers is not None:
            self.peers.close()


def _version_order(version: str) -> tuple[int, str]:
    """Versions in numeric order (Triton's are whole numbers)."""
    return (int(version), "") if version.isdigit() else (-1, version)


__all__ = ["Admission", "DataPlane"]
