// sass/route.cu — the steps of a layer's mixture of experts between its input products and the
// experts' products, for a step of up to GPU_ROUTE_T tokens in one launch (a decode step):
//   the router of every token (route_token, sass/router.cu: k_router's work, one warp a token),
//   the shared expert's h = SiLU(g) · u with its bf16 parts (silu_mul_at, sass/silu_mul.cu), then
//   the pairs grouped by expert (moe_sort_block, sass/moe_mm.cu: k_moe_sort's work).
// The same functions as the three kernels, so the same bits; one launch instead of three.
// CPU twins: ref_route, ref_silu_mul (moet.c); the grouping is checked as k_moe_sort's.
// Launch (gpu_k_route): blocks of 32·max(T, ⌈E / 32⌉) threads (≤ GPU_MOE_SORT_NT: a warp per
// token, a thread per expert for the grouping's scans); block 0 routes and groups, and the
// shared expert's SiLU · up is spread over the blocks past it (block 0 takes it too where there
// are none); dynamic shared memory T·K floats (each routing warp's chosen weights). In: logits
// [T, E], g, u [T·SI]. Out: sel, selw [T, K], h [T·SI] and its parts hs [3][T·SI], map
// (k_moe_sort's).
#include "mm.cuh"

extern "C" __global__ void __launch_bounds__(GPU_MOE_SORT_NT) k_route(const float *__restrict__ logits, int E, int K, int T,
                                                                      int *__restrict__ sel, float *__restrict__ selw,
                                                                      const float *__restrict__ g, const float *__restrict__ u,
                                                                      float *__restrict__ h, int n, __nv_bfloat16 *__restrict__ hs,
                                                                      int *__restrict__ map, int items_bound, int cap) {
    GPU_DEP();
    extern __shared__ float pr[];   // [T][K] the chosen experts' probabilities
    if (gridDim.x > 1) {   // the SiLU's blocks: elements by the blocks past 0, nothing else
        const int nb = gridDim.x - 1;
        if (blockIdx.x > 0) {
            for (int i = (blockIdx.x - 1) * blockDim.x + threadIdx.x; i < n; i += nb * blockDim.x) silu_mul_at(g, u, h, n, hs, i);
            return;
        }
    }
    const int w = threadIdx.x >> 5;
    if (w < T) route_token(logits, E, K, sel, selw, w, pr + (size_t)w * K);
    if (gridDim.x == 1)
        for (int i = threadIdx.x; i < n; i += blockDim.x) silu_mul_at(g, u, h, n, hs, i);
    __syncthreads();   // sel of every token, written above by this block, before the grouping reads it
    moe_sort_block<1>(sel, T * K, E, map, items_bound, cap);
}
