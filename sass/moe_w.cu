// sass/moe_w.cu — the routed experts' prompt products on wgmma: k_moe_up_w and k_moe_dn_w, the _g128 shape's items
// (an expert's run of up to GPU_MMG_BN128 pairs, sass/moe_mm.cu's map) through the warp-specialised product of mmw.cuh,
// for NVFP4 and 2-bit plane experts where the products read one bf16 part and the cubin is sm_90a. The same sums as
// k_moe_up_g128 / k_moe_dn_g128 and their epilogues, so the same bits. CPU twin: ref_moe (moet.c).
//
// Both are persistent: grid (blocks, 1, 1) — at most one a multiprocessor (gpu_moe_w_grid) — GPU_MMW_NT threads,
// GPU_MMW_SMEM_MOE bytes of dynamic shared memory (the kind's plan: mmw_plan); the step's tiles n = (item) · nrb +
// (row block) (an item's row blocks together: they read its tokens' rows while L2 holds them) taken by block n mod
// gridDim.x in turn, the producers running on into a block's next tile while the consumers finish this one
// (mmw_produce), so a tile's fill and epilogue overlap its neighbours' products. No tile past map[0]'s items.
// k_moe_up_w: tiles of 64 rows (nrb = I / 64): rows [64·rb, +64) of the item's gate and of its up over K = H, times the
// item's pairs' tokens of xs, the gate and up rows of an output paired in the A tile (mmw_arow), so each consumer
// thread holds both sums of its outputs and writes h = SiLU(gate · scale) · (up · scale) as moe_up_g does.
// k_moe_dn_w: tiles of 128 rows (nrb = H / 128): rows [128·rb, +128) of the item's down over K = I, times the pairs'
// rows of hs, into ye [pair][H].
#include "mmw.cuh"

// A tile of the step: its item's expert x, first pair in the map's order, pair count, row block.
struct mmw_tile {
    int x, first, cnt, rb;
};
// Tile m of this block (n = blockIdx.x + m · gridDim.x: item n / nrb, row block n % nrb).
__device__ __forceinline__ mmw_tile mmw_tile_at(const int *__restrict__ map, int m, int nrb) {
    const int n = (int)blockIdx.x + m * (int)gridDim.x, it = n / nrb;
    const int *item = map + 1 + 3 * it;
    return mmw_tile{item[0], item[1], item[2], n - it * nrb};
}
// This block's tile count: the step's map[0] · nrb tiles dealt round the grid.
__device__ __forceinline__ int mmw_tiles(const int *__restrict__ map, int nrb) {
    const int n = map[0] * nrb;
    return n > (int)blockIdx.x ? (n - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
}

extern "C" __global__ void __launch_bounds__(GPU_MMW_NT, 1) k_moe_up_w(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                     int items_bound, int K, const __nv_bfloat16 *__restrict__ xs, int T,
                                                                     __nv_bfloat16 *__restrict__ hs, int I) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t mmw_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MMW_STAGES_PL], empty[GPU_MMW_STAGES_PL];   // (the larger plan's: mmw_plan)
    MM_PL_LUT(lut);   // (256-aligned: mm_pl_lut)
    __shared__ int pair[2][GPU_MMW_BN];   // the consumers' tiles' pairs, by tile parity
    GPU_DEP();   // (the map is the step's: nothing of a tile is known before it)
    const int nrb = I / 64, nt = mmw_tiles(map, nrb);
    if (nt == 0) return;
    const int *perm = map + 1 + 3 * items_bound;
    mm_plane_lut(lut);
    mmw_stage *st = mmw_setup(mmw_smem, full, empty, GPU_MMW_STAGES_PL);
    const gpu_mat &G0 = experts[3 * mmw_tile_at(map, 0, nrb).x];   // (every expert's kind and shape alike)
    const int H = G0.cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    const bool pl = G0.kind == GPU_W_PLANES;   // (the planes' plan: mmw_plan)
    __syncthreads();   // the table and the barriers
    if (wg < 2) {   // the producers: warpgroup 0 the weights, 1 the tokens (planes: both the weights, mmw_produce_as)
        mmw_regs_producer();
        const bool wts = wg == 0;
        if (pl) {   // producer warp v's 16-row block: v < 4 of the tile's gate rows, 4..7 of its up rows
            const int v = threadIdx.x >> 5;
            mmw_produce<GPU_W_PLANES, true>(
                [&](int m, mmw_src &w, int &tok) {
                    const mmw_tile tl = mmw_tile_at(map, m, nrb);
                    w = mmw_src{experts[3 * tl.x + (v >> 2)], 64 * tl.rb + 16 * (v & 3)};
                    if (!wts) tok = i < tl.cnt ? perm[tl.first + i] / K : -1;
                },
                nt, xs, H, st, full, empty, lut, wts);
        } else {   // NVFP4 (gpu_moe_shape: planes and NVFP4 only): rows 0..63 gate, 64..127 up
            mmw_produce<GPU_W_NVFP4, true>(
                [&](int m, mmw_src &w, int &tok) {
                    const mmw_tile tl = mmw_tile_at(map, m, nrb);
                    if (wts) w = mmw_src{experts[3 * tl.x + (i >> 6)], 64 * tl.rb + (i & 63)};
                    else tok = i < tl.cnt ? perm[tl.first + i] / K : -1;
                },
                nt, xs, H, st, full, empty, lut, wts);
        }
        return;
    }
    mmw_regs_consumer();
    const int c = wg - 2, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const size_t PI = (size_t)T * K * I;
    float tot[64];
    for (int m = 0; m < nt; m++) {
        const mmw_tile tl = mmw_tile_at(map, m, nrb);
        if (c == 0) pair[m & 1][i] = i < tl.cnt ? perm[tl.first + i] : -1;
        if (pl) mmw_consume_n<GPU_MMW_STAGES_PL>(st, full, empty, H, c, tot, m * (H / 64), tl.cnt);
        else mmw_consume_n<GPU_MMW_STAGES>(st, full, empty, H, c, tot, m * (H / 64), tl.cnt);
        asm volatile("bar.sync 1, 256;" ::: "memory");   // the tile's pairs in (and every consumer past the tile before's epilogue)
        const float pg = mm_post(experts[3 * tl.x]), pu = mm_post(experts[3 * tl.x + 1]);
        // tot[4n + e]: A row 64c + 16·warp + g + 8(e / 2) — output 32c + 8·warp + g, its gate (e < 2) and up sums
        const int row = 64 * tl.rb + 32 * c + 8 * warp + g;
        const int *pr = pair[m & 1];
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = 8 * n + 2 * t + e;
                if (row < I && pr[r] >= 0) mm_split3(silu(tot[4 * n + e] * pg) * (tot[4 * n + 2 + e] * pu), hs + (size_t)pr[r] * I + row, PI);
            }
    }
#else
    __trap();   // (gpu_kernels.moe_w is 0 but where this image is the sm_90a cubin's one-part image)
#endif
}

extern "C" __global__ void __launch_bounds__(GPU_MMW_NT, 1) k_moe_dn_w(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                     int items_bound, const __nv_bfloat16 *__restrict__ hs, int P,
                                                                     float *__restrict__ ye, int H) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t mmw_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MMW_STAGES_PL], empty[GPU_MMW_STAGES_PL];   // (the larger plan's: mmw_plan)
    MM_PL_LUT(lut);   // (256-aligned: mm_pl_lut)
    __shared__ int pair[2][GPU_MMW_BN];   // the consumers' tiles' rows of hs, by tile parity
    GPU_DEP();
    const int nrb = H / GPU_MMW_BM, nt = mmw_tiles(map, nrb);
    if (nt == 0) return;
    const int *perm = map + 1 + 3 * items_bound;
    mm_plane_lut(lut);
    mmw_stage *st = mmw_setup(mmw_smem, full, empty, GPU_MMW_STAGES_PL);
    const gpu_mat &D0 = experts[3 * mmw_tile_at(map, 0, nrb).x + 2];   // (every expert's kind and shape alike)
    const int I = D0.cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    const bool pl = D0.kind == GPU_W_PLANES;   // (the planes' plan: mmw_plan)
    __syncthreads();
    if (wg < 2) {   // the producers: warpgroup 0 the weights, 1 the rows of hs (planes: both the weights, mmw_produce_as)
        mmw_regs_producer();
        const bool wts = wg == 0;
        auto src = [&](int m, mmw_src &w, int &tok, int r) {
            const mmw_tile tl = mmw_tile_at(map, m, nrb);
            if (wts || pl) w = mmw_src{experts[3 * tl.x + 2], GPU_MMW_BM * tl.rb + r};
            if (!wts) tok = i < tl.cnt ? perm[tl.first + i] : -1;
        };
        if (pl)   // producer warp v: the tile's 16-row block v
            mmw_produce<GPU_W_PLANES, false>([&](int m, mmw_src &w, int &tok) { src(m, w, tok, 16 * (threadIdx.x >> 5)); }, nt, hs, I, st, full, empty, lut, wts);
        else mmw_produce<GPU_W_NVFP4, false>([&](int m, mmw_src &w, int &tok) { src(m, w, tok, i); }, nt, hs, I, st, full, empty, lut, wts);
        return;
    }
    mmw_regs_consumer();
    const int c = wg - 2, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    float tot[64];
    for (int m = 0; m < nt; m++) {
        const mmw_tile tl = mmw_tile_at(map, m, nrb);
        if (c == 0) pair[m & 1][i] = i < tl.cnt ? perm[tl.first + i] : -1;
        if (pl) mmw_consume_n<GPU_MMW_STAGES_PL>(st, full, empty, I, c, tot, m * (I / 64), tl.cnt);
        else mmw_consume_n<GPU_MMW_STAGES>(st, full, empty, I, c, tot, m * (I / 64), tl.cnt);
        asm volatile("bar.sync 1, 256;" ::: "memory");   // the tile's pairs in (and every consumer past the tile before's epilogue)
        const float post = mm_post(experts[3 * tl.x + 2]);
        const int *pr = pair[m & 1];
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = GPU_MMW_BM * tl.rb + 64 * c + 16 * warp + g + 8 * (e >> 1), r = 8 * n + 2 * t + (e & 1);
                if (row < H && pr[r] >= 0) ye[(size_t)pr[r] * H + row] = tot[4 * n + e] * post;
            }
    }
    (void)P;
#else
    __trap();
#endif
}
