"""smollm3: SmolLM3. Llama blocks, except that every 4th layer ((il + 1) % 4 == 0) has no RoPE
(NoPE: its queries and keys carry no position). No frequency factors (llama.cpp passes none)."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    layers = tuple(LayerSpec(rope_slot=-1 if (il + 1) % NO_ROPE_STEP == 0 else 0) for il in range(hp.n_layer))
    return ModelSpec(layers=layers, rope=(hp.rope(),))
