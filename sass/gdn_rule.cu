// sass/gdn_rule.cu — the gated delta rule, recurrent form (MODEL.md §3.5, §4.1), with an fp32
// state S [nv, dk, dv] per sequence and GDN layer. For each token of a row, value head j
// (key head j / (nv / nk)):
//   q, k ← L2-normalised (eps 1e-6 inside the sqrt), q · 1/sqrt(dk)
//   β = σ(b[t, j]),  g = −exp(A_log[j]) · softplus(a[t, j] + dt_bias[j]),  S ← exp(g) · S
//   u = β (v − Sᵀk),  S ← S + k uᵀ,  o = Sᵀq
// Each value column of S evolves on its own, so a block takes GPU_GDN_VC columns of one head of one
// row and runs its tokens in order (gdn_token, sass/gdn.cuh). It serves the rows of one token
// (decode); longer rows go to k_gdn_chunk. CPU twin: ref_gdn_rule (moet.c; one token, every value
// head, called for a row's tokens in order).
// In: qkv [T, cd] after conv + SiLU (q [key_dim] | k [key_dim] | v [value_dim]), b, a [T, nv].
// Out: o [T, nv·dv] (before the gated norm). State of slot s: S_base + s·S_slot_stride.
// Rows: the step's rows rows[0 .. gridDim.y), each row_slot / row_start / row_len.
// Launch (gpu_k_gdn_rule): block GPU_GDN_VC threads, grid (nv, rows, ceil(dv / GPU_GDN_VC));
// dynamic shared memory (dk·GPU_GDN_VC + 2·dk) floats.
#include "gdn.cuh"

extern "C" __global__ void __launch_bounds__(GPU_GDN_VC) k_gdn_rule(const float *__restrict__ qkv, int cd, const float *__restrict__ bb,
                                                                    const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,
                                                                    float *__restrict__ S_base, long long S_slot_stride, float *__restrict__ o,
                                                                    int nk, int nv, int dk, int dv, const int *__restrict__ row_slot,
                                                                    const int *__restrict__ row_start, const int *__restrict__ row_len,
                                                                    const int *__restrict__ rows) {
    GPU_DEP();
    extern __shared__ float sm[];
    float *S = sm;                 // [dk, GPU_GDN_VC]
    float *qs = sm + dk * GPU_GDN_VC;  // [dk]
    float *ks = qs + dk;           // [dk]
    int j = blockIdx.x, r = rows[blockIdx.y], v0 = blockIdx.z * GPU_GDN_VC, lane = threadIdx.x;
    int v = v0 + lane, live = v < dv, hk = j / (nv / nk);
    float *Sg = S_base + (size_t)row_slot[r] * S_slot_stride + (size_t)j * dk * dv;
    for (int d = 0; d < dk; d++) S[d * GPU_GDN_VC + lane] = live ? Sg[(size_t)d * dv + v] : 0.f;
    float Aexp = expf(vec_at(A_log, j)), dtb = vec_at(dt_bias, j);
    float qscale = 1.f / sqrtf((float)dk);
    int key_dim = nk * dk, t0 = row_start[r], n = row_len[r];
    for (int t = t0; t < t0 + n; t++) {
        const float *row = qkv + (size_t)t * cd;
        float beta, g;
        gdn_gates(bb[(size_t)t * nv + j], aa[(size_t)t * nv + j], Aexp, dtb, &beta, &g);
        float vt = live ? row[2 * key_dim + j * dv + v] : 0.f;
        float out = gdn_token(S, qs, ks, row, key_dim, hk, dk, vt, beta, g, qscale, lane);
        if (live) o[(size_t)t * nv * dv + (size_t)j * dv + v] = out;
    }
    if (live)
        for (int d = 0; d < dk; d++) Sg[(size_t)d * dv + v] = S[d * GPU_GDN_VC + lane];
}
