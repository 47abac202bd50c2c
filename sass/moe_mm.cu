// sass/moe_mm.cu — the routed experts of one layer on the tensor cores (sass/mm.cuh), the step's
// (token, choice) pairs grouped by expert so each chosen expert's weights are read once per item
// of up to cap of its pairs (MODEL.md §3.6):
//   k_moe_sort: the pairs p = t·K + k of sel [T·K] grouped by expert into map (below); past
//     GPU_MOE_SORT_PB pairs its grouped form, k_moe_hist then k_moe_place, the same items
//   k_moe_up_*: hs = the bf16 parts of h[p, i] = SiLU(gate_x[i] · xn[t]) · (up_x[i] · xn[t]), i < I
//   k_moe_dn_*: ye[p, j] = down_x[j] · h[p], j < H
// (k_moe_combine, sass/moe.cu, then adds a token's choices and the shared expert.)
// CPU twins: ref_moe_gate_up, ref_moe_down (moet.c: one expert over the tokens that chose it).
//
// Launch (gpu/launch.c: gpu_k_moe_sort, gpu_k_moe_up, gpu_k_moe_dn): k_moe_sort one block of
// GPU_MOE_SORT_NT threads (k_moe_hist, k_moe_place: a block of GPU_MOE_SORT_PB pairs each); the others block GPU_MM_NT, grid (items bound, ceil(I or H / 16RT / nrb)):
// a block past the step's item count returns at once; a block of _d (or _dg4: 2-bit planes alone,
// gpu_kernels.moe_dg; at nrb 1 _d1, _dg1) takes nrb row blocks (gpu_moe_nrb), _p one. The shape is picked by P = T·K, the same bits in each:
// _d when P ≤ GPU_MM_TOK_B or up to GPU_MOE_D_PPE pairs per expert (items of ≤ GPU_MOE_CAP_D pairs, whose activations are staged in dynamic
// shared memory; k_moe_dn_d four row tiles per warp), _g beyond for planes and NVFP4 experts where
// its shared memory fits (items of ≤ GPU_MMG_BN pairs, mm.cuh: mmg_run; grid (items bound, ceil(I / (GPU_MMG_BM / 2))) for up,
// (items bound, ceil(H / GPU_MMG_BM)) for down), else _p (items of ≤ GPU_MM_TOK pairs).
#include "mm.cuh"

// ---- the routed experts, grouped by expert ------------------------------------------------------
//
// map (int32, gpu/launch.c: gpu_moe_map_ints): [0] the number of items; then items of 3 ints
// (expert x, first position in perm, count ≤ cap: GPU_MOE_CAP_D pairs for the _d shape, GPU_MM_TOK
// for _p), in ascending x; then perm [P]: the pairs p = t·K + k sorted by expert; then (the grouped
// form's) hist [⌈P / GPU_MOE_SORT_PB⌉][E]. The order of pairs inside one expert's list varies from
// run to run (atomic counters); no result depends on it: each pair's sums are its own column of the
// products, whatever tile it shares.

// Thread x's exclusive prefix sums over the block of c and it (x < E: expert x's pairs and items; the rest hold zeros)
// into oc, oi, and its inclusive one of it into ti (the last thread's: the items in all). wsum: the warps' sums (one
// barrier inside).
__device__ __forceinline__ void moe_sort_scan(int c, int it, int (&wsum)[2][32], int &oc, int &oi, int &ti) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int sc = c, si = it;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int a = __shfl_up_sync(0xffffffffu, sc, o), b = __shfl_up_sync(0xffffffffu, si, o);
        if (lane >= o) sc += a, si += b;
    }
    if (lane == 31) wsum[0][w] = sc, wsum[1][w] = si;
    __syncthreads();
    int ac = 0, ai = 0;
    for (int v = 0; v < w; v++) ac += wsum[0][v], ai += wsum[1][v];
    oc = ac + sc - c, oi = ai + si - it, ti = ai + si;
}

// Expert x's items (its c pairs from position pos in runs of up to cap, the first item ib) into map's items.
__device__ __forceinline__ void moe_sort_items(int *__restrict__ items, int x, int c, int it, int pos, int ib, int cap) {
    for (int j = 0; j < it; j++) {
        int *q = items + 3 * (ib + j);
        q[0] = x, q[1] = pos + j * cap, q[2] = min(cap, c - j * cap);
    }
}

// The block's work (GPU_MOE_SORT_NT threads; k_route, sass/route.cu, runs it too, U 1: a pair an
// iteration, its few tokens' pairs one round each). Each of the two passes over sel reads U pairs a
// thread at a time, every load in flight before the first atomic that needs one (pairs p0 + u ·
// blockDim.x: coalesced), so a prompt's 65,536 pairs cost 64 / U round trips a pass instead of 64.
// DROP: a pair whose expert is E or past it (k_moe_split's) is counted nowhere and placed nowhere.
template <int U, bool DROP = false>
__device__ __forceinline__ void moe_sort_block(const int *__restrict__ sel, int P, int E, int *__restrict__ map, int items_bound, int cap) {
    __shared__ int cnt[GPU_ROUTER_MAX_E], pos[GPU_ROUTER_MAX_E], ib[GPU_ROUTER_MAX_E], fill[GPU_ROUTER_MAX_E];
    __shared__ int wsum[2][32];
    for (int x = threadIdx.x; x < E; x += blockDim.x) cnt[x] = 0, fill[x] = 0;
    __syncthreads();
    for (int p0 = threadIdx.x; p0 < P; p0 += U * blockDim.x) {
        int e[U];
#pragma unroll
        for (int u = 0; u < U; u++) e[u] = U == 1 || p0 + u * (int)blockDim.x < P ? sel[p0 + u * (int)blockDim.x] : 0;
#pragma unroll
        for (int u = 0; u < U; u++)
            if ((U == 1 || p0 + u * (int)blockDim.x < P) && (!DROP || e[u] < E)) atomicAdd(&cnt[e[u]], 1);
    }
    __syncthreads();
    // exclusive scans of the counts and of the items per expert (E ≤ blockDim.x: one each; moe_sort_scan's sums, written
    // out here: with the call ptxas spills 12 bytes more of k_route, which runs this at every decode step)
    const int x = threadIdx.x, lane = x & 31, w = x >> 5;
    int c = x < E ? cnt[x] : 0, it = (c + cap - 1) / cap;
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
    if (x < E) moe_sort_items(items, x, c, it, pos[x], ib[x], cap);
    for (int p0 = threadIdx.x; p0 < P; p0 += U * blockDim.x) {
        int e[U];
#pragma unroll
        for (int u = 0; u < U; u++) e[u] = U == 1 || p0 + u * (int)blockDim.x < P ? sel[p0 + u * (int)blockDim.x] : 0;
#pragma unroll
        for (int u = 0; u < U; u++)
            if ((U == 1 || p0 + u * (int)blockDim.x < P) && (!DROP || e[u] < E)) perm[pos[e[u]] + atomicAdd(&fill[e[u]], 1)] = p0 + u * (int)blockDim.x;
    }
}

extern "C" __global__ void __launch_bounds__(GPU_MOE_SORT_NT) k_moe_sort(const int *__restrict__ sel, int P, int E, int *__restrict__ map,
                                                                         int items_bound, int cap) {
    GPU_DEP();
    moe_sort_block<GPU_MOE_SORT_U, true>(sel, P, E, map, items_bound, cap);
}

// The grouped form (steps of more than GPU_MOE_SORT_PB pairs, gpu_k_moe_sort): grid (B = ⌈P / GPU_MOE_SORT_PB⌉), block b
// the pairs [b·PB, +PB). k_moe_hist: hist[b][x] (map + 1 + 3·items_bound + P: past perm) = block b's pairs of expert x.
extern "C" __global__ void __launch_bounds__(GPU_MOE_HIST_NT) k_moe_hist(const int *__restrict__ sel, int P, int E, int *__restrict__ map,
                                                                         int items_bound) {
    __shared__ int cnt[GPU_ROUTER_MAX_E];
    GPU_DEP();
    for (int x = threadIdx.x; x < E; x += blockDim.x) cnt[x] = 0;
    __syncthreads();
    const int p0 = (int)blockIdx.x * GPU_MOE_SORT_PB + (int)threadIdx.x;
    int e[GPU_MOE_SORT_U];   // (the loads in flight together, as moe_sort_block's)
#pragma unroll
    for (int u = 0; u < GPU_MOE_SORT_U; u++) e[u] = p0 + u * GPU_MOE_HIST_NT < P ? sel[p0 + u * GPU_MOE_HIST_NT] : -1;
#pragma unroll
    for (int u = 0; u < GPU_MOE_SORT_U; u++)
        if (e[u] >= 0 && e[u] < E) atomicAdd(&cnt[e[u]], 1);   // (past E: dropped, k_moe_split's)
    __syncthreads();
    int *hist = map + 1 + 3 * (size_t)items_bound + P;
    for (int x = threadIdx.x; x < E; x += blockDim.x) hist[(size_t)blockIdx.x * E + x] = cnt[x];
}

// k_moe_place: every block scans the experts' totals from hist (thread x: expert x's, and its pairs in the blocks before
// this one), block 0 writes map[0] and the items as moe_sort_block does, and each block places its pairs after those
// of the blocks before it (within a block in any order, as moe_sort_block's atomics do).
extern "C" __global__ void __launch_bounds__(GPU_MOE_SORT_NT) k_moe_place(const int *__restrict__ sel, int P, int E, int *__restrict__ map,
                                                                          int items_bound, int cap) {
    __shared__ int pos[GPU_ROUTER_MAX_E], fill[GPU_ROUTER_MAX_E];
    __shared__ int wsum[2][32];
    GPU_DEP();
    const int x = threadIdx.x, b = blockIdx.x;
    const int *hist = map + 1 + 3 * (size_t)items_bound + P;
    int c = 0, before = 0;
    if (x < E)
        for (int v = 0; v < (int)gridDim.x; v++) {
            const int h = hist[(size_t)v * E + x];
            c += h, before += v < b ? h : 0;
        }
    const int it = (c + cap - 1) / cap;
    int oc, oi, ti;
    moe_sort_scan(c, it, wsum, oc, oi, ti);
    if (x < E) pos[x] = oc + before, fill[x] = 0;
    if (b == 0) {
        if (x == blockDim.x - 1) map[0] = ti;
        if (x < E) moe_sort_items(map + 1, x, c, it, oc, oi, cap);
    }
    __syncthreads();
    int *perm = map + 1 + 3 * (size_t)items_bound;
    for (int p = b * GPU_MOE_SORT_PB + x; p < P && p < (b + 1) * GPU_MOE_SORT_PB; p += blockDim.x) {
        const int y = sel[p];
        if (y < E) perm[pos[y] + atomicAdd(&fill[y], 1)] = p;
    }
}

// k_moe_split: the step's pairs p = t·K + k of sel [P] apart by their token's side (gpu/engine.c: gpu_mmc_split): sel_c[p]
// = sel[p] where token t lies in a full piece (pieces [np]: the pieces' first tokens, ascending; a piece is 64 tokens),
// else E; sel_n[p] the other way round — each then grouped by k_moe_sort, which drops the pairs of expert E. grid
// (⌈P / GPU_MOE_SPLIT_NT⌉), GPU_MOE_SPLIT_NT threads, a pair each.
extern "C" __global__ void __launch_bounds__(GPU_MOE_SPLIT_NT) k_moe_split(const int *__restrict__ sel, int P, int K, int E, const int *__restrict__ pieces,
                                                                          int np, int *__restrict__ sel_c, int *__restrict__ sel_n) {
    GPU_DEP();
    const int p = (int)blockIdx.x * GPU_MOE_SPLIT_NT + (int)threadIdx.x;
    if (p >= P) return;
    const int t = p / K;
    int lo = 0, hi = np;   // the first piece starting past t: lo
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (pieces[mid] <= t) lo = mid + 1;
        else hi = mid;
    }
    const bool in = lo > 0 && t < pieces[lo - 1] + GPU_MMC_PIECE;
    const int x = sel[p];
    sel_c[p] = in ? x : E, sel_n[p] = in ? E : x;
}

// A row block's outputs from red (mm_reduce's sums of the item's cnt pairs, rows [base, +16RT)):
// moe_up_out h = SiLU(gate) · up as its three bf16 parts, moe_dn_out ye.
template <int RT, int NT, bool ONE>
__device__ __forceinline__ void moe_up_out(const float *red, int base, int cnt, const int *perm, int first, float pg, float pu, int I, size_t PI,
                                           __nv_bfloat16 *__restrict__ hs) {
    for (int e = threadIdx.x; e < RT * 16 * cnt; e += blockDim.x) {
        int m = e / (RT * 16), rr = e % (RT * 16), row = base + rr;
        float gv = mm_at<2 * RT, NT, ONE>(red, rr / 16, rr % 16, m) * pg, uv = mm_at<2 * RT, NT, ONE>(red, RT + rr / 16, rr % 16, m) * pu;
        mm_split3(silu(gv) * uv, hs + (size_t)perm[first + m] * I + row, PI);
    }
}

template <int RT, int NT, bool ONE>
__device__ __forceinline__ void moe_dn_out(const float *red, int base, int cnt, const int *perm, int first, float post, int H, float *__restrict__ ye) {
    for (int e = threadIdx.x; e < RT * 16 * cnt; e += blockDim.x) {
        int m = e / (RT * 16), rr = e % (RT * 16), row = base + rr;
        if (row < H) ye[(size_t)perm[first + m] * H + row] = mm_at<RT, NT, ONE>(red, rr / 16, rr % 16, m) * post;
    }
}

// moe_up's and moe_dn's passes over nrb row blocks, each matrix kind its own loop (one mm_core in
// the loop: its registers, not those of four kinds' inlined side by side).
template <int KIND, int RT, int NT, int U, bool ONE, bool SB, class Pre>
__device__ __forceinline__ void moe_up_rows(const gpu_mat *__restrict__ experts, int x, const int *perm, int first, int cnt, const int *brow,
                                            const __nv_bfloat16 *xj, size_t ss, int H, int I, size_t PI, int nrb, const uint32_t *lut,
                                            float *red, __nv_bfloat16 *__restrict__ hs, Pre pre) {
    const int nact = (cnt + 7) / 8;
#pragma unroll 1
    for (int j = 0; j < nrb; j++) {
        const int base = (blockIdx.y * nrb + j) * RT * 16;
        if (base >= I) break;
        const gpu_mat M[2] = {experts[3 * x], experts[3 * x + 1]};
        int row0[RT];
#pragma unroll
        for (int i = 0; i < RT; i++) row0[i] = base + 16 * i;
        float acc[2 * RT][NT][4];
        auto first_pre = [&] {
            if (j == 0) pre();   // (the first row block's weights requested)
        };
        if constexpr (KIND == GPU_W_PLANES && NT == 1 && !SB) mm_core_pl<2, RT, U>(M, base, H, xj, ss, brow[0], lut, acc, first_pre);
        else mm_core<KIND, 2, RT, NT, U, SB, false>(M, row0, H, xj, ss, brow, nact, lut, acc, first_pre);
        if (j) __syncthreads();   // the last row block's sums all read out of red before it is written again
        mm_reduce<2 * RT, NT, ONE>(acc, red, nact);
        moe_up_out<RT, NT, ONE>(red, base, cnt, perm, first, mm_post(M[0]), mm_post(M[1]), I, PI, hs);
    }
}

template <int KIND, int RT, int NT, int U, bool ONE, bool SB, class Pre>
__device__ __forceinline__ void moe_dn_rows(const gpu_mat *__restrict__ experts, int x, const int *perm, int first, int cnt, const int *brow,
                                            const __nv_bfloat16 *hj, size_t ss, int I, int H, int nrb, const uint32_t *lut, float *red,
                                            float *__restrict__ ye, Pre pre) {
    const int nact = (cnt + 7) / 8;
#pragma unroll 1
    for (int b = 0; b < nrb; b++) {
        const int base = (blockIdx.y * nrb + b) * RT * 16;
        if (base >= H) break;
        const gpu_mat D = experts[3 * x + 2];
        int row0[RT];
#pragma unroll
        for (int i = 0; i < RT; i++) row0[i] = base + 16 * i;
        float acc[RT][NT][4];
        auto first_pre = [&] {
            if (b == 0) pre();
        };
        if constexpr (KIND == GPU_W_PLANES && NT == 1 && !SB) mm_core_pl<1, RT, U>(&D, base, I, hj, ss, brow[0], lut, acc, first_pre);
        else mm_core<KIND, 1, RT, NT, U, SB, false>(&D, row0, I, hj, ss, brow, nact, lut, acc, first_pre);
        if (b) __syncthreads();   // as in moe_up_rows
        mm_reduce<RT, NT, ONE>(acc, red, nact);
        moe_dn_out<RT, NT, ONE>(red, base, cnt, perm, first, mm_post(D), H, ye);
    }
}

// h[p] = SiLU(gate_x · xn[t]) · (up_x · xn[t]) for the item's pairs p (t = p / K), rows
// [16RT·(nrb·blockIdx.y + j), +16RT) of both for j < nrb (the item's tokens staged once for nrb row
// blocks; each row's sums as in a block of its own), written as its three bf16 parts hs [3][P][I]
// (what k_moe_dn reads). An item holds at most 8·NT pairs (the _d shape: GPU_MOE_CAP_D).
template <int RT, int NT, int U, bool ONE, int NRB, int KF = -1>
__device__ __forceinline__ void moe_up(const gpu_mat *__restrict__ experts, const int *__restrict__ map, int items_bound, int K,
                                       const __nv_bfloat16 *__restrict__ xs, int T, __nv_bfloat16 *__restrict__ hs, int I, int nrb) {
    GPU_DEP();
    MM_PL_LUT(lut);
    __shared__ float red[mm_red<2 * RT, NT, ONE>::floats];
    if ((int)blockIdx.x >= map[0]) return;
    const int *item = map + 1 + 3 * blockIdx.x, *perm = map + 1 + 3 * items_bound;
    const int x = item[0], first = item[1], cnt = item[2], P = T * K;
    const int H = experts[3 * x].cols, kind = experts[3 * x].kind, g = (threadIdx.x & 31) >> 2;
    if (KF >= 0 && kind != KF) __trap();   // (a kernel of one kind launched on another: the launcher's error, loudly)
    int brow[NT];
    __nv_bfloat16 *xl = (__nv_bfloat16 *)mm_smem;
    constexpr bool SB = NT == 1 && KF < 0;   // the tokens staged (_dg4: read from xs, through L1)
    if (SB) brow[0] = g < cnt ? g : -1;
    else
#pragma unroll
        for (int n = 0; n < NT; n++) brow[n] = 8 * n + g < cnt ? perm[first + 8 * n + g] / K : -1;
    // once the first row block's weights are requested (mm_core's pre): _d's item tokens (≤ 8,
    // distinct) staged in shared memory, [3][cnt][H], and the planes' table
    auto stage = [&] {
        if (SB) mm_stage(xl, xs, (size_t)T * H, H, cnt, [&](int j) { return perm[first + j] / K; });
        mm_plane_lut(lut);
        __syncthreads();
    };
    const __nv_bfloat16 *xj = SB ? xl : xs;
    const size_t ss = SB ? (size_t)cnt * H : (size_t)T * H, PI = (size_t)P * I;
    if constexpr (NRB == 1) {   // one row block: straight through (fewer registers than the loops below)
        const gpu_mat M[2] = {experts[3 * x], experts[3 * x + 1]};
        const int base = blockIdx.y * RT * 16, nact = (cnt + 7) / 8;
        int row0[RT];
#pragma unroll
        for (int i = 0; i < RT; i++) row0[i] = base + 16 * i;
        float acc[2 * RT][NT][4];
        if constexpr (KF == GPU_W_PLANES) mm_core_pl<2, RT, U>(M, base, H, xj, ss, brow[0], lut, acc, stage);
        else mm_any<2, RT, NT, U, SB>(M, row0, H, xj, ss, brow, nact, lut, acc, stage);
        mm_reduce<2 * RT, NT, ONE>(acc, red, nact);
        moe_up_out<RT, NT, ONE>(red, base, cnt, perm, first, mm_post(M[0]), mm_post(M[1]), I, PI, hs);
        return;
    }
    const int nb = NRB ? NRB : nrb;   // (NRB 0: the launch's count)
    if constexpr (KF == GPU_W_PLANES) {
        moe_up_rows<GPU_W_PLANES, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, xj, ss, H, I, PI, nb, lut, red, hs, stage);
        return;
    }
    // stage as mm_core's pre for the planes, before it for the other kinds (mm_any's note)
    switch (kind) {
    case GPU_W_FP8:
        stage(), moe_up_rows<GPU_W_FP8, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, xj, ss, H, I, PI, nb, lut, red, hs, mm_nop());
        break;
    case GPU_W_NVFP4:
        stage(), moe_up_rows<GPU_W_NVFP4, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, xj, ss, H, I, PI, nb, lut, red, hs, mm_nop());
        break;
    case GPU_W_BF16:
        stage(), moe_up_rows<GPU_W_BF16, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, xj, ss, H, I, PI, nb, lut, red, hs, mm_nop());
        break;
    default: moe_up_rows<GPU_W_PLANES, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, xj, ss, H, I, PI, nb, lut, red, hs, stage); break;
    }
}

// ye[p, j] = down_x[j] · h[p] for the item's pairs p, rows j in [16RT·(nrb·blockIdx.y + b), +16RT)
// for b < nrb (as moe_up's row blocks).
template <int RT, int NT, int U, bool ONE, int NRB, int KF = -1>
__device__ __forceinline__ void moe_dn(const gpu_mat *__restrict__ experts, const int *__restrict__ map, int items_bound,
                                       const __nv_bfloat16 *__restrict__ hs, int P, float *__restrict__ ye, int H, int nrb) {
    GPU_DEP();
    MM_PL_LUT(lut);
    __shared__ float red[mm_red<RT, NT, ONE>::floats];
    if ((int)blockIdx.x >= map[0]) return;
    const int *item = map + 1 + 3 * blockIdx.x, *perm = map + 1 + 3 * items_bound;
    const int x = item[0], first = item[1], cnt = item[2];
    const int I = experts[3 * x + 2].cols, kind = experts[3 * x + 2].kind, g = (threadIdx.x & 31) >> 2;
    if (KF >= 0 && kind != KF) __trap();   // (as moe_up's)
    int brow[NT];
    __nv_bfloat16 *hl = (__nv_bfloat16 *)mm_smem;
    constexpr bool SB = NT == 1 && KF < 0;   // (as moe_up's)
    if (SB) brow[0] = g < cnt ? g : -1;
    else
#pragma unroll
        for (int n = 0; n < NT; n++) brow[n] = 8 * n + g < cnt ? perm[first + 8 * n + g] : -1;
    // (as moe_up's) _d: the item's pairs' h (≤ 8) staged in shared memory, [3][cnt][I]
    auto stage = [&] {
        if (SB) mm_stage(hl, hs, (size_t)P * I, I, cnt, [&](int j) { return perm[first + j]; });
        mm_plane_lut(lut);
        __syncthreads();
    };
    const __nv_bfloat16 *hj = SB ? hl : hs;
    const size_t ss = SB ? (size_t)cnt * I : (size_t)P * I;
    if constexpr (NRB == 1) {   // as in moe_up
        const gpu_mat D = experts[3 * x + 2];
        const int base = blockIdx.y * RT * 16, nact = (cnt + 7) / 8;
        int row0[RT];
#pragma unroll
        for (int i = 0; i < RT; i++) row0[i] = base + 16 * i;
        float acc[RT][NT][4];
        if constexpr (KF == GPU_W_PLANES) mm_core_pl<1, RT, U>(&D, base, I, hj, ss, brow[0], lut, acc, stage);
        else mm_any<1, RT, NT, U, SB>(&D, row0, I, hj, ss, brow, nact, lut, acc, stage);
        mm_reduce<RT, NT, ONE>(acc, red, nact);
        moe_dn_out<RT, NT, ONE>(red, base, cnt, perm, first, mm_post(D), H, ye);
        return;
    }
    const int nb = NRB ? NRB : nrb;
    if constexpr (KF == GPU_W_PLANES) {
        moe_dn_rows<GPU_W_PLANES, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, hj, ss, I, H, nb, lut, red, ye, stage);
        return;
    }
    switch (kind) {
    case GPU_W_FP8:
        stage(), moe_dn_rows<GPU_W_FP8, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, hj, ss, I, H, nb, lut, red, ye, mm_nop());
        break;
    case GPU_W_NVFP4:
        stage(), moe_dn_rows<GPU_W_NVFP4, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, hj, ss, I, H, nb, lut, red, ye, mm_nop());
        break;
    case GPU_W_BF16:
        stage(), moe_dn_rows<GPU_W_BF16, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, hj, ss, I, H, nb, lut, red, ye, mm_nop());
        break;
    default: moe_dn_rows<GPU_W_PLANES, RT, NT, U, ONE, SB>(experts, x, perm, first, cnt, brow, hj, ss, I, H, nb, lut, red, ye, stage); break;
    }
}

// The shapes (above): RT row tiles of 16 per warp, NT n-tiles of 8 pairs, U 64-blocks of weights
// in flight, ONE: the warps' sums meet in one shared buffer, KF: the experts' one kind (-1: any,
// by the matrices' kind). _d stages 2·GPU_MM_PARTS·min(T, GPU_MOE_CAP_D)·width bytes of dynamic
// shared memory and caps its registers for two blocks per multiprocessor; _dg4 is _d for 2-bit
// planes alone (mm.cuh: mm_core_pl), the tokens read through L1 (no shared memory staged), whose
// one code path fits four blocks a multiprocessor (64 registers, up a few spilled; the four kinds'
// paths of one kernel take 128), and _dg1 is _dg4 at one row block a block (_d1's). The same steps
// in each: the same bits.
#define MOE_UP(name, RT, NT, U, ONE, MINB, NRB, KF)                                                                              \
    extern "C" __global__ void __launch_bounds__(GPU_MM_NT, MINB) name(const gpu_mat *__restrict__ experts, const int *__restrict__ map,   \
                                                                 int items_bound, int K, const __nv_bfloat16 *__restrict__ xs, int T, \
                                                                 __nv_bfloat16 *__restrict__ hs, int I, int nrb) {                    \
        moe_up<RT, NT, U, ONE, NRB, KF>(experts, map, items_bound, K, xs, T, hs, I, nrb);                    \
    }
MOE_UP(k_moe_up_d, 1, 1, 4, true, 2, 0, -1)
MOE_UP(k_moe_up_d1, 1, 1, 4, true, 2, 1, -1)
MOE_UP(k_moe_up_p, 2, 4, 1, false, 1, 1, -1)
MOE_UP(k_moe_up_dg4, 1, 1, 4, true, 4, 0, GPU_W_PLANES)
MOE_UP(k_moe_up_dg1, 1, 1, 4, true, 4, 1, GPU_W_PLANES)
#define MOE_DN(name, RT, NT, U, ONE, MINB, NRB, KF)                                                                              \
    extern "C" __global__ void __launch_bounds__(GPU_MM_NT, MINB) name(const gpu_mat *__restrict__ experts, const int *__restrict__ map,   \
                                                                 int items_bound, const __nv_bfloat16 *__restrict__ hs, int P,        \
                                                                 float *__restrict__ ye, int H, int nrb) {                            \
        moe_dn<RT, NT, U, ONE, NRB, KF>(experts, map, items_bound, hs, P, ye, H, nrb);                       \
    }
MOE_DN(k_moe_dn_d, 4, 1, 1, true, 2, 0, -1)
MOE_DN(k_moe_dn_d1, 4, 1, 1, true, 2, 1, -1)
MOE_DN(k_moe_dn_p, 2, 4, 1, false, 1, 1, -1)
MOE_DN(k_moe_dn_dg4, 4, 1, 1, true, 4, 0, GPU_W_PLANES)
MOE_DN(k_moe_dn_dg1, 4, 1, 1, true, 4, 1, GPU_W_PLANES)

// ---- prompts: an item's pairs through shared memory (mm.cuh: mmg_run) ----------------------------
//
// k_moe_up_g: row tile w of a block is rows [base + 16(w / 2), +16) of gate (w even) or up (w odd),
// so a warp's two row tiles are gate and up of the same rows and of the same pairs: h as moe_up
// writes it. k_moe_dn_g: row tiles of down, as k_mm_g's.
template <int KIND, int NW>
__device__ __forceinline__ void moe_up_g(const gpu_mat (&M)[2], int base, const __nv_bfloat16 *__restrict__ xs, size_t ss, const int *tok,
                                         const int *pair, const uint32_t *lut, __nv_bfloat16 *__restrict__ hs, int I, size_t PI) {
    float tot[2][NW][4];
    mmg_run<KIND, false>([&](int w, const gpu_mat *&W, int &row0) { W = &M[w & 1], row0 = base + 16 * (w >> 1); }, M[0].cols, xs, ss, tok,
                         mm_smem, lut, tot);
    const float pg = mm_post(M[0]), pu = mm_post(M[1]);
#pragma unroll
    for (int n = 0; n < NW; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int ti, rr, r;
            mmg_place<NW>(0, n, e, ti, rr, r);
            const int row = base + 16 * (ti >> 1) + rr;
            if (row < I && pair[r] >= 0) mm_split3(silu(tot[0][n][e] * pg) * (tot[1][n][e] * pu), hs + (size_t)pair[r] * I + row, PI);
        }
}

// An item of up to BN pairs (k_moe_up_g: GPU_MMG_BN; k_moe_up_g128: GPU_MMG_BN128, one bf16 part).
template <int BN>
__device__ __forceinline__ void moe_up_g_item(const gpu_mat *__restrict__ experts, const int *__restrict__ map, int items_bound, int K,
                                              const __nv_bfloat16 *__restrict__ xs, int T, __nv_bfloat16 *__restrict__ hs, int I) {
    __shared__ uint32_t lut[16];
    __shared__ int tok[BN], pair[BN];
    GPU_DEP();
    if ((int)blockIdx.x >= map[0]) return;
    const int *item = map + 1 + 3 * blockIdx.x, *perm = map + 1 + 3 * items_bound;
    const int x = item[0], first = item[1], cnt = item[2];
    const gpu_mat M[2] = {experts[3 * x], experts[3 * x + 1]};
    for (int r = threadIdx.x; r < BN; r += blockDim.x) {
        const int p = r < cnt ? perm[first + r] : -1;
        pair[r] = p, tok[r] = p >= 0 ? p / K : -1;
    }
    mm_plane_lut(lut);
    __syncthreads();
    const int base = blockIdx.y * (GPU_MMG_BM / 2);
    const size_t ss = (size_t)T * M[0].cols, PI = (size_t)T * K * I;
    if (M[0].kind == GPU_W_NVFP4) moe_up_g<GPU_W_NVFP4, BN / 16>(M, base, xs, ss, tok, pair, lut, hs, I, PI);
    else moe_up_g<GPU_W_PLANES, BN / 16>(M, base, xs, ss, tok, pair, lut, hs, I, PI);   // (gpu_moe_shape: planes and NVFP4 only)
}

extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MOEG_BLOCKS) k_moe_up_g(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                              int items_bound, int K, const __nv_bfloat16 *__restrict__ xs,
                                                                              int T, __nv_bfloat16 *__restrict__ hs, int I) {
    moe_up_g_item<GPU_MMG_BN>(experts, map, items_bound, K, xs, T, hs, I);
}
extern "C" __global__ void __launch_bounds__(GPU_MM_NT, 1) k_moe_up_g128(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                       int items_bound, int K, const __nv_bfloat16 *__restrict__ xs, int T,
                                                                       __nv_bfloat16 *__restrict__ hs, int I) {
    moe_up_g_item<GPU_MMG_BN128>(experts, map, items_bound, K, xs, T, hs, I);
}

template <int KIND, int NW>
__device__ __forceinline__ void moe_dn_g(const gpu_mat &D, int base, const __nv_bfloat16 *__restrict__ hs, size_t ss, const int *tok,
                                         const uint32_t *lut, float *__restrict__ ye, int H) {
    float tot[2][NW][4];
    mmg_run<KIND, false>([&](int w, const gpu_mat *&W, int &row0) { W = &D, row0 = base + 16 * w; }, D.cols, hs, ss, tok, mm_smem, lut, tot);
    const float post = mm_post(D);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < NW; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ti, rr, r;
                mmg_place<NW>(i, n, e, ti, rr, r);
                const int row = base + 16 * ti + rr;
                if (row < H && tok[r] >= 0) ye[(size_t)tok[r] * H + row] = tot[i][n][e] * post;
            }
}

template <int BN>
__device__ __forceinline__ void moe_dn_g_item(const gpu_mat *__restrict__ experts, const int *__restrict__ map, int items_bound,
                                              const __nv_bfloat16 *__restrict__ hs, int P, float *__restrict__ ye, int H) {
    __shared__ uint32_t lut[16];
    __shared__ int tok[BN];
    GPU_DEP();
    if ((int)blockIdx.x >= map[0]) return;
    const int *item = map + 1 + 3 * blockIdx.x, *perm = map + 1 + 3 * items_bound;
    const int x = item[0], first = item[1], cnt = item[2];
    const gpu_mat D = experts[3 * x + 2];
    for (int r = threadIdx.x; r < BN; r += blockDim.x) tok[r] = r < cnt ? perm[first + r] : -1;   // the pairs: rows of hs
    mm_plane_lut(lut);
    __syncthreads();
    const int base = blockIdx.y * GPU_MMG_BM;
    const size_t ss = (size_t)P * D.cols;
    if (D.kind == GPU_W_NVFP4) moe_dn_g<GPU_W_NVFP4, BN / 16>(D, base, hs, ss, tok, lut, ye, H);
    else moe_dn_g<GPU_W_PLANES, BN / 16>(D, base, hs, ss, tok, lut, ye, H);
}

extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MOEG_BLOCKS) k_moe_dn_g(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                              int items_bound, const __nv_bfloat16 *__restrict__ hs, int P,
                                                                              float *__restrict__ ye, int H) {
    moe_dn_g_item<GPU_MMG_BN>(experts, map, items_bound, hs, P, ye, H);
}
extern "C" __global__ void __launch_bounds__(GPU_MM_NT, 1) k_moe_dn_g128(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                       int items_bound, const __nv_bfloat16 *__restrict__ hs, int P,
                                                                       float *__restrict__ ye, int H) {
    moe_dn_g_item<GPU_MMG_BN128>(experts, map, items_bound, hs, P, ye, H);
}
