"""Writes tests/fixtures/vision: per projector type a tiny text GGUF, its `mmproj` GGUF and two
PNG images (tools/vision_sources.py), and llama.cpp's outputs for them through libmtmd:

- `<name>.llamacpp.json`: per case (a prompt holding the media marker, one image) the chunk list
  (text ids; per image its id, n_tokens and n_pos), the logits' top-20 at every text position
  after the first image (image chunks decoded whole, as mtmd does; text one token at a time:
  llama.cpp's one-token numerics), and a 16-token greedy continuation;
- `<name>.llamacpp-embd.npz`: each case's image embeddings (all its image chunks' rows, in
  prompt order; n_embd wide) float32;
- `<name>.llamacpp-pixels.json`: the SHA-256 of the float32 pixels llama.cpp's preprocessor
  hands the encoder, for the two PNGs and for seeded random images of odd sizes (up and down,
  both orientations; tests/media regenerates them from the seed), with tools/mtmd_preproc_dump.cpp
  built against libmtmd and the headers of the llama.cpp tree given as --src.

Flash attention off, one thread, no warmup (vision.md section 8). The feature each projector
declares is shown to bind: the neutral mmproj's embeddings and logits differ (printed).

    python tools/make_vision_fixtures.py --src LLAMA_CPP_TREE [OUT_DIR]

Needs llama-cpp-python 0.3.36 built with libmtmd (its sdist's default; vision.md section 7).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vision_sources import PROJECTORS, test_images  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Describe <__media__> in one word:", "<__media__>\nWhat is this?"]


def _rgb(path: Path) -> tuple[int, int, bytes]:
    from PIL import Image

    im = Image.open(path).convert("RGB")
    return im.width, im.height, im.tobytes()


class Reference:
    """One text model + mmproj loaded in llama.cpp (libmtmd), flash attention off, 1 thread."""

    def __init__(self, text: Path, mmproj: Path) -> None:
        import llama_cpp
        import llama_cpp.mtmd_cpp as M

        self.L, self.M = llama_cpp, M
        self.llm = llama_cpp.Llama(model_path=str(text), n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1,
                                   flash_attn=False, verbose=False)
        p = M.mtmd_context_params_default()
        p.use_gpu, p.n_threads, p.warmup, p.print_timings = False, 1, False, False
        p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.mctx = M.mtmd_init_from_file(str(mmproj).encode(), self.llm.model, p)
        assert self.mctx, "llama.cpp refused the mmproj"
        self.n_embd = llama_cpp.llama_model_n_embd_inp(self.llm.model)

    def close(self) -> None:
        self.M.mtmd_free(self.mctx)
        self.llm.close()

    def _logits(self) -> np.ndarray:
        ctx = self.llm._ctx.ctx
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(ctx, -1), shape=(self.llm.n_vocab(),)).copy()

    def _token(self, tok: int, pos: int) -> np.ndarray:
        """One token at position pos (mtmd's position counter: an M-RoPE image advances it by
        max(nx, ny), not by its rows, so llama.cpp's own next position would be wrong)."""
        L = self.L
        batch = L.llama_batch_init(1, 0, 1)
        try:
            batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = tok, pos, 1, True
            batch.seq_id[0][0] = 0
            batch.n_tokens = 1
            assert L.llama_decode(self.llm._ctx.ctx, batch) == 0
        finally:
            L.llama_batch_free(batch)
        return self._logits()

    def run(self, prompt: str, image: Path, n_gen: int = 16) -> tuple[dict, list[np.ndarray]]:
        L, M = self.L, self.M
        w, h, rgb = _rgb(image)
        bmp = M.mtmd_bitmap_init(w, h, (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb))
        M.mtmd_bitmap_set_id(bmp, hashlib.sha256(image.read_bytes()).hexdigest().encode())
        text = prompt.encode()
        inp = M.mtmd_input_text(text=text, text_len=len(text), add_special=True, parse_special=True)
        chunks = M.mtmd_input_chunks_init()
        assert M.mtmd_tokenize(self.mctx, chunks, ctypes.byref(inp), (M.mtmd_bitmap_p_ctypes * 1)(bmp), 1) == 0
        L.llama_memory_clear(L.llama_get_memory(self.llm._ctx.ctx), True)
        out, embds, tops, pos, seen_image, logits = [], [], [], 0, False, None
        for i in range(M.mtmd_input_chunks_size(chunks)):
            c = M.mtmd_input_chunks_get(chunks, i)
            if M.mtmd_input_chunk_get_type(c) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                n = M.mtmd_input_chunk_get_n_tokens(c)
                assert M.mtmd_encode_chunk(self.mctx, c) == 0
                embds.append(np.ctypeslib.as_array(M.mtmd_get_output_embd(self.mctx), shape=(n, self.n_embd)).copy())
                new = L.llama_pos(0)
                assert M.mtmd_helper_eval_chunk_single(self.mctx, self.llm._ctx.ctx, c, pos, 0, 512, True,
                                                       ctypes.byref(new)) == 0
                out.append({"image": M.mtmd_input_chunk_get_id(c).decode(), "n_tokens": n,
                            "n_pos": M.mtmd_input_chunk_get_n_pos(c)})
                pos, seen_image = new.value, True
            else:
                k = ctypes.c_size_t()
                ids = M.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(k))[:k.value]
                out.append({"text": [int(t) for t in ids]})
                for t in ids:
                    logits = self._token(int(t), pos)
                    pos += 1
                    if seen_image:
                        tops.append(_top(logits))
        gen = []
        for _ in range(n_gen):
            nxt = int(np.argmax(logits))
            gen.append(nxt)
            logits = self._token(nxt, pos)
            pos += 1
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bmp)
        return {"prompt": prompt, "image": image.name, "chunks": out, "top20_after_image": tops,
                "greedy": gen}, embds


def _top(row: np.ndarray) -> list:
    top = np.argsort(-row, kind="stable")[:20]
    return [[int(t), round(float(row[t]), 4)] for t in top]


def batch_spread(text: Path, cases: list) -> float:
    """max |logit(n_batch 512) - logit(n_batch 1)| of llama.cpp over each case's text ids and
    greedy tokens: its own batch-to-batch spread, the bar for rows llama.cpp computes batched
    (an image's chunk is one ubatch)."""
    from llama_cpp import Llama

    def run(n_batch, ids):
        llm = Llama(model_path=str(text), n_ctx=512, n_batch=n_batch, n_ubatch=n_batch, n_threads=1,
                    logits_all=True, flash_attn=False, verbose=False)
        try:
            llm.eval(ids)
            return np.array(llm.scores[:len(ids)])
        finally:
            llm.close()

    worst = 0.0
    for c in cases:
        ids = [t for ch in c["chunks"] if "text" in ch for t in ch["text"]] + c["greedy"]
        worst = max(worst, float(np.abs(run(512, ids) - run(1, ids)).max()))
    return round(worst, 6)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fixtures(name: str, out: Path) -> None:
    write_text, write_mmproj, feature = PROJECTORS[name]
    text, mmproj = out / f"{name}-tiny.gguf", out / f"{name}-tiny-mmproj.gguf"
    write_text(text)
    write_mmproj(mmproj)
    images = test_images(out)
    ref = Reference(text, mmproj)
    cases, arrays = [], {}
    try:
        for i, prompt in enumerate(PROMPTS):
            for img in images.values():
                case, embds = ref.run(prompt, img)
                arrays[f"case{len(cases)}"] = np.concatenate(embds)  # every image chunk's rows, in prompt order
                cases.append(case)
    finally:
        ref.close()
    with tempfile.TemporaryDirectory() as tmp:  # the feature binds: llama.cpp's outputs move without it
        neutral = Path(tmp) / "neutral-mmproj.gguf"
        write_mmproj(neutral, neutral=True)
        nref = Reference(text, neutral)
        try:  # the first prompt with each image (cases 0 and 1): the feature binds on one at least
            runs = [nref.run(PROMPTS[0], img) for img in images.values()]
        finally:
            nref.close()
    delta = max(float(np.abs(np.concatenate(e) - arrays[f"case{i}"]).max()) for i, (_, e) in enumerate(runs))
    moved = sum(a[0][0] != b[0][0] for i, (nc, _) in enumerate(runs)
                for a, b in zip(nc["top20_after_image"], cases[i]["top20_after_image"]))
    greedy = any(nc["greedy"] != cases[i]["greedy"] for i, (nc, _) in enumerate(runs))
    print(f"{name}: {feature}: neutral changes embeddings by up to {delta:.3g}, top-1 at {moved} of "
          f"{sum(len(cases[i]['top20_after_image']) for i in range(len(runs)))} positions, "
          f"greedy {'differs' if greedy else 'same'}")
    assert delta > 0.1 and (moved or greedy), "the feature does not bind"
    import llama_cpp

    spread = batch_spread(text, cases)
    print(f"{name}: llama.cpp's own n_batch 512 vs 1 spread on the cases' text: {spread:.3g}")
    doc = {"text": text.name, "text_sha256": _sha(text), "mmproj": mmproj.name, "mmproj_sha256": _sha(mmproj),
           "images": {p.name: _sha(p) for p in images.values()}, "llama_cpp_version": llama_cpp.__version__,
           "flash_attn": False, "n_threads": 1, "batch_spread": spread, "cases": cases}
    (out / f"{name}-tiny.llamacpp.json").write_text(json.dumps(doc, indent=1) + "\n")
    np.savez_compressed(out / f"{name}-tiny.llamacpp-embd.npz", **arrays)


PIXEL_SIZES = [(1, 1), (3, 200), (200, 3), (63, 65), (64, 64), (127, 41), (300, 301), (600, 420)]
PIXEL_KIND = {"gemma3": "fixed", "idefics3": "idefics3", "lfm2": "lfm2", "qwen3vl": "dyn", "qwen25vl": "dyn"}  # 600x420: LFM2 tiles it


def random_image(w: int, h: int) -> np.ndarray:
    """The seeded (h, w, 3) uint8 image of a pixel case (tests/media rebuilds it the same way)."""
    return np.random.default_rng(w * 1000 + h).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _dump_tool(src: Path, tmp: Path) -> Path:
    import subprocess

    import llama_cpp

    lib = Path(llama_cpp.__file__).parent / "lib"
    exe = tmp / "mtmd_preproc_dump"
    subprocess.run(["g++", "-O1", "-std=c++17", str(ROOT / "tools" / "mtmd_preproc_dump.cpp"),
                    f"-I{src}/tools/mtmd", f"-I{src}/ggml/include", f"-I{src}/include", f"-L{lib}", "-lmtmd",
                    "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    return exe


def pixel_fixtures(name: str, out: Path, src: Path) -> None:
    import subprocess

    from PIL import Image

    cases = [(p.name, np.asarray(Image.open(p).convert("RGB"))) for p in sorted(out.glob("*.png"))]
    cases += [(f"random-{w}x{h}", random_image(w, h)) for w, h in PIXEL_SIZES]
    doc = {}
    with tempfile.TemporaryDirectory() as tmp:
        exe = _dump_tool(src, Path(tmp))
        for label, px in cases:
            rgb, dump = Path(tmp) / "in.rgb", Path(tmp) / "out.f32"
            rgb.write_bytes(px.tobytes())
            done = subprocess.run([str(exe), str(out / f"{name}-tiny-mmproj.gguf"), str(rgb), str(px.shape[1]),
                                   str(px.shape[0]), PIXEL_KIND[name], str(dump)], capture_output=True)
            if done.returncode < 0:  # llama.cpp asserts (e.g. a side resized to 0 pixels): rase must refuse it
                doc[label] = {"llama_cpp_aborts": done.stderr.decode(errors="replace").strip().splitlines()[-1]}
                continue
            done.check_returncode()
            raw, entries, at = dump.read_bytes(), [], 0
            while at < len(raw):  # the overview first, then the tiles in raster order
                nx, ny = (int(v) for v in np.frombuffer(raw[at:at + 8], np.int32))
                end = at + 8 + nx * ny * 12
                entries.append({"nx": nx, "ny": ny, "sha256": hashlib.sha256(raw[at + 8:end]).hexdigest()})
                at = end
            doc[label] = entries
    (out / f"{name}-tiny.llamacpp-pixels.json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    args = sys.argv[1:]
    if "--src" not in args:
        raise SystemExit(__doc__)
    i = args.index("--src")
    src = Path(args[i + 1])
    del args[i:i + 2]
    out = Path(args[0]) if args else ROOT / "tests" / "fixtures" / "vision"
    out.mkdir(parents=True, exist_ok=True)
    for name in PROJECTORS:
        fixtures(name, out)
        pixel_fixtures(name, out, src)


if __name__ == "__main__":
    main()
