"""Serve gear models over the Open Inference Protocol (KServe v2 REST, tritonclient-ready).

    from gear_runtime.serving import build_server, ServeOptions
    server = build_server(["model.gear.onnx"], options=ServeOptions(executors=2))
    # server.app is an ASGI app: uvicorn, Ray Serve (gear_runtime.serving.ray_app), tests

Needs the ``serve`` extra (``pip install "gear_runtime[serve]"``): importing this package
without it raises ImportError saying so.
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # one clear line instead of a missing-module traceback
    raise ImportError(f'serving needs the serve extra: pip install "gear_runtime[serve]" '
                      f"({exc.name} is not installed)", name=exc.name) from exc

from gear_runtime.serving.app import GearServer, build_server, listen, uvicorn_server
from gear_runtime.serving.runner import ServeOptions, execute_accepts_pad, model_name

__all__ = ["GearServer", "ServeOptions", "build_server", "execute_accepts_pad", "listen",
           "model_name", "uvicorn_server"]
