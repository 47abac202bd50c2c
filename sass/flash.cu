// sass/flash.cu — causal GQA attention over the paged KV cache on tensor cores, for bf16 and fp8
// caches (MODEL.md §3.4 steps 6–7; the f32 cache keeps sass/attention.cu): the same function as
// k_attention, o = Σ_{τ ≤ p} softmax_τ(q · k_τ / sqrt(hd)) v_τ, core[t, h] = o ⊙ σ(gate).
// CPU twin: ref_attn_core (moet.c; one query token).
//
// Rows. A row is one (token, query head). The G = nh / kvh query heads of a token share their KV
// head, so a warp's 16 mma rows are ⌊16 / G⌋ tokens × G heads of one sequence (G ≤ 16; rows past
// them carry no query), and a block of NW warps reads each key and value once for all of them.
//
// What a row computes, in this order whatever its block, warp, mma row or the other rows (batch
// and chunk invariance: a row's bits depend on its query, its position and the cache alone):
//   - the chunks of GPU_ATT_CHUNK absolute positions (as attention.cu), each from a fresh state
//     (M = −∞, L = 0, O = 0), then folded in chunk order by att_fold (the split form folds the
//     same partial states in k_attn_merge: the same bits);
//   - inside a chunk, tiles of GPU_FA_KT keys in order. A tile: S = q · K over k16 steps in dim
//     order, each step the query's three bf16 parts (lo, mid, hi; mm.cuh's split of f32) through
//     three mma into a fresh accumulator then added to S in f32 (FA_P 1, sass/all_bf.cu: q's bf16
//     rounding through one mma into S; likewise p below) (K exact in bf16: fp8 widens
//     exactly); s = S · k_scale (fp8) · scale, −∞ past the row's position; an online-softmax
//     step (the row's max over the tile by a fixed lane order, rescale c = e^(M − M'), p =
//     e^(s − M'), L = L·c + Σp); O = O·c + (p · v_scale) · V, over k16 steps of keys in order, p's
//     three parts through three mma into a fresh accumulator then added in f32;
//   - keys past the row's position are masked to p = 0, so a tile a row does not reach is an
//     exact no-op (c = 1, nothing added), and keys past the block's deepest position are zeros.
// One kernel, k_fa, runs exactly that in two forms (one body, so the cubins carry it once):
//   walk  (gpu_k_attention, nc = 0): grid (token tiles, kvh), GPU_FA_WALK_W warps (fewer where
//         the device's shared memory is smaller), each GPU_FA_WALK_SPLIT of them sharing a tile of
//         16 rows (⌊16 / G⌋ tokens); a block walks its tokens' chunks one after another and keeps
//         the running O in core (f32, the output's own place), M and L in registers; the last
//         chunk writes the gated output. A token tile spanning sequences is taken one sequence's
//         run of tokens at a time.
//   split (gpu_k_attn_split, nc > 0): grid (T, kvh, chunks), GPU_FA_SPLIT_W warps sharing one
//         token's rows: one chunk, its partial state to part [T, nh, nc, hd + 2] (M, L, O) for
//         k_attn_merge.
// Warps sharing a tile of rows split its work, not its arithmetic (fa_chunk): each computes the
// scores of a slice of the keys and O of a slice of the dims, and every one runs the softmax of the
// whole tile from the scores in shared memory, as one warp would.
//
// Shared memory (gpu_fa_smem, fa_smem): each row tile's queries as bf16 A fragments in FA_P parts
// [nq][hd/16][FA_P][32] uint4 (fa_stage_q), one tile of keys and one of values [GPU_FA_KT][hd] bf16
// (16-byte chunks swizzled by key for ldmatrix), the tile's fp8 scales [2][GPU_FA_KT] and each row
// tile's scores [nq][16][GPU_FA_KT] f32. Keys and values come by cp.async (bf16: the next tile's
// keys while this tile's values are multiplied, its values while the next keys are); fp8 rows are
// widened on the way in. hd ∈ {32, 64, 256} (gpu_fa_warps).
#include "kv.cuh"
#include "mm.cuh"
#include "att.cuh"

#define FA_KT GPU_FA_KT
// The bf16 parts of q and p the products read: three (mm_split3's: f32 up to the order of the
// additions) or, built with GPU_MM_PARTS 1 (sass/all_bf.cu: `--act-dtype bf16`), their bf16 rounding
// alone, as the matrix products there (p's rounding is of e^(s − M) at the tile's running max M; the
// sum L adds the unrounded p).
#define FA_P (GPU_MM_PARTS == 1 ? 1 : 3)

// The dim n-tiles (8 dims each) of a warp's O when SPLIT warps share a tile's rows: at least a pair
// (one ldmatrix.x4); with few dims, warps past hd / 16 have none.
template <int HD, int SPLIT>
__host__ __device__ constexpr int fa_ndt() { return HD / 8 / SPLIT >= 2 ? HD / 8 / SPLIT : 2; }

// The 16-byte chunk c (8 bf16) of row `key` of a [GPU_FA_KT][HD] tile: swizzled for rows of ≥ 8
// chunks so that an ldmatrix's eight rows hit eight bank groups.
template <int HD>
__device__ __forceinline__ int fa_at(int key, int c) {
    return key * HD + ((HD >= 64 ? (c ^ (key & 7)) : c) << 3);
}

__device__ __forceinline__ void fa_ldm(uint32_t r[4], const __nv_bfloat16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void fa_ldm_t(uint32_t r[4], const __nv_bfloat16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// A pair of floats (lower k first) as three bf16 pairs hi, mid, lo: mm_split3's parts.
__device__ __forceinline__ void fa_split(float x, float y, uint32_t &h, uint32_t &m, uint32_t &l) {
    __nv_bfloat162 hb = __floats2bfloat162_rn(x, y);
    float2 hf = __bfloat1622float2(hb);
    float rx = __fsub_rn(x, hf.x), ry = __fsub_rn(y, hf.y);
    __nv_bfloat162 mb = __floats2bfloat162_rn(rx, ry);
    float2 mf = __bfloat1622float2(mb);
    __nv_bfloat162 lb = __floats2bfloat162_rn(__fsub_rn(rx, mf.x), __fsub_rn(ry, mf.y));
    h = *(const uint32_t *)&hb, m = *(const uint32_t *)&mb, l = *(const uint32_t *)&lb;
}

// A's fragment (4 registers) of one k16 step, in FA_P parts, from four float pairs (rows g, g+8
// at k 2t, and at k 2t + 8).
__device__ __forceinline__ void fa_afrag(float2 x0, float2 x1, float2 x2, float2 x3, uint32_t a[FA_P][4]) {
#if FA_P == 1
    const __nv_bfloat162 h0 = __floats2bfloat162_rn(x0.x, x0.y), h1 = __floats2bfloat162_rn(x1.x, x1.y), h2 = __floats2bfloat162_rn(x2.x, x2.y),
                         h3 = __floats2bfloat162_rn(x3.x, x3.y);
    a[0][0] = *(const uint32_t *)&h0, a[0][1] = *(const uint32_t *)&h1, a[0][2] = *(const uint32_t *)&h2, a[0][3] = *(const uint32_t *)&h3;
#else
    fa_split(x0.x, x0.y, a[0][0], a[1][0], a[2][0]);
    fa_split(x1.x, x1.y, a[0][1], a[1][1], a[2][1]);
    fa_split(x2.x, x2.y, a[0][2], a[1][2], a[2][2]);
    fa_split(x3.x, x3.y, a[0][3], a[1][3], a[2][3]);
#endif
}

// acc[i] += (lo, mid, hi through three mma into a fresh accumulator; one part: its mma into acc) for
// the N n-tiles of one k16 step (B fragments b[i]), the N chains interleaved so that no mma waits on
// the one just issued.
template <int N>
__device__ __forceinline__ void fa_mma3(float (*acc)[4], const uint32_t a[FA_P][4], const uint32_t (*b)[2]) {
#if FA_P == 1
#pragma unroll
    for (int i = 0; i < N; i++) mm_mma(acc[i], a[0], b[i][0], b[i][1]);
#else
    float c[N][4];
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) c[i][e] = 0.f;
#pragma unroll
    for (int p = FA_P - 1; p >= 0; p--)
#pragma unroll
        for (int i = 0; i < N; i++) mm_mma(c[i], a[p], b[i][0], b[i][1]);
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = __fadd_rn(acc[i][e], c[i][e]);
#endif
}

// One tile of keys (or values) [base, base + GPU_FA_KT) of KV head j into dst (bf16, fa_at's
// layout) and its fp8 scales into sdst, by the whole block; positions past pmax are zeros. base is
// a multiple of GPU_FA_KT, so the tile is FA_NP whole pages of the block table: their entries are
// read first, all in flight together (kv_index's page per element, read after each copy was
// issued — the copies clobber memory — made a chain of dependent loads), then every copy.
#define FA_NP (GPU_FA_KT / GPU_KV_PAGE)
static_assert(GPU_FA_KT % GPU_KV_PAGE == 0, "fa_load: a tile of keys is whole pages");
__device__ __forceinline__ void fa_pages(const int *__restrict__ btr, int base, int pmax, int pg[FA_NP]) {
#pragma unroll
    for (int q = 0; q < FA_NP; q++) pg[q] = base + q * GPU_KV_PAGE <= pmax ? btr[base / GPU_KV_PAGE + q] : 0;   // pages past pmax: not read
}
// kv_index's offset of the tile's key `key` (pos = base + key: the same place in its page), from the tile's pages.
__device__ __forceinline__ size_t fa_kv_at(const int pg[FA_NP], int key, int kvd, int i) {
    int p = pg[0];
#pragma unroll
    for (int q = 1; q < FA_NP; q++) p = key >= q * GPU_KV_PAGE ? pg[q] : p;   // a select chain: no indexed local array
    return kv_page_index(p, key, kvd, i);
}
template <int HD>
__device__ __forceinline__ void fa_load(bool f8, __nv_bfloat16 *dst, float *sdst, const void *__restrict__ src, const float *__restrict__ ssrc,
                                        const int *__restrict__ btr, int base, int pmax, int kvd, int kvh, int j) {
    constexpr int CPR = HD / 8;   // 16-byte chunks of a bf16 row
    int pg[FA_NP];
    fa_pages(btr, base, pmax, pg);
    for (int i = threadIdx.x; i < FA_KT * CPR; i += blockDim.x) {
        const int key = i / CPR, c = i % CPR, pos = base + key;
        const bool ok = pos <= pmax;
        __nv_bfloat16 *d = dst + fa_at<HD>(key, c);
        if (f8) {   // fp8: 8 bytes widened to 8 bf16, exactly (the cache's rounding saturates: no NaN code unless the key was NaN)
            uint2 raw = ok ? __ldg((const uint2 *)((const uint8_t *)src + fa_kv_at(pg, key, kvd, j * HD) + c * 8)) : make_uint2(0u, 0u);
            *(uint4 *)d = make_uint4(mm_fp8x2(raw.x), mm_fp8x2(raw.x >> 16), mm_fp8x2(raw.y), mm_fp8x2(raw.y >> 16));
        } else {
            mm_cp<16>(d, ok ? (const void *)((const __nv_bfloat16 *)src + fa_kv_at(pg, key, kvd, j * HD) + c * 8) : src, ok);
        }
    }
    if (f8)
        for (int key = threadIdx.x; key < FA_KT; key += blockDim.x) {
            const int pos = base + key;
            sdst[key] = pos <= pmax ? ssrc[fa_kv_at(pg, key, kvh, j)] : 0.f;   // kv_scale_index's entry
        }
}

// The online-softmax step of a tile for a lane's two rows (g, g + 8), in three parts that k_fa_w
// (flash_w.cu) shares: s [GPU_FA_KT / 8][4] the tile's scaled, masked scores in mma's C layout
// (n-tile n: keys 8n + 2t + e % 2, row e / 2); m, l the chunk's running max and sum.
// fa_tile_max: the lane's own max of each row over the tile.
__device__ __forceinline__ void fa_tile_max(const float (*s)[4], float mx[2]) {
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
}
// fa_tile_shift: the row's max over its four lanes (xor 1, then 2), the new running max m, the
// shift mu of the exponent and the rescale cf = e^(m − mu) of what the chunk holds.
__device__ __forceinline__ void fa_tile_shift(float mx[2], float m[2], float mu[2], float cf[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[r], mx[r]);
        mu[r] = mn == -INFINITY ? 0.f : mn;   // a row with no key yet: nothing to rescale, p = 0
        cf[r] = expf(__fsub_rn(m[r], mu[r]));
        m[r] = mn;
    }
}
// fa_tile_p: p = e^(s − mu) in place of s (times its key's value scale with fp8, vsc = the scales
// from the lane's first key 2t: what the product P V rounds), l = l·cf + Σp (the lane's p in n, e order, then the lanes xor 1, 2).
__device__ __forceinline__ void fa_tile_p(bool f8, float (*s)[4], const float *vsc, const float mu[2], const float cf[2], float l[2]) {
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1;
            const float p = expf(__fsub_rn(s[n][e], mu[r]));
            sum[r] = __fadd_rn(sum[r], p);
            s[n][e] = f8 ? __fmul_rn(p, vsc[n * 8 + e % 2]) : p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        sum[r] = __fadd_rn(sum[r], __shfl_xor_sync(0xffffffffu, sum[r], 1));
        sum[r] = __fadd_rn(sum[r], __shfl_xor_sync(0xffffffffu, sum[r], 2));
        l[r] = __fmaf_rn(l[r], cf[r], sum[r]);
    }
}

// Where a kernel's shared memory lies (gpu_fa_smem's layout, nq query tiles of 16 rows).
template <int HD>
struct fa_smem {   // (the two tiles, 256·HD bytes, hold four row tiles' f32 query scratch: fa_stage_q)
    uint4 *q;                // [nq][HD/16][FA_P][32]: fa_stage_q
    __nv_bfloat16 *k, *v;    // [GPU_FA_KT][HD] each
    float *ks, *vs;          // [GPU_FA_KT] each
    float *s;                // [nq][16][GPU_FA_KT]: each row tile's scores (its warps share its rows)
    __device__ __forceinline__ fa_smem(int nq) {
        extern __shared__ uint4 fa_raw[];
        q = fa_raw;
        k = (__nv_bfloat16 *)(q + (size_t)nq * (HD / 16) * FA_P * WARP);
        v = k + FA_KT * HD;
        ks = (float *)(v + FA_KT * HD);
        vs = ks + FA_KT;
        s = vs + FA_KT;
    }
};

// The rows of this lane (g and g + 8 of its warp's 16) for a run of tokens [ts, te) of one
// sequence: token, query head, and position (−1: no row).
struct fa_rows {
    int tok[2], head[2], pos[2];
};

// k16 step kk of a warp's 16 query rows in st ([16][HD] f32) as A fragments, FA_P parts: the lane's
// four registers of each part to q [HD/16][FA_P][32 lanes] uint4.
template <int HD>
__device__ __forceinline__ void fa_q_frag(uint4 *q, const float *st, int kk) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float *q0 = st + g * HD + kk * 16 + 2 * t, *q1 = q0 + 8 * HD;
    uint32_t a[FA_P][4];
    fa_afrag(*(const float2 *)q0, *(const float2 *)q1, *(const float2 *)(q0 + 8), *(const float2 *)(q1 + 8), a);
#pragma unroll
    for (int p = 0; p < FA_P; p++) q[(kk * FA_P + p) * WARP + lane] = make_uint4(a[p][0], a[p][1], a[p][2], a[p][3]);
}

// The warp's 16 queries as A fragments of each k16 step in their three bf16 parts (hi, mid, lo):
// q [HD/16][FA_P][32 lanes] uint4, a lane's four registers of a step and part together (zeros where
// no row), split once per run. The rows come through st (the warp's [16][HD] f32 of scratch: the
// tiles' room, free between runs), every load in flight at once; the caller's barrier follows
// before the tiles are loaded over it.
template <int HD>
__device__ __forceinline__ void fa_stage_q(uint4 *q, float *st, const float *__restrict__ proj, int nh, int G, int tpw, int tok0, int te, int j) {
    const int lane = threadIdx.x & 31;
#pragma unroll 8
    for (int i = lane; i < 16 * (HD / 4); i += WARP) {
        const int row = i / (HD / 4), d = (i % (HD / 4)) * 4, tk = tok0 + row / G;
        const bool ok = row < tpw * G && tk < te;
        *(float4 *)(st + row * HD + d) =
            ok ? __ldg((const float4 *)(proj + (size_t)tk * 2 * nh * HD + (size_t)(j * G + row % G) * 2 * HD + d)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncwarp();
#pragma unroll 4
    for (int kk = 0; kk < HD / 16; kk++) fa_q_frag<HD>(q, st, kk);
}

// The split form's one token's G rows (rows past G zero), as fa_stage_q gives them, by the whole
// block: every thread's loads in flight at once (one round where one warp took several), then each
// warp the fragments of its share of the k16 steps; the caller's barrier follows.
template <int HD>
__device__ __forceinline__ void fa_stage_q_block(uint4 *q, float *st, const float *__restrict__ proj, int nh, int G, int tk, int j) {
    const int nw = blockDim.x / WARP, w = threadIdx.x / WARP;
#pragma unroll 8
    for (int i = threadIdx.x; i < 16 * (HD / 4); i += blockDim.x) {
        const int row = i / (HD / 4), d = (i % (HD / 4)) * 4;
        *(float4 *)(st + row * HD + d) =
            row < G ? __ldg((const float4 *)(proj + (size_t)tk * 2 * nh * HD + (size_t)(j * G + row) * 2 * HD + d)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();   // every row in the scratch before any warp reads another's
    for (int kk = w; kk < HD / 16; kk += nw) fa_q_frag<HD>(q, st, kk);
}

// One chunk's tiles [base0, base0 + GPU_ATT_CHUNK) ∩ [0, pmax] for a tile of 16 rows (q: their
// staged queries) shared by SPLIT consecutive warps: the chunk's state m, l (rows g, g + 8) and o
// (C fragments: dims 8n + 2t + {0,1} of rows g, g + 8, n over the warp's dims). Warp ws of the
// SPLIT computes the scores of keys [ws·KT/SPLIT, (ws + 1)·KT/SPLIT) and O of dims
// [ws·hd/SPLIT, (ws + 1)·hd/SPLIT); with SPLIT > 1 the scores meet in ssm ([16][GPU_FA_KT] f32)
// and every warp runs the softmax of the whole tile itself, lane by lane as one warp would (the
// same sums in the same order): the bits do not depend on SPLIT. Called by every thread of the
// block; ends after a barrier (the tiles may be overwritten).
template <int HD, int SPLIT>
__device__ __forceinline__ void fa_chunk(bool f8, const fa_smem<HD> &sm, const uint4 *q, float *ssm, const void *__restrict__ kc,
                                         const void *__restrict__ vc, const float *__restrict__ ksg, const float *__restrict__ vsg,
                                         const int *__restrict__ btr, int base0, int pmax, int kvd, int kvh, int j, float scale,
                                         const int prow[2], float m[2], float l[2], float o[fa_ndt<HD, SPLIT>()][4]) {
    static_assert(FA_KT % (16 * SPLIT) == 0, "a warp's keys: whole 16-key steps of the tile");
    constexpr int NKT = FA_KT / 8 / SPLIT, NDT = fa_ndt<HD, SPLIT>();   // the warp's key n-tiles, dim n-tiles
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, ws = SPLIT > 1 ? (threadIdx.x / WARP) % SPLIT : 0;
    const bool dims = (ws + 1) * NDT <= HD / 8;   // the warp has dims of O
    const int ntiles = (min(GPU_ATT_CHUNK, pmax - base0 + 1) + FA_KT - 1) / FA_KT;
#pragma unroll
    for (int r = 0; r < 2; r++) m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int n = 0; n < NDT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.f;
    fa_load<HD>(f8, sm.k, sm.ks, kc, ksg, btr, base0, pmax, kvd, kvh, j);
    mm_cp_commit();
    fa_load<HD>(f8, sm.v, sm.vs, vc, vsg, btr, base0, pmax, kvd, kvh, j);
    mm_cp_commit();
    for (int it = 0; it < ntiles; it++) {
        const int base = base0 + it * FA_KT;
        mm_cp_wait<1>();   // this tile's keys (its values may still be on the way)
        __syncthreads();
        float sq[NKT][4];   // the warp's scores
#pragma unroll
        for (int n = 0; n < NKT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sq[n][e] = 0.f;
#pragma unroll(SPLIT > 1 ? 4 : 1)
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[FA_P][4];
#pragma unroll
            for (int p = 0; p < FA_P; p++) {
                const uint4 f = q[(kk * FA_P + p) * WARP + lane];
                a[p][0] = f.x, a[p][1] = f.y, a[p][2] = f.z, a[p][3] = f.w;
            }
            constexpr int GQ = NKT / 2 >= 2 ? 2 : 1;   // key n-tile pairs per group of interleaved chains
#pragma unroll
            for (int nb2 = 0; nb2 < NKT / 2; nb2 += GQ) {
                uint32_t b[2 * GQ][2];
#pragma unroll
                for (int u = 0; u < GQ; u++) {
                    uint32_t r[4];
                    const int mi = lane >> 3, nb = ws * (NKT / 2) + nb2 + u;
                    fa_ldm(r, sm.k + fa_at<HD>(nb * 16 + (mi >> 1) * 8 + (lane & 7), kk * 2 + (mi & 1)));
                    b[2 * u][0] = r[0], b[2 * u][1] = r[1], b[2 * u + 1][0] = r[2], b[2 * u + 1][1] = r[3];
                }
                fa_mma3<2 * GQ>(sq + 2 * nb2, a, b);
            }
        }
        // scores: scaled, masked past each row's position
        float s[FA_KT / 8][4];
#pragma unroll
        for (int n = 0; n < NKT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = (ws * NKT + n) * 8 + 2 * t + (e & 1), r = e >> 1;
                float v = f8 ? __fmul_rn(__fmul_rn(sq[n][e], sm.ks[key]), scale) : __fmul_rn(sq[n][e], scale);
                v = base + key <= prow[r] ? v : -INFINITY;
                if (SPLIT > 1) ssm[(g + 8 * r) * FA_KT + key] = v;
                else s[n][e] = v;
            }
        __syncthreads();   // every warp's keys (and key scales) read; the scores in shared memory
        if (SPLIT > 1)     // the whole tile's scores, in the lane's places of a one-warp tile
#pragma unroll
            for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = ssm[(g + 8 * (e >> 1)) * FA_KT + n * 8 + 2 * t + (e & 1)];
        float mx[2], cf[2], mu[2];
        fa_tile_max(s, mx);
        if (it + 1 < ntiles) fa_load<HD>(f8, sm.k, sm.ks, kc, ksg, btr, base + FA_KT, pmax, kvd, kvh, j);
        mm_cp_commit();
        fa_tile_shift(mx, m, mu, cf);
        mm_cp_wait<1>();   // this tile's values
        __syncthreads();
        fa_tile_p(f8, s, sm.vs + 2 * t, mu, cf, l);
#pragma unroll
        for (int n = 0; n < NDT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[n][e] = __fmul_rn(o[n][e], cf[e >> 1]);
#pragma unroll
        for (int kk = 0; kk < FA_KT / 16; kk++) {
            uint32_t a[FA_P][4];
            fa_afrag(make_float2(s[2 * kk][0], s[2 * kk][1]), make_float2(s[2 * kk][2], s[2 * kk][3]), make_float2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                     make_float2(s[2 * kk + 1][2], s[2 * kk + 1][3]), a);
            constexpr int GP = NDT / 2 >= 2 ? 2 : 1;   // dim n-tile pairs per group of interleaved chains
#pragma unroll
            for (int nb2 = 0; nb2 < NDT / 2; nb2 += GP) {
                if (!dims) break;
                uint32_t b[2 * GP][2];
#pragma unroll
                for (int u = 0; u < GP; u++) {
                    uint32_t r[4];
                    const int mi = lane >> 3, nb = ws * (NDT / 2) + nb2 + u;
                    fa_ldm_t(r, sm.v + fa_at<HD>(kk * 16 + (mi & 1) * 8 + (lane & 7), nb * 2 + (mi >> 1)));
                    b[2 * u][0] = r[0], b[2 * u][1] = r[1], b[2 * u + 1][0] = r[2], b[2 * u + 1][1] = r[3];
                }
                fa_mma3<2 * GP>(o + 2 * nb2, a, b);
            }
        }
        __syncthreads();   // every warp's values (and value scales) read
        if (it + 1 < ntiles) fa_load<HD>(f8, sm.v, sm.vs, vc, vsg, btr, base + FA_KT, pmax, kvd, kvh, j);
        mm_cp_commit();
    }
    mm_cp_wait<0>();   // nothing left in flight into the tiles
    __syncthreads();
}

// The lane's rows for tokens [tok0, te) of the warp (G heads each, ⌊16 / G⌋ tokens), KV head j.
__device__ __forceinline__ fa_rows fa_lane_rows(const int *__restrict__ tok_pos, int G, int tpw, int tok0, int te, int j) {
    fa_rows rw;
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = g + 8 * r, tk = tok0 + row / G;
        const bool ok = row < tpw * G && tk < te;
        rw.tok[r] = tk, rw.head[r] = j * G + row % G, rw.pos[r] = ok ? tok_pos[tk] : -1;
    }
    return rw;
}

// The fold of chunk c's state (m, l, and o: the lane's NDT dim n-tiles from n-tile n0, C fragments of rows g, g + 8)
// into the running one of the lane's rows rw (M, L; O kept in out = core, f32), and in the last chunk the rows' dims
// gated in place (att_out: their bf16 parts into xs, ss elements apart). dims: the lane has dims of O. k_fa's walk and
// k_fa_w (flash_w.cu) both fold so.
template <int HD, int NDT>
__device__ __forceinline__ void fa_fold(const float *__restrict__ proj, float *__restrict__ out, __nv_bfloat16 *__restrict__ xs, size_t ss, int nh,
                                        const fa_rows &rw, int n0, bool dims, int c, bool last, float M[2], float L[2], const float m[2],
                                        const float l[2], const float (*o)[4]) {
    constexpr int FG = NDT >= 4 ? 4 : NDT;   // (NDT: 2, 4, 16 or 32)
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rw.pos[r] < 0) continue;
        const float Mo = M[r], Lo = L[r];   // the running state before this chunk
        float Mn = Mo, Ln = Lo, dummy = 0.f;
        att_fold(Mn, Ln, dummy, m[r], l[r], 0.f);
        M[r] = Mn, L[r] = Ln;
        if (!dims) continue;
        const size_t row = (size_t)rw.tok[r] * nh * HD + (size_t)rw.head[r] * HD;
        const float *gate = proj + (size_t)rw.tok[r] * 2 * nh * HD + (size_t)rw.head[r] * 2 * HD + HD;
#pragma unroll
        for (int n = 0; n < NDT; n++) {
            const int d = (n0 + n) * 8 + 2 * t;   // the lane's dims d, d + 1 (8-byte aligned: HD and d even)
            float2 run = c ? *(const float2 *)(out + row + d) : make_float2(0.f, 0.f);   // the running O, kept in core
            float Mr = Mo, Lr = Lo;
            att_fold(Mr, Lr, run.x, m[r], l[r], o[n][2 * r]);
            Mr = Mo, Lr = Lo;
            att_fold(Mr, Lr, run.y, m[r], l[r], o[n][2 * r + 1]);
            *(float2 *)(out + row + d) = run;
        }
        if (last)   // the last chunk: the lane's dims of the row gated, in place, FG n-tiles' gates and O loaded together
#pragma unroll 1    // (one round trip a group: a load a dim made a chain of dependent loads as long as the lane's dims)
            for (int n1 = 0; n1 < NDT; n1 += FG) {
                float2 gv[FG], ov[FG];
#pragma unroll
                for (int n = 0; n < FG; n++) {
                    const int d = (n0 + n1 + n) * 8 + 2 * t;
                    gv[n] = *(const float2 *)(gate + d), ov[n] = *(const float2 *)(out + row + d);
                }
#pragma unroll
                for (int n = 0; n < FG; n++) {
                    const int d = (n0 + n1 + n) * 8 + 2 * t;
                    att_out(out, xs, row + d, ss, (ov[n].x / Ln) * sigm(gv[n].x));
                    att_out(out, xs, row + d + 1, ss, (ov[n].y / Ln) * sigm(gv[n].y));
                }
            }
    }
}

// The walk (see the top; out = core): the block's token tile, every chunk in order. Warps in
// pairs (GPU_FA_WALK_SPLIT) share a tile of 16 rows: half the keys' scores and half the dims each.
template <int HD>
__device__ void fa_walk(bool f8, const float *__restrict__ proj, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                        const int *__restrict__ bt, int bt_stride, const void *__restrict__ kc, const void *__restrict__ vc,
                        const float *__restrict__ ks, const float *__restrict__ vs, float *__restrict__ out, int nh, int kvh, float scale,
                        __nv_bfloat16 *__restrict__ xs, int T) {
    constexpr int S = GPU_FA_WALK_SPLIT, NDT = fa_ndt<HD, S>();
    const int nq = blockDim.x / WARP / S, w = threadIdx.x / WARP, qt = w / S, ws = w % S, G = nh / kvh, j = blockIdx.y;
    const int tpq = 16 / G, t0 = blockIdx.x * nq * tpq, tend = min(T, t0 + nq * tpq), kvd = kvh * HD;   // tokens per row tile, the block's
    const bool dims = (ws + 1) * NDT <= HD / 8;                                                         // the warp has dims of O
    const size_t ss = (size_t)T * nh * HD;                                                              // between xs's parts
    const fa_smem<HD> sm(nq);
    uint4 *q = sm.q + (size_t)qt * (HD / 16) * FA_P * WARP;
    float *ssm = sm.s + (size_t)qt * 16 * FA_KT;
    for (int ts = t0; ts < tend;) {   // each run of one sequence's tokens
        const int slot = tok_slot[ts];
        int te = ts + 1, pmax = tok_pos[ts];
        while (te < tend && tok_slot[te] == slot) pmax = max(pmax, tok_pos[te]), te++;
        const int *btr = bt + (size_t)slot * bt_stride, tok0 = ts + qt * tpq;
        const fa_rows rw = fa_lane_rows(tok_pos, G, tpq, tok0, te, j);
        if (ws == 0) fa_stage_q<HD>(q, (float *)sm.k + (size_t)qt * 16 * HD, proj, nh, G, tpq, tok0, te, j);   // the tiles' room as scratch
        __syncthreads();   // every tile's queries split (and seen by its warps) before the tiles are loaded over the scratch
        float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.f, 0.f};
        const int c1 = pmax / GPU_ATT_CHUNK + 1;
        for (int c = 0; c < c1; c++) {
            float m[2], l[2], o[NDT][4];
            fa_chunk<HD, S>(f8, sm, q, ssm, kc, vc, ks, vs, btr, c * GPU_ATT_CHUNK, pmax, kvd, kvh, j, scale, rw.pos, m, l, o);
            fa_fold<HD, NDT>(proj, out, xs, ss, nh, rw, ws * NDT, dims, c, c + 1 == c1, M, L, m, l, o);
        }
        ts = te;
    }
}

// The split (see the top; out = part [T, nh, nc, hd + 2]): token blockIdx.x's chunk blockIdx.z,
// GPU_FA_SPLIT_W warps sharing its rows.
template <int HD>
__device__ void fa_split(bool f8, const float *__restrict__ proj, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                         const int *__restrict__ bt, int bt_stride, const void *__restrict__ kc, const void *__restrict__ vc,
                         const float *__restrict__ ks, const float *__restrict__ vs, float *__restrict__ out, int nc, int nh, int kvh,
                         float scale) {
    constexpr int S = GPU_FA_SPLIT_W, NDT = fa_ndt<HD, S>();
    const int tk = blockIdx.x, j = blockIdx.y, c = blockIdx.z, G = nh / kvh, w = threadIdx.x / WARP, t = threadIdx.x & 3, p = tok_pos[tk];
    if (c * GPU_ATT_CHUNK > p) return;   // a chunk past the token
    const fa_smem<HD> sm(1);
    const fa_rows rw = fa_lane_rows(tok_pos, G, 1, tk, tk + 1, j);
    fa_stage_q_block<HD>(sm.q, (float *)sm.k, proj, nh, G, tk, j);
    __syncthreads();   // the queries split (and seen by all) before the tiles are loaded over the scratch
    float m[2], l[2], o[NDT][4];
    fa_chunk<HD, S>(f8, sm, sm.q, sm.s, kc, vc, ks, vs, bt + (size_t)tok_slot[tk] * bt_stride, c * GPU_ATT_CHUNK, p, kvh * HD, kvh, j, scale, rw.pos,
                    m, l, o);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rw.pos[r] < 0) continue;
        float *dst = out + (((size_t)tk * nh + rw.head[r]) * nc + c) * (HD + 2);
        if (w == 0 && t == 0) dst[0] = m[r], dst[1] = l[r];
        if ((w + 1) * NDT <= HD / 8)   // the warp's dims
#pragma unroll
            for (int n = 0; n < NDT; n++) *(float2 *)(dst + 2 + (w * NDT + n) * 8 + 2 * t) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    }
}

// k_fa: fp8 (else bf16) cache; hd ∈ {32, 64, 256} (gpu_fa_warps); nc = 0 the walk, else the split.
extern "C" __global__ void __launch_bounds__((GPU_FA_WALK_W > GPU_FA_SPLIT_W ? GPU_FA_WALK_W : GPU_FA_SPLIT_W) * 32)
    k_fa(const float *proj, const int *tok_pos, const int *tok_slot, const int *bt, int bt_stride, const void *kc, const void *vc, const float *ks,
         const float *vs, float *out, int nc, int nh, int kvh, int hd, float scale, __nv_bfloat16 *xs, int T, int fp8) {
    GPU_DEP();
#define FA_FORMS(H)                                                                                                                 \
    if (nc) fa_split<H>(fp8, proj, tok_pos, tok_slot, bt, bt_stride, kc, vc, ks, vs, out, nc, nh, kvh, scale);                      \
    else fa_walk<H>(fp8, proj, tok_pos, tok_slot, bt, bt_stride, kc, vc, ks, vs, out, nh, kvh, scale, xs, T);
    switch (hd) {
    case 32: FA_FORMS(32) break;
    case 64: FA_FORMS(64) break;
    default: FA_FORMS(256) break;
    }
#undef FA_FORMS
}
