"""Agreement with llama.cpp (0.3.36, through llama-cpp-python) on the same GGUF files, from the
fixtures it produced: teacher-forced logits at every prompt position and 32-token greedy
continuations. Bars from the core issue: >= 99.5% of positions within 0.5 logit of llama.cpp's
best, >= 95% exact top-1, and equal greedy continuations for >= 4 of 5 prompts."""
from __future__ import annotations

import pytest

from rase.decoder import load_gguf_decoder
from tests.conftest import QWEN3_TINY
from tests.conformance import Agreement, greedy_agreement, load_fixture, teacher_forced

MODELS = {
    "smollm2-135m-instruct-q4_1": lambda r: r.getfixturevalue("smollm2_path"),
    "gemma3-270m-q4_k_m": lambda r: r.getfixturevalue("gemma3_path"),
    "qwen3-tiny-q8_0": lambda r: QWEN3_TINY / "qwen3-tiny-q8_0.gguf",
    "qwen3-tiny-q4_k_m": lambda r: QWEN3_TINY / "qwen3-tiny-q4_k_m.gguf",
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def agreement(request) -> tuple[str, Agreement]:
    name = request.param
    fixture = load_fixture(name)
    decoder = load_gguf_decoder(None, MODELS[name](request))
    result = Agreement()
    teacher_forced(decoder, fixture, result)
    greedy_agreement(decoder, fixture, result)
    return name, result


def test_token_ids_of_the_prompts_are_in_range(agreement):
    name, result = agreement
    assert result.positions > 50 and result.prompts == 5


def test_teacher_forced_top1(agreement):
    name, a = agreement
    print(f"{name}: near {a.near_rate:.4f} exact {a.exact_rate:.4f} max logit diff {a.max_logit_err:.4f}")
    assert a.near_rate >= 0.995, f"{name}: only {a.near_rate:.3f} of positions within 0.5 logit"
    assert a.exact_rate >= 0.95, f"{name}: exact top-1 at {a.exact_rate:.3f} of positions"


def test_greedy_continuations(agreement):
    name, a = agreement
    diverged = [(ours[:12], ref[:12]) for equal, ours, ref in a.details if not equal]
    assert a.greedy_equal >= 4, f"{name}: {a.greedy_equal}/5 equal; diverged: {diverged}"


def test_real_model_prefill_equals_token_by_token_and_thread_counts(smollm2_path):
    """The same greedy continuation whether the prompt is prefilled at once or fed token by
    token; and 1 and 2 threads give bit-identical logits."""
    import numpy as np

    prompt = load_fixture("smollm2-135m-instruct-q4_1")["prompts"][1]["ids"]
    one, two = (load_gguf_decoder(None, smollm2_path, n_threads=n) for n in (1, 2))
    assert np.array_equal(one.prefill(prompt, all_logits=True), two.prefill(prompt, all_logits=True))

    def continuation(dec, first_logits):
        out, logits = [], first_logits
        for _ in range(16):
            out.append(int(np.argmax(logits)))
            logits = dec.decode(out[-1])
        return out

    batch = continuation(two, two.prefill(prompt))
    logits = two.prefill(prompt[:1])
    for tok in prompt[1:]:
        logits = two.decode(tok)
    assert continuation(two, logits) == batch
