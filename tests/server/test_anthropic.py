"""Anthropic's Messages API: the real anthropic client against a real `rase serve` with SmolLM2
(text, streamed text, a tool with tool_choice any, a tool_result turn, stop sequences,
count_tokens, the x-api-key header), each stream reassembled to the whole answer."""
from __future__ import annotations

import httpx
import jsonschema
import pytest

from tests.support.servers import rase_serve

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}
ASK = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
KEY = "sk-test-anthropic"


@pytest.fixture(scope="module")
def server(smollm2_store):
    with rase_serve(smollm2_store, "--parallel", "4", "--threads", "2", "--api-key", KEY) as base:
        yield base


@pytest.fixture
def client(server):
    from anthropic import Anthropic

    with Anthropic(base_url=server, api_key=KEY) as c:  # the SDK sends x-api-key
        yield c


def _blocks(message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


def _raw_events(client, **kw) -> list:
    return list(client.messages.create(**kw, stream=True))


def test_text_whole_and_streamed(client):
    kw = dict(model="smollm2", max_tokens=32, messages=ASK, extra_body={"temperature": 0})
    whole = client.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert [b.type for b in whole.content] == ["text"] and "Paris" in whole.content[0].text
    assert whole.stop_reason in ("end_turn", "max_tokens") and 0 < whole.usage.output_tokens <= 32
    with client.messages.stream(**kw) as stream:  # the SDK's own reassembly
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text and _blocks(final) == _blocks(whole)
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    types = [e.type for e in _raw_events(client, **kw)]
    assert types[:2] == ["message_start", "content_block_start"] and types[-2:] == ["message_delta", "message_stop"]


def test_stop_sequences_say_which_one_stopped(client):
    out = client.messages.create(model="smollm2", max_tokens=32, messages=ASK, extra_body={"temperature": 0},
                                 stop_sequences=["zzz", "capital"])
    assert (out.stop_reason, out.stop_sequence) == ("stop_sequence", "capital")
    assert "capital" not in out.content[0].text


def test_a_tool_with_choice_any_whole_and_streamed(client):
    kw = dict(model="smollm2", max_tokens=64, extra_body={"temperature": 0}, tools=[TOOL], tool_choice={"type": "any"},
              messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    whole = client.messages.create(**kw)
    uses = [b for b in whole.content if b.type == "tool_use"]
    assert whole.stop_reason == "tool_use" and len(uses) >= 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER)
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    strip = lambda blocks: [{k: v for k, v in b.items() if k != "id"} for b in blocks]  # each call its own id
    assert strip(_blocks(final)) == strip(_blocks(whole)) and final.stop_reason == "tool_use"

    # the tool's result in the next turn
    turn = kw["messages"] + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in whole.content]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                           "content": "sunny, 24 C"}]}]
    follow = client.messages.create(model="smollm2", max_tokens=48, tools=[TOOL], messages=turn)
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use") and follow.content
    count = client.messages.count_tokens(model="smollm2", tools=[TOOL], messages=turn)
    assert count.input_tokens == follow.usage.input_tokens + follow.usage.cache_read_input_tokens
    short = client.messages.count_tokens(model="smollm2", tools=[TOOL], messages=kw["messages"])
    assert count.input_tokens > short.input_tokens + 10  # the call and its result are in the prompt


def test_the_key_is_checked_in_either_header(server):
    from anthropic import Anthropic, AuthenticationError

    with Anthropic(base_url=server, api_key="wrong") as bad, pytest.raises(AuthenticationError):
        bad.messages.create(model="smollm2", max_tokens=4, messages=ASK)
    r = httpx.post(f"{server}/v1/messages/count_tokens", json={"model": "smollm2", "messages": ASK},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200 and r.json()["input_tokens"] > 10


@pytest.mark.parametrize("body,param", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages.0"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages.0"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "tool"}}, "tool_choice"),
    ({"max_tokens": 8, "messages": ASK, "temperature": 1.5}, "temperature"),
])
def test_what_cannot_be_served_is_a_400_in_anthropics_shape(server, body, param):
    r = httpx.post(f"{server}/v1/messages", json={"model": "smollm2", **body}, headers={"x-api-key": KEY},
                   timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["message"] and r.json()["error"]["param"].startswith(param)
