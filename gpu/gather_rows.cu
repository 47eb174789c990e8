// gather_rows: dst row i = src row rows[i] (an exact copy).
#include "gpu/kernels.cuh"

__global__ void gather_rows_kernel(const float *src, size_t ld, const int32_t *rows, int width,
                                   float *dst)
{
    const float *s = src + (size_t)rows[blockIdx.x] * ld;
    float *d = dst + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

cudaError_t cuda_gather_rows(cudaStream_t s, const float *src, size_t ld, const int32_t *rows,
                             int n, int width, float *dst)
{
    if (n <= 0) return cudaSuccess;
    gather_rows_kernel<<<n, 256, 0, s>>>(src, ld, rows, width, dst);
    return launch_status();
}
