// sass/gdn_conv.cu — the Gated DeltaNet causal depthwise conv + SiLU (MODEL.md §3.5), per channel,
// over the tokens of each row in order, continuing from the sequence's window of the last Kc − 1
// pre-conv inputs (oldest first), which it then updates. CPU twin: ref_gdn_conv (moet.c; one
// token, called for a row's tokens in order).
//   out[t, ch] = SiLU(Σ_{j < Kc−1} w[ch, j] · win[j, ch] + w[ch, Kc−1] · in[t, ch])
// In place on qkv [T, cd] (in → out). Window of slot s: win_base + s·win_slot_stride, [Kc − 1, cd].
// Launch (gpu_k_gdn_conv): block GPU_CONV_NT, grid (ceil(cd / GPU_CONV_NT), n rows). Row r: tokens
// [row_start[r], + row_len[r]), slot row_slot[r]. Kc ≤ GPU_CONV_MAX_K (taps and history in registers).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_CONV_NT) k_gdn_conv(float *__restrict__ qkv, int cd, gpu_mat w, int Kc, float *__restrict__ win_base,
                                                                     long long win_slot_stride, const int *__restrict__ row_slot,
                                                                     const int *__restrict__ row_start, const int *__restrict__ row_len) {
    GPU_DEP();
    int ch = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (ch >= cd) return;
    float *win = win_base + (size_t)row_slot[r] * win_slot_stride;
    float wv[GPU_CONV_MAX_K], hist[GPU_CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < GPU_CONV_MAX_K; j++) {
        wv[j] = j < Kc ? vec_at(w, (long long)ch * Kc + j) : 0.f;
        hist[j] = j < Kc - 1 ? win[(size_t)j * cd + ch] : 0.f;
    }
    int t0 = row_start[r], n = row_len[r];
    for (int t = t0; t < t0 + n; t++) {
        float in = qkv[(size_t)t * cd + ch];
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
            if (j < Kc - 1) acc += wv[j] * hist[j];
#pragma unroll
        for (int j = 0; j < GPU_CONV_MAX_K; j++)
            if (j == Kc - 1) acc += wv[j] * in;
        qkv[(size_t)t * cd + ch] = silu(acc);
#pragma unroll
        for (int j = 0; j < GPU_CONV_MAX_K - 2; j++)
            if (j < Kc - 2) hist[j] = hist[j + 1];
#pragma unroll
        for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
            if (j == Kc - 2) hist[j] = in;
    }
#pragma unroll
    for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
        if (j < Kc - 1) win[(size_t)j * cd + ch] = hist[j];
}
