"""The scheduler as policy: requests in, step plans out, made-up tokens back. No model, no
threads (style-anchors 7.1)."""
from __future__ import annotations

import numpy as np
import pytest

from rase.errors import InvalidLogits
from rase.engine.sampling import GenerationConfig, token_or_error
from rase.output import GenerationStopReason
from rase.engine.kv_manager import KVManager
from rase.engine.request import Request, State
from rase.engine.scheduler import Scheduler
from rase.output import Output

BS = 32


class Text:
    """A TextState stand-in: token t shows as 't ', 99 is a stop string."""

    def __init__(self):
        self.parts, self.finished = [], False

    def feed(self, token):
        self.parts.append(f"{token} ")
        return Output(f"{token} ", stop=GenerationStopReason.STOP_STRING if token == 99 else None)

    def finish(self):
        self.finished = True
        return ""

    def pending_calls(self):
        return ()

    def pending_reasoning(self):
        return ""

    text = property(lambda self: "".join(self.parts))
    reasoning = ""


def req(n_prompt=10, max_tokens=5, stop_tokens=(), first=1) -> Request:
    return Request(list(range(first, first + n_prompt)), GenerationConfig(max_tokens=max_tokens, stop_tokens=stop_tokens),
                   Text())


def step(s: Scheduler, token_of=lambda r: 7, seconds=0.01):
    plan = s.next_step(0.0)
    if plan is None:
        return None, []
    tokens = [token_or_error(token_of(r)) for r in plan.out]  # as the worker hands them on
    return plan, s.update(plan, tokens, seconds, now=0.0)


def test_prompt_then_decode_rows_one_token_per_step():
    s = Scheduler(KVManager(64, BS))
    r = req(n_prompt=40, max_tokens=3)
    s.add(r)
    plan, events = step(s)
    assert plan.rows.tolist() == [[t, 0, p] for p, t in enumerate(r.prompt)]  # the whole prompt
    assert plan.out_rows.tolist() == [39] and r.tokens[-1] == 7 and r.n_computed == 40
    plan, _ = step(s)
    assert plan.rows.tolist() == [[7, 0, 40]] and plan.out_rows.tolist() == [0]
    plan, events = step(s)
    assert events[-1].done and r.stop_reason is GenerationStopReason.MAX_TOKENS
    assert r.generated == 3 and r.n_computed == 42  # the last token is never fed back
    assert s.next_step(0.0) is None and r.id not in s.kv.held and s.kv.available() == 64


def test_decode_rows_come_first_and_prompts_are_chunked_under_the_budget():
    """Measured: a prompt token costs 1 ms, a decode step 20 ms; with a 50 ms target a long
    prompt arriving beside a decoding request goes in chunks of ~30 tokens, and the decoding
    request gets its row in every step (stall-free)."""
    s = Scheduler(KVManager(64, BS), max_chunk=512, min_chunk=16, tbt_target_ms=50)
    a = req(10, max_tokens=50)
    s.add(a)
    step(s, seconds=0.010)   # a's prompt alone: 10 tokens in 10 ms
    step(s, seconds=0.020)   # a decodes alone: 20 ms
    b = req(300, max_tokens=5, first=1000)
    s.add(b)
    chunks = []
    while b.generated == 0:
        plan = s.next_step(0.0)
        assert plan.rows[0].tolist() == [a.tokens[-1], 0, a.n_computed]  # a's decode row first
        s.update(plan, np.full(len(plan.out), 7, np.int32), 0.020 + 0.001 * plan.n_prefill, now=0.0)
        chunks.append(plan.n_prefill)
    assert sum(chunks) == 300 and 25 <= chunks[0] <= 30 and len(chunks) >= 8
    nobody_decoding = Scheduler(KVManager(64, BS), max_chunk=512)
    nobody_decoding.add(req(300))
    plan, _ = step(nobody_decoding)
    assert plan.n_prefill == 300  # no one waits: the whole prompt at once


def test_many_short_prompts_share_one_step():
    s = Scheduler(KVManager(64, BS), max_batch=8)
    rs = [req(5, first=10 * i) for i in range(6)]
    for r in rs:
        s.add(r)
    plan, events = step(s)
    assert len(plan.seqs) == 6 and plan.n_prefill == 30 and len(plan.out_rows) == 6
    assert all(r.generated == 1 for r in rs)


def test_max_batch_caps_running_requests_fcfs():
    s = Scheduler(KVManager(64, BS), max_batch=2)
    rs = [req(5, first=10 * i) for i in range(4)]
    for r in rs:
        s.add(r)
    step(s)
    assert [r.state for r in rs] == [State.RUNNING, State.RUNNING, State.WAITING, State.WAITING]
    while not rs[0].state is State.DONE:
        step(s)
    step(s)
    assert rs[2].state is State.RUNNING


def test_stop_token_and_stop_string_end_requests_without_another_row():
    s = Scheduler(KVManager(64, BS))
    a, b = req(5, max_tokens=50, stop_tokens=(2,)), req(5, max_tokens=50, first=100)
    s.add(a)
    s.add(b)
    step(s, token_of=lambda r: 5)
    plan, events = step(s, token_of=lambda r: 2 if r is a else 99)
    assert a.stop_reason is GenerationStopReason.STOP_TOKEN and a.text.parts == ["5 "]  # 2 never shown
    assert b.stop_reason is GenerationStopReason.STOP_STRING
    assert all(e.done for e in events) and s.next_step(0.0) is None


def test_pool_too_small_for_everyone_admits_in_order_and_never_kills():
    kv = KVManager(4, BS)  # 128 positions
    s = Scheduler(kv, max_batch=8)
    rs = [req(40, max_tokens=40, first=100 * i) for i in range(3)]  # 80 positions = 3 blocks each
    for r in rs:
        s.add(r)
    done = []
    for _ in range(200):
        plan, events = step(s)
        done += [e.request for e in events if e.done]
        assert sum(r.state is State.RUNNING for r in rs) <= 1  # one at a time fits
        kv.check([r.id for r in s.running])
        if plan is None:
            break
    assert done == rs and all(r.generated == 40 for r in rs)


def test_cancel_waiting_and_running_returns_their_blocks():
    kv = KVManager(8, BS)
    s = Scheduler(kv, max_batch=1)
    a, b = req(40, max_tokens=20), req(5, first=50)
    s.add(a)
    s.add(b)
    step(s)
    assert a.state is State.RUNNING and b.state is State.WAITING
    b.cancel_requested = True
    a.cancel_requested = True
    assert s.next_step(0.0) is None
    events = s.drain_events()
    assert {e.request.id for e in events} == {a.id, b.id} and all(e.done for e in events)
    assert all(r.stop_reason is GenerationStopReason.CANCELLED for r in (a, b))
    kv.check([])
    # a's full first block stays cached, and the 40 - 32 positions it computed after it as a tail node
    assert kv.available() == 8 and kv.n_cached == 2


def test_invalid_logits_fail_only_that_request():
    s = Scheduler(KVManager(8, BS))
    a, b = req(5), req(5, first=50)
    s.add(a)
    s.add(b)
    _, events = step(s, token_of=lambda r: -1 if r is a else 7)
    assert isinstance(a.error, InvalidLogits) and a.state is State.DONE and b.state is State.RUNNING


def test_second_turn_hits_the_cache_with_generated_tokens_too():
    kv = KVManager(16, BS)
    s = Scheduler(kv)
    first = req(40, max_tokens=40)
    s.add(first)
    while first.state is not State.DONE:
        step(s, token_of=lambda r: 3)
    history = first.tokens[:-1]  # 40 prompt + 39 computed answer tokens
    second = Request(history + [5, 6, 7], GenerationConfig(max_tokens=2), Text())
    s.add(second)
    plan, _ = step(s)
    assert second.cached_tokens == 64 and plan.rows[0].tolist() == [history[64], 0, 64]
    assert kv.cache.stats["hit_tokens"] >= 64


@pytest.mark.parametrize("seed", range(5))
def test_random_traffic_keeps_the_pool_consistent(seed):
    rng = np.random.default_rng(seed)
    kv = KVManager(20, BS)
    s = Scheduler(kv, max_batch=4, max_chunk=48)
    live = []
    for i in range(150):
        if rng.random() < 0.3:
            r = req(int(rng.integers(1, 90)), max_tokens=int(rng.integers(1, 40)), first=int(rng.integers(0, 3)) * 7)
            s.add(r)
            live.append(r)
        if rng.random() < 0.05 and live:
            live[int(rng.integers(len(live)))].cancel_requested = True
        step(s, token_of=lambda r: int(rng.integers(0, 100)))
        s.drain_events()
        kv.check([r.id for r in s.running])
    while s.has_work():
        step(s, token_of=lambda r: 1)
    assert all(r.state is State.DONE for r in live)
    kv.check([])
    assert kv.available() == 20


def test_the_scheduler_imports_no_compiled_extension():
    """It decides steps and never runs them: neither scheduler.py nor any rase module it imports
    at module level (followed transitively) imports rase.kernels._kernels."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    seen, todo = set(), ["rase.engine.scheduler"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = root / f"{name.replace('.', '/')}.py"
        package = name.rpartition(".")[0]
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                mods = [f"{base}.{node.module}"] if node.module else [f"{base}.{a.name}" for a in node.names]
                todo += [m for m in mods if (root / f"{m.replace('.', '/')}.py").exists()]
                assert not any(m.endswith("._kernels") for m in mods) and not any(a.name == "_kernels" for a in node.names), name
    assert {"rase.engine.scheduler", "rase.engine.kv_manager", "rase.engine.request", "rase.engine.sampling"} <= seen


def test_the_scheduler_reads_no_clock_and_a_request_holds_no_memory():
    """Time is an argument of next_step and update (tests drive it with made-up times); a
    request's blocks, trie nodes, state slot and draft blocks are the KV manager's, by id."""
    import ast
    import dataclasses
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / "rase" / "engine" / "scheduler.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"time", "datetime"}
    fields = {f.name for f in dataclasses.fields(Request)}
    assert not fields & {"table", "nodes", "reserved", "cache_chain", "slot", "lookup", "blocks"}
    assert {"prompt", "config", "tokens", "n_computed", "sampler", "constraint", "handle"} <= fields
