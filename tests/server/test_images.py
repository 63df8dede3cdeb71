"""Images on every API rase serves: the real openai, anthropic and ollama clients against a real
`rase serve` with the tiny Gemma 3 vision pair (tests/fixtures/vision). Each answers a question
about an attached image; a second turn about the same image reports its rows as cached; hostile
images are 400s in each dialect's shape and the server keeps serving."""
from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path

import httpx
import pytest

import rase
from tests.support.servers import rase_serve

VISION = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
PNG = (VISION / "wide.png").read_bytes()
B64 = base64.b64encode(PNG).decode()
N_IMAGE = 16  # the fixture's tokens per image
# (model, its image's rows, the least a second turn finds cached): a hybrid (LFM2) restores its
# recurrent state at checkpoints (every block of 32 positions for this model), so its cache reaches
# the last checkpoint inside the shared prefix; the rest of the image comes from the encoder's row
# cache. Qwen3.5 (a hybrid too): its delta-net state weighs 7 blocks of K/V, so it is checkpointed
# every 8 blocks (256 positions), beyond these short turns: None, nothing is cached
MODELS = [("g3v", N_IMAGE, N_IMAGE + 4), ("smolvlm", 5 * 4, 5 * 4 + 4), ("lfm2vl", 70, 64), ("qwen35vl", 12, None),
          ("qwen25vl", 30, 30 + 4)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    store = tmp_path_factory.mktemp("vision-serve")
    rase.import_model(str(store), str(VISION / "gemma3-tiny.gguf"), "g3v", mmproj=str(VISION / "gemma3-tiny-mmproj.gguf"))
    rase.import_model(str(store), str(VISION / "idefics3-tiny.gguf"), "smolvlm",
                      mmproj=str(VISION / "idefics3-tiny-mmproj.gguf"))
    rase.import_model(str(store), str(VISION / "lfm2-tiny.gguf"), "lfm2vl", mmproj=str(VISION / "lfm2-tiny-mmproj.gguf"))
    rase.import_model(str(store), str(VISION / "qwen3vl-tiny.gguf"), "qwen35vl",
                      mmproj=str(VISION / "qwen3vl-tiny-mmproj.gguf"))
    rase.import_model(str(store), str(VISION / "qwen25vl-tiny.gguf"), "qwen25vl",
                      mmproj=str(VISION / "qwen25vl-tiny-mmproj.gguf"))
    rase.import_model(str(store), str(VISION / "gemma3-tiny.gguf"), "g3-text")
    with rase_serve(store, "--threads", "2") as url:
        yield url


def _bomb() -> str:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 4096)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def test_models_say_which_take_images(base, openai_client):
    import ollama

    cards = {m.id: m for m in openai_client(base).models.list().data}
    assert cards["g3v"].input_modalities == ["text", "image"] and cards["g3-text"].input_modalities == ["text"]
    client = ollama.Client(host=base)
    try:
        assert "vision" in client.show("smolvlm").capabilities and "vision" not in client.show("g3-text").capabilities
    finally:
        client._client.close()


@pytest.mark.parametrize("model, n_image, cached", MODELS)  # smolvlm: 2 x 2 tiles + overview
def test_openai_chat_with_an_image_then_a_cached_second_turn(base, openai_client, model, n_image, cached):
    client = openai_client(base)
    turn = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                         {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}}]}]
    first = client.chat.completions.create(model=model, messages=turn, max_tokens=6, temperature=0)
    assert first.choices[0].message.content and first.usage.prompt_tokens > n_image
    turn += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "What colours does it have?"}]
    second = client.chat.completions.create(model=model, messages=turn, max_tokens=6, temperature=0)
    if cached is not None:
        assert second.usage.prompt_tokens_details.cached_tokens >= cached


def test_openai_streams_an_image_answer_and_responses_take_input_image(base, openai_client):
    client = openai_client(base)
    msg = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}",
                                                                            "detail": "auto"}},
                                        {"type": "text", "text": "Describe it."}]}]
    text = "".join(c.choices[0].delta.content or "" for c in
                   client.chat.completions.create(model="g3v", messages=msg, max_tokens=5, temperature=0, stream=True)
                   if c.choices)
    assert text
    r = client.responses.create(model="g3v", max_output_tokens=5, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Describe it."},
                                     {"type": "input_image", "image_url": f"data:image/png;base64,{B64}"}]}])
    assert r.output_text and r.usage.input_tokens > N_IMAGE


@pytest.mark.parametrize("model, n_image, cached", MODELS)
def test_anthropic_image_block_then_a_cached_second_turn(base, model, n_image, cached):
    from anthropic import Anthropic

    client = Anthropic(base_url=base, api_key="unused")
    try:
        img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
        turn = [{"role": "user", "content": [img, {"type": "text", "text": "What is this?"}]}]
        first = client.messages.create(model=model, max_tokens=6, messages=turn)
        assert first.content[0].text and first.usage.input_tokens + first.usage.cache_read_input_tokens > n_image
        turn += [{"role": "assistant", "content": first.content[0].text},
                 {"role": "user", "content": "And the colours?"}]
        second = client.messages.create(model=model, max_tokens=6, messages=turn)
        if cached is not None:
            assert second.usage.cache_read_input_tokens >= cached
    finally:
        client.close()


@pytest.mark.parametrize("model, n_image, cached", MODELS)
def test_ollama_chat_and_generate_with_images(base, model, n_image, cached):
    import ollama

    client = ollama.Client(host=base)
    try:
        r = client.chat(model=model, messages=[{"role": "user", "content": "What is this?", "images": [PNG]}],
                        options={"num_predict": 5, "temperature": 0})
        assert r.message.content and r.prompt_eval_count > n_image
        g = client.generate(model=model, prompt="Describe it.", images=[B64],
                            options={"num_predict": 5, "temperature": 0})
        assert g.response and g.prompt_eval_count > n_image
    finally:
        client._client.close()


@pytest.mark.parametrize("url, match", [
    ("data:image/png;base64,bm90IGFuIGltYWdl", "readable"),          # "not an image"
    (f"data:image/png;base64,{_bomb()}", "pixels"),                   # a 30000x30000 PNG header
    ("http://127.0.0.1:1/secret.png", "not fetched"),                 # inside the network: never fetched
    ("http://169.254.169.254/latest/meta-data/", "not fetched"),
    ("data:image/png;base64,####", "base64"),
])
def test_hostile_images_are_400s_and_the_server_keeps_serving(base, url, match):
    body = {"model": "g3v", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
    a = httpx.post(base + "/v1/messages", timeout=30, json={"model": "g3v", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]}]})
    assert a.status_code == 400 and a.json()["type"] == "error"
    ok = httpx.post(base + "/v1/chat/completions", timeout=30,
                    json={"model": "g3v", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200


@pytest.mark.parametrize("body, match", [
    ({"model": "g3-text", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}}]}]}, "--mmproj"),
    ({"model": "g3v", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}", "detail": "low"}}]}]}, "detail"),
    ({"model": "g3v", "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "content"),
])
def test_what_cannot_be_served_says_so(base, body, match):
    r = httpx.post(base + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30)
    assert r.status_code == 400 and match in r.text, r.text


def test_many_large_images_keep_memory_bounded(base):
    """Fifty 1000x1000 noise PNGs (150 MB of JSON) are refused at the door (413, before reading
    the body); five (15 MB) are read, and refused for the context before any is encoded."""
    from PIL import Image
    import numpy as np

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (1000, 1000, 3), dtype=np.uint8)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    for n, status in ((50, 413), (5, 400)):
        parts = [{"type": "image_url", "image_url": {"url": url}}] * n
        r = httpx.post(base + "/v1/chat/completions", timeout=120,
                       json={"model": "g3v", "max_tokens": 4090, "messages": [{"role": "user", "content": parts}]})
        assert r.status_code == status, r.text
    ok = httpx.post(base + "/v1/chat/completions", timeout=30,
                    json={"model": "g3v", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200
