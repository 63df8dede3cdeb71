"""EngineConfig: how an Engine serves its models, validated once where it is made (Engine's
keyword arguments, rase serve's flags) and handed as it is to every session and worker."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BackendUnavailable, InvalidGenerationConfig, InvalidRequest, RaseError

DEVICES = ("auto", "cpu")  # rase runs on the CPU; "auto" resolves to it
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")


def parse_duration(value) -> float | None | bool:
    """Ollama's keep_alive -> seconds, or None (forever: any negative value), or False ("":
    as before). A number is seconds; a string is a number of seconds or a Go duration ("5m",
    "1h30m", "250ms")."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidRequest(f"keep_alive must be a number of seconds or a duration like '5m', got {value!r}",
                             "keep_alive")
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return False
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = float(body)
        except ValueError:
            parts = _PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise InvalidRequest(f"keep_alive {value!r} is not a duration (e.g. 30s, 5m, 1h, -1 for always, "
                                     "0 to unload now)", "keep_alive") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
        value = sign * seconds
    return None if value < 0 else float(value)


def _positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise InvalidGenerationConfig(f"{name} must be a positive number, got {value!r}")


def _count(name: str, value, least: int, required: bool = False) -> None:
    if (value is not None or required) and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise InvalidRequest(f"{name} must be {'a positive' if least else 'a non-negative'} integer, got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    """device: "auto" or "cpu". n_ctx: positions per sequence (None: the model's own context).
    max_batch: requests one model decodes together. kv_cache_mb: the KV pool per model (None:
    max_batch full contexts + cached prefixes, within a share of memory: worker.pool_blocks).
    prefix_cache: reuse the K/V of earlier prompts and answers. tbt_target_ms: prompt chunks are
    sized so running requests get a token about this often. n_threads: the forward's threads
    (None: config.default_threads). max_waiting: requests queued beyond max_batch before more are
    Overloaded. time_limit_s: wall clock per request. max_tokens_limit: the most any request's
    max_tokens may be. keep_alive: how long an idle model stays loaded (seconds or a duration;
    None: until unloaded). reasoning_budget: tokens a <think> block may take unless a request
    says. speculative: None, "ngram" (prompt lookup) or "draft:ID" (a registered draft model).
    kv_type: the KV pool's elements ("f16", "q8_0", "q4_0"). image_urls: fetch http(s) images
    from public hosts (media/fetch.py; off: only data URIs and bytes)."""
    device: str = "auto"
    n_ctx: int | None = None
    max_batch: int = 8
    kv_cache_mb: float | None = None
    prefix_cache: bool = True
    tbt_target_ms: float = 100.0
    n_threads: int | None = None
    max_waiting: int | None = None
    time_limit_s: float | None = None
    max_tokens_limit: int | None = None
    keep_alive: float | str | None = None
    reasoning_budget: int | None = None
    speculative: str | None = None
    kv_type: str = "f16"
    image_urls: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise BackendUnavailable(f"requested backend is unavailable: {self.device!r}; rase runs on the CPU")
        _count("n_ctx", self.n_ctx, 1)
        _count("max_batch", self.max_batch, 1, required=True)
        for name in ("kv_cache_mb", "tbt_target_ms", "n_threads", "time_limit_s", "max_tokens_limit"):
            _positive(name, getattr(self, name))
        _count("max_waiting", self.max_waiting, 0)
        if self.reasoning_budget is not None and (isinstance(self.reasoning_budget, bool)
                                                  or not isinstance(self.reasoning_budget, int)
                                                  or self.reasoning_budget < 0):
            raise InvalidRequest(f"reasoning_budget must be a number of tokens, got {self.reasoning_budget!r}")
        self.draft_id  # noqa: B018 (a malformed speculative raises here)
        self.keep_alive_s  # noqa: B018 (and a malformed keep_alive)
        from ..kernels._kernels import KV_TYPES

        if self.kv_type not in KV_TYPES:
            raise InvalidRequest(f"kv_type must be one of {', '.join(KV_TYPES)}, got {self.kv_type!r}", "kv_type")

    @property
    def keep_alive_s(self) -> float | None:
        """keep_alive in seconds (None: until unloaded)."""
        seconds = None if self.keep_alive is None else parse_duration(self.keep_alive)
        return None if seconds is False else seconds

    @property
    def draft_id(self) -> str | None:
        """The draft model's id of speculative "draft:ID"; None for None and "ngram"."""
        spec = self.speculative
        if spec is None or spec == "ngram":
            return None
        if isinstance(spec, str) and spec.startswith("draft:"):
            from ..store.registry import validate_model_id

            try:
                return validate_model_id(spec[len("draft:"):])
            except RaseError:
                pass
        raise InvalidRequest(f"speculative must be None, 'ngram' (prompt lookup) or 'draft:ID' (a registered draft "
                             f"model), got {spec!r}", "speculative")
