// sass/mm.cu — the tensor-core products (sass/mm.cuh): the dense ones (k_mm1, k_mm4), the routed
// experts grouped by expert (k_moe_sort, k_moe_up1/2, k_moe_dn1/4), and the activations' split
// into three bf16 parts they read (k_mm_split).
//
// CPU twins: ref_linear (k_mm*), ref_moe_gate_up and ref_moe_down (k_moe_up*, k_moe_dn*), and
// k_mm_split's parts add back to the f32 input (moet.c). The digit is the row tiles of 16 per
// block (RT): a launch takes 1 for steps of up to GPU_MM_TOK tokens (more blocks for the
// bandwidth) and the larger one beyond (each token tile's activations reused over more rows);
// the sums do not depend on it.
//
// Launch (gpu/launch.c): block GPU_MM_NT threads (GPU_MM_WARPS warps, one slice of k each).
//   k_mm_split: grid ceil(T·K / 4 / GPU_MM_NT), a thread per 4 elements.
//   k_mmRT:  grid (Σ_i ceil(O_i / 16RT), ceil(T / GPU_MM_TOK)); set.first[] in blocks of 16RT rows.
//   k_moe_sort: one block of GPU_MOE_SORT_NT threads.
//   k_moe_upRT: grid (items bound, I / 16RT); k_moe_dnRT: grid (items bound, H / 16RT). A block
//   past the step's item count returns at once.
#include "mm.cuh"

// The dynamic shared memory of the kernels that stage activations (k_mm_v, k_moe_up_d, k_moe_dn_d).
extern __shared__ __align__(16) unsigned char mm_smem[];

extern "C" __global__ void __launch_bounds__(GPU_MM_NT) k_mm_split(const float *__restrict__ x, int ldx, int K, int T,
                                                                   __nv_bfloat16 *__restrict__ xs) {
    long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4, n = (long long)T * K;
    if (i >= n) return;
    long long t = i / K, k = i % K;   // K % 64 == 0: the four elements are one token's
    float4 v = *(const float4 *)(x + t * ldx + k);
    size_t ss = (size_t)n;
    mm_split3(v.x, xs + i, ss), mm_split3(v.y, xs + i + 1, ss), mm_split3(v.z, xs + i + 2, ss), mm_split3(v.w, xs + i + 3, ss);
}

// ---- dense: y_i[t, o] = post_i · Σ_k W_i[o, k] · x[t, k] for the set's matrices ------------------

template <int RT, int NT, int U, bool ONE>
__device__ __forceinline__ void mm_dense(const gpu_lin_set &set, const __nv_bfloat16 *__restrict__ xs, int T) {
    __shared__ uint32_t lut[16];
    __shared__ float red[mm_red<RT, NT, ONE>::floats];
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    const int K = W.cols, base = ((int)blockIdx.x - set.first[m]) * RT * 16, t0 = blockIdx.y * 8 * NT;
    const int g = (threadIdx.x & 31) >> 2;
    const int nact = min(NT, (T - t0 + 7) / 8), ntok = min(8 * NT, T - t0);
    int row0[RT], brow[NT];
#pragma unroll
    for (int i = 0; i < RT; i++) row0[i] = base + 16 * i;
#pragma unroll
    for (int n = 0; n < NT; n++) brow[n] = t0 + 8 * n + g < T ? t0 + 8 * n + g : -1;
    mm_plane_lut(lut);
    __syncthreads();
    float acc[RT][NT][4];
    mm_any<1, RT, NT, U>(&W, row0, K, xs, (size_t)T * K, brow, nact, lut, acc);
    mm_reduce<RT, NT, ONE>(acc, red, nact);
    float *__restrict__ y = (float *)set.y[m];
    const int ldy = set.ldy[m];
    const float post = mm_post(W);
    for (int e = threadIdx.x; e < RT * 16 * ntok; e += blockDim.x) {
        int mm = e / (RT * 16), rr = e % (RT * 16), row = base + rr;
        if (row < W.rows) y[(size_t)(t0 + mm) * ldy + row] = mm_at<RT, NT, ONE>(red, rr / 16, rr % 16, mm) * post;
    }
}

// The three shapes of a launch (gpu_k_mm picks by T): _d decode (T ≤ 8: one n-tile, four
// 64-blocks in flight per warp), _b batches (T ≤ GPU_MM_TOK_B: four n-tiles), _p prefill (four row
// tiles per warp: the activations reused over 64 rows).
#define MM_DENSE(name, RT, NT, U, ONE)                                                                                     \
    extern "C" __global__ void __launch_bounds__(GPU_MM_NT) name(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) { \
        mm_dense<RT, NT, U, ONE>(set, xs, T);                                                                              \
    }
MM_DENSE(k_mm_d, 1, 1, 4, true)
MM_DENSE(k_mm_b, 1, 4, 2, true)
MM_DENSE(k_mm_p, 2, 4, 1, false)

// ---- decode: a few tokens, each block streaming a run of row tiles ------------------------------
//
// k_mm_v (T ≤ GPU_MM_TOK_V): the tokens' parts are copied into shared memory once per block
// (dynamic: GPU_MM_SPLITS·T·K bf16), then the block walks row tiles first[m] + set.pad[0]·(its
// index within matrix m) onward (set.pad[0] tiles per block). Each warp keeps GPU_MM_RING of its
// (tile, 64-block) steps' weights in flight across tile boundaries, so the loads of the next tile
// are on their way while the warps' sums of this one meet in shared memory (double-buffered: one
// barrier per tile). The same steps and order as mm_core: the same bits as every other shape.
template <int KIND>
__device__ __forceinline__ void mm_stream(const gpu_mat &W, int tile0, int ntile, const __nv_bfloat16 *xsm, int T, float *red,
                                          const uint32_t *lut, float *__restrict__ y, int ldy) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int K = W.cols, KB = K / 64, nk = (KB + GPU_MM_WARPS - 1) / GPU_MM_WARPS, njob = ntile * nk;
    const float post = mm_post(W);
    const bool tok = g < T;   // this lane's B column holds a token
    mm_raw ring[GPU_MM_RING][1];
#pragma unroll
    for (int u = 0; u < GPU_MM_RING; u++) {
        int kb = w + GPU_MM_WARPS * (u % nk);
        if (u < njob && kb < KB) mm_load<KIND>(W, 16 * (tile0 + u / nk), kb, g, t, ring[u][0]);
    }
    float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
    for (int j0 = 0; j0 < njob; j0 += GPU_MM_RING) {
#pragma unroll
        for (int u = 0; u < GPU_MM_RING; u++) {
            const int j = j0 + u;
            if (j < njob) {   // uniform over the block: every warp has the same steps
                const int kb = w + GPU_MM_WARPS * (j % nk);
                if (kb < KB) {
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int ko = kb * 64 + (KIND == GPU_W_PLANES ? 16 * q + 4 * t : 16 * t + 4 * q);
                        uint2 b[GPU_MM_SPLITS];
#pragma unroll
                        for (int s = 0; s < GPU_MM_SPLITS; s++)
                            b[s] = tok ? *(const uint2 *)(xsm + ((size_t)s * T + g) * K + ko) : make_uint2(0, 0);
                        uint32_t a[4];
                        mm_widen<KIND>(ring[u][0], q, lut, a);
                        float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                        for (int s = GPU_MM_SPLITS - 1; s >= 0; s--) mm_mma(c, a, b[s].x, b[s].y);
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[0][0][e] += c[e];
                    }
                }
                const int jn = j + GPU_MM_RING, kn = w + GPU_MM_WARPS * (jn % nk);
                if (jn < njob && kn < KB) mm_load<KIND>(W, 16 * (tile0 + jn / nk), kn, g, t, ring[u][0]);
                if (j % nk == nk - 1) {   // the tile's last step: the warps' sums meet
                    const int ti = j / nk;
                    float *rb = red + (ti & 1) * GPU_MM_WARPS * 128;
#pragma unroll
                    for (int c = 0; c < 4; c++) rb[(w * 4 + c) * 32 + lane] = acc[0][0][c], acc[0][0][c] = 0.f;
                    __syncthreads();
                    const int e = threadIdx.x, r = e & 15, m = e >> 4, row = 16 * (tile0 + ti) + r;
                    if (m < T && row < W.rows) y[(size_t)m * ldy + row] = mm_at<1, 1, true>(rb, 0, r, m) * post;
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(GPU_MM_NT) k_mm_v(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    __shared__ uint32_t lut[16];
    __shared__ float red[2 * GPU_MM_WARPS * 128];
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    const int K = W.cols, per = set.pad[0], ntile_all = (W.rows + 15) / 16;
    const int tile0 = ((int)blockIdx.x - set.first[m]) * per, ntile = min(per, ntile_all - tile0);
    __nv_bfloat16 *xsm = (__nv_bfloat16 *)mm_smem;
    const int n16 = GPU_MM_SPLITS * T * K / 8;   // 16-byte pieces (K % 64 == 0)
    for (int i = threadIdx.x; i < n16; i += blockDim.x) ((uint4 *)xsm)[i] = __ldg((const uint4 *)xs + i);
    mm_plane_lut(lut);
    __syncthreads();
    float *__restrict__ y = (float *)set.y[m];
    switch (W.kind) {
    case GPU_W_FP8: mm_stream<GPU_W_FP8>(W, tile0, ntile, xsm, T, red, lut, y, set.ldy[m]); break;
    case GPU_W_NVFP4: mm_stream<GPU_W_NVFP4>(W, tile0, ntile, xsm, T, red, lut, y, set.ldy[m]); break;
    case GPU_W_BF16: mm_stream<GPU_W_BF16>(W, tile0, ntile, xsm, T, red, lut, y, set.ldy[m]); break;
    default: mm_stream<GPU_W_PLANES>(W, tile0, ntile, xsm, T, red, lut, y, set.ldy[m]); break;
    }
}

// ---- the routed experts, grouped by expert ------------------------------------------------------
//
// map (int32, gpu/launch.c: gpu_moe_map_ints): [0] the number of items; then items of 3 ints
// (expert x, first position in perm, count ≤ GPU_MM_TOK), in ascending x; then perm [P]: the
// pairs p = t·K + k sorted by expert. The order of pairs inside one expert's list varies from run
// to run (atomic counters); no result depends on it: each pair's sums are its own column of the
// products, whatever tile it shares.

extern "C" __global__ void __launch_bounds__(GPU_MOE_SORT_NT) k_moe_sort(const int *__restrict__ sel, int P, int E, int *__restrict__ map,
                                                                         int items_bound) {
    __shared__ int cnt[GPU_ROUTER_MAX_E], pos[GPU_ROUTER_MAX_E], ib[GPU_ROUTER_MAX_E], fill[GPU_ROUTER_MAX_E];
    __shared__ int wsum[2][32];
    for (int x = threadIdx.x; x < E; x += blockDim.x) cnt[x] = 0, fill[x] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[sel[p]], 1);
    __syncthreads();
    // exclusive scans of the counts and of the items per expert (E ≤ blockDim.x: one each)
    const int x = threadIdx.x, lane = x & 31, w = x >> 5;
    int c = x < E ? cnt[x] : 0, it = (c + GPU_MM_TOK - 1) / GPU_MM_TOK;
    int sc = c, si = it;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int a = __shfl_up_sync(0xffffffffu, sc, o), b = __shfl_up_sync(0xffffffffu, si, o);
        if (lane >= o) sc += a, si += b;
    }
    if (lane == 31) wsum[0][w] = sc, wsum[1][w] = si;
    __syncthreads();
    int oc = 0, oi = 0;
    for (int v = 0; v < w; v++) oc += wsum[0][v], oi += wsum[1][v];
    if (x < E) pos[x] = oc + sc - c, ib[x] = oi + si - it;
    if (x == blockDim.x - 1) map[0] = oi + si;
    __syncthreads();
    int *items = map + 1, *perm = map + 1 + 3 * items_bound;
    if (x < E)
        for (int j = 0; j < it; j++) {
            int *q = items + 3 * (ib[x] + j);
            q[0] = x, q[1] = pos[x] + j * GPU_MM_TOK, q[2] = min(GPU_MM_TOK, c - j * GPU_MM_TOK);
        }
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        int e = sel[p];
        perm[pos[e] + atomicAdd(&fill[e], 1)] = p;
    }
}

// h[p] = SiLU(gate_x · xn[t]) · (up_x · xn[t]) for the item's pairs p (t = p / K), rows
// [16RT·blockIdx.y, +16RT) of both, written as its three bf16 parts hs [3][P][I] (what k_moe_dn reads).
// An item holds at most 8·NT pairs (the _d shapes: every item when P ≤ 8).
template <int RT, int NT, int U, bool ONE>
__device__ __forceinline__ void moe_up(const gpu_mat *__restrict__ experts, const int *__restrict__ map, int items_bound, int K,
                                       const __nv_bfloat16 *__restrict__ xs, int T, __nv_bfloat16 *__restrict__ hs, int I) {
    __shared__ uint32_t lut[16];
    __shared__ float red[mm_red<2 * RT, NT, ONE>::floats];
    if ((int)blockIdx.x >= map[0]) return;
    const int *item = map + 1 + 3 * blockIdx.x, *perm = map + 1 + 3 * items_bound;
    const int x = item[0], first = item[1], cnt = item[2], P = T * K;
    const gpu_mat M[2] = {experts[3 * x], experts[3 * x + 1]};
    const int H = M[0].cols, base = blockIdx.y * RT * 16, g = (threadIdx.x & 31) >> 2;
    const int nact = (cnt + 7) / 8;
    int row0[RT], brow[NT];
#pragma unroll
    for (int i = 0; i < RT; i++) row0[i] = base + 16 * i;
    float acc[2 * RT][NT][4];
    if (NT == 1) {   // _d: the item's tokens (≤ 8, distinct) staged in shared memory, [3][cnt][H]
        __nv_bfloat16 *xl = (__nv_bfloat16 *)mm_smem;
        mm_stage(xl, xs, (size_t)T * H, H, cnt, [&](int j) { return perm[first + j] / K; });
        brow[0] = g < cnt ? g : -1;
        mm_plane_lut(lut);
        __syncthreads();
        mm_any<2, RT, NT, U, true>(M, row0, H, xl, (size_t)cnt * H, brow, nact, lut, acc);
    } else {
#pragma unroll
        for (int n = 0; n < NT; n++) brow[n] = 8 * n + g < cnt ? perm[first + 8 * n + g] / K : -1;
        mm_plane_lut(lut);
        __syncthreads();
        mm_any<2, RT, NT, U>(M, row0, H, xs, (size_t)T * H, brow, nact, lut, acc);
    }
    mm_reduce<2 * RT, NT, ONE>(acc, red, nact);
    const float pg = mm_post(M[0]), pu = mm_post(M[1]);
    for (int e = threadIdx.x; e < RT * 16 * cnt; e += blockDim.x) {
        int m = e / (RT * 16), rr = e % (RT * 16), row = base + rr;
        float gv = mm_at<2 * RT, NT, ONE>(red, rr / 16, rr % 16, m) * pg, uv = mm_at<2 * RT, NT, ONE>(red, RT + rr / 16, rr % 16, m) * pu;
        mm_split3(silu(gv) * uv, hs + (size_t)perm[first + m] * I + row, (size_t)P * I);
    }
}

// ye[p, j] = down_x[j] · h[p] for the item's pairs p, rows j in [16RT·blockIdx.y, +16RT).
template <int RT, int NT, int U, bool ONE>
__device__ __forceinline__ void moe_dn(const gpu_mat *__restrict__ experts, const int *__restrict__ map, int items_bound,
                                       const __nv_bfloat16 *__restrict__ hs, int P, float *__restrict__ ye, int H) {
    __shared__ uint32_t lut[16];
    __shared__ float red[mm_red<RT, NT, ONE>::floats];
    if ((int)blockIdx.x >= map[0]) return;
    const int *item = map + 1 + 3 * blockIdx.x, *perm = map + 1 + 3 * items_bound;
    const int x = item[0], first = item[1], cnt = item[2];
    const gpu_mat D = experts[3 * x + 2];
    const int I = D.cols, base = blockIdx.y * RT * 16, g = (threadIdx.x & 31) >> 2;
    const int nact = (cnt + 7) / 8;
    int row0[RT], brow[NT];
#pragma unroll
    for (int i = 0; i < RT; i++) row0[i] = base + 16 * i;
    float acc[RT][NT][4];
    if (NT == 1) {   // _d: the item's pairs' h (≤ 8) staged in shared memory, [3][cnt][I]
        __nv_bfloat16 *hl = (__nv_bfloat16 *)mm_smem;
        mm_stage(hl, hs, (size_t)P * I, I, cnt, [&](int j) { return perm[first + j]; });
        brow[0] = g < cnt ? g : -1;
        mm_plane_lut(lut);
        __syncthreads();
        mm_any<1, RT, NT, U, true>(&D, row0, I, hl, (size_t)cnt * I, brow, nact, lut, acc);
    } else {
#pragma unroll
        for (int n = 0; n < NT; n++) brow[n] = 8 * n + g < cnt ? perm[first + 8 * n + g] : -1;
        mm_plane_lut(lut);
        __syncthreads();
        mm_any<1, RT, NT, U>(&D, row0, I, hs, (size_t)P * I, brow, nact, lut, acc);
    }
    mm_reduce<RT, NT, ONE>(acc, red, nact);
    const float post = mm_post(D);
    for (int e = threadIdx.x; e < RT * 16 * cnt; e += blockDim.x) {
        int m = e / (RT * 16), rr = e % (RT * 16), row = base + rr;
        if (row < H) ye[(size_t)perm[first + m] * H + row] = mm_at<RT, NT, ONE>(red, rr / 16, rr % 16, m) * post;
    }
}

// The shapes (gpu_k_moe_up / gpu_k_moe_dn pick by P = T·K): _d when P ≤ 8 (an item has at most 8
// pairs; their activations are staged in dynamic shared memory: 2·GPU_MM_SPLITS·min(T, 8)·width
// bytes), _b up to GPU_MM_TOK_B pairs, _p beyond.
#define MOE_UP(name, RT, NT, U, ONE)                                                                                        \
    extern "C" __global__ void __launch_bounds__(GPU_MM_NT) name(const gpu_mat *__restrict__ experts, const int *__restrict__ map,   \
                                                                 int items_bound, int K, const __nv_bfloat16 *__restrict__ xs, int T, \
                                                                 __nv_bfloat16 *__restrict__ hs, int I) {                             \
        moe_up<RT, NT, U, ONE>(experts, map, items_bound, K, xs, T, hs, I);                                                    \
    }
MOE_UP(k_moe_up_d, 1, 1, 4, true)
MOE_UP(k_moe_up_b, 1, 4, 2, true)
MOE_UP(k_moe_up_p, 2, 4, 1, false)
#define MOE_DN(name, RT, NT, U, ONE)                                                                                        \
    extern "C" __global__ void __launch_bounds__(GPU_MM_NT) name(const gpu_mat *__restrict__ experts, const int *__restrict__ map,   \
                                                                 int items_bound, const __nv_bfloat16 *__restrict__ hs, int P,        \
                                                                 float *__restrict__ ye, int H) {                                     \
        moe_dn<RT, NT, U, ONE>(experts, map, items_bound, hs, P, ye, H);                                                       \
    }
MOE_DN(k_moe_dn_d, 1, 1, 4, true)
MOE_DN(k_moe_dn_b, 1, 4, 2, true)
MOE_DN(k_moe_dn_p, 2, 4, 1, false)
