// ops: the CPU backend's operations over a batch of rows — matmuls split
// across a rank's thread pool, and the per-row pieces of a decoder layer
// (RMSNorm, NeoX RoPE, router top-k) that the forward pass runs inside its
// own parallel loops.
#ifndef MOESERVE_MODEL_CPU_OPS_H
#define MOESERVE_MODEL_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/cpu/kernels.h"
#include "model/cpu/threadpool.h"

// What a rank's threads compute with: the pool, the kernel table and one
// scratch area per thread.
struct cpu_exec {
    struct threadpool *pool;
    const struct cpu_kernels *k;
    float *scratch;        // (n_threads, scratch_stride) floats, 64-byte aligned rows
    size_t scratch_stride;
};

static inline float *cpu_exec_scratch(const struct cpu_exec *e, int tid)
{
    return e->scratch + (size_t)tid * e->scratch_stride;
}

// Runs every job in one parallel region: their outputs are cut into units
// of k->unit and the units into contiguous pieces of about equal cost
// (weight bytes plus FLOPs), a few per thread, taken by whichever thread is
// free (threadpool_run_shared), so one small matrix or many experts alike
// keep every thread busy and a thread off its core holds nothing up.
// Results do not depend on the thread count or on who takes which piece.
void cpu_matmul(const struct cpu_exec *e, const struct cpu_mm *jobs, int n_jobs);

// out = x / sqrt(mean(x^2) + eps) * w, the sum of squares in double.
void cpu_rmsnorm(const float *x, const void *w, enum dtype wt, int n, float eps, float *out);

// cos/sin of pos * inv_freq[i] for the head_dim/2 rotary pairs.
void cpu_rope_angles(int pos, const double *inv_freq, int half, float *cos_out, float *sin_out);
// (The rotation itself is the kernel tables' rope: NeoX pairs (x[i], x[i + half]).)

// Router: the k largest of n logits (ties: lowest index first; a NaN ranks
// as -inf), their softmax weights over all n, renormalised over the k when
// norm_topk. 1 <= k <= n; otherwise every id is -1 and every weight 0.
void cpu_router_topk(const float *logits, int n, int k, bool norm_topk, int32_t *ids, float *w);

#endif
