"""Regenerate tests/fixtures/<model>.kl.npz: llama.cpp's next-token distributions on a real
text, the reference for rase's KL-divergence test (tests/models/test_kl.py).

    python benchmarks/kl_fixture.py MODEL.gguf NAME    # in an environment with llama-cpp-python

llama.cpp evaluates TEXT twice, one token per batch (n_batch = 1, its one-token numerics) and
512 per batch. Stored: the token ids, the top-K log-probabilities of the n_batch = 1 run at
every position, and llama.cpp's own KL(n_batch=1 || n_batch=512), both exact (full vocabulary)
and on the same top-K + rest buckets the test uses, so the test compares like with like.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

TOP_K = 64

# original prose written for this fixture (no third-party text)
TEXT = """The lighthouse at the end of the breakwater was built in 1871, when the harbour still sent
fishing boats out before dawn and waited for them long after dark. Its keeper lived in a small
stone house at the foot of the tower with his wife and two daughters, and every evening he
climbed the ninety-six steps to light the lamp, trim the wick and wind the clockwork that turned
the lens. In winter the storms came in from the north-west and threw spray over the gallery rail,
and on the worst nights he stayed at the top until morning, writing the weather in a log book
that is now kept in the town museum. The entries are short and plain: wind strong, sea rough,
lamp lit at five, two ships passed to the south, all well. When electricity reached the coast in
1952 the clockwork was replaced by a motor and the keeper by a timer, and the stone house was
sold. Today the tower is painted white every spring by volunteers, and children from the
village school walk out along the breakwater to count the steps and look at the lens, which still
throws its beam twenty miles out to sea. Most of them are surprised that something so old can
still do exactly the job it was built to do, without anyone watching over it at night."""


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def bucketed_kl(p_top_ids: np.ndarray, p_top_logp: np.ndarray, q_logp: np.ndarray) -> np.ndarray:
    """KL(p || q) per position over p's top-K tokens plus one bucket for the rest of the
    vocabulary (a lower bound of the full KL; exact when the top-K hold all of p's mass)."""
    p = np.exp(p_top_logp)
    q_top = np.take_along_axis(q_logp, p_top_ids, axis=1)
    kl = (p * (p_top_logp - q_top)).sum(axis=1)
    p_rest = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    q_rest = np.clip(1.0 - np.exp(q_top).sum(axis=1), 1e-300, 1.0)
    return kl + np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)), 0.0)


def run(model: str, n_batch: int, ids: list[int]) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=n_batch, n_ubatch=n_batch, n_threads=2,
                          logits_all=True, verbose=False)
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def main() -> int:
    model, name = sys.argv[1], sys.argv[2]
    import llama_cpp

    tok = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    ids = tok.tokenize(" ".join(TEXT.split()).encode(), add_bos=True, special=False)
    t1, b512 = log_softmax(run(model, 1, ids)), log_softmax(run(model, 512, ids))
    top = np.argsort(-t1, axis=1)[:, :TOP_K].astype(np.int32)
    top_logp = np.take_along_axis(t1, top, axis=1)
    exact = (np.exp(t1) * (t1 - b512)).sum(axis=1)
    bucketed = bucketed_kl(top, top_logp, b512)
    out = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / f"{name}.kl.npz"
    np.savez_compressed(out, ids=np.array(ids, np.int32), top_ids=top, top_logp=top_logp.astype(np.float32),
                        llama_kl_exact=exact.mean(), llama_kl_bucketed=bucketed.mean(),
                        llama_top1_agree=(t1.argmax(1) == b512.argmax(1)).mean(),
                        llama_cpp_version=llama_cpp.__version__)
    print(f"{name}: {len(ids)} tokens; llama.cpp KL(n_batch 1 || 512) exact {exact.mean():.3e}, bucketed "
          f"{bucketed.mean():.3e}; top-1 agreement {(t1.argmax(1) == b512.argmax(1)).mean():.4f} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
