"""Repacked weights kept on disk: the 16-row layout of a GGUF's matrices (plan stage), written
once after the first load and mapped read-only by later loads of the same file.

Repacking copies weights into new anonymous memory, and first-touching new memory is what a
load spends most on (page faults, zeroing; on a VM the host's faults too). A later load maps
this file instead: its pages are already in the page cache, like the GGUF's, and the GGUF's
repacked tensors are never read. The cache is keyed by the GGUF's path, size, mtime and inode
and the layout version, so any change to the model file (or to rase's layout) misses. It is
trusted as the registry trusts a verified file: while its own size, mtime and inode are those
recorded when it was written (a sidecar); anything else (truncated, rewritten, a foreign
header) is a miss and is rebuilt. Failures to write are ignored: it is a cache.

    RASE_PACK_CACHE unset: $XDG_CACHE_HOME/rase/packed (~/.cache/rase/packed); "0" or "off":
    disabled; anything else: that directory.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np

from ..config import pack_cache_dir
from .gguf import MADV_POPULATE_READ

LAYOUT_VERSION = 6          # bump when _repack.h's layout changes (2: Q5_* keep 5 bits per value; 3: Q4_K repacked;
                            # 4: Q5_0's fifth bits one byte per lane; 5: Q5_K repacked; 6: Q6_K repacked)
MAGIC = b"RASEPK01"
ALIGN = 4096                # every matrix starts on a page (the kernels need 64 bytes)
MAX_BYTES = 4 << 30         # the cache directory is trimmed to this, least recently used first
# The file is written in whole, aligned 2 MiB windows: Linux (6.x, ext4/xfs) then keeps it in the
# page cache as 2 MiB folios, which a mapping gets as huge pages (SmolLM2 Q4_1: 92 of 92 MiB,
# against 28-53 MiB written matrix by matrix; decode streams every weight per token through
# fewer TLB entries). Files on disk are the same bytes either way.
WINDOW = 2 << 20
STALE_TMP_S = 3600.0


def _key(gguf_path: str) -> str:
    st = os.stat(gguf_path)
    return json.dumps([os.path.realpath(gguf_path), st.st_size, st.st_mtime_ns, st.st_ino, LAYOUT_VERSION])


def _stamp(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _windows(pieces: list[tuple[int, memoryview]], size: int, window: int = WINDOW):
    """The file image of size bytes, pieces (offset, bytes; sorted, not overlapping) with zeros
    between them, as consecutive windows of `window` bytes (the last one shorter)."""
    i = 0
    for lo in range(0, size, window):
        hi = min(lo + window, size)
        buf = bytearray(hi - lo)
        while i < len(pieces) and pieces[i][0] < hi:
            o, data = pieces[i]
            a, b = max(o, lo), min(o + len(data), hi)
            buf[a - lo:b - lo] = data[a - o:b - o]
            if o + len(data) > hi:
                break  # continues in the next window
            i += 1
        yield buf


class PackCache:
    _writing: set[Path] = set()  # cache files being written by this process (one writer each)
    _writing_lock = threading.Lock()

    def __init__(self, gguf_path: str | os.PathLike[str], root: Path | None = None) -> None:
        self.root = pack_cache_dir() if root is None else Path(root)
        self.key = _key(str(gguf_path))
        name = hashlib.sha256(self.key.encode()).hexdigest()[:32]
        self.path = None if self.root is None else self.root / f"{name}.r16"
        self._mmap: mmap.mmap | None = None

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def load(self, huge_pages: bool = False, populate: bool = True) -> dict[str, np.ndarray] | None:
        """name -> packed bytes (read-only views of the mapped file), or None on a miss.
        huge_pages: a dense model, which reads every page each token: the mapping asks for huge
        pages, so a file the page cache must read again comes back in 2 MiB folios too. Not for
        MoE: a fault would read 2 MiB of experts the router did not choose. populate=False:
        only whether the cache holds the file (nothing mapped in ahead)."""
        if self.path is None:
            return None
        try:
            with open(self.path.with_suffix(".ok")) as f:
                if json.load(f) != _stamp(self.path):
                    return None
            with open(self.path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        try:
            if mm[:8] != MAGIC:
                return None
            (hlen,) = struct.unpack_from("<Q", mm, 8)
            header = json.loads(bytes(mm[16:16 + hlen]))
            if header.get("key") != self.key:
                return None
            out = {}
            for name, off, size in header["entries"]:
                if off % ALIGN or off + size > len(mm):
                    return None
                out[name] = np.frombuffer(mm, np.uint8, size, off)
        except (ValueError, KeyError, TypeError, struct.error):
            return None
        if hasattr(mm, "madvise") and populate:
            if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
                try:  # EINVAL where THP is off: the populate below must still run
                    mm.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass
            try:
                mm.madvise(MADV_POPULATE_READ)  # map it all in one call
            except OSError:
                pass
        self._mmap = mm
        try:  # a hit marks its entry used (the sidecar: the .r16's own mtime is in the stamp)
            os.utime(self.path.with_suffix(".ok"))
        except OSError:
            pass
        return out

    def save(self, packed: dict[str, np.ndarray]) -> None:
        """Write the packed matrices (temporary file, then an atomic rename); errors ignored."""
        if self.path is None or not packed:
            return
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        if threading.current_thread() is not threading.main_thread():
            try:  # a background write yields the cores to the model (Linux: nice is per thread)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            except (AttributeError, OSError):
                pass
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            names = sorted(packed)
            # the header's size with the widest offsets, rounded up to a page: the data starts there
            widest = json.dumps({"key": self.key, "entries": [[n, 10**19, 10**19] for n in names]})
            off = -(-(16 + len(widest)) // ALIGN) * ALIGN
            entries = []
            for n in names:
                entries.append([n, off, int(packed[n].nbytes)])
                off += -(-packed[n].nbytes // ALIGN) * ALIGN
            header = json.dumps({"key": self.key, "entries": entries}).encode()
            pieces = [(0, memoryview(MAGIC + struct.pack("<Q", len(header)) + header))]
            pieces += [(o, memoryview(packed[n]).cast("B")) for n, o, _ in entries]
            with open(tmp, "wb") as f:
                for window in _windows(pieces, off):
                    f.write(window)
            os.replace(tmp, self.path)
            with open(f"{tmp}.ok", "w") as f:
                json.dump(_stamp(self.path), f)
            os.replace(f"{tmp}.ok", self.path.with_suffix(".ok"))
            self._trim()
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass

    def save_in_background(self, packed: dict[str, np.ndarray]) -> threading.Thread | None:
        """save() on a daemon thread (the GIL is released while it writes), unless this
        process is writing that file already."""
        if self.path is None or not packed:
            return None
        with PackCache._writing_lock:
            if self.path in PackCache._writing:
                return None
            PackCache._writing.add(self.path)

        def run() -> None:
            try:
                self.save(packed)
            finally:
                with PackCache._writing_lock:
                    PackCache._writing.discard(self.path)

        t = threading.Thread(target=run, name="rase-pack-cache", daemon=True)
        t.start()
        return t

    def _trim(self) -> None:
        files = []
        now = time.time()
        for p in self.root.iterdir():
            try:
                st = p.stat()
            except OSError:
                continue
            if ".tmp-" in p.name and now - st.st_mtime > STALE_TMP_S:  # a writer that died
                p.unlink(missing_ok=True)
            elif p.suffix == ".r16":
                try:  # last used: the sidecar's mtime (touched by every hit), else the write
                    used = max(st.st_mtime, p.with_suffix(".ok").stat().st_mtime)
                except OSError:
                    used = st.st_mtime
                files.append((used, st.st_size, p))
        total = sum(s for _, s, _ in files)
        for _, size, p in sorted(files):
            if total <= MAX_BYTES or p == self.path:
                continue
            p.unlink(missing_ok=True)
            p.with_suffix(".ok").unlink(missing_ok=True)
            total -= size
