"""Environment variables rase reads, read here and nowhere else."""
from __future__ import annotations

import os
from pathlib import Path

SIMD_ENV = "RASE_SIMD"  # "scalar" | "avx2" | "avx512" | unset (= best the CPU supports)
PREFETCH_ENV = "RASE_PREFETCH"  # bytes ahead weight streams prefetch, 0 = none; unset = the CPU's default
THREADS_ENV = "RASE_NUM_THREADS"
STORE_ENV = "RASE_STORE"
PACK_CACHE_ENV = "RASE_PACK_CACHE"  # unset: the user cache dir; "0"/"off": no cache; else a directory


def simd_request() -> str | None:
    value = os.environ.get(SIMD_ENV, "").strip().lower()
    return value or None


def prefetch_request() -> str | None:
    value = os.environ.get(PREFETCH_ENV, "").strip()
    return value or None


def default_store() -> Path:
    """$RASE_STORE, else $XDG_DATA_HOME/rase, else ~/.local/share/rase."""
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rase"


def pack_cache_dir() -> Path | None:
    """Where repacked weights are kept (rase/store/pack_cache.py), or None when disabled."""
    value = os.environ.get(PACK_CACHE_ENV, "").strip()
    if value.lower() in ("0", "off", "false", "no"):
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rase" / "packed"


def physical_cores() -> int:
    """Physical cores this process may run on (SMT siblings counted once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        sib = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(sib.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def default_threads() -> int:
    """$RASE_NUM_THREADS, else physical cores, minus 4 from 12 cores up (hybrid CPUs: every
    barrier waits for the slowest core; the seed's policy, manual section 8)."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            from .errors import BackendUnavailable

            raise BackendUnavailable(f"{THREADS_ENV}={value!r} must be a positive integer")
        return n
    cores = physical_cores()
    return cores - 4 if cores >= 12 else cores


PROFILE_ENV = "RASE_PROFILE"
PROFILE = os.environ.get(PROFILE_ENV) == "1"  # read once per process (manual section 11)


MMAP_THRESHOLD = 128 << 10  # glibc's initial M_MMAP_THRESHOLD


def fix_malloc_threshold() -> bool:
    """For a long-running server process (rase serve), not at import: keep glibc's mmap threshold
    at 128 KiB instead of letting it rise to the largest freed block. Each request and step
    allocates and frees vocabulary-sized buffers (200-400 KiB) on several threads; with the
    threshold raised they come from the arenas, whose fragmentation grew RSS by ~60 KiB per
    request in the soak. True when set (glibc), False elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        return bool(libc.mallopt(-3, MMAP_THRESHOLD))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False
