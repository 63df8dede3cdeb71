"""qwen2vl: the text model of Qwen2-VL and Qwen2.5-VL. Qwen2 (Q/K/V biases, NeoX-style pairs) with
multi-section RoPE (M-RoPE: rope.dimension_sections t, h, w, e in order), which for text, every
section at the token's position, is NeoX RoPE; an image's rows take their grid positions
(kernels: rase_mrope_table, engine/media.py)."""
from __future__ import annotations

import numpy as np

from ..errors import CorruptModelFile, UnsupportedArchitecture
from .base import HParams, LayerSpec, ModelFile, ModelSpec


def _sections(g: ModelFile, n_rot: int) -> list[int]:
    """The sections; every rotated pair must take the t, h or w position (text carries no e)."""
    sect = [int(v) for v in np.asarray(g.arch_get("rope.dimension_sections", [0, 0, 0, 0])).reshape(-1)][:4]
    sect += [0] * (4 - len(sect))
    if sum(sect) <= 0:
        raise CorruptModelFile(g.path, "qwen2vl needs rope.dimension_sections")
    if sect[3] or n_rot > 512:
        raise UnsupportedArchitecture("qwen2vl", reason=f"RoPE sections {sect} over {n_rot} dims: the extra "
                                      "position id, or more dims than rase's M-RoPE tables hold (512)")
    return sect


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    t, h, w, e = _sections(g, hp.n_rot)
    return ModelSpec(layers=(LayerSpec(),) * hp.n_layer, rope=(hp.rope(),), rope_neox=True, rope_multi=1,
                     rope_sect_t=t, rope_sect_h=h, rope_sect_w=w, rope_sect_e=e)
