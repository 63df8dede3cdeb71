"""WordPiece (tokenizer.ggml.model = bert) against llama.cpp's own tokenization of the encoder
fixtures (tests/fixtures/archs/*-embd.json: texts with accents, CJK, punctuation, controls,
full-width forms and special-token text), and the rules one by one."""
from __future__ import annotations

import json

import pytest

from rase import GGUFFile
from rase.text.tokenizer import LocalTokenizer
from rase.text.wordpiece import encoder, words
from tests.support.models import ARCHS, ENCODERS


@pytest.mark.parametrize("name", ENCODERS)
def test_ids_equal_llamacpp(name):
    tok = LocalTokenizer.from_gguf(GGUFFile(ARCHS / f"{name}.gguf"))
    fx = json.loads((ARCHS / f"{name}.llamacpp-embd.json").read_text())
    cases = fx["tokenize"] + fx["texts"]
    assert len(cases) > 25 and any(100 in c["ids"] for c in cases)  # [UNK] is exercised
    for c in cases:  # [CLS] ... [SEP] added, special-token text left as text
        assert tok.encode(c["text"], add_special_tokens=True, parse_special=False) == c["ids"], c["text"]
    for c in fx["tokenize_special"]:
        assert tok.encode(c["text"], add_special_tokens=False, parse_special=True) == c["ids"], c["text"]


def test_words_split_as_llamacpp():
    assert words("Hello, World!  ÀÉ\tx") == ["hello", ",", "world", "!", "ae", "x"]
    assert words("日本語ok a\u200bb") == ["日", "本", "語", "ok", "ab"]  # CJK alone; zero-width (Cf) dropped
    assert words("Ünï", lowercase=False, strip_accents=False) == ["Ünï"]
    assert words("a~b") == ["a", "~", "b"] and words("a°b") == ["a°b"]  # only ASCII symbols split


def test_longest_match_and_unknown_words():
    vocab = ["[UNK]", "\u2581un", "\u2581unbe", "lie", "liev", "able", "\u2581x"]
    enc = encoder(vocab, 0)
    assert enc("unbelievable") == [2, 4, 5]  # longest first at every position
    assert enc("unbelievablez x") == [0, 6]  # a part no piece matches: the whole word is [UNK]
