// sass/attn_prep.cu — gated attention before the scores (MODEL.md §3.4 steps 3–5), per token:
// per-head zero-centred RMSNorm of q and k (q_norm, k_norm), partial RoPE on the first rot dims
// (pairs i, i + rot/2; angle = position · inv_freq[i] in f32, cos/sin in f64 as the reference),
// then k and v appended to the paged KV cache at the token's position (fp8: with their scales,
// sass/kv.cuh).
// CPU twin: ref_attn_prep (moet.c; one token), with ref_kv_round for the bf16 / fp8 caches.
// In/out: proj [T, 2·nh·hd] (per head h: q at h·2hd, gate at h·2hd + hd; q normed + roped in place),
// kk, vv [T, kvd]. Cache: kc/vc of this layer [pages, GPU_KV_PAGE, kvd]; block table
// bt [slots, bt_stride]. Launch (gpu_k_attn_prep): block GPU_PREP_NT (4 warps), grid (T,
// ceil((nh + kvh) / 4)): a warp per head (q heads, then k heads), each on its own, so how the
// heads are spread over blocks changes no bit.
#include "kv.cuh"

template <class KV>
__device__ void attn_prep(float *__restrict__ proj, const float *__restrict__ kk, const float *__restrict__ vv, gpu_mat qn, gpu_mat kn,
                          const float *__restrict__ inv_freq, int rot, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                          const int *__restrict__ bt, int bt_stride, typename KV::T *__restrict__ kc, typename KV::T *__restrict__ vc,
                          float *__restrict__ ks, float *__restrict__ vs, int nh, int kvh, int hd, float eps) {
    int t = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int p = tok_pos[t], kvd = kvh * hd, half = rot / 2;
    const int *btr = bt + (size_t)tok_slot[t] * bt_stride;
    for (int h = (int)blockIdx.y * nw + w; h < nh + kvh; h += nw * (int)gridDim.y) {
        int isq = h < nh;
        float *u = isq ? proj + (size_t)t * 2 * nh * hd + (size_t)h * 2 * hd : (float *)kk + (size_t)t * kvd + (size_t)(h - nh) * hd;
        const gpu_mat &nw_ = isq ? qn : kn;
        float ss = 0.f;
        for (int d = lane; d < hd; d += WARP) ss += u[d] * u[d];
        ss = warp_sum(ss);
        float rn = 1.f / sqrtf(ss / (float)hd + eps);
        for (int d = lane; d < hd; d += WARP) u[d] = (u[d] * rn) * (1.f + vec_at(nw_, d));
        __syncwarp();
        for (int i = lane; i < half; i += WARP) {
            float ang = (float)p * inv_freq[i];
            double sd, cd;
            sincos((double)ang, &sd, &cd);
            float c = (float)cd, s = (float)sd;
            float a = u[i], b = u[i + half];
            u[i] = a * c - b * s;
            u[i + half] = b * c + a * s;
        }
        __syncwarp();
        if (!isq) {
            int j = h - nh;
            const float *vh = vv + (size_t)t * kvd + (size_t)j * hd;
            float kinv = 1.f, vinv = 1.f;
            if (KV::scaled) {   // amax / 448 per (position, head); an all-zero head keeps scale 1
                float ka = 0.f, va = 0.f;
                for (int d = lane; d < hd; d += WARP) ka = fmaxf(ka, fabsf(u[d])), va = fmaxf(va, fabsf(vh[d]));
                ka = warp_max(ka), va = warp_max(va);
                float kscale = ka > 0.f ? ka / 448.f : 1.f, vscale = va > 0.f ? va / 448.f : 1.f;
                kinv = 1.f / kscale, vinv = 1.f / vscale;
                if (lane == 0) {
                    size_t si = kv_scale_index(btr, p, kvh, j);
                    ks[si] = kscale;
                    vs[si] = vscale;
                }
            }
            for (int d = lane; d < hd; d += WARP) {
                size_t ix = kv_index(btr, p, kvd, j * hd + d);
                kc[ix] = KV::put(u[d] * kinv);
                vc[ix] = KV::put(vh[d] * vinv);
            }
        }
    }
}

#define ATTN_PREP(NAME, KV)                                                                                                       \
    extern "C" __global__ void __launch_bounds__(GPU_PREP_NT)                                                                     \
        NAME(float *proj, const float *kk, const float *vv, gpu_mat qn, gpu_mat kn, const float *inv_freq, int rot,              \
             const int *tok_pos, const int *tok_slot, const int *bt, int bt_stride, void *kc, void *vc, float *ks, float *vs,    \
             int nh, int kvh, int hd, float eps) {                                                                                \
        GPU_DEP();                                                                                                                  \
        attn_prep<KV>(proj, kk, vv, qn, kn, inv_freq, rot, tok_pos, tok_slot, bt, bt_stride, (KV::T *)kc, (KV::T *)vc, ks, vs, nh, kvh, hd, eps); \
    }
ATTN_PREP(k_attn_prep_f32, kv_f32)
ATTN_PREP(k_attn_prep_bf16, kv_bf16)
ATTN_PREP(k_attn_prep_fp8, kv_fp8)
