"""The decoder families of tests/fixtures/archs (tiny random-weight files of qwen2, phi3, gemma,
gemma2, olmo2, Mixtral-style llama, qwen3moe, olmoe, and of the files users download first:
Llama 3.1+ rope_freqs, Llama linear and YaRN scaling, Phi-3.5/4 LongRoPE, SmolLM3, Granite 3; in
Q8_0 and Q4_K_M; gpt-oss in MXFP4 experts (llama.cpp's MXFP4_MOE) and Q8_0; with llama.cpp
0.3.36's outputs; see that folder's README) against llama.cpp.

Against the one-token (`-t1`) fixtures every teacher-forced logit equals llama.cpp's to the 4
stored decimals and every greedy continuation is identical, in all 30 files, MoE included (the
routers' F32 products in ggml_vec_dot_f32's order), LongRoPE's long factors past its original
context and its short ones at n_ctx 256; against the batched fixtures, llama.cpp's
batch-dependent rounding, the usual tolerances. The encoders' files are tests/engine/test_embeddings.py's."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rase import GGUFFile
from rase.engine.decoder import load_gguf_decoder
from rase.text.tokenizer import LocalTokenizer
from tests.support.conformance import Agreement, greedy_agreement, teacher_forced
from tests.support.models import ARCHS, ENCODERS, NAMES



def _fixture(name: str, t1: bool, variant: str = "") -> dict:
    return json.loads((ARCHS / f"{name}{variant}.llamacpp{'-t1' if t1 else ''}.json").read_text())


def test_every_architecture_is_here():
    archs = {GGUFFile(ARCHS / f"{n}.gguf").architecture for n in NAMES}
    assert len(NAMES) == 34 and archs == {"qwen2", "phi3", "gemma", "gemma2", "olmo2", "llama", "qwen3moe", "olmoe",
                                          "smollm3", "granite", "gpt-oss", "lfm2", "qwen35"}
    assert len(ENCODERS) == 4 and {GGUFFile(ARCHS / f"{n}.gguf").architecture for n in ENCODERS} == {"bert", "nomic-bert"}
    assert len(list(ARCHS.glob("*.gguf"))) == len(NAMES) + len(ENCODERS)


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


@pytest.mark.parametrize("name", ["phi3-longrope-tiny-q8_0", "phi3-longrope-tiny-q4_k_m"])
def test_longrope_switches_on_the_context(name):
    """LongRoPE's factors follow the context a model is loaded for, as in llama.cpp: at n_ctx 2048
    (above the original 256) the long ones, through positions past 256 (the 6th prompt reaches
    305), at n_ctx 256 the short ones; each equals llama.cpp's one-token logits at that context."""
    long_fx, short_fx = _fixture(name, True), _fixture(name, True, ".n256")
    assert long_fx["n_ctx"] == 2048 and short_fx["n_ctx"] == 256
    assert max(len(p["ids"]) for p in long_fx["prompts"]) > 300
    for fx, n_ctx in ((long_fx, 2048), (short_fx, 256)):
        a = Agreement()
        dec = load_gguf_decoder(None, ARCHS / f"{name}.gguf", n_ctx=n_ctx)
        teacher_forced(dec, fx, a)
        greedy_agreement(dec, fx, a)
        assert a.exact == a.positions and a.max_rounded_err < 1e-9 and a.greedy_equal == a.prompts, (n_ctx, a)
    # the two contexts really differ: the long factors' logits are not the short ones'
    ids = short_fx["prompts"][2]["ids"]
    short = load_gguf_decoder(None, ARCHS / f"{name}.gguf", n_ctx=256).prefill(ids, all_logits=True)
    long = load_gguf_decoder(None, ARCHS / f"{name}.gguf", n_ctx=2048).prefill(ids, all_logits=True)
    assert np.abs(short - long).max() > 0.5


def test_batched_fixture_within_tolerance(arch):
    name, dec = arch
    a = Agreement()
    teacher_forced(dec, _fixture(name, False), a)
    print(f"{name}: near {a.near_rate:.4f} exact {a.exact_rate:.4f} max logit diff {a.max_logit_err:.4f}")
    assert a.near == a.positions and a.exact_rate >= 0.95


def test_each_hyper_parameter_is_declared_once_and_reaches_the_c_forward():
    """A hyper-parameter is a field of HParams (what the file says) or of ModelSpec (what the
    architecture says), never both; forward_params hands every one the C forward takes
    (_model.h: RASE_HPARAMS) to _kernels.Weights by name, so neither the layout nor the Cython
    copy names them again."""
    from dataclasses import fields

    from rase.kernels import _kernels
    from rase.models import ARCHITECTURES
    from rase.models.base import ForwardLayout, HParams, ModelSpec, forward_params
    from rase.store.plan import load_plan

    c_names = set(_kernels.hparam_names())
    from_file, from_arch = {f.name for f in fields(HParams)}, {f.name for f in fields(ModelSpec)}
    assert not from_file & from_arch
    assert c_names <= from_file | from_arch | {"n_ctx"}  # n_ctx: the plan's, not the file's context_length
    assert not c_names & {f.name for f in fields(ForwardLayout)}
    gating = {"softmax": 0, "softmax_weight": 1}  # RASE_GATING_*
    for name in ("llama3-tiny-q8_0", "qwen35-tiny-q8_0", "gpt-oss-tiny-mxfp4", "lfm2-tiny-q8_0", "bert-tiny-q8_0",
                 "granite-tiny-q8_0"):
        plan = load_plan(ARCHS / f"{name}.gguf", n_ctx=64)
        want = forward_params(plan.hparams, ARCHITECTURES[plan.architecture].spec(plan.gguf, plan.hparams), 64)
        held = plan.weights.params  # read back from the C struct
        assert set(held) == c_names and held["n_ctx"] == 64
        for k in c_names:
            value = gating[want[k]] if k == "expert_gating" else want[k]
            assert held[k] == (np.float32(value) if isinstance(value, float) else int(value)), (name, k)
