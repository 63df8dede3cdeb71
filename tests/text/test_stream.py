"""Streaming text: random splits of multilingual text into tokens, random stop strings; the
deltas always reassemble to exactly the non-streamed result and never show a stop string."""
from __future__ import annotations

import random

import pytest

from rase.text.stream import TextStream, non_streamed

TEXTS = [
    "Hello, world! The capital of France is Paris.",
    "안녕하세요, 만나서 반갑습니다. 오늘 날씨가 좋네요.",
    "Emoji: 🙂🚀👩‍👩‍👧 and flags 🇫🇷🇰🇷 mixed with text",
    "日本語のテキストと English words, العربية أيضا, and ελληνικά.",
    "code: def f(x):\n    return x ** 2  # done\n\n<|im_end|> trailing",
]


def _tokens(data: bytes, rng: random.Random) -> list[bytes]:
    """Random byte chunks: tokens that split UTF-8 characters anywhere."""
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 5)
        out.append(data[i:i + n])
        i += n
    return out


def _stream(chunks: list[bytes], stop: list[str]) -> tuple[str, list[str]]:
    s = TextStream(lambda t: chunks[t], stop)
    deltas = [s.push(i) for i in range(len(chunks))] + [s.finish()]
    return "".join(deltas), deltas


@pytest.mark.parametrize("seed", range(300))
def test_random_splits_reassemble_exactly(seed):
    rng = random.Random(seed)
    text = rng.choice(TEXTS) + rng.choice(TEXTS)
    stops: list[str] = []
    for _ in range(rng.randint(0, 3)):
        if rng.random() < 0.7:  # a substring of the text: it will match
            a = rng.randrange(len(text))
            stops.append(text[a:a + rng.randint(1, 6)])
        else:
            stops.append(rng.choice(["</s>", "END", "\n\n\n", "🙂🙂", "xyz"]))
    chunks = _tokens(text.encode(), rng)
    got, deltas = _stream(chunks, stops)
    assert got == non_streamed(text, stops)
    for d in deltas:
        assert "\ufffd" not in d  # never a broken character
    emitted = ""
    for d in deltas[:-1]:
        emitted += d
        for s in stops:
            if s:
                assert s not in emitted  # a stop string never leaks, not even in part of a delta


def test_hold_back_only_what_could_start_a_stop():
    chunks = [b"Hello ", b"E", b"N", b"x"]
    s = TextStream(lambda t: chunks[t], ["END"])
    assert s.push(0) == "Hello "  # nothing could start "END" yet
    assert s.push(1) == ""        # "E" might become "END"
    assert s.push(2) == ""        # "EN" too
    assert s.push(3) == "ENx"     # it did not
    assert s.finish() == ""


def test_stop_cuts_at_the_earliest_match_and_ignores_the_rest():
    chunks = [b"output E", b"ND </s>", b" more"]
    s = TextStream(lambda t: chunks[t], ["</s>", "END"])
    out = s.push(0) + s.push(1) + s.push(2) + s.finish()
    assert out == "output " and s.stopped and s.tokens == [0, 1]


def test_genuinely_invalid_bytes_become_replacement_at_the_end():
    chunks = [b"ok ", b"\xe2\x82"]  # an unfinished character at the very end
    s = TextStream(lambda t: chunks[t])
    assert s.push(0) == "ok " and s.push(1) == ""
    assert s.finish() == "\ufffd"


def test_empty_stop_strings_match_nothing():
    chunks = [b"abc"]
    s = TextStream(lambda t: chunks[t], ["", ""])
    assert s.push(0) + s.finish() == "abc"
