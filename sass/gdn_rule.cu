// sass/gdn_rule.cu — the gated delta rule, recurrent form (MODEL.md §3.5, §4.1), with an fp32
// state S [nv, dk, dv] per sequence and GDN layer. For each token of a row, value head j
// (key head j / (nv / nk)):
//   q, k ← L2-normalised (eps 1e-6 inside the sqrt), q · 1/sqrt(dk)
//   β = σ(b[t, j]),  g = −exp(A_log[j]) · softplus(a[t, j] + dt_bias[j]),  S ← exp(g) · S
//   u = β (v − Sᵀk),  S ← S + k uᵀ,  o = Sᵀq
// Each value column of S evolves on its own; its tokens run in order, the state in registers where
// dk is one of GPU_GDN_RULE_REGS (gdn_token_regs, sass/gdn.cuh: every dk load in flight at once,
// the state read and written once per step), held by one lane (k_gdn_rule: a block one warp, 32
// columns; chains of dk dependent FMAs) or by GPU_GDN_RULE_LP consecutive lanes, each its rows d ≡ p
// (mod GPU_GDN_RULE_LP) (k_gdn_rule4: GPU_GDN_RULE_NT threads, 32 columns; chains a quarter as long,
// four times the warps, each warp's gates and q̂, k̂ its own), else in shared memory (k_gdn_rule, a
// lane a column: gdn_token). Every form gives the same bits (each sum in GPU_GDN_RULE_LP parts, met
// the same way). It serves the rows of one token (decode) and a verification's rows; longer rows go
// to k_gdn_chunk. CPU twin: ref_gdn_rule (moet.c; one token, every value head, called for a row's
// tokens in order).
// In: qkv [T, cd] after conv + SiLU (q [key_dim] | k [key_dim] | v [value_dim]), b, a [T, nv].
// Out: o [T, nv·dv] (before the gated norm). State of slot s: S_base + s·S_slot_stride.
// Rows: the step's rows rows[0 .. gridDim.y), each row_slot / row_start / row_len.
// With S_hist (a speculation's verification: one row), the state after each of the row's tokens
// but the last is also left at S_hist + t·hist_stride (t: the token's index in the row; the
// layer's place as in a slot's state), so that a rejection past token t takes it back as it was
// (gpu/backend.c) instead of running the kept tokens again; the outputs are the same bits.
// Launch (gpu_k_gdn_rule: gpu_gdn_rule_lanes picks the form): grid (nv, rows, ceil(dv / GPU_GDN_VC)),
// block 32 (k_gdn_rule) or GPU_GDN_RULE_NT threads (k_gdn_rule4); dynamic shared memory
// gpu_gdn_rule_smem(dk, lanes): per warp q̂ and k̂ [dk] (and, for the shared-memory state, S [dk,
// GPU_GDN_VC]).
// k_gdn_rule_norm, k_gdn_rule_norm4: the same with the gated output norm folded in
// (sass/gated_norm.cu: k_gated_norm's operations, gnorm_rn / gnorm_out, its bits; o is then the
// norm's output and xs its bf16 parts, [3][T][nv·dv] for the T tokens of the step), for a decode
// step, whose every row takes this rule: a block holds a whole value head (dv ≤ GPU_GNORM_NT
// columns, one lane each: GPU_GNORM_NT threads; or GPU_GDN_RULE_LP: GPU_GDN_RN_NT), grid (nv, rows,
// 1), state in registers (dk of GPU_GDN_RULE_REGS); the head's Σ o² summed in k_gated_norm's order
// (gnorm_head_ss). CPU twins: ref_gdn_rule, then ref_gated_rmsnorm.
#include "mm.cuh"
#include "gdn.cuh"

// Column v of head j of row r, rows d ≡ p (mod L) of it in this lane's registers (L lanes a column):
// requested before the wait for the kernels before (GPU_DEP) — no kernel of the step writes a
// slot's state before its layer's rule does, and the step's row metadata and the state as the last
// step (or the host) left it are there before the step's first kernel.
// The gated output norm folded in (NORM: k_gdn_rule_norm): nm its arguments, os [GPU_GNORM_NT] the
// head's outputs (shared).
struct gdn_norm_args {
    const float *z;   // [T, nv·dv] the gate's input
    gpu_mat w;        // [dv]
    float eps;
    __nv_bfloat16 *xs;   // o's bf16 parts [3][T][nv·dv], or null
    int T;               // the step's tokens
};

// k_gated_norm's Σ o² of a head (the order of a block_sum of GPU_GNORM_NT threads, thread v column
// v, 0 past dv: each warp's warp_sum, then the warps' sums in order from 0) from the outputs os,
// formed by every warp alike: the same bits.
__device__ __forceinline__ float gnorm_head_ss(const float *os, int lane) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < GPU_GNORM_NT / 32; w++) {
        const float x = os[w * 32 + lane];
        s += warp_sum(0.f + x * x);
    }
    return s;
}

template <int DK, bool NORM, int L>
__device__ __forceinline__ void gdn_rule_regs(const float *__restrict__ qkv, int cd, const float *__restrict__ bb, const float *__restrict__ aa,
                                              float Aexp, float dtb, float *__restrict__ Sg, float *__restrict__ o, int nk, int nv, int dv,
                                              int j, int v, int p, int t0, int n, float *qs, float *ks, int lane, float *__restrict__ Sh,
                                              long long hs, const gdn_norm_args &nm, float *os) {
    constexpr int DR = DK / L;
    const bool live = v < dv;
    float S[DR];
#pragma unroll
    for (int i = 0; i < DR; i++) S[i] = live ? Sg[(size_t)(L * i + p) * dv + v] : 0.f;
    GPU_DEP();
    const float qscale = 1.f / sqrtf((float)DK);
    const int key_dim = nk * DK, hk = j / (nv / nk);
    for (int t = t0; t < t0 + n; t++) {
        const float *row = qkv + (size_t)t * cd;
        float beta, g;
        gdn_gates(bb[(size_t)t * nv + j], aa[(size_t)t * nv + j], Aexp, dtb, &beta, &g);
        float vt = live ? row[2 * key_dim + j * dv + v] : 0.f;
        float out = gdn_token_regs<DK, L>(S, qs, ks, row, key_dim, hk, vt, beta, g, qscale, lane, p);
        if (NORM) {   // k_gated_norm's block of the head: Σ o² (0 past dv), the factor, each column's output
            if (p == 0) os[v] = live ? out : 0.f;
            __syncthreads();
            const float rn = gnorm_rn(gnorm_head_ss(os, lane), dv, nm.eps);
            __syncthreads();   // (os is the next token's)
            const size_t base = ((size_t)t * nv + j) * dv;
            if (live && p == 0) {
                out = gnorm_out(nm.w, v, out, rn, nm.z[base + v]);
                if (nm.xs) mm_split3(out, nm.xs + base + v, (size_t)nm.T * nv * dv);
            }
        }
        if (live && p == 0) o[(size_t)t * nv * dv + (size_t)j * dv + v] = out;
        if (Sh && live && t + 1 < t0 + n)   // the state after this token, for a rejection past it
#pragma unroll
            for (int i = 0; i < DR; i++) Sh[(size_t)(t - t0) * hs + (size_t)(L * i + p) * dv + v] = S[i];
    }
    if (live)
#pragma unroll
        for (int i = 0; i < DR; i++) Sg[(size_t)(L * i + p) * dv + v] = S[i];
}

// A block: columns c0 .. c0 + blockDim / L of head j (registers; NORM: the whole head, every warp
// to its barriers) or c0 + lane (shared memory, L = 1, one warp).
template <bool NORM, int L>
__device__ __forceinline__ void gdn_rule(const float *__restrict__ qkv, int cd, const float *__restrict__ bb, const float *__restrict__ aa,
                                         gpu_mat A_log, gpu_mat dt_bias, float *__restrict__ S_base, long long S_slot_stride,
                                         float *__restrict__ o, int nk, int nv, int dk, int dv, const int *__restrict__ row_slot,
                                         const int *__restrict__ row_start, const int *__restrict__ row_len, const int *__restrict__ rows,
                                         float *__restrict__ S_hist, long long hist_stride, const gdn_norm_args &nm) {
    // (the wait for the kernels before: gdn_rule_regs's, once its state is requested; the
    // shared-memory path's below. Everything read before it — the row metadata, the weights — the
    // step's kernels do not write.)
    extern __shared__ float sm[];
    __shared__ float os[NORM ? GPU_GNORM_NT : 1];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x, r = rows[blockIdx.y], c0 = blockIdx.z * GPU_GDN_VC;
    const int t0 = row_start[r], n = row_len[r];
    float *Sg = S_base + (size_t)row_slot[r] * S_slot_stride + (size_t)j * dk * dv;
    float *Sh = S_hist ? S_hist + (size_t)j * dk * dv : NULL;
    const float Aexp = expf(vec_at(A_log, j)), dtb = vec_at(dt_bias, j);
    if (NORM || L > 1 || GPU_GDN_RULE_REGS(dk)) {   // (NORM, L > 1: the launcher takes only these dk)
        const int v = c0 + threadIdx.x / L, p = threadIdx.x % L;
        float *qs = sm + w * 2 * dk, *ks = qs + dk;
        switch (dk) {
        case 32: gdn_rule_regs<32, NORM, L>(qkv, cd, bb, aa, Aexp, dtb, Sg, o, nk, nv, dv, j, v, p, t0, n, qs, ks, lane, Sh, hist_stride, nm, os); return;
        case 64: gdn_rule_regs<64, NORM, L>(qkv, cd, bb, aa, Aexp, dtb, Sg, o, nk, nv, dv, j, v, p, t0, n, qs, ks, lane, Sh, hist_stride, nm, os); return;
        default: gdn_rule_regs<128, NORM, L>(qkv, cd, bb, aa, Aexp, dtb, Sg, o, nk, nv, dv, j, v, p, t0, n, qs, ks, lane, Sh, hist_stride, nm, os); return;
        }
    }
    GPU_DEP();
    float *S = sm;                                    // [dk, GPU_GDN_VC]
    float *qs = S + dk * GPU_GDN_VC, *ks = qs + dk;   // [dk] each
    const int v = c0 + lane, live = v < dv, hk = j / (nv / nk), key_dim = nk * dk;
    for (int d = 0; d < dk; d++) S[d * GPU_GDN_VC + lane] = live ? Sg[(size_t)d * dv + v] : 0.f;
    const float qscale = 1.f / sqrtf((float)dk);
    for (int t = t0; t < t0 + n; t++) {
        const float *row = qkv + (size_t)t * cd;
        float beta, g;
        gdn_gates(bb[(size_t)t * nv + j], aa[(size_t)t * nv + j], Aexp, dtb, &beta, &g);
        float vt = live ? row[2 * key_dim + j * dv + v] : 0.f;
        float out = gdn_token(S, qs, ks, row, key_dim, hk, dk, vt, beta, g, qscale, lane);
        if (live) o[(size_t)t * nv * dv + (size_t)j * dv + v] = out;
        if (Sh && live && t + 1 < t0 + n)   // (as gdn_rule_regs)
            for (int d = 0; d < dk; d++) Sh[(size_t)(t - t0) * hist_stride + (size_t)d * dv + v] = S[d * GPU_GDN_VC + lane];
    }
    if (live)
        for (int d = 0; d < dk; d++) Sg[(size_t)d * dv + v] = S[d * GPU_GDN_VC + lane];
}

// The entry points: one lane a column (k_gdn_rule: blocks of one warp; k_gdn_rule_norm: GPU_GNORM_NT
// threads) and GPU_GDN_RULE_LP lanes a column (k_gdn_rule4: GPU_GDN_RULE_NT threads; k_gdn_rule_norm4:
// GPU_GDN_RN_NT, two blocks a multiprocessor), the same bits; the launcher picks by the launch's
// size (gpu_gdn_rule_lanes: the wide forms for few blocks, whose chains of dependent instructions are
// then the kernel's time; the narrow ones, fewer instructions a column, for many). k_gdn_rule_norm
// asks for three blocks a multiprocessor (168 registers, no spills: without it ptxas takes 254,
// holding the loads of its four parts' sums); k_gdn_rule_norm4 for two (64 registers, 28 bytes of
// spills, where one block a multiprocessor of 82 registers was 5 % slower at batch 64).
#define GDN_RULE_PARAMS                                                                                                                         \
    const float *__restrict__ qkv, int cd, const float *__restrict__ bb, const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,             \
        float *__restrict__ S_base, long long S_slot_stride, float *__restrict__ o, int nk, int nv, int dk, int dv,                                 \
        const int *__restrict__ row_slot, const int *__restrict__ row_start, const int *__restrict__ row_len, const int *__restrict__ rows,         \
        float *__restrict__ S_hist, long long hist_stride
#define GDN_RULE_ARGS qkv, cd, bb, aa, A_log, dt_bias, S_base, S_slot_stride, o, nk, nv, dk, dv, row_slot, row_start, row_len, rows, S_hist, hist_stride
#define GDN_NORM_PARAMS const float *__restrict__ z, gpu_mat w, float eps, __nv_bfloat16 *__restrict__ xs, int T

extern "C" __global__ void __launch_bounds__(32) k_gdn_rule(GDN_RULE_PARAMS) { gdn_rule<false, 1>(GDN_RULE_ARGS, gdn_norm_args{}); }
extern "C" __global__ void __launch_bounds__(GPU_GDN_RULE_NT) k_gdn_rule4(GDN_RULE_PARAMS) {
    gdn_rule<false, GPU_GDN_RULE_LP>(GDN_RULE_ARGS, gdn_norm_args{});
}
extern "C" __global__ void __launch_bounds__(GPU_GNORM_NT, GPU_GDN_RN_MINB) k_gdn_rule_norm(GDN_RULE_PARAMS, GDN_NORM_PARAMS) {
    gdn_rule<true, 1>(GDN_RULE_ARGS, gdn_norm_args{z, w, eps, xs, T});
}
extern "C" __global__ void __launch_bounds__(GPU_GDN_RN_NT, GPU_GDN_RN4_MINB) k_gdn_rule_norm4(GDN_RULE_PARAMS, GDN_NORM_PARAMS) {
    gdn_rule<true, GPU_GDN_RULE_LP>(GDN_RULE_ARGS, gdn_norm_args{z, w, eps, xs, T});
}
