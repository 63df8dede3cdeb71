"""Speculative decoding with prompt-lookup drafts and with a draft model: the lookup itself, and output identical to
decoding one token at a time, greedy and seeded sampling alike, on every tiny family and on
SmolLM2, batched with other requests in the same steps."""
from __future__ import annotations

import pytest

from rase import QuantType
from rase.api import Engine
from rase.drafting import K_MAX, Lookup
from rase.registry import ModelRegistry
from tests.tinymodels import ARCH_FEATURES


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
    archs = Path(__file__).parent / "fixtures" / "archs"
    out = {}
    for family in FAMILIES:
        path = archs / f"{family[:-5]}-tiny-q8_0.gguf" if family.endswith("-file") else \
            tiny_models(family, QuantType.Q8_0)
        ModelRegistry(root / family).import_local("m", path)
        out[family] = root / family
    return out


PROMPTS = ["a b c d a b c d a b c", "xyz xyz xyz xyz", "hello there hello there hello", "one two three"]


def _run(store, speculative):
    """Every prompt greedy and seeded-sampled, all submitted together, and with a logit_bias and
    penalties (each draft row's sampler counts the drafts before it)."""
    with Engine(store, speculative=speculative, n_threads=2, max_batch=16) as e:
        handles = [e.submit_complete("m", p, max_tokens=24, temperature=0) for p in PROMPTS]
        handles.append(e.submit_complete("m", PROMPTS[0], max_tokens=24, temperature=0, logit_bias={"5": 2.0}))
        handles.append(e.submit_complete("m", PROMPTS[1], max_tokens=24, temperature=0.8, seed=9, repeat_penalty=1.3,
                                         presence_penalty=0.4, frequency_penalty=0.2))
        noise = [e.submit_complete("m", p, max_tokens=24, temperature=0.9, top_k=8, seed=s)
                 for s, p in enumerate(PROMPTS)]
        greedy = [h.result() for h in handles]
        sampled = [h.result().text for h in noise]
        stats = e.stats["models"]["m"]
    return [g.text for g in greedy], sampled, stats


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokens_are_the_same_with_drafts_batched_with_others(stores, family):
    plain, plain_sampled, _ = _run(stores[family], None)
    spec, spec_sampled, stats = _run(stores[family], "ngram")
    assert spec == plain and spec_sampled == plain_sampled
    if family.endswith("-file"):
        assert stats["drafted_tokens"] == 0  # a recurrent state cannot step back: no speculation
    else:
        assert stats["drafted_tokens"] > 0  # the repeated prompts gave drafts to verify


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


def test_rase_serve_spec_ngram_reports_drafts_in_timings_and_metrics(smollm2_store, openai_client):
    import httpx

    from tests.conftest import rase_serve

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
    from rase.drafting import NgramCache

    cache = NgramCache(size=4)
    cache.add([1, 2, 3, 4, 5, 6])
    lk = Lookup(cache)
    assert lk.propose([9, 1, 2, 3], 10) == [4, 5, 6][:lk.k]  # nothing repeats here; an earlier request had it
    assert Lookup(cache).propose([7, 8, 9, 7, 8], 10) == [9, 7, 8][:K_MAX]  # its own history first
    cache.add(list(range(10, 20)))
    assert len(cache.next) == 4 and cache.get((1, 2, 3), 5) == []  # least recently seen dropped


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


# ---------------------------------------------------------------- a draft model


DRAFT_FAMILIES = ["llama", "qwen3", "gemma3", "gemma2", "phi3", "qwen3moe"]


@pytest.mark.parametrize("family,draft", [(f, "q4_0") for f in DRAFT_FAMILIES]
                         + [(f, "other-seed") for f in ("llama", "qwen3", "qwen3moe")])
def test_a_draft_model_gives_the_same_tokens_batched_with_others(tmp_path, tiny_models, family, draft):
    """The target is the Q8_0 file; the draft the same weights at Q4_0 (close: its drafts hold),
    or other random weights (its drafts fail): the output is the target's own either way."""
    from tests.tinymodels import write_tiny_model

    reg = ModelRegistry(tmp_path)
    reg.import_local("m", tiny_models(family, QuantType.Q8_0))
    reg.import_local("d", tiny_models(family, QuantType.Q4_0) if draft == "q4_0" else
                     write_tiny_model(tmp_path / "d.gguf", family, QuantType.Q8_0, seed=7))
    plain, plain_sampled, _ = _run(tmp_path, None)
    spec, spec_sampled, stats = _run(tmp_path, "draft:d")
    assert spec == plain and spec_sampled == plain_sampled
    drafted, accepted = stats["drafted_tokens"], stats["accepted_draft_tokens"]
    assert drafted > 0 and (accepted > 0 if draft == "q4_0" else accepted < drafted), stats


def test_smollm2_drafting_for_itself_holds_every_greedy_draft(smollm2_store):
    """The draft's cache follows the request's tokens through rollbacks: the same model's greedy
    drafts are exactly the tokens verified, so every one holds (a draft evaluated at a wrong
    position or on stale tokens would fail)."""
    msgs = [{"role": "user", "content": "Write three sentences about the sea."}]
    outs = {}
    for spec in (None, "draft:smollm2"):
        with Engine(smollm2_store, speculative=spec, n_threads=2) as e:
            other = e.submit_chat("smollm2", [{"role": "user", "content": "Name a colour."}], max_tokens=30,
                                  temperature=0.7, seed=3)
            outs[spec] = (e.chat("smollm2", msgs, max_tokens=80, temperature=0), other.result())
    (plain, plain_other), (spec, spec_other) = outs[None], outs["draft:smollm2"]
    assert spec.text == plain.text and spec_other.text == plain_other.text
    t = spec.timings
    assert t["draft_n"] >= 40 and t["draft_n_accepted"] == t["draft_n"], t
    assert spec_other.timings["draft_n"] > 0  # the sampled request drafted too: its drafts are guesses


def test_a_draft_model_drafts_for_all_requests_in_shared_steps(smollm2_store):
    """Six requests at once (one with a prompt longer than a draft step's rows, caught up over
    several steps): one draft-model step serves every request still drafting, and the tokens
    are the plain run's."""
    story = "Once upon a time a lighthouse keeper lived alone by the sea and kept the lamp lit. " * 40
    prompts = [story + "Continue the story."] + [f"Write a sentence about the number {i}." for i in range(5)]
    outs, steps = {}, []
    for spec in (None, "draft:smollm2"):
        with Engine(smollm2_store, speculative=spec, n_threads=2, max_batch=8) as e:
            worker = e.session("smollm2").worker
            batch = worker.scheduler.draft_batch
            if batch is not None:
                real = batch.fwd

                class Counting:
                    def step(self, rows, *args, **kwargs):
                        steps.append(len(rows))
                        return real.step(rows, *args, **kwargs)

                batch.fwd = Counting()
                assert len(e.tokenize("smollm2", prompts[0])) > batch.max_rows
            handles = [e.submit_chat("smollm2", [{"role": "user", "content": p}], max_tokens=40, temperature=0)
                       for p in prompts]
            outs[spec] = [h.result() for h in handles]
    assert [o.text for o in outs["draft:smollm2"]] == [o.text for o in outs[None]]
    drafted = sum(o.timings["draft_n"] for o in outs["draft:smollm2"])
    for o in outs["draft:smollm2"]:  # drafting for itself: every draft holds (a prompt caught up wrong would not)
        assert 0 < o.timings["draft_n"] == o.timings["draft_n_accepted"], o.timings
    assert len(steps) < drafted / 3 and max(steps) > 5  # rows of several requests share a draft step


def test_draft_models_that_cannot_draft_are_refused_at_load(tmp_path, tiny_models, smollm2_path):
    from pathlib import Path

    from rase import InvalidRequest, ModelNotFound

    reg = ModelRegistry(tmp_path)
    reg.import_local("m", smollm2_path)
    reg.import_local("other-vocab", tiny_models("llama", QuantType.Q8_0))
    reg.import_local("hybrid", Path(__file__).parent / "fixtures" / "archs" / "lfm2-tiny-q8_0.gguf")
    for draft, error, words in (("other-vocab", InvalidRequest, "vocabulary"), ("hybrid", InvalidRequest, "recurrent"),
                                ("missing", ModelNotFound, "missing")):
        with Engine(tmp_path, speculative=f"draft:{draft}", n_threads=2) as e:
            with pytest.raises(error, match=words):
                e.complete("m", "hello", max_tokens=2)
    for bad in ("draft:", "draft:../x", "eagle", 3):
        with pytest.raises(InvalidRequest, match="speculative"):
            Engine(tmp_path, speculative=bad)


def test_rase_serve_spec_draft_reports_drafts(smollm2_store, openai_client):
    from tests.conftest import rase_serve

    with rase_serve(smollm2_store, "--threads", "2", "--spec", "draft:smollm2") as base:
        out = openai_client(base).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Count from one to ten in words."}],
            max_tokens=40, temperature=0)
    timings = out.model_extra["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"], timings
