"""rase/media/preprocess.py: the pixels the encoder sees equal llama.cpp's bit for bit
(tests/fixtures/vision/*-pixels.json: SHA-256 of libmtmd's float32 buffers, the overview first,
tools/make_vision_fixtures.py); where llama.cpp aborts, rase refuses with a typed error."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from rase.errors import InvalidImage
from rase.media import preprocess
from rase.media.image import Image, decode_image

VISION = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
PIXELS = {name: json.loads((VISION / f"{name}-tiny.llamacpp-pixels.json").read_text())
          for name in ("gemma3", "idefics3", "lfm2", "qwen3vl", "qwen25vl")}


CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))  # mean, std


def _image(label: str) -> Image:
    if label.endswith(".png"):
        return decode_image((VISION / label).read_bytes())
    w, h = map(int, label.split("-")[1].split("x"))  # tools/make_vision_fixtures.py: random_image
    return Image(np.random.default_rng(w * 1000 + h).integers(0, 256, (h, w, 3), dtype=np.uint8), label)


def _ours(name: str, image: Image) -> list[np.ndarray]:
    """The buffers llama.cpp's preprocessor hands the encoder, in its order (the overview first)."""
    half = (0.5,) * 3
    if name == "gemma3":
        return [preprocess.fixed_size(image, 64, "bilinear", half, half)]
    if name in ("qwen3vl", "qwen25vl"):  # dyn_size: smart size (patch x 2, 8..4096 tokens), BICUBIC letterbox
        a = 16 if name == "qwen3vl" else 8
        w, h = preprocess.smart_size(image.width, image.height, a, 8 * a * a, 4096 * a * a)
        mean, std = (half, half) if name == "qwen3vl" else CLIP  # as the fixtures' mmproj files say
        return [preprocess.normalize(preprocess.letterbox(image.pixels, w, h, "bicubic"), mean, std)]
    if name == "lfm2":
        overview, tiles, _, _ = preprocess.lfm2_tiles(image, 8, 2, 64, 256, half, half)
    else:
        overview, tiles, _, _ = preprocess.idefics3_tiles(image, 32, 64, half, half)
    return [overview, *tiles]


CASES = [(n, label) for n in PIXELS for label in sorted(PIXELS[n])]


@pytest.mark.parametrize("name, label", CASES)
def test_pixels_equal_llamacpp(name, label):
    ref = PIXELS[name][label]
    if isinstance(ref, dict):  # llama.cpp aborts on this image
        assert "out of range" in ref["llama_cpp_aborts"]
        with pytest.raises(InvalidImage, match="too thin"):
            _ours(name, _image(label))
        return
    got = _ours(name, _image(label))
    assert [(g.shape[1], g.shape[0]) for g in got] == [(e["nx"], e["ny"]) for e in ref]
    for g, e in zip(got, ref):
        assert g.dtype == np.float32 and hashlib.sha256(g.tobytes()).hexdigest() == e["sha256"]


def test_the_cases_cover_up_and_down_both_orientations_and_grids():
    sizes = [(_image(k).width, _image(k).height) for k in PIXELS["gemma3"]]
    assert any(w < 64 and h < 64 for w, h in sizes) and any(w > 64 and h > 64 for w, h in sizes)
    assert any(w > h for w, h in sizes) and any(h > w for w, h in sizes)
    grids = {len(v) for v in PIXELS["idefics3"].values() if isinstance(v, list)}
    assert grids == {3, 5}  # 1 x 2 and 2 x 2 tiles, each with the overview
    assert {len(v) for v in PIXELS["lfm2"].values()} == {1, 7}  # small: one input; 600 x 420: 3 x 2 tiles


def test_letterbox_centres_on_black():
    px = np.full((10, 40, 3), 255, np.uint8)
    out = preprocess.letterbox(px, 64, 64, "bilinear")
    rows = np.flatnonzero(out.max(axis=(1, 2)))
    assert rows[0] == (64 - 16) // 2 and len(rows) == 16  # 10 * 1.6 = 16 rows, centred
    assert out[:rows[0]].max() == 0


@pytest.mark.parametrize("algo", ["bilinear", "bicubic", "lanczos"])
def test_resize_keeps_flat_images_flat_and_copies_equal_sizes(algo):
    flat = np.full((37, 23, 3), 77, np.uint8)
    assert np.array_equal(preprocess.resize(flat, 50, 11, algo), np.full((11, 50, 3), 77, np.uint8))
    px = np.random.default_rng(0).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    assert np.array_equal(preprocess.resize(px, 6, 5, algo), px)


def test_a_large_photo_resizes_in_bounded_bands():
    big = np.random.default_rng(1).integers(0, 256, (2000, 1500, 3), dtype=np.uint8)
    out = preprocess.letterbox(big, 96, 96, "bilinear")
    assert out.shape == (96, 96, 3) and out[:, :12].max() == 0  # 72 columns wide, centred
