"""Environment variables rase reads, read here and nowhere else."""
from __future__ import annotations

import os
from pathlib import Path

SIMD_ENV = "RASE_SIMD"  # "scalar" | "avx2" | unset (= best the CPU supports)
THREADS_ENV = "RASE_NUM_THREADS"
STORE_ENV = "RASE_STORE"


def simd_request() -> str | None:
    value = os.environ.get(SIMD_ENV, "").strip().lower()
    return value or None


def default_store() -> Path:
    """$RASE_STORE, else $XDG_DATA_HOME/rase, else ~/.local/share/rase."""
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rase"
