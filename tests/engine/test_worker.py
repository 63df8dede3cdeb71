"""The serving engine end to end on a real model: requests served together equal the same
requests served alone (the single-stream loop, tests/support/single_stream.py), however they are batched,
chunked, cached or cancelled, and every KV block comes back."""
from __future__ import annotations

import random
import threading
import time

import pytest

from rase.api import Engine
from rase.engine.decoder import GGUFDecoder
from rase.errors import ContextOverflow
from rase.engine.sampling import GenerationConfig
from tests.support.pools import pool_is_whole
from tests.support.single_stream import run_text

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

QUESTIONS = ["Tell me about cats.", "What is 2+2?", "Write a poem about the sea.", "Explain gravity.",
             "Name three colors.", "What is Python?", "Describe a sunset.", "Why is the sky blue?"]
CONFIGS = [dict(temperature=0.0, max_tokens=24), dict(temperature=0.8, seed=11, max_tokens=24, top_p=0.9)]


@pytest.fixture(scope="module")
def store(smollm2_store):
    return smollm2_store


@pytest.fixture(scope="module")
def oracle(store):
    """Each (question, config) served alone by the single-stream loop."""
    session = Engine(store, max_batch=1).session("smollm2")
    dec = GGUFDecoder(session.plan, n_threads=1)
    out = {}
    for q in QUESTIONS:
        ids = session.render_chat([{"role": "user", "content": q}])
        for i, c in enumerate(CONFIGS):
            r = run_text(dec, session.tokenizer, ids, GenerationConfig(**c))
            out[q, i] = (r.text, len(r.result.tokens), r.finish_reason)
    return out


def _serve_all(engine, jobs, stagger: float = 0.0, seed: int = 0) -> dict:
    rng = random.Random(seed)
    results: dict = {}
    errors: list = []

    def one(q, i, delay):
        time.sleep(delay)
        try:
            out = engine.chat("smollm2", [{"role": "user", "content": q}], **CONFIGS[i])
            results[q, i] = (out.text, out.completion_tokens, out.finish_reason)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(q, i, rng.uniform(0, stagger))) for q, i in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


@pytest.mark.parametrize("threads", [1, 2])
def test_eight_at_once_staggered_equal_served_alone(store, oracle, threads):
    engine = Engine(store, max_batch=8, n_threads=threads)
    jobs = [(q, i) for q in QUESTIONS for i in range(len(CONFIGS))]
    got = _serve_all(engine, jobs, stagger=0.5, seed=threads)
    assert got == {j: oracle[j] for j in jobs}
    # and again with the prefix cache warm from the first round: the same answers
    before = engine.stats["prefix_hit_tokens"]
    assert _serve_all(engine, jobs, stagger=0.2, seed=9) == got
    assert engine.stats["prefix_hit_tokens"] > before
    # the chat preamble the prompts share is shorter than a block: its rows were copied
    assert engine.stats["models"]["smollm2"]["prefix_copied_tokens"] > 0
    pool_is_whole(engine, "smollm2")


def test_small_chunks_and_no_cache_change_nothing(store, oracle):
    """Prompts cut into 16-token chunks next to decoding requests (a 1 ms target), and no
    prefix cache at all."""
    engine = Engine(store, max_batch=4, tbt_target_ms=1.0, prefix_cache=False)
    jobs = [(q, 1) for q in QUESTIONS]
    assert _serve_all(engine, jobs, stagger=0.3) == {j: oracle[j] for j in jobs}
    assert engine.stats["prefix_hit_tokens"] == 0
    pool_is_whole(engine, "smollm2")


def test_a_pool_too_small_for_all_serves_everyone_in_turn(store, oracle):
    """A KV pool that holds about two requests: the others wait (none is killed); a request
    that could never fit is refused before any work."""
    engine = Engine(store, max_batch=8, kv_cache_mb=3.0)  # ~136 positions
    jobs = [(q, 0) for q in QUESTIONS[:5]]
    assert _serve_all(engine, jobs) == {j: oracle[j] for j in jobs}
    with pytest.raises(ContextOverflow, match="whole KV pool"):
        engine.chat("smollm2", [{"role": "user", "content": "Hi"}], max_tokens=400)
    pool_is_whole(engine, "smollm2")


def test_the_default_pool_is_a_memory_budget_and_decides_admission(store, oracle, monkeypatch):
    """No n_ctx, no kv_cache_mb: each sequence may reach the model's own context (SmolLM2: 8192),
    and the pool is max_batch such contexts capped at KV_MEMORY_SHARE of the machine's memory.
    On a (pretended) 12 MiB machine that is ~136 positions: requests take turns within it."""
    from rase.engine import worker

    monkeypatch.setattr(worker, "physical_memory", lambda: 12 << 20)
    engine = Engine(store, max_batch=8)
    jobs = [(q, 0) for q in QUESTIONS[:5]]
    assert _serve_all(engine, jobs) == {j: oracle[j] for j in jobs}
    session = engine.session("smollm2")
    assert session.plan.n_ctx == session.plan.hparams.context_length == 8192
    assert engine.stats["models"]["smollm2"]["kv_blocks_total"] * 32 * session.plan.kv_bytes_per_token <= 3 << 20
    with pytest.raises(ContextOverflow, match="whole KV pool"):
        engine.chat("smollm2", [{"role": "user", "content": "Hi"}], max_tokens=400)
    pool_is_whole(engine, "smollm2")
    monkeypatch.undo()
    per_block = 32 * session.plan.kv_bytes_per_token
    want = min(8 * 8192 // 32 + (256 << 20) // per_block, worker.physical_memory() // 4 // per_block)
    with Engine(store, max_batch=8) as big:
        assert big.session("smollm2").worker.kv.n_blocks == want


def test_second_turn_hits_the_cache_and_answers_the_same(store):
    turn1 = [{"role": "system", "content": "You are a helpful assistant who answers carefully. " * 20},
             {"role": "user", "content": "What is the capital of France?"}]
    warm = Engine(store)
    first = warm.chat("smollm2", turn1, temperature=0, max_tokens=32)
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And of Italy?"}]
    hit = warm.chat("smollm2", turn2, temperature=0, max_tokens=32)
    cold = Engine(store, prefix_cache=False).chat("smollm2", turn2, temperature=0, max_tokens=32)
    assert hit.text == cold.text and hit.completion_tokens == cold.completion_tokens
    assert cold.cached_tokens == 0 and hit.cached_tokens >= (first.prompt_tokens // 32) * 32
    assert hit.timings["cached_n"] == hit.cached_tokens and hit.timings["prompt_n"] < cold.timings["prompt_n"]


def test_cancelling_during_prompt_and_decode_leaves_the_others_unchanged(store, oracle):
    engine = Engine(store, max_batch=8, tbt_target_ms=5.0)
    worker = engine.session("smollm2").worker
    doomed_decode = engine.submit_chat("smollm2", [{"role": "user", "content": QUESTIONS[0]}],
                                       temperature=0.7, max_tokens=200)
    it = iter(doomed_decode)
    next(it), next(it)  # it is decoding: prompts beside it go in small chunks
    long_prompt = [{"role": "user", "content": "Summarize this. " + "The quick brown fox jumps. " * 150}]
    doomed_prefill = engine.submit_chat("smollm2", long_prompt, max_tokens=50)
    survivors = [(q, i) for q in QUESTIONS[1:5] for i in range(2)]
    results: dict = {}
    t = threading.Thread(target=lambda: results.update(_serve_all(engine, survivors, stagger=0.2)))
    t.start()
    deadline = time.monotonic() + 60
    while not any(0 < r.n_computed < len(r.prompt) and len(r.prompt) > 500 for r in list(worker.scheduler.running)):
        assert time.monotonic() < deadline, "the long prompt never showed up part-way through"
        time.sleep(0.001)
    doomed_prefill.cancel()
    doomed_decode.cancel()
    assert doomed_prefill.result(timeout=60).finish_reason == "cancelled"
    assert doomed_prefill.result().completion_tokens == 0
    assert doomed_decode.result(timeout=60).finish_reason == "cancelled"
    t.join()
    assert results == {j: oracle[j] for j in survivors}
    pool_is_whole(engine, "smollm2")
    assert engine.stats["cancelled"] == 2


def test_unloading_lets_running_requests_finish(store, oracle):
    engine = Engine(store)
    handle = engine.submit_chat("smollm2", [{"role": "user", "content": QUESTIONS[2]}], **CONFIGS[0])
    worker = engine.session("smollm2").worker
    engine.unload()
    out = handle.result(timeout=60)
    assert (out.text, out.completion_tokens, out.finish_reason) == oracle[QUESTIONS[2], 0]
    for _ in range(200):
        if not worker.alive:
            break
        time.sleep(0.01)
    assert not worker.alive  # its thread ended once it had nothing left
    assert engine.stats["requests"] == 1  # counts survive the unload


def test_an_engine_dropped_without_close_stops_its_workers(store):
    import gc

    engine = Engine(store)
    engine.chat("smollm2", [{"role": "user", "content": "Hi"}], max_tokens=2)
    worker = engine.session("smollm2").worker
    del engine
    gc.collect()
    for _ in range(200):
        if not worker.alive:
            break
        time.sleep(0.01)
    assert not worker.alive
    with Engine(store) as engine:  # and as a context manager
        engine.chat("smollm2", [{"role": "user", "content": "Hi"}], max_tokens=2)
        worker = engine.session("smollm2").worker
    worker.close(wait=True)
    assert not worker.alive


@pytest.mark.parametrize("stage", ["next_step", "update"])
def test_a_scheduler_bug_fails_the_requests_and_the_worker_serves_on(store, stage):
    """An exception inside the scheduler (a bug: inputs are checked before) fails every request
    with a RaseError saying where, instead of killing the worker thread and hanging them."""
    from rase.errors import RaseError

    with Engine(store, n_threads=2) as e:
        scheduler = e.session("smollm2").worker.scheduler
        real = getattr(scheduler, stage)
        calls = []

        def broken(*args, **kwargs):
            if not calls:
                calls.append(1)
                raise ZeroDivisionError("a planted bug")
            return real(*args, **kwargs)

        setattr(scheduler, stage, broken)
        handle = e.submit_complete("smollm2", "The capital of France is", max_tokens=8, temperature=0)
        with pytest.raises(RaseError, match="ZeroDivisionError: a planted bug"):
            handle.result(timeout=60)
        after = e.complete("smollm2", "The capital of France is", max_tokens=8, temperature=0)
        assert after.completion_tokens == 8 and calls == [1]
