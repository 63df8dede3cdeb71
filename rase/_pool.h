// rase/_pool.h: the barrier that separates ops inside one OpenMP parallel region.
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
#if RASE_HAVE_X86
    __builtin_ia32_pause();
#endif
}

// reset (or NULL): set to 0 by the last thread to arrive, before any thread leaves (so a work
// counter shared by the next op starts from 0 for everyone)
static inline void rase_barrier_wait_reset(rase_barrier *b, int *reset) {
    if (b->n <= 1) {
        if (reset) *reset = 0;
        return;
    }
    const int phase = __atomic_load_n(&b->phase, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == b->n) {
        if (reset) __atomic_store_n(reset, 0, __ATOMIC_RELAXED);
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

// the next unit of work of a counter shared by every thread (dynamic split: a thread that is
// held up by the OS leaves its units to the others; which thread computes a unit changes no bit)
static inline int rase_next_job(int *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

// [*lo, *hi) = thread ith's share of n items, contiguous, sizes differing by at most one
static inline void rase_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    const int64_t base = n / nth, extra = n % nth;
    *lo = ith * base + (ith < extra ? ith : extra);
    *hi = *lo + base + (ith < extra ? 1 : 0);
}

#endif  // RASE_POOL_H
