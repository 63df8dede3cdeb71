"""The chat page at `/`: index.html and its assets from the package (rase/server/web/), read once
per app; nothing is fetched from elsewhere, and the Content-Security-Policy says so to the browser
(scripts, styles and requests from this origin only), a second line behind the page's own rule
that model output only ever becomes text nodes."""
from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from .errors import error_body

ASSETS = {"index.html": "text/html; charset=utf-8", "chat.js": "text/javascript; charset=utf-8",
          "markdown.js": "text/javascript; charset=utf-8", "chat.css": "text/css; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
           "Referrer-Policy": "no-referrer"}


def router() -> APIRouter:
    root = resources.files(__package__) / "web"
    files = {name: (root / name).read_bytes() for name in ASSETS}
    r = APIRouter()

    def asset(name: str) -> Response:
        return Response(files[name], media_type=ASSETS[name], headers=HEADERS)

    @r.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index():
        return asset("index.html")

    @r.api_route("/web/{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def web(name: str):
        if name not in files:
            return JSONResponse(error_body(f"no page asset {name!r}: the chat page is at /", "not_found_error"), 404)
        return asset(name)

    return r
