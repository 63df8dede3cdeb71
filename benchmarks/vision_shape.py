"""Random-weight vision towers of real shape, for speed: an mmproj GGUF in llama.cpp's layout (F16
matrices, as the converter writes real ones) and a small text model of the width it projects to
(two layers: llama-mtmd-cli needs one to load the pair; its own timing splits encode and decode).

    python benchmarks/vision_shape.py OUT_DIR gemma3-4b

gemma3-4b: SigLIP-So400m, 896 x 896, patch 14, D 1152, 27 layers, 16 heads, FFN 4304, pooled to
256 tokens of 2560 (Gemma 3 4B's width).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

SHAPES = {"gemma3-4b": dict(S=896, P=14, D=1152, L=27, H=16, F=4304, text=2560, pool=4)}


def write_mmproj(path: Path, s: dict, seed: int = 0) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    D, F, P, n_pos = s["D"], s["F"], s["P"], (s["S"] // s["P"]) ** 2
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type("mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.use_gelu", True)
    for k, v in {"image_size": s["S"], "patch_size": P, "embedding_length": D, "feed_forward_length": F,
                 "block_count": s["L"], "attention.head_count": s["H"], "projection_dim": s["text"],
                 "projector.scale_factor": s["pool"]}.items():
        w.add_uint32(f"clip.vision.{k}", v)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5] * 3)
    w.add_array("clip.vision.image_std", [0.5] * 3)

    def mat(name, rows, cols, dtype=np.float16):
        w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) / math.sqrt(cols)).astype(dtype))

    def vec(name, n, mean=0.0):
        w.add_tensor(name, (mean + 0.1 * rng.standard_normal(n)).astype(np.float32))

    w.add_tensor("v.patch_embd.weight", (rng.standard_normal((D, 3, P, P), dtype=np.float32) / math.sqrt(3 * P * P)))
    vec("v.patch_embd.bias", D)
    w.add_tensor("v.position_embd.weight", rng.standard_normal((n_pos, D), dtype=np.float32))
    for i in range(s["L"]):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(p + name + ".weight", D, D)
            vec(p + name + ".bias", D)
        for ln in ("ln1", "ln2"):
            vec(p + ln + ".weight", D, 1.0)
            vec(p + ln + ".bias", D)
        mat(p + "ffn_up.weight", F, D)
        vec(p + "ffn_up.bias", F)
        mat(p + "ffn_down.weight", D, F)
        vec(p + "ffn_down.bias", D)
    vec("v.post_ln.weight", D, 1.0)
    vec("v.post_ln.bias", D)
    vec("mm.soft_emb_norm.weight", D, 1.0)
    mat("mm.input_projection.weight", D, s["text"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_text(path: Path, width: int) -> None:
    """A 2-layer gemma3 of the projector's width and the tiny fixtures' vocabulary (with the
    image markers): only its width matters to the encoder."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import arch_sources
    import vision_sources

    saved = arch_sources.D
    try:
        arch_sources.D = vision_sources.D = width
        vision_sources.gemma3_text(path)
    finally:
        arch_sources.D = vision_sources.D = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("shape", choices=SHAPES)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    s = SHAPES[a.shape]
    write_mmproj(a.out / f"{a.shape}-mmproj.gguf", s)
    write_text(a.out / f"{a.shape}-text.gguf", s["text"])
    print(a.out / f"{a.shape}-mmproj.gguf", a.out / f"{a.shape}-text.gguf")


if __name__ == "__main__":
    main()
