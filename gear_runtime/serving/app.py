"""The v2 server's application: KServe v2 REST routes with Triton's extensions.

    GET  /v2/health/live, /v2/health/ready, /v2                server health, metadata
    GET  /v2/models/{name}[/versions/1]                         metadata (+ gears as parameters)
    GET  /v2/models/{name}[/versions/1]/ready
    GET  /v2/models/{name}[/versions/1]/config                  Triton model configuration
    GET  /v2/models/{name}[/versions/1]/stats, /v2/models/stats Triton statistics
    POST /v2/models/{name}[/versions/1]/infer                   JSON, or JSON + binary tensors
    POST /v2/repository/index                                   Triton model repository
    POST /v2/repository/models/{name}/load, .../unload          (with --model-repository)
    GET  /metrics                                               Prometheus text format

Every failure is answered, never raised into the server: ``{"error": "[code] message",
"code": code}`` with the status of :func:`~gear_runtime.serving.errors.http_status`.
:class:`GearServer` is served by :mod:`gear_runtime.serving.http` (``gear-runtime serve``),
by any ASGI server through ``GearServer.app`` (Ray Serve), and over gRPC by
:mod:`gear_runtime.serving.grpc_app`; the three share its methods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote

import numpy as np

from gear_runtime.errors import ClosedError, GearRuntimeError, InputError
from gear_runtime.serving.errors import (
    RETRY_AFTER_S,
    HeadersTooLargeError,
    ModelNotFoundError,
    ModelNotLoadedError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    error_code,
    http_status,
)
from gear_runtime.serving.http import HttpReply, HttpRequest
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.protocol import (
    HEADER_LENGTH,
    MODEL_VERSION,
    InferRequest,
    decode_request,
    encode_response,
    error_body,
)
from gear_runtime.serving.repository import ModelRepository
from gear_runtime.serving.runner import (
    ServedModel,
    ServeOptions,
    load_models,
    load_one,
    model_name,
)
from gear_runtime.serving.stats import RunTiming, merge_statistics

logger = logging.getLogger("gear_runtime.serving")

JSON = "application/json"
#: Bodies of requests that are not inferences (repository calls, GETs).
SMALL_BODY_BYTES = 2**20
#: A body larger than this (or compressed) is inflated and decoded on a worker thread, so
#: the event loop keeps answering health checks and small requests meanwhile.
OFFLOAD_BODY_BYTES = 256 * 2**10
#: JSON outputs of more values than this are encoded on a worker thread.
OFFLOAD_JSON_VALUES = 64 * 2**10

Handler = Callable[..., Awaitable[HttpReply]]


class GearServer:
    """The served models, the routes in front of them, and the shutdown state."""

    def __init__(self, models: dict[str, ServedModel], options: ServeOptions,
                 metrics: Metrics, repository: ModelRepository | None = None) -> None:
        self.models, self.options, self.metrics = models, options, metrics
        self.repository = repository
        #: not ready: set at the first SIGTERM (the drain) and at close
        self.closing = False
        #: past the drain deadline: inference is answered 503 (until then, answered)
        self.refusing = False
        #: name -> why a repository model is not loaded ("unloaded", a load's error)
        self.unavailable: dict[str, str] = {}
        self._repository_lock: asyncio.Lock | None = None
        self._retiring: set[asyncio.Task] = set()
        from gear_runtime.serving.asgi import AsgiApp

        #: the same routes as an ASGI application (Ray Serve, any ASGI server)
        self.app = AsgiApp(self)

    # ---- what the HTTP server asks (serving.http.HttpApp) --------------------------------
    def body_limit(self, request: HttpRequest) -> int:
        """An inference's body may be as large as its model's largest request; other
        requests are small."""
        parts = _segments(request.path)
        if len(parts) >= 4 and parts[:2] == ["v2", "models"] and parts[-1] == "infer":
            model = self.models.get(parts[2])
            if model is not None:
                return model.max_request_bytes
            # an unknown model's body is read (then answered 404) up to any model's limit
            return max((m.max_request_bytes for m in self.models.values()),
                       default=SMALL_BODY_BYTES)
        return SMALL_BODY_BYTES

    def refuse(self, request: HttpRequest | None, status: int, message: str) -> HttpReply:
        """The reply for a request the HTTP layer refused (malformed, too slow, too large,
        too many connections, past the drain deadline)."""
        kind: type[GearRuntimeError] = {
            408: RequestTimeoutError, 413: PayloadTooLargeError, 431: HeadersTooLargeError,
            400: InputError}.get(status, GearRuntimeError)
        if status == 503:
            kind = ClosedError if request is not None else OverloadedError
            if request is None:
                self.metrics.refused.inc()
        model = _model_in_path(request.path) if request is not None else ""
        return self._error(kind(message), model if model in self.models else "")

    async def handle(self, request: HttpRequest) -> HttpReply:
        """Route ``request`` and answer it; never raises."""
        try:
            handler, params = self._route(request.method, request.path)
            return await handler(request, **params)
        except Exception as exc:
            return self._error(exc, "")

    def disconnected(self, request: HttpRequest | None) -> None:
        """A client went away before its answer: counted and logged, not an error of ours."""
        path = request.path if request is not None else "(headers incomplete)"
        model = _model_in_path(path)
        self.metrics.disconnect(model if model in self.models else "")
        logger.info("client hung up before its answer: %s %s",
                    request.method if request else "", path)

    # ---- routing -------------------------------------------------------------------------
    def _route(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        parts = _segments(path)
        routes: list[tuple[str, Handler, dict[str, str]]] = []
        if parts == ["v2"]:
            routes = [("GET", self.server_metadata, {})]
        elif parts == ["v2", "health", "live"]:
            routes = [("GET", self.live, {})]
        elif parts == ["v2", "health", "ready"]:
            routes = [("GET", self.ready, {})]
        elif parts == ["metrics"]:
            routes = [("GET", self.scrape, {})]
        elif parts == ["v2", "models", "stats"]:
            routes = [("GET", self.statistics, {"name": ""})]
        elif parts == ["v2", "repository", "index"]:
            routes = [("POST", self.repository_index, {})]
        elif len(parts) == 5 and parts[:3] == ["v2", "repository", "models"] and \
                parts[4] in ("load", "unload"):
            action = self.load if parts[4] == "load" else self.unload
            routes = [("POST", action, {"name": parts[3]})]
        elif len(parts) >= 3 and parts[:2] == ["v2", "models"]:
            routes = self._model_routes(parts[2], parts[3:])
        if not routes:
            raise _NotFound(f"no such path: {path[:200]}")
        for want, handler, params in routes:
            if method == want or (method == "HEAD" and want == "GET"):
                return handler, params
        raise _MethodNotAllowed(f"{method} is not allowed on {path[:200]} "
                                f"(use {routes[0][0]})")

    def _model_routes(self, name: str, rest: list[str]
                      ) -> list[tuple[str, Handler, dict[str, str]]]:
        params = {"name": name, "version": ""}
        if len(rest) >= 2 and rest[0] == "versions":
            params["version"], rest = rest[1], rest[2:]
        table: dict[tuple[str, ...], tuple[str, Handler]] = {
            (): ("GET", self.model_metadata), ("ready",): ("GET", self.model_ready),
            ("config",): ("GET", self.model_config), ("stats",): ("GET", self.statistics),
            ("infer",): ("POST", self.infer)}
        found = table.get(tuple(rest))
        return [(found[0], found[1], params)] if found else []

    # ---- health and metadata -------------------------------------------------------------
    async def live(self, request: HttpRequest) -> HttpReply:
        return _json({"live": True})

    def is_ready(self) -> bool:
        """Server readiness, one rule for HTTP, gRPC and the ASGI app: not draining or
        closing, and not every model's queue full (then no request could be taken)."""
        models = list(self.models.values())
        return not self.closing and not (models and all(m.saturated for m in models))

    def model_is_ready(self, model: ServedModel) -> bool:
        """A model's readiness: the server's drain, and its own queue not full."""
        return not self.closing and not model.saturated

    async def ready(self, request: HttpRequest) -> HttpReply:
        ready = self.is_ready()
        return _json({"ready": ready}, 200 if ready else 503)

    def extensions(self) -> list[str]:
        """The protocol extensions this server implements (server metadata)."""
        found = ["binary_tensor_data", "parameters", "model_configuration", "statistics"]
        return found + (["model_repository"] if self.repository is not None else [])

    async def server_metadata(self, request: HttpRequest) -> HttpReply:
        from gear_runtime.version import __version__

        return _json({"name": "gear_runtime", "version": __version__,
                      "extensions": self.extensions()})

    async def scrape(self, request: HttpRequest) -> HttpReply:
        body, content_type = self.metrics.exposition()
        return HttpReply(200, body, content_type)

    async def model_metadata(self, request: HttpRequest, name: str, version: str) -> HttpReply:
        return _json(self.model(name, version).metadata())

    async def model_ready(self, request: HttpRequest, name: str, version: str) -> HttpReply:
        ready = self.model_is_ready(self.model(name, version))
        return _json({"name": name, "ready": ready}, 200 if ready else 503)

    async def model_config(self, request: HttpRequest, name: str, version: str) -> HttpReply:
        return _json(self.model(name, version).config())

    async def statistics(self, request: HttpRequest, name: str, version: str = "") -> HttpReply:
        return _json(self.model_statistics(name, version))

    def model_statistics(self, name: str, version: str = "") -> dict[str, Any]:
        """``{"model_stats": [...]}``: one model's (``name``), or every model's (``""``);
        under ``serve --workers`` every worker's, summed (serving/metrics.py's snapshots)."""
        models = [self.model(name, version)] if name else \
            [self.models[n] for n in sorted(self.models)]
        if not self.metrics.shared:
            return {"model_stats": [m.stats.snapshot() for m in models]}
        wanted = {(m.name, m.stats.version) for m in models}
        merged = merge_statistics(self.metrics.shared_stats())["model_stats"]
        return {"model_stats": [m for m in merged if (m["name"], m["version"]) in wanted]}

    def own_statistics(self) -> dict[str, Any]:
        """This process's statistics of every model (what a worker shares)."""
        return {"model_stats": [self.models[n].stats.snapshot() for n in sorted(self.models)]}

    def model(self, name: str, version: str = "") -> ServedModel:
        """The served model ``name`` (version "" or "1"); ModelNotFoundError for a name the
        server does not know, ModelNotLoadedError for a repository model not loaded."""
        model = self.models.get(name)
        if model is not None and version in ("", MODEL_VERSION):
            return model
        if model is not None:
            raise ModelNotFoundError(f"model {name!r} has no version {version[:50]!r} "
                                     f"(version {MODEL_VERSION} is served)")
        if self.repository is not None and name in self.repository:
            why = self.unavailable.get(name, "not loaded")
            raise ModelNotLoadedError(f"model {name!r} is not loaded ({why}); load it: POST "
                                      f"/v2/repository/models/{name}/load")
        raise ModelNotFoundError(f"unknown model {name[:200]!r}; models: "
                                 f"{', '.join(sorted(self.models)) or '(none)'}")

    # ---- inference -----------------------------------------------------------------------
    async def infer(self, request: HttpRequest, name: str, version: str) -> HttpReply:
        """Decode, run (batched or not), encode; every failure becomes an error reply."""
        try:
            model = self.model(name, version)
        except GearRuntimeError as exc:
            return self._error(exc, "")
        with model.use():
            try:
                if self.refusing:  # draining answers what it receives until the deadline
                    raise ClosedError("the server is shutting down (past its drain deadline)")
                infer_request = await self._decode(request, model.max_request_bytes)
                admitted = time.perf_counter()
                timing, outputs = await model.infer(infer_request)
                payload, header_length = await self.encode(model, infer_request, outputs)
            except Exception as exc:
                model.stats.failed(time.perf_counter() - request.started)
                return self._error(exc, model.name)
        self.count_success(model, infer_request, request.started, admitted, timing)
        if header_length is None:
            return HttpReply(200, payload, JSON)
        return HttpReply(200, payload, "application/octet-stream",
                         {HEADER_LENGTH.lower(): str(header_length)})

    def count_success(self, model: ServedModel, request: InferRequest, arrived: float,
                      admitted: float, timing: RunTiming) -> None:
        """Statistics and metrics of one answered inference."""
        answered = time.perf_counter()
        model.stats.succeeded(model.rows(request), admitted, answered, arrived, timing)
        label = timing.label or model.gear_label(timing.gear)
        self.metrics.request(model.name, label, answered - arrived)

    async def _decode(self, request: HttpRequest, limit: int) -> InferRequest:
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        header_length = request.headers.get(HEADER_LENGTH.lower())
        if encoding == "identity" and len(request.body) <= OFFLOAD_BODY_BYTES:
            return decode_request(request.body, header_length)
        return await asyncio.to_thread(_inflate_and_decode, request.body, encoding, limit,
                                       header_length)

    async def encode(self, model: ServedModel, request: InferRequest,
                     outputs: Sequence[np.ndarray]) -> tuple[list[Any], int | None]:
        """The response body of ``outputs`` (the ones the request asked for)."""
        names, arrays = _selected(model, request.outputs, outputs)
        json_values = sum(a.size for n, a in zip(names, arrays, strict=True)
                          if not request.binary(n))
        if json_values <= OFFLOAD_JSON_VALUES:
            return encode_response(model.name, request, names, arrays)
        return await asyncio.to_thread(encode_response, model.name, request, names, arrays)

    # ---- the model repository ------------------------------------------------------------
    def _repo(self) -> ModelRepository:
        if self.repository is None:
            raise InputError("this server has no model repository: start it with "
                             "--model-repository DIR to load and unload models")
        return self.repository

    async def repository_index(self, request: HttpRequest) -> HttpReply:
        doc = _json_body(request.body) if request.body.strip() else {}
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise InputError('"ready" must be true or false')
        return _json(self.index(ready))

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model served or in the repository: name, version, state, reason."""
        names = set(self.models) | set(self.repository.names() if self.repository else [])
        out = []
        for name in sorted(names):
            state = "READY" if name in self.models else "UNAVAILABLE"
            if ready_only and state != "READY":
                continue
            out.append({"name": name, "version": MODEL_VERSION, "state": state,
                        "reason": "" if state == "READY"
                        else self.unavailable.get(name, "not loaded")})
        return out

    async def load(self, request: HttpRequest, name: str) -> HttpReply:
        doc = _json_body(request.body) if request.body.strip() else {}
        if doc.get("parameters"):
            raise InputError("load takes the model's gear file from the repository as it "
                             "is: a config or files in the request are not supported")
        await self.load_model(name)
        return _json({})

    async def unload(self, request: HttpRequest, name: str) -> HttpReply:
        await self.unload_model(name)
        return _json({})

    def _lock(self) -> asyncio.Lock:
        if self._repository_lock is None:
            self._repository_lock = asyncio.Lock()
        return self._repository_lock

    async def load_model(self, name: str) -> None:
        """(Re)load ``name`` from the repository. The new model serves every request from
        the moment it is ready; the one it replaces finishes the requests it has, then
        closes. A load that fails leaves the model served before (if any) as it was."""
        path = self._repo().path_of(name)
        if self.closing:
            raise ClosedError("the server is shutting down")
        async with self._lock():
            try:
                new = await asyncio.to_thread(load_one, name, str(path), self.options,
                                              self.metrics)
            except GearRuntimeError as exc:
                if name not in self.models:
                    self.unavailable[name] = f"load failed: {exc}"
                raise
            old, self.models[name] = self.models.get(name), new
            self.unavailable.pop(name, None)
        if old is not None:
            self._retire(old)
        logger.info("model %r loaded from %s", name, path)

    async def unload_model(self, name: str) -> None:
        """Stop serving ``name``: new requests get 404 (145003); the requests it has are
        answered, then it closes (this call returns after that)."""
        repo = self._repo()
        async with self._lock():
            model = self.models.pop(name, None)
            if model is None:
                if name not in repo:
                    raise ModelNotFoundError(f"unknown model {name[:200]!r}")
                return  # not loaded: nothing to do
            self.unavailable[name] = "unloaded"
            self.metrics.untrack_queue(name)
        await model.retire()
        logger.info("model %r unloaded", name)

    def _retire(self, model: ServedModel) -> None:
        task = asyncio.get_running_loop().create_task(model.retire())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    # ---- errors, shutdown ----------------------------------------------------------------
    def count_error(self, exc: BaseException, model: str) -> int:
        """Count (and, for a fault of ours, log with its traceback) a request answered with
        ``exc``; its HTTP status."""
        status = exc.status if isinstance(exc, _RouteError) else http_status(exc)
        if status >= 500 and status != 503 and not isinstance(exc, _RouteError):
            logger.error("request failed", exc_info=exc)
        self.metrics.error(model, error_code(exc), status)
        return status

    def _error(self, exc: BaseException, model: str) -> HttpReply:
        status = self.count_error(exc, model)
        headers = {"retry-after": str(RETRY_AFTER_S)} if status == 503 else {}
        return HttpReply(status, error_body(exc), JSON, headers)

    def begin_drain(self) -> None:
        """The first SIGTERM: not ready from now on (a load balancer stops sending)."""
        self.closing = True

    def refuse_waiting(self) -> None:
        """Past the drain deadline: what waits for an executor, and every inference request
        from now on, is answered 503."""
        self.refusing = True
        for model in self.models.values():
            model.refuse_waiting()

    async def close(self) -> None:
        """Stop every model (batchers, executors, the models); idempotent."""
        self.closing = self.refusing = True
        models, self.models = self.models, {}
        await asyncio.gather(*(m.close() for m in models.values()), *self._retiring,
                             return_exceptions=True)


class _RouteError(GearRuntimeError):
    status = 404


class _NotFound(_RouteError, LookupError):
    """No route for the path (HTTP 404)."""


class _MethodNotAllowed(_RouteError):
    """The path exists, the method does not (HTTP 405)."""

    status = 405


def _segments(path: str) -> list[str]:
    return [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []


def _model_in_path(path: str) -> str:
    parts = _segments(path)
    return parts[2] if len(parts) >= 3 and parts[:2] == ["v2", "models"] else ""


def _json(doc: Any, status: int = 200) -> HttpReply:
    return HttpReply(status, json.dumps(doc).encode(), JSON)


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InputError("the request must be a JSON object")
    return doc


def _selected(model: ServedModel, requested: dict[str, bool] | None,
              outputs: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """The outputs the request asked for (all, in model order, when it named none)."""
    names = list(model.output_names)
    if requested is None:
        return names, list(outputs)
    by_name = dict(zip(names, outputs, strict=True))
    return list(requested), [by_name[n] for n in requested]


def _inflate_and_decode(body: bytes, encoding: str, limit: int,
                        header_length: str | None) -> InferRequest:
    return decode_request(inflate(body, encoding, limit), header_length)


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent (``identity``) or inflated (``gzip``, ``deflate``: what
    tritonclient sends), at most ``limit`` bytes: inflating stops at the limit, so a small
    body that would expand without bound costs what ``limit`` bytes cost."""
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise InputError(f"Content-Encoding {encoding[:50]!r} is not supported (gzip, deflate)")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    parts: list[bytes] = []
    size, rest = 0, body
    while True:  # gzip: one member after another (RFC 1952), as gzip.decompress reads them
        inflater = zlib.decompressobj(wbits)
        try:
            part = inflater.decompress(rest, limit + 1 - size)
        except zlib.error as exc:
            raise InputError(f"the body is not valid {encoding} data: {exc}") from None
        size += len(part)
        parts.append(part)
        if size > limit or inflater.unconsumed_tail:
            raise PayloadTooLargeError(f"the body inflates past {limit} bytes, the most this "
                                       "model's largest request needs")
        if not inflater.eof:
            raise InputError(f"the body is not valid {encoding} data: it ends inside the "
                             "compressed stream (truncated)")
        rest = inflater.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if encoding != "gzip":
            raise InputError(f"the body has {len(rest)} bytes after the end of its deflate "
                             "stream")


# ---- building ---------------------------------------------------------------------------------
def build_server(files: Sequence[str], names: Sequence[str] | None = None,
                 options: ServeOptions | None = None,
                 model_repository: str | None = None) -> GearServer:
    """Load ``files`` (served as ``names``, default: the file names without ``.gear.onnx``)
    and, with ``model_repository``, every gear file of that folder; return the server.
    Raises GearRuntimeError for a file that cannot be served."""
    options = options or ServeOptions()
    metrics = Metrics(None if options.worker is None else str(options.worker),
                      options.metrics_dir)
    repository = ModelRepository(model_repository) if model_repository else None
    files = list(files)
    names = list(names) if names else [model_name(f) for f in files]
    if repository is not None:  # every model of the repository, unless a file is named so
        extra = [n for n in repository.names() if n not in names]
        files += [str(repository.path_of(n)) for n in extra]
        names += extra
    return GearServer(load_models(files, names, options, metrics), options, metrics,
                      repository)
