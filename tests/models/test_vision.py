"""rase/models/vision: mmproj files read and refused as llama.cpp reads them, and each encoder's
image embeddings against llama.cpp's (tests/fixtures/vision, tools/make_vision_fixtures.py).

Tolerance: max |rase - llama.cpp| <= 2e-3 x std(llama.cpp's embeddings). rase's pixels are
llama.cpp's exactly (tests/media); the rest differs only in summation order (numpy's BLAS against
ggml's F32 / F16 dot products), and where that moves an activation across an F16 rounding (ggml's
GELU table, the F16 projection's input) a few elements move by up to ~1e-3 x std; the median
element by 2e-5 x std. Measured maxima: Gemma 3 5.2e-4, SmolVLM 1.6e-4, LFM2-VL 1.04e-3.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from rase.errors import CorruptModelFile, UnsupportedArchitecture
from rase.media.image import decode_image
from rase.models.vision import load_encoder
from rase.store.gguf import GGUFFile

VISION = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
NAMES = ("gemma3", "idefics3", "lfm2", "qwen3vl", "qwen25vl")
REFS = {n: json.loads((VISION / f"{n}-tiny.llamacpp.json").read_text()) for n in NAMES}
EMBDS = {n: np.load(VISION / f"{n}-tiny.llamacpp-embd.npz") for n in NAMES}
REF, EMBD = REFS["gemma3"], EMBDS["gemma3"]


def _encoder(name: str):
    with GGUFFile(VISION / f"{name}-tiny-mmproj.gguf") as g:
        return load_encoder(g)


@pytest.fixture(scope="module")
def gemma3():
    return _encoder("gemma3")


@pytest.mark.parametrize("name", NAMES)
def test_fixture_files_are_the_ones_llamacpp_ran(name):
    import hashlib

    for key in ("text", "mmproj"):
        assert hashlib.sha256((VISION / REFS[name][key]).read_bytes()).hexdigest() == REFS[name][f"{key}_sha256"]


@pytest.mark.parametrize("name, case", [(n, i) for n in NAMES for i in range(len(REFS[n]["cases"]))])
def test_embeddings_within_tolerance_of_llamacpp(name, case):
    module, enc = _encoder(name)
    c = REFS[name]["cases"][case]
    image = decode_image((VISION / c["image"]).read_bytes())
    ref = EMBDS[name][f"case{case}"]
    got = enc.embed(image)
    assert got.shape == ref.shape == (enc.tokens(image), 256)
    assert sum(ch["n_tokens"] for ch in c["chunks"] if "image" in ch) == enc.tokens(image)
    assert [item[1] for item in enc.layout(image) if item[0] == "rows"] == [ch["n_tokens"] for ch in c["chunks"] if "image" in ch]
    err = np.abs(got - ref).max() / ref.std()
    assert err <= 2e-3, f"max |delta| = {err:.2e} x std"
    assert np.median(np.abs(got - ref)) / ref.std() < 1e-4  # the bulk agrees far closer
    assert err > 0  # not a copy: the arithmetic is rase's


def test_gemma3_description(gemma3):
    module, enc = gemma3
    assert module.MARKERS == ("<start_of_image>", "<end_of_image>") and module.CAUSAL is False
    assert enc.n_tokens == (64 // 8 // 2) ** 2


def test_idefics3_description():
    module, enc = _encoder("idefics3")
    assert module.CAUSAL is True and enc.per_tile == (32 // 8 // 2) ** 2 and enc.longest == 64


def _edited(tmp_path, edit) -> Path:
    """The gemma3 mmproj rewritten with edit(writer_kwargs) applied through the gguf package."""
    import gguf

    src = gguf.GGUFReader(str(VISION / "gemma3-tiny-mmproj.gguf"))
    out = tmp_path / "edited-mmproj.gguf"
    w = gguf.GGUFWriter(str(out), "clip")
    fields, tensors = {}, {t.name: t for t in src.tensors}
    for f in src.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        fields[f.name] = f
    edit(w, fields, tensors)
    for f in fields.values():
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, [float(f.parts[i][0]) for i in f.data])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(f.name, bytes(f.parts[f.data[0]]).decode())
        else:
            w.add_key_value(f.name, f.parts[f.data[0]][0].item(), vt)
    for t in tensors.values():
        w.add_tensor(t.name, np.asarray(t.data).reshape(tuple(reversed([int(x) for x in t.shape]))),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return out


def _load(path):
    with GGUFFile(path) as g:
        return load_encoder(g)


def test_an_untouched_rewrite_loads(tmp_path):
    _load(_edited(tmp_path, lambda w, f, t: None))


def test_an_unsupported_projector_is_refused_by_name(tmp_path):
    def edit(w, fields, tensors):
        del fields["clip.projector_type"]
        w.add_string("clip.projector_type", "pixtral")
    with pytest.raises(UnsupportedArchitecture, match="pixtral.*gemma3"):
        _load(_edited(tmp_path, edit))


def test_a_size_key_of_the_wrong_type_is_refused(tmp_path):
    def edit(w, fields, tensors):
        del fields["clip.vision.patch_size"]
        w.add_int32("clip.vision.patch_size", 8)  # llama.cpp asserts UINT32
    with pytest.raises(CorruptModelFile, match="UINT32"):
        _load(_edited(tmp_path, edit))


def test_a_missing_or_misshapen_tensor_is_refused(tmp_path):
    with pytest.raises(CorruptModelFile, match="post_ln.weight is missing"):
        _load(_edited(tmp_path, lambda w, f, t: t.pop("v.post_ln.weight")))


def test_a_text_model_is_not_an_mmproj(tmp_path):
    shutil.copy(VISION / "gemma3-tiny.gguf", tmp_path / "x.gguf")
    with pytest.raises(CorruptModelFile, match="not an mmproj"):
        _load(tmp_path / "x.gguf")
