"""gemma3 (Gemma 3 4B/12B/27B): SigLIP over a size x size letterboxed input (bilinear), post-LN,
an average pool of merge x merge patches, RMSNorm times mm.soft_emb_norm (stored as 1 + w), then
mm.input_projection (numpy (D, n_text), F16). Tokens: (S / P / merge)^2, always; in the decoder
between <start_of_image> and <end_of_image>, unscaled, attending to each other both ways.
"""
from __future__ import annotations

import numpy as np

from ...media import preprocess
from .clip import Tensors, VisionParams
from .vit import layer_norm, load_layers, patch_embed, rms_norm, vit

MARKERS = ("<start_of_image>", "<end_of_image>")
CAUSAL = False  # the image's rows see each other both ways (llama_set_causal_attn false)


class Encoder:
    def __init__(self, ts: Tensors, vp: VisionParams) -> None:
        D, P, S = vp.n_embd, vp.patch_size, vp.image_size
        self.vp = vp
        self.grid = S // P
        self.merge = vp.merge or 4
        if self.grid % self.merge:
            raise ValueError(f"gemma3: a {self.grid}-patch grid does not pool by {self.merge}")
        self.n_tokens = (self.grid // self.merge) ** 2
        self.patch_w = ts.get("v.patch_embd.weight", (D, 3, P, P))
        self.patch_b = ts.get("v.patch_embd.bias", (D,))
        self.pos = ts.get("v.position_embd.weight", (self.grid * self.grid, D))
        self.layers = load_layers(ts, vp)
        self.post_ln = (ts.get("v.post_ln.weight", (D,)), ts.get("v.post_ln.bias", (D,)))
        self.soft_norm = ts.get("mm.soft_emb_norm.weight", (D,))
        self.proj = ts.get("mm.input_projection.weight", (D, vp.n_proj), f16=True)

    def tokens(self, image) -> int:
        return self.n_tokens

    def layout(self, image) -> list[tuple]:
        """The image in the prompt (mtmd.cpp): its rows between the begin and end strings."""
        return [("text", MARKERS[0]), ("rows", self.n_tokens), ("text", MARKERS[1])]

    def pixels(self, image) -> np.ndarray:
        vp = self.vp
        return preprocess.fixed_size(image, vp.image_size, "bilinear", vp.mean, vp.std)

    def embed(self, image) -> np.ndarray:
        """(n_tokens, n_proj) rows of image, in layout order."""
        return self.encode(self.pixels(image))

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """(S, S, 3) float32 -> (n_tokens, n_proj) float32."""
        vp, g, k = self.vp, self.grid, self.merge
        x = patch_embed(pixels, self.patch_w, self.patch_b, vp.patch_size) + self.pos
        x = vit(x, self.layers, vp)
        x = layer_norm(x, *self.post_ln, vp.eps)
        pooled = x.reshape(g // k, k, g // k, k, -1).sum(axis=(1, 3), dtype=np.float32) / np.float32(k * k)
        x = rms_norm(pooled.reshape(-1, vp.n_embd), self.soft_norm, vp.eps)
        return (x.astype(np.float16).astype(np.float32) @ self.proj.astype(np.float32)).astype(np.float32)
