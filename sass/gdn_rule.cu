// sass/gdn_rule.cu — the gated delta rule, recurrent form (MODEL.md §3.5, §4.1), with an fp32
// state S [nv, dk, dv] per sequence and GDN layer. For each token of a row, value head j
// (key head j / (nv / nk)):
//   q, k ← L2-normalised (eps 1e-6 inside the sqrt), q · 1/sqrt(dk)
//   β = σ(b[t, j]),  g = −exp(A_log[j]) · softplus(a[t, j] + dt_bias[j]),  S ← exp(g) · S
//   u = β (v − Sᵀk),  S ← S + k uᵀ,  o = Sᵀq
// Each value column of S evolves on its own, so a warp takes GPU_GDN_VC columns of one head of one
// row and runs its tokens in order (gdn_token, sass/gdn.cuh), each lane one column: in registers
// where dk is one of GPU_GDN_RULE_REGS (its dk loads in flight at once, the state read and
// written once per step), else in shared memory. It serves the rows of one token (decode); longer
// rows go to k_gdn_chunk. CPU twin: ref_gdn_rule (moet.c; one token, every value head, called for
// a row's tokens in order).
// In: qkv [T, cd] after conv + SiLU (q [key_dim] | k [key_dim] | v [value_dim]), b, a [T, nv].
// Out: o [T, nv·dv] (before the gated norm). State of slot s: S_base + s·S_slot_stride.
// Rows: the step's rows rows[0 .. gridDim.y), each row_slot / row_start / row_len.
// With S_hist (a speculation's verification: one row), the state after each of the row's tokens
// but the last is also left at S_hist + t·hist_stride (t: the token's index in the row; the
// layer's place as in a slot's state), so that a rejection past token t takes it back as it was
// (gpu/backend.c) instead of running the kept tokens again; the outputs are the same bits.
// Launch (gpu_k_gdn_rule): block GPU_GDN_RULE_NT threads (GPU_GDN_RULE_W warps), grid (nv, rows,
// ceil(dv / (GPU_GDN_RULE_W · GPU_GDN_VC))); dynamic shared memory gpu_gdn_rule_smem(dk): per warp
// q̂ and k̂ [dk] (and, for the shared-memory state, S [dk, GPU_GDN_VC]).
// k_gdn_rule_norm: the same with the gated output norm folded in (sass/gated_norm.cu: k_gated_norm's
// operations, gnorm_rn / gnorm_out, its bits; o is then the norm's output and xs its bf16 parts,
// [3][T][nv·dv] for the T tokens of the step), for a decode step, whose every row takes this rule:
// a block of GPU_GNORM_NT threads holds a whole value head (dv ≤ GPU_GNORM_NT, thread v column v,
// as k_gated_norm's), grid (nv, rows, 1), state in registers (dk of GPU_GDN_RULE_REGS). CPU twins:
// ref_gdn_rule, then ref_gated_rmsnorm.
#include "mm.cuh"
#include "gdn.cuh"

// One warp's columns v0 + lane of head j of row r, the state in registers: requested before the
// wait for the kernels before (GPU_DEP) — no kernel of the step writes a slot's state before its
// layer's rule does, and the step's row metadata and the state as the last step (or the host)
// left it are there before the step's first kernel.
// The gated output norm folded in (NORM: k_gdn_rule_norm): nm its arguments, red a block_sum's room.
struct gdn_norm_args {
    const float *z;   // [T, nv·dv] the gate's input
    gpu_mat w;        // [dv]
    float eps;
    __nv_bfloat16 *xs;   // o's bf16 parts [3][T][nv·dv], or null
    int T;               // the step's tokens
};

template <int DK, bool NORM>
__device__ __forceinline__ void gdn_rule_regs(const float *__restrict__ qkv, int cd, const float *__restrict__ bb, const float *__restrict__ aa,
                                              float Aexp, float dtb, float *__restrict__ Sg, float *__restrict__ o, int nk, int nv, int dv,
                                              int j, int v, int t0, int n, float *qs, float *ks, int lane, float *__restrict__ Sh, long long hs,
                                              const gdn_norm_args &nm, float *red) {
    const bool live = v < dv;
    float S[DK];
#pragma unroll
    for (int d = 0; d < DK; d++) S[d] = live ? Sg[(size_t)d * dv + v] : 0.f;
    GPU_DEP();
    const float qscale = 1.f / sqrtf((float)DK);
    const int key_dim = nk * DK, hk = j / (nv / nk);
    for (int t = t0; t < t0 + n; t++) {
        const float *row = qkv + (size_t)t * cd;
        float beta, g;
        gdn_gates(bb[(size_t)t * nv + j], aa[(size_t)t * nv + j], Aexp, dtb, &beta, &g);
        float vt = live ? row[2 * key_dim + j * dv + v] : 0.f;
        float out = gdn_token_regs<DK>(S, qs, ks, row, key_dim, hk, vt, beta, g, qscale, lane);
        if (NORM) {   // k_gated_norm's block of the head: Σ o² (0 past dv), the factor, each column's output
            const float ss = block_sum(live ? 0.f + out * out : 0.f, red);
            const float rn = gnorm_rn(ss, dv, nm.eps);
            const size_t base = ((size_t)t * nv + j) * dv;
            if (live) {
                out = gnorm_out(nm.w, v, out, rn, nm.z[base + v]);
                if (nm.xs) mm_split3(out, nm.xs + base + v, (size_t)nm.T * nv * dv);
            }
        }
        if (live) o[(size_t)t * nv * dv + (size_t)j * dv + v] = out;
        if (Sh && live && t + 1 < t0 + n)   // the state after this token, for a rejection past it
#pragma unroll
            for (int d = 0; d < DK; d++) Sh[(size_t)(t - t0) * hs + (size_t)d * dv + v] = S[d];
    }
    if (live)
#pragma unroll
        for (int d = 0; d < DK; d++) Sg[(size_t)d * dv + v] = S[d];
}

// W warps a block (NORM: the head's, every warp to its barriers; else a warp past dv returns).
template <int W, bool NORM>
__device__ __forceinline__ void gdn_rule(const float *__restrict__ qkv, int cd, const float *__restrict__ bb, const float *__restrict__ aa,
                                         gpu_mat A_log, gpu_mat dt_bias, float *__restrict__ S_base, long long S_slot_stride,
                                         float *__restrict__ o, int nk, int nv, int dk, int dv, const int *__restrict__ row_slot,
                                         const int *__restrict__ row_start, const int *__restrict__ row_len, const int *__restrict__ rows,
                                         float *__restrict__ S_hist, long long hist_stride, const gdn_norm_args &nm) {
    // (the wait for the kernels before: gdn_rule_regs's, once its state is requested; the
    // shared-memory path's below. Everything read before it — the row metadata, the weights — the
    // step's kernels do not write.)
    extern __shared__ float sm[];
    __shared__ float red[NORM ? 32 : 1];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x, r = rows[blockIdx.y], v0 = (blockIdx.z * W + w) * GPU_GDN_VC;
    if (!NORM && v0 >= dv) return;   // a warp past the head's columns (no barrier spans warps)
    const int v = v0 + lane, t0 = row_start[r], n = row_len[r];
    float *Sg = S_base + (size_t)row_slot[r] * S_slot_stride + (size_t)j * dk * dv;
    float *Sh = S_hist ? S_hist + (size_t)j * dk * dv : NULL;
    const float Aexp = expf(vec_at(A_log, j)), dtb = vec_at(dt_bias, j);
    if (NORM || GPU_GDN_RULE_REGS(dk)) {   // (NORM: the launcher takes only these dk)
        float *qs = sm + w * 2 * dk, *ks = qs + dk;
        switch (dk) {
        case 32: gdn_rule_regs<32, NORM>(qkv, cd, bb, aa, Aexp, dtb, Sg, o, nk, nv, dv, j, v, t0, n, qs, ks, lane, Sh, hist_stride, nm, red); return;
        case 64: gdn_rule_regs<64, NORM>(qkv, cd, bb, aa, Aexp, dtb, Sg, o, nk, nv, dv, j, v, t0, n, qs, ks, lane, Sh, hist_stride, nm, red); return;
        default: gdn_rule_regs<128, NORM>(qkv, cd, bb, aa, Aexp, dtb, Sg, o, nk, nv, dv, j, v, t0, n, qs, ks, lane, Sh, hist_stride, nm, red); return;
        }
    }
    GPU_DEP();
    float *S = sm + (size_t)w * (dk * GPU_GDN_VC + 2 * dk);   // [dk, GPU_GDN_VC]
    float *qs = S + dk * GPU_GDN_VC, *ks = qs + dk;          // [dk] each
    const int live = v < dv, hk = j / (nv / nk), key_dim = nk * dk;
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

extern "C" __global__ void __launch_bounds__(GPU_GDN_RULE_NT) k_gdn_rule(const float *__restrict__ qkv, int cd, const float *__restrict__ bb,
                                                                         const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,
                                                                         float *__restrict__ S_base, long long S_slot_stride,
                                                                         float *__restrict__ o, int nk, int nv, int dk, int dv,
                                                                         const int *__restrict__ row_slot, const int *__restrict__ row_start,
                                                                         const int *__restrict__ row_len, const int *__restrict__ rows,
                                                                         float *__restrict__ S_hist, long long hist_stride) {
    gdn_rule<GPU_GDN_RULE_W, false>(qkv, cd, bb, aa, A_log, dt_bias, S_base, S_slot_stride, o, nk, nv, dk, dv, row_slot, row_start, row_len, rows,
                                    S_hist, hist_stride, gdn_norm_args{});
}

extern "C" __global__ void __launch_bounds__(GPU_GNORM_NT) k_gdn_rule_norm(const float *__restrict__ qkv, int cd, const float *__restrict__ bb,
                                                                          const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,
                                                                          float *__restrict__ S_base, long long S_slot_stride,
                                                                          float *__restrict__ o, int nk, int nv, int dk, int dv,
                                                                          const int *__restrict__ row_slot, const int *__restrict__ row_start,
                                                                          const int *__restrict__ row_len, const int *__restrict__ rows,
                                                                          float *__restrict__ S_hist, long long hist_stride, const float *__restrict__ z,
                                                                          gpu_mat w, float eps, __nv_bfloat16 *__restrict__ xs, int T) {
    gdn_rule<GPU_GNORM_NT / 32, true>(qkv, cd, bb, aa, A_log, dt_bias, S_base, S_slot_stride, o, nk, nv, dk, dv, row_slot, row_start, row_len, rows,
                                      S_hist, hist_stride, gdn_norm_args{z, w, eps, xs, T});
}
