"""Tiny random-weight Hugging Face checkpoint folders, written as transformers saves them
(config.json, model*.safetensors with HF tensor names and HF's q/k layout, tokenizer.json from
`tokenizers`, tokenizer_config.json): the inputs of `rase model convert` in tests. Rows are
multiples of 256 so every K-quant applies without a fallback."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world! Paris is the capital of France.",
          "1234 + 5678 = 6912", "def main():\n    return 42\n", "Ünïcödé tëxt, naïve café."] * 20
# vocab: embedding rows, fixed (the tokenizers pad to it) so the weights depend on the seed alone
HP = dict(hidden=256, ff=512, heads=4, kv_heads=2, head_dim=64, layers=2, vocab=512)
TOKENS = [1, 5, 9, 33, 70, 12, 101, 7, 44, 3, 250, 17]  # the prompt converted checkpoints are compared on
KINDS = ("llama3", "qwen3", "gemma3", "qwen3moe")


def _bf16(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 bytes, rounded to nearest even (as torch's .to(torch.bfloat16))."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def save_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """F32 / F16 with the safetensors library; BF16 (which numpy lacks) in its format by hand."""
    if dtype != "BF16":
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v, "<f4" if dtype == "F32" else "<f2") for k, v in tensors.items()},
                  str(path), metadata={"format": "pt"})
        return
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        raw = _bf16(a)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)) + head)
        for raw in blobs:
            fh.write(raw)


def byte_level_tokenizer(folder: Path, regex: str | None, specials: list[str], vocab_size: int = 400,
                         digits: bool = False) -> int:
    """A byte-level BPE trained on CORPUS: regex split + ByteLevel (Llama 3, Qwen), or ByteLevel's
    own GPT-2 split (regex None), after single digits when digits (SmolLM)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex is None)
    first = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    first += [pre_tokenizers.Split(Regex(regex), behavior="isolated")] if regex is not None else []
    tok.pre_tokenizer = pre_tokenizers.Sequence(first + [byte_level]) if first else byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


def spm_prepend(folder: Path) -> None:
    """Make spm_tokenizer's tokenizer.json Llama 2's kind: a "▁" prepended to the text."""
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                              spec["normalizer"]]}
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")


def spm_tokenizer(folder: Path) -> int:
    """A SentencePiece-style BPE (Gemma's kind): spaces as "▁", byte fallback tokens <0x00>..<0xFF>,
    <pad> <eos> <bos> <unk> first."""
    from tokenizers import Tokenizer, models, trainers

    text = [s.replace(" ", "\u2581") for s in CORPUS]
    base = Tokenizer(models.BPE())
    base.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    trained = json.loads(base.to_str())["model"]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    spec = json.loads(Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                                                   for m in trained["merges"]],
                                           byte_fallback=True, unk_token="<unk>")).to_str())
    spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}]}
    spec["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(specials)]
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}}
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    Tokenizer.from_file(str(folder / "tokenizer.json"))  # loads: a valid tokenizer.json
    return len(vocab)


def _tokenizer(kind: str, folder: Path) -> tuple[int, dict]:
    if kind == "gemma3":
        n = spm_tokenizer(folder)
        return n, {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
                   "add_bos_token": True, "add_eos_token": False}
    if kind == "llama3":
        n = byte_level_tokenizer(folder, LLAMA3_REGEX, ["<|begin_of_text|>", "<|end_of_text|>"])
        spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        spec["model"]["ignore_merges"] = True  # as Llama 3's own tokenizer.json
        (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
        return n, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True}
    n = byte_level_tokenizer(folder, QWEN2_REGEX, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return n, {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
               "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}


def _config(kind: str, hp: dict) -> dict:
    cfg = {"hidden_size": hp["hidden"], "intermediate_size": hp["ff"], "num_attention_heads": hp["heads"],
           "num_key_value_heads": hp["kv_heads"], "num_hidden_layers": hp["layers"], "vocab_size": hp["vocab"],
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}
    if kind == "llama3":
        cfg |= {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 10000.0,
                "tie_word_embeddings": False,
                # original context 32: the scaled and smoothed bands fall inside a test's few positions
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}
    elif kind == "qwen3":
        cfg |= {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rope_theta": 1000000.0,
                "head_dim": hp["head_dim"], "tie_word_embeddings": True}
    elif kind == "qwen3moe":
        cfg |= {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "rope_theta": 1000000.0,
                "head_dim": hp["head_dim"], "tie_word_embeddings": False, "num_experts": 8,
                "num_experts_per_tok": 3, "moe_intermediate_size": 256, "norm_topk_prob": True}
    else:
        cfg |= {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0, "head_dim": hp["head_dim"], "query_pre_attn_scalar": hp["head_dim"],
                "sliding_window": 4, "sliding_window_pattern": 6, "hidden_activation": "gelu_pytorch_tanh",
                "num_hidden_layers": 6, "final_logit_softcapping": None, "attn_logit_softcapping": None}
    return cfg


def _weights(kind: str, cfg: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    h, hd, nl = cfg["hidden_size"], cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]), \
        cfg["num_hidden_layers"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):  # Gemma's norms hold w of (1 + w): around 0; the others around 1
        return (rng.standard_normal(n) * 0.1 + (0.0 if kind == "gemma3" else 1.0)).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((cfg["vocab_size"], h)) * 0.5).astype(np.float32),
         "model.norm.weight": norm(h)}
    if not cfg.get("tie_word_embeddings", True):
        w["lm_head.weight"] = mat(cfg["vocab_size"], h)
    for i in range(nl):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
              p + "self_attn.q_proj.weight": mat(nq, h), p + "self_attn.k_proj.weight": mat(nkv, h),
              p + "self_attn.v_proj.weight": mat(nkv, h), p + "self_attn.o_proj.weight": mat(h, nq)}
        if kind in ("qwen3", "qwen3moe", "gemma3"):
            w |= {p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd)}
        if kind == "gemma3":
            w |= {p + "pre_feedforward_layernorm.weight": norm(h), p + "post_feedforward_layernorm.weight": norm(h)}
        if kind == "qwen3moe":
            ff = cfg["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = mat(cfg["num_experts"], h) * 4
            for e in range(cfg["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                w |= {q + "gate_proj.weight": mat(ff, h), q + "up_proj.weight": mat(ff, h),
                      q + "down_proj.weight": mat(h, ff)}
        else:
            ff = cfg["intermediate_size"]
            w |= {p + "mlp.gate_proj.weight": mat(ff, h), p + "mlp.up_proj.weight": mat(ff, h),
                  p + "mlp.down_proj.weight": mat(h, ff)}
    return w


def write_checkpoint(folder: Path, kind: str, dtype: str = "F32", seed: int = 0, shards: int = 2,
                     hp: dict | None = None) -> Path:
    """A checkpoint folder of `kind` (KINDS): weights in `shards` files with an index, as
    transformers' save_pretrained writes a sharded model."""
    folder.mkdir(parents=True, exist_ok=True)
    n_vocab, tok_config = _tokenizer(kind, folder)
    cfg = _config(kind, HP | (hp or {}))
    assert n_vocab <= cfg["vocab_size"], n_vocab
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    weights = _weights(kind, cfg, np.random.default_rng(seed))
    names = sorted(weights)
    parts = [names[i::shards] for i in range(shards)]
    index = {}
    for k, part in enumerate(parts):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_safetensors(folder / fname, {n: weights[n] for n in part}, dtype)
        index |= {n: fname for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return folder


def load_checkpoint(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(config, {HF name: float32 array}) read back with the safetensors library (F32 / F16 shards)."""
    from safetensors.numpy import load_file

    weights = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights |= {k: v.astype(np.float32) for k, v in load_file(str(f)).items()}
    return json.loads((folder / "config.json").read_text()), weights


# real models' shapes (random weights) for speed and memory at size
SHAPES = {"qwen3-1.7b": dict(layers=28, hidden=2048, heads=16, kv=8, head_dim=128, ff=6144, vocab=151936),
          "qwen3-0.6b": dict(layers=28, hidden=1024, heads=16, kv=8, head_dim=128, ff=3072, vocab=151936),
          "mid": dict(layers=12, hidden=1024, heads=16, kv=8, head_dim=64, ff=4096, vocab=65536)}  # 0.5 GB
CHUNK = 1 << 24  # values generated at a time


def _tensors(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv"] * s["head_dim"]
    out = [("model.embed_tokens.weight", (s["vocab"], h)), ("model.norm.weight", (h,))]
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                (p + "self_attn.q_norm.weight", (s["head_dim"],)), (p + "self_attn.k_norm.weight", (s["head_dim"],)),
                (p + "mlp.gate_proj.weight", (s["ff"], h)), (p + "mlp.up_proj.weight", (s["ff"], h)),
                (p + "mlp.down_proj.weight", (h, s["ff"]))]
    return out


def write_sized_checkpoint(folder: Path, s: dict, seed: int = 0) -> None:
    """A Qwen3 checkpoint of shape s (SHAPES): config.json, tokenizer files and 2 BF16 shards with
    an index, written CHUNK values at a time (never held whole)."""
    folder.mkdir(parents=True, exist_ok=True)
    byte_level_tokenizer(folder, QWEN2_REGEX, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": s["hidden"],
        "intermediate_size": s["ff"], "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"],
        "head_dim": s["head_dim"], "num_hidden_layers": s["layers"], "vocab_size": s["vocab"],
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    rng, tensors = np.random.default_rng(seed), _tensors(s)
    half = len(tensors) // 2
    index = {}
    for k, part in enumerate((tensors[:half], tensors[half:])):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        header, off = {}, 0
        for t, shape in part:
            n = int(np.prod(shape)) * 2
            header[t] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            index[t] = name
        head = json.dumps(header).encode()
        head += b" " * (-len(head) % 8)
        with open(folder / name, "wb") as fh:
            fh.write(len(head).to_bytes(8, "little") + head)
            for t, shape in part:
                n = int(np.prod(shape))
                for i in range(0, n, CHUNK):
                    m = min(CHUNK, n - i)
                    vals = rng.standard_normal(m, dtype=np.float32) * (1.0 if len(shape) == 1 else 0.02)
                    fh.write(_bf16(vals + (1.0 if len(shape) == 1 else 0.0)))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
