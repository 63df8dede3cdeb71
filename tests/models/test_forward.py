"""The C forward against the numpy spec (tests/support/reference.py) on tiny synthetic models, for
every architecture x weight type, on both ISA paths; determinism; limits and refusals."""
from __future__ import annotations

import time

import numpy as np
import pytest

from rase import (
    ContextOverflow, CorruptModelFile, InvalidRequest, QuantType, UnsupportedArchitecture,
)
from rase.kernels import _kernels
from rase.engine.decoder import GGUFDecoder, load_gguf_decoder
from tests.support.reference import Reference
from tests.support.tinymodels import ARCH_FEATURES, HP, TOKENS

ARCHS = list(ARCH_FEATURES)


def _first_bad_layer(dec: GGUFDecoder, ref: Reference, tokens: list[int]) -> str:
    trace = np.zeros((dec.hparams.n_layer, len(tokens), dec.hparams.n_embd), np.float32)
    dec._fwd.run(np.array(tokens, np.int32), 0, 1, trace)
    for i, want in enumerate(ref.trace):
        err = np.abs(trace[i] - want).max() / np.abs(want).max()
        if err > 0.03:
            return f"first divergence after layer {i}: relative error {err:.4f}"
    return "layers agree; divergence in the output head"


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_numpy_spec(tiny_models, arch, qtype, isa):
    path = tiny_models(arch, qtype)
    ref = Reference(path)
    want = ref.forward(TOKENS)
    previous = _kernels.get_isa()
    _kernels.set_isa(isa)
    try:
        dec = load_gguf_decoder(None, path)
        got = dec.prefill(TOKENS, all_logits=True)
        # 8-bit activations make single positions of a random model jump (a rounding flip is
        # amplified); a wrong kernel or layer spec moves every position.
        err = np.abs(got - want).max(axis=1) / np.abs(want).max()
        top1 = np.mean(got.argmax(axis=1) == want.argmax(axis=1))
        ok = np.median(err) <= 0.03 and np.mean(err <= 0.05) >= 0.8 and top1 >= 0.8
        assert ok, (f"median {np.median(err):.4f}, within 5%: {np.mean(err <= 0.05):.2f}, "
                    f"top-1 {top1:.2f}; {_first_bad_layer(dec, ref, TOKENS)}")
    finally:
        _kernels.set_isa(previous)


def test_the_isa_is_fixed_in_the_plan_at_load(tiny_models):
    """A plan runs the kernel path selected when it was loaded; set_isa afterwards changes new
    plans only (a serving model never switches kernels between two steps)."""
    path = tiny_models("llama", QuantType.Q4_K)
    previous = _kernels.get_isa()
    _kernels.set_isa("scalar")
    try:
        scalar = load_gguf_decoder(None, path)
        want = scalar.prefill(TOKENS, all_logits=True)
        _kernels.set_isa(_kernels.isa_best())
        assert scalar.plan.weights.isa == "scalar"
        assert np.array_equal(scalar.prefill(TOKENS, all_logits=True), want)
        assert load_gguf_decoder(None, path).plan.weights.isa == _kernels.isa_best()
    finally:
        _kernels.set_isa(previous)


def test_the_prefetch_distance_does_not_change_logits(tiny_models):
    path = tiny_models("llama", QuantType.Q4_K)
    before = _kernels.get_prefetch()
    try:
        got = []
        for nbytes in (0, 4096):
            _kernels.set_prefetch(nbytes)
            dec = load_gguf_decoder(None, path, n_threads=2)
            got.append((dec.prefill(TOKENS, all_logits=True), dec.decode(TOKENS[0])))
        assert np.array_equal(got[0][0], got[1][0]) and np.array_equal(got[0][1], got[1][1])
    finally:
        _kernels.set_prefetch(before)


@pytest.mark.parametrize("arch", ARCHS)
def test_thread_count_does_not_change_logits(tiny_models, arch):
    path = tiny_models(arch, QuantType.Q4_K)
    one = load_gguf_decoder(None, path, n_threads=1).prefill(TOKENS, all_logits=True)
    two = load_gguf_decoder(None, path, n_threads=2).prefill(TOKENS, all_logits=True)
    three = load_gguf_decoder(None, path, n_threads=3).prefill(TOKENS, all_logits=True)
    assert np.array_equal(one, two) and np.array_equal(one, three)
    # one row: each thread serves its own run of query heads, cut at other heads per count
    for n in (2, 3):
        dec = load_gguf_decoder(None, path, n_threads=n)
        steps = [dec.prefill(TOKENS[:1])] + [dec.decode(t) for t in TOKENS[1:]]
        assert np.array_equal(np.array(steps), one), n


@pytest.mark.parametrize("isa", [i for i in _kernels.isa_supported() if i != "scalar"])
@pytest.mark.parametrize("arch,heads,kv_heads", [("llama", 6, 3), ("llama", 4, 1), ("llama", 12, 2), ("gemma2", 4, 1),
                                                ("gpt-oss", 4, 1)])
def test_long_decode_split_over_threads_keeps_the_bits(tmp_path, isa, arch, heads, kv_heads):
    """Past 512 keys a decode step splits each KV head's queries over the threads (keys for the
    scores, head elements for P.V) when the heads do not divide evenly: 3 KV heads on 2 threads,
    1 on 2-4, two groups of 6 queries on 3; gemma2 adds the score soft-cap and window layers,
    gpt-oss attention sinks (in the split softmax's sum) and its window layers.
    Every thread count gives the one-thread logits, and those equal a prefill of the same tokens."""
    from tests.support.tinymodels import write_tiny_model

    path = write_tiny_model(tmp_path / "m.gguf", arch, QuantType.Q8_0,
                            hp=dict(n_ctx=700, n_head=heads, n_head_kv=kv_heads, head_dim=64, n_embd=64 * heads))
    ids = [int(t) for t in np.random.default_rng(heads * 10 + kv_heads).integers(1, HP["n_vocab"], 606)]
    previous = _kernels.get_isa()
    _kernels.set_isa(isa)
    try:
        whole = load_gguf_decoder(None, path).prefill(ids, all_logits=True)[600:]
        for n in (1, 2, 3, 4):
            dec = load_gguf_decoder(None, path, n_threads=n)
            steps = [dec.prefill(ids[:601])] + [dec.decode(t) for t in ids[601:]]
            assert np.array_equal(np.array(steps), whole), n
    finally:
        _kernels.set_isa(previous)


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_chunking_and_decode_agree_bit_for_bit(tiny_models, arch, qtype, isa):
    """One arithmetic per position: a prompt prefilled at once, in chunks of 1..7, or decoded
    token by token gives identical logits at every position (the one-token numerics)."""
    path = tiny_models(arch, qtype)
    previous = _kernels.get_isa()
    _kernels.set_isa(isa)
    try:
        whole = load_gguf_decoder(None, path).prefill(TOKENS, all_logits=True)
        for chunk in (1, 3, 7):
            chunked = load_gguf_decoder(None, path, chunk=chunk).prefill(TOKENS, all_logits=True)
            assert np.array_equal(whole, chunked), chunk
        dec = load_gguf_decoder(None, path)
        steps = [dec.prefill(TOKENS[:1])] + [dec.decode(t) for t in TOKENS[1:]]
        assert np.array_equal(np.array(steps), whole)
    finally:
        _kernels.set_isa(previous)


def test_decode_after_prefill_continues_positions(tiny_models):
    path = tiny_models("qwen3", QuantType.Q8_0)
    dec = load_gguf_decoder(None, path)
    full = dec.prefill(TOKENS, all_logits=True)
    dec.prefill(TOKENS[:10])
    assert dec.position == 10
    for i, t in enumerate(TOKENS[10:], start=10):
        got = dec.decode(t)
        assert dec.position == i + 1
        assert int(np.argmax(got)) == int(np.argmax(full[i]))


def test_step_ns_counts_the_c_steps_within_the_callers_time(tiny_models):

    dec = load_gguf_decoder(None, tiny_models("llama", QuantType.Q8_0))
    before = dec._fwd.step_ns
    t0 = time.perf_counter_ns()
    dec.prefill(TOKENS[:4])
    for t in TOKENS[4:]:
        dec.decode(t)
    wall = time.perf_counter_ns() - t0
    spent = dec._fwd.step_ns - before
    assert 0 < spent <= wall  # 13 steps ran in C, inside the caller's wall time


def test_logits_contract(tiny_models):
    dec = load_gguf_decoder("llama3", tiny_models("llama", QuantType.Q4_0))
    out = dec.prefill([1, 2, 3])
    assert out.dtype == np.float32 and out.shape == (HP["n_vocab"],)
    assert dec.decode(4).shape == (HP["n_vocab"],)
    assert dec.eos_token == 2 and dec.vocab_size == HP["n_vocab"]


def test_context_overflow(tiny_models):
    dec = load_gguf_decoder(None, tiny_models("llama", QuantType.Q8_0), n_ctx=8)
    with pytest.raises(ContextOverflow, match="context of 8"):
        dec.prefill(list(range(9)))
    dec.prefill(list(range(7)))
    dec.decode(1)
    with pytest.raises(ContextOverflow):
        dec.decode(2)
    assert dec.position == 8  # the refused token changed nothing


def test_default_context_is_the_models(tiny_models):
    assert load_gguf_decoder(None, tiny_models("llama", QuantType.Q8_0)).n_ctx == HP["n_ctx"]


def test_bad_tokens_and_empty_prompt(tiny_models):
    dec = load_gguf_decoder(None, tiny_models("llama", QuantType.Q8_0))
    with pytest.raises(InvalidRequest, match="at least one token"):
        dec.prefill([])
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        dec.prefill([1, HP["n_vocab"]])
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        dec.decode(-1)


@pytest.mark.parametrize("name,fragment", [
    ("phi2", "use a Phi-3 or Phi-4 GGUF"), ("phi", "use a Phi-3 or Phi-4 GGUF"),
    ("qwen", "use a Qwen2.5 or Qwen3 GGUF"), ("qwen2moe", "shared experts"),
    ("qwen35moe", "use a dense Qwen3.5 GGUF"), ("lfm2moe", "use a dense LFM2 GGUF"),
    ("mamba", "supported: "), ("", "supported: "),
])
def test_refused_architectures(tiny_models, name, fragment):
    with pytest.raises(UnsupportedArchitecture, match=fragment):
        load_gguf_decoder(name, tiny_models("llama", QuantType.Q8_0))


@pytest.mark.parametrize("alias", ["llama", "LLAMA2", "llama3", "mistral", "llama-gguf"])
def test_llama_aliases(tiny_models, alias):
    assert load_gguf_decoder(alias, tiny_models("llama", QuantType.Q8_0)).architecture == "llama"


@pytest.mark.parametrize("declared", ["qwen3", "qwen2", "Qwen2.5", "phi3", "phi4", "olmoe"])
def test_declared_architecture_must_match_the_file(tiny_models, declared):
    with pytest.raises(UnsupportedArchitecture, match="the file declares 'llama'"):
        load_gguf_decoder(declared, tiny_models("llama", QuantType.Q8_0))


@pytest.mark.parametrize("alias,arch", [("qwen2.5", "qwen2"), ("phi4", "phi3"), ("mixtral", "llama")])
def test_new_aliases(tiny_models, alias, arch):
    path = tiny_models("llama-moe" if arch == "llama" else arch, QuantType.Q8_0)
    assert load_gguf_decoder(alias, path).architecture == arch


def _with_extra_tensor(tmp_path, arch: str, name: str, data: np.ndarray):
    from tests.support.ggufbuild import rewrite_gguf
    from tests.support.tinymodels import write_tiny_model

    base = write_tiny_model(tmp_path / "m.gguf", arch, QuantType.Q8_0)
    return rewrite_gguf(base, tmp_path / "extra.gguf", add_tensors={name: data})


@pytest.mark.parametrize("arch,name,fragment", [
    ("llama", "blk.0.attn_sinks.weight", "'blk.0.attn_sinks.weight' has no place"),
    ("llama-moe", "blk.0.ffn_gate_inp.bias", "'blk.0.ffn_gate_inp.bias' has no place"),
    ("llama", "blk.7.attn_q.weight", "'blk.7.attn_q.weight' has no place"),
    ("llama-moe", "blk.0.ffn_gate_shexp.weight", "shared experts"),
    ("qwen2", "rope_freqs.weight", "RoPE frequency factors"),
])
def test_tensors_with_no_place_in_the_forward_are_refused(tmp_path, arch, name, fragment):
    """Every tensor of a file is used or the file is refused by name (nothing silently ignored)."""
    path = _with_extra_tensor(tmp_path, arch, name, np.zeros(HP["n_embd"], np.float32))
    with pytest.raises(UnsupportedArchitecture, match=fragment):
        load_gguf_decoder(None, path)


def test_rope_freqs_are_used_and_checked(tmp_path, tiny_models):
    """A llama file's rope_freqs divide its RoPE frequencies (Llama 3.1+): factors of 1 change no
    bit, others change the logits; factors of the wrong length or zero are a corrupt file."""
    plain = load_gguf_decoder(None, tiny_models("llama", QuantType.Q8_0)).prefill(TOKENS, all_logits=True)
    half = HP["head_dim"] // 2
    for name, factors, same in (("ones", np.ones(half), True), ("llama3", np.linspace(1, 8, half), False)):
        (tmp_path / name).mkdir()
        path = _with_extra_tensor(tmp_path / name, "llama", "rope_freqs.weight", factors.astype(np.float32))
        assert np.array_equal(load_gguf_decoder(None, path).prefill(TOKENS, all_logits=True), plain) == same
    for name, factors in (("short", np.ones(half - 1)), ("zero", np.zeros(half))):
        (tmp_path / name).mkdir()
        path = _with_extra_tensor(tmp_path / name, "llama", "rope_freqs.weight", factors.astype(np.float32))
        with pytest.raises(CorruptModelFile, match="RoPE factors"):
            load_gguf_decoder(None, path)


def test_optional_biases_are_used_and_checked(tmp_path, tiny_models):
    """A llama file with an attention-output bias runs with it (as llama.cpp's llama does); a
    bias of the wrong length is a corrupt file."""
    plain = load_gguf_decoder(None, tiny_models("llama", QuantType.Q8_0)).prefill(TOKENS[:4], all_logits=True)
    biased = _with_extra_tensor(tmp_path, "llama", "blk.0.attn_output.bias", np.full(HP["n_embd"], 0.5, np.float32))
    assert not np.array_equal(load_gguf_decoder(None, biased).prefill(TOKENS[:4], all_logits=True), plain)
    (tmp_path / "bad").mkdir()
    bad = _with_extra_tensor(tmp_path / "bad", "llama", "blk.0.attn_q.bias", np.zeros(7, np.float32))
    with pytest.raises(CorruptModelFile, match="blk.0.bq"):
        load_gguf_decoder(None, bad)


def test_missing_hyperparameter_is_a_corrupt_file(tmp_path):
    from tests.support.ggufbuild import GGUFSpec, Tensor

    spec = GGUFSpec(kvs=[("general.architecture", 8, "llama")],
                    tensors=[Tensor("token_embd.weight", (32, 4), 0, b"\0" * 512)])
    (tmp_path / "x.gguf").write_bytes(spec.build())
    with pytest.raises(CorruptModelFile, match="llama.embedding_length"):
        load_gguf_decoder(None, tmp_path / "x.gguf")


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: its final softcap runs after the LM head
def test_non_finite_logits_are_an_error_not_an_answer(tmp_path, tiny_models, arch):
    """A NaN scale in one row of the (tied) LM head makes that logit NaN: prefill (last or all
    positions) and decode raise InvalidLogits instead of returning it; the step's own check says
    so too. (A NaN in an activation would not do: its int8 quantization drops it, as ggml's does.)"""
    import shutil

    import gguf

    from rase import InvalidLogits

    good = load_gguf_decoder(None, tiny_models(arch, QuantType.Q8_0))
    good.prefill(TOKENS[:4])
    assert good._fwd.logits_finite and np.isfinite(good.decode(5)).all()
    path = shutil.copy(tiny_models(arch, QuantType.Q8_0), tmp_path / "nan.gguf")
    embd = next(t for t in gguf.GGUFReader(str(path), "r+").tensors if t.name == "token_embd.weight")
    embd.data[40, 0:2] = [0x00, 0x7E]  # row 40 (no token of the prompt), block 0: d = f16 NaN
    del embd
    dec = load_gguf_decoder(None, path)
    for call in (lambda: dec.prefill(TOKENS[:4]), lambda: dec.prefill(TOKENS[:4], all_logits=True),
                 lambda: dec.decode(5)):
        with pytest.raises(InvalidLogits, match="NaN or inf"):
            call()
        assert not dec._fwd.logits_finite
    out = dec._fwd.run(np.array(TOKENS[:4], np.int32), 0, 1)
    assert np.isnan(out[0, 40]) and np.isfinite(np.delete(out[0], 40)).all()


# ---------------------------------------------------------------- encoders (bert, nomic-bert)

def _encoder_hidden(plan, seqs: list[list[int]], threads: int) -> list[np.ndarray]:
    """Every sequence's final hidden states, all of them in one step (rows in position order)."""
    fwd = _kernels.Forward(plan.weights, 1, sum(map(len, seqs)), threads)
    rows = np.array([(t, s, p) for s, ids in enumerate(seqs) for p, t in enumerate(ids)], np.int32)
    fwd.step(rows, np.zeros((len(seqs), 1), np.int32), np.zeros(0, np.int32),
             embd_rows=np.arange(len(rows), dtype=np.int32))
    return np.split(fwd.hidden.copy(), np.cumsum([len(i) for i in seqs])[:-1])


def _encoder_ids(name: str) -> list[list[int]]:
    import json

    from tests.support.models import ARCHS

    return [t["ids"] for t in json.loads((ARCHS / f"{name}.llamacpp-embd.json").read_text())["texts"]]


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("name", ["bert-tiny-q8_0", "nomic-bert-tiny-q4_k_m"])
def test_encoder_forward_matches_numpy_spec(name, isa):
    """The C encoder (LayerNorms after the adds, token types, positions or RoPE, GELU or SwiGLU,
    attention over the whole input) against tests/support/reference.py's EncoderReference, every ISA."""
    from rase.store.plan import load_plan
    from tests.support.reference import EncoderReference
    from tests.support.models import ARCHS

    ids = _encoder_ids(name)[9]  # 23 tokens
    ref = EncoderReference(ARCHS / f"{name}.gguf")
    want = ref.hidden(ids)
    previous = _kernels.get_isa()
    _kernels.set_isa(isa)
    try:
        got = _encoder_hidden(load_plan(ARCHS / f"{name}.gguf"), [ids], 2)[0]
    finally:
        _kernels.set_isa(previous)
    err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert np.median(err) < 1e-5 and err.max() < 2e-3, err  # an 8-bit rounding may flip in a row


@pytest.mark.parametrize("name", ["bert-tiny-q4_k_m", "nomic-bert-tiny-q8_0"])
def test_encoder_rows_do_not_depend_on_threads_or_the_step(name):
    """An input's hidden states are the same bits alone on one thread as beside other inputs of
    other lengths in one step, on 2 and 3 threads."""
    from rase.store.plan import load_plan
    from tests.support.models import ARCHS

    plan = load_plan(ARCHS / f"{name}.gguf")
    seqs = _encoder_ids(name)
    alone = [_encoder_hidden(plan, [ids], 1)[0] for ids in seqs]
    for threads in (2, 3):
        for got, want in zip(_encoder_hidden(plan, seqs[::-1], threads), alone[::-1]):
            assert got.tobytes() == want.tobytes(), threads
    with pytest.raises(ValueError, match="whole in its step"):  # a sequence split across steps
        fwd = _kernels.Forward(plan.weights, 1, 8, 1)
        fwd.step(np.array([[101, 0, 1], [102, 0, 2]], np.int32), np.zeros((1, 1), np.int32), np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="no LM head"):
        _kernels.Forward(plan.weights, 1, 8, 1).step(np.array([[101, 0, 0]], np.int32), np.zeros((1, 1), np.int32),
                                                     np.zeros(1, np.int32))
