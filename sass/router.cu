// sass/router.cu — the router (MODEL.md §3.6): softmax over the E logits of a token, the K most
// probable experts (ties to the lower id), their probabilities renormalised to sum 1.
// CPU twin: ref_route (moet.c). Launch (gpu_k_router): block GPU_ROUTER_NT (one warp), grid T;
// E ≤ GPU_ROUTER_MAX_E, K ≤ GPU_ROUTER_MAX_K.
// In: logits [T, E]. Out: sel [T, K] (by descending weight), selw [T, K].
#include "common.cuh"

// One warp per token: no block barriers, and the same bits as a block of GPU_ROUTER_SUM_NT threads
// (the sum of the exponentials in that block's order: block_sum over partials of x ≡ thread mod
// GPU_ROUTER_SUM_NT, replayed warp by warp); the maximum and the choices depend on no order.
// Lane l holds the probabilities of experts x = l + 32j, j < J (J·32 ≥ E), in registers: the
// partials of that order are sums of its own values, and each of the K rounds of the choice scans
// them in ascending x (ties to the lower id) before the warp's argmax. Token t by the calling warp;
// chosen [K] its own shared memory. (k_route, sass/route.cu, runs it too.)
template <int J>
__device__ __forceinline__ void route_token_j(const float *__restrict__ logits, int E, int K, int *__restrict__ sel, float *__restrict__ selw,
                                              int t, float *chosen) {
    const int lane = threadIdx.x & 31;
    const float *l = logits + (size_t)t * E;
    float v[J];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int x = lane + 32 * j;
        v[j] = x < E ? l[x] : 0.f;
        if (x < E) mx = fmaxf(mx, v[j]);
    }
    mx = warp_max(mx);
#pragma unroll
    for (int j = 0; j < J; j++)
        if (lane + 32 * j < E) v[j] = expf(v[j] - mx);
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < GPU_ROUTER_SUM_NT / 32; w++) {   // the block's warp w: its lanes' partials (x = 32w + lane + GPU_ROUTER_SUM_NT·i), then warp_sum
        float a = 0.f;
#pragma unroll
        for (int j = w; j < J; j += GPU_ROUTER_SUM_NT / 32)
            if (lane + 32 * j < E) a += v[j];
        s += warp_sum(a);
    }
#pragma unroll
    for (int j = 0; j < J; j++) v[j] = lane + 32 * j < E ? v[j] / s : -3.f;   // (past E: as taken)
    for (int k = 0; k < K; k++) {
        // argmax, ties to the lower id; a taken expert has p = -3, below the search's start
        float bv = -2.f;
        int bi = E;
#pragma unroll
        for (int j = 0; j < J; j++)
            if (v[j] > bv) bv = v[j], bi = lane + 32 * j;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (bi >= E) {
            // NaN probabilities win no comparison: take the lowest expert not yet chosen (as
            // ref_route does), or the last, so an id is always one of the E
            int c = E - 1;
#pragma unroll
            for (int j = J - 1; j >= 0; j--)
                if (lane + 32 * j < E - 1 && v[j] != -3.f) c = lane + 32 * j;
            for (int o = 16; o > 0; o >>= 1) c = min(c, __shfl_xor_sync(0xffffffffu, c, o));
            bi = c;
            float own = 0.f;
#pragma unroll
            for (int j = 0; j < J; j++)
                if (j == bi >> 5) own = v[j];
            bv = __shfl_sync(0xffffffffu, own, bi & 31);
        }
        if (lane == 0) sel[(size_t)t * K + k] = bi, chosen[k] = bv;
        if (lane == (bi & 31))
#pragma unroll
            for (int j = 0; j < J; j++)
                if (j == bi >> 5) v[j] = -3.f;
    }
    if (lane == 0) {
        float ws = 0.f;
        for (int k = 0; k < K; k++) ws += chosen[k];
        for (int k = 0; k < K; k++) selw[(size_t)t * K + k] = chosen[k] / ws;
    }
}

// route_token_j for E experts (≤ GPU_ROUTER_MAX_E): eight values a lane up to 256 (Qwen3.6's).
__device__ __forceinline__ void route_token(const float *__restrict__ logits, int E, int K, int *__restrict__ sel, float *__restrict__ selw,
                                            int t, float *chosen) {
    if (E <= 256) route_token_j<8>(logits, E, K, sel, selw, t, chosen);
    else route_token_j<GPU_ROUTER_MAX_E / 32>(logits, E, K, sel, selw, t, chosen);
}

extern "C" __global__ void __launch_bounds__(GPU_ROUTER_NT) k_router(const float *__restrict__ logits, int E, int K, int *__restrict__ sel,
                                                                     float *__restrict__ selw) {
    GPU_DEP();
    __shared__ float chosen[GPU_ROUTER_MAX_K];
    route_token(logits, E, K, sel, selw, blockIdx.x, chosen);
}
