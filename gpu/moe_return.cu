// moe_return: where each pair's expert output comes back in a fixed-size
// expert-parallel exchange — fwd_plan_return_slot, the host's own function,
// one thread per pair.
#include "gpu/kernels.cuh"

__global__ void moe_return_kernel(const struct cuda_return p)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= p.n_tokens * p.k) return;
    const int t = i / p.k, j = i % p.k;
    p.slot[i] = p.live && !p.live[t] ? -1
                                     : fwd_plan_return_slot(p.ids[i], t, j, p.k, p.first, p.n_ranks,
                                                             p.stride);
}

cudaError_t cuda_moe_return(cudaStream_t s, const struct cuda_return *p)
{
    const int n = p->n_tokens * p->k;
    if (n <= 0) return cudaSuccess;
    moe_return_kernel<<<ceil_div_u((size_t)n, 256), 256, 0, s>>>(*p);
    return launch_status();
}
