// sass/flash_w.cu — causal GQA attention of long prompt steps on wgmma: k_fa_w, the walk of k_fa (flash.cu) over a bf16
// or fp8 cache with heads of GPU_FAW_HD (Qwen3.6's 256), for one-part images on the sm_90a cubin (H100 / H200). The same
// sums in the same order as k_fa's walk with FA_P 1, so every output is k_fa's bits: S = q·K over k16 steps of dims in
// order from a fresh accumulator, the scores scaled (times the key's scale with fp8) and masked, the online-softmax step
// of flash.cu (fa_tile_max, fa_tile_shift, fa_tile_p: the same functions), O = O·c + P·V over k16 steps of keys in
// order, chunks of GPU_ATT_CHUNK positions from a fresh state folded by att_fold, the running O in core, the last
// chunk's output gated (att_out). CPU twin: ref_attn_fa1 (as k_fa's; the kernel harness and test_gpu kernel_fa_w
// check it bit for bit against k_fa).
//
// Why the same bits: a wgmma m64nNk16 sums each row's 16 products of a step as the mma.m16n8k16 of the same k do (as
// mmw.cuh's products), and its accumulator is mma's C layout per warp (n-tile n: columns 8n + 2t + e % 2, rows
// 16·warp + g + 8(e / 2)), so the softmax runs on the same values in the same lanes' order as in k_fa.
//
// grid (token tiles of 128 / G tokens, the deepest tile first; KV heads), GPU_FAW_NT threads, GPU_FAW_SMEM bytes of
// dynamic shared memory. G = nh / kvh divides 64. Warpgroup 0 produces: each tile of GPU_FA_KT keys (and its values) of
// the sequence into a stage, [4 column blocks of 64 dims][GPU_FA_KT keys][128 bytes] bf16 with 16-byte piece c of key κ
// at c ^ (κ & 7) (128B swizzle) — bf16 by cp.async (zeros past the run's deepest position), fp8 widened exactly
// (mm_fp8x2, as k_fa's loads) with the keys' scales beside — then arrives on the stage's `full` barrier. Warpgroups 1
// and 2 consume 64 rows each (64 / G tokens × G heads: row r is token r / G, head r % G): the queries' bf16 rounding
// staged once in the same swizzled layout, S by wgmma m64n64k16 (both operands K-major), P V by m64n256k16 with P from
// registers (mma's A layout) and V through the transposed (MN-major) descriptor on the keys' own layout, then release
// the stage on its `empty` barrier. A token tile spanning sequences is walked one sequence's run of tokens at a time
// (the other rows masked, as k_fa does); gpu_fa_w_take keeps k_fa where runs are short.
//
// Included after flash.cu (sass/all.cu, sass/all_bf.cu); the other images trap (gpu_kernels.fa_w_min is 0 there).
#include "mmw.cuh"

#if MMW_ON   // (mmw.cuh: the sm_90a cubin's one-part image; FA_P is 1 there)
#define FAW_HD GPU_FAW_HD
static_assert(FAW_HD == 256 && GPU_FA_KT == 64 && GPU_FAW_NT == 384 && GPU_ATT_CHUNK % GPU_FA_KT == 0, "k_fa_w: four column blocks of 64 dims, "
              "tiles of 64 keys, a producer and two consumer warpgroups");

// A stage: a tile's keys and values, bf16 (the layout above), and their fp8 scales.
struct __align__(1024) faw_stage {
    uint8_t k[FAW_HD / 64 * GPU_FA_KT * 128];
    uint8_t v[FAW_HD / 64 * GPU_FA_KT * 128];
};
struct __align__(1024) faw_smem {
    uint8_t q[2][FAW_HD / 64 * 64 * 128];   // each consumer warpgroup's 64 query rows, bf16, the stages' layout
    faw_stage st[GPU_FAW_STAGES];
    float ks[GPU_FAW_STAGES][GPU_FA_KT], vs[GPU_FAW_STAGES][GPU_FA_KT];
    uint64_t full[GPU_FAW_STAGES], empty[GPU_FAW_STAGES];
};
static_assert(sizeof(faw_smem) + 1024 == GPU_FAW_SMEM, "k_fa_w: gpu_abi.h's plan (1,024 bytes to align the base)");

// Byte offset of 16-byte piece cc (of a row's 32) of row r in the stages' layout.
__device__ __forceinline__ int faw_at(int r, int cc) { return (cc >> 3) * (GPU_FA_KT * 128) + r * 128 + (((cc & 7) ^ (r & 7)) << 4); }

// The descriptor of the keys' layout read MN-major (P V's B: N = dims, 64 a 128-byte row; K = keys, 8-row groups
// SBO = 1,024 bytes apart; the next 64 dims LBO = one column block on), 128B swizzle.
__device__ __forceinline__ uint64_t faw_desc_mn(uint32_t sa) {
    return (uint64_t)((sa & 0x3FFFF) >> 4) | (uint64_t)((GPU_FA_KT * 128) >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

#define FAW_D8(n) "+f"(d[8 * n]), "+f"(d[8 * n + 1]), "+f"(d[8 * n + 2]), "+f"(d[8 * n + 3]), "+f"(d[8 * n + 4]), "+f"(d[8 * n + 5]), "+f"(d[8 * n + 6]), "+f"(d[8 * n + 7])
// d += one k16 step of S: 64 query rows (a) × 64 keys (b), both K-major from shared memory.
__device__ __forceinline__ void faw_mma_s(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, 0, 0;}"
                 : FAW_D8(0), FAW_D8(1), FAW_D8(2), FAW_D8(3)
                 : "l"(a), "l"(b));
}
// d += one k16 step of O: 64 rows of P (registers, mma's A layout) × 256 dims of V (MN-major: transposed).
__device__ __forceinline__ void faw_mma_o(float (&d)[128], const uint32_t a[4], uint64_t b) {
    asm volatile("{.reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
                 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
                 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,"
                 "%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 1;}"
                 : FAW_D8(0), FAW_D8(1), FAW_D8(2), FAW_D8(3), FAW_D8(4), FAW_D8(5), FAW_D8(6), FAW_D8(7), FAW_D8(8), FAW_D8(9), FAW_D8(10),
                   FAW_D8(11), FAW_D8(12), FAW_D8(13), FAW_D8(14), FAW_D8(15)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// Keeps accumulator registers at this point of the program (an asynchronous wgmma writes them: no read or write of
// them may move across its fence or wait).
template <int N>
__device__ __forceinline__ void faw_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void faw_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void faw_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}

// The run of one sequence's tokens from ts in the block's [ts, tend): its end, and its deepest position in pmax.
__device__ __forceinline__ int faw_run(const int *__restrict__ tok_slot, const int *__restrict__ tok_pos, int ts, int tend, int &pmax) {
    const int slot = tok_slot[ts];
    int te = ts + 1;
    pmax = tok_pos[ts];
    while (te < tend && tok_slot[te] == slot) pmax = max(pmax, tok_pos[te]), te++;
    return te;
}
// Tiles of chunk c of a run reaching pmax (k_fa's).
__device__ __forceinline__ int faw_tiles(int c, int pmax) { return (min(GPU_ATT_CHUNK, pmax - c * GPU_ATT_CHUNK + 1) + GPU_FA_KT - 1) / GPU_FA_KT; }

// The producer (warpgroup 0): every tile of every run's chunks into stage jt % GPU_FAW_STAGES, in the consumers' order.
// Thread tid copies 16-byte piece tid % 32 of keys tid / 32 + 4u (u < 16) of both tensors; threads < 64 the key
// scales, 64..127 the value scales (fp8).
__device__ __forceinline__ void faw_produce(faw_smem &sm, bool f8, const int *__restrict__ tok_pos, const int *__restrict__ tok_slot,
                                            const int *__restrict__ bt, int bt_stride, const void *__restrict__ kc, const void *__restrict__ vc,
                                            const float *__restrict__ ks, const float *__restrict__ vs, int kvh, int j, int t0, int tend) {
    const int tid = threadIdx.x, cc = tid & 31, kvd = kvh * FAW_HD;
    int jt = 0;
    for (int ts = t0; ts < tend;) {
        int pmax;
        const int te = faw_run(tok_slot, tok_pos, ts, tend, pmax), *btr = bt + (size_t)tok_slot[ts] * bt_stride;
        for (int c = 0; c <= pmax / GPU_ATT_CHUNK; c++)
            for (int it = 0, nt = faw_tiles(c, pmax); it < nt; it++, jt++) {
                const int s = jt % GPU_FAW_STAGES, base = c * GPU_ATT_CHUNK + it * GPU_FA_KT;
                if (jt >= GPU_FAW_STAGES) mmw_wait(&sm.empty[s], (jt / GPU_FAW_STAGES - 1) & 1);
                faw_stage &st = sm.st[s];
                int pg[FA_NP];   // the tile's pages first, all in flight (as fa_load: kv_index's page per element was a chain)
                fa_pages(btr, base, pmax, pg);
                if (f8) {
#pragma unroll 4
                    for (int u = 0; u < GPU_FA_KT / 4; u++) {
                        const int key = (tid >> 5) + 4 * u, pos = base + key, at = faw_at(key, cc);
                        const bool ok = pos <= pmax;
                        const size_t e = ok ? fa_kv_at(pg, key, kvd, j * FAW_HD) + cc * 8 : 0;
                        const uint2 rk = ok ? __ldg((const uint2 *)((const uint8_t *)kc + e)) : make_uint2(0u, 0u);
                        const uint2 rv = ok ? __ldg((const uint2 *)((const uint8_t *)vc + e)) : make_uint2(0u, 0u);
                        *(uint4 *)(st.k + at) = make_uint4(mm_fp8x2(rk.x), mm_fp8x2(rk.x >> 16), mm_fp8x2(rk.y), mm_fp8x2(rk.y >> 16));
                        *(uint4 *)(st.v + at) = make_uint4(mm_fp8x2(rv.x), mm_fp8x2(rv.x >> 16), mm_fp8x2(rv.y), mm_fp8x2(rv.y >> 16));
                    }
                    const int key = tid & (GPU_FA_KT - 1), pos = base + key;
                    const float sc = pos <= pmax ? (tid < GPU_FA_KT ? ks : vs)[fa_kv_at(pg, key, kvh, j)] : 0.f;   // kv_scale_index's
                    (tid < GPU_FA_KT ? sm.ks[s] : sm.vs[s])[key] = sc;
                } else {
#pragma unroll 4
                    for (int u = 0; u < GPU_FA_KT / 4; u++) {
                        const int key = (tid >> 5) + 4 * u, pos = base + key, at = faw_at(key, cc);
                        const bool ok = pos <= pmax;
                        const size_t e = ok ? fa_kv_at(pg, key, kvd, j * FAW_HD) + cc * 8 : 0;
                        mm_cp<16>(st.k + at, (const __nv_bfloat16 *)kc + e, ok);
                        mm_cp<16>(st.v + at, (const __nv_bfloat16 *)vc + e, ok);
                    }
                    mm_cp_commit();
                    mm_cp_wait<0>();
                }
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the generic proxy's writes, seen by wgmma
                mmw_arrive(&sm.full[s]);
            }
        ts = te;
    }
}

// A consumer warpgroup cw (0, 1): rows [64cw, +64) of the block's tokens from t0 (64 / G tokens), every run in turn.
template <bool f8>
__device__ __forceinline__ void faw_consume(faw_smem &sm, const float *__restrict__ proj, const int *__restrict__ tok_pos,
                                            const int *__restrict__ tok_slot, float *__restrict__ out, int nh, int kvh, float scale,
                                            __nv_bfloat16 *__restrict__ xs, int T, int t0, int tend, int cw) {
    const int tid = threadIdx.x & 127, G = nh / kvh, j = blockIdx.y, tokw = t0 + cw * (64 / G);
    const size_t ss = (size_t)T * nh * FAW_HD;   // between xs's parts
    {   // the queries' bf16 rounding (fa_afrag's, FA_P 1): thread tid → row tid / 2, dims [128(tid % 2), +128)
        const int r = tid >> 1, tk = tokw + r / G;
        const bool ok = tk < tend;
        const float *qr = proj + (size_t)(ok ? tk : t0) * 2 * nh * FAW_HD + (size_t)(j * G + r % G) * 2 * FAW_HD;
#pragma unroll 4
        for (int u = 0; u < 16; u++) {
            const int cc = 16 * (tid & 1) + u;
            const float4 x0 = ok ? __ldg((const float4 *)(qr + 8 * cc)) : make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 x1 = ok ? __ldg((const float4 *)(qr + 8 * cc + 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
            uint32_t h[1][4];
            fa_afrag(make_float2(x0.x, x0.y), make_float2(x0.z, x0.w), make_float2(x1.x, x1.y), make_float2(x1.z, x1.w), h);
            *(uint4 *)(sm.q[cw] + faw_at(r, cc)) = make_uint4(h[0][0], h[0][1], h[0][2], h[0][3]);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" ::"r"(1 + cw));   // the warpgroup's rows staged
    }
    const int wq = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint32_t qa = mmw_sa(sm.q[cw]);
    int jt = 0;
    for (int ts = t0; ts < tend;) {
        int pmax;
        const int te = faw_run(tok_slot, tok_pos, ts, tend, pmax);
        fa_rows rw;   // the lane's rows g, g + 8 of its warp's 16 (pos −1: not of this run)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 16 * wq + g + 8 * r, tk = tokw + row / G;
            rw.tok[r] = tk, rw.head[r] = j * G + row % G, rw.pos[r] = tk >= ts && tk < te ? tok_pos[tk] : -1;
        }
        float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.f, 0.f};
        const int c1 = pmax / GPU_ATT_CHUNK + 1;
        for (int c = 0; c < c1; c++) {
            float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[128];
#pragma unroll
            for (int i = 0; i < 128; i++) o[i] = 0.f;
            for (int it = 0, nt = faw_tiles(c, pmax); it < nt; it++, jt++) {
                const int s = jt % GPU_FAW_STAGES, base = c * GPU_ATT_CHUNK + it * GPU_FA_KT;
                mmw_wait(&sm.full[s], (jt / GPU_FAW_STAGES) & 1);
                const uint32_t ka = mmw_sa(sm.st[s].k), va = mmw_sa(sm.st[s].v);
                float sa[32];
#pragma unroll
                for (int i = 0; i < 32; i++) sa[i] = 0.f;
                faw_pin(sa);
                faw_fence();
#pragma unroll
                for (int kk = 0; kk < FAW_HD / 16; kk++) {
                    const int off = (kk >> 2) * (GPU_FA_KT * 128) + (kk & 3) * 32;
                    faw_mma_s(sa, mmw_desc(qa + off), mmw_desc(ka + off));
                }
                faw_commit_wait();
                faw_pin(sa);
                // scores: scaled, masked past each row's position (k_fa's expressions)
                float sc[GPU_FA_KT / 8][4];
#pragma unroll
                for (int n = 0; n < GPU_FA_KT / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = 8 * n + 2 * t + (e & 1);
                        const float v = f8 ? __fmul_rn(__fmul_rn(sa[4 * n + e], sm.ks[s][key]), scale) : __fmul_rn(sa[4 * n + e], scale);
                        sc[n][e] = base + key <= rw.pos[e >> 1] ? v : -INFINITY;
                    }
                float mx[2], cf[2], mu[2];
                fa_tile_max(sc, mx);
                fa_tile_shift(mx, m, mu, cf);
                fa_tile_p(f8, sc, sm.vs[s] + 2 * t, mu, cf, l);
#pragma unroll
                for (int i = 0; i < 128; i++) o[i] = __fmul_rn(o[i], cf[(i >> 1) & 1]);
                uint32_t pa[GPU_FA_KT / 16][4];   // P's bf16 rounding in mma's A layout (fa_afrag, FA_P 1)
#pragma unroll
                for (int kk = 0; kk < GPU_FA_KT / 16; kk++)
                    fa_afrag(make_float2(sc[2 * kk][0], sc[2 * kk][1]), make_float2(sc[2 * kk][2], sc[2 * kk][3]),
                             make_float2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), make_float2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]), &pa[kk]);
                faw_pin(o);
                faw_fence();
#pragma unroll
                for (int kk = 0; kk < GPU_FA_KT / 16; kk++) faw_mma_o(o, pa[kk], faw_desc_mn(va + kk * 16 * 128));   // keys [16kk, +16)
                faw_commit_wait();
                faw_pin(o);
                mmw_arrive(&sm.empty[s]);
            }
            // the chunk into the running state (k_fa's walk: O in core, f32), the last one's output gated
            fa_fold<FAW_HD, FAW_HD / 8>(proj, out, xs, ss, nh, rw, 0, true, c, c + 1 == c1, M, L, m, l, (const float(*)[4])o);
        }
        ts = te;
    }
}
#endif

extern "C" __global__ void __launch_bounds__(GPU_FAW_NT, 1)
    k_fa_w(const float *proj, const int *tok_pos, const int *tok_slot, const int *bt, int bt_stride, const void *kc, const void *vc, const float *ks,
           const float *vs, float *out, int nh, int kvh, float scale, __nv_bfloat16 *xs, int T, int fp8) {
#if MMW_ON
    extern __shared__ uint8_t faw_raw[];
    faw_smem &sm = *(faw_smem *)(faw_raw + ((1024u - (mmw_sa(faw_raw) & 1023u)) & 1023u));
    const int tb = 128 / (nh / kvh), t0 = (int)(gridDim.x - 1 - blockIdx.x) * tb, tend = min(T, t0 + tb), wg = threadIdx.x >> 7;
    if (threadIdx.x == 0)
        for (int s = 0; s < GPU_FAW_STAGES; s++) mmw_bar_init(&sm.full[s], 128), mmw_bar_init(&sm.empty[s], 256);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();   // the barriers initialised
    GPU_DEP();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        faw_produce(sm, fp8, tok_pos, tok_slot, bt, bt_stride, kc, vc, ks, vs, kvh, blockIdx.y, t0, tend);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    if (fp8) faw_consume<true>(sm, proj, tok_pos, tok_slot, out, nh, kvh, scale, xs, T, t0, tend, wg - 1);
    else faw_consume<false>(sm, proj, tok_pos, tok_slot, out, nh, kvh, scale, xs, T, t0, tend, wg - 1);
#else
    __trap();   // (gpu_kernels.fa_w_min is 0 but where this image is the sm_90a cubin's one-part image)
#endif
}
