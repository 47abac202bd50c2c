// sass/router.cu — the router (MODEL.md §3.6): softmax over the E logits of a token, the K most
// probable experts (ties to the lower id), their probabilities renormalised to sum 1.
// CPU twin: ref_route (moet.c). Launch (gpu_k_router): block GPU_ROUTER_NT (one warp), grid T; dynamic
// shared memory E floats (E ≤ GPU_ROUTER_MAX_E), K ≤ GPU_ROUTER_MAX_K.
// In: logits [T, E]. Out: sel [T, K] (by descending weight), selw [T, K].
#include "common.cuh"

// One warp per token: no block barriers, and the same bits as a block of GPU_ROUTER_SUM_NT threads
// (the sum of the exponentials in that block's order: block_sum over partials of x ≡ thread mod
// GPU_ROUTER_SUM_NT, replayed warp by warp); the maximum and the choices depend on no order.
// Token t by the calling warp; p [E] and chosen [K] its own shared memory. (k_route, sass/route.cu,
// runs it too.)
__device__ __forceinline__ void route_token(const float *__restrict__ logits, int E, int K, int *__restrict__ sel, float *__restrict__ selw,
                                            int t, float *p, float *chosen) {
    const int lane = threadIdx.x & 31;
    const float *l = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int x = lane; x < E; x += 32) mx = fmaxf(mx, l[x]);
    mx = warp_max(mx);
    for (int x = lane; x < E; x += 32) p[x] = expf(l[x] - mx);
    __syncwarp();
    float s = 0.f;
    for (int w = 0; w < GPU_ROUTER_SUM_NT / 32; w++) {   // the block's warp w: its lanes' partials, then warp_sum
        float v = 0.f;
        for (int x = 32 * w + lane; x < E; x += GPU_ROUTER_SUM_NT) v += p[x];
        s += warp_sum(v);
    }
    for (int x = lane; x < E; x += 32) p[x] = p[x] / s;
    __syncwarp();
    for (int k = 0; k < K; k++) {
        // argmax, ties to the lower id; a taken expert has p = -1
        float bv = -2.f;
        int bi = E;
        for (int x = lane; x < E; x += 32)
            if (p[x] > bv) bv = p[x], bi = x;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) {
            // NaN logits win no comparison: take the lowest expert not yet chosen (as ref_route
            // starts from), so an id is always one of the E
            if (bi >= E) {
                for (bi = 0; bi < E - 1 && p[bi] == -1.f; bi++) {}
                bv = p[bi];
            }
            sel[(size_t)t * K + k] = bi;
            chosen[k] = bv;
            p[bi] = -1.f;
        }
        __syncwarp();
    }
    if (lane == 0) {
        float ws = 0.f;
        for (int k = 0; k < K; k++) ws += chosen[k];
        for (int k = 0; k < K; k++) selw[(size_t)t * K + k] = chosen[k] / ws;
    }
}

extern "C" __global__ void __launch_bounds__(GPU_ROUTER_NT) k_router(const float *__restrict__ logits, int E, int K, int *__restrict__ sel,
                                                                     float *__restrict__ selw) {
    GPU_DEP();
    extern __shared__ float p[];   // [E]
    __shared__ float chosen[GPU_ROUTER_MAX_K];
    route_token(logits, E, K, sel, selw, blockIdx.x, p, chosen);
}
