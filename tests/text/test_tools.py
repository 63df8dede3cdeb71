"""Tool calling: a tiny random-weight model with Qwen3's tool template and vocabulary tokens
(<tool_call>, <|im_end|>), through the Engine and through the real openai client against
`rase serve`; SmolLM2 (no tools in its template) through the generic JSON format."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rase import InvalidGrammar, InvalidRequest, QuantType
from rase.api import Engine
from rase.store.registry import ModelRegistry
from rase.text.tools import ToolCallDelta, closed, parse_generic, parse_hermes, tool_spec
from tests.support.servers import rase_serve
from tests.support.tinymodels import write_tiny_model

TEMPLATE = (Path(__file__).parents[1] / "fixtures" / "qwen3-tools.jinja").read_text()
EXTRA = {"<|im_start|>": 3, "<|im_end|>": 3, "<tool_call>": 4, "</tool_call>": 4, "<think>": 4, "</think>": 4,
         "<0x0A>": 6}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now>",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "weather?"}]


@pytest.fixture(scope="module")
def tool_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools-store")
    path = write_tiny_model(root / "qwen3-tools.gguf", "qwen3", QuantType.Q8_0, seed=3, extra_tokens=EXTRA,
                            chat_template=TEMPLATE, eos="<|im_end|>")
    ModelRegistry(root).import_local("toolbot", path)
    return root


@pytest.fixture(scope="module")
def engine(tool_store):
    with Engine(tool_store, n_ctx=2048, max_batch=8) as e:
        yield e


def _valid(call) -> None:
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert call.id.startswith("call_") and len(call.id) > 10


def test_the_template_renders_the_tools_as_written(engine):
    session = engine.session("toolbot")
    assert session.tool_format() == "hermes"
    text = session.chat_prompt(ASK, tool_spec(TOOLS))
    assert '"description": "Weather <now>"' in text  # tojson: no HTML escaping, keys in order
    assert text.index('"name": "get_weather"') < text.index('"description"') < text.index('"parameters"')
    none = session.chat_prompt(ASK, tool_spec(TOOLS, "none"))
    assert "# Tools" not in none and "# Tools" in text


# the template's thinking switch off, or on with the <think> block closed after 8 tokens (the
# calls are constrained after it; a random model would otherwise reason until max_tokens)
THINKING = [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_budget": 8}]


@pytest.mark.parametrize("thinking", THINKING)
def test_required_and_named_choices_always_give_valid_calls(engine, thinking):
    for seed in range(15):
        out = engine.chat("toolbot", ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                          temperature=1.0, seed=seed, max_tokens=200, think="auto", **thinking)
        assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1, out
        assert "<think>" not in out.text + out.tool_calls[0].arguments
        _valid(out.tool_calls[0])
        named = engine.chat("toolbot", ASK, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=200, **thinking,
                            tool_choice={"type": "function", "function": {"name": "get_time"}})
        assert [c.name for c in named.tool_calls] == ["get_time"] and named.finish_reason == "tool_calls"
        _valid(named.tool_calls[0])


def test_parallel_calls_and_auto(engine):
    many = engine.chat("toolbot", ASK, tools=TOOLS, tool_choice="required", temperature=1.0, seed=4,
                       max_tokens=400)
    assert many.tool_calls and many.finish_reason == "tool_calls"
    for c in many.tool_calls:
        _valid(c)
    assert len({c.id for c in many.tool_calls}) == len(many.tool_calls)
    kinds = set()
    for seed in range(12):  # auto: free text, and a call once the model writes <tool_call>
        out = engine.chat("toolbot", ASK, tools=TOOLS, temperature=1.5, seed=seed, max_tokens=60)
        for c in out.tool_calls:
            _valid(c)
        kinds.add("call" if out.tool_calls else "text")
    assert "text" in kinds


def test_streamed_calls_equal_the_returned_ones(engine):
    kw = dict(tools=TOOLS, tool_choice="required", temperature=1.0, seed=9, max_tokens=300)
    out = engine.chat("toolbot", ASK, **kw)
    items = list(engine.stream_chat("toolbot", ASK, **kw))
    deltas = [d for d in items if isinstance(d, ToolCallDelta)]
    assert [(d.index, d.name, d.arguments) for d in deltas] == [(i, c.name, c.arguments)
                                                                 for i, c in enumerate(out.tool_calls)]


def test_tool_turns_in_the_history_render(engine):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]
    session = engine.session("toolbot")
    text = session.chat_prompt(history, tool_spec(TOOLS))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>' in text
    assert "<tool_response>\n21 degrees\n</tool_response>" in text
    out = engine.chat("toolbot", history, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=1,
                      max_tokens=200)
    assert out.tool_calls
    bad = history[:1] + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "[1]"}}]}]
    with pytest.raises(Exception, match="arguments must be a JSON object"):
        engine.chat("toolbot", bad, tools=TOOLS, max_tokens=5)


@pytest.mark.parametrize("kwargs,param", [
    (dict(tools=[{"type": "custom", "custom": {}}]), "tools[0].type"),
    (dict(tools=[TOOLS[0], TOOLS[0]]), "tools[1].function.name"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0].function.name"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "minimum": 5,
                                                                                "maximum": 1}}}]),
     "tools[0].function.parameters"),
])
def test_bad_tool_requests_are_refused_before_generation(engine, kwargs, param):
    with pytest.raises(InvalidGrammar) as err:
        engine.chat("toolbot", ASK, max_tokens=5, **kwargs)
    assert err.value.param == param


def test_parsers():
    content, calls = parse_hermes('Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    assert content == "Sure." and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1})]
    assert parse_hermes("no call") == ("no call", [])
    assert parse_hermes('<tool_call>\n{"name": "f", "argu')[1] == []  # cut: not a call
    assert parse_generic('{"response": "hi"}') == ("hi", [])
    _, [call] = parse_generic('{"tool_call": {"name": "g", "arguments": {}}}')
    assert call.name == "g" and call.arguments == "{}"


@pytest.fixture(scope="module")
def tool_server(tool_store):
    with rase_serve(tool_store, "--threads", "2", "--ctx-size", "2048") as base:
        yield base


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_openai_client_tool_calls_streamed_and_not(tool_server, choice, openai_client):

    client = openai_client(tool_server)
    kw = dict(model="toolbot", messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
              temperature=1.0, seed=5, max_tokens=200, extra_body={"reasoning_budget_tokens": 8})
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    assert full.choices[0].finish_reason == "tool_calls" and msg.content is None and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    chunks = list(client.chat.completions.create(**kw, stream=True))
    parts: dict[int, dict] = {}
    for ch in chunks:
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            p = parts.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert p["id"] is None  # id and name once per index
                p["id"], p["name"] = tc.id, tc.function.name
            p["arguments"] += tc.function.arguments or ""
    assert [(p["name"], p["arguments"]) for p in parts.values()] == [(call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    history = ASK + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    follow = client.chat.completions.create(model="toolbot", messages=history, tools=TOOLS, tool_choice="none",
                                            max_tokens=5)
    assert follow.choices[0].message.tool_calls is None


def test_bad_tool_fields_over_http_are_400s(tool_server):
    r = httpx.post(tool_server + "/v1/chat/completions", timeout=60, json={
        "model": "toolbot", "messages": ASK, "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_time2"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "get_time2" in r.json()["error"]["message"]


COUNT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}  # open by JSON Schema's default
NO_ARGS = {"type": "object", "properties": {}}


def test_closed_schemas_admit_only_what_they_declare():
    nested = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                                               "c": {"type": "array", "items": {"properties": {"d": {}}}}},
              "$defs": {"e": {"type": "object"}}}
    out = closed(nested)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["c"]["items"]["additionalProperties"] is False
    assert out["$defs"]["e"]["additionalProperties"] is False and "additionalProperties" not in nested
    kept = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert closed(kept) == kept and closed({"type": "string"}) == {"type": "string"}


@pytest.mark.needs_model
@pytest.mark.parametrize("schema,want", [(COUNT, {"n"}), (NO_ARGS, set())])
def test_a_real_model_calls_with_exactly_the_declared_arguments(smollm2_store, schema, want):
    """SmolLM2 (llama.cpp's generic tool format), tool_choice required, temperature 0.8: 10 of 10
    seeded calls carry exactly the declared arguments, streamed and not, though the schema does
    not close itself (additionalProperties absent: JSON Schema's default would admit anything).
    One call a request: with parallel calls the generic format is an array, and SmolLM2 repeats
    the call until max_tokens."""
    tools = [{"type": "function", "function": {"name": "act", "description": "Do it.", "parameters": schema}}]
    ask = [{"role": "user", "content": "Use the tool."}]
    with Engine(smollm2_store, n_ctx=2048, max_batch=4) as e:
        for seed in range(10):
            kw = dict(tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=0.8, seed=seed,
                      max_tokens=120)
            out = e.chat("smollm2", ask, **kw)
            assert out.finish_reason == "tool_calls" and len(out.tool_calls) >= 1, (seed, out.text)
            for call in out.tool_calls:
                args = json.loads(call.arguments)
                assert call.name == "act" and set(args) == want, (seed, call.arguments)
                if want:
                    assert isinstance(args["n"], int)
            deltas = [d for d in e.stream_chat("smollm2", ask, **kw) if isinstance(d, ToolCallDelta)]
            assert [(d.name, d.arguments) for d in deltas] == [(c.name, c.arguments) for c in out.tool_calls], seed


def test_chat_template_kwargs_reach_the_template(engine):
    """llama-server's chat_template_kwargs: Qwen3's enable_thinking false pre-fills an empty think
    block; rase's own variables and non-identifiers are refused, as is a built-in template."""
    session = engine.session("toolbot")
    off = session.chat_prompt(ASK, template_kwargs={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert session.chat_prompt(ASK).endswith("<|im_start|>assistant\n")
    out = engine.chat("toolbot", ASK, chat_template_kwargs={"enable_thinking": False}, max_tokens=4, temperature=0)
    assert out.prompt_tokens == len(session.render_chat(ASK, template_kwargs={"enable_thinking": False}))
    for bad in ({"messages": []}, {"bad key": 1}, {"_x": 1}, {"f": object()}, ["enable_thinking"]):
        with pytest.raises(InvalidRequest, match="chat_template_kwargs"):
            engine.chat("toolbot", ASK, chat_template_kwargs=bad, max_tokens=2)


def test_chat_template_kwargs_need_a_jinja_template(tmp_path):
    ModelRegistry(tmp_path).import_local("plain", Path(__file__).parents[1] / "fixtures" / "archs" / "lfm2-tiny-q8_0.gguf",
                                         chat_template="chatml")
    with Engine(tmp_path, n_ctx=256) as e:
        with pytest.raises(InvalidRequest, match="built in"):
            e.chat("plain", ASK, chat_template_kwargs={"enable_thinking": False}, max_tokens=2)
        assert e.chat("plain", ASK, max_tokens=2).completion_tokens == 2


# ---------------------------------------------------------------- no call text in content, however streamed

_WORDS = st.sampled_from(["Sure", " let", " me", " check", ".", "\n", " <", "<tool", "_ca", " é", "日本", "{", "}",
                          " 42", "<b>", "tool", " </", "<tool_", "call>"])


@st.composite
def _answers(draw):
    """(a hermes answer's text, its content, its calls' arguments): free text, then calls."""
    content = "".join(draw(st.lists(_WORDS, max_size=12)))
    assume("tool_call" not in content)
    calls = [json.dumps({"city": draw(st.text("aéz日 ", min_size=1, max_size=6)), "n": draw(st.integers(0, 999))},
                        ensure_ascii=False) for _ in range(draw(st.integers(1, 3)))]
    sep = draw(st.sampled_from(["", "\n", "\n\n"]))
    text = content + sep + sep.join(f'<tool_call>\n{{"name": "get_weather", "arguments": {a}}}\n</tool_call>'
                                    for a in calls)
    return text, content, calls


@given(_answers(), st.data())
@settings(max_examples=300, deadline=None)
def test_streamed_hermes_calls_never_reach_content(answer, data):
    """Any split of the answer's bytes into tokens (inside tags, inside UTF-8 characters): the
    content deltas are the content only, each call arrives whole, once."""
    from rase.text.textstate import TextState
    from rase.text.tools import ToolText

    text, content, arguments = answer
    raw = text.encode()
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=len(raw)))))
    pieces = [raw[a:b] for a, b in zip([0] + cuts, cuts + [len(raw)]) if b > a]
    reader = ToolText(TextState(lambda t: pieces[t]), "hermes")
    shown, calls = [], []
    for t in range(len(pieces)):
        d = reader.feed(t)
        shown.append(d.text)
        calls.extend(d.calls)
    shown.append(reader.finish())
    calls.extend(reader.pending_calls())
    streamed = "".join(shown)
    assert "<tool_call" not in streamed and "</tool_call" not in streamed and '"arguments"' not in streamed
    assert streamed.strip() == content.strip() == (reader.content or "")
    assert [json.loads(c.arguments) for c in calls] == [json.loads(a) for a in arguments]
    assert [c.index for c in calls] == list(range(len(arguments))) and len({c.id for c in calls}) == len(calls)
