"""The pixels a vision encoder sees, as llama.cpp's libmtmd makes them (mtmd-image.cpp): a u8
resize ported from llama.cpp's port of Pillow's Resample.c (separable, horizontal pass first,
double-precision filter weights rounded to 22-bit fixed point, accumulators starting at half),
letterboxed on black (PAD_CEIL, llama.cpp's default), then (x / 255 - mean) / std in float32.
Pillow's own resize differs from llama.cpp's port by one level in rare pixels (a 3-wide image
shrunk to 1), so the port is reproduced, not Pillow. Layout: (height, width, 3), llama.cpp's order.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidImage
from .image import Image

PRECISION_BITS = 22  # 32 - 8 (u8 pixels) - 2 (headroom)
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}
MAX_SIDE = 65536     # llama.cpp refuses larger targets
BAND = 256           # lines per band of a pass: bounded memory for large images


def _filter(algo: str, x: np.ndarray) -> np.ndarray:
    """Pillow's filters (bicubic with a = -0.5), in double."""
    if algo == "lanczos":
        def sinc(v):
            with np.errstate(invalid="ignore", divide="ignore"):
                out = np.sin(v * math.pi) / (v * math.pi)
            return np.where(v == 0.0, 1.0, out)
        return np.where((-3.0 <= x) & (x < 3.0), sinc(x) * sinc(x / 3.0), 0.0)
    x = np.abs(x)
    if algo == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _weights(n_in: int, n_out: int, algo: str) -> tuple[np.ndarray, np.ndarray]:
    """precompute_weights: per output pixel the input indices (n_out, ksize) and their
    fixed-point weights (0 past the pixel's count)."""
    scale = n_in / n_out
    filterscale = max(scale, 1.0)
    support = SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    idx = np.zeros((n_out, ksize), np.int64)
    out = np.zeros((n_out, ksize), np.int64)
    for xx in range(n_out):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), n_in) - xmin
        w = [float(v) for v in _filter(algo, (np.arange(xmax) + xmin - center + 0.5) * (1.0 / filterscale))]
        ww = 0.0
        for v in w:  # summed in order, as the C loop
            ww += v
        pre = [v / ww for v in w] if ww != 0.0 else w
        fxp = math.ldexp(1.0, PRECISION_BITS)
        out[xx, :xmax] = [int(v * fxp + (-0.5 if v < 0 else 0.5)) for v in pre]
        idx[xx, :xmax] = np.arange(xmin, xmin + xmax)
    return idx, out


def _pass(src: np.ndarray, n_out: int, algo: str, axis: int) -> np.ndarray:
    """One separable pass along axis (1: horizontal, 0: vertical) of (h, w, 3) uint8, in int32
    as the C loops (no overflow: 2 bits of headroom), a band of BAND lines of the other axis at a time."""
    idx, k = _weights(src.shape[axis], n_out, algo)
    k32 = k.astype(np.int32)
    moved = np.moveaxis(src, axis, 1)  # (lines, n_in, 3): the pass runs along axis 1
    out = np.empty((moved.shape[0], n_out, 3), np.uint8)
    for b0 in range(0, moved.shape[0], BAND):
        band = moved[b0:b0 + BAND].astype(np.int32)
        acc = np.full((band.shape[0], n_out, 3), 1 << (PRECISION_BITS - 1), np.int32)
        for j in range(idx.shape[1]):
            acc += band[:, idx[:, j], :] * k32[None, :, j, None]
        out[b0:b0 + BAND] = np.clip(acc >> PRECISION_BITS, 0, 255)
    return np.ascontiguousarray(np.moveaxis(out, 1, axis))


def resize(pixels: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """(h, w, 3) uint8 -> (height, width, 3) uint8, llama.cpp's resize_pillow."""
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise ValueError(f"resize target {width}x{height} is out of range")
    out = pixels
    if width != pixels.shape[1]:
        out = _pass(out, width, algo, 1)
    if height != pixels.shape[0]:
        out = _pass(out, height, algo, 0)
    return out.copy() if out is pixels else out


def letterbox(pixels: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """img_tool::resize with PAD_CEIL: fit inside (width, height) keeping the aspect ratio
    (float32 scale, sizes rounded up), centred (integer halves) on black."""
    h, w = pixels.shape[:2]
    if (h, w) == (height, width):
        return pixels.copy()
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    nw = min(int(math.ceil(np.float32(w) * scale)), width)
    nh = min(int(math.ceil(np.float32(h) * scale)), height)
    out = np.zeros((height, width, 3), np.uint8)
    x0, y0 = (width - nw) // 2, (height - nh) // 2
    out[y0:y0 + nh, x0:x0 + nw] = resize(pixels, nw, nh, algo)
    return out


def normalize(pixels: np.ndarray, mean, std) -> np.ndarray:
    """(u8 / 255 - mean[c]) / std[c] in float32, as clip_image_f32::normalize."""
    x = pixels.astype(np.float32) / np.float32(255.0)
    return (x - np.asarray(mean[:3], np.float32)) / np.asarray(std[:3], np.float32)


def fixed_size(image: Image, size: int, algo: str, mean, std) -> np.ndarray:
    """mtmd_image_preprocessor_fixed_size: one size x size input (Gemma 3, SigLIP)."""
    return normalize(letterbox(image.pixels, size, size, algo), mean, std)


def idefics3_tiles(image: Image, tile: int, longest: int, mean, std) -> tuple[np.ndarray, list, int, int]:
    """mtmd_image_preprocessor_idefics3 (SmolVLM): LANCZOS to a long side of `longest` (the short
    side in proportion, made even), stretched to whole tiles, cut into tile x tile tiles in raster
    order; the overview is that stretched image resized to one tile. Returns (overview, tiles,
    grid_x, grid_y), each (tile, tile, 3) float32."""
    w, h = image.width, image.height
    aspect = w / h
    if w >= h:
        rw, rh = longest, int(longest / aspect)
        rh += rh % 2
    else:
        rw, rh = int(longest * aspect), longest
        rw += rw % 2
    if rw < 1 or rh < 1:  # llama.cpp aborts on it ("resize target 0x64 is out of range")
        raise InvalidImage(f"a {w}x{h} image is too thin for this model: its short side would shrink to no pixels "
                           f"at a long side of {longest}; pad or crop it")
    gx, gy = (rw + tile - 1) // tile, (rh + tile - 1) // tile
    resized = resize(image.pixels, rw, rh, "lanczos") if (rw, rh) != (w, h) else image.pixels
    refined = resize(resized, gx * tile, gy * tile, "lanczos")
    overview = normalize(resize(refined, tile, tile, "lanczos"), mean, std)
    tiles = [normalize(refined[y * tile:(y + 1) * tile, x * tile:(x + 1) * tile], mean, std)
             for y in range(gy) for x in range(gx)]
    return overview, tiles, gx, gy


def _round_half_away(x: np.float32) -> int:
    return int(math.floor(abs(float(x)) + 0.5)) * (1 if x >= 0 else -1)


def smart_size(w: int, h: int, align: int, min_px: int, max_px: int) -> tuple[int, int]:
    """img_tool::calc_size_preserved_ratio in float32: sides rounded to multiples of align (C
    round: half away from zero), then scaled down under max_px or up over min_px."""
    f32, a = np.float32, np.float32(align)
    w_bar = max(align, _round_half_away(f32(w) / a) * align)
    h_bar = max(align, _round_half_away(f32(h) / a) * align)
    if max_px > 0 and h_bar * w_bar > max_px:
        beta = np.sqrt(f32(h) * f32(w) / f32(max_px), dtype=np.float32)
        h_bar = max(align, int(math.floor(f32(h) / beta / a)) * align)
        w_bar = max(align, int(math.floor(f32(w) / beta / a)) * align)
    elif min_px > 0 and h_bar * w_bar < min_px:
        beta = np.sqrt(f32(min_px) / (f32(h) * f32(w)), dtype=np.float32)
        h_bar = int(math.ceil(f32(h) * beta / a)) * align
        w_bar = int(math.ceil(f32(w) * beta / a)) * align
    return w_bar, h_bar


LFM2_TILE, LFM2_TILES, LFM2_TOLERANCE = 512, (2, 10), 2.0


def _lfm2_grid(w: int, h: int) -> tuple[int, int]:
    """mtmd_image_preprocessor_lfm2::get_grid_layout: the (cols, rows) of 2..10 tiles whose aspect
    is closest to the image's (float32); on a tie the later wins when the image covers more than
    half its pixels."""
    lo, hi = LFM2_TILES
    ratios = []
    for n in range(lo, hi + 1):
        for c in range(1, n + 1):
            for r in range(1, n + 1):
                if lo <= c * r <= hi and (c, r) not in ratios:
                    ratios.append((c, r))
    ratios.sort(key=lambda cr: cr[0] * cr[1])
    aspect, area = np.float32(w) / np.float32(h), np.float32(w * h)
    best, best_diff = (1, 1), np.float32(np.finfo(np.float32).max)
    for c, r in ratios:
        diff = np.float32(abs(aspect - np.float32(c) / np.float32(r)))
        if diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and area > np.float32(0.5) * np.float32(LFM2_TILE * LFM2_TILE * c * r):
            best = (c, r)
    return best


def lfm2_tiles(image: Image, patch: int, merge: int, min_tokens: int, max_tokens: int, mean, std):
    """mtmd_image_preprocessor_lfm2 (LFM2-VL): the overview is the image stretched (BILINEAR) to its
    smart size (a multiple of patch x merge, min..max tokens); an image well over the budget is
    also cut into 512 x 512 tiles of a letterboxed resize, the overview then its thumbnail.
    Returns (overview, tiles, grid_x, grid_y); no tiles: (overview, [], 0, 0)."""
    align = patch * merge
    min_px, max_px = min_tokens * align * align, max_tokens * align * align
    w, h = image.width, image.height
    ov_w, ov_h = smart_size(w, h, align, min_px, max_px)
    overview = normalize(resize(image.pixels, ov_w, ov_h, "bilinear") if (ov_w, ov_h) != (w, h)
                         else image.pixels, mean, std)
    h_bar = max(patch, round(h / align) * align)  # nearbyint: half to even, as Python's round
    w_bar = max(patch, round(w / align) * align)
    if not h_bar * w_bar > max_px * LFM2_TOLERANCE:
        return overview, [], 0, 0
    gx, gy = _lfm2_grid(w, h)
    refined = letterbox(image.pixels, LFM2_TILE * gx, LFM2_TILE * gy, "bilinear")
    t = LFM2_TILE
    tiles = [normalize(refined[y * t:(y + 1) * t, x * t:(x + 1) * t], mean, std) for y in range(gy) for x in range(gx)]
    return overview, tiles, gx, gy
