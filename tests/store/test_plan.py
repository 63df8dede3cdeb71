"""GGUF -> the C plan (rase/store/plan.py): what a loaded model keeps mapped of its file.

Peak RSS counts every page of the GGUF the process has mapped, and a fault in a mapping maps the
whole page-cache folio around it (up to 2 MiB on Linux 6.18 for a file just downloaded). So a
model whose matrices are all served from the pack cache must not read its file through the mmap
at all after parsing it: norm vectors are read with pread, and the tied token embedding is looked
up in the output's repacked copy."""
from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from rase.engine.decoder import load_gguf_decoder
from tests.support.packing import wait_for_saves

if not sys.platform.startswith("linux"):
    pytest.skip("reads /proc/self/pagemap (Linux)", allow_module_level=True)

FOLIO = 2 << 20  # what one fault in the metadata may map beside it


def _mapped_pages(base: int, lo: int, hi: int) -> int:
    """Pages of [base + lo, base + hi) present in this process's page tables."""
    page = mmap.PAGESIZE
    first, last = (base + lo) // page, -(-(base + hi) // page)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first) * 8), np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


@pytest.mark.needs_model
def test_a_warm_load_maps_nothing_of_the_file_past_its_metadata(tmp_path, monkeypatch, smollm2_path):
    """SmolLM2 (every matrix repacked, the embedding tied to the Q8_0 output): after a load from
    the pack cache, a prefill and a decode, no page of the file's tensor data is mapped except
    within a folio of the metadata. Reading a norm through the mmap, or a token's embedding row
    from the file, maps its page (and its folio) and fails this."""
    monkeypatch.setenv("RASE_PACK_CACHE", str(tmp_path / "packed"))
    load_gguf_decoder(None, smollm2_path)  # writes the pack cache
    wait_for_saves()
    dec = load_gguf_decoder(None, smollm2_path)
    assert dec.plan.weights.repacked == {}  # every matrix mapped from the pack cache
    g = dec.gguf
    embd = g.tensor("token_embd.weight")
    row = embd.nbytes // dec.vocab_size
    tokens = [9000, 12000, 20000, 31000, 45000]  # rows MiBs away from either end of the embedding
    logits = dec.prefill(tokens)
    dec.decode(int(np.argmax(logits)))
    base = embd.data.ctypes.data - embd.offset  # the mapping's first byte (offsets are absolute)
    start = -(-g.data_offset // FOLIO) * FOLIO + FOLIO
    assert _mapped_pages(base, start, g.file_size) == 0
    for tok in tokens:  # the looked-up rows themselves, whatever the folio size
        assert _mapped_pages(base, embd.offset + tok * row, embd.offset + (tok + 1) * row) == 0, tok
    norms = [t for name, t in g.tensors.items() if name.endswith("norm.weight")]
    assert norms and all(_mapped_pages(base, t.offset, t.offset + t.nbytes) == 0 for t in norms)


def test_a_cold_load_gives_back_every_repacked_experts_file_pages(tmp_path, monkeypatch):
    """Repacking copies each matrix chunk by chunk, then gives the chunk's file pages back
    (GGUFFile.release). A MoE layer's experts are slices of one 3-D tensor: every slice's chunks
    are released at their own offsets, so the whole expert tensor is (a 20B gpt-oss's peak RSS
    was 21 GB, its file pages and its copies, when only each tensor's first expert was)."""
    from rase.store.gguf import GGUFFile
    from tests.support.models import ARCHS

    monkeypatch.setenv("RASE_PACK_CACHE", str(tmp_path / "packed"))  # a cold load: nothing cached
    released: dict[str, list[tuple[int, int]]] = {}
    real = GGUFFile.release

    def record(self, tensor, start=0, end=None):
        released.setdefault(tensor.name, []).append((start, tensor.nbytes if end is None else end))
        return real(self, tensor, start, end)

    monkeypatch.setattr(GGUFFile, "release", record)
    dec = load_gguf_decoder(None, ARCHS / "gpt-oss-tiny-mxfp4.gguf")
    experts = [n for n in dec.gguf.tensors if "_exps.weight" in n]
    assert len(experts) == 6
    for name in experts:
        spans = sorted(released[name])
        assert spans[0][0] == 0 and spans[-1][1] == dec.gguf.tensor(name).nbytes, name
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), name  # contiguous, no gap


def test_a_decoder_over_a_shared_plan_takes_a_shorter_context(tiny_models):
    from rase.engine.decoder import GGUFDecoder
    from rase.errors import ContextOverflow
    from rase.store.plan import load_plan
    from rase import QuantType

    plan = load_plan(tiny_models("llama", QuantType.Q8_0))
    short = GGUFDecoder(plan, n_ctx=40, n_threads=1)
    assert short.n_ctx == 40 < plan.n_ctx and GGUFDecoder(plan, n_threads=1).n_ctx == plan.n_ctx
    whole = GGUFDecoder(plan, n_threads=1)
    assert np.array_equal(short.prefill(list(range(1, 41))), whole.prefill(list(range(1, 41))))
    with pytest.raises(ContextOverflow):
        short.decode(5)
