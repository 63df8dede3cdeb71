"""What every request passes before a route: body size, the Host (DNS rebinding), the browser
origin (cross-site form posts and fetches), the API key (constant time), opt-in CORS; and the
error shapes of validation failures and RaseErrors. Every answer is counted by route and status.

A web page the user opens can send requests to 127.0.0.1; it cannot read the answers (no CORS)
but a POST still runs. Two rules stop that: on a loopback bind the Host must be a loopback name
(a rebound DNS name is refused), and a request a browser marks as coming from another origin
(Origin, Sec-Fetch-Site) is refused unless --cors-origin names that origin.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import RaseError
from .errors import error_body, status_of

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# routes open without the API key: the page itself (it asks for the key) and liveness
PUBLIC = ("/", "/health")
PUBLIC_PREFIXES = ("/web/",)


@dataclass(frozen=True)
class GuardConfig:
    api_key: str | None = None
    max_body: int = 20 << 20  # a prompt with a few photos as base64 (an image is read up to 20 MiB)
    allowed_hosts: tuple[str, ...] | None = None  # Host names accepted; None = any (e.g. mounted in a host app)
    cors_origins: tuple[str, ...] = field(default=())  # origins allowed to call from a browser; "*" = any

    @staticmethod
    def loopback(**kw) -> "GuardConfig":
        return GuardConfig(**{"allowed_hosts": LOOPBACK_NAMES, **kw})


def _host_name(host: str) -> str:
    """'localhost:8080' -> 'localhost', '[::1]:8080' -> '::1' (lower case)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else url.lower()


class Guard:
    def __init__(self, config: GuardConfig):
        self.config = config
        self._key = config.api_key.encode() if config.api_key else None
        self._origins = {_origin(o) for o in config.cors_origins if o != "*"}
        self._any_origin = "*" in config.cors_origins

    def refuse(self, request: Request) -> JSONResponse | None:
        """None when the request may go on, else the answer that refuses it."""
        c, path = self.config, request.url.path
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > c.max_body):
            return _error(413, f"request body over {c.max_body} bytes", "invalid_request_error")
        if c.allowed_hosts is not None and _host_name(request.headers.get("host", "")) not in c.allowed_hosts:
            return _error(403, "Host header not allowed: this server answers to " + ", ".join(c.allowed_hosts)
                          + " (rase serve --allowed-host NAME adds a name)", "permission_error")
        if self._cross_site(request):
            return _error(403, "cross-origin request refused: rase serve --cors-origin ORIGIN allows a web "
                          "origin to call this server", "permission_error")
        if self._key and not (path in PUBLIC or path.startswith(PUBLIC_PREFIXES)):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            bearer = token.strip() if scheme.lower() == "bearer" else None
            given = bearer if bearer is not None else request.headers.get("x-api-key")  # Anthropic's header
            if given is None or not hmac.compare_digest(given.strip().encode(), self._key):
                return _error(401, "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                              "authentication_error")
        return None

    def _cross_site(self, request: Request) -> bool:
        origin = request.headers.get("origin")
        if origin is None:  # not a browser's cross-origin call unless Fetch Metadata says so
            if request.method == "GET" and request.headers.get("sec-fetch-mode") == "navigate":
                return False  # following a link to the page is fine; reading the API is not
            return request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none")
        if self._any_origin or _origin(origin) in self._origins:
            return False
        scheme = request.headers.get("x-forwarded-proto", request.url.scheme)
        return _origin(origin) != f"{scheme}://{request.headers.get('host', '')}".lower()

    def cors_headers(self, request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is None or not (self._any_origin or _origin(origin) in self._origins):
            return {}
        return {"Access-Control-Allow-Origin": "*" if self._any_origin else origin, "Vary": "Origin",
                "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Api-Key, Anthropic-Version",
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "600"}


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(error_body(message, kind), status)


# body types read as JSON, as llama-server and Ollama do: curl -d labels JSON a form, fetch without a
# type says text/plain (cross-site senders of these are refused above: Origin, Sec-Fetch-Site)
READ_AS_JSON = (b"", b"application/x-www-form-urlencoded", b"text/plain")


def _as_json(scope: dict) -> None:
    given = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    if given.split(b";")[0].strip().lower() in READ_AS_JSON:
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"] + [
            (b"content-type", b"application/json")]


class GuardMiddleware:
    """The guard as a pure ASGI middleware: a refused request never reaches the app, an allowed
    one passes through with its CORS headers added to the response's start, streaming answers are
    never buffered, and every answer is counted by route and status."""

    def __init__(self, app, config: GuardConfig, metrics) -> None:
        self.app, self.guard, self.metrics = app, Guard(config), metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        answer = self.guard.refuse(request)
        cors = {} if answer is not None else self.guard.cors_headers(request)
        if cors and request.method == "OPTIONS" and "access-control-request-method" in request.headers:
            answer = JSONResponse({}, 204)  # a preflight of an allowed origin
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cors.items()]
        status = [500]

        async def send_counted(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if extra:  # the guard's CORS headers replace any of the same name
                    names = {k for k, _ in extra}
                    message = {**message, "headers": [h for h in message.get("headers", []) if h[0].lower() not in names]
                               + extra}
            await send(message)

        try:
            if answer is not None:
                await answer(scope, receive, send_counted)
                return
            if request.method == "POST":
                _as_json(scope)
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.request(getattr(scope.get("route"), "path", "other"), status[0])


_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _union_tag(part) -> bool:
    """A segment pydantic adds to an error's location for a union's branch (str, literal[...],
    a model's class name), not a field: left out of the param a 400 names."""
    return isinstance(part, str) and (part in _TAGS or "[" in part or part.startswith(("constrained-", "function-"))
                                      or part[:1].isupper())


def install_guards(app: FastAPI, config: GuardConfig, metrics) -> None:
    app.add_middleware(GuardMiddleware, config=config, metrics=metrics)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # e.g. a body that is not UTF-8
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(f"request body is not valid JSON ({first.get('msg')})",
                                           "invalid_request_error"), 400)
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body" and not _union_tag(p))
        why = "not supported by this server" if first.get("type") == "extra_forbidden" else first.get("msg", "invalid")
        msg = f"{where}: {why}" if where else "invalid request body"
        return JSONResponse(error_body(msg, "invalid_request_error", param=where or None), 400)

    @app.exception_handler(RaseError)
    async def rase_error(request: Request, exc: RaseError):
        status, kind = status_of(exc)
        retry = getattr(exc, "retry_after", None)
        return JSONResponse(error_body(str(exc), kind, param=getattr(exc, "param", None)), status,
                            headers={"Retry-After": str(retry)} if retry is not None else None)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve_config(host: str, api_key: str | None = None, api_key_file: str | None = None,
                 allowed_hosts: list[str] | None = None, cors_origins: list[str] | None = None,
                 environ: dict | None = None) -> tuple[GuardConfig, list[str]]:
    """rase serve's guard from its options -> (config, warnings). The key: --api-key, else
    --api-key-file (first line), else $RASE_API_KEY. On a loopback bind only loopback Host names
    (and --allowed-host names) are answered; on any other bind every name, unless --allowed-host."""
    import os

    from ..errors import InvalidRequest

    environ = os.environ if environ is None else environ
    if api_key is None and api_key_file is not None:
        try:
            with open(api_key_file, encoding="utf-8") as f:
                api_key = f.readline().strip()
        except OSError as exc:
            raise InvalidRequest(f"--api-key-file {api_key_file}: {exc.strerror}", "api_key_file") from None
        if not api_key:
            raise InvalidRequest(f"--api-key-file {api_key_file} is empty: write the key on its first line",
                                          "api_key_file")
    if api_key is None:
        api_key = environ.get("RASE_API_KEY") or None
    extra = tuple(h.lower() for h in allowed_hosts or ())
    loopback = _is_loopback(host)
    hosts = LOOPBACK_NAMES + extra if loopback else (extra + LOOPBACK_NAMES + (host.lower(),) if extra else None)
    warnings = []
    if not loopback and not api_key:
        warnings.append(f"warning: serving on {host} without an API key: anyone who can reach this port can use "
                        "the models; give --api-key-file FILE or set RASE_API_KEY")
    return GuardConfig(api_key=api_key, allowed_hosts=hosts, cors_origins=tuple(cors_origins or ())), warnings
