"""The KV manager: one owner for every memory group a request uses, keyed by request id.

A request's memory (Memory) is its attention blocks with the prefix trie's nodes it shares
(prefix_cache.py), its recurrent-state slot and the checkpoints the trie keeps (state_cache.py,
hybrids), and its blocks on the draft model's pool (speculation with a draft model). Every pool
block is in exactly one place: the free list (LIFO, so recently touched pages are reused first),
a running request's private tail, or the prefix cache (held by running requests, or evictable).
allocate reserves every block a request can still need (prompt + max_tokens, less what the cache
already holds), so an admitted request never runs out of KV (no preemption, no aborts); extend
takes blocks from the reservation only when a position first lands in them, from the free list
first and by evicting cached leaves after; free gives everything back. The request's own facts
(its tokens, how many positions are computed) are the caller's: they come in as arguments.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .prefix_cache import Node, PrefixCache
from .state_cache import StateSlots


def blocks_for(positions: int, block_size: int) -> int:
    return -(-positions // block_size)


@dataclass(eq=False)
class Memory:
    """One request's memory in every group."""
    table: list[int] = field(default_factory=list)  # attention blocks: position p in table[p // block_size]
    nodes: list[Node] = field(default_factory=list)  # the cached chain: table[:len(nodes)] are their blocks
    reserved: int = 0                                # blocks promised and not taken yet
    cache_chain: bool = True                         # False once a full block could not be cached
    slot: int = -1                                   # a hybrid's running recurrent-state slot
    draft: list[int] = field(default_factory=list)   # the draft model's pool blocks, position p in draft[p // bs]
    draft_known: list[int] = field(default_factory=list)  # the tokens whose draft K/V those blocks hold


class KVManager:
    """copy_rows(src, dst, n): copies positions [0, n) of pool block src to block dst; given, a
    prompt also reuses the leading positions of a cached block it shares only in part.
    state: a hybrid's recurrent-state slots; draft_blocks: the draft model's pool (0: none)."""

    def __init__(self, n_blocks: int, block_size: int, prefix_cache: bool = True,
                 copy_rows: Callable[[int, int, int], None] | None = None, state: StateSlots | None = None,
                 max_tails: int = 16, draft_blocks: int = 0) -> None:
        if n_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.copy_rows = copy_rows
        self.state = state
        self.max_tails = max_tails  # finished requests' last blocks kept, newest first (each a block of the pool)
        self.tails: collections.deque[Node] = collections.deque()
        self.copied_tokens = 0
        self.n_blocks, self.block_size = n_blocks, block_size
        self.free_blocks: list[int] = list(range(n_blocks - 1, -1, -1))  # pop() -> lowest ids first
        self.n_draft = draft_blocks
        self.draft_free: list[int] = list(range(draft_blocks - 1, -1, -1))
        self.reserved = 0
        self.held: dict[int, Memory] = {}
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
        return len(self.free_blocks) + self.n_evictable - self.reserved

    def usage(self) -> dict:
        used = self.n_blocks - len(self.free_blocks) - self.n_evictable
        return dict(kv_blocks_total=self.n_blocks, kv_blocks_used=used, kv_blocks_cached=self.n_evictable,
                    kv_blocks_free=len(self.free_blocks), kv_blocks_reserved=self.reserved,
                    **(self.state.usage() if self.state else {}))

    def table(self, rid: int) -> list[int]:
        return self.held[rid].table

    def slot(self, rid: int) -> int:
        return self.held[rid].slot

    # ---------------------------------------------------------------- a request's life

    def allocate(self, rid: int, tokens: Sequence[int], max_positions: int, cached: bool = True) -> int | None:
        """Admit request rid: match its prompt (tokens) against the cache and reserve the blocks
        it may still need to reach max_positions; the positions whose K/V it starts with, or None
        (nothing held) when the pool cannot promise them now. The last prompt token is never taken
        from the cache: its logits are needed. cached=False (an embedding, which needs every row's
        hidden state): no match, and none of its blocks joins the cache."""
        prompt = len(tokens)
        hit = self.cache.match(tokens, prompt - 1) if self.cache and cached else []
        slot = self.state.take_running() if self.state else -1
        if self.state and hit:  # a hybrid resumes only where a checkpoint is: a tail past the chain, or in it
            depth = len(hit) if self._tail_checkpoint(hit[-1], tokens[len(hit) * self.block_size:prompt - 1]) \
                else self.state.resume_depth(hit)
            self.cache.release(hit[depth:])
            hit = hit[:depth]
        need = blocks_for(max_positions, self.block_size) - len(hit)
        if slot is None or need > self.available():
            if self.cache:
                self.cache.release(hit)
            if self.state and slot is not None:
                self.state.give_running(slot)
            return None
        self.reserved += need
        mem = self.held[rid] = Memory([n.block for n in hit], hit, need, cached, slot)
        computed = len(hit) * self.block_size
        partial = self._reuse_partial(rid, tokens, computed, prompt - 1) if self.cache and cached and self.copy_rows \
            else None
        resume = partial[0] if partial else (hit[-1] if hit else None)
        if self.state and resume is not None:
            self.state.restore(resume, mem.slot)
        return computed + partial[1] if partial else computed

    def _tail_checkpoint(self, node: Node, rest: Sequence[int]) -> bool:
        """Whether a whole tail node under node, with a checkpoint, starts the rest of a prompt."""
        src, _ = self.cache.partial(node, rest, whole=True) if self.copy_rows else (None, 0)
        return src is not None and src.ckpt >= 0

    def _reuse_partial(self, rid: int, tokens: Sequence[int], done: int, limit: int) -> tuple[Node, int] | None:
        """Past the full blocks: a cached block that starts like the rest of the prompt gives
        its leading positions (copied into the request's next block; K/V are bit-identical
        however they were computed, so this changes no result); (the source node, positions
        copied), or None. A hybrid takes only a whole tail node that has a checkpoint (its state
        is the one to resume from)."""
        mem = self.held[rid]
        src, k = self.cache.partial(mem.nodes[-1] if mem.nodes else None, tokens[done:limit],
                                    whole=self.state is not None)
        if src is None or (self.state and src.ckpt < 0):
            return None
        self.cache.pin(src)  # taking a block may evict: not this one
        try:
            if self.available() < 0:  # src was the room the reservation counted on: skip
                return None
            self.extend(rid, done + 1)
            self.copy_rows(src.block, mem.table[-1], k)
        finally:
            self.cache.release([src])
        self.copied_tokens += k
        return src, k

    def _take(self) -> int:
        if not self.free_blocks:
            self.free_blocks.extend(self.cache.evict(1))
        return self.free_blocks.pop()

    def extend(self, rid: int, positions: int) -> None:
        """Blocks in rid's table for positions < `positions` (taken from its reservation)."""
        mem = self.held[rid]
        while len(mem.table) * self.block_size < positions:
            if mem.reserved <= 0:
                raise RuntimeError("a request outgrew its KV reservation")
            mem.table.append(self._take())
            mem.reserved -= 1
            self.reserved -= 1

    def commit(self, rid: int, tokens: Sequence[int], n_computed: int) -> None:
        """After a step: every block that is now full of computed positions joins the cache
        (no copy: the request's block becomes the node), while the chain is unbroken."""
        mem = self.held[rid]
        if not self.cache or not mem.cache_chain:
            return
        bs = self.block_size
        while len(mem.nodes) < n_computed // bs:
            i = len(mem.nodes)
            node = self.cache.insert(mem.nodes[-1] if mem.nodes else None, tokens[i * bs:(i + 1) * bs], mem.table[i])
            if node is None:  # computed by someone else meanwhile: ours stays private
                mem.cache_chain = False
                return
            mem.nodes.append(node)
            if self.state and n_computed == (i + 1) * bs and self.state.is_boundary(i + 1):
                self.state.checkpoint(node, mem.slot)  # the step ended here (Scheduler: chunks stop at boundaries)

    def free(self, rid: int, tokens: Sequence[int], n_computed: int) -> None:
        """The request is done: its last, partly filled block is cached as a tail node (the
        next turn of a conversation resumes after it); other private blocks back to the free
        list (tail first), cached ones keep their K/V for later requests, the unused
        reservation returns, and so do its state slot and its draft blocks."""
        mem = self.held.pop(rid)
        private = mem.table[len(mem.nodes):]
        if private and self._cache_tail(mem, tokens, n_computed):
            private = private[1:]
        elif self.state and mem.nodes and n_computed == len(mem.nodes) * self.block_size:
            self.state.checkpoint(mem.nodes[-1], mem.slot)  # the turn ended on a block boundary
        if self.state and mem.slot >= 0:
            self.state.give_running(mem.slot)
        self.free_blocks.extend(reversed(private))
        if self.cache:
            self.cache.release(mem.nodes)
        self.reserved -= mem.reserved
        self.draft_free.extend(mem.draft)

    def _cache_tail(self, mem: Memory, tokens: Sequence[int], n: int) -> bool:
        """Cache the block past the cached chain when it holds the last computed positions
        (fewer than a block, every block before it cached): True when the block became a node.
        The newest max_tails tails are kept: a conversation's next turn comes soon or not at all,
        and older tails would keep taking untouched pool blocks (memory) from the free list."""
        bs = self.block_size
        if not self.cache or not mem.cache_chain or len(mem.nodes) != n // bs or n % bs == 0:
            return False
        node = self.cache.insert(mem.nodes[-1] if mem.nodes else None, tokens[n - n % bs:n],
                                 mem.table[len(mem.nodes)], tail=True)
        if node is None:
            return False
        if self.state:
            self.state.checkpoint(node, mem.slot)  # the state after the turn's last position
        self.cache.release([node])
        self.tails.append(node)
        while len(self.tails) > self.max_tails:  # the oldest tail's block back to the free list
            old = self.tails.popleft()           # (a tail in use, or gone already, is skipped)
            if self.cache.drop(old):
                self.free_blocks.append(old.block)
        return True

    # ---------------------------------------------------------------- the draft model's pool

    def draft(self, rid: int) -> Memory:
        """rid's memory, for its draft sequence: draft (blocks) and draft_known (tokens)."""
        return self.held[rid]

    def reserve_draft(self, rid: int, positions: int) -> bool:
        """Draft-pool blocks for rid's positions < `positions`; False (none taken) when the pool
        cannot hold them now (that request drafts nothing this step)."""
        mem = self.held[rid]
        need = blocks_for(positions, self.block_size) - len(mem.draft)
        if need > len(self.draft_free):
            return False
        mem.draft.extend(self.draft_free.pop() for _ in range(max(0, need)))
        return True

    # ---------------------------------------------------------------- the cache as a whole

    def drop_cache(self) -> int:
        """Forget every evictable cached block; how many were freed."""
        if not self.cache:
            return 0
        freed = self.cache.clear()
        self.free_blocks.extend(freed)
        return len(freed)

    def check(self, live: Sequence[int]) -> None:
        """Invariants (tests): the live request ids are the ones held; every block (attention
        and draft) in exactly one place; reservations add up."""
        assert sorted(self.held) == sorted(live), "memory held for a request that is not live (or missing)"
        mems = [self.held[r] for r in live]
        held = [b for m in mems for b in m.table[len(m.nodes):]]
        everything = self.free_blocks + held + self._cached_blocks()
        assert sorted(everything) == list(range(self.n_blocks)), "a block is lost or double-owned"
        assert self.reserved == sum(m.reserved for m in mems) >= 0
        assert self.available() >= 0
        drafts = self.draft_free + [b for m in mems for b in m.draft]
        assert sorted(drafts) == list(range(self.n_draft)), "a draft block is lost or double-owned"
        if self.state:
            self.state.check([m.slot for m in mems])

    def _cached_blocks(self) -> list[int]:
        out, stack = [], list(self.cache.root.children.values()) if self.cache else []
        while stack:
            node = stack.pop()
            assert node.refs >= 0
            assert all(node.refs >= c.refs for c in node.children.values())
            out.append(node.block)
            stack.extend(node.children.values())
        return out
