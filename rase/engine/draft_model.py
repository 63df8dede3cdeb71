"""Drafts from a smaller model that shares the tokenizer (llama-server's --model-draft), for
all of a worker's speculating requests together.

Each request has a sequence on the draft model's own paged KV pool: its blocks and the tokens
whose K/V they hold are its memory in the KV manager's draft group (kv_manager.Memory.draft,
draft_known); DraftSeq keeps its adaptive draft length. Before a step, DraftModel.run evaluates, in one draft step,
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

from ..errors import RaseError
from ..kernels import _kernels
from .drafting import Lookup
from .kv_manager import KVManager
from .timing import Ema

log = logging.getLogger("rase")


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
    """One request's drafting on the draft model: its adaptive draft length (Lookup's k, capped
    by what pays); its drafts come from DraftModel.run."""

    def __init__(self, batch: "DraftModel") -> None:
        super().__init__(None)
        self.batch = batch
        self.pending: list[int] = []  # the drafts of this step (run)

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


class DraftModel:
    """A worker's draft model: its plan's forward over the KV manager's draft pool, steps of up
    to max_rows rows, run from the worker's thread (its drafter)."""

    def __init__(self, plan, kv: KVManager, max_rows: int, n_threads: int, vocab: int | None = None) -> None:
        """vocab: the model's vocabulary size; a draft token past it (or past the draft's) ends
        that request's drafts for the step (plan.check_draft allows sizes a little apart)."""
        self.fwd = _kernels.Forward(plan.weights, kv.n_draft, max_rows, n_threads)
        self.kv, self.seqs = kv, {}  # request id -> DraftSeq
        self.max_rows, self.n_ctx = max_rows, plan.n_ctx
        self.vocab = min(plan.vocab_size, vocab or plan.vocab_size)
        self.failed = False
        self.step_s = Ema(0.1)              # a draft step (a row per request), in seconds
        self.target_s: float | None = None  # the worker's decode step, as the scheduler measures it

    def ratio(self) -> float | None:
        """A draft step's time in target steps, once both were measured."""
        return None if self.step_s.value is None or not self.target_s else self.step_s.value / self.target_s

    def propose(self, rooms: dict, target_s: float | None = None) -> dict:
        """rooms: request -> the most drafts it may verify; its drafts (none: not this step).
        target_s: the worker's decode step in seconds (best_k weighs the drafts' cost by it). A
        failure of the draft model stops drafting, never the requests."""
        self.target_s = target_s
        for req in rooms:
            if req.id not in self.seqs:
                self.seqs[req.id] = DraftSeq(self)
        wants = [(self.seqs[req.id], req, room) for req, room in rooms.items()]
        try:
            if not self.failed:
                self._run(wants)
        except (RaseError, MemoryError, ValueError) as exc:
            log.warning("the draft model failed; speculation stops for this model: %s", exc)
            self.failed = True
        out = {req: seq.pending for seq, req, _ in wants if seq.pending and not self.failed}
        for seq, _, _ in wants:
            seq.pending = []
        return out

    def verified(self, req, drafted: int, accepted: int) -> None:
        self.seqs[req.id].verified(drafted, accepted)

    def finished(self, req) -> None:
        """req is done (its draft blocks went back with the rest of its memory: KVManager.free)."""
        self.seqs.pop(req.id, None)

    def _run(self, wants) -> None:
        rows, outs, live, budget = [], [], [], self.max_rows
        for seq, req, most in wants:
            seq.pending = []
            tokens, mem = req.tokens, self.kv.draft(req.id)
            k = min(seq._room(most), self.n_ctx - len(tokens))
            if k <= 0 or len(tokens) < 1 or not self.kv.reserve_draft(req.id, len(tokens) + k - 1):
                continue
            same = 0
            for a, b in zip(mem.draft_known, tokens):
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
            mem.draft_known = tokens[:same + take]
            live.append((mem, sid))
            if same + take == len(tokens):  # caught up: this row's logits give the first draft
                outs.append((seq, mem, k, sid, len(rows) - 1))
        if not rows:
            return
        tables = np.zeros((len(live), max(len(m.draft) for m, _ in live)), np.int32)
        for mem, sid in live:
            tables[sid, :len(mem.draft)] = mem.draft
        while rows:  # the first step also when it only catches up (its one logits row then unread)
            read = [o[4] for o in outs] or [len(rows) - 1]
            t0 = time.perf_counter()
            _, logits = self.fwd.step(np.array(rows, np.int32), tables, np.array(read, np.int32))
            if len(rows) <= 2 * len(live):  # a drafting step, not a prompt's catch-up
                self.step_s.add(time.perf_counter() - t0)
            drawn = np.argmax(logits, axis=1).tolist() if outs else []
            rows, nxt = [], []
            for (seq, mem, k, sid, _), tok in zip(outs, drawn):
                if tok >= self.vocab:  # a token the model does not have: no draft from here on
                    continue
                seq.pending.append(int(tok))
                if len(seq.pending) < k:  # evaluate this draft: its logits give the next one
                    rows.append((int(tok), sid, len(mem.draft_known)))
                    mem.draft_known.append(int(tok))
                    nxt.append((seq, mem, k, sid, len(rows) - 1))
            outs = nxt
