"""A random-weight GGUF of Llama 3.2 1B's real shape, for speed at a realistic size: 16 layers,
2048 hidden, 32/8 heads x 64, FFN 8192, a 128256-token vocabulary with the output tied to the
embedding, and Llama 3.2's `rope_freqs` (factor 32, low 1, high 4, original context 8192, base
500000), as llama.cpp's converter writes them. The outputs mean nothing; the bytes a token reads,
the matrix shapes and the RoPE work are the real model's. The vocabulary is the tiny fixtures'
512 byte-level BPE tokens and reserved control tokens up to 128256 (no benchmark tokenizes).

    python benchmarks/sized_model.py OUT_DIR [--quant q4_k_m q8_0 ...] [--keep-f16]

Writes OUT_DIR/llama-3.2-1b-shape-f16.gguf, then each quantization with llama.cpp's own
quantizer (llama-cpp-python), e.g. OUT_DIR/llama-3.2-1b-shape-q4_k_m.gguf.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
L, D, H, KV, HD, F, V = 16, 2048, 32, 8, 64, 8192, 128256
BASE = 500000.0
FTYPES = {"q4_k_m": 15, "q8_0": 7, "q4_0": 2, "q6_k": 18}  # llama_ftype


def write_f16(path: Path, seed: int = 0) -> Path:
    import gguf

    from rase.store.gguf import GGUFFile
    from tools.arch_sources import llama3_factors

    src = GGUFFile(ROOT / "tests" / "fixtures" / "archs" / "llama3-tiny-q8_0.gguf")
    tokens = list(src.get("tokenizer.ggml.tokens")) + [f"<|reserved_special_token_{i}|>" for i in range(V - 512)]
    types = [int(t) for t in src.get("tokenizer.ggml.token_type")] + [3] * (V - 512)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("random-llama-3.2-1b-shape")
    w.add_context_length(131072)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(HD)
    w.add_rope_freq_base(BASE)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(src.get("tokenizer.ggml.merges")))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    def mat(name: str, rows: int, cols: int, scale: float) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float16))

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(D, dtype=np.float32)).astype(np.float32))

    mat("token_embd.weight", V, D, 1.0)
    norm("output_norm.weight")
    w.add_tensor("rope_freqs.weight", llama3_factors(HD, BASE, factor=32.0, low=1.0, high=4.0, orig=8192))
    for i in range(L):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        mat(p + "attn_q.weight", H * HD, D, D ** -0.5)
        mat(p + "attn_k.weight", KV * HD, D, D ** -0.5)
        mat(p + "attn_v.weight", KV * HD, D, D ** -0.5)
        mat(p + "attn_output.weight", D, H * HD, (H * HD) ** -0.5)
        norm(p + "ffn_norm.weight")
        mat(p + "ffn_gate.weight", F, D, D ** -0.5)
        mat(p + "ffn_up.weight", F, D, D ** -0.5)
        mat(p + "ffn_down.weight", D, F, F ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    shape_cli(__doc__, "llama-3.2-1b-shape", write_f16, sorted(FTYPES))


def shape_cli(doc: str, stem: str, write, quants: list[str]) -> None:
    """A shape writer's command line: OUT_DIR [--quant ...] [--keep-f16] (write_quantized)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--quant", nargs="*", default=["q4_k_m"], choices=quants)
    ap.add_argument("--keep-f16", action="store_true")
    args = ap.parse_args()
    write_quantized(Path(args.out_dir), stem, write, args.quant, args.keep_f16)


def write_quantized(out: Path, stem: str, write, quants: list[str], keep_f16: bool) -> None:
    """OUT/stem-f16.gguf by write(path), then each of quants (FTYPES) by llama.cpp's quantizer."""
    from tools.make_arch_fixtures import quantize

    out.mkdir(parents=True, exist_ok=True)
    f16 = write(out / f"{stem}-f16.gguf")
    for q in quants:
        quantize(f16, out / f"{stem}-{q}.gguf", FTYPES[q])
        print(out / f"{stem}-{q}.gguf")
    if not keep_f16:
        f16.unlink()


if __name__ == "__main__":
    main()
