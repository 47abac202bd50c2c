// sass/attention.cu — causal GQA attention over the paged KV cache with the sigmoid output gate
// (MODEL.md §3.4 steps 6–7): for token t at position p and query head h (KV head h / (nh / kvh)),
//   o = Σ_{τ ≤ p} softmax_τ(q · k_τ / sqrt(hd)) v_τ,   core[t, h] = o ⊙ σ(gate)
// CPU twin: the second loop of ref_attention.
// Launch: block 128 = 4 warps, grid (nh, T). Warp w takes positions τ ≡ w (mod 4) with an online
// softmax (running max m, sum l, accumulator per lane over hd/32 dims); the four partial states
// merge in warp order. The order depends only on p: batch invariant. hd ≤ 512.
#include "kv.cuh"

#define ATT_WARPS 4
#define ATT_MAXD (512 / WARP)

template <class KV>
__device__ void attention(const float *__restrict__ proj, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                          const int *__restrict__ bt, int bt_stride, const typename KV::T *__restrict__ kc,
                          const typename KV::T *__restrict__ vc, const float *__restrict__ ks, const float *__restrict__ vs,
                          float *__restrict__ core, int nh, int kvh, int hd, float scale) {
    __shared__ float ms[ATT_WARPS], ls[ATT_WARPS];
    __shared__ float accs[ATT_WARPS][512];
    int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int p = tok_pos[t], kvd = kvh * hd, j = h / (nh / kvh), nd = (hd + WARP - 1) / WARP;
    const int *btr = bt + (size_t)tok_slot[t] * bt_stride;
    const float *q = proj + (size_t)t * 2 * nh * hd + (size_t)h * 2 * hd;
    float qr[ATT_MAXD], acc[ATT_MAXD];
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) {
        int d = lane + i * WARP;
        qr[i] = (i < nd && d < hd) ? q[d] : 0.f;
        acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int tau = w; tau <= p; tau += ATT_WARPS) {
        size_t base = kv_index(btr, tau, kvd, j * hd);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            int d = lane + i * WARP;
            if (i < nd && d < hd) s += qr[i] * KV::get(kc[base + d]);
        }
        float kscale = 1.f, vscale = 1.f;
        if (KV::scaled) {
            size_t si = kv_scale_index(btr, tau, kvh, j);
            kscale = ks[si];
            vscale = vs[si];
        }
        s = warp_sum(s) * kscale * scale;
        float mn = fmaxf(m, s), c = expf(m - mn), e = expf(s - mn);
        l = l * c + e;
        float ev = e * vscale;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            int d = lane + i * WARP;
            if (i < nd && d < hd) acc[i] = acc[i] * c + ev * KV::get(vc[base + d]);
        }
        m = mn;
    }
    if (lane == 0) { ms[w] = m; ls[w] = l; }
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) {
        int d = lane + i * WARP;
        if (i < nd && d < hd) accs[w][d] = acc[i];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int i = 0; i < ATT_WARPS; i++) M = fmaxf(M, ms[i]);
    float L = 0.f, f[ATT_WARPS];
    for (int i = 0; i < ATT_WARPS; i++) {
        f[i] = ms[i] == -INFINITY ? 0.f : expf(ms[i] - M);   // a warp with no position adds nothing
        L += ls[i] * f[i];
    }
    const float *gate = q + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (int i = 0; i < ATT_WARPS; i++) o += accs[i][d] * f[i];
        core[(size_t)t * nh * hd + (size_t)h * hd + d] = (o / L) * sigm(gate[d]);
    }
}

#define ATTENTION(NAME, KV)                                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) NAME(const float *proj, const int *tok_pos, const int *tok_slot, const int *bt, \
                                                           int bt_stride, const void *kc, const void *vc, const float *ks, const float *vs, \
                                                           float *core, int nh, int kvh, int hd, float scale) {                     \
        attention<KV>(proj, tok_pos, tok_slot, bt, bt_stride, (const KV::T *)kc, (const KV::T *)vc, ks, vs, core, nh, kvh, hd, scale); \
    }
ATTENTION(k_attention_f32, kv_f32)
ATTENTION(k_attention_bf16, kv_bf16)
ATTENTION(k_attention_fp8, kv_fp8)
