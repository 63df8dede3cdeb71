"""rase on Ray Serve: replicas that each own one Engine and run the same create_app as
`rase serve`, behind an ingress that reads each request, names its prompt prefix (route_key)
and hands it to the replica whose prefix cache holds it (PrefixAffinityRouter).

    HTTP -> Ray proxy -> RaseIngress (reads the body, no model) -> router -> RaseReplica (Engine, create_app)

The ingress keeps the client's socket; a replica streams the response back (ResponseStart, then
body chunks). A replica that dies before the first byte of an answer is retried on another one;
a stream it was in the middle of ends with an error event. Needs `pip install 'rase[ray]'`.
"""
from __future__ import annotations

import json
import os
from typing import AsyncIterator, Sequence

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from ..server.errors import error_body
from ..server.guard import GuardConfig
from .asgi_call import ForwardedRequest, ResponseStart, call_asgi
from .ray_router import PrefixAffinityRouter
from .node_store import fetched_manifest
from .replicas import Replicas
from .route_key import route_key

REPLICA_HEADER = b"x-rase-replica"  # who answered: "<Ray replica id> pid=<its process>"
RETRIES = 2  # further replicas tried when one dies before answering


class RaseReplica:
    """One Engine over this node's store with the deployment's models present (fetched and
    SHA-256 checked if missing), loaded before the replica reports ready."""

    def __init__(self, manifests: list[dict], store: str | None, engine_options: dict, guard: GuardConfig,
                 reasoning_format: str = "auto") -> None:
        from ..api import Engine
        from ..config import default_store
        from ..store.registry import ModelRegistry
        from ..server import create_app
        from ..server.defaults import ServeDefaults
        from .node_store import ensure_model

        registry = ModelRegistry(store or default_store())
        for m in manifests:
            ensure_model(registry, m)
        self.engine = Engine(registry.root, **engine_options)
        for m in manifests:
            self.engine.session(m["id"])  # verify + load now: a replica is healthy once it can answer
        self.app = create_app(self.engine, guard=guard, defaults=ServeDefaults(reasoning_format))
        self.name = serve.get_replica_context().replica_id.unique_id
        self.headers = ((REPLICA_HEADER, f"{self.name} pid={os.getpid()}".encode()),)

    async def forward(self, req: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        async for item in call_asgi(self.app, req, self.headers):
            yield item

    def check_health(self) -> None:
        """Ray's health probe: every loaded model's worker thread still runs."""
        dead = [key[0] for key, s in self.engine.sessions.sessions() if not s.worker.alive]
        if dead:
            raise RuntimeError(f"rase replica {self.name}: the worker of {', '.join(dead)} stopped")

    def __del__(self) -> None:  # Ray calls this once running requests drained (graceful_shutdown_timeout_s)
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it passes limit bytes (the replica's guard would refuse it too)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _forwarded(request: Request, body: bytes) -> ForwardedRequest:
    scope = request.scope
    return ForwardedRequest(request.method, scope["path"], scope.get("query_string", b""),
                            tuple((bytes(k), bytes(v)) for k, v in scope["headers"]), body,
                            tuple(scope["client"]) if scope.get("client") else None,
                            tuple(scope["server"]) if scope.get("server") else None,
                            route_key(scope["path"], body))


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind), status_code=status)


class RaseIngress:
    """The HTTP entry: no model, no engine; reads a request and forwards it to a replica."""

    def __init__(self, replicas, max_body: int) -> None:
        self.replicas = replicas.options(stream=True, method_name="forward")
        self.max_body = max_body

    async def __call__(self, request: Request):
        body = await _read_body(request, self.max_body)
        if body is None:
            return _error(413, f"request body over {self.max_body} bytes", "invalid_request_error")
        forwarded = _forwarded(request, body)
        for attempt in range(RETRIES + 1):
            stream = self.replicas.remote(forwarded)
            try:
                start = await stream.__anext__()
                first = await _next(stream)
            except RayActorError:  # died before answering: nothing was sent, another replica may
                stream.cancel()
                if attempt < RETRIES:
                    continue
                return _error(503, "no rase replica could answer (each one tried died); retry shortly",
                              "server_error")
            except Exception as exc:
                stream.cancel()
                return _error(500, f"the rase replica failed: {type(exc).__name__}", "server_error")
            except BaseException:  # cancelled: the client left
                stream.cancel()
                raise
            return _response(start, first, stream)


async def _next(stream) -> bytes | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


# a stream cut by its replica ends with the error its clients read: the openai client raises on an
# SSE error event, the ollama client on an NDJSON {"error"} line; a bare cut would look finished
CUT_MESSAGE = "the rase replica serving this stream died; retry the request"
STREAM_ERRORS = {
    b"text/event-stream": lambda: ("data: " + json.dumps({"error": {"message": CUT_MESSAGE, "type": "server_error"}})
                                   + "\n\ndata: [DONE]\n\n").encode(),
    b"application/x-ndjson": lambda: (json.dumps({"error": CUT_MESSAGE}) + "\n").encode(),
}


def _response(start: ResponseStart, first: bytes | None, stream) -> StreamingResponse:
    media = next((v.split(b";")[0].strip() for k, v in start.headers if k.lower() == b"content-type"), b"")
    cut = STREAM_ERRORS.get(media)

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is None:
                return
            yield first
            async for chunk in stream:
                yield chunk
        except Exception:  # RayActorError (died) or its task's error: end the stream as its clients expect
            if cut is not None:
                yield cut()
        finally:
            stream.cancel()

    response = StreamingResponse(body(), status_code=start.status)
    response.raw_headers = list(start.headers)
    return response


ROUTERS = {"affinity": lambda max_batch: RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                                             request_router_kwargs={"imbalance": max_batch}),
           "pow2": lambda max_batch: RequestRouterConfig()}  # Ray's default: power of two choices, no affinity


def build_app(models: Sequence[str | dict] | None = None, store=None, *, replicas: Replicas = Replicas(),
              threads_per_replica: int | None = None, router: str = "affinity", guard: GuardConfig | None = None,
              drain_timeout_s: float = 300.0, reasoning_format: str = "auto", **engine_options) -> serve.Application:
    """The Ray Serve application: RaseIngress over `replicas` RaseReplica of the models (ids in
    store, default all of them, or fetch specs: fetched_manifest) with Engine(**engine_options),
    rase serve's -np 8 and --max-waiting 64 unless given. Each replica takes threads_per_replica
    cores (default: this machine's physical cores split between the replicas) as its Ray CPUs.
    reasoning_format: rase serve's --reasoning-format, for every replica's app."""
    from ..config import default_store, physical_cores
    from ..errors import InvalidRequest
    from ..store.registry import ModelRegistry

    if router not in ROUTERS:
        raise InvalidRequest(f"router must be one of {', '.join(ROUTERS)}, got {router!r}", "router")
    if engine_options.get("keep_alive") is not None:
        raise InvalidRequest("keep_alive does not apply on Ray Serve: each replica keeps its models loaded "
                             "(scale replicas down instead)", "keep_alive")
    from ..server.defaults import ServeDefaults

    ServeDefaults(reasoning_format)  # a bad format fails here, before Ray starts
    registry = ModelRegistry(store or default_store())
    models = list(models) if models else [m.id for m in registry.list()]
    if not models:
        raise InvalidRequest(f"the store {registry.root} holds no models: rase model pull/import one first")
    manifests = [registry.get(m).to_dict() if isinstance(m, str) else fetched_manifest(m) for m in models]
    guard = guard or GuardConfig()
    most = replicas.high or replicas.count
    threads = threads_per_replica or max(1, physical_cores() // most)
    given = {k: v for k, v in engine_options.items() if v is not None}
    engine_options = {"max_batch": 8, "max_waiting": 64, **given, "n_threads": threads}
    max_batch, waiting = engine_options["max_batch"], engine_options["max_waiting"]
    replica = serve.deployment(RaseReplica, name="RaseReplica").options(
        **replicas.options(max_batch), ray_actor_options={"num_cpus": threads},
        max_ongoing_requests=max_batch + waiting + 1,  # past this the engine itself answers 429
        graceful_shutdown_timeout_s=drain_timeout_s, graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=5, request_router_config=ROUTERS[router](max_batch))
    ingress = serve.deployment(RaseIngress, name="RaseIngress").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096,
        graceful_shutdown_timeout_s=drain_timeout_s, graceful_shutdown_wait_loop_s=0.5)
    return ingress.bind(replica.bind(manifests, str(store) if store else None, engine_options, guard,
                                     reasoning_format), guard.max_body)


BUILDER_ARGS = {"models", "store", "replicas", "threads_per_replica", "router", "drain_timeout_s", "allowed_hosts",
                "cors_origins", "n_ctx", "max_batch", "kv_cache_mb", "prefix_cache", "max_waiting", "time_limit_s",
                "max_tokens_limit", "reasoning_format", "reasoning_budget"}


def app_builder(args: dict) -> serve.Application:
    """build_app from a Serve config file's `args` (serve run/deploy, KubeRay's serveConfigV2):
    import_path rase.integrations.ray_serve:app_builder. replicas: 2 or "1:4"; the API key is
    $RASE_API_KEY where the application is built (a Kubernetes secret, say); other keys as build_app's."""
    from ..errors import InvalidRequest

    unknown = sorted(set(args) - BUILDER_ARGS)
    if unknown:
        raise InvalidRequest(f"unknown rase app args: {', '.join(unknown)}; known: {', '.join(sorted(BUILDER_ARGS))}",
                                      unknown[0])
    args = dict(args)
    replicas = Replicas.parse(str(args.pop("replicas", 1)))
    guard = GuardConfig(api_key=os.environ.get("RASE_API_KEY") or None,
                        allowed_hosts=tuple(args.pop("allowed_hosts")) if "allowed_hosts" in args else None,
                        cors_origins=tuple(args.pop("cors_origins", ())))
    return build_app(replicas=replicas, guard=guard, **args)
