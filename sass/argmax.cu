// sass/argmax.cu — a greedy row's token on the device: ids[r] = the first index t of row r of
// logits [rows, V] whose value equals the row's largest (NaN never the largest; −0 and +0 equal;
// 0 when every value is NaN), the token samp_pick takes at temperature 0 without penalties, so a
// step of such rows returns ids instead of its logits (gpu/backend.c).
// CPU twin: samp_first_max over samp_block_max (moet.c).
// Launch (gpu_k_argmax): block GPU_ARGMAX_NT threads, grid (rows).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_ARGMAX_NT) k_argmax(const float *__restrict__ logits, int V, int *__restrict__ ids) {
    GPU_DEP();
    __shared__ float wmax[GPU_ARGMAX_NT / 32];
    __shared__ int wfirst[GPU_ARGMAX_NT / 32];
    const float *__restrict__ x = logits + (size_t)blockIdx.x * V;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = GPU_ARGMAX_NT / 32;
    // the largest value (a max is the same whatever the order; NaN loses every comparison)
    float m = -INFINITY;
    for (int t = threadIdx.x; t < V; t += GPU_ARGMAX_NT) {
        const float v = x[t];
        m = v > m ? v : m;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, m, o);
        m = v > m ? v : m;
    }
    if (lane == 0) wmax[w] = m;
    __syncthreads();
    m = wmax[0];
    for (int i = 1; i < nw; i++) m = wmax[i] > m ? wmax[i] : m;
    // the first index holding it: each thread's first (its indices ascend), then the least
    int first = V;
    for (int t = threadIdx.x; t < V; t += GPU_ARGMAX_NT)
        if (x[t] == m) {
            first = t;
            break;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
    if (lane == 0) wfirst[w] = first;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; i++) first = min(first, wfirst[i]);
        ids[blockIdx.x] = first < V ? first : 0;
    }
}
