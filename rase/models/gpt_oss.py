"""gpt-oss: OpenAI's open-weight MoE (llama.cpp's src/models/openai-moe.cpp). Pre-norm blocks
whose FFN norm the file names post_attention_norm; Q/K/V/O biases; a learned sink logit per head
in every softmax's denominator; sliding-window attention on the layers the pattern marks (every
other one, from the first) and full attention between, each with its own RoPE base (the same by
default), YaRN-scaled, NeoX pairs; every FFN routed: the top n_expert_used router logits (with
the router's bias), a softmax over those, experts with biases and a clamped SwiGLU."""
from __future__ import annotations

from dataclasses import replace

from ..errors import CorruptModelFile
from .base import HParams, LayerSpec, ModelFile, ModelSpec

SWA_PATTERN = 2         # llama.cpp's load_swa_pattern(ml, 2): layer il slides when il % 2 < 1
SWIGLU_ALPHA = 1.702    # LLM_FFN_SWIGLU_OAI_MOE's constants in llama-graph.cpp
SWIGLU_LIMIT = 7.0


def _sliding(g: ModelFile, n_layer: int) -> list[bool]:
    """Which layers slide: the file's per-layer array, or its pattern n (il % n < n - 1)."""
    pattern = g.arch_get("attention.sliding_window_pattern", SWA_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise CorruptModelFile(g.path, f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
        return [bool(p) for p in pattern]
    n = int(pattern)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    window = int(g.arch_get("attention.sliding_window", 0) or 0)
    if window <= 0:
        raise CorruptModelFile(g.path, "gpt-oss needs attention.sliding_window (128 in the released files)")
    rope = hp.rope()
    rope_swa = replace(rope, base=float(g.arch_get("rope.freq_base_swa", hp.rope_base)))
    layers = tuple(LayerSpec(window=window if s else 0, rope_slot=1 if s else 0) for s in _sliding(g, hp.n_layer))
    return ModelSpec(layers=layers, rope=(rope, rope_swa), rope_neox=True, expert_norm=False,
                     expert_gating="softmax_weight", swiglu_limit=SWIGLU_LIMIT, swiglu_alpha=SWIGLU_ALPHA,
                     ffn_norm="post_attention_norm.weight", sinks=True, expert_biases=True)
