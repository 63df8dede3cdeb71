"""rase/session/media.py through the engine: prompts with images tokenized as llama.cpp's
mtmd_tokenize does, answered as llama.cpp answers them (greedy text equal on every fixture
case), served beside other requests, and cached by the image's bytes: a second turn about the
same image computes none of its rows and encodes nothing. Bad images and pairs are typed errors."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rase
from rase.api import Engine
from rase.errors import ContextOverflow, InvalidImage, InvalidRequest, ManifestError, NoVisionEncoder
from rase.session.media import MARKER

VISION = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
NAMES = {"gemma3": "g3v", "idefics3": "smolvlm", "lfm2": "lfm2vl", "qwen3vl": "qwen35vl", "qwen25vl": "qwen25vl"}  # projector -> its model id in the store
REFS = {n: json.loads((VISION / f"{n}-tiny.llamacpp.json").read_text()) for n in NAMES}
REF = REFS["gemma3"]
CASES = [(n, i) for n in NAMES for i in range(len(REFS[n]["cases"]))]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision-store")
    for name, model in NAMES.items():
        rase.import_model(str(root), str(VISION / f"{name}-tiny.gguf"), model,
                          mmproj=str(VISION / f"{name}-tiny-mmproj.gguf"))
    rase.import_model(str(root), str(VISION / "gemma3-tiny.gguf"), "g3-text")
    return root


@pytest.fixture(scope="module")
def engine(store):
    eng = Engine(str(store), max_batch=4)
    yield eng
    eng.close()


def _image(name: str) -> bytes:
    return (VISION / name).read_bytes()


@pytest.mark.parametrize("name, case", CASES)
def test_prompt_ids_are_llamacpps_chunks(engine, name, case):
    from rase.session.media import media_ids

    c = REFS[name]["cases"][case]
    ids, media = media_ids(engine.session(NAMES[name]), c["prompt"], [_image(c["image"])], MARKER, add_special=True)
    want: list[int] = []
    for ch in c["chunks"]:
        want += ch["text"] if "text" in ch else [None] * ch["n_tokens"]
    assert [None if t < 0 else t for t in ids] == want
    chunks = [ch for ch in c["chunks"] if "image" in ch]
    assert [s.n for s in media.spans] == [ch["n_tokens"] for ch in chunks]
    assert {s.image.digest for s in media.spans} == {ch["image"] for ch in chunks}  # llama.cpp's bitmap id
    assert all(s.causal is (name != "gemma3") for s in media.spans)


@pytest.mark.parametrize("name, case", CASES)
def test_greedy_answers_equal_llamacpp(engine, name, case):
    c = REFS[name]["cases"][case]
    model = NAMES[name]
    out = engine.complete(model, c["prompt"], images=[_image(c["image"])], max_tokens=len(c["greedy"]), temperature=0)
    assert out.text == engine.session(model).tokenizer.decode(c["greedy"])
    assert out.completion_tokens == len(c["greedy"])


def test_answers_do_not_depend_on_what_shares_the_steps(engine):
    c = REF["cases"][0]
    alone = engine.complete("g3v", c["prompt"], images=[_image(c["image"])], max_tokens=12, temperature=0).text
    handles = [engine.submit_complete("g3v", "The lighthouse keeper climbed " * (1 + i), max_tokens=20, temperature=0)
               for i in range(2)]
    handles.insert(1, engine.submit_complete("g3v", c["prompt"], images=[_image(c["image"])], max_tokens=12,
                                             temperature=0))
    handles.append(engine.submit_complete("g3v", REF["cases"][3]["prompt"], images=[_image("tall.png")],
                                          max_tokens=12, temperature=0))
    outs = [h.result() for h in handles]
    assert outs[1].text == alone


def test_a_second_turn_about_the_same_image_is_cached(engine):
    img = base64.b64encode(_image("wide.png")).decode()
    eng_images = engine.session("g3v").images
    turn1 = [{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"},
                                          {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}}]}]
    first = engine.chat("g3v", turn1, max_tokens=8, temperature=0)
    encoded = eng_images.encoded
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And its colours?"}]
    second = engine.chat("g3v", turn2, max_tokens=8, temperature=0)
    assert eng_images.encoded == encoded  # nothing encoded again
    assert second.cached_tokens >= first.prompt_tokens - 16  # the image's 16 rows and the text around them
    assert second.cached_tokens > 16 + 4


def test_chat_parts_join_as_llama_server_joins_them(engine):
    from rase.session.media import CHAT_MARKER
    from rase.text.chat import split_images

    msgs, payloads = split_images([{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}, {"type": "image", "image": b"x"},
        {"type": "text", "text": "c"}]}], CHAT_MARKER)
    assert msgs[0]["content"] == f"a\nb{CHAT_MARKER}c" and payloads == [b"x"]


def test_images_to_a_model_without_an_mmproj_say_how_to_add_one(engine):
    with pytest.raises(NoVisionEncoder, match="--mmproj"):
        engine.complete("g3-text", f"{MARKER} hi", images=[_image("wide.png")], max_tokens=2)
    assert issubclass(NoVisionEncoder, InvalidRequest)


@pytest.mark.parametrize("prompt, images, err, match", [
    (f"{MARKER}", [b"\x89PNG garbage"], InvalidImage, "readable"),
    (f"{MARKER}", ["data:image/png;base64,!!!"], InvalidImage, "base64"),
    (f"{MARKER}", ["https://127.0.0.1/x.png"], InvalidImage, "not fetched"),
    (f"{MARKER}{MARKER}", [None], InvalidRequest, "2 image markers"),
    ("no marker", [b"x"], InvalidRequest, "0 image markers"),
    (f"{MARKER}", [12], InvalidImage, "not int"),
])
def test_bad_images_are_typed_errors(engine, prompt, images, err, match):
    with pytest.raises(err, match=match):
        engine.complete("g3v", prompt, images=images, max_tokens=2)


def test_more_images_than_the_context_holds(store):
    eng = Engine(str(store), n_ctx=64)
    try:
        with pytest.raises(ContextOverflow):
            eng.complete("g3v", MARKER * 5, images=[_image("wide.png")] * 5, max_tokens=4)
        assert eng.complete("g3v", MARKER, images=[_image("wide.png")], max_tokens=2).completion_tokens == 2
    finally:
        eng.close()


def test_a_mismatched_pair_is_refused_at_import(tmp_path):
    from rase.kernels.quants import QuantType
    from tests.support.tinymodels import write_tiny_model

    other = write_tiny_model(tmp_path / "narrow.gguf", "llama", QuantType.Q8_0, hp=dict(n_embd=128, head_dim=32))
    with pytest.raises(ManifestError, match="mmproj of another model"):
        rase.import_model(str(tmp_path), str(other), "q3", mmproj=str(VISION / "gemma3-tiny-mmproj.gguf"))
    assert rase.list_models(str(tmp_path)) == []  # nothing half-registered


def test_cli_import_with_mmproj_and_verify(tmp_path):
    env_store = str(tmp_path / "store")
    run = [sys.executable, "-m", "rase", "--store", env_store]
    got = subprocess.run(run + ["model", "import", str(VISION / "gemma3-tiny.gguf"), "--id", "g3v", "--copy",
                                "--mmproj", str(VISION / "gemma3-tiny-mmproj.gguf")], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert "mmproj sha256:" in got.stdout
    assert subprocess.run(run + ["model", "verify", "g3v"], capture_output=True).returncode == 0
    manifest = rase.inspect_model(env_store, "g3v")
    blob = next(line.split('"')[1] for line in manifest.splitlines() if line.startswith("mmproj ="))
    assert Path(blob).parent.name == "blobs"  # --copy: the store owns both files
    Path(blob).write_bytes(Path(blob).read_bytes()[:-1] + b"\0")  # tampered
    bad = subprocess.run(run + ["model", "verify", "g3v"], capture_output=True, text=True)
    assert bad.returncode == 1 and "mmproj" in bad.stderr


def test_other_requests_decode_while_an_image_encodes(store):
    """An image encodes on its own thread: a text request submitted with it streams to its end
    while the (slowed) encoding runs, and the image's request answers once its rows are there."""
    import io
    import time

    from PIL import Image as PILImage
    import numpy as np

    eng = Engine(str(store), max_batch=4)
    try:
        images = eng.session("g3v").images
        real = images.encoder

        class Slow:
            def __getattr__(self, name):
                return getattr(real, name)

            def embed(self, image):
                time.sleep(1.5)
                return real.embed(image)

        images.encoder = Slow()
        buf = io.BytesIO()
        PILImage.fromarray(np.random.default_rng(7).integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(buf, "PNG")
        t0 = time.monotonic()
        pictured = eng.submit_complete("g3v", f"{MARKER} hi", images=[buf.getvalue()], max_tokens=2, temperature=0)
        text = eng.submit_complete("g3v", "The lighthouse keeper", max_tokens=24, temperature=0)
        done = text.result()
        t_text = time.monotonic() - t0
        first = pictured.result()
        t_image = time.monotonic() - t0
        assert done.completion_tokens == 24 and t_text < 1.2, t_text  # not held behind the encoding
        assert first.completion_tokens == 2 and t_image >= 1.5
        assert images.encoded >= 1
    finally:
        eng.close()


@pytest.mark.parametrize("spec", ["draft:g3v", "ngram"])
def test_speculative_engines_answer_images_as_plain_ones(store, spec):
    """A draft model reads no image rows: a request with images decodes without drafts (the same
    greedy answer), and the engine's other requests keep speculating."""
    c = REF["cases"][0]
    plain = Engine(str(store))
    fast = Engine(str(store), speculative=spec)
    try:
        want = plain.complete("g3v", c["prompt"], images=[_image(c["image"])], max_tokens=12, temperature=0)
        got = fast.complete("g3v", c["prompt"], images=[_image(c["image"])], max_tokens=12, temperature=0)
        assert got.text == want.text and got.completion_tokens == 12
        text = fast.complete("g3v", "The lighthouse keeper climbed the stairs", max_tokens=12, temperature=0)
        assert text.completion_tokens == 12
        if spec.startswith("draft:"):  # the model drafting for itself: its drafts are verified, and hold
            assert text.timings["draft_n"] > 0 and text.timings["draft_n_accepted"] == text.timings["draft_n"]
    finally:
        plain.close()
        fast.close()
