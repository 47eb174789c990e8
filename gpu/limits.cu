// limits: the fp32 FMA peak (independent chains per thread, enough threads
// to fill every multiprocessor); the copy bandwidth is timed in
// backend_cuda.cu with a device-to-device copy.
#include "gpu/kernels.cuh"

#define FMA_CHAINS 8

__global__ void fma_burn_kernel(long iters, float seed, float *sink)
{
    float a[FMA_CHAINS];
    for (int j = 0; j < FMA_CHAINS; j++) a[j] = seed + (float)(threadIdx.x + j);
    const float m = 0.999999f, c = 1e-7f;
    for (long i = 0; i < iters; i++)
#pragma unroll
        for (int j = 0; j < FMA_CHAINS; j++) a[j] = fmaf(a[j], m, c);
    float s = 0;
    for (int j = 0; j < FMA_CHAINS; j++) s += a[j];
    if (s == 12345.0f) sink[0] = s; // never true: keeps the chains alive
}

cudaError_t cuda_fma_burn(cudaStream_t s, int blocks, long iters, float *sink, double *flops_out)
{
    fma_burn_kernel<<<blocks, 256, 0, s>>>(iters, 1.0f, sink);
    *flops_out = 2.0 * FMA_CHAINS * (double)iters * 256.0 * blocks;
    return launch_status();
}
