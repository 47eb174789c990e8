// moe_combine: x[t] += sum over j in 0..k-1, in that order, of w[t, j] *
// expert_out[slot[t, j]] — the same fused multiply-adds in the same order as
// the CPU reference's axpy, so the sum does not depend on ranks or batch.
// A negative slot adds nothing; no slots read pair (t, j) at row t * k + j.
#include "gpu/kernels.cuh"

__global__ void moe_combine_kernel(float *x, const float *out, const int32_t *slot, const float *w,
                                   int k, int width)
{
    const size_t t = blockIdx.x;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            const size_t p = t * k + j;
            const int32_t row = slot ? slot[p] : (int32_t)p;
            if (row >= 0) acc = fmaf(w[p], out[(size_t)row * width + i], acc);
        }
        x[t * width + i] = fmaf(1.0f, acc, x[t * width + i]);
    }
}

cudaError_t cuda_moe_combine(cudaStream_t s, float *x, const float *expert_out, const int32_t *slot,
                             const float *weights, int n_tokens, int k, int width)
{
    if (n_tokens <= 0) return cudaSuccess;
    moe_combine_kernel<<<n_tokens, 256, 0, s>>>(x, expert_out, slot, weights, k, width);
    return launch_status();
}
