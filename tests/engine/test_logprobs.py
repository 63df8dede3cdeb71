"""logprobs / top_logprobs and logit_bias: the log-softmax of the raw logits, through the engine
(teacher-forced against the decoder's own logits) and the OpenAI shapes."""
from __future__ import annotations

import numpy as np
import pytest

from rase import InvalidGenerationConfig
from rase.api import Engine
from rase.engine.decoder import GGUFDecoder
from rase.engine.logprobs import chat_logprobs, completion_logprobs, token_logprob

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_token_logprob_is_the_log_softmax():
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(5000) * 4).astype(np.float32)
    row[7] = row[8] = row.max() + 1  # a tie: the lower id first
    e = token_logprob(row, 123, 5, lambda i: f"<{i}>".encode())
    ref = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64) - row.max()).sum()) - row.max()
    assert abs(e.logprob - ref[123]) < 1e-5 and e.bytes == b"<123>"
    assert [t[0] for t in e.top] == list(np.argsort(-ref, kind="stable")[:5])
    assert [t[0] for t in e.top][:2] == [7, 8]
    assert all(abs(lp - ref[i]) < 1e-5 for i, _, lp in e.top) and sum(np.exp([t[2] for t in e.top])) <= 1
    c = chat_logprobs([e])["content"][0]
    assert c["token"] == "<123>" and c["bytes"] == list(b"<123>") and len(c["top_logprobs"]) == 5
    assert completion_logprobs([e, e])["text_offset"] == [0, 5]


@pytest.fixture(scope="module")
def engine(smollm2_store):
    with Engine(smollm2_store, max_batch=4) as e:
        yield e


@pytest.mark.needs_model
def test_chat_logprobs_are_the_models_own(engine):
    out = engine.chat("smollm2", CHAT, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    # every token shown has an entry; the end-of-turn token that stopped it is not shown
    assert out.finish_reason == "stop" and len(out.logprobs) == out.completion_tokens - 1 and "Paris" in out.text
    assert b"".join(e.bytes for e in out.logprobs).decode() == out.text
    for e in out.logprobs:  # greedy: every token is the most likely one
        assert e.top[0][0] == e.token and e.top[0][2] == e.logprob and len(e.top) == 3
    session = engine.session("smollm2")
    logits = GGUFDecoder(session.plan).prefill(session.render_chat(CHAT))  # the single-stream oracle
    first = token_logprob(logits, out.logprobs[0].token, 3, lambda t: session.tokenizer.decode_bytes([t]))
    assert first == out.logprobs[0]  # teacher-forced: the same numbers from the decoder's logits
    plain = engine.chat("smollm2", CHAT, temperature=0, max_tokens=12)
    assert plain.logprobs is None and plain.text == out.text
    streamed = [d for d in engine.stream_chat("smollm2", CHAT, temperature=0, max_tokens=12, logprobs=True)
                if not isinstance(d, str)]
    assert [e.token for d in streamed for e in d.entries] == [e.token for e in out.logprobs]


@pytest.mark.needs_model
def test_completion_logprobs_and_bad_values(engine):
    out = engine.complete("smollm2", "The capital of France is", temperature=0, max_tokens=4, logprobs=2)
    assert len(out.logprobs) == 4 and all(len(e.top) == 2 for e in out.logprobs)
    for kw, param in ((dict(top_logprobs=2), "top_logprobs"), (dict(logprobs=True, top_logprobs=21), "top_logprobs")):
        with pytest.raises(InvalidGenerationConfig) as err:
            engine.chat("smollm2", CHAT, max_tokens=2, **kw)
        assert err.value.param == param
    with pytest.raises(InvalidGenerationConfig) as err:
        engine.complete("smollm2", "x", max_tokens=2, logprobs=6)
    assert err.value.param == "logprobs"


@pytest.mark.needs_model
def test_logit_bias_bans_and_forces_tokens(engine):
    greedy = engine.chat("smollm2", CHAT, temperature=0, max_tokens=3, logprobs=True)
    first = greedy.logprobs[0].token
    banned = engine.chat("smollm2", CHAT, temperature=0, max_tokens=3, logprobs=True, logit_bias={str(first): -100})
    assert banned.logprobs[0].token != first
    forced = engine.chat("smollm2", CHAT, temperature=0, max_tokens=3, logprobs=True, logit_bias={"1234": 100})
    assert forced.logprobs[0].token == 1234
    assert forced.logprobs[0].logprob < -1  # logprobs are the raw model's, before the bias
    for bias in ({"99999999": 1}, {"5": 101}, {"x": 1}):
        with pytest.raises(InvalidGenerationConfig):
            engine.chat("smollm2", CHAT, max_tokens=2, logit_bias=bias)


@pytest.mark.needs_model
def test_n_choices_are_the_single_runs_with_consecutive_seeds(engine):
    chat = [{"role": "user", "content": "Name a fruit."}]
    handles = engine.submit_chat_choices("smollm2", chat, 3, temperature=1.0, seed=5, max_tokens=16)
    outs = [h.result() for h in handles]
    singles = [engine.chat("smollm2", chat, temperature=1.0, seed=s, max_tokens=16) for s in (5, 6, 7)]
    assert [o.text for o in outs] == [s.text for s in singles]
    assert all(o.cached_tokens > 0 for o in outs[1:])  # the later choices start from the first's prompt KV
    with pytest.raises(InvalidGenerationConfig) as err:
        engine.submit_chat_choices("smollm2", chat, 9)
    assert err.value.param == "n"
