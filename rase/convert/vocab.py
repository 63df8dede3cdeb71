"""tokenizer.json (+ tokenizer_config.json, config.json) -> the GGUF's tokenizer.* metadata, as
llama.cpp's converter writes it: byte-level BPE -> "gpt2" with merges and the pre-tokenizer's
llama.cpp name; SentencePiece-style BPE (byte fallback, "▁" for spaces) -> "llama" with scores
that order merges as the merge list does. Anything else is refused, never guessed."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import TokenizerError
from ..text.tokenizer import PRE_REGEXES, T_BYTE, T_CONTROL, T_NORMAL, T_UNKNOWN, T_UNUSED, T_USER_DEFINED

# tokenizers' case-insensitive contraction group, as llama.cpp spells it
_CONTRACTIONS = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])")
_PRE_NAMES = ("llama-bpe", "qwen2", "qwen35")  # the names llama.cpp's converter writes, by regex
_BY_REGEX = {PRE_REGEXES[n][0]: n for n in _PRE_NAMES}
SPACE = "\u2581"


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read {path} ({exc})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} is not a JSON object")
    return data


def _parts(node) -> list[dict]:
    """A pre-tokenizer / normalizer and, for a Sequence, its members, flattened."""
    if not isinstance(node, dict):
        return []
    items = node.get("pretokenizers") or node.get("normalizers")
    return [p for item in items for p in _parts(item)] if node.get("type") == "Sequence" else [node]


def _pre_name(tok: dict) -> str:
    """llama.cpp's tokenizer.ggml.pre for a byte-level BPE tokenizer.json."""
    parts = _parts(tok.get("pre_tokenizer"))
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        pattern = (parts[0].get("pattern") or {}).get("Regex", "").replace(*_CONTRACTIONS)
        if pattern in _BY_REGEX:
            return _BY_REGEX[pattern]
    raise TokenizerError(
        f"tokenizer.json's pre-tokenizer ({json.dumps(tok.get('pre_tokenizer'))[:300]}) is not one rase knows how to "
        f"name for llama.cpp (known: {', '.join(('gpt-2', 'smollm') + _PRE_NAMES)}); convert this model with "
        "llama.cpp's convert_hf_to_gguf.py, then `rase model import` the GGUF")


def _looks_special(text: str) -> bool:  # llama.cpp's does_token_look_special
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or text.startswith(("<start_of_", "<end_of_")) and text.endswith(">"))


def _vocab(tok: dict, n_vocab: int) -> tuple[list[str | None], dict[int, dict]]:
    """Token text by id (None: an id the tokenizer lacks, padding to the embedding's rows)."""
    model = tok.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise TokenizerError("tokenizer.json has no model.vocab mapping")
    added = {a["id"]: a for a in tok.get("added_tokens") or [] if isinstance(a, dict) and "id" in a}
    by_id = {i: t for t, i in vocab.items()} | {i: a["content"] for i, a in added.items()}
    top = max(by_id) + 1
    if top > n_vocab:
        raise TokenizerError(f"tokenizer.json has token id {top - 1}, past the model's {n_vocab} embedding rows")
    return [by_id.get(i) for i in range(n_vocab)], added


def _merges(model: dict) -> list[str]:
    merges = model.get("merges") or []
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def _special_ids(tokens: list[str], tok_config: dict, config: dict) -> dict[str, int]:
    index = {t: i for i, t in enumerate(tokens)}
    out = {}
    for kind in ("bos", "eos", "unk", "pad"):
        value = tok_config.get(f"{kind}_token")
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value in index:
            out[kind] = index[value]
            continue
        fallback = config.get(f"{kind}_token_id")
        fallback = fallback[0] if isinstance(fallback, list) and fallback else fallback
        if isinstance(fallback, int) and 0 <= fallback < len(tokens):
            out[kind] = fallback
    return out


def _adds(tok: dict, tok_config: dict, special: dict[str, int], tokens: list[str]) -> dict[str, bool]:
    """add_bos / add_eos: tokenizer_config.json's flags, else the post-processor's template."""
    out = {k: tok_config[f"add_{k}_token"] for k in ("bos", "eos") if isinstance(tok_config.get(f"add_{k}_token"), bool)}
    for proc in _processors(tok.get("post_processor")):
        single = proc.get("single") or []
        if proc.get("type") != "TemplateProcessing" or len(single) < 2:
            continue
        first, last = (single[i].get("SpecialToken", {}).get("id") for i in (0, -1))
        if first and "bos" in special:
            out.setdefault("bos", first == tokens[special["bos"]])
        if last and "eos" in special:
            out.setdefault("eos", last == tokens[special["eos"]])
    return out


def _processors(node) -> list[dict]:
    if not isinstance(node, dict):
        return []
    return node.get("processors") or [node]


def _chat_template(folder: Path, tok_config: dict) -> str | None:
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    jinja = folder / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return template if isinstance(template, str) else None


def _spm_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """-rank of the first merge that makes each token: llama.cpp's SentencePiece merging (highest
    score first) then follows the merge list; tokens no merge makes score below every merge."""
    rank = {}
    for r, m in enumerate(merges):
        rank.setdefault(m.replace(" ", "", 1), r)
    floor = -float(len(merges) + 1)
    return [-float(rank[t]) if t in rank else floor for t in tokens]


def _spm_space_prefix(tok: dict) -> bool:
    for p in _parts(tok.get("normalizer")) + _parts(tok.get("pre_tokenizer")):
        if p.get("type") == "Prepend" and p.get("prepend") == SPACE:
            return True
        if p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") != "never":
            return True
    return False


def vocab_metadata(folder: Path, config: dict, n_vocab: int) -> dict:
    """{GGUF key: value} for the tokenizer of the checkpoint in folder; n_vocab: embedding rows."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{folder} has no tokenizer.json (a tokenizer.model alone is not read); save the "
                             "tokenizer with transformers' save_pretrained, which writes tokenizer.json")
    tok = _load(path)
    tok_config = _load(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise TokenizerError(f"tokenizer.json's model is {model.get('type')!r}; rase converts BPE tokenizers "
                             "(byte-level or SentencePiece-style); use llama.cpp's convert_hf_to_gguf.py for this one")
    texts, added = _vocab(tok, n_vocab)
    types = [T_UNUSED if t is None else T_NORMAL for t in texts]
    tokens = [f"[PAD{i}]" if t is None else t for i, t in enumerate(texts)]  # llama.cpp's padding tokens
    merges = _merges(model)
    special = _special_ids(tokens, tok_config, config)
    for i, a in added.items():
        types[i] = T_CONTROL if a.get("special") or _looks_special(a["content"]) else T_USER_DEFINED
    out: dict = {}
    if model.get("byte_fallback"):
        for i, t in enumerate(tokens):
            if types[i] == T_NORMAL and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                types[i] = T_BYTE
        if "unk" in special:
            types[special["unk"]] = T_UNKNOWN
        out |= {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
                "tokenizer.ggml.scores": _spm_scores(tokens, merges),
                "tokenizer.ggml.add_space_prefix": _spm_space_prefix(tok)}
    else:
        out |= {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": _pre_name(tok)}
    out["tokenizer.ggml.tokens"] = tokens
    out["tokenizer.ggml.token_type"] = types
    if not model.get("byte_fallback"):
        out["tokenizer.ggml.merges"] = merges
    for kind, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        if kind in special:
            out[f"tokenizer.ggml.{key}"] = special[kind]
    for kind, flag in _adds(tok, tok_config, special, tokens).items():
        out[f"tokenizer.ggml.add_{kind}_token"] = flag
    template = _chat_template(folder, tok_config)
    if template is not None:
        out["tokenizer.chat_template"] = template
    return out
