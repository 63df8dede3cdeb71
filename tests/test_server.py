"""The OpenAI-compatible server, through the official openai client against a real `rase
serve` process, plus error shapes, disconnects and mounting inside a host app."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from rase.api import Engine
from rase.registry import ModelRegistry
from tests.conftest import rase_command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("serve-store")
    ModelRegistry(root).import_local("smollm2", smollm2_path)
    return root


@pytest.fixture(scope="module")
def server(store):
    port = _free_port()
    exe = rase_command()
    proc = subprocess.Popen([*exe, "--store", str(store), "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        proc.kill()
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        pytest.fail(f"rase serve did not start: {err}")
    yield base
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()


CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_openai_client_end_to_end(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    full = client.chat.completions.create(model="smollm2", messages=CHAT, temperature=0, max_tokens=40)
    text = full.choices[0].message.content
    assert "Paris" in text and full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 10
    chunks = list(client.chat.completions.create(model="smollm2", messages=CHAT, temperature=0,
                                                 max_tokens=40, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "stop"
    ids = {full.id, chunks[0].id}
    assert len(ids) == 2  # unique response ids
    comp = client.completions.create(model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=4)
    assert comp.choices[0].text.strip().startswith("Paris") and comp.choices[0].finish_reason == "length"
    word = text.split()[3]
    cut = client.chat.completions.create(model="smollm2", messages=CHAT, temperature=0, max_tokens=40, stop=[word])
    assert cut.choices[0].message.content == text[:text.index(word)] and word not in cut.choices[0].message.content
    streamed_cut = client.chat.completions.create(model="smollm2", messages=CHAT, temperature=0, max_tokens=40,
                                                  stop=word, stream=True, stream_options={"include_usage": True})
    parts = list(streamed_cut)
    assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == text[:text.index(word)]
    assert parts[-1].usage is not None and parts[-1].usage.completion_tokens > 0
    as_parts = [{"role": "user", "content": [{"type": "text", "text": CHAT[0]["content"][:20]},
                                             {"type": "text", "text": CHAT[0]["content"][20:]}]}]
    same = client.chat.completions.create(model="smollm2", messages=as_parts, temperature=0, max_tokens=40)
    assert same.choices[0].message.content == text  # content parts join to the same prompt


@pytest.mark.parametrize("body,status", [
    (b"{not json", 400),
    (b'{"model": "smollm2", "messages": "hi"}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400),
    (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404),
    (b'{"model": "smollm2", "messages": []}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "n": 3}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "' + b"x" * (2 << 20) + b'"}]}', 413),
])
def test_bad_requests_get_openai_errors_and_the_server_lives(server, body, status):
    r = httpx.post(server + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert httpx.get(server + "/health", timeout=5).json()["status"] == "ok"


def test_disconnect_stops_generation_within_a_token(server):
    before = httpx.get(server + "/health").json()
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Write a very long story."}],
            "temperature": 0.7, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=60) as r:
        n = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                n += 1
                if n == 4:  # the role chunk + 3 content chunks
                    break
    time.sleep(1.5)
    after = httpx.get(server + "/health").json()
    assert after["cancelled"] == before["cancelled"] + 1
    generated = after["generated_tokens"] - before["generated_tokens"]
    assert generated <= 3 + 8  # 3 streamed; the cancel lands at the next token (deltas can lag a few)
    ok = httpx.post(server + "/v1/chat/completions", json={"model": "smollm2", "messages": CHAT,
                                                          "temperature": 0, "max_tokens": 8}, timeout=60)
    assert ok.status_code == 200


def test_api_key(store):
    from fastapi.testclient import TestClient

    from rase.server import create_app

    client = TestClient(create_app(Engine(store), api_key="s3cret"))
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200


def test_host_app_keeps_answering_while_generating(store):
    import uvicorn
    from fastapi import FastAPI

    from rase.server import create_app

    host = FastAPI()

    @host.get("/ping")
    async def ping():
        return {"pong": True}

    host.mount("/llm", create_app(Engine(store)))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(host, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(base + "/ping", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    result = {}

    def generate():
        result["r"] = httpx.post(base + "/llm/v1/chat/completions", timeout=120, json={
            "model": "smollm2", "messages": CHAT, "temperature": 0.7, "max_tokens": 120})

    g = threading.Thread(target=generate)
    g.start()
    time.sleep(0.3)
    latencies = []
    while g.is_alive():
        start = time.perf_counter()
        assert httpx.get(base + "/ping", timeout=5).json() == {"pong": True}
        latencies.append(time.perf_counter() - start)
        time.sleep(0.02)
    g.join()
    srv.should_exit = True
    t.join(timeout=10)
    assert result["r"].status_code == 200
    assert len(latencies) >= 5 and max(latencies) < 0.5  # the event loop never waited on generation
