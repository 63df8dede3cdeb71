"""gemma2: Gemma 2. gemma's blocks plus post-attention/post-FFN norms, attention and final-logit
soft-capping (defaults 50 and 30, as llama.cpp's), a sliding window on even layers (llama.cpp's
pattern 2). Q is scaled by 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) for the 46-layer 27B, as
llama.cpp decides it."""
from __future__ import annotations

import math

from .base import HParams, LayerSpec, ModelFile, ModelSpec

SWA_PATTERN = 2        # layers with il % 2 == 0 attend within the window
LAYERS_27B = 46


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    window = int(g.arch_get("attention.sliding_window", 4096))
    layers = tuple(LayerSpec(post_norms=True, window=window if il % SWA_PATTERN < SWA_PATTERN - 1 else 0)
                   for il in range(hp.n_layer))
    scalar = hp.n_embd / hp.n_head if hp.n_layer == LAYERS_27B else hp.head_dim
    return ModelSpec(
        layers=layers, rope=(hp.rope(),), rope_neox=True, gelu=True,
        embd_scale=math.sqrt(hp.n_embd), attn_scale=1.0 / math.sqrt(scalar), attn_prescale=True,
        attn_softcap=float(g.arch_get("attn_logit_softcapping", 50.0)),
        final_softcap=float(g.arch_get("final_logit_softcapping", 30.0)),
    )
