"""The single-stream loop: one request served alone, token by token over a GGUFDecoder (prefill,
sample, decode, stop), and its text through the same TextState the engine uses. It is the
oracle the batched engine (rase/engine/worker.py) is held to: the same request gives the same tokens
and text however the worker batches it. rase itself serves every request through the worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from rase.errors import Cancelled, ContextOverflow
from rase.engine.sampling import GenerationConfig, make_sampler, sampled, stop_tokens_with_eos
from rase.output import GenerationStopReason
from rase.text.textstate import TextState


@dataclass
class GenerationResult:
    tokens: list[int] = field(default_factory=list)
    stop_reason: GenerationStopReason = GenerationStopReason.MAX_TOKENS
    prompt_tokens: int = 0


# on_token returns True to go on, False to cancel, or a GenerationStopReason to stop with it
OnToken = Callable[[int], "bool | GenerationStopReason"]


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


@dataclass
class TextResult:
    text: str
    result: GenerationResult
    reasoning: str = ""

    @property
    def finish_reason(self) -> str:
        return self.result.stop_reason.finish_reason


def run_text(decoder, tokenizer, prompt_ids: Sequence[int], config: GenerationConfig,
             stop: Sequence[str] = (), on_delta: Callable[[str], bool | None] | None = None,
             cancelled: Callable[[], bool] = lambda: False, eos: bool = True,
             think: str = "keep", constraint=None) -> TextResult:
    """Generate from token ids; on_delta(text) gets each safe delta (return False to cancel).
    eos: add the model's EOS to the stop tokens. think: keep | strip | separate <think> blocks.
    constraint: a structured.Constraint the output must follow."""
    config = GenerationConfig(**{**config.__dict__,
                                 "stop_tokens": stop_tokens_with_eos(config, decoder.eos_token, eos)})
    state = TextState.for_tokenizer(tokenizer, stop=stop, think=think)

    def on_token(token: int):
        delta = state.feed(token)
        if delta.text and on_delta is not None and on_delta(delta.text) is False:
            return False
        return delta.stop or True

    result = generate_with(decoder, prompt_ids, config, cancelled, on_token, constraint)
    tail = state.finish()
    if tail and on_delta is not None:
        on_delta(tail)
    return TextResult(state.text, result, state.reasoning)
