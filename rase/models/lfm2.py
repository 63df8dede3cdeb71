"""lfm2: Liquid's LFM2 (llama.cpp's src/models/lfm2.cpp). A hybrid: the layers whose KV head
count is 0 mix tokens with a short gated convolution (in_proj to b, c, x; c * conv(b * x) over
the last shortconv.l_cache positions; out_proj), the others with attention (per-head Q/K RMSNorm,
NeoX RoPE); every layer then a SwiGLU FFN, pre-norms throughout. The final norm is stored as
token_embd_norm, and the output is tied to the embeddings when the file has no output.weight.
The convolution's state (its last l_cache - 1 inputs) is a sequence's state slot (state_cache.py)."""
from __future__ import annotations

import numpy as np

from ..errors import CorruptModelFile, UnsupportedArchitecture
from .base import HParams, LayerSpec, ModelFile, ModelSpec

def _kv_heads(g: ModelFile, hp: HParams) -> list[int]:
    value = g.arch_get("attention.head_count_kv", hp.n_head_kv)
    heads = [int(h) for h in value] if isinstance(value, (list, np.ndarray)) else [int(value)] * hp.n_layer
    if len(heads) != hp.n_layer:
        raise CorruptModelFile(g.path, f"head_count_kv has {len(heads)} entries for {hp.n_layer} layers")
    if any(h not in (0, hp.n_head_kv) for h in heads):
        raise UnsupportedArchitecture("lfm2", reason=f"KV heads per layer {heads}: rase's pool takes one "
                                      "KV head count for every attention layer")
    return heads


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    n_conv = g.arch_get("shortconv.l_cache")
    if not isinstance(n_conv, int) or n_conv < 2:
        raise CorruptModelFile(g.path, "lfm2 needs shortconv.l_cache (the convolution's taps, 3 in LFM2)")
    if g.arch_get("attention.sliding_window"):
        raise UnsupportedArchitecture("lfm2", reason="sliding-window attention in an LFM2 file is not "
                                      "implemented yet")
    layers = tuple(LayerSpec(qk_norm=True) if h else LayerSpec(mixer="shortconv") for h in _kv_heads(g, hp))
    return ModelSpec(layers=layers, rope=(hp.rope(),), rope_neox=True, n_conv=n_conv,
                     output_norm="token_embd_norm.weight")
