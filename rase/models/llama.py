"""llama: Llama 2/3, Mistral, SmolLM, TinyLlama. Plain pre-norm blocks, SiLU gate, RoPE on
adjacent pairs (llama.cpp's converter permutes Q/K rows for that), optional tied output."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(),) * hp.n_layer, rope=(hp.rope(file_factors=True),))
