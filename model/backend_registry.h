// backend_registry: the one place that knows every backend — it parses
// --device, resolves auto, makes a rank's backend and the communicator
// group that matches the ranks' backends. It is the only file outside
// the CPU backend's folder (and gpu/) that includes their headers.
#ifndef MOESERVE_MODEL_BACKEND_REGISTRY_H
#define MOESERVE_MODEL_BACKEND_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "model/backend.h"
#include "model/comm.h"

// "auto" | "cpu" | "cuda" (vLLM's --device); MS_EINVAL for anything else.
int backend_device_parse(const char *s, enum backend_device *out);
const char *backend_device_name(enum backend_device d);

// Resolves auto to a device this process can use and checks that an explicit
// one exists: auto is CUDA when this build has the CUDA backend and a GPU is
// visible, else the CPU (note, when non-NULL, then says why). cuda without
// a CUDA backend or a visible GPU is refused with a sentence naming what is
// missing.
int backend_device_resolve(enum backend_device want, enum backend_device *out, char *note,
                           size_t notelen, char *err, size_t errlen);

struct backend_opts {
    int n_threads;        // CPU: this rank's compute threads (0: every core the process may use)
    int device_index;     // CUDA: the GPU (after CUDA_VISIBLE_DEVICES)
    int rank;             // the rank the backend serves (logs)
    const char *variant;  // CPU: the kernel table ("scalar", "avx2", "avx512", "avx512_bf16",
                          // "amx"); NULL: the best this CPU runs (MOESERVE_CPU_KERNELS
                          // steers it)
};

// The variants of device d this machine runs, best first (CPU: its kernel
// tables); returns how many (at most max names written).
int backend_variants(enum backend_device d, const char **names, int max);

// Whether variant (NULL: the default) multiplies its projections with the
// activations rounded to bf16 (8 significant bits, fp32 sums): the CUDA
// backend, the CPU's avx512_bf16 table. Such results are held to bf16
// tolerances, the others to fp32's.
bool backend_variant_bf16_activations(enum backend_device d, const char *variant);

// Devices of kind d this process can use: 1 for the CPU, the visible GPUs
// for CUDA (0 without a CUDA build, driver or device).
int backend_device_count(enum backend_device d);

// Makes one rank's backend on a resolved device (not auto).
int backend_create(enum backend_device d, const struct backend_opts *o, struct backend **out,
                   char *err, size_t errlen);
static inline void backend_destroy(struct backend *b)
{
    if (b) b->ops->destroy(b);
}

// One communicator group of n_ranks endpoints for ranks on device d (the
// in-process one for CPU ranks, NCCL for CUDA ranks): out[r] is rank r's;
// each is released with its ops->destroy. ranks (n_ranks) are the ranks'
// backends, which must outlive the endpoints (a NCCL endpoint enqueues on
// its rank's stream); the in-process group ignores them (NULL is fine).
int backend_comm_create(enum backend_device d, int n_ranks, struct backend *const *ranks,
                        struct comm **out, char *err, size_t errlen);

#endif
