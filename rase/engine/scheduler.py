"""Continuous batching for one model: decides each step, never runs the model.

next_step(now) admits waiting requests (first come, first served, as long as the KV pool can promise
their whole budget), then lays out one step: one decode row for every running request whose
prompt is done, followed by prompt chunks of the others (oldest first) within a token budget
sized so that the running requests' time between tokens stays near `tbt_target_ms`.
update(step, tokens, seconds, now) folds the sampled tokens back: text, stops, finished requests.
Prompt-only requests sample nothing: a collector reads their rows, the final hidden states
(embeddings.Pooling) or the logits (perplexity.Scoring), at most `max_logit_rows` logits rows a
step; an encoder's input (causal=False) goes whole into one step and holds no KV block.
Cancellation is honoured at the start of every next_step(now). Speculation: draft_rooms() says
how many drafts each decoding request may verify, the worker's drafter proposes them, and
next_step(now, drafts) lays them out as extra rows of their sequence. No threads, no kernels, no
clock (time is an argument): tests drive it with made-up tokens.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import RaseError
from ..output import GenerationStopReason, Output
from .kv_manager import KVManager
from .logprobs import token_logprob
from .request import Request, State
from .timing import Ema


@dataclass
class Event:
    """What a step (or a cancellation) hands a request's channel: its Output, and whether it ended."""
    request: Request
    output: Output = Output()
    done: bool = False


@dataclass
class Step:
    rows: np.ndarray          # (n, 3) int32: token, seq, pos
    tables: np.ndarray        # (n_seq, max_blocks) int32
    out_rows: np.ndarray      # (n_out,) int32: rows whose logits give a token, then the read logits rows
    out: list[Request]        # the request each of the first len(out) out rows samples for
    seqs: list[Request]       # seq index -> request
    counts: list[int]         # rows per seq
    n_decode: int
    n_prefill: int
    samplers: list = field(default_factory=list)
    embd_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # rows whose hidden states are read
    reads: list = field(default_factory=list)  # (request, start, stop): its slice of hidden (embd_rows) or logits
    slots: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # seq -> recurrent-state slot
    drafts: dict = field(default_factory=dict)  # request -> the draft tokens its rows verify (speculation)
    verified: dict = field(default_factory=dict)  # request -> (drafts verified, accepted), after update


@dataclass
class _Rows:
    """A step as it is laid out: its rows (token, seq, pos), the rows whose logits give a token
    (and who samples each), the sequences and their row counts, and the rows read back."""
    rows: list = field(default_factory=list)
    out_rows: list = field(default_factory=list)
    out: list = field(default_factory=list)
    samplers: list = field(default_factory=list)
    seqs: list = field(default_factory=list)
    counts: list = field(default_factory=list)
    embd_rows: list = field(default_factory=list)
    logit_rows: list = field(default_factory=list)
    reads: list = field(default_factory=list)

    def sample(self, req: Request, sampler, row: int | None = None) -> None:
        """The row (default: the next one) samples a token for req with sampler."""
        self.out_rows.append(len(self.rows) if row is None else row)
        self.out.append(req)
        self.samplers.append(sampler)


class Scheduler:
    def __init__(self, kv: KVManager, max_batch: int = 8, max_chunk: int = 512, min_chunk: int = 16,
                 tbt_target_ms: float = 100.0, causal: bool = True, max_logit_rows: int = 512,
                 speculative: bool = False) -> None:
        """speculative: decoding requests verify drafts (the worker's drafter proposes them:
        drafting.py, draft_model.py) as extra rows of their sequence: the same tokens, fewer
        steps."""
        self.kv, self.causal, self.max_logit_rows = kv, causal, max_logit_rows
        self.speculative = speculative and causal and kv.state is None  # a recurrent state cannot step back
        self._forks: dict[int, list] = {}  # request id -> the samplers of its draft rows, reused step to step
        self.max_batch, self.max_chunk, self.min_chunk = max_batch, max_chunk, min_chunk
        self.tbt_target = tbt_target_ms / 1e3
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.events: list[Event] = []     # finished outside a step (cancelled while waiting)
        self._decode_s = Ema()           # a decode-only step
        self._prefill_tok_s = Ema()      # each prompt token a step adds
        self.steps = 0
        self.drafted = self.draft_accepted = 0  # speculation: draft tokens verified, and confirmed
        self.media_ready = None  # image -> whether its rows are encoded (starting it if not); None: no images

    # ---------------------------------------------------------------- queue

    def add(self, req: Request) -> None:
        req.state = State.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _finish(self, req: Request, reason: GenerationStopReason | None, error: BaseException | None = None,
                out: Output = Output()) -> Event:
        """req ends with reason (or error); its last Event: out and what its text state held back."""
        self._forks.pop(req.id, None)
        if req.state is State.RUNNING:
            self.kv.free(req.id, req.tokens, req.n_computed)
            self.running.remove(req)
        req.state = State.DONE
        req.stop_reason, req.error = reason, error
        text = out.text + req.text.finish()
        calls = out.calls + req.text.pending_calls()
        return Event(req, Output(text, out.reasoning + req.text.pending_reasoning(), calls, out.logprobs), True)

    def _sweep_cancelled(self, now: float) -> None:
        for queue in (self.waiting, self.running):
            for req in [r for r in queue if r.cancel_requested or (r.deadline is not None and now >= r.deadline)]:
                if queue is self.waiting:
                    self.waiting.remove(req)
                reason = GenerationStopReason.CANCELLED if req.cancel_requested else GenerationStopReason.TIME_LIMIT
                self.events.append(self._finish(req, reason))

    def _admit(self) -> None:
        """FCFS while the pool can promise a request's KV; generation requests up to max_batch
        (each holds a decode row), prompt-only requests beside them (they hold rows only for
        their prompt's steps, so a batch of inputs lands in one step)."""
        generating = sum(r.collect is None for r in self.running)
        while self.waiting:
            req = self.waiting[0]
            if req.collect is None and generating >= self.max_batch:
                break
            first = req.after
            if first is not None and first.state is not State.DONE and first.n_computed < len(first.prompt):
                break  # a sibling choice: admitted once the shared prompt is in the prefix cache
            computed = self.kv.allocate(req.id, req.tokens, req.max_positions if self.causal else 0,
                                        cached=req.collect is None)
            if computed is None:
                break  # FCFS: later requests wait behind it
            self.waiting.popleft()
            req.n_computed = req.cached_tokens = computed
            req.state = State.RUNNING
            self.running.append(req)
            generating += req.collect is None

    def fail_all(self, error: BaseException) -> list[Event]:
        """Every request ends with `error` (the forward itself failed)."""
        out = [self._finish(r, None, error) for r in list(self.running)]
        while self.waiting:
            out.append(self._finish(self.waiting.popleft(), None, error))
        return out

    # ---------------------------------------------------------------- one step

    def chunk_budget(self, n_decode: int) -> int:
        """Prompt tokens this step may take: all the chunk holds when nobody is decoding, else
        what fits in the time-between-tokens target next to the decode rows."""
        if n_decode == 0 or self._prefill_tok_s.value is None:
            return self.max_chunk
        spare = self.tbt_target - (self._decode_s.value or 0.0)
        return int(min(self.max_chunk, max(self.min_chunk, spare / max(self._prefill_tok_s.value, 1e-6))))

    @property
    def decode_seconds(self) -> float | None:
        """A decode-only step's moving mean, in seconds (None until measured)."""
        return self._decode_s.value

    def draft_rooms(self) -> dict[Request, int]:
        """The running requests that decode next and may verify drafts, each with how many
        (speculative only): the drafter proposes at most that many for each."""
        rooms = {}
        for req in self.running:
            if req.remaining == 1 and req.collect is None:
                room = self._draft_room(req)
                if room > 0:
                    rooms[req] = room
        return rooms

    def next_step(self, now: float, drafts: dict[Request, list[int]] | None = None) -> Step | None:
        """The next step at time now (monotonic seconds); drafts: the drafter's tokens for the
        requests draft_rooms() named (the ones still decoding verify them)."""
        self._sweep_cancelled(now)
        self._admit()
        if not self.running:
            return None
        decode = [r for r in self.running if r.remaining == 1 and r.collect is None]
        rows = _Rows()
        verify = self._decode_rows(rows, decode, drafts or {})
        # the forward holds max_batch + max_chunk rows: drafts' rows come out of the prompt budget
        budget = min(self.chunk_budget(len(decode)), self.max_batch + self.max_chunk - len(rows.rows))
        n_prefill = self._prompt_rows(rows, budget)
        if not rows.seqs:
            return None  # encoder inputs waiting for a step with room (none is running yet)
        held = [self.kv.table(r.id) for r in rows.seqs]
        tables = np.zeros((len(rows.seqs), max(1, max(map(len, held)))), np.int32)
        for i, table in enumerate(held):
            tables[i, :len(table)] = table
        for req in dict.fromkeys(rows.out):  # the grammar's mask for the token its first out row samples
            if req.constraint is not None:
                req.sampler.mask = req.constraint.fill()
        n_out = len(rows.out_rows)  # logits reads follow the sampled rows in the logits
        reads = [(r, a + n_out, b + n_out) if r.collect.source == "logits" else (r, a, b) for r, a, b in rows.reads]
        return Step(np.array(rows.rows, np.int32).reshape(-1, 3), tables,
                    np.array(rows.out_rows + rows.logit_rows, np.int32), rows.out, rows.seqs, rows.counts, len(decode),
                    n_prefill, rows.samplers + [None] * len(rows.logit_rows), np.array(rows.embd_rows, np.int32), reads,
                    np.array([self.kv.slot(r.id) for r in rows.seqs], np.int32), verify)

    def _decode_rows(self, rows: "_Rows", decode: list[Request], drafts: dict) -> dict[Request, list[int]]:
        """A row for each decoding request's last token, and one per draft it verifies; the drafts."""
        verify: dict[Request, list[int]] = {}
        for req in decode:
            guess, masks = self._drafts(req, drafts.get(req, []))
            if guess:
                verify[req] = guess
            n = req.n_computed
            self.kv.extend(req.id, n + 1 + len(guess))
            for i, token in enumerate([req.tokens[n]] + guess):  # each position's logits verify the next draft
                rows.sample(req, req.sampler if i == 0 else self._fork(req, i, guess, masks[i - 1] if masks else None))
                rows.rows.append((token, len(rows.seqs), n + i))
            rows.seqs.append(req)
            rows.counts.append(1 + len(guess))
        return verify

    def _prompt_rows(self, rows: "_Rows", budget: int) -> int:
        """Prompt chunks of the others, oldest first, within budget tokens; how many."""
        n_prefill = 0
        for req in self.running:
            if (req.remaining == 1 and req.collect is None) or budget <= 0:
                continue
            take = self._take(req, budget, len(rows.logit_rows))
            if req.media is not None and take > 0:
                take = self._media_take(req, take, self.max_batch + self.max_chunk - len(rows.rows))
            if self.kv.state and take > 0:  # a hybrid's chunk ends at its next checkpoint boundary
                take = self.kv.state.chunk(req.n_computed, take, self.kv.block_size)
            if take <= 0 or (not self.causal and take < req.remaining):
                continue  # an encoder's input is whole in one step: a later step has room
            budget -= take
            n_prefill += take
            if self.causal:
                self.kv.extend(req.id, req.n_computed + take)
            start = req.n_computed
            if req.collect is not None:
                read = rows.embd_rows if req.collect.source == "hidden" else rows.logit_rows
                first = len(read)
                read.extend(len(rows.rows) + p - start for p in range(start, start + take) if req.collect.wants(p))
                rows.reads.append((req, first, len(read)))
            rows.rows.extend((req.tokens[p], len(rows.seqs), p) for p in range(start, start + take))
            if start + take == len(req.tokens) and req.collect is None:  # the prompt's last position: token 1
                rows.sample(req, req.sampler, len(rows.rows) - 1)
            rows.seqs.append(req)
            rows.counts.append(take)
        return n_prefill

    def _media_take(self, req: Request, take: int, room: int) -> int:
        """A chunk of a prompt with images: the rest of a non-causal image in one step (within the
        step's room), and never past an image whose rows are still being encoded (0: wait)."""
        take = req.media.cut(req.n_computed, take)
        if take > room:
            return 0  # a later step has room for it
        if self.media_ready is not None:
            wait = req.media.waiting(req.n_computed, self.media_ready)
            if wait is not None and wait < req.n_computed + take:
                take = wait - req.n_computed
        return take

    def _accepted(self, step: Step, tokens) -> dict[Request, int]:
        """Per verified request: how many of its drafts the tokens its rows drew confirm (each
        row's token is the one decoding one at a time would draw there, given the drafts before it)."""
        out = {}
        for req, guess in step.drafts.items():
            j = step.out.index(req)
            m = 0
            while m < len(guess) and isinstance(tokens[j + m], int) and int(tokens[j + m]) == guess[m]:
                m += 1
            out[req] = m
            step.verified[req] = (len(guess), m)
            req.drafted += len(guess)
            req.draft_accepted += m
            if req.config.temperature > 0:
                req.sampler.skip(m)  # its own row drew once; the m accepted rows' draws are its next ones
            self.drafted += len(guess)
            self.draft_accepted += m
        return out

    def _fork(self, req: Request, i: int, guess: list[int], mask=None):
        """The sampler of a draft's row i: the request's as it will be i draws on, its penalties
        counting the tokens before the row, with the grammar's mask after the drafts before it
        (kept for reuse)."""
        forks = self._forks.setdefault(req.id, [])
        while len(forks) < i:
            forks.append(None)
        # the request's counts hold every token so far; row i samples after drafts 1..i too
        forks[i - 1] = req.sampler.fork(i, forks[i - 1], guess[:i] if req.penalized else ())
        forks[i - 1].mask = mask
        return forks[i - 1]

    def _draft_room(self, req: Request) -> int:
        """How many drafts a decoding request may verify this step (0: none): only where each
        verified token is, by construction, the one decoding one at a time draws (row i samples
        with the request's sampler as it will be i draws on, greedy or seeded, with the grammar's
        mask after the drafts before it, its penalties counting them; each row's logits give its
        logprobs); not with a constraint that cannot say its masks ahead (no draft_masks: tool
        calls, reasoning gates); not for a prompt with images (the drafter sees no image)."""
        if not self.speculative or (req.constraint is not None and not hasattr(req.constraint, "draft_masks")):
            return 0
        if req.media is not None:  # a draft model cannot read the image's rows: the request decodes alone
            return 0
        if req.drafted is None:
            req.drafted = 0  # it speculates: its timings count its drafts
        # room: the tokens it may still sample, the last of which needs no draft after it
        room = req.config.max_tokens - req.generated - 1
        if req.config.draft_max is not None:
            room = min(room, req.config.draft_max)
        return room

    @staticmethod
    def _drafts(req: Request, guess: list[int]) -> tuple[list[int], list]:
        """The drafts req verifies (a prefix of its drafter's guess) and its rows' grammar masks."""
        masks: list = []
        if guess and req.constraint is not None:
            guess, masks = req.constraint.draft_masks(guess)
        return (guess, masks) if len(guess) >= max(1, req.config.draft_min) else ([], [])

    def _take(self, req: Request, budget: int, logit_rows: int) -> int:
        """Prompt positions req computes this step: within the budget and, when it reads logits,
        within the step's logits rows (its wanted positions are a contiguous run)."""
        take = min(req.remaining, budget)
        if req.collect is None or req.collect.source != "logits":
            return take
        start = req.n_computed
        wanted = [p for p in range(start, start + take) if req.collect.wants(p)]
        room = self.max_logit_rows - logit_rows
        return take if len(wanted) <= room else (wanted[room] - start if room >= 0 else 0)

    def update(self, step: Step, tokens, seconds: float, now: float, logits=None, hidden=None) -> list[Event]:
        """Fold a step's sampled tokens back: one per sampling out row, each a token id or the
        RaseError its draw stands for (sampling.token_or_error). logits (n_out, n_vocab) feed the
        log-probabilities of the requests that ask for them and the logits reads; hidden
        (len(embd_rows), n_embd) the hidden-state reads."""
        self.steps += 1
        if step.n_prefill == 0:
            self._decode_s.add(seconds)
        else:
            self._prefill_tok_s.add(max(seconds - (self._decode_s.value or 0.0) * (step.n_decode > 0), 0.0)
                                    / step.n_prefill)
        accepted = self._accepted(step, tokens)
        for req, n in zip(step.seqs, step.counts):
            req.n_computed += n if req not in accepted else accepted[req] + 1  # rejected drafts' K/V is left behind
            self.kv.commit(req.id, req.tokens, req.n_computed)
        events, self.events = self.events, []
        for req, a, b in step.reads:
            req.collect.add((hidden if req.collect.source == "hidden" else logits)[a:b])
            if req.n_computed == len(req.prompt):
                req.collect.finish()
                events.append(self._finish(req, None))
        left = {req: m + 1 for req, m in accepted.items()}  # tokens of a verified run to take: the accepted + 1
        for j, (req, token) in enumerate(zip(step.out, tokens)):
            if req in left:
                if left[req] == 0 or req.state is State.DONE:
                    continue  # past the first wrong draft, or the run already ended the request
                left[req] -= 1
            try:
                if isinstance(token, RaseError):
                    raise token
                token = int(token)
                if req.constraint is not None:
                    req.constraint.advance(token)
            except RaseError as exc:
                events.append(self._finish(req, None, exc))
                continue
            req.tokens.append(token)
            req.generated += 1
            req.first_token = req.first_token or now
            req.last_token = now
            if req.sampler is not None and req.penalized:
                req.sampler.accept(token)
            if token in req.stop_tokens:  # kept in tokens, never shown
                events.append(self._finish(req, GenerationStopReason.STOP_TOKEN))
                continue
            out = req.text.feed(token)
            if req.logprobs is not None and logits is not None:
                out = replace(out, logprobs=(token_logprob(logits[j], token, req.logprobs, req.text.token_bytes),))
                req.logprob_entries.extend(out.logprobs)
            stop = out.stop or (GenerationStopReason.GRAMMAR if req.constraint is not None and req.constraint.complete
                                else GenerationStopReason.MAX_TOKENS if req.generated >= req.config.max_tokens
                                else None)
            events.append(self._finish(req, stop, out=out) if stop else Event(req, out))
        return events

    def drain_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def stats(self) -> dict:
        return dict(running=len(self.running), waiting=len(self.waiting), steps=self.steps,
                    decode_step_ms=round((self._decode_s.value or 0.0) * 1e3, 3),
                    prefill_token_ms=round((self._prefill_tok_s.value or 0.0) * 1e3, 4),
                    drafted_tokens=self.drafted, accepted_draft_tokens=self.draft_accepted, **self.kv.usage())
