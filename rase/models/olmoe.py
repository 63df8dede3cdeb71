"""olmoe: OLMoE. Pre-norm blocks with full-width Q/K norms (as olmo2) and NeoX RoPE; every
layer's FFN routed: softmax over experts, top n_expert_used, weights not renormalized."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(qk_norm_full=True),) * hp.n_layer,
                     rope=(hp.rope(),), rope_neox=True, expert_norm=False)
