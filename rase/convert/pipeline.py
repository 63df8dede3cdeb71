"""The conversion's three stages, overlapped: a reader thread preads each band of source rows and
hashes the shards as it goes; the caller's thread fixes and quantizes the band (the C quantizer
on n_threads); a writer thread appends the result to the GGUF and hashes it. Queues of two bands
between them bound the memory; an error in any stage stops all three and is raised here."""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

import numpy as np

from ..kernels import _kernels
from ..kernels.quants import QuantType, row_bytes
from .checkpoint import Checkpoint, SourceTensor
from .gguf_writer import GGUFStreamWriter
from .plan import OutTensor, permutation

BAND_BYTES = 32 << 20  # source bytes per band: memory holds a few bands, never a tensor
DEPTH = 2              # bands in flight between two stages
END = object()


def _bands(t: OutTensor) -> Iterator[tuple[SourceTensor | None, int, int]]:
    """(source, first row, end row) of t in output order; a fixed tensor is read whole."""
    if t.data is not None:
        yield None, 0, 0
        return
    for s in t.sources:
        rows = s.nbytes // s.row_bytes
        step = rows if t.fix else max(1, BAND_BYTES // s.row_bytes)
        for r0 in range(0, rows, step):
            yield s, r0, min(rows, r0 + step)


def _fixed(t: OutTensor, raw: np.ndarray, s: SourceTensor | None, cfg: dict) -> tuple[np.ndarray, int]:
    """(bytes, ggml type of their values) to quantize: llama's permuted q/k rows, Gemma's 1 + w."""
    if s is None:
        return t.data.astype("<f4").view(np.uint8), 0
    if t.fix == "plus1":
        values = np.empty(raw.nbytes // (s.row_bytes // s.shape[-1]), np.float32)
        _kernels.dequantize_into(s.ggml_type, raw, values)  # the traits row's exact F16 / BF16 -> f32
        return (values + np.float32(1)).view(np.uint8), 0
    if t.fix:
        heads = cfg["num_attention_heads"] if t.fix == "q" else cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        rows = raw.reshape(-1, s.row_bytes)
        return rows[permutation(rows.shape[0], heads)].reshape(-1), s.ggml_type
    return raw, s.ggml_type


class _Stage:
    """A thread running fn over a queue's items until END; its error is kept for the caller."""

    def __init__(self, fn: Callable, name: str) -> None:
        self.q: queue.Queue = queue.Queue(DEPTH)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn: Callable) -> None:
        try:
            fn(self.q)
        except BaseException as exc:  # handed to the caller, which raises it
            self.error = exc
            while self.q.get() is not END:  # unblock the producer until it stops
                pass

    def put(self, item) -> None:
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def run(ckpt: Checkpoint, tensors: list[OutTensor], w: GGUFStreamWriter, n_threads: int) -> None:
    """Every tensor of the plan, in order, quantized into w."""
    out = queue.Queue(DEPTH)
    stop = threading.Event()

    def read() -> None:
        try:
            for t in tensors:
                for s, r0, r1 in _bands(t):
                    if stop.is_set():
                        return
                    out.put((t, s, ckpt.read(s, r0, r1) if s is not None else None))
                out.put((t, None, END))
        except BaseException as exc:
            out.put(exc)

    def write(q: queue.Queue) -> None:
        while (item := q.get()) is not END:
            w.end_tensor() if item is None else w.write(item)

    reader = threading.Thread(target=read, name="rase-convert-read", daemon=True)
    reader.start()
    writer = _Stage(write, "rase-convert-write")
    try:
        for _ in range(sum(sum(1 for _ in _bands(t)) + 1 for t in tensors)):
            item = out.get()
            if isinstance(item, BaseException):
                raise item
            t, s, raw = item
            if raw is END:
                writer.put(None)
                continue
            data, src_type = _fixed(t, raw, s, ckpt.config)
            n_rows = data.nbytes // (t.ncols * (4 if src_type == 0 else 2))
            q = np.empty(n_rows * row_bytes(QuantType(t.qtype), t.ncols), np.uint8)
            _kernels.quantize_rows(t.qtype, data, src_type, t.ncols, q, n_threads)
            writer.put(q)
    finally:
        stop.set()
        while reader.is_alive():  # let a reader blocked on a full queue finish
            try:
                out.get(timeout=0.05)
            except queue.Empty:
                pass
        writer.q.put(END)
    writer.join()
