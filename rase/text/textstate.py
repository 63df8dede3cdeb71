"""One request's text, token by token: feed(token) -> output.Output (the text that is safe to
show, the reasoning separated from it, and whether a stop string ended the request).

Wraps the incremental detokenizer and stop strings (stream.TextStream) and the <think> filter
(thinking.ThinkFilter, whose separated reasoning streams as Output.reasoning); a stop string
ends the request. Stop tokens and max_tokens are the
scheduler's rules (scheduler.Scheduler.update): those tokens never reach feed. The tests'
single-stream oracle (tests/support/single_stream.py) uses the same object, so a request gives the
same text served alone or batched.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..output import GenerationStopReason, Output
from .stream import TextStream
from .thinking import ThinkFilter


class TextState:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = (), think: str = "keep",
                 opened: bool = False) -> None:
        """think: thinking.MODES; opened: the prompt ends inside a <think> block."""
        self.token_bytes = token_bytes
        self._stream = TextStream(token_bytes, stop)
        self._think = ThinkFilter(think, opened)
        self._reasoning_sent = 0
        self.reasoning_tokens = 0  # tokens fed while inside a separated or stripped block
        self._parts: list[str] = []
        self.finished = False

    @classmethod
    def for_tokenizer(cls, tokenizer, **kw) -> "TextState":
        return cls(lambda t: tokenizer.decode_bytes([t]), **kw)

    def _show(self, delta: str) -> str:
        visible = self._think.feed(delta) if delta else ""
        if visible:
            self._parts.append(visible)
        return visible

    def feed(self, token: int) -> Output:
        """The text this token makes safe to show, and whether a stop string ended the
        request (the text is cut before it)."""
        inside = self._think.inside
        text = self._show(self._stream.push(token))
        self.reasoning_tokens += inside or self._think.inside
        return Output(text, self.pending_reasoning(),
                      stop=GenerationStopReason.STOP_STRING if self._stream.stopped else None)

    def finish(self) -> str:
        """End of the request: the text held back until now (visible part)."""
        if self.finished:
            return ""
        self.finished = True
        tail = self._show(self._stream.finish())
        rest = self._think.flush()
        if rest:
            self._parts.append(rest)
        return tail + rest

    def pending_calls(self) -> tuple:
        """Tool calls not yet handed out (none: plain text; see tools.ToolText)."""
        return ()

    def pending_reasoning(self) -> str:
        """Separated reasoning not yet handed out as deltas."""
        r = self._think.reasoning
        out, self._reasoning_sent = r[self._reasoning_sent:], len(r)
        return out

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def reasoning(self) -> str:
        return self._think.reasoning

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the request, if one did."""
        return self._stream.matched
