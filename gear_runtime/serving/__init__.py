"""Serve gear models over the Open Inference Protocol (KServe v2 REST and gRPC, with Triton's
binary tensor, model configuration, statistics and model repository extensions: the real
``tritonclient.http`` and ``tritonclient.grpc`` work unchanged).

    from gear_runtime.serving import build_server, ServeOptions, listen, serve
    server = build_server(["model.gear.onnx"], options=ServeOptions(executors=2))
    asyncio.run(serve(server, listen("127.0.0.1", 8000)))   # until SIGTERM, then drains
    # server.app is the same routes as an ASGI app (Ray Serve: gear_runtime.serving.ray_app)

Needs the ``serve`` extra (``pip install "gear_runtime[serve]"``; gRPC: ``[grpc]``):
importing this package without it raises ImportError saying so.
"""

from __future__ import annotations

try:
    import httptools  # noqa: F401
    import orjson  # noqa: F401
    import prometheus_client  # noqa: F401
except ImportError as exc:  # one clear line instead of a missing-module traceback
    raise ImportError(f'serving needs the serve extra: pip install "gear_runtime[serve]" '
                      f"({exc.name} is not installed)", name=exc.name) from exc

from gear_runtime.serving.app import GearServer, build_server
from gear_runtime.serving.http import HttpLimits, listen
from gear_runtime.serving.lifecycle import serve
from gear_runtime.serving.loading import model_name
from gear_runtime.serving.options import ServeOptions

__all__ = ["GearServer", "HttpLimits", "ServeOptions", "build_server", "listen", "model_name",
           "serve"]
