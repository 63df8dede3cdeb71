"""qwen3: llama blocks plus RMSNorm on each Q/K head before RoPE, NeoX-style RoPE."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(qk_norm=True),) * hp.n_layer,
                     rope=(hp.rope(),), rope_neox=True)
