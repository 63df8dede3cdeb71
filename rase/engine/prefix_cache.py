"""The prefix cache: a trie of full KV blocks, keyed by their exact tokens.

A node is one pool block holding the K/V of BS positions whose tokens, and everything before
them, are known: its key is (parent node, the BS tokens). A tail node holds fewer (the end of a
finished request: a turn of a conversation), is always a leaf, and is only ever reused by copying
(partial), never matched as a block. `refs` counts the running sequences
whose block table contains it; a node with refs == 0 stays cached (evictable) until its block is
needed. Only leaves are evicted, least recently used first, so a shared head outlives its tails.
Sequences hold refs on whole chains (a node's parent is in every table that holds the node),
so refs(parent) >= refs(child) and every node with refs == 0 can eventually be evicted.

Pure Python: the blocks are ints naming pool blocks the C forward reads; nothing is copied.
By the numerics contract a block's K/V is bit-identical however it was computed, so a hit never
changes an answer.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Sequence


class Node:
    __slots__ = ("id", "parent", "tokens", "block", "refs", "children", "last_used", "ckpt")

    def __init__(self, id: int, parent: "Node | None", tokens: tuple[int, ...], block: int) -> None:
        self.id = id
        self.parent = parent
        self.tokens = tokens
        self.block = block
        self.refs = 0
        self.children: dict[tuple[int, ...], Node] = {}
        self.last_used = 0
        self.ckpt = -1  # a hybrid's recurrent-state checkpoint at the node's end (state_cache.py), or -1


class PrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.root = Node(0, None, (), -1)
        self._ids = itertools.count(1)
        self._clock = 0
        self._lru: list[tuple[int, int, Node]] = []  # (last_used, id, node): evictable leaves, lazily pruned
        self.n_nodes = 0       # cached blocks (refs or not)
        self.n_evictable = 0   # nodes with refs == 0
        self.stats = dict(queries=0, hit_tokens=0, inserted_blocks=0, evicted_blocks=0)
        self.on_evict = None  # called with each node that leaves (its checkpoint is freed)

    # ---------------------------------------------------------------- lookups

    def match(self, tokens: Sequence[int], limit: int) -> list[Node]:
        """The cached chain of full blocks covering tokens[:n], n <= limit, longest first
        match; every node returned gains a ref (release them when done)."""
        bs, node, out = self.block_size, self.root, []
        self._clock += 1
        while (len(out) + 1) * bs <= limit:
            child = node.children.get(tuple(tokens[len(out) * bs:(len(out) + 1) * bs]))
            if child is None:
                break
            out.append(child)
            node = child
        for n in out:
            self._acquire(n)
        self.stats["queries"] += 1
        self.stats["hit_tokens"] += len(out) * bs
        return out

    def partial(self, parent: Node | None, tokens: Sequence[int], whole: bool = False) -> tuple[Node | None, int]:
        """The cached child of parent (None: the root) whose block begins with the longest run
        of `tokens` (fewer than a block), and that run's length; (None, 0) if none. whole: only
        tail nodes whose every position is in the run (a hybrid model's recurrent state is
        checkpointed after a tail's last position: it resumes there or not at all)."""
        best, k_best = None, 0
        want = tuple(tokens[:self.block_size - 1])
        for child in (parent or self.root).children.values():
            k = 0
            for a, b in zip(child.tokens, want):
                if a != b:
                    break
                k += 1
            if whole and k != len(child.tokens):
                continue
            if k > k_best:
                best, k_best = child, k
        return best, k_best

    def pin(self, node: Node) -> None:
        """Hold a node for a moment (it cannot be evicted until released)."""
        self._clock += 1
        self._acquire(node)

    def insert(self, parent: Node | None, tokens: Sequence[int], block: int, tail: bool = False) -> Node | None:
        """Cache `block` (just filled with tokens, after parent's chain) as a node the caller
        holds one ref on; None when that key is cached already (the caller keeps its block).
        tail: the block holds 1 .. BS - 1 positions (a finished request's last)."""
        parent = parent or self.root
        key = tuple(tokens)
        size_ok = 0 < len(key) < self.block_size if tail else len(key) == self.block_size
        if not size_ok or key in parent.children:
            return None
        node = Node(next(self._ids), parent, key, block)
        parent.children[key] = node
        self.n_nodes += 1
        self.n_evictable += 1  # refs == 0 until acquired just below
        self._clock += 1
        self._acquire(node)
        self.stats["inserted_blocks"] += 1
        return node

    # ---------------------------------------------------------------- refs and eviction

    def _acquire(self, node: Node) -> None:
        if node.refs == 0:
            self.n_evictable -= 1
        node.refs += 1
        node.last_used = self._clock

    def release(self, nodes: Sequence[Node]) -> None:
        """Drop one ref from each node (a sequence leaving); tails first."""
        for node in reversed(nodes):
            assert node.refs > 0, "released a node nobody holds"
            node.refs -= 1
            if node.refs == 0:
                self.n_evictable += 1
                if not node.children:
                    heapq.heappush(self._lru, (node.last_used, node.id, node))

    def _evictable_leaf(self, entry: tuple[int, int, Node]) -> bool:
        last_used, _, node = entry
        return (node.refs == 0 and not node.children and node.last_used == last_used
                and node.parent is not None and node.parent.children.get(node.tokens) is node)

    def evict(self, n: int) -> list[int]:
        """Free up to n blocks: least recently used leaves with no refs; a parent left without
        children becomes a leaf itself."""
        out: list[int] = []
        while len(out) < n and self._lru:
            entry = heapq.heappop(self._lru)
            if not self._evictable_leaf(entry):
                continue  # stale: re-acquired, got children, or already gone
            node = entry[2]
            parent = node.parent
            del parent.children[node.tokens]
            if self.on_evict is not None:
                self.on_evict(node)
            node.parent = None
            self.n_nodes -= 1
            self.n_evictable -= 1
            out.append(node.block)
            if parent is not self.root and parent.refs == 0 and not parent.children:
                heapq.heappush(self._lru, (parent.last_used, parent.id, parent))
        self.stats["evicted_blocks"] += len(out)
        return out

    def drop(self, node: Node) -> bool:
        """Evict one particular node now if it is an evictable leaf (a tail past its budget)."""
        parent = node.parent
        if node.refs or node.children or parent is None or parent.children.get(node.tokens) is not node:
            return False
        del parent.children[node.tokens]
        node.parent = None
        self.n_nodes -= 1
        self.n_evictable -= 1
        if self.on_evict is not None:
            self.on_evict(node)
        self.stats["evicted_blocks"] += 1
        if parent is not self.root and parent.refs == 0 and not parent.children:
            heapq.heappush(self._lru, (parent.last_used, parent.id, parent))
        return True

    def clear(self) -> list[int]:
        """Evict everything evictable; the blocks freed."""
        return self.evict(self.n_evictable)
