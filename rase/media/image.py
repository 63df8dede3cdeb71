"""Image bytes -> RGB pixels, as llama.cpp's mtmd helper reads them (stb_image; here Pillow):
PNG, JPEG, WebP, GIF (first frame), BMP; alpha dropped (not composited), grey replicated, EXIF
orientation ignored. The id is the SHA-256 hex of the bytes (llama.cpp's bitmap id, the
prefix cache's key). Bounded before decoding: a header that promises more than MAX_PIXELS is
refused without allocating its pixels (a decompression bomb), and so are over-long inputs.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidImage, MissingDependency

MAX_BYTES = 20 * 1024 * 1024      # an encoded image (llama-server downloads up to 10 MB)
MAX_PIXELS = 25_000_000           # width x height: a 24 MP photo; 75 MB of RGB
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_DATA_URI = re.compile(r"data:(?P<mime>[\w.+-]*/?[\w.+-]*)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                       re.ASCII)


@dataclass(frozen=True)
class Image:
    """Decoded pixels: (height, width, 3) uint8, and the SHA-256 hex of the encoded bytes."""
    pixels: np.ndarray = field(repr=False)
    digest: str

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])


def _pillow():
    try:
        from PIL import Image as PILImage
    except ImportError as e:  # pragma: no cover - Pillow is a dependency
        raise MissingDependency("images need Pillow: pip install pillow") from e
    return PILImage


def decode_image(data: bytes, what: str = "image") -> Image:
    """Encoded image bytes -> Image; InvalidImage says what is wrong (size, format, truncation)."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
        raise InvalidImage(f"{what}: no image bytes")
    if len(data) > MAX_BYTES:
        raise InvalidImage(f"{what}: {len(data)} bytes; images up to {MAX_BYTES // (1024 * 1024)} MiB are read")
    pil = _pillow()
    digest = hashlib.sha256(data).hexdigest()
    try:
        with pil.open(io.BytesIO(data), formats=FORMATS) as im:  # reads the header only
            w, h = im.size
            if w < 1 or h < 1 or w * h > MAX_PIXELS:
                raise InvalidImage(f"{what}: {w}x{h} pixels; at most {MAX_PIXELS} are decoded (resize it first)")
            im.seek(0)  # a GIF's first frame, as llama.cpp
            rgb = im.convert("RGB")  # alpha dropped as stb_image does; palettes and grey expanded
            pixels = np.asarray(rgb, dtype=np.uint8).copy()
    except InvalidImage:
        raise
    except Exception as e:  # Pillow: UnidentifiedImageError, truncated data, DecompressionBombError, ...
        raise InvalidImage(f"{what}: not a readable {'/'.join(FORMATS)} image ({type(e).__name__}: {e})") from None
    return Image(pixels, digest)


def image_from_data_uri(uri: str, what: str = "image") -> Image:
    """A `data:image/...;base64,` URI (or bare base64, as llama-server and Ollama accept)."""
    if not isinstance(uri, str) or not uri:
        raise InvalidImage(f"{what}: an image must be a data URI or base64 text")
    m = _DATA_URI.match(uri)
    if m:
        if not m.group("b64"):
            raise InvalidImage(f"{what}: a data URI must be base64-encoded (data:image/png;base64,...)")
        mime = (m.group("mime") or "").lower()
        if mime and not mime.startswith("image/") and mime != "application/octet-stream":
            raise InvalidImage(f"{what}: data URI of type {mime!r}; images only (image/png, image/jpeg, ...)")
        payload = uri[m.end():]
    elif re.match(r"[a-z][a-z0-9+.-]*://", uri, re.I):
        raise InvalidImage(f"{what}: image URLs ({uri.split('://')[0]}://) are not fetched: send the image "
                           "as a data URI (data:image/png;base64,...), or start the server with "
                           "--allow-image-urls (public http(s) hosts only)")
    else:
        payload = uri
    if len(payload) > (MAX_BYTES * 4) // 3 + 4:
        raise InvalidImage(f"{what}: images up to {MAX_BYTES // (1024 * 1024)} MiB are read")
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage(f"{what}: invalid base64 image data") from None
    return decode_image(data, what)
