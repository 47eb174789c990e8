// rmsnorm: out = x / sqrt(mean(x^2) + eps) * w per row, the sum of squares
// in double and the scaling in float in the CPU reference's order.
#include "gpu/kernels.cuh"

__global__ void rmsnorm_kernel(const float *x, size_t ldx, const int32_t *rows, const void *w,
                               enum dtype wt, int n, float eps, float *out)
{
    __shared__ double sh[32];
    const float *xr = x + (size_t)(rows ? rows[blockIdx.x] : (int)blockIdx.x) * ldx;
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss, sh);
    const float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    float *o = out + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = xr[i] * scale * load_elem(w, wt, i);
}

cudaError_t cuda_rmsnorm(cudaStream_t s, const float *x, size_t ldx, const int32_t *rows, int n,
                         const void *w, enum dtype wt, int width, float eps, float *out)
{
    if (n <= 0) return cudaSuccess;
    rmsnorm_kernel<<<n, 256, 0, s>>>(x, ldx, rows, w, wt, width, eps, out);
    return launch_status();
}
