"""Prompts with images, as llama.cpp's mtmd_tokenize makes them: the text split at each image's
marker, every piece tokenized on its own, the model's begin / end strings around each image's
rows (placeholder ids, engine/media.py), BOS once at the front when asked for.

A chat's image parts become a marker no text can hold (a per-process random one, as
llama-server's); a completion prompt names its images with MARKER ("<__media__>", llama.cpp's).
"""
from __future__ import annotations

import os
import secrets

from ..engine.media import ImageSpan, PromptMedia, placeholder_ids
from ..errors import InvalidImage, InvalidRequest, NoVisionEncoder
from ..media.image import Image, decode_image, image_from_data_uri

MARKER = "<__media__>"                                 # llama.cpp's mtmd_default_marker
CHAT_MARKER = f"<__media_{secrets.token_hex(8)}__>"    # fixed per process; never in a user's text
MAX_IMAGES = 64                                        # per prompt


def as_image(payload, what: str, urls: bool = False) -> Image:
    """An image payload: decoded already, encoded bytes, a data URI / base64 text, a file path,
    or (urls: the engine fetches them) an http(s) URL of a public host."""
    if isinstance(payload, Image):
        return payload
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return decode_image(bytes(payload), what)
    if isinstance(payload, os.PathLike):
        try:
            with open(payload, "rb") as f:
                return decode_image(f.read(), what)
        except OSError as e:
            raise InvalidImage(f"{what}: cannot read {os.fspath(payload)}: {e.strerror}") from None
    if isinstance(payload, str):
        if urls and payload[:8].lower().startswith(("http://", "https://")):
            from ..media.fetch import fetch_image_bytes

            return decode_image(fetch_image_bytes(payload), what)
        return image_from_data_uri(payload, what)
    raise InvalidImage(f"{what}: an image is bytes, a data URI, base64 text or a path, not {type(payload).__name__}")


def media_ids(session, text: str, payloads: list, marker: str, add_special: bool) -> tuple[list[int], PromptMedia]:
    """(prompt ids, their images) of text holding one marker per image."""
    enc = session.images
    if enc is None:
        raise NoVisionEncoder(f"{session.manifest.id} has no vision encoder: register it with its mmproj file "
                              f"(rase model import PATH --id {session.manifest.id} --mmproj FILE) to send images")
    if len(payloads) > MAX_IMAGES:
        raise InvalidRequest(f"{len(payloads)} images in one prompt; at most {MAX_IMAGES}")
    pieces = text.split(marker)
    if len(pieces) - 1 != len(payloads):
        raise InvalidRequest(f"the prompt holds {len(pieces) - 1} image markers ({marker}) for {len(payloads)} images")
    urls = bool(getattr(getattr(session.worker, "config", None), "image_urls", False))
    images = [as_image(p, f"image {i}", urls) for i, p in enumerate(payloads)]
    tok = session.tokenizer
    ids = tok.encode("", add_special_tokens=True, parse_special=True) if add_special else []
    spans: list[ImageSpan] = []
    for i, piece in enumerate(pieces):
        ids += tok.encode(piece, add_special_tokens=False, parse_special=True) if piece else []
        if i < len(images):
            ids += _image_ids(enc, tok, images[i], len(ids), spans)
    return ids, PromptMedia(tuple(spans))


def _image_ids(enc, tok, image: Image, start: int, spans: list) -> list[int]:
    """The ids of one image's place in the prompt (its layout), its row spans appended to spans."""
    out: list[int] = []
    rows = placeholder_ids(image.digest, enc.tokens(image))
    used = 0
    for kind, value, *rest in enc.layout(image):
        grid = rest[0] if rest else None
        if kind == "text":
            out += tok.encode(value, add_special_tokens=False, parse_special=True)
        elif kind == "token":
            out.append(enc.piece(tok, value))
        else:  # ("rows", n) or ("rows", n, (nx, ny)): an M-RoPE model's grid
            spans.append(ImageSpan(start + len(out), value, image, enc.causal, used, grid))
            out += rows[used:used + value]
            used += value
    return out


def chat_ids(session, messages, spec, effort, kwargs):
    """A chat's prompt ids, or (ids, PromptMedia) when its messages hold images."""
    from ..text.chat import split_images

    plain, payloads = split_images(messages, CHAT_MARKER)
    if not payloads:
        return session.render_chat(messages, spec, effort, kwargs)
    text = session.chat_prompt(plain, spec, effort, kwargs)
    return media_ids(session, text, payloads, CHAT_MARKER, add_special=False)


def with_media(got) -> tuple[list[int], PromptMedia | None]:
    """chat_ids' or media_ids' answer as (ids, media or None)."""
    return got if isinstance(got, tuple) else (got, None)
