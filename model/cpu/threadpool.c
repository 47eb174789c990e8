// threadpool: persistent workers woken by a generation counter; futexes for
// sleeping so that an idle rank costs nothing, a short spin so that the
// hundreds of runs in one forward step do not each pay a system call.
// Shared runs (threadpool_run_shared) wait only for the workers that took
// part: on a machine shared with other processes a worker the OS has not
// put back on a core would otherwise hold up every op of a step (measured on
// a 2-core VM at load average 6: a decode step 3x slower than when quiet).
#include "model/cpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/spin.h"

// About 20-50 microseconds of pause instructions: long enough to bridge the
// gap between two kernels of a step, short enough not to steal a shared core.
#define SPIN_ITERS 2000

struct worker {
    struct threadpool *pool;
    pthread_t thread;
    int tid;
};

struct threadpool {
    int n_threads;
    struct worker *workers;       // (n_threads - 1), tids 1..n-1
    threadpool_fn fn;
    void *ctx;
    _Atomic uint32_t generation;  // bumped by each run; workers wait for a change
    _Atomic uint32_t pending;     // workers still running the current generation
    _Atomic uint32_t sleepers;    // workers in futex_wait on generation
    _Atomic uint32_t master_sleeping;
    // Rung by a worker leaving a shared run; the caller sleeps on it. Its
    // own word, not pending: a worker rings after leaving the gate, so the
    // ring can land after the caller has returned and set pending for the
    // next full run, which a stray +1 there would never let finish.
    _Atomic uint32_t bell;
    _Atomic int stop;
    // The run in progress: its generation (high 32 bits), whether it is
    // shared, whether it is closed to late workers, and how many workers are
    // inside a shared run's fn (GATE_COUNT bits).
    _Atomic uint64_t gate;
};

#define GATE_SHARED ((uint64_t)1 << 31)
#define GATE_CLOSED ((uint64_t)1 << 30)
#define GATE_COUNT (GATE_CLOSED - 1)

static uint64_t gate_of(uint32_t generation, bool shared)
{
    return (uint64_t)generation << 32 | (shared ? GATE_SHARED : 0);
}

// A worker that saw generation g joins its shared run unless the run is over
// (closed, or another generation already): true when it must run fn.
static bool gate_join(struct threadpool *p, uint32_t g)
{
    uint64_t v = atomic_load(&p->gate);
    for (;;) {
        if ((uint32_t)(v >> 32) != g || (v & GATE_CLOSED)) return false;
        if (atomic_compare_exchange_weak(&p->gate, &v, v + 1)) return true;
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct threadpool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                ms_cpu_relax();
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            // Re-check after announcing ourselves, so a wake cannot be missed.
            if (atomic_load(&p->generation) == seen) ms_futex_wait(&p->generation, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        const uint64_t v = atomic_load(&p->gate);
        if ((uint32_t)(v >> 32) != g) continue; // a shared run that ended without us
        if (v & GATE_SHARED) {
            if (!gate_join(p, g)) continue;
            p->fn(p->ctx, w->tid, p->n_threads);
            atomic_fetch_sub(&p->gate, 1);
            // The caller may sleep on the bell: ring it. A late ring only
            // bumps a counter nobody waits on.
            atomic_fetch_add(&p->bell, 1);
            if (atomic_load(&p->master_sleeping)) ms_futex_wake(&p->bell, 1);
            continue;
        }
        p->fn(p->ctx, w->tid, p->n_threads);
        if (atomic_fetch_sub(&p->pending, 1) == 1 &&
            atomic_load(&p->master_sleeping))
            ms_futex_wake(&p->pending, 1);
    }
}

int threadpool_run_once(void *(*fn)(void *), void *arg, int max_threads)
{
    const int n_cpu = ms_cpu_count();
    int n = n_cpu > 64 ? 64 : n_cpu;
    if (max_threads >= 1 && n > max_threads) n = max_threads;
    pthread_t th[64];
    int started = 0;
    for (; started < n - 1; started++)
        if (pthread_create(&th[started], NULL, fn, arg)) break;
    fn(arg); // and what threads could not be started leave to this one
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    return started + 1;
}

int threadpool_create(int n_threads, struct threadpool **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n_threads < 0 || n_threads > 4096)
        return ms_err(err, errlen, MS_EINVAL, "threads must be between 1 and 4096 (or 0 for all "
                      "cores), not %d", n_threads);
    if (n_threads == 0) n_threads = ms_cpu_count();
    struct threadpool *p = calloc(1, sizeof *p);
    if (!p) return ms_err(err, errlen, MS_ENOMEM, "out of memory creating a thread pool");
    p->n_threads = n_threads;
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            free(p);
            return ms_err(err, errlen, MS_ENOMEM, "out of memory creating a thread pool");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        struct worker *w = &p->workers[i];
        w->pool = p;
        w->tid = i + 1;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc) {
            p->n_threads = i + 1; // the workers started so far
            threadpool_destroy(p);
            return ms_err(err, errlen, MS_ENOMEM, "cannot start compute thread %d of %d: %s",
                          i + 1, n_threads, strerror(rc));
        }
    }
    *out = p;
    return 0;
}

void threadpool_destroy(struct threadpool *p)
{
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    ms_futex_wake(&p->generation, INT32_MAX);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->workers[i].thread, NULL);
    free(p->workers);
    free(p);
}

int threadpool_size(const struct threadpool *p) { return p->n_threads; }

void threadpool_run(struct threadpool *p, threadpool_fn fn, void *ctx)
{
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, (uint32_t)(p->n_threads - 1), memory_order_relaxed);
    const uint32_t g = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    atomic_store(&p->gate, gate_of(g, false));
    atomic_fetch_add(&p->generation, 1); // seq_cst: ordered before the sleepers check
    if (atomic_load(&p->sleepers)) ms_futex_wake(&p->generation, INT32_MAX);
    fn(ctx, 0, p->n_threads);
    int spins = 0;
    uint32_t left;
    while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0) {
        if (++spins < SPIN_ITERS) {
            ms_cpu_relax();
            continue;
        }
        atomic_store(&p->master_sleeping, 1);
        if ((left = atomic_load(&p->pending)) != 0) ms_futex_wait(&p->pending, left);
        atomic_store(&p->master_sleeping, 0);
        spins = 0;
    }
}

void threadpool_run_shared(struct threadpool *p, threadpool_fn fn, void *ctx)
{
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    const uint32_t g = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    atomic_store(&p->gate, gate_of(g, true));
    atomic_fetch_add(&p->generation, 1); // seq_cst: ordered before the sleepers check
    if (atomic_load(&p->sleepers)) ms_futex_wake(&p->generation, INT32_MAX);
    fn(ctx, 0, p->n_threads);
    // Every piece is taken: close the run to workers not yet inside, and
    // wait for those that are.
    uint64_t v = atomic_fetch_or(&p->gate, GATE_CLOSED) | GATE_CLOSED;
    int spins = 0;
    while (v & GATE_COUNT) {
        if (++spins < SPIN_ITERS) {
            ms_cpu_relax();
        } else {
            // Read the bell before the count: a worker leaving after the
            // count check has rung a bell that no longer matches, so the
            // wait returns at once.
            const uint32_t bell = atomic_load(&p->bell);
            atomic_store(&p->master_sleeping, 1);
            if (atomic_load(&p->gate) & GATE_COUNT) ms_futex_wait(&p->bell, bell);
            atomic_store(&p->master_sleeping, 0);
            spins = 0;
        }
        v = atomic_load(&p->gate);
    }
}

void threadpool_range(int n, int tid, int n_threads, int *begin, int *end)
{
    long long b = (long long)n * tid / n_threads, e = (long long)n * (tid + 1) / n_threads;
    *begin = (int)b;
    *end = (int)e;
}
