"""Reasoning blocks: the text filter, the constraint gate, and Qwen3 / Qwen3.5 templates through
the engine and `rase serve` (reasoning_content, a JSON answer after the block, the budget)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from rase import InvalidRequest, QuantType
from rase.api import Engine
from rase.store.registry import ModelRegistry
from rase.text.thinking import ReasoningGate, ThinkFilter, with_no_think
from tests.support.servers import rase_serve
from tests.support.tinymodels import write_tiny_model

CASES = [
    ("<think>\nplan\n</think>\n\nAnswer.", "Answer.", "\nplan\n"),
    ("<think></think>\n\nAnswer.", "Answer.", ""),
    ("</think>\n\nAnswer.", "Answer.", ""),
    ("</think></think>Answer.", "Answer.", ""),
    ("Answer with a literal </think> inside.", "Answer with a literal </think> inside.", ""),
    ("Plain answer.", "Plain answer.", ""),
]


@pytest.mark.parametrize("text,answer,reasoning", CASES)
@pytest.mark.parametrize("seed", range(8))
def test_strip_and_separate_on_any_split(text, answer, reasoning, seed):
    rng = random.Random(seed)
    for mode in ("strip", "separate"):
        f = ThinkFilter(mode)
        out, i = [], 0
        while i < len(text):
            n = rng.randint(1, 4)
            out.append(f.feed(text[i:i + n]))
            i += n
        out.append(f.flush())
        assert "".join(out) == answer
        assert f.reasoning == reasoning


def test_keep_passes_everything():
    f = ThinkFilter("keep")
    assert f.feed("<think>x</think>y") + f.flush() == "<think>x</think>y"
    with pytest.raises(ValueError):
        ThinkFilter("hide")


def test_no_think_switch():
    assert with_no_think([{"role": "user", "content": "Hi"}])[0] == {"role": "system", "content": "/no_think"}
    msgs = with_no_think([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert msgs[0]["content"] == "Be brief. /no_think"
    assert with_no_think(msgs) == msgs  # idempotent


def test_a_prompt_that_opened_the_block_starts_inside_it():
    f = ThinkFilter("separate", opened=True)
    out = f.feed("plan") + f.feed("</th") + f.feed("ink>\n\nAnswer.") + f.flush()
    assert (out, f.reasoning) == ("Answer.", "plan")


class _Inner:
    """A constraint that allows token 3 only, once."""

    def __init__(self):
        self.seen = []

    def fill(self):
        m = np.zeros(1, np.int32)
        m[0] = 1 << 3
        return m

    def advance(self, token):
        assert token == 3
        self.seen.append(token)

    @property
    def complete(self):
        return bool(self.seen)


def _allowed(mask):
    return None if mask is None else [t for t in range(32) if mask.view(np.uint32)[0] >> t & 1]


def test_the_gate_frees_the_reasoning_and_binds_after_it():
    inner = _Inner()
    gate = ReasoningGate(inner, (10, 11), 1, [2])
    assert _allowed(gate.fill()) == [3, 10]  # open the block, or begin the answer
    gate.advance(10)
    assert 2 not in _allowed(gate.fill()) and len(_allowed(gate.fill())) == 31  # anything but the EOS
    for t in (5, 6, 11):
        gate.advance(t)
    assert gate.reasoned == 3 and not gate.complete and not inner.seen
    assert _allowed(gate.fill()) == [3]
    gate.advance(3)
    assert gate.complete and inner.seen == [3]


@pytest.mark.parametrize("opened", [False, True])
def test_a_budget_forces_the_block_closed(opened):
    gate = ReasoningGate(None, (10, 11), 1, [2], opened=opened, budget=2)
    if not opened:
        assert gate.fill() is None
        gate.advance(10)
    for t in (4, 5):
        assert gate.fill() is None  # no constraint: free text while within the budget
        gate.advance(t)
    assert _allowed(gate.fill()) == [11]
    gate.advance(11)
    assert gate.fill() is None and gate.phase == "answer" and not gate.complete


# ---------------------------------------------------------------- through the engine and the server

FIXTURES = Path(__file__).parents[1] / "fixtures"
EXTRA = {"<|im_start|>": 3, "<|im_end|>": 3, "<think>": 4, "</think>": 4, "<tool_call>": 4, "</tool_call>": 4,
         "<0x0A>": 6}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
ASK = [{"role": "user", "content": "How many?"}]


@pytest.fixture(scope="module")
def think_store(tmp_path_factory):
    """Tiny random Qwen3 files with Qwen3's template (the model opens <think> itself) and
    Qwen3.5's (the prompt ends in <think>)."""
    root = tmp_path_factory.mktemp("think-store")
    for name, template in (("qwen3", "qwen3-tools.jinja"), ("qwen35", "qwen35.jinja")):
        path = write_tiny_model(root / f"{name}.gguf", "qwen3", QuantType.Q8_0, seed=3, extra_tokens=EXTRA,
                                chat_template=(FIXTURES / template).read_text(), eos="<|im_end|>")
        ModelRegistry(root).import_local(name, path)
    return root


@pytest.fixture(scope="module")
def engine(think_store):
    with Engine(think_store, n_ctx=1024) as e:
        yield e


def _opening(engine, model):
    """qwen3's model must open the block itself: a bias on <think> makes it."""
    return {} if model == "qwen35" else {"logit_bias": {engine.session(model).reasoning_tags()[0]: 100.0}}


@pytest.mark.parametrize("model", ["qwen3", "qwen35"])
def test_a_json_answer_after_a_reasoning_block_parses(engine, model):
    for seed in range(4):
        out = engine.chat(model, ASK, think="auto", reasoning_budget=6, response_format=FORMAT, max_tokens=80,
                          temperature=1.0, seed=seed, logprobs=True, **_opening(engine, model))
        jsonschema.validate(json.loads(out.text), SCHEMA)
        tokens = [e.token for e in out.logprobs]
        open_, close = engine.session(model).reasoning_tags()
        assert tokens.index(close) == (6 if model == "qwen35" else 7)  # the budget's 6 tokens (after <think>)
        assert out.reasoning and "</think>" not in out.text + out.reasoning


def test_the_block_is_kept_in_the_text_unless_separated(engine):
    kept = engine.chat("qwen35", ASK, reasoning_budget=3, max_tokens=12, seed=1)
    split = engine.chat("qwen35", ASK, think="auto", reasoning_budget=3, max_tokens=12, seed=1)
    assert "</think>" in kept.text and not kept.reasoning
    assert kept.text.startswith(split.reasoning) and kept.text.endswith(split.text) and split.reasoning


def test_the_engines_budget_holds_unless_a_request_says(think_store):
    with Engine(think_store, n_ctx=1024, reasoning_budget=3) as e:
        held = e.chat("qwen35", ASK, think="auto", max_tokens=20, seed=1)
        free = e.chat("qwen35", ASK, think="auto", max_tokens=20, seed=1, reasoning_budget=-1)
        five = e.chat("qwen35", ASK, think="auto", max_tokens=20, seed=1, reasoning_budget=5)
    assert (held.reasoning_tokens, five.reasoning_tokens) == (3 + 1, 5 + 1)  # and the forced </think>
    assert free.reasoning_tokens > 6 and free.reasoning.startswith(five.reasoning)


def test_reasoning_effort_switches_qwen3_thinking(engine):
    on = engine.session("qwen35").chat_prompt(ASK, reasoning_effort="high")
    off = engine.session("qwen35").chat_prompt(ASK, reasoning_effort="none")
    assert on.endswith("<think>\n") and off.endswith("<think>\n\n</think>\n\n")
    with pytest.raises(InvalidRequest, match="reasoning_effort"):
        engine.submit_chat("qwen35", ASK, reasoning_effort="max")
    with pytest.raises(InvalidRequest, match="reasoning_budget"):
        engine.submit_chat("qwen35", ASK, reasoning_budget=-2)


@pytest.fixture(scope="module")
def think_server(think_store):
    with rase_serve(think_store, "--threads", "2", "--ctx-size", "1024", "--reasoning-budget", "6") as base:
        yield base


@pytest.mark.parametrize("model", ["qwen3", "qwen35"])
def test_openai_client_gets_reasoning_content_streamed_and_not(think_server, openai_client, engine, model):
    client = openai_client(think_server)
    # qwen3's model opens the block itself (a bias makes this random one); qwen35's prompt opened it
    bias = {"logit_bias": {str(k): v for k, v in _opening(engine, model).get("logit_bias", {}).items()}}
    kw = dict(model=model, messages=ASK, max_tokens=60, temperature=0.9, seed=2, response_format=FORMAT, **bias)
    whole = client.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert msg.reasoning_content and "<think>" not in msg.content
    # the budget's 6 and </think> (and the <think> qwen3's model wrote)
    assert whole.usage.completion_tokens_details.reasoning_tokens == 6 + 1 + (model == "qwen3")
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    reasoning = content = ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
    assert (reasoning, content) == (msg.reasoning_content, msg.content)
    raw = client.chat.completions.create(**kw, extra_body={"reasoning_format": "none"}).choices[0].message
    head, tail = raw.content.split("</think>", 1)  # the same tokens, the block left in content
    assert head == ("<think>" if model == "qwen3" else "") + msg.reasoning_content and tail.strip() == msg.content
    assert getattr(raw, "reasoning_content", None) is None


def test_anthropic_thinking_blocks_streamed_and_not(think_server):
    from anthropic import Anthropic

    kw = dict(model="qwen35", max_tokens=40, messages=ASK, thinking={"type": "enabled", "budget_tokens": 4},
              extra_body={"seed": 3})
    with Anthropic(base_url=think_server, api_key="unused") as client:
        whole = client.messages.create(**kw)
        assert [b.type for b in whole.content] == ["thinking", "text"] and whole.content[0].thinking
        with client.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
        hidden = client.messages.create(**{**kw, "thinking": {**kw["thinking"], "display": "omitted"}})
        assert hidden.content[0].thinking == "" and hidden.content[1].text == whole.content[1].text
        off = client.messages.create(**{**kw, "thinking": {"type": "disabled"}})
        assert [b.type for b in off.content] == ["text"]  # the block closed at once: nothing reasoned


def test_responses_reasoning_items_streamed_and_not(think_server, openai_client):
    client = openai_client(think_server)
    kw = dict(model="qwen35", input="How many?", max_output_tokens=40, reasoning={"effort": "high"},
              extra_body={"seed": 3})
    whole = client.responses.create(**kw)
    assert [i.type for i in whole.output] == ["reasoning", "message"]
    # the server's budget of 6, and the </think> that closes the block
    assert whole.output[0].content[0].text and whole.usage.output_tokens_details.reasoning_tokens == 6 + 1
    with client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert (final.output[0].content[0].text, final.output_text) == (whole.output[0].content[0].text, whole.output_text)
