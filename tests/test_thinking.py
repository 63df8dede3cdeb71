from __future__ import annotations

import random

import pytest

from rase.thinking import ThinkFilter, with_no_think

CASES = [
    ("<think>\nplan\n</think>\n\nAnswer.", "Answer.", "\nplan\n"),
    ("<think></think>\n\nAnswer.", "Answer.", ""),
    ("</think>\n\nAnswer.", "Answer.", ""),
    ("</think></think>Answer.", "Answer.", ""),
    ("Answer with a literal </think> inside.", "Answer with a literal </think> inside.", ""),
    ("Plain answer.", "Plain answer.", ""),
]


@pytest.mark.parametrize("text,answer,reasoning", CASES)
@pytest.mark.parametrize("seed", range(8))
def test_strip_and_separate_on_any_split(text, answer, reasoning, seed):
    rng = random.Random(seed)
    for mode in ("strip", "separate"):
        f = ThinkFilter(mode)
        out, i = [], 0
        while i < len(text):
            n = rng.randint(1, 4)
            out.append(f.feed(text[i:i + n]))
            i += n
        out.append(f.flush())
        assert "".join(out) == answer
        assert f.reasoning == reasoning


def test_keep_passes_everything():
    f = ThinkFilter("keep")
    assert f.feed("<think>x</think>y") + f.flush() == "<think>x</think>y"
    with pytest.raises(ValueError):
        ThinkFilter("hide")


def test_no_think_switch():
    assert with_no_think([{"role": "user", "content": "Hi"}])[0] == {"role": "system", "content": "/no_think"}
    msgs = with_no_think([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert msgs[0]["content"] == "Be brief. /no_think"
    assert with_no_think(msgs) == msgs  # idempotent
