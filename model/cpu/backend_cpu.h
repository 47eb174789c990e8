// backend_cpu: the CPU backend — model/backend.h's op table over a rank's
// thread pool and a kernel table (scalar, AVX2, AVX-512, AMX). It is the
// numerical reference every other backend is tested against. Backend memory
// is host memory here.
#ifndef MOESERVE_MODEL_CPU_BACKEND_CPU_H
#define MOESERVE_MODEL_CPU_BACKEND_CPU_H

#include <stddef.h>

#include "model/backend.h"
#include "model/cpu/kernels.h"

// A backend on n_threads compute threads (the caller's thread is one of
// them; 0: every core this process may use) running kernel table k (NULL:
// cpu_kernels_best(), which MOESERVE_CPU_KERNELS can steer). Freed with its
// ops->destroy.
int backend_cpu_create(int n_threads, const struct cpu_kernels *k, struct backend **out,
                       char *err, size_t errlen);

// The kernel table a CPU backend runs (tests and benchmarks name it).
const struct cpu_kernels *backend_cpu_kernels(const struct backend *b);

// The most floats of act-order inputs (backend_mat.perm) b copies before
// it multiplies them (0: the default, 8 Mi floats); a matmul needing more
// runs in batches, a gather wider than that split by rows, with the same
// results. Tests lower it to make the batches. Returns the previous limit.
size_t backend_cpu_set_gather_floats(struct backend *b, size_t floats);

// Where weights prepared by a CPU backend came from: 0 prepared in memory,
// 1 mapped from a weights cache file (model/cpu/weights_cache.h), 2
// prepared and written to one.
int backend_cpu_weights_cached(const struct backend_weights *w);

#endif
