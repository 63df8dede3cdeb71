"""The kernels: the Cython module `_kernels` (def shims with the GIL, nogil cores) over C headers,
one traits row per quant type, one header per kernel family or mixer, the barrier pool and ISA
dispatch (docs/ARCHITECTURE.md); quants.py mirrors the C type table, smoke.py checks every path."""
