"""Image rows in a request's prompt, and the worker's image encoder with its embedding cache.

An image occupies n consecutive prompt positions. Their ids are placeholders: negative, and a
function of the image's SHA-256 and the row's index, so the prefix cache (keyed by ids) matches
a later turn that sends the same image, as llama-server keys its cache by image id; no token
has a negative id, so no text prefix matches one. The worker swaps each placeholder for its
embedding row (ImageEncoder, which keeps recent images' rows within a byte budget) and, where
the model's image rows attend to each other both ways (Gemma 3), keeps an image's remaining
rows in one step and lets them see the whole image (key_end).
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np


def placeholder_ids(digest: str, n: int) -> list[int]:
    """n negative ids for the rows of the image whose SHA-256 hex is digest."""
    h = hashlib.sha256(digest.encode()).digest()
    base = int.from_bytes(h[:4], "little") & 0x3FFFFFFF
    return [-1 - ((base + i * 0x9E3779B1) & 0x3FFFFFFF) for i in range(n)]


@dataclass(frozen=True)
class ImageSpan:
    """Rows of one image at prompt positions [start, start + n): its rows offset .. offset + n
    (a tiled image's tiles are spans apart, with text between them)."""
    start: int
    n: int
    image: object = field(repr=False)  # media.image.Image
    causal: bool = True                # False: the rows attend to each other both ways
    offset: int = 0
    grid: tuple[int, int] | None = None  # M-RoPE models: the rows' (nx, ny) grid, raster order

    @property
    def end(self) -> int:
        return self.start + self.n


@dataclass(frozen=True)
class PromptMedia:
    """The images of one prompt, in position order."""
    spans: tuple[ImageSpan, ...]

    def at(self, pos: int) -> tuple[ImageSpan, int] | None:
        for s in self.spans:
            if s.start <= pos < s.end:
                return s, pos - s.start
        return None

    def cut(self, start: int, take: int) -> int:
        """Prompt positions to compute from start, near take: never splitting the rest of a
        non-causal image (a chunk ends before it, or takes it whole even past take)."""
        for s in self.spans:
            if s.causal or s.end <= start or s.start >= start + take:
                continue
            if s.start > start:
                return s.start - start  # stop before the image; the next chunk starts with it
            return max(take, s.end - start)
        return take

    def waiting(self, start: int, ready) -> int | None:
        """The first position from start on whose image's rows are not ready (ready(image) starts
        their encoding), or None."""
        for s in self.spans:
            if s.end > start and not ready(s.image):
                return max(s.start, start)
        return None

    def key_end(self, pos: int) -> int:
        """The end of the keys a row at pos attends to: its image's end for a non-causal image."""
        hit = self.at(pos)
        return hit[0].end if hit is not None and not hit[0].causal else pos + 1

    @property
    def mrope(self) -> bool:
        return any(s.grid is not None for s in self.spans)

    def rope_positions(self, cells: np.ndarray) -> np.ndarray:
        """(n, 4) int32 M-RoPE positions (t, h, w, e) of prompt or answer cells (mtmd's): a text
        cell at (q, q, q, 0); row i of an nx x ny image starting at position q0 at
        (q0, q0 + i // nx, q0 + i % nx, 0); each image advances the position by max(nx, ny),
        not by its rows, so later cells sit that much lower."""
        cells = np.asarray(cells, np.int64)
        out = np.repeat(cells[:, None], 4, axis=1)
        out[:, 3] = 0
        shift = 0
        for s in self.spans:
            if s.grid is None:
                continue
            nx, ny = s.grid
            inside = (cells >= s.start) & (cells < s.end)
            i = cells[inside] - s.start
            q0 = s.start - shift
            out[inside] = np.stack([np.full_like(i, q0), q0 + i // nx, q0 + i % nx, np.zeros_like(i)], axis=1)
            delta = s.n - max(nx, ny)
            out[cells >= s.end, :3] -= delta
            shift += delta
        return out.astype(np.int32)

    @property
    def non_causal(self) -> bool:
        return any(not s.causal for s in self.spans)

    @property
    def image_tokens(self) -> int:
        return sum(s.n for s in self.spans)


class ImageEncoder:
    """A session's vision encoder (models/vision) and the rows of recently seen images by
    digest, least recently used dropped past budget bytes. Images are encoded on a thread of
    their own (numpy releases the GIL), so the worker keeps stepping other requests meanwhile:
    ready(image) starts an encoding and says whether the rows are there; rows(image) waits for
    them. on_done is called (from the encoding thread) when an encoding ends."""

    def __init__(self, module, encoder, budget_bytes: int = 64 << 20) -> None:
        self.module, self.encoder, self.budget = module, encoder, budget_bytes
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._pieces: dict[str, int] | None = None  # token text -> id (llama.cpp's lookup_token)
        self.on_done = lambda: None
        self.encoded = 0  # images encoded (cache misses)

    @property
    def causal(self) -> bool:
        return self.module.CAUSAL

    def tokens(self, image) -> int:
        return self.encoder.tokens(image)

    def layout(self, image) -> list[tuple]:
        """The image in a prompt: ("text", s) tokenized with special tokens, ("token", s) the one
        token whose text is s, ("rows", n) its next n rows."""
        return self.encoder.layout(image)

    def piece(self, tokenizer, text: str) -> int:
        """The id of the token whose text is `text` (the first, as llama.cpp's lookup_token)."""
        with self._lock:
            if self._pieces is None:
                found: dict[str, int] = {}
                for i in range(tokenizer.n_vocab):  # special tokens by their text too (token_to_piece, special)
                    found.setdefault(tokenizer.decode_bytes([i], False).decode("utf-8", "replace"), i)
                self._pieces = found
            hit = self._pieces.get(text)
        if hit is None:
            raise ValueError(f"the vocabulary has no token {text!r} for this vision encoder's prompt layout")
        return hit

    def ready(self, image) -> bool:
        """Whether image's rows are cached; if not, its encoding is started (once)."""
        with self._lock:
            if image.digest in self._rows:
                return True
            if image.digest not in self._pending:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="rase-vision")
                self._pending[image.digest] = self._pool.submit(self._encode, image)
        return False

    def rows(self, image) -> np.ndarray:
        """(n_tokens, n_embd) float32 embedding rows of image (encoded once while cached)."""
        with self._lock:
            hit = self._rows.get(image.digest)
            if hit is not None:
                self._rows.move_to_end(image.digest)
                return hit
            pending = self._pending.get(image.digest)
        return pending.result() if pending is not None else self._encode(image)

    def _encode(self, image) -> np.ndarray:
        try:
            rows = np.ascontiguousarray(self.encoder.embed(image), np.float32)
            with self._lock:
                self.encoded += 1
                self._rows[image.digest] = rows
                used = sum(r.nbytes for r in self._rows.values())
                while used > self.budget and len(self._rows) > 1:
                    _, old = self._rows.popitem(last=False)
                    used -= old.nbytes
            return rows
        finally:
            with self._lock:
                self._pending.pop(image.digest, None)
            self.on_done()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict:
        with self._lock:
            return {"images_encoded": self.encoded, "images_cached": len(self._rows),
                    "image_cache_bytes": sum(r.nbytes for r in self._rows.values())}


def rope_positions(rows: np.ndarray, seqs: list) -> np.ndarray | None:
    """The step's (n, 4) M-RoPE positions when a sequence in it has M-RoPE images (every row's:
    the others' text at (pos, pos, pos, 0)), else None."""
    if not any(getattr(r, "media", None) is not None and r.media.mrope for r in seqs):
        return None
    out = np.repeat(rows[:, 2:3].astype(np.int32), 4, axis=1)
    out[:, 3] = 0
    for j, req in enumerate(seqs):
        if req.media is not None and req.media.mrope:
            mine = rows[:, 1] == j
            out[mine] = req.media.rope_positions(rows[mine, 2])
    return out


def step_inputs(rows: np.ndarray, seqs: list, encoder: ImageEncoder | None):
    """For a step's rows (n, 3) of (token, seq, pos): the forward's (rows, in_embd, in_row,
    key_end), placeholders swapped for token 0 and their embedding rows; (rows, None, None,
    None) when the step holds no image row."""
    image = rows[:, 0] < 0
    if not image.any():
        return rows, None, None, None
    rows = rows.copy()
    in_row = np.full(len(rows), -1, np.int32)
    picked: list[np.ndarray] = []
    key_end = rows[:, 2] + 1
    any_open = False
    for i in np.flatnonzero(image):
        seq, pos = int(rows[i, 1]), int(rows[i, 2])
        media = seqs[seq].media
        span, j = media.at(pos)
        picked.append(encoder.rows(span.image)[span.offset + j])
        in_row[i] = len(picked) - 1
        if not span.causal:
            key_end[i], any_open = span.end, True
    rows[image, 0] = 0
    return rows, np.stack(picked), in_row, (key_end.astype(np.int32) if any_open else None)
