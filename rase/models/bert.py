"""bert: BERT-family sentence encoders (bge, all-MiniLM, e5, ...). Token + type-0 + learned
position embeddings through a LayerNorm; post-LN blocks (x = LN(x + attention(x)), then
x = LN(x + FFN(x))) with biases, an ungated GELU FFN, attention over the whole input
(`attention.causal` false); no LM head: the output is the last layer's hidden state, pooled
(embeddings.py). WordPiece vocabulary (wordpiece.py)."""
from __future__ import annotations

from .base import HParams, LayerSpec, ModelFile, ModelSpec

KIND = "embedding"


def spec(g: ModelFile, hp: HParams) -> ModelSpec:
    return ModelSpec(layers=(LayerSpec(pre_norms=False, post_norms=True, rope_slot=-1),) * hp.n_layer,
                     rope=(hp.rope(),), gelu=True, encoder=True, layer_norm=True, norm_after_add=True,
                     causal=bool(g.arch_get("attention.causal", True)))
