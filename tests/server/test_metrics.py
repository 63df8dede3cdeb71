"""GET /metrics, read back with prometheus-client's own parser after real requests, and the
per-request timings in responses."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rase.api import Engine
from rase.store.registry import ModelRegistry

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def client(tmp_path_factory, smollm2_path):
    from fastapi.testclient import TestClient

    from rase.server import create_app

    root = tmp_path_factory.mktemp("metrics-store")
    ModelRegistry(root).import_local("smollm2", smollm2_path)
    with Engine(root) as engine:
        yield TestClient(create_app(engine))


def _samples(client) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_what_was_served(client):
    before = _samples(client)
    assert before[("rase_model_loads_total", ())] == 0 and before[("rase_models_loaded", ())] == 0
    body = {"model": "smollm2", "messages": CHAT, "temperature": 0, "max_tokens": 12}
    full = client.post("/v1/chat/completions", json=body).json()
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and "[DONE]" in "".join(r.iter_text())
    assert client.post("/v1/chat/completions", json={**body, "model": "nope"}).status_code == 404
    m = _samples(client)
    ok = ("rase_http_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))
    assert m[ok] == 2
    assert m[("rase_http_requests_total", (("route", "/v1/chat/completions"), ("status", "404")))] == 1
    model = (("model", "smollm2"),)
    assert m[("rase_generated_tokens_total", model)] == 2 * full["usage"]["completion_tokens"]
    assert m[("rase_prompt_tokens_total", model)] == 2 * full["usage"]["prompt_tokens"]
    assert m[("rase_prompt_cached_tokens_total", model)] > 0  # the second request hit the prefix cache
    assert m[("rase_time_to_first_token_seconds_count", model)] == 2
    assert m[("rase_time_between_tokens_seconds_count", model)] == 2
    assert m[("rase_kv_blocks_total", ())] > 0 and m[("rase_models_loaded", ())] == 1
    assert m[("rase_model_loads_total", ())] == 1 and m[("rase_prefix_cache_hit_tokens_total", ())] > 0
    t = full["timings"]
    assert t["prompt_n"] + t["cached_n"] == full["usage"]["prompt_tokens"]
    assert t["predicted_n"] == full["usage"]["completion_tokens"]
    assert t["prompt_per_second"] > 0 and t["predicted_per_second"] > 0 and t["predicted_ms"] > 0
