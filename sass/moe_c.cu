// sass/moe_c.cu — the routed experts' chain products for the pairs of prompts' full pieces: k_moe_up_c and k_moe_dn_c,
// 2-bit plane experts, one bf16 part, the sm_90a cubin. (The engine takes their form with A from registers, k_moe_up_r
// / k_moe_dn_r in sass/moe_r.cu, the same bits; these stay as its check: test_gpu kernel_moe_c holds them against the
// reference and _r against them bit for bit.) Chain order as k_mm_c (sass/mm_c.cu: one f32 accumulator over
// K, the 64-blocks ascending and in each the k16 steps q = 0..3 of k 64kb + 16q + 0..15), so a pair's outputs are bits
// of their own — what keeps a sequence's bits whatever the step: a pair takes these kernels iff its token lies in a full
// piece (gpu/engine.c: gpu_mmc_split), which depends on the sequence and the position alone. CPU twin: ref_moe (moet.c).
//
// Why: the class order of every other shape holds two accumulator sets a consumer thread, which caps k_moe_up_w's and
// k_moe_dn_w's tiles at 128 weight rows; their tokens' bytes from L2 per product are 4096 / rows B a tensor clock. One
// set lets a consumer warpgroup take 128 rows (two m64n128 a k16 step): tiles of GPU_MOEC_BM = 256 rows × GPU_MMW_BN
// tokens, each token's 64-block read once for twice the rows.
//
// Persistent as k_moe_up_w (sass/moe_w.cu: mmw_tile_at, mmw_tiles; included before this file): grid (blocks ≤ SMs, 1, 1),
// GPU_MMW_NT threads, GPU_MOEC_SMEM bytes of dynamic shared memory; tiles n = item · nrb + row block of the map's items.
// k_moe_up_c: nrb = I / 128, the tile's 128 outputs' gate and up rows paired in the A tile (moec_arow); k_moe_dn_c:
// nrb = H / 256, rows [256·rb, +256) of down over K = I. Producer warp v (0..7, both producer warpgroups) widens the
// tile's 16-row blocks v and v + 8 (two mmw_pl_buf buffers a warp: a raw slot of GPU_MOEC_SLOT bytes a stage),
// warpgroup 1 also copies the tokens straight into the stage (mmw_cp_tok), all MOEC_AHEAD steps ahead. Consumer
// warpgroup 2 + c: A rows [128c, +128) as two m64n128 × the tile's first N tokens (N = 32, 64, 128 by its pairs).
#include "mmw.cuh"

#if MMW_ON
struct __align__(1024) moec_stage {
    uint8_t a[GPU_MOEC_BM * 128];
    uint8_t b[GPU_MMW_BN * 128];
};
static_assert(GPU_MOEC_STAGES * (sizeof(moec_stage) + GPU_MOEC_SLOT) + 1024 <= GPU_MOEC_SMEM && GPU_MOEC_SLOT == 16 * MMW_PL_BUF &&
                  GPU_MOEC_BM == 256,
              "k_moe_up_c: gpu_abi.h's plan");
#define MOEC_AHEAD (GPU_MOEC_STAGES - 2)   // (≤ S − 2, as MMW_AHEAD)

// k_moe_up_c's A rows: source-local row r (r < 128: gate row of output r, else up row of output r − 128) at A row
// 16·((r mod 128) / 8) + 8·(r / 128) + r mod 8, so an mma fragment's rows g and g + 8 are one output's gate and up sums.
__device__ __forceinline__ int moec_arow(int r, bool paired) { return paired ? 16 * ((r & 127) >> 3) + 8 * (r >> 7) + (r & 7) : r; }

// The producers' part: tiles m = 0 .. nt − 1 of this block, steps j = m·KB + kb numbered across them (the raw slots and
// the barriers' phases carry over); src(m, w0, w1, tok): tile m's two 16-row blocks of this warp (weights) and this
// thread's token (-1: none). tokens: this warpgroup copies tokens too.
template <bool PAIRED, class Src>
__device__ __forceinline__ void moec_produce(Src src, int nt, const __nv_bfloat16 *__restrict__ xs, int K, moec_stage *st, uint64_t *full,
                                             uint64_t *empty, const uint32_t *lut, bool tokens) {
    constexpr int S = GPU_MOEC_STAGES, A = MOEC_AHEAD;
    uint8_t *raw = (uint8_t *)(st + S);
    const int KB = K / 64, steps = nt * KB, l = threadIdx.x & 31, v = (threadIdx.x >> 5) & 7, i = threadIdx.x & 127;
    if (mmw_sa(lut) & 255u) __trap();   // (the table not where MM_PL_LUT puts it: mm_pl_lut, loudly)
    mmw_src w0 = {}, w1 = {};
    int tok = -1, m = -1;
    mmw_pl_src p0 = {}, p1 = {};
    auto issue = [&](int j) {   // step j's copies (the steps in turn), none past the last
        if (j >= steps) return;
        const int kb = j % KB, s = j % S;
        if (kb == 0) src(++m, w0, w1, tok), p0 = mmw_pl_at(w0, K), p1 = mmw_pl_at(w1, K);
        if (tokens && j >= S) mmw_wait(&empty[s], (j / S - 1) & 1);   // (its stage released: the tokens go straight in)
        uint8_t *slot = raw + s * GPU_MOEC_SLOT;
        if (l < 18) {
            mm_cp<16>(slot + v * MMW_PL_BUF + 16 * l, p0.p + (size_t)kb * p0.step, p0.v);
            mm_cp<16>(slot + (v + 8) * MMW_PL_BUF + 16 * l, p1.p + (size_t)kb * p1.step, p1.v);
        }
        if (tokens) mmw_cp_tok(st[s].b + (i - l) * 128, xs, tok, K, kb);
    };
    for (int j = 0; j < A; j++) issue(j), mm_cp_commit();
    const int g = (l >> 1) & 7, h = l >> 4;
    // Step j is announced before step j + A's copies are issued: the token warpgroup's issue waits for stage (j + A) % S
    // to be released (the consumers past step j + A − S + 1), which the announcement of step j must not wait on.
    for (int j = 0; j < steps; j++) {
        const int s = j % S;
        mm_cp_wait<A - 1>();   // step j's copies (this lane's own) landed
        __syncwarp();          // and the other lanes'
        if (!tokens && j >= S) mmw_wait(&empty[s], (j / S - 1) & 1);
        const uint8_t *slot = raw + s * GPU_MOEC_SLOT;
        mmw_pl_widen(slot + v * MMW_PL_BUF, st[s].a + moec_arow(16 * v + 8 * h + g, PAIRED) * 128, lut);
        mmw_pl_widen(slot + (v + 8) * MMW_PL_BUF, st[s].a + moec_arow(16 * (v + 8) + 8 * h + g, PAIRED) * 128, lut);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the stores and the direct copies seen by the wgmma
        mmw_arrive(&full[s]);
        __syncwarp();   // (raw slot (j + A) % S was step j + A − S's, widened before; the copies' shuffles converged)
        issue(j + A);
        mm_cp_commit();
    }
    mm_cp_wait<0>();
}

// Consumer warpgroup 2 + c's part of a tile whose first step is j0: d0, d1 = the sums over K (chain order, before the
// scale) of A rows 128c + 16·warp + g + 8(e/2) (d0) and 64 rows further (d1), token 8n + 2t + e % 2 of the first N.
template <int N>
__device__ __forceinline__ void moec_consume(moec_stage *st, uint64_t *full, uint64_t *empty, int K, int c, float (&d0)[64], float (&d1)[64], int j0) {
    constexpr int S = GPU_MOEC_STAGES;
    const int KB = K / 64;
#pragma unroll
    for (int e = 0; e < 64; e++) d0[e] = 0.f, d1[e] = 0.f;
    for (int j = j0; j < j0 + KB; j++) {
        const int s = j % S;
        mmw_wait(&full[s], (j / S) & 1);
        const uint32_t a0 = mmw_sa(st[s].a + 128 * c * 128), b0 = mmw_sa(st[s].b);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int q = 0; q < 4; q++) {
            mmw_mma<N>(d0, mmw_desc(a0 + 32 * q), mmw_desc(b0 + 32 * q));
            mmw_mma<N>(d1, mmw_desc(a0 + 64 * 128 + 32 * q), mmw_desc(b0 + 32 * q));
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        if (j > j0) mmw_arrive(&empty[(j - 1) % S]);   // step j − 1's group has landed: its stage is free
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    mmw_arrive(&empty[(j0 + KB - 1) % S]);
}
__device__ __forceinline__ void moec_consume_n(moec_stage *st, uint64_t *full, uint64_t *empty, int K, int c, float (&d0)[64], float (&d1)[64], int j0,
                                               int cnt) {
    if (cnt <= 32) moec_consume<32>(st, full, empty, K, c, d0, d1, j0);
    else if (cnt <= 64) moec_consume<64>(st, full, empty, K, c, d0, d1, j0);
    else moec_consume<128>(st, full, empty, K, c, d0, d1, j0);
}

// The block's shared state (as mmw_setup): the stages 1,024-aligned, the raw slots after them.
__device__ __forceinline__ moec_stage *moec_setup(uint8_t *smem, uint64_t *full, uint64_t *empty) {
    if (threadIdx.x == 0)
        for (int s = 0; s < GPU_MOEC_STAGES; s++) mmw_bar_init(&full[s], 256), mmw_bar_init(&empty[s], 256);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    return (moec_stage *)(smem + ((1024u - (mmw_sa(smem) & 1023u)) & 1023u));
}
#endif

// hs [P][I] (one bf16 part) = SiLU(gate · xn) · (up · xn) for the pairs of map's items (expert x, first, count; perm);
// xs: xn's one bf16 part [T][K = H].
extern "C" __global__ void __launch_bounds__(GPU_MMW_NT, 1) k_moe_up_c(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                     int items_bound, int K, const __nv_bfloat16 *__restrict__ xs,
                                                                     __nv_bfloat16 *__restrict__ hs, int I) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t moec_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MOEC_STAGES], empty[GPU_MOEC_STAGES];
    MM_PL_LUT(lut);
    __shared__ int pair[2][GPU_MMW_BN];   // the consumers' tiles' pairs, by tile parity
    GPU_DEP();
    const int nrb = I / 128, nt = mmw_tiles(map, nrb);
    if (nt == 0) return;
    const int *perm = map + 1 + 3 * items_bound;
    mm_plane_lut(lut);
    moec_stage *st = moec_setup(moec_smem, full, empty);
    const int H = experts[3 * mmw_tile_at(map, 0, nrb).x].cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    __syncthreads();   // the table and the barriers
    if (wg < 2) {   // producer warp v: 16-row blocks v (gate rows 128rb + 16v ..) and v + 8 (up rows, the same)
        mmw_regs_producer();
        const int v = threadIdx.x >> 5;
        moec_produce<true>(
            [&](int m, mmw_src &w0, mmw_src &w1, int &tok) {
                const mmw_tile tl = mmw_tile_at(map, m, nrb);
                w0 = mmw_src{experts[3 * tl.x], 128 * tl.rb + 16 * v}, w1 = mmw_src{experts[3 * tl.x + 1], 128 * tl.rb + 16 * v};
                tok = i < tl.cnt ? perm[tl.first + i] / K : -1;
            },
            nt, xs, H, st, full, empty, lut, wg == 1);
        return;
    }
    mmw_regs_consumer();
    const int c = wg - 2, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    float d0[64], d1[64];
    for (int m = 0; m < nt; m++) {
        const mmw_tile tl = mmw_tile_at(map, m, nrb);
        if (c == 0) pair[m & 1][i] = i < tl.cnt ? perm[tl.first + i] : -1;
        moec_consume_n(st, full, empty, H, c, d0, d1, m * (H / 64), tl.cnt);
        asm volatile("bar.sync 1, 256;" ::: "memory");   // the tile's pairs in (and every consumer past the tile before's epilogue)
        const float pg = mm_post(experts[3 * tl.x]), pu = mm_post(experts[3 * tl.x + 1]);
        const int *pr = pair[m & 1];
        // d_hf[4n + e]: A row 128c + 64hf + 16·warp + g + 8(e / 2) — output 64c + 32hf + 8·warp + g, its gate (e < 2) and up sums
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float(&d)[64] = hf ? d1 : d0;
            const int row = 128 * tl.rb + 64 * c + 32 * hf + 8 * warp + g;
#pragma unroll
            for (int n = 0; n < 16; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int r = 8 * n + 2 * t + e;
                    if (row < I && pr[r] >= 0) mm_split3(silu(d[4 * n + e] * pg) * (d[4 * n + 2 + e] * pu), hs + (size_t)pr[r] * I + row, 0);
                }
        }
    }
#else
    __trap();   // (gpu_kernels.moe_c is 0 but where this image is the sm_90a cubin's one-part image)
#endif
}

// ye [P][H] = down · h for the pairs of map's items, from hs ([P][I], one bf16 part).
extern "C" __global__ void __launch_bounds__(GPU_MMW_NT, 1) k_moe_dn_c(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                     int items_bound, const __nv_bfloat16 *__restrict__ hs,
                                                                     float *__restrict__ ye, int H) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t moec_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MOEC_STAGES], empty[GPU_MOEC_STAGES];
    MM_PL_LUT(lut);
    __shared__ int pair[2][GPU_MMW_BN];
    GPU_DEP();
    const int nrb = H / GPU_MOEC_BM, nt = mmw_tiles(map, nrb);
    if (nt == 0) return;
    const int *perm = map + 1 + 3 * items_bound;
    mm_plane_lut(lut);
    moec_stage *st = moec_setup(moec_smem, full, empty);
    const int I = experts[3 * mmw_tile_at(map, 0, nrb).x + 2].cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    __syncthreads();
    if (wg < 2) {   // producer warp v: the tile's 16-row blocks v and v + 8
        mmw_regs_producer();
        const int v = threadIdx.x >> 5;
        moec_produce<false>(
            [&](int m, mmw_src &w0, mmw_src &w1, int &tok) {
                const mmw_tile tl = mmw_tile_at(map, m, nrb);
                const gpu_mat &D = experts[3 * tl.x + 2];
                w0 = mmw_src{D, GPU_MOEC_BM * tl.rb + 16 * v}, w1 = mmw_src{D, GPU_MOEC_BM * tl.rb + 16 * (v + 8)};
                tok = i < tl.cnt ? perm[tl.first + i] : -1;
            },
            nt, hs, I, st, full, empty, lut, wg == 1);
        return;
    }
    mmw_regs_consumer();
    const int c = wg - 2, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    float d0[64], d1[64];
    for (int m = 0; m < nt; m++) {
        const mmw_tile tl = mmw_tile_at(map, m, nrb);
        if (c == 0) pair[m & 1][i] = i < tl.cnt ? perm[tl.first + i] : -1;
        moec_consume_n(st, full, empty, I, c, d0, d1, m * (I / 64), tl.cnt);
        asm volatile("bar.sync 1, 256;" ::: "memory");
        const float post = mm_post(experts[3 * tl.x + 2]);
        const int *pr = pair[m & 1];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float(&d)[64] = hf ? d1 : d0;
#pragma unroll
            for (int n = 0; n < 16; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = GPU_MOEC_BM * tl.rb + 128 * c + 64 * hf + 16 * warp + g + 8 * (e >> 1), r = 8 * n + 2 * t + (e & 1);
                    if (row < H && pr[r] >= 0) ye[(size_t)pr[r] * H + row] = d[4 * n + e] * post;
                }
        }
    }
#else
    __trap();
#endif
}
