"""Sampling settings: GenerationConfig (validated request fields) and the C sampler built from a
config, and what a sampler's answer stands for (a request's stop reasons: output.py). The extension is imported only where a sampler
is built or its answer read, so the scheduler (which only reads configs and stop reasons) never
imports it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidGenerationConfig, InvalidGrammar, InvalidLogits, RaseError


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    temperature: float = 0.7
    top_k: int | None = 40
    seed: int = 0
    stop_tokens: tuple[int, ...] = ()
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), OpenAI's -100..100
    draft_max: int | None = None  # speculation: at most this many drafts a step (0: none; None: as it adapts)
    draft_min: int = 0            # fewer drafts than this are not verified

    def validate(self) -> None:
        bad = InvalidGenerationConfig
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise bad("invalid generation configuration: max_tokens must be greater than zero")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise bad("invalid generation configuration: temperature must be finite and non-negative")
        if self.top_k is not None and self.top_k <= 0:
            raise bad("invalid generation configuration: top_k must be greater than zero when supplied")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("invalid generation configuration: top_p must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("invalid generation configuration: min_p must be in [0, 1]")
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise bad("invalid generation configuration: repeat_penalty must be positive")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise bad(f"invalid generation configuration: {name} must be finite")
        for name in ("draft_max", "draft_min"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise bad(f"invalid generation configuration: {name} must be a non-negative integer")
        if not 0 <= self.seed < 2**64:
            raise bad("invalid generation configuration: seed must be in [0, 2^64)")
        for tid, value in self.logit_bias:
            if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
                raise bad(f"invalid generation configuration: logit_bias key {tid!r} is not a token id")
            if not (math.isfinite(value) and -100.0 <= value <= 100.0):
                raise bad(f"invalid generation configuration: logit_bias of token {tid} must be in [-100, 100]")


def make_sampler(config: GenerationConfig, n_vocab: int) -> "rase.kernels._kernels.Sampler":
    bias = dict(config.logit_bias)
    bad = [t for t in bias if t >= n_vocab]
    if bad:
        raise InvalidGenerationConfig(f"logit_bias token {bad[0]} is outside the vocabulary of {n_vocab}")
    from ..kernels import _kernels

    return _kernels.Sampler(n_vocab, config.temperature, config.top_k or 0, config.top_p,
                            config.min_p, config.repeat_penalty, config.presence_penalty,
                            config.frequency_penalty, config.seed, bias or None)


def token_or_error(token: int) -> "int | RaseError":
    """A sampler's answer: the token id, or the error it stands for (returned, not raised, so a
    step's tokens can be handed on as data)."""
    from ..kernels import _kernels

    if token == _kernels.SAMPLE_NONE:
        return InvalidGrammar("the grammar allows no token here (it cannot be continued)")
    if token < 0:
        return InvalidLogits("model returned invalid logits (NaN or inf)")
    return token


def sampled(token: int) -> int:
    """A sampler's answer as a token id; raises the error it stands for."""
    out = token_or_error(token)
    if isinstance(out, RaseError):
        raise out
    return out


def stop_tokens_with_eos(config: GenerationConfig, eos_token: int | None, eos: bool = True) -> tuple[int, ...]:
    """config.stop_tokens plus the model's EOS (when eos and the model has one)."""
    stops = tuple(config.stop_tokens)
    if eos and eos_token is not None and eos_token not in stops:
        stops += (eos_token,)
    return stops
