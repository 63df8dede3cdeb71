"""Embeddings against llama.cpp's own on the same files (llama-cpp-python, embedding=True, pooling
mean and last, normalized; computed in the test), through the Engine and through the openai client."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from rase import InvalidGenerationConfig
from rase.api import Engine
from rase.registry import ModelRegistry
from tests import llamacpp_ref
from tests.conftest import QWEN3_TINY
from tests.test_server import _serve_in_thread

TEXTS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b", "Un chat noir dort au soleil."]
FILES = {"smollm2": None, "qwen3-tiny-q8_0": QWEN3_TINY / "qwen3-tiny-q8_0.gguf"}


@pytest.fixture(scope="module")
def want(smollm2_path):
    """(model, pooling) -> llama.cpp's vectors for TEXTS, computed once per module."""
    cache = {}

    def get(model: str, pooling: str):
        if (model, pooling) not in cache:
            cache[model, pooling] = llamacpp_ref.embeddings(FILES[model] or smollm2_path, TEXTS, pooling)
        return cache[model, pooling]

    return get


@pytest.fixture(scope="module")
def engine(tmp_path_factory, smollm2_path):
    root = tmp_path_factory.mktemp("embed-store")
    reg = ModelRegistry(root)
    reg.import_local("smollm2", smollm2_path)
    reg.import_local("qwen3-tiny-q8_0", QWEN3_TINY / "qwen3-tiny-q8_0.gguf")
    with Engine(root) as e:
        yield e


@pytest.mark.parametrize("model", ["smollm2", "qwen3-tiny-q8_0"])
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embeddings_equal_llamacpps(engine, want, model, pooling):
    vectors, n = engine.embed(model, TEXTS, pooling=pooling)
    assert n > len(TEXTS)
    for got, ref in zip(vectors, want(model, pooling)):
        assert got.shape == ref.shape and abs(np.linalg.norm(got) - 1) < 1e-5 and abs(np.linalg.norm(ref) - 1) < 1e-5
        assert float(got @ ref) >= 0.999  # cosine (both unit length)


def test_default_pooling_and_bad_input(engine):
    [a], _ = engine.embed("smollm2", "The capital of France is Paris.")
    [b], _ = engine.embed("smollm2", ["The capital of France is Paris."], pooling="mean")
    assert np.array_equal(a, b)  # no pooling_type in the file: mean
    for bad in ([], [""], [3]):
        with pytest.raises(InvalidGenerationConfig):
            engine.embed("smollm2", bad)
    with pytest.raises(InvalidGenerationConfig):
        engine.embed("smollm2", "x", pooling="cls")


def test_openai_embeddings_endpoint(engine, want, openai_client):
    from fastapi.testclient import TestClient

    from rase.server import create_app

    http = TestClient(create_app(engine))
    srv, thread, base = _serve_in_thread(create_app(engine))
    try:  # the openai SDK asks for base64 and decodes it itself
        sdk = openai_client(base).embeddings.create(model="smollm2", input=TEXTS)
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
    assert len(sdk.data) == 3 and sdk.usage.prompt_tokens > 3
    for d, ref in zip(sdk.data, want("smollm2", "mean")):
        assert float(np.asarray(d.embedding) @ ref) >= 0.999
    body = {"model": "smollm2", "input": TEXTS[:2]}
    r = http.post("/v1/embeddings", json=body).json()
    assert [d["index"] for d in r["data"]] == [0, 1] and r["usage"]["prompt_tokens"] > 2
    vec = np.asarray(r["data"][0]["embedding"], np.float32)
    assert float(vec @ want("smollm2", "mean")[0]) >= 0.999
    b64 = http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    assert np.array_equal(np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), np.float32), vec)
    one = http.post("/v1/embeddings", json={"model": "smollm2", "input": TEXTS[0]}).json()
    assert len(one["data"]) == 1 and np.array_equal(np.asarray(one["data"][0]["embedding"], np.float32), vec)
    for extra, param in (({"dimensions": 64}, "dimensions"), ({"encoding_format": "int8"}, "encoding_format"),
                         ({"input": []}, "input")):
        bad = http.post("/v1/embeddings", json={**body, **extra})
        assert bad.status_code == 400 and param in json.dumps(bad.json()), bad.text
