"""What every architecture shares: hyper-parameters read from GGUF metadata, and the shapes of
the plan (weights + per-layer flags) handed to the one C forward; rase/models/layout.py fills them
from the file's tensors.

An architecture module declares only what differs: a `spec(g, hp) -> ModelSpec`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping, Protocol

import numpy as np

from ..errors import CorruptModelFile, UnsupportedArchitecture


class FileTensor(Protocol):
    """One tensor of a model file as an architecture reads it (store/gguf.py: FileTensor)."""
    name: str
    ne: tuple[int, ...]    # ggml order: ne[0] is the contiguous (row) dimension
    ggml_type: int
    data: np.ndarray       # (nbytes,) uint8 view of the file

    @property
    def shape(self) -> tuple[int, ...]: ...


class ModelFile(Protocol):
    """What an architecture reads of its GGUF file: metadata and tensors. The store's reader
    (store/gguf.py: ModelFile) is one; the models never import the store, which plans with them."""
    path: str
    architecture: str | None
    tensors: dict[str, FileTensor]

    def arch_get(self, suffix: str, default: Any = None) -> Any: ...

    def get(self, key: str, default: Any = None) -> Any: ...

    def value_type_name(self, key: str) -> str: ...

    def tensor(self, name: str) -> FileTensor: ...

    def copy(self, t: FileTensor) -> np.ndarray: ...


@dataclass(frozen=True)
class Rope:
    """One RoPE as llama.cpp applies it (ggml_rope_ext after llama_context's setup)."""
    base: float
    freq_scale: float = 1.0        # positions times this (linear and YaRN scaling: 1 / factor)
    yarn: bool = False             # YaRN's ramp between scaled and unscaled frequencies
    attn_factor: float = 1.0       # cos/sin multiplier (`rope.scaling.attn_factor`: Phi-3 LongRoPE)
    n_ctx_orig: int = 0            # the training context YaRN's ramp and LongRoPE's switch refer to
    file_factors: bool = False     # divide frequencies by the file's rope_freqs / LongRoPE factors
    factors: np.ndarray | None = field(default=None, compare=False)  # (n_rot/2,) float32, set by build_layout


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
    n_expert: int = 0          # mixture of experts: experts per MoE layer (0: dense)
    n_expert_used: int = 0     # experts chosen per token
    n_ff_exp: int = 0          # width of one expert's FFN
    rope_yarn: bool = False    # rope.scaling.type yarn
    rope_attn_factor: float = 1.0
    n_ctx_orig: int = 0        # rope.scaling.original_context_length, else context_length

    def rope(self, file_factors: bool = False) -> Rope:
        """The file's RoPE (base, scaling); file_factors: the architecture applies the file's
        frequency factors, as llama.cpp's get_rope_factors does for llama, phi3 and granite."""
        return Rope(self.rope_base, self.rope_freq_scale, self.rope_yarn, self.rope_attn_factor,
                    self.n_ctx_orig, file_factors)


@dataclass(frozen=True)
class LayerSpec:
    qk_norm: bool = False      # RMSNorm of each Q and K head before RoPE (qwen3, gemma3)
    qk_norm_full: bool = False  # the Q/K norms span all heads of a row (olmo2, olmoe)
    pre_norms: bool = True     # attn_norm/ffn_norm before each sublayer; False: it reads x (olmo2)
    post_norms: bool = False   # norm of the attention and FFN outputs before the residual (gemma3),
                               # or of the sum after it when ModelSpec.norm_after_add (bert)
    window: int = 0            # sliding-window length; 0 = full causal attention
    rope_slot: int = 0         # index into ModelSpec.rope; -1: no RoPE (SmolLM3's NoPE layers)
    mixer: str = "attention"   # the token mixer: "attention", "shortconv" (LFM2) or "deltanet" (Qwen3.5)


@dataclass(frozen=True)
class ModelSpec:
    layers: tuple[LayerSpec, ...]
    rope: tuple[Rope, ...]     # at most 2 slots
    rope_neox: bool = False    # rotate (i, i + n_rot/2) pairs; False: (2i, 2i+1)
    gelu: bool = False         # GELU(tanh) gate instead of SiLU
    embd_scale: float = 1.0    # token embeddings are multiplied by this
    attn_scale: float | None = None  # default 1/sqrt(head_dim)
    attn_prescale: bool = False  # scale Q before the QK product (gemma) instead of the scores
    attn_softcap: float = 0.0  # > 0: scores s -> cap * tanh(s / cap) before the softmax (gemma2)
    final_softcap: float = 0.0  # > 0: the same on the logits
    residual_scale: float = 1.0  # each sublayer's output times this before the residual add (granite)
    logit_mul: float = 1.0     # the logits times this (granite: 1 / logit_scale)
    encoder: bool = False      # token types, learned positions, an embeddings norm, no LM head (bert)
    layer_norm: bool = False   # LayerNorm with biases instead of RMSNorm
    norm_after_add: bool = False  # x = norm(x + sublayer(x)): BERT's post-LN
    causal: bool = True        # False: every position attends to the whole input
    rope_multi: int = 0        # M-RoPE for rows given (t, h, w, e) positions (images): 1 sections in order, 2 interleaved
    rope_sect_t: int = 0       # rope.dimension_sections: pairs per position component
    rope_sect_h: int = 0
    rope_sect_w: int = 0
    rope_sect_e: int = 0
    expert_norm: bool = True   # MoE: the chosen experts' weights renormalized to sum 1
    expert_gating: str = "softmax"  # "softmax": over all logits, top k; "softmax_weight": over the top k
    swiglu_limit: float = 0.0  # > 0: experts' act is gpt-oss's clamped SwiGLU (with swiglu_alpha)
    swiglu_alpha: float = 0.0
    ffn_norm: str = "ffn_norm.weight"  # the FFN's pre-norm tensor under blk.{i}. (gpt-oss: post_attention_norm)
    sinks: bool = False        # attn_sinks: a learned logit per head in the softmax's denominator (gpt-oss)
    expert_biases: bool = False  # the router's and the experts' biases (gpt-oss); elsewhere refused, as llama.cpp
    n_conv: int = 0            # taps of the recurrent layers' convolution (LFM2's l_cache, Qwen3.5's d_conv)
    ssm_head: int = 0          # delta nets: head size S
    ssm_k_heads: int = 0       # key heads
    ssm_v_heads: int = 0       # value heads (H_v)
    attn_gate: bool = False    # attn_q holds each head's query then its output gate (Qwen3.5)
    skip_blocks: range = range(0)  # blk.{i}. tensors not run (Qwen3.5's multi-token-prediction blocks)
    output_norm: str = "output_norm.weight"  # the final norm's tensor (LFM2: token_embd_norm.weight)

    def __post_init__(self) -> None:
        if self.attn_softcap and not self.attn_prescale:  # the kernel caps scores scaled by 1
            raise ValueError("attention soft-capping needs attn_prescale (the scale applied to Q)")


@dataclass(frozen=True)
class Matrix:
    """One weight matrix as the C forward takes it: rows of ggml blocks in the mmap."""
    data: np.ndarray           # uint8, rows * row_bytes
    ggml_type: int
    rows: int
    cols: int


@dataclass(frozen=True)
class Experts:
    """A MoE layer's router and experts (views into the 3-D expert tensors, one per expert)."""
    gate_inp: Matrix           # (n_expert, n_embd)
    gate: tuple[Matrix, ...]   # (n_ff_exp, n_embd) each
    up: tuple[Matrix, ...]
    down: tuple[Matrix, ...]   # (n_embd, n_ff_exp) each
    gate_inp_b: np.ndarray | None = None  # (n_expert,) router bias (gpt-oss)
    bgate: np.ndarray | None = None       # (n_expert * n_ff_exp,) expert biases, expert-major
    bup: np.ndarray | None = None
    bdown: np.ndarray | None = None       # (n_expert * n_embd,)


@dataclass(frozen=True)
class LayerLayout:
    wq: Matrix | None          # None in a layer whose mixer is not attention
    wk: Matrix | None
    wv: Matrix | None
    wo: Matrix | None
    wgate: Matrix | None       # None in a MoE layer
    wup: Matrix | None
    wdown: Matrix | None
    attn_norm: np.ndarray | None  # float32 vectors; None = the layer has no such norm
    ffn_norm: np.ndarray | None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    bq: np.ndarray | None = None  # projection biases
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    bgate: np.ndarray | None = None
    bup: np.ndarray | None = None
    bdown: np.ndarray | None = None
    post_attn_norm_b: np.ndarray | None = None  # LayerNorm biases
    post_ffn_norm_b: np.ndarray | None = None
    sinks: np.ndarray | None = None  # (n_head,) attention sink logits (gpt-oss)
    qk_norm_full: bool = False
    experts: Experts | None = None
    window: int = 0
    rope_slot: int = 0
    mixer: str = "attention"
    conv_in: Matrix | None = None   # shortconv: (3 n_embd, n_embd): b, c, x
    conv_out: Matrix | None = None  # (n_embd, n_embd)
    conv_w: np.ndarray | None = None  # (n_conv, channels) float32 taps, tap-major
    ssm_z: Matrix | None = None       # delta net: (d_inner, n_embd) output gate
    ssm_beta: Matrix | None = None    # (H_v, n_embd)
    ssm_alpha: Matrix | None = None   # (H_v, n_embd)
    ssm_dt: np.ndarray | None = None  # (H_v,) gate bias
    ssm_a: np.ndarray | None = None   # (H_v,) -exp(A_log)
    ssm_norm: np.ndarray | None = None  # (S,)


@dataclass(frozen=True)
class ForwardLayout:
    """Everything _kernels.Weights copies into the C model: the hyper-parameters (params) and
    the weights (rase_weights)."""
    params: Mapping[str, Any]  # forward_params: every field of _model.h's RASE_HPARAMS, by name
    rope: tuple[Rope, Rope]    # slot 1 unused when its base is 0; factors resolved
    tok_embd: Matrix
    output: Matrix | None      # None: no LM head (an encoder)
    output_norm: np.ndarray | None
    layers: tuple[LayerLayout, ...]
    pos_embd: Matrix | None = None     # learned positions (bert)
    type_embd: np.ndarray | None = None  # token type 0's row, added to every embedding
    embd_norm: np.ndarray | None = None
    embd_norm_b: np.ndarray | None = None


def forward_params(hp: HParams, spec: ModelSpec, n_ctx: int) -> Mapping[str, Any]:
    """The C forward's hyper-parameters by name (_model.h: RASE_HPARAMS, copied field by field
    by _kernels.Weights): each declared once, as a field of the file's HParams or of the
    architecture's ModelSpec, and the three a plan derives: the layers it runs, the context,
    the attention scale by default."""
    params = {f.name: getattr(hp, f.name) for f in fields(hp)}
    params.update((f.name, getattr(spec, f.name)) for f in fields(spec))
    params.update(n_layer=len(spec.layers), n_ctx=n_ctx,
                  attn_scale=spec.attn_scale if spec.attn_scale is not None else 1.0 / math.sqrt(hp.head_dim))
    return MappingProxyType(params)


ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")  # llama.cpp's rope.scaling.type names


def _required(g: ModelFile, suffix: str) -> int | float:
    value = g.arch_get(suffix)
    if value is None or isinstance(value, (str, list)):
        raise CorruptModelFile(g.path, f"metadata {g.architecture}.{suffix} is missing or not a number")
    return value


def _eps(g: ModelFile) -> float:
    """The norms' epsilon: RMSNorm's, else LayerNorm's (bert)."""
    for key in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        if g.arch_get(key) is not None:
            return _required(g, key)
    return _required(g, "attention.layer_norm_rms_epsilon")


def _head_count_kv(g: ModelFile, n_head: int) -> int:
    """KV heads; a per-layer array (LFM2: 0 where a layer has no attention) gives its largest."""
    value = g.arch_get("attention.head_count_kv", n_head)
    if isinstance(value, (list, np.ndarray)):
        counts = np.asarray(value)
        if counts.ndim != 1 or not counts.size or counts.dtype.kind not in "iu" or counts.min() < 0:
            raise CorruptModelFile(g.path, f"{g.architecture}.attention.head_count_kv is not a list of counts")
        return int(counts.max())
    return int(value)


def read_hparams(g: ModelFile) -> HParams:
    n_embd, n_head = int(_required(g, "embedding_length")), int(_required(g, "attention.head_count"))
    head_dim = int(g.arch_get("attention.key_length", n_embd // max(n_head, 1)))
    scaling = g.arch_get("rope.scaling.type", "linear")  # llama.cpp's default when absent
    factor = g.arch_get("rope.scaling.factor", None)
    factor = g.arch_get("rope.scale_linear", 0.0) if factor is None else factor  # the old key
    if scaling not in ROPE_SCALINGS or not isinstance(factor, (int, float)) or factor < 0:
        raise UnsupportedArchitecture(
            g.architecture or "?", reason=f"RoPE scaling {scaling!r} (factor {factor!r}) is not "
            f"implemented; rase reads {', '.join(ROPE_SCALINGS)} with a positive factor")
    freq_scale = 1.0 if scaling == "none" or not factor else float(np.float32(1.0) / np.float32(factor))
    n_ctx_train = int(_required(g, "context_length"))
    hp = HParams(
        n_layer=int(_required(g, "block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=_head_count_kv(g, n_head), head_dim=head_dim,
        n_ff=int(_required(g, "feed_forward_length")),
        n_vocab=int(g.tensor("token_embd.weight").ne[1]),
        context_length=n_ctx_train,
        eps=float(_eps(g)),
        rope_base=float(g.arch_get("rope.freq_base", 10000.0)),
        rope_freq_scale=freq_scale,
        n_rot=int(g.arch_get("rope.dimension_count", head_dim)),
        n_expert=int(g.arch_get("expert_count", 0) or 0),
        n_expert_used=int(g.arch_get("expert_used_count", 0) or 0),
        n_ff_exp=int(g.arch_get("expert_feed_forward_length", 0) or g.arch_get("feed_forward_length", 0)),
        rope_yarn=scaling == "yarn", rope_attn_factor=float(g.arch_get("rope.scaling.attn_factor", 1.0)),
        n_ctx_orig=int(g.arch_get("rope.scaling.original_context_length", 0) or n_ctx_train),
    )
    if hp.n_expert and not (0 < hp.n_expert_used <= hp.n_expert <= 256):
        raise CorruptModelFile(g.path, f"{hp.n_expert_used} experts used of {hp.n_expert} "
                               "(1 <= used <= count <= 256 required)")
    if min(hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) <= 0 \
            or hp.n_head % hp.n_head_kv or hp.n_layer > 4096:
        raise CorruptModelFile(g.path, f"inconsistent hyper-parameters {hp}")
    return hp
