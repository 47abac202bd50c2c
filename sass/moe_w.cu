// sass/moe_w.cu — the routed experts' prompt products on wgmma: k_moe_up_w and k_moe_dn_w, the _g128 shape's items
// (an expert's run of up to GPU_MMG_BN128 pairs, sass/moe_mm.cu's map) through the warp-specialised product of mmw.cuh,
// for NVFP4 and 2-bit plane experts where the products read one bf16 part and the cubin is sm_90a. The same sums as
// k_moe_up_g128 / k_moe_dn_g128 and their epilogues, so the same bits. CPU twin: ref_moe (moet.c).
//
// k_moe_up_w: grid (I / 64, items bound over y and z), GPU_MMW_NT threads, GPU_MMW_SMEM bytes of dynamic shared memory. A block's A
// tile is rows [64·blockIdx.x, +64) of the item's gate (A rows 0..63: consumer warpgroup 2) and of its up (64..127:
// warpgroup 3) over K = H, times the item's pairs' tokens of xs; warpgroup 3 hands up · its scale to warpgroup 2 through
// shared memory (the stages, every one consumed), which writes h = SiLU(gate · scale) · (up · scale) as moe_up_g does.
// k_moe_dn_w: grid (H / 128, items bound over y and z): rows [128·blockIdx.x, +128) of the item's down over K = I, times the pairs'
// rows of hs, into ye [pair][H].
#include "mmw.cuh"

// The item of a block: y + gridDim.y · z (the items past 65,535 along z: gpu_moe_w_grid); none past map[0].
__device__ __forceinline__ int mmw_item_index() { return (int)(blockIdx.y + gridDim.y * blockIdx.z); }

// The block's item's expert, and its pairs (-1 past its count) into pair[].
__device__ __forceinline__ int mmw_item(const int *__restrict__ map, int items_bound, int *pair) {
    const int *item = map + 1 + 3 * mmw_item_index(), *perm = map + 1 + 3 * items_bound;
    const int x = item[0], first = item[1], cnt = item[2];
    for (int r = threadIdx.x; r < GPU_MMW_BN; r += blockDim.x) pair[r] = r < cnt ? perm[first + r] : -1;
    return x;
}

extern "C" __global__ void __launch_bounds__(GPU_MMW_NT, 1) k_moe_up_w(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                     int items_bound, int K, const __nv_bfloat16 *__restrict__ xs, int T,
                                                                     __nv_bfloat16 *__restrict__ hs, int I) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t mmw_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MMW_STAGES], empty[GPU_MMW_STAGES];
    MM_PL_LUT(lut);   // (256-aligned: mm_pl_lut)
    __shared__ int pair[GPU_MMW_BN];
    GPU_DEP();   // (the map is the step's: nothing of the item is known before it)
    if (mmw_item_index() >= map[0]) return;
    const int x = mmw_item(map, items_bound, pair);
    mm_plane_lut(lut);
    mmw_stage *st = mmw_setup(mmw_smem, full, empty);
    uint8_t *raw = (uint8_t *)(st + GPU_MMW_STAGES);
    const gpu_mat G = experts[3 * x], U = experts[3 * x + 1];
    const int base = blockIdx.x * 64, H = G.cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    __syncthreads();   // the pairs, the table and the barriers
    if (wg < 2) {   // the producers: warpgroup 0 the weights, 1 the tokens
        mmw_regs_producer();
        const int p = pair[i], tok = p >= 0 ? p / K : -1;
        if (G.kind == GPU_W_PLANES) {   // 16-row blocks 0..3 of the tile from gate, 4..7 from up
            const int nb = i >> 4;
            const mmw_src w = {nb < 4 ? G : U, base + 16 * (nb & 3)};
            mmw_produce<GPU_W_PLANES>(w, xs, tok, H, raw, st, full, empty, lut, wg == 0);
        } else {   // NVFP4 (gpu_moe_shape: planes and NVFP4 only): rows 0..63 gate, 64..127 up
            const mmw_src w = {i < 64 ? G : U, base + (i & 63)};
            mmw_produce<GPU_W_NVFP4>(w, xs, tok, H, raw, st, full, empty, lut, wg == 0);
        }
        return;
    }
    mmw_regs_consumer();
    const int c = wg - 2, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    float tot[64];
    mmw_consume(st, full, empty, H, c, tot);
    float *xch = (float *)st;   // [64][128]: up's sums, each consumer thread's 64 in a column
    asm volatile("bar.sync 1, 256;" ::: "memory");   // both warpgroups past their last wgmma: the stages are free
    if (c == 1) {
        const float pu = mm_post(U);
#pragma unroll
        for (int e = 0; e < 64; e++) xch[e * 128 + i] = tot[e] * pu;
    }
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (c == 0) {
        const float pg = mm_post(G);
        const size_t PI = (size_t)T * K * I;
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = base + 16 * warp + g + 8 * (e >> 1), r = 8 * n + 2 * t + (e & 1);
                if (row < I && pair[r] >= 0) mm_split3(silu(tot[4 * n + e] * pg) * xch[(4 * n + e) * 128 + i], hs + (size_t)pair[r] * I + row, PI);
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
    __shared__ __align__(8) uint64_t full[GPU_MMW_STAGES], empty[GPU_MMW_STAGES];
    MM_PL_LUT(lut);   // (256-aligned: mm_pl_lut)
    __shared__ int pair[GPU_MMW_BN];   // the rows of hs
    GPU_DEP();
    if (mmw_item_index() >= map[0]) return;
    const int x = mmw_item(map, items_bound, pair);
    mm_plane_lut(lut);
    mmw_stage *st = mmw_setup(mmw_smem, full, empty);
    uint8_t *raw = (uint8_t *)(st + GPU_MMW_STAGES);
    const gpu_mat D = experts[3 * x + 2];
    const int base = blockIdx.x * GPU_MMW_BM, I = D.cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    __syncthreads();
    if (wg < 2) {   // the producers: warpgroup 0 the weights, 1 the rows of hs
        mmw_regs_producer();
        if (D.kind == GPU_W_PLANES) mmw_produce<GPU_W_PLANES>(mmw_src{D, base + 16 * (i >> 4)}, hs, pair[i], I, raw, st, full, empty, lut, wg == 0);
        else mmw_produce<GPU_W_NVFP4>(mmw_src{D, base + i}, hs, pair[i], I, raw, st, full, empty, lut, wg == 0);
        return;
    }
    mmw_regs_consumer();
    const int c = wg - 2, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    float tot[64];
    mmw_consume(st, full, empty, I, c, tot);
    const float post = mm_post(D);
#pragma unroll
    for (int n = 0; n < 16; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = base + 64 * c + 16 * warp + g + 8 * (e >> 1), r = 8 * n + 2 * t + (e & 1);
            if (row < H && pair[r] >= 0) ye[(size_t)pair[r] * H + row] = tot[4 * n + e] * post;
        }
    (void)P;
#else
    __trap();
#endif
}
