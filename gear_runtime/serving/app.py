"""The HTTP server: KServe v2 REST endpoints on Starlette, run by uvicorn.

    GET  /v2/health/live, /v2/health/ready, /v2
    GET  /v2/models/{name}[/versions/1]            metadata (+ gears as parameters)
    GET  /v2/models/{name}[/versions/1]/ready
    POST /v2/models/{name}[/versions/1]/infer      JSON, or JSON + binary tensors (Triton)
    GET  /metrics                                  Prometheus text format

Every failure is answered, never raised into the server: ``{"error": "[code] message",
"code": code}`` with 400 (bad request), 404 (unknown model or path), 413 (body too large),
503 + ``Retry-After`` (queue full, shutting down) or 500 (a failure of ours, logged).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import zlib
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gear_runtime.errors import ClosedError, InputError
from gear_runtime.serving.errors import (
    RETRY_AFTER_S,
    ModelNotFoundError,
    PayloadTooLargeError,
    error_code,
    http_status,
)
from gear_runtime.serving.metrics import Metrics
from gear_runtime.serving.protocol import HEADER_LENGTH, decode_request, encode_response, error_body
from gear_runtime.serving.runner import ServedModel, ServeOptions, load_models

logger = logging.getLogger("gear_runtime.serving")

#: The only model version served (v2 paths may name it).
VERSION = "1"
JSON = "application/json"


class GearServer:
    """The served models and the ASGI app in front of them (``.app``)."""

    def __init__(self, models: dict[str, ServedModel], options: ServeOptions,
                 metrics: Metrics) -> None:
        self.models, self.options, self.metrics = models, options, metrics
        self.closing = False
        self.app = self._build_app()

    # ---- the app -------------------------------------------------------------------------
    def _build_app(self) -> Starlette:
        routes = [Route("/v2/health/live", self.live), Route("/v2/health/ready", self.ready),
                  Route("/v2", self.server_metadata), Route("/metrics", self.scrape)]
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            routes += [Route(prefix, self.model_metadata),
                       Route(prefix + "/ready", self.model_ready),
                       Route(prefix + "/infer", self.infer, methods=["POST"])]

        @asynccontextmanager
        async def lifespan(app: Starlette):
            yield
            await self.close()  # after uvicorn has drained the requests in flight

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
            return Response(json.dumps({"error": f"{detail}: {request.url.path}"}),
                            status, media_type=JSON)

        return Starlette(routes=routes, lifespan=lifespan,
                         exception_handlers={HTTPException: http_error})

    async def live(self, request: Request) -> Response:
        return _json({"live": True})

    async def ready(self, request: Request) -> Response:
        return _json({"ready": not self.closing}, 200 if not self.closing else 503)

    async def server_metadata(self, request: Request) -> Response:
        from gear_runtime.version import __version__

        return _json({"name": "gear_runtime", "version": __version__,
                      "extensions": ["binary_tensor_data"]})

    async def scrape(self, request: Request) -> Response:
        body, content_type = self.metrics.exposition()
        return Response(body, media_type=content_type)

    async def model_metadata(self, request: Request) -> Response:
        try:
            return _json(self._model(request).metadata())
        except Exception as exc:
            return self._error(exc, "")

    async def model_ready(self, request: Request) -> Response:
        try:
            self._model(request)
        except Exception as exc:
            return self._error(exc, "")
        return _json({"name": request.path_params["name"], "ready": not self.closing},
                     200 if not self.closing else 503)

    async def infer(self, request: Request) -> Response:
        """Decode, run (batched or not), encode; every failure becomes an error response."""
        t0 = time.perf_counter()
        name = ""
        try:
            # the body first, even for an unknown model: a reply before the body is read
            # would close the connection under a client still sending it
            body = await read_body(request, self.options.max_body_bytes)
            model = self._model(request)
            name = model.name
            if self.closing:
                raise ClosedError("the server is shutting down")
            infer_request = decode_request(body, request.headers.get(HEADER_LENGTH))
            gear, outputs = await model.infer(infer_request)
            names, outputs = _selected(model, infer_request.outputs, outputs)
            payload, header_length = encode_response(model.name, infer_request, names, outputs)
        except Exception as exc:
            return self._error(exc, name)
        self.metrics.request(name, model.gear_label(gear), time.perf_counter() - t0)
        if header_length is None:
            return Response(payload, media_type=JSON)
        return Response(payload, media_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(header_length)})

    def _model(self, request: Request) -> ServedModel:
        name = request.path_params["name"]
        version = request.path_params.get("version", VERSION)
        model = self.models.get(name)
        if model is None or version != VERSION:
            what = f"model {name!r}" + (f" version {version!r}" if model is not None else "")
            raise ModelNotFoundError(f"{what} is not served here; models: "
                                     f"{', '.join(sorted(self.models))} (version {VERSION})")
        return model

    def _error(self, exc: BaseException, model: str) -> Response:
        status = http_status(exc)
        if status >= 500 and not isinstance(exc, ClosedError) and status != 503:
            logger.error("request failed", exc_info=exc)
        self.metrics.error(model, error_code(exc), status)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
        return Response(error_body(exc), status, headers=headers, media_type=JSON)

    async def close(self) -> None:
        """Stop every model (batchers, executors, the models); idempotent."""
        if self.closing and not self.models:
            return
        self.closing = True
        models, self.models = self.models, {}
        await asyncio.gather(*(m.close() for m in models.values()), return_exceptions=True)


def _json(doc: Any, status: int = 200) -> Response:
    return Response(json.dumps(doc), status, media_type=JSON)


def _selected(model: ServedModel, requested: dict[str, bool] | None,
              outputs: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """The outputs the request asked for (all, in model order, when it named none)."""
    names = list(model.model.output_names)
    if requested is None:
        return names, list(outputs)
    by_name = dict(zip(names, outputs, strict=True))
    return list(requested), [by_name[n] for n in requested]


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (also once decompressed: gzip and deflate,
    as tritonclient sends them); PayloadTooLargeError past it, before reading further."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the body has {declared} bytes; this server accepts at "
                                   f"most {limit} (--max-body-mb)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"the body exceeds {limit} bytes (--max-body-mb)")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise InputError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
    return _decompress(body, encoding, limit)


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate at most ``limit`` bytes: a small compressed body cannot expand without bound."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InputError(f"the body is not valid {encoding} data: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLargeError(f"the body inflates past {limit} bytes (--max-body-mb)")
    return out


# ---- building and running ---------------------------------------------------------------------
def build_server(files: Sequence[str], names: Sequence[str] | None = None,
                 options: ServeOptions | None = None) -> GearServer:
    """Load ``files`` (served as ``names``, default: the file names without ``.gear.onnx``)
    and return the server; its ``.app`` is the ASGI application. Raises GearRuntimeError for
    a file that cannot be served."""
    options = options or ServeOptions()
    metrics = Metrics()
    return GearServer(load_models(files, names, options, metrics), options, metrics)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port; read it back with
    ``getsockname``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def uvicorn_server(server: GearServer, sock: socket.socket, *, log_level: str = "warning",
                   graceful_timeout_s: float = 30.0) -> Any:
    """A uvicorn Server for ``server.app`` on the bound ``sock``. Its ``run(sockets=[sock])``
    handles SIGINT/SIGTERM: stop accepting, let the requests in flight finish (up to
    ``graceful_timeout_s``), then close the models."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(server.app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=graceful_timeout_s, lifespan="on",
                            access_log=False)
    return uvicorn.Server(config)
