"""Text in, text out: tokenizer + (chat template) + generate_with + TextStream, one function
for every surface. Stop strings never leak; deltas never split a character."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .generation import GenerationConfig, GenerationResult, GenerationStopReason, generate_with
from .stream import TextStream
from .thinking import ThinkFilter


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
             think: str = "keep") -> TextResult:
    """Generate from token ids; on_delta(text) gets each safe delta (return False to cancel).
    eos: add the model's EOS to the stop tokens. think: keep | strip | separate <think> blocks."""
    stop_tokens = tuple(config.stop_tokens)
    if eos and decoder.eos_token is not None and decoder.eos_token not in stop_tokens:
        stop_tokens += (decoder.eos_token,)
    config = GenerationConfig(**{**config.__dict__, "stop_tokens": stop_tokens})
    stream = TextStream(lambda t: tokenizer.decode_bytes([t]), stop)
    thinking = ThinkFilter(think)
    parts: list[str] = []

    def emit(delta: str) -> bool:
        visible = thinking.feed(delta)
        parts.append(visible)
        if visible and on_delta is not None and on_delta(visible) is False:
            return False
        return True

    def on_token(token: int):
        delta = stream.push(token)
        if delta and not emit(delta):
            return False
        return GenerationStopReason.STOP_STRING if stream.stopped else True

    result = generate_with(decoder, prompt_ids, config, cancelled, on_token)
    tail = stream.finish() if result.stop_reason is not GenerationStopReason.STOP_TOKEN else stream.finish()
    if tail:
        emit(tail)
    rest = thinking.flush()
    if rest:
        parts.append(rest)
        if on_delta is not None:
            on_delta(rest)
    return TextResult("".join(parts), result, thinking.reasoning)
