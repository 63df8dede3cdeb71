"""The tiny random-weight GGUF sources of tools/make_arch_fixtures.py: one writer per family, in
llama.cpp's exact tensor layout and metadata (F32, numpy seed 0, weights drawn in file order),
each able to write the same file with its distinctive feature neutralized. The vocabularies: the
first eight files' byte-level BPE (copied), or a WordPiece vocabulary built from the texts.
"""
from __future__ import annotations

import json
import math
import unicodedata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ROOT / "tests" / "fixtures" / "archs"
D, H, KV, HD, F, CTX = 256, 4, 2, 64, 512, 4096
LONG_TEXT = (
    "The lighthouse keeper climbed the stairs every evening at dusk. He carried a small lamp, a "
    "notebook and a thermos of tea. From the top he could see the harbour, the fishing boats "
    "coming home, and the long grey line of the cliffs to the north. He wrote down the wind, the "
    "height of the waves and the names of the ships that passed. In winter the storms came in from "
    "the west and the whole tower shook; in summer the sea was calm and blue and children swam "
    "below the rocks. After forty years he knew every sound the building made, and he slept well "
    "only when the light was turning above him. When the new automatic lamp arrived, he stayed.")


# ---------------------------------------------------------------- vocabularies

def bpe_vocab() -> dict:
    """The 512-token byte-level BPE vocabulary of the first eight files (README), copied."""
    from rase.store.gguf import GGUFFile

    g = GGUFFile(ARCHS / "qwen2-tiny-q8_0.gguf")
    keys = ("tokens", "token_type", "merges", "bos_token_id", "eos_token_id", "unknown_token_id",
            "padding_token_id", "add_bos_token")
    return {k: g.get(f"tokenizer.ggml.{k}") for k in keys}


def _words(texts: list[str]) -> list[str]:
    out = []
    for t in texts:
        t = "".join(c for c in unicodedata.normalize("NFD", t.lower()) if unicodedata.category(c) != "Mn")
        word = ""
        for c in t:
            if c.isspace() or unicodedata.category(c)[0] in "PS":
                out += [word] * bool(word) + [c] * (not c.isspace())
                word = ""
            else:
                word += c
        out += [word] * bool(word)
    return out


def wpm_vocab(texts: list[str]) -> list[str]:
    """512 WordPiece tokens in llama.cpp's phantom-space form (BERT's layout of the special ids:
    [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103): every lower-case ASCII letter, digit
    and punctuation mark as a word start ("\u2581x") and a continuation ("x"), the words of
    `texts` (most frequent first), their 2-4 letter suffixes and inner letter pairs. 語 is left out, so a word
    holding it becomes [UNK]."""
    chars = [chr(c) for c in range(0x21, 0x7F) if not chr(c).isupper()]
    pieces = ["\u2581" + c for c in chars] + [c for c in chars if c.isalnum()]
    counts: dict[str, int] = {}
    for w in _words(texts):
        if "語" not in w and len(w) > 1:
            counts[w] = counts.get(w, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))
    pieces += ["\u2581" + w for w in words] + sorted({w[-k:] for w in words for k in (2, 3, 4) if len(w) > k})
    pieces += ["\u2581日", "\u2581本"] + sorted({w[i:i + 2] for w in words for i in range(1, len(w) - 1)})
    seen, uniq = set(), []
    for p in pieces:
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    room = 512 - 5
    assert len(uniq) >= room, len(uniq)
    uniq = uniq[:room]
    vocab = ["[PAD]"] + uniq[:99] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + uniq[99:]
    assert len(vocab) == 512
    return vocab


# ---------------------------------------------------------------- writing a source

class Source:
    """A GGUF under construction with the README's weight conventions (seed 0, drawn in file order)."""

    def __init__(self, path: Path, arch: str, name: str) -> None:
        import gguf

        self.gguf, self.arch = gguf, arch
        self.w = gguf.GGUFWriter(str(path), arch)
        self.w.add_name(name)
        self.rng = np.random.default_rng(0)

    def key(self, suffix: str, value) -> None:
        full = f"{self.arch}.{suffix}"
        if isinstance(value, bool):
            self.w.add_bool(full, value)
        elif isinstance(value, int):
            self.w.add_uint32(full, value)
        elif isinstance(value, float):
            self.w.add_float32(full, value)
        else:
            self.w.add_string(full, value)

    def mat(self, name: str, rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        m = (self.rng.standard_normal((rows, cols)) * scale / math.sqrt(cols)).astype(np.float32)
        self.w.add_tensor(name, m)
        return m

    def vec(self, name: str, n: int, gain: float = 1.0, mean: float = 1.0, sd: float = 0.1) -> None:
        self.w.add_tensor(name, (gain * (mean + sd * self.rng.standard_normal(n))).astype(np.float32))

    def embedding(self, name: str, rows: int, emb: float, control_rows: tuple = ()) -> None:
        e = (self.rng.standard_normal((rows, D)) * emb).astype(np.float32)
        e[list(control_rows)] *= 0.25  # control tokens rarely win: greedy runs reach 32 tokens
        self.w.add_tensor(name, e)

    def raw(self, name: str, data: np.ndarray) -> None:
        self.w.add_tensor(name, np.asarray(data, np.float32))

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def bpe_tokenizer(s: Source) -> None:
    v = bpe_vocab()
    s.w.add_tokenizer_model("gpt2")
    s.w.add_tokenizer_pre("smollm")
    s.w.add_token_list(v["tokens"])
    s.w.add_token_types([int(t) for t in v["token_type"]])
    s.w.add_token_merges(v["merges"])
    s.w.add_bos_token_id(v["bos_token_id"])
    s.w.add_eos_token_id(v["eos_token_id"])
    s.w.add_unk_token_id(v["unknown_token_id"])
    s.w.add_pad_token_id(v["padding_token_id"])
    s.w.add_add_bos_token(False)


def decoder_hparams(s: Source, n_layer: int = 2, base: float = 10000.0, eps: float = 1e-5, n_rot: int = HD,
                    kv: int | list[int] = KV) -> None:
    s.w.add_context_length(CTX)
    s.w.add_embedding_length(D)
    s.w.add_block_count(n_layer)
    s.w.add_feed_forward_length(F)
    s.w.add_head_count(H)
    s.w.add_head_count_kv(kv)
    s.w.add_rope_dimension_count(n_rot)
    s.w.add_rope_freq_base(base)
    s.w.add_layer_norm_rms_eps(eps)


def llama_layers(s: Source, n_layer: int, fused: bool = False) -> None:
    for i in range(n_layer):
        p = f"blk.{i}."
        s.vec(p + "attn_norm.weight", D)
        if fused:
            s.mat(p + "attn_qkv.weight", (H + 2 * KV) * HD, D)
        else:
            s.mat(p + "attn_q.weight", H * HD, D)
            s.mat(p + "attn_k.weight", KV * HD, D)
            s.mat(p + "attn_v.weight", KV * HD, D)
        s.mat(p + "attn_output.weight", D, H * HD)
        s.vec(p + "ffn_norm.weight", D)
        if fused:
            s.mat(p + "ffn_up.weight", 2 * F, D)
        else:
            s.mat(p + "ffn_gate.weight", F, D)
            s.mat(p + "ffn_up.weight", F, D)
        s.mat(p + "ffn_down.weight", D, F)


def llama3_factors(n_rot: int, base: float, factor=8.0, low=1.0, high=4.0, orig=64) -> np.ndarray:
    """convert_hf_to_gguf's rope_freqs for rope_type llama3 (Llama 3.1: factor 8, low 1, high 4,
    original 8192; 64 here so that the factors reach the positions a tiny prompt has)."""
    out = []
    for i in range(0, n_rot, 2):
        freq = 1.0 / base ** (i / n_rot)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


# ---------------------------------------------------------------- the families
# each: (source writer(path, neutral), kind, what neutral removes)

def _decoder(path: Path, arch: str, name: str, *, n_layer=2, base=10000.0, keys=(), fused=False,
             tied=False, extra=None, n_rot=HD, out_gain=1.0, emb=1.0) -> None:
    s = Source(path, arch, name)
    decoder_hparams(s, n_layer, base, n_rot=n_rot)
    for k, v in keys:
        s.key(k, v)
    bpe_tokenizer(s)
    s.embedding("token_embd.weight", 512, emb, control_rows=() if not tied else (0, 1, 2))
    s.vec("output_norm.weight", D, out_gain)
    if not tied:
        out = s.rng.standard_normal((512, D)).astype(np.float32) * 4 / math.sqrt(D)
        out[:3] *= 0.25
        s.raw("output.weight", out)
    if extra:
        extra(s)
    llama_layers(s, n_layer, fused)
    s.close()


def llama3(path: Path, neutral: bool) -> None:
    f = llama3_factors(HD, 500000.0)
    _decoder(path, "llama", "tiny-llama3", base=500000.0,
             extra=lambda s: s.raw("rope_freqs.weight", np.ones_like(f) if neutral else f))


def llama_yarn(path: Path, neutral: bool) -> None:
    keys = [("rope.scaling.type", "none" if neutral else "yarn"), ("rope.scaling.factor", 4.0),
            ("rope.scaling.original_context_length", 1024)]
    _decoder(path, "llama", "tiny-llama-yarn", keys=keys)


def llama_linear(path: Path, neutral: bool) -> None:
    _decoder(path, "llama", "tiny-llama-linear", keys=[("rope.scaling.type", "none" if neutral else "linear"),
                                                        ("rope.scaling.factor", 4.0)])


def phi3_longrope(path: Path, neutral: bool) -> None:
    """Phi-3.5/Phi-4-mini's layout: partial rotary (48 of 64 dims, as Phi-4-mini's 0.75), long and
    short factors, original context 256 of 4096 and the converter's attn_factor."""
    rng = np.random.default_rng(1)
    half = 48 // 2
    long = np.sort(1.0 + 30 * rng.random(half)).astype(np.float32)
    short = np.sort(1.0 + 1.5 * rng.random(half)).astype(np.float32)
    scale = CTX / 256
    keys = [("rope.scaling.original_context_length", 256),
            ("rope.scaling.attn_factor", 1.0 if neutral else math.sqrt(1 + math.log(scale) / math.log(256)))]

    def factors(s: Source) -> None:
        s.raw("rope_factors_long.weight", np.ones(half) if neutral else long)
        s.raw("rope_factors_short.weight", np.ones(half) if neutral else short)
    _decoder(path, "phi3", "tiny-phi", keys=keys, fused=True, extra=factors, n_rot=48)


def smollm3(path: Path, neutral: bool) -> None:
    """4 layers, so that layer 3 is the NoPE one; tied output. Neutral: the same tensors as a
    llama file (RoPE in every layer)."""
    _decoder(path, "llama" if neutral else "smollm3", "tiny-smollm3", n_layer=4, base=5e6, tied=True,
             out_gain=1.0, emb=0.25)


def granite(path: Path, neutral: bool) -> None:
    """Granite 3.1's multipliers (embedding 12, residual 0.22, attention 1/64, logits / 8), tied."""
    keys = [("embedding_scale", 1.0 if neutral else 12.0), ("residual_scale", 1.0 if neutral else 0.22),
            ("attention.scale", 0.125 if neutral else 0.015625), ("logit_scale", 1.0 if neutral else 8.0)]
    _decoder(path, "granite", "tiny-granite", base=1e7, keys=keys, tied=True, out_gain=8.0, emb=0.25)


HARMONY_TOKENS = ["<|startoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|return|>", "<|call|>"]  # o200k_harmony's control tokens, ids 512..519 here
GPT_OSS_WINDOW, GPT_OSS_EXPERTS, GPT_OSS_USED = 16, 4, 2


def gpt_oss(path: Path, neutral) -> None:
    """gpt-oss's layout (convert_hf_to_gguf's GptOssModel): Q/K/V/O biases, attn_sinks, the FFN
    norm named post_attention_norm, a biased router over 4 experts (2 used) with biased gate/up/
    down experts; sliding window 16 on layer 0, full attention on layer 1; YaRN (factor 4 of an
    original 1024); the BPE vocabulary plus harmony's control tokens, <|return|> as EOS, and the
    released files' chat template (llama.cpp's models/templates/openai-gpt-oss-120b.jinja). Expert
    gate/up weights are scaled (6) so the clamp at 7 binds on many activations, sinks ~ N(0, 2).
    neutral: False, "sinks" (sinks -1e4: exp gives 0) or "swa" (a window past the context)."""
    v = bpe_vocab()
    s = Source(path, "gpt-oss", "tiny-gpt-oss")
    decoder_hparams(s, 2, 150000.0)
    s.w.add_key_length(HD)
    s.w.add_value_length(HD)
    s.key("attention.sliding_window", CTX if neutral == "swa" else GPT_OSS_WINDOW)
    s.key("expert_count", GPT_OSS_EXPERTS)
    s.key("expert_used_count", GPT_OSS_USED)
    s.key("expert_feed_forward_length", D)
    s.key("rope.scaling.type", "yarn")
    s.key("rope.scaling.factor", 4.0)
    s.key("rope.scaling.original_context_length", 1024)
    tokens = list(v["tokens"]) + HARMONY_TOKENS
    s.w.add_tokenizer_model("gpt2")
    s.w.add_tokenizer_pre("gpt-4o")
    s.w.add_token_list(tokens)
    s.w.add_token_types([int(t) for t in v["token_type"]] + [3] * len(HARMONY_TOKENS))
    s.w.add_token_merges(v["merges"])
    s.w.add_bos_token_id(tokens.index("<|startoftext|>"))
    s.w.add_eos_token_id(tokens.index("<|return|>"))
    s.w.add_pad_token_id(0)
    s.w.add_add_bos_token(False)
    s.w.add_chat_template((ROOT / "tests" / "fixtures" / "gpt-oss.jinja").read_text())
    n_vocab = len(tokens)
    control = (0, 1, 2) + tuple(range(512, n_vocab))
    e = (s.rng.standard_normal((n_vocab, D))).astype(np.float32)
    s.raw("token_embd.weight", e)
    s.vec("output_norm.weight", D)
    out = s.rng.standard_normal((n_vocab, D)).astype(np.float32) * 4 / math.sqrt(D)
    out[list(control)] *= 0.25
    s.raw("output.weight", out)
    for i in range(2):
        p = f"blk.{i}."
        s.vec(p + "attn_norm.weight", D)
        for name, rows in (("attn_q", H * HD), ("attn_k", KV * HD), ("attn_v", KV * HD)):
            s.mat(p + name + ".weight", rows, D)
            s.vec(p + name + ".bias", rows, mean=0.0, sd=0.5)
        s.mat(p + "attn_output.weight", D, H * HD)
        s.vec(p + "attn_output.bias", D, mean=0.0, sd=0.5)
        sinks = 2.0 * s.rng.standard_normal(H)
        s.raw(p + "attn_sinks.weight", np.full(H, -1e4) if neutral == "sinks" else sinks)
        s.vec(p + "post_attention_norm.weight", D)
        s.mat(p + "ffn_gate_inp.weight", GPT_OSS_EXPERTS, D, 3.0)
        s.vec(p + "ffn_gate_inp.bias", GPT_OSS_EXPERTS, mean=0.0, sd=1.0)
        for name, rows, cols, scale in (("ffn_gate_exps", D, D, 6.0), ("ffn_up_exps", D, D, 6.0),
                                        ("ffn_down_exps", D, D, 1.0)):
            w = s.rng.standard_normal((GPT_OSS_EXPERTS, rows, cols)) * scale / math.sqrt(cols)
            s.raw(p + name + ".weight", w)
            s.raw(p + name + ".bias", 0.5 * s.rng.standard_normal((GPT_OSS_EXPERTS, rows)))
    s.close()


LFM2_KV = (0, 0, KV, 0)  # KV heads per layer: layer 2 attends, the others convolve
LFM2_TAPS = 3


def lfm2(path: Path, neutral: bool) -> None:
    """LFM2's layout (convert_hf_to_gguf's LFM2Model): head_count_kv per layer (0: a short gated
    convolution, shortconv.{in_proj,conv,out_proj}), per-head Q/K norms in the attention layer, the
    final norm as token_embd_norm, the output tied to the embeddings. The taps are N(0, 1), so the
    previous positions weigh as much as the current one. neutral: the taps of the previous
    positions are 0 (the convolution sees only its own position: no state)."""
    s = Source(path, "lfm2", "tiny-lfm2")
    decoder_hparams(s, len(LFM2_KV), 1e6, kv=list(LFM2_KV))
    s.key("shortconv.l_cache", LFM2_TAPS)
    bpe_tokenizer(s)
    s.embedding("token_embd.weight", 512, 0.25, control_rows=(0, 1, 2))
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
            taps = s.rng.standard_normal((D, LFM2_TAPS)).astype(np.float32)
            if neutral:
                taps[:, :-1] = 0.0
            s.raw(p + "shortconv.conv.weight", taps)
            s.mat(p + "shortconv.out_proj.weight", D, D)
        s.vec(p + "ffn_norm.weight", D)
        s.mat(p + "ffn_gate.weight", F, D)
        s.mat(p + "ffn_up.weight", F, D)
        s.mat(p + "ffn_down.weight", D, F)
    s.close()


QWEN35_LAYERS, QWEN35_ROT, QWEN35_SECTIONS = 4, 32, [6, 5, 5, 0]  # layer 3 attends, 0-2 are delta nets
QWEN35_SSM = dict(d_conv=4, head=32, k_heads=4, v_heads=8)


def qwen35(path: Path, neutral: bool, tokenizer=None, n_vocab: int = 512) -> None:
    """Qwen3.5's layout (convert_hf_to_gguf's Qwen3_5TextModel): every 4th layer full attention
    with Q and its output gate interleaved per head in attn_q (2 x H x HD rows), per-head Q/K
    norms, partial interleaved multi-section RoPE (32 of 64 dims); the others gated delta nets:
    attn_qkv (q | k | v channels), attn_gate (z), ssm_conv1d (4 taps), ssm_beta / ssm_alpha (a
    value per value head), ssm_dt.bias, ssm_a (-exp(A_log)), ssm_norm, ssm_out; 4 key heads
    shared by 8 value heads of 32 (8 rows of ssm_beta / ssm_alpha: llama.cpp repacks a Q4_K
    matrix only when its rows are a multiple of 8, as every real Qwen3.5's are). The FFN norm is
    post_attention_norm; the output untied.
    neutral: the delta rule forgets at once (ssm_a -1e4: exp(g) = 0, so no state carries over,
    and the conv taps of earlier positions 0). tokenizer / n_vocab: another vocabulary (with image
    tokens: tools/vision_sources.py)."""
    ssm = QWEN35_SSM
    key_dim, value_dim = ssm["head"] * ssm["k_heads"], ssm["head"] * ssm["v_heads"]
    conv_dim = 2 * key_dim + value_dim
    s = Source(path, "qwen35", "tiny-qwen35")
    decoder_hparams(s, QWEN35_LAYERS, 1e7, eps=1e-6, n_rot=QWEN35_ROT)
    s.w.add_key_length(HD)
    s.w.add_value_length(HD)
    s.w.add_rope_dimension_sections(QWEN35_SECTIONS)
    s.w.add_ssm_conv_kernel(ssm["d_conv"])
    s.w.add_ssm_inner_size(value_dim)
    s.w.add_ssm_state_size(ssm["head"])
    s.w.add_ssm_time_step_rank(ssm["v_heads"])
    s.w.add_ssm_group_count(ssm["k_heads"])
    s.w.add_full_attention_interval(4)
    (tokenizer or bpe_tokenizer)(s)
    s.embedding("token_embd.weight", n_vocab, 1.0)
    s.vec("output_norm.weight", D)
    out = s.rng.standard_normal((n_vocab, D)).astype(np.float32) * 4 / math.sqrt(D)
    out[:3] *= 0.25
    s.raw("output.weight", out)
    for i in range(QWEN35_LAYERS):
        p = f"blk.{i}."
        s.vec(p + "attn_norm.weight", D)
        if (i + 1) % 4 == 0:
            s.mat(p + "attn_q.weight", 2 * H * HD, D)
            s.mat(p + "attn_k.weight", KV * HD, D)
            s.mat(p + "attn_v.weight", KV * HD, D)
            s.vec(p + "attn_q_norm.weight", HD)
            s.vec(p + "attn_k_norm.weight", HD)
            s.mat(p + "attn_output.weight", D, H * HD)
        else:
            s.mat(p + "attn_qkv.weight", conv_dim, D, 2.0)
            s.mat(p + "attn_gate.weight", value_dim, D)
            taps = s.rng.standard_normal((conv_dim, ssm["d_conv"])).astype(np.float32) * 0.5
            if neutral:
                taps[:, :-1] = 0.0
            s.raw(p + "ssm_conv1d.weight", taps)
            s.raw(p + "ssm_dt.bias", s.rng.standard_normal(ssm["v_heads"]))
            a_log = s.rng.uniform(-1.5, 0.5, ssm["v_heads"])
            s.raw(p + "ssm_a", np.full(ssm["v_heads"], -1e4) if neutral else -np.exp(a_log))
            s.mat(p + "ssm_beta.weight", ssm["v_heads"], D, 2.0)
            s.mat(p + "ssm_alpha.weight", ssm["v_heads"], D, 2.0)
            s.vec(p + "ssm_norm.weight", ssm["head"])
            s.mat(p + "ssm_out.weight", D, value_dim)
        s.vec(p + "post_attention_norm.weight", D)
        s.mat(p + "ffn_gate.weight", F, D)
        s.mat(p + "ffn_up.weight", F, D)
        s.mat(p + "ffn_down.weight", D, F)
    s.close()


def _encoder(path: Path, arch: str, name: str, neutral: bool, nomic: bool) -> None:
    texts = encoder_texts()
    s = Source(path, arch, name)
    s.w.add_context_length(2048 if nomic else 512)
    s.w.add_embedding_length(D)
    s.w.add_block_count(2)
    s.w.add_feed_forward_length(F)
    s.w.add_head_count(H)
    s.w.add_layer_norm_eps(1e-12)
    s.w.add_causal_attention(neutral)
    s.w.add_pooling_type(s.gguf.PoolingType.MEAN if nomic else s.gguf.PoolingType.CLS)  # nomic-embed-text, bge
    if nomic:
        s.w.add_rope_freq_base(1000.0)
        s.w.add_rope_dimension_count(HD)
    s.w.add_tokenizer_model("bert")
    s.w.add_tokenizer_pre("default")
    vocab = wpm_vocab(texts)
    s.w.add_token_list(vocab)
    s.w.add_token_types([3 if t.startswith("[") and t.endswith("]") else 1 for t in vocab])
    s.w.add_token_type_count(2)
    for fn, tid in ((s.w.add_bos_token_id, 101), (s.w.add_sep_token_id, 102), (s.w.add_unk_token_id, 100),
                    (s.w.add_pad_token_id, 0), (s.w.add_mask_token_id, 103)):
        fn(tid)
    s.embedding("token_embd.weight", 512, 1.0)
    types = s.rng.standard_normal((2, D)).astype(np.float32)
    s.raw("token_types.weight", types * (0.0 if neutral else 1.0))
    if not nomic:
        pos = s.rng.standard_normal((512, D)).astype(np.float32)
        s.raw("position_embd.weight", pos * (0.0 if neutral else 1.0))
    s.vec("token_embd_norm.weight", D)
    s.vec("token_embd_norm.bias", D, mean=0.0)
    for i in range(2):
        p = f"blk.{i}."
        if nomic:
            s.mat(p + "attn_qkv.weight", 3 * D, D)
        else:
            for t in ("attn_q", "attn_k", "attn_v"):
                s.mat(p + t + ".weight", D, D)
                s.vec(p + t + ".bias", D, mean=0.0, sd=0.5)
        s.mat(p + "attn_output.weight", D, D)
        if not nomic:
            s.vec(p + "attn_output.bias", D, mean=0.0)
        s.vec(p + "attn_output_norm.weight", D)
        s.vec(p + "attn_output_norm.bias", D, mean=0.0)
        if nomic:
            s.mat(p + "ffn_gate.weight", F, D)
        s.mat(p + "ffn_up.weight", F, D, 2.0)
        if not nomic:
            s.vec(p + "ffn_up.bias", F, mean=0.0)
        s.mat(p + "ffn_down.weight", D, F)
        if not nomic:
            s.vec(p + "ffn_down.bias", D, mean=0.0)
        s.vec(p + "layer_output_norm.weight", D)
        s.vec(p + "layer_output_norm.bias", D, mean=0.0)
    s.close()


def bert(path: Path, neutral: bool) -> None:
    """BERT (bge / MiniLM layout): learned positions, token types, biases, GELU, CLS pooling.
    Neutral: causal attention, no position or token-type embeddings."""
    _encoder(path, "bert", "tiny-bert", neutral, nomic=False)


def nomic_bert(path: Path, neutral: bool) -> None:
    """nomic-embed-text's layout: fused QKV, rotary (base 1000), SwiGLU, mean pooling.
    Neutral: causal attention, no token-type embedding."""
    _encoder(path, "nomic-bert", "tiny-nomic-bert", neutral, nomic=True)


FAMILIES = {
    "llama3-tiny": (llama3, "decoder"), "llama-yarn-tiny": (llama_yarn, "decoder"),
    "llama-linear-tiny": (llama_linear, "decoder"), "phi3-longrope-tiny": (phi3_longrope, "decoder"),
    "smollm3-tiny": (smollm3, "decoder"), "granite-tiny": (granite, "decoder"),
    "bert-tiny": (bert, "encoder"), "nomic-bert-tiny": (nomic_bert, "encoder"),
    "gpt-oss-tiny": (gpt_oss, "decoder"), "lfm2-tiny": (lfm2, "decoder"), "qwen35-tiny": (qwen35, "decoder"),
}
# families whose features are neutralized one at a time (binds.json keeps one record each)
FEATURES = {"gpt-oss-tiny": ("sinks", "swa")}


# ---------------------------------------------------------------- llama.cpp's outputs

def cases() -> dict:
    return json.loads((ARCHS / "cases.json").read_text())


def encoder_texts() -> list[str]:
    c = cases()
    return [t for t in c["tokenize"] if t] + c["prompts"] + [LONG_TEXT]
