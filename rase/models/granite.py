"""granite: IBM Granite 3.x dense. Llama blocks with four multipliers from the metadata:
embeddings times `embedding_scale`, each sublayer's output times `residual_scale` before its
residual add, attention scores times `attention.scale` (instead of 1/sqrt(head_dim)) and the
logits divided by `logit_scale`. `rope.scaling.finetuned` false turns RoPE off in every layer
(llama.cpp's switch); rope_freqs and LongRoPE factors apply as in llama."""
from __future__ import annotations

import numpy as np

from ..errors import CorruptModelFile
from .base import HParams, LayerSpec, ModelFile, ModelSpec

def _positive(g: ModelFile, key: str, default: float | None) -> float | None:
    value = g.arch_get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise CorruptModelFile(g.path, f"metadata {g.architecture}.{key} is {value!r}, a positive number expected")
    return float(value)


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    logit_scale = _positive(g, "logit_scale", None)  # required by llama.cpp
    if logit_scale is None:
        raise CorruptModelFile(g.path, f"metadata {g.architecture}.logit_scale is missing")
    rope = g.arch_get("rope.scaling.finetuned", True) is not False
    return ModelSpec(
        layers=(LayerSpec(rope_slot=0 if rope else -1),) * hp.n_layer, rope=(hp.rope(file_factors=True),),
        embd_scale=_positive(g, "embedding_scale", 1.0), residual_scale=_positive(g, "residual_scale", 1.0),
        attn_scale=_positive(g, "attention.scale", None), logit_mul=float(np.float32(1) / np.float32(logit_scale)))
