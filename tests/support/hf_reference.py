"""The transformers forward, in numpy (float64), on a checkpoint's own tensors: Hugging Face names,
HF's q/k layout (RoPE on the two halves of each head, rotate_half), Gemma's (1 + w) norms and
scaled embeddings, Llama 3's scaled inverse frequencies, per-expert MoE matrices. The spec a
converted GGUF's logits are checked against, independent of the converter's own choices."""
from __future__ import annotations

import math

import numpy as np


def _rms(x, w, eps, plus1=False):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * ((1.0 + w) if plus1 else w)


def inv_freq(cfg: dict, base: float, dim: int) -> np.ndarray:
    """transformers' rope init: default, or _compute_llama3_parameters."""
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rope = cfg.get("rope_scaling") or {}
    if rope.get("rope_type") != "llama3":
        return inv
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled)


def _rope(x, pos, inv):  # x (T, H, D): rotate_half over the two halves of each head
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _silu(x):
    return x / (1 + np.exp(-x))


def _attention(q, k, v, scale, window):  # (T, H, D), (T, KV, D): causal, GQA, optional sliding window
    T, H, _ = q.shape
    k, v = np.repeat(k, H // k.shape[1], 1), np.repeat(v, H // v.shape[1], 1)
    s = np.einsum("thd,uhd->htu", q, k) * scale
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = (j > i) | ((i - j >= window) if window else False)
    s = np.where(mask[None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("htu,uhd->thd", p, v)


def _moe(x, w, p, cfg):
    logits = x @ w[p + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:cfg["num_experts_per_tok"]]
        weights = probs[t, top] / (probs[t, top].sum() if cfg.get("norm_topk_prob") else 1.0)
        for e, we in zip(top, weights):
            q = f"{p}mlp.experts.{e}."
            hidden = _silu(x[t] @ w[q + "gate_proj.weight"].T) * (x[t] @ w[q + "up_proj.weight"].T)
            out[t] += we * (hidden @ w[q + "down_proj.weight"].T)
    return out


def forward(cfg: dict, weights: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """Logits (T, vocab) of the checkpoint (config.json, {HF name: array}) for tokens."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    gemma = cfg["model_type"].startswith("gemma3")
    H, KV, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = cfg.get("head_dim") or E // H
    eps, T = cfg["rms_norm_eps"], len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = w["model.embed_tokens.weight"][tokens] * (math.sqrt(E) if gemma else 1.0)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        local = gemma and (i + 1) % cfg.get("sliding_window_pattern", 6) != 0
        base = cfg["rope_local_base_freq"] if local else cfg["rope_theta"]
        h = _rms(x, w[p + "input_layernorm.weight"], eps, gemma)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, D)
        if p + "self_attn.q_norm.weight" in w:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps, gemma)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps, gemma)
        inv = inv_freq(cfg, base, D)
        q, k = _rope(q, pos, inv), _rope(k, pos, inv)
        scale = cfg.get("query_pre_attn_scalar", D) ** -0.5 if gemma else D ** -0.5
        a = _attention(q, k, v, scale, cfg["sliding_window"] if local else 0).reshape(T, H * D)
        a = a @ w[p + "self_attn.o_proj.weight"].T
        if gemma:
            x = x + _rms(a, w[p + "post_attention_layernorm.weight"], eps, True)
            h = _rms(x, w[p + "pre_feedforward_layernorm.weight"], eps, True)
        else:
            x = x + a
            h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate.weight" in w:
            x = x + _moe(h, w, p, cfg)
            continue
        act = _gelu_tanh if gemma else _silu
        m = (act(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
            w[p + "mlp.down_proj.weight"].T
        x = x + (_rms(m, w[p + "post_feedforward_layernorm.weight"], eps, True) if gemma else m)
    x = _rms(x, w["model.norm.weight"], eps, gemma)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
