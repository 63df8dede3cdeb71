"""WordPiece (`tokenizer.ggml.model = bert`) as llama.cpp tokenizes it (llm_tokenizer_wpm):
the text is split into words (whitespace separates, every punctuation mark, ASCII symbol and
CJK ideograph is a word of its own; controls dropped; lower-cased, and accents stripped after
NFD, unless the file's tokenizer.ggml.normalizer.* say otherwise), then each word, prefixed
with the phantom space "\u2581" (the converter writes word-initial pieces as "\u2581piece" and
"##piece" continuations bare), is cut greedily into the longest vocabulary pieces, compared as
UTF-8 bytes; a word with a part no piece matches becomes one [UNK].
"""
from __future__ import annotations

import unicodedata
from typing import Callable

PHANTOM = "\u2581"
# llama.cpp's whitespace set (unicode-data.cpp)
WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                        0x202F, 0x205F, 0x3000])
CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
       (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _lower(c: str) -> str:
    low = c.lower()
    return low if len(low) == 1 else c  # a simple (one code point) mapping, as llama.cpp's table


def _alone(c: str, cat: str) -> bool:
    """Punctuation, an ASCII symbol or a CJK ideograph: a word of its own."""
    cp = ord(c)
    return cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or any(lo <= cp <= hi for lo, hi in CJK)


def words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """llama.cpp's llm_tokenizer_wpm_session::preprocess."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    out, word = [], []
    for c in text:
        if ord(c) in WHITESPACE:
            if word:
                out.append("".join(word))
                word = []
            continue
        cat = unicodedata.category(c)
        if ord(c) in (0, 0xFFFD) or cat[0] == "C" or (strip_accents and cat[0] == "M"):
            continue
        s = _lower(c) if lowercase else c
        if _alone(c, cat):
            if word:
                out.append("".join(word))
            out.append(s)
            word = []
        else:
            word.append(s)
    if word:
        out.append("".join(word))
    return out


def encoder(tokens: list[str], unk_id: int, lowercase: bool = True,
            strip_accents: bool = True) -> Callable[[str], list[int]]:
    """text -> ids for a vocabulary in the phantom-space form; the longest match is searched
    over at most the longest token's byte length (llama.cpp's max_token_len)."""
    ids = {t.encode(): i for i, t in enumerate(tokens)}  # a repeated piece: the last id, as llama.cpp
    longest = max(len(t) for t in ids)

    def encode(text: str) -> list[int]:
        out: list[int] = []
        for w in words(text, lowercase, strip_accents):
            b, start, i = (PHANTOM + w).encode(), len(out), 0
            while i < len(b):
                for j in range(min(len(b), i + longest + 1), i, -1):
                    tid = ids.get(b[i:j])
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:
                    del out[start:]  # a part no piece matches: the whole word is unknown
                    break
            if len(out) == start:
                out.append(unk_id)
        return out

    return encode
