// sass/moe_r.cu — k_moe_up_r and k_moe_dn_r: k_moe_up_c / k_moe_dn_c's products (sass/moe_c.cu: the routed experts'
// chain order for prompts' full pieces, 2-bit plane experts, one bf16 part, the sm_90a cubin) with the weights' A
// operand from registers: each consumer thread widens its own mma fragments from the planes' codes in shared memory
// (format/PLANES.md §3; the nibble table, mm_pl_lut), so a stage holds the tokens' 64-block and the tile's raw codes
// (GPU_MOER_STAGE bytes) where k_moe_up_c's held the widened rows too — GPU_MOER_STAGES stages in the same memory —
// and no producer widens. The same sums in the same order as k_moe_up_c / k_moe_dn_c (a wgmma's rows are independent
// sums, the k16 steps ascending over K, m64n128k16 each): the same bits. CPU twin: ref_moe (moet.c). The engine's chain
// path (gpu/engine.c moe_chain) takes these; k_moe_up_c / k_moe_dn_c stay as the same products' other design, which
// test_gpu (kernel_moe_c) checks these against bit for bit and the kernel harness times beside them.
//
// Why: with the widened rows in shared memory k_moe_up_c had room for four stages, two ahead (~9 KB of copies in
// flight a multiprocessor): at a few tokens a tile each step waited on copies issued two steps before. Here ten
// stages, eight ahead. (On an H100, HK_ACT=bf16 harness, Qwen3.6's shapes: at 64 tokens up 234.8 µs against _c's
// 267.1, at 8,192 tokens 902.6 against 1,107.1, down 586.4 against 667.5.)
//
// A block: GPU_MOER_NT threads; warpgroup 0 copies (cp.async: the tile's sixteen 16-row blocks' codes and scales of
// the 64-block, MMW_PL_BUF bytes each as the file stores them, and the tile's tokens straight into the stage, 128B
// swizzle: mmw_cp_tok), MOER_AHEAD steps ahead; warpgroups 1 and 2 (consumer c = w − 1) each hold 128 A rows as two
// m64n128 accumulators d0, d1 over the tile's 128 token rows (rows past its pairs: stale, their columns never written). Tiles as k_moe_up_w's (persistent: mmw_tile_at).
// k_moe_up_r: consumer c's d0 = gate rows of outputs 128rb + 64c + [0, 64), d1 = up rows of the same outputs (16-row
// block b = 8c + 4m + w of the stage: m 0 gate, 1 up; warp w's rows 16w .. 16w + 15 of each), so a thread holds an
// output's gate and up sums of the same token in d0[e] and d1[e]. k_moe_dn_r: block b = 8c + 4m + w holds down rows
// 256rb + 128c + 64m + 16w + [0, 16).
//
// A lane's fragment (wgmma's register A per warp = mma.m16n8k16's A) of k16 step q, natural k (the tokens' order in the
// stage): a0 = (row g, k 16q + 2t, +1), a1 = (row g + 8, the same k), a2, a3 = k + 8. In a block's [g][tp][x, y, z, w]
// code words (word t' of a row holds its codes of k 16q + 4t' + j in byte q), k 16q + 2t, +1 is nibble 2q + (t & 1) of
// word t >> 1, k + 8 the same nibble of word 2 + (t >> 1): the words (row g, row g + 8) at 32g + 8(t >> 1) (tp 0) and
// 32g + 16 + 8(t >> 1) (tp 1); scale bytes 256 + g, 264 + g (q < 2; rows g, g + 8) and 272 + g, 280 + g (q ≥ 2).
#include "mmw.cuh"

#if MMW_ON
struct __align__(1024) moer_stage {
    uint8_t b[GPU_MMW_BN * 128];
    uint8_t codes[16 * MMW_PL_BUF];
    uint8_t pad[GPU_MOER_STAGE - GPU_MMW_BN * 128 - 16 * MMW_PL_BUF];
};
static_assert(sizeof(moer_stage) == GPU_MOER_STAGE && GPU_MOER_STAGES * GPU_MOER_STAGE + 1024 <= GPU_MOER_SMEM && GPU_MOER_NT == 384,
              "k_moe_up_r: gpu_abi.h's plan");
#define MOER_AHEAD (GPU_MOER_STAGES - 2)   // (≤ S − 2, as MMW_AHEAD)
// The warpgroups' registers (setmaxnreg): a thread starts with GPU_MOER_REG_0 (65,536 / 384 rounded down to 8, what
// ptxas gives a block of 384), and .inc takes only what the block's own .dec released — the consumers' two
// warpgroups' gain must equal the producer's loss, or they wait for registers forever: P + 2C = 3 · REG_0.
// (Producer 56: 8 bytes of its state spill in k_moe_up_r; consumers 224: the products in flight, no C7512.)
#define GPU_MOER_REG_0 168
#define GPU_MOER_REG_P 56
#define GPU_MOER_REG_C 224
static_assert(GPU_MOER_REG_P + 2 * GPU_MOER_REG_C == 3 * GPU_MOER_REG_0 && 384 * GPU_MOER_REG_0 <= 65536, "k_moe_up_r: registers");

// d += one k16 step of 64 rows × the tile's 128 tokens with A from registers (a: this lane's fragment), d as mmw_mma's.
// (m64n128 only: narrower products beside it leave ptxas too few registers to keep the products in flight, C7512.)
__device__ __forceinline__ void moer_mma(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1, 0;}"
                 : MMW_D8(0), MMW_D8(1), MMW_D8(2), MMW_D8(3), MMW_D8(4), MMW_D8(5), MMW_D8(6), MMW_D8(7)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// A lane's fragments of one 64-block: [m][q] for its warp's rows of d0 (m 0) and d1 (m 1).
struct moer_frag {
    uint32_t a[2][4][4];
};
// Widen them from the stage's codes: consumer c's blocks 8c + 4m + warp. la: the nibble table's address.
__device__ __forceinline__ void moer_widen(moer_frag &f, const moer_stage &st, int c, int warp, int g, int t, uint32_t la) {
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const uint8_t *blk = st.codes + (8 * c + 4 * m + warp) * MMW_PL_BUF;
        const uint2 lo = *(const uint2 *)(blk + 32 * g + 8 * (t >> 1)), hi = *(const uint2 *)(blk + 32 * g + 16 + 8 * (t >> 1));
        uint32_t e0, o0, e1, o1, e2, o2, e3, o3;   // (mm_pl_idx: e the nibbles of codes 0, 1 — t even — o of codes 2, 3)
        mm_pl_idx(lo.x, e0, o0), mm_pl_idx(lo.y, e1, o1), mm_pl_idx(hi.x, e2, o2), mm_pl_idx(hi.y, e3, o3);
        const bool od = t & 1;
        const uint32_t ig = od ? o0 : e0, ih = od ? o1 : e1, jg = od ? o2 : e2, jh = od ? o3 : e3;
        const uint32_t bg0 = mm_plane_base(blk[256 + g]), bh0 = mm_plane_base(blk[264 + g]), bg1 = mm_plane_base(blk[272 + g]),
                       bh1 = mm_plane_base(blk[280 + g]);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t bg = q < 2 ? bg0 : bg1, bh = q < 2 ? bh0 : bh1;
            f.a[m][q][0] = bg + mm_pl_lut(ig, la, q), f.a[m][q][1] = bh + mm_pl_lut(ih, la, q);
            f.a[m][q][2] = bg + mm_pl_lut(jg, la, q), f.a[m][q][3] = bh + mm_pl_lut(jh, la, q);
        }
    }
}
__device__ __forceinline__ void moer_issue(float (&d0)[64], float (&d1)[64], const moer_frag &f, const moer_stage &st) {
    const uint32_t b0 = mmw_sa(st.b);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int q = 0; q < 4; q++) moer_mma(d0, f.a[0][q], mmw_desc(b0 + 32 * q)), moer_mma(d1, f.a[1][q], mmw_desc(b0 + 32 * q));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Consumer c's part of a tile whose first step is j0 (KB = K / 64 steps, even): d0, d1 the sums over K (chain order,
// before the scale). Two steps an iteration, their fragments in fa and fb (each a variable of its own): a buffer is
// widened again only once the products that read it have landed (wait_group 1 after the next step's issue), so step
// j + 1's widening runs while step j's products do.
__device__ __forceinline__ void moer_consume(moer_stage *st, uint64_t *full, uint64_t *empty, int K, int c, float (&d0)[64], float (&d1)[64],
                                             int j0, uint32_t la) {
    constexpr int S = GPU_MOER_STAGES;
    const int KB = K / 64, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;

#pragma unroll
    for (int e = 0; e < 64; e++) d0[e] = 0.f, d1[e] = 0.f;
    moer_frag fa, fb;
    mmw_wait(&full[j0 % S], (j0 / S) & 1);
    moer_widen(fa, st[j0 % S], c, warp, g, t, la);
    for (int j = j0; j < j0 + KB; j += 2) {
        moer_issue(d0, d1, fa, st[j % S]);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");   // step j − 1's products landed (fb free)
        if (j > j0) mmw_arrive(&empty[(j - 1) % S]);                      // and its stage
        mmw_wait(&full[(j + 1) % S], ((j + 1) / S) & 1);
        moer_widen(fb, st[(j + 1) % S], c, warp, g, t, la);
        moer_issue(d0, d1, fb, st[(j + 1) % S]);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");   // step j's (fa free)
        mmw_arrive(&empty[j % S]);
        if (j + 2 < j0 + KB) mmw_wait(&full[(j + 2) % S], ((j + 2) / S) & 1), moer_widen(fa, st[(j + 2) % S], c, warp, g, t, la);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    mmw_arrive(&empty[(j0 + KB - 1) % S]);
}
// The producer warpgroup: tiles m = 0 .. nt − 1, steps j = m·KB + kb; src(m, b) = tile m's 16-row block b's source
// (every lane), tok(m) this thread's token of tile m (-1: none). Thread i copies pieces i, i + 128, i + 256 (< 288) of
// the sixteen blocks' MMW_PL_BUF bytes (piece p: block p / 18, its piece p % 18: mmw_pl_at's) and its warp the tokens.
template <class Src, class Tok>
__device__ __forceinline__ void moer_produce(Src src, Tok tokf, int nt, const __nv_bfloat16 *__restrict__ xs, int K, moer_stage *st, uint64_t *full,
                                             uint64_t *empty) {
    constexpr int S = GPU_MOER_STAGES, A = MOER_AHEAD;
    const int KB = K / 64, steps = nt * KB, i = threadIdx.x & 127, l = threadIdx.x & 31;
    mmw_pl_src ps[3] = {};
    int tok = -1, m = -1;
    auto issue = [&](int j) {
        if (j >= steps) return;
        const int kb = j % KB, s = j % S;
        if (kb == 0) {
            ++m, tok = tokf(m);
#pragma unroll
            for (int r = 0; r < 3; r++) {   // piece p = i + 128r of block p / 18: lane-independent sources, so mmw_pl_at's per lane
                const int p = i + 128 * r;
                if (p < 16 * 18) {
                    const mmw_src w = src(m, p / 18);
                    const int k = p % 18;
                    const bool v = w.row < w.W.rows;
                    const size_t nb = (size_t)(v ? w.row : 0) / 16;
                    ps[r] = k < 16 ? mmw_pl_src{(const uint8_t *)w.W.w + nb * (K / 64) * 256 + 16 * k, 256, v}
                                   : mmw_pl_src{(const uint8_t *)w.W.scale + nb * (K / 32) * 16 + 16 * (k - 16), 32, v};
                }
            }
        }
        if (j >= S) mmw_wait(&empty[s], (j / S - 1) & 1);   // the stage released by both consumers
#pragma unroll
        for (int r = 0; r < 3; r++) {
            const int p = i + 128 * r;
            if (p < 16 * 18) mm_cp<16>(st[s].codes + (p / 18) * MMW_PL_BUF + 16 * (p % 18), ps[r].p + (size_t)kb * ps[r].step, ps[r].v);
        }
        mmw_cp_tok(st[s].b + (i - l) * 128, xs, tok, K, kb);
    };
    // Step j's stage is announced before step j + A's copies are issued (whose stage the consumers release only after
    // step j + A − S + 1's products are in flight): the announcement never waits on the consumers.
    for (int j = 0; j < A; j++) issue(j), mm_cp_commit();
    for (int j = 0; j < steps; j++) {
        mm_cp_wait<A - 1>();   // step j's copies (this lane's own) landed
        __syncwarp();          // and the other lanes' (the tokens' copies serve each other's rows)
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the tokens seen by the wgmma
        mmw_arrive(&full[j % S]);
        issue(j + A);
        mm_cp_commit();
    }
    mm_cp_wait<0>();
}

__device__ __forceinline__ moer_stage *moer_setup(uint8_t *smem, uint64_t *full, uint64_t *empty) {
    if (threadIdx.x == 0)
        for (int s = 0; s < GPU_MOER_STAGES; s++) mmw_bar_init(&full[s], 128), mmw_bar_init(&empty[s], 256);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    return (moer_stage *)(smem + ((1024u - (mmw_sa(smem) & 1023u)) & 1023u));
}
#endif

// hs [P][I] (one bf16 part) = SiLU(gate · xn) · (up · xn) for the pairs of map's items; xs: xn's one bf16 part [T][H].
extern "C" __global__ void __launch_bounds__(GPU_MOER_NT, 1) k_moe_up_r(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                      int items_bound, int K, const __nv_bfloat16 *__restrict__ xs,
                                                                      __nv_bfloat16 *__restrict__ hs, int I) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t moer_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MOER_STAGES], empty[GPU_MOER_STAGES];
    MM_PL_LUT(lut);
    __shared__ int pair[2][GPU_MMW_BN];
    GPU_DEP();
    const int nrb = I / 128, nt = mmw_tiles(map, nrb);
    if (nt == 0) return;
    const int *perm = map + 1 + 3 * items_bound;
    mm_plane_lut(lut);
    moer_stage *st = moer_setup(moer_smem, full, empty);
    const int H = experts[3 * mmw_tile_at(map, 0, nrb).x].cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 " MMW_STR(GPU_MOER_REG_P) ";");
        moer_produce(
            [&](int m, int b) {   // block b = 8c + 4mm + w: gate (mm 0) or up rows 128rb + 64c + 16w ..
                const mmw_tile tl = mmw_tile_at(map, m, nrb);
                return mmw_src{experts[3 * tl.x + ((b >> 2) & 1)], 128 * tl.rb + 64 * (b >> 3) + 16 * (b & 3)};
            },
            [&](int m) {
                const mmw_tile tl = mmw_tile_at(map, m, nrb);
                return i < tl.cnt ? perm[tl.first + i] / K : -1;
            },
            nt, xs, H, st, full, empty);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 " MMW_STR(GPU_MOER_REG_C) ";");
    const int c = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const uint32_t la = mmw_sa(lut);
    float d0[64], d1[64];
    for (int m = 0; m < nt; m++) {
        const mmw_tile tl = mmw_tile_at(map, m, nrb);
        if (c == 0) pair[m & 1][i] = i < tl.cnt ? perm[tl.first + i] : -1;
        moer_consume(st, full, empty, H, c, d0, d1, m * (H / 64), la);
        asm volatile("bar.sync 1, 256;" ::: "memory");   // the tile's pairs in (and every consumer past the tile before's epilogue)
        const float pg = mm_post(experts[3 * tl.x]), pu = mm_post(experts[3 * tl.x + 1]);
        const int *pr = pair[m & 1];
        // d0[4n + e], d1[4n + e]: output 128rb + 64c + 16·warp + g + 8(e / 2), its gate and up sums, token 8n + 2t + e % 2
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = 128 * tl.rb + 64 * c + 16 * warp + g + 8 * (e >> 1), r = 8 * n + 2 * t + (e & 1);
                if (row < I && pr[r] >= 0) mm_split3(silu(d0[4 * n + e] * pg) * (d1[4 * n + e] * pu), hs + (size_t)pr[r] * I + row, 0);
            }
    }
#else
    __trap();   // (gpu_kernels.moe_w is 0 but where this image is the sm_90a cubin's one-part image)
#endif
}

// ye [P][H] = down · h for the pairs of map's items, from hs ([P][I], one bf16 part).
extern "C" __global__ void __launch_bounds__(GPU_MOER_NT, 1) k_moe_dn_r(const gpu_mat *__restrict__ experts, const int *__restrict__ map,
                                                                      int items_bound, const __nv_bfloat16 *__restrict__ hs,
                                                                      float *__restrict__ ye, int H) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t moer_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MOER_STAGES], empty[GPU_MOER_STAGES];
    MM_PL_LUT(lut);
    __shared__ int pair[2][GPU_MMW_BN];
    GPU_DEP();
    const int nrb = H / GPU_MOEC_BM, nt = mmw_tiles(map, nrb);
    if (nt == 0) return;
    const int *perm = map + 1 + 3 * items_bound;
    mm_plane_lut(lut);
    moer_stage *st = moer_setup(moer_smem, full, empty);
    const int I = experts[3 * mmw_tile_at(map, 0, nrb).x + 2].cols, wg = threadIdx.x >> 7, i = threadIdx.x & 127;
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 " MMW_STR(GPU_MOER_REG_P) ";");
        moer_produce(
            [&](int m, int b) {   // block b: down rows 256rb + 16b ..
                const mmw_tile tl = mmw_tile_at(map, m, nrb);
                return mmw_src{experts[3 * tl.x + 2], GPU_MOEC_BM * tl.rb + 16 * b};
            },
            [&](int m) {
                const mmw_tile tl = mmw_tile_at(map, m, nrb);
                return i < tl.cnt ? perm[tl.first + i] : -1;
            },
            nt, hs, I, st, full, empty);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 " MMW_STR(GPU_MOER_REG_C) ";");
    const int c = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    const uint32_t la = mmw_sa(lut);
    float d0[64], d1[64];
    for (int m = 0; m < nt; m++) {
        const mmw_tile tl = mmw_tile_at(map, m, nrb);
        if (c == 0) pair[m & 1][i] = i < tl.cnt ? perm[tl.first + i] : -1;
        moer_consume(st, full, empty, I, c, d0, d1, m * (I / 64), la);
        asm volatile("bar.sync 1, 256;" ::: "memory");
        const float post = mm_post(experts[3 * tl.x + 2]);
        const int *pr = pair[m & 1];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {   // d_hf: block 8c + 4hf + warp = rows 256rb + 128c + 64hf + 16·warp ..
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
