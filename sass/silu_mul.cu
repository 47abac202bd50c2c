// sass/silu_mul.cu — h[i] = SiLU(g[i]) · u[i], the shared expert's activation (MODEL.md §3.6).
// CPU twin: ref_silu_mul (moet.c). Launch (gpu_k_silu_mul): block GPU_SILU_NT, grid
// ceil(n / GPU_SILU_NT). If xs: h's three bf16 parts for the shared expert's down projection
// (k_mm_split's layout, [3][n]).
#include "mm.cuh"

// Element i (k_route, sass/route.cu, calls it too).
__device__ __forceinline__ void silu_mul_at(const float *__restrict__ g, const float *__restrict__ u, float *__restrict__ h, int n,
                                            __nv_bfloat16 *__restrict__ xs, int i) {
    float v = silu(g[i]) * u[i];
    h[i] = v;
    if (xs) mm_split3(v, xs + i, (size_t)n);
}

extern "C" __global__ void __launch_bounds__(GPU_SILU_NT) k_silu_mul(const float *__restrict__ g, const float *__restrict__ u,
                                                                     float *__restrict__ h, int n, __nv_bfloat16 *__restrict__ xs) {
    GPU_DEP();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) silu_mul_at(g, u, h, n, xs, i);
}
