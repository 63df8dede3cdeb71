"""qwen3moe: Qwen3-MoE (30B-A3B ...). qwen3's attention (per-head Q/K norms, NeoX RoPE); every
layer's FFN routed: softmax over experts, top n_expert_used, weights renormalized."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(qk_norm=True),) * hp.n_layer,
                     rope=(hp.rope(),), rope_neox=True, expert_norm=True)
