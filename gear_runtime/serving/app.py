"""The v2 server's application: KServe v2 REST routes with Triton's extensions.

    GET  /v2/health/live, /v2/health/ready, /v2                server health, metadata
    GET  /v2/models/{name}[/versions/{v}]                       metadata (+ gears as parameters)
    GET  /v2/models/{name}[/versions/{v}]/ready                 (no version: the newest)
    GET  /v2/models/{name}[/versions/{v}]/config                Triton model configuration
    GET  /v2/models/{name}[/versions/{v}]/stats, /v2/models/stats   Triton statistics
    POST /v2/models/{name}[/versions/{v}]/infer                 JSON, or JSON + binary tensors
    POST /v2/repository/index                                   Triton model repository
    POST /v2/repository/models/{name}/load, .../unload          (with --model-repository)
    GET  /metrics                                               Prometheus text format
    GET  /v1/models                                             OpenAI: the language models
    POST /v1/completions, /v1/chat/completions                  OpenAI (stream: SSE)
    POST /v2/models/{name}[/versions/1]/generate[_stream]       Triton's generate extension

The routes are declared once (:data:`ROUTES`); each is a thin REST front of the data plane
(serving/dataplane.py), which gRPC (serving/grpc_app.py) fronts as well. Every failure is
answered, never raised into the server: ``{"error": "[code] message", "code": code}`` with
the status of :func:`~gear_runtime.serving.errors.http_status` (the OpenAI routes answer
in OpenAI's error shape: serving/openai_api.py). :class:`GearServer` is
served by :mod:`gear_runtime.serving.http` (``gear-runtime serve``) and by any ASGI server
through ``GearServer.app`` (Ray Serve).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import unquote

import numpy as np

from gear_runtime.errors import ClosedError, GearRuntimeError, InputError
from gear_runtime.serving import openai_api, triton_generate
from gear_runtime.serving.dataplane import DataPlane
from gear_runtime.serving.errors import (
    RETRY_AFTER_S,
    HeadersTooLargeError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    StatusError,
)
from gear_runtime.serving.generation import ServedLlm, is_llm_folder
from gear_runtime.serving.http import HttpReply, HttpRequest
from gear_runtime.serving.loading import close_loaded, load_models, model_name
from gear_runtime.serving.logs import log_access
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.options import ServeOptions
from gear_runtime.serving.protocol import (
    HEADER_LENGTH,
    MODEL_VERSION,
    InferRequest,
    decode_request,
    encode_response,
    error_body,
)
from gear_runtime.serving.repository import ModelRepository, RepositoryModel, load_entries
from gear_runtime.serving.served import ServedModel

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


class GearServer(DataPlane):
    """The data plane (serving/dataplane.py) with its REST routes in front of it."""

    def __init__(self, models: dict[str, ServedModel], options: ServeOptions,
                 metrics: Metrics, repository: ModelRepository | None = None,
                 llms: dict[str, ServedLlm] | None = None) -> None:
        super().__init__(models, options, metrics, repository, llms)
        from gear_runtime.serving.asgi import AsgiApp

        #: the same routes as an ASGI application (Ray Serve, any ASGI server)
        self.app = AsgiApp(self)
        self._routes = _RouteTable(self)

    # ---- what the HTTP server asks (serving.http.HttpApp) --------------------------------
    def body_limit(self, request: HttpRequest) -> int:
        """An inference's body may be as large as its model's largest request; other
        requests are small."""
        parts = _segments(request.path)
        if len(parts) >= 4 and parts[:2] == ["v2", "models"] and parts[-1] == "infer":
            versions = self.versions.get(parts[2])  # the largest of the model's versions
            if versions:
                return max(m.max_request_bytes for m in versions.values())
            # an unknown model's body is read (then answered 404) up to any model's limit
            return max((m.max_request_bytes for m in self.every_model()),
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
        reply = self._error(kind(message), model if model in self.models else "")
        if request is not None:
            self._access(request, reply)
        return reply

    async def handle(self, request: HttpRequest) -> HttpReply:
        """Route ``request`` and answer it; never raises."""
        try:
            handler, params = self._routes.find(request.method, request.path)
            reply = await handler(request, **params)
        except Exception as exc:
            reply = self._error(exc, "")
        self._access(request, reply)
        return reply

    def _access(self, request: HttpRequest, reply: HttpReply) -> None:
        """The access line of an answered request (serve --access-log); its seconds run
        from its headers to its reply (a streamed reply: to its head)."""
        if self.options.access_log:
            log_access(request.method, request.path, reply.status,
                       time.perf_counter() - request.started, _model_in_path(request.path))

    def disconnected(self, request: HttpRequest | None) -> None:
        """A client went away before its answer: counted and logged, not an error of ours."""
        path = request.path if request is not None else "(headers incomplete)"
        model = _model_in_path(path)
        self.metrics.disconnect(model if model in self.models else "")
        logger.info("client hung up before its answer: %s %s",
                    request.method if request else "", path)

    # ---- the routes (ROUTES below names them) --------------------------------------------
    async def live(self, request: HttpRequest) -> HttpReply:
        return _json({"live": True})

    async def ready(self, request: HttpRequest) -> HttpReply:
        ready = self.is_ready()
        return _json({"ready": ready}, 200 if ready else 503)

    async def get_server_metadata(self, request: HttpRequest) -> HttpReply:
        return _json(self.server_metadata())

    async def scrape(self, request: HttpRequest) -> HttpReply:
        body, content_type = await self.metrics.scrape(request.headers)  # every worker's, now
        return HttpReply(200, body, content_type)

    async def model_metadata(self, request: HttpRequest, name: str,
                             version: str = "") -> HttpReply:
        if name in self.llms and version in ("", "1"):
            return _json(_llm_metadata(self.llms[name]))
        return _json(self.model(name, version).metadata())

    async def model_ready(self, request: HttpRequest, name: str, version: str = "") -> HttpReply:
        if name in self.llms and version in ("", "1"):
            ready = self.is_ready()
        else:
            ready = self.model_is_ready(self.model(name, version))
        return _json({"name": name, "ready": ready}, 200 if ready else 503)

    async def model_config(self, request: HttpRequest, name: str,
                           version: str = "") -> HttpReply:
        return _json(self.model(name, version).config())

    async def statistics(self, request: HttpRequest, name: str = "",
                         version: str = "") -> HttpReply:
        return _json(self.model_statistics(name, version))

    async def infer_route(self, request: HttpRequest, name: str, version: str = "") -> HttpReply:
        """The data plane's inference over HTTP: JSON or binary tensors in and out; every
        failure becomes an error reply."""
        try:
            model = self.model(name, version)
        except GearRuntimeError as exc:
            return self._error(exc, "")
        try:
            with self.admit(model, request.started) as admission:
                infer_request = await self._decode(request, model.max_request_bytes)
                outputs = await self.infer(admission, infer_request)
                reply = await self._reply(model, infer_request, outputs)
        except Exception as exc:
            return self._error(exc, model.name)
        return reply

    async def _decode(self, request: HttpRequest, limit: int) -> InferRequest:
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        header_length = request.headers.get(HEADER_LENGTH.lower())
        if encoding == "identity" and len(request.body) <= OFFLOAD_BODY_BYTES:
            return decode_request(request.body, header_length)
        return await asyncio.to_thread(_inflate_and_decode, request.body, encoding, limit,
                                       header_length)

    async def _reply(self, model: ServedModel, request: InferRequest,
                     outputs: Sequence[np.ndarray]) -> HttpReply:
        """The reply of ``outputs``: JSON, or JSON + binary tensors."""
        payload, header_length = await self.encode(model, request, outputs)
        if header_length is None:
            return HttpReply(200, payload, JSON)
        return HttpReply(200, payload, "application/octet-stream",
                         {HEADER_LENGTH.lower(): str(header_length)})

    async def encode(self, model: ServedModel, request: InferRequest,
                     outputs: Sequence[np.ndarray]) -> tuple[list[Any], int | None]:
        """The response body of ``outputs`` (the ones the request asked for)."""
        names, arrays = _selected(model, request.outputs, outputs)
        json_values = sum(a.size for n, a in zip(names, arrays, strict=True)
                          if not request.binary(n))
        if json_values <= OFFLOAD_JSON_VALUES:
            return encode_response(model.name, request, names, arrays, model.version)
        return await asyncio.to_thread(encode_response, model.name, request, names, arrays,
                                       model.version)

    async def repository_index(self, request: HttpRequest) -> HttpReply:
        doc = _json_body(request.body) if request.body.strip() else {}
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise InputError('"ready" must be true or false')
        return _json(self.index(ready))

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

    # ---- the text routes (serving/generation.py) ------------------------------------------
    async def openai_models(self, request: HttpRequest) -> HttpReply:
        return _json({"object": "list",
                      "data": [self.llms[n].describe() for n in sorted(self.llms)]})

    async def completions(self, request: HttpRequest) -> HttpReply:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: HttpRequest) -> HttpReply:
        return await self._openai(request, chat=True)

    async def _openai(self, request: HttpRequest, chat: bool) -> HttpReply:
        """A completion or chat completion: the whole answer, or its SSE stream. Every
        failure before the stream starts is an error reply in OpenAI's shape."""
        name = ""
        try:
            doc = _json_body(request.body)
            model = doc.get("model")
            if not isinstance(model, str):
                raise InputError(f'"model" must be a string naming a served model, got '
                                 f"{model!r:.80}; models: {', '.join(sorted(self.llms))}")
            served = self.llm(model)
            name = served.name
            decode = openai_api.chat_request if chat else openai_api.completion_request
            text_request = decode(doc, served)
            stream, include_usage = openai_api.stream_wanted(doc)
            reply = openai_api.Reply(served.name, chat, openai_api.token_ids_wanted(doc))
            generation = self.start_generation(served, text_request)
        except Exception as exc:
            return self._openai_error(exc, name)
        if stream:
            return _event_stream(openai_api.events(
                reply, generation, include_usage,
                lambda exc: openai_api.error_doc(exc, self.count_error(exc, name))),
                generation)
        try:
            text = await generation.text()
        except Exception as exc:
            return self._openai_error(exc, name)
        return _json(reply.whole(text, generation))

    def _openai_error(self, exc: BaseException, model: str) -> HttpReply:
        status = self.count_error(exc, model)
        headers = {"retry-after": str(RETRY_AFTER_S)} if status == 503 else {}
        return HttpReply(status, json.dumps(openai_api.error_doc(exc, status)).encode(), JSON,
                         headers)

    async def generate(self, request: HttpRequest, name: str, version: str = "") -> HttpReply:
        return await self._generate(request, name, version, stream=False)

    async def generate_stream(self, request: HttpRequest, name: str,
                              version: str = "") -> HttpReply:
        return await self._generate(request, name, version, stream=True)

    async def _generate(self, request: HttpRequest, name: str, version: str,
                        stream: bool) -> HttpReply:
        """Triton's generate / generate_stream (serving/triton_generate.py)."""
        try:
            if version not in ("", "1"):
                raise ModelNotFoundError(f"model {name!r} has no version {version[:50]!r}")
            served = self.llm(name)
            text_request = triton_generate.generate_request(_json_body(request.body), served)
            generation = self.start_generation(served, text_request)
        except Exception as exc:
            return self._error(exc, name if name in self.llms else "")
        if stream:
            return _event_stream(triton_generate.events(
                served, generation,
                lambda exc: {"error": f"{exc}", "code": self.count_error(exc, name)}),
                generation)
        try:
            text = await generation.text()
        except Exception as exc:
            return self._error(exc, name)
        return _json(triton_generate.answer(served, text, generation))

    # ---- errors --------------------------------------------------------------------------
    def _error(self, exc: BaseException, model: str) -> HttpReply:
        status = self.count_error(exc, model)
        headers = {"retry-after": str(RETRY_AFTER_S)} if status == 503 else {}
        return HttpReply(status, error_body(exc), JSON, headers)


#: Every REST route, once: (method, path pattern, GearServer method). ``{name}`` /
#: ``{version}`` segments are the handler's arguments; the first pattern that fits a path
#: wins (``/v2/models/stats`` before ``/v2/models/{name}``), and a path that fits only
#: under another method is 405 naming it. HEAD is answered as GET, without a body.
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("GET", "/v2", "get_server_metadata"),
    ("GET", "/v2/health/live", "live"),
    ("GET", "/v2/health/ready", "ready"),
    ("GET", "/metrics", "scrape"),
    ("GET", "/v2/models/stats", "statistics"),
    ("POST", "/v2/repository/index", "repository_index"),
    ("POST", "/v2/repository/models/{name}/load", "load"),
    ("POST", "/v2/repository/models/{name}/unload", "unload"),
    ("GET", "/v1/models", "openai_models"),
    ("POST", "/v1/completions", "completions"),
    ("POST", "/v1/chat/completions", "chat_completions"),
    *((method, f"/v2/models/{{name}}{version}{tail}", handler)
      for version in ("", "/versions/{version}")
      for method, tail, handler in (
          ("GET", "", "model_metadata"), ("GET", "/ready", "model_ready"),
          ("GET", "/config", "model_config"), ("GET", "/stats", "statistics"),
          ("POST", "/infer", "infer_route"), ("POST", "/generate", "generate"),
          ("POST", "/generate_stream", "generate_stream"))),
)


class _RouteTable:
    """ROUTES bound to one server, grouped by segment count (a lookup checks the few
    patterns of the path's length)."""

    def __init__(self, server: GearServer) -> None:
        self._by_length: dict[int, list[tuple[str, list[str], Handler]]] = {}
        for method, pattern, handler in ROUTES:
            segments = _segments(pattern)
            self._by_length.setdefault(len(segments), []).append(
                (method, segments, getattr(server, handler)))

    def find(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        """(handler, its path arguments); _NotFound (404) or _MethodNotAllowed (405)."""
        parts = _segments(path)
        allowed: list[str] = []
        for want, segments, handler in self._by_length.get(len(parts), ()):
            params = _bind(segments, parts)
            if params is None:
                continue
            if method == want or (method == "HEAD" and want == "GET"):
                return handler, params
            allowed.append(want)
        if allowed:
            raise _MethodNotAllowed(f"{method} is not allowed on {path[:200]} "
                                    f"(use {allowed[0]})")
        raise _NotFound(f"no such path: {path[:200]}")


def _bind(pattern: list[str], parts: list[str]) -> dict[str, str] | None:
    """The ``{name}`` segments of ``pattern`` bound to ``parts``; None if they do not fit."""
    params: dict[str, str] = {}
    for want, got in zip(pattern, parts, strict=True):
        if want.startswith("{"):
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


class _RouteError(StatusError):
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


def _event_stream(events: Any, generation: Any) -> HttpReply:
    """A reply of Server-Sent Events (sent as they come); closing it closes
    ``generation`` too, even where the events never started (the client went away first)."""
    return HttpReply(200, b"", "text/event-stream",
                     {"cache-control": "no-cache", "x-accel-buffering": "no"},
                     stream=_Events(events, generation))


class _Events:
    """An event stream that ends its generation however it ends."""

    def __init__(self, events: Any, generation: Any) -> None:
        self.events, self.generation = events, generation

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> bytes:
        return await self.events.__anext__()

    async def aclose(self) -> None:
        try:
            await self.events.aclose()
        finally:
            await self.generation.aclose()


def _llm_metadata(served: ServedLlm) -> dict[str, Any]:
    """v2 model metadata of a language model: what Triton's generate extension takes."""
    return {"name": served.name, "versions": ["1"], "platform": "gear_runtime_llm",
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}],
            "parameters": {"max_length": served.max_length,
                           "max_sequences": served.engine.gears.rows}}


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
    and, with ``model_repository``, every model of that folder (gear files, and Triton's
    layout: serving/repository.py); return the server. Raises GearRuntimeError for a file
    that cannot be served."""
    options = options or ServeOptions()
    metrics = Metrics(None if options.worker is None else str(options.worker),
                      options.worker_dir)
    repository = ModelRepository(model_repository) if model_repository else None
    files = list(files)
    names = list(names) if names else [model_name(f) for f in files]
    triton: list[RepositoryModel] = []  # the models of Triton's layout: their versions
    if repository is not None:  # every model of the repository, unless a file is named so
        extra = [repository.entry(n) for n in repository.names() if n not in names]
        files += [str(e.versions[MODEL_VERSION]) for e in extra if e.triton is None]
        names += [e.name for e in extra if e.triton is None]
        triton = [e for e in extra if e.triton is not None]
    if len(set(names)) != len(names):
        raise InputError(f"two models would be served as the same name: {names}; use --name")
    text = {n: f for n, f in zip(names, files, strict=True) if is_llm_folder(f)}
    llms = load_llms(text.items(), options, metrics)
    models: dict[str, ServedModel] = {}
    try:
        tensors = [(n, f) for n, f in zip(names, files, strict=True) if n not in text]
        models = load_models([f for _, f in tensors], [n for n, _ in tensors], options,
                             metrics)
        versions = load_entries(triton, options, metrics)
    except BaseException:
        close_loaded(models.values())
        _close_llms(llms.values())
        raise
    server = GearServer(models, options, metrics, repository, llms)
    for name, loaded in versions.items():
        server.install(name, loaded)
    return server


def load_llms(folders: Iterable[tuple[str, str]], options: ServeOptions,
              metrics: Metrics) -> dict[str, ServedLlm]:
    """Each (name, causal LM folder) with its engine started; none left running when one
    fails."""
    served: dict[str, ServedLlm] = {}
    try:
        for name, path in folders:
            served[name] = ServedLlm.load(name, path, options, metrics)
    except BaseException:
        _close_llms(served.values())
        raise
    return served


def _close_llms(served: Iterable[ServedLlm]) -> None:
    """Stop the engines of models that will not be served (a load failed)."""
    for s in served:
        s.engine.close()
