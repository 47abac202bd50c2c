// sass/mm_w.cu — prompt products y_i = x W_iᵀ of FP8 and NVFP4 weights on wgmma: k_mm_w, for long
// prompt steps where the products read one bf16 part and the cubin is sm_90a (H100 / H200). The
// same sums in the same order as every other shape of sass/mm.cuh (k_mm_g's classes: the 64-blocks
// kb ≡ c (mod GPU_MM_WARPS) in ascending kb, each k16 step q = 0..3 with the kind's k-set
// {64kb + 16t + 4q + j}, a fresh accumulator per class added to the total in class order), so a
// token's outputs are the bits of k_mm_v, _p, _g or _g128. CPU twin: ref_linear.
//
// Why the same bits: one wgmma m64nNk16 sums a token's 16 products of a step as the mma.m16n8k16 of
// the same k do (measured on the H200: no output differs on random, wide-exponent, cancelling and
// bf16 hi/lo operands, nor when the slots of a step are shuffled), so what must hold is which 16 k
// each step takes. wgmma reads both operands from shared memory, K-major rows of 64 bf16 (128 bytes,
// swizzled 128B: 16-byte piece c of row r at c ^ (r & 7)), step q the bytes [32q, 32q + 32) of each
// row. The stages therefore hold each row's k pairs P (k = 2P, 2P + 1 of the 64-block) at pair
// position L = 8q + t + 4h where P = 8t + 2q + h (t = lane % 4 of the mma fragment, h = 0 for its
// slots 2t, 2t+1 and 1 for 2t+8, 2t+9): the weights' pairs as they are widened, the tokens' as they
// are copied, in both operands alike.
//
// A block: rows [GPU_MMW_BM·b, +GPU_MMW_BM) of one matrix of the set (grid.x: the row blocks of
// every matrix, set.first) × tokens [GPU_MMW_BN·blockIdx.y, +GPU_MMW_BN). Warpgroup 0 produces:
// thread i copies weight row i and token i of each 64-block by cp.async into a raw ring of
// GPU_MMW_RAW 64-blocks (its own copies only: no barrier among producers), widens the row to bf16
// (FP8 exactly through bf16 × 2^120, NVFP4 by its block scale: mm_fp8x4, mm_fp4x4) and writes
// both rows to the stage in the order above, then arrives on the stage's `full` barrier.
// Warpgroups 1 and 2 consume rows [64(w − 1), +64) × all GPU_MMW_BN tokens: four wgmma
// m64n128k16 a stage, one group in flight, releasing each stage on its `empty` barrier once its
// group has landed; the class's sum is added to the total after its last group.
#include "mm.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && GPU_MM_PARTS == 1
#define MMW_ON 1
#else
#define MMW_ON 0
#endif

#if MMW_ON
// One stage: the widened weights [GPU_MMW_BM][64] and the tokens [GPU_MMW_BN][64] bf16, swizzled.
struct __align__(1024) mmw_stage {
    uint8_t a[GPU_MMW_BM * 128];
    uint8_t b[GPU_MMW_BN * 128];
};
#define MMW_RAW_BYTES (GPU_MMW_BM * GPU_MMW_RAW_A + GPU_MMW_BN * GPU_MMW_RAW_B)
static_assert(GPU_MMW_STAGES * sizeof(mmw_stage) + GPU_MMW_RAW * MMW_RAW_BYTES + 1024 == GPU_MMW_SMEM, "k_mm_w: gpu_abi.h's plan");
static_assert(GPU_MMW_BM == 128 && GPU_MMW_BN == 128 && GPU_MMW_NT == 384, "k_mm_w: a producer thread per row and token; m64n128 steps");

__device__ __forceinline__ uint32_t mmw_sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mmw_bar_init(uint64_t *b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mmw_sa(b)), "r"(n)); }
__device__ __forceinline__ void mmw_arrive(uint64_t *b) {
    asm volatile("{.reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0];}" ::"r"(mmw_sa(b)) : "memory");
}
__device__ __forceinline__ void mmw_wait(uint64_t *b, uint32_t parity) {
    asm volatile("{.reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W;}" ::"r"(mmw_sa(b)), "r"(parity) : "memory");
}

// The descriptor of a K-major operand at shared address sa: 128-byte rows, 8-row groups 1,024 bytes apart, 128B swizzle.
__device__ __forceinline__ uint64_t mmw_desc(uint32_t sa) {
    return (uint64_t)((sa & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

// d += one k16 step of 64 rows (a, this warpgroup's) × 128 tokens (b): d[4n + e] = row 16·warp + g + 8(e/2), token
// 8n + 2t + e % 2 (mma.m16n8k16's c of n-tile n).
#define MMW_D8(n) "+f"(d[8 * n]), "+f"(d[8 * n + 1]), "+f"(d[8 * n + 2]), "+f"(d[8 * n + 3]), "+f"(d[8 * n + 4]), "+f"(d[8 * n + 5]), "+f"(d[8 * n + 6]), "+f"(d[8 * n + 7])
__device__ __forceinline__ void mmw_mma(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "%64, %65, p, 1, 1, 0, 0;}"
                 : MMW_D8(0), MMW_D8(1), MMW_D8(2), MMW_D8(3), MMW_D8(4), MMW_D8(5), MMW_D8(6), MMW_D8(7)
                 : "l"(a), "l"(b));
}

// The producer's share of 64-block j (class-major order, mmg_kb) into raw slot j % GPU_MMW_RAW: weight row `row` (its
// codes; NVFP4 also its 4 scale bytes after them) and token `tok` (-1: none, zeros); a commit group either way.
template <int KIND>
__device__ __forceinline__ void mmw_issue(const gpu_mat &W, int row, const __nv_bfloat16 *__restrict__ xs, int tok, int K, int j, int KB,
                                          uint8_t *raw, bool weights, bool tokens) {
    if (j < KB) {
        const int kb = mmg_kb(j, KB), i = threadIdx.x;   // (producer threads 0..127)
        uint8_t *ra = raw + (j % GPU_MMW_RAW) * MMW_RAW_BYTES + i * GPU_MMW_RAW_A;
        const bool va = row < W.rows;
        const uint8_t *w = (const uint8_t *)W.w + (size_t)(va ? row : 0) * W.row_bytes;
        if (weights) {
            if (KIND == GPU_W_FP8) {
#pragma unroll
                for (int c = 0; c < 4; c++) mm_cp<16>(ra + 16 * c, w + (size_t)kb * 64 + 16 * c, va);
            } else {   // NVFP4: 32 bytes of codes, the 4 e4m3 scales of the 64-block (t's 16 elements: byte t)
                mm_cp<16>(ra, w + (size_t)kb * 32, va), mm_cp<16>(ra + 16, w + (size_t)kb * 32 + 16, va);
                mm_cp<4>(ra + 32, (const uint8_t *)W.scale + (size_t)(va ? row : 0) * (K / 16) + (size_t)kb * 4, va);
            }
        }
        if (tokens) {
            uint8_t *rb = raw + (j % GPU_MMW_RAW) * MMW_RAW_BYTES + GPU_MMW_BM * GPU_MMW_RAW_A + i * GPU_MMW_RAW_B;
            const __nv_bfloat16 *x = xs + (size_t)(tok >= 0 ? tok : 0) * K + (size_t)kb * 64;
#pragma unroll
            for (int c = 0; c < 8; c++) mm_cp<16>(rb + 16 * c, x + 8 * c, tok >= 0);
        }
    }
}

// The producer's step j: raw slot j % GPU_MMW_RAW (landed) → stage s in wgmma's order (see the top).
template <int KIND>
__device__ __forceinline__ void mmw_fill(const uint8_t *raw, int j, mmw_stage &st) {
    const int i = threadIdx.x;
    const uint8_t *ra = raw + (j % GPU_MMW_RAW) * MMW_RAW_BYTES + i * GPU_MMW_RAW_A;
    const uint8_t *rb = raw + (j % GPU_MMW_RAW) * MMW_RAW_BYTES + GPU_MMW_BM * GPU_MMW_RAW_A + i * GPU_MMW_RAW_B;
    uint32_t lo[16], hi[16];   // [4t + q]: the bf16 pairs P = 8t + 2q (lo) and P + 1 (hi) of the row
    if (KIND == GPU_W_FP8) {   // word 4t + q holds k 16t + 4q + 0..3 (stored c0 c2 c1 c3)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const uint4 v = *(const uint4 *)(ra + 16 * c);
            mm_fp8x4(v.x, lo[4 * c], hi[4 * c]), mm_fp8x4(v.y, lo[4 * c + 1], hi[4 * c + 1]);
            mm_fp8x4(v.z, lo[4 * c + 2], hi[4 * c + 2]), mm_fp8x4(v.w, lo[4 * c + 3], hi[4 * c + 3]);
        }
    } else {   // NVFP4: bytes 8t .. 8t + 7 hold k 16t .. 16t + 15 (low nibble first), scale byte t
        const uint4 c0 = *(const uint4 *)ra, c1 = *(const uint4 *)(ra + 16);
        const uint32_t scw = *(const uint32_t *)(ra + 32), words[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const __nv_bfloat162 sc = __float2bfloat162_rn(dec_e4m3((scw >> (8 * t)) & 0xffu));
#pragma unroll
            for (int q = 0; q < 4; q++) mm_fp4x4(words[2 * t + (q >> 1)] >> ((q & 1) * 16), sc, lo[4 * t + q], hi[4 * t + q]);
        }
    }
    uint8_t *ar = st.a + i * 128;   // piece 2q + h holds words t = 0..3
#pragma unroll
    for (int q = 0; q < 4; q++) {
        *(uint4 *)(ar + (((2 * q) ^ (i & 7)) << 4)) = make_uint4(lo[q], lo[4 + q], lo[8 + q], lo[12 + q]);
        *(uint4 *)(ar + (((2 * q + 1) ^ (i & 7)) << 4)) = make_uint4(hi[q], hi[4 + q], hi[8 + q], hi[12 + q]);
    }
    uint32_t x[32];   // the token's pairs P = 0..31; piece c = 2q + h holds P = 8t + c, t = 0..3
#pragma unroll
    for (int c = 0; c < 8; c++) {
        const uint4 v = *(const uint4 *)(rb + 16 * c);
        x[4 * c] = v.x, x[4 * c + 1] = v.y, x[4 * c + 2] = v.z, x[4 * c + 3] = v.w;
    }
    uint8_t *br = st.b + i * 128;
#pragma unroll
    for (int c = 0; c < 8; c++) *(uint4 *)(br + ((c ^ (i & 7)) << 4)) = make_uint4(x[c], x[8 + c], x[16 + c], x[24 + c]);
}

template <int KIND>
__device__ __forceinline__ void mmw_produce(const gpu_mat &W, int row, const __nv_bfloat16 *__restrict__ xs, int tok, int K, uint8_t *raw,
                                            mmw_stage *st, uint64_t *full, uint64_t *empty) {
    const int KB = K / 64;
    for (int j = 0; j < GPU_MMW_RAW - 1; j++) mmw_issue<KIND>(W, row, xs, tok, K, j, KB, raw, true, false);   // the weights before GPU_DEP
    GPU_DEP();
    for (int j = 0; j < GPU_MMW_RAW - 1; j++) {
        mmw_issue<KIND>(W, row, xs, tok, K, j, KB, raw, false, true);
        mm_cp_commit();
    }
    for (int j = 0; j < KB; j++) {
        const int s = j % GPU_MMW_STAGES;
        mmw_issue<KIND>(W, row, xs, tok, K, j + GPU_MMW_RAW - 1, KB, raw, true, true);   // into the raw slot step j − 1 read
        mm_cp_commit();
        mm_cp_wait<GPU_MMW_RAW - 1>();   // step j's copies (this thread's own) landed
        if (j >= GPU_MMW_STAGES) mmw_wait(&empty[s], (j / GPU_MMW_STAGES - 1) & 1);
        mmw_fill<KIND>(raw, j, st[s]);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the stores seen by the consumers' wgmma
        mmw_arrive(&full[s]);
    }
    mm_cp_wait<0>();
}
#endif

extern "C" __global__ void __launch_bounds__(GPU_MMW_NT, 1) k_mm_w(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t mmw_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MMW_STAGES], empty[GPU_MMW_STAGES];
    mmw_stage *st = (mmw_stage *)(mmw_smem + ((1024u - (mmw_sa(mmw_smem) & 1023u)) & 1023u));
    uint8_t *raw = (uint8_t *)(st + GPU_MMW_STAGES);
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    const int base = ((int)blockIdx.x - set.first[m]) * GPU_MMW_BM, t0 = blockIdx.y * GPU_MMW_BN, K = W.cols, wg = threadIdx.x >> 7;
    if (threadIdx.x == 0)
        for (int s = 0; s < GPU_MMW_STAGES; s++) mmw_bar_init(&full[s], 128), mmw_bar_init(&empty[s], 256);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    if (wg == 0) {
        const int tok = t0 + (int)threadIdx.x < T ? t0 + (int)threadIdx.x : -1;
        if (W.kind == GPU_W_FP8) mmw_produce<GPU_W_FP8>(W, base + threadIdx.x, xs, tok, K, raw, st, full, empty);
        else mmw_produce<GPU_W_NVFP4>(W, base + threadIdx.x, xs, tok, K, raw, st, full, empty);   // (gpu_mm_w_ok: FP8 and NVFP4 only)
        return;
    }
    GPU_DEP();
    const int c = wg - 1, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3, KB = K / 64;
    float acc[64], tot[64];
#pragma unroll
    for (int e = 0; e < 64; e++) acc[e] = 0.f, tot[e] = 0.f;
    const int q8 = KB / GPU_MM_WARPS, r8 = KB % GPU_MM_WARPS;
    int j = 0;
    for (int cls = 0; cls < GPU_MM_WARPS; cls++) {   // (a class without a 64-block adds its zero, as mm_at does)
        const int len = q8 + (cls < r8);
        for (int e = 0; e < len; e++, j++) {
            const int s = j % GPU_MMW_STAGES;
            mmw_wait(&full[s], (j / GPU_MMW_STAGES) & 1);
            const uint32_t a0 = mmw_sa(st[s].a + 64 * c * 128), b0 = mmw_sa(st[s].b);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int q = 0; q < 4; q++) mmw_mma(acc, mmw_desc(a0 + 32 * q), mmw_desc(b0 + 32 * q));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (j > 0) mmw_arrive(&empty[(j - 1) % GPU_MMW_STAGES]);   // step j − 1's group has landed: its stage is free
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int e = 0; e < 64; e++) tot[e] = cls == 0 ? acc[e] : tot[e] + acc[e], acc[e] = 0.f;
    }
    if (j > 0) mmw_arrive(&empty[(j - 1) % GPU_MMW_STAGES]);
    const float post = mm_post(W);
    float *__restrict__ y = (float *)set.y[m];
    const int ldy = set.ldy[m];
#pragma unroll
    for (int n = 0; n < 16; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = base + 64 * c + 16 * warp + g + 8 * (e >> 1), r = 8 * n + 2 * t + (e & 1);
            if (row < W.rows && t0 + r < T) y[(size_t)(t0 + r) * ldy + row] = tot[4 * n + e] * post;
        }
#else
    __trap();   // (gpu_kernels.mm_w_min is 0 but where this image is the sm_90a cubin's one-part image)
#endif
}
