"""KV blocks of one model's C pool: who holds which block, reservations, and the prefix cache.

Every pool block is in exactly one place: the free list (LIFO, so recently touched pages are
reused first), a running sequence's private tail, or the prefix cache (held by running
sequences, or evictable). Admission reserves every block a request can still need (prompt +
max_tokens, less what the cache already holds), so an admitted request never runs out of KV
(no preemption, no aborts); blocks are taken from the reservation only when a position first
lands in them, from the free list first and by evicting cached leaves after.
"""
from __future__ import annotations

import collections
from typing import Callable, Protocol, Sequence

from .prefix_cache import Node, PrefixCache
from .state_cache import StateSlots


class Sequence_(Protocol):  # what the KV bookkeeping needs from a request
    tokens: list[int]       # prompt + generated so far
    n_computed: int         # positions whose K/V is in the pool
    table: list[int]        # block ids, position p in table[p // block_size]
    nodes: list[Node]       # the cached chain: table[:len(nodes)] are these nodes' blocks
    reserved: int           # blocks still reserved for this request
    cache_chain: bool       # False once a full block could not be cached (chain broken)
    slot: int               # a hybrid's recurrent-state slot while it runs, else -1


def blocks_for(positions: int, block_size: int) -> int:
    return -(-positions // block_size)


class KVCache:
    """copy_rows(src, dst, n): copies positions [0, n) of pool block src to block dst; given,
    a prompt also reuses the leading positions of a cached block it shares only in part."""

    def __init__(self, n_blocks: int, block_size: int, prefix_cache: bool = True,
                 copy_rows: Callable[[int, int, int], None] | None = None, state: StateSlots | None = None,
                 max_tails: int = 16) -> None:
        if n_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.copy_rows = copy_rows
        self.state = state  # a hybrid model's recurrent-state slots and checkpoints
        self.max_tails = max_tails  # finished requests' last blocks kept, newest first (each a block of the pool)
        self.tails: collections.deque[Node] = collections.deque()
        self.copied_tokens = 0
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.free: list[int] = list(range(n_blocks - 1, -1, -1))  # pop() -> lowest ids first
        self.reserved = 0
        self.cache = PrefixCache(block_size) if prefix_cache else None
        if self.cache and state:
            self.cache.on_evict = state.dropped

    # ---------------------------------------------------------------- accounting

    @property
    def n_evictable(self) -> int:
        return self.cache.n_evictable if self.cache else 0

    @property
    def n_cached(self) -> int:
        return self.cache.n_nodes if self.cache else 0

    def available(self) -> int:
        """Blocks a new reservation may claim."""
        return len(self.free) + self.n_evictable - self.reserved

    def usage(self) -> dict:
        used = self.n_blocks - len(self.free) - self.n_evictable
        return dict(kv_blocks_total=self.n_blocks, kv_blocks_used=used, kv_blocks_cached=self.n_evictable,
                    kv_blocks_free=len(self.free), kv_blocks_reserved=self.reserved,
                    **(self.state.usage() if self.state else {}))

    # ---------------------------------------------------------------- a request's life

    def admit(self, req: Sequence_, max_positions: int, cached: bool = True) -> bool:
        """Match the prompt against the cache and reserve the blocks req may still need to
        reach max_positions; False (nothing held) when the pool cannot promise them now. The
        last prompt token is never taken from the cache: its logits are needed. cached=False
        (an embedding, which needs every row's hidden state): no match, and none of its blocks
        joins the cache."""
        prompt = len(req.tokens)
        hit = self.cache.match(req.tokens, prompt - 1) if self.cache and cached else []
        slot = self.state.take_running() if self.state else -1
        if self.state and hit:  # a hybrid resumes only where a checkpoint is: a tail past the chain, or in it
            depth = len(hit) if self._tail_checkpoint(hit[-1], req.tokens[len(hit) * self.block_size:prompt - 1]) \
                else self.state.resume_depth(hit)
            self.cache.release(hit[depth:])
            hit = hit[:depth]
        need = blocks_for(max_positions, self.block_size) - len(hit)
        if slot is None or need > self.available():
            if self.cache:
                self.cache.release(hit)
            if self.state and slot is not None:
                self.state.give_running(slot)
            return False
        self.reserved += need
        req.reserved = need
        req.nodes = hit
        req.table = [n.block for n in hit]
        req.n_computed = len(hit) * self.block_size
        req.cache_chain = cached
        req.slot = slot
        partial = self._reuse_partial(req, prompt - 1) if self.cache and cached and self.copy_rows else None
        resume = partial or (hit[-1] if hit else None)
        if self.state and resume is not None:
            self.state.restore(resume, slot)
        return True

    def _tail_checkpoint(self, node: Node, rest: Sequence[int]) -> bool:
        """Whether a whole tail node under node, with a checkpoint, starts the rest of a prompt."""
        src, _ = self.cache.partial(node, rest, whole=True) if self.copy_rows else (None, 0)
        return src is not None and src.ckpt >= 0

    def _reuse_partial(self, req: Sequence_, limit: int) -> Node | None:
        """Past the full blocks: a cached block that starts like the rest of the prompt gives
        its leading positions (copied into req's next block; K/V are bit-identical however
        they were computed, so this changes no result); the source node, or None. A hybrid
        takes only a whole tail node that has a checkpoint (its state is the one to resume from)."""
        done = req.n_computed
        src, k = self.cache.partial(req.nodes[-1] if req.nodes else None, req.tokens[done:limit],
                                    whole=self.state is not None)
        if src is None or (self.state and src.ckpt < 0):
            return None
        done_k = done + k
        self.cache.pin(src)  # taking a block may evict: not this one
        try:
            if self.available() < 0:  # src was the room the reservation counted on: skip
                return None
            self.grow(req, done + 1)
            self.copy_rows(src.block, req.table[-1], k)
        finally:
            self.cache.release([src])
        req.n_computed = done_k
        self.copied_tokens += k
        return src

    def _take(self) -> int:
        if not self.free:
            self.free.extend(self.cache.evict(1))
        return self.free.pop()

    def grow(self, req: Sequence_, positions: int) -> None:
        """Blocks in req.table for positions < `positions` (taken from its reservation)."""
        while len(req.table) * self.block_size < positions:
            if req.reserved <= 0:
                raise RuntimeError("a request outgrew its KV reservation")
            req.table.append(self._take())
            req.reserved -= 1
            self.reserved -= 1

    def commit(self, req: Sequence_) -> None:
        """After a step: every block that is now full of computed positions joins the cache
        (no copy: the request's block becomes the node), while the chain is unbroken."""
        if not self.cache or not req.cache_chain:
            return
        bs = self.block_size
        while len(req.nodes) < req.n_computed // bs:
            i = len(req.nodes)
            node = self.cache.insert(req.nodes[-1] if req.nodes else None, req.tokens[i * bs:(i + 1) * bs],
                                     req.table[i])
            if node is None:  # computed by someone else meanwhile: ours stays private
                req.cache_chain = False
                return
            req.nodes.append(node)
            if self.state and req.n_computed == (i + 1) * bs and self.state.is_boundary(i + 1):
                self.state.checkpoint(node, req.slot)  # the step ended here (Scheduler: chunks stop at boundaries)

    def release(self, req: Sequence_) -> None:
        """The request is done: its last, partly filled block is cached as a tail node (the
        next turn of a conversation resumes after it); other private blocks back to the free
        list (tail first), cached ones keep their K/V for later requests, the unused
        reservation returns."""
        private = req.table[len(req.nodes):]
        if private and self._cache_tail(req):
            private = private[1:]
        elif self.state and req.nodes and req.n_computed == len(req.nodes) * self.block_size:
            self.state.checkpoint(req.nodes[-1], req.slot)  # the turn ended on a block boundary
        if self.state and req.slot >= 0:
            self.state.give_running(req.slot)
            req.slot = -1
        self.free.extend(reversed(private))
        if self.cache:
            self.cache.release(req.nodes)
        self.reserved -= req.reserved
        req.reserved = 0
        req.table, req.nodes = [], []

    def _cache_tail(self, req: Sequence_) -> bool:
        """Cache req's block past its cached chain when it holds its last computed positions
        (fewer than a block, every block before it cached): True when the block became a node.
        The newest max_tails tails are kept: a conversation's next turn comes soon or not at all,
        and older tails would keep taking untouched pool blocks (memory) from the free list."""
        bs, n = self.block_size, req.n_computed
        if not self.cache or not req.cache_chain or len(req.nodes) != n // bs or n % bs == 0:
            return False
        node = self.cache.insert(req.nodes[-1] if req.nodes else None, req.tokens[n - n % bs:n],
                                 req.table[len(req.nodes)], tail=True)
        if node is None:
            return False
        if self.state:
            self.state.checkpoint(node, req.slot)  # the state after the turn's last position
        self.cache.release([node])
        self.tails.append(node)
        while len(self.tails) > self.max_tails:  # the oldest tail's block back to the free list
            old = self.tails.popleft()           # (a tail in use, or gone already, is skipped)
            if self.cache.drop(old):
                self.free.append(old.block)
        return True

    def drop_cache(self) -> int:
        """Forget every evictable cached block; how many were freed."""
        if not self.cache:
            return 0
        freed = self.cache.clear()
        self.free.extend(freed)
        return len(freed)

    def check(self, live: Sequence[Sequence_]) -> None:
        """Invariants (tests): every block in exactly one place; reservations add up."""
        held = [b for r in live for b in r.table[len(r.nodes):]]
        cached = self._cached_blocks()
        everything = self.free + held + cached
        assert sorted(everything) == list(range(self.n_blocks)), "a block is lost or double-owned"
        assert self.reserved == sum(r.reserved for r in live) >= 0
        assert self.available() >= 0
        if self.state:
            self.state.check([r.slot for r in live])

    def _cached_blocks(self) -> list[int]:
        out, stack = [], list(self.cache.root.children.values()) if self.cache else []
        while stack:
            node = stack.pop()
            assert node.refs >= 0
            assert all(node.refs >= c.refs for c in node.children.values())
            out.append(node.block)
            stack.extend(node.children.values())
        return out
