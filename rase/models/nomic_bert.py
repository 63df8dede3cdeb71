"""nomic-bert: nomic-embed-text. BERT's post-LN encoder without learned positions: NeoX RoPE in
every layer, a SwiGLU FFN without biases, usually a fused attn_qkv; mean pooling."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

KIND = "embedding"


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(pre_norms=False, post_norms=True),) * hp.n_layer, rope=(hp.rope(),),
                     rope_neox=True, encoder=True, layer_norm=True, norm_after_add=True,
                     causal=bool(g.arch_get("attention.causal", True)))
