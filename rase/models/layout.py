"""The plan's tensors: a GGUF file's weights, under llama.cpp's names, as the typed ForwardLayout
_kernels.Weights copies into the C model (weights stay in the mmap; fused tensors become row
views). What each architecture takes is its ModelSpec's (rase/models/base.py); a tensor nobody
takes is refused."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from ..errors import CorruptModelFile, UnsupportedArchitecture
from ..kernels.quants import dequantize
from .base import (Experts, FileTensor, ForwardLayout, HParams, LayerLayout, LayerSpec, Matrix, ModelFile, ModelSpec,
                   Rope, forward_params)

# plan field -> GGUF tensor name under blk.{i}.
LAYER_TENSORS = {
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "wgate": "ffn_gate.weight", "wup": "ffn_up.weight", "wdown": "ffn_down.weight",
    "attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight", "post_ffn_norm": "post_ffw_norm.weight",
    "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias",
    "bgate": "ffn_gate.bias", "bup": "ffn_up.bias", "bdown": "ffn_down.bias", "sinks": "attn_sinks.weight",
}
# an encoder's norms after each residual add (ModelSpec.norm_after_add), LayerNorm weights and biases
POST_ADD_NORMS = {"post_attn_norm": "attn_output_norm.weight", "post_attn_norm_b": "attn_output_norm.bias",
                  "post_ffn_norm": "layer_output_norm.weight", "post_ffn_norm_b": "layer_output_norm.bias"}
ENCODER_TENSORS = {"type_embd": "token_types.weight", "pos_embd": "position_embd.weight",
                   "embd_norm": "token_embd_norm.weight", "embd_norm_b": "token_embd_norm.bias"}
FUSED_QKV = "attn_qkv.weight"        # rows: q, then k, then v (phi3)
EXPERT_TENSORS = {"gate_inp": "ffn_gate_inp.weight", "gate": "ffn_gate_exps.weight",
                  "up": "ffn_up_exps.weight", "down": "ffn_down_exps.weight"}
EXPERT_BIASES = {"gate_inp_b": "ffn_gate_inp.bias", "bgate": "ffn_gate_exps.bias", "bup": "ffn_up_exps.bias",
                 "bdown": "ffn_down_exps.bias"}
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
GLOBAL_TENSORS = {"token_embd.weight", "output_norm.weight", "output.weight"}
ROPE_FREQS = "rope_freqs.weight"     # Llama 3.1+: (n_rot/2,) frequency divisors
LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")  # Phi-3.5/4: chosen by n_ctx


def _matrix(t: FileTensor, r0: int = 0, r1: int | None = None) -> Matrix:
    """Rows [r0, r1) of a 2-D tensor: a view into the mmap (fused tensors split without copies)."""
    if len(t.ne) != 2:
        raise CorruptModelFile("", f"tensor {t.name!r} should be a matrix, has shape {t.shape}")
    rows, r1 = int(t.ne[1]), int(t.ne[1]) if r1 is None else r1
    row_bytes = t.data.size // max(rows, 1)
    if not 0 <= r0 < r1 <= rows:
        raise CorruptModelFile("", f"tensor {t.name!r} has {rows} rows, {r1} needed")
    return Matrix(t.data[r0 * row_bytes:r1 * row_bytes], t.ggml_type, r1 - r0, int(t.ne[0]))


def _experts(t: FileTensor, n_expert: int) -> tuple[Matrix, ...]:
    """A 3-D expert tensor (ne: cols, rows, n_expert) as one matrix view per expert."""
    if len(t.ne) != 3 or int(t.ne[2]) != n_expert:
        raise CorruptModelFile("", f"tensor {t.name!r} should hold {n_expert} expert matrices, "
                               f"has shape {t.shape}")
    size = t.data.size // n_expert
    return tuple(Matrix(t.data[e * size:(e + 1) * size], t.ggml_type, int(t.ne[1]), int(t.ne[0]))
                 for e in range(n_expert))


class _Tensors:
    """A file's tensors as the plan takes them; whatever is never taken is refused (unused())."""

    def __init__(self, g: ModelFile) -> None:
        self.g, self.taken = g, set()

    def has(self, name: str) -> bool:
        return name in self.g.tensors

    def take(self, name: str) -> FileTensor:
        self.taken.add(name)
        return self.g.tensor(name)

    def vector(self, name: str) -> np.ndarray:
        """A 1-D tensor (norm weights, biases) as a private float32 copy: read from the file,
        never through the mmap (ModelFile.copy), and never read from the file again."""
        t = self.take(name)
        return dequantize(replace(t, data=self.g.copy(t))).reshape(-1)

    def unused(self) -> list[str]:
        return [n for n in self.g.tensors if n not in self.taken]


def _optional(ts: _Tensors, blk: str, keys: tuple[str, ...]) -> dict:
    """The biases a layer has, as llama.cpp's optional (TENSOR_NOT_REQUIRED) tensors."""
    return {k: ts.vector(blk + LAYER_TENSORS[k]) for k in keys if ts.has(blk + LAYER_TENSORS[k])}


def _post_norms(ts: _Tensors, blk: str, which: str, spec: ModelSpec) -> dict:
    """The post-sublayer norm `which` (post_attn_norm / post_ffn_norm): RMSNorm weights, or an
    encoder's LayerNorm weight and bias after the residual add."""
    if not spec.norm_after_add:
        return {which: ts.vector(blk + LAYER_TENSORS[which])}
    return {k: ts.vector(blk + POST_ADD_NORMS[k]) for k in (which, which + "_b")}


def _attention_parts(ts: _Tensors, il: int, hp: HParams, ls: LayerSpec, spec: ModelSpec) -> dict:
    blk = f"blk.{il}."
    parts: dict = {}
    if ts.has(blk + FUSED_QKV) and not ts.has(blk + LAYER_TENSORS["wq"]):
        t, nq, nkv = ts.take(blk + FUSED_QKV), hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        if len(t.ne) != 2 or int(t.ne[1]) != nq + 2 * nkv:
            raise CorruptModelFile(ts.g.path, f"{t.name} has shape {t.shape}, expected {nq + 2 * nkv} rows")
        parts.update(wq=_matrix(t, 0, nq), wk=_matrix(t, nq, nq + nkv), wv=_matrix(t, nq + nkv, nq + 2 * nkv))
    else:
        parts.update({k: _matrix(ts.take(blk + LAYER_TENSORS[k])) for k in ("wq", "wk", "wv")})
    parts["wo"] = _matrix(ts.take(blk + LAYER_TENSORS["wo"]))
    parts.update(_optional(ts, blk, ("bq", "bk", "bv", "bo")))
    if spec.sinks:
        parts["sinks"] = ts.vector(blk + LAYER_TENSORS["sinks"])
    names = ["attn_norm"] * ls.pre_norms + ["q_norm", "k_norm"] * (ls.qk_norm or ls.qk_norm_full)
    parts.update({k: ts.vector(blk + LAYER_TENSORS[k]) for k in names})
    if ls.post_norms:
        parts.update(_post_norms(ts, blk, "post_attn_norm", spec))
    parts.setdefault("attn_norm", None)
    return parts


SHORTCONV = {"conv_in": "shortconv.in_proj.weight", "conv_out": "shortconv.out_proj.weight",
             "conv_w": "shortconv.conv.weight"}


def _shortconv_parts(ts: _Tensors, il: int, hp: HParams, ls: LayerSpec, spec: ModelSpec) -> dict:
    """LFM2's convolution block: its projections and the taps ({n_conv, n_embd} in ggml's
    order: each channel's taps contiguous), transposed to tap-major for the kernel."""
    blk = f"blk.{il}."
    taps = ts.vector(blk + SHORTCONV["conv_w"])
    if taps.size != spec.n_conv * hp.n_embd:
        raise CorruptModelFile(ts.g.path, f"{blk}shortconv.conv has {taps.size} values, "
                               f"{spec.n_conv} x {hp.n_embd} expected")
    conv_w = np.ascontiguousarray(taps.reshape(hp.n_embd, spec.n_conv).T)
    return dict(wq=None, wk=None, wv=None, wo=None, attn_norm=ts.vector(blk + LAYER_TENSORS["attn_norm"]),
                conv_in=_matrix(ts.take(blk + SHORTCONV["conv_in"])),
                conv_out=_matrix(ts.take(blk + SHORTCONV["conv_out"])), conv_w=conv_w)


DELTANET = {"conv_in": "attn_qkv.weight", "ssm_z": "attn_gate.weight", "ssm_beta": "ssm_beta.weight",
            "ssm_alpha": "ssm_alpha.weight", "conv_out": "ssm_out.weight", "conv_w": "ssm_conv1d.weight",
            "ssm_dt": "ssm_dt.bias", "ssm_a": "ssm_a", "ssm_norm": "ssm_norm.weight"}


def _deltanet_parts(ts: _Tensors, il: int, hp: HParams, ls: LayerSpec, spec: ModelSpec) -> dict:
    """Qwen3.5's gated delta net: its projections (q | k | v channels, z, beta, alpha, out), the
    conv taps ({d_conv, channels}: each channel's taps contiguous) made tap-major, the gates'
    vectors and the output norm."""
    blk = f"blk.{il}."
    S, Hk, Hv = spec.ssm_head, spec.ssm_k_heads, spec.ssm_v_heads
    channels = 2 * S * Hk + S * Hv
    taps = ts.vector(blk + DELTANET["conv_w"])
    if taps.size != spec.n_conv * channels:
        raise CorruptModelFile(ts.g.path, f"{blk}ssm_conv1d has {taps.size} values, {spec.n_conv} x {channels} expected")
    parts = {k: _matrix(ts.take(blk + DELTANET[k])) for k in ("conv_in", "ssm_z", "ssm_beta", "ssm_alpha", "conv_out")}
    parts.update({k: ts.vector(blk + DELTANET[k]) for k in ("ssm_dt", "ssm_a", "ssm_norm")})
    return dict(parts, wq=None, wk=None, wv=None, wo=None, attn_norm=ts.vector(blk + LAYER_TENSORS["attn_norm"]),
                conv_w=np.ascontiguousarray(taps.reshape(channels, spec.n_conv).T))


MIXER_PARTS = {"attention": _attention_parts, "shortconv": _shortconv_parts, "deltanet": _deltanet_parts}


def _ffn_parts(ts: _Tensors, il: int, hp: HParams, ls: LayerSpec, spec: ModelSpec) -> dict:
    blk = f"blk.{il}."
    parts: dict = {"wgate": None, "wup": None, "wdown": None}
    if ts.has(blk + EXPERT_TENSORS["gate_inp"]):
        if not hp.n_expert:
            raise CorruptModelFile(ts.g.path, f"{blk}ffn_gate_inp is present but expert_count is not set")
        gate_inp = _matrix(ts.take(blk + EXPERT_TENSORS["gate_inp"]))
        ex = {k: _experts(ts.take(blk + EXPERT_TENSORS[k]), hp.n_expert) for k in ("gate", "up", "down")}
        biases = {k: ts.vector(blk + n) for k, n in EXPERT_BIASES.items() if spec.expert_biases}
        parts["experts"] = Experts(gate_inp, ex["gate"], ex["up"], ex["down"], **biases)
    elif ts.has(blk + LAYER_TENSORS["wgate"]):
        parts.update({k: _matrix(ts.take(blk + LAYER_TENSORS[k])) for k in ("wgate", "wup", "wdown")})
    elif spec.encoder:  # no gate: up, act, down (bert)
        parts.update({k: _matrix(ts.take(blk + LAYER_TENSORS[k])) for k in ("wup", "wdown")})
    else:  # gate and up fused in ffn_up: rows [0, n_ff) gate, [n_ff, 2 n_ff) up (phi3)
        t = ts.take(blk + LAYER_TENSORS["wup"])
        if int(t.ne[1]) != 2 * hp.n_ff:
            raise CorruptModelFile(ts.g.path, f"{blk}ffn_gate is missing and {t.name} is not a fused "
                                   f"gate+up of {2 * hp.n_ff} rows")
        parts.update(wgate=_matrix(t, 0, hp.n_ff), wup=_matrix(t, hp.n_ff, 2 * hp.n_ff),
                     wdown=_matrix(ts.take(blk + LAYER_TENSORS["wdown"])))
    parts.update(_optional(ts, blk, ("bgate", "bup", "bdown")))
    if ls.pre_norms:
        parts["ffn_norm"] = ts.vector(blk + spec.ffn_norm)
    if ls.post_norms:
        parts.update(_post_norms(ts, blk, "post_ffn_norm", spec))
    parts.setdefault("ffn_norm", None)
    return parts


def _refuse_unused(g: ModelFile, ts: _Tensors) -> None:
    """Tensors this plan would ignore (shared experts, extra layers, RoPE factors ...) are refused."""
    for name in ts.unused():
        reason = f"tensor {name!r} has no place in rase's {g.architecture} forward"
        if name == ROPE_FREQS or name in LONGROPE:
            reason = f"RoPE frequency factors ({name!r}) have no place in {g.architecture}'s forward " \
                     "(llama.cpp refuses this file too)"
        elif "shexp" in name:
            reason = f"shared experts ({name!r}) are not implemented yet"
        raise UnsupportedArchitecture(g.architecture or "?", reason=reason)


def _rope_factors(ts: _Tensors, rope: Rope, hp: HParams, n_ctx: int) -> Rope:
    """rope with the file's frequency factors when it takes them: rope_freqs, else LongRoPE's
    long factors when the context (rounded up to 256, as llama.cpp pads it) exceeds the original
    training context, its short ones otherwise (llama_model::get_rope_factors)."""
    if not rope.file_factors:
        return rope
    want = hp.n_rot // 2
    if ts.has(ROPE_FREQS):
        factors = ts.vector(ROPE_FREQS)
    elif all(ts.has(n) for n in LONGROPE):
        long, short = (ts.vector(n) for n in LONGROPE)
        factors = long if -(-n_ctx // 256) * 256 > rope.n_ctx_orig else short
    else:
        return rope
    if factors.shape != (want,) or not np.all(np.isfinite(factors)) or np.any(factors == 0):
        raise CorruptModelFile(ts.g.path, f"RoPE factors of shape {factors.shape} (finite, non-zero, "
                               f"({want},) expected)")
    return replace(rope, factors=factors)


def _encoder_parts(ts: _Tensors) -> dict:
    """An encoder's embedding extras: token type 0's row, learned positions (when the model
    has them), the embeddings' LayerNorm."""
    parts: dict = {}
    if ts.has(ENCODER_TENSORS["type_embd"]):  # rows: token types; every input is type 0
        types = ts.vector(ENCODER_TENSORS["type_embd"])
        parts["type_embd"] = types[:ts.g.tensor(ENCODER_TENSORS["type_embd"]).ne[0]]
    if ts.has(ENCODER_TENSORS["pos_embd"]):
        parts["pos_embd"] = _matrix(ts.take(ENCODER_TENSORS["pos_embd"]))
    parts.update({k: ts.vector(ENCODER_TENSORS[k]) for k in ("embd_norm", "embd_norm_b")})
    return parts


def build_layout(g: ModelFile, hp: HParams, spec: ModelSpec, n_ctx: int) -> ForwardLayout:
    """The typed plan for _kernels.Weights; weights stay in the mmap (fused tensors as views)."""
    ts = _Tensors(g)
    rope = [_rope_factors(ts, r, hp, n_ctx) for r in spec.rope] + [Rope(0.0)] * (2 - len(spec.rope))
    embd = ts.take("token_embd.weight")
    output = None
    if not spec.encoder:
        output = ts.take("output.weight") if ts.has("output.weight") else embd  # tied when absent
    extra = _encoder_parts(ts) if spec.encoder else {}
    layers = []
    for il, ls in enumerate(spec.layers):
        parts = {**MIXER_PARTS[ls.mixer](ts, il, hp, ls, spec), **_ffn_parts(ts, il, hp, ls, spec)}
        layers.append(LayerLayout(**parts, qk_norm_full=ls.qk_norm_full, window=ls.window, rope_slot=ls.rope_slot,
                                  mixer=ls.mixer))
    output_norm = None if spec.encoder else ts.vector(spec.output_norm)
    ts.taken.update(n for n in g.tensors if (m := _BLK.match(n)) and int(m.group(1)) in spec.skip_blocks)
    _refuse_unused(g, ts)
    return ForwardLayout(forward_params(hp, spec, n_ctx), rope=(rope[0], rope[1]), tok_embd=_matrix(embd),
                         output=None if output is None else _matrix(output), output_norm=output_norm,
                         layers=tuple(layers), **extra)
