"""qwen2: Qwen2 / Qwen2.5. llama blocks with Q/K/V biases (optional biases are read for every
architecture, as llama.cpp does), NeoX-style RoPE."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(),) * hp.n_layer, rope=(hp.rope(),),
                     rope_neox=True)
