"""Speculative decoding with prompt-lookup drafts: the lookup itself, and output identical to
decoding one token at a time, greedy and seeded sampling alike, on every tiny family and on
SmolLM2, batched with other requests in the same steps."""
from __future__ import annotations

import pytest

from rase import QuantType
from rase.api import Engine
from rase.engine.drafting import K_MAX, Lookup
from rase.store.registry import ModelRegistry
from tests.support.speculation import run_prompts
from tests.support.tinymodels import ARCH_FEATURES


def test_the_lookup_proposes_what_followed_the_tails_last_occurrence():
    lk = Lookup()
    assert lk.propose([5, 6, 7, 8, 5, 6], 10) == [7, 8, 5, 6][:lk.k]  # (5, 6) was followed by 7, 8, ...
    assert lk.propose([1, 2, 3], 10) == []  # nothing repeats
    assert Lookup().propose([9, 1, 2, 4, 1, 2], 1) == [4]  # within the room left
    lk = Lookup()  # one per sequence: it indexes the tokens as they grow
    assert lk.propose([1, 2, 9, 9, 3, 2], 10) == [9, 9, 3, 2][:lk.k]  # the 1-gram (2,) when longer ones miss
    assert lk.propose([1, 2, 9, 9, 3, 2, 9], 10) == [9, 3, 2, 9][:lk.k]  # (2, 9) was followed by 9, 3, 2, 9


def test_k_grows_while_drafts_hold_and_backs_off_when_they_fail():
    lk = Lookup()
    start = lk.k
    lk.verified(start, start)
    assert lk.k == min(K_MAX, 2 * start)
    drafted = start
    while lk.k:  # every draft wrong: k halves to 0
        drafted += lk.k
        lk.verified(lk.k, 0)
    assert lk.propose([1, 2, 1, 2], 5) == []  # backed off: no drafts for a while
    for _ in range(20):
        lk.propose([1, 2, 1, 2], 5)
    assert lk.k == 1  # then it probes again with one draft
    assert (lk.drafted, lk.accepted) == (drafted, start)


FAMILIES = sorted(set(ARCH_FEATURES) - {"gpt-oss"}) + ["lfm2-file", "qwen35-file"]  # the hybrids: no drafts


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_models):
    from pathlib import Path

    root = tmp_path_factory.mktemp("spec-stores")
    archs = Path(__file__).parents[1] / "fixtures" / "archs"
    out = {}
    for family in FAMILIES:
        path = archs / f"{family[:-5]}-tiny-q8_0.gguf" if family.endswith("-file") else \
            tiny_models(family, QuantType.Q8_0)
        ModelRegistry(root / family).import_local("m", path)
        out[family] = root / family
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokens_are_the_same_with_drafts_batched_with_others(stores, family):
    plain, plain_sampled, _ = run_prompts(stores[family], None)
    spec, spec_sampled, stats = run_prompts(stores[family], "ngram")
    assert spec == plain and spec_sampled == plain_sampled
    if family.endswith("-file"):
        assert stats["drafted_tokens"] == 0  # a recurrent state cannot step back: no speculation
    else:
        assert stats["drafted_tokens"] > 0  # the repeated prompts gave drafts to verify


@pytest.mark.needs_model
@pytest.mark.parametrize("temperature,penalties", [(0.0, {}), (0.7, {}),
                                                   (0.7, {"repeat_penalty": 1.1, "frequency_penalty": 0.1})])
def test_smollm2_quoting_accepts_most_drafts_and_says_so(smollm2_store, temperature, penalties):
    passage = "The quick brown fox jumps over the lazy dog. All that glitters is not gold. " * 3
    msgs = [{"role": "user", "content": "Repeat this text exactly:\n\n" + passage}]
    outs = {}
    for spec in (None, "ngram"):
        with Engine(smollm2_store, speculative=spec, n_threads=2) as e:
            other = e.submit_chat("smollm2", [{"role": "user", "content": "Name a colour."}], max_tokens=30,
                                  temperature=0.7, seed=3)
            outs[spec] = (e.chat("smollm2", msgs, max_tokens=120, temperature=temperature, seed=11, **penalties),
                          other.result().text)
    (plain, plain_other), (spec, spec_other) = outs[None], outs["ngram"]
    assert spec.text == plain.text and spec_other == plain_other
    t = spec.timings
    if penalties:  # they steer away from repeating the passage: fewer drafts, some still held
        assert t["draft_n"] > 0 and t["draft_n_accepted"] > 0, t
    else:
        assert t["draft_n"] > 20 and t["draft_n_accepted"] >= 0.5 * t["draft_n"], t


@pytest.mark.needs_model
def test_rase_serve_spec_ngram_reports_drafts_in_timings_and_metrics(smollm2_store, openai_client):
    import httpx

    from tests.support.servers import rase_serve

    passage = "Green leaves turn gold in autumn and fall to the ground. " * 4
    with rase_serve(smollm2_store, "--threads", "2", "--spec", "ngram") as base:
        out = openai_client(base).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Repeat exactly:\n\n" + passage}], max_tokens=60,
            temperature=0)
        timings = out.model_extra["timings"]
        assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
        metrics = httpx.get(f"{base}/metrics").text
        ask = {"model": "smollm2", "messages": [{"role": "user", "content": "Repeat exactly:\n\n" + passage}],
               "max_tokens": 60, "temperature": 0}
        off = httpx.post(f"{base}/v1/chat/completions", json={**ask, "speculative.n_max": 0}, timeout=60).json()
        assert off["timings"]["draft_n"] == 0 and off["choices"][0]["message"] == out.choices[0].message.model_dump(
            exclude_none=True)
        capped = httpx.post(f"{base}/v1/chat/completions", json={**ask, "speculative.n_max": 1}, timeout=60).json()
        assert 0 < capped["timings"]["draft_n"] <= capped["timings"]["predicted_n"]  # one draft a step at most
        refused = httpx.post(f"{base}/v1/chat/completions", json={**ask, "speculative.p_min": 0.5}, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "speculative.p_min"
    drafted = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("rase_draft_tokens"))
    assert drafted >= timings["draft_n"]


@pytest.mark.needs_model
def test_logprobs_are_the_same_bits_with_drafts(smollm2_store):
    passage = "One fish, two fish, red fish, blue fish. " * 4
    msgs = [{"role": "user", "content": "Repeat exactly:\n\n" + passage}]
    outs = {}
    for spec in (None, "ngram"):
        with Engine(smollm2_store, speculative=spec, n_threads=2) as e:
            outs[spec] = e.chat("smollm2", msgs, max_tokens=60, temperature=0, logprobs=True, top_logprobs=3)
    assert outs["ngram"].timings["draft_n_accepted"] > 10
    assert outs["ngram"].logprobs == outs[None].logprobs  # each row's raw logits: token, bytes, logprob, top 3


def test_the_ngram_cache_drafts_from_earlier_requests():
    from rase.engine.drafting import NgramCache

    cache = NgramCache(size=4)
    cache.add([1, 2, 3, 4, 5, 6])
    lk = Lookup(cache)
    assert lk.propose([9, 1, 2, 3], 10) == [4, 5, 6][:lk.k]  # nothing repeats here; an earlier request had it
    assert Lookup(cache).propose([7, 8, 9, 7, 8], 10) == [9, 7, 8][:K_MAX]  # its own history first
    cache.add(list(range(10, 20)))
    assert len(cache.next) == 4 and cache.get((1, 2, 3), 5) == []  # least recently seen dropped


@pytest.mark.needs_model
def test_a_repeated_question_drafts_from_the_first_answer(smollm2_store):
    ask = [{"role": "user", "content": "Write a short paragraph about the city of Paris and its history."}]
    with Engine(smollm2_store, speculative="ngram", n_threads=2, prefix_cache=False) as e:
        first = e.chat("smollm2", ask, max_tokens=80, temperature=0)
        second = e.chat("smollm2", ask, max_tokens=80, temperature=0)
    with Engine(smollm2_store, n_threads=2) as e:
        plain = e.chat("smollm2", ask, max_tokens=80, temperature=0)
    assert first.text == second.text == plain.text
    assert second.timings["draft_n_accepted"] > first.timings["draft_n_accepted"] + 10, (first.timings, second.timings)


def test_the_schedulers_row_cap_is_the_forwards(tiny_models, tmp_path):
    """Drafting requests beside a prompt being computed all finish, and the cap the scheduler
    takes drafts' rows out of (max_batch + max_chunk) is the forward's max_rows."""
    ModelRegistry(tmp_path).import_local("m", tiny_models("llama", QuantType.Q8_0))
    with Engine(tmp_path, speculative="ngram", n_threads=2, max_batch=4) as e:
        worker = e.session("m").worker
        greedy = [e.submit_complete("m", "a b a b a b a b", max_tokens=40, temperature=0) for _ in range(4)]
        long = e.submit_complete("m", list(range(3, 53)), max_tokens=4, temperature=0)
        outs = [h.result() for h in greedy] + [long.result()]
    assert all(o.finish_reason in ("length", "stop") for o in outs)
    assert worker.scheduler.max_batch + worker.scheduler.max_chunk == worker.fwd.max_rows


@pytest.mark.needs_model
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_binds_every_verified_row(smollm2_store, temperature):
    """A JSON schema answer quoting the prompt: each row draws with the grammar's mask after the
    drafts before it, so the tokens (and the JSON) are the one-at-a-time ones."""
    import json

    record = {"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing", "poetry"]}
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"},
                                               "fields": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "born", "fields"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Copy this JSON exactly: " + json.dumps(record)}]
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    outs = {}
    for spec in (None, "ngram"):
        with Engine(smollm2_store, speculative=spec, n_threads=2) as e:
            outs[spec] = e.chat("smollm2", msgs, max_tokens=80, temperature=temperature, seed=4, response_format=fmt)
    assert outs["ngram"].text == outs[None].text and json.loads(outs["ngram"].text).keys() == record.keys()
    assert outs["ngram"].timings["draft_n_accepted"] > 5, outs["ngram"].timings
