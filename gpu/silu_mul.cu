// silu_mul: g = silu(g) * u, elementwise, as the CPU reference writes it.
#include "gpu/kernels.cuh"

__global__ void silu_mul_kernel(float *g, const float *u, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

cudaError_t cuda_silu_mul(cudaStream_t s, float *g, const float *u, size_t n)
{
    if (n == 0) return cudaSuccess;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    silu_mul_kernel<<<(unsigned)blocks, 256, 0, s>>>(g, u, n);
    return launch_status();
}
