"""The eight architectures of tests/fixtures/archs (tiny random-weight files of qwen2, phi3,
gemma, gemma2, olmo2, Mixtral-style llama, qwen3moe and olmoe, in Q8_0 and Q4_K_M, with llama.cpp
0.3.36's outputs; see that folder's README) against llama.cpp.

Against the one-token (`-t1`) fixtures every teacher-forced logit equals llama.cpp's to the 4
stored decimals and every greedy continuation is identical, in all 16 files, MoE included (the
routers' F32 products in ggml_vec_dot_f32's order); against the batched fixtures, llama.cpp's
batch-dependent rounding, the usual tolerances."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rase import GGUFFile
from rase.decoder import load_gguf_decoder
from rase.tokenizer import LocalTokenizer
from tests.conformance import Agreement, greedy_agreement, teacher_forced

ARCHS = Path(__file__).parent / "fixtures" / "archs"
NAMES = sorted(p.stem for p in ARCHS.glob("*.gguf"))


def _fixture(name: str, t1: bool) -> dict:
    return json.loads((ARCHS / f"{name}.llamacpp{'-t1' if t1 else ''}.json").read_text())


def test_every_architecture_is_here():
    archs = {GGUFFile(ARCHS / f"{n}.gguf").architecture for n in NAMES}
    assert len(NAMES) == 16 and archs == {"qwen2", "phi3", "gemma", "gemma2", "olmo2", "llama", "qwen3moe", "olmoe"}


@pytest.fixture(scope="module", params=NAMES)
def arch(request):
    return request.param, load_gguf_decoder(None, ARCHS / f"{request.param}.gguf")


def test_token_ids_equal_llamacpp(arch):
    name, _ = arch
    tok, fx = LocalTokenizer.from_gguf(GGUFFile(ARCHS / f"{name}.gguf")), _fixture(name, True)
    for e in fx["tokenize"]:
        assert tok.encode(e["text"], add_special_tokens=True, parse_special=False) == e["ids"], e["text"]
    for e in fx["tokenize_special"]:  # no BOS added; <|im_start|> (the BOS token here) parsed
        assert tok.encode(e["text"], add_special_tokens=False, parse_special=True) == e["ids"], e["text"]
    for p in fx["prompts"]:
        assert tok.encode(p["text"], add_special_tokens=True, parse_special=p["special"]) == p["ids"]


def test_one_token_fixture(arch):
    name, dec = arch
    a = Agreement()
    teacher_forced(dec, _fixture(name, True), a)
    greedy_agreement(dec, _fixture(name, True), a)
    print(f"{name}: max |ours - llama.cpp t1| {a.max_logit_err:.5f}, greedy {a.greedy_equal}/{a.prompts}")
    assert a.positions > 120 and a.exact == a.positions
    assert a.max_rounded_err < 1e-9, f"{name}: logits differ from llama.cpp's by {a.max_rounded_err}"
    assert a.greedy_equal == a.prompts, [(o[:8], r[:8]) for eq, o, r in a.details if not eq]


def test_batched_fixture_within_tolerance(arch):
    name, dec = arch
    a = Agreement()
    teacher_forced(dec, _fixture(name, False), a)
    print(f"{name}: near {a.near_rate:.4f} exact {a.exact_rate:.4f} max logit diff {a.max_logit_err:.4f}")
    assert a.near == a.positions and a.exact_rate >= 0.95
