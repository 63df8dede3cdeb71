"""The Python surface: an Engine object for applications, and the manual's module functions.

Engine(store) is safe to share between threads and event loops: each model is loaded once and
served by its own worker thread, which batches concurrent requests (continuous batching over a
paged KV cache with a prefix cache); different models run in parallel. A request's tokens do
not depend on what else is being served. Every call is a RequestHandle underneath
(submit_chat / submit_complete), which the blocking, streaming and async variants consume.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import threading
import weakref
from typing import AsyncIterator, Callable, Iterator, Sequence

from .config import default_store
from .engine.channel import RequestHandle
from .engine.config import DEVICES, EngineConfig, parse_duration
from .engine.logprobs import MAX_TOP_CHAT, MAX_TOP_COMPLETION
from .engine.sampling import GenerationConfig, stop_tokens_with_eos
from .errors import (BackendUnavailable, InvalidGenerationConfig, InvalidGrammar, InvalidRequest, ModelUnloaded,
                     WrongModelKind)
from .output import Completion
from .session.lifecycle import KeepAlive
from .session.media import MARKER, chat_ids, media_ids, with_media as _with_media
from .session.session import SessionCache, load_session
from .session.submission import EFFORTS, generation_config, prompt_ids, reader, template_kwargs, top_count
from .store.registry import ModelRegistry
from .text.structured import grammar_spec
from .text.textstate import TextState
from .text.thinking import MODES as THINK_MODES
from .text.tools import ToolSpec, tool_spec

COUNTED = ("requests", "generated_tokens", "cancelled", "failed")
MAX_CHOICES = 8  # OpenAI's n per request, at most



def _add_counts(counts: dict, lock: threading.Lock, session) -> None:
    with lock:
        for k in COUNTED:
            counts[k] += session.worker.counters[k]


class Engine:
    """n_ctx: positions per sequence (default: the model's own context).
    max_batch: requests one model decodes together (1 = one at a time). kv_cache_mb: the KV
    pool per model (default: max_batch full contexts + 256 MiB of cached prefixes, at most a
    quarter of the machine's memory; pages are touched only as used): requests are admitted while
    it holds their prompt plus max_tokens, and one that could never fit is refused.
    prefix_cache: reuse the K/V of earlier prompts and answers.
    tbt_target_ms: prompt chunks are sized so running requests get a token about this often.
    Limits per model, for serving: max_waiting requests queued beyond max_batch (more get
    Overloaded, HTTP 429); time_limit_s of wall clock per request (then it ends, finish_reason
    "length"); max_tokens_limit on any request's max_tokens (the default is lowered to it).
    keep_alive: how long a model stays loaded once idle (seconds, or a duration like "5m"; None:
    until unloaded); Engine.load(model, keep_alive=...) sets one model's. reasoning_budget: the
    tokens a <think> block may take unless a request says (rase serve --reasoning-budget).
    speculative "ngram": requests decode prompt-lookup drafts, verified in the same step as
    everything else (the same tokens as without, in fewer steps; rase serve --spec ngram);
    "draft:ID": drafts from the registered model ID (smaller, same tokenizer), loaded beside
    each generator (rase serve --spec draft:ID).
    kv_type: the KV pool's elements, "f16", or llama.cpp's quantized "q8_0" (0.53x the bytes) and
    "q4_0" (0.28x), which attend with llama.cpp's flash-attention numerics (rase serve -ctk/-ctv)."""

    def __init__(self, store=None, device: str = "auto", n_ctx: int | None = None, *, max_batch: int = 8,
                 kv_cache_mb: float | None = None, prefix_cache: bool = True, tbt_target_ms: float = 100.0,
                 n_threads: int | None = None, max_waiting: int | None = None, time_limit_s: float | None = None,
                 max_tokens_limit: int | None = None, keep_alive: float | str | None = None,
                 reasoning_budget: int | None = None, speculative: str | None = None, kv_type: str = "f16",
                 image_urls: bool = False) -> None:
        self.config = config = EngineConfig(
            device=device, n_ctx=n_ctx, max_batch=max_batch, kv_cache_mb=kv_cache_mb, prefix_cache=prefix_cache,
            tbt_target_ms=tbt_target_ms, n_threads=n_threads, max_waiting=max_waiting, time_limit_s=time_limit_s,
            max_tokens_limit=max_tokens_limit, keep_alive=keep_alive, reasoning_budget=reasoning_budget,
            speculative=speculative, kv_type=kv_type, image_urls=image_urls)
        self.registry = ModelRegistry(store if store is not None else default_store())
        draft = None if config.draft_id is None else functools.partial(self.registry.verify, config.draft_id)
        self.sessions = SessionCache(functools.partial(load_session, config=config, draft=draft))
        self._retired_counts = dict.fromkeys(COUNTED, 0)
        self._stats_lock = threading.Lock()
        # counts of unloaded models survive them; the callback holds the counters, not self
        self.sessions.on_drop = functools.partial(_add_counts, self._retired_counts, self._stats_lock)
        # an Engine dropped without close() still stops its workers (their threads would keep
        # every loaded model alive otherwise)
        self._finalizer = weakref.finalize(self, SessionCache.clear, self.sessions)
        self.lifecycle = KeepAlive(self.sessions, config.keep_alive_s)

    @property
    def device(self) -> str:
        return self.config.device

    @property
    def max_tokens_limit(self) -> int | None:
        return self.config.max_tokens_limit

    @property
    def reasoning_budget(self) -> int | None:
        return self.config.reasoning_budget

    @property
    def stats(self) -> dict:
        """Totals (requests, generated_tokens, cancelled, failed; running, waiting, KV and
        recurrent-state use of the loaded models) and per model: the scheduler, KV pool and prefix
        cache figures."""
        models = {key[0]: s.worker.stats() for key, s in self.sessions.sessions()}
        with self._stats_lock:
            out = dict(self._retired_counts)
        for m in models.values():
            for k in COUNTED:
                out[k] += m[k]
        for k in ("running", "waiting", "kv_blocks_used", "kv_blocks_total", "prefix_hit_tokens", "state_bytes_used",
                  "state_bytes_total", "drafted_tokens", "accepted_draft_tokens"):
            out[k] = sum(m.get(k, 0) for m in models.values())
        out["models"] = models
        return out

    def _limited(self, config: GenerationConfig, asked: bool) -> GenerationConfig:
        limit = self.max_tokens_limit
        if limit is None or config.max_tokens <= limit:
            return config
        if asked:
            raise InvalidGenerationConfig(f"max_tokens {config.max_tokens} is over this server's limit of {limit}",
                                          "max_tokens")
        return dataclasses.replace(config, max_tokens=limit)

    def session(self, model: str):
        return self.sessions.get_or_load(self.registry, model, self.device)

    # -------------------------------------------------------------- submission

    def _submit(self, model: str, ids_of: Callable, stop: Sequence[str] | str | None, think: str,
                gen: dict, structure: dict, tools: ToolSpec | None = None, logprobs: int | None = None,
                after: RequestHandle | None = None, chat: bool = False, budget: int | None = None) -> RequestHandle:
        config = self._limited(generation_config(dict(gen)), gen.get("max_tokens") is not None)
        spec = grammar_spec(**structure)  # a malformed format fails before the model loads
        raw = spec is not None and not spec.param.startswith("response_format")  # a grammar or regex
        if spec is not None and tools is not None and not (raw and tools.choice == "auto"):
            raise InvalidGrammar("tools and a response_format/grammar/regex cannot be combined", "tools")
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not (isinstance(stops, (list, tuple)) and all(isinstance(s, str) for s in stops)):
            raise InvalidGenerationConfig(f"stop must be a string or a list of strings, got {stop!r}", "stop")
        stops = list(stops)
        if think not in THINK_MODES + ("auto",):
            raise InvalidRequest(f"think must be one of {', '.join(THINK_MODES + ('auto',))}", "think")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < -1):
            raise InvalidRequest("reasoning_budget must be a number of tokens, or -1 for none", "reasoning_budget")
        self.lifecycle.touch(model)
        for attempt in (1, 2):  # a session unloaded under us (keep-alive) is loaded again once
            session = self.session(model)
            if session.manifest.kind == "embedding":
                raise WrongModelKind(model, "embedding", "it embeds text (Engine.embed, /v1/embeddings, /api/embed)")
            ids, media = _with_media(ids_of(session))
            run = dataclasses.replace(config, stop_tokens=stop_tokens_with_eos(config, session.plan.eos_token))
            text, constraint = reader(session, spec, tools, stops, think, chat, ids, budget, run.stop_tokens,
                                      self.reasoning_budget)
            try:
                return session.worker.submit(ids, run, text, constraint, logprobs, after, media)
            except ModelUnloaded:
                if attempt == 2 or after is not None:
                    raise
                self.sessions.unload(model)  # that closing session, if the cache still holds it

    def submit_chat(self, model: str, messages: list[dict], *, stop=None, think: str = "keep",
                    response_format: dict | None = None, grammar: str | None = None, regex: str | None = None,
                    tools: list[dict] | None = None, tool_choice=None, parallel_tool_calls: bool | None = None,
                    logprobs: bool = False, top_logprobs: int | None = None, after: RequestHandle | None = None,
                    reasoning_effort: str | None = None, chat_template_kwargs: dict | None = None,
                    reasoning_budget: int | None = None, **gen) -> RequestHandle:
        """Queue a chat request (the model's chat template renders it; EOS stops); the handle
        iterates text deltas (and tools.ToolCallDelta items when tools are called) and ends with
        a Completion. response_format (OpenAI's: json_object, json_schema), grammar (Lark or
        GBNF) or regex constrain the answer token by token; tools / tool_choice /
        parallel_tool_calls are OpenAI's (calls in Completion.tool_calls). logprobs /
        top_logprobs (0-20): each token's log-probability (Completion.logprobs; streamed as
        output.LogprobDelta items), from the raw logits. after: an earlier request for the
        same messages whose prompt KV this one reuses (see submit_chat_choices). reasoning_effort
        (OpenAI's none .. high): gpt-oss's template reads it, Qwen3's enable_thinking follows it.
        chat_template_kwargs: more variables for the model's Jinja template (e.g. {"enable_thinking":
        false}). think: what happens to a <think> block: "keep" it in the text, "strip" it,
        "separate" it into Completion.reasoning (streamed as output.ReasoningDelta items), "auto":
        separate it when the model has <think> tokens. A response format, grammar or tool constraint
        of such a model binds after the block; reasoning_budget closes the block after that many
        (-1: no limit; None: the engine's; a harmony model's analysis is bounded by reasoning_effort
        instead, so a budget there is a 400)
        tokens. A harmony model (gpt-oss) streams its analysis channel as reasoning whatever think
        says; constraints apply to its final and tool-call messages."""
        spec = tool_spec(tools, tool_choice, parallel_tool_calls)
        if reasoning_effort is not None and reasoning_effort not in EFFORTS:
            raise InvalidRequest(f"reasoning_effort must be one of {', '.join(EFFORTS)}", "reasoning_effort")
        kwargs = template_kwargs(chat_template_kwargs)
        return self._submit(model, lambda s: chat_ids(s, messages, spec, reasoning_effort, kwargs), stop, think, gen,
                            dict(response_format=response_format, grammar=grammar, regex=regex), spec,
                            top_count(logprobs, top_logprobs, MAX_TOP_CHAT), after, chat=True,
                            budget=reasoning_budget)

    def chat_prompt_tokens(self, model: str, messages: list[dict], *, tools: list[dict] | None = None,
                           tool_choice=None, parallel_tool_calls: bool | None = None,
                           reasoning_effort: str | None = None, chat_template_kwargs: dict | None = None) -> int:
        """The tokens the prompt of this chat request takes (the Responses API's input_tokens,
        Anthropic's count_tokens), rendered as submit_chat renders it."""
        spec = tool_spec(tools, tool_choice, parallel_tool_calls)
        if reasoning_effort is not None and reasoning_effort not in EFFORTS:
            raise InvalidRequest(f"reasoning_effort must be one of {', '.join(EFFORTS)}", "reasoning_effort")
        kwargs = template_kwargs(chat_template_kwargs)
        session = self.session(model)
        if session.manifest.kind == "embedding":
            raise WrongModelKind(model, "embedding", "it embeds text (Engine.embed, /v1/embeddings, /api/embed)")
        return len(_with_media(chat_ids(session, messages, spec, reasoning_effort, kwargs))[0])

    def submit_complete(self, model: str, prompt: str, *, stop=None, response_format: dict | None = None,
                        grammar: str | None = None, regex: str | None = None, logprobs: int | None = None,
                        after: RequestHandle | None = None, parse_special: bool = True, images: list | None = None,
                        **gen) -> RequestHandle:
        """Queue a plain completion: prompt is text (given the model's automatic special tokens)
        or token ids, taken as they are (OpenAI's and llama-cpp-python's token prompts: an agent
        that keeps a conversation's ids resumes exactly where the cache holds it). Special-token
        text in a prompt (<|im_start|>, <|eot_id|>) is those tokens unless parse_special is False.
        logprobs (0-5): each token's log-probability and that many alternatives. images: one per
        "<__media__>" in the text prompt (bytes, data URIs or paths), for a model with an mmproj."""
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= MAX_TOP_COMPLETION):
            raise InvalidGenerationConfig(f"logprobs must be an integer in 0..{MAX_TOP_COMPLETION}", "logprobs")
        ids_of = (lambda s: prompt_ids(s, prompt, parse_special)) if images is None else \
            (lambda s: media_ids(s, _text_prompt(prompt), list(images), MARKER, add_special=True))
        return self._submit(model, ids_of, stop, "keep", gen,
                            dict(response_format=response_format, grammar=grammar, regex=regex), None, logprobs, after)

    def submit_chat_choices(self, model: str, messages: list[dict], n: int, **kw) -> list[RequestHandle]:
        """n answers to one chat (OpenAI's n), choice i sampled with seed + i; the prompt is
        computed once (the others start from its KV) and the choices then run batched."""
        return self._choices(self.submit_chat, model, messages, n, kw)

    def submit_complete_choices(self, model: str, prompt: str, n: int, **kw) -> list[RequestHandle]:
        return self._choices(self.submit_complete, model, prompt, n, kw)

    def _choices(self, submit: Callable, model: str, what, n: int, kw: dict) -> list[RequestHandle]:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
            raise InvalidGenerationConfig(f"n must be an integer in 1..{MAX_CHOICES}", "n")
        seed = kw.pop("seed", None) or 0
        handles: list[RequestHandle] = []
        try:
            for i in range(n):
                handles.append(submit(model, what, seed=seed + i, after=handles[0] if handles else None, **kw))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return handles

    # -------------------------------------------------------------- blocking

    @staticmethod
    def _consume(handle: RequestHandle, on_delta, cancelled: Callable[[], bool]) -> Completion:
        """Text deltas to on_delta (False cancels; reasoning, tool calls and logprobs come in
        the Completion) while polling cancelled(); the Completion. When the caller stops it,
        the text is what on_delta was handed (the worker may have run a step further)."""
        shown: list[str] = []
        try:
            while True:
                try:
                    out = handle.next_output(timeout=0.02)
                except StopIteration:
                    break
                if handle.cancelled:
                    continue  # drain to the end; nothing more reaches the caller
                text = out.text if out is not None else ""
                shown.append(text)
                if cancelled() or (text and on_delta is not None and on_delta(text) is False):
                    handle.cancel()
            out = handle.result()
        except BaseException:
            handle.cancel()  # the callback raised, or Ctrl-C: stop generating
            raise
        if handle.cancelled and on_delta is not None:
            out = dataclasses.replace(out, text="".join(shown), finish_reason="cancelled")
        return out

    def chat(self, model: str, messages: list[dict], *, stop=None, on_delta=None,
             cancelled: Callable[[], bool] = lambda: False, think: str = "keep", **gen) -> Completion:
        """Render the model's chat template, generate (EOS stops), return the answer."""
        return self._consume(self.submit_chat(model, messages, stop=stop, think=think, **gen), on_delta, cancelled)

    def complete(self, model: str, prompt: str, *, stop=None, on_delta=None,
                 cancelled: Callable[[], bool] = lambda: False, **gen) -> Completion:
        """Plain completion: the prompt is encoded with the model's automatic special tokens."""
        return self._consume(self.submit_complete(model, prompt, stop=stop, **gen), on_delta, cancelled)

    def stream_chat(self, model: str, messages: list[dict], **kw) -> Iterator[str]:
        """Text deltas as they are generated; closing the iterator cancels generation."""
        return iter(self.submit_chat(model, messages, **kw))

    def stream_complete(self, model: str, prompt: str, **kw) -> Iterator[str]:
        return iter(self.submit_complete(model, prompt, **kw))

    # -------------------------------------------------------------- async

    async def achat(self, model: str, messages: list[dict], **kw) -> Completion:
        """Cancelling the awaiting task cancels the request."""
        return await self.submit_chat(model, messages, **kw).aresult()

    async def acomplete(self, model: str, prompt: str, **kw) -> Completion:
        return await self.submit_complete(model, prompt, **kw).aresult()

    async def astream_chat(self, model: str, messages: list[dict], **kw) -> AsyncIterator[str]:
        async for d in self.submit_chat(model, messages, **kw):
            yield d

    async def astream_complete(self, model: str, prompt: str, **kw) -> AsyncIterator[str]:
        async for d in self.submit_complete(model, prompt, **kw):
            yield d

    # -------------------------------------------------------------- embeddings and tokens

    def embed(self, model: str, input: str | Sequence[str], *, pooling: str | None = None,
              normalize: bool = True) -> tuple[list, int]:
        """(one float32 vector per input, tokens read): the final hidden states pooled (`mean`,
        `cls` (encoders), `last`; default: the file's pooling_type, else mean) and L2-normalized,
        as llama.cpp's embeddings. Every input is a request of the model's worker, batched with
        whatever else it serves; the inputs are queued together (one step when they fit)."""
        from .engine.embeddings import check_pooling, default_pooling, texts_of, token_inputs

        texts = texts_of(input)
        session = self.session(model)
        encoder = not session.plan.weights.has_lm_head
        pooling = check_pooling(pooling or default_pooling(session.plan.gguf), encoder)
        ids = token_inputs(session.tokenizer, texts)
        handles = session.worker.submit_embed(ids, pooling, normalize)
        try:
            vectors = [h.result().embedding for h in handles]
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return vectors, sum(len(i) for i in ids)

    def tokenize(self, model: str, text: str, *, add_special: bool = False, parse_special: bool = True,
                 with_pieces: bool = False) -> list:
        """The model's token ids for text (llama.cpp's tokenizer on a GGUF vocabulary);
        with_pieces: (id, bytes of the piece) pairs. add_special: the model's BOS/EOS;
        parse_special: special-token text (<|im_end|>) becomes its token."""
        if not isinstance(text, str):
            raise InvalidRequest("content must be a string", "content")
        tok = self.session(model).tokenizer
        ids = tok.encode(text, add_special_tokens=add_special, parse_special=parse_special)
        return [(i, tok.decode_bytes([i], skip_special_tokens=False)) for i in ids] if with_pieces else ids

    def detokenize(self, model: str, tokens: Sequence[int]) -> str:
        session = self.session(model)
        bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int)
               or not 0 <= t < session.tokenizer.n_vocab]
        if bad:
            raise InvalidRequest(f"token {bad[0]!r} is not an id of this model's vocabulary "
                                          f"(0..{session.tokenizer.n_vocab - 1})", "tokens")
        return session.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def convert_model(self, folder, model: str, type: str = "F16", **kw):
        """A Hugging Face safetensors folder converted to a GGUF in this engine's store
        (rase.convert_model); the manifest."""
        from .convert import convert_model

        return convert_model(folder, model, type, store=self.registry.root, **kw)

    def load(self, model: str, keep_alive: float | str | None | bool = False) -> None:
        """Load model now (verified, resident) unless it is; keep_alive: how long it then stays
        loaded once idle (seconds or a duration; None: until unloaded; False: as it was, else the
        engine's). Loading one model never blocks requests to others."""
        self.registry.get(model)  # ModelNotFound before anything else
        seconds = keep_alive if keep_alive in (None, False) else parse_duration(keep_alive)
        if seconds is not False:
            self.lifecycle.keep(model, seconds)
        self.lifecycle.touch(model)
        self.session(model)

    def check_generation(self, **gen) -> None:
        """Raise as a request with these generation options would (ranges, max_tokens_limit)."""
        config = self._limited(generation_config(dict(gen)), gen.get("max_tokens") is not None)
        config.validate()

    def status(self, model: str) -> str:
        """"loaded", "loading" or "unloaded" (llama-server's model status)."""
        return self.sessions.status(model)

    def unload(self, model: str | None = None) -> bool:
        """Unload one model, or every model (requests already queued still finish; the memory
        goes back once they have); whether anything was loaded. The next request loads it again."""
        if model is not None:
            return self.sessions.unload(model)
        loaded = bool(self.sessions.loaded())
        self.sessions.clear()
        return loaded

    def close(self) -> None:
        """Unload every model; the Engine can load them again if used later."""
        self.unload()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ the manual's functions

_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _text_prompt(prompt) -> str:
    if not isinstance(prompt, str):
        raise InvalidRequest(f"a prompt with images is text holding one {MARKER} per image", "prompt")
    return prompt


def _engine(store) -> Engine:
    key = str(store)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = Engine(store)
        return _ENGINES[key]


def _toml(manifest) -> str:
    import tomli_w

    return tomli_w.dumps(manifest.to_dict())


def import_model(store, path, id, kind=None, architecture=None, context_length=None, chat_template=None,
                 mmproj=None) -> str:
    from .store.registry import check_mmproj_pair

    reg = ModelRegistry(store if store is not None else default_store())
    if mmproj is not None:
        check_mmproj_pair(path, mmproj, id)
    m = reg.import_local(id, path, kind=kind, architecture=architecture, context_length=context_length,
                         chat_template=chat_template)
    return _toml(reg.attach_mmproj(id, mmproj) if mmproj is not None else m)


def pull_model(store, repo, file, id, kind=None, architecture=None, context_length=None,
               chat_template=None, tokenizer_repo=None, tokenizer_file=None, mmproj_file=None) -> str:
    return _toml(ModelRegistry(store).pull_hf(repo, file, id, kind=kind, architecture=architecture,
                                              context_length=context_length, chat_template=chat_template,
                                              tokenizer_repo=tokenizer_repo, tokenizer_file=tokenizer_file,
                                              mmproj_file=mmproj_file))


def attach_tokenizer(store, id, tokenizer) -> str:
    return _toml(ModelRegistry(store).attach_tokenizer(id, tokenizer))


def list_models(store) -> list[str]:
    return [m.id for m in ModelRegistry(store).list()]


def inspect_model(store, id) -> str:
    return _toml(ModelRegistry(store).get(id))


def verify_model(store, id) -> str:
    return _toml(ModelRegistry(store).verify(id))


def unload_models() -> None:
    with _ENGINES_LOCK:
        for e in _ENGINES.values():
            e.unload()


def probe_runtime(device: str = "auto") -> str:
    if device not in ("auto", "cpu", "cuda", "metal"):
        raise BackendUnavailable("device must be one of 'auto', 'cpu', 'cuda', or 'metal'")
    if device not in DEVICES:
        raise BackendUnavailable(f"requested backend is unavailable: {device} support is not built into rase")
    from .kernels import _kernels

    return f"backend=Cpu; accelerated=false; isa={_kernels.get_isa()}"


def gpu_info() -> str:
    return "inactive: rase runs on the CPU (no GPU offload is built in)"


def generate_registered_gguf(store, id, prompt, max_tokens=256, temperature=0.7, top_k=40, seed=0,
                             stop_tokens=(), device="auto") -> str:
    return _engine(store).complete(id, prompt, max_tokens=max_tokens, temperature=temperature,
                                   top_k=top_k, seed=seed, stop_tokens=list(stop_tokens)).text


def generate_chat_registered_gguf(store, id, messages, max_tokens=256, temperature=0.7, top_k=40, seed=0,
                                  device="auto") -> str:
    return _engine(store).chat(id, messages, max_tokens=max_tokens, temperature=temperature,
                               top_k=top_k, seed=seed).text


def generate_chat_stream_registered_gguf(store, id, messages, on_delta, max_tokens=256, temperature=0.7,
                                         top_k=40, seed=0, device="auto") -> str:
    """on_delta(text) per fragment; returning False (exactly) stops generation; the text so far
    is returned. An exception in the callback stops generation and is re-raised."""
    errors: list[BaseException] = []

    def call(delta: str):
        try:
            return False if on_delta(delta) is False else None
        except BaseException as exc:
            errors.append(exc)
            return False

    out = _engine(store).chat(id, messages, on_delta=call, max_tokens=max_tokens, temperature=temperature,
                              top_k=top_k, seed=seed)
    if errors:
        raise errors[0]
    return out.text


def generate_llama_gguf(weights, tokenizer, prompt, max_tokens=256, temperature=0.7, top_k=40, seed=0,
                        stop_tokens=(), device="auto") -> str:
    """One-off, uncached generation from files (the architecture comes from the GGUF): a worker
    of its own for the one request, closed after it."""
    from .store.plan import load_plan
    from .text.tokenizer import LocalTokenizer
    from .engine.worker import ModelWorker

    plan = load_plan(weights)
    tok = LocalTokenizer.from_file(tokenizer) if tokenizer else LocalTokenizer.from_gguf(plan.gguf)
    ids = tok.encode(prompt, add_special_tokens=True, parse_special=False)
    cfg = GenerationConfig(max_tokens=max_tokens, temperature=temperature, top_k=top_k, seed=seed,
                           stop_tokens=tuple(stop_tokens))
    cfg = dataclasses.replace(cfg, stop_tokens=stop_tokens_with_eos(cfg, plan.eos_token))
    worker = ModelWorker(plan, EngineConfig(max_batch=1, prefix_cache=False), name="generate")  # one context's KV
    try:
        return worker.submit(ids, cfg, TextState.for_tokenizer(tok)).result().text
    finally:
        worker.close()


def profiling_snapshot(reset: bool = True) -> str:
    from .engine.profiling import profile_snapshot

    return json.dumps(profile_snapshot(reset))
