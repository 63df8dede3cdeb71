"""gemma3: QK-norm, post-attention/post-FFN norms, GELU(tanh) gate, embeddings scaled by
sqrt(n_embd), sliding-window attention on 5 of every 6 layers (RoPE base 10000 there), tied
output. The `1 + w` of Gemma's RMSNorm is already folded into the weights by llama.cpp's
converter (convert_hf_to_gguf adds 1 to every norm weight), so nothing is folded at load;
tests/models/test_conformance.py checks this against llama.cpp's logits."""
from __future__ import annotations

import math

from .base import HParams, LayerSpec, ModelFile, ModelSpec, Rope

SWA_PATTERN = 6        # every 6th layer (il % 6 == 5) attends globally
SWA_ROPE_BASE = 10000.0


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    window = int(g.arch_get("attention.sliding_window", 0))
    layers = tuple(
        LayerSpec(qk_norm=True, post_norms=True,
                  window=0 if (il + 1) % SWA_PATTERN == 0 else window,
                  rope_slot=0 if (il + 1) % SWA_PATTERN == 0 else 1)
        for il in range(hp.n_layer)
    )
    scalar = float(g.arch_get("attention.query_pre_attn_scalar", hp.head_dim))
    return ModelSpec(
        layers=layers, rope=(hp.rope(), Rope(SWA_ROPE_BASE)),
        rope_neox=True, gelu=True, embd_scale=math.sqrt(hp.n_embd),
        attn_scale=1.0 / math.sqrt(scalar), attn_prescale=True,
    )
