"""Draft tokens for speculative decoding: prompt lookup (llama.cpp's ngram-simple), and an
n-gram cache of the requests served before (a draft model's drafts: draft_model.py). The
worker's drafter (NgramDrafter here, or draft_model.DraftModel) proposes each decoding request's
drafts before a step, hears how many held after it, and forgets a request once it finishes.

A request's next tokens are guessed from its own prompt and output: the tokens that followed
the latest earlier occurrence of its last n tokens (n = 3, then 2, then 1); failing that, what
followed its last 3 tokens in a recent request (NgramCache). The step verifies
them as extra rows of the request's sequence; rase's logits of a position do not depend on how
many rows share the step, so every accepted token is exactly the token decoding one at a time
gives (greedy), and the draft only changes how many forward steps it takes.
"""
from __future__ import annotations

N_MAX = 3       # longest n-gram looked up
K_START = 4     # drafts per step at first
K_MAX = 8       # at most
PROBE = 16      # tokens decoded without drafts before trying again once k fell to 0
CACHED = 1 << 16  # 3-grams an NgramCache keeps (least recently seen dropped)


def _token_ids(guess) -> list[int]:
    """A guess up to its first image row (a negative placeholder id is no token to draft)."""
    out = []
    for t in guess:
        if t < 0:
            break
        out.append(t)
    return out


class NgramCache:
    """A worker's memory of what followed each 3-gram in the requests it finished (the latest
    occurrence wins): later requests draft from it (an agent's turns, a template's boilerplate)."""

    def __init__(self, size: int = CACHED) -> None:
        from collections import OrderedDict

        self.size, self.next = size, OrderedDict()

    def add(self, tokens: list[int], last: int = 2048) -> None:
        """What followed each 3-gram of a finished request's last `last` tokens."""
        tokens = tokens[-last:]
        for i in range(len(tokens) - N_MAX):
            key = tuple(tokens[i:i + N_MAX])
            self.next[key] = tuple(tokens[i + N_MAX:i + N_MAX + K_MAX])
            self.next.move_to_end(key)
        while len(self.next) > self.size:
            self.next.popitem(last=False)

    def get(self, tail: tuple, k: int) -> list[int]:
        return list(self.next.get(tail, ())[:k])


class Lookup:
    """One request's n-gram index and adaptive draft length (cache: the worker's NgramCache)."""

    def __init__(self, cache: NgramCache | None = None) -> None:
        self.cache = cache
        self.last: dict[tuple, int] = {}   # n-gram -> position after its latest occurrence
        self.prev: dict[tuple, int] = {}   # n-gram -> position after the occurrence before that
        self.indexed = 0                   # tokens indexed so far
        self.k = K_START
        self.idle = 0                      # tokens decoded since k fell to 0
        self.drafted = self.accepted = 0

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
        """The k tokens after the latest earlier occurrence of the longest tail n-gram seen before:
        in this request, or (for the 3-gram, before shorter ones here) in earlier requests."""
        for n in range(min(N_MAX, len(tokens) - 1), 0, -1):
            at = self.prev.get(tuple(tokens[-n:]))
            if at is not None:
                return _token_ids(tokens[at:at + k])
            if n == N_MAX and self.cache is not None:
                cached = _token_ids(self.cache.get(tuple(tokens[-N_MAX:]), k))
                if cached:
                    return cached
        return []

    def verified(self, drafted: int, accepted: int) -> None:
        """Adapt k: double it while every draft holds, halve it when half or more fail."""
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.k = min(K_MAX, max(1, self.k * 2))
        elif 2 * accepted <= drafted:
            self.k //= 2


class NgramDrafter:
    """A worker's prompt-lookup drafts: one Lookup per speculating request, and the NgramCache
    of the requests it finished."""

    def __init__(self) -> None:
        self.cache = NgramCache()
        self.lookups: dict[int, Lookup] = {}  # request id -> its Lookup

    def propose(self, rooms: dict, target_s: float | None = None) -> dict:
        """rooms: request -> the most drafts it may verify; its drafts (none: not this step)."""
        out = {}
        for req, room in rooms.items():
            lookup = self.lookups.get(req.id)
            if lookup is None:
                lookup = self.lookups[req.id] = Lookup(self.cache)
            guess = lookup.propose(req.tokens, room)
            if guess:
                out[req] = guess
        return out

    def verified(self, req, drafted: int, accepted: int) -> None:
        self.lookups[req.id].verified(drafted, accepted)

    def finished(self, req) -> None:
        """req is done: later requests may draft from what it wrote."""
        self.lookups.pop(req.id, None)
        if req.collect is None and req.generated:
            self.cache.add(req.tokens)
