// sass/router.cu — the router (MODEL.md §3.6): softmax over the E logits of a token, the K most
// probable experts (ties to the lower id), their probabilities renormalised to sum 1.
// CPU twin: ref_route (moet.c). Launch (gpu_k_router): block GPU_ROUTER_NT, grid T; dynamic
// shared memory E floats (E ≤ GPU_ROUTER_MAX_E), K ≤ GPU_ROUTER_MAX_K.
// In: logits [T, E]. Out: sel [T, K] (by descending weight), selw [T, K].
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_ROUTER_NT) k_router(const float *__restrict__ logits, int E, int K, int *__restrict__ sel,
                                                                     float *__restrict__ selw) {
    GPU_DEP();
    extern __shared__ float p[];   // [E]
    __shared__ float red[32];
    __shared__ int redi[32];
    __shared__ float chosen[GPU_ROUTER_MAX_K];
    int t = blockIdx.x;
    const float *l = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int x = threadIdx.x; x < E; x += blockDim.x) mx = fmaxf(mx, l[x]);
    mx = block_max(mx, red);
    float s = 0.f;
    for (int x = threadIdx.x; x < E; x += blockDim.x) s += (p[x] = expf(l[x] - mx));
    s = block_sum(s, red);
    for (int x = threadIdx.x; x < E; x += blockDim.x) p[x] = p[x] / s;
    __syncthreads();
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int k = 0; k < K; k++) {
        // block argmax, ties to the lower id; a taken expert has p = -1
        float bv = -2.f;
        int bi = E;
        for (int x = threadIdx.x; x < E; x += blockDim.x)
            if (p[x] > bv) { bv = p[x]; bi = x; }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { red[w] = bv; redi[w] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            float v = red[0];
            int b = redi[0];
            for (int i = 1; i < nw; i++)
                if (red[i] > v || (red[i] == v && redi[i] < b)) { v = red[i]; b = redi[i]; }
            // NaN logits win no comparison: take the lowest expert not yet chosen (as ref_route
            // starts from), so an id is always one of the E
            if (b >= E) {
                for (b = 0; b < E - 1 && p[b] == -1.f; b++) {}
                v = p[b];
            }
            sel[(size_t)t * K + k] = b;
            chosen[k] = v;
            p[b] = -1.f;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float ws = 0.f;
        for (int k = 0; k < K; k++) ws += chosen[k];
        for (int k = 0; k < K; k++) selw[(size_t)t * K + k] = chosen[k] / ws;
    }
}
