"""Tiny random-weight GGUF models for every architecture x weight type (written by the tests;
no network). Shapes are the smallest that every quant type accepts (rows of 256)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rase.kernels.quants import QUANT_BLOCKS, QuantType

HP = dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, n_vocab=160, n_ctx=64)
TOKENS = [1, 5, 9, 33, 77, 100, 3, 4, 150, 7, 8, 12, 44, 55, 66, 11]  # a prompt within every tiny vocabulary
N_LAYER = {"gemma3": 6, "smollm3": 4}  # gemma3: layer 5 is the global one; smollm3: layer 3 has no RoPE
WINDOW = 5  # gemma3/gemma2 sliding window, small so that tests cross it
# MoE files: 8 experts (the router softmax's 8-lane exp path), 3 chosen (the sum order binds)
HP.update(n_expert=8, n_expert_used=3, n_ff_exp=256)

# what each architecture's file holds beyond plain llama blocks (file architecture, features)
ARCH_FEATURES = {
    "llama": ("llama", set()),
    "qwen3": ("qwen3", {"qk_norm", "untied", "key_length"}),
    "gemma3": ("gemma3", {"qk_norm", "post_norms", "key_length", "window"}),
    "qwen2": ("qwen2", {"bias", "untied"}),
    "phi3": ("phi3", {"fused", "untied"}),
    "gemma": ("gemma", {"key_length"}),
    "gemma2": ("gemma2", {"post_norms", "key_length", "window", "softcap"}),
    "olmo2": ("olmo2", {"qk_norm_full", "post_norms", "no_pre_norms", "untied"}),
    "llama-moe": ("llama", {"moe", "untied"}),
    "qwen3moe": ("qwen3moe", {"qk_norm", "moe", "untied", "key_length"}),
    "olmoe": ("olmoe", {"qk_norm_full", "moe", "untied"}),
    "llama3": ("llama", {"rope_freqs", "untied"}),
    "llama-yarn": ("llama", {"yarn"}),
    "phi3-longrope": ("phi3", {"fused", "longrope", "untied"}),
    "smollm3": ("smollm3", {"untied"}),
    "granite": ("granite", {"granite", "untied"}),
    "gpt-oss": ("gpt-oss", {"moe", "untied", "key_length", "window", "bias", "yarn", "oai"}),
}

# K-quant blocks are random bytes with their f16 scales set so weights come out ~0.1
K_SCALES = {QuantType.Q2_K: ([80, 82], 0.004), QuantType.Q3_K: ([108], 0.001),
            QuantType.Q4_K: ([0, 2], 0.0002), QuantType.Q5_K: ([0, 2], 0.0001),
            QuantType.Q6_K: ([208], 0.00005)}


def quantize(w: np.ndarray, qtype: QuantType, rng: np.random.Generator) -> np.ndarray:
    """(rows, cols) float32 -> (rows, row_bytes) uint8 of ggml blocks."""
    import gguf

    if qtype in K_SCALES:
        blck, size = QUANT_BLOCKS[qtype]
        rows, cols = w.shape
        raw = rng.integers(0, 256, (rows * cols // blck, size), dtype=np.uint8)
        offsets, scale = K_SCALES[qtype]
        for off in offsets:
            d = (scale * rng.uniform(0.5, 1.5, raw.shape[0])).astype(np.float16)
            raw[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
        return raw.reshape(rows, -1)
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType(int(qtype)))


def _add_tiny_vocab(w, n_vocab: int, extra: dict[str, int] | None = None, eos: str = "</s>") -> None:
    """A SentencePiece-style vocabulary of n_vocab tokens: <unk> <s> </s>, the word marker, the
    printable ASCII characters, then letter pairs; enough for sessions to encode ASCII text.
    extra: token text -> ggml token type, appended last (in place of letter pairs)."""
    import itertools
    import string

    extra = extra or {}
    pieces = ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)]
    pairs = ("".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2))
    pieces += list(itertools.islice(pairs, n_vocab - 3 - len(pieces) - len(extra)))
    tokens = ["<unk>", "<s>", "</s>", *pieces, *extra]
    assert len(tokens) == n_vocab
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(len(pieces))] + [0.0] * len(extra))
    w.add_token_types([2, 3, 3] + [1] * len(pieces) + list(extra.values()))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(tokens.index(eos))


def write_tiny_model(path: Path, arch: str, qtype: QuantType, seed: int = 0, extra_tokens: dict | None = None,
                     chat_template: str | None = None, eos: str = "</s>", hp: dict | None = None) -> Path:
    """arch: an ARCH_FEATURES key (llama-moe is a llama file with experts); hp: HP overrides."""
    import gguf

    rng = np.random.default_rng(seed)
    hp = {**HP, **(hp or {})}
    E, F, H, KV, D, V = (hp[k] for k in ("n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab"))
    file_arch, feat = ARCH_FEATURES[arch]
    L = N_LAYER.get(arch, 2)
    w = gguf.GGUFWriter(str(path), file_arch)
    w.add_block_count(L)
    w.add_context_length(hp["n_ctx"])
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    if "key_length" in feat:
        w.add_key_length(D)
        w.add_value_length(D)
    if "window" in feat:
        w.add_sliding_window(WINDOW)
    if "softcap" in feat:
        w.add_float32(f"{file_arch}.attn_logit_softcapping", 2.0)  # small: binds on these scores
        w.add_float32(f"{file_arch}.final_logit_softcapping", 30.0)
    if "yarn" in feat:  # the ramp spans dimensions 8..21 of 32 at this original context
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(2048)
    if "longrope" in feat:  # n_ctx 64 > 32: the long factors
        w.add_rope_scaling_orig_ctx_len(32)
        w.add_rope_scaling_attn_factors(1.2)
    if "granite" in feat:
        for key, value in (("embedding_scale", 3.0), ("residual_scale", 0.5), ("logit_scale", 4.0)):
            w.add_float32(f"{file_arch}.{key}", value)
        w.add_float32(f"{file_arch}.attention.scale", 0.05)
    if "moe" in feat:
        w.add_expert_count(hp["n_expert"])
        w.add_expert_used_count(hp["n_expert_used"])
        w.add_uint32(f"{file_arch}.expert_feed_forward_length", hp["n_ff_exp"])
    _add_tiny_vocab(w, V, extra_tokens, eos)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def mat(name: str, rows: int, cols: int, scale: float = 0.08, experts: int = 0) -> None:
        m = (rng.standard_normal((max(experts, 1) * rows, cols)) * scale).astype(np.float32)
        data = quantize(m, qtype, rng)
        if experts:
            data = data.reshape(experts, rows, -1)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType(int(qtype)))

    def vec(name: str, n: int, mean: float = 1.0, sd: float = 0.1) -> None:
        w.add_tensor(name, (mean + sd * rng.standard_normal(n)).astype(np.float32))

    embd = (rng.standard_normal((V, E)) * 0.5).astype(np.float32)
    q8 = gguf.quants.quantize(embd, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    vec("output_norm.weight", E)
    if "untied" in feat:
        mat("output.weight", V, E)
    if "rope_freqs" in feat:
        w.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, D // 2).astype(np.float32))
    if "longrope" in feat:
        w.add_tensor("rope_factors_long.weight", np.linspace(1.0, 16.0, D // 2).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", np.linspace(1.0, 2.0, D // 2).astype(np.float32))
    for i in range(L):
        _write_layer(w, f"blk.{i}.", feat, mat, vec, rng, hp)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _write_layer(w, p: str, feat: set, mat, vec, rng, hp: dict) -> None:
    E, F, H, KV, D = (hp[k] for k in ("n_embd", "n_ff", "n_head", "n_head_kv", "head_dim"))
    NE, NF = hp["n_expert"], hp["n_ff_exp"]
    if "fused" in feat:
        mat(p + "attn_qkv.weight", (H + 2 * KV) * D, E)
    else:
        mat(p + "attn_q.weight", H * D, E)
        mat(p + "attn_k.weight", KV * D, E)
        mat(p + "attn_v.weight", KV * D, E)
    mat(p + "attn_output.weight", E, H * D)
    if "bias" in feat:
        for name, n in (("attn_q", H * D), ("attn_k", KV * D), ("attn_v", KV * D)):
            vec(p + name + ".bias", n, 0.0, 0.5)
    if "oai" in feat:  # gpt-oss: output bias, sinks, biased router and experts, FFN norm's name
        vec(p + "attn_output.bias", E, 0.0, 0.5)
        vec(p + "attn_sinks.weight", H, 0.0, 2.0)
        vec(p + "ffn_gate_inp.bias", NE, 0.0, 1.0)
        for name, n in (("ffn_gate_exps", NF), ("ffn_up_exps", NF), ("ffn_down_exps", E)):
            w.add_tensor(p + name + ".bias", (0.5 * rng.standard_normal((NE, n))).astype(np.float32))
    if "moe" in feat:
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((NE, E)) * 0.2).astype(np.float32))
        mat(p + "ffn_gate_exps.weight", NF, E, experts=NE)
        mat(p + "ffn_up_exps.weight", NF, E, experts=NE)
        mat(p + "ffn_down_exps.weight", E, NF, experts=NE)
    elif "fused" in feat:
        mat(p + "ffn_up.weight", 2 * F, E)
        mat(p + "ffn_down.weight", E, F)
    else:
        mat(p + "ffn_gate.weight", F, E)
        mat(p + "ffn_up.weight", F, E)
        mat(p + "ffn_down.weight", E, F)
    if "no_pre_norms" not in feat:
        vec(p + "attn_norm.weight", E)
        vec(p + ("post_attention_norm.weight" if "oai" in feat else "ffn_norm.weight"), E)
    if "qk_norm" in feat:
        vec(p + "attn_q_norm.weight", D)
        vec(p + "attn_k_norm.weight", D)
    if "qk_norm_full" in feat:
        vec(p + "attn_q_norm.weight", H * D)
        vec(p + "attn_k_norm.weight", KV * D)
    if "post_norms" in feat:
        vec(p + "post_attention_norm.weight", E)
        vec(p + "post_ffw_norm.weight", E)
