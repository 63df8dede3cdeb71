"""RASE_PROFILE=1 phase counters, the manual's names in its order (paths rase does not have
stay 0). Forward passes add to them; profiling_snapshot() reads them."""
from __future__ import annotations

import threading

from ..config import PROFILE

PROFILE_KEYS = ("prefill_calls", "prefill_tokens", "prefill_forward_ns", "gemm_dequant_ns",
                "gemm_matmul_ns", "gemm_gpu_ns", "gemm_gpu_calls", "attn_blocked_ns", "attn_flash_ns",
                "decode_steps", "decode_forward_ns", "decode_matvec_ns", "decode_attn_ns")
_COUNTS = dict.fromkeys(PROFILE_KEYS, 0)
_LOCK = threading.Lock()


def profile_snapshot(reset: bool = True) -> dict:
    with _LOCK:
        out = {"enabled": PROFILE, **_COUNTS}
        if reset:
            for k in _COUNTS:
                _COUNTS[k] = 0
    return out


def profile_add(fwd, prefill: bool, tokens: int, ns: int) -> None:
    """Count one forward call (a step with prompt rows counts as prefill) and the C timers."""
    matmul, attn = fwd.take_profile()
    with _LOCK:
        if prefill:
            _COUNTS["prefill_calls"] += 1
            _COUNTS["prefill_tokens"] += tokens
            _COUNTS["prefill_forward_ns"] += ns
            _COUNTS["gemm_matmul_ns"] += matmul
            _COUNTS["attn_blocked_ns"] += attn
        else:
            _COUNTS["decode_steps"] += 1
            _COUNTS["decode_forward_ns"] += ns
            _COUNTS["decode_matvec_ns"] += matmul
            _COUNTS["decode_attn_ns"] += attn
