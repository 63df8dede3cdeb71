"""Speculative decoding with a draft model (rase/engine/draft_model.py): the cost-aware draft length,
and output identical to decoding one token at a time on tiny families and SmolLM2, batched with
other requests, greedy and seeded."""
from __future__ import annotations

import pytest

from rase import QuantType
from rase.api import Engine
from rase.engine.draft_model import DraftSeq, best_k
from rase.store.registry import ModelRegistry
from tests.support.pools import pool_is_whole
from tests.support.speculation import run_prompts


def test_the_draft_length_is_the_one_that_pays_for_the_drafts_cost():
    assert best_k(1.0, 0.05, 8) == 8        # a cheap draft that always holds: as many as allowed
    assert best_k(0.9, 0.05, 8) >= 6
    assert best_k(0.97, 0.76, 8) in (2, 3, 4)  # a draft costing 3/4 of a target step: a few
    assert best_k(0.6, 0.76, 8) == 0        # ... and none when they fail this often
    assert best_k(1.0, 1.2, 8) == 0         # a draft dearer than the model never pays
    assert best_k(0.9, 0.05, 3) == 3        # within the room


class _Batch:
    def __init__(self, ratio):
        self.free, self._ratio = [], ratio

    def ratio(self):
        return self._ratio


def test_a_sequence_drafts_what_pays_and_probes_when_nothing_does():
    seq = DraftSeq(_Batch(None))
    assert seq._room(8) == seq.k  # unmeasured: the acceptance-driven k
    seq = DraftSeq(_Batch(0.05))
    seq.verified(8, 8)
    assert seq._room(8) == seq.k == 8  # cheap and holding: all of it
    dear = DraftSeq(_Batch(0.9))
    dear.verified(8, 5)
    assert dear._room(8) == 0 and dear.k == 0  # nothing pays: off
    rooms = [dear._room(8) for _ in range(40)]
    assert rooms.count(1) >= 2 and set(rooms) <= {0, 1}  # a one-draft probe every PROBE tokens


DRAFT_FAMILIES = ["llama", "qwen3", "gemma3", "gemma2", "phi3", "qwen3moe"]


@pytest.mark.parametrize("family,draft", [(f, "q4_0") for f in DRAFT_FAMILIES]
                         + [(f, "other-seed") for f in ("llama", "qwen3", "qwen3moe")])
def test_a_draft_model_gives_the_same_tokens_batched_with_others(tmp_path, tiny_models, family, draft):
    """The target is the Q8_0 file; the draft the same weights at Q4_0 (close: its drafts hold),
    or other random weights (its drafts fail): the output is the target's own either way."""
    from tests.support.tinymodels import write_tiny_model

    reg = ModelRegistry(tmp_path)
    reg.import_local("m", tiny_models(family, QuantType.Q8_0))
    reg.import_local("d", tiny_models(family, QuantType.Q4_0) if draft == "q4_0" else
                     write_tiny_model(tmp_path / "d.gguf", family, QuantType.Q8_0, seed=7))
    plain, plain_sampled, _ = run_prompts(tmp_path, None)
    spec, spec_sampled, stats = run_prompts(tmp_path, "draft:d")
    assert spec == plain and spec_sampled == plain_sampled
    drafted, accepted = stats["drafted_tokens"], stats["accepted_draft_tokens"]
    assert drafted > 0 and (accepted > 0 if draft == "q4_0" else accepted < drafted), stats


@pytest.mark.needs_model
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


@pytest.mark.needs_model
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
            batch = worker.drafter if spec else None  # the draft model
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
            if spec:  # the draft sequences' blocks are the KV manager's: every one back once the requests end
                pool_is_whole(e, "smollm2")
                assert len(worker.kv.draft_free) == worker.kv.n_draft > 0 and not hasattr(batch, "free")
    assert [o.text for o in outs["draft:smollm2"]] == [o.text for o in outs[None]]
    drafted = sum(o.timings["draft_n"] for o in outs["draft:smollm2"])
    for o in outs["draft:smollm2"]:  # drafting for itself: every draft holds (a prompt caught up wrong would not)
        assert 0 < o.timings["draft_n"] == o.timings["draft_n_accepted"], o.timings
    assert len(steps) < drafted / 3 and max(steps) > 5  # rows of several requests share a draft step


@pytest.mark.needs_model
def test_draft_models_that_cannot_draft_are_refused_at_load(tmp_path, tiny_models, smollm2_path):
    from pathlib import Path

    from rase import InvalidRequest, ModelNotFound

    reg = ModelRegistry(tmp_path)
    reg.import_local("m", smollm2_path)
    reg.import_local("other-vocab", tiny_models("llama", QuantType.Q8_0))
    reg.import_local("hybrid", Path(__file__).parents[1] / "fixtures" / "archs" / "lfm2-tiny-q8_0.gguf")
    for draft, error, words in (("other-vocab", InvalidRequest, "vocabulary"), ("hybrid", InvalidRequest, "recurrent"),
                                ("missing", ModelNotFound, "missing")):
        with Engine(tmp_path, speculative=f"draft:{draft}", n_threads=2) as e:
            with pytest.raises(error, match=words):
                e.complete("m", "hello", max_tokens=2)
    for bad in ("draft:", "draft:../x", "eagle", 3):
        with pytest.raises(InvalidRequest, match="speculative"):
            Engine(tmp_path, speculative=bad)


def test_vocabularies_a_little_apart_may_draft_as_llama_cpp_allows(tmp_path, tiny_models):
    """llama.cpp's rule (common_speculative_are_compatible): sizes within 128 tokens and the same
    text for the ids both have; the output is the model's own, whatever the draft proposes."""
    from rase import InvalidRequest
    from tests.support.tinymodels import HP, write_tiny_model

    V = HP["n_vocab"]
    reg = ModelRegistry(tmp_path)
    reg.import_local("m", tiny_models("llama", QuantType.Q8_0))
    reg.import_local("padded", write_tiny_model(tmp_path / "p.gguf", "llama", QuantType.Q8_0, hp={"n_vocab": V + 32}))
    reg.import_local("far", write_tiny_model(tmp_path / "f.gguf", "llama", QuantType.Q8_0, hp={"n_vocab": V + 200}))
    reg.import_local("renamed", write_tiny_model(tmp_path / "r.gguf", "llama", QuantType.Q8_0,
                                                 extra_tokens={"<|other|>": 4}))
    plain, plain_sampled, _ = run_prompts(tmp_path, None)
    spec, spec_sampled, stats = run_prompts(tmp_path, "draft:padded")
    assert spec == plain and spec_sampled == plain_sampled and stats["drafted_tokens"] > 0
    for draft, why in (("far", "tokens against"), ("renamed", "not the same ones")):
        with Engine(tmp_path, speculative=f"draft:{draft}", n_threads=2) as e:
            with pytest.raises(InvalidRequest, match=why):
                e.complete("m", "hello", max_tokens=2)


@pytest.mark.needs_model
def test_rase_serve_spec_draft_reports_drafts(smollm2_store, openai_client):
    from tests.support.servers import rase_serve

    with rase_serve(smollm2_store, "--threads", "2", "--spec", "draft:smollm2") as base:
        out = openai_client(base).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Count from one to ten in words."}],
            max_tokens=40, temperature=0)
    timings = out.model_extra["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"], timings
