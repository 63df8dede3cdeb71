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

from ..errors import InvalidRequest, WrongModelKind


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


class Scoring:
    """A scoring request's collector: -log p(token j + 1 | tokens ..j) for positions j in
    [first, n - 1), from the logits rows the worker's steps read (scheduler.Scheduler)."""
    source = "logits"

    def __init__(self, tokens, first: int) -> None:
        self.tokens, self.first = np.asarray(tokens, np.int64), first
        self.at, self.parts = first, []
        self.nll: np.ndarray | None = None

    def wants(self, pos: int) -> bool:
        return self.first <= pos < len(self.tokens) - 1

    def add(self, logits: np.ndarray) -> None:
        """logits (k, n_vocab): the next k wanted positions, in order."""
        if len(logits):
            self.parts.append(_nll(logits, self.tokens[self.at + 1:self.at + 1 + len(logits)]))
            self.at += len(logits)

    def finish(self) -> None:
        self.nll = np.concatenate(self.parts) if self.parts else np.zeros(0)


def perplexity(worker, tokenizer, text: str, n_ctx: int = 512,
               on_chunk: Callable[[int, int, float], None] | None = None) -> Perplexity:
    """Every chunk is a scoring request of the model's worker (rase.engine.worker.ModelWorker), queued
    together and batched with whatever else it serves; on_chunk(i, n_chunks, running ppl) after
    each chunk, in order."""
    plan = worker.plan
    if not plan.weights.has_lm_head:
        raise WrongModelKind(plan.architecture or "?", "embedding", "an encoder has no next-token distribution to score")
    if n_ctx < 4 or n_ctx % 2 or n_ctx > plan.n_ctx:
        raise InvalidRequest(f"n_ctx must be even, 4..{plan.n_ctx}; got {n_ctx}", "ctx")
    ids = tokenizer.encode(text, add_special_tokens=True, parse_special=False)
    n_chunks = len(ids) // n_ctx
    if n_chunks < 2:
        raise InvalidRequest(f"the text has {len(ids)} tokens: perplexity needs at least 2 x n_ctx = "
                                      f"{2 * n_ctx} (use a longer text or a smaller --ctx)", "text")
    bos = tokenizer.bos_id if ids and tokenizer.bos_id is not None and ids[0] == tokenizer.bos_id else None
    chunks = [ids[c * n_ctx:(c + 1) * n_ctx] for c in range(n_chunks)]
    if bos is not None:
        chunks = [[bos] + chunk[1:] for chunk in chunks]
    handles = worker.submit_score(chunks, n_ctx // 2)
    nll = nll2 = 0.0
    count, running = 0, []
    try:
        for c, handle in enumerate(handles):
            values = handle.result().nll
            nll += float(values.sum())
            nll2 += float((values * values).sum())
            count += len(values)
            running.append(math.exp(nll / count))
            if on_chunk is not None:
                on_chunk(c, n_chunks, running[-1])
    finally:
        for handle in handles:
            handle.cancel()  # after an error or an interrupt: the rest stop (a no-op once finished)
    mean, mean2 = nll / count, nll2 / count
    var = mean2 - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 else 0.0
    return Perplexity(ppl, err, running, count)
