// rase/kernels/_pool.h: the barrier that separates ops inside one OpenMP parallel region.
//
// A forward is one `#pragma omp parallel` region; every op splits its work by (ith, nth) and
// ops are separated by rase_barrier_wait. A spinning barrier costs ~0.1 us here against
// 1-100 us for an OpenMP fork/join (docs: cpu-kernels.md section 1.3).
#ifndef RASE_POOL_H
#define RASE_POOL_H

#include "_simd.h"
#include <sched.h>
#ifdef _OPENMP
#  include <omp.h>
#endif

#ifndef RASE_SPIN_LIMIT
#define RASE_SPIN_LIMIT 2048  // pause-spins before a waiting thread yields its core
#endif

typedef struct {
    _Alignas(64) int count;  // threads arrived in the current phase
    _Alignas(64) int phase;  // bumped by the last arrival
    int n;                   // team size; set once per region before the first wait
} rase_barrier;

static inline void rase_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// one thread's work counter, alone on its cache line
typedef struct { _Alignas(64) int next; } rase_job_slot;
_Static_assert(sizeof(rase_job_slot) == 64, "rase_job_slot: one cache line");

// reset (or NULL): slots [0, n) set to 0 by the last thread to arrive, before any thread leaves
// (so the next op's work counters start from 0 for everyone; a thread still claiming work of
// the op before cannot see a reset counter)
static inline void rase_barrier_wait_reset(rase_barrier *b, rase_job_slot *reset) {
    if (b->n <= 1) {
        if (reset) reset[0].next = 0;
        return;
    }
    const int phase = __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
        if (reset)
            for (int i = 0; i < b->n; ++i) __atomic_store_n(&reset[i].next, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&b->phase, 1, __ATOMIC_RELEASE);
    } else {
        // spin briefly (a barrier normally completes within ~0.1 us), then yield: when the
        // machine is oversubscribed the thread we wait for may need this very core
        for (int spins = 0; __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE) == phase; ++spins) {
            if (spins < RASE_SPIN_LIMIT) rase_cpu_relax();
            else sched_yield();
        }
    }
}

static inline void rase_barrier_wait(rase_barrier *b) { rase_barrier_wait_reset(b, NULL); }

// [*lo, *hi) = thread ith's share of n items, contiguous, sizes differing by at most one
static inline void rase_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    const int64_t base = n / nth, extra = n % nth;
    *lo = ith * base + (ith < extra ? ith : extra);
    *hi = *lo + base + (ith < extra ? 1 : 0);
}

// Units [0, total) of one op: thread ith takes its own contiguous share (rase_split) in order,
// then helps the others from the front of what they have left. Contiguous shares keep each
// core's hardware prefetcher on one long stream (small units handed out alternately read
// ~30% slower from DRAM on a 2-core Zen 4); the help means a thread held up by the OS leaves
// its units to the others. Which thread computes a unit changes no bit.
typedef struct { rase_job_slot *slots; int64_t total; int ith, nth, k; } rase_jobs;

static inline rase_jobs rase_jobs_start(rase_job_slot *slots, int64_t total, int ith, int nth) {
    const rase_jobs j = {slots, total, ith, nth, 0};
    return j;
}

// the next unit for this thread, or total when none is left
static inline int64_t rase_jobs_next(rase_jobs *j) {
    for (; j->k < j->nth; ++j->k) {
        const int o = (j->ith + j->k) % j->nth;
        int64_t lo, hi;
        rase_split(j->total, o, j->nth, &lo, &hi);
        const int64_t c = lo + __atomic_fetch_add(&j->slots[o].next, 1, __ATOMIC_RELAXED);
        if (c < hi) return c;
    }
    return j->total;
}

#endif  // RASE_POOL_H
