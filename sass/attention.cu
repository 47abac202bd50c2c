// sass/attention.cu — causal GQA attention over the paged KV cache with the sigmoid output gate
// (MODEL.md §3.4 steps 6–7): for token t at position p and query head h (KV head h / (nh / kvh)),
//   o = Σ_{τ ≤ p} softmax_τ(q · k_τ / sqrt(hd)) v_τ,   core[t, h] = o ⊙ σ(gate)
// CPU twin: ref_attn_core (moet.c; one query token).
// Launch (gpu_k_attention): block GPU_ATT_NT = GPU_ATT_WARPS (16) warps, grid (T, nh) (tokens
// along grid.x, which holds 2³¹ − 1 blocks). Warp w takes
// positions τ ≡ w (mod 16), two at a time (τ and τ + 16: two independent dot products in
// flight), with an online softmax (running max m, sum l, accumulator per lane over hd/32 dims);
// the sixteen partial states merge in warp order. The order depends only on p: batch invariant.
// hd ≤ GPU_ATT_MAX_HD.
#include "kv.cuh"

#define ATT_MAXD (GPU_ATT_MAX_HD / WARP)   // dims per lane

template <class KV>
__device__ void attention(const float *__restrict__ proj, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                          const int *__restrict__ bt, int bt_stride, const typename KV::T *__restrict__ kc,
                          const typename KV::T *__restrict__ vc, const float *__restrict__ ks, const float *__restrict__ vs,
                          float *__restrict__ core, int nh, int kvh, int hd, float scale) {
    __shared__ float ms[GPU_ATT_WARPS], ls[GPU_ATT_WARPS];
    __shared__ float accs[GPU_ATT_WARPS][GPU_ATT_MAX_HD];
    int h = blockIdx.y, t = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
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
    for (int tau = w; tau <= p; tau += 2 * GPU_ATT_WARPS) {
        int t1 = tau + GPU_ATT_WARPS, two = t1 <= p;   // the second position, when there is one
        size_t b0 = kv_index(btr, tau, kvd, j * hd), b1 = two ? kv_index(btr, t1, kvd, j * hd) : b0;
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            int d = lane + i * WARP;
            if (i < nd && d < hd) {
                s0 += qr[i] * KV::get(kc[b0 + d]);
                s1 += qr[i] * KV::get(kc[b1 + d]);
            }
        }
        float ks0 = 1.f, vs0 = 1.f, ks1 = 1.f, vs1 = 1.f;
        if (KV::scaled) {
            size_t i0 = kv_scale_index(btr, tau, kvh, j), i1 = two ? kv_scale_index(btr, t1, kvh, j) : i0;
            ks0 = ks[i0], vs0 = vs[i0], ks1 = ks[i1], vs1 = vs[i1];
        }
        s0 = warp_sum(s0) * ks0 * scale;
        s1 = warp_sum(s1) * ks1 * scale;
        float mn = fmaxf(m, two ? fmaxf(s0, s1) : s0), c = expf(m - mn), e0 = expf(s0 - mn), e1 = two ? expf(s1 - mn) : 0.f;
        l = l * c + e0 + e1;
        float ev0 = e0 * vs0, ev1 = e1 * vs1;
#pragma unroll
        for (int i = 0; i < ATT_MAXD; i++) {
            int d = lane + i * WARP;
            if (i < nd && d < hd) acc[i] = acc[i] * c + ev0 * KV::get(vc[b0 + d]) + ev1 * KV::get(vc[b1 + d]);
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
    for (int i = 0; i < GPU_ATT_WARPS; i++) M = fmaxf(M, ms[i]);
    float L = 0.f, f[GPU_ATT_WARPS];
    for (int i = 0; i < GPU_ATT_WARPS; i++) {
        f[i] = ms[i] == -INFINITY ? 0.f : expf(ms[i] - M);   // a warp with no position adds nothing
        L += ls[i] * f[i];
    }
    const float *gate = q + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (int i = 0; i < GPU_ATT_WARPS; i++) o += accs[i][d] * f[i];
        core[(size_t)t * nh * hd + (size_t)h * hd + d] = (o / L) * sigm(gate[d]);
    }
}

#define ATTENTION(NAME, KV)                                                                                                         \
    extern "C" __global__ void __launch_bounds__(GPU_ATT_NT)                                                                        \
        NAME(const float *proj, const int *tok_pos, const int *tok_slot, const int *bt, int bt_stride, const void *kc, const void *vc, \
             const float *ks, const float *vs, float *core, int nh, int kvh, int hd, float scale) {                                 \
        attention<KV>(proj, tok_pos, tok_slot, bt, bt_stride, (const KV::T *)kc, (const KV::T *)vc, ks, vs, core, nh, kvh, hd, scale); \
    }
ATTENTION(k_attention_f32, kv_f32)
ATTENTION(k_attention_bf16, kv_bf16)
ATTENTION(k_attention_fp8, kv_fp8)
