"""The KServe v2 / Triton gRPC API (``GRPCInferenceService``) on grpcio's asyncio server, on
the server's event loop: the same models, batcher, limits, statistics and errors as HTTP.

Built on the message and service modules ``tritonclient`` ships (``tritonclient.grpc``'s
``service_pb2`` / ``service_pb2_grpc`` / ``model_config_pb2``, generated from Triton's
grpc_service.proto and model_config.proto), so ``tritonclient.grpc`` works unchanged.
Implemented: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelConfig,
ModelStatistics, ModelInfer (inputs as ``raw_input_contents`` or typed ``contents``; outputs
as ``raw_output_contents``), RepositoryIndex, RepositoryModelLoad / Unload. Every other call
(streaming inference, shared memory, trace and log settings) answers UNIMPLEMENTED with a
message saying what to use instead, and one log line, never a traceback. Needs the ``grpc``
extra.

Errors: the HTTP status of :func:`~gear_runtime.serving.errors.http_status` mapped to a gRPC
code (400 INVALID_ARGUMENT, 404 NOT_FOUND, 408 DEADLINE_EXCEEDED: a call whose deadline
passed while it waited in the queue, 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 500 INTERNAL),
the message ``[code] message`` as over HTTP.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from gear_runtime.errors import BackendUnavailableError, GearRuntimeError, InputError

try:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
except ImportError as exc:  # one clear line instead of a missing-module traceback
    raise BackendUnavailableError(
        f'--grpc-port needs the grpc extra: pip install "gear_runtime[grpc]" ({exc.name} is '
        "not installed)") from exc

import numpy as np

from gear_runtime.serving.errors import PayloadTooLargeError
from gear_runtime.serving.options import UNBOUNDED_MODEL_BODY_BYTES
from gear_runtime.serving.protocol import (
    DATATYPES,
    InferRequest,
    binary_tensor,
    check_datatype,
    check_shape,
    datatype_of,
    list_tensor,
)

if TYPE_CHECKING:
    from gear_runtime.serving.dataplane import DataPlane

logger = logging.getLogger("gear_runtime.serving")

#: HTTP status -> gRPC status code (what Triton's gRPC front end answers for the same).
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          405: grpc.StatusCode.UNIMPLEMENTED, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 431: grpc.StatusCode.RESOURCE_EXHAUSTED,
          503: grpc.StatusCode.UNAVAILABLE}

#: v2 datatype -> the InferTensorContents field that carries it (FP16: raw contents only).
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """GRPCInferenceService over the data plane (serving/dataplane.py)."""

    def __init__(self, server: DataPlane) -> None:
        self.server = server

    async def _answer(self, context: Any, call: Any, model: str = "") -> Any:
        """``await call()``; an error becomes the call's status (counted, logged as over
        HTTP)."""
        try:
            return await call()
        except Exception as exc:
            status = self.server.count_error(exc, model)
            code = _CODES.get(status, grpc.StatusCode.INTERNAL)
            await context.abort(code, str(exc))

    # ---- health and metadata -------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.server.is_ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            model = self.server.model(request.name, request.version)
        except GearRuntimeError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=self.server.model_is_ready(model))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(**self.server.server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            meta = self.server.model(request.name, request.version).metadata()
            tensor = service_pb2.ModelMetadataResponse.TensorMetadata
            return service_pb2.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                inputs=[tensor(**t) for t in meta["inputs"]],
                outputs=[tensor(**t) for t in meta["outputs"]])

        return await self._answer(context, call)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            config = self.server.model(request.name, request.version).config()
            return service_pb2.ModelConfigResponse(
                config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

        return await self._answer(context, call)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            stats = self.server.model_statistics(request.name, request.version)
            return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())

        return await self._answer(context, call)

    # ---- the model repository ------------------------------------------------------------
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            entries = self.server.index(request.ready)
            return service_pb2.RepositoryIndexResponse(
                models=[service_pb2.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

        return await self._answer(context, call)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            if request.parameters:
                raise InputError("load takes the model's gear file from the repository as "
                                 "it is: a config or files in the request are not supported")
            await self.server.load_model(request.model_name)
            return service_pb2.RepositoryModelLoadResponse()

        return await self._answer(context, call)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            await self.server.unload_model(request.model_name)
            return service_pb2.RepositoryModelUnloadResponse()

        return await self._answer(context, call)

    # ---- inference -----------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        """The data plane's inference over gRPC: raw or typed contents in, raw out."""
        arrived = time.perf_counter()
        try:
            model = self.server.model(request.model_name, request.model_version)
        except GearRuntimeError as exc:
            return await self._answer(context, _raiser(exc))
        remaining = context.time_remaining()  # the call's deadline (None: none)

        async def call() -> Any:
            with self.server.admit(model, arrived, remaining) as admission:
                infer_request = _decode(request, model)
                outputs = await self.server.infer(admission, infer_request)
                response = _response(model, request, infer_request, outputs)
            return response

        return await self._answer(context, call, model.name)

    # ---- what is not implemented: UNIMPLEMENTED, one log line, never a traceback --------
    async def _unimplemented(self, context: Any, method: str, why: str) -> Any:
        logger.info("gRPC %s: not implemented (%s)", method, why)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented by "
                            f"gear_runtime: {why}")

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
        await self._unimplemented(context, "ModelStreamInfer", "use ModelInfer (a stateful "
                                  "model takes sequence_id / sequence_start / sequence_end)")

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "SystemSharedMemoryStatus", _NO_SHM)

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "SystemSharedMemoryRegister", _NO_SHM)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "SystemSharedMemoryUnregister", _NO_SHM)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "CudaSharedMemoryStatus", _NO_SHM)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "CudaSharedMemoryRegister", _NO_SHM)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "CudaSharedMemoryUnregister", _NO_SHM)

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "TraceSetting", "no tracing extension")

    async def LogSettings(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "LogSettings", "the log level is serve "
                                  "--log-level")


#: why the shared-memory extensions are not offered
_NO_SHM = "no shared-memory extension: tensors travel in the request (raw_input_contents)"


def _raiser(exc: Exception) -> Any:
    async def call() -> Any:
        raise exc

    return call


def _decode(request: Any, model: Any) -> InferRequest:
    """``request`` decoded (:func:`decode_infer`); PayloadTooLargeError past the model's
    largest request."""
    size = request.ByteSize()
    if size > model.max_request_bytes:
        raise PayloadTooLargeError(
            f"the request has {size} bytes; model {model.name!r} accepts at most "
            f"{model.max_request_bytes}")
    return decode_infer(request)


def decode_infer(request: Any) -> InferRequest:
    """A ModelInferRequest as an InferRequest (the checks of the REST codec: datatypes,
    shapes, sizes, kinds and ranges of typed values)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InputError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: "
                         "give raw contents for every input or for none")
    if not request.inputs:
        raise InputError("the request needs inputs")
    out = InferRequest(inputs={}, datatypes={}, id=request.id or None,
                       parameters=_parameters(request.parameters), outputs=None)
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name:
            raise InputError(f"inputs[{i}] needs a name")
        if name in out.inputs:
            raise InputError(f"input {name!r} is given twice")
        datatype = check_datatype(name, tensor.datatype)
        shape = check_shape(name, list(tensor.shape))
        dtype = DATATYPES[datatype]
        if raw:
            array = binary_tensor(name, shape, dtype, len(raw[i]), memoryview(raw[i]))
        else:
            field = _CONTENTS.get(datatype)
            if field is None:
                raise InputError(f"input {name!r}: {datatype} data goes in raw_input_contents")
            array = list_tensor(name, shape, dtype, list(getattr(tensor.contents, field)))
        out.inputs[name], out.datatypes[name] = array, datatype
    if request.outputs:
        for item in request.outputs:
            if "classification" in item.parameters:
                raise InputError(f"output {item.name!r}: the classification extension is not "
                                 "supported")
        out.outputs = {item.name: True for item in request.outputs}
    out.binary_default = True
    return out


def _parameters(params: Any) -> dict[str, Any]:
    """The request parameters as plain values; ``dynamic_dims`` (a list of integers, which
    InferParameter cannot hold) may be given as a string: ``"20,1,1"`` or ``"[20, 1, 1]"``."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, kind) if kind else None
    dims = out.get("dynamic_dims")
    if isinstance(dims, str):
        text = dims.strip()
        try:
            out["dynamic_dims"] = json.loads(text if text.startswith("[") else f"[{text}]")
        except ValueError:
            raise InputError(f'parameter "dynamic_dims" {dims[:100]!r} is not a list of '
                             "integers") from None
    return out


def _response(model: Any, request: Any, infer_request: InferRequest,
              outputs: list[np.ndarray]) -> Any:
    names = list(model.output_names)
    if infer_request.outputs is not None:
        by_name = dict(zip(names, outputs, strict=True))
        names = list(infer_request.outputs)
        outputs = [by_name[n] for n in names]
    response = service_pb2.ModelInferResponse(model_name=model.name,
                                              model_version=model.version, id=request.id)
    for name, array in zip(names, outputs, strict=True):
        response.outputs.add(name=name, datatype=datatype_of(array.dtype),
                             shape=list(array.shape))
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        response.raw_output_contents.append(little.tobytes())
    return response


async def start_grpc(server: DataPlane, host: str, port: int) -> tuple[Any, tuple[str, int]]:
    """Start the gRPC service on ``host``:``port`` (0: a free port) on the running loop;
    returns (the grpc.aio server, (host, bound port)). OSError when it cannot bind."""
    limit = max([m.max_request_bytes for m in server.every_model()]
                + [UNBOUNDED_MODEL_BODY_BYTES])
    grpc_server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1),
        # a port in use fails, never shared with another server; the workers of one server
        # (serve --workers) share theirs
        ("grpc.so_reuseport", 1 if server.options.worker is not None else 0)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(server), grpc_server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = grpc_server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot serve gRPC on {address}: {exc}") from None
    if not bound:
        raise OSError(f"cannot serve gRPC on {address} (in use?): choose another --grpc-port, "
                      "or --grpc-port 0 for a free one")
    await grpc_server.start()
    return grpc_server, (host, bound)
