"""`rase serve --ray`: start (or join) Ray, deploy build_app on Serve's HTTP proxy at --host/--port,
wait for SIGINT/SIGTERM, then drain (running requests finish, up to the drain timeout) and stop.

A Ray instance this command starts is its own and local: every Ray service on the loopback
address (Ray's own switch for single-machine use, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), an
object store of OBJECT_STORE_MB (rase sends requests and text through it, never tensors), and
it stops with the command. With --ray-address the cluster is someone else's: the app is removed
on exit, the cluster stays."""
from __future__ import annotations

import os
import signal
import threading

from ..errors import DeploymentFailed, InvalidRequest

APP_NAME = "rase"
OBJECT_STORE_MB = 128


def _init_ray(address: str | None):
    import ray

    try:
        if address:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(include_dashboard=False, object_store_memory=OBJECT_STORE_MB << 20, log_to_driver=False,
                     configure_logging=False)
    except ConnectionError as exc:
        raise DeploymentFailed(f"cannot reach the Ray cluster at {address}: {exc} (a cluster with token "
                               "authentication also needs RAY_AUTH_MODE=token and its token here, "
                               "~/.ray/auth_token)") from None
    return ray


def _deploy(serve, app) -> None:
    try:
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    except RuntimeError as exc:  # Ray's "Deploying application rase failed"; the why is in the status
        details = serve.status().applications.get(APP_NAME)
        why = [d.message.strip().splitlines()[-1] for d in details.deployments.values()
               if d.message.strip()] if details else []  # the replica's own exception line
        raise DeploymentFailed(f"the rase replicas did not start: {'; '.join(why) or exc} (Ray's logs: "
                               "session_latest/logs/serve/ under Ray's temp dir)") from None


def _http_matches(host: str, port: int) -> None:
    """Serve keeps the HTTP options of whoever started it first: refuse rather than listen elsewhere."""
    from ray.serve.context import _get_global_client  # the one place Serve says where its proxy listens

    cfg = _get_global_client().http_config
    if (cfg.host, cfg.port) != (host, port):
        raise InvalidRequest(f"Ray Serve on this cluster already listens on {cfg.host}:{cfg.port}; "
                                      f"run with --host {cfg.host} --port {cfg.port} (or `serve shutdown` first)")


def _port_free(host: str, port: int) -> None:
    """Serve's proxy would fail to bind deep inside an actor: say it here, before Ray starts."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy's uvicorn binds
        try:
            s.bind((host, port))
        except OSError as exc:
            raise DeploymentFailed(f"cannot listen on {host}:{port}: {exc.strerror}; "
                                   "give another --port (or stop what listens there)") from None


def _start_serve(serve, host: str, port: int) -> None:
    from ray.exceptions import RayTaskError

    try:
        serve.start(http_options={"host": host, "port": port})
    except RayTaskError as exc:  # the proxy actor's own error, e.g. a port taken meanwhile
        raise DeploymentFailed(f"Ray Serve did not start on {host}:{port}: {type(exc.cause).__name__}: "
                               f"{exc.cause}") from None
    _http_matches(host, port)


def serve_on_ray(host: str, port: int, address: str | None, banner, stop: threading.Event | None = None,
                 **app_options) -> int:
    """app_options: build_app's. Blocks until SIGINT/SIGTERM (or stop is set); returns the exit code."""
    if not address:  # Ray's own switch for single-machine use, read at import: every service on loopback
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from .ray_serve import build_app

    app = build_app(**app_options)  # refuses a bad store or option before Ray starts
    if not address:
        _port_free(host, port)
    ray = _init_ray(address)
    from ray import serve

    stop = stop or threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _start_serve(serve, host, port)
        _deploy(serve, app)
        banner()
        while not stop.wait(0.5):
            pass
        print("draining: running requests finish, then the replicas stop", flush=True)
        serve.delete(APP_NAME)  # waits for each replica's graceful shutdown
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if not address:
            serve.shutdown()
        ray.shutdown()
