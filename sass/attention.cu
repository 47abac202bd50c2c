// sass/attention.cu — causal GQA attention over an f32 paged KV cache with the sigmoid output gate,
// on CUDA cores (MODEL.md §3.4 steps 6–7; bf16 and fp8 caches take the tensor cores: flash.cu;
// the functions below stay generic over the cache's element type, and k_attn_merge serves both):
// for token t at position p and query head h (KV head h / (nh / kvh)),
//   o = Σ_{τ ≤ p} softmax_τ(q · k_τ / sqrt(hd)) v_τ,   core[t, h] = o ⊙ σ(gate)
// CPU twin: ref_attn_core (moet.c; one query token).
//
// The positions are cut into chunks of GPU_ATT_CHUNK by absolute position ([cC, cC + C) ∩ [0, p]).
// A chunk's partial state (its max M, sum L and unnormalised output O over hd) is computed by one
// block of GPU_ATT_WARPS (16) warps: warp w takes positions cC + w, cC + w + 16, … with an online
// softmax, four at a time where hd is 32 · a power of two (each lane eight contiguous dims at
// hd 256, a K or V row one 16-byte load per lane for bf16: att_chunk_vec), else two at a time
// (att_chunk_any), and the sixteen warp states merge in warp order (att_merge_warps). The chunks then fold in chunk order (att_fold), from chunk 0.
// Two kernels do exactly that, with the same functions, so a token's bits do not depend on which
// one ran or on the other tokens of the step:
//   k_attention_*  (gpu_k_attention): grid (T, nh), block GPU_ATT_NT; each block walks its token's
//                  chunks one after another (prompt chunks: the partial states never leave the SM);
//   k_attn_part_*  (gpu_k_attn_split): grid (T, nh, chunks of the step's deepest token), a block per
//                  chunk writes its partial state to part [T, nh, nc, hd + 2]; k_attn_merge then
//                  folds them in chunk order (decode steps: the chunks of a long context in parallel).
// hd ≤ GPU_ATT_MAX_HD; tokens along grid.x (2³¹ − 1 blocks). If xs: core's three bf16 parts
// too, for the output projection (k_mm_split's layout, [3][T][nh·hd]).
#include "kv.cuh"
#include "mm.cuh"
#include "att.cuh"

#define ATT_MAXD (GPU_ATT_MAX_HD / WARP)   // dims per lane

// The sixteen warps' states (ms, ls, accs) merged in warp order into Mc, Lc and oc[hd].
__device__ __forceinline__ void att_merge_warps(int hd, float *ms, float *ls, float (*accs)[GPU_ATT_MAX_HD], float *oc, float &Mc, float &Lc) {
    __syncthreads();
    float M = -INFINITY;
    for (int i = 0; i < GPU_ATT_WARPS; i++) M = fmaxf(M, ms[i]);
    float L = 0.f, f[GPU_ATT_WARPS];
    for (int i = 0; i < GPU_ATT_WARPS; i++) {
        f[i] = ms[i] == -INFINITY ? 0.f : expf(ms[i] - M);   // a warp with no position adds nothing
        L += ls[i] * f[i];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (int i = 0; i < GPU_ATT_WARPS; i++) o += accs[i][d] * f[i];
        oc[d] = o;
    }
    Mc = M, Lc = L;
    __syncthreads();
}

// att_chunk for any head dimension (qr: dims lane + 32i): each warp two positions per round.
template <class KV>
__device__ __forceinline__ void att_chunk_any(const float qr[ATT_MAXD], int lo, int hi, const int *__restrict__ btr, const typename KV::T *__restrict__ kc,
                                          const typename KV::T *__restrict__ vc, const float *__restrict__ ks, const float *__restrict__ vs,
                                          int kvd, int kvh, int j, int hd, float scale, float *ms, float *ls, float (*accs)[GPU_ATT_MAX_HD],
                                          float *oc, float &Mc, float &Lc) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nd = (hd + WARP - 1) / WARP;
    float acc[ATT_MAXD];
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int tau = lo + w; tau <= hi; tau += 2 * GPU_ATT_WARPS) {
        int t1 = tau + GPU_ATT_WARPS, two = t1 <= hi;   // the second position, when there is one
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
    att_merge_warps(hd, ms, ls, accs, oc, Mc, Lc);
}

// Whether head dimension hd takes the vector form below: lane l holds dims [l·nd, l·nd + nd),
// nd = hd / 32 a power of two up to ATT_MAXD (its K and V rows read 16 bytes at a time).
__device__ __forceinline__ bool att_vec(int hd) {
    const int nd = hd / WARP;
    return hd % WARP == 0 && nd >= 1 && nd <= ATT_MAXD && (nd & (nd - 1)) == 0;
}

// ND consecutive elements of a K or V row at p (ND · sizeof(T) bytes, aligned to that up to 16),
// as floats.
template <class KV, int ND>
__device__ __forceinline__ void att_row(const typename KV::T *__restrict__ p, float *out) {
    typedef typename KV::T T;
    constexpr int BYTES = ND * (int)sizeof(T);
    if constexpr (BYTES >= 16) {
        uint4 raw[BYTES / 16];
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++) raw[i] = __ldg((const uint4 *)p + i);
        const T *e = (const T *)raw;
#pragma unroll
        for (int i = 0; i < ND; i++) out[i] = KV::get(e[i]);
    } else if constexpr (BYTES == 8) {
        uint2 raw = __ldg((const uint2 *)p);
        const T *e = (const T *)&raw;
#pragma unroll
        for (int i = 0; i < ND; i++) out[i] = KV::get(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < ND; i++) out[i] = KV::get(p[i]);
    }
}

// att_chunk_any for att_vec head dimensions (ND = hd / 32): each warp takes PW positions per
// round (tau, tau + 16, …: its positions in the same order), their K and V rows requested
// together, one rescale of the running state per round (PW · ND ≤ 32 floats of each in registers).
template <class KV, int ND>
__device__ __forceinline__ void att_chunk_vec(const float qr[ATT_MAXD], int lo, int hi, const int *__restrict__ btr,
                                              const typename KV::T *__restrict__ kc, const typename KV::T *__restrict__ vc,
                                              const float *__restrict__ ks, const float *__restrict__ vs, int kvd, int kvh, int j, int hd,
                                              float scale, float *ms, float *ls, float (*accs)[GPU_ATT_MAX_HD]) {
    constexpr int ATT_PW = ND <= 8 ? 4 : 2;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float acc[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    for (int tau = lo + w; tau <= hi; tau += ATT_PW * GPU_ATT_WARPS) {
        float kr[ATT_PW][ND], vr[ATT_PW][ND], s[ATT_PW], ksc[ATT_PW], vsc[ATT_PW];
        bool on[ATT_PW];
#pragma unroll
        for (int u = 0; u < ATT_PW; u++) {
            const int tp = tau + u * GPU_ATT_WARPS;
            on[u] = tp <= hi;
            const size_t b = kv_index(btr, on[u] ? tp : tau, kvd, j * hd) + (size_t)lane * ND;
            att_row<KV, ND>(kc + b, kr[u]);
            att_row<KV, ND>(vc + b, vr[u]);
            ksc[u] = 1.f, vsc[u] = 1.f;
            if (KV::scaled) {
                const size_t si = kv_scale_index(btr, on[u] ? tp : tau, kvh, j);
                ksc[u] = ks[si], vsc[u] = vs[si];
            }
        }
        float mn = m;
#pragma unroll
        for (int u = 0; u < ATT_PW; u++) {
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < ND; i++) d += qr[i] * kr[u][i];
            s[u] = warp_sum(d) * ksc[u] * scale;
            if (on[u]) mn = fmaxf(mn, s[u]);
        }
        const float c = expf(m - mn);
        float e[ATT_PW];
        l = l * c;
#pragma unroll
        for (int u = 0; u < ATT_PW; u++) {
            e[u] = on[u] ? expf(s[u] - mn) : 0.f;
            l += e[u];
            e[u] *= vsc[u];
        }
#pragma unroll
        for (int i = 0; i < ND; i++) {
            float a = acc[i] * c;
#pragma unroll
            for (int u = 0; u < ATT_PW; u++) a += e[u] * vr[u][i];
            acc[i] = a;
        }
        m = mn;
    }
    if (lane == 0) { ms[w] = m; ls[w] = l; }
#pragma unroll
    for (int i = 0; i < ND; i++) accs[w][lane * ND + i] = acc[i];
}

// One chunk [lo, hi] of token t's positions for query head h: the block's sixteen warps merged in
// warp order into Mc, Lc (returned to every thread) and oc[d] (shared, hd floats). q in registers
// (att_q's layout for hd). Ends with a barrier: oc, ms, ls, accs may be reused after the caller's next one.
template <class KV>
__device__ __forceinline__ void att_chunk(const float qr[ATT_MAXD], int lo, int hi, const int *__restrict__ btr, const typename KV::T *__restrict__ kc,
                                          const typename KV::T *__restrict__ vc, const float *__restrict__ ks, const float *__restrict__ vs,
                                          int kvd, int kvh, int j, int hd, float scale, float *ms, float *ls, float (*accs)[GPU_ATT_MAX_HD],
                                          float *oc, float &Mc, float &Lc) {
    if (!att_vec(hd)) {
        att_chunk_any<KV>(qr, lo, hi, btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs, oc, Mc, Lc);
        return;
    }
    switch (hd / WARP) {
    case 1: att_chunk_vec<KV, 1>(qr, lo, hi, btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs); break;
    case 2: att_chunk_vec<KV, 2>(qr, lo, hi, btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs); break;
    case 4: att_chunk_vec<KV, 4>(qr, lo, hi, btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs); break;
    case 8: att_chunk_vec<KV, 8>(qr, lo, hi, btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs); break;
    default: att_chunk_vec<KV, 16>(qr, lo, hi, btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs); break;
    }
    att_merge_warps(hd, ms, ls, accs, oc, Mc, Lc);
}

// The query of token t, head h in registers.
// (att_chunk's layouts: dims lane·nd + i where att_vec(hd), else lane + 32i).
__device__ __forceinline__ void att_q(const float *q, int hd, float qr[ATT_MAXD]) {
    const int lane = threadIdx.x & 31, nd = (hd + WARP - 1) / WARP;
    const bool vec = att_vec(hd);
#pragma unroll
    for (int i = 0; i < ATT_MAXD; i++) {
        int d = vec ? lane * nd + i : lane + i * WARP;
        qr[i] = (i < nd && d < hd) ? q[d] : 0.f;
    }
}

// k_attention_*: every chunk of the token, one after another, folded as they come.
template <class KV>
__device__ void attention(const float *__restrict__ proj, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                          const int *__restrict__ bt, int bt_stride, const typename KV::T *__restrict__ kc,
                          const typename KV::T *__restrict__ vc, const float *__restrict__ ks, const float *__restrict__ vs,
                          float *__restrict__ core, int nh, int kvh, int hd, float scale, __nv_bfloat16 *__restrict__ xs) {
    __shared__ float ms[GPU_ATT_WARPS], ls[GPU_ATT_WARPS];
    __shared__ float accs[GPU_ATT_WARPS][GPU_ATT_MAX_HD];
    __shared__ float oc[GPU_ATT_MAX_HD];
    int h = blockIdx.y, t = blockIdx.x;
    int p = tok_pos[t], kvd = kvh * hd, j = h / (nh / kvh);
    const int *btr = bt + (size_t)tok_slot[t] * bt_stride;
    const float *q = proj + (size_t)t * 2 * nh * hd + (size_t)h * 2 * hd;
    float qr[ATT_MAXD];
    att_q(q, hd, qr);
    float M = -INFINITY, L = 0.f, o[GPU_ATT_MAX_HD / GPU_ATT_NT];   // dims threadIdx.x + i·GPU_ATT_NT
#pragma unroll
    for (int i = 0; i < GPU_ATT_MAX_HD / GPU_ATT_NT; i++) o[i] = 0.f;
    for (int c = 0; c * GPU_ATT_CHUNK <= p; c++) {
        int lo = c * GPU_ATT_CHUNK, hi = min(p, lo + GPU_ATT_CHUNK - 1);
        float Mc, Lc;
        att_chunk<KV>(qr, lo, hi, btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs, oc, Mc, Lc);
        float Mr = M, Lr = L;
#pragma unroll
        for (int i = 0; i < GPU_ATT_MAX_HD / GPU_ATT_NT; i++) {
            int d = threadIdx.x + i * GPU_ATT_NT;
            M = Mr, L = Lr;
            float od = d < hd ? oc[d] : 0.f;
            att_fold(M, L, o[i], Mc, Lc, od);
        }
        __syncthreads();   // oc read before the next chunk writes it
    }
    const float *gate = q + hd;
#pragma unroll
    for (int i = 0; i < GPU_ATT_MAX_HD / GPU_ATT_NT; i++) {
        int d = threadIdx.x + i * GPU_ATT_NT;
        if (d < hd) att_out(core, xs, (size_t)t * nh * hd + (size_t)h * hd + d, (size_t)gridDim.x * nh * hd, (o[i] / L) * sigm(gate[d]));
    }
}

// k_attn_part_*: chunk blockIdx.z of token t, head h: its state to part[((t·nh + h)·nc + c)·(hd + 2)]
// as M, L, O[hd] (nothing when the chunk starts past the token's position).
template <class KV>
__device__ void attn_part(const float *__restrict__ proj, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                          const int *__restrict__ bt, int bt_stride, const typename KV::T *__restrict__ kc,
                          const typename KV::T *__restrict__ vc, const float *__restrict__ ks, const float *__restrict__ vs,
                          float *__restrict__ part, int nc, int nh, int kvh, int hd, float scale) {
    __shared__ float ms[GPU_ATT_WARPS], ls[GPU_ATT_WARPS];
    __shared__ float accs[GPU_ATT_WARPS][GPU_ATT_MAX_HD];
    __shared__ float oc[GPU_ATT_MAX_HD];
    int h = blockIdx.y, t = blockIdx.x, c = blockIdx.z;
    int p = tok_pos[t], kvd = kvh * hd, j = h / (nh / kvh), lo = c * GPU_ATT_CHUNK;
    if (lo > p) return;
    const int *btr = bt + (size_t)tok_slot[t] * bt_stride;
    float qr[ATT_MAXD];
    att_q(proj + (size_t)t * 2 * nh * hd + (size_t)h * 2 * hd, hd, qr);
    float Mc, Lc;
    att_chunk<KV>(qr, lo, min(p, lo + GPU_ATT_CHUNK - 1), btr, kc, vc, ks, vs, kvd, kvh, j, hd, scale, ms, ls, accs, oc, Mc, Lc);
    float *dst = part + (((size_t)t * nh + h) * nc + c) * (hd + 2);
    if (threadIdx.x == 0) dst[0] = Mc, dst[1] = Lc;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[2 + d] = oc[d];
}

// k_attn_merge: token t, head h (grid (T, nh), block GPU_ATT_NT): its chunks' states folded in
// chunk order, then core = O / L ⊙ σ(gate).
extern "C" __global__ void __launch_bounds__(GPU_ATT_NT) k_attn_merge(const float *__restrict__ proj, const int *__restrict__ tok_pos,
                                                                      const float *__restrict__ part, int nc, float *__restrict__ core, int nh,
                                                                      int hd, __nv_bfloat16 *__restrict__ xs) {
    GPU_DEP();
    int h = blockIdx.y, t = blockIdx.x, p = tok_pos[t];
    const float *src = part + ((size_t)t * nh + h) * nc * (hd + 2), *gate = proj + (size_t)t * 2 * nh * hd + (size_t)h * 2 * hd + hd;
#pragma unroll
    for (int i = 0; i < GPU_ATT_MAX_HD / GPU_ATT_NT; i++) {
        int d = threadIdx.x + i * GPU_ATT_NT;
        float M = -INFINITY, L = 0.f, o = 0.f;
        for (int c = 0; c * GPU_ATT_CHUNK <= p; c++) {
            const float *sc = src + (size_t)c * (hd + 2);
            att_fold(M, L, o, sc[0], sc[1], d < hd ? sc[2 + d] : 0.f);
        }
        if (d < hd) att_out(core, xs, (size_t)t * nh * hd + (size_t)h * hd + d, (size_t)gridDim.x * nh * hd, (o / L) * sigm(gate[d]));
    }
}

#define ATTENTION(NAME, KV)                                                                                                         \
    extern "C" __global__ void __launch_bounds__(GPU_ATT_NT)                                                                        \
        NAME(const float *proj, const int *tok_pos, const int *tok_slot, const int *bt, int bt_stride, const void *kc, const void *vc, \
             const float *ks, const float *vs, float *core, int nh, int kvh, int hd, float scale, __nv_bfloat16 *xs) {              \
        GPU_DEP();                                                                                                                  \
        attention<KV>(proj, tok_pos, tok_slot, bt, bt_stride, (const KV::T *)kc, (const KV::T *)vc, ks, vs, core, nh, kvh, hd, scale, xs); \
    }
ATTENTION(k_attention_f32, kv_f32)   // (bf16 and fp8 caches: sass/flash.cu)

#define ATTN_PART(NAME, KV)                                                                                                         \
    extern "C" __global__ void __launch_bounds__(GPU_ATT_NT)                                                                        \
        NAME(const float *proj, const int *tok_pos, const int *tok_slot, const int *bt, int bt_stride, const void *kc, const void *vc, \
             const float *ks, const float *vs, float *part, int nc, int nh, int kvh, int hd, float scale) {                        \
        GPU_DEP();                                                                                                                  \
        attn_part<KV>(proj, tok_pos, tok_slot, bt, bt_stride, (const KV::T *)kc, (const KV::T *)vc, ks, vs, part, nc, nh, kvh, hd, scale); \
    }
ATTN_PART(k_attn_part_f32, kv_f32)
