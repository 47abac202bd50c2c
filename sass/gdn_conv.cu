// sass/gdn_conv.cu — the Gated DeltaNet causal depthwise conv + SiLU (MODEL.md §3.5), per channel,
// over the tokens of each row in order, continuing from the sequence's window of the last Kc − 1
// pre-conv inputs (oldest first), which it then updates. CPU twin: ref_gdn_conv (moet.c; one
// token, called for a row's tokens in order).
//   out[t, ch] = SiLU(Σ_{j < Kc−1} w[ch, j] · win[j, ch] + w[ch, Kc−1] · in[t, ch])
// In place on qkv [T, cd] (in → out). Window of slot s: win_base + s·win_slot_stride, [Kc − 1, cd].
// Launch (gpu_k_gdn_conv): block GPU_CONV_NT, grid (ceil(cd / (32 · GPU_CONV_NT / (32 · nseg))), n rows).
// Row r: tokens [row_start[r], + row_len[r]), slot row_slot[r]. Kc ≤ GPU_CONV_MAX_K (taps and history
// in registers). A block takes GPU_CONV_NT / (32 · nseg) groups of 32 channels (lane = channel) of
// one row, nseg warps each (nseg a power of two ≤ GPU_CONV_NT / 32, at most the step's longest
// row: a decode step's rows of one token take one warp per 32 channels, not sixteen), which cut
// the row's tokens into nseg segments of ceil(n / nseg) tokens. Each thread first reads its segment's
// history (the Kc − 1 inputs before it: earlier tokens of the row, else the window), the block
// waits, then each walks its segment in place — every output the same sum of the same inputs
// whatever the segments, so the bits do not depend on the row's length or cut. The thread of the
// row's last segment leaves the window. With win_hist (a speculation's verification: one row) the
// window after each of the row's tokens but the last is also left at win_hist + t·hist_stride
// (t: the token's index in the row; the layer's place as in a slot's windows), for a rejection
// past token t (gpu/backend.c).
#include "common.cuh"

#define CONV_U 8   // inputs a thread loads ahead (their loads in flight together)

extern "C" __global__ void __launch_bounds__(GPU_CONV_NT) k_gdn_conv(float *__restrict__ qkv, int cd, gpu_mat w, int Kc, float *__restrict__ win_base,
                                                                     long long win_slot_stride, const int *__restrict__ row_slot,
                                                                     const int *__restrict__ row_start, const int *__restrict__ row_len,
                                                                     float *__restrict__ win_hist, long long hist_stride, int nseg) {
    GPU_DEP();
    const int warp = threadIdx.x >> 5, groups = GPU_CONV_NT / WARP / nseg;
    const int ch = (blockIdx.x * groups + warp / nseg) * WARP + (threadIdx.x & 31), seg = warp % nseg, r = blockIdx.y;
    const int t0 = row_start[r], n = row_len[r], S = (n + nseg - 1) / nseg, lo = seg * S, hi = min(n, lo + S);   // row positions [lo, hi)
    const bool on = ch < cd && lo < hi;
    float *win = win_base + (size_t)row_slot[r] * win_slot_stride;
    float wv[GPU_CONV_MAX_K], hist[GPU_CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < GPU_CONV_MAX_K; j++) {
        const int pos = lo - (Kc - 1) + j;   // the row position of history entry j
        wv[j] = on && j < Kc ? vec_at(w, (long long)ch * Kc + j) : 0.f;
        hist[j] = on && j < Kc - 1 ? (pos >= 0 ? qkv[(size_t)(t0 + pos) * cd + ch] : win[(size_t)(pos + Kc - 1) * cd + ch]) : 0.f;
    }
    __syncthreads();   // every segment's history read before any segment overwrites its inputs
    if (!on) return;
    for (int t = t0 + lo; t < t0 + hi; t += CONV_U) {
        float in[CONV_U];
#pragma unroll
        for (int u = 0; u < CONV_U; u++) in[u] = t + u < t0 + hi ? qkv[(size_t)(t + u) * cd + ch] : 0.f;
#pragma unroll
        for (int u = 0; u < CONV_U; u++) {
            if (t + u >= t0 + hi) break;
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
                if (j < Kc - 1) acc += wv[j] * hist[j];
#pragma unroll
            for (int j = 0; j < GPU_CONV_MAX_K; j++)
                if (j == Kc - 1) acc += wv[j] * in[u];
            qkv[(size_t)(t + u) * cd + ch] = silu(acc);
#pragma unroll
            for (int j = 0; j < GPU_CONV_MAX_K - 2; j++)
                if (j < Kc - 2) hist[j] = hist[j + 1];
#pragma unroll
            for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
                if (j == Kc - 2) hist[j] = in[u];
            const int tp = t + u - t0;   // the token's index in the row
            if (win_hist && tp + 1 < n)
#pragma unroll
                for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
                    if (j < Kc - 1) win_hist[(size_t)tp * hist_stride + (size_t)j * cd + ch] = hist[j];
        }
    }
    if (hi == n) {   // the row's last segment: its history is now the row's last Kc − 1 inputs (or the old window's tail)
#pragma unroll
        for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
            if (j < Kc - 1) win[(size_t)j * cd + ch] = hist[j];
    }
}
