"""The OpenAI-compatible server, through the official openai client against a real `rase
serve` process, plus error shapes, disconnects and mounting inside a host app."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from rase.api import Engine
from tests.support.servers import rase_serve, serve_in_thread
from tests.support.fake_engine import FakeEngine





@pytest.fixture(scope="module")
def store(smollm2_store):
    return smollm2_store


@pytest.fixture(scope="module")
def server(store):
    with rase_serve(store, "--parallel", "4", "--kv-cache-mb", "64", "--threads", "2") as base:
        yield base


CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.mark.needs_model
def test_openai_client_end_to_end(server, openai_client):

    client = openai_client(server)
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
    # the last chunk of a choice carries llama-server's timings (the chat page shows them)
    timings = parts[-2].model_extra["timings"]
    assert parts[-2].choices[0].finish_reason == "stop" and timings["predicted_n"] == parts[-1].usage.completion_tokens
    assert timings["prompt_n"] + timings["cached_n"] == parts[-1].usage.prompt_tokens and timings["ttft_ms"] > 0
    as_parts = [{"role": "user", "content": [{"type": "text", "text": CHAT[0]["content"][:20]},
                                             {"type": "text", "text": CHAT[0]["content"][20:]}]}]
    same = client.chat.completions.create(model="smollm2", messages=as_parts, temperature=0, max_tokens=40)
    assert same.choices[0].message.content == text  # content parts join to the same prompt


@pytest.mark.needs_model
@pytest.mark.parametrize("body,status", [
    (b"{not json", 400),
    (b'{"model": "smollm2", "messages": "hi"}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400),
    (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404),
    (b'{"model": "smollm2", "messages": []}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "n": 9}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "' + b"x" * (21 << 20) + b'"}]}', 413),
])
def test_bad_requests_get_openai_errors_and_the_server_lives(server, body, status):
    r = httpx.post(server + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert httpx.get(server + "/health", timeout=5).json()["status"] == "ok"


@pytest.mark.needs_model
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
    _wait_for(lambda: httpx.get(server + "/health").json()["cancelled"] == before["cancelled"] + 1,
              "the disconnect to cancel the request")
    after = httpx.get(server + "/health").json()
    generated = after["generated_tokens"] - before["generated_tokens"]
    assert generated <= 3 + 8  # 3 streamed; the cancel lands at the next token (deltas can lag a few)
    ok = httpx.post(server + "/v1/chat/completions", json={"model": "smollm2", "messages": CHAT,
                                                          "temperature": 0, "max_tokens": 8}, timeout=60)
    assert ok.status_code == 200


@pytest.mark.needs_model
def test_api_key(store):
    from fastapi.testclient import TestClient

    from rase.server import create_app

    client = TestClient(create_app(FakeEngine(store), api_key="s3cret"))  # routing only: no model needed
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200
    assert client.post("/tokenize", json={"content": "x"}).status_code == 401
    ok = client.post("/tokenize", json={"content": "x"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["tokens"]


@pytest.mark.needs_model
def test_host_app_keeps_answering_while_generating(store):
    """20 pings answered, each within 0.5 s, while a streamed generation is known to be running:
    its first content arrived before the first ping and more arrived after the last."""
    from fastapi import FastAPI

    from rase.server import create_app

    host = FastAPI()

    @host.get("/ping")
    async def ping():
        return {"pong": True}

    @host.get("/health")
    async def health():
        return {"ok": True}

    host.mount("/llm", create_app(Engine(store)))
    srv, t, base = serve_in_thread(host)
    chunks: list[float] = []  # arrival time of each content chunk
    started = threading.Event()
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Write a long story about a ship."}],
            "temperature": 0.7, "seed": 1, "max_tokens": 400, "stream": True}

    def generate():
        with httpx.stream("POST", base + "/llm/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if '"content"' in line and '"content": ""' not in line:
                    chunks.append(time.perf_counter())
                    started.set()

    g = threading.Thread(target=generate)
    g.start()
    assert started.wait(60), "generation never started"
    latencies, first_ping = [], time.perf_counter()
    for _ in range(20):
        start = time.perf_counter()
        assert httpx.get(base + "/ping", timeout=5).json() == {"pong": True}
        latencies.append(time.perf_counter() - start)
    last_ping = time.perf_counter()
    g.join()
    srv.should_exit = True
    t.join(timeout=10)
    assert chunks[0] < first_ping and chunks[-1] > last_ping, "the generation was not running during the pings"
    assert max(latencies) < 0.5, latencies  # the event loop never waited on generation


def _wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.needs_model
def test_disconnect_storm_leaves_the_server_whole(store):
    """16 streaming clients, half of them dropping at random points: every other request
    completes with its full answer, every KV block returns, and the server answers the next."""
    import random

    from rase.server import create_app

    engine = Engine(store, max_batch=8)
    srv, t, base = serve_in_thread(create_app(engine))
    rng = random.Random(3)
    plans = [(i, rng.randint(1, 12) if i % 2 else None) for i in range(16)]  # None: reads to the end
    outcome: dict = {}

    def client(i, drop_after):
        body = {"model": "smollm2", "messages": [{"role": "user", "content": f"Tell me fact number {i} about space."}],
                "temperature": 0.7, "seed": i, "max_tokens": 48, "stream": True}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
            n, finish = 0, None
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = __import__("json").loads(line[6:])
                if chunk["choices"]:
                    n += 1
                    finish = chunk["choices"][0]["finish_reason"] or finish
                if drop_after is not None and n >= drop_after:
                    break
            outcome[i] = (n, finish)

    threads = [threading.Thread(target=client, args=p) for p in plans]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    completed = [i for i, drop in plans if drop is None]
    assert all(outcome[i][1] in ("stop", "length") for i in completed), outcome
    worker = engine.session("smollm2").worker
    _wait_for(lambda: engine.stats["running"] == 0 and engine.stats["waiting"] == 0, "the dropped requests to end")
    worker.kv.check([])
    assert worker.kv.reserved == 0 and worker.kv.available() == worker.kv.n_blocks
    health = httpx.get(base + "/health", timeout=5).json()
    assert health["kv_blocks_used"] == 0 and health["running"] == 0
    # every dropper that left early was cancelled (one reading its whole answer first was not)
    assert health["requests"] == 16 and 1 <= health["cancelled"] <= 8
    ok = httpx.post(base + "/v1/chat/completions", json={"model": "smollm2", "messages": CHAT,
                                                         "temperature": 0, "max_tokens": 8}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
    srv.should_exit = True
    t.join(timeout=10)


@pytest.mark.needs_model
def test_cached_tokens_and_health_through_the_openai_client(server, openai_client):

    client = openai_client(server)
    system = {"role": "system", "content": "You answer in one short sentence. " * 12}
    first = client.chat.completions.create(model="smollm2", messages=[system, CHAT[0]], temperature=0, max_tokens=8)
    again = client.chat.completions.create(model="smollm2", messages=[system, {"role": "user", "content": "Hi!"}],
                                           temperature=0, max_tokens=8)
    assert 0 <= first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens >= 64  # the shared system prompt
    health = httpx.get(server + "/health", timeout=5).json()
    for key in ("running", "waiting", "kv_blocks_used", "kv_blocks_total", "prefix_hit_tokens"):
        assert key in health, key
    # --kv-cache-mb 64: 64 MiB of 32-position blocks of SmolLM2's 22.5 KiB per position
    assert health["models"]["smollm2"]["kv_blocks_total"] == health["kv_blocks_total"] == (64 << 20) // (32 * 23040)


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                         "country": {"type": "string", "maxLength": 30},
                                         "population_millions": {"type": "number", "minimum": 0, "maximum": 50}},
        "required": ["city", "country", "population_millions"], "additionalProperties": False}


@pytest.mark.needs_model
def test_structured_output_through_the_openai_client(server, openai_client):
    import jsonschema
    from pydantic import BaseModel

    client = openai_client(server)
    ask = [{"role": "user", "content": "Give the capital of France as JSON."}]
    rf = {"type": "json_schema", "json_schema": {"name": "capital", "schema": CITY, "strict": True}}
    full = client.chat.completions.create(model="smollm2", messages=ask, response_format=rf, temperature=1.0,
                                          seed=11, max_tokens=120)
    answer = json.loads(full.choices[0].message.content)
    jsonschema.validate(answer, CITY)
    assert full.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="smollm2", messages=ask, response_format=rf,
                                                 temperature=1.0, seed=11, max_tokens=120, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content

    class Capital(BaseModel):  # the SDK's own parse(): a strict schema from a pydantic model
        city: str
        country: str

    parsed = client.chat.completions.parse(model="smollm2", messages=ask, response_format=Capital, temperature=0,
                                           max_tokens=120)
    assert isinstance(parsed.choices[0].message.parsed, Capital)
    anyjson = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give me a JSON object with the capital of France."}],
        temperature=0.7, seed=0, max_tokens=120, response_format={"type": "json_object"})
    assert anyjson.choices[0].finish_reason == "stop", anyjson.choices[0].message.content
    assert isinstance(json.loads(anyjson.choices[0].message.content), dict)
    yn = httpx.post(server + "/v1/completions", json={"model": "smollm2", "prompt": "Is Paris in France?",
                                                      "grammar": 'root ::= ("yes" | "no") "."', "max_tokens": 5},
                    timeout=60).json()
    assert yn["choices"][0]["text"] in ("yes.", "no.")


@pytest.mark.needs_model
@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                         "if": {}}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"regex": "[a-"}, "regex"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"}, "tool_choice"),
    ({"logit_bias": {"5": 1000}}, None),
    ({"frobnicate": True}, "frobnicate"),
])
def test_unsupported_or_invalid_fields_are_400s_that_name_them(server, extra, param):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, **extra}
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.needs_model
def test_response_messages_echoed_back_are_accepted(server):
    """What clients send back from an earlier answer (null refusal, tool_calls, audio) is fine;
    a field rase would have to drop is a 400. A message's name goes to the template, which
    renders it where it reads it (SmolLM2's does not: the same answer)."""
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello!", "refusal": None, "tool_calls": None, "audio": None},
               {"role": "user", "content": "Bye"}]
    body = {"model": "smollm2", "messages": history, "max_tokens": 3, "temperature": 0}
    ok = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert ok.status_code == 200, ok.text
    history[0]["name"], history[1]["name"] = "ada", "bot"
    named = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert named.status_code == 200, named.text
    assert named.json()["choices"][0]["message"] == ok.json()["choices"][0]["message"]
    history[1]["annotations"] = [{"type": "url_citation"}]
    bad = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert bad.status_code == 400 and "annotations" in bad.json()["error"]["message"]


@pytest.mark.needs_model
def test_generic_tool_calls_for_a_template_without_tools(server, openai_client):
    """SmolLM2's template knows no tools: the tools go into a system message and the answer is
    one JSON object, constrained from the first token (small models need "required")."""
    import jsonschema

    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
               "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                               "parameters": weather}}]
    client = openai_client(server)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for seed in range(3):
        out = client.chat.completions.create(model="smollm2", messages=ask, tools=tools, tool_choice="required",
                                             temperature=0.7, seed=seed, max_tokens=100)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), weather)
    history = ask + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 C, cloudy"}]
    answer = client.chat.completions.create(model="smollm2", messages=history, tools=tools, temperature=0,
                                            max_tokens=80)
    assert answer.choices[0].finish_reason in ("stop", "tool_calls", "length")
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls


@pytest.mark.needs_model
def test_logprobs_through_the_openai_client(server, openai_client):

    client = openai_client(server)
    kw = dict(model="smollm2", messages=CHAT, temperature=0.8, seed=3, max_tokens=12, logprobs=True, top_logprobs=2)
    full = client.chat.completions.create(**kw)
    content = full.choices[0].logprobs.content
    assert content and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)
    assert bytes(b for e in content for b in e.bytes).decode() == full.choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    comp = client.completions.create(model="smollm2", prompt="The capital of France is", temperature=0,
                                     max_tokens=3, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == 3 and "".join(lp.tokens) == comp.choices[0].text and len(lp.top_logprobs[0]) == 2
    banned = client.chat.completions.create(model="smollm2", messages=CHAT, temperature=0, max_tokens=3,
                                            logprobs=True, logit_bias={"504": -100})
    assert banned.choices[0].logprobs.content[0].token != "The"


@pytest.mark.needs_model
def test_n_choices_through_the_openai_client(server, openai_client):

    client = openai_client(server)
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Name a color."}], temperature=1.0, seed=2,
              max_tokens=10, n=3)
    full = client.chat.completions.create(**kw)
    assert [c.index for c in full.choices] == [0, 1, 2]
    texts = [c.message.content for c in full.choices]
    streamed = {0: "", 1: "", 2: ""}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert [streamed[i] for i in range(3)] == texts
    assert full.usage.completion_tokens == sum(
        client.chat.completions.create(**{**kw, "n": 1, "seed": 2 + i}).usage.completion_tokens for i in range(3))


@pytest.mark.needs_model
def test_tokenize_and_detokenize(server):
    """llama-server's shapes; the ids are the ones chat prompts are built from."""
    r = httpx.post(server + "/tokenize", json={"content": "Hello world<|im_end|>"}, timeout=30).json()
    ids = r["tokens"]
    assert ids[-1] == 2 and len(ids) == 3  # <|im_end|> parsed as its token (parse_special defaults on)
    plain = httpx.post(server + "/tokenize", json={"model": "smollm2", "content": "Hello world<|im_end|>",
                                                   "parse_special": False}, timeout=30).json()["tokens"]
    assert 2 not in plain and len(plain) > 3
    pieces = httpx.post(server + "/tokenize", json={"content": "Hé", "with_pieces": True}, timeout=30).json()["tokens"]
    assert [p["id"] for p in pieces] == httpx.post(server + "/tokenize", json={"content": "Hé"}, timeout=30).json()["tokens"]
    assert "".join(p["piece"] if isinstance(p["piece"], str) else bytes(p["piece"]).decode("utf-8", "replace")
                   for p in pieces) == "Hé"
    back = httpx.post(server + "/detokenize", json={"tokens": ids}, timeout=30).json()
    assert back == {"content": "Hello world<|im_end|>"}
    bad = httpx.post(server + "/detokenize", json={"tokens": [10**9]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    missing = httpx.post(server + "/tokenize", json={"model": "nope", "content": "x"}, timeout=30)
    assert missing.status_code == 404


@pytest.mark.needs_model
def test_chat_template_kwargs_over_http(server):
    """llama-server's chat_template_kwargs: passed to the template (SmolLM2's reads none of them:
    the same answer); a variable rase sets itself is a 400 naming the field."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    plain = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    kw = httpx.post(server + "/v1/chat/completions", json={**body, "chat_template_kwargs": {"enable_thinking": False}},
                    timeout=60)
    assert kw.status_code == 200 and kw.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    bad = httpx.post(server + "/v1/chat/completions", json={**body, "chat_template_kwargs": {"messages": []}},
                     timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"


def test_the_dialects_render_output_records_without_asking_their_kind():
    """One record per token (output.Output) reaches every surface; each dialect renders its
    fields, so no router asks what kind of output it holds (isinstance on output classes)."""
    import ast
    from pathlib import Path

    kinds = {"Output", "ReasoningDelta", "LogprobDelta", "ToolCallDelta", "Delta", "TokenLogprob"}
    for path in sorted((Path(__file__).resolve().parents[2] / "rase" / "server").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                assert not names & kinds, f"{path.name}:{node.lineno} asks an output's kind"
            if isinstance(node, ast.ImportFrom):
                assert not {a.name for a in node.names} & kinds, f"{path.name}:{node.lineno} imports an output kind"
