// sass/silu_mul.cu — h[i] = SiLU(g[i]) · u[i], the shared expert's activation (MODEL.md §3.6).
// CPU twin: the loop after the shared gate/up products in ref_moe. Launch: block 256, grid ceil(n / 256).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) k_silu_mul(const float *__restrict__ g, const float *__restrict__ u,
                                                              float *__restrict__ h, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = silu(g[i]) * u[i];
}
