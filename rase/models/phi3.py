"""phi3: Phi-3 / Phi-3.5 / Phi-4. Fused `attn_qkv` and fused gate+up in `ffn_up`, split into
views at load (models/base.py); NeoX RoPE; Q scaled by 1/sqrt(head_dim) after RoPE, scores
unscaled (llama.cpp's graph). The metadata's sliding window is ignored, as llama.cpp ignores it;
LongRoPE (Phi-3.5, Phi-4-mini): rope_factors_long/short by the context, rope.scaling.attn_factor
on cos and sin (models/base.py)."""
from __future__ import annotations

import math

from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(),) * hp.n_layer, rope=(hp.rope(file_factors=True),),
                     rope_neox=True, attn_scale=1.0 / math.sqrt(hp.head_dim), attn_prescale=True)
