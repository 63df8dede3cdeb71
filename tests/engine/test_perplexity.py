"""rase perplexity against llama.cpp on the same file and text: llama-perplexity's recorded runs
(tests/fixtures/perplexity.llamacpp.json) and llama-cpp-python's logits, computed in the test."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rase import InvalidRequest
from rase.engine.perplexity import perplexity
from rase.store.plan import load_plan
from rase.text.tokenizer import LocalTokenizer
from rase.engine.config import EngineConfig
from rase.engine.worker import ModelWorker
from tests.support import llamacpp_ref
from tests.support.servers import rase_command
from tests.support.conformance import llamacpp_order

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

FIX = Path(__file__).parents[1] / "fixtures"
REF = json.loads((FIX / "perplexity.llamacpp.json").read_text())
TEXT = (FIX / "perplexity.txt").read_text()
LONG = (FIX / "perplexity-long.txt").read_text()


def _ppl(path, n_ctx=128, text=TEXT):
    plan = load_plan(path, n_ctx=n_ctx)
    worker = ModelWorker(plan, EngineConfig(max_batch=1))
    try:
        return perplexity(worker, LocalTokenizer.from_gguf(plan.gguf), text, n_ctx), llamacpp_order(plan)
    finally:
        worker.close()


def _against_llamacpp(r, runs: dict, exact: bool, tokens: int, live=None) -> None:
    """Exactly llama-perplexity -b 1 -fa off where rase has llama.cpp's one-token numerics, and
    near its other runs (default: 0.6% of its flash-attention run; 0.5% of llama-cpp-python's
    batched logits, live). With block-sum numerics (Gemma3's Q5_0) the bar is llama.cpp's own
    spread, as for KL: within twice the largest difference between any two of its runs (one-token,
    batched, flash attention or not, live) of every one of them."""
    ref = runs["one-token"]
    assert r.tokens == tokens and len(r.chunks) == len(ref["chunks"])
    if exact:
        assert round(r.ppl, 4) == ref["ppl"] and round(r.error, 5) == ref["error"]
        assert [round(c, 4) for c in r.chunks] == ref["chunks"]
        assert abs(r.ppl / runs["default"]["ppl"] - 1) < 0.006
        assert live is None or abs(r.ppl / live - 1) < 0.005, (r.ppl, live)
        return
    theirs = [v["ppl"] for v in runs.values()] + ([live] if live else [])
    spread = max(theirs) / min(theirs) - 1
    worst = max(abs(r.ppl / x - 1) for x in theirs)
    print(f"PPL {r.ppl:.4f} vs llama.cpp's {theirs}: at most {worst:.3%} from one (theirs span {spread:.3%})")
    assert round(r.ppl, 4) != ref["ppl"]  # not llama.cpp's order: the tolerance is what binds
    assert worst <= 2 * spread


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_equal_to_llama_perplexity(request, model):
    """SmolLM2: llama.cpp's one-token numerics (-b 1, no flash attention) are rase's, so the same
    PPL, error and running values to the digits llama-perplexity prints; its default run (batched,
    flash attention) rounds differently, within 0.6% on this short text. Gemma3 (block-sum Q5_0):
    the spread bar of _against_llamacpp."""
    r, exact = _ppl(request.getfixturevalue(f"{model}_path"))
    _against_llamacpp(r, REF[model], exact, 2 * 63)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_equal_to_llama_perplexity_at_512_and_near_llama_cpp_python(request, model):
    """The default context on an 8 KB text, SmolLM2: exactly llama-perplexity -b 1 -fa off; within
    0.5% of llama.cpp's batched logits (llama-cpp-python, n_batch 512, no flash attention: this
    build's own kernels for this CPU). Gemma3 (block-sum Q5_0): the spread bar of _against_llamacpp;
    llama.cpp's own runs span 0.76% here."""
    path = request.getfixturevalue(f"{model}_path")
    r, exact = _ppl(path, 512, LONG)
    live = llamacpp_ref.perplexity(path, LONG, 512)
    assert len(live.chunks) == 3
    _against_llamacpp(r, REF["long"][model], exact, 3 * 255, live.ppl)
    if exact:
        assert abs(r.error / live.error - 1) < 0.01
    else:  # the error scales with the PPL, whose difference the spread bar bounds: compare error / PPL
        assert abs((r.error / r.ppl) / (live.error / live.ppl) - 1) < 0.01


def test_the_cli_and_its_refusals(smollm2_path, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = subprocess.run([*rase_command(), "perplexity", str(smollm2_path), str(text), "--ctx", "128"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Final estimate: PPL = 45.9274 +/- 12.28951" in out.stdout, out.stderr
    assert "[2/2]" in out.stderr
    short = subprocess.run([*rase_command(), "perplexity", str(smollm2_path), str(text)], capture_output=True,
                           text=True, timeout=300)
    assert short.returncode == 1 and "at least 2 x n_ctx" in short.stderr
    worker = ModelWorker(load_plan(smollm2_path, n_ctx=64), EngineConfig(max_batch=1))
    with pytest.raises(InvalidRequest):
        perplexity(worker, None, TEXT, 63)
    worker.close()


def test_perplexity_chunks_batch_with_generation_and_change_no_bit(smollm2_path):
    """The chunks are prompt-only requests of the model's worker: run while two chats stream on
    the same worker, they share its steps, and every chunk's -log p values, and so the PPL, are
    the bits they have alone (the chats' tokens too)."""
    import threading

    from rase.engine.sampling import GenerationConfig
    from rase.text.textstate import TextState

    plan = load_plan(smollm2_path, n_ctx=256)
    tok = LocalTokenizer.from_gguf(plan.gguf)
    worker = ModelWorker(plan, EngineConfig(max_batch=2))
    try:
        alone = perplexity(worker, tok, TEXT, 128)
        ids = tok.encode("Once upon a time", add_special_tokens=True, parse_special=False)
        chat = lambda: worker.submit(ids, GenerationConfig(max_tokens=48, temperature=0), TextState.for_tokenizer(tok))
        chats_alone = [chat().result().text for _ in range(2)]
        shared, next_step = [], worker.scheduler.next_step

        def recorded(now, drafts=None):  # steps holding a chat's decode row and a chunk's logits rows
            step = next_step(now, drafts)
            if step is not None and step.n_decode and any(r.collect is not None for r, _, _ in step.reads):
                shared.append(step)
            return step

        worker.scheduler.next_step = recorded
        handles = [chat() for _ in range(2)]
        both: list = []
        t = threading.Thread(target=lambda: both.append(perplexity(worker, tok, TEXT, 128)))
        t.start()
        texts = [h.result().text for h in handles]
        t.join()
        assert both[0] == alone and texts == chats_alone
        assert shared  # the chunks rode in the chats' steps
    finally:
        worker.close()
