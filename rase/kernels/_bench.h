// rase/kernels/_bench.h: the forward's matmul loop on one matrix, for the kernel benchmarks
// (benchmarks/bench_kernels.py): the same 32-row chunks from a shared counter and the same
// rase_mm_rows as a step, without the rest of a model.
#ifndef RASE_BENCH_H
#define RASE_BENCH_H

#include "_forward.h"

// Y (T, rows) = A (T activation rows in rase_act_for's format, `as` bytes apart) w^T, reps times
// on n_threads; returns the wall time of all reps in ns, -1 without memory.
static int64_t rase_bench_matmul(int isa, const rase_mat *w, const uint8_t *A, size_t as, int T, float *Y,
                                 int n_threads, int reps) {
    rase_model m;
    memset(&m, 0, sizeof m);
    m.isa = isa;  // rase_mm_rows reads only the ISA of the model
    const int act = rase_act_for(w->type, isa, T, w->cols);
    const int64_t work_stride = RASE_CHUNK_ROWS * w->cols;
    rase_job_slot *slots = rase_alloc((size_t)n_threads * sizeof(rase_job_slot));
    float *work = rase_alloc((size_t)n_threads * work_stride * sizeof(float));
    if (!slots || !work) {
        free(slots);
        free(work);
        return -1;
    }
    const int64_t chunks = (w->rows + RASE_CHUNK_ROWS - 1) / RASE_CHUNK_ROWS;
    const int64_t t0 = rase_now_ns();
    for (int rep = 0; rep < reps; ++rep) {
        for (int i = 0; i < n_threads; ++i) slots[i].next = 0;
#pragma omp parallel num_threads(n_threads)
        {
            int ith = 0, nth = 1;
#ifdef _OPENMP
            ith = omp_get_thread_num();
            nth = omp_get_num_threads();
#endif
            rase_jobs jobs = rase_jobs_start(slots, chunks, ith, nth);
            for (int64_t c = rase_jobs_next(&jobs); c < chunks; c = rase_jobs_next(&jobs)) {
                const int64_t r0 = c * RASE_CHUNK_ROWS, r1 = r0 + RASE_CHUNK_ROWS < w->rows ? r0 + RASE_CHUNK_ROWS : w->rows;
                rase_mm_rows(&m, w, A, act, as, T, Y, r0, r1, work + ith * work_stride);
            }
        }
    }
    const int64_t dt = rase_now_ns() - t0;
    free(slots);
    free(work);
    return dt;
}

static uint64_t rase_bench_xor_ref(const uint8_t *p, int64_t lines) {
    uint64_t x[8] = {0};
    for (int64_t i = 0; i < lines; ++i)
        for (int k = 0; k < 8; ++k) x[k] ^= ((const uint64_t *)(p + i * 64))[k];
    return x[0] ^ x[1] ^ x[2] ^ x[3] ^ x[4] ^ x[5] ^ x[6] ^ x[7];
}
#if RASE_HAVE_X86
RASE_TARGET_AVX2 static uint64_t rase_bench_xor_avx2(const uint8_t *p, int64_t lines) {
    __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
    for (int64_t i = 0; i < lines; ++i) {  // two 32-byte loads per line, as the kernels read
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(p + i * 64)));
        b = _mm256_xor_si256(b, _mm256_loadu_si256((const __m256i *)(p + i * 64 + 32)));
    }
    uint64_t x[4];
    _mm256_storeu_si256((__m256i *)x, _mm256_xor_si256(a, b));
    return x[0] ^ x[1] ^ x[2] ^ x[3];
}
#endif
static uint64_t rase_bench_xor(const uint8_t *p, int64_t lines) {
#if RASE_HAVE_X86
    if (rase_isa >= RASE_ISA_AVX2) return rase_bench_xor_avx2(p, lines);
#endif
    return rase_bench_xor_ref(p, lines);
}

// Streams buf (n bytes) reps times, each thread its contiguous share, 64 bytes a step; the
// XOR of everything read lands in *sink so no read is optimized away. Returns ns.
static int64_t rase_bench_read(const uint8_t *buf, int64_t n, int n_threads, int reps, int64_t *sink) {
    const int64_t t0 = rase_now_ns();
    for (int rep = 0; rep < reps; ++rep) {
        uint64_t total = 0;
#pragma omp parallel num_threads(n_threads) reduction(^ : total)
        {
            int ith = 0, nth = 1;
#ifdef _OPENMP
            ith = omp_get_thread_num();
            nth = omp_get_num_threads();
#endif
            int64_t lo, hi;
            rase_split(n / 64, ith, nth, &lo, &hi);
            total ^= rase_bench_xor(buf + lo * 64, hi - lo);
        }
        *sink ^= (int64_t)total;
    }
    return rase_now_ns() - t0;
}

#endif  // RASE_BENCH_H
