"""The shared pieces of llama.cpp's vision encoders (clip.cpp build_vit, build_attn, build_ffn),
computed as ggml's CPU backend does where it rounds: the patch embedding is im2col into F16 then
a matmul (pixels and kernel both F16), LayerNorm / RMSNorm sums in double, GELU through ggml's
F16 table, an F16 weight's activations rounded to F16. Attention is bidirectional, f32,
softmax(Q K^T / sqrt(d)) V (llama.cpp with flash attention off). Matmuls run in float32 BLAS
(the GIL released); their summation order differs from ggml's by a few ulps.

Shapes: x (n_patch, D) float32, patches in raster order (x fastest).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...kernels import _kernels
from .clip import Tensors, VisionParams


@dataclass
class Layer:
    ln1: tuple
    ln2: tuple
    q: tuple
    k: tuple
    v: tuple
    out: tuple
    up: tuple
    down: tuple
    gate: tuple | None = None


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x @ w.T (+ b): w (rows, cols) float32, or float16 (x rounded to F16 first, as ggml's
    F16 matmul converts its activations)."""
    if w.dtype == np.float16:
        y = x.astype(np.float16).astype(np.float32) @ w.astype(np.float32).T
    else:
        y = x @ w.T
    return y if b is None else y + b


def layer_norm(x: np.ndarray, w, b, eps: float) -> np.ndarray:
    """ggml_norm (the sum, and the float squares of the centred values, summed in double) times w plus b."""
    n = x.shape[-1]
    mean = (x.sum(axis=-1, keepdims=True, dtype=np.float64) / n).astype(np.float32)
    c = x - mean
    var = (c * c).sum(axis=-1, keepdims=True, dtype=np.float64) / n
    y = c * (np.float32(1.0) / np.sqrt((var + eps).astype(np.float32)))
    y = y * w
    return y if b is None else y + b


def rms_norm(x: np.ndarray, w, eps: float) -> np.ndarray:
    """ggml_rms_norm (sum of squares in double) times w."""
    ms = (x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True)
    return (x * (np.float32(1.0) / np.sqrt((ms + eps).astype(np.float32)))) * w


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU (tanh form) as ggml's CPU computes it: the F16 table for |x| < 10 (rase's kernel)."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    return _kernels.gate(flat, np.ones_like(flat), True).reshape(x.shape)


def patch_embed(pixels: np.ndarray, w: np.ndarray, b: np.ndarray | None, patch: int) -> np.ndarray:
    """pixels (H, W, 3) float32 -> (n_patch, D): ggml_conv_2d, stride = kernel = patch."""
    h, wd = pixels.shape[0] // patch, pixels.shape[1] // patch
    planes = pixels.transpose(2, 0, 1)[:, :h * patch, :wd * patch]  # (3, H, W), the graph's input
    cols = planes.reshape(3, h, patch, wd, patch).transpose(1, 3, 0, 2, 4).reshape(h * wd, -1)
    kern = w.reshape(w.shape[0], -1)
    y = cols.astype(np.float16).astype(np.float32) @ kern.astype(np.float16).astype(np.float32).T
    return y if b is None else y + b


ATTN_ROWS = 256  # queries per block of scores (256 x 4096 floats: 4 MiB)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_head: int) -> np.ndarray:
    """Bidirectional multi-head attention over every patch: (n, D) each -> (n, D), a head at a
    time on contiguous operands (BLAS for both products), the softmax in place."""
    n, d = q.shape
    hd = d // n_head
    out = np.empty((n, d), np.float32)
    scale = np.float32(1.0 / np.sqrt(hd))
    for h in range(n_head):
        sl = slice(h * hd, (h + 1) * hd)
        kt, vh = np.ascontiguousarray(k[:, sl].T), np.ascontiguousarray(v[:, sl])
        for r in range(0, n, ATTN_ROWS):  # a block of queries: its scores stay in cache
            s = q[r:r + ATTN_ROWS, sl] @ kt
            s *= scale
            s -= s.max(axis=1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=1, keepdims=True)
            out[r:r + ATTN_ROWS, sl] = s @ vh
    return out


def load_layers(ts: Tensors, vp: VisionParams) -> list[Layer]:
    """v.blk.N.*: LayerNorm ln1/ln2 (weight, bias), q/k/v/out and up/(gate)/down with biases."""
    D, F = vp.n_embd, vp.n_ff

    def pair(name, shape, bias=True):
        b = ts.get(name + ".bias", shape[:1]) if bias and ts.has(name + ".bias") else None
        return ts.get(name + ".weight", shape), b

    out = []
    for il in range(vp.n_layer):
        p = f"v.blk.{il}."
        out.append(Layer(pair(p + "ln1", (D,)), pair(p + "ln2", (D,)), pair(p + "attn_q", (D, D)),
                         pair(p + "attn_k", (D, D)), pair(p + "attn_v", (D, D)), pair(p + "attn_out", (D, D)),
                         pair(p + "ffn_up", (F, D)), pair(p + "ffn_down", (D, F)),
                         pair(p + "ffn_gate", (F, D)) if ts.has(p + "ffn_gate.weight") else None))
    return out


def vit(x: np.ndarray, layers: list[Layer], vp: VisionParams, norm=layer_norm) -> np.ndarray:
    """build_vit's layers: ln1 -> attention -> + residual -> ln2 -> FFN -> + residual."""
    for L in layers:
        h = norm(x, *L.ln1, vp.eps)
        att = attention(linear(h, *L.q), linear(h, *L.k), linear(h, *L.v), vp.n_head)
        x = linear(att, *L.out) + x
        h = norm(x, *L.ln2, vp.eps)
        up = linear(h, *L.up)
        if L.gate is not None:
            act = linear(h, *L.gate)
            h = (gelu(act) if vp.act == "gelu" else act / (1 + np.exp(-act))) * up
        else:
            h = gelu(up) if vp.act == "gelu" else up / (1 + np.exp(-up)) if vp.act == "silu" else \
                up / (1 + np.exp(-1.702 * up))
        x = x + linear(h, *L.down)
    return x


def pixel_shuffle(x: np.ndarray, grid_x: int, grid_y: int, s: int) -> np.ndarray:
    """build_patch_merge_permute: (grid_y * grid_x, D) raster patches -> ((grid_y/s) * (grid_x/s),
    s*s*D), output token (X, Y) in raster order holding patch (sX + dx, sY + dy) at features
    (dy * s + dx) * D .. + D; odd sides padded with zero patches at the right and bottom."""
    d = x.shape[1]
    px, py = -grid_x % s, -grid_y % s
    if px or py:
        x = np.pad(x.reshape(grid_y, grid_x, d), ((0, py), (0, px), (0, 0))).reshape(-1, d)
        grid_x, grid_y = grid_x + px, grid_y + py
    g = x.reshape(grid_y // s, s, grid_x // s, s, d)          # [Y, dy, X, dx, c]
    return g.transpose(0, 2, 1, 3, 4).reshape((grid_y // s) * (grid_x // s), s * s * d)


def resize_positions_antialias(table: np.ndarray, width: int, height: int) -> np.ndarray:
    """clip.cpp resize_position_embeddings with ggml_interpolate (bilinear, antialias, half-pixel
    centres), float32 as ggml's CPU loop: (n*n, D) rows of an n x n grid -> (height*width, D) raster."""
    n = int(round(np.sqrt(table.shape[0])))
    if (width, height) == (n, n):
        return table
    grid = table.reshape(n, n, -1)  # [y][x]
    f32 = np.float32
    sf0, sf1 = f32(width) / f32(n), f32(height) / f32(n)
    sup0, sup1 = max(f32(1), f32(1) / sf0), max(f32(1), f32(1) / sf1)
    inv0, inv1 = f32(1) / sup0, f32(1) / sup1
    half = f32(0.5)
    out = np.empty((height, width, table.shape[1]), np.float32)
    for i1 in range(height):
        y = (f32(i1) + half) / sf1
        y0, y1 = max(int(y - sup1 + half), 0), min(int(y + sup1 + half), n)
        for i0 in range(width):
            x = (f32(i0) + half) / sf0
            x0, x1 = max(int(x - sup0 + half), 0), min(int(x + sup0 + half), n)
            val, total = np.zeros(table.shape[1], np.float32), f32(0)
            for sy in range(y0, y1):
                wy = max(f32(1) - abs((f32(sy) - y + half) * inv1), f32(0))
                for sx in range(x0, x1):
                    wx = max(f32(1) - abs((f32(sx) - x + half) * inv0), f32(0))
                    wgt = f32(wx * wy)
                    if wgt <= 0:
                        continue
                    val += grid[sy, sx] * wgt
                    total = f32(total + wgt)
            out[i1, i0] = val / total if total > 0 else val
    return out.reshape(height * width, -1)
