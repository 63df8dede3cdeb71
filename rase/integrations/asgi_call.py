"""One HTTP request, already read, run through an ASGI app in this process; the response comes
back as a ResponseStart and then body chunks. This is how a replica that owns an Engine answers
requests its ingress forwards (the ingress holds the socket, the replica runs create_app)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class ForwardedRequest:
    """What the ingress read: the request line, headers (as sent), the whole body; route_key:
    the prefix the router keeps together (None: any replica)."""
    method: str
    path: str
    query_string: bytes
    headers: Headers
    body: bytes
    client: tuple[str, int] | None = None
    server: tuple[str, int] | None = None
    route_key: str | None = None


@dataclass(frozen=True)
class ResponseStart:
    status: int
    headers: Headers


def _scope(req: ForwardedRequest) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.path.encode("latin-1"),
            "query_string": req.query_string, "root_path": "", "headers": [list(h) for h in req.headers],
            "client": req.client, "server": req.server, "state": {}}


async def call_asgi(app, req: ForwardedRequest, extra_headers: Headers = ()) -> AsyncIterator[ResponseStart | bytes]:
    """Run app on req; yield the response start (with extra_headers added), then non-empty body
    chunks as the app sends them. Closing this generator early is the client going away: the
    app's receive() says http.disconnect and its task is cancelled."""
    messages: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await messages.put(message)

    finished = object()
    task = asyncio.create_task(app(_scope(req), receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(finished))
    try:
        while True:
            message = await messages.get()
            if message is finished:
                task.result()  # the app's own exception, if it raised one
                return
            if message["type"] == "http.response.start":
                yield ResponseStart(message["status"], tuple((bytes(k), bytes(v)) for k, v in
                                                            message.get("headers", ())) + tuple(extra_headers))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    return
    finally:
        gone.set()
        if not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # the app's cleanup after the client left
                pass
