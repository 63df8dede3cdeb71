"""gemma: Gemma 1. GELU(tanh) gate, embeddings scaled by sqrt(n_embd), Q scaled by
1/sqrt(head_dim) after RoPE, tied output, multi-query attention with head_dim set apart from
n_embd / n_head. The `1 + w` of Gemma's RMSNorm is folded into the weights by llama.cpp's
converter, so nothing is folded at load."""
from __future__ import annotations

import math

from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(),) * hp.n_layer, rope=(hp.rope(),),
                     rope_neox=True, gelu=True, embd_scale=math.sqrt(hp.n_embd),
                     attn_scale=1.0 / math.sqrt(hp.head_dim), attn_prescale=True)
