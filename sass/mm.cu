// sass/mm.cu — the dense matrix products on the tensor cores (sass/mm.cuh) and the activations'
// split into the three bf16 parts they read:
//   k_mm_split: xs[s][t][k], s < 3 (hi, mid, lo), of x [T, ldx]'s first K columns
//   k_mm_*:     y_i[t, o] = post_i · Σ_k W_i[o, k] · x[t, k] for the matrices of a gpu_lin_set
// CPU twins: ref_linear (k_mm_*); k_mm_split's parts add back to x (the harness checks both).
//
// Launch (gpu/launch.c: gpu_k_mm_split, gpu_k_mm): block GPU_MM_NT threads (GPU_MM_WARPS warps,
// one slice of k each). k_mm_split: grid ceil(T·K / 4 / GPU_MM_NT), a thread per 4 elements.
// gpu_k_mm picks the shape by T; every shape gives the same bits (the order depends on K alone):
//   k_mm_v  T ≤ GPU_MM_TOK_V, the weights' ring and the tokens' parts in dynamic shared memory:
//           grid (runs of set.pad[0] row tiles of 16 per matrix), set.first[] in runs;
//   k_mm_v2 T ≤ GPU_MM_TOK_V2 (gpu_kernels.mm_v2): k_mm_v's grid and ring, the tokens read from xs;
//   k_mm_v4 T ≤ GPU_MM_TOK_V4 (gpu_kernels.mm_v4): the same in four n-tiles;
//   k_mm_d  T ≤ 8: grid (Σ_i ceil(O_i / 16), ceil(T / 8)), one n-tile of 8 tokens, four 64-blocks
//           of weights in flight per warp;
//   k_mm_b  T ≤ GPU_MM_TOK_B: grid (Σ_i ceil(O_i / 16), ceil(T / 32)), four n-tiles;
//   k_mm_p  beyond: grid (Σ_i ceil(O_i / 32), ceil(T / 32)), two row tiles per warp (the token
//           tile's activations reused over 32 rows);
//   k_mm_g  beyond, where its shared memory fits and the weights are FP8, NVFP4 or BF16 (mm.cuh:
//           mmg_run): grid (Σ_i ceil(O_i / GPU_MMG_BM), ceil(T / GPU_MMG_BN)), both operands
//           through GPU_MMG_STAGES stages.

#include "mm.cuh"

// The dynamic shared memory of the kernels that stage activations (k_mm_v here, k_moe_up_d and
// k_moe_dn_d in moe_mm.cu).
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
    mm_any<1, RT, NT, U, false, true>(&W, row0, K, xs, (size_t)T * K, brow, nact, lut, acc);
    mm_reduce<RT, NT, ONE>(acc, red, nact);
    float *__restrict__ y = (float *)set.y[m];
    const int ldy = set.ldy[m];
    const float post = mm_post(W);
    for (int e = threadIdx.x; e < RT * 16 * ntok; e += blockDim.x) {
        int mm = e / (RT * 16), rr = e % (RT * 16), row = base + rr;
        if (row < W.rows) y[(size_t)(t0 + mm) * ldy + row] = mm_at<RT, NT, ONE>(red, rr / 16, rr % 16, mm) * post;
    }
}

// The grid shapes (above): RT row tiles of 16 per warp, NT n-tiles of 8 tokens, U 64-blocks of
// weights in flight, ONE: the warps' sums meet in one shared buffer (else in turn).
#define MM_DENSE(name, RT, NT, U, ONE, MINB)                                                                               \
    extern "C" __global__ void __launch_bounds__(GPU_MM_NT, MINB) name(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) { \
        mm_dense<RT, NT, U, ONE>(set, xs, T);                                                                              \
    }
MM_DENSE(k_mm_d, 1, 1, 4, true, 2)
MM_DENSE(k_mm_b, 1, 4, 2, true, 1)
MM_DENSE(k_mm_p, 2, 4, 1, false, 1)

// ---- decode: a few tokens, each block streaming a run of row tiles ------------------------------
//
// k_mm_v (T ≤ GPU_MM_TOK_V): the tokens' parts are copied into shared memory once per block
// (dynamic: GPU_MM_PARTS·T·K bf16), then the block walks row tiles first[m] + set.pad[0]·(its
// index within matrix m) onward (set.pad[0] tiles per block). Each thread copies its own weight
// bytes of mm_cp_slots<KIND>::ring (tile, 64-block) steps ahead (six; three for BF16) into its
// own slots of a ring of GPU_MM_RING_BYTES of shared memory (cp.async: no registers held, the
// loop body one step long), across tile boundaries, so the
// loads of the next tile are on their way while the warps' sums of this one meet in shared memory
// (double-buffered: one barrier per tile). The same steps and order as mm_core: the same bits as
// every other shape.
template <int KIND, int NT>
__device__ __forceinline__ void mm_stream(const gpu_mat &W, int tile0, int ntile, const __nv_bfloat16 *__restrict__ xs, __nv_bfloat16 *xsm,
                                          uint8_t *ring, int T, float *red, uint32_t *lut, float *__restrict__ y, int ldy) {
    constexpr int R = mm_cp_slots<KIND>::ring, SB = mm_cp_slots<KIND>::bytes;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int K = W.cols, KB = K / 64, nk = (KB + GPU_MM_WARPS - 1) / GPU_MM_WARPS, njob = ntile * nk;
    const float post = mm_post(W);
    // steps j < R: slot j (a commit group per step, empty past the end: the count of groups in
    // flight stays R); step j is 64-block w + GPU_MM_WARPS · (j % nk) of tile tile0 + j / nk
    for (int j = 0; j < R; j++) {
        const int kb = w + GPU_MM_WARPS * (j % nk);
        if (j < njob && kb < KB) mm_cp_issue<KIND>(W, 16 * (tile0 + j / nk), kb, g, t, ring + j * SB);
        mm_cp_commit();
    }
    // the weights are on their way: wait for the activations, then (one n-tile) copy them in
    GPU_DEP();
    if (NT == 1) {
        mm_copy16((uint4 *)xsm, (const uint4 *)xs, GPU_MM_PARTS * T * K / 8);   // 16-byte pieces (K % 64 == 0)
    }
    mm_plane_lut(lut);
    __syncthreads();
    // the steps walked by counters, not divisions: this step's (slot, 64-block class cq, tile ti),
    // the next issue's (class iq of tile it, its sources src)
    int slot = 0, cq = 0, ti = 0, iq = R % nk, it = R / nk;
    mm_cp_src src;
    if (it < ntile) mm_cp_tile<KIND>(W, 16 * (tile0 + it), g, t, src);
    // this lane's B column in each part and n-tile, at 64-block 0 (k = its first of q = 0): token
    // 8n + g, or the last token for lanes past T — an output column depends on its own B column
    // alone, and columns past T are never stored, so those lanes read real values instead of
    // being zeroed. One n-tile: the copy in shared memory; more: xs itself (L1 keeps it).
    const __nv_bfloat16 *xp[NT][GPU_MM_PARTS];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const int gt = 8 * n + g < T ? 8 * n + g : T - 1;
#pragma unroll
        for (int s = 0; s < GPU_MM_PARTS; s++)
            xp[n][s] = (NT == 1 ? xsm : xs) + ((size_t)s * T + gt) * K + (KIND == GPU_W_PLANES ? 4 * t : 16 * t);
    }
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[n][c] = 0.f;
    for (int j = 0; j < njob; j++) {   // uniform over the block: every warp has the same steps
        const int kb = w + GPU_MM_WARPS * cq;
        uint8_t *sl = ring + slot * SB;
        mm_cp_wait<R - 1>();   // this thread's step j has landed (its own bytes: no barrier)
        if (kb < KB) {
            mm_raw raw;
            mm_cp_fetch<KIND>(sl, g, raw);
            constexpr bool PAIR = mm_b_pairs<KIND, NT>::on;
            uint2 bp[PAIR ? NT : 1][GPU_MM_PARTS];   // PAIR: step q + 1's, loaded with step q's
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int ko = kb * 64 + (KIND == GPU_W_PLANES ? 16 * q : 4 * q);
                uint2 b[NT][GPU_MM_PARTS];
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int s = 0; s < GPU_MM_PARTS; s++) {
                        if (!PAIR || q % 2 == 0) mm_b_load<NT != 1, PAIR>(xp[n][s], ko, b[n][s], bp[PAIR ? n : 0][s]);
                        else b[n][s] = bp[n][s];
                    }
                uint32_t a[4];
                mm_widen<KIND>(raw, q, lut, a);
#pragma unroll
                for (int n = 0; n < NT; n++) mm_acc(acc[n], a, b[n]);
            }
        }
        // step j + R into the slot just read (its values are used above: the read is done)
        if (it < ntile && w + GPU_MM_WARPS * iq < KB) mm_cp_kb<KIND>(src, w + GPU_MM_WARPS * iq, sl);
        mm_cp_commit();
        if (++iq == nk && ++it < ntile) iq = 0, mm_cp_tile<KIND>(W, 16 * (tile0 + it), g, t, src);
        if (++slot == R) slot = 0;
        if (++cq == nk) {   // the tile's last step: the warps' sums meet (mm_reduce's layout, ONE)
            float *rb = red + (ti & 1) * GPU_MM_WARPS * 128 * NT;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) rb[((w * NT + n) * 4 + c) * 32 + mm_red_slot<true>(lane, c)] = acc[n][c], acc[n][c] = 0.f;
            __syncthreads();
            for (int e = threadIdx.x; e < 16 * T; e += GPU_MM_NT) {
                const int r = e & 15, m = e >> 4, row = 16 * (tile0 + ti) + r;
                if (row < W.rows) y[(size_t)m * ldy + row] = mm_at<1, NT, true, true>(rb, 0, r, m) * post;
            }
            cq = 0, ti++;
        }
    }
    mm_cp_wait<0>();   // nothing left in flight into shared memory at exit
}

// A block's run of row tiles (set.pad[0] a block) of its matrix through mm_stream.
template <int NT>
__device__ __forceinline__ void mm_stream_set(const gpu_lin_set &set, const __nv_bfloat16 *__restrict__ xs, int T, float *red, uint32_t *lut) {
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    const int per = set.pad[0], ntile_all = (W.rows + 15) / 16;
    const int tile0 = ((int)blockIdx.x - set.first[m]) * per, ntile = min(per, ntile_all - tile0);
    uint8_t *ring = mm_smem;                                            // GPU_MM_RING_BYTES
    __nv_bfloat16 *xsm = (__nv_bfloat16 *)(mm_smem + GPU_MM_RING_BYTES);   // (one n-tile) [GPU_MM_PARTS][T][K]
    float *__restrict__ y = (float *)set.y[m];
    switch (W.kind) {
    case GPU_W_FP8: mm_stream<GPU_W_FP8, NT>(W, tile0, ntile, xs, xsm, ring, T, red, lut, y, set.ldy[m]); break;
    case GPU_W_NVFP4: mm_stream<GPU_W_NVFP4, NT>(W, tile0, ntile, xs, xsm, ring, T, red, lut, y, set.ldy[m]); break;
    case GPU_W_BF16: mm_stream<GPU_W_BF16, NT>(W, tile0, ntile, xs, xsm, ring, T, red, lut, y, set.ldy[m]); break;
    default: mm_stream<GPU_W_PLANES, NT>(W, tile0, ntile, xs, xsm, ring, T, red, lut, y, set.ldy[m]); break;
    }
}

extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MM_V_BLOCKS) k_mm_v(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    __shared__ uint32_t lut[16];
    __shared__ float red[2 * GPU_MM_WARPS * 128];
    mm_stream_set<1>(set, xs, T, red, lut);
}

// k_mm_v2: k_mm_v's steps for GPU_MM_TOK_V + 1 to GPU_MM_TOK_V2 tokens (two n-tiles of 8), their B
// fragments read from xs (global, through L1) instead of a copy: the ring alone in dynamic shared
// memory, GPU_MM_V2_BLOCKS blocks per multiprocessor. The same bits as every other shape.
extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MM_V2_BLOCKS) k_mm_v2(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    __shared__ uint32_t lut[16];
    __shared__ float red[2 * GPU_MM_WARPS * 128 * 2];
    mm_stream_set<2>(set, xs, T, red, lut);
}

// k_mm_v4: k_mm_v2's for GPU_MM_TOK_V2 + 1 to GPU_MM_TOK_V4 tokens (four n-tiles of 8), the warps'
// sums in dynamic shared memory after the ring (GPU_MM_V4_RED bytes: four n-tiles' sums of two
// tiles are more than a block's static arrays may take), GPU_MM_V4_BLOCKS blocks per
// multiprocessor. The same bits as every other shape.
extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MM_V4_BLOCKS) k_mm_v4(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    __shared__ uint32_t lut[16];
    mm_stream_set<4>(set, xs, T, (float *)(mm_smem + GPU_MM_RING_BYTES), lut);
}

// ---- decode, the weights through the copy engine (k_mm_t) ----------------------------------------
//
// k_mm_t: k_mm_v's row tiles per block and its order of operations (the same bits), but the
// weights come through a ring of GPU_MT_RING bytes in stages (mm.cuh: mt_kind, mt_kbc) that bulk
// copies fill (cp.async.bulk: the copy engine, not every thread's 16-byte copies): one copy per
// tile where its rows are contiguous and a stage holds them whole, else one per row. A stage's
// copies complete on its `full` mbarrier; each warp releases it on its `empty` mbarrier once it
// has multiplied its 64-blocks of it, and warp 0 refills it. Only for matrices whose copies are
// 16-byte pieces (gpu_k_mm: gpu_mt_ok); k_mm_v takes the others.
template <int KIND>
__device__ __forceinline__ void mt_issue(const gpu_mat &W, int tile, int kb0, int nkb, int KBc, uint8_t *st, uint64_t *bar) {
    constexpr int CODE = mt_kind<KIND>::code, SC = mt_kind<KIND>::sc;
    const int lane = threadIdx.x & 31, KB = W.cols / 64, r0 = 16 * tile, nv = min(16, W.rows - r0), P = KBc * CODE;
    const uint8_t *w = (const uint8_t *)W.w, *scale = (const uint8_t *)W.scale;
    if (lane == 0) mt_expect(bar, KIND == GPU_W_PLANES ? nkb * (CODE + SC) : nv * nkb * (CODE + SC));
    __syncwarp();
    if (KIND == GPU_W_PLANES) {
        if (lane == 0) mt_copy(st, w + ((size_t)tile * KB + kb0) * CODE, nkb * CODE, bar);
        if (lane == 1) mt_copy(st + KBc * CODE, scale + ((size_t)tile * KB + kb0) * SC, nkb * SC, bar);
    } else if (nkb == KB && W.row_bytes == (unsigned long long)KB * CODE) {   // the tile's rows are one piece
        if (lane == 0) mt_copy(st, w + (size_t)r0 * W.row_bytes, nv * KB * CODE, bar);
        if (SC && lane == 1) mt_copy(st + 16 * P, scale + (size_t)r0 * KB * SC, nv * KB * SC, bar);
    } else if (lane < nv) {
        mt_copy(st + lane * P, w + (size_t)(r0 + lane) * W.row_bytes + (size_t)kb0 * CODE, nkb * CODE, bar);
        if (SC) mt_copy(st + 16 * P + lane * KBc * SC, scale + (size_t)(r0 + lane) * KB * SC + (size_t)kb0 * SC, nkb * SC, bar);
    }
}

// mm_load's bytes of lane (g, t) for the stage's 64-block kbl from a landed stage of pitch P;
// rows past the matrix are zeros (no copy wrote them).
template <int KIND>
__device__ __forceinline__ void mt_fetch(const uint8_t *st, int P, int KBc, int kbl, int g, int t, bool va, bool vb, mm_raw &r) {
    const uint4 z = make_uint4(0, 0, 0, 0);
    if (KIND == GPU_W_FP8) {
        r.r0 = va ? *(const uint4 *)(st + g * P + kbl * 64 + 16 * t) : z;
        r.r1 = vb ? *(const uint4 *)(st + (g + 8) * P + kbl * 64 + 16 * t) : z;
    } else if (KIND == GPU_W_NVFP4) {
        const uint2 a = va ? *(const uint2 *)(st + g * P + kbl * 32 + 8 * t) : make_uint2(0, 0);
        const uint2 b = vb ? *(const uint2 *)(st + (g + 8) * P + kbl * 32 + 8 * t) : make_uint2(0, 0);
        r.r0 = make_uint4(a.x, a.y, b.x, b.y);
        const uint8_t *sc = st + 16 * P + kbl * 4 + t;
        r.s = (va ? (uint32_t)sc[g * KBc * 4] : 0u) | ((vb ? (uint32_t)sc[(g + 8) * KBc * 4] : 0u) << 8);
    } else if (KIND == GPU_W_BF16) {
        r.r0 = va ? *(const uint4 *)(st + g * P + kbl * 128 + 32 * t) : z;
        r.r1 = va ? *(const uint4 *)(st + g * P + kbl * 128 + 32 * t + 16) : z;
        r.r2 = vb ? *(const uint4 *)(st + (g + 8) * P + kbl * 128 + 32 * t) : z;
        r.r3 = vb ? *(const uint4 *)(st + (g + 8) * P + kbl * 128 + 32 * t + 16) : z;
    } else {
        const uint2 c = *(const uint2 *)(st + kbl * 256 + (g * 4 + t) * 8);
        r.r0 = make_uint4(c.x, c.y, 0, 0);
        const uint8_t *sc = st + KBc * 256 + kbl * 32 + g;
        r.s = (uint32_t)sc[0] | ((uint32_t)sc[8] << 8) | ((uint32_t)sc[16] << 16) | ((uint32_t)sc[24] << 24);
    }
}

template <int KIND>
__device__ __forceinline__ void mt_stream(const gpu_mat &W, int tile0, int ntile, const __nv_bfloat16 *__restrict__ xs, __nv_bfloat16 *xsm,
                                          uint8_t *ring, uint64_t *full, uint64_t *empty, int T, float *red, uint32_t *lut,
                                          float *__restrict__ y, int ldy) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int K = W.cols, KB = K / 64, KBc = mt_kbc<KIND>(KB), ns = (KB + KBc - 1) / KBc, njob = ntile * ns;
    const int SB = KBc * mt_kind<KIND>::per_kb, P = KBc * mt_kind<KIND>::code, R = min(GPU_MT_STAGES, GPU_MT_RING / SB);
    const float post = mm_post(W);
    // this lane's B column in each part: token g, or the last token for lanes g ≥ T (as k_mm_v)
    const int gt = g < T ? g : T - 1;
    if (threadIdx.x == 0) {
        for (int i = 0; i < R; i++) mt_init(&full[i], 1), mt_init(&empty[i], GPU_MM_WARPS);
        mt_init_fence();
    }
    __syncthreads();
    auto issue = [&](int js) {   // stage js (tile js / ns, its (js % ns)-th piece of K) into slot js % R
        const int kb0 = (js % ns) * KBc;
        mt_issue<KIND>(W, tile0 + js / ns, kb0, min(KBc, KB - kb0), KBc, ring + (size_t)(js % R) * SB, &full[js % R]);
    };
    // the first stages' weights on their way, then the activations (GPU_DEP) into shared memory
    if (w == 0)
        for (int js = 0; js < R && js < njob; js++) issue(js);
    GPU_DEP();
    mm_copy16((uint4 *)xsm, (const uint4 *)xs, GPU_MM_PARTS * T * K / 8);   // 16-byte pieces (K % 64 == 0)
    mm_plane_lut(lut);
    __syncthreads();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int js = 0; js < njob; js++) {   // uniform over the block: every warp has the same stages
        const int slot = js % R, ph = (js / R) & 1, tile = tile0 + js / ns, kb0 = (js % ns) * KBc, kbe = min(kb0 + KBc, KB);
        const uint8_t *st = ring + (size_t)slot * SB;
        const bool va = 16 * tile + g < W.rows, vb = 16 * tile + g + 8 < W.rows;
        mt_wait(&full[slot], ph);   // the stage's copies have landed
        for (int kb = kb0 + w; kb < kbe; kb += GPU_MM_WARPS) {   // this warp's 64-blocks of the stage, ascending
            mm_raw raw;
            mt_fetch<KIND>(st, P, KBc, kb - kb0, g, t, va, vb, raw);
            constexpr bool PAIR = mm_b_pairs<KIND, 1>::on;
            uint2 bp[GPU_MM_PARTS];   // PAIR: step q + 1's, loaded with step q's
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int ko = kb * 64 + (KIND == GPU_W_PLANES ? 16 * q + 4 * t : 16 * t + 4 * q);
                uint2 b[GPU_MM_PARTS];
#pragma unroll
                for (int s = 0; s < GPU_MM_PARTS; s++) {
                    if (!PAIR || q % 2 == 0) mm_b_load<false, PAIR>(xsm + ((size_t)s * T + gt) * K, ko, b[s], bp[s]);
                    else b[s] = bp[s];
                }
                uint32_t a[4];
                mm_widen<KIND>(raw, q, lut, a);
                mm_acc(acc, a, b);
            }
        }
        __syncwarp();
        if (lane == 0) mt_arrive(&empty[slot]);   // this warp's reads of the stage are done
        if (w == 0 && js + R < njob) {   // refill the slot once every warp has read it
            mt_wait(&empty[slot], ph);
            issue(js + R);
        }
        if (js % ns == ns - 1) {   // the tile's last stage: the warps' sums meet
            const int ti = js / ns;
            float *rb = red + (ti & 1) * GPU_MM_WARPS * 128;
#pragma unroll
            for (int c = 0; c < 4; c++) rb[(w * 4 + c) * 32 + mm_red_slot<true>(lane, c)] = acc[c], acc[c] = 0.f;
            __syncthreads();
            const int e = threadIdx.x, r = e & 15, m = e >> 4, row = 16 * (tile0 + ti) + r;
            if (m < T && row < W.rows) y[(size_t)m * ldy + row] = mm_at<1, 1, true, true>(rb, 0, r, m) * post;
        }
    }
}

extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MT_BLOCKS) k_mm_t(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    __shared__ uint32_t lut[16];
    __shared__ float red[2 * GPU_MM_WARPS * 128];
    __shared__ uint64_t full[GPU_MT_STAGES], empty[GPU_MT_STAGES];
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    const int per = set.pad[0], ntile_all = (W.rows + 15) / 16;
    const int tile0 = ((int)blockIdx.x - set.first[m]) * per, ntile = min(per, ntile_all - tile0);
    uint8_t *ring = mm_smem;                                      // GPU_MT_RING
    __nv_bfloat16 *xsm = (__nv_bfloat16 *)(mm_smem + GPU_MT_RING);   // [GPU_MM_PARTS][T][K]
    float *__restrict__ y = (float *)set.y[m];
    switch (W.kind) {
    case GPU_W_FP8: mt_stream<GPU_W_FP8>(W, tile0, ntile, xs, xsm, ring, full, empty, T, red, lut, y, set.ldy[m]); break;
    case GPU_W_NVFP4: mt_stream<GPU_W_NVFP4>(W, tile0, ntile, xs, xsm, ring, full, empty, T, red, lut, y, set.ldy[m]); break;
    case GPU_W_BF16: mt_stream<GPU_W_BF16>(W, tile0, ntile, xs, xsm, ring, full, empty, T, red, lut, y, set.ldy[m]); break;
    default: mt_stream<GPU_W_PLANES>(W, tile0, ntile, xs, xsm, ring, full, empty, T, red, lut, y, set.ldy[m]); break;
    }
}

// ---- prompts: tiles of GPU_MMG_BM rows × BN tokens (mm.cuh: mmg_run) -----------------------------
//
// k_mm_g: BN = GPU_MMG_BN; k_mm_g32: BN = GPU_MMG_BN32, half the stages' bytes and half a block's
// products, GPU_MMG32_BLOCKS blocks per multiprocessor — for steps of a few dozen tokens, where
// k_mm_g's row blocks are fewer than the multiprocessors; k_mm_g128 (below): BN = GPU_MMG_BN128.
// The same steps per token: the same bits.
template <int KIND, int NW>
__device__ __forceinline__ void mm_dense_g(const gpu_mat &W, int base, int t0, const __nv_bfloat16 *__restrict__ xs, int T, const int *tok,
                                           const uint32_t *lut, float *__restrict__ y, int ldy) {
    float tot[2][NW][4];
    mmg_run<KIND, true>([&](int w, const gpu_mat *&M, int &row0) { M = &W, row0 = base + 16 * w; }, W.cols, xs, (size_t)T * W.cols, tok,
                        mm_smem, lut, tot);
    const float post = mm_post(W);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < NW; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ti, rr, r;
                mmg_place<NW>(i, n, e, ti, rr, r);
                const int row = base + 16 * ti + rr;
                if (row < W.rows && tok[r] >= 0) y[(size_t)(t0 + r) * ldy + row] = tot[i][n][e] * post;
            }
}

template <int BN>
__device__ __forceinline__ void mm_g(const gpu_lin_set &set, const __nv_bfloat16 *__restrict__ xs, int T) {
    __shared__ uint32_t lut[16];
    __shared__ int tok[BN];
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    const int base = ((int)blockIdx.x - set.first[m]) * GPU_MMG_BM, t0 = blockIdx.y * BN, ldy = set.ldy[m];
    for (int r = threadIdx.x; r < BN; r += blockDim.x) tok[r] = t0 + r < T ? t0 + r : -1;
    mm_plane_lut(lut);
    __syncthreads();
    float *__restrict__ y = (float *)set.y[m];
    switch (W.kind) {
    case GPU_W_FP8: mm_dense_g<GPU_W_FP8, BN / 16>(W, base, t0, xs, T, tok, lut, y, ldy); break;
    case GPU_W_NVFP4: mm_dense_g<GPU_W_NVFP4, BN / 16>(W, base, t0, xs, T, tok, lut, y, ldy); break;
    default: mm_dense_g<GPU_W_BF16, BN / 16>(W, base, t0, xs, T, tok, lut, y, ldy); break;   // (gpu_k_mm: FP8, NVFP4 and BF16 only)
    }
}

extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MMG_BLOCKS) k_mm_g(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    mm_g<GPU_MMG_BN>(set, xs, T);
}
extern "C" __global__ void __launch_bounds__(GPU_MM_NT, GPU_MMG32_BLOCKS) k_mm_g32(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    mm_g<GPU_MMG_BN32>(set, xs, T);
}
// k_mm_g128: tiles of GPU_MMG_BN128 tokens — each weight fragment widened once for twice k_mm_g's
// products — for long prompts of the one-part images (gpu_mm_pick: k->parts 1; three parts'
// stages would not fit, and its registers spill there).
extern "C" __global__ void __launch_bounds__(GPU_MM_NT, 1) k_mm_g128(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
    mm_g<GPU_MMG_BN128>(set, xs, T);
}
