"""rase model convert (rase/convert/): tiny Hugging Face checkpoints of llama (Llama 3 rope scaling),
qwen3, gemma3 and qwen3moe, written by tests/support/hf_checkpoints.py in HF's layout, converted to GGUF.

- The converted model's logits equal the transformers forward run in numpy on the original
  safetensors (tests/support/hf_reference.py: HF names, HF's q/k layout, Gemma's 1 + w) within float
  tolerance; a converter that skips llama's q/k permutation or Llama 3's rope_freqs is caught.
- llama.cpp (llama-cpp-python) loads every converted file. rase's logits equal llama.cpp's
  one-token logits bit for bit where rase's numerics are llama.cpp's (F32, Q8_0, Q6_K, and
  Q4_K_M on the dense families), against tests/fixtures/convert.llamacpp-t1.json (made by
  benchmarks/convert_fixture.py with the portable AVX2 llama-cpp-python 0.3.36, the build every
  t1 fixture comes from); a live llama.cpp built for this CPU differs from that build by ulps
  (its AVX-512 dots), so against it every type is held to the calibrated bars.
- Every tensor is byte-identical to what llama.cpp's own quantizer (llama_model_quantize) writes
  from the same values, for every file type rase writes (tests/convert/test_convert_refusals.py: what
  is refused; tests/kernels/test_quantize.py: the C quantizers)."""
from __future__ import annotations

import ctypes
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from rase import convert_model
from rase.convert import archs
from rase.convert.mix import FTYPES
from rase.engine.decoder import load_gguf_decoder
from rase.store.gguf import GGUFFile
from tests.support import hf_reference
from tests.support.hf_checkpoints import TOKENS
from tests.support.hf_checkpoints import KINDS, load_checkpoint, write_checkpoint

SPEC_TOL = 2e-3  # max |ours - spec| / max |spec|: F32 weights, f16 KV cache
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_K_M", "Q4_0")
# rase's numerics are llama.cpp's one-token numerics on these files; not on F16/BF16 (rase keeps
# f32 activations where llama.cpp rounds them to the weight type), Q4_0 (block-sum numerics,
# rase/kernels/_repack_bs.h), and the MoE's Q4_K experts (llama.cpp's mul_mat_id sums them in
# ggml_vec_dot_q4_K_q8_K's order, rase in its gemv_q4_K_8x8's)
EXACT = {f"{k}-{t}" for k in KINDS for t in ("F32", "Q8_0", "Q6_K", "Q4_K_M")} - {"qwen3moe-Q4_K_M"}
FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "convert.llamacpp-t1.json").read_text())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {kind: write_checkpoint(root / kind, kind) for kind in KINDS}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("store")


def _logits(path, tokens=TOKENS) -> np.ndarray:
    return load_gguf_decoder(None, str(path)).prefill(tokens, all_logits=True)


def _spec_error(folder: Path, gguf_path) -> float:
    cfg, weights = load_checkpoint(folder)
    spec = hf_reference.forward(cfg, weights, TOKENS)
    return float(np.abs(_logits(gguf_path) - spec).max() / np.abs(spec).max())


@pytest.mark.parametrize("kind", KINDS)
def test_converted_logits_equal_the_transformers_forward_on_the_original_checkpoint(checkpoints, store, kind):
    m = convert_model(checkpoints[kind], f"{kind}-f32", "F32", store=store)
    err = _spec_error(checkpoints[kind], m.weights)
    print(f"{kind}: max |rase - HF spec| / max |spec| = {err:.2e}")
    assert err < SPEC_TOL


def test_the_spec_comparison_catches_a_missing_permutation_and_missing_rope_freqs(checkpoints, store, monkeypatch):
    """The same check on two broken converters: one leaves llama's q/k rows in HF's order, one
    drops Llama 3's rope_freqs; each is off by far more than the tolerance."""
    folder = checkpoints["llama3"]
    monkeypatch.setitem(archs.ARCHS, "LlamaForCausalLM", archs.HFArch("llama", archs.LLAMA.layer, permute=False,
                                                                     keys=archs.LLAMA.keys))
    unpermuted = _spec_error(folder, convert_model(folder, "llama3-unpermuted", "F32", store=store).weights)
    monkeypatch.undo()
    monkeypatch.setattr(archs, "llama3_rope_freqs", lambda cfg: None)
    monkeypatch.setattr("rase.convert.plan.llama3_rope_freqs", lambda cfg: None)
    no_freqs = _spec_error(folder, convert_model(folder, "llama3-nofreqs", "F32", store=store).weights)
    print(f"unpermuted q/k: {unpermuted:.2e}; without rope_freqs: {no_freqs:.2e}")
    assert unpermuted > 50 * SPEC_TOL and no_freqs > 10 * SPEC_TOL


def _llamacpp_t1(path, tokens=TOKENS) -> np.ndarray:
    from tests.support.llamacpp_ref import llama

    llm = llama(path, n_ctx=64, n_batch=1, n_ubatch=1, logits_all=True, n_threads=1)
    for t in tokens:
        llm.eval([t])
    out = np.array([llm.scores[i] for i in range(len(tokens))], np.float32)
    llm.close()
    return out


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_one_token_logits_equal_llama_cpps(checkpoints, store, kind, qtype):
    m = convert_model(checkpoints[kind], f"{kind}-{qtype.lower()}", qtype, store=store)
    ours, ref = _logits(m.weights), FIXTURE["files"][f"{kind}-{qtype}"]
    assert ours.argmax(-1).tolist() == ref["top1"]
    if f"{kind}-{qtype}" in EXACT:
        assert hashlib.sha256(ours.tobytes()).hexdigest() == ref["sha256"]
    theirs = _llamacpp_t1(m.weights)  # this machine's llama.cpp loads the file
    rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    print(f"{kind} {qtype}: max |rase - live llama.cpp| / max |llama.cpp| = {rel:.1e}")
    assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
    assert rel < 3e-2  # measured here: up to 1.5e-2 (llama3 Q4_K_M); a wrong conversion is off by 0.2-0.4


def _quantize_with_llamacpp(src: Path, dst: Path, qtype: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = FTYPES[qtype][0], 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0


def _same_tensors(a, b) -> list[str]:
    x, y = GGUFFile(a), GGUFFile(b)
    assert sorted(x.tensors) == sorted(y.tensors)  # llama-quantize writes them in its own order
    return [n for n in x.tensors if x.tensors[n].qtype != y.tensors[n].qtype or
            bytes(x.tensors[n].data) != bytes(y.tensors[n].data)]


@pytest.mark.parametrize("kind,dtype", [(k, "F32") for k in KINDS] + [("llama3", "BF16"), ("gemma3", "BF16")])
def test_every_tensor_is_what_llama_cpps_quantizer_writes_from_the_same_values(tmp_path, store, kind, dtype):
    """The checkpoint converted to its own precision (F32, or BF16: lossless) is llama.cpp's input;
    llama_model_quantize's output for each file type against rase's direct conversion: the same
    tensors, types (Q4_K_M's attn_v / ffn_down mix, the MoE's 8-expert bumps) and bytes."""
    folder = write_checkpoint(tmp_path / kind, kind, dtype=dtype, seed=3)
    base = convert_model(folder, f"{kind}-{dtype.lower()}-base", dtype, store=store).weights
    seen = set()
    for qtype in FTYPES:
        if qtype == "F32":
            continue
        ours = convert_model(folder, f"{kind}-{dtype.lower()}-{qtype.lower()}", qtype, store=store).weights
        theirs = tmp_path / f"{qtype}.gguf"
        _quantize_with_llamacpp(Path(base), theirs, qtype)
        assert _same_tensors(ours, theirs) == [], qtype
        seen |= {t.qtype.name for t in GGUFFile(ours).tensors.values()}
    assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "F16", "BF16"} <= seen


def test_the_manifest_records_the_source_files_and_the_store_verifies_the_file(checkpoints, tmp_path):
    from rase.store.registry import ModelRegistry

    m = convert_model(checkpoints["qwen3"], "q", "Q8_0", store=tmp_path)
    files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in checkpoints["qwen3"].iterdir()
             if f.suffix == ".safetensors" or f.name in ("config.json", "tokenizer.json", "tokenizer_config.json")}
    assert m.source == {"type": "convert", "path": str(checkpoints["qwen3"].absolute()), "quantization": "Q8_0",
                        "files": files}
    assert m.owned and Path(m.weights).parent == tmp_path / "blobs"
    assert ModelRegistry(tmp_path).verify("q").sha256 == hashlib.sha256(Path(m.weights).read_bytes()).hexdigest()
    assert sorted(p.name for p in (tmp_path / "blobs").iterdir()) == [Path(m.weights).name]


def _with_tokenizer(src: Path, dst: Path, variant: str) -> Path:
    """src's checkpoint with the tokenizer of another family."""
    from tests.support.hf_checkpoints import byte_level_tokenizer, spm_prepend, spm_tokenizer

    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    if variant == "gpt-2":
        byte_level_tokenizer(dst, None, ["<|endoftext|>"])
    elif variant == "smollm":
        byte_level_tokenizer(dst, None, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], digits=True)
    else:
        spm_tokenizer(dst)
        spm_prepend(dst)
    return dst


@pytest.mark.parametrize("variant", ["llama3", "qwen3", "gemma3", "gpt-2", "smollm", "llama2-spm"])
def test_the_converted_vocabulary_tokenizes_as_the_checkpoints_tokenizer(checkpoints, store, tmp_path, variant):
    """rase's tokenizer built from the GGUF's metadata, and llama.cpp's, against the checkpoint's
    own tokenizer.json (HF tokenizers): byte-level BPE with Llama 3's, Qwen's, GPT-2's and
    SmolLM's pre-tokenizers, and SentencePiece-style BPE with byte fallback (Gemma's; Llama 2's,
    which prepends a space)."""
    from tokenizers import Tokenizer

    from rase.text.tokenizer import LocalTokenizer
    from tests.support.llamacpp_ref import llama

    folder = checkpoints[variant] if variant in checkpoints else \
        _with_tokenizer(checkpoints["qwen3"], tmp_path / variant, variant)
    m = convert_model(folder, f"{variant}-tok", "Q8_0", store=store)
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ours = LocalTokenizer.from_gguf(GGUFFile(m.weights))
    lcpp = llama(m.weights, vocab_only=True)
    for text in ["Hello world! The quick brown fox.", "1234 + 5678 = 6912", "naïve café: Ünïcödé",
                 "def main():\n    return 42\n", "  two  spaces and\ttabs", "emoji 🦊 and 日本語"]:
        want = hf.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False) == want, text
        assert lcpp.tokenize(text.encode(), add_bos=False, special=False) == want, text
    g = GGUFFile(m.weights)
    spm = variant in ("gemma3", "llama2-spm")
    assert g.get("tokenizer.ggml.model") == ("llama" if spm else "gpt2")
    assert g.get("tokenizer.ggml.pre") == {"llama3": "llama-bpe", "qwen3": "qwen2"}.get(variant, "default" if spm
                                                                                          else variant)
    if spm:
        assert g.get("tokenizer.ggml.add_space_prefix") is (variant == "llama2-spm")


def test_a_half_gigabyte_checkpoint_converts_in_a_fraction_of_its_size(tmp_path):
    """Streaming: a 0.5 GB BF16 checkpoint (65,536 x 1024 embedding, 12 layers; its f32 values
    would be 1 GB) converted in a child process peaks at less than half the checkpoint's size
    of RSS, the interpreter, numpy and rase included; and the tensors are the ones the same
    weights give in F32 (the whole path through bands of rows equals one whole-tensor pass).
    The 1.7B figure against llama-quantize is benchmarks/bench_convert.py's."""
    import subprocess
    import sys

    from tests.support.hf_checkpoints import SHAPES, write_sized_checkpoint

    folder = tmp_path / "mid"
    write_sized_checkpoint(folder, SHAPES["mid"])
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    # VmHWM: this process image's peak (ru_maxrss would carry pytest's own across the exec)
    code = ("import sys; from rase import convert_model; "
            "convert_model(sys.argv[1], 'mid', 'Q4_K_M', store=sys.argv[2], n_threads=2); "
            "print(next(int(line.split()[1]) * 1024 for line in open('/proc/self/status') if line.startswith('VmHWM')))")
    out = subprocess.run([sys.executable, "-c", code, str(folder), str(tmp_path / "store")], capture_output=True,
                         text=True, check=True)
    peak = int(out.stdout.split()[-1])
    print(f"checkpoint {size / 2**20:.0f} MiB, peak RSS {peak / 2**20:.0f} MiB")
    assert size > 450 << 20 and peak < size / 2


def test_an_80_layer_llama_gets_llama_cpps_70b_attn_v_bump(tmp_path, store):
    """llama.cpp types an 80-layer llama with grouped KV heads as 70B and gives its attn_v
    Q5_K where Q4_K_M would give Q4_K (more bits where 8 heads share the matrix); rase's mix
    does too: the tensors equal llama_model_quantize's, and the bump is there to see."""
    folder = write_checkpoint(tmp_path / "llama80", "llama3", dtype="BF16", hp=dict(layers=80, ff=256))
    base = convert_model(folder, "llama80-bf16", "BF16", store=store).weights
    ours = convert_model(folder, "llama80-q4km", "Q4_K_M", store=store).weights
    _quantize_with_llamacpp(Path(base), tmp_path / "theirs.gguf", "Q4_K_M")
    assert _same_tensors(ours, tmp_path / "theirs.gguf") == []
    attn_v = {t.qtype.name for n, t in GGUFFile(ours).tensors.items() if n.endswith("attn_v.weight")}
    assert attn_v == {"Q5_K", "Q6_K"}
