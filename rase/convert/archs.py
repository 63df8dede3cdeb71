"""Hugging Face architectures rase converts: per `architectures[0]` of config.json, the GGUF
architecture, the tensor names (HF -> llama.cpp's), the load-time fixes llama.cpp's converter
makes (q/k rows permuted for llama's interleaved RoPE, Gemma's 1 + w norms, experts stacked
into one 3-D tensor, Llama 3's rope_freqs) and the metadata it writes (conversion/*.py of
llama.cpp b11434)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedArchitecture

ATTN = {"input_layernorm.weight": "attn_norm.weight",
        **{f"self_attn.{p}_proj.{w}": f"attn_{g}.{w}" for p, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))
           for w in ("weight", "bias")}}
QK_NORM = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
MLP = {"mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
       "mlp.down_proj.weight": "ffn_down.weight"}
FFN_NORM = {"post_attention_layernorm.weight": "ffn_norm.weight"}
GEMMA_NORMS = {"post_attention_layernorm.weight": "post_attention_norm.weight",
               "pre_feedforward_layernorm.weight": "ffn_norm.weight",
               "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
SKIP = (".rotary_emb.inv_freq",)  # buffers some checkpoints save; llama.cpp drops them too


@dataclass(frozen=True)
class Experts:
    """HF per-expert tensors (suffix with {e}) stacked into GGUF 3-D tensors; the router stays F32."""
    router: str                     # HF suffix of the router matrix
    mats: dict[str, str]            # HF suffix with {e} -> GGUF suffix


@dataclass(frozen=True)
class HFArch:
    gguf: str
    layer: dict[str, str]           # HF suffix in model.layers.{i}. -> GGUF suffix in blk.{i}.
    permute: bool = False           # llama: HF's half-split q/k rows -> llama.cpp's interleaved pairs
    norm_plus1: bool = False        # Gemma: RMSNorm multiplies by 1 + w; llama.cpp stores 1 + w
    experts: Experts | None = None
    keys: dict = field(default_factory=dict)  # extra {GGUF key suffix: config key or (config key, default)}


QWEN_MOE = Experts("mlp.gate.weight", {f"mlp.experts.{{e}}.{p}_proj.weight": f"ffn_{p}_exps.weight"
                                       for p in ("down", "gate", "up")})
MIXTRAL = Experts("block_sparse_moe.gate.weight", {f"block_sparse_moe.experts.{{e}}.{w}.weight": f"ffn_{g}_exps.weight"
                                                   for w, g in (("w1", "gate"), ("w2", "down"), ("w3", "up"))})
LLAMA = HFArch("llama", ATTN | FFN_NORM | MLP, permute=True, keys={"vocab_size": "vocab_size"})
ARCHS: dict[str, HFArch] = {
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": LLAMA,
    "MixtralForCausalLM": HFArch("llama", ATTN | FFN_NORM, permute=True, experts=MIXTRAL,
                                 keys={"vocab_size": "vocab_size"}),
    "Qwen2ForCausalLM": HFArch("qwen2", ATTN | FFN_NORM | MLP),
    "Qwen3ForCausalLM": HFArch("qwen3", ATTN | QK_NORM | FFN_NORM | MLP),
    "Qwen3MoeForCausalLM": HFArch("qwen3moe", ATTN | QK_NORM | FFN_NORM, experts=QWEN_MOE,
                                  keys={"expert_feed_forward_length": "moe_intermediate_size"}),
    "Gemma3ForCausalLM": HFArch("gemma3", ATTN | QK_NORM | GEMMA_NORMS | MLP, norm_plus1=True),
}


def resolve(config: dict) -> HFArch:
    names = config.get("architectures") or []
    name = names[0] if isinstance(names, list) and names else None
    arch = ARCHS.get(name) if isinstance(name, str) else None
    if arch is None:
        raise UnsupportedArchitecture(
            str(name), tuple(ARCHS), "rase converts these Hugging Face architectures; for others use llama.cpp's "
            "convert_hf_to_gguf.py and `rase model import` the GGUF")
    _refuse_unrepresentable(arch, config)
    return arch


def _refuse_unrepresentable(arch: HFArch, cfg: dict) -> None:
    """Settings a GGUF of this architecture cannot say: refused rather than converted wrong."""
    why = None
    if arch.gguf == "qwen3moe" and cfg.get("norm_topk_prob") is False:
        why = "norm_topk_prob = false (llama.cpp's qwen3moe always renormalizes the chosen experts' weights)"
    if arch.gguf == "gemma3":
        head_dim = cfg.get("head_dim", 256)
        if cfg.get("query_pre_attn_scalar", head_dim) != head_dim:
            why = "query_pre_attn_scalar differs from head_dim"
        types = cfg.get("layer_types")
        if isinstance(types, list) and types != [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                                                  for i in range(len(types))]:
            why = "layer_types is not Gemma 3's five sliding layers to one global"
    if arch.gguf in ("qwen2", "qwen3", "qwen3moe") and cfg.get("use_sliding_window"):
        why = "use_sliding_window = true (llama.cpp's qwen architectures attend globally)"
    if why:
        raise UnsupportedArchitecture(arch.gguf, (), f"this checkpoint sets {why}")


def rope_params(cfg: dict) -> dict:
    """The RoPE settings in either config layout (rope_scaling + rope_theta, or rope_parameters)."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    params.setdefault("rope_theta", cfg.get("rope_theta"))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params["type"]
    return params


def head_dim(cfg: dict) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def metadata(arch: HFArch, cfg: dict) -> dict:
    """{GGUF key: value} of the architecture (the tokenizer's and general.* keys are added elsewhere)."""
    a, gemma = arch.gguf, arch.gguf == "gemma3"
    rope = rope_params(cfg)
    out = {
        f"{a}.block_count": cfg["num_hidden_layers"],
        f"{a}.context_length": cfg.get("max_position_embeddings", 131072 if gemma else None),
        f"{a}.embedding_length": cfg["hidden_size"],
        f"{a}.feed_forward_length": cfg.get("intermediate_size"),
        f"{a}.attention.head_count": cfg.get("num_attention_heads", 8 if gemma else None),
        f"{a}.attention.head_count_kv": cfg.get("num_key_value_heads", 4 if gemma else cfg.get("num_attention_heads")),
        f"{a}.rope.freq_base": float(rope["rope_theta"] or (1e6 if gemma else 10000.0)),
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.get("rms_norm_eps", 1e-6)),
        f"{a}.expert_count": cfg.get("num_local_experts", cfg.get("num_experts")) if arch.experts else None,
        f"{a}.expert_used_count": cfg.get("num_experts_per_tok") if arch.experts else None,
    }
    if cfg.get("head_dim") is not None or gemma:
        out[f"{a}.attention.key_length"] = out[f"{a}.attention.value_length"] = head_dim(cfg) if not gemma \
            else cfg.get("head_dim", 256)
    if a == "llama":
        out[f"{a}.rope.dimension_count"] = head_dim(cfg)
    for key, src in arch.keys.items():
        out[f"{a}.{key}"] = cfg.get(src)
    kind = rope.get("rope_type")
    if kind in ("linear", "yarn") and rope.get("factor") is not None:
        out[f"{a}.rope.scaling.type"] = kind
        out[f"{a}.rope.scaling.factor"] = float(rope["factor"])
        if kind == "yarn":
            out[f"{a}.rope.scaling.original_context_length"] = rope["original_max_position_embeddings"]
    elif kind not in (None, "default", "llama3"):
        raise UnsupportedArchitecture(a, (), f"RoPE scaling {kind!r} is not converted by rase")
    if gemma:
        if cfg.get("final_logit_softcapping"):
            out[f"{a}.final_logit_softcapping"] = float(cfg["final_logit_softcapping"])
        if cfg.get("sliding_window_pattern") != 1:
            out[f"{a}.attention.sliding_window"] = cfg["sliding_window"]
    return {k: v for k, v in out.items() if v is not None}


def llama3_rope_freqs(cfg: dict) -> np.ndarray | None:
    """Llama 3.1+'s per-dimension frequency divisors (rope_freqs.weight), as llama.cpp's converter
    computes them in float32; None without llama3 scaling."""
    rope = rope_params(cfg)
    if str(rope.get("rope_type", "")).lower() != "llama3":
        return None
    base, dim = rope.get("rope_theta") or 10000.0, head_dim(cfg)
    freqs = np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)
            out.append(1 / ((1 - smooth) / np.float32(factor) + smooth))
    return np.array(out, np.float32)
