"""qwen3: llama blocks plus RMSNorm on each Q/K head before RoPE, NeoX-style RoPE."""
from __future__ import annotations

from ..store.gguf import GGUFFile
from .base import HParams, LayerSpec, ModelSpec


def spec(g: GGUFFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(qk_norm=True),) * hp.n_layer,
                     rope=(hp.rope(),), rope_neox=True)
