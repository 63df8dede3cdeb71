"""gpt-oss (rase/models/gpt_oss.py) on its tiny llama.cpp-made files: each of its features is
needed to equal llama.cpp's one-token logits (tests/models/test_archs.py shows that rase does). With
one feature taken out of rase's plan (no sinks, no clamp, no window, the router's softmax over
all experts) the logits move away from llama.cpp's, so no feature passes by not being exercised:
the sinks and the window also bind in llama.cpp itself (tests/models/test_arch_fixtures.py), the clamp
only here, since llama.cpp's limit is a constant."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import rase.store.plan
from rase.engine.decoder import load_gguf_decoder
from tests.support.models import ARCHS

NAME = "gpt-oss-tiny-mxfp4"


def _no_sinks(f):
    return replace(f, layers=tuple(replace(L, sinks=None) for L in f.layers))


def _no_window(f):
    return replace(f, layers=tuple(replace(L, window=0) for L in f.layers))


KNOCKOUTS = {
    "sinks": _no_sinks,
    "clamp": lambda f: replace(f, params={**f.params, "swiglu_limit": 1e30}),
    "window": _no_window,
    "gating": lambda f: replace(f, params={**f.params, "expert_gating": "softmax"}),
}


def _max_error(dec, fixture: dict) -> float:
    err = 0.0
    for p in fixture["prompts"]:
        logits = dec.prefill(p["ids"], all_logits=True)
        for i, top in enumerate(p["topk"]):
            err = max(err, max(abs(float(logits[i][t]) - v) for t, v in top))
    return err


@pytest.mark.parametrize("feature", sorted(KNOCKOUTS))
def test_each_feature_is_needed_to_equal_llama_cpp(monkeypatch, feature):
    fixture = json.loads((ARCHS / f"{NAME}.llamacpp-t1.json").read_text())
    assert _max_error(load_gguf_decoder(None, ARCHS / f"{NAME}.gguf"), fixture) < 1e-4
    build = rase.store.plan.build_layout
    monkeypatch.setattr(rase.store.plan, "build_layout", lambda *a: KNOCKOUTS[feature](build(*a)))
    err = _max_error(load_gguf_decoder(None, ARCHS / f"{NAME}.gguf"), fixture)
    print(f"without {feature}: max |logit - llama.cpp's| {err:.3f}")
    assert err > 0.5, feature


def test_sliding_layers_follow_the_files_pattern():
    """Layer il slides when il % 2 < 1 (llama.cpp's load_swa_pattern(ml, 2)): the tiny file's
    layer 0 has the window, layer 1 full attention, each with its RoPE slot."""
    from rase.store.gguf import GGUFFile
    from rase.models import gpt_oss
    from rase.models.base import read_hparams

    g = GGUFFile(ARCHS / f"{NAME}.gguf")
    spec = gpt_oss.spec(g, read_hparams(g))
    assert [(ls.window, ls.rope_slot) for ls in spec.layers] == [(16, 1), (0, 0)]
    assert spec.rope[0].yarn and spec.rope[1].yarn and spec.rope[0].base == spec.rope[1].base == 150000.0
    assert gpt_oss._sliding(g, 5) == [True, False, True, False, True]
