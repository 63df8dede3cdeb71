"""The executable spec: a readable numpy forward for every architecture rase runs.

Weights are dequantized with the gguf package (independent of rase's kernels); all math is
float64, except that each matmul input is rounded to the 8-bit block format its weight type
pairs with (ggml's semantics) and K/V are rounded to f16 like the cache. Used by tests/models/test_forward.py to
check the C forward, layer by layer when they disagree.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
from dataclasses import replace

import numpy as np

from rase.store.gguf import GGUFFile
from rase.models import ARCHITECTURES, resolve
from rase.models.base import read_hparams
from rase.models.layout import EXPERT_BIASES, EXPERT_TENSORS, FUSED_QKV, LAYER_TENSORS


def _w(g: GGUFFile, name: str):
    """Vectors as float64 arrays; matrices as _Linear (weights + activation format)."""
    import gguf

    t = g.tensor(name)
    arr = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType(t.ggml_type))
    arr = np.asarray(arr, dtype=np.float64).reshape(t.shape)
    return _Linear(arr, t.ggml_type) if arr.ndim == 2 else arr


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast=32.0, beta_slow=1.0) -> tuple[float, float]:
    """YaRN's ramp: the dimensions whose wavelength lies between n_ctx_orig/beta_fast and /beta_slow."""
    dim = lambda beta: n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))


def rope_angles(r, pos: np.ndarray, n_rot: int) -> tuple[np.ndarray, float]:
    """(T, n_rot/2) angles and the cos/sin multiplier of a models.base.Rope (factors resolved):
    theta_i = pos * base^(-2i/n_rot) / factors[i]; linear scaling multiplies by freq_scale; YaRN
    blends the scaled and unscaled angle over its ramp and scales cos/sin by 1 + 0.1 ln(factor);
    the file's attn_factor (LongRoPE's) multiplies cos and sin."""
    half = n_rot // 2
    factors = np.ones(half) if r.factors is None else np.asarray(r.factors, np.float64)
    extrap = pos[:, None] * r.base ** (-2.0 * np.arange(half) / n_rot) / factors  # (T, half)
    theta = r.freq_scale * extrap
    if r.yarn:
        lo, hi = yarn_corr_dims(n_rot, r.n_ctx_orig, r.base)
        mix = 1.0 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0.0, 1.0)
        theta = theta * (1.0 - mix) + extrap * mix
        if r.freq_scale < 1.0:
            return theta, r.attn_factor * (1.0 + 0.1 * math.log(1.0 / r.freq_scale))
    return theta, r.attn_factor


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, r, neox: bool) -> np.ndarray:
    """x: (T, heads, hd); rotate the first n_rot dims of each head (rope_angles)."""
    half = n_rot // 2
    theta, mscale = rope_angles(r, pos, n_rot)
    c, s = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half], out[..., half:n_rot] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    return out


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_f16(x: np.ndarray) -> np.ndarray:
    """ggml's GELU as its kernels compute it: the input rounded to f16, the result looked up in
    an f16 table; 0 below -10, x above 10."""
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, f16(gelu(f16(x)))))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


# ggml pairs each weight type with an 8-bit activation format (vec_dot_type): the spec
# quantizes a matmul's input the same way, then multiplies in float64.
ACT_FORMAT = {2: "q8_0", 6: "q8_0", 8: "q8_0", 39: "q8_0", 3: "q8_1", 7: "q8_1",
              10: "q8_K", 11: "q8_K", 12: "q8_K", 13: "q8_K", 14: "q8_K"}


def quantize_act(x: np.ndarray, fmt: str | None) -> np.ndarray:
    """x (..., n) -> the values the kernels see after 8-bit block quantization."""
    if fmt is None:
        return x
    blk = 256 if fmt == "q8_K" else 32
    xb = x.astype(np.float32).reshape(*x.shape[:-1], -1, blk)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    iscale = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(xb * iscale)
    if fmt != "q8_K":
        d = f16(d)  # q8_0 / q8_1 store d as f16
    return (q * d).reshape(x.shape)


class _Linear:
    def __init__(self, w: np.ndarray, ggml_type: int) -> None:
        self.w, self.ggml_type, self.fmt = w, ggml_type, ACT_FORMAT.get(ggml_type)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return quantize_act(x, self.fmt) @ self.w.T


def _layer_weights(g: GGUFFile, il: int, hp, spec) -> dict:
    """Every tensor of layer il under its plan name; fused Q/K/V and gate+up split by rows."""
    names = {k: f"blk.{il}.{v}" for k, v in LAYER_TENSORS.items()}
    names["ffn_norm"] = f"blk.{il}.{spec.ffn_norm}"
    W = {k: _w(g, n) for k, n in names.items() if n in g.tensors}
    nq, nkv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
    if f"blk.{il}.{FUSED_QKV}" in g.tensors:
        qkv = _w(g, f"blk.{il}.{FUSED_QKV}")
        for key, (r0, r1) in {"wq": (0, nq), "wk": (nq, nq + nkv), "wv": (nq + nkv, nq + 2 * nkv)}.items():
            W[key] = _Linear(qkv.w[r0:r1], qkv.ggml_type)
    if "wgate" not in W and "wup" in W and W["wup"].w.shape[0] == 2 * hp.n_ff:
        up = W["wup"]
        W["wgate"], W["wup"] = _Linear(up.w[:hp.n_ff], up.ggml_type), _Linear(up.w[hp.n_ff:], up.ggml_type)
    if f"blk.{il}.{EXPERT_TENSORS['gate_inp']}" in g.tensors:
        W["gate_inp"] = _w(g, f"blk.{il}.{EXPERT_TENSORS['gate_inp']}")
        for key in ("gate", "up", "down"):
            t = _w3(g, f"blk.{il}.{EXPERT_TENSORS[key]}")
            W[f"exp_{key}"] = t
        for key, name in EXPERT_BIASES.items():  # (n_expert, rows) float32 (gpt-oss)
            if f"blk.{il}.{name}" in g.tensors:
                t = g.tensor(f"blk.{il}.{name}")
                W[key] = np.asarray(t.data.view(np.float32), np.float64).reshape(t.shape)
    return W


def _w3(g: GGUFFile, name: str) -> list:
    """A 3-D expert tensor as one _Linear per expert."""
    import gguf

    t = g.tensor(name)
    arr = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType(t.ggml_type))
    arr = np.asarray(arr, dtype=np.float64).reshape(t.shape)
    return [_Linear(arr[e], t.ggml_type) for e in range(arr.shape[0])]


def _softmax(x: np.ndarray) -> np.ndarray:
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.expf.restype, _LIBM.expf.argtypes = ctypes.c_float, [ctypes.c_float]


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf: the f32 product is exact in f64, so one f64 add and one rounding to f32 (a double
    rounding that differs from a fused one only when the f64 sum lands exactly on an f32 tie)."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


def causal_conv(x: np.ndarray, w: np.ndarray, state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """ggml_ssm_conv over one sequence's rows x (T, E) with taps w (L, E): each position's window
    is the L - 1 previous inputs (state first, zeros at position 0) and its own, summed tap by tap
    from 0 as GCC compiles ggml's loop for x86: the first 4 * (L // 4) products rounded, then
    added; the rest as FMAs. Returns y (T, E) and the last L - 1 inputs (the state after)."""
    L, E = w.shape
    hist = np.concatenate([np.zeros((L - 1, E), np.float32) if state is None else state, x]).astype(np.float32)
    y = np.empty(x.shape, np.float32)
    for t in range(x.shape[0]):
        acc = np.zeros(E, np.float32)
        for k in range(L):
            acc = acc + hist[t + k] * w[k] if k < L // 4 * 4 else fma32(hist[t + k], w[k], acc)
        y[t] = acc
    return y, hist[-(L - 1):]


def shortconv(bcx: np.ndarray, w: np.ndarray, state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """LFM2's gated short convolution (ggml_mul, ggml_ssm_conv, ggml_mul) over one sequence's rows
    bcx (T, 3E) = b, c, x: y = c * conv(b * x). Returns y (T, E) and the state after."""
    E = w.shape[1]
    y, after = causal_conv(bcx[:, :E] * bcx[:, 2 * E:], w, state)
    return bcx[:, E:2 * E] * y, after


def expf(x: float) -> np.float32:
    """libm's expf, which llama.cpp's f32 ops call (numpy's float32 exp may differ in the last bit)."""
    return np.float32(_LIBM.expf(np.float32(x)))


def dot_f32(x: np.ndarray, y: np.ndarray, simd: bool) -> np.float32:
    """ggml_vec_dot_f32: on x86 (simd) 4 x 8 FMA lanes over 32-element steps, then its reduction
    ((a0 + a2) + (a1 + a3), halves added, two hadds); the scalar build sums in double.
    len(x) a multiple of 32 when simd."""
    if not simd:
        return np.float32(np.cumsum(x.astype(np.float64) * y.astype(np.float64))[-1])  # in order
    acc = np.zeros((4, 8), np.float32)
    for i in range(0, len(x), 32):
        for j in range(4):
            acc[j] = fma32(x[i + 8 * j:i + 8 * j + 8], y[i + 8 * j:i + 8 * j + 8], acc[j])
    s = (acc[0] + acc[2]) + (acc[1] + acc[3])
    t0 = s[:4] + s[4:]
    return (t0[0] + t0[1]) + (t0[2] + t0[3])


def delta_step(state: np.ndarray, q, k, v, g: float, beta: float, simd: bool) -> tuple[np.ndarray, np.ndarray]:
    """One token of Qwen3.5's gated delta rule for one value head, as ggml_gated_delta_net on the
    CPU: state (S, S), row j = column j of the rule's matrix; returns (o, the state after)."""
    S = len(q)
    f32 = np.float32
    st = (state * expf(g)).astype(f32)
    delta = np.array([(v[j] - dot_f32(st[j], k, simd)) * f32(beta) for j in range(S)], f32)
    st = np.stack([fma32(k, np.full(S, delta[j], f32), st[j]) for j in range(S)])
    scale = f32(1.0) / np.sqrt(f32(S), dtype=f32)
    return np.array([dot_f32(st[j], q, simd) * scale for j in range(S)], f32), st


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    x, y = np.minimum(g, limit), np.clip(u, -limit, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (y + 1.0)


def _moe(W: dict, h: np.ndarray, hp, spec, act) -> np.ndarray:
    """The router (+ its bias): softmax over all then the top n_expert_used, renormalized when
    spec.expert_norm; or (softmax_weight) the top logits, softmax over those. Experts with their
    biases, the clamped SwiGLU when spec.swiglu_limit; the weighted sum."""
    logits = W["gate_inp"](h) + W.get("gate_inp_b", 0.0)
    weigh_after = spec.expert_gating == "softmax_weight"
    p = logits if weigh_after else _softmax(logits)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-p[t], kind="stable")[:hp.n_expert_used]
        w = _softmax(p[t, chosen]) if weigh_after else p[t, chosen]
        w = w / (w.sum() if spec.expert_norm else 1.0)
        for e, we in zip(chosen, w):
            x = h[t:t + 1]
            g = W["exp_gate"][e](x) + (W["bgate"][e] if "bgate" in W else 0.0)
            u = W["exp_up"][e](x) + (W["bup"][e] if "bup" in W else 0.0)
            a = swiglu_oai(g, u, spec.swiglu_alpha, spec.swiglu_limit) if spec.swiglu_limit else act(g) * u
            f = W["exp_down"][e](a) + (W["bdown"][e] if "bdown" in W else 0.0)
            out[t] += we * f[0]
    return out


class Reference:
    """forward(tokens) -> logits (T, vocab) for a fresh sequence; `trace` keeps each layer's output."""

    def __init__(self, path, n_ctx: int | None = None) -> None:
        """n_ctx: the context the model is loaded for (LongRoPE's long/short switch), default the
        file's own, as rase's loader does."""
        self.g = g = GGUFFile(path)
        self.hp = hp = read_hparams(g)
        self.spec = ARCHITECTURES[resolve(g.architecture)].spec(g, hp)
        self.rope = [self._factors(r, n_ctx) for r in self.spec.rope]
        self.embd = _w(g, "token_embd.weight")
        self.out = _w(g, "output.weight") if "output.weight" in g.tensors else self.embd
        self.out_norm = _w(g, "output_norm.weight")
        self.layers = [_layer_weights(g, il, hp, self.spec) for il in range(len(self.spec.layers))]
        self.trace: list[np.ndarray] = []

    def _factors(self, r, n_ctx: int | None):
        """r with the file's frequency factors when the architecture takes them: rope_freqs, or
        LongRoPE's long factors past the original context (llama.cpp pads n_ctx to 256)."""
        g = self.g
        if not r.file_factors:
            return r
        n_ctx = self.hp.context_length if n_ctx is None else n_ctx
        name = "rope_freqs.weight" if "rope_freqs.weight" in g.tensors else (
            "rope_factors_long.weight" if -(-n_ctx // 256) * 256 > r.n_ctx_orig else "rope_factors_short.weight")
        return replace(r, factors=_w(g, name)) if name in g.tensors else r

    def _attention(self, ls, W: dict, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        hp, spec = self.hp, self.spec
        T, hd, nh, nkv = len(h), hp.head_dim, hp.n_head, hp.n_head_kv
        attn_scale = spec.attn_scale if spec.attn_scale is not None else 1.0 / math.sqrt(hd)
        q, k, v = (W[n](h) + W.get(b, 0.0) for n, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
        if ls.qk_norm_full:
            q, k = rmsnorm(q, W["q_norm"], hp.eps), rmsnorm(k, W["k_norm"], hp.eps)
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        if ls.qk_norm:
            q, k = rmsnorm(q, W["q_norm"], hp.eps), rmsnorm(k, W["k_norm"], hp.eps)
        if ls.rope_slot >= 0:
            r = self.rope[ls.rope_slot]
            q, k = rope(q, pos, hp.n_rot, r, spec.rope_neox), rope(k, pos, hp.n_rot, r, spec.rope_neox)
        k, v = f16(k), f16(v)
        group = nh // nkv
        att = np.empty((T, nh, hd))
        for t in range(T):
            j0 = max(0, t - ls.window + 1) if ls.window else 0
            for hh in range(nh):
                s = k[j0:t + 1, hh // group] @ q[t, hh] * attn_scale
                if spec.attn_softcap:
                    s = spec.attn_softcap * np.tanh(s / spec.attn_softcap)
                sink = W["sinks"][hh] if "sinks" in W else -np.inf  # gpt-oss: only in the denominator
                mx = max(s.max(), sink)
                p = np.exp(s - mx)
                att[t, hh] = (p / (p.sum() + np.exp(sink - mx))) @ v[j0:t + 1, hh // group]
        return W["wo"](att.reshape(T, nh * hd)) + W.get("bo", 0.0)

    def forward(self, tokens) -> np.ndarray:
        hp, spec = self.hp, self.spec
        pos = np.arange(len(tokens), dtype=np.float64)
        act = gelu if spec.gelu else silu
        x = self.embd.w[np.asarray(tokens)] * spec.embd_scale
        self.trace = []
        for ls, W in zip(spec.layers, self.layers):
            h = rmsnorm(x, W["attn_norm"], hp.eps) if ls.pre_norms else x
            o = self._attention(ls, W, h, pos)
            if ls.post_norms:
                o = rmsnorm(o, W["post_attn_norm"], hp.eps)
            x = x + o * spec.residual_scale
            h = rmsnorm(x, W["ffn_norm"], hp.eps) if ls.pre_norms else x
            if "gate_inp" in W:
                f = _moe(W, h, hp, spec, act)
            else:
                f = W["wdown"](act(W["wgate"](h)) * W["wup"](h))
            if ls.post_norms:
                f = rmsnorm(f, W["post_ffn_norm"], hp.eps)
            x = x + f * spec.residual_scale
            self.trace.append(x.copy())
        logits = self.out(rmsnorm(x, self.out_norm, hp.eps)) * spec.logit_mul
        if spec.final_softcap:
            logits = spec.final_softcap * np.tanh(logits / spec.final_softcap)
        return logits


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps) * w + b


class EncoderReference:
    """hidden(tokens) -> (T, n_embd): a BERT-family encoder's last hidden states (bert: learned
    positions, GELU FFN; nomic-bert: NeoX RoPE, SwiGLU), attention over the whole input, every
    sublayer followed by residual add and LayerNorm. quantize_acts=False skips the 8-bit
    rounding of matmul inputs (the weights are the file's, dequantized)."""

    def __init__(self, path, quantize_acts: bool = True) -> None:
        self.g = g = GGUFFile(path)
        self.hp = read_hparams(g)
        self.spec = ARCHITECTURES[resolve(g.architecture)].spec(g, self.hp)
        self.q = quantize_acts
        self.W = {n: _w(g, n) for n in g.tensors}
        for n in ("token_embd.weight", "token_types.weight", "position_embd.weight"):  # tables, not matmuls
            if isinstance(self.W.get(n), _Linear):
                self.W[n] = self.W[n].w

    def _lin(self, name: str, x: np.ndarray) -> np.ndarray:
        m = self.W[name]
        y = m(x) if self.q else x @ m.w.T
        return y + self.W.get(name.replace(".weight", ".bias"), 0.0)

    def hidden(self, tokens) -> np.ndarray:
        hp, W, T = self.hp, self.W, len(tokens)
        x = W["token_embd.weight"][np.asarray(tokens)]
        if "token_types.weight" in W:
            x = x + W["token_types.weight"][0]
        if "position_embd.weight" in W:
            x = x + W["position_embd.weight"][:T]
        x = layernorm(x, W["token_embd_norm.weight"], W["token_embd_norm.bias"], hp.eps)
        pos = np.arange(T, dtype=np.float64)
        nh, hd = hp.n_head, hp.head_dim
        self.trace = [x]
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            if p + "attn_qkv.weight" in W:
                qkv = self._lin(p + "attn_qkv.weight", x)
                q, k, v = qkv[:, :nh * hd], qkv[:, nh * hd:2 * nh * hd], qkv[:, 2 * nh * hd:]
            else:
                q, k, v = (self._lin(p + f"attn_{n}.weight", x) for n in "qkv")
            q, k, v = q.reshape(T, nh, hd), k.reshape(T, nh, hd), v.reshape(T, nh, hd)
            if self.spec.layers[il].rope_slot >= 0:
                r = self.spec.rope[0]
                q, k = rope(q, pos, hp.n_rot, r, self.spec.rope_neox), rope(k, pos, hp.n_rot, r, self.spec.rope_neox)
            s = np.einsum("thd,uhd->htu", q, k) / math.sqrt(hd)
            if self.spec.causal:
                s = s + np.triu(np.full((T, T), -np.inf), 1)
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            att = np.einsum("htu,uhd->thd", a, v).reshape(T, nh * hd)
            x = layernorm(x + self._lin(p + "attn_output.weight", att), W[p + "attn_output_norm.weight"],
                          W[p + "attn_output_norm.bias"], hp.eps)
            up = self._lin(p + "ffn_up.weight", x)
            f = silu(self._lin(p + "ffn_gate.weight", x)) * up if p + "ffn_gate.weight" in W else gelu_f16(up)
            x = layernorm(x + self._lin(p + "ffn_down.weight", f), W[p + "layer_output_norm.weight"],
                          W[p + "layer_output_norm.bias"], hp.eps)
            self.trace.append(x)
        return x
