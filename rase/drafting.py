"""Draft tokens for speculative decoding: prompt lookup (llama.cpp's ngram-simple).

A request's next tokens are guessed from its own prompt and output: the tokens that followed
the latest earlier occurrence of its last n tokens (n = 3, then 2, then 1). The step verifies
them as extra rows of the request's sequence; rase's logits of a position do not depend on how
many rows share the step, so every accepted token is exactly the token decoding one at a time
gives (greedy), and the draft only changes how many forward steps it takes.
"""
from __future__ import annotations

N_MAX = 3       # longest n-gram looked up
K_START = 4     # drafts per step at first
K_MAX = 8       # at most
PROBE = 16      # tokens decoded without drafts before trying again once k fell to 0


class Lookup:
    """One request's n-gram index and adaptive draft length."""

    def __init__(self) -> None:
        self.last: dict[tuple, int] = {}   # n-gram -> position after its latest occurrence
        self.prev: dict[tuple, int] = {}   # n-gram -> position after the occurrence before that
        self.indexed = 0                   # tokens indexed so far
        self.k = K_START
        self.idle = 0                      # tokens decoded since k fell to 0
        self.drafted = self.accepted = 0
        self.forks: list = []              # the samplers of draft rows, reused step to step

    def _index(self, tokens: list[int]) -> None:
        for end in range(self.indexed, len(tokens)):
            for n in range(1, N_MAX + 1):
                if end + 1 >= n:
                    gram = tuple(tokens[end + 1 - n:end + 1])
                    if gram in self.last:
                        self.prev[gram] = self.last[gram]
                    self.last[gram] = end + 1
        self.indexed = len(tokens)

    def propose(self, tokens: list[int], most: int) -> list[int]:
        """At most min(k, most) tokens that followed the tail's latest earlier occurrence."""
        self._index(tokens)
        k = self._room(most)
        return self.guess(tokens, k) if k > 0 else []

    def _room(self, most: int) -> int:
        """This step's k: the adaptive one, or, once it fell to 0, one draft every PROBE tokens."""
        if self.k == 0:
            self.idle += 1
            if self.idle < PROBE:
                return 0
            self.k, self.idle = 1, 0
        return min(self.k, most)

    def guess(self, tokens: list[int], k: int) -> list[int]:
        """The k tokens after the latest earlier occurrence of the longest tail n-gram seen before."""
        for n in range(min(N_MAX, len(tokens) - 1), 0, -1):
            at = self.prev.get(tuple(tokens[-n:]))
            if at is not None:
                return tokens[at:at + k]
        return []

    def verified(self, drafted: int, accepted: int) -> None:
        """Adapt k: double it while every draft holds, halve it when half or more fail."""
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.k = min(K_MAX, max(1, self.k * 2))
        elif 2 * accepted <= drafted:
            self.k //= 2
