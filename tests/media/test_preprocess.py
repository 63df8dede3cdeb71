"""rase/media/preprocess.py: the pixels the encoder sees equal llama.cpp's bit for bit
(tests/fixtures/vision/*-pixels.json: SHA-256 of libmtmd's float32 buffers, tools/make_vision_fixtures.py)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from rase.media import preprocess
from rase.media.image import Image, decode_image

VISION = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
PIXELS = json.loads((VISION / "gemma3-tiny.llamacpp-pixels.json").read_text())


def _image(label: str) -> Image:
    if label.endswith(".png"):
        return decode_image((VISION / label).read_bytes())
    w, h = map(int, label.split("-")[1].split("x"))  # tools/make_vision_fixtures.py: random_image
    return Image(np.random.default_rng(w * 1000 + h).integers(0, 256, (h, w, 3), dtype=np.uint8), label)


@pytest.mark.parametrize("label", sorted(PIXELS))
def test_gemma3_pixels_equal_llamacpp(label):
    ref = PIXELS[label]
    px = preprocess.fixed_size(_image(label), 64, "bilinear", (0.5,) * 3, (0.5,) * 3)
    assert px.shape == (ref["ny"], ref["nx"], 3) and px.dtype == np.float32
    assert hashlib.sha256(px.tobytes()).hexdigest() == ref["sha256"]


def test_the_cases_cover_up_and_down_and_both_orientations():
    sizes = [(_image(k).width, _image(k).height) for k in PIXELS]
    assert any(w < 64 and h < 64 for w, h in sizes) and any(w > 64 and h > 64 for w, h in sizes)
    assert any(w > h for w, h in sizes) and any(h > w for w, h in sizes)


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
