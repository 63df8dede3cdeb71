# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kernels over rase/_simd.h and rase/_quants.h.

Every public function is a `def` shim: it checks types and shapes with the GIL held, then enters
a `noexcept nogil` C core that never touches Python objects.
"""
from libc.stdint cimport uint8_t, int64_t

cdef extern from "_simd.h" nogil:
    int RASE_ISA_SCALAR
    int RASE_ISA_AVX2
    int RASE_ISA_COUNT
    const char *RASE_ISA_NAMES[]
    int rase_isa
    int rase_isa_compiled(int isa)
    int rase_isa_supported(int isa)
    int rase_isa_best()

cdef extern from *:
    """
    #ifdef _OPENMP
    #  include <omp.h>
    #  define RASE_OPENMP _OPENMP
    static int rase_omp_max_threads(void) { return omp_get_max_threads(); }
    #else
    #  define RASE_OPENMP 0
    static int rase_omp_max_threads(void) { return 1; }
    #endif
    #ifdef __clang__
    #  define RASE_COMPILER "clang " __clang_version__
    #elif defined(__GNUC__)
    #  define RASE_COMPILER "gcc " __VERSION__
    #else
    #  define RASE_COMPILER "unknown"
    #endif
    """
    int RASE_OPENMP
    const char *RASE_COMPILER
    int rase_omp_max_threads() nogil

cdef extern from "_quants.h" nogil:
    ctypedef void (*rase_dequant_fn)(const void *src, float *dst, int64_t n) noexcept nogil
    ctypedef struct rase_quant_traits:
        const char *name
        int blck
        int size
        rase_dequant_fn dequant[2]
    int RASE_GGML_TYPE_COUNT
    const rase_quant_traits QUANT_TRAITS[]
    rase_dequant_fn rase_dequant_for(int qtype, int isa)


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


def compiler_info():
    return {"compiler": RASE_COMPILER.decode(), "openmp": int(RASE_OPENMP),
            "omp_max_threads": rase_omp_max_threads()}


def quant_traits():
    """The C QUANT_TRAITS table: {ggml type id: (name, block size, bytes per block, has_avx2)}."""
    out = {}
    for t in range(RASE_GGML_TYPE_COUNT):
        if QUANT_TRAITS[t].name != NULL:
            out[t] = (QUANT_TRAITS[t].name.decode(), QUANT_TRAITS[t].blck, QUANT_TRAITS[t].size,
                      QUANT_TRAITS[t].dequant[RASE_ISA_AVX2] != NULL)
    return out


# ---------------------------------------------------------------- dequantization

cdef int _check_type(int qtype) except -1:
    if qtype < 0 or qtype >= RASE_GGML_TYPE_COUNT or QUANT_TRAITS[qtype].name == NULL:
        raise ValueError(f"ggml type {qtype} has no kernels in rase")
    return 0


def dequantize_into(int qtype, const uint8_t[::1] src, float[::1] dst, isa=None):
    """dst[0..n) = the n = len(dst) values stored in src; n a multiple of the type's block size.

    src: (n / blck * size,) bytes of consecutive blocks. isa: name of the path (default: current).
    """
    _check_type(qtype)
    cdef int64_t n = dst.shape[0]
    cdef int blck = QUANT_TRAITS[qtype].blck, size = QUANT_TRAITS[qtype].size
    if n % blck:
        raise ValueError(f"{n} elements is not a multiple of the block size {blck}")
    if src.shape[0] != (n // blck) * size:
        raise ValueError(f"{n} elements need {(n // blck) * size} bytes, got {src.shape[0]}")
    cdef int path = rase_isa if isa is None else _isa_id(isa)
    cdef rase_dequant_fn fn = rase_dequant_for(qtype, path)
    if n == 0:
        return
    with nogil:
        fn(&src[0], &dst[0], n)
