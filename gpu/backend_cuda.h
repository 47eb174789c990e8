// backend_cuda: the CUDA backend and the NCCL communicator as the rest of
// moeserve sees them — plain C, so that the registry (the only caller) needs
// no CUDA headers. Built only when meson found CUDA and NCCL
// (MOESERVE_HAVE_CUDA in build/moeserve_build.h).
//
// One backend owns one GPU (its index after CUDA_VISIBLE_DEVICES) and one
// stream; every op is queued on that stream in call order (model/backend.h's
// contract). A backend is used by one thread at a time; backends on
// different GPUs run in parallel from their ranks' threads.
#ifndef MOESERVE_GPU_BACKEND_CUDA_H
#define MOESERVE_GPU_BACKEND_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "model/backend.h"
#include "model/comm.h"

// How many GPUs this process sees (> 0), or MS_EUNSUPPORTED with a sentence
// naming what is missing: no NVIDIA driver, no visible device (with
// CUDA_VISIBLE_DEVICES when it is set), or the driver's own error.
int backend_cuda_probe(int *n_devices, char *err, size_t errlen);

// A backend on GPU device_index (0-based among the visible ones).
int backend_cuda_create(int device_index, int rank, struct backend **out, char *err, size_t errlen);

// One NCCL communicator group over the n_ranks CUDA backends ranks[r] (rank
// r on its backend's GPU, one GPU each), made in this process with
// ncclCommInitAll; each endpoint enqueues on its rank's stream. The ranks'
// backends must outlive the endpoints.
int comm_nccl_create(int n_ranks, struct backend *const *ranks, struct comm **out, char *err,
                     size_t errlen);

// The multi-process path (for a launcher to come): rank 0 makes an id and
// hands its NCCL_ID_BYTES bytes to the other processes out of band; each
// process then joins with its rank and backend.
#define NCCL_ID_BYTES 128
int comm_nccl_make_id(unsigned char id[NCCL_ID_BYTES], char *err, size_t errlen);
int comm_nccl_join(const unsigned char id[NCCL_ID_BYTES], int n_ranks, int rank,
                   struct backend *b, struct comm **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
