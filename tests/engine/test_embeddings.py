"""Embeddings against llama.cpp's own on the same files: generators (llama-cpp-python,
embedding=True, pooling mean and last, normalized; computed in the test) and the BERT and
nomic-bert encoders of tests/fixtures/archs (llama.cpp's vectors in their -embd.json fixtures),
through the Engine, the openai client on /v1/embeddings and the ollama client on /api/embed of
a real server; every input is a request of the model's worker, batched with chats."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from rase import ContextOverflow, InvalidRequest, ManifestError, WrongModelKind
from rase.api import Engine
from rase.store.registry import ModelRegistry
from tests.support import llamacpp_ref
from tests.support.models import QWEN3_TINY
from tests.support.servers import rase_serve
from tests.support.models import ARCHS, ENCODERS
from tests.support.servers import serve_in_thread

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

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
    for name in ENCODERS:
        reg.import_local(name, ARCHS / f"{name}.gguf")
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
        with pytest.raises(InvalidRequest):
            engine.embed("smollm2", bad)
    with pytest.raises(InvalidRequest):
        engine.embed("smollm2", "x", pooling="cls")


def test_openai_embeddings_endpoint(engine, want, openai_client):
    from fastapi.testclient import TestClient

    from rase.server import create_app

    http = TestClient(create_app(engine))
    srv, thread, base = serve_in_thread(create_app(engine))
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


# ---------------------------------------------------------------- encoders (bert, nomic-bert)

def _encoder_fixture(name: str) -> dict:
    return json.loads((ARCHS / f"{name}.llamacpp-embd.json").read_text())


def _cosines(got, want) -> np.ndarray:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_embeddings_equal_llamacpps(engine, name):
    """Every text alone and all of them in one call, L2-normalized and raw: cosine >= 0.9999
    with llama.cpp's vectors (the file's pooling: CLS for bert, mean for nomic-bert), raw
    lengths within 0.1%. The whole batch is one step of the worker; no single-stream decoder."""
    fx = _encoder_fixture(name)
    texts = [t["text"] for t in fx["texts"]]
    worker = engine.session(name).worker
    steps = worker.scheduler.steps
    batch, n_tokens = engine.embed(name, texts)
    assert worker.scheduler.steps == steps + 1 and n_tokens == sum(len(t["ids"]) for t in fx["texts"])
    assert _cosines(batch, [t["normalized"] for t in fx["texts"]]).min() >= 0.9999
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in batch)
    alone = [engine.embed(name, t)[0][0] for t in texts[:4]]
    assert all(np.array_equal(a, b) for a, b in zip(alone, batch))  # batching changes no bit
    raw, _ = engine.embed(name, texts, normalize=False)
    want = [t["embedding"] for t in fx["texts"]]
    assert _cosines(raw, want).min() >= 0.9999
    assert max(abs(np.linalg.norm(r) / np.linalg.norm(w) - 1) for r, w in zip(raw, want)) < 1e-3
    pooled = {"cls": "mean", "mean": "cls"}[fx["pooling"]]  # the other pooling is another vector
    other, _ = engine.embed(name, texts[:3], pooling=pooled)
    assert _cosines(other, batch[:3]).max() < 0.999
    assert worker.counters["requests"] >= 2 * len(texts) + 4 + 3  # every input a request of the worker


def test_encoder_refusals(engine, tmp_path):
    name = ENCODERS[0]
    assert engine.registry.get(name).kind == "embedding"  # an encoder registers as an embedding model
    with pytest.raises(WrongModelKind, match="embedding model"):
        engine.chat(name, [{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(WrongModelKind):
        engine.complete(name, "hi", max_tokens=4)
    with pytest.raises(ManifestError, match="encoder"):
        ModelRegistry(tmp_path).import_local("b", ARCHS / f"{name}.gguf", kind="generator")
    with pytest.raises(InvalidRequest, match="pooling"):
        engine.embed(name, "x", pooling="rank")
    too_long = " ".join(["word"] * 600)  # bert's context is 512 positions
    with pytest.raises(ContextOverflow):
        engine.embed("bert-tiny-q8_0", too_long)


@pytest.fixture(scope="module")
def server(engine):
    with rase_serve(engine.registry.root, "--threads", "2") as url:
        yield url


def test_encoders_through_openai_and_ollama_clients(server, openai_client):
    import ollama

    bert, nomic = "bert-tiny-q8_0", "nomic-bert-tiny-q4_k_m"
    fb, fn = _encoder_fixture(bert), _encoder_fixture(nomic)
    texts = [t["text"] for t in fb["texts"]]
    sdk = openai_client(server)
    many = sdk.embeddings.create(model=bert, input=texts)
    assert [d.index for d in many.data] == list(range(len(texts)))
    assert _cosines([d.embedding for d in many.data], [t["normalized"] for t in fb["texts"]]).min() >= 0.9999
    one = sdk.embeddings.create(model=bert, input=texts[1])
    assert _cosines([one.data[0].embedding], [fb["texts"][1]["normalized"]])[0] >= 0.9999
    client = ollama.Client(host=server)
    try:
        got = client.embed(model=nomic, input=[t["text"] for t in fn["texts"]])
        assert _cosines(got.embeddings, [t["normalized"] for t in fn["texts"]]).min() >= 0.9999
        single = client.embed(model=nomic, input=fn["texts"][0]["text"])
        assert _cosines(single.embeddings, [fn["texts"][0]["normalized"]])[0] >= 0.9999
        assert client.show(nomic).capabilities == ["embedding"]
        with pytest.raises(ollama.ResponseError) as err:
            client.chat(model=nomic, messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 400 and "embedding model" in str(err.value)
    finally:
        client._client.close()
    import openai

    with pytest.raises(openai.BadRequestError, match="embedding model"):
        sdk.chat.completions.create(model=bert, messages=[{"role": "user", "content": "hi"}])


def test_embeddings_beside_streaming_chats(server, openai_client):
    """16 embedding requests (8 to the chats' own model, 8 to an encoder) while 4 chats stream:
    all complete, every chat's tokens equal that chat alone, every vector equals it alone."""
    from concurrent.futures import ThreadPoolExecutor

    sdk = openai_client(server)
    asks = [f"Name {k} animals that live in the sea." for k in (2, 3, 4, 5)]
    texts = [f"sentence number {i} about the sea" for i in range(8)]

    def chat(q: str) -> str:
        stream = sdk.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": q}],
                                             temperature=0, max_tokens=40, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    def embed(model: str, text: str) -> list:
        return sdk.embeddings.create(model=model, input=text).data[0].embedding

    alone_chats = [chat(q) for q in asks]
    alone_vecs = {(m, t): embed(m, t) for m in ("smollm2", "bert-tiny-q8_0") for t in texts}
    with ThreadPoolExecutor(20) as pool:
        chats = [pool.submit(chat, q) for q in asks]
        vecs = {(m, t): pool.submit(embed, m, t) for m in ("smollm2", "bert-tiny-q8_0") for t in texts}
        assert [c.result(timeout=300) for c in chats] == alone_chats
        assert all(v.result(timeout=300) == alone_vecs[k] for k, v in vecs.items())
    assert all(len(c) > 20 for c in alone_chats)


def test_embeddings_run_in_the_workers_steps_on_its_openmp_team(engine):
    """8 embedding requests beside 4 streaming chats of the same model, in process: every chat's
    text and token count equal that chat alone, every vector equals it alone, and no thread
    appears while they run beyond the callers' own. A forward on a caller's thread (the old
    session.lock path) starts a second OpenMP team there: n_threads - 1 more threads."""
    import os
    import threading
    import time

    worker = engine.session("smollm2").worker
    assert worker.fwd.n_threads >= 2  # else a second team would add no thread to count
    asks = [f"Name {k} animals that live in the sea." for k in (2, 3, 4, 5)]
    texts = [f"sentence number {i} about the sea" for i in range(8)]
    ask = lambda q: dict(messages=[{"role": "user", "content": q}], temperature=0, max_tokens=40)
    alone = [engine.chat("smollm2", **ask(q)) for q in asks]
    alone_vecs = [engine.embed("smollm2", t)[0][0] for t in texts]
    go, out = threading.Barrier(len(asks) + len(texts) + 1), {}

    def chat(i: int) -> None:
        go.wait()
        handle = engine.submit_chat("smollm2", **ask(asks[i]))
        out["chat", i] = ("".join(handle), handle.result().completion_tokens)

    def embed(i: int) -> None:
        go.wait()
        out["embed", i] = engine.embed("smollm2", texts[i])[0][0]

    callers = [threading.Thread(target=chat, args=(i,)) for i in range(len(asks))]
    callers += [threading.Thread(target=embed, args=(i,)) for i in range(len(texts))]
    for t in callers:
        t.start()
    base = len(os.listdir("/proc/self/task"))  # every caller alive, waiting at the barrier
    steps = worker.scheduler.steps
    go.wait()
    peak = base
    while any(t.is_alive() for t in callers):
        peak = max(peak, len(os.listdir("/proc/self/task")))
        time.sleep(0.001)
    assert peak == base
    assert [out["chat", i] for i in range(len(asks))] == [(c.text, c.completion_tokens) for c in alone]
    assert all(np.array_equal(out["embed", i], alone_vecs[i]) for i in range(len(texts)))
    assert worker.scheduler.steps - steps < 4 * 40 + len(texts)  # they shared steps
