"""rase model convert: a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json)
-> a GGUF in the store, in llama.cpp's layout and metadata, quantized as llama-quantize would
(rase/kernels/_quantize.h), registered with the source files' hashes, and verified.

Data path: checkpoint.py (shards, read by bands of rows) -> archs.py (names, fixes, metadata) +
vocab.py (tokenizer.*) -> plan.py (tensors in file order) -> mix.py (a ggml type per tensor) ->
gguf_writer.py (streamed to a temporary blob, hashed as written) -> registry (renamed into place).
Memory holds one band of rows at a time; nothing is written to the store unless all of it is.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..config import default_store, default_threads
from ..errors import StoreWriteError, UnsupportedQuantType
from ..kernels.quants import QuantType, row_bytes
from ..store.registry import ModelManifest, ModelRegistry, validate_model_id
from .archs import metadata, resolve
from .checkpoint import Checkpoint
from .gguf_writer import GGUFStreamWriter
from .mix import FTYPES, counters, is_70b, quantize_order, tensor_type
from . import pipeline
from .plan import OutTensor, build
from .vocab import vocab_metadata

QNT_VERSION = 2        # GGML_QNT_VERSION, as llama-quantize writes it


def _assign_types(tensors: list[OutTensor], ftype: str, arch: str, cfg: dict, n_expert: int) -> None:
    n_head = cfg["num_attention_heads"]
    big = is_70b(arch, cfg["num_hidden_layers"], n_head, cfg.get("num_key_value_heads", n_head))
    qs = counters([t.name for t in tensors], cfg["num_hidden_layers"], n_expert, big)
    for t in sorted(tensors, key=lambda t: quantize_order(t.name)):
        t.qtype = int(tensor_type(t.name, len(t.shape), t.ncols, ftype, qs))


def _nbytes(t: OutTensor) -> int:
    return int(np.prod(t.shape[:-1], dtype=np.int64)) * row_bytes(QuantType(t.qtype), t.ncols)


def _write(fh, kv: dict, tensors: list[OutTensor], ckpt: Checkpoint, n_threads: int) -> str:
    w = GGUFStreamWriter(fh, kv, [(t.name, tuple(reversed(t.shape)), t.qtype, _nbytes(t)) for t in tensors])
    pipeline.run(ckpt, tensors, w, n_threads)
    return w.finish()


def _header(ckpt: Checkpoint, arch, ftype: str, n_vocab: int) -> dict:
    kv = {"general.architecture": arch.gguf, "general.name": ckpt.folder.name,
          "general.file_type": FTYPES[ftype][0], "general.quantization_version": QNT_VERSION}
    return kv | metadata(arch, ckpt.config) | vocab_metadata(ckpt.folder, ckpt.config, n_vocab)


def convert_model(folder: str | os.PathLike[str], model_id: str, qtype: str = "F16", *, store=None,
                  n_threads: int | None = None, prepare: bool = False) -> ModelManifest:
    """Convert the checkpoint in folder to a GGUF of file type qtype (F16, BF16, Q8_0, Q4_K_M, ...
    see FTYPES), register it as model_id and verify it. Everything that can be refused (pickle
    weights, an architecture or tokenizer rase does not convert, a bad type) is refused before
    anything is written; a failure later leaves nothing in the store. prepare: write the pack
    cache now, as `rase model import` does (off: it holds every repacked matrix in memory at once,
    where the conversion holds a band of rows; the first load repacks instead)."""
    validate_model_id(model_id)
    if qtype not in FTYPES:
        raise UnsupportedQuantType(f"--type {qtype!r} is not one rase writes; use one of {', '.join(FTYPES)}")
    ckpt = Checkpoint(folder)
    arch = resolve(ckpt.config)
    tensors = build(ckpt, arch)
    kv = _header(ckpt, arch, qtype, n_vocab=next(t.shape[0] for t in tensors if t.name == "token_embd.weight"))
    n_expert = int(kv.get(f"{arch.gguf}.expert_count", 0))
    _assign_types(tensors, qtype, arch.gguf, ckpt.config, n_expert)
    registry = ModelRegistry(store or default_store())
    try:
        dest = _stream_to_blob(registry, kv, tensors, ckpt, n_threads or default_threads())
        files = ckpt.file_hashes()
    finally:
        ckpt.close()
    source = {"type": "convert", "path": str(ckpt.folder.absolute()), "quantization": qtype, "files": files}
    try:
        _check_written(dest, tensors)
        return registry.import_local(model_id, dest, copy=True, written_sha256=dest.stem, source=source,
                                     prepare=prepare)
    except BaseException:
        registry.drop_unreferenced(dest)
        raise


def _check_written(path: Path, tensors: list[OutTensor]) -> None:
    """The file as written parses back (rase's GGUF reader) to the planned tensors: names, types,
    shapes and sizes; its bytes were hashed as they were written."""
    from ..errors import CorruptModelFile
    from ..store.gguf import GGUFFile

    g = GGUFFile(path)
    try:
        got = [(n, int(i.qtype), tuple(i.shape), i.nbytes) for n, i in g.tensors.items()]
    finally:
        g.close()
    want = [(t.name, t.qtype, t.shape, _nbytes(t)) for t in tensors]
    if got != want:
        raise CorruptModelFile(str(path), "the written file does not hold the planned tensors")


def _stream_to_blob(registry: ModelRegistry, kv: dict, tensors: list[OutTensor], ckpt: Checkpoint,
                    n_threads: int) -> Path:
    """The GGUF written to a temporary file beside the store's blobs, then renamed to
    blobs/<sha256>.gguf; the temporary file never outlives a failure."""
    size = sum(_nbytes(t) for t in tensors)
    try:
        registry.blobs.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(registry.blobs).free
        if free < size + (64 << 20):
            raise OSError(28, f"the GGUF needs {size / 2**30:.2f} GiB and {free / 2**30:.2f} GiB are free")
        fd, tmp = tempfile.mkstemp(dir=registry.blobs, prefix=".convert.", suffix=".part")
    except OSError as exc:
        raise StoreWriteError(registry.blobs, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            digest = _write(fh, kv, tensors, ckpt, n_threads)
        dest = registry.blobs / f"{digest}.gguf"
        os.replace(tmp, dest)
        return dest
    except OSError as exc:
        raise StoreWriteError(registry.blobs, exc) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
