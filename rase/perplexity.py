"""Perplexity as llama.cpp's `llama-perplexity` computes it: the text tokenized with the model's
automatic special tokens, cut into chunks of n_ctx tokens (the rest dropped), each chunk's first
token replaced by BOS when the model adds one, and only the second half of each chunk scored
(position j predicts token j + 1 for j in [n_ctx/2, n_ctx - 1)). PPL = exp(mean NLL), with
llama.cpp's error estimate sqrt(var(NLL) / (count - 1)) * PPL."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import InvalidGenerationConfig, WrongModelKind


@dataclass
class Perplexity:
    ppl: float
    error: float
    chunks: list[float] = field(default_factory=list)  # the running PPL after each chunk, as llama prints
    tokens: int = 0                                      # tokens scored


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]], each row as llama.cpp's log_softmax (f32 exps, f64 sum)."""
    m = logits.max(axis=1, keepdims=True)
    s = np.exp(logits - m, dtype=np.float32).sum(axis=1, dtype=np.float64)
    picked = logits[np.arange(len(targets)), targets].astype(np.float64) - m[:, 0]
    return -(picked - np.log(s))


def perplexity(decoder, tokenizer, text: str, n_ctx: int = 512,
               on_chunk: Callable[[int, int, float], None] | None = None) -> Perplexity:
    """on_chunk(i, n_chunks, running ppl) after each chunk."""
    if not decoder.plan.weights.has_lm_head:
        raise WrongModelKind(decoder.gguf.architecture or "?", "embedding",
                             "an encoder has no next-token distribution to score")
    if n_ctx < 4 or n_ctx % 2 or n_ctx > decoder.n_ctx:
        raise InvalidGenerationConfig(f"n_ctx must be even, 4..{decoder.n_ctx}; got {n_ctx}", "ctx")
    ids = tokenizer.encode(text, add_special_tokens=True, parse_special=False)
    n_chunks = len(ids) // n_ctx
    if n_chunks < 2:
        raise InvalidGenerationConfig(f"the text has {len(ids)} tokens: perplexity needs at least 2 x n_ctx = "
                                      f"{2 * n_ctx} (use a longer text or a smaller --ctx)", "text")
    bos = tokenizer.bos_id if ids and tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id else None
    first, step = n_ctx // 2, decoder._fwd.max_rows
    nll = nll2 = 0.0
    count, running = 0, []
    for c in range(n_chunks):
        chunk = np.asarray(ids[c * n_ctx:(c + 1) * n_ctx], np.int32)
        if bos is not None:
            chunk[0] = bos
        rows = []  # logits of positions first .. n_ctx - 1
        for p0 in range(0, n_ctx, step):
            p1 = min(n_ctx, p0 + step)
            n_out = p1 - max(first, p0) if p1 > first else 1
            out = decoder._fwd.run(chunk[p0:p1], p0, n_out)
            if p1 > first:
                rows.append(out)
        values = _nll(np.concatenate(rows)[:-1], chunk[first + 1:].astype(np.int64))
        nll += float(values.sum())
        nll2 += float((values * values).sum())
        count += len(values)
        running.append(math.exp(nll / count))
        if on_chunk is not None:
            on_chunk(c, n_chunks, running[-1])
    mean, mean2 = nll / count, nll2 / count
    var = mean2 - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 else 0.0
    return Perplexity(ppl, err, running, count)
