"""Overload and per-request limits: a bounded waiting queue (Overloaded, HTTP 429 + Retry-After),
a wall-clock limit per request, a max_tokens ceiling; slow clients hold no worker."""
from __future__ import annotations

import socket
import time

import httpx
import pytest

from rase import InvalidGenerationConfig, InvalidRequest, Overloaded
from rase.api import Engine
from tests.support.servers import rase_serve

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

LONG = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def store(smollm2_store):
    return smollm2_store


def test_a_full_queue_refuses_with_a_retry_time_and_recovers(store):
    with Engine(store, max_batch=1, max_waiting=2) as engine:
        held = [engine.submit_chat("smollm2", LONG, max_tokens=2000, temperature=0.8, seed=i,
                                   logit_bias={0: -100, 2: -100}) for i in range(3)]
        with pytest.raises(Overloaded) as err:  # 1 decoding + 2 waiting: the 4th is refused, nothing queued
            engine.submit_chat("smollm2", LONG, max_tokens=8)
        assert err.value.waiting == 2 and err.value.retry_after >= 1 and "retry in" in str(err.value)
        assert engine.stats["waiting"] + engine.stats["running"] <= 3
        for h in held:
            h.cancel()
        for h in held:
            h.result()
        out = engine.chat("smollm2", LONG, max_tokens=4, temperature=0)  # room again
        assert out.completion_tokens == 4
    with pytest.raises(InvalidRequest):
        Engine(store, max_waiting=-1)


def test_the_time_limit_ends_a_request_as_length(store):
    with Engine(store, time_limit_s=0.5) as engine:
        t0 = time.monotonic()
        out = engine.chat("smollm2", LONG, max_tokens=3000, temperature=0.8, seed=1, logit_bias={0: -100, 2: -100})
        took = time.monotonic() - t0
        assert out.finish_reason == "length" and 0 < out.completion_tokens < 3000
        assert 0.45 < took < 2.0, took
        quick = engine.chat("smollm2", LONG, max_tokens=3, temperature=0)
        assert quick.completion_tokens == 3  # a short request is not affected


def test_max_tokens_ceiling(store):
    with Engine(store, max_tokens_limit=20) as engine:
        with pytest.raises(InvalidGenerationConfig, match="over this server's limit of 20") as err:
            engine.submit_chat("smollm2", LONG, max_tokens=21)
        assert err.value.param == "max_tokens"
        out = engine.chat("smollm2", LONG, temperature=0.8, seed=3)  # no max_tokens: the default, lowered
        assert out.completion_tokens <= 20
        assert engine.chat("smollm2", LONG, max_tokens=20, temperature=0).completion_tokens <= 20


@pytest.fixture(scope="module")
def busy_server(store):
    with rase_serve(store, "-np", "1", "--max-waiting", "1", "--max-tokens-limit", "4000", "--threads", "2") as base:
        yield base


NO_EOS = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: a long request runs its max_tokens out


def _stream_body(max_tokens: int, seed: int = 0) -> dict:
    return {"model": "smollm2", "messages": LONG, "max_tokens": max_tokens, "temperature": 0.8, "seed": seed,
            "stream": True, "logit_bias": NO_EOS}


def test_http_429_with_retry_after_and_the_openai_client_sees_it(busy_server, openai_client):
    from openai import RateLimitError

    with httpx.Client(timeout=60) as http:
        with http.stream("POST", busy_server + "/v1/chat/completions", json=_stream_body(3000, 1)) as first:
            lines = first.iter_lines()  # (held: a dropped iterator would close the stream)
            next(lines)  # decoding
            with http.stream("POST", busy_server + "/v1/chat/completions", json=_stream_body(3000, 2)) as second:
                assert second.status_code == 200  # the one waiting place
                health = http.get(busy_server + "/health").json()
                assert health["cancelled"] == 0 and health["requests"] == 2, health
                r = http.post(busy_server + "/v1/chat/completions", json={**_stream_body(8), "stream": False})
                assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["type"] == "rate_limit_error"
                client = openai_client(busy_server).with_options(max_retries=0)
                with pytest.raises(RateLimitError):
                    client.chat.completions.create(model="smollm2", messages=LONG, max_tokens=8)
        over = http.post(busy_server + "/v1/chat/completions", json={**_stream_body(4001), "stream": False})
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    _until_idle(busy_server)
    ok = httpx.post(busy_server + "/v1/chat/completions", json={**_stream_body(4), "stream": False}, timeout=60)
    assert ok.status_code == 200  # the queue drained: answered again


def _until_idle(base: str, timeout: float = 20.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        h = httpx.get(base + "/health", timeout=10).json()
        if h["running"] == 0 and h["waiting"] == 0:
            return h
        time.sleep(0.1)
    pytest.fail(f"still busy: {h}")


def _raw_request(base: str, body: bytes) -> socket.socket:
    host, port = base.rsplit("/", 1)[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    return s


def test_slow_clients_hold_no_worker(busy_server):
    import json

    body = json.dumps(_stream_body(200, 5)).encode()
    reader = _raw_request(busy_server, body)   # reads its stream a byte at a time
    reader.sendall(body)
    sender = _raw_request(busy_server, body)   # sends its body a byte at a time, never finishing
    try:
        reader.recv(1)
        t0 = time.monotonic()
        while True:  # the generation finishes while the reader has read almost nothing
            sender.sendall(body[:1])
            reader.recv(1)
            h = httpx.get(busy_server + "/health", timeout=10).json()
            if h["running"] == 0 and h["waiting"] == 0:
                break
            assert time.monotonic() - t0 < 30, h
            time.sleep(0.2)
        # with one decoding slot (-np 1) and one waiting place, others are still served at once
        for _ in range(3):
            r = httpx.post(busy_server + "/v1/chat/completions", json={**_stream_body(4), "stream": False}, timeout=30)
            assert r.status_code == 200
    finally:
        reader.close()
        sender.close()
