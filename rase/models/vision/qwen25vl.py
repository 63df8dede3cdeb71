"""qwen2.5vl_merger (Qwen2.5-VL 3B/7B): the image at its own size (a multiple of patch x 2,
8..4096 tokens, BICUBIC letterbox), two temporal conv slices on the one frame (no bias), patches
in 2 x 2 merge groups, then regathered window by window (windows of window_size pixels); RMSNorm,
Q/K/V with biases, 2D vision RoPE, attention inside each window except every n_wa_pattern-th layer
(all patches), SwiGLU with biases, post-RMSNorm, the merger mm.0 -> GELU -> mm.2, and the tokens
put back in raster order. In the decoder: <|vision_start|> rows <|vision_end|> at M-RoPE positions
(the qwen2vl text architecture). Qwen2-VL's qwen2vl_merger (LayerNorm, quick-GELU, no windows) is
not this description.
"""
from __future__ import annotations

import numpy as np

from .clip import Tensors, VisionParams
from .qwen3vl import MARKERS, DynSize, merge_order, vision_rope
from .vit import gelu, linear, patch_embed, rms_norm

CAUSAL = True
WINDOW = 112  # pixels a side of an attention window
__all__ = ["CAUSAL", "MARKERS", "Encoder"]


def windows(gx: int, gy: int, grid_window: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """clip.cpp's window order of the (gx/2) x (gy/2) merge groups: inv[dst] = the raster group at
    windowed position dst, and each window's [first, end) group range."""
    pw, ph = gx // 2, gy // 2
    inv, ranges = [], []
    for y in range(0, ph, grid_window):
        for x in range(0, pw, grid_window):
            first = len(inv)
            for dy in range(min(grid_window, ph - y)):
                for dx in range(min(grid_window, pw - x)):
                    inv.append((y + dy) * pw + x + dx)
            ranges.append((first, len(inv)))
    return np.array(inv, np.int64), ranges


def masked_attention(q, k, v, n_head: int, ranges) -> np.ndarray:
    """Attention inside each window (rows and keys of one contiguous patch range)."""
    from .vit import attention

    out = np.empty_like(q)
    for a, b in ranges:
        out[a:b] = attention(q[a:b], k[a:b], v[a:b], n_head)
    return out


class Encoder(DynSize):
    def __init__(self, ts: Tensors, vp: VisionParams) -> None:
        D, P, F = vp.n_embd, vp.patch_size, vp.n_ff
        self.vp, self.merge = vp, 2
        self.pattern = int(ts.g.get("clip.vision.n_wa_pattern") or 0)
        self.window = WINDOW  # llama.cpp reads no window size for this projector (clip.cpp)
        if self.pattern < 1:
            raise ValueError("qwen2.5vl_merger needs clip.vision.n_wa_pattern (llama.cpp requires it too)")
        self.w0, self.w1 = ts.get("v.patch_embd.weight", (D, 3, P, P)), ts.get("v.patch_embd.weight.1", (D, 3, P, P))
        self.layers = []
        for il in range(vp.n_layer):
            p = f"v.blk.{il}."
            wb = lambda name, shape: (ts.get(name + ".weight", shape), ts.get(name + ".bias", shape[:1]))  # noqa: E731
            self.layers.append(dict(ln1=ts.get(p + "ln1.weight", (D,)), ln2=ts.get(p + "ln2.weight", (D,)),
                                    q=wb(p + "attn_q", (D, D)), k=wb(p + "attn_k", (D, D)), v=wb(p + "attn_v", (D, D)),
                                    out=wb(p + "attn_out", (D, D)), gate=wb(p + "ffn_gate", (F, D)),
                                    up=wb(p + "ffn_up", (F, D)), down=wb(p + "ffn_down", (D, F))))
        self.post_ln = ts.get("v.post_ln.weight", (D,))
        self.mm0 = (ts.get("mm.0.weight", (4 * D, 4 * D)), ts.get("mm.0.bias", (4 * D,)))
        self.mm2 = (ts.get("mm.2.weight", (vp.n_proj, 4 * D)), ts.get("mm.2.bias", (vp.n_proj,)))

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        vp, P, D = self.vp, self.vp.patch_size, self.vp.n_embd
        gx, gy = pixels.shape[1] // P, pixels.shape[0] // P
        order = merge_order(gx, gy)                                   # patches in merge groups, raster
        inv, ranges = windows(gx, gy, self.window // P // 2)
        order = order.reshape(-1, 4)[inv].reshape(-1)                # groups window by window
        x = (patch_embed(pixels, self.w0, None, P) + patch_embed(pixels, self.w1, None, P))[order]
        rows, cols = order // gx, order % gx
        patch_ranges = [(4 * a, 4 * b) for a, b in ranges]
        for il, L in enumerate(self.layers):
            h = rms_norm(x, L["ln1"], vp.eps)
            q = vision_rope(linear(h, *L["q"]), rows, cols, vp.n_head)
            k = vision_rope(linear(h, *L["k"]), rows, cols, vp.n_head)
            full = (il + 1) % self.pattern == 0
            att = masked_attention(q, k, linear(h, *L["v"]), vp.n_head, [(0, len(x))] if full else patch_ranges)
            x = linear(att, *L["out"]) + x
            h = rms_norm(x, L["ln2"], vp.eps)
            g = linear(h, *L["gate"])
            x = x + linear(g / (1 + np.exp(-g)) * linear(h, *L["up"]), *L["down"])
        x = rms_norm(x, self.post_ln, vp.eps).reshape(-1, 4 * D)
        merged = linear(gelu(linear(x, *self.mm0)), *self.mm2).astype(np.float32)
        out = np.empty_like(merged)
        out[inv] = merged                                             # windowed -> raster groups
        return out
