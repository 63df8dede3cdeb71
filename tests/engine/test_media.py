"""rase/engine/media.py and the forward's image rows: placeholders, spans kept whole, and the
logits after an image against llama.cpp's one-token numerics (tests/fixtures/vision).

llama.cpp computes an image's rows as one batch (one ubatch), and its batched F32 arithmetic
differs from its one-token arithmetic, which rase computes every row with: with llama.cpp's own
image embeddings as input rows, rase's logits stay within llama.cpp's own n_batch 512 vs 1 spread
on the same model (the fixture's batch_spread, plus the fixture's rounding to 4 decimals; measured:
Gemma 3 1.9e-3 of 4.2e-3, SmolVLM 1.0e-3 of 1.6e-3, LFM2-VL 6.6e-5 of 2.9e-5 + 5e-5). With rase's embeddings (within 1e-3 x std of llama.cpp's, tests/models/test_vision.py)
the logits move by up to 4.6e-3 (Gemma 3) and 1.3e-3 (SmolVLM), the top-1 token is llama.cpp's at
every position and the greedy continuation is identical. Image rows attend to each other both ways (Gemma 3), and
the logits do not depend on what shares the step, how the prompt is cut, or the thread count.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rase.engine.media import ImageEncoder, ImageSpan, PromptMedia, placeholder_ids, step_inputs
from rase.kernels import _kernels
from rase.media.image import decode_image
from rase.models.vision import load_encoder
from rase.store.gguf import GGUFFile
from rase.store.plan import load_plan

VISION = Path(__file__).resolve().parents[1] / "fixtures" / "vision"


def test_placeholders_are_negative_distinct_and_keyed_by_the_image():
    a, b = placeholder_ids("aa" * 32, 300), placeholder_ids("bb" * 32, 300)
    assert max(a) < 0 and len(set(a)) == 300 and not set(a) & set(b)
    assert a == placeholder_ids("aa" * 32, 300)


def test_a_non_causal_image_is_never_split():
    m = PromptMedia((ImageSpan(10, 16, None, causal=False), ImageSpan(40, 8, None, causal=True)))
    assert m.cut(0, 5) == 5            # before the image
    assert m.cut(0, 12) == 10          # a chunk ends before it
    assert m.cut(10, 4) == 16          # starting it: all of it, past the budget
    assert m.cut(18, 2) == 8           # the rest of it (a cached prefix ended inside it)
    assert m.cut(26, 20) == 20         # a causal image may be cut
    assert [m.key_end(p) for p in (9, 10, 25, 26, 41)] == [10, 26, 26, 27, 42]


class _Req:
    def __init__(self, media):
        self.media = media


class _Enc:
    def __init__(self):
        self.calls = 0

    def rows(self, image):
        self.calls += 1
        return np.arange(4 * 3, dtype=np.float32).reshape(4, 3) + (100 if image == "B" else 0)


def test_step_inputs_swap_placeholders_for_embedding_rows():
    media = PromptMedia((ImageSpan(2, 4, "A", causal=False),))
    rows = np.array([[5, 0, 1], [-7, 0, 2], [-8, 0, 3], [9, 1, 0], [-9, 0, 4], [-3, 0, 5]], np.int32)
    out, in_embd, in_row, key_end = step_inputs(rows, [_Req(media), _Req(None)], _Enc())
    assert out[:, 0].tolist() == [5, 0, 0, 9, 0, 0] and rows[1, 0] == -7  # the step's own rows untouched
    assert in_row.tolist() == [-1, 0, 1, -1, 2, 3]
    assert np.array_equal(in_embd, np.arange(12, dtype=np.float32).reshape(4, 3)[[0, 1, 2, 3]])
    assert key_end.tolist() == [2, 6, 6, 1, 6, 6]
    plain = np.array([[5, 0, 1]], np.int32)
    assert step_inputs(plain, [_Req(None)], None)[1:] == (None, None, None)


NAMES = ("gemma3", "idefics3", "lfm2", "qwen3vl", "qwen25vl")
REFS = {n: json.loads((VISION / f"{n}-tiny.llamacpp.json").read_text()) for n in NAMES}
EMBDS = {n: np.load(VISION / f"{n}-tiny.llamacpp-embd.npz") for n in NAMES}
CASES = [(n, i) for n in NAMES for i in range(len(REFS[n]["cases"]))]
ROUNDED = 5e-5  # the fixtures keep logits to 4 decimals
SLOTS = np.array([0, 1], np.int32)  # the two sequences' recurrent state slots (LFM2's short convolutions)


def _model(name):
    plan = load_plan(VISION / f"{name}-tiny.gguf", None, 512)
    with GGUFFile(VISION / f"{name}-tiny-mmproj.gguf") as g:
        module, enc = load_encoder(g)
    return plan, ImageEncoder(module, enc)


@pytest.fixture(scope="module")
def gemma3():
    return _model("gemma3")


def _layout(case):
    """(ids with -1 for image rows, image spans (start, n, offset), the first image's start)."""
    ids, spans, used = [], [], 0
    for ch in case["chunks"]:
        if "text" in ch:
            ids += ch["text"]
        else:
            spans.append((len(ids), ch["n_tokens"], used))
            used += ch["n_tokens"]
            ids += [-1] * ch["n_tokens"]
    return ids, spans, spans[0][0]


def _cuts(ids, spans, causal, cut):
    """Steps as (first, end) positions: text one token per step and each image chunk in one step
    (llama.cpp's way here), or chunks of `cut` rows that never split a non-causal image."""
    if cut is None:
        out, p = [], 0
        while p < len(ids):
            span = next((s for s in spans if s[0] == p), None)
            out.append((p, p + (span[1] if span else 1)))
            p = out[-1][1]
        return out
    out, p = [], 0
    while p < len(ids):
        q = min(len(ids), p + cut)
        for a, n, _ in spans:
            if not causal and a < q < a + n:
                q = a if a > p else a + n
        out.append((p, q))
        p = q
    return out


def _media(spans, grids):
    """The prompt's image spans, with their token grids on an M-RoPE model (grids given)."""
    if grids is None:
        return None
    return PromptMedia(tuple(ImageSpan(a, n, None, True, off, g) for (a, n, off), g in zip(spans, grids)))


def _run(plan, case, embd, causal, cut=None, threads=1, neighbour=False, grids=None):
    """Logits at every text position after the first image, the steps as _cuts makes them;
    neighbour: a second sequence's rows share every step; grids: an M-RoPE model's image grids
    (its rows then take mtmd's positions). Returns (logits, ids, fwd, positions of a cell)."""
    fwd = _kernels.Forward(plan.weights, 16, 256, threads, n_slots=2)  # a hybrid's state: a slot per sequence
    ids, spans, first = _layout(case)
    media = _media(spans, grids)
    where = {a + j: (off + j, a + n) for a, n, off in spans for j in range(n)}  # row -> (embedding row, span end)
    tables = np.arange(16, dtype=np.int32).reshape(2, 8)
    out = {}
    for a, b in _cuts(ids, spans, causal, cut):
        rows = [(max(ids[p], 0), 0, p) for p in range(a, b)]
        in_row = [where[p][0] if p in where else -1 for p in range(a, b)]
        key_end = [where[p][1] if p in where and not causal else p + 1 for p in range(a, b)]
        rope = media.rope_positions(np.arange(a, b)).tolist() if media else None
        if neighbour:
            rows.append((7 + a % 50, 1, a))
            in_row.append(-1)
            key_end.append(a + 1)
            rope = rope + [[a, a, a, 0]] if rope else None
        _, logits = fwd.step(np.array(rows, np.int32), tables, np.arange(len(rows), dtype=np.int32), in_embd=embd,
                             in_row=np.array(in_row, np.int32), key_end=np.array(key_end, np.int32), slots=SLOTS,
                             rope_pos=None if rope is None else np.array(rope, np.int32))
        for p in range(a, b):
            if p > first and p not in where:
                out[p] = logits[p - a].copy()
    at = (lambda c: None) if media is None else (lambda c: media.rope_positions(np.array([c])))
    return [out[p] for p in sorted(out)], ids, fwd, at


def _grids(name, images, case):
    """An M-RoPE model's image grids (nx, ny), from the encoder (the fixture has rows and positions)."""
    if not callable(getattr(type(images.encoder), "grid", None)):  # the Qwen towers say their token grid
        return None
    image = decode_image((VISION / case["image"]).read_bytes())
    grid = images.encoder.grid(image)
    assert [(ch["n_tokens"], ch["n_pos"]) for ch in case["chunks"] if "image" in ch] == [(grid[0] * grid[1], max(grid))]
    return [grid]


def _worst(logits, ref):
    return max(np.abs(row[[t for t, _ in top]] - np.array([v for _, v in top])).max() for row, top in zip(logits, ref))


@pytest.mark.parametrize("name, case", CASES)
def test_decoder_rows_equal_llamacpp_given_its_embeddings(name, case):
    plan, images = _model(name)
    c = REFS[name]["cases"][case]
    logits, _, _, _ = _run(plan, c, EMBDS[name][f"case{case}"], images.causal, grids=_grids(name, images, c))
    ref = REFS[name]["cases"][case]["top20_after_image"]
    assert len(logits) == len(ref)
    assert all(np.argmax(row) == top[0][0] for row, top in zip(logits, ref))
    assert _worst(logits, ref) <= REFS[name]["batch_spread"] + ROUNDED


@pytest.mark.parametrize("name, case", CASES)
def test_logits_after_rases_own_embeddings_follow_llamacpp(name, case):
    plan, images = _model(name)
    c = REFS[name]["cases"][case]
    embd = images.rows(decode_image((VISION / c["image"]).read_bytes()))
    logits, ids, fwd, at = _run(plan, c, embd, images.causal, grids=_grids(name, images, c))
    ref = c["top20_after_image"]
    assert all(np.argmax(row) == top[0][0] for row, top in zip(logits, ref))
    assert _worst(logits, ref) < 2 * max(REFS[n]["batch_spread"] for n in NAMES)  # the embeddings' 1e-3 x std
    pos, last, greedy = len(ids), logits[-1], []  # greedy continuation, one token per step
    table = np.arange(16, dtype=np.int32).reshape(2, 8)
    for _ in range(len(c["greedy"])):
        tok = int(np.argmax(last))
        greedy.append(tok)
        _, out = fwd.step(np.array([[tok, 0, pos]], np.int32), table, np.zeros(1, np.int32), slots=SLOTS,
                          rope_pos=at(pos))
        last, pos = out[0].copy(), pos + 1
    assert greedy == c["greedy"]


@pytest.mark.parametrize("name", NAMES)
def test_image_rows_are_batch_chunk_and_thread_invariant(name):
    plan, images = _model(name)
    c = REFS[name]["cases"][1]
    embd = EMBDS[name]["case1"]
    grids = _grids(name, images, c)
    base = _run(plan, c, embd, images.causal, grids=grids)[0]
    for kw in (dict(cut=5), dict(cut=64), dict(threads=2), dict(neighbour=True), dict(cut=3, neighbour=True, threads=2)):
        got = _run(plan, c, embd, images.causal, grids=grids, **kw)[0]
        assert all(np.array_equal(a, b) for a, b in zip(base, got)), kw


def test_the_image_attends_both_ways(gemma3):
    """Causal image rows (key_end = pos + 1) give other logits: the non-causal mask binds."""
    plan, _ = gemma3
    c = REFS["gemma3"]["cases"][0]
    fwd = _kernels.Forward(plan.weights, 16, 64, 1)
    ids = c["chunks"][0]["text"]
    n = c["chunks"][1]["n_tokens"]
    rows = np.array([(t, 0, p) for p, t in enumerate(ids)] + [(0, 0, len(ids) + i) for i in range(n)], np.int32)
    in_row = np.array([-1] * len(ids) + list(range(n)), np.int32)
    table = np.arange(16, dtype=np.int32).reshape(2, 8)
    last = np.array([len(rows) - 1], np.int32)
    both = fwd.step(rows, table, last, in_embd=EMBDS["gemma3"]["case0"], in_row=in_row,
                    key_end=np.array([p + 1 for p in range(len(ids))] + [len(rows)] * n, np.int32))[1].copy()
    causal = fwd.step(rows, table, last, in_embd=EMBDS["gemma3"]["case0"], in_row=in_row)[1].copy()
    assert np.abs(both - causal).max() > 0.1


def test_forward_refuses_bad_image_inputs(gemma3):
    plan, _ = gemma3
    fwd = _kernels.Forward(plan.weights, 4, 8, 1)
    rows, table, out = np.array([[0, 0, 0], [0, 0, 1]], np.int32), np.arange(4, dtype=np.int32)[None], np.zeros(1, np.int32)
    e = np.zeros((2, 256), np.float32)
    for kw in (dict(in_embd=e), dict(in_embd=np.zeros((2, 7), np.float32), in_row=np.zeros(2, np.int32)),
               dict(in_embd=e, in_row=np.array([0, 2], np.int32)), dict(key_end=np.array([1, 1], np.int32)),
               dict(key_end=np.array([9999, 2], np.int32))):
        with pytest.raises(ValueError):
            fwd.step(rows, table, out, **kw)


def test_mrope_positions_equal_single_positions_for_text_and_bind_for_images():
    """qwen35 (IMROPE): rows given (p, p, p, 0) compute what rows given p do, bit for bit (a text
    row is the same row whatever positions path it takes); other components change the output."""
    plan = load_plan(Path(__file__).resolve().parents[1] / "fixtures" / "archs" / "qwen35-tiny-q8_0.gguf", None, 256)
    fwd = _kernels.Forward(plan.weights, 8, 32, 1, n_slots=2)
    ids = [5, 77, 300, 12, 9, 41]
    rows = np.array([(t, 0, p) for p, t in enumerate(ids)], np.int32)
    table = np.arange(8, dtype=np.int32).reshape(1, 8)
    out = np.arange(len(ids), dtype=np.int32)
    slots = np.array([0], np.int32)
    plain = fwd.step(rows, table, out, slots=slots)[1].copy()
    same = fwd.step(rows, table, out, slots=slots,
                    rope_pos=np.array([(p, p, p, 0) for p in range(len(ids))], np.int32))[1].copy()
    assert np.array_equal(plain, same)
    grid = fwd.step(rows, table, out, slots=slots,
                    rope_pos=np.array([(0, p // 3, p % 3, 0) for p in range(len(ids))], np.int32))[1].copy()
    assert np.abs(grid - plain).max() > 1e-3
    g = load_plan(VISION / "gemma3-tiny.gguf", None, 256)
    with pytest.raises(ValueError, match="one position"):
        _kernels.Forward(g.weights, 4, 8, 1).step(rows, np.arange(4, dtype=np.int32)[None], out,
                                                  rope_pos=np.zeros((len(ids), 4), np.int32))


def test_mrope_positions_of_a_prompt_with_images():
    """mtmd's positions: image rows on their grid from the image's first position, later cells
    lowered by rows - max(nx, ny) per image; a causal image without a grid keeps cell positions."""
    m = PromptMedia((ImageSpan(2, 6, None, grid=(3, 2)), ImageSpan(10, 4, None, grid=(2, 2))))
    pos = m.rope_positions(np.arange(16))
    assert pos[:2].tolist() == [[0, 0, 0, 0], [1, 1, 1, 0]]
    assert pos[2:8].tolist() == [[2, 2, 2, 0], [2, 2, 3, 0], [2, 2, 4, 0], [2, 3, 2, 0], [2, 3, 3, 0], [2, 3, 4, 0]]
    assert pos[8].tolist() == [5, 5, 5, 0]                       # 8 - (6 - 3)
    assert pos[10:14, 1:3].tolist() == [[7, 7], [7, 8], [8, 7], [8, 8]] and pos[10, 0] == 7
    assert pos[14].tolist() == [9, 9, 9, 0] and pos[15].tolist() == [10, 10, 10, 0]  # 14 - 3 - 2
    assert not PromptMedia((ImageSpan(0, 4, None),)).mrope
