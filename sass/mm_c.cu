// sass/mm_c.cu — k_mm_c: y_i[tok, o] = post_i · Σ_k W_i[o, k] · x[tok, k] for the FP8 matrices of a gpu_lin_set and the
// tokens of a prompt's full pieces, in chain order: one f32 accumulator over K, the 64-blocks in ascending order and in
// each the k16 steps q = 0..3 of k = 64kb + 16q + 0..15 — not k_mm_g's class order, so these tokens' outputs are
// bits of their own. What keeps a sequence's bits whatever the step: a token takes this kernel iff it lies in a full
// piece, GPU_MMC_PIECE tokens at positions [64m, 64m + 64) of one sequence wholly in the step's row (gpu/engine.c:
// gpu_step_meta_at), which depends on the sequence and the position alone — prompts are cut at multiples of 64, and
// decode rows and a verification's rows never hold one. The other tokens take gpu_k_mm's shapes (the class order).
// CPU twin: ref_linear (the products of the one-part rounding of x, within the f32 sums' bound).
//
// Why one accumulator: k_mm_w holds a class's partial sums beside the total (two m64n128 sets a consumer thread);
// one set lets a consumer warpgroup take 64 rows × 256 tokens (m64n256), reading each weight 64-block once for twice
// the tokens, and the block needs one producer warpgroup instead of two.
//
// grid (the row blocks of GPU_MMC_BM rows of every matrix of the set, set.first; token tiles of GPU_MMC_BN / 64 pieces),
// GPU_MMC_NT threads, GPU_MMC_SMEM bytes of dynamic shared memory. pieces[p] is the step's token index of piece p's
// first token (its 64 tokens consecutive in the step); np pieces. Rows past a matrix and pieces past np read zeros and
// write nothing. The set holds FP8 matrices only (gpu_k_mm_c).
//
// Warpgroup 0 produces: thread i copies row i of the tile's 64-block j (the warp's lanes coalesced, mmw_cp_rows) into a
// raw ring of GPU_MMC_RAW slots, widens it to bf16 in natural k order into stage j % GPU_MMC_STAGES (128B swizzle:
// 16-byte piece c of row r at c ^ (r & 7), piece c = k 8c .. 8c + 7), and copies the tile's tokens' 64-block straight
// into the stage (8 lanes a token's 128 bytes, after the consumers released the stage); weights and tokens of a step
// share one commit group. Warpgroups 1 and 2 consume rows [64(wg − 1), +64) × 256 tokens: four wgmma m64n256k16 a
// stage, one group in flight, each stage released on its `empty` barrier once its group has landed.
#include "mmw.cuh"

#if MMW_ON
// One stage: the widened weights [GPU_MMC_BM][64] and the tokens [GPU_MMC_BN][64] bf16, swizzled.
struct __align__(1024) mmc_stage {
    uint8_t a[GPU_MMC_BM * 128];
    uint8_t b[GPU_MMC_BN * 128];
};
static_assert(GPU_MMC_STAGES * sizeof(mmc_stage) + GPU_MMC_RAW * GPU_MMC_BM * GPU_MMC_RAW_A + 1024 == GPU_MMC_SMEM, "k_mm_c: gpu_abi.h's plan");
static_assert(GPU_MMC_BM == 128 && GPU_MMC_BN == 256 && GPU_MMC_NT == 384 && GPU_MMC_RAW_A >= 64, "k_mm_c: a producer thread a row; m64n256");

// The warpgroups' register budgets (setmaxnreg): the block's launch allocation is 384 × 168 = 64,512; the producers
// give back what the consumers (128 sums each) take: 128 · 104 + 256 · 200 = 64,512.
#define GPU_MMC_REG_P 104
#define GPU_MMC_REG_C 200
static_assert(128 * GPU_MMC_REG_P + 256 * GPU_MMC_REG_C <= GPU_MMC_NT * 168, "k_mm_c: registers");

// d += one k16 step of 64 rows (a) × 256 tokens (b): d[4n + e] = row 16·warp + g + 8(e/2), token 8n + 2t + e % 2.
#define MMC_D8(n) "+f"(d[8 * n]), "+f"(d[8 * n + 1]), "+f"(d[8 * n + 2]), "+f"(d[8 * n + 3]), "+f"(d[8 * n + 4]), "+f"(d[8 * n + 5]), "+f"(d[8 * n + 6]), "+f"(d[8 * n + 7])
__device__ __forceinline__ void mmc_mma(float (&d)[128], uint64_t a, uint64_t b) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
                 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
                 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
                 "%128, %129, p, 1, 1, 0, 0;}"
                 : MMC_D8(0), MMC_D8(1), MMC_D8(2), MMC_D8(3), MMC_D8(4), MMC_D8(5), MMC_D8(6), MMC_D8(7), MMC_D8(8), MMC_D8(9), MMC_D8(10),
                   MMC_D8(11), MMC_D8(12), MMC_D8(13), MMC_D8(14), MMC_D8(15)
                 : "l"(a), "l"(b));
}

#endif

extern "C" __global__ void __launch_bounds__(GPU_MMC_NT, 1) k_mm_c(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, const int *__restrict__ pieces,
                                                                   int np) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t mmc_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MMC_STAGES], empty[GPU_MMC_STAGES];
    mmc_stage *st = (mmc_stage *)(mmc_smem + ((1024u - (mmw_sa(mmc_smem) & 1023u)) & 1023u));
    uint8_t *raw = (uint8_t *)(st + GPU_MMC_STAGES);
    if (threadIdx.x == 0)
        for (int s = 0; s < GPU_MMC_STAGES; s++) mmw_bar_init(&full[s], 128), mmw_bar_init(&empty[s], 256);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat &W = set.W[m];
    const int base = ((int)blockIdx.x - set.first[m]) * GPU_MMC_BM, pbase = blockIdx.y * (GPU_MMC_BN / GPU_MMC_PIECE), K = W.cols, KB = K / 64;
    const int wg = threadIdx.x >> 7, i = threadIdx.x & 127, l = threadIdx.x & 31;
    __syncthreads();   // the barriers initialised
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 " MMW_STR(GPU_MMC_REG_P) ";");
        GPU_DEP();   // (the tokens share the weights' commit groups: the wait comes before the first copy)
        const mmw_src w = {W, base + i};
        // this warp's tokens [64 · warp, +64), 4 a copy (8 lanes a token's 128 bytes): one piece, 64 consecutive step rows
        const int warp = i >> 5, pc = l & 7, tok0 = pbase + warp < np ? pieces[pbase + warp] : -1;
        auto issue = [&](int jj) {
            if (jj < KB) {
                const int s = jj % GPU_MMC_STAGES;
                // stage s was last read at step jj − STAGES, released once the consumers took step jj − STAGES + 1
                if (jj >= GPU_MMC_STAGES) mmw_wait(&empty[s], (jj / GPU_MMC_STAGES - 1) & 1);
#pragma unroll
                for (int c = 0; c < 16; c++) {
                    const int u = 4 * c + (l >> 3), tk = 64 * warp + u;
                    const __nv_bfloat16 *x = xs + (size_t)(tok0 >= 0 ? tok0 + u : 0) * K + (size_t)jj * 64 + 8 * pc;
                    mm_cp<16>(st[s].b + tk * 128 + ((pc ^ (tk & 7)) << 4), x, tok0 >= 0);
                }
                mmw_cp_rows<8>(w, raw + (jj % GPU_MMC_RAW) * GPU_MMC_BM * GPU_MMC_RAW_A + (i - l) * GPU_MMC_RAW_A, jj, l);
            }
            mm_cp_commit();
        };
        for (int jj = 0; jj < GPU_MMC_RAW - 1; jj++) issue(jj);
        for (int j = 0; j < KB; j++) {
            const int s = j % GPU_MMC_STAGES;
            __syncwarp();   // every lane's fill of step j − 1 has read the raw slot about to be copied into
            issue(j + GPU_MMC_RAW - 1);
            mm_cp_wait<GPU_MMC_RAW - 1>();   // step j's copies (this lane's own) landed
            __syncwarp();                   // and the other lanes': the rows and tokens are whole
            // row i's 64 bytes (words w = k 4w .. 4w + 3, stored c0 c2 c1 c3) → bf16 pairs lo (k 4w, +1), hi (+2, +3);
            // piece c = k 8c .. 8c + 7 = words 2c, 2c + 1
            const uint8_t *ra = raw + (j % GPU_MMC_RAW) * GPU_MMC_BM * GPU_MMC_RAW_A + i * GPU_MMC_RAW_A;
            uint32_t lo[16], hi[16];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const uint4 v = *(const uint4 *)(ra + 16 * c);
                mm_fp8x4(v.x, lo[4 * c], hi[4 * c]), mm_fp8x4(v.y, lo[4 * c + 1], hi[4 * c + 1]);
                mm_fp8x4(v.z, lo[4 * c + 2], hi[4 * c + 2]), mm_fp8x4(v.w, lo[4 * c + 3], hi[4 * c + 3]);
            }
            uint8_t *ar = st[s].a + i * 128;
#pragma unroll
            for (int c = 0; c < 8; c++) *(uint4 *)(ar + ((c ^ (i & 7)) << 4)) = make_uint4(lo[2 * c], hi[2 * c], lo[2 * c + 1], hi[2 * c + 1]);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the stores and copies seen by the consumers' wgmma
            mmw_arrive(&full[s]);
        }
        mm_cp_wait<0>();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 " MMW_STR(GPU_MMC_REG_C) ";");
    GPU_DEP();
    const int c = wg - 1, warp = i >> 5, g = l >> 2, t = l & 3;
    float acc[128];
#pragma unroll
    for (int e = 0; e < 128; e++) acc[e] = 0.f;
    for (int j = 0; j < KB; j++) {
        const int s = j % GPU_MMC_STAGES;
        mmw_wait(&full[s], (j / GPU_MMC_STAGES) & 1);
        const uint32_t a0 = mmw_sa(st[s].a + 64 * c * 128), b0 = mmw_sa(st[s].b);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int q = 0; q < 4; q++) mmc_mma(acc, mmw_desc(a0 + 32 * q), mmw_desc(b0 + 32 * q));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        if (j > 0) mmw_arrive(&empty[(j - 1) % GPU_MMC_STAGES]);   // step j − 1's group has landed: its stage is free
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    const float post = mm_post(W);
    float *__restrict__ y = (float *)set.y[m];
    const int ldy = set.ldy[m];
    const int row = base + 64 * c + 16 * warp + g;
#pragma unroll
    for (int pp = 0; pp < GPU_MMC_BN / GPU_MMC_PIECE; pp++) {   // the tile's piece pp: n-tiles 8pp .. 8pp + 7
        if (pbase + pp >= np) break;
        float *__restrict__ yp = y + (size_t)pieces[pbase + pp] * ldy;
#pragma unroll
        for (int n = 8 * pp; n < 8 * pp + 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = row + 8 * (e >> 1), u = 8 * (n % 8) + 2 * t + (e & 1);   // token u of the piece
                if (r < W.rows) yp[(size_t)u * ldy + r] = acc[4 * n + e] * post;
            }
    }
#else
    __trap();   // (gpu_kernels.mm_c is 0 but where this image is the sm_90a cubin's one-part image)
#endif
}
