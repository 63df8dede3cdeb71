"""The prefix cache and the KV block bookkeeping, alone, under random operation sequences."""
from __future__ import annotations

import itertools
import random

import pytest

from rase.engine.kv_manager import KVManager
from rase.engine.prefix_cache import PrefixCache
from rase.engine.state_cache import StateSlots

BS = 4


_IDS = itertools.count(1)


class Seq:
    """A request's own facts the KV manager is told: its id, tokens and computed positions."""

    def __init__(self, tokens, max_new):
        self.id = next(_IDS)
        self.tokens = list(tokens)
        self.max_positions = len(tokens) + max_new
        self.n_computed = 0


def admit(kv: KVManager, s: Seq, max_positions: int) -> bool:
    """Allocate s's memory as the scheduler admits a request: it starts past its cache hit."""
    computed = kv.allocate(s.id, s.tokens, max_positions)
    if computed is None:
        return False
    s.n_computed = computed
    return True


def live_ids(seqs) -> list[int]:
    return [s.id for s in seqs]


def _leaves(cache: PrefixCache):
    out, stack = [], list(cache.root.children.values())
    while stack:
        n = stack.pop()
        if not n.children:
            out.append(n)
        stack.extend(n.children.values())
    return out


def test_match_insert_release_evict_basics():
    c = PrefixCache(BS)
    a = c.insert(None, [1, 2, 3, 4], block=10)
    b = c.insert(a, [5, 6, 7, 8], block=11)
    assert c.insert(a, [5, 6, 7, 8], block=12) is None  # key exists: the caller keeps its block
    assert c.insert(None, [1, 2, 3], block=13) is None  # only full blocks
    assert c.evict(5) == []  # held by the inserting sequence
    c.release([a, b])
    assert c.n_evictable == 2
    hit = c.match([1, 2, 3, 4, 5, 6, 7, 8, 9], limit=8)
    assert [n.block for n in hit] == [10, 11] and c.n_evictable == 0
    assert [n.block for n in c.match([1, 2, 3, 4, 5, 6, 7, 8], limit=7)] == [10]  # limit cuts the match
    c.release(hit)
    c.release([a])
    assert c.evict(1) == [11] and c.evict(1) == [10]  # leaf first, then the parent it left bare
    assert c.n_nodes == 0 and c.n_evictable == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_keep_refs_leaves_and_lru(seed):
    rng = random.Random(seed)
    c = PrefixCache(BS)
    held: list[list] = []  # chains held by live sequences
    next_block = iter(range(10_000))
    for _ in range(300):
        op = rng.random()
        if op < 0.4:  # a sequence: match a prefix, then insert a few more blocks after it
            prefix = [rng.randrange(3) for _ in range(BS * rng.randrange(1, 5))]
            chain = c.match(prefix, len(prefix))
            for i in range(len(chain), len(prefix) // BS):
                node = c.insert(chain[-1] if chain else None, prefix[i * BS:(i + 1) * BS], next(next_block))
                if node is None:
                    break
                chain.append(node)
            held.append(chain)
        elif op < 0.7 and held:
            c.release(held.pop(rng.randrange(len(held))))
        else:  # evict: every victim is a leaf without refs, least recently used first
            for _ in range(rng.randrange(1, 4)):
                candidates = [n for n in _leaves(c) if n.refs == 0]
                got = c.evict(1)
                if not candidates:
                    assert got == []
                    continue
                oldest = min(n.last_used for n in candidates)
                assert len(got) == 1 and got[0] in {n.block for n in candidates if n.last_used == oldest}
        # invariants: refs never negative, parents hold at least their children's refs,
        # the evictable count is the nodes without refs
        nodes, stack = [], list(c.root.children.values())
        while stack:
            n = stack.pop()
            nodes.append(n)
            assert n.refs >= 0 and all(n.refs >= ch.refs for ch in n.children.values())
            stack.extend(n.children.values())
        assert c.n_nodes == len(nodes)
        assert c.n_evictable == sum(n.refs == 0 for n in nodes)
        assert sum(n.refs for n in nodes) == sum(len(ch) for ch in held)
    for chain in held:
        c.release(chain)
    assert len(c.clear()) == len(nodes) and c.n_nodes == 0


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_kv_pool_budget_holds_under_random_requests(seed, partial):
    """Admission promises every block a request can need; blocks are never lost or shared
    by two owners; the budget is never exceeded; everything returns at the end (with and
    without reuse of partly shared blocks)."""
    rng = random.Random(seed)
    copies = []
    kv = KVManager(24, BS, copy_rows=(lambda src, dst, n: copies.append((src, dst, n))) if partial else None)
    live: list[Seq] = []
    heads = [[rng.randrange(5) for _ in range(9)] for _ in range(3)]
    for _ in range(400):
        if rng.random() < 0.3:
            s = Seq(rng.choice(heads) + [rng.randrange(5) for _ in range(rng.randrange(1, 8))], rng.randrange(1, 9))
            if admit(kv, s, s.max_positions):
                assert (partial or s.n_computed % BS == 0) and s.n_computed <= len(s.tokens) - 1
                live.append(s)
        elif live:
            s = rng.choice(live)
            if rng.random() < 0.2 or len(s.tokens) >= s.max_positions:
                kv.free(s.id, s.tokens, s.n_computed)
                live.remove(s)
            else:  # compute the rest of what is known (a chunk or a decode row), then sample one
                kv.extend(s.id, len(s.tokens))
                s.n_computed = len(s.tokens)
                kv.commit(s.id, s.tokens, s.n_computed)
                s.tokens.append(rng.randrange(5))
        kv.check(live_ids(live))
    for s in live:
        kv.free(s.id, s.tokens, s.n_computed)
    kv.check([])
    assert kv.available() == kv.n_blocks and kv.reserved == 0
    assert bool(copies) == partial and all(src != dst and 0 < n < BS for src, dst, n in copies)


def test_full_prompt_hit_still_computes_the_last_token():
    kv = KVManager(8, BS)
    first = Seq(list(range(8)), 1)
    assert admit(kv, first, first.max_positions)
    kv.extend(first.id, 8)
    first.n_computed = 8
    kv.commit(first.id, first.tokens, first.n_computed)
    kv.free(first.id, first.tokens, first.n_computed)
    again = Seq(list(range(8)), 1)  # the same 8 tokens: both blocks cached
    assert admit(kv, again, again.max_positions)
    assert again.n_computed == 4  # the second block holds the last prompt token: recomputed
    longer = Seq(list(range(9)), 1)
    assert admit(kv, longer, longer.max_positions) and longer.n_computed == 8


def test_admission_waits_for_room_and_never_oversubscribes():
    kv = KVManager(4, BS)
    a, b = Seq([1] * 7, 5), Seq([2] * 3, 2)   # a needs 3 blocks, b 2
    assert admit(kv, a, a.max_positions) and not admit(kv, b, b.max_positions)
    assert b.id not in kv.held and kv.reserved == 3
    kv.free(a.id, a.tokens, a.n_computed)
    assert admit(kv, b, b.max_positions)


def test_a_prompt_sharing_part_of_a_cached_block_copies_those_rows():
    copies = []
    kv = KVManager(8, BS, copy_rows=lambda src, dst, n: copies.append((src, dst, n)))
    first = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9], 1)
    assert admit(kv, first, first.max_positions)
    kv.extend(first.id, 9)
    first.n_computed = 9
    kv.commit(first.id, first.tokens, first.n_computed)  # blocks [1 2 3 4] [5 6 7 8] cached
    kv.free(first.id, first.tokens, first.n_computed)
    second = Seq([1, 2, 3, 4, 5, 6, 0, 0, 0], 1)  # one full block, then 2 of the next 4
    assert admit(kv, second, second.max_positions)
    assert second.n_computed == 6 and copies == [(kv.cache.root.children[(1, 2, 3, 4)].children[(5, 6, 7, 8)].block,
                                                  kv.table(second.id)[1], 2)]
    kv.check(live_ids([second]))
    third = Seq([1, 2, 9], 1)  # only a partial block in common, limited by the last token
    assert admit(kv, third, third.max_positions) and third.n_computed == 2
    kv.check(live_ids([second, third]))
    without_copies = KVManager(8, BS)
    assert admit(without_copies, Seq([1, 2, 3], 1), 4)  # no copy function: full blocks only


def _turn(kv: KVManager, tokens) -> Seq:
    """A request computed to its end and released (a finished turn); a hybrid's steps end at its
    checkpoint boundaries, as the scheduler's chunks do."""
    seq = Seq(tokens, 1)
    assert admit(kv, seq, seq.max_positions)
    while seq.n_computed < len(tokens):
        take = len(tokens) - seq.n_computed
        if kv.state:
            take = kv.state.chunk(seq.n_computed, take, BS)
        kv.extend(seq.id, seq.n_computed + take)
        seq.n_computed += take
        kv.commit(seq.id, seq.tokens, seq.n_computed)
    kv.free(seq.id, seq.tokens, seq.n_computed)
    return seq


def test_a_finished_turns_last_positions_are_a_tail_the_next_turn_resumes_after():
    copies = []
    kv = KVManager(8, BS, copy_rows=lambda src, dst, n: copies.append((src, dst, n)))
    _turn(kv, [1, 2, 3, 4, 5, 6])                 # [1 2 3 4] cached, then the tail (5 6)
    tail = kv.cache.root.children[(1, 2, 3, 4)].children[(5, 6)]
    assert not tail.children and tail.refs == 0 and kv.n_cached == 2 and kv.available() == 8
    nxt = Seq([1, 2, 3, 4, 5, 6, 7, 8, 9], 1)
    assert admit(kv, nxt, nxt.max_positions) and nxt.n_computed == 6
    assert copies == [(tail.block, kv.table(nxt.id)[1], 2)]
    kv.check(live_ids([nxt]))
    assert kv.cache.evict(8) == [tail.block]      # a leaf like any other: evicted first (LRU)


def _hybrid(n_blocks: int, every: int, checkpoints: int = 4):
    """A KVManager with recurrent-state slots (3 running), recording the K/V and state copies."""
    copies, states = [], []
    state = StateSlots(3, checkpoints, every, lambda src, dst: states.append((src, dst)), 64)
    kv = KVManager(n_blocks, BS, copy_rows=lambda src, dst, n: copies.append((src, dst, n)), state=state)
    return kv, copies, states


def test_a_hybrid_resumes_only_after_a_whole_tail_with_its_checkpoint():
    """A recurrent state is a slot, not per position: a hybrid resumes only where a checkpoint
    was taken: the end of a turn (a whole tail node), never the leading rows of a block."""
    kv, copies, states = _hybrid(8, every=1)
    first = _turn(kv, [1, 2, 3, 4, 5, 6])       # checkpoints: block [1 2 3 4]'s end (every block), the tail's
    tail = kv.cache.root.children[(1, 2, 3, 4)].children[(5, 6)]
    assert tail.ckpt >= 3 and kv.cache.root.children[(1, 2, 3, 4)].ckpt >= 3 and first.id not in kv.held
    part = Seq([1, 2, 3, 4, 5, 0, 0], 1)         # one of the tail's two positions: the block's checkpoint
    assert admit(kv, part, part.max_positions) and part.n_computed == 4 and copies == []
    assert states[-1] == (kv.cache.root.children[(1, 2, 3, 4)].ckpt, kv.slot(part.id))
    head = Seq([1, 2, 0], 1)                      # the leading rows of a full block: nothing
    assert admit(kv, head, head.max_positions) and head.n_computed == 0 and copies == []
    whole = Seq([1, 2, 3, 4, 5, 6, 7], 1)
    assert admit(kv, whole, whole.max_positions) and whole.n_computed == 6 and len(copies) == 1
    assert states[-1] == (tail.ckpt, kv.slot(whole.id))
    assert not admit(kv, Seq([9], 1), 2)          # 3 running slots, all held: it waits
    kv.check(live_ids([part, head, whole]))
    assert kv.usage()["state_slots_total"] == 7 and kv.usage()["state_checkpoints"] == 2


def test_a_hybrid_resumes_at_the_deepest_checkpoint_and_checkpoints_are_a_budget():
    kv, copies, states = _hybrid(16, every=2, checkpoints=2)
    _turn(kv, list(range(10, 22)))              # 12 positions, 3 blocks: a checkpoint at 2 blocks and at the end
    chain = kv.cache.match(list(range(10, 22)), 12)
    kv.cache.release(chain)
    assert [n.ckpt >= 0 for n in chain] == [False, True, True]
    again = Seq(list(range(10, 20)) + [0, 0], 1)  # shares two blocks and a half: resumes at block 2's end
    assert admit(kv, again, again.max_positions) and again.n_computed == 8
    kv.free(again.id, again.tokens, again.n_computed)  # 8 computed: ends on a block boundary, already checkpointed
    _turn(kv, [50, 51, 52, 53, 54])             # a third checkpoint (its tail): the least recent is dropped
    assert sum(n.ckpt >= 0 for n in chain) == 1 and len(kv.state.owner) == 2
    kv.check([])
    assert kv.drop_cache() and not kv.state.owner  # evicted nodes give their checkpoints back
    kv.check([])


def test_partial_reuse_never_takes_the_room_the_reservation_counted_on():
    """The pool is all cached blocks; the partial source is the only evictable leaf, so it is
    the block the reservation counts on: the copy is skipped, not the promise broken."""
    copies = []
    kv = KVManager(2, BS, copy_rows=lambda src, dst, n: copies.append((src, dst, n)))
    first = Seq([1, 2, 3, 4, 5, 6, 7, 8], 1)
    assert admit(kv, first, 8)
    kv.extend(first.id, 8)
    first.n_computed = 8
    kv.commit(first.id, first.tokens, first.n_computed)
    kv.free(first.id, first.tokens, first.n_computed)  # [1 2 3 4] -> [5 6 7 8], both cached, none free
    again = Seq([1, 2, 3, 4, 5, 6, 0], 1)   # hits the first, shares 2 rows of the second
    assert admit(kv, again, 7)
    assert copies == [] and again.n_computed == 4
    kv.extend(again.id, 7)                  # the reserved block: the second one, evicted
    kv.check(live_ids([again]))
    roomy = KVManager(3, BS, copy_rows=lambda src, dst, n: copies.append((src, dst, n)))
    first = Seq([1, 2, 3, 4, 5, 6, 7, 8], 1)
    assert admit(roomy, first, 8)
    roomy.extend(first.id, 8)
    first.n_computed = 8
    roomy.commit(first.id, first.tokens, first.n_computed)
    roomy.free(first.id, first.tokens, first.n_computed)
    again = Seq([1, 2, 3, 4, 5, 6, 0], 1)
    assert admit(roomy, again, 7) and again.n_computed == 6  # a free block: the rows are copied
    (src, dst, n), = copies
    assert src != dst and n == 2
    roomy.check(live_ids([again]))


def test_only_the_newest_tails_are_kept():
    """Each finished request leaves its last block as a tail; past max_tails the oldest goes back
    to the free list, so unrelated requests do not spread the cache over untouched pool pages."""
    kv = KVManager(16, BS, copy_rows=lambda src, dst, n: None, max_tails=2)
    for first in (10, 20, 30):
        _turn(kv, [first, first + 1, first + 2])
    assert [n.tokens[0] for n in kv.cache.root.children.values()] == [20, 30]
    assert kv.n_cached == 2 and len(kv.free_blocks) == 14
    kv.check([])
    again = Seq([30, 31, 32, 33], 1)              # the newest still resumes
    assert admit(kv, again, again.max_positions) and again.n_computed == 3
