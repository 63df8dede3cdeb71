"""The Ollama API through the official `ollama` client against a real `rase serve`."""
from __future__ import annotations

import json

import httpx
import ollama
import pytest

from tests.support.servers import rase_serve

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

ASK = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def base(smollm2_store):
    with rase_serve(smollm2_store, "--threads", "2") as url:
        yield url


@pytest.fixture
def client(base):
    import ollama

    c = ollama.Client(host=base)
    yield c
    c._client.close()


def test_list_show_and_version(client, base):
    models = client.list().models
    assert [m.model for m in models] == ["smollm2"] and models[0].details.format == "gguf"
    assert models[0].size > 50_000_000 and models[0].digest
    shown = client.show("smollm2")
    assert shown.details.family == "llama" and shown.modelinfo["general.architecture"] == "llama"
    assert httpx.get(base + "/api/version", timeout=10).json()["version"]
    # Ollama names carry a tag: ":latest" names the same model, any other tag is refused
    assert client.show("smollm2:latest").details.family == "llama"
    tagged = client.chat(model="smollm2:latest", messages=ASK, options={"temperature": 0, "num_predict": 3})
    assert tagged.message.content and tagged.model == "smollm2"
    import ollama

    with pytest.raises(ollama.ResponseError) as err:
        client.show("smollm2:q4")
    assert err.value.status_code == 400


def test_chat_streamed_and_not(client):
    opts = {"temperature": 0, "num_predict": 24}
    full = client.chat(model="smollm2", messages=ASK, options=opts)
    assert "Paris" in full.message.content and full.done and full.done_reason == "stop"
    assert full.eval_count > 0 and full.prompt_eval_count > 10 and full.total_duration > 0
    parts = list(client.chat(model="smollm2", messages=ASK, options=opts, stream=True))
    assert "".join(p.message.content for p in parts) == full.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    js = client.chat(model="smollm2", messages=[{"role": "user", "content": "The capital of France as JSON."}],
                     format={"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                             "required": ["city"]}, options={"temperature": 0.7, "seed": 1, "num_predict": 60})
    assert isinstance(json.loads(js.message.content)["city"], str)


def test_generate_streamed_and_not(client):
    full = client.generate(model="smollm2", prompt="The capital of France is", raw=True,
                           options={"temperature": 0, "num_predict": 4})
    assert "Paris" in full.response and full.done_reason == "length"
    parts = list(client.generate(model="smollm2", prompt="The capital of France is", raw=True, stream=True,
                                 options={"temperature": 0, "num_predict": 4}))
    assert "".join(p.response for p in parts) == full.response and parts[-1].done
    opts = {"temperature": 0, "num_predict": 24}
    templated = client.generate(model="smollm2", prompt=ASK[0]["content"], options=opts)
    # through the chat template, as Ollama does: the chat answer to the same user message
    assert templated.response == client.chat(model="smollm2", messages=ASK, options=opts).message.content


def test_unsupported_options_are_errors_that_name_them(client):
    import ollama

    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="smollm2", messages=ASK, options={"mirostat": 2})
    assert err.value.status_code == 400 and "mirostat" in str(err.value)
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="nope", messages=ASK)
    assert err.value.status_code == 404


def test_embed(client):
    import numpy as np

    out = client.embed(model="smollm2", input=["The capital of France is Paris.", "A cat sleeps."])
    a, b = (np.asarray(v) for v in out.embeddings)
    assert a.shape == (576,) and abs(np.linalg.norm(a) - 1) < 1e-5 and 0 < float(a @ b) < 0.999
    assert out.prompt_eval_count > 4
    [one] = client.embed(model="smollm2", input="The capital of France is Paris.").embeddings
    assert np.array_equal(np.asarray(one), a)  # alone or beside another input: the same bits


def test_ps_lists_the_loaded_models(client):
    """Ollama's /api/ps through the official client: what is loaded now, its file's size and
    digest, its context; with no keep-alive given it stays until unloaded (no expiry)."""
    client.chat(model="smollm2", messages=ASK, options={"temperature": 0, "num_predict": 2})
    running = client.ps().models
    assert [m.model for m in running] == ["smollm2"] and running[0].size > 50_000_000 and running[0].digest
    assert running[0].expires_at.year == 9999 and running[0].details.family == "llama"


def test_keep_alive_loads_unloads_and_sets_the_expiry(client):
    """Ollama's load (empty messages), unload (keep_alive 0) and a request's keep_alive, through
    the official client; /api/ps's expires_at follows the keep-alive."""
    import datetime

    loaded = client.chat(model="smollm2", messages=[], keep_alive="10m")
    assert loaded.done_reason == "load" and [m.model for m in client.ps().models] == ["smollm2"]
    left = client.ps().models[0].expires_at - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(minutes=9) < left <= datetime.timedelta(minutes=10)
    gone = client.generate(model="smollm2", prompt="", keep_alive=0)
    assert gone.done_reason == "unload" and client.ps().models == []
    out = client.generate(model="smollm2", prompt="Hi", keep_alive=-1, options={"num_predict": 2})
    assert out.done and client.ps().models[0].expires_at.year == 9999
    with pytest.raises(ollama.ResponseError, match="keep_alive"):
        client.generate(model="smollm2", prompt="Hi", keep_alive="soon")


def test_engine_unloads_one_model_and_loads_it_again(smollm2_store):
    from rase.api import Engine

    with Engine(smollm2_store) as e:
        assert not e.unload("smollm2")  # nothing loaded yet
        first = e.complete("smollm2", "Hi", max_tokens=2, temperature=0)
        assert e.sessions.loaded() == [("smollm2", "auto")] and e.unload("smollm2")
        assert e.sessions.loaded() == [] and e.stats["models"] == {}
        again = e.complete("smollm2", "Hi", max_tokens=2, temperature=0)
        assert again.text == first.text and e.sessions.loads == 2
