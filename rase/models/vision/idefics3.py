"""idefics3 (SmolVLM, SmolVLM2): SigLIP over tiles of a LANCZOS-resized image (long side
preproc_image_size) and an overview, post-LN, a pixel shuffle of scale x scale patches, then
mm.model.fc (no bias). Each tile and the overview give (S / P / scale)^2 rows; in the prompt
(mtmd.cpp, HF's processing_idefics3): per tile <fake_token_around_image><row_R_col_C> and its rows,
"\n" after each row of tiles but the last, then "\n\n" <fake_token_around_image> <global-img>, the
overview's rows, <fake_token_around_image>. Causal, positions sequential.
"""
from __future__ import annotations

import numpy as np

from ...media import preprocess
from .clip import Tensors, VisionParams
from .vit import layer_norm, linear, load_layers, patch_embed, pixel_shuffle, vit

CAUSAL = True
AROUND, GLOBAL = "<fake_token_around_image>", "<global-img>"


class Encoder:
    def __init__(self, ts: Tensors, vp: VisionParams) -> None:
        D, P, S = vp.n_embd, vp.patch_size, vp.image_size
        self.vp, self.grid = vp, S // P
        self.scale = vp.merge or 2
        self.longest = int(ts.g.get("clip.vision.preproc_image_size") or 0)
        if self.grid % self.scale or self.longest < 1:
            raise ValueError("idefics3: the patch grid must divide by the scale factor, and the file must carry "
                             "clip.vision.preproc_image_size (re-convert it with a recent llama.cpp)")
        self.per_tile = (self.grid // self.scale) ** 2
        self.patch_w = ts.get("v.patch_embd.weight", (D, 3, P, P))
        self.patch_b = ts.get("v.patch_embd.bias", (D,))
        self.pos = ts.get("v.position_embd.weight", (self.grid * self.grid, D))
        self.layers = load_layers(ts, vp)
        self.post_ln = (ts.get("v.post_ln.weight", (D,)), ts.get("v.post_ln.bias", (D,)))
        self.fc = ts.get("mm.model.fc.weight", (vp.n_proj, D * self.scale ** 2))

    def _grid(self, image) -> tuple[int, int]:
        w, h, L, S = image.width, image.height, self.longest, self.vp.image_size
        rw, rh = (L, int(L / (w / h))) if w >= h else (int(L * (w / h)), L)
        rw, rh = (rw, rh + rh % 2) if w >= h else (rw + rw % 2, rh)
        return (rw + S - 1) // S, (rh + S - 1) // S

    def tokens(self, image) -> int:
        gx, gy = self._grid(image)
        return (gx * gy + 1) * self.per_tile

    def layout(self, image) -> list[tuple]:
        gx, gy = self._grid(image)
        out: list[tuple] = []
        for y in range(gy):
            for x in range(gx):
                out += [("text", f"{AROUND}<row_{y + 1}_col_{x + 1}>"), ("rows", self.per_tile)]
            if y != gy - 1:
                out.append(("token", "\n"))
        return out + [("token", "\n\n"), ("token", AROUND), ("token", GLOBAL), ("rows", self.per_tile),
                      ("token", AROUND)]

    def pixels(self, image):
        vp = self.vp
        return preprocess.idefics3_tiles(image, vp.image_size, self.longest, vp.mean, vp.std)

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """One (S, S, 3) tile -> (per_tile, n_proj)."""
        vp = self.vp
        x = patch_embed(pixels, self.patch_w, self.patch_b, vp.patch_size) + self.pos
        x = layer_norm(vit(x, self.layers, vp), *self.post_ln, vp.eps)
        return linear(pixel_shuffle(x, self.grid, self.grid, self.scale), self.fc)

    def embed(self, image) -> np.ndarray:
        """Rows in layout order: the tiles, then the overview."""
        overview, tiles, _, _ = self.pixels(image)
        return np.concatenate([self.encode(t) for t in tiles + [overview]]).astype(np.float32)
