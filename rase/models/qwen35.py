"""qwen35: Qwen3.5 (llama.cpp's src/models/qwen35.cpp). A hybrid: every full_attention_interval-th
layer (4) attends, the others are gated delta nets (rase/kernels/_deltanet.h; their conv and matrix
state is a sequence's state slot, state_cache.py). The attention is gated: attn_q holds each head's query then
its output gate, the output is multiplied by sigmoid(gate) before attn_output; per-head Q/K
RMSNorm; interleaved multi-section RoPE (IMROPE) over the first rope.dimension_count dims,
which for text (every section at the token's position) is NeoX RoPE. Every layer's FFN is a
SwiGLU whose norm the file names post_attention_norm. Multi-token-prediction blocks
(nextn_predict_layers, after the trunk) are not run; a file that has them loads."""
from __future__ import annotations

import numpy as np

from ..errors import CorruptModelFile, UnsupportedArchitecture
from .base import HParams, LayerSpec, ModelFile, ModelSpec

FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default when the file has neither key below


def _int(g: ModelFile, key: str) -> int:
    value = g.arch_get(key)
    if not isinstance(value, int) or value <= 0:
        raise CorruptModelFile(g.path, f"qwen35 needs {g.architecture}.{key} (a positive integer)")
    return value


def _recurrent(g: ModelFile, n_layer: int) -> list[bool]:
    """Which trunk layers are delta nets: the file's per-layer list, else the interval rule."""
    listed = g.arch_get("attention.recurrent_layers")
    if listed is not None:
        flags = [bool(v) for v in np.asarray(listed).reshape(-1)]
        if len(flags) < n_layer:
            raise CorruptModelFile(g.path, f"attention.recurrent_layers has {len(flags)} entries for {n_layer} layers")
        return flags[:n_layer]
    interval = int(g.arch_get("full_attention_interval", FULL_ATTENTION_INTERVAL))
    return [(il + 1) % interval != 0 for il in range(n_layer)]


def _check_sections(g: ModelFile, n_rot: int) -> list[int]:
    """IMROPE equals NeoX RoPE for text only where every rotated pair takes its angle from the
    temporal, height or width position (all the token's position), never the fourth (ggml's
    ggml_mrope_cache_init, is_imrope). The sections, for image rows' positions."""
    sections = [int(v) for v in np.asarray(g.arch_get("rope.dimension_sections", [0, 0, 0, 0])).reshape(-1)][:4]
    sections += [0] * (4 - len(sections))
    total = sum(sections)
    if total <= 0:
        raise CorruptModelFile(g.path, "qwen35 needs rope.dimension_sections")
    for i in range(n_rot // 2):
        sector = i % total
        if not any(sector % 3 == r and sector < 3 * sections[r] for r in range(3)):
            raise UnsupportedArchitecture("qwen35", reason=f"RoPE sections {sections} give pair {i} the extra "
                                          "position id, which text does not carry")
    if n_rot > 512:
        raise UnsupportedArchitecture("qwen35", reason=f"{n_rot} rotated dims; rase's M-RoPE tables hold 512")
    return sections


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    n_layer = hp.n_layer - int(g.arch_get("nextn_predict_layers", 0) or 0)
    S, Hk, Hv = _int(g, "ssm.state_size"), _int(g, "ssm.group_count"), _int(g, "ssm.time_step_rank")
    if _int(g, "ssm.inner_size") != S * Hv:
        raise CorruptModelFile(g.path, f"ssm.inner_size {g.arch_get('ssm.inner_size')} is not {Hv} heads of {S}")
    sect = _check_sections(g, hp.n_rot)
    layers = tuple(LayerSpec(mixer="deltanet") if r else LayerSpec(qk_norm=True) for r in _recurrent(g, n_layer))
    return ModelSpec(layers=layers, rope=(hp.rope(),), rope_neox=True, n_conv=_int(g, "ssm.conv_kernel"),
                     ssm_head=S, ssm_k_heads=Hk, ssm_v_heads=Hv, attn_gate=True, ffn_norm="post_attention_norm.weight",
                     skip_blocks=range(n_layer, hp.n_layer), rope_multi=2, rope_sect_t=sect[0], rope_sect_h=sect[1],
                     rope_sect_w=sect[2], rope_sect_e=sect[3])
