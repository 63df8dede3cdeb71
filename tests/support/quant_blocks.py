"""Random quantized blocks for the kernel tests: any bit pattern a file could hold, the scale
fields kept finite; and rows of them with their values as gguf-py dequantizes them."""
from __future__ import annotations

import gguf  # test extra: the independent dequantizer we check against
import numpy as np

from rase import QuantType
from rase.kernels.quants import QUANT_BLOCKS
from tests.support.reference import ACT_FORMAT

# byte offsets of the f16 scale fields inside one block (kept finite in random blocks)
F16_FIELDS = {
    QuantType.Q4_0: [0], QuantType.Q4_1: [0, 2], QuantType.Q5_0: [0], QuantType.Q5_1: [0, 2],
    QuantType.Q8_0: [0], QuantType.Q2_K: [80, 82], QuantType.Q3_K: [108],
    QuantType.Q4_K: [0, 2], QuantType.Q5_K: [0, 2], QuantType.Q6_K: [208], QuantType.MXFP4: [],
}
# byte offsets of E8M0 exponents: kept where the values stay finite, the two denormal codes included
E8M0_FIELDS = {QuantType.MXFP4: [0]}


def random_blocks(qtype: QuantType, n_blocks: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    blck, size = QUANT_BLOCKS[qtype]
    if qtype == QuantType.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).tobytes()
    if qtype in (QuantType.F16, QuantType.BF16):
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        exp_mask = 0x7C00 if qtype == QuantType.F16 else 0x7F80
        bits[(bits & exp_mask) == exp_mask] &= ~np.uint16(0x4000)  # no inf/NaN
        return bits.tobytes()
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        # any finite f16, subnormals and negatives included
        h = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        h[(h & 0x7C00) == 0x7C00] &= ~np.uint16(0x4000)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    for off in E8M0_FIELDS.get(qtype, []):
        raw[:, off] = rng.choice(np.r_[0, 1, 2, 100:150], n_blocks).astype(np.uint8)
    return raw.tobytes()


def row_and_values(qtype: QuantType, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random row of n elements of qtype: its bytes and gguf-py's dequantized values (f64)."""
    blck, _ = QUANT_BLOCKS[qtype]
    raw = np.frombuffer(random_blocks(qtype, n // blck, seed), np.uint8).copy()
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(qtype))).reshape(-1)
    return raw, deq.astype(np.float64)


def lengths(qtype: QuantType) -> list[int]:
    """Row lengths that exercise a type's blocks: one, several, an odd count."""
    kblk = 256 if ACT_FORMAT.get(int(qtype)) == "q8_K" else 32
    return [kblk, 3 * kblk, 7 * kblk] if kblk == 32 else [256, 768]
