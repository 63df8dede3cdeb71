"""File types (--type) and the ggml type of each tensor in them: llama.cpp's llama_tensor_get_type
(src/llama-quant.cpp, b11434) for the types rase writes, so a Q4_K_M file has llama-quantize's mix
(more bits for attn_v and ffn_down on the layers use_more_bits picks, Q6_K for the output), and
the same fallbacks for rows that do not divide into a type's blocks."""
from __future__ import annotations

from dataclasses import dataclass

from ..kernels.quants import QUANT_BLOCKS, QuantType as Q

# --type -> (llama_ftype id, default ggml type)
FTYPES: dict[str, tuple[int, Q]] = {
    "F32": (0, Q.F32), "F16": (1, Q.F16), "BF16": (32, Q.BF16), "Q8_0": (7, Q.Q8_0), "Q4_0": (2, Q.Q4_0),
    "Q4_1": (3, Q.Q4_1), "Q5_0": (8, Q.Q5_0), "Q5_1": (9, Q.Q5_1), "Q4_K_S": (14, Q.Q4_K), "Q4_K_M": (15, Q.Q4_K),
    "Q5_K_S": (16, Q.Q5_K), "Q5_K_M": (17, Q.Q5_K), "Q6_K": (18, Q.Q6_K),
}
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}  # tensor_type_fallback
NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight")       # tensor_allows_quantization
FLOAT = (Q.F32, Q.F16, Q.BF16)


@dataclass
class Counters:
    """quantize_state_impl: attn_v tensors seen and in all, ffn_down seen, layers."""
    n_attention_wv: int
    n_layer: int
    n_expert: int
    tied: bool
    type_70b: bool = False  # llama.cpp's LLM_TYPE_70B: attn_v is shared by 8 heads, so it gets more bits
    i_attention_wv: int = 0
    i_ffn_down: int = 0


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _layer(name: str, counter: int, qs: Counters) -> int:
    """The layer of an ffn tensor: its counter, or (experts) the number in its name."""
    return int(name.split(".")[1]) if qs.n_expert > 1 else counter


def _by_category(name: str, t: Q, ftype: str, qs: Counters, ncols: int) -> Q:
    """llama_tensor_get_type_impl, for the file types in FTYPES."""
    if name == "output.weight" or (qs.tied and name == "token_embd.weight"):
        return Q.Q8_0 if ncols % QUANT_BLOCKS[t][0] else (t if t == Q.Q8_0 else Q.Q6_K)
    if "attn_v.weight" in name or "attn_qkv.weight" in name or "attn_kv_b.weight" in name:
        if ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(qs.i_attention_wv, qs.n_attention_wv):
            t = Q.Q6_K
        elif ftype == "Q4_K_S" and qs.i_attention_wv < 4:
            t = Q.Q5_K
        if qs.type_70b and t in (Q.Q3_K, Q.Q4_K):
            t = Q.Q5_K
        if qs.n_expert == 8:
            t = Q.Q8_0
        qs.i_attention_wv += 1
    elif "attn_k.weight" in name:
        if qs.n_expert == 8:
            t = Q.Q8_0
    elif "ffn_down" in name and "ffn_up" not in name and "ffn_gate" not in name:
        i_layer = _layer(name, qs.i_ffn_down, qs)
        if ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(i_layer, qs.n_layer):
            t = Q.Q6_K
        elif ftype == "Q4_K_S" and i_layer < qs.n_layer // 8:
            t = Q.Q5_K
        qs.i_ffn_down += 1
    elif "attn_output.weight" in name and qs.n_expert == 8 and ftype in ("Q4_K_S", "Q4_K_M"):
        t = Q.Q5_K
    return t


def tensor_type(name: str, ndim: int, ncols: int, ftype: str, qs: Counters) -> Q:
    """The ggml type of tensor `name` (ndim dimensions, ncols per row) in a file of type ftype;
    call in quantize_order (the attn_v / ffn_down counters advance as llama-quantize's do)."""
    default = FTYPES[ftype][1]
    if ndim < 2 or not name.endswith("weight") or any(s in name for s in NOT_QUANTIZED):
        return Q.F32
    if default in FLOAT:
        return default
    t = _by_category(name, default, ftype, qs, ncols)
    if ncols % QUANT_BLOCKS[t][0]:
        t = FALLBACK.get(t, t)
        if ncols % QUANT_BLOCKS[t][0]:
            t = Q.F16
    return t


def quantize_order(name: str) -> tuple[int, str]:
    """llama-quantize's order (llama_model_loader's weight_name_comparer): tensors outside the
    layers first, then layer by layer (numerically), by name within one. Its counters advance in
    this order, whatever order the file holds the tensors in."""
    parts = name.split(".")
    return (int(parts[1]) if parts[0] == "blk" and parts[1].isdigit() else -1), name


def is_70b(arch: str, n_layer: int, n_head: int, n_head_kv: int) -> bool:
    """llama.cpp's LLM_TYPE_70B (src/models/llama.cpp, qwen2.cpp): 80 layers, grouped KV heads for llama."""
    return n_layer == 80 and (arch == "qwen2" or (arch == "llama" and n_head != n_head_kv))


def counters(names: list[str], n_layer: int, n_expert: int, type_70b: bool = False) -> Counters:
    return Counters(n_attention_wv=sum(("attn_v.weight" in n or "attn_qkv.weight" in n or "attn_kv_b.weight" in n)
                                       for n in names),
                    n_layer=n_layer, n_expert=n_expert, tied="output.weight" not in names, type_70b=type_70b)
