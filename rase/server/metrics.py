"""GET /metrics: one app's Prometheus registry (prometheus-client; no module-level state).

Counted as requests finish: HTTP requests by route template and status, prompt / cached /
generated tokens and the time-to-first-token and time-between-tokens histograms per model.
Read from the engine at each scrape: running and waiting requests, KV blocks used and total, the
recurrent state they carry (hybrid models), prefix-cache hit tokens, models loaded and model loads.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TBT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class _EngineCollector:
    """Gauges read from Engine.stats when scraped."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def collect(self):
        stats = self.engine.stats
        for name, key, doc in (("rase_requests_running", "running", "requests in the batch"),
                               ("rase_requests_waiting", "waiting", "requests queued for admission"),
                               ("rase_kv_blocks_used", "kv_blocks_used", "KV blocks in use (all models)"),
                               ("rase_kv_blocks_total", "kv_blocks_total", "KV blocks in the pools"),
                               ("rase_state_bytes_used", "state_bytes_used",
                                "recurrent state of the KV blocks in use (hybrid models)"),
                               ("rase_state_bytes_total", "state_bytes_total",
                                "recurrent state the KV pools carry (hybrid models)")):
            yield GaugeMetricFamily(name, doc, value=stats.get(key, 0))
        yield CounterMetricFamily("rase_prefix_cache_hit_tokens", "prompt tokens served from the prefix cache",
                                  value=stats.get("prefix_hit_tokens", 0))
        yield CounterMetricFamily("rase_draft_tokens", "speculative draft tokens verified (the loaded models)",
                                  value=stats.get("drafted_tokens", 0))
        yield CounterMetricFamily("rase_draft_accepted_tokens", "speculative draft tokens the model confirmed",
                                  value=stats.get("accepted_draft_tokens", 0))
        yield GaugeMetricFamily("rase_models_loaded", "models resident", value=len(stats.get("models", {})))
        yield CounterMetricFamily("rase_model_loads", "models loaded (verified and planned)",
                                  value=self.engine.sessions.loads)


class Metrics:
    def __init__(self, engine) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("rase_http_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.prompt_tokens = Counter("rase_prompt_tokens", "prompt tokens of finished requests", ["model"],
                                     registry=r)
        self.cached_tokens = Counter("rase_prompt_cached_tokens", "prompt tokens whose KV came from the prefix cache",
                                     ["model"], registry=r)
        self.generated = Counter("rase_generated_tokens", "tokens generated", ["model"], registry=r)
        self.ttft = Histogram("rase_time_to_first_token_seconds", "from submission to the first token",
                              ["model"], buckets=TTFT_BUCKETS, registry=r)
        self.tbt = Histogram("rase_time_between_tokens_seconds", "mean time between tokens of a request",
                             ["model"], buckets=TBT_BUCKETS, registry=r)
        r.register(_EngineCollector(engine))

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def finished(self, model: str, outs) -> None:
        for out in outs:
            t = out.timings
            self.prompt_tokens.labels(model).inc(out.prompt_tokens)
            self.cached_tokens.labels(model).inc(out.cached_tokens)
            self.generated.labels(model).inc(out.completion_tokens)
            if t.get("ttft_ms") is not None and out.completion_tokens:
                self.ttft.labels(model).observe(t["ttft_ms"] / 1e3)
            if t.get("predicted_per_second"):
                self.tbt.labels(model).observe(1.0 / t["predicted_per_second"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
