"""What every architecture shares: hyper-parameters read from GGUF metadata, the standard GGUF
tensor names, and the plan (weights + per-layer flags) handed to the one C forward.

An architecture module declares only what differs: a `spec(g, hp) -> ModelSpec`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptModelFile, UnsupportedArchitecture
from ..gguf import GGUFFile, TensorInfo
from ..quants import dequantize


@dataclass(frozen=True)
class HParams:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    context_length: int
    eps: float
    rope_base: float
    rope_freq_scale: float
    n_rot: int


@dataclass(frozen=True)
class LayerSpec:
    qk_norm: bool = False      # RMSNorm of each Q and K head before RoPE (qwen3, gemma3)
    post_norms: bool = False   # RMSNorm of the attention and FFN outputs before the residual (gemma3)
    window: int = 0            # sliding-window length; 0 = full causal attention
    rope_slot: int = 0         # index into ModelSpec.rope


@dataclass(frozen=True)
class ModelSpec:
    layers: tuple[LayerSpec, ...]
    rope: tuple[tuple[float, float], ...]  # (base, freq_scale) per slot, at most 2
    rope_neox: bool = False    # rotate (i, i + n_rot/2) pairs; False: (2i, 2i+1)
    gelu: bool = False         # GELU(tanh) gate instead of SiLU
    embd_scale: float = 1.0    # token embeddings are multiplied by this
    attn_scale: float | None = None  # default 1/sqrt(head_dim)
    attn_prescale: bool = False  # scale Q before the QK product (gemma) instead of the scores


@dataclass(frozen=True)
class Matrix:
    """One weight matrix as the C forward takes it: rows of ggml blocks in the mmap."""
    data: np.ndarray           # uint8, rows * row_bytes
    ggml_type: int
    rows: int
    cols: int


@dataclass(frozen=True)
class LayerPlan:
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wo: Matrix
    wgate: Matrix
    wup: Matrix
    wdown: Matrix
    attn_norm: np.ndarray      # float32 vectors; None = the layer has no such norm
    ffn_norm: np.ndarray
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    window: int = 0
    rope_slot: int = 0


@dataclass(frozen=True)
class ForwardPlan:
    """Everything _kernels.Weights copies into the C model (rase_hparams, rase_weights)."""
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx: int                 # positions one sequence may reach
    n_rot: int
    rope_neox: bool
    gelu: bool
    attn_prescale: bool
    eps: float
    embd_scale: float
    attn_scale: float
    rope_base: tuple[float, float]        # per rope slot (slot 1 unused when 0)
    rope_freq_scale: tuple[float, float]
    tok_embd: Matrix
    output: Matrix
    output_norm: np.ndarray
    layers: tuple[LayerPlan, ...]


# plan field -> GGUF tensor name suffix under blk.{i}.
LAYER_TENSORS = {
    "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
    "wgate": "ffn_gate", "wup": "ffn_up", "wdown": "ffn_down",
    "attn_norm": "attn_norm", "ffn_norm": "ffn_norm",
    "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
    "post_attn_norm": "post_attention_norm", "post_ffn_norm": "post_ffw_norm",
}
_BLK = re.compile(r"^blk\.(\d+)\.(.+)\.weight$")
GLOBAL_TENSORS = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}


def _required(g: GGUFFile, suffix: str) -> int | float:
    value = g.arch_get(suffix)
    if value is None or isinstance(value, (str, list)):
        raise CorruptModelFile(g.path, f"metadata {g.architecture}.{suffix} is missing or not a number")
    return value


def read_hparams(g: GGUFFile) -> HParams:
    n_embd, n_head = int(_required(g, "embedding_length")), int(_required(g, "attention.head_count"))
    head_dim = int(g.arch_get("attention.key_length", n_embd // max(n_head, 1)))
    scaling = g.arch_get("rope.scaling.type", "none")
    factor = float(g.arch_get("rope.scaling.factor", 1.0) or 1.0)
    if scaling not in ("none", "linear") and factor != 1.0:
        raise UnsupportedArchitecture(
            g.architecture or "?", reason=f"RoPE scaling {scaling!r} is not implemented; "
            "use a model without it or a linear-scaled one")
    hp = HParams(
        n_layer=int(_required(g, "block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=int(g.arch_get("attention.head_count_kv", n_head)), head_dim=head_dim,
        n_ff=int(_required(g, "feed_forward_length")),
        n_vocab=int(g.tensor("token_embd.weight").ne[1]),
        context_length=int(_required(g, "context_length")),
        eps=float(_required(g, "attention.layer_norm_rms_epsilon")),
        rope_base=float(g.arch_get("rope.freq_base", 10000.0)),
        rope_freq_scale=1.0 / factor,
        n_rot=int(g.arch_get("rope.dimension_count", head_dim)),
    )
    if min(hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) <= 0 \
            or hp.n_head % hp.n_head_kv or hp.n_layer > 4096:
        raise CorruptModelFile(g.path, f"inconsistent hyper-parameters {hp}")
    return hp


def _matrix(t: TensorInfo) -> Matrix:
    if len(t.ne) != 2:
        raise CorruptModelFile("", f"tensor {t.name!r} should be a matrix, has shape {t.shape}")
    return Matrix(t.data, t.ggml_type, int(t.ne[1]), int(t.ne[0]))


def _vector(t: TensorInfo) -> np.ndarray:
    return dequantize(t).reshape(-1)


def check_tensors(g: GGUFFile, spec: ModelSpec) -> None:
    """Refuse files with tensors this plan would ignore (biases, MoE routers, ...)."""
    known = set(LAYER_TENSORS.values())
    for name in g.tensors:
        m = _BLK.match(name)
        if name in GLOBAL_TENSORS or (m and m.group(2) in known and int(m.group(1)) < len(spec.layers)):
            continue
        raise UnsupportedArchitecture(
            g.architecture or "?", reason=f"tensor {name!r} has no place in rase's "
            f"{g.architecture} forward (biases, mixture-of-experts and extra layers are not supported)")


def build_plan(g: GGUFFile, hp: HParams, spec: ModelSpec, n_ctx: int) -> ForwardPlan:
    """The typed plan for _kernels.Weights; weights stay in the mmap."""
    check_tensors(g, spec)
    if "rope_freqs.weight" in g.tensors:
        raise UnsupportedArchitecture(
            g.architecture or "?", reason="per-dimension RoPE frequency factors (Llama 3.1 "
            "rope_freqs) are not implemented yet")
    rope = list(spec.rope) + [(0.0, 1.0)] * (2 - len(spec.rope))
    embd = g.tensor("token_embd.weight")
    output = g.tensors.get("output.weight", embd)  # tied when absent
    layers = []
    for il, ls in enumerate(spec.layers):
        need = ["wq", "wk", "wv", "wo", "wgate", "wup", "wdown", "attn_norm", "ffn_norm"]
        need += ["q_norm", "k_norm"] if ls.qk_norm else []
        need += ["post_attn_norm", "post_ffn_norm"] if ls.post_norms else []
        parts = {}
        for key in need:
            t = g.tensor(f"blk.{il}.{LAYER_TENSORS[key]}.weight")
            parts[key] = _matrix(t) if key.startswith("w") else _vector(t)
        layers.append(LayerPlan(**parts, window=ls.window, rope_slot=ls.rope_slot))
    return ForwardPlan(
        n_layer=hp.n_layer, n_embd=hp.n_embd, n_head=hp.n_head, n_head_kv=hp.n_head_kv,
        head_dim=hp.head_dim, n_ff=hp.n_ff, n_vocab=hp.n_vocab, n_ctx=n_ctx, n_rot=hp.n_rot,
        rope_neox=spec.rope_neox, gelu=spec.gelu, attn_prescale=spec.attn_prescale, eps=hp.eps,
        embd_scale=spec.embd_scale,
        attn_scale=spec.attn_scale if spec.attn_scale is not None else 1.0 / math.sqrt(hp.head_dim),
        rope_base=(rope[0][0], rope[1][0]), rope_freq_scale=(rope[0][1], rope[1][1]),
        tok_embd=_matrix(embd), output=_matrix(output),
        output_norm=_vector(g.tensor("output_norm.weight")), layers=tuple(layers))
