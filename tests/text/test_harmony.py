"""harmony.py: gpt-oss's messages read token by token (the tiny gpt-oss file's vocabulary,
whose harmony control tokens are single tokens): analysis -> reasoning, final -> content, a
message to functions.NAME -> a tool call; the constraints of a harmony request."""
from __future__ import annotations

import json

import pytest

from rase.store.gguf import GGUFFile
from rase.text.harmony import HarmonyText, call_grammar, control_ids
from rase.output import GenerationStopReason
from rase.text.tokenizer import LocalTokenizer
from rase.text.tools import tool_spec
from tests.support.models import ARCHS


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.from_gguf(GGUFFile(ARCHS / "gpt-oss-tiny-mxfp4.gguf"))


def _run(tok, text: str, stop=()):
    ids = control_ids(tok)
    h = HarmonyText(lambda t: tok.decode_bytes([t]), ids, stop)
    content, reasoning, calls, stops = [], [], [], []
    for t in tok.encode(text, add_special_tokens=False, parse_special=True):
        d = h.feed(t)
        content.append(d.text)
        reasoning.append(d.reasoning)
        calls.extend(d.calls)
        if d.stop:
            stops.append(d.stop)
            break
    content.append(h.finish())
    reasoning.append(h.pending_reasoning())
    calls.extend(h.pending_calls())
    return h, "".join(content), "".join(reasoning), calls, stops


def test_every_control_token_is_one_token(tok):
    ids = control_ids(tok)
    assert sorted(ids) == sorted(["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                                  "<|return|>", "<|call|>"])
    assert len(set(ids.values())) == 7 and all(i >= 512 for i in ids.values())


def test_analysis_is_reasoning_and_final_is_content(tok):
    h, content, reasoning, calls, stops = _run(
        tok, "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
             "<|start|>assistant<|channel|>final<|message|>Hello there, friend!")
    assert reasoning == h.reasoning == "The user greets; answer briefly."
    assert content == h.text == "Hello there, friend!"
    assert calls == [] and stops == []


def test_a_commentary_message_to_a_function_is_a_tool_call(tok):
    h, content, reasoning, calls, stops = _run(
        tok, "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
             'to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris", "unit": "c"}<|call|>')
    assert reasoning == "Need the weather." and content == ""
    assert [(c.index, c.name) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].arguments) == {"location": "Paris", "unit": "c"}
    assert h.calls[0].id == calls[0].id and stops == [GenerationStopReason.STOP_TOKEN]


def test_the_recipient_may_follow_the_role(tok):
    _, _, _, calls, _ = _run(tok, "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.lookup"
                                  "<|channel|>commentary json<|message|>{}<|call|>")
    assert [(c.name, c.arguments) for c in calls] == [("lookup", "{}")]


def test_commentary_without_a_recipient_is_shown(tok):
    _, content, _, calls, _ = _run(tok, "<|channel|>commentary<|message|>Checking now.<|end|>"
                                        "<|start|>assistant<|channel|>final<|message|>Done.")
    assert content == "Checking now.Done." and calls == []


def test_stop_strings_cut_the_content_only(tok):
    _, content, reasoning, _, stops = _run(
        tok, "<|channel|>analysis<|message|>I will say STOP here<|end|><|start|>assistant<|channel|>final"
             "<|message|>one two STOP three", stop=["STOP"])
    assert reasoning == "I will say STOP here" and content == "one two "
    assert stops == [GenerationStopReason.STOP_STRING]


def test_a_call_cut_short_is_no_call_and_text_without_messages_is_the_answer(tok):
    _, content, _, calls, _ = _run(tok, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":")
    assert calls == [] and content == ""
    _, content, reasoning, calls, _ = _run(tok, "just words, no channels")
    assert content == "just words, no channels" and reasoning == "" and calls == []


def test_a_required_call_grammar_names_each_allowed_tool():
    spec = tool_spec([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}],
        "required")
    g = call_grammar(spec)
    assert '"get_weather "' in g and "<|call|>" in g and g.startswith("start: analysis? <|channel|>")


# ---------------------------------------------------------------- through the engine and the clients
# The tiny model's random weights say nothing harmonious, so each answer is forced through it by
# a grammar (rase's extension; on a harmony model it covers the raw output, control tokens and
# all): the model computes every token, the grammar picks them, the harmony reader and the
# surfaces do the rest.

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT_1, ARGS = "The user wants the weather; call the tool.", '{"city": "Paris"}'
THOUGHT_2, ANSWER = "The tool says sunny.", "It is sunny in Paris."


def _force(*parts) -> str:
    """A Lark grammar whose one sentence is parts: control tokens as written, text quoted."""
    return "start: " + " ".join(p if p.startswith("<|") else json.dumps(p) for p in parts) + "\n"


CALL = _force("<|channel|>", "analysis", "<|message|>", THOUGHT_1, "<|end|>", "<|start|>", "assistant",
              "<|channel|>", "commentary to=functions.get_weather ", "<|constrain|>", "json", "<|message|>", ARGS,
              "<|call|>")
FINAL = _force("<|channel|>", "analysis", "<|message|>", THOUGHT_2, "<|end|>", "<|start|>", "assistant",
               "<|channel|>", "final", "<|message|>", ANSWER)


@pytest.fixture(scope="module")
def harmony_store(tmp_path_factory):
    from rase.store.registry import ModelRegistry

    root = tmp_path_factory.mktemp("harmony-store")
    ModelRegistry(root).import_local("gptoss", ARCHS / "gpt-oss-tiny-mxfp4.gguf")
    return root


@pytest.fixture(scope="module")
def harmony_engine(harmony_store):
    from rase.api import Engine

    with Engine(harmony_store, n_ctx=1024, max_batch=4) as e:
        yield e


def _history(call_id: str) -> list[dict]:
    return ASK + [{"role": "assistant", "content": None, "reasoning_content": THOUGHT_1,
                   "tool_calls": [{"id": call_id, "type": "function",
                                   "function": {"name": "get_weather", "arguments": ARGS}}]},
                  {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]


def test_the_files_template_renders_tools_effort_and_history(harmony_engine):
    session = harmony_engine.session("gptoss")
    assert session.tool_format() == "harmony" and session.harmony_ids() is not None
    first = session.chat_prompt([{"role": "system", "content": "Be brief."}] + ASK, tool_spec(TOOLS), "high")
    assert "Reasoning: high" in first and "# Instructions\n\nBe brief." in first
    assert "// The weather in a city\ntype get_weather = (_: {\ncity: string,\n}) => any;" in first
    assert first.endswith("<|start|>user<|message|>What is the weather in Paris?<|end|><|start|>assistant")
    again = session.chat_prompt(_history("call_1"), tool_spec(TOOLS))
    assert f"<|start|>assistant<|channel|>analysis<|message|>{THOUGHT_1}<|end|>" in again
    assert f"<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>" in again
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>' in again
    with pytest.raises(Exception, match="reasoning_effort"):
        harmony_engine.chat("gptoss", ASK, reasoning_effort="extreme")
    assert "Reasoning: low" in session.chat_prompt(ASK, None, "minimal")  # the lowest it has
    with pytest.raises(Exception, match="reasoning_effort"):  # its analysis is bounded by effort, not a budget
        harmony_engine.chat("gptoss", ASK, reasoning_budget=8)


def test_the_engine_separates_reasoning_calls_and_answer(harmony_engine):
    shown: list = []
    out = harmony_engine.chat("gptoss", ASK, tools=TOOLS, grammar=CALL, max_tokens=200, on_delta=shown.append)
    assert shown == []  # on_delta gets the answer's text only: here there is none
    assert out.reasoning == THOUGHT_1 and out.text == "" and out.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", ARGS)]
    done = harmony_engine.chat("gptoss", _history(out.tool_calls[0].id), tools=TOOLS, grammar=FINAL, max_tokens=200,
                               on_delta=shown.append)
    assert "".join(shown) == ANSWER and all(isinstance(d, str) for d in shown)
    assert (done.reasoning, done.text, done.tool_calls, done.finish_reason) == (THOUGHT_2, ANSWER, [], "stop")


def test_a_response_format_binds_the_final_message_only(harmony_engine):
    """json_object on a harmony model: the analysis stays free text, the final message is JSON."""
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": {
        "type": "object", "properties": {"sky": {"enum": ["sunny", "rainy"]}}, "required": ["sky"],
        "additionalProperties": False}}}
    from rase.text.harmony import FinalConstraint

    session = harmony_engine.session("gptoss")
    handle = harmony_engine.submit_chat("gptoss", ASK, response_format=fmt, max_tokens=8)
    assert isinstance(handle.request.constraint, FinalConstraint)
    handle.result()
    c = FinalConstraint(session.grammar_vocab(), __import__("rase.text.structured", fromlist=["grammar_spec"])
                        .grammar_spec(response_format=fmt).grammar, session.harmony_ids(),
                        lambda t: session.tokenizer.decode_bytes([t]).decode())
    ids = session.tokenizer.encode("<|channel|>analysis<|message|>free text {{ here<|end|><|start|>assistant"
                                   "<|channel|>final<|message|>", add_special_tokens=False, parse_special=True)
    for t in ids:
        assert c.fill() is None
        c.advance(t)
    mask = c.fill()
    assert mask is not None
    allowed = [t for t in range(session.plan.vocab_size) if mask[t // 32] >> (t % 32) & 1]
    assert allowed and all(session.tokenizer.decode([t]).startswith("{") for t in allowed)


def test_a_required_call_is_a_valid_call_of_an_offered_tool(harmony_engine):
    """tool_choice required: an optional analysis, then one call of an offered tool with
    arguments valid for its schema (the random model's analysis is ended early by a logit bias
    on <|end|>, which the grammar allows only there)."""
    import jsonschema

    short = {**WEATHER, "properties": {"city": {"type": "string", "maxLength": 8}}, "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": short}},
             {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    end = harmony_engine.session("gptoss").harmony_ids()["<|end|>"]
    for seed in range(3):
        for choice, names in (("required", {"get_weather", "get_time"}),
                              ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})):
            out = harmony_engine.chat("gptoss", ASK, tools=tools, tool_choice=choice, temperature=1.0, seed=seed,
                                      max_tokens=300, logit_bias={str(end): 100.0})
            assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1, out
            call = out.tool_calls[0]
            assert call.name in names
            if call.name == "get_weather":
                jsonschema.validate(json.loads(call.arguments), short)


@pytest.fixture(scope="module")
def harmony_server(harmony_store):
    from tests.support.servers import rase_serve

    with rase_serve(harmony_store, "--threads", "2", "--ctx-size", "1024") as base:
        yield base


def test_openai_client_round_trip(harmony_server, openai_client):
    client = openai_client(harmony_server)
    kw = dict(model="gptoss", messages=ASK, tools=TOOLS, max_tokens=200, extra_body={"grammar": CALL})
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    assert full.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert msg.reasoning_content == THOUGHT_1
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [("get_weather", ARGS)]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == THOUGHT_1
    assert "".join(d.content or "" for d in deltas) == ""
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(tc.function.name, tc.function.arguments) for tc in calls] == [("get_weather", ARGS)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the call goes back with its reasoning, the tool's result after it
    history = ASK + [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                                                         "content": "sunny"}]
    kw = dict(model="gptoss", messages=history, tools=TOOLS, max_tokens=200, extra_body={"grammar": FINAL})
    done = client.chat.completions.create(**kw)
    assert (done.choices[0].message.content, done.choices[0].message.reasoning_content) == (ANSWER, THOUGHT_2)
    assert done.choices[0].finish_reason == "stop" and done.usage.prompt_tokens > full.usage.prompt_tokens
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    assert "".join(d.content or "" for d in deltas) == ANSWER
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == THOUGHT_2


@pytest.fixture
def ollama_client(harmony_server):
    import ollama

    c = ollama.Client(host=harmony_server)
    yield c
    c._client.close()


def test_ollama_client_round_trip(ollama_client):
    c = ollama_client
    kw = dict(model="gptoss", tools=TOOLS, think=True)
    first = c.chat(messages=ASK, options={"grammar": CALL, "num_predict": 200}, **kw)
    assert first.message.thinking == THOUGHT_1 and first.message.content == ""
    call = first.message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("get_weather", json.loads(ARGS))
    parts = list(c.chat(messages=ASK, options={"grammar": CALL, "num_predict": 200}, stream=True, **kw))
    assert "".join(p.message.thinking or "" for p in parts) == THOUGHT_1
    assert [tc.function.name for p in parts for tc in (p.message.tool_calls or [])] == ["get_weather"]
    history = ASK + [{"role": "assistant", "content": "", "thinking": THOUGHT_1,
                      "tool_calls": [{"function": {"name": "get_weather", "arguments": json.loads(ARGS)}}]},
                     {"role": "tool", "content": "sunny"}]
    done = c.chat(messages=history, options={"grammar": FINAL, "num_predict": 200}, **kw)
    assert (done.message.content, done.message.thinking) == (ANSWER, THOUGHT_2)
    parts = list(c.chat(messages=history, options={"grammar": FINAL, "num_predict": 200}, stream=True,
                        model="gptoss", tools=TOOLS, think="high"))
    assert "".join(p.message.content for p in parts) == ANSWER
    assert "".join(p.message.thinking or "" for p in parts) == THOUGHT_2
    hidden = c.chat(messages=history, options={"grammar": FINAL, "num_predict": 200}, model="gptoss", think=False)
    assert hidden.message.content == ANSWER and not hidden.message.thinking
