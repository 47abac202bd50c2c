// sass/silu_mul.cu — h[i] = SiLU(g[i]) · u[i], the shared expert's activation (MODEL.md §3.6).
// CPU twin: ref_silu_mul (moet.c). Launch (gpu_k_silu_mul): block GPU_SILU_NT, grid
// ceil(n / GPU_SILU_NT).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_SILU_NT) k_silu_mul(const float *__restrict__ g, const float *__restrict__ u,
                                                                     float *__restrict__ h, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = silu(g[i]) * u[i];
}
