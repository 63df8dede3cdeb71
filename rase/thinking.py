"""Qwen3-style reasoning blocks: keep them, strip them, or separate them from the answer.

Handles what hybrid models emit even under /no_think: an empty <think></think>, a </think>
with no opening tag, or a duplicated closing tag at the head of the stream. Works on streamed
deltas: a tag split across deltas is held back until it is complete or ruled out.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
MODES = ("keep", "strip", "separate")
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
    def __init__(self, mode: str = "keep") -> None:
        if mode not in MODES:
            raise ValueError(f"think mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.reasoning = ""
        self._pending = ""
        self._inside = False
        self._answer_started = False  # stray closing tags are only dropped at the head

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
