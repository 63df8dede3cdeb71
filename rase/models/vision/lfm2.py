"""lfm2 (LFM2-VL, LFM2.5-VL): SigLIP2-NaFlex at the image's own size (a multiple of patch x merge
between 64 and 256 tokens), its position table resized to the patch grid (bilinear,
antialiased), post-LN, a pixel unshuffle of scale x scale, LayerNorm (eps 1e-5), mm.1 -> GELU ->
mm.2. Large images are also tiled (512 x 512) with the overview as a thumbnail. In the prompt
(mtmd.cpp): <|image_start|> [<|img_row_R_col_C|> tile ...] [<|img_thumbnail|>] rows <|image_end|>.
Causal, positions sequential.
"""
from __future__ import annotations

import numpy as np

from ...media import preprocess
from .clip import Tensors, VisionParams
from .vit import gelu, layer_norm, linear, load_layers, patch_embed, pixel_shuffle, resize_positions_antialias, vit

CAUSAL = True
MIN_TOKENS, MAX_TOKENS = 64, 256  # llama.cpp's set_limit_image_tokens(64, 256) for LFM2
BEGIN, END, THUMB = "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"


class Encoder:
    def __init__(self, ts: Tensors, vp: VisionParams) -> None:
        D, P = vp.n_embd, vp.patch_size
        self.vp, self.scale = vp, vp.merge or 2
        n_pos = ts.g.tensor("v.position_embd.weight").shape[0]
        side = int(round(np.sqrt(n_pos)))
        if side * side != n_pos:
            raise ValueError(f"lfm2: the position table's {n_pos} rows are not a square grid")
        self.patch_w = ts.get("v.patch_embd.weight", (D, 3, P, P))
        self.patch_b = ts.get("v.patch_embd.bias", (D,))
        self.pos = ts.get("v.position_embd.weight", (n_pos, D))
        self.layers = load_layers(ts, vp)
        self.post_ln = (ts.get("v.post_ln.weight", (D,)), ts.get("v.post_ln.bias", (D,)))
        W = D * self.scale ** 2
        self.in_norm = (ts.get("mm.input_norm.weight", (W,)) if ts.has("mm.input_norm.weight") else None,
                        ts.get("mm.input_norm.bias", (W,)) if ts.has("mm.input_norm.bias") else None)
        self.mm1 = (ts.get("mm.1.weight", (W, W)), ts.get("mm.1.bias", (W,)))
        self.mm2 = (ts.get("mm.2.weight", (vp.n_proj, W)), ts.get("mm.2.bias", (vp.n_proj,)))

    def pixels(self, image):
        vp = self.vp
        return preprocess.lfm2_tiles(image, vp.patch_size, self.scale, MIN_TOKENS, MAX_TOKENS, vp.mean, vp.std)

    def _n(self, shape) -> int:
        gx, gy = shape[1] // self.vp.patch_size, shape[0] // self.vp.patch_size
        return -(-gx // self.scale) * -(-gy // self.scale)

    def _plan(self, image) -> tuple[int, int, int, int]:
        """(overview tokens, tile tokens, grid_x, grid_y) without resizing any pixels."""
        P, a = self.vp.patch_size, self.vp.patch_size * self.scale
        w, h = preprocess.smart_size(image.width, image.height, a, MIN_TOKENS * a * a, MAX_TOKENS * a * a)
        n_ov = self._n((h, w))
        h_bar = max(P, round(image.height / a) * a)
        w_bar = max(P, round(image.width / a) * a)
        if not h_bar * w_bar > MAX_TOKENS * a * a * preprocess.LFM2_TOLERANCE:
            return n_ov, 0, 0, 0
        gx, gy = preprocess._lfm2_grid(image.width, image.height)
        return n_ov, self._n((preprocess.LFM2_TILE, preprocess.LFM2_TILE)), gx, gy

    def tokens(self, image) -> int:
        n_ov, n_tile, gx, gy = self._plan(image)
        return n_ov + n_tile * gx * gy

    def layout(self, image) -> list[tuple]:
        n_ov, n_tile, gx, gy = self._plan(image)
        out: list[tuple] = [("text", BEGIN)]
        for y in range(gy):
            for x in range(gx):
                out += [("text", f"<|img_row_{y + 1}_col_{x + 1}|>"), ("rows", n_tile)]
        if gx:
            out.append(("token", THUMB))
        return out + [("rows", n_ov), ("text", END)]

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """One (H, W, 3) input -> (tokens, n_proj)."""
        vp = self.vp
        gx, gy = pixels.shape[1] // vp.patch_size, pixels.shape[0] // vp.patch_size
        x = patch_embed(pixels, self.patch_w, self.patch_b, vp.patch_size) + resize_positions_antialias(self.pos, gx, gy)
        x = layer_norm(vit(x, self.layers, vp), *self.post_ln, vp.eps)
        x = pixel_shuffle(x, gx, gy, self.scale)
        if self.in_norm[0] is not None:
            x = layer_norm(x, self.in_norm[0], self.in_norm[1], 1e-5)
        return linear(gelu(linear(x, *self.mm1)), *self.mm2)

    def embed(self, image) -> np.ndarray:
        """Rows in layout order: the tiles, then the overview (the thumbnail)."""
        overview, tiles, _, _ = self.pixels(image)
        return np.concatenate([self.encode(t) for t in tiles + [overview]]).astype(np.float32)
