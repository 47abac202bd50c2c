// sass/gdn_step.cu — a decode step's Gated DeltaNet core in one launch: for rows of one token
// each, the causal conv + SiLU of the token's q, k and v (k_gdn_conv), the gated delta rule's
// recurrent step (k_gdn_rule) and the gated output norm (k_gated_norm), with the same device
// functions in the same order, so the same bits as the three kernels (MODEL.md §3.3, §3.5):
//   conv:  gdn_conv_out / gdn_conv_push per channel, the window updated as k_gdn_conv leaves it
//   rule:  gdn_gates, gdn_token_regs per value column (the state column in registers)
//   norm:  gnorm_sq per value, the head's sum as block_sum over GPU_GNORM_NT threads (4 warps:
//          group_sum below), gnorm_rn, gnorm_out, and the output's three bf16 parts (mm_split3)
// CPU twins: ref_gdn_conv, ref_gdn_qk_norm + ref_gdn_token, ref_gated_rmsnorm (moet.c).
// Launch (gpu_k_gdn_step): grid (nk, rows), block G · GPU_GNORM_NT threads (≤ GPU_GDN_STEP_NT:
// the state columns in registers want the registers of few threads) for the G = nv / nk value
// heads of key head blockIdx.x (a group of 4 warps a value head, warp w of a group its
// columns [32w, +32)); the block computes the conv of the key head's q and k (shared by its G
// value heads: one block a key head, so no other block reads or writes those channels' windows)
// and of its value heads' v. Requires dk ∈ GPU_GDN_RULE_REGS, dv ≤ GPU_GNORM_NT, Kc ≤
// GPU_CONV_MAX_K, G · GPU_GNORM_NT ≤ GPU_GDN_STEP_NT (gpu_gdn_step_ok). Dynamic shared memory gpu_gdn_step_smem: the conv's q | k
// [2·dk] and v [G·dv], each warp's q̂, k̂ [2·dk].
// In: qkv [T, cd] (before the conv; not written), bb, aa [T, nv], z [T, nv·dv]. Out: o [T, nv·dv]
// (after the norm) and its parts xs [3][T][nv·dv]; the windows and states of the rows' slots.
#include "gdn.cuh"
#include "mm.cuh"

// The sum of v over the 4 warps of group gr, in block_sum's order for a block of those 4 warps
// (GPU_GNORM_NT threads: k_gated_norm's block). Every thread of the block calls it.
__device__ __forceinline__ float group_sum(float v, float *red, int gr) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < GPU_GNORM_NT / 32; i++) s += red[gr * (GPU_GNORM_NT / 32) + i];
    return s;
}

template <int DK>
__device__ __forceinline__ void gdn_step_body(const float *__restrict__ qkv, int cd, gpu_mat cw, int Kc, float *__restrict__ win_base,
                                              long long win_slot_stride, const float *__restrict__ bb, const float *__restrict__ aa,
                                              gpu_mat A_log, gpu_mat dt_bias, float *__restrict__ S_base, long long S_slot_stride,
                                              float *__restrict__ o, const float *__restrict__ z, gpu_mat gw, int nk, int nv, int dv, float eps,
                                              __nv_bfloat16 *__restrict__ xs, int T, int slot, int t, float *sm, float *red) {
    const int G = nv / nk, hk = blockIdx.x, key_dim = nk * DK, nthr = blockDim.x;
    float *cqk = sm, *cv = sm + 2 * DK;   // the conv's q | k of key head hk, v of its G value heads
    // 1. the conv of the block's channels: q, k of key head hk, then v of value heads hk·G … (contiguous)
    float *win = win_base + (size_t)slot * win_slot_stride;
    for (int c = threadIdx.x; c < 2 * DK + G * dv; c += nthr) {
        const int ch = c < DK ? hk * DK + c : c < 2 * DK ? key_dim + hk * DK + (c - DK) : 2 * key_dim + hk * G * dv + (c - 2 * DK);
        float wv[GPU_CONV_MAX_K], hist[GPU_CONV_MAX_K];
#pragma unroll
        for (int j = 0; j < GPU_CONV_MAX_K; j++) {
            wv[j] = j < Kc ? vec_at(cw, (long long)ch * Kc + j) : 0.f;
            hist[j] = j < Kc - 1 ? win[(size_t)j * cd + ch] : 0.f;
        }
        const float in = qkv[(size_t)t * cd + ch];
        sm[c] = gdn_conv_out(wv, hist, Kc, in);
        gdn_conv_push(hist, Kc, in);
#pragma unroll
        for (int j = 0; j < GPU_CONV_MAX_K - 1; j++)
            if (j < Kc - 1) win[(size_t)j * cd + ch] = hist[j];
    }
    __syncthreads();
    // 2. the rule: value head j = hk·G + gr, column v of warp w of group gr
    const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = wi / (GPU_GNORM_NT / 32), w = wi % (GPU_GNORM_NT / 32);
    const int j = hk * G + gr, v = 32 * w + lane;
    const bool live = v < dv;
    float out = 0.f;
    if (32 * w < dv) {   // a warp with columns (no barrier inside: gdn_token_regs syncs its warp only)
        float *qs = sm + 2 * DK + G * dv + (size_t)wi * 2 * DK, *ks = qs + DK;
        float *Sg = S_base + (size_t)slot * S_slot_stride + (size_t)j * DK * dv;
        float S[DK];
#pragma unroll
        for (int d = 0; d < DK; d++) S[d] = live ? Sg[(size_t)d * dv + v] : 0.f;
        float beta, g;
        gdn_gates(bb[(size_t)t * nv + j], aa[(size_t)t * nv + j], expf(vec_at(A_log, j)), vec_at(dt_bias, j), &beta, &g);
        const float vt = live ? cv[gr * dv + v] : 0.f;
        // q and k from the conv in shared memory, laid out as a row of key_dim DK with key head 0
        out = gdn_token_regs<DK>(S, qs, ks, cqk, DK, 0, vt, beta, g, 1.f / sqrtf((float)DK), lane);
        if (live)
#pragma unroll
            for (int d = 0; d < DK; d++) Sg[(size_t)d * dv + v] = S[d];
    }
    // 3. the gated norm of value head j (its group's 4 warps as k_gated_norm's block)
    const float ss = group_sum(live ? gnorm_sq(out, 0.f) : 0.f, red, gr);
    const float rn = gnorm_rn(ss, dv, eps);
    if (live) {
        const size_t at = ((size_t)t * nv + j) * dv + v;
        const float r = gnorm_out(vec_at(gw, v), out, rn, z[at]);
        o[at] = r;
        mm_split3(r, xs + at, (size_t)T * nv * dv);
    }
}

extern "C" __global__ void __launch_bounds__(GPU_GDN_STEP_NT) k_gdn_step(const float *__restrict__ qkv, int cd, gpu_mat cw, int Kc, float *__restrict__ win_base,
                                                               long long win_slot_stride, const float *__restrict__ bb, const float *__restrict__ aa,
                                                               gpu_mat A_log, gpu_mat dt_bias, float *__restrict__ S_base, long long S_slot_stride,
                                                               float *__restrict__ o, const float *__restrict__ z, gpu_mat gw, int nk, int nv, int dk,
                                                               int dv, float eps, __nv_bfloat16 *__restrict__ xs, int T,
                                                               const int *__restrict__ row_slot, const int *__restrict__ row_start,
                                                               const int *__restrict__ rows) {
    GPU_DEP();
    extern __shared__ float sm[];
    __shared__ float red[32];   // group_sum's warp sums
    const int r = rows[blockIdx.y], slot = row_slot[r], t = row_start[r];
    switch (dk) {
    case 32: gdn_step_body<32>(qkv, cd, cw, Kc, win_base, win_slot_stride, bb, aa, A_log, dt_bias, S_base, S_slot_stride, o, z, gw, nk, nv, dv, eps, xs, T, slot, t, sm, red); return;
    case 64: gdn_step_body<64>(qkv, cd, cw, Kc, win_base, win_slot_stride, bb, aa, A_log, dt_bias, S_base, S_slot_stride, o, z, gw, nk, nv, dv, eps, xs, T, slot, t, sm, red); return;
    default: gdn_step_body<128>(qkv, cd, cw, Kc, win_base, win_slot_stride, bb, aa, A_log, dt_bias, S_base, S_slot_stride, o, z, gw, nk, nv, dv, eps, xs, T, slot, t, sm, red); return;
    }
}
