"""The Python surface: an Engine object for applications, and the manual's module functions.

Engine(store) is safe to share between threads: sessions are loaded once per model and each
model generates one request at a time (others queue); different models run in parallel. The
async variants run generation in a worker thread, so the event loop never blocks, and cancel
it when the awaiting task is cancelled.
"""
from __future__ import annotations

import asyncio
import functools
import json
import queue
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator, Sequence

from . import __version__
from .config import default_store
from .errors import BackendUnavailable, Cancelled, InvalidGenerationConfig
from .generation import GenerationConfig
from .registry import ModelRegistry
from .session import DEVICES, SessionCache, load_session
from .textgen import TextResult, run_text

GEN_FIELDS = ("max_tokens", "temperature", "top_k", "seed", "top_p", "min_p", "repeat_penalty",
              "presence_penalty", "frequency_penalty", "stop_tokens")


@dataclass
class Completion:
    text: str
    finish_reason: str          # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    reasoning: str = ""


def _config(kw: dict) -> GenerationConfig:
    values = {k: kw.pop(k) for k in list(kw) if k in GEN_FIELDS and kw[k] is not None}
    if "stop_tokens" in values:
        values["stop_tokens"] = tuple(int(t) for t in values["stop_tokens"])
    return GenerationConfig(**values)


class Engine:
    """n_ctx: KV cache positions per loaded model (default: the model's context, at most 4096)."""

    def __init__(self, store=None, device: str = "auto", n_ctx: int | None = None) -> None:
        if device not in DEVICES:
            raise BackendUnavailable(f"requested backend is unavailable: {device!r}; rase runs on the CPU")
        if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1):
            raise InvalidGenerationConfig(f"n_ctx must be a positive integer, got {n_ctx!r}")
        self.registry = ModelRegistry(store if store is not None else default_store())
        self.sessions = SessionCache(functools.partial(load_session, n_ctx=n_ctx))
        self.device = device
        self.stats = {"requests": 0, "generated_tokens": 0, "cancelled": 0}
        self._stats_lock = threading.Lock()

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    def session(self, model: str):
        return self.sessions.get_or_load(self.registry, model, self.device)

    def _run(self, model: str, ids_of: Callable, stop: Sequence[str] | str | None,
             on_delta: Callable[[str], bool | None] | None, cancelled: Callable[[], bool],
             think: str, kw: dict) -> Completion:
        config = _config(dict(kw))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        session = self.session(model)
        with session.lock:
            ids = ids_of(session)
            self._count("requests")

            def counting_delta(delta: str):
                return on_delta(delta) if on_delta is not None else None

            out: TextResult = run_text(session.decoder, session.tokenizer, ids, config, stops,
                                       counting_delta, cancelled, think=think)
        self._count("generated_tokens", len(out.result.tokens))
        reason = out.finish_reason
        if out.result.stop_reason.value == "cancelled":
            reason = "cancelled"
            self._count("cancelled")
        return Completion(out.text, reason, out.result.prompt_tokens, len(out.result.tokens), out.reasoning)

    # -------------------------------------------------------------- blocking

    def chat(self, model: str, messages: list[dict], *, stop=None, on_delta=None,
             cancelled: Callable[[], bool] = lambda: False, think: str = "keep", **gen) -> Completion:
        """Render the model's chat template, generate (EOS stops), return the answer."""
        return self._run(model, lambda s: s.render_chat(messages), stop, on_delta, cancelled, think, gen)

    def complete(self, model: str, prompt: str, *, stop=None, on_delta=None,
                 cancelled: Callable[[], bool] = lambda: False, **gen) -> Completion:
        """Plain completion: the prompt is encoded with the model's automatic special tokens."""
        return self._run(model, lambda s: s.tokenizer.encode(prompt, add_special_tokens=True, parse_special=False),
                         stop, on_delta, cancelled, "keep", gen)

    def stream_chat(self, model: str, messages: list[dict], **kw) -> Iterator[str]:
        """Text deltas as they are generated; closing the iterator cancels generation."""
        return self._stream(lambda cancel, push: self.chat(model, messages, on_delta=push, cancelled=cancel, **kw))

    def stream_complete(self, model: str, prompt: str, **kw) -> Iterator[str]:
        return self._stream(lambda cancel, push: self.complete(model, prompt, on_delta=push, cancelled=cancel, **kw))

    def _stream(self, start: Callable) -> Iterator[str]:
        q: queue.Queue = queue.Queue()
        stop = threading.Event()
        done = object()

        def work() -> None:
            try:
                result = start(stop.is_set, q.put)
                q.put((done, result))
            except BaseException as exc:  # delivered to the consumer
                q.put((done, exc))

        t = threading.Thread(target=work, daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if isinstance(item, tuple) and item and item[0] is done:
                    if isinstance(item[1], BaseException):
                        raise item[1]
                    return
                yield item
        finally:
            stop.set()
            t.join()

    # -------------------------------------------------------------- async

    async def achat(self, model: str, messages: list[dict], **kw) -> Completion:
        return await self._await(lambda cancel: self.chat(model, messages, cancelled=cancel, **kw))

    async def acomplete(self, model: str, prompt: str, **kw) -> Completion:
        return await self._await(lambda cancel: self.complete(model, prompt, cancelled=cancel, **kw))

    async def _await(self, call: Callable) -> Completion:
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(None, call, stop.is_set)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            stop.set()  # generation stops at the next token; the worker finishes on its own
            raise

    async def astream_chat(self, model: str, messages: list[dict], **kw) -> AsyncIterator[str]:
        async for d in self._astream(lambda cancel, push: self.chat(model, messages, on_delta=push, cancelled=cancel, **kw)):
            yield d

    async def astream_complete(self, model: str, prompt: str, **kw) -> AsyncIterator[str]:
        async for d in self._astream(lambda cancel, push: self.complete(model, prompt, on_delta=push, cancelled=cancel, **kw)):
            yield d

    async def _astream(self, start: Callable) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        end = object()

        def push(delta: str) -> None:
            loop.call_soon_threadsafe(q.put_nowait, delta)

        def work():
            try:
                return start(stop.is_set, push)
            finally:
                loop.call_soon_threadsafe(q.put_nowait, end)

        fut = loop.run_in_executor(None, work)
        try:
            while True:
                item = await q.get()
                if item is end:
                    break
                yield item
            await fut  # re-raise a generation error
        finally:
            stop.set()  # consumer gone or cancelled: stop at the next token

    def unload(self) -> None:
        self.sessions.clear()


# ------------------------------------------------------------------ the manual's functions

_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _engine(store) -> Engine:
    key = str(store)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = Engine(store)
        return _ENGINES[key]


def _toml(manifest) -> str:
    import tomli_w

    return tomli_w.dumps(manifest.to_dict())


def import_model(store, path, id, kind="generator", architecture=None, context_length=None, chat_template=None) -> str:
    return _toml(ModelRegistry(store).import_local(id, path, kind=kind, architecture=architecture,
                                                   context_length=context_length, chat_template=chat_template))


def pull_model(store, repo, file, id, kind="generator", architecture=None, context_length=None,
               chat_template=None, tokenizer_repo=None, tokenizer_file=None) -> str:
    return _toml(ModelRegistry(store).pull_hf(repo, file, id, kind=kind, architecture=architecture,
                                              context_length=context_length, chat_template=chat_template,
                                              tokenizer_repo=tokenizer_repo, tokenizer_file=tokenizer_file))


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
    from . import build_info

    return f"backend=Cpu; accelerated=false; isa={build_info()['isa_selected']}"


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
    """One-off, uncached generation from files (the architecture comes from the GGUF)."""
    from .decoder import load_gguf_decoder
    from .tokenizer import LocalTokenizer

    dec = load_gguf_decoder(None, weights)
    tok = LocalTokenizer.from_file(tokenizer) if tokenizer else LocalTokenizer.from_gguf(dec.gguf)
    ids = tok.encode(prompt, add_special_tokens=True, parse_special=False)
    cfg = GenerationConfig(max_tokens=max_tokens, temperature=temperature, top_k=top_k, seed=seed,
                           stop_tokens=tuple(stop_tokens))
    return run_text(dec, tok, ids, cfg).text


def profiling_snapshot(reset: bool = True) -> str:
    from .profiling import profile_snapshot

    return json.dumps(profile_snapshot(reset))
