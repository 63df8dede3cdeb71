"""OpenAI's Responses API: the real openai client against a real `rase serve` with SmolLM2
(text, streamed text, a required function tool, a json_schema format, a function_call_output
turn through previous_response_id, input_tokens), each stream reassembled to the whole answer."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.support.servers import rase_serve

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string"}},
        "required": ["city", "country"], "additionalProperties": False}
ASK = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def server(smollm2_store):
    with rase_serve(smollm2_store, "--parallel", "4", "--threads", "2") as base:
        yield base


@pytest.fixture
def client(server, openai_client):
    return openai_client(server)


def _items(response) -> list[dict]:
    """Output items without their ids (a stream's response has its own)."""
    return [{k: v for k, v in item.model_dump().items() if k != "id"} for item in response.output]


def _streamed(client, **kw):
    """(the text deltas joined, the function-call argument deltas by item, the completed response,
    the event types in order) of a streamed request."""
    text, args, types, done, seqs = "", {}, [], None, []
    for ev in client.responses.create(**kw, stream=True):
        types.append(ev.type)
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        elif ev.type == "response.function_call_arguments.delta":
            args[ev.item_id] = args.get(ev.item_id, "") + ev.delta
        elif ev.type in ("response.completed", "response.incomplete"):
            done = ev.response
    assert seqs == list(range(len(seqs)))
    return text, args, done, types


def test_text_whole_and_streamed(client):
    kw = dict(model="smollm2", input=ASK, max_output_tokens=32, temperature=0)
    whole = client.responses.create(**kw)
    assert whole.object == "response" and whole.status in ("completed", "incomplete") and whole.id.startswith("resp_")
    assert "Paris" in whole.output_text and whole.usage.input_tokens > 10
    u = whole.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens and 0 < u.output_tokens <= 32
    text, _, done, types = _streamed(client, **kw)
    assert text == whole.output_text and _items(done) == _items(whole)
    assert (done.usage.input_tokens, done.usage.output_tokens) == (u.input_tokens, u.output_tokens)
    assert done.usage.input_tokens_details.cached_tokens > 0  # the same prompt again: a prefix-cache hit
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-1] == f"response.{whole.status}"
    with client.responses.stream(**kw) as stream:  # the SDK's own reassembly
        final = stream.get_final_response()
    assert final.output_text == whole.output_text


def test_instructions_and_input_items(client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Name one colour."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
             {"role": "user", "content": "And another one?"}]
    out = client.responses.create(model="smollm2", instructions="Answer in one word.", input=items,
                                  max_output_tokens=8, temperature=0)
    assert out.output_text and out.instructions == "Answer in one word."
    count = client.responses.input_tokens.count(model="smollm2", instructions="Answer in one word.", input=items)
    assert count.input_tokens == out.usage.input_tokens


def test_a_required_function_tool_whole_and_streamed(client):
    kw = dict(model="smollm2", input="What is the weather in Paris?", tools=[TOOL], tool_choice="required",
              max_output_tokens=64, temperature=0)
    whole = client.responses.create(**kw)
    calls = [i for i in whole.output if i.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    _, args, done, types = _streamed(client, **kw)
    assert _items(done)[0]["arguments"] == calls[0].arguments and list(args.values())[0] == calls[0].arguments
    assert [i["call_id"] for i in _items(done)] != [c.call_id for c in calls]  # each response its own ids
    assert [{k: v for k, v in i.items() if k != "call_id"} for i in _items(done)] == \
        [{k: v for k, v in i.items() if k != "call_id"} for i in _items(whole)]
    assert "response.function_call_arguments.done" in types

    # the tool's result in a second turn, by previous_response_id
    follow = client.responses.create(model="smollm2", previous_response_id=whole.id, tools=[TOOL], tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": json.dumps({"weather": "sunny, 24 C"})}],
                                     max_output_tokens=32, temperature=0)
    assert follow.previous_response_id == whole.id and follow.status in ("completed", "incomplete")
    whole_input = [{"role": "user", "content": "What is the weather in Paris?"},
                   {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                    "arguments": calls[0].arguments},
                   {"type": "function_call_output", "call_id": calls[0].call_id,
                    "output": json.dumps({"weather": "sunny, 24 C"})}]
    count = client.responses.input_tokens.count(model="smollm2", input=whole_input, tools=[TOOL], tool_choice="none")
    assert follow.usage.input_tokens == count.input_tokens  # the stored turn is the whole conversation
    short = client.responses.input_tokens.count(model="smollm2", input=whole_input[:1], tools=[TOOL], tool_choice="none")
    assert count.input_tokens > short.input_tokens + 20  # ... with the call and its result in the prompt
    assert client.responses.retrieve(follow.id).output_text == follow.output_text


def test_a_json_schema_format_whole_and_streamed(client):
    kw = dict(model="smollm2", input="Which city is the capital of France? Answer in JSON.", max_output_tokens=48,
              temperature=0, text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
    whole = client.responses.create(**kw)
    jsonschema.validate(json.loads(whole.output_text), CITY)
    text, _, done, _ = _streamed(client, **kw)
    assert text == whole.output_text and _items(done) == _items(whole)


@pytest.mark.parametrize("body,status,param", [
    ({"input": "hi", "frobnicate": 1}, 400, None),
    ({"input": "hi", "previous_response_id": "resp_00"}, 404, "previous_response_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, 400, "text.format"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, None),
    ({"input": "hi", "include": ["reasoning.encrypted_content"]}, 400, None),
    ({"input": ""}, 400, "input"),
])
def test_what_cannot_be_served_is_a_4xx_that_says_why(server, body, status, param):
    r = httpx.post(f"{server}/v1/responses", json={"model": "smollm2", **body}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and (param is None or err["param"].startswith(param))
