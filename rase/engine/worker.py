"""ModelWorker: the one thread per loaded model that runs its forward.

Everyone else sends it requests (submit -> RequestHandle) and cancellations (a flag on the
request); it loops: take new requests, have the drafter propose drafts where the scheduler
allows them, let the scheduler plan a step, run the step (forward and sampling of every row,
GIL released), hand the scheduler the tokens, push text and ends to the handles. Idle, it
sleeps on a condition variable. Different models have different workers and run in parallel.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref

from ..kernels import _kernels
from ..config import PROFILE, default_threads
from ..errors import (ContextOverflow, InvalidRequest, ModelUnloaded, NoVisionEncoder, Overloaded, RaseError,
                      WrongModelKind)
from .sampling import GenerationConfig, make_sampler, token_or_error
from .drafting import NgramDrafter
from .kv_manager import KVManager, blocks_for
from .media import ImageEncoder, rope_positions, step_inputs
from .draft_model import DraftModel
from ..store.plan import ModelPlan, check_kv_type
from .config import EngineConfig
from .profiling import profile_add
from .request import NoText, Request
from .channel import RequestHandle
from .scheduler import Event, Scheduler
from .state_cache import StateSlots

log = logging.getLogger("rase")

MAX_CHUNK = 512            # prompt tokens per step at most (llama.cpp's default ubatch)
LOGIT_READS_MB = 128       # logits rows prompt-only requests may read in one step (f32 x vocabulary)
PREFIX_CACHE_MB = 256      # default pool room for cached prefixes, beyond max_batch full contexts
KV_MEMORY_SHARE = 0.25     # the default pool per model at most this share of physical memory
IDLE_WAIT_S = 0.05         # a step with nothing to compute waits this long for news (deadlines are checked then)


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def pool_blocks(plan: ModelPlan, max_batch: int, kv_cache_mb: float | None, prefix_cache: bool = True,
                kv_type: str = "f16") -> int:
    """KV pool size: kv_cache_mb if given, else max_batch full contexts, plus PREFIX_CACHE_MB of
    room for cached prefixes when there is a prefix cache to keep them, within KV_MEMORY_SHARE of
    the machine's memory (a model's own context, 32k-128k positions, times max_batch would
    not fit it). Requests reserve what they may reach, so the pool, not n_ctx, decides
    admission."""
    per_block = plan.kv_bytes(kv_type) * _kernels.KV_BLOCK
    if kv_cache_mb is not None:
        n = int(kv_cache_mb * (1 << 20) // per_block)
        if n < 1:
            raise InvalidRequest(f"kv_cache_mb={kv_cache_mb} holds no KV block "
                                          f"({per_block} bytes each for this model)")
        return n
    room = PREFIX_CACHE_MB * (1 << 20) // per_block if prefix_cache else 0
    budget = max(1, int(KV_MEMORY_SHARE * physical_memory()) // per_block)
    return min(blocks_for(max_batch * plan.n_ctx, _kernels.KV_BLOCK) + room, budget)


def state_slots(plan: ModelPlan, max_batch: int, n_blocks: int, kv_type: str = "f16") -> tuple[int, int, int]:
    """A hybrid's recurrent-state slots: (running: one per batched request, checkpoints, every:
    checkpoint interval in blocks). The interval makes a checkpoint cost about the K/V of the
    blocks it spans, so checkpoints take about as much memory as the KV pool; at least two per
    running request (their turns' ends)."""
    state = plan.weights.state_bytes
    if not state:
        return 1, 0, 1
    per_block = max(1, plan.kv_bytes(kv_type) * _kernels.KV_BLOCK)
    every = max(1, -(-state // per_block))
    return max_batch, max(2 * max_batch, -(-n_blocks // every)), every


class ModelWorker:
    def __init__(self, plan: ModelPlan, config: EngineConfig = EngineConfig(), *, name: str = "model",
                 draft: ModelPlan | None = None, images: ImageEncoder | None = None) -> None:
        """config: the engine's settings (max_batch, kv_cache_mb, n_threads, tbt_target_ms,
        prefix_cache, max_waiting, time_limit_s, speculative, kv_type). draft: with speculative,
        the plan of a model sharing the tokenizer (plan.check_draft) whose drafts are verified;
        without, prompt lookup drafts (drafting.py). images: the model's vision encoder (its
        prompts' image rows are encoded here, in this worker's thread), or None."""
        self.plan, self.config, self.name, self.images = plan, config, name, images
        self.causal = plan.weights.causal
        self.kv_type = check_kv_type(plan, config.kv_type)
        max_batch, threads = config.max_batch, config.n_threads or default_threads()
        # an encoder: every input whole in one step (up to a full context), no KV pool
        n_blocks = pool_blocks(plan, max_batch, config.kv_cache_mb, config.prefix_cache, self.kv_type) \
            if self.causal else 1
        self.max_chunk = MAX_CHUNK if self.causal else plan.n_ctx
        running, checkpoints, every = state_slots(plan, max_batch, n_blocks, self.kv_type)
        self.fwd = _kernels.Forward(plan.weights, n_blocks, max_batch + self.max_chunk, threads,
                                    running + checkpoints, kv_type=self.kv_type)
        state = StateSlots(running, checkpoints, every, self.fwd.copy_state, plan.weights.state_bytes) \
            if plan.weights.state_bytes else None
        speculative = config.speculative is not None
        drafting = speculative and draft is not None and self.causal and state is None  # Scheduler.speculative
        # a draft model's pool holds as many positions as this one's (its rows are smaller)
        self.kv = KVManager(n_blocks, _kernels.KV_BLOCK, config.prefix_cache and self.causal,
                            copy_rows=self.fwd.copy_rows, state=state, max_tails=2 * max_batch,
                            draft_blocks=n_blocks if drafting else 0)
        logit_rows = max(1, min(self.max_chunk, LOGIT_READS_MB * (1 << 20) // (4 * plan.vocab_size)))
        self.scheduler = Scheduler(self.kv, max_batch=max_batch, max_chunk=self.max_chunk,
                                   tbt_target_ms=config.tbt_target_ms, causal=self.causal, max_logit_rows=logit_rows,
                                   speculative=speculative)
        self.drafter = None  # proposes drafts for the requests the scheduler lets speculate
        if self.scheduler.speculative:
            self.drafter = DraftModel(draft, self.kv, max_batch + self.max_chunk, threads, plan.vocab_size) \
                if drafting else NgramDrafter()
        self._cond = threading.Condition()
        self._inbox: list[Request] = []
        self._closing = False
        self.max_batch, self.max_waiting, self.time_limit_s = max_batch, config.max_waiting, config.time_limit_s
        self._pending = 0            # submitted, not yet finished (under _cond)
        self._request_s = 1.0        # moving mean of a request's wall time: Retry-After's estimate
        self.counters = dict(requests=0, generated_tokens=0, cancelled=0, failed=0, rows=0, step_s=0.0,
                             python_s=0.0)
        if images is not None:  # images encode on their own thread; their requests' chunks wait for them
            self.scheduler.media_ready = images.ready
            images.on_done = self._wake
        self._thread = threading.Thread(target=self._loop, name=f"rase-worker-{name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- any thread

    def submit(self, prompt: list[int], config: GenerationConfig, text, constraint=None,
               logprobs: int | None = None, after: RequestHandle | None = None, media=None) -> RequestHandle:
        """Queue a request; its handle streams the text. constraint: a structured.Constraint
        its tokens must follow (its requests batch with everyone else's). after: the handle of
        an earlier request with the same prompt, computed first so this one reuses its KV (n > 1).
        media: the prompt's images (media.PromptMedia; their rows hold placeholder ids). Refused before any work when the prompt plus max_tokens cannot fit one sequence or the
        whole pool."""
        config.validate()
        if not self.plan.weights.has_lm_head:
            raise InvalidRequest("this model is an encoder: it embeds text and generates none", "model")
        self._check_prompt(prompt, config.max_tokens, media)
        sampler = make_sampler(config, self.plan.vocab_size)
        req = Request(list(prompt), config, text, sampler, constraint, logprobs,
                      None if after is None else after.request, media=media)
        if req.penalized:
            for t in prompt:
                if t >= 0:  # an image's rows are no tokens to penalize
                    sampler.accept(int(t))
        return self._enqueue([req])[0]

    def submit_embed(self, prompts: list[list[int]], pooling: str, normalize: bool = True) -> list[RequestHandle]:
        """One embedding request per prompt (submit_prompts); each handle's Completion carries
        its pooled vector (embeddings.Pooling)."""
        from .embeddings import Pooling

        return self.submit_prompts(prompts, lambda prompt: Pooling(pooling, len(prompt), normalize))

    def submit_score(self, prompts: list[list[int]], first: int) -> list[RequestHandle]:
        """One scoring request per prompt (submit_prompts); each handle's Completion carries the
        -log p of every token after position `first` given the ones before (perplexity.Scoring)."""
        from .perplexity import Scoring

        if not self.plan.weights.has_lm_head:
            raise WrongModelKind(self.plan.architecture, "embedding", "an encoder has no next-token distribution to score")
        return self.submit_prompts(prompts, lambda prompt: Scoring(prompt, first))

    def submit_prompts(self, prompts: list[list[int]], collector_of) -> list[RequestHandle]:
        """Queue one prompt-only request per prompt, together (admitted in the same step when
        the pool and the step have room): collector_of(prompt) reads its rows as the steps compute
        them, batched with everything else the worker serves. Refused before any work when a
        prompt cannot fit a sequence, or (an encoder) one step."""
        reqs = []
        for i, prompt in enumerate(prompts):
            self._check_prompt(prompt, 0)
            if not self.causal and len(prompt) > self.max_chunk:
                raise ContextOverflow(len(prompt), self.max_chunk, f" (input[{i}])")
            reqs.append(Request(list(prompt), GenerationConfig(max_tokens=1), NoText(), collect=collector_of(prompt)))
        return self._enqueue(reqs)

    def _check_prompt(self, prompt: list[int], max_tokens: int, media=None) -> None:
        if not prompt:
            raise InvalidRequest("the prompt must contain at least one token")
        if media is not None:
            if self.images is None:
                raise NoVisionEncoder(f"{self.name} has no vision encoder: register it with its mmproj file "
                                      "(rase model import MODEL --mmproj FILE) to send images")
            for span in media.spans:
                if not span.causal and span.n > self.max_chunk:
                    raise ContextOverflow(span.n, self.max_chunk, " of one image in a step; raise max_chunk")
            rows = {p for span in media.spans for p in range(span.start, span.end)}
            if rows != {i for i, t in enumerate(prompt) if t < 0}:
                raise InvalidRequest("the prompt's image rows and its media spans disagree")
        bad = [t for t in prompt if t >= self.plan.vocab_size or (t < 0 and media is None)]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary of {self.plan.vocab_size}")
        need = len(prompt) + max_tokens
        if need > self.plan.n_ctx:
            raise ContextOverflow(need, self.plan.n_ctx, f" ({len(prompt)} prompt + {max_tokens} max_tokens)")
        if self.causal and blocks_for(need, _kernels.KV_BLOCK) > self.kv.n_blocks:
            raise ContextOverflow(need, self.kv.n_blocks * _kernels.KV_BLOCK,
                                  " positions in the whole KV pool; raise kv_cache_mb")

    def _enqueue(self, reqs: list[Request]) -> list[RequestHandle]:
        handles = []
        me = weakref.ref(self)  # a handle kept after its request must not keep the model loaded
        for req in reqs:
            if self.time_limit_s is not None:
                req.deadline = req.submitted + self.time_limit_s
            handle = RequestHandle(on_cancel=lambda req=req: _cancel_on(me(), req))
            req.handle, handle.request = handle, req
            handles.append(handle)
        with self._cond:
            if self._closing:
                raise ModelUnloaded("this model is being unloaded; retry the request")
            waiting = self._pending - self.max_batch
            if self.max_waiting is not None and waiting >= self.max_waiting:
                raise Overloaded(waiting, max(1, math.ceil(self._request_s * (waiting + 1) / self.max_batch)))
            self._pending += len(reqs)
            self._inbox.extend(reqs)
            self.counters["requests"] += len(reqs)
            self._cond.notify()
        return handles

    def _cancel(self, req: Request) -> None:  # see _cancel_on
        req.cancel_requested = True
        with self._cond:
            self._cond.notify()

    @property
    def busy(self) -> bool:
        """Requests submitted and not yet finished (the keep-alive's idle test)."""
        return self._pending > 0

    def close(self, wait: bool = False) -> None:
        """Stop taking requests; the thread ends once those already queued have finished."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if wait:
            self._thread.join()
            if self.images is not None:
                self.images.close()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> dict:
        c = self.counters
        steps = max(1, self.scheduler.steps)
        out = dict(self.scheduler.stats(), requests=c["requests"], generated_tokens=c["generated_tokens"],
                   cancelled=c["cancelled"], failed=c["failed"], rows_per_step=round(c["rows"] / steps, 3),
                   step_ms_mean=round(c["step_s"] / steps * 1e3, 3),
                   python_ms_per_step=round(c["python_s"] / steps * 1e3, 3), kv_type=self.kv_type,
                   kv_bytes_per_token=self.plan.kv_bytes(self.kv_type))
        if self.images is not None:
            out.update(self.images.stats())
        if self.kv.cache:
            out.update({f"prefix_{k}": v for k, v in self.kv.cache.stats.items()})
            out["prefix_hit_tokens"] += self.kv.copied_tokens  # leading positions of partial blocks
            out["prefix_copied_tokens"] = self.kv.copied_tokens
        return out

    # ---------------------------------------------------------------- the worker thread

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self.scheduler.has_work() and not self._closing \
                        and not self.scheduler.events:
                    self._cond.wait()
                inbox, self._inbox = self._inbox, []
                if self._closing and not inbox and not self.scheduler.has_work():
                    return
            t0 = time.perf_counter()
            for req in inbox:
                self.scheduler.add(req)
            try:
                drafts = self.drafter.propose(self.scheduler.draft_rooms(), self.scheduler.decode_seconds) \
                    if self.drafter is not None else None
                step = self.scheduler.next_step(time.monotonic(), drafts)
            except Exception as exc:
                self._crash("scheduling a step", exc)
                continue
            self._deliver(self.scheduler.drain_events())
            if step is None:  # work, but nothing to compute yet (an image encoding): wait for news
                with self._cond:
                    if not self._inbox and not self._closing:
                        self._cond.wait(IDLE_WAIT_S)
                continue
            t1 = time.perf_counter()
            try:
                rows, in_embd, in_row, key_end = step_inputs(step.rows, step.seqs, self.images)
                tokens, logits = self.fwd.step(rows, step.tables, step.out_rows, step.samplers,
                                               embd_rows=step.embd_rows, slots=step.slots, in_embd=in_embd,
                                               in_row=in_row, key_end=key_end,
                                               rope_pos=rope_positions(step.rows, step.seqs))
            except Exception as exc:
                self._crash("forward step", exc)
                continue
            t2 = time.perf_counter()
            if PROFILE:
                profile_add(self.fwd, step.n_prefill > 0, len(step.rows), int((t2 - t1) * 1e9))
            drawn = [token_or_error(int(t)) for t in tokens[:len(step.out)]]
            try:
                events = self.scheduler.update(step, drawn, t2 - t1, time.monotonic(), logits, self.fwd.hidden)
            except Exception as exc:
                self._crash("folding a step back", exc)
                continue
            for req, (drafted, accepted) in step.verified.items():
                self.drafter.verified(req, drafted, accepted)
            self._deliver(events)
            self.counters["rows"] += len(step.rows)
            self.counters["step_s"] += t2 - t1
            self.counters["python_s"] += (time.perf_counter() - t0) - (t2 - t1)

    def _crash(self, what: str, exc: Exception) -> None:
        """A bug, not bad input (inputs were checked): every request fails with a RaseError
        saying what failed, and the worker stays alive for the next ones."""
        log.error("model worker: %s failed", what, exc_info=exc)
        self._deliver(self.scheduler.fail_all(RaseError(f"{what} failed: {type(exc).__name__}: {exc}")))

    def _deliver(self, events: list[Event]) -> None:
        for ev in events:
            req, handle = ev.request, ev.request.handle
            handle.push(ev.output)
            if ev.done:
                if self.drafter is not None:
                    self.drafter.finished(req)
                with self._cond:
                    self._pending -= 1
                    self._request_s += 0.1 * ((time.monotonic() - req.submitted) - self._request_s)
                self.counters["generated_tokens"] += req.generated
                if req.error is not None:
                    self.counters["failed"] += 1
                    handle.fail(req.error)
                else:
                    self.counters["cancelled"] += req.stop_reason is not None and req.stop_reason.value == "cancelled"
                    handle.finish(req.completion())


def _cancel_on(worker: ModelWorker | None, req: Request) -> None:
    """A handle's cancel: its request is flagged for the worker, if the worker still exists."""
    if worker is not None:
        worker._cancel(req)
