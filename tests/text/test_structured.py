"""Constrained decoding: the sampler's bitmask (C), grammars from response_format / regex /
Lark, and constrained requests through the engine (alone, batched, streamed) on the tiny
random-weight models and SmolLM2."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from rase import InvalidGrammar, QuantType
from rase.kernels import _kernels
from rase.api import Engine
from rase.store.registry import ModelRegistry
from rase.text.structured import grammar_spec

GOLDEN = Path(__file__).parents[1] / "fixtures" / "sampler_golden.json"


def _sampler(V, c, seed=1234):
    return _kernels.Sampler(V, c["temperature"], c["top_k"], c["top_p"], c["min_p"], c["rp"], c["pp"], c["fp"], seed)


def test_without_a_mask_the_sampler_draws_what_it_drew_before_masks_existed():
    """tests/fixtures/sampler_golden.json was recorded by the sampler of commit d11b173 (before
    the bitmask argument): 5 configurations (greedy, full vocabulary, top-k, top-p + min-p,
    penalties) x 64 rows of seeded logits."""
    g = json.loads(GOLDEN.read_text())
    logits = (np.random.default_rng(g["seed"]).standard_normal((64, g["vocab"])) * 3).astype(np.float32)
    everything = np.full((g["vocab"] + 31) // 32, -1, np.int32)
    for c, want in zip(g["configs"], g["tokens"]):
        for allow in (None, everything):  # no mask, and a mask that allows every token
            s = _sampler(g["vocab"], c)
            got = []
            for row in logits:
                t = s.sample(row, allow)
                got.append(t)
                s.accept(t)
            assert got == want, (c, allow is None)


def _allowed(mask: np.ndarray, V: int) -> np.ndarray:
    return np.unpackbits(mask.view(np.uint8), bitorder="little")[:V].astype(bool)


@pytest.mark.parametrize("V", [1, 31, 32, 33, 1000])
def test_a_mask_never_lets_a_forbidden_token_through(V):
    rng = np.random.default_rng(V)
    configs = [dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, rp=1.0, pp=0.0, fp=0.0),
               dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, rp=1.0, pp=0.0, fp=0.0),
               dict(temperature=0.9, top_k=5, top_p=0.8, min_p=0.1, rp=1.3, pp=0.5, fp=0.5)]
    for trial in range(300):
        c = configs[trial % len(configs)]
        density = rng.choice([0.001, 0.05, 0.5, 0.99])
        bits = rng.random(V) < density
        if not bits.any():
            bits[rng.integers(V)] = True
        mask = np.packbits(np.concatenate([bits, np.zeros(-V % 32, bool)]), bitorder="little").view(np.int32).copy()
        logits = (rng.standard_normal(V) * 5).astype(np.float32)
        s = _sampler(V, c, seed=trial)
        for t in rng.integers(0, V, 3):
            s.accept(int(t))
        tok = s.sample(logits, mask)
        assert 0 <= tok < V and bits[tok], (trial, tok)
        if c["temperature"] == 0.0:  # greedy: the best allowed logit (penalties off here)
            assert tok == int(np.flatnonzero(bits)[np.argmax(logits[bits])])
        assert _allowed(mask, V).tolist() == bits.tolist()


def test_a_mask_that_allows_nothing_is_reported_not_sampled():
    s = _sampler(64, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, rp=1.0, pp=0.0, fp=0.0))
    nothing = np.zeros(2, np.int32)
    assert s.sample(np.zeros(64, np.float32), nothing) == _kernels.SAMPLE_NONE
    s.mask = nothing
    assert s.sample(np.zeros(64, np.float32)) == _kernels.SAMPLE_NONE
    with pytest.raises(ValueError, match="2 words"):
        s.mask = np.zeros(3, np.int32)
    with pytest.raises(ValueError):
        s.mask = np.zeros(2, np.int64)


# ---------------------------------------------------------------- grammars from requests

SCHEMA = {  # nested object, array, enum, required, pattern; bounded so random text ends
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z]{2}[0-9]$"},
        "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2},
        "pos": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                 "ok": {"type": "boolean"}},
                "required": ["x", "ok"], "additionalProperties": False},
    },
    "required": ["id", "tags", "pos"],
    "additionalProperties": False,
}
RF = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}


@pytest.mark.parametrize("kwargs,param", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "if": {}}}}),
     "response_format.json_schema.schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": []}}),
     "response_format.json_schema.schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}),
     "response_format.json_schema.name"),
    (dict(response_format={"type": "xml"}), "response_format.type"),
    (dict(response_format={"type": "json_object", "extra": 1}), "response_format"),
    (dict(response_format="json"), "response_format"),
    (dict(regex="[a-z"), "regex"),
    (dict(grammar="start: undefined_rule"), "grammar"),
    (dict(regex="a", grammar='start: "a"'), "regex"),
])
def test_bad_grammars_are_refused_before_any_generation(tiny_engine, kwargs, param):
    before = tiny_engine.stats["requests"]
    with pytest.raises(InvalidGrammar) as err:
        tiny_engine.complete("llama", "hi", max_tokens=4, **kwargs)
    assert err.value.param == param and str(err.value)
    assert tiny_engine.stats["requests"] == before  # nothing was queued


def test_plain_text_response_format_is_no_constraint():
    assert grammar_spec(response_format={"type": "text"}) is None and grammar_spec() is None


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory, tiny_models):
    root = tmp_path_factory.mktemp("structured-store")
    reg = ModelRegistry(root)
    for arch in ("llama", "qwen3", "gemma3"):
        reg.import_local(arch, tiny_models(arch, QuantType.Q8_0))
    with Engine(root, n_ctx=256, max_batch=8) as engine:
        yield engine


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_50_random_samples_all_match_the_schema(tiny_engine, arch):
    """Temperature 1.0 (top-k 40 of 160 tokens) of a random-weight model: only the grammar
    keeps the text valid. The 50 requests run batched together, beside unconstrained ones.
    (Plain completions: the tiny vocabulary cannot spell the chat templates' newlines.)"""
    prompt = "json please"
    handles = [tiny_engine.submit_complete(arch, prompt, response_format=RF, temperature=1.0,
                                           seed=seed, max_tokens=120) for seed in range(50)]
    free = [tiny_engine.submit_complete(arch, prompt, temperature=1.0, seed=seed, max_tokens=20) for seed in range(3)]
    outs = [h.result() for h in handles]
    for seed, out in enumerate(outs):
        assert out.finish_reason == "stop", (seed, out.text)
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert len({o.text for o in outs}) > 1  # the draws differ: the mask constrains, it does not fix
    assert all(h.result().completion_tokens > 0 for h in free)
    alone = tiny_engine.complete(arch, prompt, response_format=RF, temperature=1.0, seed=7, max_tokens=120)
    assert alone.text == outs[7].text  # batched or alone: the same tokens
    streamed = "".join(tiny_engine.stream_complete(arch, prompt, response_format=RF, temperature=1.0,
                                                   seed=7, max_tokens=120))
    assert streamed == alone.text


def test_regex_and_lark_grammars(tiny_engine):
    for seed in range(20):
        out = tiny_engine.complete("qwen3", "x", regex=r"[a-f]{2,5}-[0-9]{1,3}", temperature=1.0,
                               seed=seed, max_tokens=30)
        assert re.fullmatch(r"[a-f]{2,5}-[0-9]{1,3}", out.text), out.text
        yn = tiny_engine.complete("llama", "q", grammar='start: ("yes" | "no") "!"', temperature=1.0,
                                  seed=seed, max_tokens=10)
        assert yn.text in ("yes!", "no!") and yn.finish_reason == "stop"
        gbnf = tiny_engine.complete("gemma3", "q", grammar='root ::= [0-9] [0-9]? "kg"', temperature=1.0,
                                    seed=seed, max_tokens=10)
        assert re.fullmatch(r"[0-9]{1,2}kg", gbnf.text), gbnf.text


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["engineer", "teacher", "doctor", "artist"]},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "hobbies"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smol_engine(smollm2_store):
    with Engine(smollm2_store, max_batch=4) as engine:
        yield engine


@pytest.mark.needs_model
def test_smollm2_answers_in_the_schema_every_time(smol_engine):
    chat = [{"role": "system", "content": "Reply with a JSON object describing a person."},
            {"role": "user", "content": "Describe a fictional person: name, age, role, address, hobbies."}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    handles = [smol_engine.submit_chat("smollm2", chat, response_format=rf, temperature=1.0, seed=s,
                                       max_tokens=200) for s in range(10)]
    outs = [h.result() for h in handles]
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), PERSON)
    streamed = "".join(smol_engine.stream_chat("smollm2", chat, response_format=rf, temperature=1.0, seed=3,
                                               max_tokens=200))
    assert streamed == outs[3].text


@pytest.mark.needs_model
def test_smollm2_json_object_is_an_object(smol_engine):
    chat = [{"role": "user", "content": "Give me a JSON object with the capital of France."}]
    for seed in range(3):
        out = smol_engine.chat("smollm2", chat, response_format={"type": "json_object"}, temperature=0.7,
                               seed=seed, max_tokens=120)
        assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict), out.text
