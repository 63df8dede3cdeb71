"""ggml tensor types rase executes: ids by name, block sizes and bytes per block.

The sizes are read from the C traits rows (rase/kernels/_traits.h, one per type), so a type's facts live
in one place; QuantType names the ids (a C row without a name here fails at import), and
tests/kernels/test_quants.py checks the names and sizes against ggml's. Block layouts: ggml-common.h.
"""
from __future__ import annotations

import enum
from typing import NamedTuple


class QuantType(enum.IntEnum):
    # values are ggml_type ids as stored in GGUF tensor infos
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30
    MXFP4 = 39


class QuantBlock(NamedTuple):
    block_size: int  # elements per block
    type_size: int  # bytes per block


def _blocks() -> dict[QuantType, QuantBlock]:
    from . import _kernels

    return {QuantType(t): QuantBlock(blck, size) for t, (_name, blck, size, _avx2) in _kernels.quant_traits().items()}


QUANT_BLOCKS: dict[QuantType, QuantBlock] = _blocks()

# ggml types that exist but rase has no kernels for; named so errors can say which one.
KNOWN_UNSUPPORTED: dict[int, str] = {
    4: "Q4_2 (removed from ggml)", 5: "Q4_3 (removed from ggml)", 9: "Q8_1", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0",
}


def row_bytes(qtype: QuantType, n: int) -> int:
    """Bytes of one row of n elements; n must be a multiple of the block size."""
    blk = QUANT_BLOCKS[qtype]
    return (n // blk.block_size) * blk.type_size


def dequantize(tensor) -> "np.ndarray":
    """A GGUF tensor (gguf.TensorInfo) as float32 in numpy order (tensor.shape)."""
    import numpy as np

    from . import _kernels
    from ..errors import UnsupportedQuantType

    if tensor.qtype is None:
        raise UnsupportedQuantType(
            f"tensor {tensor.name!r} uses ggml type {tensor.type_name}, which rase cannot execute; "
            f"use a file quantized to one of {', '.join(t.name for t in QUANT_BLOCKS)}"
        )
    out = np.empty(tensor.shape, dtype=np.float32)
    _kernels.dequantize_into(int(tensor.qtype), tensor.data, out.reshape(-1))
    return out
