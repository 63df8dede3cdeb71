"""Qwen3-style reasoning blocks: keep them, strip them, or separate them from the answer.

Handles what hybrid models emit even under /no_think: an empty <think></think>, a </think>
with no opening tag, or a duplicated closing tag at the head of the stream. Works on streamed
deltas: a tag split across deltas is held back until it is complete or ruled out.
"""
from __future__ import annotations

import numpy as np

OPEN, CLOSE = "<think>", "</think>"
MODES = ("keep", "strip", "separate")
# llama-server's --reasoning-format -> think mode on the OpenAI surface ("auto": deepseek's)
REASONING_FORMATS = {"none": "keep", "deepseek": "separate", "auto": "separate"}
NO_THINK = "/no_think"


def with_no_think(messages: list[dict]) -> list[dict]:
    """Messages with Qwen's /no_think soft switch in the system prompt (added if absent)."""
    out = [dict(m) for m in messages]
    for m in out:
        if m.get("role") == "system":
            if NO_THINK not in m.get("content", ""):
                m["content"] = (m.get("content", "") + " " + NO_THINK).strip()
            return out
    return [{"role": "system", "content": NO_THINK}] + out


class ThinkFilter:
    def __init__(self, mode: str = "keep", opened: bool = False) -> None:
        """opened: the prompt ends inside a reasoning block (a template that writes <think>)."""
        if mode not in MODES:
            raise ValueError(f"think mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.reasoning = ""
        self._pending = ""
        self._inside = opened
        self._answer_started = False  # stray closing tags are only dropped at the head

    @property
    def inside(self) -> bool:
        """Within a reasoning block being separated (or stripped) now."""
        return self._inside and self.mode != "keep"

    def _partial_tag(self, text: str) -> int:
        """Length of a suffix of text that could begin <think> or </think>."""
        for k in range(min(len(CLOSE) - 1, len(text)), 0, -1):
            tail = text[-k:]
            if OPEN.startswith(tail) or CLOSE.startswith(tail):
                return k
        return 0

    def feed(self, delta: str) -> str:
        if self.mode == "keep":
            return delta
        text = self._pending + delta
        out: list[str] = []
        while text:
            if self._inside:
                end = text.find(CLOSE)
                if end < 0:
                    keep = self._partial_tag(text)
                    self.reasoning += text[:len(text) - keep]
                    text = text[len(text) - keep:]
                    break
                self.reasoning += text[:end]
                text = text[end + len(CLOSE):]
                self._inside = False
                continue
            i_open, i_close = text.find(OPEN), text.find(CLOSE)
            if i_close >= 0 and (i_open < 0 or i_close < i_open) and not self._answer_started \
                    and not text[:i_close].strip():
                text = text[i_close + len(CLOSE):]  # a stray or duplicated </think> at the head
                continue
            if i_open >= 0 and not self._answer_started and not text[:i_open].strip():
                text = text[i_open + len(OPEN):]
                self._inside = True
                continue
            keep = self._partial_tag(text) if not self._answer_started else 0
            visible = text[:len(text) - keep]
            if not self._answer_started:
                stripped = visible.lstrip()
                if stripped:
                    self._answer_started = True
                    visible = stripped
                else:
                    keep = len(text)  # only whitespace so far: wait (it may precede a tag)
                    visible = ""
            out.append(visible)
            text = text[len(text) - keep:] if keep else ""
            break
        self._pending = text
        return "".join(out)

    def flush(self) -> str:
        """End of stream: whatever is pending is answer text (or unclosed reasoning)."""
        rest, self._pending = self._pending, ""
        if self.mode == "keep":
            return ""
        if self._inside:
            self.reasoning += rest
            return ""
        return rest if self._answer_started else rest.strip()


def _bit(mask: np.ndarray, token: int) -> None:
    mask.view(np.uint32)[token // 32] |= np.uint32(1 << (token % 32))


class ReasoningGate:
    """A reasoning model's constraint (or None) held back while it reasons: free text inside
    <think>...</think>, the constraint from the first token after </think> (so a JSON answer
    is not forced into the reasoning), and </think> forced once `budget` tokens were reasoned
    (None: no budget). Before any reasoning, the first token may open the block or begin the
    answer. opened: the prompt already opened it. The scheduler's constraint protocol: fill()
    -> bit mask of allowed tokens or None, advance(token), complete."""

    def __init__(self, inner, tags: tuple[int, int], n_words: int, eos: list[int], opened: bool = False,
                 budget: int | None = None) -> None:
        self.inner, (self.open, self.close), self.budget = inner, tags, budget
        self.phase = "thinking" if opened else "before"
        self.reasoned = 0  # tokens inside the block so far
        self._only_close = np.zeros(n_words, np.int32)
        _bit(self._only_close, self.close)
        # while reasoning, a constrained answer may not end before it starts
        self._no_eos = np.full(n_words, -1, np.int32)
        for t in eos:
            self._no_eos.view(np.uint32)[t // 32] &= ~np.uint32(1 << (t % 32))

    def fill(self) -> np.ndarray | None:
        if self.phase == "thinking":
            if self.budget is not None and self.reasoned >= self.budget:
                return self._only_close
            return None if self.inner is None else self._no_eos
        mask = None if self.inner is None else self.inner.fill()
        if self.phase == "before" and mask is not None:
            mask = mask.copy()
            _bit(mask, self.open)
        return mask

    def advance(self, token: int) -> None:
        if self.phase == "thinking":
            self.reasoned += 1
            if token == self.close:
                self.phase = "answer"
            return
        if self.phase == "before" and token == self.open:
            self.phase = "thinking"
            return
        self.phase = "answer"
        if self.inner is not None:
            self.inner.advance(token)

    @property
    def complete(self) -> bool:
        return self.phase == "answer" and self.inner is not None and self.inner.complete
