"""Drafts from a smaller model that shares the tokenizer (llama-server's --model-draft), for
all of a worker's speculating requests together.

Each request has a sequence on the draft model's own paged KV pool (DraftSeq: its blocks, and
the tokens whose K/V they hold). Before a step, DraftBatch.run evaluates, in one draft step,
each request's tokens from the first position where they differ from what its sequence holds
(the tokens the last step accepted and the one it drew: a rollback is only a shorter prefix),
then one step per further draft with a row per request still drafting: the greedy
continuation, each request's adaptive number of tokens (drafting.Lookup's k). A prompt the
draft has not seen is caught up chunk by chunk, within the step's rows, before it drafts.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from ..kernels import _kernels
from .drafting import Lookup
from ..errors import RaseError
from .scheduler import Ema

log = logging.getLogger("rase")
BLOCK = _kernels.KV_BLOCK


def best_k(a: float, r: float, most: int) -> int:
    """The draft length (0..most) that gives the most tokens per unit of time: k drafts, each
    holding with probability a (and only after those before it), give (1 - a^(k+1)) / (1 - a)
    tokens for a target step and k draft steps of r target steps each. 0 when no length beats
    not drafting by 2%."""
    best, value = 0, 1.02
    for k in range(1, most + 1):
        tokens = (k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
        if tokens / (1.0 + k * r) > value:
            best, value = k, tokens / (1.0 + k * r)
    return best


class DraftSeq(Lookup):
    """One request's sequence on the draft model: its drafts come from DraftBatch.run."""

    def __init__(self, batch: "DraftBatch") -> None:
        super().__init__(None)
        self.batch = batch
        self.blocks: list[int] = []  # pool blocks, position p in blocks[p // BLOCK]
        self.known: list[int] = []   # the tokens whose K/V the blocks hold, position by position
        self.pending: list[int] = []  # the drafts of this step (run), handed out by propose

    def propose(self, tokens: list[int], most: int) -> list[int]:
        out, self.pending = self.pending[:max(0, most)], []
        return out

    def _room(self, most: int) -> int:
        """Lookup's k (grown while drafts hold), capped by what pays for this draft model's cost
        (best_k, at this request's acceptance so far); when nothing pays, k falls to 0 and a
        probe of one draft comes every PROBE tokens."""
        probe = self.k == 0
        k = super()._room(most)
        ratio = self.batch.ratio()
        if k <= 0 or ratio is None or probe:  # a probe's one draft goes through: it measures acceptance
            return k
        cap = best_k((self.accepted + 1) / (self.drafted + 2), ratio, k)
        if cap == 0:
            self.k, self.idle = 0, 0
        return cap

    def close(self) -> None:
        """The request is done: its blocks go back (the counters stay for its timings)."""
        self.batch.free.extend(self.blocks)
        self.blocks, self.known, self.pending = [], [], []


class DraftBatch:
    """A worker's draft model: its plan's forward with a pool of n_blocks and steps of up to
    max_rows rows, run from the worker's thread."""

    def __init__(self, plan, n_blocks: int, max_rows: int, n_threads: int, vocab: int | None = None) -> None:
        """vocab: the model's vocabulary size; a draft token past it (or past the draft's) ends
        that request's drafts for the step (plan.check_draft allows sizes a little apart)."""
        self.fwd = _kernels.Forward(plan.weights, n_blocks, max_rows, n_threads)
        self.free = list(range(n_blocks - 1, -1, -1))
        self.max_rows, self.n_ctx = max_rows, plan.n_ctx
        self.vocab = min(plan.vocab_size, vocab or plan.vocab_size)
        self.failed = False
        self.step_s = Ema(0.1)              # a draft step (a row per request), in seconds
        self.target_s: float | None = None  # the worker's decode step, as the scheduler measures it

    def ratio(self) -> float | None:
        """A draft step's time in target steps, once both were measured."""
        return None if self.step_s.value is None or not self.target_s else self.step_s.value / self.target_s

    def sequence(self, req) -> DraftSeq:
        return DraftSeq(self)

    def _reserve(self, seq: DraftSeq, positions: int) -> bool:
        need = -(-positions // BLOCK) - len(seq.blocks)
        if need > len(self.free):
            return False
        seq.blocks.extend(self.free.pop() for _ in range(max(0, need)))
        return True

    def run(self, wants: list[tuple[DraftSeq, list[int], int]], target_s: float | None = None) -> None:
        """wants: (sequence, the request's tokens, the most drafts it may verify); each
        sequence's pending becomes its drafts (none: not this step). target_s: the worker's
        decode step in seconds (best_k weighs the drafts' cost by it). A failure of the draft
        model stops drafting, never the requests."""
        self.target_s = target_s
        try:
            if not self.failed:
                self._run(wants)
        except (RaseError, MemoryError, ValueError) as exc:
            log.warning("the draft model failed; speculation stops for this model: %s", exc)
            self.failed = True
            for seq, _, _ in wants:
                seq.pending = []

    def _run(self, wants) -> None:
        rows, outs, live, budget = [], [], [], self.max_rows
        for seq, tokens, most in wants:
            seq.pending = []
            k = min(seq._room(most), self.n_ctx - len(tokens))
            if k <= 0 or len(tokens) < 1 or not self._reserve(seq, len(tokens) + k - 1):
                continue
            same = 0
            for a, b in zip(seq.known, tokens):
                if a != b:
                    break
                same += 1
            same = min(same, len(tokens) - 1)  # the last token runs again: its logits give the first draft
            take = min(len(tokens) - same, budget)
            if take <= 0:
                continue
            sid = len(live)
            rows.extend((tokens[p], sid, p) for p in range(same, same + take))
            budget -= take
            seq.known = tokens[:same + take]
            live.append((seq, k, sid))
            if same + take == len(tokens):  # caught up: this row's logits give the first draft
                outs.append((seq, k, sid, len(rows) - 1))
        if not rows:
            return
        tables = np.zeros((len(live), max(len(s.blocks) for s, _, _ in live)), np.int32)
        for seq, _, sid in live:
            tables[sid, :len(seq.blocks)] = seq.blocks
        while rows:  # the first step also when it only catches up (its one logits row then unread)
            read = [o[3] for o in outs] or [len(rows) - 1]
            t0 = time.perf_counter()
            _, logits = self.fwd.step(np.array(rows, np.int32), tables, np.array(read, np.int32))
            if len(rows) <= 2 * len(live):  # a drafting step, not a prompt's catch-up
                self.step_s.add(time.perf_counter() - t0)
            drawn = np.argmax(logits, axis=1).tolist() if outs else []
            rows, nxt = [], []
            for (seq, k, sid, _), tok in zip(outs, drawn):
                if tok >= self.vocab:  # a token the model does not have: no draft from here on
                    continue
                seq.pending.append(int(tok))
                if len(seq.pending) < k:  # evaluate this draft: its logits give the next one
                    rows.append((int(tok), sid, len(seq.known)))
                    seq.known.append(int(tok))
                    nxt.append((seq, k, sid, len(rows) - 1))
            outs = nxt
