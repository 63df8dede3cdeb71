"""Every fast kernel against its scalar reference and against numpy, over awkward shapes."""
from __future__ import annotations

import gguf  # test extra: the independent dequantizer we check against
import numpy as np
import pytest

from rase import QuantType
from rase.kernels import _kernels
from rase.kernels.quants import QUANT_BLOCKS
from tests.support.quant_blocks import lengths, random_blocks, row_and_values
from tests.support.reference import ACT_FORMAT, quantize_act


# The levels by position (rase/kernels/_simd.h): x86 scalar, avx2, avx512; aarch64 scalar, neon, dotprod.
# SIMD is the first SIMD level, WIDE the one above it (its kernels give SIMD's bits).
SIMD, WIDE = _kernels.isa_names()[1:3]
if SIMD not in _kernels.isa_supported():  # every machine kind rase is tested on has it: it must be tested
    pytest.fail(f"{SIMD} expected on this machine kind", pytrace=False)


@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_dot_avx2_matches_scalar_and_numpy(qtype):
    rng = np.random.default_rng(int(qtype))
    for n in lengths(qtype):
        w, deq = row_and_values(qtype, n, seed=n)
        deq = np.nan_to_num(deq, posinf=0, neginf=0)
        x = rng.standard_normal((4, n)).astype(np.float32)
        scalar = np.array(_kernels.vec_dot(int(qtype), w, x, "scalar"))
        avx2 = np.array(_kernels.vec_dot(int(qtype), w, x, SIMD))
        spec = quantize_act(x, ACT_FORMAT.get(int(qtype))) @ deq
        scale = np.abs(deq) @ np.abs(x).T  # sum |w x|: the size of rounding errors
        assert np.all(np.abs(avx2 - scalar) <= 1e-5 * scale + 1e-30), (n, avx2, scalar)
        # q8_1 keeps s = d * sum(q) in f16 (its rounding is the 1e-3 below)
        assert np.all(np.abs(avx2 - spec) <= 2e-3 * scale + 1e-30), (n, avx2, spec)


@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_dot_avx512_is_the_avx2_result_bit_for_bit(qtype):
    """The AVX-512 kernels compute the AVX2 kernels' exact integer sums, then the same floats.
    On a CPU without AVX-512 VNNI the path is refused before any of its instructions run."""
    if WIDE not in _kernels.isa_supported():
        w, _ = row_and_values(qtype, lengths(qtype)[0], seed=7)
        x = np.ones((1, lengths(qtype)[0]), np.float32)
        with pytest.raises(ValueError, match="not supported by this CPU"):
            _kernels.vec_dot(int(qtype), w, x, WIDE)
        return
    rng = np.random.default_rng(int(qtype) + 100)
    floats = qtype in (QuantType.F32, QuantType.F16, QuantType.BF16)
    for n in lengths(qtype) + ([107, 1000] if floats else []):  # float rows: the 8- and 1-element tails
        w, _ = row_and_values(qtype, n, seed=n + 7)
        for nt in range(1, 9):  # every tile the forward uses (up to RASE_NT = 8 tokens)
            x = (rng.standard_normal((nt, n)) * rng.uniform(0.01, 30)).astype(np.float32)
            avx2 = np.array(_kernels.vec_dot(int(qtype), w, x, SIMD), np.float32)
            avx512 = np.array(_kernels.vec_dot(int(qtype), w, x, WIDE), np.float32)
            assert avx512.tobytes() == avx2.tobytes(), (qtype, n, nt, avx512, avx2)


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_multi_token_dot_equals_single_token_bit_for_bit(qtype, isa):
    n = lengths(qtype)[-1]
    w, _ = row_and_values(qtype, n, seed=1)
    x = np.random.default_rng(2).standard_normal((8, n)).astype(np.float32)
    together = _kernels.vec_dot(int(qtype), w, x, isa)
    alone = [_kernels.vec_dot(int(qtype), w, x[i:i + 1], isa)[0] for i in range(8)]
    assert np.array(together, np.float32).tobytes() == np.array(alone, np.float32).tobytes()


@pytest.mark.parametrize("qtype", [QuantType.Q8_0, QuantType.Q4_1, QuantType.Q6_K], ids=lambda t: t.name)
def test_activation_quantizers_agree_across_isas(qtype):
    x = np.random.default_rng(3).standard_normal(1024).astype(np.float32) * 7
    x[5] = 0.0
    assert _kernels.quantize_activation(int(qtype), x, "scalar") == \
        _kernels.quantize_activation(int(qtype), x, SIMD)
    zeros = np.zeros(256, np.float32)
    assert set(_kernels.quantize_activation(int(qtype), zeros, SIMD)) <= {0}


def test_dot_shape_checks():
    w = np.zeros(34, np.uint8)
    with pytest.raises(ValueError, match="multiple of 32"):
        _kernels.vec_dot(8, w, np.zeros((1, 31), np.float32))
    with pytest.raises(ValueError, match="1..8 activation rows"):
        _kernels.vec_dot(8, w, np.zeros((9, 32), np.float32))
    with pytest.raises(ValueError, match="need 34 bytes"):
        _kernels.vec_dot(8, w[:30], np.zeros((1, 32), np.float32))


def _attention_spec(q, k, v, scale, j0, softcap=0.0, sink=-np.inf):
    """float64 softmax(scale q.k) v over rows j0.., sink: a logit only in the denominator"""
    kf, vf = k.view(np.float16).astype(np.float64), v.view(np.float16).astype(np.float64)
    s = kf[j0:] @ q.astype(np.float64) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    mx = max(s.max(), sink)
    p = np.exp(s - mx)
    return (p / (p.sum() + np.exp(sink - mx))) @ vf[j0:]


@pytest.mark.parametrize("hd", [32, 64, 128, 256, 40])
@pytest.mark.parametrize("n,j0", [(1, 0), (7, 0), (33, 0), (100, 37), (300, 0)])
def test_attention_against_scalar_and_spec(hd, n, j0):
    rng = np.random.default_rng(hd * 1000 + n)
    q = rng.standard_normal(hd).astype(np.float32)
    k = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    scale = np.float32(1 / np.sqrt(hd))
    spec = _attention_spec(q, k, v, scale, j0)
    for isa in _kernels.isa_supported():
        got = _kernels.attention(q[None, :], k, v, scale, j0, isa)[0]
        # the AVX2 path rounds q and the probabilities to f16, as llama.cpp does
        assert np.abs(got - spec).max() <= 4e-3 * np.abs(spec).max() + 1e-6, isa
    if WIDE in _kernels.isa_supported():  # zmm runs ymm's chains lane for lane: the same bits
        for g in (1, 2, 3, 4):
            qg = rng.standard_normal((g, hd)).astype(np.float32)
            wide = _kernels.attention(qg, k, v, scale, j0, WIDE)
            assert wide.tobytes() == _kernels.attention(qg, k, v, scale, j0, SIMD).tobytes(), g


@pytest.mark.parametrize("hd", [64, 128, 40])
@pytest.mark.parametrize("n,j0", [(1, 0), (33, 0), (100, 37)])
def test_attention_softcap(hd, n, j0):
    """Gemma 2's soft-capped scores (cap * tanh(s / cap) before the softmax): every ISA near the
    spec, AVX-512 bit for bit AVX2, and the cap binds (the uncapped result is far)."""
    rng = np.random.default_rng(hd + n)
    q = (rng.standard_normal((2, hd)) * 3).astype(np.float32)  # large scores, so a cap of 2 binds
    k = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    for h in range(2):
        spec = _attention_spec(q[h], k, v, 1.0, j0, softcap=2.0)
        for isa in _kernels.isa_supported():
            got = _kernels.attention(q[h:h + 1], k, v, 1.0, j0, isa, softcap=2.0)[0]
            assert np.abs(got - spec).max() <= 4e-3 * np.abs(spec).max() + 1e-6, isa
        if n > 1:
            assert np.abs(_attention_spec(q[h], k, v, 1.0, j0) - spec).max() > 0.05
    if WIDE in _kernels.isa_supported():
        assert _kernels.attention(q, k, v, 1.0, j0, WIDE, softcap=2.0).tobytes() == \
            _kernels.attention(q, k, v, 1.0, j0, SIMD, softcap=2.0).tobytes()


@pytest.mark.parametrize("n", [1, 7, 8, 33, 1536])
@pytest.mark.parametrize("gelu", [False, True])
def test_gate_avx2_matches_scalar_and_numpy(n, gelu):
    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) * 4).astype(np.float32)
    edges = [-12.0, 11.0, 0.0, -10.0, 10.0, 9.999, -9.999, 1e-7, -3e-6, 6e-5]  # GELU table edges, f16 subnormals
    g[: min(n, len(edges))] = edges[: min(n, len(edges))]
    u = rng.standard_normal(n).astype(np.float32)
    scalar, avx2 = _kernels.gate(g, u, gelu, "scalar"), _kernels.gate(g, u, gelu, SIMD)
    x = g.astype(np.float64)
    if gelu:
        act = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        tol = 2e-3  # llama.cpp's GELU goes through an f16 table
    else:
        act = x / (1 + np.exp(-x))
        tol = 1e-6
    spec = act * u
    assert np.abs(avx2 - spec).max() <= tol * (np.abs(spec).max() + 1)
    assert np.abs(avx2 - scalar).max() <= tol * (np.abs(spec).max() + 1)
    if gelu:  # the table lookup itself is exact: both paths give the same bits
        assert np.array_equal(avx2.view(np.uint32), scalar.view(np.uint32))


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n,n_rot", [(64, 64), (128, 64), (256, 256), (6, 4)])
def test_rope_avx2_matches_scalar_and_numpy(neox, n, n_rot):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    for pos in (0, 1, 17, 4095):
        scalar = _kernels.rope(x, pos, 10000.0, n_rot, neox, "scalar")
        avx2 = _kernels.rope(x, pos, 10000.0, n_rot, neox, SIMD)
        half = n_rot // 2
        theta = pos * 10000.0 ** (-2.0 * np.arange(half) / n_rot)
        a, b = (np.arange(half), np.arange(half) + half) if neox else (np.arange(half) * 2, np.arange(half) * 2 + 1)
        spec = x.astype(np.float64).copy()
        spec[a] = x[a] * np.cos(theta) - x[b] * np.sin(theta)
        spec[b] = x[a] * np.sin(theta) + x[b] * np.cos(theta)
        # ggml's theta recurrence in f32 drifts ~1e-7 per step: a few e-4 at position 4095
        assert np.abs(avx2 - spec).max() <= 2e-3 * max(1, pos / 1000)
        assert np.abs(avx2 - scalar).max() <= 1e-5 * np.abs(x).max()
        assert np.array_equal(avx2[n_rot:], x[n_rot:])


@pytest.mark.parametrize("isa", _kernels.isa_supported())
def test_chain_major_rows_are_the_transpose_numpy_gives(isa):
    """The F16 GEMM's activation rows (ACT_F32C): x seen as (n / 32, 32), transposed, whole 8 x 8
    blocks and the rows past them (n / 32 not a multiple of 8) alike."""
    rng = np.random.default_rng(11)
    for n in (32, 224, 256, 288, 576, 1536, 4096):
        x = rng.standard_normal(n).astype(np.float32)
        got = np.frombuffer(_kernels.quantize_activation(int(QuantType.F16), x, isa, gemm=True), np.float32)
        assert np.array_equal(got, x.reshape(-1, 32).T.ravel()), n


@pytest.mark.parametrize("isa", _kernels.isa_supported())
def test_kv_rows_round_to_f16_as_numpy_does(isa):
    """K/V rows enter the pool as f16, nearest-even (numpy's conversion): ties, the subnormal
    range, overflow to inf and a tail that is not a multiple of 8 included."""
    rng = np.random.default_rng(7)
    ties = (np.arange(1, 2049, dtype=np.float32) + 0.5) * np.float32(2.0 ** -10)  # halfway between f16s
    x = np.concatenate([rng.standard_normal(1000) * 10.0 ** rng.integers(-9, 6, 1000), ties,
                        [0.0, -0.0, 6.1e-5, 5.9e-8, 2.9e-8, -3.1e-8, 65504.0, 65519.0, 65520.0, -7e4, np.inf, -np.inf],
                        rng.standard_normal(5)]).astype(np.float32)
    got = _kernels.fp16_row(x, isa)
    with np.errstate(over="ignore"):  # the values past 65519.99 are meant to become inf
        want = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(got, want)
    assert np.array_equal(got, _kernels.fp16_row(x, "scalar"))


def test_vector_exp():
    x = np.concatenate([np.linspace(-110, 90, 4000), [0.0, -0.0, -np.inf, 1e-8, -87.5, 88.7, 126.0, -126.0]])
    x = np.resize(x, (len(x) + 7) // 8 * 8).astype(np.float32)
    got = _kernels.expf_avx2(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    finite = want < np.finfo(np.float32).max
    rel = np.abs(got[finite] - want[finite]) / np.maximum(want[finite], 1e-38)
    assert rel[want[finite] > 1e-37].max() < 4e-7  # ~1.5 ulp, as documented for ggml_v_expf
    assert np.all(got[~finite] == np.inf) and got[x == -np.inf][0] == 0.0


SIMD_ISAS = [i for i in _kernels.isa_supported() if i != "scalar"]


@pytest.mark.parametrize("hd", [32, 64, 128, 256])
@pytest.mark.parametrize("n,j0", [(1, 0), (33, 0), (256, 0), (257, 3), (700, 290), (1100, 513)])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_simd_attention_equals_its_scalar_reference_bit_for_bit(hd, n, j0, softcap):
    """attend_ggml_ref spells out the SIMD paths' numerics float by float (the f16 roundings,
    FMA chains, reduction orders, f64 softmax sum, the 32 P.V slot chains). Every SIMD path, for
    every group size, gives its bits, with the blocks in order or scattered through the pool, for
    lengths that span several P.V block groups (256 positions each) and windows starting inside
    one; the reference itself is near the float64 spec."""
    assert SIMD_ISAS  # CI's machines have AVX2 at least
    rng = np.random.default_rng(hd * 10_000 + n)
    k = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    scattered = rng.permutation((n + 31) // 32)
    q = (rng.standard_normal((4, hd)) * 2).astype(np.float32)
    ref = _kernels.attention(q, k, v, 0.125, j0, "ggml-ref", softcap=softcap)
    for h in range(4):
        spec = _attention_spec(q[h], k, v, 0.125, j0, softcap)
        assert np.abs(ref[h] - spec).max() <= 4e-3 * np.abs(spec).max() + 1e-6
    for isa in SIMD_ISAS:
        for g in (1, 2, 3, 4):
            for blocks in (None, scattered):
                got = _kernels.attention(q[:g], k, v, 0.125, j0, isa, softcap=softcap, blocks=blocks)
                assert got.tobytes() == ref[:g].tobytes(), (isa, g, blocks is None)
    with pytest.raises(ValueError, match="permutation"):
        _kernels.attention(q[:1], k, v, 0.125, j0, blocks=np.zeros(len(scattered), np.int32) + len(scattered))


@pytest.mark.parametrize("n,j0", [(1, 0), (40, 0), (700, 290)])
def test_attention_sinks_in_every_path_as_ggml_soft_max(n, j0):
    """A sink logit per query head joins the softmax as ggml_compute_forward_soft_max_f32 adds
    it: the max includes it, its expf after the scores' f64 sum. Every SIMD path and group size
    gives attend_ggml_ref's bits; the scalar path is near the float64 spec; a sink of -inf is no
    sink at all (the same bits)."""
    rng = np.random.default_rng(n)
    hd = 64
    k = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    q = (rng.standard_normal((4, hd)) * 2).astype(np.float32)
    sinks = np.array([-1.0, 0.5, 3.0, 8.0], np.float32)
    ref = _kernels.attention(q, k, v, 0.125, j0, "ggml-ref", sinks=sinks)
    for h in range(4):
        spec = _attention_spec(q[h], k, v, 0.125, j0, 0.0, sink=float(sinks[h]))
        assert np.abs(ref[h] - spec).max() <= 4e-3 * np.abs(spec).max() + 1e-6
        scalar = _kernels.attention(q[h:h + 1], k, v, 0.125, j0, "scalar", sinks=sinks[h:h + 1])[0]
        assert np.abs(scalar - spec).max() <= 1e-5 * np.abs(spec).max() + 1e-6
    for isa in SIMD_ISAS:
        for g in (1, 2, 3, 4):
            got = _kernels.attention(q[:g], k, v, 0.125, j0, isa, sinks=sinks[:g])
            assert got.tobytes() == ref[:g].tobytes(), (isa, g)
    none = _kernels.attention(q, k, v, 0.125, j0, "ggml-ref")
    assert _kernels.attention(q, k, v, 0.125, j0, "ggml-ref", sinks=np.full(4, -np.inf, np.float32)).tobytes() \
        == none.tobytes()
    # a sink only grows the denominator: every output shrinks by the same factor, < 1
    factor = np.linalg.norm(ref, axis=1) / np.linalg.norm(none, axis=1)
    assert np.all(factor < 1) and np.allclose(ref, none * factor[:, None], rtol=2e-2, atol=1e-3)


def test_swiglu_oai_is_ggmls_clamped_swiglu():
    """gpt-oss's expert act, element by element as ggml_swiglu_oai: x = min(g, limit), y clamped
    to [-limit, limit], x * sigmoid(alpha x) * (y + 1); NaN stays NaN."""
    g = np.array([-9.0, -1.0, 0.0, 0.5, 6.9, 7.0, 12.0, np.nan], np.float32)
    u = np.array([-12.0, -0.5, 2.0, 7.5, 1.0, -7.0, 3.0, 1.0], np.float32)
    got = _kernels.swiglu_oai(g, u, 1.702, 7.0)
    x = np.minimum(g, np.float32(7.0))
    y = np.clip(u, np.float32(-7.0), np.float32(7.0))
    want = (x / (np.float32(1.0) + np.exp(np.float32(1.702) * -x))) * (y + np.float32(1.0))
    assert np.allclose(got[:-1], want[:-1], rtol=1e-6, atol=0) and np.isnan(got[-1])
    assert got[6] == got[5] * (np.float32(4.0) / np.float32(-6.0))  # g clamped to 7: only y differs


@pytest.mark.parametrize("hd,n", [(8, 1), (64, 7), (64, 512), (96, 33), (36, 20)])
def test_encoder_attention_equals_its_scalar_reference_bit_for_bit(hd, n):
    """An encoder's attention over f32 K/V (rase_attend_f32): every ISA computes the scalar
    reference's operations (lengths off the 8-lane groups, and a head size that is not a
    multiple of 8, where every ISA runs the reference), and the reference is the float64 spec."""
    rng = np.random.default_rng(hd * 1000 + n)
    q = (rng.standard_normal(hd) * 2).astype(np.float32)
    k, v = (rng.standard_normal((n, hd)).astype(np.float32) for _ in range(2))
    ref = _kernels.attention_f32(q, k, v, 0.125, "scalar")
    s = k.astype(np.float64) @ q * 0.125
    p = np.exp(s - s.max())
    spec = (p / p.sum()) @ v
    assert np.abs(ref - spec).max() <= 1e-5 * np.abs(spec).max() + 1e-6
    for isa in _kernels.isa_supported():
        assert _kernels.attention_f32(q, k, v, 0.125, isa).tobytes() == ref.tobytes(), isa


@pytest.mark.parametrize("isa", ["scalar", SIMD])
@pytest.mark.parametrize("hd,n,j0", [(64, 1, 0), (64, 77, 0), (128, 300, 200), (256, 40, 9)])
def test_grouped_attention_equals_each_query_alone_bit_for_bit(isa, hd, n, j0):
    """Query heads sharing a KV head are served together (each K/V row read once); every
    query's result is the one it gets alone, for every group size."""
    rng = np.random.default_rng(hd + n)
    q = rng.standard_normal((4, hd)).astype(np.float32)
    k = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n, hd)).astype(np.float16).view(np.uint16)
    alone = np.stack([_kernels.attention(q[h:h + 1], k, v, 0.125, j0, isa)[0] for h in range(4)])
    for g in (2, 3, 4):
        assert np.array_equal(_kernels.attention(q[:g], k, v, 0.125, j0, isa), alone[:g]), g


REPACKED = [QuantType(t) for t in _kernels.repacked_types()]


def _matrix(qtype: QuantType, rows: int, n: int, seed: int):
    blck, _ = QUANT_BLOCKS[qtype]
    raw = np.frombuffer(random_blocks(qtype, rows * n // blck, seed), np.uint8).copy().reshape(rows, -1)
    deq = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType(int(qtype))).reshape(rows, n)
    return raw, np.nan_to_num(deq.astype(np.float64), posinf=0, neginf=0)


def test_the_repacked_types_are_the_32_element_block_types_and_q4_k_q5_k_q6_k():
    assert sorted(REPACKED) == [QuantType.Q4_0, QuantType.Q4_1, QuantType.Q5_0, QuantType.Q5_1, QuantType.Q8_0,
                                QuantType.Q4_K, QuantType.Q5_K, QuantType.Q6_K, QuantType.MXFP4]


@pytest.mark.parametrize("qtype", [QuantType.Q5_K, QuantType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [256, 768])
def test_repacking_moved_no_bit_of_the_row_kernels(qtype, n):
    """Q5_K and Q6_K ran row by row before they were repacked, in the orders spelled out below
    (Q5_K: rase_kdot_ref's; Q6_K: ggml's AVX2 vec_dot, llama.cpp's one-token bits); every ISA's
    16-row kernel (the scalar reference included) gives those bits, for every row of a group and
    every tile of tokens, the GEMM panel's (from 12 tokens) too."""
    raw, _ = _matrix(qtype, 19, n, seed=n + int(qtype))
    x = (np.random.default_rng(n).standard_normal((16, n)) * 3).astype(np.float32)
    spec = _q5_k_by_definition if qtype == QuantType.Q5_K else _q6_k_by_definition
    want = np.array([[spec(raw[r], _kernels.quantize_activation(int(qtype), x[t])) for r in range(19)]
                     for t in range(16)], np.float32)
    for isa in _kernels.isa_supported():
        for T in (1, 2, 3, 8, 13, 16):
            assert _kernels.matmul(int(qtype), raw, x[:T], isa).tobytes() == want[:T].tobytes(), (isa, T)


def _fma_f32(a, b, c) -> np.float32:
    """fma(a, b, c) of float32 values: the exact a * b + c, rounded once to float32 (to nearest,
    ties to even): the single rounding numpy's float32 arithmetic cannot give."""
    from fractions import Fraction

    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))  # within one float32 step of the answer
    steps = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
    return min(steps, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.int32)) & 1))


def _q6_k_by_definition(row: np.ndarray, act: bytes) -> np.float32:
    """Q6_K as ggml's AVX2 vec_dot rounds it, in numpy, independently of the C: per 256-block, 8
    integer lanes, lane L = sum over the 8 vectors v of sc[2v + L / 4] x (the 4 products of
    elements 32v + 4L .. + 3, values 0..63) - 32 (sc[2L] bsum[2L] + sc[2L + 1] bsum[2L + 1]);
    acc_L = fma(dy * dx, lane_L, acc_L) block by block; then ggml's 8-lane tree."""
    blocks = row.reshape(-1, 210)  # block_q6_K: ql[128], qh[64], i8 scales[16], f16 d
    acts = np.frombuffer(act, np.uint8).reshape(len(blocks), 292)
    acc = [np.float32(0)] * 8
    for x, a in zip(blocks, acts):
        ql, qh = x[0:128].astype(np.int64), x[128:192].astype(np.int64)
        sc = x[192:208].view(np.int8).astype(np.int64)
        dx, dy = x[208:210].view(np.float16).astype(np.float32)[0], a[0:4].view(np.float32)[0]
        y, bsums = a[4:260].view(np.int8).astype(np.int64), a[260:292].view(np.int16).astype(np.int64)
        u = np.zeros(256, np.int64)  # ggml's dequantize_row_q6_K order, before the -32
        for h in range(2):
            lo, hi = ql[64 * h:64 * h + 64], qh[32 * h:32 * h + 32]
            u[128 * h:128 * h + 32] = (lo[:32] & 0xF) | ((hi & 3) << 4)
            u[128 * h + 32:128 * h + 64] = (lo[32:] & 0xF) | (((hi >> 2) & 3) << 4)
            u[128 * h + 64:128 * h + 96] = (lo[:32] >> 4) | (((hi >> 4) & 3) << 4)
            u[128 * h + 96:128 * h + 128] = (lo[32:] >> 4) | (((hi >> 6) & 3) << 4)
        scale = np.float32(dy * dx)
        for L in range(8):
            lane = sum(int(sc[2 * v + L // 4]) * int(u[32 * v + 4 * L:32 * v + 4 * L + 4] @ y[32 * v + 4 * L:32 * v + 4 * L + 4])
                       for v in range(8))
            lane -= 32 * int(sc[2 * L] * bsums[2 * L] + sc[2 * L + 1] * bsums[2 * L + 1])
            acc[L] = _fma_f32(scale, np.float32(lane), acc[L])
    f = np.float32
    return f(f(f(acc[4] + acc[0]) + f(acc[6] + acc[2])) + f(f(acc[5] + acc[1]) + f(acc[7] + acc[3])))


def _k4_scales_mins(q: np.ndarray) -> tuple[list[int], list[int]]:
    """ggml's get_scale_min_k4 for the 8 sub-blocks of a Q4_K/Q5_K block's 12 scale bytes."""
    q = [int(v) for v in q]
    sc = [q[j] & 63 if j < 4 else (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4) for j in range(8)]
    mn = [q[j + 4] & 63 if j < 4 else (q[j + 4] >> 4) | ((q[j] >> 6) << 4) for j in range(8)]
    return sc, mn


def _q5_k_by_definition(row: np.ndarray, act: bytes) -> np.float32:
    """Q5_K's numerics spelled out in numpy, independently of the C: per 256-block the exact
    integers S = sum_j sc_j (q_j . y_j) and M = sum_j mn_j (bsum_2j + bsum_2j+1), then
    acc = acc + dy * (dx * S - dmin * M) in f32, block by block from 0."""
    blocks = row.reshape(-1, 176)
    acts = np.frombuffer(act, np.uint8).reshape(len(blocks), 292)  # block_q8_K: f32 d, 256 i8, 16 i16 bsums
    acc = np.float32(0)
    for x, a in zip(blocks, acts):
        dx, dm = x[0:4].view(np.float16).astype(np.float32)
        sc, mn = _k4_scales_mins(x[4:16])
        qh, qs = x[16:48].astype(np.int64), x[48:176].astype(np.int64)
        dy = a[0:4].view(np.float32)[0]
        y, bsums = a[4:260].view(np.int8).astype(np.int64), a[260:292].view(np.int16).astype(np.int64)
        S = M = 0
        for j in range(8):
            nib = qs[32 * (j // 2):32 * (j // 2) + 32]
            q = (nib >> 4 if j & 1 else nib & 0xF) | (((qh >> j) & 1) << 4)
            S += sc[j] * int(q @ y[32 * j:32 * j + 32])
            M += mn[j] * int(bsums[2 * j] + bsums[2 * j + 1])
        acc = np.float32(acc + dy * np.float32(np.float32(dx * np.float32(S)) - np.float32(dm * np.float32(M))))
    return acc


@pytest.mark.parametrize("rows,n", [(1, 256), (17, 768), (37, 512)])
def test_repacked_q5_k_keeps_the_numerics_of_its_row_kernels(rows, n):
    """Repacking Q5_K moved no bit: every ISA's 16-row kernel gives, for every tile of tokens,
    the numerics the row-by-row kernels had (the definition above, rase_kdot_ref's order)."""
    raw, _ = _matrix(QuantType.Q5_K, rows, n, seed=rows + n)
    x = np.random.default_rng(rows).standard_normal((9, n)).astype(np.float32)
    want = np.array([[_q5_k_by_definition(raw[r], _kernels.quantize_activation(int(QuantType.Q5_K), x[t]))
                      for r in range(rows)] for t in range(9)], np.float32)
    for isa in _kernels.isa_supported():
        for T in (1, 5, 9):
            assert _kernels.matmul(int(QuantType.Q5_K), raw, x[:T], isa).tobytes() == want[:T].tobytes(), (isa, T)


def _cols(qtype: QuantType, n32: int) -> int:
    """n32 columns for a 32-element block type, 8x as many for a K-quant (256-element blocks)."""
    return n32 * (8 if ACT_FORMAT.get(int(qtype)) == "q8_K" else 1)


@pytest.mark.parametrize("qtype", REPACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,n32", [(1, 32), (7, 64), (8, 96), (9, 32), (16, 64), (17, 32), (37, 256)])
def test_repacked_matmul_is_the_same_on_every_isa_bit_for_bit(qtype, rows, n32):
    """One definition per type: the scalar reference, the AVX2 kernel and the AVX-512 VNNI one
    (where the CPU has it) give the same bits for every shape (partial groups of 16 rows, every
    tile of 1..9 tokens), and agree with numpy."""
    n = _cols(qtype, n32)
    raw, deq = _matrix(qtype, rows, n, seed=rows * n)
    x = np.random.default_rng(rows).standard_normal((9, n)).astype(np.float32)
    scalar = _kernels.matmul(int(qtype), raw, x, "scalar")
    for isa in _kernels.isa_supported():
        assert _kernels.matmul(int(qtype), raw, x, isa).tobytes() == scalar.tobytes(), isa
        for T in range(1, 10):  # every tile: 1..4 tokens block by block, 5..8 slice by slice, 8 + 1
            assert _kernels.matmul(int(qtype), raw, x[:T], isa).tobytes() == scalar[:T].tobytes(), (isa, T)
    spec = quantize_act(x, ACT_FORMAT.get(int(qtype))) @ deq.T
    scale = np.abs(x) @ np.abs(deq).T
    assert np.all(np.abs(scalar - spec) <= 2e-3 * scale + 1e-30)


@pytest.mark.parametrize("isa", _kernels.isa_supported())
@pytest.mark.parametrize("qtype", REPACKED, ids=lambda t: t.name)
def test_a_tokens_result_does_not_depend_on_its_tile(qtype, isa):
    n = _cols(qtype, 128)
    raw, _ = _matrix(qtype, 21, n, seed=3)
    x = np.random.default_rng(4).standard_normal((11, n)).astype(np.float32)
    together = _kernels.matmul(int(qtype), raw, x, isa)
    for t in range(11):
        assert together[t].tobytes() == _kernels.matmul(int(qtype), raw, x[t:t + 1], isa)[0].tobytes()


@pytest.mark.parametrize("qtype", REPACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_a_repacked_row_unpacks_to_the_files_row(qtype, rows):
    """The tied token embedding is looked up in the output's repacked copy: every row of it,
    partial groups included, must come back as exactly the file's bytes."""
    n = _cols(qtype, 64)
    raw, _ = _matrix(qtype, rows, n, seed=rows + 5)
    packed = _kernels.repack(int(qtype), raw, n)
    for r in range(rows):
        assert _kernels.unpack_row(int(qtype), packed, rows, n, r).tobytes() == raw[r].tobytes(), r
    with pytest.raises(ValueError):
        _kernels.unpack_row(int(qtype), packed, rows, n, rows)
    with pytest.raises(ValueError):
        _kernels.unpack_row(int(qtype), packed[:-1], rows, n, 0)


@pytest.mark.needs_model
def test_released_pages_read_back_the_same(smollm2_path):
    from rase.store.gguf import GGUFFile

    g = GGUFFile(smollm2_path)
    t = g.tensor("blk.0.ffn_up.weight")
    before = bytes(t.data)
    g.populate(t)
    g.release(t)
    g.release(t, 100, 5000)
    g.populate(t, 0, 10)
    assert bytes(t.data) == before


@pytest.mark.parametrize("qtype", list(QuantType), ids=lambda t: t.name)
def test_the_prefetch_distance_changes_no_bit(qtype):
    """Software prefetch (RASE_PREFETCH, the vendor default) only moves timing: the forward's
    matmul loop gives the same bits with none, one line and 4 KiB ahead, on every ISA, for one
    token, a tile and (F16) the GEMM."""
    n = _cols(qtype, 64)
    raw, _ = _matrix(qtype, 70, n, seed=int(qtype))
    x = np.random.default_rng(int(qtype)).standard_normal((17, n)).astype(np.float32)
    before = _kernels.get_prefetch()
    try:
        for isa in _kernels.isa_supported():
            m = _kernels.BenchMatrix(int(qtype), raw, n, isa, 2)
            for T in (1, 5, 17):
                got = []
                for nbytes in (0, 64, 4096):
                    _kernels.set_prefetch(nbytes)
                    got.append(m.matmul(x[:T], 2)[0].tobytes())
                assert got[0] == got[1] == got[2], (isa, T)
    finally:
        _kernels.set_prefetch(before)


def test_mxfp4_logits_equal_llama_cpps_one_token_logits(tmp_path):
    """A tiny llama file whose matrices are MXFP4 (gguf's quantizer), run token by token by
    llama.cpp (llama-cpp-python, its plain CPU kernels) and by rase on every SIMD ISA (whose other
    kernels carry llama.cpp's x86 numerics; MXFP4's scalar reference gives its SIMD bits, above):
    the same logits, bit for bit. Every row has an even number of blocks, as every gpt-oss matrix
    does: ggml rounds an unpaired last block in a scalar tail whose contraction into an FMA depends
    on how llama.cpp was compiled (fused in the portable wheel, not in a native build here)."""
    n_ff = 512
    from rase.engine.decoder import load_gguf_decoder
    from tests.support import llamacpp_ref
    from tests.support.tinymodels import write_tiny_model

    path = write_tiny_model(tmp_path / "mxfp4.gguf", "llama", QuantType.MXFP4, hp=dict(n_ff=n_ff))
    tokens = [1, 5, 9, 33, 70, 12, 101, 7]
    llm = llamacpp_ref.llama(path, n_ctx=64, n_batch=1, n_ubatch=1, logits_all=True, n_threads=1)
    for t in tokens:
        llm.eval([t])
    theirs = np.array([llm.scores[i] for i in range(len(tokens))], np.float32)
    previous = _kernels.get_isa()
    try:
        for isa in [i for i in _kernels.isa_supported() if i != "scalar"]:
            _kernels.set_isa(isa)
            ours = load_gguf_decoder(None, path).prefill(tokens, all_logits=True)
            assert ours.tobytes() == theirs.tobytes(), isa
    finally:
        _kernels.set_isa(previous)
