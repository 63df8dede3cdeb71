"""Embeddings: an input's final hidden states (after the model's last norm when it has one, as
llama.cpp's embeddings take them) pooled into one vector, `mean`, `cls` (the first token: an
encoder's [CLS]) or `last` (the file's `<arch>.pooling_type` when it names one, else mean), and
L2-normalized unless asked otherwise. Embedding requests run in the model's worker like any
other prompt (scheduler.py): every input is a sequence of its own, its rows' hidden states are
folded into a Pooling as the steps compute them, and no token is sampled.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InvalidRequest

POOLINGS = ("mean", "cls", "last")
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's LLAMA_POOLING_TYPE_* ids
GENERATOR_POOLINGS = ("mean", "last")  # a generator's first token is its BOS: nothing to pool there


def default_pooling(gguf) -> str:
    value = gguf.get(f"{gguf.architecture}.pooling_type")
    return GGUF_POOLING.get(value, "mean") if isinstance(value, int) else "mean"


def check_pooling(pooling: str, encoder: bool) -> str:
    allowed = POOLINGS if encoder else GENERATOR_POOLINGS
    if pooling not in allowed:
        raise InvalidRequest(f"pooling must be one of {', '.join(allowed)} for this model, got "
                                      f"{pooling!r}" + ("" if encoder else " (cls pools an encoder's [CLS] token)"),
                                      "pooling")
    return pooling


def texts_of(input) -> list[str]:
    texts = [input] if isinstance(input, str) else list(input) if isinstance(input, (list, tuple)) else None
    if not texts:
        raise InvalidRequest("input must be a string or a non-empty list of strings", "input")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InvalidRequest(f"input[{i}] must be a string", "input")
    return texts


def token_inputs(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Texts as llama.cpp embeds them: the model's automatic special tokens, special-token text
    left as text."""
    out = []
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text, add_special_tokens=True, parse_special=False)
        if not ids:
            raise InvalidRequest(f"input[{i}] is empty: nothing to embed", "input")
        out.append(ids)
    return out


class Pooling:
    """One input's pooled vector, folded in as its rows are computed (in one step or several)."""

    source = "hidden"  # the rows it reads (scheduler.Scheduler)

    def __init__(self, how: str, n_tokens: int, normalize: bool = True) -> None:
        self.how, self.n, self.normalize = how, n_tokens, normalize
        self.acc: np.ndarray | None = None
        self.vector: np.ndarray | None = None

    def wants(self, pos: int) -> bool:
        return self.how == "mean" or pos == (0 if self.how == "cls" else self.n - 1)

    def add(self, h: np.ndarray) -> None:
        """h (k, n_embd): the hidden states of the wanted positions one step computed, in order."""
        if not len(h):
            return
        part = h.sum(axis=0, dtype=np.float64) if self.how == "mean" else h[-1].astype(np.float64)
        self.acc = part if self.acc is None or self.how != "mean" else self.acc + part

    def finish(self) -> np.ndarray:
        v = self.acc / self.n if self.how == "mean" else self.acc
        if self.normalize:
            norm = np.linalg.norm(v)
            v = v / norm if norm > 0 else v
        self.vector = v.astype(np.float32)
        return self.vector
