"""GGUF decoders: the manual's TokenDecoder contract over the C forward.

prefill(tokens) resets the KV cache, evaluates the prompt in chunks (GEMM path) and returns
the last position's logits; decode(token) appends one token (matvec path). Logits are rank-1
float32 arrays of vocabulary size. The GIL is released inside every forward call.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Sequence

import numpy as np

from . import _kernels
from .config import PROFILE, default_threads
from .errors import (
    Cancelled, ContextOverflow, CorruptModelFile, InvalidGenerationConfig, InvalidLogits,
    UnsupportedArchitecture,
)
from .gguf import GGUFFile
from .models import ARCHITECTURES, resolve
from .models.base import build_plan, read_hparams

# RASE_PROFILE=1 phase counters, the manual's names in its order; paths rase does not have stay 0
PROFILE_KEYS = ("prefill_calls", "prefill_tokens", "prefill_forward_ns", "gemm_dequant_ns",
                "gemm_matmul_ns", "gemm_gpu_ns", "gemm_gpu_calls", "attn_blocked_ns", "attn_flash_ns",
                "decode_steps", "decode_forward_ns", "decode_matvec_ns", "decode_attn_ns")
_PROFILE = dict.fromkeys(PROFILE_KEYS, 0)
_PROFILE_LOCK = threading.Lock()


def profile_snapshot(reset: bool = True) -> dict:
    with _PROFILE_LOCK:
        out = {"enabled": PROFILE, **_PROFILE}
        if reset:
            for k in _PROFILE:
                _PROFILE[k] = 0
    return out


def _profile_add(fwd, prefill: bool, tokens: int, ns: int) -> None:
    matmul, attn = fwd.take_profile()
    with _PROFILE_LOCK:
        if prefill:
            _PROFILE["prefill_calls"] += 1
            _PROFILE["prefill_tokens"] += tokens
            _PROFILE["prefill_forward_ns"] += ns
            _PROFILE["gemm_matmul_ns"] += matmul
            _PROFILE["attn_blocked_ns"] += attn
        else:
            _PROFILE["decode_steps"] += 1
            _PROFILE["decode_forward_ns"] += ns
            _PROFILE["decode_matvec_ns"] += matmul
            _PROFILE["decode_attn_ns"] += attn


DEFAULT_MAX_CTX = 4096   # KV cache positions when the caller does not say (cheap: pages fill lazily)
PREFILL_CHUNK = 512      # tokens per prefill call: llama.cpp's default ubatch, so rounding matches


class GGUFDecoder:
    """One loaded model with its own KV cache. Not thread-safe: sessions serialize callers."""

    def __init__(self, path: str | os.PathLike[str], architecture: str | None = None,
                 n_ctx: int | None = None, n_threads: int | None = None,
                 chunk: int = PREFILL_CHUNK) -> None:
        self.gguf = GGUFFile(path)
        file_arch = self.gguf.architecture
        if file_arch is None:
            raise CorruptModelFile(self.gguf.path, "metadata general.architecture is missing")
        self.architecture = resolve(file_arch)
        if architecture is not None and resolve(architecture) != self.architecture:
            raise UnsupportedArchitecture(
                architecture, reason=f"the file declares {file_arch!r}; register the model "
                f"with architecture {file_arch!r} or leave it unset")
        hp = read_hparams(self.gguf)
        self.hparams = hp
        self.n_ctx = min(hp.context_length, DEFAULT_MAX_CTX) if n_ctx is None else int(n_ctx)
        if self.n_ctx < 1:
            raise InvalidGenerationConfig(f"n_ctx must be positive, got {n_ctx}")
        spec = ARCHITECTURES[self.architecture].spec(self.gguf, hp)
        hpd, tensors, layers = build_plan(self.gguf, hp, spec, self.n_ctx)
        threads = default_threads() if n_threads is None else int(n_threads)
        if threads < 1:
            raise InvalidGenerationConfig(f"n_threads must be positive, got {n_threads}")
        # chunks are a multiple of 4 tokens: llama.cpp multiplies full groups of 4 differently
        chunk = max(4, min(int(chunk), self.n_ctx) // 4 * 4)
        try:
            self._fwd = _kernels.Forward(hpd, tensors, layers, threads, chunk)
        except ValueError as exc:
            raise CorruptModelFile(self.gguf.path, str(exc)) from None
        eos = self.gguf.get("tokenizer.ggml.eos_token_id")
        self.eos_token: int | None = eos if self.gguf.metadata_types.get(
            "tokenizer.ggml.eos_token_id") == 4 else None  # the manual: only a u32 counts
        self.vocab_size = hp.n_vocab
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
            raise InvalidGenerationConfig(f"token id {bad} is outside the vocabulary of {self.vocab_size}")

    def _logits(self, out: np.ndarray) -> np.ndarray:
        if not np.isfinite(out).all():
            raise InvalidLogits("model returned invalid logits (NaN or inf)")
        return out

    def prefill(self, tokens: Sequence[int], all_logits: bool = False,
                should_stop: Callable[[], bool] | None = None) -> np.ndarray:
        """Reset the cache and evaluate the prompt; logits of the last position (vocab,), or of
        every position (n, vocab) with all_logits."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        if ids.size == 0:
            raise InvalidGenerationConfig("the prompt must contain at least one token")
        if ids.size > self.n_ctx:
            raise ContextOverflow(int(ids.size), self.n_ctx)
        self._check(ids)
        self.position = 0
        chunk = self._fwd.max_batch
        outs = []
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
            if PROFILE:
                _profile_add(self._fwd, part.size > 1, int(part.size), time.perf_counter_ns() - t0)
            self.position = start + part.size
        out = np.concatenate(outs) if all_logits else outs[-1][0]
        return self._logits(out)

    def decode(self, token: int) -> np.ndarray:
        """Append one token at the next position; logits (vocab,)."""
        if self.position >= self.n_ctx:
            raise ContextOverflow(self.position + 1, self.n_ctx)
        ids = np.array([token], dtype=np.int32)
        self._check(ids)
        t0 = time.perf_counter_ns() if PROFILE else 0
        out = self._fwd.run(ids, self.position, 1)[0]
        if PROFILE:
            _profile_add(self._fwd, False, 1, time.perf_counter_ns() - t0)
        self.position += 1
        return self._logits(out)


def load_gguf_decoder(architecture: str | None, path: str | os.PathLike[str], **kwargs) -> GGUFDecoder:
    """The manual's dispatcher: llama/llama2/llama3/mistral/mixtral -> llama, qwen3, gemma3;
    qwen2 and phi are refused with the manual's messages."""
    if architecture is not None:
        resolve(architecture)  # refuse before touching the file
    return GGUFDecoder(path, architecture, **kwargs)
