"""A random-weight GGUF of gpt-oss-20b's real shape, as its released MXFP4 file is laid out, for
speed and memory at the size people run: 24 layers, 2880 hidden, 64/8 heads x 64, 32 experts of
width 2880 (4 chosen per token) in MXFP4, sliding window 128 on every other layer, attention
sinks, biases, YaRN (factor 32 of 4096), a 201088-token vocabulary, untied output. Expert
matrices are MXFP4 as llama.cpp's MXFP4_MOE quantization leaves them, every other matrix Q8_0,
norms, biases, sinks and the router F32 (20.9B parameters, ~12.1 GB). The outputs mean nothing;
the bytes a token reads, the shapes and the routing work are the real model's.

The quantized blocks are written directly (random 4-bit values under E8M0 scales near 2^-5,
random int8 under f16 scales near 1/1024), tensor by tensor: a 21B-parameter F16 source for
llama.cpp's quantizer would be 42 GB. The vocabulary is the tiny fixtures' 512 byte-level BPE
tokens, harmony's control tokens and reserved control tokens up to 201088 (no benchmark
tokenizes); the chat template is the released one.

    python benchmarks/gpt_oss_shape.py OUT.gguf [--layers 24]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
L, D, H, KV, HD, NE, NU, FE, V = 24, 2880, 64, 8, 64, 32, 4, 2880, 201088
WINDOW, BASE = 128, 150000.0


def _mxfp4(rng, shape: tuple[int, ...]) -> np.ndarray:
    """(..., rows, cols) as MXFP4 blocks: (..., rows, cols / 32 * 17) bytes, E8M0 then 16 bytes."""
    *lead, cols = shape
    nb = int(np.prod(lead)) * (cols // 32)
    blocks = rng.integers(0, 256, (nb, 17), dtype=np.uint8)
    blocks[:, 0] = rng.integers(121, 125, nb, dtype=np.uint8)  # 2^-6 .. 2^-3
    return blocks.reshape(*lead, cols // 32 * 17)


def _q8_0(rng, rows: int, cols: int) -> np.ndarray:
    nb = rows * (cols // 32)
    blocks = rng.integers(-128, 128, (nb, 34), dtype=np.int16).astype(np.int8).view(np.uint8)
    d = (rng.uniform(0.5, 1.5, nb) / 1024).astype(np.float16).view(np.uint8).reshape(nb, 2)
    blocks[:, :2] = d
    return blocks.reshape(rows, cols // 32 * 34)


def write(path: Path, n_layer: int = L, seed: int = 0) -> Path:
    import gguf

    from rase.store.gguf import GGUFFile
    from tools.arch_sources import HARMONY_TOKENS

    src = GGUFFile(ROOT / "tests" / "fixtures" / "archs" / "gpt-oss-tiny-mxfp4.gguf")
    tokens = list(src.get("tokenizer.ggml.tokens"))
    assert tokens[512:] == HARMONY_TOKENS
    tokens += [f"<|reserved_{i}|>" for i in range(V - len(tokens))]
    types = [int(t) for t in src.get("tokenizer.ggml.token_type")] + [3] * (V - 520)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_name("random-gpt-oss-20b-shape")
    for key, value in (("context_length", 131072), ("embedding_length", D), ("block_count", n_layer),
                       ("feed_forward_length", FE), ("attention.head_count", H), ("attention.head_count_kv", KV),
                       ("attention.key_length", HD), ("attention.value_length", HD), ("expert_count", NE),
                       ("expert_used_count", NU), ("expert_feed_forward_length", FE),
                       ("attention.sliding_window", WINDOW), ("rope.scaling.original_context_length", 4096)):
        w.add_uint32(f"gpt-oss.{key}", value)
    w.add_float32("gpt-oss.rope.freq_base", BASE)
    w.add_float32("gpt-oss.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("gpt-oss.rope.scaling.type", "yarn")
    w.add_float32("gpt-oss.rope.scaling.factor", 32.0)
    w.add_file_type(38)  # MOSTLY_MXFP4_MOE
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(src.get("tokenizer.ggml.merges")))
    w.add_bos_token_id(tokens.index("<|startoftext|>"))
    w.add_eos_token_id(tokens.index("<|return|>"))
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(src.get("tokenizer.chat_template"))

    Q8, MX, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4, gguf.GGMLQuantizationType.F32
    plan: list[tuple[str, object]] = []  # (name, maker) in file order; tensors are made when written

    def q8(name, rows, cols):
        plan.append((name, lambda: _q8_0(rng, rows, cols)))
        w.add_tensor_info(name, (rows, cols // 32 * 34), np.dtype(np.uint8), rows * cols // 32 * 34, Q8)

    def mx(name, rows, cols):
        plan.append((name, lambda: _mxfp4(rng, (NE, rows, cols))))
        w.add_tensor_info(name, (NE, rows, cols // 32 * 17), np.dtype(np.uint8), NE * rows * cols // 32 * 17, MX)

    def f32(name, shape, mean=0.0, sd=0.1):
        plan.append((name, lambda: (mean + sd * rng.standard_normal(shape)).astype(np.float32)))
        w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)), F32)

    q8("token_embd.weight", V, D)
    f32("output_norm.weight", (D,), 1.0)
    q8("output.weight", V, D)
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", (D,), 1.0)
        for name, rows in (("attn_q", H * HD), ("attn_k", KV * HD), ("attn_v", KV * HD)):
            q8(p + name + ".weight", rows, D)
            f32(p + name + ".bias", (rows,))
        q8(p + "attn_output.weight", D, H * HD)
        f32(p + "attn_output.bias", (D,))
        f32(p + "attn_sinks.weight", (H,), 0.0, 1.0)
        f32(p + "post_attention_norm.weight", (D,), 1.0)
        f32(p + "ffn_gate_inp.weight", (NE, D), 0.0, D ** -0.5)
        f32(p + "ffn_gate_inp.bias", (NE,))
        for name, rows, cols in (("ffn_gate_exps", FE, D), ("ffn_up_exps", FE, D), ("ffn_down_exps", D, FE)):
            mx(p + name + ".weight", rows, cols)
            f32(p + name + ".bias", (NE, rows))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, make in plan:
        w.write_tensor_data(make())
    w.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=L)
    a = ap.parse_args()
    print(write(Path(a.out), a.layers))


if __name__ == "__main__":
    main()
