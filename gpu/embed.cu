// embed: token ids -> rows of the embedding table in fp32 (an exact gather).
#include "gpu/kernels.cuh"

__global__ void embed_kernel(const void *table, enum dtype t, int hidden, const int32_t *ids,
                             float *x)
{
    const size_t row = (size_t)ids[blockIdx.x] * hidden;
    float *out = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = load_elem(table, t, row + i);
}

cudaError_t cuda_embed(cudaStream_t s, const void *table, enum dtype t, int hidden,
                       const int32_t *ids, int n, float *x)
{
    if (n <= 0) return cudaSuccess;
    embed_kernel<<<n, 256, 0, s>>>(table, t, hidden, ids, x);
    return launch_status();
}
