// threadpool: a rank's persistent compute threads. The caller is thread 0;
// each run wakes the workers, runs one function on every thread and waits
// for all of them (a generation-counted barrier that spins briefly, then sleeps).
#ifndef MOESERVE_MODEL_CPU_THREADPOOL_H
#define MOESERVE_MODEL_CPU_THREADPOOL_H

#include <stddef.h>

struct threadpool;

// The function every thread runs: tid in [0, n_threads).
typedef void (*threadpool_fn)(void *ctx, int tid, int n_threads);

// Runs fn(arg) on every core this process may run on (ms_cpu_count) at
// once, at most max_threads (and 64) threads, the caller one of them, and
// returns how many ran: one-off work at load (packing, checking the weights
// cache) before any pool exists. fn takes its pieces from arg itself (a
// shared counter), so the share of a thread that could not be started is
// left to the others.
int threadpool_run_once(void *(*fn)(void *), void *arg, int max_threads);

// n_threads counts the caller; 0 means ms_cpu_count().
int threadpool_create(int n_threads, struct threadpool **out, char *err, size_t errlen);
void threadpool_destroy(struct threadpool *p);
int threadpool_size(const struct threadpool *p);

// Runs fn(ctx, tid, n) on every thread and returns when all have finished.
// Not reentrant: fn must not call threadpool_run on the same pool.
void threadpool_run(struct threadpool *p, threadpool_fn fn, void *ctx);

// Like threadpool_run, for work that any thread may take piece by piece
// (every fn takes pieces from a shared counter until none are left, so the
// caller's own fn returns only when every piece is taken). The caller waits
// only for the threads already inside fn; a thread that has not started
// when the caller's fn returns never runs it, so one the OS has taken off
// its core (other processes on a shared machine) does not hold the run up.
// tid is still unique among the threads running fn. Not reentrant either.
void threadpool_run_shared(struct threadpool *p, threadpool_fn fn, void *ctx);

// Splits [0, n) into contiguous, near-equal ranges, one per thread.
void threadpool_range(int n, int tid, int n_threads, int *begin, int *end);

#endif
