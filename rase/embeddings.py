"""Embeddings: the final hidden state (after the model's last norm, as llama.cpp's embeddings
take it) pooled over the input's tokens, `mean` or `last` (the file's `<arch>.pooling_type`
when it has one, else mean), L2-normalized. Runs on a session's single-stream decoder, one
input at a time, in chunks of its batch size."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import ContextOverflow, InvalidGenerationConfig

POOLINGS = ("mean", "last")
GGUF_POOLING = {1: "mean", 3: "last"}  # llama.cpp's LLAMA_POOLING_TYPE_* ids


def default_pooling(gguf, architecture: str) -> str:
    value = gguf.get(f"{gguf.architecture}.pooling_type")
    return GGUF_POOLING.get(value, "mean") if isinstance(value, int) else "mean"


def hidden_states(decoder, ids: Sequence[int]) -> np.ndarray:
    """(T, n_embd) float32: the last layer's output for each position, after the final norm."""
    hp, plan = decoder.hparams, decoder.plan
    if len(ids) > decoder.n_ctx:
        raise ContextOverflow(len(ids), decoder.n_ctx, " (an embedding input)")
    step = decoder._fwd.max_rows
    out = np.empty((len(ids), hp.n_embd), np.float32)
    for p0 in range(0, len(ids), step):
        chunk = np.asarray(ids[p0:p0 + step], np.int32)
        trace = np.zeros((hp.n_layer, len(chunk), hp.n_embd), np.float32)
        decoder._fwd.run(chunk, p0, 1, trace)
        out[p0:p0 + len(chunk)] = trace[-1]
    x = out.astype(np.float64)
    x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + hp.eps) * plan.output_norm
    return x.astype(np.float32)


def pool(h: np.ndarray, pooling: str, normalize: bool = True) -> np.ndarray:
    v = h.mean(axis=0, dtype=np.float64) if pooling == "mean" else h[-1].astype(np.float64)
    if normalize:
        n = np.linalg.norm(v)
        v = v / n if n > 0 else v
    return v.astype(np.float32)


def embed(decoder, tokenizer, texts: Sequence[str], pooling: str, normalize: bool = True) -> tuple[list, int]:
    """(one vector per text, tokens read). Texts are tokenized as llama.cpp embeds them: with
    the model's automatic special tokens, special-token text left as text."""
    if pooling not in POOLINGS:
        raise InvalidGenerationConfig(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}", "pooling")
    vectors, n_tokens = [], 0
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidGenerationConfig(f"input[{i}] must be a string", "input")
        ids = tokenizer.encode(text, add_special_tokens=True, parse_special=False)
        if not ids:
            raise InvalidGenerationConfig(f"input[{i}] is empty: nothing to embed", "input")
        vectors.append(pool(hidden_states(decoder, ids), pooling, normalize))
        n_tokens += len(ids)
    return vectors, n_tokens
