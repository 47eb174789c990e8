// dummy: --load-format dummy weights made on the device, element i =
// tensor_dummy_value(t, i) in the tensor's dtype, rounded as the CPU backend
// rounds — the same bits whichever backend makes them.
#include "gpu/kernels.cuh"

__global__ void dummy_kernel(const struct tensor t, size_t n, void *dst)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        store_elem(dst, t.dtype, i, tensor_dummy_value(&t, i));
}

cudaError_t cuda_dummy_fill(cudaStream_t s, const struct tensor *t, size_t n, void *dst)
{
    if (n == 0) return cudaSuccess;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    dummy_kernel<<<(unsigned)blocks, 256, 0, s>>>(*t, n, dst);
    return launch_status();
}
