"""The tiny random-weight sources of tools/make_vision_fixtures.py: a text GGUF and its `mmproj`
GGUF per projector type, in llama.cpp's exact layout (F32, numpy seed 0, drawn in file order),
and the test images. Each writer can neutralize its projector's distinctive feature, so the
generator can show llama.cpp's output changes with it.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from arch_sources import CTX, D, F, Source, bpe_vocab, decoder_hparams

GEMMA3_MARKERS = ("<start_of_image>", "<end_of_image>")
CONTROL = 3  # llama.cpp's token type for control tokens: one id each, never split


def _tokenizer(s: Source, markers: tuple[str, ...], normal: tuple[str, ...] = (), add_bos: bool = True) -> None:
    """The first eight files' 512-token BPE plus each marker as a control token (ids 512..), then
    the normal tokens given (byte-level text, no merge makes them)."""
    v = bpe_vocab()
    s.w.add_tokenizer_model("gpt2")
    s.w.add_tokenizer_pre("smollm")
    s.w.add_token_list(list(v["tokens"]) + list(markers) + list(normal))
    s.w.add_token_types([int(t) for t in v["token_type"]] + [CONTROL] * len(markers) + [1] * len(normal))
    s.w.add_token_merges(v["merges"])
    s.w.add_bos_token_id(v["bos_token_id"])
    s.w.add_eos_token_id(v["eos_token_id"])
    s.w.add_unk_token_id(v["unknown_token_id"])
    s.w.add_pad_token_id(v["padding_token_id"])
    s.w.add_add_bos_token(add_bos)


def gemma3_text(path: Path, window: int = 12) -> None:
    """gemma3: D 256, H 4, KV 2, HD 64, F 512, 2 layers (both sliding, window 12: llama.cpp's
    pattern puts every 6th layer global), QK-norms, post-norms, GELU gate, tied output."""
    s = Source(path, "gemma3", "tiny-gemma3-vision")
    decoder_hparams(s, 2, base=1e6, eps=1e-6, n_rot=64)
    s.key("attention.key_length", 64)
    s.key("attention.value_length", 64)
    s.key("attention.sliding_window", window)
    _tokenizer(s, GEMMA3_MARKERS)
    n_vocab = 512 + len(GEMMA3_MARKERS)
    e = (s.rng.standard_normal((n_vocab, D)) * 0.05).astype(np.float32)
    e[[0, 1, 2]] *= 0.25  # control tokens rarely win: greedy runs reach their length
    s.raw("token_embd.weight", e)
    s.vec("output_norm.weight", D, 5.0)
    for i in range(2):
        p = f"blk.{i}."
        s.vec(p + "attn_norm.weight", D)
        s.mat(p + "attn_q.weight", 4 * 64, D, 3.0)
        s.mat(p + "attn_k.weight", 2 * 64, D, 3.0)
        s.mat(p + "attn_v.weight", 2 * 64, D)
        s.vec(p + "attn_q_norm.weight", 64)
        s.vec(p + "attn_k_norm.weight", 64)
        s.mat(p + "attn_output.weight", D, 4 * 64, 12.0)
        s.vec(p + "post_attention_norm.weight", D, 8.0)
        s.vec(p + "ffn_norm.weight", D)
        s.mat(p + "ffn_gate.weight", F, D)
        s.mat(p + "ffn_up.weight", F, D)
        s.mat(p + "ffn_down.weight", D, F, 12.0)
        s.vec(p + "post_ffw_norm.weight", D, 8.0)
    s.close()


class Mmproj(Source):
    """An `mmproj` GGUF (arch `clip`): clip.vision.* keys with llama.cpp's exact types."""

    def __init__(self, path: Path, projector: str) -> None:
        super().__init__(path, "clip", f"tiny-{projector}-mmproj")
        self.w.add_type("mmproj")
        self.w.add_bool("clip.has_vision_encoder", True)
        self.w.add_string("clip.projector_type", projector)

    def vision(self, **keys) -> None:
        for k, v in keys.items():
            k = k.replace("__", ".")
            if isinstance(v, float):
                self.w.add_float32(f"clip.vision.{k}", v)
            elif isinstance(v, list):
                self.w.add_array(f"clip.vision.{k}", v)
            else:
                self.w.add_uint32(f"clip.vision.{k}", v)  # U32: llama.cpp asserts the type


def gemma3_mmproj(path: Path, neutral: bool = False) -> None:
    """SigLIP: image 64, patch 8, D 64, F 128, 2 layers, 4 heads, pool 2 -> 16 tokens of 256.
    Neutral: mm.soft_emb_norm gains of 1 (the feature: far from 1, per channel)."""
    vd, vf = 64, 128
    s = Mmproj(path, "gemma3")
    s.w.add_bool("clip.use_gelu", True)
    s.vision(image_size=64, patch_size=8, embedding_length=vd, feed_forward_length=vf, block_count=2,
             attention__head_count=4, projection_dim=D, projector__scale_factor=2,
             attention__layer_norm_epsilon=1e-6, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    s.raw("v.patch_embd.weight", s.rng.standard_normal((vd, 3, 8, 8)).astype(np.float32) / math.sqrt(3 * 64))
    s.raw("v.patch_embd.bias", s.rng.standard_normal(vd) * 0.1)
    s.raw("v.position_embd.weight", s.rng.standard_normal((64, vd)))  # N(0,1): positions bind
    for i in range(2):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            s.mat(p + name + ".weight", vd, vd, 2.0 if name in ("attn_q", "attn_k") else 1.0)
            s.raw(p + name + ".bias", s.rng.standard_normal(vd) * 0.1)
        for ln in ("ln1", "ln2"):
            s.vec(p + ln + ".weight", vd)
            s.raw(p + ln + ".bias", s.rng.standard_normal(vd) * 0.1)
        s.mat(p + "ffn_up.weight", vf, vd)
        s.raw(p + "ffn_up.bias", s.rng.standard_normal(vf) * 0.1)
        s.mat(p + "ffn_down.weight", vd, vf)
        s.raw(p + "ffn_down.bias", s.rng.standard_normal(vd) * 0.1)
    s.vec("v.post_ln.weight", vd, 2.0)
    s.raw("v.post_ln.bias", s.rng.standard_normal(vd) * 0.1)
    gains = np.exp(s.rng.standard_normal(vd)).astype(np.float32)  # 0.1 .. 10, stored as 1 + w already
    s.raw("mm.soft_emb_norm.weight", np.ones(vd, np.float32) if neutral else gains)
    w = (s.rng.standard_normal((vd, D)) / math.sqrt(vd)).astype(np.float16)  # numpy (D, n_text), F16 as the converter
    s.w.add_tensor("mm.input_projection.weight", w)
    s.close()


def test_images(out: Path) -> dict[str, Path]:
    """PNG images: smooth gradients with noise, non-square so letterboxing binds (50x37), and a
    larger one that is scaled down (97x130)."""
    from PIL import Image

    rng = np.random.default_rng(1)
    paths = {}
    for name, (w, h) in {"wide": (50, 37), "tall": (97, 130)}.items():
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([255 * x / w, 255 * y / h, 128 + 100 * np.sin(x / 5.0 + y / 7.0)], -1)
        px = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
        paths[name] = out / f"{name}.png"
        Image.fromarray(px, "RGB").save(paths[name])
    return paths


IDEFICS3_MARKERS = ("<fake_token_around_image>", "<global-img>") + tuple(
    f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5))


def idefics3_text(path: Path) -> None:
    """llama (SmolVLM's text model): D 256, H 4, KV 2, 2 layers, untied output; the image tokens
    as control tokens, and "\n\n" as one normal token (llama.cpp looks it up by its text; byte-level
    BPE never merges to it here)."""
    from arch_sources import llama_layers

    s = Source(path, "llama", "tiny-smolvlm")
    decoder_hparams(s, 2, base=1e5, eps=1e-5)
    _tokenizer(s, IDEFICS3_MARKERS, normal=("\u010a\u010a",))
    n_vocab = 512 + len(IDEFICS3_MARKERS) + 1
    s.embedding("token_embd.weight", n_vocab, 1.0, control_rows=(0, 1, 2))
    s.vec("output_norm.weight", D)
    out = s.rng.standard_normal((n_vocab, D)).astype(np.float32) * 4 / math.sqrt(D)
    out[:3] *= 0.25
    out[512:] *= 0.25  # the image tokens rarely win either
    s.raw("output.weight", out)
    llama_layers(s, 2)
    s.close()


def idefics3_mmproj(path: Path, neutral: bool = False) -> None:
    """SigLIP tiles: image 32, patch 8, D 64, 2 layers, 4 heads, pixel shuffle 2 -> 4 tokens of 256
    per tile; longest edge 64 -> up to 2 x 2 tiles and the overview. Neutral: the shuffle's
    feature groups carry the same weights (fc columns tiled), so the shuffle order cannot matter."""
    vd, vf, s2 = 64, 128, 4
    s = Mmproj(path, "idefics3")
    s.w.add_bool("clip.use_gelu", True)
    s.vision(image_size=32, patch_size=8, embedding_length=vd, feed_forward_length=vf, block_count=2,
             attention__head_count=4, projection_dim=D, projector__scale_factor=2, preproc_image_size=64,
             attention__layer_norm_epsilon=1e-6, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    s.raw("v.patch_embd.weight", s.rng.standard_normal((vd, 3, 8, 8)).astype(np.float32) / math.sqrt(3 * 64))
    s.raw("v.patch_embd.bias", s.rng.standard_normal(vd) * 0.1)
    s.raw("v.position_embd.weight", s.rng.standard_normal((16, vd)))
    for i in range(2):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            s.mat(p + name + ".weight", vd, vd, 2.0 if name in ("attn_q", "attn_k") else 1.0)
            s.raw(p + name + ".bias", s.rng.standard_normal(vd) * 0.1)
        for ln in ("ln1", "ln2"):
            s.vec(p + ln + ".weight", vd)
            s.raw(p + ln + ".bias", s.rng.standard_normal(vd) * 0.1)
        s.mat(p + "ffn_up.weight", vf, vd)
        s.raw(p + "ffn_up.bias", s.rng.standard_normal(vf) * 0.1)
        s.mat(p + "ffn_down.weight", vd, vf)
        s.raw(p + "ffn_down.bias", s.rng.standard_normal(vd) * 0.1)
    s.vec("v.post_ln.weight", vd, 2.0)
    s.raw("v.post_ln.bias", s.rng.standard_normal(vd) * 0.1)
    fc = (s.rng.standard_normal((D, vd * s2)) * 2 / math.sqrt(vd * s2)).astype(np.float32)
    if neutral:
        fc = np.tile(fc[:, :vd], (1, s2))
    s.raw("mm.model.fc.weight", fc)
    s.close()


LFM2_MARKERS = ("<|image_start|>", "<|image_end|>", "<|img_thumbnail|>") + tuple(
    f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4))


def lfm2_text(path: Path) -> None:
    """lfm2 (LFM2-VL's text model): arch_sources.lfm2's hybrid (short convolutions and attention),
    with the image tokens as control tokens."""
    from arch_sources import HD, KV, LFM2_KV, LFM2_TAPS, H

    s = Source(path, "lfm2", "tiny-lfm2-vl")
    decoder_hparams(s, len(LFM2_KV), 1e6, kv=list(LFM2_KV))
    s.key("shortconv.l_cache", LFM2_TAPS)
    _tokenizer(s, LFM2_MARKERS)
    n_vocab = 512 + len(LFM2_MARKERS)
    s.embedding("token_embd.weight", n_vocab, 0.25, control_rows=(0, 1, 2) + tuple(range(512, n_vocab)))
    s.vec("token_embd_norm.weight", D)
    for i, kv in enumerate(LFM2_KV):
        p = f"blk.{i}."
        s.vec(p + "attn_norm.weight", D)
        if kv:
            s.mat(p + "attn_q.weight", H * HD, D)
            s.mat(p + "attn_k.weight", KV * HD, D)
            s.mat(p + "attn_v.weight", KV * HD, D)
            s.vec(p + "attn_q_norm.weight", HD)
            s.vec(p + "attn_k_norm.weight", HD)
            s.mat(p + "attn_output.weight", D, H * HD)
        else:
            s.mat(p + "shortconv.in_proj.weight", 3 * D, D, 2.0)
            s.raw(p + "shortconv.conv.weight", s.rng.standard_normal((D, LFM2_TAPS)).astype(np.float32))
            s.mat(p + "shortconv.out_proj.weight", D, D)
        s.vec(p + "ffn_norm.weight", D)
        s.mat(p + "ffn_gate.weight", F, D)
        s.mat(p + "ffn_up.weight", F, D)
        s.mat(p + "ffn_down.weight", D, F)
    s.close()


def lfm2_mmproj(path: Path, neutral: bool = False) -> None:
    """SigLIP2-NaFlex: patch 8, a 4 x 4 position table resized to each image's patch grid
    (bilinear, antialiased), D 64, 2 layers, pixel unshuffle 2, LayerNorm, mm.1 -> GELU -> mm.2.
    Neutral: a constant position table (the resize then cannot matter)."""
    vd, vf = 64, 128
    s = Mmproj(path, "lfm2")
    s.w.add_bool("clip.use_gelu", True)
    s.vision(image_size=256, patch_size=8, embedding_length=vd, feed_forward_length=vf, block_count=2,
             attention__head_count=4, projection_dim=D, projector__scale_factor=2,
             attention__layer_norm_epsilon=1e-6, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    s.raw("v.patch_embd.weight", s.rng.standard_normal((vd, 3, 8, 8)).astype(np.float32) / math.sqrt(3 * 64))
    s.raw("v.patch_embd.bias", s.rng.standard_normal(vd) * 0.1)
    pos = s.rng.standard_normal((16, vd)).astype(np.float32)
    s.raw("v.position_embd.weight", np.tile(pos[:1], (16, 1)) if neutral else pos)
    for i in range(2):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            s.mat(p + name + ".weight", vd, vd, 2.0 if name in ("attn_q", "attn_k") else 1.0)
            s.raw(p + name + ".bias", s.rng.standard_normal(vd) * 0.1)
        for ln in ("ln1", "ln2"):
            s.vec(p + ln + ".weight", vd)
            s.raw(p + ln + ".bias", s.rng.standard_normal(vd) * 0.1)
        s.mat(p + "ffn_up.weight", vf, vd)
        s.raw(p + "ffn_up.bias", s.rng.standard_normal(vf) * 0.1)
        s.mat(p + "ffn_down.weight", vd, vf)
        s.raw(p + "ffn_down.bias", s.rng.standard_normal(vd) * 0.1)
    s.vec("v.post_ln.weight", vd, 2.0)
    s.raw("v.post_ln.bias", s.rng.standard_normal(vd) * 0.1)
    s.vec("mm.input_norm.weight", 4 * vd)
    s.raw("mm.input_norm.bias", s.rng.standard_normal(4 * vd) * 0.1)
    s.mat("mm.1.weight", 4 * vd, 4 * vd)
    s.raw("mm.1.bias", s.rng.standard_normal(4 * vd) * 0.1)
    s.mat("mm.2.weight", D, 4 * vd)
    s.raw("mm.2.bias", s.rng.standard_normal(D) * 0.1)
    s.close()


QWEN_MARKERS = ("<|vision_start|>", "<|vision_end|>")


def qwen35_text(path: Path) -> None:
    """qwen35 (Qwen3.5, natively multimodal): arch_sources.qwen35 (IMROPE over 32 of 64 dims, sections
    [6, 5, 5, 0]) with the vision markers as control tokens."""
    from arch_sources import qwen35

    qwen35(path, False, tokenizer=lambda s: _tokenizer(s, QWEN_MARKERS, add_bos=False),
           n_vocab=512 + len(QWEN_MARKERS))


def qwen3vl_mmproj(path: Path, neutral: bool = False) -> None:
    """qwen3vl_merger without deepstack (Qwen3.5's): patch 8, two temporal conv slices + bias, a 4 x 4
    position table (image_size 32) resized with align-corners to each image's grid, fused QKV,
    2D vision RoPE, LayerNorm, GELU, post-LN, the 2 x 2 merger mm.0 -> GELU -> mm.2. D 64 (16 per
    head: 4 heads). Neutral: the second temporal slice zero (the images' rows then differ)."""
    vd, vf = 64, 128
    s = Mmproj(path, "qwen3vl_merger")
    s.w.add_bool("clip.use_gelu", True)
    s.vision(image_size=32, patch_size=8, embedding_length=vd, feed_forward_length=vf, block_count=2,
             attention__head_count=4, projection_dim=D, spatial_merge_size=2,
             attention__layer_norm_epsilon=1e-6, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    s.raw("v.patch_embd.weight", s.rng.standard_normal((vd, 3, 8, 8)).astype(np.float32) / math.sqrt(3 * 64))
    w1 = s.rng.standard_normal((vd, 3, 8, 8)).astype(np.float32) / math.sqrt(3 * 64)
    s.raw("v.patch_embd.weight.1", np.zeros_like(w1) if neutral else w1)
    s.raw("v.patch_embd.bias", s.rng.standard_normal(vd) * 0.1)
    s.raw("v.position_embd.weight", s.rng.standard_normal((16, vd)))
    for i in range(2):
        p = f"v.blk.{i}."
        s.mat(p + "attn_qkv.weight", 3 * vd, vd, 2.0)
        s.raw(p + "attn_qkv.bias", s.rng.standard_normal(3 * vd) * 0.1)
        s.mat(p + "attn_out.weight", vd, vd)
        s.raw(p + "attn_out.bias", s.rng.standard_normal(vd) * 0.1)
        for ln in ("ln1", "ln2"):
            s.vec(p + ln + ".weight", vd)
            s.raw(p + ln + ".bias", s.rng.standard_normal(vd) * 0.1)
        s.mat(p + "ffn_up.weight", vf, vd)
        s.raw(p + "ffn_up.bias", s.rng.standard_normal(vf) * 0.1)
        s.mat(p + "ffn_down.weight", vd, vf)
        s.raw(p + "ffn_down.bias", s.rng.standard_normal(vd) * 0.1)
    s.vec("v.post_ln.weight", vd, 2.0)
    s.raw("v.post_ln.bias", s.rng.standard_normal(vd) * 0.1)
    s.mat("mm.0.weight", 4 * vd, 4 * vd)
    s.raw("mm.0.bias", s.rng.standard_normal(4 * vd) * 0.1)
    s.mat("mm.2.weight", D, 4 * vd)
    s.raw("mm.2.bias", s.rng.standard_normal(D) * 0.1)
    s.close()


def qwen2vl_text(path: Path) -> None:
    """qwen2vl (Qwen2.5-VL's text model): qwen2 with Q/K/V biases and M-RoPE sections [8, 12, 12, 0]
    over the head's 64 dims; D 256, H 4, KV 2, 2 layers, untied output; the vision markers."""
    from arch_sources import HD, KV, H

    s = Source(path, "qwen2vl", "tiny-qwen2.5-vl")
    decoder_hparams(s, 2, base=1e6, eps=1e-6)
    s.w.add_rope_dimension_sections([8, 12, 12, 0])
    _tokenizer(s, QWEN_MARKERS, add_bos=False)
    n_vocab = 512 + len(QWEN_MARKERS)
    s.embedding("token_embd.weight", n_vocab, 1.0, control_rows=(0, 1, 2, 512, 513))
    s.vec("output_norm.weight", D)
    out = s.rng.standard_normal((n_vocab, D)).astype(np.float32) * 4 / math.sqrt(D)
    out[[0, 1, 2, 512, 513]] *= 0.25
    s.raw("output.weight", out)
    for i in range(2):  # llama_layers' tensors plus qwen2's q/k/v biases
        p = f"blk.{i}."
        s.vec(p + "attn_norm.weight", D)
        for name, rows in (("attn_q", H * HD), ("attn_k", KV * HD), ("attn_v", KV * HD)):
            s.mat(p + name + ".weight", rows, D)
            s.raw(p + name + ".bias", s.rng.standard_normal(rows) * 0.5)
        s.mat(p + "attn_output.weight", D, H * HD)
        s.vec(p + "ffn_norm.weight", D)
        s.mat(p + "ffn_gate.weight", F, D)
        s.mat(p + "ffn_up.weight", F, D)
        s.mat(p + "ffn_down.weight", D, F)
    s.close()


def qwen25vl_mmproj(path: Path, neutral: bool = False) -> None:
    """qwen2.5vl_merger: patch 4, two temporal conv slices (no bias), D 64 (4 heads of 16), 2 layers:
    layer 0 attends inside llama.cpp's 112-pixel windows (it reads no window size for this
    projector: 14 x 14 merge groups at patch 4, so the 97 x 130 image has two), layer 1 to every
    patch (n_wa_pattern 2); RMSNorm, SwiGLU with biases, CLIP mean/std. Neutral: n_wa_pattern 3,
    both layers inside windows (llama.cpp aborts on n_wa_pattern 1, where no layer uses the mask)."""
    vd, vf = 64, 128
    s = Mmproj(path, "qwen2.5vl_merger")
    s.w.add_bool("clip.use_silu", True)
    s.vision(image_size=32, patch_size=4, embedding_length=vd, feed_forward_length=vf, block_count=2,
             attention__head_count=4, projection_dim=D, n_wa_pattern=3 if neutral else 2,
             attention__layer_norm_epsilon=1e-6, image_mean=[0.48145466, 0.4578275, 0.40821073],
             image_std=[0.26862954, 0.26130258, 0.27577711])
    s.raw("v.patch_embd.weight", s.rng.standard_normal((vd, 3, 4, 4)).astype(np.float32) / math.sqrt(3 * 16))
    s.raw("v.patch_embd.weight.1", s.rng.standard_normal((vd, 3, 4, 4)).astype(np.float32) / math.sqrt(3 * 16))
    for i in range(2):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            s.mat(p + name + ".weight", vd, vd, 2.0 if name in ("attn_q", "attn_k") else 1.0)
            s.raw(p + name + ".bias", s.rng.standard_normal(vd) * 0.1)
        s.vec(p + "ln1.weight", vd)
        s.vec(p + "ln2.weight", vd)
        for name, shape in (("ffn_gate", (vf, vd)), ("ffn_up", (vf, vd)), ("ffn_down", (vd, vf))):
            s.mat(p + name + ".weight", *shape)
            s.raw(p + name + ".bias", s.rng.standard_normal(shape[0]) * 0.1)
    s.vec("v.post_ln.weight", vd, 2.0)
    s.mat("mm.0.weight", 4 * vd, 4 * vd)
    s.raw("mm.0.bias", s.rng.standard_normal(4 * vd) * 0.1)
    s.mat("mm.2.weight", D, 4 * vd)
    s.raw("mm.2.bias", s.rng.standard_normal(D) * 0.1)
    s.close()


PROJECTORS = {"gemma3": (gemma3_text, gemma3_mmproj, "feature: mm.soft_emb_norm gains"),
              "qwen25vl": (qwen2vl_text, qwen25vl_mmproj, "feature: window attention"),
              "qwen3vl": (qwen35_text, qwen3vl_mmproj, "feature: the second temporal conv slice"),
              "lfm2": (lfm2_text, lfm2_mmproj, "feature: the position table resized to the image"),
              "idefics3": (idefics3_text, idefics3_mmproj, "feature: the pixel shuffle's feature order")}
__all__ = ["CTX", "PROJECTORS", "gemma3_mmproj", "gemma3_text", "idefics3_mmproj", "idefics3_text", "test_images"]
