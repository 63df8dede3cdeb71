"""The pack cache's writes, which run on a thread of their own (rase/store/pack_cache.py)."""
from __future__ import annotations


def wait_for_saves() -> None:
    """Until every pack-cache write under way has finished."""
    import threading

    for t in threading.enumerate():
        if t.name == "rase-pack-cache":
            t.join()
