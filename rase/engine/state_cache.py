"""Recurrent-state slots of a hybrid model's C pool (LFM2's convolutions, Qwen3.5's delta nets):
each running sequence's own slot, and checkpoints the prefix cache keeps.

A sequence's recurrent state is not per position like K/V: its rows update one slot in place, so
a cached prefix can only be resumed where a copy of the state was taken. Checkpoints are taken
at every `every`-th block boundary (a prompt's chunks end there: Scheduler) and at the end of
each request (its last computed position: the next turn of a conversation resumes there), and
hang on the prefix cache's nodes: a hit resumes at the deepest node that has one. The state
copied back is the state the uncached run reaches there, so a hit changes no result.
`every` keeps the checkpoints' bytes near the K/V's (a Qwen3.5 state is ~50 blocks of its K/V);
the checkpoint slots are a budget of their own, least recently used dropped first (the node keeps
its K/V; a hit just resumes earlier).
"""
from __future__ import annotations

from typing import Callable, Sequence

from .prefix_cache import Node


class StateSlots:
    def __init__(self, running: int, checkpoints: int, every: int, copy: Callable[[int, int], None],
                 state_bytes: int) -> None:
        self.running, self.checkpoints, self.every = running, checkpoints, max(1, every)
        self.copy, self.state_bytes = copy, state_bytes
        self.free_running = list(range(running - 1, -1, -1))
        self.free_ckpt = list(range(running + checkpoints - 1, running - 1, -1))
        self.owner: dict[int, Node] = {}  # checkpoint slot -> the node it hangs on
        self.taken = self.restored = 0

    # ---------------------------------------------------------------- running slots

    def take_running(self) -> int | None:
        return self.free_running.pop() if self.free_running else None

    def give_running(self, slot: int) -> None:
        self.free_running.append(slot)

    # ---------------------------------------------------------------- checkpoints

    def resume_depth(self, hit: Sequence[Node]) -> int:
        """How many of a matched chain's nodes a hybrid may use: up to the deepest checkpoint."""
        for i in range(len(hit), 0, -1):
            if hit[i - 1].ckpt >= 0:
                return i
        return 0

    def restore(self, node: Node, slot: int) -> None:
        """slot = the state at node's end."""
        self.copy(node.ckpt, slot)
        self.restored += 1

    def is_boundary(self, n_blocks: int) -> bool:
        return n_blocks % self.every == 0

    def chunk(self, n_computed: int, take: int, block_size: int) -> int:
        """A prompt chunk from n_computed clipped to end at the next checkpoint boundary, so the
        state after the step is the one there."""
        span = self.every * block_size
        boundary = (n_computed // span + 1) * span
        return min(take, boundary - n_computed)

    def checkpoint(self, node: Node, slot: int) -> None:
        """Hang a copy of running slot `slot` (the state at node's end) on node."""
        if node.ckpt >= 0:
            return
        ckpt = self._take()
        if ckpt is None:
            return
        self.copy(slot, ckpt)
        node.ckpt = ckpt
        self.owner[ckpt] = node
        self.taken += 1

    def _take(self) -> int | None:
        if not self.free_ckpt and self.owner:  # drop the least recently used checkpoint
            oldest = min(self.owner.values(), key=lambda n: n.last_used)
            self.dropped(oldest)
        return self.free_ckpt.pop() if self.free_ckpt else None

    def dropped(self, node: Node) -> None:
        """node leaves the cache (or its checkpoint is reclaimed): its slot is free again."""
        if node.ckpt >= 0:
            del self.owner[node.ckpt]
            self.free_ckpt.append(node.ckpt)
            node.ckpt = -1

    # ---------------------------------------------------------------- accounting

    def usage(self) -> dict:
        held = self.running - len(self.free_running) + len(self.owner)
        return dict(state_slots_total=self.running + self.checkpoints, state_slots_running=self.running,
                    state_checkpoints=len(self.owner), state_checkpoint_every_blocks=self.every,
                    state_checkpoints_taken=self.taken, state_checkpoints_restored=self.restored,
                    state_bytes_total=(self.running + self.checkpoints) * self.state_bytes,
                    state_bytes_used=held * self.state_bytes)

    def check(self, live_slots: Sequence[int]) -> None:
        """Invariants (tests): every slot in one place."""
        assert sorted(list(self.free_running) + list(live_slots)) == list(range(self.running)), "a running slot leaked"
        assert sorted(self.free_ckpt + list(self.owner)) == list(range(self.running, self.running + self.checkpoints))
        assert all(n.ckpt == s for s, n in self.owner.items())
