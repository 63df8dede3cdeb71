"""Hybrid models (LFM2: short convolutions beside attention; Qwen3.5: gated delta nets beside gated
attention; tests/fixtures/archs) in the serving engine. A running sequence's recurrent state is a
slot, and checkpoints of it hang on the prefix cache's nodes (rase/engine/state_cache.py), so batched,
chunked, cached and cancelled requests answer exactly as the single-stream loop does, a
conversation's next turn resumes after the last computed position, and every KV block and state
slot comes back."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rase.api import Engine
from rase.engine.decoder import GGUFDecoder
from rase.errors import InvalidRequest
from rase.engine.sampling import GenerationConfig
from tests.support.pools import pool_is_whole
from tests.support.single_stream import generate_with

ARCHS = Path(__file__).resolve().parents[1] / "fixtures" / "archs"
GREEDY = dict(temperature=0.0, max_tokens=24)
MODELS = {"lfm2": "lfm2-tiny-q8_0.gguf", "qwen35": "qwen35-tiny-q4_k_m.gguf"}
# f32 state of a sequence: (taps - 1) x channels per conv layer, H_v (S, S) matrices per delta net
STATE_BYTES = {"lfm2": 3 * 2 * 256 * 4, "qwen35": 3 * (3 * 512 + 8 * 32 * 32) * 4}
SAMPLED = dict(temperature=0.9, top_p=0.95, seed=5, max_tokens=24)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from rase.store.registry import ModelRegistry

    root = tmp_path_factory.mktemp("hybrid-store")
    for model, file in MODELS.items():
        ModelRegistry(root).import_local(model, ARCHS / file)
    return root


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return request.param


@pytest.fixture(scope="module")
def decoder(store, model):
    with Engine(store, max_batch=1, n_ctx=4096) as e:
        yield GGUFDecoder(e.session(model).plan, n_threads=1)


def _alone(decoder, ids: list[int], gen: dict) -> list[int]:
    """The single-stream loop's tokens (EOS stops, as the engine's completions do)."""
    config = GenerationConfig(**gen)
    config = GenerationConfig(**{**config.__dict__, "stop_tokens": [decoder.eos_token]})
    return generate_with(decoder, ids, config).tokens


def _ids(rng, n: int) -> list[int]:
    return [int(t) for t in rng.integers(3, 512, n)]


def _text(engine, model: str, tokens: list[int]) -> str:
    return engine.session(model).tokenizer.decode(tokens)


def test_an_eight_turn_conversation_resumes_from_the_cache(store, model, decoder):
    """Turn after turn (the conversation's ids kept, as an agent loop with a chat template
    does): the cached tokens cover at least 90% of the previous turn's prompt and answer, and
    every answer equals the one computed alone from nothing."""
    rng = np.random.default_rng(1)
    ids = _ids(rng, 40)
    with Engine(store, n_ctx=4096) as engine:
        previous = None
        for turn in range(8):
            out = engine.complete(model, ids, **GREEDY)
            want = _alone(decoder, ids, GREEDY)
            assert out.text == _text(engine, model, want) and out.completion_tokens == len(want), turn
            if previous is not None:
                assert out.cached_tokens >= 0.9 * previous, (turn, out.cached_tokens, previous)
            previous = len(ids) + len(want)
            ids = ids + want + _ids(rng, int(rng.integers(5, 30)))
        m = engine.stats["models"][model]
        assert m["prefix_hit_tokens"] > 0 and m["state_checkpoints_restored"] == 7  # turns 2..8 each resumed
        pool_is_whole(engine, model)


def test_concurrent_requests_with_cancellations_equal_served_alone(store, model, decoder):
    """8 requests with long and short prompts in mixed steps, small prompt chunks beside decodes;
    one cancelled mid-prompt and one mid-answer. The others answer as alone; the pool is whole."""
    rng = np.random.default_rng(2)
    prompts = [_ids(rng, n) for n in (700, 15, 90, 33, 260, 64, 8, 130)]
    gens = [GREEDY if i % 2 else SAMPLED for i in range(len(prompts))]
    want = {i: _alone(decoder, p, g) for i, (p, g) in enumerate(zip(prompts, gens)) if i not in (0, 1)}
    with Engine(store, n_ctx=4096, max_batch=8, tbt_target_ms=2.0) as engine:
        worker = engine.session(model).worker
        doomed_answer = engine.submit_complete(model, prompts[1], temperature=0.7, max_tokens=500)
        it = iter(doomed_answer)
        next(it), next(it)  # decoding: the long prompt beside it goes in small chunks
        doomed_prompt = engine.submit_complete(model, prompts[0], max_tokens=8)
        results: dict = {}

        def one(i):
            results[i] = engine.complete(model, prompts[i], **gens[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in want]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while not any(0 < r.n_computed < len(r.prompt) and len(r.prompt) == 700 for r in list(worker.scheduler.running)):
            assert time.monotonic() < deadline, "the long prompt never showed up part-way through"
            time.sleep(0.0005)
        doomed_prompt.cancel()
        doomed_answer.cancel()
        for t in threads:
            t.join()
        assert doomed_prompt.result(timeout=60).finish_reason == "cancelled"
        assert doomed_answer.result(timeout=60).finish_reason == "cancelled"
        for i, tokens in want.items():
            assert results[i].text == _text(engine, model, tokens) and results[i].completion_tokens == len(tokens), i
        pool_is_whole(engine, model)
        stats = engine.stats
        m = stats["models"][model]
        assert stats["cancelled"] == 2 and m["state_bytes_total"] == m["state_slots_total"] * STATE_BYTES[model]


def test_token_prompts_are_checked(store):
    with Engine(store, n_ctx=256) as engine:
        for bad in ([], [5, 512], [5, -1], [True, 3], ["a"]):
            with pytest.raises(InvalidRequest, match="token ids"):
                engine.complete("lfm2", bad, max_tokens=2)


def test_health_and_metrics_count_the_state(store):
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from rase.server import create_app

    with Engine(store, n_ctx=256) as engine:
        engine.complete("lfm2", _ids(np.random.default_rng(4), 40), max_tokens=4)
        client = TestClient(create_app(engine))
        health = client.get("/health").json()
        m = health["models"]["lfm2"]
        assert health["state_bytes_total"] == m["state_slots_total"] * STATE_BYTES["lfm2"] > 0
        # 43 positions computed: a checkpoint at the first block's end (a block of K/V costs more than
        # a state: every block is a boundary) and one at the request's end
        assert m["state_checkpoint_every_blocks"] == 1 and m["state_checkpoints"] == 2
        samples = {s.name: s.value for f in text_string_to_metric_families(client.get("/metrics").text)
                   for s in f.samples}
        assert samples["rase_state_bytes_total"] == health["state_bytes_total"]
        assert samples["rase_state_bytes_used"] == 2 * STATE_BYTES["lfm2"]  # nothing running: the checkpoints


def test_token_prompts_over_http(store):
    from fastapi.testclient import TestClient

    from rase.server import create_app

    ids = _ids(np.random.default_rng(6), 30)
    with Engine(store, n_ctx=256) as engine:
        want = engine.complete("lfm2", ids, **GREEDY)
        client = TestClient(create_app(engine))
        r = client.post("/v1/completions", json={"model": "lfm2", "prompt": ids, **GREEDY})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == want.text and body["usage"]["prompt_tokens"] == len(ids)
        bad = client.post("/v1/completions", json={"model": "lfm2", "prompt": [1, 99999], "max_tokens": 2})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
