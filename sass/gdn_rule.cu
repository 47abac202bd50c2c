// sass/gdn_rule.cu — the gated delta rule, recurrent form (MODEL.md §3.5, §4.1), with an fp32
// state S [nv, dk, dv] per sequence and GDN layer. For each token of a row, value head j
// (key head j / (nv / nk)):
//   q, k ← L2-normalised (eps 1e-6 inside the sqrt), q · 1/sqrt(dk)
//   β = σ(b[t, j]),  g = −exp(A_log[j]) · softplus(a[t, j] + dt_bias[j]),  S ← exp(g) · S
//   u = β (v − Sᵀk),  S ← S + k uᵀ,  o = Sᵀq
// Each value column of S evolves on its own, so a block takes GDN_VC columns of one head of one
// row and runs its tokens in order. CPU twin: ref_gdn.
// In: qkv [T, cd] after conv + SiLU (q [key_dim] | k [key_dim] | v [value_dim]), b, a [T, nv].
// Out: o [T, nv·dv] (before the gated norm). State of slot s: S_base + s·S_slot_stride.
// Launch: block GDN_VC threads, grid (nv, n rows, ceil(dv / GDN_VC)); dynamic shared memory
// (dk·GDN_VC + 2·dk) floats.
#include "common.cuh"

#define GDN_VC 32

extern "C" __global__ void __launch_bounds__(GDN_VC) k_gdn_rule(const float *__restrict__ qkv, int cd, const float *__restrict__ bb,
                                                                const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,
                                                                float *__restrict__ S_base, long long S_slot_stride, float *__restrict__ o,
                                                                int nk, int nv, int dk, int dv, const int *__restrict__ row_slot,
                                                                const int *__restrict__ row_start, const int *__restrict__ row_len) {
    extern __shared__ float sm[];
    float *S = sm;                 // [dk, GDN_VC]
    float *qs = sm + dk * GDN_VC;  // [dk]
    float *ks = qs + dk;           // [dk]
    int j = blockIdx.x, r = blockIdx.y, v0 = blockIdx.z * GDN_VC, lane = threadIdx.x;
    int v = v0 + lane, live = v < dv, hk = j / (nv / nk);
    float *Sg = S_base + (size_t)row_slot[r] * S_slot_stride + (size_t)j * dk * dv;
    for (int d = 0; d < dk; d++) S[d * GDN_VC + lane] = live ? Sg[(size_t)d * dv + v] : 0.f;
    float Aexp = expf(vec_at(A_log, j)), dtb = vec_at(dt_bias, j);
    float qscale = 1.f / sqrtf((float)dk);
    int key_dim = nk * dk, t0 = row_start[r], n = row_len[r];
    for (int t = t0; t < t0 + n; t++) {
        const float *row = qkv + (size_t)t * cd;
        float sq = 0.f, sk = 0.f;
        for (int d = lane; d < dk; d += GDN_VC) {
            float qv = row[hk * dk + d], kv = row[key_dim + hk * dk + d];
            qs[d] = qv;
            ks[d] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        float rq = 1.f / sqrtf(sq + 1e-6f) * qscale, rk = 1.f / sqrtf(sk + 1e-6f);
        __syncwarp();
        float beta = sigm(bb[(size_t)t * nv + j]);
        float x = aa[(size_t)t * nv + j] + dtb;
        float sp = x > 20.f ? x : log1pf(expf(x));   // PyTorch softplus, threshold 20
        float decay = expf(-Aexp * sp);
        float vt = live ? row[2 * key_dim + j * dv + v] : 0.f;
        float kS = 0.f;
        for (int d = 0; d < dk; d++) {
            float s = S[d * GDN_VC + lane] * decay;
            S[d * GDN_VC + lane] = s;
            kS += s * (ks[d] * rk);
        }
        float u = (vt - kS) * beta;
        float out = 0.f;
        for (int d = 0; d < dk; d++) {
            float s = S[d * GDN_VC + lane] + (ks[d] * rk) * u;
            S[d * GDN_VC + lane] = s;
            out += s * (qs[d] * rq);
        }
        if (live) o[(size_t)t * nv * dv + (size_t)j * dv + v] = out;
        __syncwarp();
    }
    if (live)
        for (int d = 0; d < dk; d++) Sg[(size_t)d * dv + v] = S[d * GDN_VC + lane];
}
