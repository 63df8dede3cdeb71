"""Tokenizers: HF `tokenizers` for tokenizer.json files, and the GGUF's own vocabulary.

From a GGUF, rase reproduces llama.cpp's tokenization (ids equal llama.cpp's on the fixtures):
special tokens are split out first (control tokens only when parse_special, user-defined
tokens always, longest first), then each text fragment goes through the vocabulary's model:
gpt2-style byte-level BPE (HF `tokenizers`, with llama.cpp's pre-tokenizer regexes for the
GGUF's `tokenizer.ggml.pre`), SentencePiece-style ("llama": highest-score bigram merges with
byte fallback, llama.cpp's algorithm), or WordPiece ("bert": wordpiece.py; [CLS] ... [SEP]).
"""
from __future__ import annotations

import heapq
import os
from typing import Sequence

import numpy as np

from ..errors import TokenizerError
from ..store.gguf import T_ARRAY as T_GGUF_ARRAY, T_STRING as T_GGUF_STRING

# token types (tokenizer.ggml.token_type)
T_NORMAL, T_UNKNOWN, T_CONTROL, T_USER_DEFINED, T_UNUSED, T_BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), applied in sequence
PRE_REGEXES: dict[str, list[str]] = {
    "gpt2": [_GPT2],
    "default": [_GPT2],
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b"), [r"\p{N}", _GPT2]),
    **dict.fromkeys(("olmo", "mpt", "jais", "gpt-2"), [_GPT2]),
    # Qwen2/2.5/3 (and what llama.cpp maps to its QWEN2 pre-tokenizer): llama3's, digits one by one
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"), [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
    # Qwen3.5: qwen2's, letters joined by their combining marks (\p{M})
    "qwen35": [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|"
        r"\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    **dict.fromkeys(("llama3", "llama-bpe", "llama-v3", "smaug-bpe"), [
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
    # o200k (gpt-oss), as llama.cpp rewrites tokenizer.json's regex: case classes by lookahead
    **dict.fromkeys(("gpt-4o", "minimax-m2"), [
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|"
        r"'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+"]),
}
IGNORE_MERGES = {"llama3", "llama-bpe", "llama-v3", "smaug-bpe"}


class LocalTokenizer:
    """encode(text, add_special_tokens, parse_special) -> ids; decode(ids, skip_special_tokens)."""

    def __init__(self, impl: "_Impl") -> None:
        self._impl = impl
        self.bos_id, self.eos_id, self.n_vocab = impl.bos_id, impl.eos_id, impl.n_vocab
        self.path = getattr(impl, "path", None)  # the tokenizer.json it was read from, if any

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "LocalTokenizer":
        return cls(_HFFile(str(path)))

    @classmethod
    def from_gguf(cls, g) -> "LocalTokenizer":
        _check_vocab_metadata(g)
        model = g.get("tokenizer.ggml.model")
        if model in FRAGMENT_ENCODERS:
            return cls(_GGUFVocab(g, FRAGMENT_ENCODERS[model](g), model))
        raise TokenizerError(f"tokenizer model {model!r} in {g.path} is not supported "
                             f"({', '.join(FRAGMENT_ENCODERS)} are); attach a tokenizer.json")

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TokenizerError(f"expected text, got {type(text).__name__}")
        return self._impl.encode(text, add_special_tokens, parse_special)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._impl.decode([int(i) for i in ids], skip_special_tokens)

    def encode_piece(self, text: str) -> list[int]:
        """Text inside a longer text: no BOS, no SentencePiece space prefix, no special tokens
        (what a grammar engine tokenizes forced text with)."""
        return self._impl.encode_piece(text)

    def decode_bytes(self, ids: Sequence[int], skip_special_tokens: bool = True) -> bytes:
        """The raw bytes of the tokens (a prefix may end inside a UTF-8 character)."""
        return self._impl.decode_bytes([int(i) for i in ids], skip_special_tokens)


class _Impl:
    bos_id: int | None
    eos_id: int | None
    n_vocab: int


class _HFFile(_Impl):
    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as exc:
            raise TokenizerError(f"cannot load tokenizer {path}: {exc}") from None
        self.n_vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.bos_id = self.eos_id = None
        self.path = path

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: list[int], skip: bool) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip)

    def decode_bytes(self, ids: list[int], skip: bool) -> bytes:
        return self.decode(ids, skip).encode("utf-8", "surrogatepass")

    def encode_piece(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


def _check_vocab_metadata(g) -> None:
    """The tokenizer.ggml.* values a file carries have the types and lengths llama.cpp requires
    (a file from anywhere is untrusted input): else TokenizerError naming the key."""
    def bad(key: str, what: str) -> TokenizerError:
        return TokenizerError(f"{g.path}: {key} {what}; the file's vocabulary is malformed")

    tokens = g.get("tokenizer.ggml.tokens")
    strings = g.metadata_types.get("tokenizer.ggml.tokens") == (T_GGUF_ARRAY, T_GGUF_STRING)  # each item a str
    if not isinstance(tokens, list) or not tokens or not strings:
        raise bad("tokenizer.ggml.tokens", "is not a non-empty list of strings")
    n = len(tokens)
    for key, kinds in (("tokenizer.ggml.scores", "iuf"), ("tokenizer.ggml.token_type", "iu")):
        v = g.get(key)
        if v is None:
            continue
        if isinstance(v, list):  # (the reader gives long numeric arrays as numpy arrays)
            v = np.asarray(v) if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v) else None
        if not isinstance(v, np.ndarray) or v.ndim != 1 or len(v) != n or v.dtype.kind not in kinds:
            raise bad(key, f"is not a list of {n} numbers")
    merges = g.get("tokenizer.ggml.merges")
    if merges is not None and (not isinstance(merges, list)
                               or not all(isinstance(m, str) and " " in m.strip(" ") for m in merges)):
        raise bad("tokenizer.ggml.merges", "is not a list of 'left right' pairs")
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        v = g.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n):
            raise bad(key, f"is not a token id below {n}")
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        if g.get(key) is not None and not isinstance(g.get(key), str):
            raise bad(key, "is not a string")


def _gpt2_fragment_encoder(g):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = g.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_REGEXES:
        raise TokenizerError(
            f"pre-tokenizer {pre!r} of {g.path} is not implemented; known: "
            f"{', '.join(sorted(PRE_REGEXES))}. Attach the model's tokenizer.json instead")
    tokens = g.get("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in g.get("tokenizer.ggml.merges", [])]
    try:
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                         ignore_merges=pre in IGNORE_MERGES)
    except Exception as exc:  # the tokenizers library's own check (a merge of unknown tokens)
        raise TokenizerError(f"{g.path}: tokenizer.ggml.merges do not fit the vocabulary ({exc})") from None
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_REGEXES[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _wordpiece_fragment_encoder(g):
    from .wordpiece import encoder

    lower = bool(g.get("tokenizer.ggml.normalizer.lowercase", True))
    return encoder(list(g.get("tokenizer.ggml.tokens")), int(g.get("tokenizer.ggml.unknown_token_id", 100)), lower,
                   bool(g.get("tokenizer.ggml.normalizer.strip_accents", lower)))


# tokenizer.ggml.model -> (g -> text fragment -> ids), or None: SentencePiece (_GGUFVocab._spm)
FRAGMENT_ENCODERS = {"gpt2": _gpt2_fragment_encoder, "llama": lambda g: None, "bert": _wordpiece_fragment_encoder}

_BYTE_DECODER: dict[str, int] | None = None


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-unicode map, inverted."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(bs, cs)}
    return _BYTE_DECODER


class _GGUFVocab(_Impl):
    def __init__(self, g, fragment_encode, model: str = "gpt2") -> None:
        self.tokens: list[str] = list(g.get("tokenizer.ggml.tokens") or [])
        if not self.tokens:
            raise TokenizerError(f"{g.path} carries no vocabulary (tokenizer.ggml.tokens)")
        n = len(self.tokens)
        types = g.get("tokenizer.ggml.token_type")  # numpy arrays (_check_vocab_metadata), or absent
        types = np.asarray(types, np.int64) if types is not None else np.full(n, T_NORMAL, np.int64)
        self.types = types.tolist()
        scores = g.get("tokenizer.ggml.scores")
        self.scores = np.asarray(scores, np.float64).tolist() if scores is not None else [0.0] * n
        self.n_vocab = n
        self.model, self.fragment_encode = model, fragment_encode
        self.ids = dict(zip(self.tokens, range(n)))  # a repeated token: its last id, as before
        self.bos_id = g.get("tokenizer.ggml.bos_token_id", 101 if model == "bert" else None)
        self.eos_id = g.get("tokenizer.ggml.eos_token_id")
        self.sep_id = g.get("tokenizer.ggml.seperator_token_id", 102) if model == "bert" else None  # llama.cpp's spelling
        self.add_bos = model == "bert" or bool(g.get("tokenizer.ggml.add_bos_token", model == "llama"))
        self.add_eos = bool(g.get("tokenizer.ggml.add_eos_token", False))
        self.add_space_prefix = bool(g.get("tokenizer.ggml.add_space_prefix", model == "llama"))
        # split-out tokens, longest first (llama.cpp's cache_special_tokens)
        special = np.flatnonzero(np.isin(types, (T_CONTROL, T_USER_DEFINED, T_UNKNOWN))).tolist()
        self.special = sorted(special, key=lambda i: -len(self.tokens[i].encode()))
        self.byte_ids = {}
        for i in np.flatnonzero(types == T_BYTE).tolist():
            if len(self.tokens[i]) == 6 and self.tokens[i].startswith("<0x"):
                self.byte_ids[int(self.tokens[i][3:5], 16)] = i

    # -------------------------------------------------------------- encode

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        frags: list[str | int] = [text]
        for sid in self.special:
            if not parse_special and self.types[sid] in (T_CONTROL, T_UNKNOWN):
                continue
            piece = self.tokens[sid]
            if not piece:
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or piece not in f:
                    out.append(f)
                    continue
                parts = f.split(piece)
                for k, p in enumerate(parts):
                    if p:
                        out.append(p)
                    if k < len(parts) - 1:
                        out.append(sid)
            frags = out
        return frags

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(int(self.bos_id))
        prev_special = True
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.fragment_encode is not None:
                out.extend(self.fragment_encode(frag))
            else:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                out.extend(self._spm(frag.replace(" ", "\u2581")))
            prev_special = False
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(int(self.eos_id))
        if add_special and self.sep_id is not None:  # WordPiece: [CLS] text [SEP]
            out.append(int(self.sep_id))
        return out

    def encode_piece(self, text: str) -> list[int]:
        if self.fragment_encode is not None:
            return self.fragment_encode(text)
        return self._spm(text.replace(" ", "\u2581"))

    def _spm(self, text: str) -> list[int]:
        """llama.cpp's SentencePiece-BPE: merge the best-scoring adjacent pair (ties: leftmost)
        while the merged text is a vocabulary token; unknown pieces fall back to bytes."""
        syms = list(text)  # symbol texts; "" once merged away
        n = len(syms)
        prev, nxt = list(range(-1, n - 1)), list(range(1, n + 1))
        if n:
            nxt[-1] = -1
        heap: list[tuple[float, int, int, str]] = []
        rev: dict[str, tuple[str, str]] = {}

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = syms[left] + syms[right]
            tid = self.ids.get(merged)
            if tid is None:
                return
            heapq.heappush(heap, (-self.scores[tid], left, right, merged))
            rev[merged] = (syms[left], syms[right])

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            if not syms[left] or not syms[right] or syms[left] + syms[right] != merged or nxt[left] != right:
                continue
            syms[left], syms[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        out: list[int] = []
        i = 0 if n else -1
        while i != -1:
            self._resegment(syms[i], rev, out)
            i = nxt[i]
        return out

    def _resegment(self, piece: str, rev: dict[str, tuple[str, str]], out: list[int]) -> None:
        tid = self.ids.get(piece)
        if tid is not None:
            out.append(tid)
            return
        split = rev.get(piece)
        if split is None:
            for b in piece.encode("utf-8"):
                bid = self.byte_ids.get(b)
                if bid is None:
                    raise TokenizerError(f"byte {b:#04x} has no token and no byte fallback")
                out.append(bid)
            return
        self._resegment(split[0], rev, out)
        self._resegment(split[1], rev, out)

    # -------------------------------------------------------------- decode

    def decode_bytes(self, ids: list[int], skip: bool) -> bytes:
        parts: list[bytes] = []
        byte_dec = _byte_level_decoder() if self.model == "gpt2" else None
        for i in ids:
            if not 0 <= i < self.n_vocab:
                raise TokenizerError(f"token id {i} outside the vocabulary of {self.n_vocab}")
            t, piece = self.types[i], self.tokens[i]
            if t in (T_CONTROL, T_UNKNOWN, T_UNUSED):
                if not skip and t == T_CONTROL:
                    parts.append(piece.encode())
                continue
            if t == T_USER_DEFINED:
                parts.append(piece.encode())
            elif t == T_BYTE and byte_dec is None:
                parts.append(bytes([int(piece[3:5], 16)]))
            elif byte_dec is not None:
                parts.append(bytes(byte_dec.get(c, ord("?")) for c in piece))
            else:
                parts.append(piece.replace("\u2581", " ").encode())
        out = b"".join(parts)
        return out[1:] if self.model == "bert" and out.startswith(b" ") else out  # WordPiece: no leading space

    def decode(self, ids: list[int], skip: bool) -> str:
        return self.decode_bytes(ids, skip).decode("utf-8", "replace")
