// sass/mm.cuh — the tensor-core matrix product every dense and expert product shares:
// acc[tile][n] += W[rows of the tile, k] · x[tokens of n-tile n, k] over one warp's slice of k,
// with `mma.sync.m16n8k16` (bf16 operands, f32 accumulators).
//
// Weights are widened to bf16 in registers, exactly: FP8 e4m3 (through f16), NVFP4 (e2m1 times
// its e4m3 block scale: at most 6 significant bits), the 2-bit planes (±1, ±4 times 2^e, with
// the UE8M0 scale folded into the exponent) and BF16 as stored. The per-tensor scales (FP8
// weight_scale, NVFP4 weight_scale_2) multiply the sum afterwards.
//
// Activations enter as three bf16 parts x = hi + mid + lo (k_mm_split): each part times a bf16
// weight is exact in f32, and the parts carry 24 bits of x's mantissa, so the product is that
// of f32 activations up to the order of the f32 additions (arena/DESIGN.md §3). Built with
// GPU_MM_PARTS 1 (sass/all_bf.cu) the products read hi alone: x rounded to bf16, the same steps
// and order otherwise.
//
// Fragments (PTX ISA, mma.m16n8k16 .bf16): lane (g = lane/4, t = lane%4) holds A rows g and g+8
// at k slots {2t, 2t+1, 2t+8, 2t+9} and B column (token) g at the same slots. Each k16 step q
// (0..3) of a 64-wide block kb maps the four slots of lane t to four consecutive k:
//   PLANES (format/PLANES.md §3, fixed by the file): k = 64kb + 16q + 4t + j
//   FP8, NVFP4, BF16:                              k = 64kb + 16t + 4q + j
// so one lane's weights of a row and 64-block are one contiguous load, and its activations of
// a token and q are one 8-byte load per part (FP8, NVFP4, BF16: those of q and q + 1 one 16-byte
// load, mm_b_load). Slot 2t ↔ j = 0, 2t+1 ↔ 1, 2t+8 ↔ 2, 2t+9 ↔ 3.
//
// Order (batch invariance): warp w of GPU_MM_WARPS takes the 64-blocks kb = w, w + 8, …; for each
// kb and q = 0..3, the parts lo, mid, hi go through three mma into a fresh accumulator, which is
// then added to the running one in f32 (one part: its mma accumulates into the running one;
// mm_acc); the warps' sums are added in warp order (mm_reduce, mm_at). All of it depends on K alone: a token's result is the same bits whatever the other
// tokens of the launch, the tile it lands in or the rows per block (k_mm_v: the same steps).
#pragma once
#include "common.cuh"

// xs[s][t][k] for s < GPU_MM_SPLITS (parts hi, mid, lo; ss = T·K elements between parts),
// t < T, k < K: x[t, k] = hi + mid + lo exactly up to 2^-24 · |x| (each part is the bf16
// rounding of what the previous ones leave, and each remainder is exact in f32). In the one-part
// image (GPU_MM_PARTS 1, sass/all_bf.cu), whose products read hi alone, hi alone is written: the
// places of mid and lo keep what they held (nothing reads them there).
__device__ __forceinline__ void mm_split3(float v, __nv_bfloat16 *o, size_t ss) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    o[0] = h;
    if (GPU_MM_PARTS == 1) return;
    float r = v - __bfloat162float(h);
    __nv_bfloat16 m = __float2bfloat16_rn(r);
    float r2 = r - __bfloat162float(m);
    o[ss] = m, o[2 * ss] = __float2bfloat16_rn(r2);
}

// e4m3 pair (low byte = first) → bf16 pair, exact, in integer operations (a conversion
// instruction per element would run at a quarter of their rate): each byte's 7 magnitude bits
// placed at bf16 bits 4..10 (exponent field 0000eeee, mantissa mmm0000) and its sign at bit 15
// are its value · 2^-120, normals and subnormals alike (biases 7 and 127; a zero exponent field is
// subnormal in both), then × 2^120, exact (at most 4 significant bits, in range). The code 0x7f
// (e4m3's NaN) gives 480, as dec_e4m3 decodes it.
__device__ __forceinline__ uint32_t mm_fp8x2(uint32_t v) {
    const uint32_t x = __byte_perm(v, 0u, 0x4140);   // bytes b0, 0, b1, 0
    const uint32_t h = ((x << 4) & 0x07f007f0u) | ((x << 8) & 0x80008000u);
    const __nv_bfloat162 two120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));
    __nv_bfloat162 r = __hmul2(*(const __nv_bfloat162 *)&h, two120);
    return *(const uint32_t *)&r;
}

// A word of four e4m3 weight codes as the device stores them (gpu_put: c0 c2 c1 c3, low byte
// first, gpu_abi.h GPU_FP8_SLOT) → the bf16 pairs (c0, c1) and (c2, c3), exact as mm_fp8x2: the
// magnitude bits of bytes 1 and 3 masked and shifted into place, their signs kept where they are
// (each byte's sign is already at bit 15 of its half), then the same of the word shifted up by a
// byte (bytes 0 and 2), each pair × 2^120 — no byte permute, two shifts fewer a pair.
__device__ __forceinline__ void mm_fp8x4(uint32_t v, uint32_t &p01, uint32_t &p23) {
    const uint32_t v8 = v << 8;
    const uint32_t h23 = ((v & 0x7f007f00u) >> 4) | (v & 0x80008000u), h01 = ((v8 & 0x7f007f00u) >> 4) | (v8 & 0x80008000u);
    const __nv_bfloat162 two120 = __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));
    __nv_bfloat162 r01 = __hmul2(*(const __nv_bfloat162 *)&h01, two120), r23 = __hmul2(*(const __nv_bfloat162 *)&h23, two120);
    p01 = *(const uint32_t *)&r01, p23 = *(const uint32_t *)&r23;
}

// Four e2m1 codes (the low 16 bits of c, code 0 lowest) times the block scale sc → two bf16
// pairs (codes 0, 1 in p01; 2, 3 in p23), exact: each magnitude looked up as a bf16 by byte
// permutes of two 8-entry tables (its low and its high byte), the sign bits moved in, then × sc
// (at most 6 significant bits: exact): about a third of the operations of building each value
// from its bits.
__device__ __forceinline__ void mm_fp4x4(uint32_t c, __nv_bfloat162 sc, uint32_t &p01, uint32_t &p23) {
    const uint32_t sel = c & 0x7777u;   // magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (bf16 0000 3f00 3f80 3fc0 4000 4040 4080 40c0)
    const uint32_t lo = __byte_perm(0xc0800000u, 0xc0804000u, sel), hi = __byte_perm(0x3f3f3f00u, 0x40404040u, sel);
    uint32_t a = __byte_perm(lo, hi, 0x5140) | ((c << 12) & 0x8000u) | ((c << 24) & 0x80000000u);
    uint32_t b = __byte_perm(lo, hi, 0x7362) | ((c << 4) & 0x8000u) | ((c << 16) & 0x80000000u);
    __nv_bfloat162 ra = __hmul2(*(const __nv_bfloat162 *)&a, sc), rb = __hmul2(*(const __nv_bfloat162 *)&b, sc);
    p01 = *(const uint32_t *)&ra, p23 = *(const uint32_t *)&rb;
}

// Two plane codes (a nibble, low pair first) → what a bf16 pair adds to its scale's exponent:
// bit 15 for a negative level, 2 in the exponent (0x100) for ±4. mm_plane_lut fills it.
__device__ __forceinline__ uint32_t mm_plane_bits(uint32_t c) { return (c < 2u ? 0x8000u : 0u) + ((c == 0u || c == 3u) ? 0x100u : 0u); }

// A scale byte s as the exponent of a bf16 pair: level ±1 · 2^(s − 127) has exponent field s.
// (s = 0 gives ±0 for ±1 where the reference has ±2^-127: a difference of < 1e-38 · x.)
__device__ __forceinline__ uint32_t mm_plane_base(uint32_t s) { return s * 0x00800080u; }   // (s << 7) | (s << 23): s < 256, no carries

__device__ __forceinline__ void mm_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc += one k16 step's products of the activations' parts b[GPU_MM_PARTS] with the widened
// weights a: three parts (lo, mid, hi) through a fresh accumulator that is then added in f32 (the
// tensor cores' own additions, which do not round to nearest, see at most 48 products); one part
// (sass/all_bf.cu) straight into acc. Every shape sums its steps through this, in the same order.
__device__ __forceinline__ void mm_acc(float acc[4], const uint32_t a[4], const uint2 *b) {
    if (GPU_MM_PARTS == 1) {
        mm_mma(acc, a, b[0].x, b[0].y);
        return;
    }
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = GPU_MM_PARTS - 1; s >= 0; s--) mm_mma(c, a, b[s].x, b[s].y);
#pragma unroll
    for (int e = 0; e < 4; e++) acc[e] += c[e];
}

// A lane's B operands (one part, one token) of one step of a 64-block into b0: the 8 bytes at p + ko
// (p: its slot of 64-block 0 and step 0; ko: the step's k offset, mm_stream's). PAIR (FP8, NVFP4
// and BF16 alone, at an even step q): steps q and q + 1 into b0 and b1 in one load — their k = 16t
// + 4q + j, so both are the 16 bytes at p + ko, where a load a step (8 bytes) touched a 32-byte
// sector of its own for each lane. LDG: through the read-only path (xs in global memory), else a
// plain load (a copy in shared memory).
template <bool LDG, bool PAIR>
__device__ __forceinline__ void mm_b_load(const __nv_bfloat16 *p, int ko, uint2 &b0, uint2 &b1) {
    if (PAIR) {
        const uint4 v = LDG ? __ldg((const uint4 *)(p + ko)) : *(const uint4 *)(p + ko);
        b0 = make_uint2(v.x, v.y), b1 = make_uint2(v.z, v.w);
    } else b0 = LDG ? __ldg((const uint2 *)(p + ko)) : *(const uint2 *)(p + ko);
}

// Whether the streamed products of NT n-tiles read B two steps a load (mm_b_load's PAIR; the odd
// step takes what the even one loaded): not for the planes (their k = 16q + 4t + j), nor where the
// three parts' four n-tiles would spill.
template <int KIND, int NT>
struct mm_b_pairs {
    static constexpr bool on = KIND != GPU_W_PLANES && GPU_MM_PARTS * NT <= 8;
};

// The raw bytes one lane loads for one row tile and one 64-block (before widening).
struct mm_raw {
    uint4 r0, r1, r2, r3;   // FP8: r0 row g, r1 row g+8; NVFP4: r0.xy row g, r0.zw row g+8; BF16: r0 r1 row g, r2 r3 row g+8; PLANES: r0.xy
    uint32_t s;             // NVFP4: the two block-scale bytes (g, g+8); PLANES: four scale bytes (g b0, g+8 b0, g b1, g+8 b1)
};

// A planes lane's four scale bytes of a 64-block (format/PLANES.md §3), s at row g's first: (g b0,
// g + 8 b0, g b1, g + 8 b1), byte 0 first — mm_raw.s.
__device__ __forceinline__ uint32_t mm_pl_scales(const uint8_t *s) {
    return (uint32_t)__ldg(s) | ((uint32_t)__ldg(s + 8) << 8) | ((uint32_t)__ldg(s + 16) << 16) | ((uint32_t)__ldg(s + 24) << 24);
}

template <int KIND>
__device__ __forceinline__ void mm_load(const gpu_mat &W, int row0, int kb, int g, int t, mm_raw &r) {
    const uint8_t *w = (const uint8_t *)W.w;
    const int ra = row0 + g, rb = row0 + g + 8, K = W.cols;
    const bool va = ra < W.rows, vb = rb < W.rows;
    const uint4 z = make_uint4(0, 0, 0, 0);
    if (KIND == GPU_W_FP8) {
        size_t o = (size_t)kb * 64 + 16 * t;
        r.r0 = va ? __ldg((const uint4 *)(w + (size_t)ra * W.row_bytes + o)) : z;
        r.r1 = vb ? __ldg((const uint4 *)(w + (size_t)rb * W.row_bytes + o)) : z;
    } else if (KIND == GPU_W_NVFP4) {
        size_t o = ((size_t)kb * 64 + 16 * t) / 2;
        uint2 a = va ? __ldg((const uint2 *)(w + (size_t)ra * W.row_bytes + o)) : make_uint2(0, 0);
        uint2 b = vb ? __ldg((const uint2 *)(w + (size_t)rb * W.row_bytes + o)) : make_uint2(0, 0);
        r.r0 = make_uint4(a.x, a.y, b.x, b.y);
        const uint8_t *sc = (const uint8_t *)W.scale;
        size_t so = (size_t)kb * 4 + t;
        uint32_t sa = va ? __ldg(sc + (size_t)ra * (K / 16) + so) : 0u, sb = vb ? __ldg(sc + (size_t)rb * (K / 16) + so) : 0u;
        r.s = sa | (sb << 8);
    } else if (KIND == GPU_W_BF16) {
        size_t o = ((size_t)kb * 64 + 16 * t) * 2;
        r.r0 = va ? __ldg((const uint4 *)(w + (size_t)ra * W.row_bytes + o)) : z;
        r.r1 = va ? __ldg((const uint4 *)(w + (size_t)ra * W.row_bytes + o + 16)) : z;
        r.r2 = vb ? __ldg((const uint4 *)(w + (size_t)rb * W.row_bytes + o)) : z;
        r.r3 = vb ? __ldg((const uint4 *)(w + (size_t)rb * W.row_bytes + o + 16)) : z;
    } else {   // PLANES: rows % 16 == 0, so the tile is whole
        const int KB = K / 64, nb = row0 / 16;
        uint2 c = __ldg((const uint2 *)(w + ((((size_t)nb * KB + kb) * 8 + g) * 4 + t) * 8));
        r.r0 = make_uint4(c.x, c.y, 0, 0);
        r.s = mm_pl_scales((const uint8_t *)W.scale + ((size_t)nb * (K / 32) + 2 * (size_t)kb) * 16 + g);
    }
}

// ---- the same bytes through shared memory (k_mm_v) ----------------------------------------------
//
// A thread's bytes of one step (what mm_load reads) copied by cp.async into its own 16-byte slots:
// slot p of the thread at ring + (p · GPU_MM_NT + thread) · 16 (a warp's 16-byte reads contiguous:
// no bank conflicts). FP8: 0 row g, 1 row g+8; NVFP4: 0 = codes of g | g+8, 1 = the 4-byte scale
// words holding their bytes; BF16: 0, 1 row g, 2, 3 row g+8; PLANES: 0 = codes, 1 = the four
// scale words. A step takes `bytes` of the ring; `ring` steps fit GPU_MM_RING_BYTES.
template <int KIND>
struct mm_cp_slots {
    static constexpr int n = KIND == GPU_W_BF16 ? 4 : 2;
    static constexpr int bytes = n * GPU_MM_NT * 16;
    static constexpr int ring = GPU_MM_RING_BYTES / bytes;
};

// cp.async of N bytes (4, 8 or 16) from global memory src to shared dst; !valid: N zeros (src not read).
template <int N>
__device__ __forceinline__ void mm_cp(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(N), "r"(valid ? N : 0) : "memory");
}
__device__ __forceinline__ void mm_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void mm_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// A lane's sources of one row tile (rows row0 + g, row0 + g + 8) at 64-block 0 (mm_cp_tile), and its
// copies of 64-block kb from them into its slots (mm_cp_kb): a tile's addresses once, a step's
// offsets by kb alone. Rows past the matrix read nothing (their slots get zeros).
struct mm_cp_src {
    const uint8_t *a, *b, *sa, *sb;   // codes of rows g, g+8 (PLANES: the tile's, a); their scales
    bool va, vb;
};

template <int KIND>
__device__ __forceinline__ void mm_cp_tile(const gpu_mat &W, int row0, int g, int t, mm_cp_src &c) {
    const uint8_t *w = (const uint8_t *)W.w, *sc = (const uint8_t *)W.scale;
    const int ra = row0 + g, rb = row0 + g + 8, K = W.cols;
    c.va = ra < W.rows, c.vb = rb < W.rows;
    const size_t ia = c.va ? ra : 0, ib = c.vb ? rb : 0;
    if (KIND == GPU_W_FP8) c.a = w + ia * W.row_bytes + 16 * t, c.b = w + ib * W.row_bytes + 16 * t;
    else if (KIND == GPU_W_NVFP4) {
        c.a = w + ia * W.row_bytes + 8 * t, c.b = w + ib * W.row_bytes + 8 * t;
        c.sa = sc + ia * (K / 16), c.sb = sc + ib * (K / 16);   // the word of bytes kb·4 .. kb·4 + 3 (K / 16 % 4 == 0)
    } else if (KIND == GPU_W_BF16) c.a = w + ia * W.row_bytes + 32 * t, c.b = w + ib * W.row_bytes + 32 * t;
    else {   // PLANES: rows % 16 == 0, so the tile is whole
        const size_t nb = row0 / 16;
        c.a = w + ((nb * (K / 64) * 8 + g) * 4 + t) * 8;
        c.sa = sc + nb * (K / 32) * 16 + (g & ~3);
    }
}

template <int KIND>
__device__ __forceinline__ void mm_cp_kb(const mm_cp_src &c, int kb, uint8_t *slots) {
    uint8_t *s0 = slots + threadIdx.x * 16, *s1 = s0 + GPU_MM_NT * 16;
    if (KIND == GPU_W_FP8) {
        mm_cp<16>(s0, c.a + (size_t)kb * 64, c.va);
        mm_cp<16>(s1, c.b + (size_t)kb * 64, c.vb);
    } else if (KIND == GPU_W_NVFP4) {
        mm_cp<8>(s0, c.a + (size_t)kb * 32, c.va);
        mm_cp<8>(s0 + 8, c.b + (size_t)kb * 32, c.vb);
        mm_cp<4>(s1, c.sa + (size_t)kb * 4, c.va);
        mm_cp<4>(s1 + 4, c.sb + (size_t)kb * 4, c.vb);
    } else if (KIND == GPU_W_BF16) {
        const uint8_t *pa = c.a + (size_t)kb * 128, *pb = c.b + (size_t)kb * 128;
        mm_cp<16>(s0, pa, c.va), mm_cp<16>(s1, pa + 16, c.va);
        mm_cp<16>(s1 + GPU_MM_NT * 16, pb, c.vb), mm_cp<16>(s1 + 2 * GPU_MM_NT * 16, pb + 16, c.vb);
    } else {
        mm_cp<8>(s0, c.a + (size_t)kb * 256, true);
        const uint8_t *sc = c.sa + (size_t)kb * 32;
        mm_cp<4>(s1, sc, true), mm_cp<4>(s1 + 4, sc + 8, true), mm_cp<4>(s1 + 8, sc + 16, true), mm_cp<4>(s1 + 12, sc + 24, true);
    }
}

template <int KIND>
__device__ __forceinline__ void mm_cp_issue(const gpu_mat &W, int row0, int kb, int g, int t, uint8_t *slots) {
    mm_cp_src c;
    mm_cp_tile<KIND>(W, row0, g, t, c);
    mm_cp_kb<KIND>(c, kb, slots);
}

// The raw bytes of mm_load back from the slots of thread tid (mm_cp_issue's, landed), for a lane
// of the same g and t.
template <int KIND>
__device__ __forceinline__ void mm_cp_fetch(const uint8_t *slots, int tid, int g, mm_raw &r) {
    const uint4 *s0 = (const uint4 *)(slots + tid * 16);
    const int st = GPU_MM_NT;   // uint4 between a thread's slots
    if (KIND == GPU_W_FP8) {
        r.r0 = s0[0], r.r1 = s0[st];
    } else if (KIND == GPU_W_NVFP4) {
        r.r0 = s0[0];
        const uint4 sc = s0[st];
        const int sh = 8 * (tid & 3);   // byte t of each word
        r.s = ((sc.x >> sh) & 0xffu) | (((sc.y >> sh) & 0xffu) << 8);
    } else if (KIND == GPU_W_BF16) {
        r.r0 = s0[0], r.r1 = s0[st], r.r2 = s0[2 * st], r.r3 = s0[3 * st];
    } else {
        r.r0 = s0[0];
        const uint4 sc = s0[st];
        const int sh = 8 * (g & 3);
        r.s = ((sc.x >> sh) & 0xffu) | (((sc.y >> sh) & 0xffu) << 8) | (((sc.z >> sh) & 0xffu) << 16) | (((sc.w >> sh) & 0xffu) << 24);
    }
}

// ---- the copy engine's bulk copies (k_mm_t) -------------------------------------------------------
//
// k_mm_t's ring holds stages of GPU_MT_STAGE_BYTES or less: a tile of 16 rows × KBc 64-blocks
// (mt_kbc: K cut into equal stages, each a multiple of 8 64-blocks so a warp's blocks stay those
// ≡ its index mod 8). Bytes per 64-block: `code` of a row (FP8 64, NVFP4 32, BF16 128) and `sc` of
// its scales (NVFP4 4); PLANES per tile (256 codes, 32 scales). In a stage of pitch P = KBc·code:
// row r's codes at r·P, NVFP4's scales at 16·P + r·KBc·4; PLANES' codes as stored (KBc·256
// bytes), their scales after them.
template <int KIND>
struct mt_kind {
    static constexpr int code = KIND == GPU_W_FP8 ? 64 : KIND == GPU_W_NVFP4 ? 32 : KIND == GPU_W_BF16 ? 128 : 256;
    static constexpr int sc = KIND == GPU_W_NVFP4 ? 4 : KIND == GPU_W_PLANES ? 32 : 0;
    static constexpr int per_kb = KIND == GPU_W_PLANES ? code + sc : 16 * (code + sc);   // a tile's bytes per 64-block
};
template <int KIND>
__device__ __forceinline__ int mt_kbc(int KB) {
    constexpr int cap = GPU_MT_STAGE_BYTES / mt_kind<KIND>::per_kb / 8 * 8;
    const int n = (KB + cap - 1) / cap, c = ((KB + n - 1) / n + 7) / 8 * 8;
    return c < KB ? c : KB;
}

__device__ __forceinline__ unsigned mt_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mt_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mt_smem(bar)), "r"(count) : "memory");
}
// The barriers' initialisation visible to the copy engine (then a block barrier for the threads).
__device__ __forceinline__ void mt_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// This thread's arrival, announcing `bytes` the stage's copies will complete.
__device__ __forceinline__ void mt_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mt_smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mt_arrive(uint64_t *bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(mt_smem(bar)) : "memory"); }
// Waits until the barrier's phase of parity `ph` has completed.
__device__ __forceinline__ void mt_wait(uint64_t *bar, int ph) {
    asm volatile("{\n\t.reg .pred p;\n\tW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t@!p bra W;\n\t}" ::"r"(mt_smem(bar)), "r"(ph)
                 : "memory");
}
// n bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst,
// completing on bar.
__device__ __forceinline__ void mt_copy(uint8_t *dst, const void *src, int n, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(mt_smem(dst)), "l"(src),
                 "r"(n), "r"(mt_smem(bar))
                 : "memory");
}

// The A fragment of step q from the raw bytes (the table of the planes in shared memory).
template <int KIND>
__device__ __forceinline__ void mm_widen(const mm_raw &r, int q, const uint32_t *lut, uint32_t a[4]) {
    if (KIND == GPU_W_FP8) {
        uint32_t wa = q == 0 ? r.r0.x : q == 1 ? r.r0.y : q == 2 ? r.r0.z : r.r0.w;
        uint32_t wb = q == 0 ? r.r1.x : q == 1 ? r.r1.y : q == 2 ? r.r1.z : r.r1.w;
        mm_fp8x4(wa, a[0], a[2]);   // (the stored order c0 c2 c1 c3: slots 2t, 2t+1 ↔ k 4q·…+0, +1; 2t+8, 2t+9 ↔ +2, +3)
        mm_fp8x4(wb, a[1], a[3]);
    } else if (KIND == GPU_W_NVFP4) {
        // elements 4q..4q+3 are bytes 2q, 2q+1 of the row's 8
        uint32_t wa = q < 2 ? r.r0.x : r.r0.y, wb = q < 2 ? r.r0.z : r.r0.w;
        int sh = (q & 1) * 16;
        const __nv_bfloat162 sa = __float2bfloat162_rn(dec_e4m3(r.s & 0xffu)), sb = __float2bfloat162_rn(dec_e4m3((r.s >> 8) & 0xffu));
        mm_fp4x4(wa >> sh, sa, a[0], a[2]);
        mm_fp4x4(wb >> sh, sb, a[1], a[3]);
    } else if (KIND == GPU_W_BF16) {
        // elements 4q..4q+3 are words 2q, 2q+1 of the row's 8
        const uint4 &ha = q < 2 ? r.r0 : r.r1, &hb = q < 2 ? r.r2 : r.r3;
        a[0] = (q & 1) ? ha.z : ha.x, a[2] = (q & 1) ? ha.w : ha.y;
        a[1] = (q & 1) ? hb.z : hb.x, a[3] = (q & 1) ? hb.w : hb.y;
    } else {
        // byte q of each row's word: codes j = 0..3 of k = 16q + 4t + j; scale block q / 2
        int sh = 8 * q, ss = q < 2 ? 0 : 16;
        uint32_t ba = mm_plane_base((r.s >> ss) & 0xffu), bb = mm_plane_base((r.s >> (ss + 8)) & 0xffu);
        a[0] = ba + lut[(r.r0.x >> sh) & 15u], a[2] = ba + lut[(r.r0.x >> (sh + 4)) & 15u];
        a[1] = bb + lut[(r.r0.y >> sh) & 15u], a[3] = bb + lut[(r.r0.y >> (sh + 4)) & 15u];
    }
}

template <int KIND>
__device__ __forceinline__ void mm_cp_fetch(const uint8_t *slots, int g, mm_raw &r) { mm_cp_fetch<KIND>(slots, threadIdx.x, g, r); }

// The planes' nibble table's declaration: 16 words at a shared address that is a multiple of 256
// (mm_core_pl forms a lookup's address by replacing its low byte).
#define MM_PL_LUT(name) __shared__ __align__(256) uint32_t name[16]

// Fills the planes' nibble table (16 words); the caller synchronises.
__device__ __forceinline__ void mm_plane_lut(uint32_t *lut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = mm_plane_bits(threadIdx.x & 3u) | (mm_plane_bits(threadIdx.x >> 2) << 16);
}

// The calling warp's share of acc[i][n] += W_i[row0_i + tile rows, k] · xs[brow[n], k] for the
// NTL row tiles i (matrix M[i / RT], rows row0[i % RT]) and the NT n-tiles of 8 tokens (n < nact
// only; brow[n] < 0: no token, zeros), over the 64-blocks kb ≡ warp (mod GPU_MM_WARPS).
// xs: bf16 [GPU_MM_PARTS][·][K] with ss elements between the parts; row brow[n] of each part.
// Each 16-wide step sums its three parts (lo, mid, hi) into a fresh accumulator that is then
// added to the running one in f32: the tensor cores' own additions (which do not round to
// nearest) see at most 48 products.
template <int KIND, int NTL, int NT, bool SB>
__device__ __forceinline__ void mm_step(const mm_raw (&raw)[NTL], int kb, const __nv_bfloat16 *__restrict__ xs, size_t ss, int K,
                                        const int brow[NT], int nact, const uint32_t *lut, float acc[NTL][NT][4]) {
    const int t = threadIdx.x & 3;
    // the activations of QB steps at once: all four (one round trip) for a single n-tile, one
    // step at a time for four (the registers)
    constexpr int QB = NT == 1 ? 4 : 1;
#pragma unroll
    for (int q0 = 0; q0 < 4; q0 += QB) {
        uint2 b[QB][NT][GPU_MM_PARTS];
#pragma unroll
        for (int qq = 0; qq < QB; qq++) {
            const int q = q0 + qq, ko = kb * 64 + (KIND == GPU_W_PLANES ? 16 * q + 4 * t : 16 * t + 4 * q);
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int s = 0; s < GPU_MM_PARTS; s++)
                    b[qq][n][s] = (n < nact && brow[n] >= 0) ? (SB ? *(const uint2 *)(xs + s * ss + (size_t)brow[n] * K + ko)
                                                                   : __ldg((const uint2 *)(xs + s * ss + (size_t)brow[n] * K + ko)))
                                                             : make_uint2(0, 0);
        }
#pragma unroll
        for (int qq = 0; qq < QB; qq++)
#pragma unroll
            for (int i = 0; i < NTL; i++) {
                uint32_t a[4];
                mm_widen<KIND>(raw[i], q0 + qq, lut, a);
#pragma unroll
                for (int n = 0; n < NT; n++)
                    if (n < nact) {
                        mm_acc(acc[i][n], a, b[qq][n]);
                    }
            }
    }
}

// The 64-blocks of weights a lane keeps in flight for a launch shape's U: half as many for BF16
// (twice the bytes of FP8 per block: the same bytes, half the registers). Only when loads are
// issued depends on it, never a result.
template <int KIND, int U>
struct mm_ring {
    static constexpr int n = KIND == GPU_W_BF16 && U > 1 ? U / 2 : U;
};

// U: the 64-blocks whose weights are in flight at once (a ring of mm_ring<KIND, U>::n; the next
// is loaded as soon as one is multiplied). SB: xs is in shared memory (plain loads), else global
// (read-only loads). DEP: the kernel has not yet passed GPU_DEP (sass/common.cuh): the first
// weights are requested, then it waits for the activations. pre: what the block does once the
// first weights are requested and before they are multiplied (the experts' _d shape: the item's
// tokens staged, the table filled, a block barrier), so that those loads and its own overlap;
// every thread of the block calls mm_core, so pre may hold a barrier.
struct mm_nop {
    __device__ __forceinline__ void operator()() const {}
};
template <int KIND, int NM, int RT, int NT, int U0, bool SB, bool DEP, class Pre = mm_nop>
__device__ __forceinline__ void mm_core(const gpu_mat *M, const int *row0, int K, const __nv_bfloat16 *__restrict__ xs, size_t ss,
                                        const int brow[NT], int nact, const uint32_t *lut, float acc[NM * RT][NT][4], Pre pre = Pre()) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int KB = K / 64;
    constexpr int NTL = NM * RT, S = GPU_MM_WARPS, U = mm_ring<KIND, U0>::n;
#pragma unroll
    for (int i = 0; i < NTL; i++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][n][c] = 0.f;
    mm_raw ring[U][NTL];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (w + S * u < KB)
#pragma unroll
            for (int i = 0; i < NTL; i++) mm_load<KIND>(M[i / RT], row0[i % RT], w + S * u, g, t, ring[u][i]);
    if (DEP) GPU_DEP();
    pre();
    for (int kb0 = w; kb0 < KB; kb0 += S * U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kb = kb0 + S * u;
            if (kb < KB) {
                mm_step<KIND, NTL, NT, SB>(ring[u], kb, xs, ss, K, brow, nact, lut, acc);
                if (kb + S * U < KB)
#pragma unroll
                    for (int i = 0; i < NTL; i++) mm_load<KIND>(M[i / RT], row0[i % RT], kb + S * U, g, t, ring[u][i]);
            }
        }
    }
}

// ---- the 2-bit planes at one n-tile of tokens read through L1 (the experts' _dg4 kernels) -----------
//
// mm_core_pl<NM, RT, U>: mm_core<GPU_W_PLANES, NM, RT, 1, U, false, false>'s steps, products and
// sums in the same order (the same bits) for row tiles row0 + 16r (r < RT) of each of the NM
// matrices, in fewer instructions a weight: at 1 to 8 tokens an expert the shape is bound by issue,
// not by bytes (ncu, H200, batch 16: 0.71 warp instructions a cycle a scheduler, DRAM 16 % busy).
// Each matrix's codes and scales addressed from a pointer set once (a step's offsets by kb and the
// row tile alone), the token's row of xs likewise; a scale byte's bf16 exponent pair by one
// multiply (mm_plane_base); the table offsets of a code word's nibbles for its four steps by two
// shifts and masks (mm_pl_idx), then a byte permute a lookup that is its shared-memory address
// too (mm_pl_lut). 1,472 / 688 instructions in k_moe_up_dg4 / k_moe_dn_dg4 where mm_core's planes
// path gave 2,040 / 1,040 (cuobjdump). A lane whose token slot is empty (brow < 0) reads row 0 of
// xs instead of zeros: its products fill only that slot's column of the C fragment, which no
// caller reads (mm_at: slots m < cnt).

// The table offsets (4 · nibble) of a code word's 8 nibbles: byte q of e for nibble 2q (codes j = 0,
// 1 of step q), byte q of o for nibble 2q + 1 (codes 2, 3).
__device__ __forceinline__ void mm_pl_idx(uint32_t wd, uint32_t &e, uint32_t &o) { e = (wd << 2) & 0x3c3c3c3cu, o = (wd >> 2) & 0x3c3c3c3cu; }

// The table's word at offset byte q of e: its shared-memory address is the table's la (a multiple
// of 256, MM_PL_LUT) with that byte as its low byte — one byte permute, no add.
__device__ __forceinline__ uint32_t mm_pl_lut(uint32_t e, uint32_t la, int q) {
    uint32_t v;
    // volatile: the table is read only after the barrier that publishes it (mm_core_pl's pre)
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(__byte_perm(e, la, 0x7650u + q)));
    return v;
}

// Step q's A fragment (as mm_widen<GPU_W_PLANES>): ea, oa the offsets of row g's word, eb, ob of
// row g + 8's; ba, bb their scale block's exponent pairs (block q / 2); la the table's address.
__device__ __forceinline__ void mm_pl_widen(uint32_t ea, uint32_t oa, uint32_t eb, uint32_t ob, uint32_t ba, uint32_t bb, int q, uint32_t la,
                                            uint32_t a[4]) {
    a[0] = ba + mm_pl_lut(ea, la, q), a[2] = ba + mm_pl_lut(oa, la, q);
    a[1] = bb + mm_pl_lut(eb, la, q), a[3] = bb + mm_pl_lut(ob, la, q);
}

template <int NM, int RT, int U, class Pre>
__device__ __forceinline__ void mm_core_pl(const gpu_mat *M, int row0, int K, const __nv_bfloat16 *__restrict__ xs, size_t ss,
                                           int brow, const uint32_t *lut, float acc[NM * RT][1][4], Pre pre) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int KB = K / 64;
    const uint32_t la = (uint32_t)__cvta_generic_to_shared(lut);
    if (la & 255u) __trap();   // (the table not where MM_PL_LUT puts it: the caller's declaration, loudly)
    // HB: scale blocks whose steps' activations are loaded at once — both (one round trip) for one
    // part, one at a time for three (the registers)
    constexpr int NTL = NM * RT, S = GPU_MM_WARPS, HB = GPU_MM_PARTS == 1 ? 2 : 1;
#pragma unroll
    for (int i = 0; i < NTL; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][0][c] = 0.f;
    // tile i's 64-block kb (format/PLANES.md §3, as mm_load): this lane's 8 code bytes at cw[m] + r·cr +
    // 256 kb, its rows' scale bytes at cs[m] + r·sr + 32 kb + {0, 8, 16, 24} (g b0, g + 8 b0, g b1, g + 8 b1),
    // m = i / RT the matrix, r = i % RT its row tile (row tiles 16 rows apart: cr, sr bytes)
    const uint8_t *cw[NM], *cs[NM];
    const int cr = KB * 256, sr = K / 2;
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const size_t nb = row0 / 16;
        cw[m] = (const uint8_t *)M[m].w + ((nb * KB * 8 + g) * 4 + t) * 8;
        cs[m] = (const uint8_t *)M[m].scale + nb * (K / 32) * 16 + g;
    }
    // the token's row of each part at k = 16q + 4t of 64-block 0
    const __nv_bfloat16 *xp = xs + (size_t)(brow >= 0 ? brow : 0) * K + 4 * t;
    uint2 code[U][NTL];
    uint32_t sc[U][NTL];
    auto load = [&](int u, int kb) {
#pragma unroll
        for (int i = 0; i < NTL; i++) {
            const int m = i / RT, r = i % RT;
            code[u][i] = __ldg((const uint2 *)(cw[m] + (size_t)(r * cr + kb * 256)));
            sc[u][i] = mm_pl_scales(cs[m] + (size_t)(r * sr + kb * 32));
        }
    };
#pragma unroll
    for (int u = 0; u < U; u++)
        if (w + S * u < KB) load(u, w + S * u);
    pre();
    for (int kb0 = w; kb0 < KB; kb0 += S * U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kb = kb0 + S * u;
            if (kb < KB) {
#pragma unroll
                for (int h0 = 0; h0 < 2; h0 += HB) {
                    uint2 b[2 * HB][GPU_MM_PARTS];   // the steps 2h0 .. 2(h0 + HB) − 1's activations at once
#pragma unroll
                    for (int q = 0; q < 2 * HB; q++)
#pragma unroll
                        for (int s = 0; s < GPU_MM_PARTS; s++) b[q][s] = __ldg((const uint2 *)(xp + s * ss + (size_t)kb * 64 + 16 * (2 * h0 + q)));
#pragma unroll
                    for (int i = 0; i < NTL; i++) {
                        uint32_t ea, oa, eb, ob;
                        mm_pl_idx(code[u][i].x, ea, oa), mm_pl_idx(code[u][i].y, eb, ob);
                        const uint32_t sw = sc[u][i];
#pragma unroll
                        for (int h = h0; h < h0 + HB; h++) {   // scale block h: steps 2h, 2h + 1
                            const uint32_t ba = mm_plane_base(__byte_perm(sw, 0, 0x4440u + 2 * h)), bb = mm_plane_base(__byte_perm(sw, 0, 0x4441u + 2 * h));
#pragma unroll
                            for (int qq = 0; qq < 2; qq++) {
                                uint32_t a[4];
                                mm_pl_widen(ea, oa, eb, ob, ba, bb, 2 * h + qq, la, a);
                                mm_acc(acc[i][0], a, b[2 * (h - h0) + qq]);
                            }
                        }
                    }
                }
                if (kb + S * U < KB) load(u, kb + S * U);
            }
        }
    }
}

// The place of a lane's C register c in its 32 floats of the warps' sums: the lane itself, or (ROT:
// mm_stream's and mt_stream's sums, a tile's every four steps) t turned by c within the lane's
// group of four, so that mm_at's reads — one t, every g and c in a warp — meet each bank once
// (unturned: four lanes a bank). mm_reduce keeps the lanes: the turn's addresses cost the experts'
// staging kernels registers they spill.
template <bool ROT>
__device__ __forceinline__ int mm_red_slot(int lane, int c) { return ROT ? (lane & ~3) | ((lane + c) & 3) : lane; }

// Adds the GPU_MM_WARPS warps' accumulators in warp order into red [NTL][NT][4][32] (shared),
// which every thread may read after it returns. ONE: red has room for every warp's share
// ([GPU_MM_WARPS] of them, one barrier, the sums in warp order as they are read: mm_at);
// otherwise the warps add theirs in turn, a barrier each.
template <int NTL, int NT, bool ONE>
__device__ __forceinline__ void mm_reduce(const float acc[NTL][NT][4], float *red, int nact) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (ONE) {
#pragma unroll
        for (int i = 0; i < NTL; i++)
#pragma unroll
            for (int n = 0; n < NT; n++)
                if (n < nact)
#pragma unroll
                    for (int c = 0; c < 4; c++) red[(((w * NTL + i) * NT + n) * 4 + c) * 32 + lane] = acc[i][n][c];
        __syncthreads();
    } else {
        for (int v = 0; v < GPU_MM_WARPS; v++) {
            if (w == v)
#pragma unroll
                for (int i = 0; i < NTL; i++)
#pragma unroll
                    for (int n = 0; n < NT; n++)
                        if (n < nact)
#pragma unroll
                            for (int c = 0; c < 4; c++) {
                                float *p = red + ((i * NT + n) * 4 + c) * 32 + lane;
                                *p = v == 0 ? acc[i][n][c] : *p + acc[i][n][c];
                            }
            __syncthreads();
        }
    }
}

// Element (row r of the tile, token slot m of the block's 8·NT) of a reduced tile i (of NTL):
// the lane and register that hold it (C fragment: c0, c1 row g tokens 2t, 2t+1; c2, c3 row g + 8),
// summed over the warps in warp order when ONE; ROT: where mm_red_slot<true> placed it.
template <int NTL, int NT, bool ONE, bool ROT = false>
__device__ __forceinline__ float mm_at(const float *red, int i, int r, int m) {
    int n = m >> 3, col = m & 7, g = r & 7, c = (r >> 3) * 2 + (col & 1), t = col >> 1;
    int o = ((i * NT + n) * 4 + c) * 32 + mm_red_slot<ROT>(g * 4 + t, c);
    if (!ONE) return red[o];
    float v = red[o];
#pragma unroll
    for (int w = 1; w < GPU_MM_WARPS; w++) v += red[w * NTL * NT * 128 + o];
    return v;
}

// Shared floats of mm_reduce's red.
template <int NTL, int NT, bool ONE>
struct mm_red {
    static constexpr int floats = (ONE ? GPU_MM_WARPS : 1) * NTL * NT * 128;
};

// Runs mm_core for the matrices' kind (every matrix of one call has the same kind).
template <int NM, int RT, int NT, int U, bool SB = false, bool DEP = false, class Pre = mm_nop>
__device__ __forceinline__ void mm_any(const gpu_mat *M, const int *row0, int K, const __nv_bfloat16 *__restrict__ xs, size_t ss,
                                       const int brow[NT], int nact, const uint32_t *lut, float acc[NM * RT][NT][4], Pre pre = Pre()) {
    // (pre inside mm_core for the planes alone: the wider rings of the other kinds beside the
    // experts' staging spilled registers, and their down products ran 11-14 % slower)
    switch (M[0].kind) {
    case GPU_W_FP8: pre(), mm_core<GPU_W_FP8, NM, RT, NT, U, SB, DEP>(M, row0, K, xs, ss, brow, nact, lut, acc); break;
    case GPU_W_NVFP4: pre(), mm_core<GPU_W_NVFP4, NM, RT, NT, U, SB, DEP>(M, row0, K, xs, ss, brow, nact, lut, acc); break;
    case GPU_W_BF16: pre(), mm_core<GPU_W_BF16, NM, RT, NT, U, SB, DEP>(M, row0, K, xs, ss, brow, nact, lut, acc); break;
    default: mm_core<GPU_W_PLANES, NM, RT, NT, U, SB, DEP>(M, row0, K, xs, ss, brow, nact, lut, acc, pre); break;
    }
}

// Copies n16 16-byte pieces src → dst (shared memory), a thread's pieces four at a time: their loads
// all in flight before the first store (one round trip for every four pieces, not one a piece); the
// caller synchronises.
__device__ __forceinline__ void mm_copy16(uint4 *dst, const uint4 *__restrict__ src, int n16) {
    constexpr int U = 4;
    const int nt = blockDim.x;
    for (int i0 = threadIdx.x; i0 < n16; i0 += U * nt) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i0 + u * nt < n16) v[u] = __ldg(src + i0 + u * nt);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i0 + u * nt < n16) dst[i0 + u * nt] = v[u];
    }
}

// Copies rows src_row(j) of the parts [GPU_MM_PARTS][·][K] at xs (ss elements apart), j < n, into
// dst [GPU_MM_PARTS][n][K] (shared memory), 16 bytes a thread at a time; the caller synchronises.
template <class F>
__device__ __forceinline__ void mm_stage(__nv_bfloat16 *dst, const __nv_bfloat16 *__restrict__ xs, size_t ss, int K, int n, F src_row) {
    const int per = K / 8, total = GPU_MM_PARTS * n * per;   // 16-byte pieces
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        int s = i / (n * per), j = (i / per) % n, k8 = i % per;
        ((uint4 *)dst)[i] = __ldg((const uint4 *)(xs + s * ss + (size_t)src_row(j) * K) + k8);
    }
}

// The per-tensor scale that multiplies a kind's sums.
__device__ __forceinline__ float mm_post(const gpu_mat &W) { return W.kind == GPU_W_FP8 || W.kind == GPU_W_NVFP4 ? W.s : 1.f; }

// ---- prompts: tiles of GPU_MMG_BM rows × GPU_MMG_BN tokens through shared memory (k_mm_g) -------
//
// A block's GPU_MM_WARPS warps share each 64-block's operands: warp w copies the bytes its lanes
// would load of row tile w (mm_cp_issue: the same slots as k_mm_v's ring) and every thread a share
// of the tokens' three parts ([part][token][64] bf16, 16-byte pieces swizzled by token so a
// warp's reads meet no bank twice), GPU_MMG_STAGES 64-blocks ahead (cp.async). Warp (wm, wn)
// = (w % 4, w / 4) multiplies rows [32wm, +32) by tokens [GPU_MMG_BN/2 · wn, + GPU_MMG_BN/2): two
// row tiles × MMG_NW n-tiles. The order: the 64-blocks kb ≡ 0 (mod GPU_MM_WARPS) in ascending kb, then those ≡ 1,
// …, each class into a fresh accumulator (what warp w of mm_core sums: the same steps, q and
// parts in the same order) that is added to the running total when the class ends, in class
// order: mm_reduce's order. So a token's sums are the bits of every other shape.

#define MMG_NW (GPU_MMG_BN / 16)   // n-tiles of 8 tokens per warp (k_mm_g32: GPU_MMG_BN32 / 16; NW below)

// Bytes of one stage of BN tokens: the weights' slots (mm_cp_slots), the parts [GPU_MM_PARTS][BN][64] bf16.
template <int KIND, int BN = GPU_MMG_BN>
struct mmg_stage {
    static constexpr int a = mm_cp_slots<KIND>::bytes, b = GPU_MM_PARTS * BN * 128, bytes = a + b;
};

// The swizzled place of 16-byte piece c (of 8) of token row r in a part: k_mm_g's reads of one
// 16-byte piece per lane (pieces 2t + h of 8 tokens g… in each quarter warp), the planes' of 8
// bytes (pieces 2q + t/2 of 4 tokens in each half warp), meet every bank once.
template <int KIND>
__device__ __forceinline__ int mmg_piece(int c, int r) { return KIND == GPU_W_PLANES ? c ^ ((r & 3) << 1) : c ^ (r & 7); }

// The 64-blocks of K in the order the staged shapes take them (mmw_produce's and mmg_run's issues,
// j = 0, 1, 2, … in turn): the classes kb ≡ c (mod GPU_MM_WARPS) one after the other, each in
// ascending kb, the first KB % GPU_MM_WARPS of them one 64-block longer — each next() the kb of the
// next j, by counters (no division by the runtime class lengths at each issue).
struct mmg_kb_walk {
    int cls, e, len, q, r;   // the class of the next j, its place in the class, the class's length; KB = GPU_MM_WARPS·q + r
    __device__ __forceinline__ explicit mmg_kb_walk(int KB)
        : cls(0), e(0), len(KB / GPU_MM_WARPS + (KB % GPU_MM_WARPS > 0)), q(KB / GPU_MM_WARPS), r(KB % GPU_MM_WARPS) {}
    __device__ __forceinline__ int next() {
        const int kb = cls + GPU_MM_WARPS * e;
        if (++e == len) e = 0, cls++, len = q + (cls < r);
        return kb;
    }
};

// One 64-block of the stage (sa: the weights' slots, sb: the parts of 16·NW tokens) into acc [2][NW][4] of warp (wm, wn).
template <int KIND, int NW>
__device__ __forceinline__ void mmg_mul(const uint8_t *sa, const uint8_t *sb, int wm, int wn, const uint32_t *lut, float (&acc)[2][NW][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    mm_raw raw[2];
#pragma unroll
    for (int i = 0; i < 2; i++) mm_cp_fetch<KIND>(sa, 32 * (2 * wm + i) + lane, g, raw[i]);
#pragma unroll
    for (int h = 0; h < 2; h++) {   // steps q = 2h, 2h + 1
        uint32_t a[2][2][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int qq = 0; qq < 2; qq++) mm_widen<KIND>(raw[i], 2 * h + qq, lut, a[i][qq]);
#pragma unroll
        for (int n = 0; n < NW; n++) {
            const int r = 8 * NW * wn + 8 * n + g;
            uint2 b[2][GPU_MM_PARTS];
#pragma unroll
            for (int s = 0; s < GPU_MM_PARTS; s++) {
                const uint8_t *row = sb + (size_t)(s * 16 * NW + r) * 128;
                if (KIND == GPU_W_PLANES) {   // k = 16q + 4t: piece 2q + t/2, half t % 2
#pragma unroll
                    for (int qq = 0; qq < 2; qq++)
                        b[qq][s] = *(const uint2 *)(row + mmg_piece<KIND>(2 * (2 * h + qq) + (t >> 1), r) * 16 + (t & 1) * 8);
                } else {   // k = 16t + 4q: piece 2t + h holds q = 2h and 2h + 1
                    const uint4 v = *(const uint4 *)(row + mmg_piece<KIND>(2 * t + h, r) * 16);
                    b[0][s] = make_uint2(v.x, v.y), b[1][s] = make_uint2(v.z, v.w);
                }
            }
#pragma unroll
            for (int qq = 0; qq < 2; qq++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mm_acc(acc[i][n], a[i][qq], b[qq]);
                }
        }
    }
}

// The block's tile: row tile w (< GPU_MM_WARPS) is rows [row0, row0 + 16) of matrix *M as tile(w, M,
// row0) says (rows past M->rows: zeros), times the tokens tok[r] (r < 16·NW, shared int32, -1:
// none) of xs (parts ss apart, rows of K); tot[i][n][e] = the sum of row tile 2wm + i, row g + 8(e/2),
// token 8·NW·wn + 8n + 2t + e%2 (mmg_place), before the kind's scale (k_mm_g: NW = MMG_NW). smem:
// GPU_MMG_STAGES · mmg_stage<KIND, 16·NW>::bytes (dynamic). DEP: GPU_DEP is still to come (the
// first stages' weights are requested before it). lut filled and published by the caller.
template <int KIND, bool DEP, class Tile, int NW>
__device__ __forceinline__ void mmg_run(Tile tile, int K, const __nv_bfloat16 *__restrict__ xs, size_t ss, const int *tok, uint8_t *smem,
                                        const uint32_t *lut, float (&tot)[2][NW][4]) {
    constexpr int S = GPU_MMG_STAGES, BN = 16 * NW, ST = mmg_stage<KIND, BN>::bytes;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5, wm = w & 3, wn = w >> 2;
    const int KB = K / 64;
    const gpu_mat *M;
    int row0;
    tile(w, M, row0);
    const bool mine = KIND != GPU_W_PLANES || row0 < M->rows;   // (a planes tile is whole or absent)
    auto issue_a = [&](int j, int kb) {
        if (j < KB && mine) mm_cp_issue<KIND>(*M, row0, kb, g, t, smem + (j % S) * ST);
    };
    auto issue_b = [&](int j, int kb) {
        if (j >= KB) return;
        uint8_t *sb = smem + (j % S) * ST + mmg_stage<KIND, BN>::a;
        for (int c = threadIdx.x; c < GPU_MM_PARTS * BN * 8; c += GPU_MM_NT) {
            const int s = c / (BN * 8), r = (c >> 3) % BN, p = c & 7, row = tok[r];
            mm_cp<16>(sb + ((size_t)(s * BN + r) * 8 + mmg_piece<KIND>(p, r)) * 16,
                      xs + s * ss + (size_t)(row >= 0 ? row : 0) * K + kb * 64 + p * 8, row >= 0);
        }
    };
    mmg_kb_walk kw(KB);   // the issues' 64-blocks j = 0, 1, … in turn (mmg_kb's order)
    if (DEP) {
        mmg_kb_walk ka(KB);   // (the weights' first S − 1 before the wait)
        for (int j = 0; j < S - 1; j++) issue_a(j, ka.next());
        GPU_DEP();
    }
    for (int j = 0; j < S - 1; j++) {
        const int kb = kw.next();
        if (!DEP) issue_a(j, kb);
        issue_b(j, kb);
        mm_cp_commit();
    }
    float acc[2][NW][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < NW; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][n][e] = 0.f, tot[i][n][e] = 0.f;
    const int q8 = KB / GPU_MM_WARPS, r8 = KB % GPU_MM_WARPS;
    int cls = 0, left = q8 + (r8 > 0);   // the class being summed, its 64-blocks still to come
    for (int j = 0; j < KB; j++) {
        mm_cp_wait<S - 2>();
        __syncthreads();   // stage j landed for every thread; stage j − 1 read by every warp
        const int kb = kw.next();
        issue_a(j + S - 1, kb);
        issue_b(j + S - 1, kb);
        mm_cp_commit();
        mmg_mul<KIND>(smem + (j % S) * ST, smem + (j % S) * ST + mmg_stage<KIND, BN>::a, wm, wn, lut, acc);
        if (--left == 0) {   // the class ends: its sum joins the total (the first is the total)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int n = 0; n < NW; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) tot[i][n][e] = cls == 0 ? acc[i][n][e] : tot[i][n][e] + acc[i][n][e], acc[i][n][e] = 0.f;
            cls++;
            left = q8 + (cls < r8);
        }
    }
    mm_cp_wait<0>();   // nothing left in flight into shared memory
    // classes without a 64-block (K < 64 · GPU_MM_WARPS) add their zero, as mm_at does
    for (; cls < GPU_MM_WARPS; cls++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int n = 0; n < NW; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) tot[i][n][e] += 0.f;
}

// Where tot[i][n][e] of mmg_run lies: row tile ti (of the block's GPU_MM_WARPS), row rr in it, token r.
template <int NW = MMG_NW>
__device__ __forceinline__ void mmg_place(int i, int n, int e, int &ti, int &rr, int &r) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    ti = 2 * (w & 3) + i, rr = (lane >> 2) + 8 * (e >> 1), r = 8 * NW * (w >> 2) + 8 * n + 2 * (lane & 3) + (e & 1);
}
