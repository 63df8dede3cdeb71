"""One request's own facts in the serving engine: its prompt, config, tokens, sampler,
constraint, state, timings and handle; and the Completion they make at its end (output.py).

There is no prefill phase and no decode phase: `tokens` holds the prompt and everything sampled
so far, `n_computed` counts the positions whose K/V is in the pool, and each step computes some
of the difference (a chunk of the prompt, or the one token sampled last). A prefix-cache hit
simply starts n_computed past zero. Its memory (blocks, trie nodes, a state slot, draft blocks)
is the KV manager's, by the request's id (kv_manager.py).
"""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from ..output import Completion, GenerationStopReason
from .sampling import GenerationConfig

_IDS = itertools.count(1)


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False)
class Request:
    prompt: list[int]
    config: GenerationConfig     # stop_tokens include the model's EOS when it stops on it
    text: Any                    # TextState-like: feed(token) -> output.Output, finish(), pending_calls(),
                                 # pending_reasoning(), text, reasoning
    sampler: Any = None          # _kernels.Sampler (opaque to the scheduler)
    constraint: Any = None       # structured.Constraint: the grammar its tokens must follow, or None
    logprobs: int | None = None  # None: off; else how many top alternatives each token reports
    after: Any = None            # a Request whose prompt must be computed first (n > 1: its KV is shared)
    media: Any = None            # media.PromptMedia: the prompt's image rows (placeholder ids), or None
    collect: Any = None          # a prompt-only request's reader of its rows (embeddings.Pooling,
                                 # perplexity.Scoring): no tokens sampled, no prefix cache
    id: int = field(default_factory=lambda: next(_IDS))
    state: State = State.WAITING
    tokens: list[int] = field(default_factory=list)
    n_computed: int = 0          # positions whose K/V the pool holds (its memory: the KV manager's, by id)
    cached_tokens: int = 0
    generated: int = 0
    stop_reason: GenerationStopReason | None = None
    error: BaseException | None = None
    cancel_requested: bool = False  # set by any thread; the scheduler acts on it next step
    handle: Any = None              # the channel.RequestHandle its worker reports to
    submitted: float = field(default_factory=time.monotonic)
    deadline: float | None = None   # time.monotonic() past which it stops (TIME_LIMIT)
    first_token: float | None = None
    last_token: float | None = None
    logprob_entries: list = field(default_factory=list)  # logprobs.TokenLogprob per shown token
    drafted: int | None = None      # draft tokens its steps verified (None: it does not speculate)
    draft_accepted: int = 0         # of those, the ones that held

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)
        self.stop_tokens = frozenset(self.config.stop_tokens)

    @property
    def remaining(self) -> int:
        """Positions known but not yet computed (1 = the last sampled token: a decode row)."""
        return len(self.tokens) - self.n_computed

    @property
    def max_positions(self) -> int:
        """Positions this request may occupy: the prompt and every token it may sample."""
        return len(self.prompt) + (0 if self.collect is not None else self.config.max_tokens)

    @property
    def penalized(self) -> bool:
        c = self.config
        return c.repeat_penalty != 1.0 or c.presence_penalty != 0.0 or c.frequency_penalty != 0.0

    def completion(self) -> Completion:
        reason = "cancelled" if self.stop_reason is GenerationStopReason.CANCELLED else (
            self.stop_reason.finish_reason if self.stop_reason else "stop")
        prompt_s = ((self.first_token or self.submitted) - self.submitted)
        gen_s = (self.last_token - self.first_token) if self.first_token and self.last_token else 0.0
        prompt_n = len(self.prompt) - self.cached_tokens
        timings = dict(prompt_n=prompt_n, cached_n=self.cached_tokens, ttft_ms=round(prompt_s * 1e3, 3),
                       prompt_per_second=round(prompt_n / prompt_s, 2) if prompt_s > 0 else None,
                       predicted_n=self.generated, predicted_ms=round(gen_s * 1e3, 3),
                       predicted_per_second=round((self.generated - 1) / gen_s, 2) if gen_s > 0 else None)
        if self.drafted is not None:  # llama-server's names
            timings.update(draft_n=self.drafted, draft_n_accepted=self.draft_accepted)
        calls = list(getattr(self.text, "calls", ()))
        if calls and reason != "cancelled":
            reason = "tool_calls"
        return Completion(self.text.text, reason, len(self.prompt), self.generated, self.text.reasoning,
                          self.cached_tokens, timings, calls,
                          None if self.logprobs is None else list(self.logprob_entries),
                          getattr(self.collect, "vector", None), getattr(self.collect, "nll", None),
                          getattr(self.text, "reasoning_tokens", 0), getattr(self.text, "stop_sequence", None))


class NoText:
    """The text state of a request that generates none (a prompt-only request)."""
    text = reasoning = ""
    calls = ()

    def finish(self) -> str:
        return ""

    def pending_calls(self) -> tuple:
        return ()

    def pending_reasoning(self) -> str:
        return ""
