"""THE generation loop: prefill, sample, decode, stop. Every surface calls generate_with.

Sampling runs in C (_kernels.Sampler) and each forward in C, both with the GIL released; the
loop takes the GIL between tokens only to check cancellation and hand the token to the caller.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from . import _kernels
from .errors import Cancelled, ContextOverflow, InvalidGenerationConfig, InvalidGrammar, InvalidLogits


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
        if not 0 <= self.seed < 2**64:
            raise bad("invalid generation configuration: seed must be in [0, 2^64)")
        for tid, value in self.logit_bias:
            if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
                raise bad(f"invalid generation configuration: logit_bias key {tid!r} is not a token id")
            if not (math.isfinite(value) and -100.0 <= value <= 100.0):
                raise bad(f"invalid generation configuration: logit_bias of token {tid} must be in [-100, 100]")


class GenerationStopReason(enum.Enum):
    STOP_TOKEN = "stop_token"    # EOS or a configured stop token (kept in tokens)
    STOP_STRING = "stop_string"  # the caller's text check asked to stop
    MAX_TOKENS = "max_tokens"
    CANCELLED = "cancelled"
    GRAMMAR = "grammar"          # the request's grammar is complete: nothing may follow
    TIME_LIMIT = "time_limit"    # the server's wall-clock limit per request ran out

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish_reason."""
        return "length" if self in (GenerationStopReason.MAX_TOKENS, GenerationStopReason.TIME_LIMIT) else "stop"


@dataclass
class GenerationResult:
    tokens: list[int] = field(default_factory=list)
    stop_reason: GenerationStopReason = GenerationStopReason.MAX_TOKENS
    prompt_tokens: int = 0


# on_token returns True to go on, False to cancel, or a GenerationStopReason to stop with it
OnToken = Callable[[int], "bool | GenerationStopReason"]


def make_sampler(config: GenerationConfig, n_vocab: int) -> _kernels.Sampler:
    bias = dict(config.logit_bias)
    bad = [t for t in bias if t >= n_vocab]
    if bad:
        raise InvalidGenerationConfig(f"logit_bias token {bad[0]} is outside the vocabulary of {n_vocab}")
    return _kernels.Sampler(n_vocab, config.temperature, config.top_k or 0, config.top_p,
                            config.min_p, config.repeat_penalty, config.presence_penalty,
                            config.frequency_penalty, config.seed, bias or None)


def sampled(token: int) -> int:
    """A sampler's answer as a token id, or the error it stands for."""
    if token == _kernels.SAMPLE_NONE:
        raise InvalidGrammar("the grammar allows no token here (it cannot be continued)")
    if token < 0:
        raise InvalidLogits("model returned invalid logits (NaN or inf)")
    return token


def generate_with(decoder, prompt: Sequence[int], config: GenerationConfig,
                  cancelled: Callable[[], bool] = lambda: False,
                  on_token: OnToken = lambda token: True, constraint=None) -> GenerationResult:
    """Prefill the prompt and sample up to max_tokens. A stop token ends generation (it is in
    the result; on_token is not called for it). constraint (structured.Constraint): only the
    tokens its grammar allows are drawn, and generation ends when the grammar is complete.
    No forward pass runs after the last token."""
    config.validate()
    n_ctx = getattr(decoder, "n_ctx", None)
    if n_ctx is not None and len(prompt) + config.max_tokens > n_ctx:  # refuse before any work
        raise ContextOverflow(len(prompt) + config.max_tokens, n_ctx,
                              f" ({len(prompt)} prompt + {config.max_tokens} max_tokens)")
    stops = set(config.stop_tokens)
    result = GenerationResult(prompt_tokens=len(prompt))
    try:
        logits = decoder.prefill(prompt, should_stop=cancelled)
    except Cancelled:
        result.stop_reason = GenerationStopReason.CANCELLED
        return result
    sampler = make_sampler(config, decoder.vocab_size)
    if config.repeat_penalty != 1.0 or config.presence_penalty or config.frequency_penalty:
        for t in prompt:
            sampler.accept(int(t))
    mask = (lambda: None) if constraint is None else constraint.fill
    fused = getattr(decoder, "decode_sampled", None)  # forward + draw in one C step
    drawn = None  # the next token, when the last forward drew it
    for i in range(config.max_tokens):
        if cancelled():
            result.stop_reason = GenerationStopReason.CANCELLED
            return result
        token = sampled(sampler.sample(logits, mask()) if drawn is None else drawn)
        result.tokens.append(token)
        sampler.accept(token)
        if constraint is not None:
            constraint.advance(token)
        if token in stops:
            result.stop_reason = GenerationStopReason.STOP_TOKEN
            return result
        verdict = on_token(token)
        if verdict is False or isinstance(verdict, GenerationStopReason):
            result.stop_reason = verdict if verdict is not False else GenerationStopReason.CANCELLED
            return result
        if constraint is not None and constraint.complete:
            result.stop_reason = GenerationStopReason.GRAMMAR
            return result
        if i + 1 < config.max_tokens:
            if fused is None:
                logits = decoder.decode(token)
            else:
                sampler.mask = mask()  # the draw after token sees the grammar's state after it
                drawn = fused(token, sampler)
    result.stop_reason = GenerationStopReason.MAX_TOKENS
    return result


def generate(decoder, prompt: Sequence[int], config: GenerationConfig) -> GenerationResult:
    return generate_with(decoder, prompt, config)
