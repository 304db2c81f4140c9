"""Scale out on Ray Serve: N replicas, each loading the models with their own executors (and
batchers), behind Ray Serve's HTTP proxy, which speaks the same v2 API as the single-process
server (the replica's ASGI app is the same Starlette app).

    from gear_runtime.serving.ray_app import ray_app
    from gear_runtime.serving import ServeOptions
    app = ray_app(["model.gear.onnx"], replicas=2, options=ServeOptions(executors=2))
    serve.run(app, route_prefix="/")        # a ray.serve Application, like any other

``ray_actor_options`` places replicas (``{"num_gpus": 1}``: one device per replica). Each
replica's ``/metrics`` are its own (the proxy sends a scrape to one replica). Needs the
``ray`` extra (``pip install "gear_runtime[ray]"``).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ray import serve

from gear_runtime.serving.app import GearServer, build_server
from gear_runtime.serving.loading import model_name
from gear_runtime.serving.options import ServeOptions

#: The Ray Serve application (and deployment) name.
APP_NAME = "gear_runtime"


@serve.ingress()
class GearDeployment:
    """One replica: the models of ``files`` with their executors, and the v2 app."""

    def __init__(self, files: Sequence[str], names: Sequence[str] | None,
                 options: ServeOptions) -> None:
        self._server: GearServer = build_server(files, names, options)

    def __serve_build_asgi_app__(self) -> Any:
        return self._server.app


def ray_app(files: Sequence[str], names: Sequence[str] | None = None,
            options: ServeOptions | None = None, *, replicas: int = 1,
            ray_actor_options: Mapping[str, Any] | None = None) -> serve.Application:
    """The Ray Serve application serving ``files`` on ``replicas`` replicas (model names:
    ``names`` or the file names). Paths are made absolute here: replicas run elsewhere."""
    files = [os.path.abspath(f) for f in files]
    names = list(names) if names else [model_name(f) for f in files]
    # the decorator form: ray types serve.deployment(cls, ...) as returning a decorator
    deployment = serve.deployment(name=APP_NAME, num_replicas=replicas,
                                  ray_actor_options=dict(ray_actor_options or {}))(GearDeployment)
    return deployment.bind(files, names, options or ServeOptions())


def start_local(host: str, port: int, num_cpus: int | None = None) -> None:
    """Start a local Ray instance on the loopback address and Serve's proxy on
    ``host``:``port``. Ray's usage reporting is off unless the environment turns it on."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _loopback_node()
    # "local": always a new instance of our own, never one found through RAY_ADDRESS or
    # another process's cluster file
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             configure_logging=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})


def _loopback_node() -> None:
    """Make a new local Ray node use 127.0.0.1 as its address (Ray's own processes then talk
    over loopback). Ray turns ``_node_ip_address="127.0.0.1"`` into the host's address; its
    loopback mode is the single-node one it uses on macOS and Windows, switched by this
    constant (read when the node starts). Without it, Ray picks the host's address."""
    try:
        from ray._private import ray_constants
    except ImportError:  # a Ray without it: its default address
        return
    ray_constants.ENABLE_RAY_CLUSTER = False


def free_port(host: str) -> int:
    """A port free on ``host`` now (Ray's proxy takes a number, not a socket)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_forever(files: Sequence[str], names: Sequence[str] | None, options: ServeOptions, *,
                  host: str, port: int, replicas: int) -> int:
    """``gear-runtime serve --ray``: a local Ray instance, the app on ``replicas`` replicas,
    until SIGINT / SIGTERM; then Serve and Ray shut down (Serve drains its replicas)."""
    import ray

    port = port or free_port(host)
    start_local(host, port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # at most one CPU per replica, so that N replicas fit on fewer cores (Ray would wait
        # for CPUs that never come)
        cpus = min(1.0, (os.cpu_count() or 1) / replicas)
        serve.run(ray_app(files, names, options, replicas=replicas,
                          ray_actor_options={"num_cpus": cpus}),
                  name=APP_NAME, route_prefix="/", blocking=False)
        print(f"gear-runtime: serving {', '.join(names or map(model_name, files))} at "
              f"http://{host}:{port} on Ray Serve ({replicas} replicas)", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    print("gear-runtime: server stopped", flush=True)
    return 0
