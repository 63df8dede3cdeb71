"""What a request gives back, in one shape from its text state through its channel to every
surface: an Output per token (the text that token makes safe to show, reasoning separated from
it, the tool calls it completes, its log-probabilities), the reasons a request ends, and the
Completion at its end. Each surface renders Outputs in its own dialect (server/, and the Python
API's stream items: python_items)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


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


@dataclass(frozen=True)
class Output:
    """What one token adds to an answer, in the order a surface shows it: reasoning, text, calls
    (logprobs describe the token; its text may come later, held back until no stop string can
    match)."""
    text: str = ""          # visible text to hand out now
    reasoning: str = ""     # separated reasoning to hand out before it (<think> blocks, harmony's analysis)
    calls: tuple = ()       # text.tools.ToolCallDelta of the calls this token completed
    logprobs: tuple = ()    # engine.logprobs.TokenLogprob of this token, when the request asks
    stop: GenerationStopReason | None = None  # the text state's verdict: this token ends the request

    def __bool__(self) -> bool:
        """Whether it carries anything to show (a token held back, or shown as nothing, does not)."""
        return bool(self.text or self.reasoning or self.calls or self.logprobs)


@dataclass
class Completion:
    text: str
    finish_reason: str          # "stop" | "length" | "tool_calls" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    reasoning: str = ""
    cached_tokens: int = 0      # prompt tokens whose K/V came from the prefix cache
    timings: dict = field(default_factory=dict)
    tool_calls: list = field(default_factory=list)  # text.tools.ToolCall (finish_reason "tool_calls")
    logprobs: list | None = None  # engine.logprobs.TokenLogprob per token, when asked
    embedding: Any = None       # float32 (n_embd,): an embedding request's pooled vector
    nll: Any = None             # float64 (k,): a scoring request's -log p of each scored next token
    reasoning_tokens: int = 0   # completion tokens that were reasoning (a <think> block with its tags, harmony's analysis)
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop")


# ---------------------------------------------------------------- the Python API's stream items


@dataclass(frozen=True)
class ReasoningDelta:
    """Streamed reasoning text (a <think> block separated, harmony's analysis channel)."""
    text: str


@dataclass(frozen=True)
class LogprobDelta:
    """Streamed with the tokens it describes."""
    entries: tuple


def python_items(out: Output) -> list:
    """An Output as the Python API streams it (Engine.stream_chat, iterating a RequestHandle): a
    ReasoningDelta, the text (str), each ToolCallDelta, a LogprobDelta, in that order, each only
    when there is one."""
    items: list = [ReasoningDelta(out.reasoning)] if out.reasoning else []
    if out.text:
        items.append(out.text)
    items.extend(out.calls)
    if out.logprobs:
        items.append(LogprobDelta(out.logprobs))
    return items
