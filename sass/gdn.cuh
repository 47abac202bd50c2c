// sass/gdn.cuh — what the two forms of the gated delta rule share (MODEL.md §3.5, §4): the
// gates of one token and one value head, and the recurrent update of one token on the GPU_GDN_VC
// value columns a warp holds (GPU_GDN_VC: sass/gpu_abi.h). k_gdn_rule runs every token through gdn_token; k_gdn_chunk runs
// its single-token pieces through it too, and the two give the same bits there: the update
// below spells out every rounding (__fmul_rn, __fmaf_rn), so no FMA contraction is left to the
// compiler to choose differently in the two kernels.
#pragma once
#include "common.cuh"

// β = σ(b), g = −exp(A_log) · softplus(a + dt_bias) (PyTorch softplus: threshold 20). g ≤ 0 is
// the log of the token's decay. CPU twin: ref_gdn_gates.
__device__ __forceinline__ void gdn_gates(float b, float a, float Aexp, float dtb, float *beta, float *g) {
    *beta = sigm(b);
    float x = a + dtb;
    float sp = x > 20.f ? x : log1pf(expf(x));
    *g = -Aexp * sp;
}

// The token's q and k of key head hk into qs, ks [dk] (shared), and the factors that normalise
// them: q̂ = q · rq (with 1/sqrt(dk)), k̂ = k · rk; lane-strided sums, then warp_sum (GPU_GDN_VC
// lanes), the same order in both forms of the rule. CPU twin: ref_gdn_qk_norm.
__device__ __forceinline__ void gdn_qk_norm(float *qs, float *ks, const float *row, int key_dim, int hk, int dk, float qscale, int lane,
                                            float *rq, float *rk) {
    float sq = 0.f, sk = 0.f;
    for (int d = lane; d < dk; d += GPU_GDN_VC) {
        float qv = row[hk * dk + d], kv = row[key_dim + hk * dk + d];
        qs[d] = qv;
        ks[d] = kv;
        sq = __fmaf_rn(qv, qv, sq);
        sk = __fmaf_rn(kv, kv, sk);
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    *rq = __fmul_rn(__fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(sq, 1e-6f))), qscale);
    *rk = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(sk, 1e-6f)));
}

// The gated output norm's two steps (MODEL.md §3.3; k_gated_norm, and k_gdn_rule_norm that folds it
// into the rule): the factor from a head's Σ o² (block_sum over its dv columns, one a thread), then
// a column's output. One spelling for both kernels, so the same bits. CPU twin: ref_gated_rmsnorm.
__device__ __forceinline__ float gnorm_rn(float ss, int dv, float eps) { return 1.f / sqrtf(ss / (float)dv + eps); }
__device__ __forceinline__ float gnorm_out(gpu_mat w, int v, float o, float rn, float z) { return vec_at(w, v) * (o * rn) * silu(z); }

// One token, recurrent form, by the calling warp (lane = value column v0 + lane):
//   q̂, k̂ ← L2-normalised q, k (eps 1e-6 inside the sqrt), q̂ · 1/sqrt(dk)
//   S ← e^g S,  u = β (v − Sᵀk̂),  S ← S + k̂ uᵀ,  returns o = Sᵀq̂ (this lane's column)
// S [dk, GPU_GDN_VC] and qs, ks [dk] in shared memory; row: the token's conv output q | k | v;
// vt: this lane's value (0 for a column past dv). CPU twins: ref_gdn_qk_norm, then ref_gdn_token.
// SWZ: S's columns stored swizzled as k_gdn_chunk keeps them (gdn_sw); the same arithmetic.
__device__ __forceinline__ int gdn_sw(int d, int c) { return d * GPU_GDN_VC + (c ^ ((d & 3) << 3)); }
template <bool SWZ = false>
__device__ __forceinline__ float gdn_token(float *S, float *qs, float *ks, const float *row, int key_dim, int hk, int dk,
                                           float vt, float beta, float g, float qscale, int lane) {
    float rq, rk;
    gdn_qk_norm(qs, ks, row, key_dim, hk, dk, qscale, lane, &rq, &rk);
    __syncwarp();
    float decay = expf(g);
    float kS = 0.f;
    for (int d = 0; d < dk; d++) {
        const int i = SWZ ? gdn_sw(d, lane) : d * GPU_GDN_VC + lane;
        float s = __fmul_rn(S[i], decay);
        S[i] = s;
        kS = __fmaf_rn(s, __fmul_rn(ks[d], rk), kS);
    }
    float u = __fmul_rn(__fsub_rn(vt, kS), beta);
    float out = 0.f;
    for (int d = 0; d < dk; d++) {
        const int i = SWZ ? gdn_sw(d, lane) : d * GPU_GDN_VC + lane;
        float s = __fmaf_rn(__fmul_rn(ks[d], rk), u, S[i]);
        S[i] = s;
        out = __fmaf_rn(s, __fmul_rn(qs[d], rq), out);
    }
    __syncwarp();
    return out;
}

// gdn_token with this lane's state column S[0 .. DK) in registers (k_gdn_rule for DK of
// GPU_GDN_RULE_REGS): the same operations in the same order, so the same bits.
template <int DK>
__device__ __forceinline__ float gdn_token_regs(float (&S)[DK], float *qs, float *ks, const float *row, int key_dim, int hk, float vt, float beta,
                                                float g, float qscale, int lane) {
    float rq, rk;
    gdn_qk_norm(qs, ks, row, key_dim, hk, DK, qscale, lane, &rq, &rk);
    // q̂ and k̂ in place, each lane its own elements (the products gdn_token forms at each use);
    // read back through volatile so that the compiler keeps none of the 2·DK in registers
    for (int d = lane; d < DK; d += GPU_GDN_VC) qs[d] = __fmul_rn(qs[d], rq), ks[d] = __fmul_rn(ks[d], rk);
    __syncwarp();
    const volatile float *qh = qs, *kh = ks;
    float decay = expf(g);
    float kS = 0.f;
#pragma unroll
    for (int d = 0; d < DK; d++) {
        S[d] = __fmul_rn(S[d], decay);
        kS = __fmaf_rn(S[d], kh[d], kS);
    }
    float u = __fmul_rn(__fsub_rn(vt, kS), beta);
    float out = 0.f;
#pragma unroll
    for (int d = 0; d < DK; d++) {
        S[d] = __fmaf_rn(kh[d], u, S[d]);
        out = __fmaf_rn(S[d], qh[d], out);
    }
    __syncwarp();
    return out;
}
