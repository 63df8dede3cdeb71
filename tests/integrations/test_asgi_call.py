"""call_asgi: a forwarded request run through create_app in process answers as the server does,
and closing its stream early cancels the generation (the client left)."""
import asyncio
import json
import time

import pytest

from rase.api import Engine
from rase.integrations.asgi_call import ForwardedRequest, ResponseStart, call_asgi
from rase.server import create_app

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def engine(smollm2_store):
    with Engine(smollm2_store) as e:
        yield e


def forwarded(path, body: dict | None = None, method="POST", headers=()):
    raw = json.dumps(body).encode() if body is not None else b""
    return ForwardedRequest(method, path, b"", ((b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                                                (b"content-length", str(len(raw)).encode()), *headers), raw,
                            ("127.0.0.1", 5000), ("127.0.0.1", 8000))


async def collect(app, req, extra=()):
    items = [item async for item in call_asgi(app, req, extra)]
    assert isinstance(items[0], ResponseStart) and all(isinstance(i, bytes) for i in items[1:])
    return items[0], b"".join(items[1:])


def test_non_streamed_and_streamed_answers_are_the_servers(engine):
    app = create_app(engine)
    expected = engine.chat("smollm2", MESSAGES, max_tokens=24, temperature=0).text
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    start, raw = asyncio.run(collect(app, forwarded("/v1/chat/completions", body), ((b"x-extra", b"1"),)))
    assert start.status == 200 and (b"x-extra", b"1") in start.headers
    assert json.loads(raw)["choices"][0]["message"]["content"] == expected
    start, raw = asyncio.run(collect(app, forwarded("/v1/chat/completions", {**body, "stream": True})))
    assert dict(start.headers)[b"content-type"].startswith(b"text/event-stream")
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == expected
    assert raw.endswith(b"data: [DONE]\n\n")


def test_errors_and_guards_answer_as_they_do_over_http(engine):
    app = create_app(engine, api_key="k")
    start, raw = asyncio.run(collect(app, forwarded("/v1/chat/completions", {"model": "nope", "messages": MESSAGES})))
    assert start.status == 401  # the key is checked first, as over HTTP
    auth = ((b"authorization", b"Bearer k"),)
    start, raw = asyncio.run(collect(app, forwarded("/v1/models/nope", method="GET", headers=auth)))
    assert start.status == 404 and json.loads(raw)["error"]["type"] == "model_not_found"
    start, raw = asyncio.run(collect(app, forwarded("/health", method="GET")))
    assert start.status == 200 and json.loads(raw)["status"] == "ok"


def test_closing_the_stream_early_cancels_generation(engine):
    app = create_app(engine)
    before = engine.stats["cancelled"]
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 2000, "stream": True}

    async def leave_after_two_chunks():
        stream = call_asgi(app, forwarded("/v1/chat/completions", body))
        assert isinstance(await stream.__anext__(), ResponseStart)
        await stream.__anext__()
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(leave_after_two_chunks())
    deadline = time.monotonic() + 10
    while engine.stats["cancelled"] != before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = engine.stats
    assert stats["cancelled"] == before + 1 and stats["running"] == 0
