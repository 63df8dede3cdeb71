"""phi3: Phi-3 / Phi-3.5 / Phi-4. Fused `attn_qkv` and fused gate+up in `ffn_up`, split into
views at load (models/base.py); NeoX RoPE; Q scaled by 1/sqrt(head_dim) after RoPE, scores
unscaled (llama.cpp's graph). The metadata's sliding window is ignored, as llama.cpp ignores it;
the 128k variants' rope_factors tensors are refused by name."""
from __future__ import annotations

import math

from ..gguf import GGUFFile
from .base import HParams, LayerSpec, ModelSpec


def spec(g: GGUFFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(),) * hp.n_layer, rope=((hp.rope_base, hp.rope_freq_scale),),
                     rope_neox=True, attn_scale=1.0 / math.sqrt(hp.head_dim), attn_prescale=True)
