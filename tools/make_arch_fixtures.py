"""Writes tests/fixtures/archs' files of the families users download first (Llama 3.1+ rope_freqs,
Llama linear/YaRN scaling, Phi-3.5/4 LongRoPE, SmolLM3, Granite 3, BERT and nomic-bert) and
llama.cpp's outputs for them, the way that folder's README describes for the first eight.

For each family: an F32 source in llama.cpp's exact tensor layout and metadata (numpy seed 0;
the writers are tools/arch_sources.py), quantized by llama.cpp's own quantizer to Q8_0 and Q4_K_M; llama.cpp (llama-cpp-python, the
live reference) must load and run every file. Decoders get batched (`.llamacpp.json`) and
one-token (`.llamacpp-t1.json`) fixtures; encoders get llama.cpp's pooled embeddings
(`.llamacpp-embd.json`). Each family's feature is shown to bind: the same source with the
feature neutralized gives different llama.cpp outputs (printed, and kept in `binds.json`).

    python tools/make_arch_fixtures.py [OUT_DIR] [--only NAME ...]

Needs llama-cpp-python 0.3.36 and gguf (the test extras). Deterministic: the same seed gives
byte-identical sources.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arch_sources import ARCHS, FAMILIES, FEATURES, LONG_TEXT, cases, encoder_texts  # noqa: E402

QUANTS = {"q8_0": 7, "q4_k_m": 15}  # llama_ftype
FAMILY_QUANTS = {"gpt-oss-tiny": {"mxfp4": 38, "q8_0": 7}}  # 38: MXFP4_MOE (experts MXFP4, the rest Q8_0)


def _llama(path: Path, **kw):
    """llama.cpp with its default CPU buffers, as the first eight files' fixtures were made: Q4_K
    weights are repacked, and its one-token numerics are those of the repacked kernels (which
    rase reproduces). On a CPU with AMX, 0.3.36's AMX repack crashes here (tests/support/llamacpp_ref.py)."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), verbose=False, n_threads=2, **kw)


def _topk(row: np.ndarray) -> list:
    top = np.argsort(-row, kind="stable")[:20]
    return [[int(t), round(float(row[t]), 4)] for t in top]


def decoder_fixture(path: Path, n_batch: int, n_ctx: int, prompts: list[str]) -> dict:
    llm = _llama(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, logits_all=True)
    try:
        c = cases()
        eos = llm.token_eos()
        out = {"model": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
               "llama_cpp_version": __import__("llama_cpp").__version__, "bos": llm.token_bos(), "eos": eos,
               "n_vocab": llm.n_vocab(), "n_batch": n_batch, "n_ctx": n_ctx,
               "tokenize": [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=True, special=False)}
                            for t in c["tokenize"]],
               "tokenize_special": [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=False, special=True)}
                                    for t in c["tokenize_special"]],
               "prompts": []}
        for text in prompts:
            ids = llm.tokenize(text.encode(), add_bos=True, special=False)
            llm.reset()
            llm.eval(ids)
            logits = np.array(llm.scores[:len(ids)], np.float32)
            greedy = []
            last = logits[-1]
            while len(greedy) < 32:
                tok = int(np.argmax(last))
                greedy.append(tok)
                if tok == eos or len(greedy) == 32 or llm.n_tokens >= n_ctx:
                    break
                llm.eval([tok])
                last = np.array(llm.scores[llm.n_tokens - 1], np.float32)
            out["prompts"].append({"text": text, "special": False, "ids": ids,
                                   "topk": [_topk(r) for r in logits], "greedy": greedy})
        return out
    finally:
        llm.close()


def decoder_logits(path: Path, prompts: list[str], n_ctx: int = 2048) -> list[np.ndarray]:
    llm = _llama(path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, logits_all=True)
    try:
        out = []
        for text in prompts:
            ids = llm.tokenize(text.encode(), add_bos=True, special=False)
            llm.reset()
            llm.eval(ids)
            out.append(np.array(llm.scores[:len(ids)], np.float64))
        return out
    finally:
        llm.close()


WPM_TOKENIZE = ["ＡＢＣ ﬁne Ünïcödé", "zero\u200bwidth\u00a0nbsp and\x00nul", "emoji 😀 ok", "a-b_c/d\\e~f`g",
                "MIXED Case ÀÉÎ", "１２３ ４５", "tab\tsep\r\nline"]


def encoder_fixture(path: Path) -> dict:
    """llama.cpp's embeddings of every text, one at a time (the file's pooling), L2-normalized
    and raw, with the ids it read; all texts in one batch; and WordPiece cases' ids."""
    from rase.store.gguf import GGUFFile

    texts = encoder_texts()
    g = GGUFFile(path)
    pooling = {1: "mean", 2: "cls", 3: "last"}[g.get(f"{g.architecture}.pooling_type")]
    llm = _llama(path, embedding=True, n_ctx=512, n_batch=512, n_ubatch=512)
    try:
        rows = []
        for t in texts:
            ids = llm.tokenize(t.encode(), add_bos=True, special=False)
            raw = np.asarray(llm.embed(t, normalize=False), np.float64)
            unit = np.asarray(llm.embed(t, normalize=True), np.float64)
            rows.append({"text": t, "ids": ids, "embedding": [round(float(x), 7) for x in raw],
                         "normalized": [round(float(x), 7) for x in unit]})
        batched = np.asarray(llm.embed(texts, normalize=True), np.float64)
        special = [{"text": s, "ids": llm.tokenize(s.encode(), add_bos=False, special=True)}
                   for s in ("[CLS] the cat [SEP]", "hello [MASK] world")]
        tokenize = [{"text": s, "ids": llm.tokenize(s.encode(), add_bos=True, special=False)}
                    for s in cases()["tokenize"] + WPM_TOKENIZE]
        return {"model": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "llama_cpp_version": __import__("llama_cpp").__version__, "n_embd": llm.n_embd(),
                "pooling": pooling, "texts": rows, "tokenize": tokenize, "tokenize_special": special,
                "batched": [[round(float(x), 7) for x in v] for v in batched]}
    finally:
        llm.close()


def binds(name: str, write, kind: str, tmp: Path, feature=True) -> dict:
    """How far llama.cpp's outputs move when the family's feature is neutralized (F32 sources)."""
    if name in FEATURES and feature is True:
        return {f: binds(name, write, kind, tmp, f) for f in FEATURES[name]}
    real, neutral = tmp / f"{name}-f32.gguf", tmp / f"{name}-neutral.gguf"
    write(real, False)
    write(neutral, feature)
    if kind == "encoder":
        a, b = (np.array(encoder_fixture(p)["batched"]) for p in (real, neutral))
        cos = np.sum(a * b, axis=1)
        return {"min_cosine_real_vs_neutral": round(float(cos.min()), 4),
                "max_cosine_real_vs_neutral": round(float(cos.max()), 4)}
    prompts = cases()["prompts"] + ([LONG_TEXT] if name == "phi3-longrope-tiny" else [])
    a, b = decoder_logits(real, prompts), decoder_logits(neutral, prompts)
    diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    top1 = np.mean(np.concatenate([x.argmax(1) != y.argmax(1) for x, y in zip(a, b)]))
    return {"max_logit_change": round(diff, 4), "top1_changed": round(float(top1), 4)}


@__import__("llama_cpp").llama_log_callback
def _quiet(level, text, user_data):  # the quantizer's log (its lines can end inside a UTF-8 character)
    pass


def quantize(src: Path, dst: Path, ftype: int) -> None:
    import ctypes

    import llama_cpp
    from llama_cpp import _logger

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
    try:
        if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not quantize {src}")
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def make(name: str, out: Path, tmp: Path) -> dict:
    write, kind = FAMILIES[name]
    src = tmp / f"{name}-f32.gguf"
    write(src, False)
    record = {"f32_sha256": hashlib.sha256(src.read_bytes()).hexdigest()}
    for q, ftype in FAMILY_QUANTS.get(name, QUANTS).items():
        dst = out / f"{name}-{q}.gguf"
        quantize(src, dst, ftype)
        record[f"{q}_sha256"] = hashlib.sha256(dst.read_bytes()).hexdigest()
        stem = out / f"{name}-{q}"
        if kind == "encoder":
            Path(f"{stem}.llamacpp-embd.json").write_text(json.dumps(encoder_fixture(dst)))
            continue
        prompts = cases()["prompts"] + ([LONG_TEXT] if name == "phi3-longrope-tiny" else [])
        for n_batch, suffix in ((512, ""), (1, "-t1")):
            fx = decoder_fixture(dst, n_batch, 2048, prompts)
            Path(f"{stem}.llamacpp{suffix}.json").write_text(json.dumps(fx))
        if name == "phi3-longrope-tiny":  # n_ctx 256 = the original context: the short factors
            fx = decoder_fixture(dst, 1, 256, cases()["prompts"])
            Path(f"{stem}.n256.llamacpp-t1.json").write_text(json.dumps(fx))
    record["binds"] = binds(name, write, kind, tmp)
    print(name, json.dumps(record), flush=True)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(ARCHS))
    ap.add_argument("--only", nargs="*", default=list(FAMILIES))
    args = ap.parse_args()
    out = Path(args.out)
    record_path = out / "binds.json"
    records = json.loads(record_path.read_text()) if record_path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            records[name] = make(name, out, Path(tmp))
    record_path.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
