"""olmo2: OLMo 2. No pre-norms: each sublayer reads the residual itself and its output is
normed (post_attention_norm, post_ffw_norm) before the add; Q/K RMS norms span the whole
projection (all heads) before RoPE; NeoX RoPE. OLMo 3's sliding-window layers (the same
architecture name with attention.sliding_window set) are refused."""
from __future__ import annotations

from ..errors import UnsupportedArchitecture
from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    if int(g.arch_get("attention.sliding_window", 0) or 0) > 0:
        raise UnsupportedArchitecture("olmo2", reason="OLMo 3's sliding-window layers are not "
                                      "implemented yet; use an OLMo 2 GGUF")
    layers = (LayerSpec(qk_norm_full=True, pre_norms=False, post_norms=True),) * hp.n_layer
    return ModelSpec(layers=layers, rope=(hp.rope(),), rope_neox=True)
