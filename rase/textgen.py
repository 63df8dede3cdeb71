"""Text in, text out for one request served alone: tokenizer + (chat template) + generate_with +
TextState. Stop strings never leak; deltas never split a character. The batched engine
(worker.py) gives the same text for the same request."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .generation import GenerationConfig, GenerationResult, generate_with
from .textstate import TextState


@dataclass
class TextResult:
    text: str
    result: GenerationResult
    reasoning: str = ""

    @property
    def finish_reason(self) -> str:
        return self.result.stop_reason.finish_reason


def stop_tokens_with_eos(config: GenerationConfig, eos_token: int | None, eos: bool = True) -> tuple[int, ...]:
    """config.stop_tokens plus the model's EOS (when eos and the model has one)."""
    stops = tuple(config.stop_tokens)
    if eos and eos_token is not None and eos_token not in stops:
        stops += (eos_token,)
    return stops


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
