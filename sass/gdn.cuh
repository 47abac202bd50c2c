// sass/gdn.cuh — what the two forms of the gated delta rule share (MODEL.md §3.5, §4): the
// gates of one token and one value head, and the recurrent update of one token: on the GPU_GDN_VC
// value columns a warp holds, one a lane, the state in shared memory (gdn_token; GPU_GDN_VC:
// sass/gpu_abi.h), or on columns of GPU_GDN_RULE_LP lanes each, the state in registers
// (gdn_token_regs). k_gdn_rule runs every token through one of them, k_gdn_chunk its single-token
// pieces through gdn_token, and all give the same bits: the update below spells out every
// rounding (__fmul_rn, __fmaf_rn, __fadd_rn) and the order of each sum, so no FMA contraction or
// order is left to the compiler to choose differently in the kernels.
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
// into the rule): the factor from a head's Σ o² (in the order of a block_sum over GPU_GNORM_NT
// threads, column v in thread v mod GPU_GNORM_NT: sass/gated_norm.cu), then a column's output.
// One spelling for both kernels, so the same bits. CPU twin: ref_gated_rmsnorm.
__device__ __forceinline__ float gnorm_rn(float ss, int dv, float eps) { return 1.f / sqrtf(ss / (float)dv + eps); }
__device__ __forceinline__ float gnorm_outw(float wv, float o, float rn, float z) { return wv * (o * rn) * silu(z); }   // (wv: w[v])
__device__ __forceinline__ float gnorm_out(gpu_mat w, int v, float o, float rn, float z) { return gnorm_outw(vec_at(w, v), o, rn, z); }

// The sums over a state column's dk rows (Sᵀk̂ and Sᵀq̂) are GPU_GDN_RULE_LP partial sums, part p
// over the rows d ≡ p (mod GPU_GDN_RULE_LP) in increasing d, met pairwise: ((s0 + s1) + (s2 + s3))
// for 4. gdn_parts_sum spells that out for one lane that holds them all; gdn_lanes_sum for the
// GPU_GDN_RULE_LP consecutive lanes that hold one each (a butterfly of xor shuffles: each add the
// same two operands, in either order, so the same bits in every lane).
__device__ __forceinline__ float gdn_parts_sum(float (&s)[GPU_GDN_RULE_LP]) {
#pragma unroll
    for (int o = 1; o < GPU_GDN_RULE_LP; o <<= 1)
#pragma unroll
        for (int p = 0; p < GPU_GDN_RULE_LP; p += 2 * o) s[p] = __fadd_rn(s[p], s[p + o]);
    return s[0];
}
__device__ __forceinline__ float gdn_lanes_sum(float s) {
#pragma unroll
    for (int o = 1; o < GPU_GDN_RULE_LP; o <<= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}
// A column's sum from a lane's NA accumulators: all GPU_GDN_RULE_LP parts in this lane, or its one
// part of GPU_GDN_RULE_LP lanes.
template <int NA>
__device__ __forceinline__ float gdn_acc_sum(float (&a)[NA]) {
    static_assert(NA == GPU_GDN_RULE_LP || NA == 1, "gdn_acc_sum: every part in one lane, or one a lane");
    if constexpr (NA == GPU_GDN_RULE_LP) return gdn_parts_sum(a);
    else return gdn_lanes_sum(a[0]);
}

// One token, recurrent form, by the calling warp (lane = value column v0 + lane):
//   q̂, k̂ ← L2-normalised q, k (eps 1e-6 inside the sqrt), q̂ · 1/sqrt(dk)
//   S ← e^g S,  u = β (v − Sᵀk̂),  S ← S + k̂ uᵀ,  returns o = Sᵀq̂ (this lane's column)
// S [dk, GPU_GDN_VC] and qs, ks [dk] in shared memory; row: the token's conv output q | k | v;
// vt: this lane's value (0 for a column past dv). The two sums in GPU_GDN_RULE_LP parts
// (gdn_parts_sum). CPU twins: ref_gdn_qk_norm, then ref_gdn_token.
// SWZ: S's columns stored swizzled as k_gdn_chunk keeps them (gdn_sw); the same arithmetic.
__device__ __forceinline__ int gdn_sw(int d, int c) { return d * GPU_GDN_VC + (c ^ ((d & 3) << 3)); }
// f(d, p, i) for each row d < dk of the lane's column, by groups of GPU_GDN_RULE_LP rows in
// increasing d: p = d mod GPU_GDN_RULE_LP, i its place in S [dk, GPU_GDN_VC].
template <bool SWZ, typename F>
__device__ __forceinline__ void gdn_rows(int dk, int lane, F &&f) {
    for (int d0 = 0; d0 < dk; d0 += GPU_GDN_RULE_LP)
#pragma unroll
        for (int p = 0; p < GPU_GDN_RULE_LP; p++) {
            const int d = d0 + p;
            if (d < dk) f(d, p, SWZ ? gdn_sw(d, lane) : d * GPU_GDN_VC + lane);
        }
}
template <bool SWZ = false>
__device__ __forceinline__ float gdn_token(float *S, float *qs, float *ks, const float *row, int key_dim, int hk, int dk,
                                           float vt, float beta, float g, float qscale, int lane) {
    float rq, rk;
    gdn_qk_norm(qs, ks, row, key_dim, hk, dk, qscale, lane, &rq, &rk);
    __syncwarp();
    float decay = expf(g);
    float kS[GPU_GDN_RULE_LP] = {};
    gdn_rows<SWZ>(dk, lane, [&](int d, int p, int i) {
        float s = __fmul_rn(S[i], decay);
        S[i] = s;
        kS[p] = __fmaf_rn(s, __fmul_rn(ks[d], rk), kS[p]);
    });
    float u = __fmul_rn(__fsub_rn(vt, gdn_parts_sum(kS)), beta);
    float out[GPU_GDN_RULE_LP] = {};
    gdn_rows<SWZ>(dk, lane, [&](int d, int p, int i) {
        float s = __fmaf_rn(__fmul_rn(ks[d], rk), u, S[i]);
        S[i] = s;
        out[p] = __fmaf_rn(s, __fmul_rn(qs[d], rq), out[p]);
    });
    __syncwarp();
    return gdn_parts_sum(out);
}

// gdn_token with the state in registers (k_gdn_rule for DK of GPU_GDN_RULE_REGS), a column held by
// L lanes: L = 1, this lane all of it (S[i] = row i, each sum's GPU_GDN_RULE_LP parts in this lane,
// then gdn_parts_sum); or L = GPU_GDN_RULE_LP consecutive lanes, this lane's part p (S[i] = row
// LP·i + p, its part's sum, then gdn_lanes_sum). The same operations in the same order, so the same
// bits either way. Every lane of the warp takes part (L > 1: the shuffles), its column live or not.
template <int DK, int L>
__device__ __forceinline__ float gdn_token_regs(float (&S)[DK / L], float *qs, float *ks, const float *row, int key_dim, int hk, float vt,
                                                float beta, float g, float qscale, int lane, int p) {
    constexpr int LP = GPU_GDN_RULE_LP, NA = LP / L;   // NA: this lane's parts (accumulators)
    static_assert(L == 1 || L == LP, "gdn_token_regs: a column in one lane or in GPU_GDN_RULE_LP");
    float rq, rk;
    gdn_qk_norm(qs, ks, row, key_dim, hk, DK, qscale, lane, &rq, &rk);
    // q̂ and k̂ in place, each lane its own elements (the products gdn_token forms at each use);
    // read back through volatile so that the compiler keeps none of them in registers
    for (int d = lane; d < DK; d += GPU_GDN_VC) qs[d] = __fmul_rn(qs[d], rq), ks[d] = __fmul_rn(ks[d], rk);
    __syncwarp();
    const volatile float *qh = qs, *kh = ks;
    float decay = expf(g);
    float kS[NA] = {};
#pragma unroll
    for (int i = 0; i < DK / L; i++) {
        S[i] = __fmul_rn(S[i], decay);
        kS[i % NA] = __fmaf_rn(S[i], kh[L * i + p], kS[i % NA]);
    }
    float u = __fmul_rn(__fsub_rn(vt, gdn_acc_sum(kS)), beta);
    float out[NA] = {};
#pragma unroll
    for (int i = 0; i < DK / L; i++) {
        S[i] = __fmaf_rn(kh[L * i + p], u, S[i]);
        out[i % NA] = __fmaf_rn(S[i], qh[L * i + p], out[i % NA]);
    }
    __syncwarp();
    return gdn_acc_sum(out);
}
