"""A random-weight GGUF of a Qwen3.5-2B-class shape, for speed at a realistic size: 24 layers (a
gated full-attention layer after every three gated delta nets), 2048 hidden, attention 8 query /
2 KV heads of 256 with partial interleaved multi-section RoPE (64 dims, sections 11/11/10),
delta nets of 16 key and 16 value heads of 128 with a 4-tap conv, FFN 6144, a 248320-token
vocabulary with the output tied to the embedding. These dims are the family's pattern (llama.cpp
calls a 24-layer qwen35 of hidden != 1024 the 2B), not a published config: the bytes a token
reads and the recurrent work are a 2B's, not to the last matrix. The vocabulary is the tiny
fixtures' 512 byte-level BPE tokens and reserved control tokens (no benchmark tokenizes).

    python benchmarks/qwen35_shape.py OUT_DIR [--quant q4_k_m q8_0 ...] [--keep-f16]

Writes OUT_DIR/qwen35-2b-shape-f16.gguf, then each quantization with llama.cpp's own quantizer,
e.g. OUT_DIR/qwen35-2b-shape-q4_k_m.gguf.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHAPE = dict(layers=24, d=2048, heads=8, kv=2, hd=256, rot=64, ff=6144, vocab=248320, conv=4, s=128, hk=16, hv=16)
SECTIONS = [11, 11, 10, 0]
FTYPES = ("q4_k_m", "q8_0")  # of sized_model.FTYPES


def write_f16(path: Path, shape: dict = SHAPE, seed: int = 0) -> Path:
    import gguf

    from rase.store.gguf import GGUFFile

    L, D, V = shape["layers"], shape["d"], shape["vocab"]
    S, Hk, Hv = shape["s"], shape["hk"], shape["hv"]
    src = GGUFFile(ROOT / "tests" / "fixtures" / "archs" / "qwen35-tiny-q8_0.gguf")
    tokens = list(src.get("tokenizer.ggml.tokens")) + [f"<|reserved_{i}|>" for i in range(V - 512)]
    types = [int(t) for t in src.get("tokenizer.ggml.token_type")] + [3] * (V - 512)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_name("random-qwen35-2b-shape")
    w.add_context_length(262144)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(shape["ff"])
    w.add_head_count(shape["heads"])
    w.add_head_count_kv(shape["kv"])
    w.add_key_length(shape["hd"])
    w.add_value_length(shape["hd"])
    w.add_rope_dimension_count(shape["rot"])
    w.add_rope_dimension_sections(SECTIONS)
    w.add_rope_freq_base(1e7)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(shape["conv"])
    w.add_ssm_inner_size(S * Hv)
    w.add_ssm_state_size(S)
    w.add_ssm_time_step_rank(Hv)
    w.add_ssm_group_count(Hk)
    w.add_full_attention_interval(4)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(src.get("tokenizer.ggml.merges")))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    def mat(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * cols ** -0.5).astype(np.float16))

    def vec(name: str, n: int, mean: float = 1.0, sd: float = 0.1) -> None:
        w.add_tensor(name, (mean + sd * rng.standard_normal(n, dtype=np.float32)).astype(np.float32))

    mat("token_embd.weight", V, D)
    vec("output_norm.weight", D)
    key, val = S * Hk, S * Hv
    for i in range(L):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", D)
        if (i + 1) % 4 == 0:
            nq = shape["heads"] * shape["hd"]
            mat(p + "attn_q.weight", 2 * nq, D)
            mat(p + "attn_k.weight", shape["kv"] * shape["hd"], D)
            mat(p + "attn_v.weight", shape["kv"] * shape["hd"], D)
            vec(p + "attn_q_norm.weight", shape["hd"])
            vec(p + "attn_k_norm.weight", shape["hd"])
            mat(p + "attn_output.weight", D, nq)
        else:
            mat(p + "attn_qkv.weight", 2 * key + val, D)
            mat(p + "attn_gate.weight", val, D)
            w.add_tensor(p + "ssm_conv1d.weight", (0.5 * rng.standard_normal((2 * key + val, shape["conv"]))).astype(np.float32))
            vec(p + "ssm_dt.bias", Hv, 0.0, 1.0)
            w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(-1.5, 0.5, Hv)).astype(np.float32))
            mat(p + "ssm_beta.weight", Hv, D)
            mat(p + "ssm_alpha.weight", Hv, D)
            vec(p + "ssm_norm.weight", S)
            mat(p + "ssm_out.weight", D, val)
        vec(p + "post_attention_norm.weight", D)
        mat(p + "ffn_gate.weight", shape["ff"], D)
        mat(p + "ffn_up.weight", shape["ff"], D)
        mat(p + "ffn_down.weight", D, shape["ff"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    from benchmarks.sized_model import shape_cli

    shape_cli(__doc__, "qwen35-2b-shape", write_f16, list(FTYPES))


if __name__ == "__main__":
    main()
