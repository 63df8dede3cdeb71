"""qwen3vl_merger (Qwen3-VL's vision tower without deepstack, as Qwen3.5 ships it): the image at
its own size (a multiple of patch x merge, 8..4096 tokens, BICUBIC into a black letterbox), two
temporal conv slices applied to the one frame, patches in 2 x 2 merge groups, the position table
resized with align-corners to the patch grid, fused-QKV ViT with 2D vision RoPE (rows on the first
quarter of each head's pairs, columns on the second), LayerNorm, GELU, post-LN, then each group's
4 patches through mm.0 -> GELU -> mm.2. In the decoder: <|vision_start|> rows <|vision_end|> at
M-RoPE positions on the token grid (engine/media.py PromptMedia.rope_positions). Files with
deepstack layers (Qwen3-VL proper) need the qwen3vl text architecture, which rase does not run.
"""
from __future__ import annotations

import numpy as np

from ...media import preprocess
from .clip import Tensors, VisionParams
from .vit import attention, gelu, layer_norm, linear, patch_embed

CAUSAL = True
MARKERS = ("<|vision_start|>", "<|vision_end|>")
MIN_TOKENS, MAX_TOKENS = 8, 4096  # llama.cpp's set_limit_image_tokens(8, 4096)
ROPE_BASE = 10000.0


def merge_order(gx: int, gy: int) -> np.ndarray:
    """Raster patch indices in 2 x 2 merge-group order: groups in raster, inside (0,0) (0,1) (1,0) (1,1)."""
    y, x, dy, dx = np.meshgrid(np.arange(gy // 2), np.arange(gx // 2), np.arange(2), np.arange(2), indexing="ij")
    return ((2 * y + dy) * gx + 2 * x + dx).reshape(-1)


def resize_align_corners(table: np.ndarray, width: int, height: int) -> np.ndarray:
    """ggml_interpolate bilinear with align corners, float32: (n*n, D) -> (height*width, D) raster."""
    n = int(round(np.sqrt(table.shape[0])))
    if (width, height) == (n, n):
        return table
    grid, f32 = table.reshape(n, n, -1), np.float32
    sf0 = f32(width - 1) / f32(n - 1) if width > 1 and n > 1 else f32(width) / f32(n)
    sf1 = f32(height - 1) / f32(n - 1) if height > 1 and n > 1 else f32(height) / f32(n)
    out = np.empty((height, width, table.shape[1]), np.float32)
    one = f32(1)
    for i1 in range(height):
        y = f32(i1) / sf1
        y0 = int(np.floor(y))
        y0c, y1c = min(max(y0, 0), n - 1), min(max(y0 + 1, 0), n - 1)
        dy = min(max(f32(y - f32(y0c)), f32(0)), one)
        for i0 in range(width):
            x = f32(i0) / sf0
            x0 = int(np.floor(x))
            x0c, x1c = min(max(x0, 0), n - 1), min(max(x0 + 1, 0), n - 1)
            dx = min(max(f32(x - f32(x0c)), f32(0)), one)
            a, b, c, d = grid[y0c, x0c], grid[y0c, x1c], grid[y1c, x0c], grid[y1c, x1c]
            out[i1, i0] = a * ((one - dx) * (one - dy)) + b * (dx * (one - dy)) + c * ((one - dx) * dy) + d * (dx * dy)
    return out.reshape(height * width, -1)


def vision_rope(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, n_head: int) -> np.ndarray:
    """GGML_ROPE_TYPE_VISION over (n, D): each head's pair (i, i + d/2) turns by row * s^i for
    i < d/4 and col * s^(i - d/4) after, s = 10000^(-4/d), the angles running products in float32."""
    n, D = x.shape
    d = D // n_head
    half, quarter, f32 = d // 2, d // 4, np.float32
    scale = f32(np.power(f32(ROPE_BASE), f32(-2.0) / f32(half)))
    ang = np.empty((n, half), np.float32)
    tr, tc = rows.astype(np.float32), cols.astype(np.float32)
    for i in range(half):
        if i == quarter:
            tc = cols.astype(np.float32)  # the second section starts its running product anew
        ang[:, i] = tr if i < quarter else tc
        tr, tc = (tr * scale).astype(np.float32), (tc * scale).astype(np.float32)
    cos, sin = np.cos(ang), np.sin(ang)
    h = x.reshape(n, n_head, d)
    x0, x1 = h[..., :half], h[..., half:]
    out = np.concatenate([x0 * cos[:, None] - x1 * sin[:, None], x0 * sin[:, None] + x1 * cos[:, None]], axis=-1)
    return out.reshape(n, D).astype(np.float32)


class DynSize:
    """The Qwen towers' image size and place in the prompt: the image at its own size (a multiple
    of patch x merge, MIN..MAX tokens, BICUBIC letterbox), its rows on an nx x ny token grid
    between the vision markers. Needs self.vp and self.merge."""

    def _size(self, image) -> tuple[int, int]:
        a = self.vp.patch_size * self.merge
        return preprocess.smart_size(image.width, image.height, a, MIN_TOKENS * a * a, MAX_TOKENS * a * a)

    def grid(self, image) -> tuple[int, int]:
        """The image's token grid (nx, ny)."""
        w, h = self._size(image)
        a = self.vp.patch_size * self.merge
        return w // a, h // a

    def tokens(self, image) -> int:
        nx, ny = self.grid(image)
        return nx * ny

    def layout(self, image) -> list[tuple]:
        return [("text", MARKERS[0]), ("rows", self.tokens(image), self.grid(image)), ("text", MARKERS[1])]

    def pixels(self, image) -> np.ndarray:
        w, h = self._size(image)
        return preprocess.normalize(preprocess.letterbox(image.pixels, w, h, "bicubic"), self.vp.mean, self.vp.std)

    def embed(self, image) -> np.ndarray:
        return self.encode(self.pixels(image))


class Encoder(DynSize):
    def __init__(self, ts: Tensors, vp: VisionParams) -> None:
        D, P = vp.n_embd, vp.patch_size
        self.vp = vp
        self.merge = int(ts.g.get("clip.vision.spatial_merge_size") or 2)
        if self.merge != 2 or any(k.startswith("v.deepstack.") for k in ts.g.tensors):
            raise ValueError("qwen3vl_merger: rase runs the 2 x 2 merger without deepstack layers (Qwen3.5's); "
                             "Qwen3-VL's deepstack needs the qwen3vl text architecture")
        n_pos = ts.g.tensor("v.position_embd.weight").shape[0]
        self.w0, self.w1 = ts.get("v.patch_embd.weight", (D, 3, P, P)), ts.get("v.patch_embd.weight.1", (D, 3, P, P))
        self.bias = ts.get("v.patch_embd.bias", (D,))
        self.pos = ts.get("v.position_embd.weight", (n_pos, D))
        self.layers = []
        for il in range(vp.n_layer):
            p = f"v.blk.{il}."
            pair = lambda name, shape: (ts.get(name + ".weight", shape), ts.get(name + ".bias", shape[:1]))  # noqa: E731
            self.layers.append((pair(p + "ln1", (D,)), pair(p + "attn_qkv", (3 * D, D)), pair(p + "attn_out", (D, D)),
                                pair(p + "ln2", (D,)), pair(p + "ffn_up", (vp.n_ff, D)), pair(p + "ffn_down", (D, vp.n_ff))))
        self.post_ln = (ts.get("v.post_ln.weight", (D,)), ts.get("v.post_ln.bias", (D,)))
        self.mm0 = (ts.get("mm.0.weight", (4 * D, 4 * D)), ts.get("mm.0.bias", (4 * D,)))
        self.mm2 = (ts.get("mm.2.weight", (vp.n_proj, 4 * D)), ts.get("mm.2.bias", (vp.n_proj,)))

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        vp, P = self.vp, self.vp.patch_size
        gx, gy = pixels.shape[1] // P, pixels.shape[0] // P
        order = merge_order(gx, gy)
        x = (patch_embed(pixels, self.w0, None, P) + patch_embed(pixels, self.w1, None, P))[order] + self.bias
        x = x + resize_align_corners(self.pos, gx, gy)[order]
        rows, cols = order // gx, order % gx
        D = vp.n_embd
        for ln1, qkv, out, ln2, up, down in self.layers:
            h = linear(layer_norm(x, *ln1, vp.eps), *qkv)
            q = vision_rope(h[:, :D], rows, cols, vp.n_head)
            k = vision_rope(h[:, D:2 * D], rows, cols, vp.n_head)
            x = linear(attention(q, k, h[:, 2 * D:], vp.n_head), *out) + x
            x = x + linear(gelu(linear(layer_norm(x, *ln2, vp.eps), *up)), *down)
        x = layer_norm(x, *self.post_ln, vp.eps).reshape(-1, 4 * D)
        return linear(gelu(linear(x, *self.mm0)), *self.mm2).astype(np.float32)
