"""rase/media/image.py: bytes -> RGB as llama.cpp's helper reads them, bounded, with the bytes' SHA-256."""
from __future__ import annotations

import base64
import hashlib
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image as PILImage

from rase.errors import InvalidImage, InvalidRequest
from rase.media.image import MAX_PIXELS, decode_image, image_from_data_uri


def _encode(px: np.ndarray, fmt: str, mode: str = "RGB", **kw) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(px, mode).save(buf, fmt, **kw)
    return buf.getvalue()


def _noise(h=9, w=13, c=3) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, (h, w, c) if c > 1 else (h, w), dtype=np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "WEBP"])
def test_lossless_formats_decode_to_their_pixels(fmt):
    px = _noise()
    data = _encode(px, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    img = decode_image(data)
    assert np.array_equal(img.pixels, px)
    assert (img.width, img.height) == (13, 9)
    assert img.digest == hashlib.sha256(data).hexdigest()  # llama.cpp's bitmap id


def test_jpeg_decodes_near_its_source():
    px = np.full((16, 16, 3), 128, np.uint8)
    px[:, 8:] = 200
    img = decode_image(_encode(px, "JPEG", quality=95))
    assert img.pixels.shape == (16, 16, 3)
    assert np.abs(img.pixels.astype(int) - px).max() < 24  # lossy: a few levels, never another picture


def test_alpha_is_dropped_and_grey_replicated():
    rgba = _noise(c=4)
    rgba[..., 3] = 0  # fully transparent: stb_image keeps the colours, it does not composite
    assert np.array_equal(decode_image(_encode(rgba, "PNG", "RGBA")).pixels, rgba[..., :3])
    grey = _noise(c=1)
    assert np.array_equal(decode_image(_encode(grey, "PNG", "L")).pixels, np.repeat(grey[..., None], 3, -1))


def test_gif_reads_its_first_frame():
    frames = [PILImage.fromarray(np.full((8, 8, 3), v, np.uint8)) for v in (10, 240)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    assert decode_image(buf.getvalue()).pixels.mean() < 50


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG whose header promises w x h pixels, followed by a tiny (invalid) image stream."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [30000, 6000])
def test_a_decompression_bomb_is_refused_before_decoding(side):
    assert side * side > MAX_PIXELS
    with pytest.raises(InvalidImage, match="pixels|readable"):
        decode_image(_png_header_only(side, side))


@pytest.mark.parametrize("data", [b"not an image at all", b"\x89PNG\r\n\x1a\n", b"GIF89a\x01"])
def test_garbage_and_truncated_bytes_are_invalid_images(data):
    with pytest.raises(InvalidImage):
        decode_image(data)
    assert issubclass(InvalidImage, InvalidRequest)  # a 400 on every surface


def test_a_truncated_png_is_refused():
    data = _encode(_noise(64, 64), "PNG")
    with pytest.raises(InvalidImage):
        decode_image(data[: len(data) // 2])


def test_data_uris_and_bare_base64():
    data = _encode(_noise(), "PNG")
    b64 = base64.b64encode(data).decode()
    for uri in (f"data:image/png;base64,{b64}", f"data:;base64,{b64}", b64):
        assert image_from_data_uri(uri).digest == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("uri, match", [
    ("data:image/png;base64,@@@@", "base64"),
    ("data:text/plain;base64,aGVsbG8=", "images only"),
    ("data:image/png,rawbytes", "base64-encoded"),
    ("http://169.254.169.254/latest/meta-data", "not fetched"),
    ("file:///etc/passwd", "not fetched"),
    ("", "data URI"),
])
def test_bad_image_references_say_what_to_send(uri, match):
    with pytest.raises(InvalidImage, match=match):
        image_from_data_uri(uri)
