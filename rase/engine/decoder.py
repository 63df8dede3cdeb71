"""GGUF decoders: the manual's TokenDecoder contract over the C forward.

prefill(tokens) resets the KV cache, evaluates the prompt in chunks and returns the last
position's logits; decode(token) appends one token. Every position is computed by the same
arithmetic however the prompt is chunked (the one-token numerics, equal to llama.cpp's
n_batch = 1 results). Logits are rank-1 float32 arrays of vocabulary size. The GIL is released
inside every forward call. One sequence over a Forward of its own: the tests' single-stream
oracle (tests/support/single_stream.py) and the benchmarks use it; rase serves every request through
the model's worker (worker.py) instead.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import numpy as np

from ..kernels import _kernels
from ..config import PROFILE, default_threads
from ..errors import Cancelled, ContextOverflow, InvalidRequest, InvalidLogits
from ..models import resolve
from ..store.plan import ModelPlan, blocks_for, check_kv_type, load_plan
from .profiling import profile_add

PREFILL_CHUNK = 512      # tokens per prefill call (any chunking gives the same bits)


class GGUFDecoder:
    """One loaded model with its own KV cache. Not thread-safe: sessions serialize callers."""

    def __init__(self, path: str | os.PathLike[str] | ModelPlan, architecture: str | None = None,
                 n_ctx: int | None = None, n_threads: int | None = None,
                 chunk: int = PREFILL_CHUNK, kv_type: str = "f16", kv_rotate: bool = True) -> None:
        plan = path if isinstance(path, ModelPlan) else load_plan(path, architecture, n_ctx)
        self.plan = plan
        self.gguf, self.architecture, self.hparams = plan.gguf, plan.architecture, plan.hparams
        self.eos_token, self.vocab_size = plan.eos_token, plan.vocab_size
        # a shared plan keeps its context; this decoder's cache may be shorter
        self.n_ctx = plan.n_ctx if n_ctx is None or not isinstance(path, ModelPlan) else min(plan.n_ctx, int(n_ctx))
        if self.n_ctx < 1:
            raise InvalidRequest(f"n_ctx must be positive, got {n_ctx}")
        threads = default_threads() if n_threads is None else int(n_threads)
        if threads < 1:
            raise InvalidRequest(f"n_threads must be positive, got {n_threads}")
        chunk = max(1, min(int(chunk), self.n_ctx))
        self._fwd = _kernels.Forward(plan.weights, blocks_for(self.n_ctx), chunk, threads, kv_type=check_kv_type(plan, kv_type),
                                     kv_rotate=kv_rotate)
        self.position = 0
        if PROFILE:
            self._fwd.take_profile()  # switches the C timers on

    @property
    def n_threads(self) -> int:
        return self._fwd.n_threads

    def reset(self) -> None:
        self.position = 0

    def _check(self, tokens: np.ndarray) -> None:
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            bad = int(tokens[(tokens < 0) | (tokens >= self.vocab_size)][0])
            raise InvalidRequest(f"token id {bad} is outside the vocabulary of {self.vocab_size}")

    @staticmethod
    def _logits(out: np.ndarray, finite: bool) -> np.ndarray:
        # finite: the step's own check (Forward.logits_finite); a numpy pass here cost ~2% of a decode
        if not finite:
            raise InvalidLogits("model returned invalid logits (NaN or inf)")
        return out

    def prefill(self, tokens: Sequence[int], all_logits: bool = False,
                should_stop: Callable[[], bool] | None = None) -> np.ndarray:
        """Reset the cache and evaluate the prompt; logits of the last position (vocab,), or of
        every position (n, vocab) with all_logits."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        if ids.size == 0:
            raise InvalidRequest("the prompt must contain at least one token")
        if ids.size > self.n_ctx:
            raise ContextOverflow(int(ids.size), self.n_ctx)
        self._check(ids)
        self.position = 0
        chunk = self._fwd.max_rows
        outs, finite = [], True
        for start in range(0, ids.size, chunk):
            if should_stop is not None and start and should_stop():
                raise Cancelled("prefill cancelled")
            part = ids[start:start + chunk]
            last = start + chunk >= ids.size
            n_out = part.size if all_logits else (1 if last else 0)
            t0 = time.perf_counter_ns() if PROFILE else 0
            out = self._fwd.run(part, start, max(1, n_out))
            if n_out:
                outs.append(out)
                finite = finite and self._fwd.logits_finite
            if PROFILE:
                profile_add(self._fwd, part.size > 1, int(part.size), time.perf_counter_ns() - t0)
            self.position = start + part.size
        out = np.concatenate(outs) if all_logits else outs[-1][0]
        return self._logits(out, finite)

    def decode(self, token: int) -> np.ndarray:
        """Append one token at the next position; logits (vocab,)."""
        if self.position >= self.n_ctx:
            raise ContextOverflow(self.position + 1, self.n_ctx)
        if not 0 <= token < self.vocab_size:
            raise InvalidRequest(f"token id {token} is outside the vocabulary of {self.vocab_size}")
        ids = np.array([token], dtype=np.int32)
        t0 = time.perf_counter_ns() if PROFILE else 0
        out = self._fwd.run(ids, self.position, 1)[0]
        if PROFILE:
            profile_add(self._fwd, False, 1, time.perf_counter_ns() - t0)
        self.position += 1
        return self._logits(out, self._fwd.logits_finite)

    def decode_sampled(self, token: int, sampler) -> int:
        """decode(token), then sampler's draw from its logits, in one C step (the generation
        loop's per-token path): the drawn id, or the sampler's SAMPLE_INVALID / SAMPLE_NONE.
        The logits row is last_logits until the next call."""
        if self.position >= self.n_ctx:
            raise ContextOverflow(self.position + 1, self.n_ctx)
        if not 0 <= token < self.vocab_size:
            raise InvalidRequest(f"token id {token} is outside the vocabulary of {self.vocab_size}")
        t0 = time.perf_counter_ns() if PROFILE else 0
        drawn = self._fwd.decode_sampled(token, self.position, sampler)
        if PROFILE:
            profile_add(self._fwd, False, 1, time.perf_counter_ns() - t0)
        self.position += 1
        return drawn

    @property
    def last_logits(self) -> np.ndarray:
        return self._fwd.last_logits


def load_gguf_decoder(architecture: str | None, path: str | os.PathLike[str], **kwargs) -> GGUFDecoder:
    """The manual's dispatcher, widened: every models.ARCHITECTURES name and alias
    (llama2/llama3/mistral/mixtral -> llama, qwen2.5 -> qwen2, phi4 -> phi3); phi2, Qwen 1 and
    qwen2moe are refused by name with what to use instead."""
    if architecture is not None:
        resolve(architecture)  # refuse before touching the file
    return GGUFDecoder(path, architecture, **kwargs)
