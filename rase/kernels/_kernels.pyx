# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kernels over rase/kernels/_simd.h and rase/_quants.h.

Every public function is a `def` shim: it checks types and shapes with the GIL held, then enters
a `noexcept nogil` C core that never touches Python objects.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc


# ---------------------------------------------------------------- ISA selection and build facts

def isa_names():
    """Names of every ISA path this build knows, index = ISA id."""
    return [RASE_ISA_NAMES[i].decode() for i in range(RASE_ISA_COUNT)]


def isa_compiled():
    return [RASE_ISA_NAMES[i].decode() for i in range(RASE_ISA_COUNT) if rase_isa_compiled(i)]


def isa_supported():
    return [RASE_ISA_NAMES[i].decode() for i in range(RASE_ISA_COUNT)
            if rase_isa_compiled(i) and rase_isa_supported(i)]


def isa_best():
    return RASE_ISA_NAMES[rase_isa_best()].decode()


def set_isa(str name):
    """Select the ISA path for every kernel; raises ValueError if it cannot run here."""
    global rase_isa
    rase_isa = _isa_id(name)


cdef int _isa_id(str name) except -1:
    names = isa_names()
    if name not in names:
        raise ValueError(f"unknown ISA {name!r}; known: {', '.join(names)}")
    cdef int isa = names.index(name)
    if not (rase_isa_compiled(isa) and rase_isa_supported(isa)):
        raise ValueError(f"ISA {name!r} is not supported by this CPU or build")
    return isa


def get_isa():
    return RASE_ISA_NAMES[rase_isa].decode()


MAX_PREFETCH_BYTES = 1 << 16


def cpu_vendor():
    """The CPU's vendor string from cpuid ("AuthenticAMD", "GenuineIntel", ...), "" without one."""
    cdef char out[13]
    rase_cpu_vendor(out)
    return out[:12].decode("ascii", "replace").rstrip("\0")


def prefetch_default():
    """The weight prefetch distance this CPU's vendor gets by default, in bytes (0: none)."""
    return rase_prefetch_default()


def set_prefetch(int nbytes):
    """How far ahead (bytes) weight streams prefetch; 0 turns software prefetch off. Changes
    timing only, never a result. Set it between steps, not while a forward runs."""
    global rase_prefetch_bytes
    if not 0 <= nbytes <= MAX_PREFETCH_BYTES or nbytes % 64:
        raise ValueError(f"a prefetch distance is 0 or a multiple of 64 up to {MAX_PREFETCH_BYTES}, got {nbytes}")
    rase_prefetch_bytes = nbytes


def get_prefetch():
    return rase_prefetch_bytes


def compiler_info():
    return {"compiler": RASE_COMPILER.decode(), "openmp": int(RASE_OPENMP),
            "omp_max_threads": rase_omp_max_threads()}


def quant_traits():
    """The C traits rows (_traits.h): {ggml type id: (name, block size, bytes per block, has_avx2)}."""
    out = {}
    for t in range(RASE_GGML_TYPE_COUNT):
        if rase_traits(t).name != NULL:
            out[t] = (rase_traits(t).name.decode(), rase_traits(t).blck, rase_traits(t).size,
                      rase_traits(t).dequant[RASE_ISA_AVX2] != NULL)
    return out


# ---------------------------------------------------------------- the stages, in data-path order

include "_kernels_quants.pxi"
include "_kernels_weights.pxi"
include "_kernels_sample.pxi"
include "_kernels_forward.pxi"
include "_kernels_ops.pxi"
include "_kernels_bench.pxi"
include "_kernels_gguf.pxi"
