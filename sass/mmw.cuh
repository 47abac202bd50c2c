// sass/mmw.cuh — the warp-specialised wgmma product of the prompt kernels k_mm_w (mm_w.cu: dense FP8 and NVFP4
// matrices) and k_moe_up_w / k_moe_dn_w (moe_w.cu: the routed experts, NVFP4 or 2-bit planes), for long prompt steps
// where the products read one bf16 part and the cubin is sm_90a (H100 / H200). The same sums in the same order as every
// other shape of sass/mm.cuh (k_mm_g's classes: the 64-blocks kb ≡ c (mod GPU_MM_WARPS) in ascending kb, each k16 step
// q = 0..3 with the kind's k-set — FP8, NVFP4, BF16 {64kb + 16t + 4q + j}, PLANES {64kb + 16q + 4t + j} — a fresh
// accumulator per class added to the total in class order), so a token's outputs are the bits of every other shape.
//
// Why the same bits: one wgmma m64nNk16 sums a token's 16 products of a step as the mma.m16n8k16 of the same k do
// (measured on the H200: no output differs on random, wide-exponent, cancelling and bf16 hi/lo operands, nor when the
// slots of a step are shuffled), so what must hold is which 16 k each step takes. wgmma reads both operands from shared
// memory, K-major rows of 64 bf16 (128 bytes, swizzled 128B: 16-byte piece c of row r at c ^ (r & 7)), step q the bytes
// [32q, 32q + 32) of each row. The stages therefore hold each row's k pairs P (k = 2P, 2P + 1 of the 64-block) at pair
// position L = 8q + t + 4h, where P = 8t + 2q + h (FP8, NVFP4) — t = lane % 4 of the mma fragment, h = 0 for its slots
// 2t, 2t+1 and 1 for 2t+8, 2t+9 — the weights' pairs as they are widened, the tokens' as they are copied, in both
// operands alike; PLANES' steps take k 16q .. 16q + 15, so there the natural order L = P serves, and the tokens are
// copied straight into the stages (mmw_plan).
//
// A block: GPU_MMW_BM weight rows (the A tile; where they come from is the kernel's: mmw_src) × GPU_MMW_BN tokens.
// Two warpgroups produce, each by cp.async into its part of a raw ring of 64-blocks (a warp's lanes copy its 32
// threads' shares together, coalesced, and wait for them with a warp barrier: no barrier among warps). FP8, NVFP4: in
// warpgroup 0 thread i's share is row i of the tile's weights, which it widens to bf16 (FP8 exactly through bf16 ×
// 2^120, NVFP4 by its block scale: mm_fp8x4, mm_fp4x4) and writes to the stage in the order above; in warpgroup 1 thread
// i's share is token i of each 64-block, which it writes to the stage in the same order. PLANES: producer warp v (0..7
// over both warpgroups) copies the tile's 16-row block v as the file stores it into a buffer of its own (mmw_pl_buf)
// and its threads widen it by their UE8M0 scale (mm_plane_base + the nibble table) — thread (g, tp, h = lane / 16) row
// 8h + g, words t = 2tp, +1 — and warpgroup 1 also copies the tokens straight into the stages. Every producer thread
// arrives on the stage's `full` barrier. Warpgroups 2 and 3 consume A rows [64(w − 2), +64) × all GPU_MMW_BN tokens (mmw_consume): four wgmma
// m64n128k16 a stage, one group in flight, releasing each stage on its `empty` barrier once its group has landed; a
// class's sum is added to the total after its last group. Registers (setmaxnreg): GPU_MMW_REG_P a producer thread,
// GPU_MMW_REG_C a consumer thread (its 64 sums and 64 partial sums).
#pragma once
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

// A kind's plan (gpu_abi.h): FP8 and NVFP4 — GPU_MMW_STAGES stages, raw slots of weights and tokens (the tokens'
// pairs reordered by mmw_fill_b); 2-bit planes (direct) — the tokens copied straight into GPU_MMW_STAGES_PL stages in
// their natural k order (the planes' step q takes k 16q .. 16q + 15 of its 64-block: natural bytes [32q, 32q + 32) of a
// row, and mmw_fill_pl writes the weights' pairs in that order too), a raw slot of the weights alone (the producer
// warps' buffers, GPU_MMW_PL_SLOT bytes) a stage. R raw slots of `slot` bytes.
template <int KIND>
struct mmw_plan {
    static constexpr bool direct = KIND == GPU_W_PLANES;
    static constexpr int S = direct ? GPU_MMW_STAGES_PL : GPU_MMW_STAGES;
    static constexpr int R = direct ? GPU_MMW_STAGES_PL : GPU_MMW_RAW;
    static constexpr int slot = direct ? GPU_MMW_PL_SLOT : MMW_RAW_BYTES;
};
static_assert(GPU_MMW_STAGES_PL * (sizeof(mmw_stage) + GPU_MMW_PL_SLOT) + 1024 <= GPU_MMW_SMEM_MOE &&
                  GPU_MMW_SMEM <= GPU_MMW_SMEM_MOE && GPU_MMW_STAGES_PL >= GPU_MMW_STAGES, "mmw: gpu_abi.h's plans");
// The raw ring of a kind's plan: after its stages.
template <int KIND>
__device__ __forceinline__ uint8_t *mmw_raw(mmw_stage *st) { return (uint8_t *)(st + mmw_plan<KIND>::S); }
static_assert(GPU_MMW_BM == 128 && GPU_MMW_BN == 128 && GPU_MMW_NT == 512, "mmw: a producer thread per row and one per token; m64n128 steps");
static_assert(GPU_MMW_RAW_A >= 64 + 16 && GPU_MMW_RAW_B == 128, "mmw: a raw weight share (FP8 64, NVFP4 36 bytes), a token (its pieces swizzled in a line)");

// The warpgroups' register budgets (setmaxnreg; the block's 65,536 registers: 2 · 128 · P + 2 · 128 · C).
#define GPU_MMW_REG_P 88
#define GPU_MMW_REG_C 168
static_assert(256 * GPU_MMW_REG_P + 256 * GPU_MMW_REG_C <= 65536 && GPU_MMW_REG_P % 8 == 0 && GPU_MMW_REG_C % 8 == 0, "mmw: registers");
#define MMW_STR2(x) #x
#define MMW_STR(x) MMW_STR2(x)
__device__ __forceinline__ void mmw_regs_producer() { asm volatile("setmaxnreg.dec.sync.aligned.u32 " MMW_STR(GPU_MMW_REG_P) ";"); }
__device__ __forceinline__ void mmw_regs_consumer() { asm volatile("setmaxnreg.inc.sync.aligned.u32 " MMW_STR(GPU_MMW_REG_C) ";"); }

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

// d += one k16 step of 64 rows (a, this warpgroup's) × the first N tokens (b; N = 32, 64 or 128): d[4n + e] = row
// 16·warp + g + 8(e/2), token 8n + 2t + e % 2 (mma.m16n8k16's c of n-tile n), n < N / 8 (the rest untouched). A token's
// sums are the same bits whatever N (each n-tile of 8 tokens its own columns).
#define MMW_D8(n) "+f"(d[8 * n]), "+f"(d[8 * n + 1]), "+f"(d[8 * n + 2]), "+f"(d[8 * n + 3]), "+f"(d[8 * n + 4]), "+f"(d[8 * n + 5]), "+f"(d[8 * n + 6]), "+f"(d[8 * n + 7])
template <int N>
__device__ __forceinline__ void mmw_mma(float (&d)[64], uint64_t a, uint64_t b) {
    static_assert(N == 32 || N == 64 || N == 128, "mmw_mma: m64n32, m64n64, m64n128");
    if constexpr (N == 128)
        asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                     "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                     "%64, %65, p, 1, 1, 0, 0;}"
                     : MMW_D8(0), MMW_D8(1), MMW_D8(2), MMW_D8(3), MMW_D8(4), MMW_D8(5), MMW_D8(6), MMW_D8(7)
                     : "l"(a), "l"(b));
    else if constexpr (N == 64)
        asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                     "%32, %33, p, 1, 1, 0, 0;}"
                     : MMW_D8(0), MMW_D8(1), MMW_D8(2), MMW_D8(3)
                     : "l"(a), "l"(b));
    else
        asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;}"
                     : MMW_D8(0), MMW_D8(1)
                     : "l"(a), "l"(b));
}

// Producer thread i's weights: FP8, NVFP4 — row `row` of W (A row i of the tile); PLANES — the 16-row block of W from
// row `row` (a multiple of 16; A rows 16(i / 16) + 0..15, of which this thread's are g = (i / 2) % 8 and g + 8, words
// t = 2(i % 2), +1 of each step). Past W's rows: zeros.
struct mmw_src {
    gpu_mat W;
    int row;
};

// A producer warp's copies of a 64-block, coalesced: its 32 threads' rows (each thread's share lands in its own raw
// slot, which mmw_fill_a / mmw_fill_b read) taken R rows a copy instruction, 32 / R lanes a row in 16-byte pieces, so an
// instruction reads R whole runs of bytes (R lines; a lane's own row each would read 32) and each 32-byte sector once
// (16-byte pieces of 32 rows at a time fetched every sector twice). FP8 rows (64 bytes): R = 8; NVFP4 codes (32): 16;
// tokens (128): 4. Copy c, lane l: warp row mmw_crow<R>(c, l), piece mmw_cpiece<R>(l). Within each eight lanes (one
// wavefront of 16-byte shared-memory writes) the rows are picked so their slots (GPU_MMW_RAW_A = 80 bytes apart) fall
// on distinct banks: FP8 rows k and k + 4 (320 bytes apart: the two halves of 128), NVFP4 rows 0, 2, 4, 6 or 1, 3, 5, 7
// (four disjoint 32-byte windows of 128). The planes' shares are contiguous already: each thread copies its own.
template <int R>
__device__ __forceinline__ int mmw_crow(int c, int l) {
    if (R == 8) {
        const int sub = l >> 2;
        return 8 * c + (sub >> 1) + 4 * (sub & 1);
    }
    if (R == 16) {
        const int ph = l >> 3, j = (l >> 1) & 3;
        return 16 * c + 8 * (ph >> 1) + 2 * j + (ph & 1);
    }
    return 4 * c + (l >> 3);
}
template <int R>
__device__ __forceinline__ int mmw_cpiece(int l) {
    return l & (32 / R - 1);
}
// The row of W of the warp's thread (lane) u, -1 past W (every lane calls it: a shuffle of the threads' own rows).
__device__ __forceinline__ int mmw_wrow(const mmw_src &w, int u) {
    const int r = __shfl_sync(0xffffffffu, w.row, u);
    return r < w.W.rows ? r : -1;
}

// The warp's coalesced copies of its rows' 64-block kb (R rows a copy, 512 / R bytes a row: FP8's 64, NVFP4's 32 of codes)
// into their shares from rw, the warp's first (lane l's: rows mmw_crow, piece mmw_cpiece).
template <int R>
__device__ __forceinline__ void mmw_cp_rows(const mmw_src &w, uint8_t *rw, int kb, int l) {
    const int pc = mmw_cpiece<R>(l);
#pragma unroll
    for (int c = 0; c < 32 / R; c++) {
        const int r = mmw_wrow(w, mmw_crow<R>(c, l));
        const uint8_t *p = (const uint8_t *)w.W.w + (size_t)(r >= 0 ? r : 0) * w.W.row_bytes + (size_t)kb * (512 / R) + 16 * pc;
        mm_cp<16>(rw + mmw_crow<R>(c, l) * GPU_MMW_RAW_A + 16 * pc, p, r >= 0);
    }
}

// The planes' copies by warps: producer warp v's threads widen the tile's 16-row block v (thread (g, tp, h): row 8h + g,
// words t = 2tp, 2tp + 1), which the warp copies into a buffer of its own in the raw slot, contiguous (MMW_PL_BUF bytes:
// the block's 256 code bytes of the 64-block as the file stores them, [g][tp][x, y, z, w], then its 32 scale bytes
// [2 k-blocks][16 rows]; 18 pieces of 16 bytes, lanes 0..17), so that a copy instruction writes a few 128-byte lines of
// shared memory — per-thread shares 80 bytes apart cost a line each.
#define MMW_PL_BUF 288
static_assert(8 * MMW_PL_BUF == GPU_MMW_PL_SLOT, "mmw: the planes' eight warp buffers, a raw slot");

// A lane's source of one piece at 64-block 0 and its bytes a 64-block; rows past W: nothing (zeros).
struct mmw_pl_src {
    const uint8_t *p;
    int step;
    bool v;
};
// The calling lane's piece (lane l < 18: piece l) of the warp's block, whose first row is w.row (every lane's).
__device__ __forceinline__ mmw_pl_src mmw_pl_at(const mmw_src &w, int K) {
    const int l = threadIdx.x & 31, k = l < 18 ? l : 0;
    const bool v = w.row < w.W.rows && l < 18;
    const size_t nb = (size_t)(w.row < w.W.rows ? w.row : 0) / 16;
    if (k < 16) return mmw_pl_src{(const uint8_t *)w.W.w + nb * (K / 64) * 256 + 16 * k, 256, v};
    return mmw_pl_src{(const uint8_t *)w.W.scale + nb * (K / 32) * 16 + 16 * (k - 16), 32, v};
}

// The calling producer warp's buffer in raw slot `slot` (warp v = threadIdx.x / 32 of the two producer warpgroups).
__device__ __forceinline__ uint8_t *mmw_pl_buf(const uint8_t *slot) { return (uint8_t *)slot + ((threadIdx.x >> 5) & 7) * MMW_PL_BUF; }

// A producer warp's copies of 64-block kb into raw slot j % GPU_MMW_RAW (j: the producer's step, mmw_produce; the
// plan's slots, mmw_plan) — the 2-bit planes' tokens straight into stage st (j's, in the same swizzle as a raw row's):
// with weights each thread's share of them (FP8 64 bytes; NVFP4 32 of codes and the 4 e4m3 scales of the 64-block;
// PLANES the warp's 16-row block into its buffer, mmw_pl_at's pieces ps), with tokens each thread's token of xs
// ([·][K]; -1: none, nothing copied — that token's column of the products is never written back, whatever its stage
// row holds) — FP8, NVFP4's codes and the tokens by the warp's coalesced copies (mmw_crow: the rows of other lanes, their threads'
// own w.row and tok by shuffles), the rest by each thread for itself; a token's 16-byte pieces swizzled in its 128-byte
// raw row (piece c of token u at c ^ (u % 8): a copy instruction writes four whole lines, mmw_fill_b's reads meet eight
// bank groups). A thread's share has landed once the copies of its whole warp have (mmw_produce).
// A warp's copies of its 32 threads' tokens' 64-block kb (thread u's token tok, -1: none, nothing copied) into 128-byte
// rows from rb (the warp's first; 4 tokens a copy instruction, 8 lanes a token), each row's 16-byte piece c at c ^ (u % 8)
// (mmw_fill_b's raw rows, and wgmma's 128B swizzle where the rows are a stage's).
__device__ __forceinline__ void mmw_cp_tok(uint8_t *rb, const __nv_bfloat16 *__restrict__ xs, int tok, int K, int kb) {
    const int l = threadIdx.x & 31, pc = mmw_cpiece<4>(l);
#pragma unroll
    for (int c = 0; c < 8; c++) {
        const int u = mmw_crow<4>(c, l), r = __shfl_sync(0xffffffffu, tok, u);
        const __nv_bfloat16 *x = xs + (size_t)(r >= 0 ? r : 0) * K + (size_t)kb * 64 + 8 * pc;
        if (r >= 0) mm_cp<16>(rb + u * GPU_MMW_RAW_B + 16 * (pc ^ (u & 7)), x, true);
    }
}

template <int KIND>
__device__ __forceinline__ void mmw_issue(const mmw_src &w, const mmw_pl_src &ps, const __nv_bfloat16 *__restrict__ xs, int tok, int K,
                                          int j, int kb, uint8_t *raw, mmw_stage &st, bool weights, bool tokens) {
    const int i = threadIdx.x & 127, l = threadIdx.x & 31;   // (thread i of either producer warpgroup)
    uint8_t *slot = raw + (j % mmw_plan<KIND>::R) * mmw_plan<KIND>::slot;
    if (weights) {
        uint8_t *ra = slot + i * GPU_MMW_RAW_A, *rw = slot + (i - l) * GPU_MMW_RAW_A;   // this thread's share; its warp's first
        const bool va = w.row < w.W.rows;
        const int row = va ? w.row : 0;
        if (KIND == GPU_W_FP8) {
            mmw_cp_rows<8>(w, rw, kb, l);
        } else if (KIND == GPU_W_NVFP4) {   // t's 16 elements: code bytes 8t .. 8t + 7, scale byte t
            mmw_cp_rows<16>(w, rw, kb, l);
            mm_cp<4>(ra + 32, (const uint8_t *)w.W.scale + (size_t)row * (K / 16) + (size_t)kb * 4, va);
        } else if (l < 18) {   // the warp's block into its buffer (piece l)
            mm_cp<16>(mmw_pl_buf(slot) + 16 * l, ps.p + (size_t)kb * ps.step, ps.v);
        }
    }
    if (tokens)   // (from the warp's first token row)
        mmw_cp_tok(mmw_plan<KIND>::direct ? st.b + (i - l) * 128 : slot + GPU_MMW_BM * GPU_MMW_RAW_A + (i - l) * GPU_MMW_RAW_B, xs, tok, K, kb);
}

// k_moe_up_w's A rows (PAIRED): the tile's 64 output rows o as gate row o at A row 16(o / 8) + o % 8 and up row o eight
// rows further, so that an mma fragment's rows g and g + 8 (mmw_mma's e / 2) are one output's gate and up sums; r: the
// producer's row (0..63 gate, 64..127 up). The same row's sums wherever it sits (a wgmma's rows are independent sums).
__device__ __forceinline__ int mmw_arow(int r, bool paired) { return paired ? 16 * ((r & 63) >> 3) + 8 * (r >> 6) + (r & 7) : r; }

// The weight producer's step j (FP8, NVFP4): its raw share of slot j % R (landed) → its stage row in wgmma's order (see
// the top), A row mmw_arow(i, PAIRED).
template <int KIND, bool PAIRED>
__device__ __forceinline__ void mmw_fill_a(const uint8_t *raw, int j, mmw_stage &st) {
    static_assert(KIND == GPU_W_FP8 || KIND == GPU_W_NVFP4, "mmw_fill_a: the planes widen in mmw_fill_pl");
    const int i = threadIdx.x & 127;
    const uint8_t *ra = raw + (j % mmw_plan<KIND>::R) * mmw_plan<KIND>::slot + i * GPU_MMW_RAW_A;
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
    uint8_t *ar = st.a + mmw_arow(i, PAIRED) * 128;   // piece 2q + h holds words t = 0..3 (the A row ≡ i mod 8: the swizzle's)
#pragma unroll
    for (int q = 0; q < 4; q++) {
        *(uint4 *)(ar + (((2 * q) ^ (i & 7)) << 4)) = make_uint4(lo[q], lo[4 + q], lo[8 + q], lo[12 + q]);
        *(uint4 *)(ar + (((2 * q + 1) ^ (i & 7)) << 4)) = make_uint4(hi[q], hi[4 + q], hi[8 + q], hi[12 + q]);
    }
}

// The calling thread's row 8h + g (lane (g, tp, h): g = lane / 2 % 8, tp = lane % 2, h = lane / 16) of the 16-row block
// in buf (MMW_PL_BUF bytes, landed) → its stage row ar (≡ g mod 8: the swizzle's) in the natural order.
__device__ __forceinline__ void mmw_pl_widen(const uint8_t *buf, uint8_t *ar, const uint32_t *lut) {
    const int l = threadIdx.x & 31, g = (l >> 1) & 7, tp = l & 1, h = l >> 4;
    const uint4 cw = *(const uint4 *)(buf + 32 * g + 16 * tp);   // x: (g, 2tp) row g, y: row g + 8, z: (g, 2tp + 1) row g, w: row g + 8
    const uint32_t la = mmw_sa(lut);
    uint32_t ea, oa, eb, ob;   // byte q = codes j of k = 16q + 4t + j, words t = 2tp (a) and 2tp + 1 (b)
    mm_pl_idx(h ? cw.y : cw.x, ea, oa), mm_pl_idx(h ? cw.w : cw.z, eb, ob);
    const uint32_t b0 = mm_plane_base(buf[256 + 8 * h + g]), b1 = mm_plane_base(buf[272 + 8 * h + g]);   // scale blocks of q < 2, q ≥ 2
#pragma unroll
    for (int q = 0; q < 4; q++) {   // pairs 8q + 4tp + 0..3 (ea: codes 0, 1 of word 2tp; oa: 2, 3; eb, ob: word 2tp + 1's)
        const uint32_t base = q < 2 ? b0 : b1;
        *(uint4 *)(ar + (((2 * q + tp) ^ g) << 4)) =
            make_uint4(base + mm_pl_lut(ea, la, q), base + mm_pl_lut(oa, la, q), base + mm_pl_lut(eb, la, q), base + mm_pl_lut(ob, la, q));
    }
}

// A planes producer thread's step j: its row 8h + g of its warp's 16-row block v (slot j % R, landed) → its stage row in
// the natural order (mmw_plan), A row mmw_arow(16v + 8h + g, PAIRED); words t = 2tp, 2tp + 1 of each k16 step q — pairs
// 8q + 4tp .. + 3: piece 2q + tp. lut: the nibble table (mm_plane_lut).
template <bool PAIRED>
__device__ __forceinline__ void mmw_fill_pl(const uint8_t *raw, int j, mmw_stage &st, const uint32_t *lut) {
    constexpr int KIND = GPU_W_PLANES;
    const int l = threadIdx.x & 31, v = (threadIdx.x >> 5) & 7, g = (l >> 1) & 7, h = l >> 4;
    mmw_pl_widen(mmw_pl_buf(raw + (j % mmw_plan<KIND>::R) * mmw_plan<KIND>::slot), st.a + mmw_arow(16 * v + 8 * h + g, PAIRED) * 128, lut);
}

// The token producer's step j (FP8, NVFP4): token i's raw 64-block → its stage row in wgmma's order (see the top).
template <int KIND>
__device__ __forceinline__ void mmw_fill_b(const uint8_t *raw, int j, mmw_stage &st) {
    const int i = threadIdx.x & 127;
    static_assert(!mmw_plan<KIND>::direct, "mmw_fill_b: the planes' tokens go straight into the stages");
    const uint8_t *rb = raw + (j % GPU_MMW_RAW) * MMW_RAW_BYTES + GPU_MMW_BM * GPU_MMW_RAW_A + i * GPU_MMW_RAW_B;
    uint8_t *br = st.b + i * 128;
    const int sw = i & 7;   // (the raw row's piece c is at c ^ sw: mmw_issue)
    // P = 8t + 2q + h: piece c = 2q + h, word t takes the raw row's pair 8t + c (raw piece 2t + c / 4, word c % 4)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {   // pieces c = 4hf .. 4hf + 3 from raw pieces hf, 2 + hf, 4 + hf, 6 + hf
        uint4 v[4];
#pragma unroll
        for (int t = 0; t < 4; t++) v[t] = *(const uint4 *)(rb + 16 * ((2 * t + hf) ^ sw));
        *(uint4 *)(br + (((4 * hf) ^ sw) << 4)) = make_uint4(v[0].x, v[1].x, v[2].x, v[3].x);
        *(uint4 *)(br + (((4 * hf + 1) ^ sw) << 4)) = make_uint4(v[0].y, v[1].y, v[2].y, v[3].y);
        *(uint4 *)(br + (((4 * hf + 2) ^ sw) << 4)) = make_uint4(v[0].z, v[1].z, v[2].z, v[3].z);
        *(uint4 *)(br + (((4 * hf + 3) ^ sw) << 4)) = make_uint4(v[0].w, v[1].w, v[2].w, v[3].w);
    }
}

// A producer warpgroup's part: the block's tiles m = 0 .. nt − 1 one after the other, every 64-block of K of each into
// the stages — the steps j = m·KB + (the tile's j) numbered across tiles, so the copies run on from one tile into the
// next (the next tile's first issued while this one's last are widened) and the stages' barriers keep their phases;
// src(m, w, tok) gives tile m's source (weights: w, tokens: tok; every lane calls it). WTS: the warpgroup copies and
// widens weights (before any GPU_DEP — they never change after boot — and never waiting for it), TOKS: it copies tokens
// (after GPU_DEP). FP8, NVFP4: warpgroup 0 the weights, warpgroup 1 the tokens, both through the raw ring R − 1 steps
// ahead. PLANES (mmw_plan: direct): both warpgroups a weight block a warp (mmw_fill_pl) and warpgroup 1 the tokens too,
// straight into the stages; all MMW_AHEAD steps ahead (a stage's token copies issued once the consumers released it).
// Each warp waits for its own copies only (its lanes copy each other's shares: a warp barrier after the wait, and one
// before a raw slot is copied into again, once every lane has read it) and each thread arrives on the stage's `full`
// barrier when its part is in.
#define MMW_AHEAD (GPU_MMW_STAGES_PL - 2)   // (≤ S − 2: the stage it waits for is released once the consumers hold the step before's)
template <int KIND, bool PAIRED, bool WTS, bool TOKS, class Src>
__device__ __forceinline__ void mmw_produce_as(Src src, int nt, const __nv_bfloat16 *__restrict__ xs, int K, mmw_stage *st, uint64_t *full,
                                               uint64_t *empty, const uint32_t *lut) {
    constexpr int S = mmw_plan<KIND>::S;
    constexpr bool pl = KIND == GPU_W_PLANES, direct = pl && TOKS;   // (direct: this warpgroup's tokens straight into the stages)
    constexpr int A = pl ? MMW_AHEAD : mmw_plan<KIND>::R - 1;   // steps issued ahead
    static_assert(A < mmw_plan<KIND>::R && (WTS || TOKS) && (pl || WTS != TOKS), "mmw_produce_as: the rings and the warpgroups' parts");
    uint8_t *raw = mmw_raw<KIND>(st);
    const int KB = K / 64, steps = nt * KB;
    if (pl && (mmw_sa(lut) & 255u)) __trap();   // (the table not where MM_PL_LUT puts it: mm_pl_lut, loudly)
    mmw_src w = {};
    int tok = -1, m = 0, jt = 0;   // the issues' tile and its 64-blocks issued
    mmw_pl_src ps = {};
    auto at = [&](int mm) {   // tile mm's source (every lane of the warp: the shuffles)
        src(mm, w, tok);
        if (pl) ps = mmw_pl_at(w, K);
    };
    at(0);
    if (TOKS) GPU_DEP();
    mmg_kb_walk kw(KB);   // the issues' 64-blocks of their tile, in turn
    auto issue = [&](int j) {   // step j's copies (the steps in turn), none past the last
        if (j >= steps) return;
        if (jt == KB) at(++m), jt = 0, kw = mmg_kb_walk(KB);
        jt++;
        if (direct && j >= S) mmw_wait(&empty[j % S], (j / S - 1) & 1);   // (its stage released)
        mmw_issue<KIND>(w, ps, xs, tok, K, j, kw.next(), raw, st[j % S], WTS, TOKS);
    };
    for (int j = 0; j < A; j++) {
        issue(j);
        mm_cp_commit();
    }
    for (int j = 0; j < steps; j++) {
        const int s = j % S;
        __syncwarp();   // every lane's fill of the step before has read the raw slot about to be copied into
        issue(j + A);
        mm_cp_commit();
        mm_cp_wait<A>();   // step j's copies (this lane's own) landed
        __syncwarp();      // and the other lanes': this thread's share is whole
        if (!direct && j >= S) mmw_wait(&empty[s], (j / S - 1) & 1);   // (direct: waited before its copies)
        if constexpr (pl) mmw_fill_pl<PAIRED>(raw, j, st[s], lut);
        else if constexpr (WTS) mmw_fill_a<KIND, PAIRED>(raw, j, st[s]);
        else mmw_fill_b<KIND>(raw, j, st[s]);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the stores (and the direct copies) seen by the consumers' wgmma
        mmw_arrive(&full[s]);
    }
    mm_cp_wait<0>();
}

// The calling producer warpgroup's part (wg0: warpgroup 0's), each its own code.
template <int KIND, bool PAIRED, class Src>
__device__ __forceinline__ void mmw_produce(Src src, int nt, const __nv_bfloat16 *__restrict__ xs, int K, mmw_stage *st, uint64_t *full,
                                            uint64_t *empty, const uint32_t *lut, bool wg0) {
    if (wg0) mmw_produce_as<KIND, PAIRED, true, false>(src, nt, xs, K, st, full, empty, lut);
    else mmw_produce_as<KIND, PAIRED, KIND == GPU_W_PLANES, true>(src, nt, xs, K, st, full, empty, lut);
}

// One tile's producer source (k_mm_w: a block one tile).
template <int KIND>
__device__ __forceinline__ void mmw_produce(const mmw_src &w0, const __nv_bfloat16 *__restrict__ xs, int tok0, int K, mmw_stage *st, uint64_t *full,
                                            uint64_t *empty, const uint32_t *lut, bool wg0) {
    mmw_produce<KIND, false>([&](int, mmw_src &w, int &tok) { w = w0, tok = tok0; }, 1, xs, K, st, full, empty, lut, wg0);
}

// Warpgroup 2 + c's part of a tile whose first step is j0 (mmw_produce's steps) over S stages (the kind's plan), its
// first N tokens (mmw_mma's N: the stages' token rows past N are not read): tot[4n + e] = the sum of A row 64c +
// 16·warp + g + 8(e/2) and token 8n + 2t + e % 2 over K, in k_mm_g's order (before the kind's scale); n ≥ N / 8: 0.
// Returns when every stage it read is released.
template <int S, int N>
__device__ __forceinline__ void mmw_consume(mmw_stage *st, uint64_t *full, uint64_t *empty, int K, int c, float (&tot)[64], int j0) {
    const int KB = K / 64, q8 = KB / GPU_MM_WARPS, r8 = KB % GPU_MM_WARPS;
    float acc[64];
#pragma unroll
    for (int e = 0; e < 64; e++) acc[e] = 0.f, tot[e] = 0.f;
    int j = j0;
    for (int cls = 0; cls < GPU_MM_WARPS; cls++) {   // (a class without a 64-block adds its zero, as mm_at does)
        const int len = q8 + (cls < r8);
        for (int e = 0; e < len; e++, j++) {
            const int s = j % S;
            mmw_wait(&full[s], (j / S) & 1);
            const uint32_t a0 = mmw_sa(st[s].a + 64 * c * 128), b0 = mmw_sa(st[s].b);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int q = 0; q < 4; q++) mmw_mma<N>(acc, mmw_desc(a0 + 32 * q), mmw_desc(b0 + 32 * q));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (j > j0) mmw_arrive(&empty[(j - 1) % S]);   // step j − 1's group has landed: its stage is free
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int e = 0; e < N / 2; e++) tot[e] = cls == 0 ? acc[e] : tot[e] + acc[e], acc[e] = 0.f;
    }
    if (j > j0) mmw_arrive(&empty[(j - 1) % S]);
}

// d (= or +=, Z 0 or 1) one k16 step of 64 rows × 64 tokens (m64n64, the same bits as mmw_mma's: each n-tile its own
// columns): d[4n + e] = row 16·warp + g + 8(e/2), token 8n + 2t + e % 2 of the 64 (n < 8).
template <int Z>
__device__ __forceinline__ void mmw_mma_h(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, 0, 0;}"
                 : MMW_D8(0), MMW_D8(1), MMW_D8(2), MMW_D8(3)
                 : "l"(a), "l"(b), "n"(Z));
}
// One half of a step: the four k16 products of A at a0 and the 64 tokens at b0 into acc (FRESH: the first overwrites
// it, so a class's sum starts from zero without an instruction writing acc), a commit group of their own.
template <bool FRESH>
__device__ __forceinline__ void mmw_half(float (&acc)[32], uint32_t a0, uint32_t b0) {
    mmw_mma_h<FRESH ? 0 : 1>(acc, mmw_desc(a0), mmw_desc(b0));
#pragma unroll
    for (int q = 1; q < 4; q++) mmw_mma_h<1>(acc, mmw_desc(a0 + 32 * q), mmw_desc(b0 + 32 * q));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// mmw_consume<S, 128>'s sums (the same bits: each class's sum from zero over its 64-blocks in turn, added to the total
// in class order) with the classes' drains hidden: the 128 tokens as two halves of 64 (acc0: tokens 0..63 = tot[0..31],
// acc1: 64..127 = tot[32..63]), each half a commit group, so that a class's half-0 sum is added while its half 1 is
// still in the tensor pipe and its half-1 sum while the next class's half 0 is — the pipe idles at one drain in two
// classes, where one class a drain idled it (every step where K = 512: one 64-block a class). The classes in pairs,
// each pair's groups landed at its end (wait_group 0): ptxas keeps wgmma in its pipeline only where a read of an
// accumulator follows the wait that lands it in straight-line code, not across a loop's back edge. K ≥ 512 (every
// class one 64-block at least).
template <int S>
__device__ __forceinline__ void mmw_consume_pp(mmw_stage *st, uint64_t *full, uint64_t *empty, int K, int c, float (&tot)[64], int j0) {
    const int KB = K / 64, q8 = KB / GPU_MM_WARPS, r8 = KB % GPU_MM_WARPS;
    float acc0[32], acc1[32];
    int j = j0;
    auto at = [&](int jj, uint32_t &a0, uint32_t &b0) {   // step jj's stage, once its products have landed in it
        const int s = jj % S;
        mmw_wait(&full[s], (jj / S) & 1);
        a0 = mmw_sa(st[s].a + 64 * c * 128), b0 = mmw_sa(st[s].b);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    };
    auto next = [&]() {   // step j's groups in flight: step j − 1's have landed, its stage is free
        asm volatile("wgmma.wait_group.sync.aligned 2;" ::: "memory");
        if (j > j0) mmw_arrive(&empty[(j - 1) % S]);
        j++;
    };
    for (int cp = 0; cp < GPU_MM_WARPS; cp += 2) {
        const int la = q8 + (cp < r8), lb = q8 + (cp + 1 < r8);
        uint32_t a0, b0;
        at(j, a0, b0), mmw_half<true>(acc0, a0, b0), mmw_half<true>(acc1, a0, b0 + 64 * 128), next();   // class cp
        for (int e = 1; e < la; e++) at(j, a0, b0), mmw_half<false>(acc0, a0, b0), mmw_half<false>(acc1, a0, b0 + 64 * 128), next();
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");   // class cp's half 0 landed
#pragma unroll
        for (int e = 0; e < 32; e++) tot[e] = cp == 0 ? acc0[e] : tot[e] + acc0[e];
        at(j, a0, b0), mmw_half<true>(acc0, a0, b0);   // class cp + 1's first step, half 0
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");   // class cp's half 1 landed
#pragma unroll
        for (int e = 0; e < 32; e++) tot[32 + e] = cp == 0 ? acc1[e] : tot[32 + e] + acc1[e];
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        mmw_half<true>(acc1, a0, b0 + 64 * 128), next();
        for (int e = 1; e < lb; e++) at(j, a0, b0), mmw_half<false>(acc0, a0, b0), mmw_half<false>(acc1, a0, b0 + 64 * 128), next();
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
#pragma unroll
        for (int e = 0; e < 32; e++) tot[e] += acc0[e];
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int e = 0; e < 32; e++) tot[32 + e] += acc1[e];
    }
    mmw_arrive(&empty[(j - 1) % S]);
}

// The same for a tile of cnt tokens (1 .. GPU_MMW_BN): the narrowest product that holds them (m64n32, m64n64, m64n128;
// the same bits each: mmw_mma), so an expert's last short run costs its own tokens' tensor work, not a full tile's;
// a full one by halves where K allows (mmw_consume_pp).
template <int S>
__device__ __forceinline__ void mmw_consume_n(mmw_stage *st, uint64_t *full, uint64_t *empty, int K, int c, float (&tot)[64], int j0, int cnt) {
    if (cnt <= 32) mmw_consume<S, 32>(st, full, empty, K, c, tot, j0);
    else if (cnt <= 64) mmw_consume<S, 64>(st, full, empty, K, c, tot, j0);
    else if (K >= 64 * GPU_MM_WARPS) mmw_consume_pp<S>(st, full, empty, K, c, tot, j0);
    else mmw_consume<S, 128>(st, full, empty, K, c, tot, j0);
}

// The block's shared state: the stages (1,024-aligned in the dynamic shared memory) and the raw ring after them; the
// ns barriers of each array initialised (full: the 256 producers arrive; empty: the 256 consumers). Every thread calls it.
__device__ __forceinline__ mmw_stage *mmw_setup(uint8_t *smem, uint64_t *full, uint64_t *empty, int ns) {
    if (threadIdx.x == 0)
        for (int s = 0; s < ns; s++) mmw_bar_init(&full[s], 256), mmw_bar_init(&empty[s], 256);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    return (mmw_stage *)(smem + ((1024u - (mmw_sa(smem) & 1023u)) & 1023u));
}
#endif
