"""tools/make_arch_fixtures.py is the recipe of the newer tiny files of tests/fixtures/archs:
each family's F32 source regenerates byte for byte (its SHA-256 is in binds.json) and llama.cpp's
quantizer turns it into the committed Q8_0 file; and each family's distinctive feature binds in
llama.cpp itself: the same source with the feature neutralized (factors 1, multipliers 1, RoPE in
every layer, causal attention without positions or token types; gpt-oss: sinks at -1e4, then a
window past the context; lfm2: convolution taps that see only the current position; qwen35: those
taps too and a delta rule that forgets at once) gives different outputs, so a file cannot pass the conformance tests by
not exercising its feature."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ROOT / "tests" / "fixtures" / "archs"


def _tool():
    spec = importlib.util.spec_from_file_location("make_arch_fixtures", ROOT / "tools" / "make_arch_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TOOL = _tool()
RECORDS = json.loads((ARCHS / "binds.json").read_text())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_family_has_its_record():
    assert sorted(RECORDS) == sorted(TOOL.FAMILIES)
    for name in TOOL.FAMILIES:
        for q in TOOL.FAMILY_QUANTS.get(name, TOOL.QUANTS):
            assert RECORDS[name][f"{q}_sha256"] == _sha(ARCHS / f"{name}-{q}.gguf")


@pytest.mark.parametrize("name", sorted(TOOL.FAMILIES))
def test_sources_regenerate_and_the_feature_binds(tmp_path, name):
    write, kind = TOOL.FAMILIES[name]
    src = tmp_path / f"{name}-f32.gguf"
    write(src, False)
    assert _sha(src) == RECORDS[name]["f32_sha256"]
    TOOL.quantize(src, tmp_path / "q8.gguf", TOOL.QUANTS["q8_0"])
    assert _sha(tmp_path / "q8.gguf") == _sha(ARCHS / f"{name}-q8_0.gguf") == RECORDS[name]["q8_0_sha256"]
    moved = TOOL.binds(name, write, kind, tmp_path)
    if kind == "encoder":  # cosine of each text's embedding, feature on vs off
        assert moved["max_cosine_real_vs_neutral"] < 0.9, moved
        return
    # one record per feature where a family has several (gpt-oss: sinks, sliding window)
    for feature, m in (moved.items() if name in TOOL.FEATURES else [(name, moved)]):
        assert m["max_logit_change"] > 1.0 and m["top1_changed"] > 0.05, (feature, m)
