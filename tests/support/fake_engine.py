"""An Engine stand-in for the tests of the HTTP layer's routing, guards and error shapes: a real
registry (manifests only; no model is loaded), canned answers through real RequestHandles.
Whatever depends on what a model computes is tested against the real Engine."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from rase.engine.channel import RequestHandle
from rase.errors import InvalidRequest
from rase.store.registry import ModelRegistry
from rase.output import Completion


class FakeEngine:
    def __init__(self, store) -> None:
        self.registry = ModelRegistry(store)
        self.sessions = SimpleNamespace(loads=0)
        self.submitted: list[tuple[str, str]] = []  # (surface call, model)

    def status(self, model: str) -> str:
        return "unloaded"  # nothing is ever loaded

    @property
    def stats(self) -> dict:
        return dict(requests=len(self.submitted), generated_tokens=0, cancelled=0, failed=0, running=0,
                    waiting=0, kv_blocks_used=0, kv_blocks_total=0, prefix_hit_tokens=0, models={})

    def tokenize(self, model: str, text: str, *, add_special: bool = False, parse_special: bool = True,
                 with_pieces: bool = False):
        """One token per byte."""
        self.registry.get(model)
        ids = list(text.encode())
        return [(i, bytes([i])) for i in ids] if with_pieces else ids

    def detokenize(self, model: str, tokens) -> str:
        self.registry.get(model)
        if any(not 0 <= t < 256 for t in tokens):
            raise InvalidRequest("token outside the fake vocabulary of 256 bytes", "tokens")
        return bytes(tokens).decode("utf-8", "replace")

    def embed(self, model: str, input, *, pooling=None, normalize: bool = True):
        texts = [input] if isinstance(input, str) else list(input)
        self._record("embed", model)
        return [np.full(4, len(t), np.float32) for t in texts], sum(len(t.encode()) for t in texts)

    def _answer(self, call: str, model: str, max_tokens: int | None = None, **_kw) -> RequestHandle:
        self._record(call, model)
        n = max_tokens or 8
        handle = RequestHandle()
        for _ in range(n):
            handle.push("x")
        handle.finish(Completion("x" * n, "length", 1, n, timings=dict(prompt_n=1, cached_n=0, predicted_n=n)))
        return handle

    def _record(self, call: str, model: str) -> None:
        self.registry.get(model)  # 404 for an unknown model, as the real Engine
        self.submitted.append((call, model))

    def submit_chat(self, model: str, messages: list, **kw) -> RequestHandle:
        if not messages:
            raise InvalidRequest("chat messages must not be empty")
        return self._answer("chat", model, **kw)

    def submit_complete(self, model: str, prompt: str, **kw) -> RequestHandle:
        return self._answer("complete", model, **kw)

    def submit_chat_choices(self, model: str, messages: list, n: int, **kw) -> list[RequestHandle]:
        return [self.submit_chat(model, messages, **kw) for _ in range(n)]

    def submit_complete_choices(self, model: str, prompt: str, n: int, **kw) -> list[RequestHandle]:
        return [self.submit_complete(model, prompt, **kw) for _ in range(n)]
