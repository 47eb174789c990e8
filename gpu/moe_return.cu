// moe_return: where each pair's expert output comes back in a fixed-size
// expert-parallel exchange — fwd_plan_return_slot, the host's own function,
// one thread per pair.
#include "gpu/kernels.cuh"

__global__ void moe_return_kernel(const struct cuda_return p)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)p.n_tokens * (size_t)p.k) return;
    const int t = (int)(i / (size_t)p.k), j = (int)(i % (size_t)p.k);
    p.slot[i] = p.live && !p.live[t] ? -1
                                     : fwd_plan_return_slot(p.ids[i], t, j, p.k, p.first, p.n_ranks,
                                                             p.stride);
}

cudaError_t cuda_moe_return(cudaStream_t s, const struct cuda_return *p)
{
    if (p->n_tokens <= 0 || p->k <= 0) return cudaSuccess;
    // The slots are indexed by int (fwd_plan_return_slot's result included).
    const size_t n = (size_t)p->n_tokens * (size_t)p->k;
    if (n > INT_MAX) return cudaErrorInvalidValue;
    moe_return_kernel<<<ceil_div_u(n, 256), 256, 0, s>>>(*p);
    return launch_status();
}
