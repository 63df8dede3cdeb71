# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Test build of rase.kernels._kernels: the same module compiled with RASE_EMULATE_SIMD, every SIMD
intrinsic in portable C (SIMDe), so tests check the AVX2 and AVX-512 kernels bit for bit on any
CPU. Never used by the runtime; slow."""
from rase.kernels._kernels cimport *

include "_kernels.pyx"
