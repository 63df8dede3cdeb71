"""llama.cpp itself, through llama-cpp-python (a test extra, built from PyPI), as the live
reference for embeddings and perplexity on the same GGUF file."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POOLING = {"mean": 1, "last": 3}  # llama.cpp's LLAMA_POOLING_TYPE_*


def llama(path, **kw):
    """llama_cpp.Llama on llama.cpp's plain CPU kernels (use_extra_bufts off, as `--repack 0`): built
    natively on a CPU with AMX, 0.3.36 repacks the weights for its AMX kernels, which segfault on
    the first batch there (seen on a Xeon with amx_int8, SmolLM2 and Gemma3 alike)."""
    import llama_cpp
    from llama_cpp import Llama

    defaults = llama_cpp.llama_cpp.llama_model_default_params  # what Llama() starts from

    def plain():
        params = defaults()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_cpp.llama_model_default_params = plain
    try:
        return Llama(model_path=str(path), verbose=False, **kw)
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults


def _llama(path, **kw):
    return llama(path, n_threads=2, **kw)


def embeddings(path, texts: list[str], pooling: str) -> list[np.ndarray]:
    """llama.cpp's embedding=True vectors (its pooling, L2-normalized), one text at a time."""
    llm = _llama(path, embedding=True, pooling_type=POOLING[pooling], n_ctx=512)
    try:
        return [np.asarray(llm.embed(t, normalize=True), np.float64) for t in texts]
    finally:
        llm.close()


@dataclass
class Perplexity:
    ppl: float
    error: float
    chunks: list[float]


def perplexity(path, text: str, n_ctx: int, n_batch: int = 512) -> Perplexity:
    """llama-perplexity's procedure on llama.cpp's logits: chunks of n_ctx tokens (BOS first),
    the second half of each scored, log-softmax in float64, its error estimate."""
    llm = _llama(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, logits_all=True)
    try:
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        nll = nll2 = 0.0
        count, chunks = 0, []
        for i in range(len(tokens) // n_ctx):
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
            chunk[0] = llm.token_bos()
            llm.reset()
            llm.eval(chunk)
            logits = np.asarray(llm.scores[:n_ctx], np.float64)
            for j in range(n_ctx // 2, n_ctx - 1):
                row = logits[j]
                top = row.max()
                lp = row[chunk[j + 1]] - top - math.log(np.exp(row - top).sum())
                nll, nll2, count = nll - lp, nll2 + lp * lp, count + 1
            chunks.append(math.exp(nll / count))
    finally:
        llm.close()
    mean = nll / count
    error = math.sqrt(max(nll2 / count - mean * mean, 0.0) / (count - 1)) * math.exp(mean)
    return Perplexity(math.exp(mean), error, chunks)
