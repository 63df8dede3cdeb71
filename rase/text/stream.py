"""Token ids -> text deltas for every surface: incremental UTF-8 decoding that never emits a
broken character, and stop strings that never leak (only text that could still begin a stop
string is held back; the output is cut at the earliest match; the rest is flushed at the end).
"""
from __future__ import annotations

import codecs
from typing import Callable, Sequence


class TextStream:
    """push(token) -> the text that is safe to show now; finish() -> the remainder.

    The concatenation of every delta equals the non-streamed result: decode(all tokens) cut
    before the earliest stop string.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops = [s for s in stop if s]  # empty stop strings match nothing
        self.text = ""          # decoded so far (complete characters only)
        self.emitted = 0        # characters handed out
        self.stopped = False    # a stop string matched: later tokens are ignored
        self.matched: str | None = None  # the stop string that matched (the earliest; the first listed on a tie)
        self.tokens: list[int] = []

    def _earliest_stop(self) -> int | None:
        # nothing before `emitted` can start a match (it was shown because it could not)
        hits = [p for s in self.stops if (p := self.text.find(s, self.emitted)) >= 0]
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _advance(self, final: bool) -> str:
        cut = self._earliest_stop() if self.stops else None
        # a stop that starts earlier may still complete: text from there on waits
        pending = None if final else len(self.text) - self._held_back()
        if cut is not None and (pending is None or pending >= cut):
            self.stopped = True
            self.matched = next(s for s in self.stops if self.text.find(s, self.emitted) == cut)
            self.text = self.text[:cut]
            end = cut
        else:
            end = len(self.text) if pending is None else min(pending, cut if cut is not None else pending)
        delta = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return delta

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.tokens.append(token)
        self.text += self._utf8.decode(self._token_bytes(token))
        return self._advance(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self.text += self._utf8.decode(b"", final=True)
        return self._advance(final=True)


def non_streamed(text: str, stop: Sequence[str]) -> str:
    """What the stream's deltas add up to: text cut before the earliest stop string."""
    hits = [p for s in stop if s and (p := text.find(s)) >= 0]
    return text[:min(hits)] if hits else text
