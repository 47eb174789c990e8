// common.cuh: what every .cu file of the CUDA backend shares — the C headers
// of the rest of moeserve (wrapped for C++), element loads and stores in
// the dtypes the backend holds (rounding exactly as base/base.h does on the
// host, so that bytes written here equal the CPU backend's), warp
// reductions, the launch check every launcher ends with and the check of
// releases that have no caller to report to.
#ifndef MOESERVE_GPU_COMMON_CUH
#define MOESERVE_GPU_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "base/base.h"
#include "model/backend.h"
}

// Device views of the scalar types: bf16 and f16 travel as raw uint16_t bits
// (the layout of the CPU backend and of the safetensors files).
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float f16_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ uint16_t f32_to_f16(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float load_elem(const void *p, enum dtype t, size_t i)
{
    switch (t) {
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void store_elem(void *p, enum dtype t, size_t i, float v)
{
    switch (t) {
    case DTYPE_BF16: ((uint16_t *)p)[i] = f32_to_bf16(v); break;
    case DTYPE_F16: ((uint16_t *)p)[i] = f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A block-wide sum in a fixed tree order (so that a result never depends on
// timing); every thread gets it. `sh` holds 32 doubles; blockDim.x is a
// multiple of 32. Ends with the block synchronised.
__device__ __forceinline__ double block_sum_d(double v, double *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double s = 0;
    if (warp == 0) {
        s = lane < nw ? sh[lane] : 0.0;
        s = warp_sum_d(s);
        if (lane == 0) sh[0] = s;
    }
    __syncthreads();
    s = sh[0];
    __syncthreads();
    return s;
}

// The status of the last launch (a launch error, or an earlier kernel's
// fault), as every launcher returns it.
static inline cudaError_t launch_status(void) { return cudaGetLastError(); }

// The status of a release on a path that cannot return one (teardown, a
// backend's free): cudaFree, cudaStreamDestroy and the like. A failure —
// most often an earlier kernel's fault, which every later call reports — is
// logged with what was being released, then cleared so that the next
// operation does not take it for its own.
static inline void cuda_release_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    ms_log(MS_LOG_WARN, "releasing %s on GPU %d failed: %s (%s)", what, dev, cudaGetErrorString(e),
           cudaGetErrorName(e));
    cudaGetLastError();
}

static inline unsigned ceil_div_u(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

#endif
