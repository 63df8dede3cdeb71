"""Forward.step, the batched forward: a sequence's logits are bit-identical whatever else
shares its steps (other sequences at other positions, prefill chunks of any size, decode rows),
whichever pool blocks hold its K/V, and whatever the thread count. The reference is the same
sequence fed alone, one token per step (the one-token numerics, llama.cpp's n_batch = 1)."""
from __future__ import annotations

import numpy as np
import pytest

from rase import QuantType
from rase.kernels import _kernels
from rase.engine.decoder import GGUFDecoder
from rase.store.plan import load_plan
from tests.support.tinymodels import ARCH_FEATURES

BS = _kernels.KV_BLOCK


def alone(plan, prompt: list[int], threads: int = 1) -> np.ndarray:
    """Logits at every position of prompt, fed one token per step."""
    fwd = _kernels.Forward(plan.weights, -(-len(prompt) // BS), 1, threads)
    table = np.arange(fwd.n_blocks, dtype=np.int32).reshape(1, -1)
    out = []
    for pos, tok in enumerate(prompt):
        _, logits = fwd.step(np.array([[tok, 0, pos]], np.int32), table, np.array([0], np.int32),
                             slots=np.zeros(1, np.int32))
        out.append(logits[0].copy())
    return np.array(out)


def mixed(plan, prompts: list[list[int]], seed: int, threads: int, max_rows: int = 40,
          every: int = 1) -> list[np.ndarray]:
    """Every prompt through random steps: each step takes a random chunk (1..12 positions) from
    a random subset of the unfinished sequences, rows shuffled; blocks scattered in the pool.
    Logits of positions p % every == 0 (the others stay 0)."""
    rng = np.random.default_rng(seed)
    need = [-(-len(p) // BS) for p in prompts]
    pool = rng.permutation(sum(need) + 7).astype(np.int32)  # 7 blocks nobody uses
    tables = np.zeros((len(prompts), max(need)), np.int32)
    at = 0
    for s, n in enumerate(need):
        tables[s, :n] = pool[at:at + n]
        at += n
    fwd = _kernels.Forward(plan.weights, len(pool), max_rows, threads, len(prompts))  # a state slot each
    done = [0] * len(prompts)
    logits = [np.zeros((len(p), plan.vocab_size), np.float32) for p in prompts]
    while any(d < len(p) for d, p in zip(done, prompts)):
        live = [s for s, p in enumerate(prompts) if done[s] < len(p)]
        rows = []
        for s in rng.choice(live, rng.integers(1, len(live) + 1), replace=False):
            take = min(int(rng.integers(1, 13)), len(prompts[s]) - done[s], max_rows - len(rows))
            rows += [(prompts[s][p], s, p) for p in range(done[s], done[s] + take)]
            done[s] += take
            if len(rows) == max_rows:
                break
        rows = np.array(rows, np.int32)[rng.permutation(len(rows))]
        wanted = np.flatnonzero(rows[:, 2] % every == 0).astype(np.int32)
        _, out = fwd.step(np.ascontiguousarray(rows), tables, wanted, slots=np.arange(len(prompts), dtype=np.int32))
        for (tok, s, p), row in zip(rows[wanted], out):
            logits[s][p] = row
    return logits


def _prompts(rng, n_vocab: int, lengths) -> list[list[int]]:
    return [rng.integers(0, n_vocab, n).tolist() for n in lengths]


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
@pytest.mark.parametrize("arch", list(ARCH_FEATURES))
def test_batched_steps_equal_each_sequence_alone(tiny_models, arch, qtype, isa):
    previous = _kernels.get_isa()
    _kernels.set_isa(isa)
    try:
        plan = load_plan(tiny_models(arch, qtype))
        prompts = _prompts(np.random.default_rng(int(qtype)), plan.vocab_size, [40, 7, 63, 1, 33])
        want = [alone(plan, p) for p in prompts]
        for seed, threads in ((0, 1), (1, 2), (2, 3)):
            got = mixed(plan, prompts, seed, threads)
            for s, (g, w) in enumerate(zip(got, want)):
                assert np.array_equal(g, w), (seed, threads, s)
    finally:
        _kernels.set_isa(previous)


@pytest.mark.needs_model
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_models_batched_equal_alone(request, model):
    """SmolLM2 and Gemma3 (its 512-position sliding window crossed by a 600-token prompt):
    every sequence's logits in mixed steps equal its own single-sequence prefill and decode."""
    plan = load_plan(request.getfixturevalue(f"{model}_path"), n_ctx=1024)
    rng = np.random.default_rng(7)
    lengths = [600, 45, 3, 70] if model == "gemma3" else [45, 3, 70, 33]
    prompts = _prompts(rng, min(plan.vocab_size, 30000), lengths)
    dec = GGUFDecoder(plan, n_threads=2)
    every = 5 if model == "gemma3" else 1  # Gemma's 262144-token LM head is most of the cost
    want = [dec.prefill(p, all_logits=True) for p in prompts]
    # the decoder's prefill itself equals token-by-token feeding (checked on a short prompt)
    assert np.array_equal(alone(plan, prompts[1], threads=2), want[1])
    for w in want:
        w[np.arange(len(w)) % every != 0] = 0
    got = mixed(plan, prompts, seed=5, threads=2, max_rows=64, every=every)
    for s, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), s


def test_sampling_inside_the_step_equals_sampling_alone(tiny_models):
    """Rows sampled inside the step (each with its own sampler and RNG) draw the tokens the
    same samplers draw from the same logits outside it."""
    plan = load_plan(tiny_models("llama", QuantType.Q8_0))
    fwd = _kernels.Forward(plan.weights, 4, 8, 2)
    rows = np.array([[5, 0, 0], [9, 1, 0], [11, 2, 0], [12, 3, 0]], np.int32)
    tables = np.arange(4, dtype=np.int32).reshape(4, 1)
    make = lambda seed, temp: _kernels.Sampler(plan.vocab_size, temp, 20, 0.9, 0.0, 1.0, 0.0, 0.0, seed)
    configs = [(1, 0.8), (2, 0.0), (3, 1.3), (1, 0.8)]
    inside, logits = fwd.step(rows, tables, np.arange(4, dtype=np.int32), [make(*c) for c in configs])
    outside = [make(*c).sample(logits[j]) for j, c in enumerate(configs)]
    assert inside.tolist() == outside


@pytest.mark.parametrize("name", ["qwen2-tiny-q4_k_m", "gemma2-tiny-q8_0", "qwen3moe-tiny-q4_k_m",
                                  "olmoe-tiny-q8_0", "llama-moe-tiny-q4_k_m", "llama3-tiny-q4_k_m",
                                  "llama-yarn-tiny-q8_0", "phi3-longrope-tiny-q4_k_m", "smollm3-tiny-q8_0",
                                  "granite-tiny-q4_k_m", "gpt-oss-tiny-mxfp4", "lfm2-tiny-q4_k_m", "lfm2-tiny-q8_0",
                                  "qwen35-tiny-q4_k_m", "qwen35-tiny-q8_0"])
def test_llamacpp_quantized_architectures_batched_equal_alone(name):
    """Files made by llama.cpp's quantizer, dense and MoE (tests/fixtures/archs): a sequence's
    logits in mixed steps, at 1 and 2 threads, equal it fed alone; in a MoE layer the other rows
    of a step choose other experts and change how the pairs are grouped, never the bits."""
    from tests.support.models import ARCHS

    plan = load_plan(ARCHS / f"{name}.gguf", n_ctx=256)
    prompts = _prompts(np.random.default_rng(3), plan.vocab_size, [70, 9, 41, 1, 25])
    want = [alone(plan, p) for p in prompts]
    for seed, threads in ((0, 1), (1, 2)):
        got = mixed(plan, prompts, seed, threads)
        for s, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(g, w), (seed, threads, s)
