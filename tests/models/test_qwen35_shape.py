"""benchmarks/qwen35_shape.py writes a file rase loads and runs (at a tiny size here, so it
cannot rot): the shape's keys and tensors are the ones the qwen35 plan takes, every one of them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from rase.engine.decoder import load_gguf_decoder

ROOT = Path(__file__).resolve().parents[2]


def test_the_shape_writer_makes_a_file_rase_runs(tmp_path):
    spec = importlib.util.spec_from_file_location("qwen35_shape", ROOT / "benchmarks" / "qwen35_shape.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tiny = dict(mod.SHAPE, layers=4, d=256, ff=512, vocab=640, hd=64, s=32, hk=2, hv=4)
    path = mod.write_f16(tmp_path / "q.gguf", tiny)
    dec = load_gguf_decoder(None, path, n_ctx=64)
    logits = dec.prefill([5, 9, 300, 7])
    assert logits.shape == (640,) and np.isfinite(logits).all()
    assert np.isfinite(dec.decode(11)).all()
