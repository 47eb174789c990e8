// probe: what this machine can do, measured in the same run as a benchmark
// — streaming read bandwidth over a buffer far larger than the caches, and
// the FMA peak of a kernel table on every thread of a pool.
#ifndef MOESERVE_MODEL_CPU_PROBE_H
#define MOESERVE_MODEL_CPU_PROBE_H

#include <stddef.h>

#include "model/cpu/kernels.h"
#include "model/cpu/threadpool.h"

struct cpu_read_probe {
    float *buf;   // (bytes / 4), touched once at creation; on 2 MiB pages where granted
    size_t bytes;
    void *map;    // the mapping buf lies in (aligned inside it)
    size_t map_bytes;
};

int cpu_read_probe_create(size_t bytes, struct cpu_read_probe *p, char *err, size_t errlen);
void cpu_read_probe_destroy(struct cpu_read_probe *p);
// Best of reps passes: every thread streams its share of the buffer once.
// Returns bytes per second.
double cpu_read_probe_run(const struct cpu_read_probe *p, struct threadpool *pool,
                          const struct cpu_kernels *k, int reps);

// Best of reps runs of iters FMA rounds per thread. Returns FLOP per second.
double cpu_fma_peak(struct threadpool *pool, const struct cpu_kernels *k, long iters, int reps);

#endif
