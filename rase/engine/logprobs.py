"""Token log-probabilities for OpenAI's logprobs / top_logprobs: the log-softmax of the model's
raw logits (before logit_bias, penalties, temperature and any grammar mask), computed only for
requests that ask, in the shapes of chat (`content` entries with bytes) and completions
(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

MAX_TOP_CHAT, MAX_TOP_COMPLETION = 20, 5


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    bytes: bytes                                # exact; text may end inside a UTF-8 character
    logprob: float
    top: tuple[tuple[int, bytes, float], ...]   # the most likely tokens, best first

    @property
    def text(self) -> str:
        return self.bytes.decode("utf-8", "replace")


def token_logprob(row: np.ndarray, token: int, top: int, token_bytes: Callable[[int], bytes]) -> TokenLogprob:
    x = np.asarray(row, dtype=np.float32)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m, dtype=np.float32).sum(dtype=np.float64)))
    best: tuple = ()
    if top > 0:
        idx = np.argpartition(-x, top - 1)[:top]
        idx = idx[np.lexsort((idx, -x[idx]))]  # by logit, ties to the lower id
        best = tuple((int(i), token_bytes(int(i)), float(x[i]) - lse) for i in idx)
    return TokenLogprob(int(token), token_bytes(int(token)), float(x[token]) - lse, best)


def chat_logprobs(entries) -> dict:
    def one(tid, b, lp):
        return {"token": b.decode("utf-8", "replace"), "bytes": list(b), "logprob": lp}

    return {"content": [{**one(e.token, e.bytes, e.logprob), "top_logprobs": [one(*t) for t in e.top]}
                        for e in entries], "refusal": None}


def completion_logprobs(entries) -> dict:
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e.text)
    return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{b.decode("utf-8", "replace"): lp for _, b, lp in e.top} for e in entries],
            "text_offset": offsets}
