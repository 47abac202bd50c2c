// tests/harness_kernels.c — every kernel of sass/ against its CPU twin on Qwen3.6-35B-A3B's
// shapes, in the formats its checkpoint stores, and timed. One table line per kernel and shape:
// the normalised error against the twin (check_nerr: max |gpu − twin| / std(twin)) and its bound,
// the median time, the bytes the kernel must move, and the bandwidth that gives, in GB/s and as a
// share of the device-to-device copy bandwidth measured in the same run.
//
// `./build.sh harness` builds and runs it on a machine with an NVIDIA GPU; the exit status is 1
// when an error is past its bound (or there is no GPU). HK_ONLY=linear,experts (a comma-separated
// list of embed, norm, linear, router, experts, combine, argmax, gdn, attention) runs those sections only;
// HK_PROMPT_ONLY=1 the experts' 2-bit planes' prompt steps alone (hk_prompt_only).
// HK_ACT=bf16: the tensor-core products read one bf16 part of their inputs (`--act-dtype bf16`:
// sass/all_bf.cu's images), against twins that round their inputs the same way (ref_linear with
// act_bf16); the f32 CUDA-core products (k_linear, k_moe_gate_up, k_moe_down), whose twins do not,
// are left out of such a run.
//
// Shapes: tests/fixtures/reference/qwen36-35b-a3b-nvfp4.config.json (H 2048; attention 16 query
// heads over 2 KV heads of 256, 64 rotary dims; GDN 16 key / 32 value heads of 128, conv 4; 256
// experts top-8 of width 512, a shared expert of 512; vocab 248,320). Formats: its
// hf_quant_config.json — FP8 attention and GDN projections; NVFP4 routed experts, shared expert
// and lm_head; BF16 embedding, router, GDN b / a, norms and conv — and the routed experts as
// 2-bit planes too (what `moet serve` reads). Random values of each format (kernel_data.h).
// Two shapes per kernel: decode, T = 1 (attention at depth 4,096), and prefill, T = 512 (a
// 512-token chunk from position 0; for k_gdn_rule, which serves one-token rows, 512 sequences
// decoding). lm_head only at T = 1 (a prefill chunk takes the logits of its last token only). The
// routed experts also at T = 16 with every token choosing the same experts (the _d shape with
// several items of one expert).
//
// Timing: HK_WARM launches, then HK_REPS launches each between two events on the stream, each
// after a read of 256 MiB (a k_mm product over a matrix of zeros) that leaves nothing of the data
// in L2 (a decode step reads its weights once, never from a warm cache) and nothing dirty there
// (a memset leaves ~60 MB of lines to write back while the next kernel reads: on the H200 the
// 64 MiB FP8 stream below took 41.9 µs after a memset, 39.8 µs after the read); the median.
// Bytes: what the kernel must move at least — every input read once, every output written once;
// of the routed experts, the weights (with scales) of the distinct experts chosen. The copy
// bandwidth counts a copy's bytes read plus written.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"
#include "kernel_data.h"

#define HK_WARM 3
#define HK_REPS 15
#define HK_FLUSH_ROWS 65536                // the flush matrix: FP8 [65,536, 4,096], 256 MiB read before each
#define HK_FLUSH_K 4096                    // timed launch (H200 L2: 60 MiB)
#define HK_SCRATCH ((size_t)3072 << 20)   // device bytes of one section's buffers (the experts at 8,192 tokens: ~2 GiB)
#define HK_CONFIG "tests/fixtures/reference/qwen36-35b-a3b-nvfp4.config.json"

// Bounds (normalised max error against the twin), each with its reason.
// Both sides compute each output from the same values in f32 (the twin often sums in f64), in
// another order. For the dot products of k_linear and k_moe_down (≤ 4,096 terms) that moves the
// largest outputs by a few ulps of their partial sums: the kernels' summation order emulated on
// the CPU against the twin's gives 2.0e-6 .. 2.4e-6 of the outputs' spread over 2e5 outputs (K
// 2,048 and 4,096); the harness compares up to 5e6, whose tail is a little longer. The norms,
// the conv, attn_prep's q and k, combine and SiLU round far less (a scale factor, a few terms).
// Measured on the H200 over every such line: at most 3.19e-6 (k_linear, attention o, T = 512) → 1e-5.
#define HK_TOL_SUM 1e-5
// k_moe_gate_up's output is the product SiLU(g) · u of two such sums: an error of g meets the
// largest u (and the reverse), several times the spread of h away: emulated 1.1e-5 over 2e5
// outputs of 2-bit plane experts. Measured on the H200: at most 9.49e-6 (2-bit planes, T = 512) → 3e-5.
#define HK_TOL_PRODUCT 3e-5
// k_gdn_rule_norm's outputs: the rule's (GPU_TOL_GDN, of the rule's outputs' spread) put through
// the gated norm, which scales each value head to unit rms, so a head whose rule output is small
// beside the spread carries its error grown by that ratio; the states as the rule's. Measured on
// an H100: 1.68e-5 (T = 512 rows; the rule alone 4.06e-6), 6.39e-6 (T = 1) → 1e-4.
#define HK_TOL_GDN_NORM 1e-4
// Attention: a softmax over up to 4,096 positions in f32 with an online rescaling (sixteen
// warps' partial states merged), against the twin's f64 sums: emulated 1.6e-6 .. 1.8e-6 at
// depths 41, 512 and 4,096. Measured on the H200: at most 5.15e-6 (bf16 cache, T = 512) → 2e-5.
#define HK_TOL_ATT 2e-5
// k_fa of the one-part image (HK_ACT=bf16, a bf16 or fp8 cache) against the twin making its roundings
// (ref_attn_fa1: q to bf16, each tile's p — times the value row's scale with fp8 — to bf16 at the
// running max): where the two sides' p straddle a bf16 rounding midpoint, p moves one bf16 step (2^-8
// relative) on one side only, and in a row of a few keys one such step moves the output by up to a
// few 1e-3 of the spread. So the twin gives the range its output may take when each p within a
// relative HK_FA1_EPS of a midpoint takes either neighbour, and the GPU's output must lie in it up to
// HK_TOL_ATT (its f32 sums of L and o, as the three-part kernel's). HK_FA1_EPS: the GPU's p differs
// from the twin's by its score's f32 sum of hd ≤ 256 exact bf16 products (a random walk of 2^-24
// steps: ≈ 1e-6 absolute at this harness's scores, |s| ≤ 5) and expf's ulp; 2^-14 (6.1e-5) is 60
// times that.
#define HK_FA1_EPS 0x1p-14
// k_mm_c (the chain order of prompts' full pieces) against the class order of the same step (no twin at the prompt
// rows' sizes: the class order's bits, checked against theirs, stand in): both the f32 sums of the same exact products,
// the chain's walk longer (one accumulator over K / 16 steps). Measured on the H100: 1.6e-5 at K = 2,048 (GDN
// in-projections), 2.3e-5 to 2.6e-5 at K = 4,096 (GDN out-projection), T 1,024 to 8,192 → 5e-5.
#define HK_TOL_CHAIN 5e-5
// k_mm_split: three bf16 parts carry 24 bits of the f32 value; their sum (in f32) is x up to
// 2^-24 of |x|, a few 1e-8 of the spread.
#define HK_TOL_SPLIT 1e-7
// k_embed copies decoded values: exact; k_moe_sort's map is right or wrong.
#define HK_TOL_EXACT 0.0

static struct {
    gpu_device dev;
    gpu_kernels k;
    CUstream s;
    CUevent ev[HK_REPS][2];
    arena flush, d;          // the L2 flush buffers; one section's device buffers (reset per section)
    gpu_lin_set flush_set;   // the flush matrix of zeros, its output
    CUdeviceptr flush_xs;    // its input's parts (zeros)
    double copy_gbs;         // device-to-device copy, bytes read + written per second / 1e9
    ck_model m;              // the config alone: the twins read their dimensions from it
    ref_engine r;            // the twins' engine: matrix products on every core, rotary frequencies, KV rounding
    uint64_t rng;
    int act;                 // HK_ACT=bf16: the products' one-part images, the twins rounding their inputs
} hk;

// ---- data and device buffers ------------------------------------------------------------------

static uint64_t hk_next(void) {   // xorshift64: the gigabytes of the large tables, quickly
    hk.rng ^= hk.rng << 13, hk.rng ^= hk.rng >> 7, hk.rng ^= hk.rng << 17;
    return hk.rng;
}

// n floats of kt_normal() · sd (the small arrays), or uniform in ±sd·√3 (the same spread) for
// the large ones.
static float *hk_normal(size_t n, float sd) {
    float *p = malloc(sizeof(float) * n);
    MOET_ASSERT(p, "%zu floats", n);
    if (n < ((size_t)1 << 24))
        for (size_t i = 0; i < n; i++) p[i] = sd * kt_normal();
    else
        for (size_t i = 0; i < n; i++) p[i] = sd * 1.7320508f * ((float)(hk_next() >> 40) / 8388608.0f - 1.0f);
    return p;
}

static void hk_reset(void) {
    CU_CHECK(cu.cuCtxSynchronize());
    hk.d.used = 0;   // a scratch arena: every section carves from the start again
}

static CUdeviceptr hk_take(size_t bytes) { return (uintptr_t)arena_take(&hk.d, bytes, 256, "harness buffer"); }

// A device copy of host bytes (h NULL: NaN bytes, so an unwritten output fails the check).
static CUdeviceptr hk_up(const void *h, size_t bytes) {
    CUdeviceptr p = hk_take(bytes);
    if (h) CU_CHECK(cu.cuMemcpyHtoD(p, h, bytes));
    else CU_CHECK(cu.cuMemsetD8(p, 0xff, bytes));
    CU_CHECK(cu.cuCtxSynchronize());   // the legacy stream's copy before the harness stream's launches
    return p;
}

static void *hk_down(CUdeviceptr p, size_t bytes) {
    void *h = malloc(bytes);
    CU_CHECK(cu.cuStreamSynchronize(hk.s));
    CU_CHECK(cu.cuMemcpyDtoH(h, p, bytes));
    return h;
}

static size_t hk_mat_bytes(const ck_mat *m) { return gpu_mat_bytes(m) + gpu_scale_bytes(m); }

static const char *hk_kind(int kind) {
    return kind == CK_W_BF16 ? "bf16" : kind == CK_W_FP8 ? "fp8" : kind == CK_W_NVFP4 ? "nvfp4" : kind == CK_W_PLANES ? "planes" : "f32";
}

// ---- timing and the table -----------------------------------------------------------------------

static double hk_median_us(void) {
    float ms[HK_REPS];
    CU_CHECK(cu.cuStreamSynchronize(hk.s));
    for (int i = 0; i < HK_REPS; i++) CU_CHECK(cu.cuEventElapsedTime(&ms[i], hk.ev[i][0], hk.ev[i][1]));
    for (int i = 1; i < HK_REPS; i++)
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    return 1000.0 * ms[HK_REPS / 2];
}

// us_out = the median time in µs of the launch statement(s) after the comma.
#define HK_TIME(us_out, ...)                                                                   \
    do {                                                                                       \
        for (int w_ = 0; w_ < HK_WARM; w_++) { __VA_ARGS__; }                                  \
        for (int r_ = 0; r_ < HK_REPS; r_++) {                                                 \
            gpu_k_mm(&hk.k, hk.s, &hk.flush_set, hk.flush_xs, 1);                              \
            CU_CHECK(cu.cuEventRecord(hk.ev[r_][0], hk.s));                                    \
            __VA_ARGS__;                                                                       \
            CU_CHECK(cu.cuEventRecord(hk.ev[r_][1], hk.s));                                    \
        }                                                                                      \
        (us_out) = hk_median_us();                                                             \
    } while (0)

static void hk_row(const char *kernel, const char *shape, const char *format, double err, double bound, double us, double bytes) {
    double gbs = bytes / (us * 1e-6) / 1e9;
    CHECK(err <= bound, "%s %s %s: normalised error %.3g past its bound %.0e", kernel, shape, format, err, bound);
    printf("%-18s %-46s %-12s %9.2e %7.0e %10.1f %9.2f MB %8.1f %6.1f%%%s\n", kernel, shape, format, err, bound, us, bytes / 1e6, gbs,
           100 * gbs / hk.copy_gbs, err <= bound ? "" : "  FAIL");
    fflush(stdout);
}

// A time alone, beside the row above: the kernels that row's kernel folds into one launch, run one
// after the other (their bits are the fold's: test_gpu checks them bit for bit; no error of its own).
static void hk_time_row(const char *kernels, const char *shape, double us) {
    printf("%-18s %-46s %-12s %9s %7s %10.1f   (the row above's work in separate launches)\n", kernels, shape, "", "", "", us);
    fflush(stdout);
}

// The device-to-device copy bandwidth: a 1 GiB cuMemcpyDtoDAsync, bytes read + written.
static void hk_copy(void) {
    size_t n = (size_t)1 << 30;
    CUdeviceptr a = hk_up(NULL, n), b = hk_up(NULL, n);
    double us;
    HK_TIME(us, CU_CHECK(cu.cuMemcpyDtoDAsync(b, a, n, hk.s)));
    hk.copy_gbs = 2.0 * n / (us * 1e-6) / 1e9;
    printf("device-to-device copy of 1 GiB: %.1f µs, %.1f GB/s (read + written)\n\n", us, hk.copy_gbs);
    printf("%-18s %-46s %-12s %9s %7s %10s %12s %8s %7s\n", "kernel", "shape", "format", "err", "bound", "µs", "bytes", "GB/s",
           "% copy");
    hk_reset();
}

// ---- the kernels --------------------------------------------------------------------------------

// k_embed against ck_row_f32 (the reference's embedding lookup): a BF16 table [V, H].
static void hk_embed(void) {
    const ck_config *c = &hk.m.cfg;
    int H = c->hidden, V = c->vocab;
    uint16_t *tab = malloc(sizeof(uint16_t) * (size_t)V * H);
    for (size_t i = 0; i < (size_t)V * H; i++) {   // sign, exponent 2^-7 .. 2^0, mantissa: ±[2^-7, 2)
        uint32_t b = (uint32_t)(hk_next() >> 48);
        tab[i] = (uint16_t)((b & 0x8000u) | ((120u + ((b >> 7) & 7u)) << 7) | (b & 0x7fu));
    }
    ck_mat E = {.kind = CK_W_BF16, .rows = V, .cols = H, .w = (const uint8_t *)tab, .row_bytes = (size_t)H * 2, .s = 1};
    gpu_mat Ed = gpu_put(&hk.d, &E, "embedding");
    for (int T = 1; T <= 512; T += 511) {
        int32_t *ids = malloc(sizeof(int32_t) * T);
        for (int t = 0; t < T; t++) ids[t] = (int32_t)(hk_next() % (uint64_t)V);
        CUdeviceptr idd = hk_up(ids, sizeof(int32_t) * T), x = hk_up(NULL, sizeof(float) * (size_t)T * H);
        gpu_k_embed(&hk.k, hk.s, Ed, idd, x, H, T);
        float *got = hk_down(x, sizeof(float) * (size_t)T * H), *ref = malloc(sizeof(float) * (size_t)T * H);
        for (int t = 0; t < T; t++) ck_row_f32(&E, ids[t], ref + (size_t)t * H);
        double err = check_nerr(got, ref, (size_t)T * H), us;
        HK_TIME(us, gpu_k_embed(&hk.k, hk.s, Ed, idd, x, H, T));
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d of [%d, %d]", T, V, H);
        hk_row("k_embed", shape, "bf16", err, HK_TOL_EXACT, us, (double)T * H * (2 + 4) + 4.0 * T);
        free(ids), free(got), free(ref);
    }
    free(tab);
    hk_reset();
}

// k_mm_split: the normalised error of hi + mid + lo (bf16 parts [GPU_MM_SPLITS][n] at xs) against
// the f32 x [n]; with one part (HK_ACT=bf16: the one-part image writes hi alone), of hi against
// x's bf16 rounding (0 where it is that rounding). NaN or a part out of place gives INFINITY.
static double hk_split_err(CUdeviceptr xs, const float *x, size_t n) {
    const int np = hk.k.parts;
    uint16_t *h = hk_down(xs, 2 * (size_t)np * n);
    float *v = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        float a = 0;
        for (int q = np - 1; q >= 0; q--) a += ck_bf16((const uint8_t *)&h[(size_t)q * n + i]);
        v[i] = a, r[i] = np == 1 ? ref_bf16_round(x[i]) : x[i];
    }
    double e = check_nerr(v, r, n);
    free(h), free(v), free(r);
    return e;
}

// check_nerr of a bf16 rounding a [n] against the f32 b [n] it rounds, past half a bf16 step of b: 0
// where each a[i] is b[i]'s rounding, and where the device's f32 value beneath a[i] lay across a
// rounding boundary from b[i], what it differs from b[i] by beyond that boundary (the f32 product's
// own error); NaN gives INFINITY.
static double hk_bf16_err(const float *a, const float *b, size_t n) {
    float *past = malloc(sizeof(float) * n);   // b moved by what a differs from it beyond half a step (check_nerr's max over its sd)
    for (size_t i = 0; i < n; i++) {
        int ex;
        frexp(b[i], &ex);   // |b| in [2^(ex−1), 2^ex): a bf16 step there is 2^(ex−8)
        const double over = fabs((double)a[i] - b[i]) - ldexp(0.5, ex - 8);
        past[i] = isnan(a[i]) ? NAN : (float)(b[i] + (over > 0 ? over : 0));
    }
    const double e = check_nerr(past, b, n);
    free(past);
    return e;
}

// k_add_rmsnorm against x + y and ref_rmsnorm1p; a BF16 weight [H].
static void hk_norm(void) {
    const ck_config *c = &hk.m.cfg;
    int H = c->hidden;
    uint16_t *wb = malloc(sizeof(uint16_t) * H);
    ck_mat w = kt_bf16_vec(wb, H, 0.0f, 0.3f);
    gpu_mat wd = gpu_put(&hk.d, &w, "norm");
    for (int T = 1; T <= 512; T += 511) {
        size_t n = (size_t)T * H;
        float *x = hk_normal(n, 3.0f), *y = hk_normal(n, 1.0f), *ref = malloc(sizeof(float) * n);
        CUdeviceptr xd = hk_up(x, sizeof(float) * n), yd = hk_up(y, sizeof(float) * n), nd = hk_up(NULL, sizeof(float) * n);
        CUdeviceptr pd = hk_up(NULL, 2 * GPU_MM_SPLITS * n);   // xn's bf16 parts, as the engine asks for them
        gpu_k_add_rmsnorm(&hk.k, hk.s, xd, yd, wd, nd, pd, 0, H, (float)c->eps, T);
        float *gx = hk_down(xd, sizeof(float) * n), *gn = hk_down(nd, sizeof(float) * n);
        for (size_t i = 0; i < n; i++) x[i] += y[i];
        for (int t = 0; t < T; t++) ref_rmsnorm1p(x + (size_t)t * H, &w, H, c->eps, ref + (size_t)t * H);
        double err = fmax(check_nerr(gn, ref, n), check_nerr(gx, x, n)), perr = hk_split_err(pd, gn, n), us;
        CU_CHECK(cu.cuMemcpyHtoD(xd, x, sizeof(float) * n));   // the timed launches add y again: harmless, same bytes
        HK_TIME(us, gpu_k_add_rmsnorm(&hk.k, hk.s, xd, yd, wd, nd, pd, 0, H, (float)c->eps, T));
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d, H %d", T, H);
        hk_row("k_add_rmsnorm", shape, "f32, bf16 w", err, HK_TOL_SUM, us, 16.0 * n + 2.0 * H + 2.0 * hk.k.parts * n);
        hk_row("k_add_rmsnorm parts", shape, hk.k.parts == 1 ? "bf16 hi" : "bf16 x3", perr, HK_TOL_SPLIT, us, 0);
        free(x), free(y), free(ref), free(gx), free(gn);
    }
    free(wb);
    hk_reset();
}

// k_moe_sort: 0 when map groups the P pairs of sel by expert (items in ascending expert, each of
// 1..gpu_moe_cap(P) pairs of its expert, every pair once), else INFINITY.
static double hk_map_err(CUdeviceptr map, const int32_t *sel, int P, int E) {
    size_t ni = gpu_moe_map_ints(P, E);
    int bound = gpu_moe_items_bound(P, E), *m = hk_down(map, 4 * ni), *seen = calloc((size_t)P, sizeof(int)), ok = m[0] >= 1 && m[0] <= bound;
    const int *perm = m + 1 + 3 * bound;
    int pos = 0, last = -1;
    for (int i = 0; ok && i < m[0]; i++) {
        const int *it = m + 1 + 3 * i;
        ok = it[0] >= last && it[0] < E && it[1] == pos && it[2] >= 1 && it[2] <= gpu_moe_cap(&hk.k, P, E);
        for (int j = 0; ok && j < it[2]; j++) {
            int p = perm[it[1] + j];
            ok = p >= 0 && p < P && !seen[p] && sel[p] == it[0];
            if (ok) seen[p] = 1;
        }
        last = it[0], pos += it[2];
    }
    ok = ok && pos == P;
    free(m), free(seen);
    return ok ? 0.0 : INFINITY;
}

// The largest normalised error of a set's outputs (y of set->n matrices W, read back) against
// ref_linear of x [T, K].
static double hk_set_err(const gpu_lin_set *set, const ck_mat *W, const float *x, int K, int T) {
    double err = 0;
    for (int i = 0; i < set->n; i++) {
        size_t no = (size_t)T * W[i].rows;
        float *got = hk_down(set->y[i], sizeof(float) * no), *ref = malloc(sizeof(float) * no);
        ref_linear(&hk.r, &W[i], x, K, T, ref, W[i].rows);
        err = fmax(err, check_nerr(got, ref, no));
        free(got), free(ref);
    }
    return err;
}

// Every shape a step of T tokens can take through k_mm (_b, _p, k_mm_g and k_mm_g32 whatever T; k_mm_v2 up to
// GPU_MM_TOK_V2 tokens, k_mm_v4 up to GPU_MM_TOK_V4) against the one it takes (ms's outputs hold its result): the same bits, and their times.
static void hk_mm_shapes(gpu_lin_set *ms, CUdeviceptr xs, int T, const char *shape, const char *fmt) {
    size_t ob = 0;
    for (int i = 0; i < ms->n; i++) ob += sizeof(float) * (size_t)T * ms->W[i].rows;
    float *h0 = malloc(ob), *h1 = malloc(ob);
    for (size_t i = 0, o = 0; i < (size_t)ms->n; o += (size_t)T * ms->W[i].rows, i++)
        CU_CHECK(cu.cuMemcpyDtoH(h0 + o, ms->y[i], sizeof(float) * (size_t)T * ms->W[i].rows));
    static const char *const name[4] = {"_b", "_p", "_g", "_g32"};
    double us[4];
    int same = 1;
    const int g0 = hk.k.mm_g_min, g32 = hk.k.mm_g32_max, v2 = hk.k.mm_v2, v4 = hk.k.mm_v4;
    hk.k.mm_v2 = hk.k.mm_v4 = 0;   // (_g, _g32 through gpu_k_mm: not k_mm_v2's or k_mm_v4's steps)
    for (int sh = 0; sh < 4; sh++) {
        for (int i = 0; i < ms->n; i++) CU_CHECK(cu.cuMemsetD8Async(ms->y[i], 0xff, sizeof(float) * (size_t)T * ms->W[i].rows, hk.s));
        if (sh >= 2) hk.k.mm_g_min = 1, hk.k.mm_g32_max = sh == 3 ? T : 0;   // (_g, _g32: k_mm_g or k_mm_g32 from any tokens)
        if (sh < 2) gpu_k_mm_fixed(&hk.k, hk.s, ms, xs, T, sh + 1);
        else gpu_k_mm(&hk.k, hk.s, ms, xs, T);
        CU_CHECK(cu.cuStreamSynchronize(hk.s));
        for (size_t i = 0, o = 0; i < (size_t)ms->n; o += (size_t)T * ms->W[i].rows, i++)
            CU_CHECK(cu.cuMemcpyDtoH(h1 + o, ms->y[i], sizeof(float) * (size_t)T * ms->W[i].rows));
        const int eq = !memcmp(h0, h1, ob);
        CHECK(eq, "k_mm%s %s: not the bits of the shape the step takes", name[sh], shape);
        same &= eq;
        if (sh < 2) HK_TIME(us[sh], gpu_k_mm_fixed(&hk.k, hk.s, ms, xs, T, sh + 1));
        else HK_TIME(us[sh], gpu_k_mm(&hk.k, hk.s, ms, xs, T));
        hk.k.mm_g_min = g0, hk.k.mm_g32_max = g32;
    }
    hk.k.mm_v2 = v2, hk.k.mm_v4 = v4;
    double uv = 0;   // k_mm_v2 or k_mm_v4 where the step's tokens allow it
    const int vb = T > GPU_MM_TOK_V && T <= GPU_MM_TOK_V2 ? 2 : T > GPU_MM_TOK_V2 && T <= GPU_MM_TOK_V4 ? 4 : 0;
    if (vb && gpu_smem_room(&hk.k, vb == 4 ? K_MM_V4 : K_MM_V2, gpu_mm_stream_smem(&hk.k, ms, T, vb))) {
        for (int i = 0; i < ms->n; i++) CU_CHECK(cu.cuMemsetD8Async(ms->y[i], 0xff, sizeof(float) * (size_t)T * ms->W[i].rows, hk.s));
        gpu_k_mm_stream(&hk.k, hk.s, ms, xs, T, vb);
        CU_CHECK(cu.cuStreamSynchronize(hk.s));
        for (size_t i = 0, o = 0; i < (size_t)ms->n; o += (size_t)T * ms->W[i].rows, i++)
            CU_CHECK(cu.cuMemcpyDtoH(h1 + o, ms->y[i], sizeof(float) * (size_t)T * ms->W[i].rows));
        const int eq = !memcmp(h0, h1, ob);
        CHECK(eq, "k_mm_v%d %s: not the bits of the shape the step takes", vb, shape);
        same &= eq;
        HK_TIME(uv, gpu_k_mm_stream(&hk.k, hk.s, ms, xs, T, vb));
    }
    printf("%-18s %-46s %-12s _b %.1f µs, _p %.1f µs, _g %.1f µs, _g32 %.1f µs, _v%d %.1f µs (0: not run); bits %s\n", "k_mm shapes", shape, fmt,
           us[0], us[1], us[2], us[3], vb ? vb : 2, uv, same ? "equal" : "DIFFERENT");
    free(h0), free(h1);
}

// k_linear against ref_linear: the model's matrix products, each set as the engine launches it
// (the matrices that read one input in one launch).
static void hk_linear(void) {
    const ck_config *c = &hk.m.cfg;
    int H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    const struct {
        const char *name;
        int n, T_max, kind[GPU_LIN_SET], rows[GPU_LIN_SET], cols;
    } sets[] = {
        {"attention q|k|v", 3, 512, {CK_W_FP8, CK_W_FP8, CK_W_FP8}, {2 * qd, kvd, kvd}, H},
        {"attention o", 1, 512, {CK_W_FP8}, {H}, qd},
        {"GDN qkv|z|b|a", 4, 512, {CK_W_FP8, CK_W_FP8, CK_W_BF16, CK_W_BF16}, {c->conv_dim, c->value_dim, c->lv_heads, c->lv_heads}, H},
        {"GDN out", 1, 512, {CK_W_FP8}, {H}, c->value_dim},
        {"router|shared g|u|gate", 4, 512, {CK_W_BF16, CK_W_NVFP4, CK_W_NVFP4, CK_W_BF16}, {c->n_experts, c->shared_inter, c->shared_inter, 1}, H},
        {"shared down", 1, 512, {CK_W_NVFP4}, {H}, c->shared_inter},
        {"lm_head", 1, 16, {CK_W_NVFP4}, {c->vocab}, H},
        // long streams of one format (64 MiB of FP8, 64 MiB of BF16): a kernel's rate once its
        // start and end no longer count
        {"stream", 1, 4, {CK_W_FP8}, {32768}, H},
        {"stream", 1, 4, {CK_W_BF16}, {16384}, H},
    };
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        int n = sets[si].n, K = sets[si].cols;
        ck_mat W[GPU_LIN_SET];
        uint8_t *wb[GPU_LIN_SET], *sb[GPU_LIN_SET];
        gpu_lin_set set;
        memset(&set, 0, sizeof set);
        set.n = n;
        double wbytes = 0;
        char rows[64] = "", fmt[32] = "";
        for (int i = 0; i < n; i++) {
            W[i] = kt_random_mat(sets[si].kind[i], sets[si].rows[i], K, &wb[i], &sb[i]);
            set.W[i] = gpu_put(&hk.d, &W[i], "matrix");
            set.first[i + 1] = set.first[i] + (W[i].rows + GPU_LIN_ROWS - 1) / GPU_LIN_ROWS;
            wbytes += (double)hk_mat_bytes(&W[i]);
            snprintf(rows + strlen(rows), sizeof rows - strlen(rows), "%s%d", i ? "+" : "", W[i].rows);
            if (!strstr(fmt, hk_kind(W[i].kind))) snprintf(fmt + strlen(fmt), sizeof fmt - strlen(fmt), "%s%s", *fmt ? "+" : "", hk_kind(W[i].kind));
        }
        // 1 and 512 tokens, 4 (k_mm's largest step with the tokens in shared memory, k_mm_v), and
        // 16, 32, 64 and 128 (batches of decoding sequences: the shapes compared)
        static const int Ts[] = {1, 4, 16, 32, 64, 128, 512};
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0] && Ts[ti] <= sets[si].T_max; ti++) {
            int T = Ts[ti];
            float *x = hk_normal((size_t)T * K, 1.0f);
            CUdeviceptr xd = hk_up(x, sizeof(float) * (size_t)T * K);
            double obytes = 0, err = 0, us;
            for (int i = 0; i < n; i++) {
                set.y[i] = hk_up(NULL, sizeof(float) * (size_t)T * W[i].rows);
                set.ldy[i] = W[i].rows;
                obytes += 4.0 * T * W[i].rows;
            }
            char shape[96];
            snprintf(shape, sizeof shape, "%s T=%d [%s, %d]", sets[si].name, T, rows, K);
            if (!hk.act) {
                gpu_k_linear(&hk.k, hk.s, &set, xd, K, T);
                err = hk_set_err(&set, W, x, K, T);
                HK_TIME(us, gpu_k_linear(&hk.k, hk.s, &set, xd, K, T));
                hk_row("k_linear", shape, fmt, err, HK_TOL_SUM, us, wbytes + 4.0 * T * K + obytes);
            }
            // the tensor cores: k_mm_split, then k_mm over the parts (outputs poisoned again)
            CUdeviceptr xs = hk_up(NULL, 2 * GPU_MM_SPLITS * (size_t)T * K);
            for (int i = 0; i < n; i++) CU_CHECK(cu.cuMemsetD8Async(set.y[i], 0xff, sizeof(float) * (size_t)T * W[i].rows, hk.s));   // ordered before the launch on hk.s
            gpu_k_mm_split(&hk.k, hk.s, xd, K, K, T, xs);
            gpu_lin_set ms = set;
            gpu_k_mm(&hk.k, hk.s, &ms, xs, T);
            err = hk_set_err(&set, W, x, K, T);
            HK_TIME(us, gpu_k_mm(&hk.k, hk.s, &ms, xs, T));
            hk_row("k_mm", shape, fmt, err, HK_TOL_SUM, us, wbytes + 2.0 * hk.k.parts * T * K + obytes);
            if (T <= GPU_MM_TOK_V && gpu_mt_ok(&ms)) {   // both streaming kernels on the same parts: k_mm's bits, their times
                size_t ob = 0;
                for (int i = 0; i < n; i++) ob += sizeof(float) * (size_t)T * W[i].rows;
                float *h0 = malloc(ob), *h1 = malloc(ob);
                for (size_t i = 0, o = 0; i < (size_t)n; o += (size_t)T * W[i].rows, i++)
                    CU_CHECK(cu.cuMemcpyDtoH(h0 + o, set.y[i], sizeof(float) * (size_t)T * W[i].rows));
                for (int bulk = 1; bulk >= 0; bulk--) {
                    for (int i = 0; i < n; i++) CU_CHECK(cu.cuMemsetD8Async(set.y[i], 0xff, sizeof(float) * (size_t)T * W[i].rows, hk.s));
                    gpu_k_mm_stream(&hk.k, hk.s, &ms, xs, T, bulk);
                    CU_CHECK(cu.cuStreamSynchronize(hk.s));
                    for (size_t i = 0, o = 0; i < (size_t)n; o += (size_t)T * W[i].rows, i++)
                        CU_CHECK(cu.cuMemcpyDtoH(h1 + o, set.y[i], sizeof(float) * (size_t)T * W[i].rows));
                    int same = !memcmp(h0, h1, ob);
                    HK_TIME(us, gpu_k_mm_stream(&hk.k, hk.s, &ms, xs, T, bulk));
                    hk_row(bulk ? "k_mm_t" : "k_mm_v", shape, fmt, same ? 0.0 : 1.0, 0.5, us, wbytes + 2.0 * hk.k.parts * T * K + obytes);   // err 1: not k_mm's bits
                }
                free(h0), free(h1);
            }
            HK_TIME(us, gpu_k_mm_split(&hk.k, hk.s, xd, K, K, T, xs));
            hk_row("k_mm_split", shape, "f32", hk_split_err(xs, x, (size_t)T * K), HK_TOL_SPLIT, us, 4.0 * T * K + 2.0 * hk.k.parts * T * K);
            if (T > 8 && T < 512) hk_mm_shapes(&ms, xs, T, shape, fmt);
            free(x);
        }
        for (int i = 0; i < n; i++) free(wb[i]), free(sb[i]);
        hk_reset();
    }
}

// A prompt of T / 64 full pieces (T a multiple of 64): the set's FP8 matrices by k_mm_c (chain order) against k_mm_p's
// outputs (the class order), its time and rate (HK_TOL_CHAIN). Where the image has it (gpu_kernels.mm_c).
static void hk_gemm_chain(const gpu_lin_set *set, CUdeviceptr xs, int T, const char *name) {
    if (!hk.k.mm_c || hk.k.parts != 1 || T % GPU_MMC_PIECE) return;
    gpu_lin_set cs;
    memset(&cs, 0, sizeof cs);
    double rows = 0;
    int K = 0;
    for (int i = 0; i < set->n; i++)
        if (set->W[i].kind == GPU_W_FP8)
            cs.W[cs.n] = set->W[i], cs.y[cs.n] = set->y[i], cs.ldy[cs.n] = set->ldy[i], cs.n++, rows += set->W[i].rows, K = set->W[i].cols;
    if (!cs.n) return;
    const int np = T / GPU_MMC_PIECE;
    int32_t *pc = malloc(sizeof(int32_t) * np);
    for (int p = 0; p < np; p++) pc[p] = GPU_MMC_PIECE * p;
    const CUdeviceptr pd = hk_up(pc, sizeof(int32_t) * np);
    gpu_lin_set ps = cs;
    gpu_k_mm_fixed(&hk.k, hk.s, &ps, xs, T, 2);
    float *yr[GPU_LIN_SET];
    for (int i = 0; i < cs.n; i++) {
        yr[i] = hk_down(cs.y[i], sizeof(float) * (size_t)T * cs.W[i].rows);
        CU_CHECK(cu.cuMemsetD8Async(cs.y[i], 0xff, sizeof(float) * (size_t)T * cs.W[i].rows, hk.s));
    }
    gpu_k_mm_c(&hk.k, hk.s, &cs, xs, pd, np);
    double err = 0, us;
    for (int i = 0; i < cs.n; i++) {
        float *yc = hk_down(cs.y[i], sizeof(float) * (size_t)T * cs.W[i].rows);
        const double e = check_nerr(yc, yr[i], (size_t)T * cs.W[i].rows);
        err = e > err || isnan(e) ? e : err;
        free(yc), free(yr[i]);
    }
    HK_TIME(us, gpu_k_mm_c(&hk.k, hk.s, &cs, xs, pd, np));
    CHECK(err < HK_TOL_CHAIN, "k_mm_c %s T=%d: %.3g from the class order's outputs", name, T, err);
    printf("%-18s %-46s T=%5d: %d FP8 matrices, %.0f rows: %9.1f µs (%6.1f TFLOP/s), %.2g from the class order (bound %.0e)\n", "k_mm_c", name, T,
           cs.n, rows, us, 2.0 * T * rows * K / (us * 1e-6) / 1e12, err, HK_TOL_CHAIN);
    free(pc);
}

// k_mm_g (a prompt's dense products, tiles of GPU_MMG_BM rows × GPU_MMG_BN tokens through shared
// memory) against k_mm_p on the same parts: the same bits, asked of every shape (sass/mm.cuh), at
// a step of 8,192 tokens and at one of 300 (a token tile cut short); the time of both and the
// tensor-core rate (2 · T · rows · K per product, the three parts counted once).
static void hk_gemm(void) {
    const ck_config *c = &hk.m.cfg;
    int H = c->hidden;
    const struct {
        const char *name;
        int n, kind[GPU_LIN_SET], rows[GPU_LIN_SET], cols;
    } sets[] = {
        {"GDN qkv|z|b|a", 4, {CK_W_FP8, CK_W_FP8, CK_W_BF16, CK_W_BF16}, {c->conv_dim, c->value_dim, c->lv_heads, c->lv_heads}, H},
        {"GDN out", 1, {CK_W_FP8}, {H}, c->value_dim},
        {"router|shared g|u|gate", 4, {CK_W_BF16, CK_W_NVFP4, CK_W_NVFP4, CK_W_BF16}, {c->n_experts, c->shared_inter, c->shared_inter, 1}, H},
        {"shared down", 1, {CK_W_NVFP4}, {H}, c->shared_inter},
    };
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        int n = sets[si].n, K = sets[si].cols;
        ck_mat W[GPU_LIN_SET];
        uint8_t *wb[GPU_LIN_SET], *sb[GPU_LIN_SET];
        gpu_lin_set set;
        memset(&set, 0, sizeof set);
        set.n = n;
        double rows_all = 0;
        for (int i = 0; i < n; i++) {
            W[i] = kt_random_mat(sets[si].kind[i], sets[si].rows[i], K, &wb[i], &sb[i]);
            set.W[i] = gpu_put(&hk.d, &W[i], "matrix");
            rows_all += W[i].rows;
        }
        static const int Ts[] = {300, 1024, 2048, 4096, 8192};   // (the prompt shapes' thresholds: mm_g128_min, mm_w_min)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int T = Ts[ti];
            float *x = hk_normal((size_t)T * K, 1.0f);
            CUdeviceptr xd = hk_up(x, sizeof(float) * (size_t)T * K), xs = hk_up(NULL, 2 * GPU_MM_SPLITS * (size_t)T * K);
            float *yp[GPU_LIN_SET];
            for (int i = 0; i < n; i++) set.y[i] = hk_up(NULL, sizeof(float) * (size_t)T * W[i].rows), set.ldy[i] = W[i].rows;
            gpu_k_mm_split(&hk.k, hk.s, xd, K, K, T, xs);
            gpu_lin_set ms = set;
            double up, ug;
            gpu_k_mm_fixed(&hk.k, hk.s, &ms, xs, T, 2);
            for (int i = 0; i < n; i++) yp[i] = hk_down(set.y[i], sizeof(float) * (size_t)T * W[i].rows);
            HK_TIME(up, gpu_k_mm_fixed(&hk.k, hk.s, &ms, xs, T, 2));
            for (int i = 0; i < n; i++) CU_CHECK(cu.cuMemsetD8Async(set.y[i], 0xff, sizeof(float) * (size_t)T * W[i].rows, hk.s));   // ordered before the launch on hk.s
            ms = set;
            gpu_k_mm(&hk.k, hk.s, &ms, xs, T);
            int same = 1;
            for (int i = 0; i < n; i++) {
                float *yg = hk_down(set.y[i], sizeof(float) * (size_t)T * W[i].rows);
                size_t nd = 0, first = 0;
                for (size_t j = 0; j < (size_t)T * W[i].rows; j++)
                    if (memcmp(&yg[j], &yp[i][j], 4)) first = nd++ ? first : j;
                if (nd)
                    printf("  matrix %d: %zu of %zu differ, the first at token %zu row %zu: k_mm_p %.9g, k_mm_g %.9g\n", i, nd,
                           (size_t)T * W[i].rows, first / W[i].rows, first % W[i].rows, yp[i][first], yg[first]);
                same &= nd == 0;
                free(yg), free(yp[i]);
            }
            HK_TIME(ug, gpu_k_mm(&hk.k, hk.s, &ms, xs, T));
            CHECK(same, "k_mm_g %s T=%d: not the bits of k_mm_p", sets[si].name, T);
            double fl = 2.0 * T * rows_all * K, u64 = ug, u128 = ug;
            const int g128 = hk.k.parts == 1 && hk.k.mm_g128_min && T >= hk.k.mm_g128_min;   // the step took k_mm_g128: k_mm_g's time beside it
            const int w = gpu_mm_w_take(&hk.k, &ms, T);   // ... or k_mm_w (its FP8 / NVFP4 matrices): k_mm_g128's time beside it too
            if (w) {
                const int keep = hk.k.mm_w_min;
                hk.k.mm_w_min = 0;
                HK_TIME(u128, gpu_k_mm(&hk.k, hk.s, &ms, xs, T));
                hk.k.mm_w_min = keep;
            }
            if (g128) {
                const int keep = hk.k.mm_g128_min, keep_w = hk.k.mm_w_min;
                hk.k.mm_g128_min = 0, hk.k.mm_w_min = 0;
                HK_TIME(u64, gpu_k_mm(&hk.k, hk.s, &ms, xs, T));
                hk.k.mm_g128_min = keep, hk.k.mm_w_min = keep_w;
            }
            double ubelow = 0;   // k_mm_w below mm_w_min where the image has it: its time and bits there too
            if (g128 && !w && hk.k.mm_w_min) {
                const int keep = hk.k.mm_w_min;
                hk.k.mm_w_min = 1;
                if (gpu_mm_w_take(&hk.k, &ms, T)) {
                    for (int i = 0; i < n; i++) CU_CHECK(cu.cuMemsetD8Async(set.y[i], 0xff, sizeof(float) * (size_t)T * W[i].rows, hk.s));
                    gpu_k_mm(&hk.k, hk.s, &ms, xs, T);
                    float *yw[GPU_LIN_SET];
                    for (int i = 0; i < n; i++) yw[i] = hk_down(set.y[i], sizeof(float) * (size_t)T * W[i].rows);
                    gpu_k_mm_fixed(&hk.k, hk.s, &ms, xs, T, 2);   // (k_mm_p again into y: the reference bits)
                    for (int i = 0; i < n; i++) {
                        float *yr = hk_down(set.y[i], sizeof(float) * (size_t)T * W[i].rows);
                        same &= !memcmp(yw[i], yr, sizeof(float) * (size_t)T * W[i].rows);
                        free(yw[i]), free(yr);
                    }
                    CHECK(same, "k_mm_w %s T=%d (below mm_w_min): not the bits of k_mm_p", sets[si].name, T);
                    HK_TIME(ubelow, gpu_k_mm(&hk.k, hk.s, &ms, xs, T));
                }
                hk.k.mm_w_min = keep;
            }
            printf("%-18s %-46s T=%5d: k_mm_p %9.1f µs (%6.1f TFLOP/s), %s %9.1f µs (%6.1f TFLOP/s), bits %s", "k_mm_g", sets[si].name, T, up,
                   fl / (up * 1e-6) / 1e12, w ? "k_mm_w" : g128 ? "k_mm_g128" : "k_mm_g", ug, fl / (ug * 1e-6) / 1e12, same ? "equal" : "DIFFERENT");
            if (w && g128) printf("; k_mm_g128 %.1f µs (%.1f TFLOP/s)", u128, fl / (u128 * 1e-6) / 1e12);
            if (g128) printf("; k_mm_g %.1f µs (%.1f TFLOP/s)", u64, fl / (u64 * 1e-6) / 1e12);
            if (ubelow > 0) printf("; k_mm_w (below mm_w_min) %.1f µs (%.1f TFLOP/s)", ubelow, fl / (ubelow * 1e-6) / 1e12);
            printf("\n");
            hk_gemm_chain(&set, xs, T, sets[si].name);
            fflush(stdout);
            free(x);
        }
        for (int i = 0; i < n; i++) free(wb[i]), free(sb[i]);
        hk_reset();
    }
}

// T tokens' routing as the reference routes random logits: sel [T, K] (distinct experts), w [T, K].
// skew: every token picks among the first K experts (each then holds T pairs: a _d step of more
// than GPU_MOE_CAP_D pairs per expert splits them into several items).
static void hk_route(int T, int32_t *sel, float *w, int skew) {
    const ck_config *c = &hk.m.cfg;
    int E = c->n_experts, K = c->topk, s[GPU_ROUTER_MAX_K];
    float *p = malloc(sizeof(float) * E);
    for (int t = 0; t < T; t++) {
        for (int x = 0; x < E; x++) p[x] = 2.0f * kt_normal() + (skew && x < K ? 30.0f : 0.0f);
        ref_route(p, E, K, s, w + (size_t)t * K);
        for (int k = 0; k < K; k++) sel[(size_t)t * K + k] = s[k];
    }
    free(p);
}

// k_router against ref_route: the same experts in the same order, and their weights.
static void hk_router(void) {
    const ck_config *c = &hk.m.cfg;
    int E = c->n_experts, K = c->topk;
    for (int T = 1; T <= 512; T += 511) {
        float *lg = hk_normal((size_t)T * E, 2.0f), *w = malloc(sizeof(float) * (size_t)T * K), *p = malloc(sizeof(float) * E);
        int *sel = malloc(sizeof(int) * (size_t)T * K);
        CUdeviceptr ld = hk_up(lg, sizeof(float) * (size_t)T * E), sd = hk_up(NULL, 4 * (size_t)T * K), wd = hk_up(NULL, 4 * (size_t)T * K);
        gpu_k_router(&hk.k, hk.s, ld, E, K, sd, wd, T);
        int32_t *gs = hk_down(sd, 4 * (size_t)T * K);
        float *gw = hk_down(wd, 4 * (size_t)T * K);
        int same = 1;
        for (int t = 0; t < T; t++) {
            memcpy(p, lg + (size_t)t * E, sizeof(float) * E);
            ref_route(p, E, K, sel + (size_t)t * K, w + (size_t)t * K);
            for (int k = 0; k < K; k++) same &= sel[(size_t)t * K + k] == gs[(size_t)t * K + k];
        }
        double err = same ? check_nerr(gw, w, (size_t)T * K) : INFINITY, us;   // other experts: no bound holds
        HK_TIME(us, gpu_k_router(&hk.k, hk.s, ld, E, K, sd, wd, T));
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d, E %d top-%d", T, E, K);
        hk_row("k_router", shape, "f32", err, HK_TOL_SUM, us, 4.0 * T * E + 8.0 * T * K);
        free(lg), free(w), free(p), free(sel), free(gs), free(gw);
        hk_reset();
    }
}

// k_route (a decode step's router, shared-expert activation and grouping in one launch) against
// ref_route (experts, weights), ref_silu_mul (h) and the grouping's rules (hk_map_err), at T = 1
// and T = GPU_ROUTE_T.
static void hk_route_fused(void) {
    const ck_config *c = &hk.m.cfg;
    int E = c->n_experts, K = c->topk, SI = c->shared_inter;
    for (int T = 1; T <= GPU_ROUTE_T; T += GPU_ROUTE_T - 1) {
        size_t n = (size_t)T * SI;
        float *lg = hk_normal((size_t)T * E, 2.0f), *w = malloc(sizeof(float) * (size_t)T * K), *p = malloc(sizeof(float) * E);
        float *g = hk_normal(n, 2.0f), *u = hk_normal(n, 1.0f), *hr = malloc(sizeof(float) * n);
        int *sel = malloc(sizeof(int) * (size_t)T * K);
        CUdeviceptr ld = hk_up(lg, sizeof(float) * (size_t)T * E), sd = hk_up(NULL, 4 * (size_t)T * K), wd = hk_up(NULL, 4 * (size_t)T * K);
        CUdeviceptr gd = hk_up(g, sizeof(float) * n), ud = hk_up(u, sizeof(float) * n), hd = hk_up(NULL, sizeof(float) * n);
        CUdeviceptr hs = hk_up(NULL, 2 * GPU_MM_SPLITS * n), map = hk_up(NULL, 4 * gpu_moe_map_ints((long long)T * K, E));
        CHECK(gpu_k_route(&hk.k, hk.s, ld, E, K, T, sd, wd, gd, ud, hd, (int)n, hs, map), "k_route: T = %d does not launch", T);
        int32_t *gs = hk_down(sd, 4 * (size_t)T * K);
        float *gw = hk_down(wd, 4 * (size_t)T * K), *gh = hk_down(hd, sizeof(float) * n);
        int same = 1;
        for (int t = 0; t < T; t++) {
            memcpy(p, lg + (size_t)t * E, sizeof(float) * E);
            ref_route(p, E, K, sel + (size_t)t * K, w + (size_t)t * K);
            for (int k = 0; k < K; k++) same &= sel[(size_t)t * K + k] == gs[(size_t)t * K + k];
        }
        ref_silu_mul(g, u, hr, n);
        // other experts: no bound holds; a wrong grouping: INFINITY (hk_map_err)
        double err = same ? fmax(fmax(check_nerr(gw, w, (size_t)T * K), check_nerr(gh, hr, n)), hk_map_err(map, gs, T * K, E)) : INFINITY, us;
        HK_TIME(us, gpu_k_route(&hk.k, hk.s, ld, E, K, T, sd, wd, gd, ud, hd, (int)n, hs, map));
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d, E %d top-%d, shared %d", T, E, K, SI);
        // logits read, sel and selw written; g and u read, h written (12 bytes an element) and its three
        // bf16 parts (6); the map written
        hk_row("k_route", shape, "f32", err, HK_TOL_SUM, us, 4.0 * T * E + 8.0 * T * K + 18.0 * n + 4.0 * gpu_moe_map_ints((long long)T * K, E));
        free(lg), free(w), free(p), free(g), free(u), free(hr), free(sel), free(gs), free(gw), free(gh);
        hk_reset();
    }
}

// The routed experts through the shape hk.k picks (the pairs of sd grouped again by k_moe_sort
// when map is 0, else map's grouping) into fresh outputs: whether h's parts and ye are the bits of
// hp and gy (the shape the step takes), and the time of k_moe_up and k_moe_dn.
static int hk_moe_same(CUdeviceptr ex, CUdeviceptr sd, CUdeviceptr map, int E, int K, CUdeviceptr xs, int T, int H, int I, const uint16_t *hp,
                       const float *gy, double *t_up, double *t_dn) {
    const int P = T * K;
    const size_t mark = hk.d.used;   // (this call's buffers dropped at its end: a prompt's shapes take several calls)
    CUdeviceptr hsx = hk_up(NULL, 2 * GPU_MM_SPLITS * (size_t)P * I), ydx = hk_up(NULL, sizeof(float) * (size_t)P * H);
    if (!map) {
        map = hk_up(NULL, 4 * gpu_moe_map_ints(P, E));
        gpu_k_moe_sort(&hk.k, hk.s, sd, P, E, map);
    }
    gpu_k_moe_up(&hk.k, hk.s, ex, map, E, K, xs, T, H, hsx, I);
    gpu_k_moe_dn(&hk.k, hk.s, ex, map, E, hsx, P, I, ydx, H);
    uint16_t *hpx = hk_down(hsx, 2 * GPU_MM_SPLITS * (size_t)P * I);
    float *gyx = hk_down(ydx, sizeof(float) * (size_t)P * H);
    const int eq = !memcmp(hp, hpx, 2 * GPU_MM_SPLITS * (size_t)P * I) && !memcmp(gy, gyx, sizeof(float) * (size_t)P * H);
    HK_TIME(*t_up, gpu_k_moe_up(&hk.k, hk.s, ex, map, E, K, xs, T, H, hsx, I));
    HK_TIME(*t_dn, gpu_k_moe_dn(&hk.k, hk.s, ex, map, E, hsx, P, I, ydx, H));
    free(hpx), free(gyx);
    hk.d.used = mark;
    return eq;
}

// The routed experts of one stored kind: k_moe_gate_up against ref_moe_gate_up and k_moe_down
// against ref_moe_down, each expert over the (token, choice) pairs that chose it, as ref_moe
// groups them; k_moe_down reads the GPU's own h, so each kernel is measured alone.
// HK_PROMPT_ONLY=1: of the experts, the 2-bit planes' prompt steps alone (no CPU twins: a short run while a chain
// kernel is changed).
static int hk_prompt_only(void) {
    const char *po = getenv("HK_PROMPT_ONLY");
    return po && !strcmp(po, "1");
}

static void hk_experts(int kind) {
    const ck_config *c = &hk.m.cfg;
    hk.k.moe_kind = kind;   // (the launch shapes follow it, as the engine's)
    int E = c->n_experts, K = c->topk, H = c->hidden, I = c->inter;
    ck_mat *gate = malloc(sizeof(ck_mat) * E), *up = malloc(sizeof(ck_mat) * E), *down = malloc(sizeof(ck_mat) * E);
    uint8_t **bufs = malloc(sizeof(uint8_t *) * 6 * (size_t)E);
    gpu_mat *tab = malloc(sizeof(gpu_mat) * 3 * (size_t)E);
    for (int x = 0; x < E; x++) {
        gate[x] = kt_random_mat(kind, I, H, &bufs[6 * x], &bufs[6 * x + 1]);
        up[x] = kt_random_mat(kind, I, H, &bufs[6 * x + 2], &bufs[6 * x + 3]);
        down[x] = kt_random_mat(kind, H, I, &bufs[6 * x + 4], &bufs[6 * x + 5]);
        tab[3 * x] = gpu_put(&hk.d, &gate[x], "expert"), tab[3 * x + 1] = gpu_put(&hk.d, &up[x], "expert");
        tab[3 * x + 2] = gpu_put(&hk.d, &down[x], "expert");
    }
    CUdeviceptr ex = hk_up(tab, sizeof(gpu_mat) * 3 * (size_t)E);
    size_t used = hk.d.used;
    // decode (T = 1), a batch of 16 decoding sequences that all chose the same K experts (two
    // items per expert in the _d shape), 64 and 256 tokens (a batch of decoding sequences, a short
    // prompt: 2 and 8 pairs per expert), a 512-token prefill chunk
    static const int Ts[] = {1, 16, 64, 256, 512};
    const int nts = hk_prompt_only() ? 0 : (int)(sizeof Ts / sizeof Ts[0]);
    for (int ti = 0; ti < nts; ti++) {
        int T = Ts[ti], skew = T == 16;
        int P = T * K, *rows = malloc(sizeof(int) * P);
        int32_t *sel = malloc(sizeof(int32_t) * P);
        float *w = malloc(sizeof(float) * P), *xn = hk_normal((size_t)T * H, 1.0f);
        hk_route(T, sel, w, skew);
        float *href = malloc(sizeof(float) * (size_t)P * I), *yref = malloc(sizeof(float) * (size_t)P * H);
        float *gx = malloc(sizeof(float) * (size_t)T * (H > I ? H : I)), *hh = malloc(sizeof(float) * (size_t)T * I);
        float *uu = malloc(sizeof(float) * (size_t)T * I), *ed = malloc(sizeof(float) * (size_t)T * H);
        CUdeviceptr sd = hk_up(sel, 4 * (size_t)P), xd = hk_up(xn, sizeof(float) * (size_t)T * H);
        CUdeviceptr hd = hk_up(NULL, sizeof(float) * (size_t)P * I), yd = hk_up(NULL, sizeof(float) * (size_t)P * H);
        gpu_k_moe_gate_up(&hk.k, hk.s, ex, sd, xd, H, K, hd, I, T);
        float *gh = hk_down(hd, sizeof(float) * (size_t)P * I);
        gpu_k_moe_down(&hk.k, hk.s, ex, sd, hd, I, yd, H, P);
        float *gy = hk_down(yd, sizeof(float) * (size_t)P * H);
        double ebytes_gu = 0, ebytes_d = 0;
        for (int x = 0; x < E; x++) {
            int n = 0;
            for (int p = 0; p < P; p++)
                if (sel[p] == x) rows[n++] = p;
            if (!n) continue;
            ebytes_gu += (double)(hk_mat_bytes(&gate[x]) + hk_mat_bytes(&up[x]));
            ebytes_d += (double)hk_mat_bytes(&down[x]);
            for (int i = 0; i < n; i++) memcpy(gx + (size_t)i * H, xn + (size_t)(rows[i] / K) * H, sizeof(float) * H);
            ref_moe_gate_up(&hk.r, &gate[x], &up[x], gx, n, hh, uu);
            for (int i = 0; i < n; i++) memcpy(href + (size_t)rows[i] * I, hh + (size_t)i * I, sizeof(float) * I);
            for (int i = 0; i < n; i++) memcpy(gx + (size_t)i * I, gh + (size_t)rows[i] * I, sizeof(float) * I);
            ref_moe_down(&hk.r, &down[x], gx, n, ed);
            for (int i = 0; i < n; i++) memcpy(yref + (size_t)rows[i] * H, ed + (size_t)i * H, sizeof(float) * H);
        }
        double egu = check_nerr(gh, href, (size_t)P * I), ed_ = check_nerr(gy, yref, (size_t)P * H), us;
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d x top-%d%s, [%d, %d] x 2", T, K, skew ? " (same)" : "", I, H);
        if (!hk.act) {   // (f32 kernels: their twins, computed above, do not round)
            HK_TIME(us, gpu_k_moe_gate_up(&hk.k, hk.s, ex, sd, xd, H, K, hd, I, T));
            hk_row("k_moe_gate_up", shape, hk_kind(kind), egu, HK_TOL_PRODUCT, us, ebytes_gu + 4.0 * T * H + 4.0 * P * I + 4.0 * P);
            snprintf(shape, sizeof shape, "T=%d x top-%d%s, [%d, %d]", T, K, skew ? " (same)" : "", H, I);
            HK_TIME(us, gpu_k_moe_down(&hk.k, hk.s, ex, sd, hd, I, yd, H, P));
            hk_row("k_moe_down", shape, hk_kind(kind), ed_, HK_TOL_SUM, us, ebytes_d + 4.0 * P * I + 4.0 * P * H + 4.0 * P);
        }
        // the tensor cores: the pairs grouped by expert (k_moe_sort), k_moe_up writing h's parts,
        // k_moe_dn reading them; against the same twins (down over the GPU's own h)
        CUdeviceptr xs = hk_up(NULL, 2 * GPU_MM_SPLITS * (size_t)T * H), hs = hk_up(NULL, 2 * GPU_MM_SPLITS * (size_t)P * I);
        CUdeviceptr map = hk_up(NULL, 4 * gpu_moe_map_ints(P, E));
        CU_CHECK(cu.cuMemsetD8Async(yd, 0xff, sizeof(float) * (size_t)P * H, hk.s));   // ordered before the launches on hk.s
        gpu_k_mm_split(&hk.k, hk.s, xd, H, H, T, xs);
        gpu_k_moe_sort(&hk.k, hk.s, sd, P, E, map);
        gpu_k_moe_up(&hk.k, hk.s, ex, map, E, K, xs, T, H, hs, I);
        gpu_k_moe_dn(&hk.k, hk.s, ex, map, E, hs, P, I, yd, H);
        uint16_t *hp = hk_down(hs, 2 * GPU_MM_SPLITS * (size_t)P * I);
        float *gy2 = hk_down(yd, sizeof(float) * (size_t)P * H);
        for (size_t i = 0; i < (size_t)P * I; i++) {   // h = hi + mid + lo (one part: hi, h's bf16 rounding)
            float v = 0;
            for (int q = 0; q < hk.k.parts; q++) v += ck_bf16((const uint8_t *)&hp[(size_t)q * P * I + i]);
            gh[i] = v;
        }
        for (int x = 0; x < E; x++) {
            int n = 0;
            for (int p = 0; p < P; p++)
                if (sel[p] == x) rows[n++] = p;
            if (!n) continue;
            for (int i = 0; i < n; i++) memcpy(gx + (size_t)i * I, gh + (size_t)rows[i] * I, sizeof(float) * I);
            ref_moe_down(&hk.r, &down[x], gx, n, ed);
            for (int i = 0; i < n; i++) memcpy(yref + (size_t)rows[i] * H, ed + (size_t)i * H, sizeof(float) * H);
        }
        egu = hk.k.parts == 1 ? hk_bf16_err(gh, href, (size_t)P * I) : check_nerr(gh, href, (size_t)P * I), ed_ = check_nerr(gy2, yref, (size_t)P * H);
        snprintf(shape, sizeof shape, "T=%d x top-%d%s, [%d, %d] x 2", T, K, skew ? " (same)" : "", I, H);
        HK_TIME(us, gpu_k_moe_sort(&hk.k, hk.s, sd, P, E, map));
        hk_row("k_moe_sort", shape, "i32", hk_map_err(map, sel, P, E), HK_TOL_EXACT, us, 4.0 * P + 4.0 * gpu_moe_map_ints(P, E));
        HK_TIME(us, gpu_k_moe_up(&hk.k, hk.s, ex, map, E, K, xs, T, H, hs, I));
        hk_row("k_moe_up", shape, hk_kind(kind), egu, HK_TOL_PRODUCT, us, ebytes_gu + 2.0 * hk.k.parts * T * H + 6.0 * P * I);
        snprintf(shape, sizeof shape, "T=%d x top-%d%s, [%d, %d]", T, K, skew ? " (same)" : "", H, I);
        HK_TIME(us, gpu_k_moe_dn(&hk.k, hk.s, ex, map, E, hs, P, I, yd, H));
        hk_row("k_moe_dn", shape, hk_kind(kind), ed_, HK_TOL_SUM, us, ebytes_d + 2.0 * hk.k.parts * P * I + 4.0 * P * H);
        // every other shape this step could take (_d up to GPU_MOE_D_PPE pairs per expert, _p, _g and,
        // reading one part, _g128 from any pairs per expert) against the one it takes: the same bits, and their times
        static const char *const shname[4] = {"_d", "_p", "_g", "_g128"};
        static const int set_d[4] = {GPU_MOE_D_PPE, 0, 0, 0}, set_g[4] = {1 << 20, 1 << 20, 0, 0}, set_g128[4] = {0, 0, 0, 1};
        const int taken = gpu_moe_shape(&hk.k, P, E), d0 = hk.k.moe_d_ppe, g0 = hk.k.moe_g_min, g1280 = hk.k.moe_g128_min, w0 = hk.k.moe_w;
        hk.k.moe_w = 0;   // (_g128's own kernels here; k_moe_up_w / k_moe_dn_w in the prompt rows below)
        double t_up[4] = {0}, t_dn[4] = {0};
        int ran[4] = {0}, same = 1;
        for (int sh = 0; sh < 4; sh++) {
            hk.k.moe_d_ppe = set_d[sh], hk.k.moe_g_min = set_g[sh], hk.k.moe_g128_min = set_g128[sh];
            if (gpu_moe_shape(&hk.k, P, E) != sh) continue;   // (the shape taken too: its time beside the others)
            const int eq = hk_moe_same(ex, sd, 0, E, K, xs, T, H, I, hp, gy2, &t_up[sh], &t_dn[sh]);
            CHECK(eq, "k_moe_up%s / k_moe_dn%s %s T=%d: not the bits of the %s shape", shname[sh], shname[sh], hk_kind(kind), T, shname[taken]);
            same &= eq;
            ran[sh] = 1;
        }
        hk.k.moe_d_ppe = d0, hk.k.moe_g_min = g0, hk.k.moe_g128_min = g1280, hk.k.moe_w = w0;
        // the _d shape's row blocks per block (gpu_moe_nrb): the same bits with any, their times; for
        // 2-bit planes each kernel set (k_moe_*_d, and the planes' own k_moe_*_dg4, four blocks a
        // multiprocessor; one row block a block takes k_moe_*_d1 in each), each against the bits of
        // the shape taken
        for (int set = kind == CK_W_PLANES ? 1 : 0; taken == 0 && set >= 0; set--) {
            static const char *const dname[2] = {"k_moe_*_d", "k_moe_*_dg4"};
            const int q0 = hk.k.moe_dg, bound = gpu_moe_items_bound(P, E);
            hk.k.moe_dg = set > 0;
            printf("%-18s %-46s %-12s row blocks a block (up, down by gpu_moe_nrb: %d, %d):", dname[set], shape,
                   hk_kind(kind), gpu_moe_nrb(&hk.k, bound, I / 16), gpu_moe_nrb(&hk.k, bound, H / 64));
            for (int nrb = 1; nrb <= 8; nrb *= 2) {
                hk.k.moe_nrb = nrb;
                double tu, td;
                const int eq = hk_moe_same(ex, sd, map, E, K, xs, T, H, I, hp, gy2, &tu, &td);
                CHECK(eq, "%s %s T=%d, %d row blocks a block: not the bits of gpu_moe_nrb's", dname[set], hk_kind(kind), T, nrb);
                printf(" %d: %.1f, %.1f µs%s", nrb, tu, td, eq ? "" : " (DIFFERENT bits)");
            }
            hk.k.moe_nrb = 0, hk.k.moe_dg = q0;
            printf("\n");
        }
        if (ran[0] + ran[1] + ran[2] + ran[3] > 1) {
            printf("%-18s %-46s %-12s takes %s;", "k_moe_* shapes", shape, hk_kind(kind), shname[taken]);
            for (int sh = 0; sh < 4; sh++)
                if (ran[sh]) printf(" %s up %.1f µs, down %.1f µs;", shname[sh], t_up[sh], t_dn[sh]);
            printf(" bits %s\n", same ? "equal" : "DIFFERENT");
        }
        free(hp), free(gy2);
        free(rows), free(sel), free(w), free(xn), free(href), free(yref), free(gx), free(hh), free(uu), free(ed), free(gh), free(gy);
        CU_CHECK(cu.cuCtxSynchronize());
        hk.d.used = used;   // keep the experts, drop this shape's buffers
    }
    // prompt steps of 64, 2,048 and 8,192 tokens (2, 64 and 256 pairs per expert: one piece, a long prompt's chunks):
    // no CPU twin at this size (the twins above hold the kernels' function); the _g shape's
    // outputs are the reference of the others' bits (_g128 where the products read one part), and
    // each shape's time and rate (2 · pairs · 3 · I · H multiply-adds' flops)
    static const int Tp[] = {64, 2048, 8192};
    for (int ti = 0; ti < (int)(sizeof Tp / sizeof Tp[0]); ti++) {
        const int T = Tp[ti], P = T * K;
        int32_t *sel = malloc(sizeof(int32_t) * P);
        float *w = malloc(sizeof(float) * P), *xn = hk_normal((size_t)T * H, 1.0f);
        hk_route(T, sel, w, 0);
        CUdeviceptr sd = hk_up(sel, 4 * (size_t)P), xd = hk_up(xn, sizeof(float) * (size_t)T * H);
        CUdeviceptr xs = hk_up(NULL, 2 * GPU_MM_SPLITS * (size_t)T * H), hs = hk_up(NULL, 2 * GPU_MM_SPLITS * (size_t)P * I);
        CUdeviceptr yd = hk_up(NULL, sizeof(float) * (size_t)P * H), map = hk_up(NULL, 4 * gpu_moe_map_ints(P, E));
        gpu_k_mm_split(&hk.k, hk.s, xd, H, H, T, xs);
        const int d0 = hk.k.moe_d_ppe, g0 = hk.k.moe_g_min, g1280 = hk.k.moe_g128_min, taken = gpu_moe_shape(&hk.k, P, E);
        hk.k.moe_d_ppe = 0, hk.k.moe_g_min = 0, hk.k.moe_g128_min = 0;   // _g
        MOET_ASSERT(gpu_moe_shape(&hk.k, P, E) == 2, "harness: the _g shape at %d tokens", T);
        gpu_k_moe_sort(&hk.k, hk.s, sd, P, E, map);
        gpu_k_moe_up(&hk.k, hk.s, ex, map, E, K, xs, T, H, hs, I);
        gpu_k_moe_dn(&hk.k, hk.s, ex, map, E, hs, P, I, yd, H);
        uint16_t *hp = hk_down(hs, 2 * GPU_MM_SPLITS * (size_t)P * I);
        float *gy = hk_down(yd, sizeof(float) * (size_t)P * H);
        const double fl_up = 2.0 * P * 2.0 * I * H, fl_dn = 2.0 * P * (double)H * I;
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d x top-%d, [%d, %d] (prompt)", T, K, H, I);
        printf("%-18s %-46s %-12s takes %s;", "k_moe_* shapes", shape, hk_kind(kind), taken == 3 ? "_g128" : taken == 2 ? "_g" : "another");
        const int w0 = hk.k.moe_w;
        for (int sh = 2; sh <= 4; sh++) {   // _g, _g128, and _g128's items through k_moe_up_w / k_moe_dn_w (4) where the image has them
            static const char *const nm[5] = {"", "", "_g", "_g128", "_w"};
            hk.k.moe_g128_min = sh >= 3, hk.k.moe_w = sh == 4 ? w0 : 0;
            if (gpu_moe_shape(&hk.k, P, E) != (sh >= 3 ? 3 : 2) || (sh == 4 && !gpu_moe_w_take(&hk.k, I, H))) continue;   // (_g128: one part only)
            double tu, td;
            const int eq = hk_moe_same(ex, sd, sh == 2 ? map : 0, E, K, xs, T, H, I, hp, gy, &tu, &td);
            CHECK(eq, "k_moe_up%s / k_moe_dn%s %s T=%d: not the bits of the _g shape", nm[sh], nm[sh], hk_kind(kind), T);
            printf(" %s up %.1f µs (%.1f TFLOP/s), down %.1f µs (%.1f TFLOP/s)%s;", nm[sh], tu, fl_up / tu * 1e-6, td, fl_dn / td * 1e-6,
                   eq ? "" : " DIFFERENT bits");
        }
        // the chain products (k_moe_up_c / k_moe_dn_c: prompts' full pieces' pairs, 2-bit planes, one part) on the
        // _g128 shape's map: their time, and the down products' error against the _g shape's (another order of the
        // f32 sums, h rounded to bf16 from other sums: not bits — how far, not whether)
        hk.k.moe_g128_min = 1, hk.k.moe_w = w0;
        if (kind == GPU_W_PLANES && hk.k.parts == 1 && gpu_moe_w_take(&hk.k, I, H) && gpu_moe_shape(&hk.k, P, E) == 3 && I % 128 == 0 &&
            H % GPU_MOEC_BM == 0) {
            const int bound = gpu_moe_items_bound(P, E);
            gpu_k_moe_sort(&hk.k, hk.s, sd, P, E, map);
            double tu, td;
            HK_TIME(tu, gpu_k_moe_up_c(&hk.k, hk.s, ex, map, bound, K, xs, hs, I));
            HK_TIME(td, gpu_k_moe_dn_c(&hk.k, hk.s, ex, map, bound, hs, yd, H));
            float *cy = hk_down(yd, sizeof(float) * (size_t)P * H);
            printf(" _c up %.1f µs (%.1f TFLOP/s), down %.1f µs (%.1f TFLOP/s), down's error vs _g %.2g;", tu, fl_up / tu * 1e-6, td,
                   fl_dn / td * 1e-6, check_nerr(cy, gy, (size_t)P * H));
            // the same products with A from registers (k_moe_up_r / k_moe_dn_r): the same bits as _c's
            HK_TIME(tu, gpu_k_moe_up_r(&hk.k, hk.s, ex, map, bound, K, xs, hs, I));
            HK_TIME(td, gpu_k_moe_dn_r(&hk.k, hk.s, ex, map, bound, hs, yd, H));
            float *ry = hk_down(yd, sizeof(float) * (size_t)P * H);
            const int req = !memcmp(ry, cy, sizeof(float) * (size_t)P * H);
            CHECK(req, "k_moe_up_r / k_moe_dn_r T=%d: not the bits of _c", T);
            printf(" _r up %.1f µs (%.1f TFLOP/s), down %.1f µs (%.1f TFLOP/s)%s;", tu, fl_up / tu * 1e-6, td, fl_dn / td * 1e-6,
                   req ? "" : " DIFFERENT bits from _c");
            free(cy), free(ry);
        }
        printf("\n");
        hk.k.moe_d_ppe = d0, hk.k.moe_g_min = g0, hk.k.moe_g128_min = g1280, hk.k.moe_w = w0;
        free(hp), free(gy), free(sel), free(w), free(xn);
        CU_CHECK(cu.cuCtxSynchronize());
        hk.d.used = used;
    }
    for (size_t i = 0; i < 6 * (size_t)E; i++) free(bufs[i]);
    free(bufs), free(gate), free(up), free(down), free(tab);
    hk_reset();
}

// k_moe_combine against ref_moe_combine, and k_silu_mul against ref_silu_mul (the shared expert).
// Bound HK_TOL_SUM: the GPU may contract a product and a sum into one FMA where the twin rounds
// twice, and computes SiLU / σ in f32 (expf) where the twin goes through f64: a few ulps.
static void hk_combine_silu(void) {
    const ck_config *c = &hk.m.cfg;
    int K = c->topk, H = c->hidden, SI = c->shared_inter;
    for (int T = 1; T <= 512; T += 511) {
        int32_t *sel = malloc(sizeof(int32_t) * (size_t)T * K);
        float *w = malloc(sizeof(float) * (size_t)T * K);
        hk_route(T, sel, w, 0);
        float *ye = hk_normal((size_t)T * K * H, 1.0f), *sh = hk_normal((size_t)T * H, 1.0f), *sg = hk_normal(T, 2.0f);
        float *ref = malloc(sizeof(float) * (size_t)T * H);
        CUdeviceptr yed = hk_up(ye, sizeof(float) * (size_t)T * K * H), sd = hk_up(sel, 4 * (size_t)T * K), wd = hk_up(w, 4 * (size_t)T * K);
        CUdeviceptr shd = hk_up(sh, sizeof(float) * (size_t)T * H), sgd = hk_up(sg, sizeof(float) * T);
        CUdeviceptr yd = hk_up(NULL, sizeof(float) * (size_t)T * H);
        gpu_k_moe_combine(&hk.k, hk.s, yed, sd, wd, shd, sgd, yd, K, H, T);
        float *got = hk_down(yd, sizeof(float) * (size_t)T * H);
        for (int t = 0; t < T; t++)
            ref_moe_combine(ye + (size_t)t * K * H, sel + (size_t)t * K, w + (size_t)t * K, sg[t], sh + (size_t)t * H, K, H, ref + (size_t)t * H);
        double err = check_nerr(got, ref, (size_t)T * H), us;
        HK_TIME(us, gpu_k_moe_combine(&hk.k, hk.s, yed, sd, wd, shd, sgd, yd, K, H, T));
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d x top-%d, H %d", T, K, H);
        hk_row("k_moe_combine", shape, "f32", err, HK_TOL_SUM, us, 4.0 * T * K * H + 8.0 * T * H + 8.0 * T * K + 4.0 * T);
        // the same y made in the norm that adds it (k_moe_add_rmsnorm, a decode step's form): against
        // ref_moe_combine + the add + ref_rmsnorm1p; its time against k_moe_combine + k_add_rmsnorm's
        {
            uint16_t *wb = malloc(sizeof(uint16_t) * H);
            ck_mat nw = kt_bf16_vec(wb, H, 0.0f, 0.3f);
            gpu_mat nwd = gpu_put(&hk.d, &nw, "norm");
            const size_t n = (size_t)T * H;
            float *x = hk_normal(n, 3.0f), *nref = malloc(sizeof(float) * n);
            CUdeviceptr xd = hk_up(x, sizeof(float) * n), nd = hk_up(NULL, sizeof(float) * n), pd = hk_up(NULL, 2 * GPU_MM_SPLITS * n);
            gpu_k_moe_add_rmsnorm(&hk.k, hk.s, xd, yed, sd, wd, shd, sgd, K, nwd, nd, pd, 0, H, (float)c->eps, T);
            float *gn = hk_down(nd, sizeof(float) * n);
            for (size_t i = 0; i < n; i++) x[i] += ref[i];
            for (int t = 0; t < T; t++) ref_rmsnorm1p(x + (size_t)t * H, &nw, H, c->eps, nref + (size_t)t * H);
            double nerr = check_nerr(gn, nref, n), us2;
            HK_TIME(us, gpu_k_moe_add_rmsnorm(&hk.k, hk.s, xd, yed, sd, wd, shd, sgd, K, nwd, nd, pd, 0, H, (float)c->eps, T));
            HK_TIME(us2, (gpu_k_moe_combine(&hk.k, hk.s, yed, sd, wd, shd, sgd, yd, K, H, T),
                          gpu_k_add_rmsnorm(&hk.k, hk.s, xd, yd, nwd, nd, pd, 0, H, (float)c->eps, T)));
            hk_row("k_moe_add_rmsnorm", shape, "f32, bf16 w", nerr, HK_TOL_SUM, us,
                   4.0 * T * K * H + 16.0 * n + 8.0 * T * K + 4.0 * T + 2.0 * H + 2.0 * GPU_MM_SPLITS * n);
            hk_time_row("k_moe_combine + k_add_rmsnorm", shape, us2);
            free(wb), free(x), free(nref), free(gn);
        }
        free(sel), free(w), free(ye), free(sh), free(sg), free(ref), free(got);
        // the shared expert's activation: h = SiLU(g) · u over [T, SI]
        size_t n = (size_t)T * SI;
        float *g = hk_normal(n, 2.0f), *u = hk_normal(n, 1.0f), *hr = malloc(sizeof(float) * n);
        CUdeviceptr gd = hk_up(g, sizeof(float) * n), ud = hk_up(u, sizeof(float) * n), hd = hk_up(NULL, sizeof(float) * n);
        gpu_k_silu_mul(&hk.k, hk.s, gd, ud, hd, (int)n, 0);
        float *gh = hk_down(hd, sizeof(float) * n);
        ref_silu_mul(g, u, hr, n);
        err = check_nerr(gh, hr, n);
        HK_TIME(us, gpu_k_silu_mul(&hk.k, hk.s, gd, ud, hd, (int)n, 0));
        snprintf(shape, sizeof shape, "T=%d x %d", T, SI);
        hk_row("k_silu_mul", shape, "f32", err, HK_TOL_SUM, us, 12.0 * n);
        free(g), free(u), free(hr), free(gh);
        hk_reset();
    }
}

// k_argmax against samp_first_max (a greedy row's token on the device, instead of the row's logits
// copied out): rows of the real vocabulary, 1 and 16 of them; err 0 when every id is the sampler's.
static void hk_argmax(void) {
    int V = hk.m.cfg.vocab;
    for (int R = 1; R <= 16; R += 15) {
        float *x = hk_normal((size_t)R * V, 3.0f), *bmax = malloc(sizeof(float) * ((size_t)V / SAMP_BLOCK + 1));
        int32_t *zero = calloc(GPU_ARGMAX_INTS(R), sizeof(int32_t));   // the slices' counters start at 0
        CUdeviceptr xd = hk_up(x, sizeof(float) * (size_t)R * V), idd = hk_up(zero, sizeof(int32_t) * GPU_ARGMAX_INTS(R));
        free(zero);
        gpu_k_argmax(&hk.k, hk.s, xd, V, idd, R, R);
        int32_t *got = hk_down(idd, sizeof(int32_t) * (size_t)R);
        int bad = 0;
        for (int r = 0; r < R; r++) {
            const float *row = x + (size_t)r * V;
            bad += got[r] != samp_first_max(row, V, bmax, samp_block_max(row, V, bmax));
        }
        double us;
        HK_TIME(us, gpu_k_argmax(&hk.k, hk.s, xd, V, idd, R, R));
        char shape[64];
        snprintf(shape, sizeof shape, "%d rows of %d", R, V);
        hk_row("k_argmax", shape, "f32", bad ? 1.0 : 0.0, 0.5, us, 4.0 * R * V + 4.0 * R);   // err 1: an id not the sampler's
        free(x), free(bmax), free(got);
        hk_reset();
    }
}

// k_gdn_conv against ref_gdn_conv, token after token of one row, and the window it leaves.
static void hk_gdn_conv(void) {
    const ck_config *c = &hk.m.cfg;
    int cd = c->conv_dim, Kc = c->conv_k;
    uint8_t *wb, *sb;
    ck_mat w = kt_random_mat(CK_W_BF16, cd, Kc, &wb, &sb);
    gpu_mat wd = gpu_put(&hk.d, &w, "conv");
    const int Ts[] = {1, 2, 37, 512, 8192};   // rows shorter than the window, cut unevenly, a prompt chunk, a long prompt
    for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++) {
        const int T = Ts[ti];
        size_t n = (size_t)T * cd, nw = (size_t)(Kc - 1) * cd;
        float *x = hk_normal(n, 1.0f), *win = hk_normal(nw, 1.0f), *tmp = malloc(sizeof(float) * cd);
        int32_t meta[3] = {0, 0, T};   // row_slot, row_start, row_len of the one row
        CUdeviceptr xd = hk_up(x, sizeof(float) * n), wind = hk_up(win, sizeof(float) * nw), md = hk_up(meta, sizeof meta);
        gpu_k_gdn_conv(&hk.k, hk.s, xd, cd, wd, Kc, wind, (long long)nw, md, md + 4, md + 8, 1, T, 0, 0);
        float *gx = hk_down(xd, sizeof(float) * n), *gw = hk_down(wind, sizeof(float) * nw);
        for (int t = 0; t < T; t++) ref_gdn_conv(&w, cd, Kc, x + (size_t)t * cd, win, tmp);
        double err = fmax(check_nerr(gx, x, n), check_nerr(gw, win, nw)), us;
        HK_TIME(us, gpu_k_gdn_conv(&hk.k, hk.s, xd, cd, wd, Kc, wind, (long long)nw, md, md + 4, md + 8, 1, T, 0, 0));
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d in 1 row, %d ch x %d taps", T, cd, Kc);
        hk_row("k_gdn_conv", shape, "f32, bf16 w", err, HK_TOL_SUM, us, 8.0 * n + 8.0 * nw + 2.0 * cd * Kc);
        free(x), free(win), free(tmp), free(gx), free(gw);
    }
    // a decode step of R rows of one token, each its own slot's window (rows in reverse slot order)
    const int Rs[] = {16, 64};
    for (int ri = 0; ri < (int)(sizeof Rs / sizeof Rs[0]); ri++) {
        const int R = Rs[ri];
        size_t n = (size_t)R * cd, nw = (size_t)(Kc - 1) * cd;
        float *x = hk_normal(n, 1.0f), *win = hk_normal(nw * R, 1.0f), *tmp = malloc(sizeof(float) * cd);
        int32_t *meta = malloc(sizeof(int32_t) * 3 * R);
        for (int r = 0; r < R; r++) meta[r] = R - 1 - r, meta[R + r] = r, meta[2 * R + r] = 1;
        CUdeviceptr xd = hk_up(x, sizeof(float) * n), wind = hk_up(win, sizeof(float) * nw * R), md = hk_up(meta, sizeof(int32_t) * 3 * R);
        gpu_k_gdn_conv(&hk.k, hk.s, xd, cd, wd, Kc, wind, (long long)nw, md, md + 4 * R, md + 8 * R, R, 1, 0, 0);
        float *gx = hk_down(xd, sizeof(float) * n), *gw = hk_down(wind, sizeof(float) * nw * R);
        for (int r = 0; r < R; r++) ref_gdn_conv(&w, cd, Kc, x + (size_t)r * cd, win + (size_t)(R - 1 - r) * nw, tmp);
        double err = fmax(check_nerr(gx, x, n), check_nerr(gw, win, nw * R)), us;
        HK_TIME(us, gpu_k_gdn_conv(&hk.k, hk.s, xd, cd, wd, Kc, wind, (long long)nw, md, md + 4 * R, md + 8 * R, R, 1, 0, 0));
        char shape[64];
        snprintf(shape, sizeof shape, "%d rows of 1 token, %d ch x %d taps", R, cd, Kc);
        hk_row("k_gdn_conv", shape, "f32, bf16 w", err, HK_TOL_SUM, us, 8.0 * n + 8.0 * nw * R + 2.0 * cd * Kc);
        free(x), free(win), free(tmp), free(gx), free(gw), free(meta);
    }
    free(wb);
    hk_reset();
}

// k_gdn_rule (T one-token rows, each its own sequence) and k_gdn_chunk (crows rows of T / crows
// tokens from position 0) against their twins (kernel_data.h: kt_gdn_row), outputs and states.
static void hk_gdn_rule(int kernel, int T, int crows) {
    const ck_config *c = &hk.m.cfg;
    int nk = c->lk_heads, nv = c->lv_heads, dk = c->lk_dim, dv = c->lv_dim, cd = c->conv_dim;
    int nrows = kernel == K_GDN_RULE ? T : crows;
    size_t slot = (size_t)nv * dk * dv, nS = slot * nrows, nO = (size_t)T * nv * dv;
    float *qkv = hk_normal((size_t)T * cd, 1.0f), *bb = hk_normal((size_t)T * nv, 2.0f), *aa = hk_normal((size_t)T * nv, 2.0f);
    for (size_t i = 0; i < (size_t)T * nv; i++) aa[i] -= 1.0f;
    float *S = hk_normal(nS, 0.1f), *o = malloc(sizeof(float) * nO);
    uint16_t lb[64], db[64];
    ck_mat alog = kt_bf16_vec(lb, nv, 0.5f, 1.0f), dtb = kt_bf16_vec(db, nv, 0.0f, 0.5f);
    gpu_mat ga = gpu_put(&hk.d, &alog, "A_log"), gd = gpu_put(&hk.d, &dtb, "dt_bias");
    kt_row *rw = malloc(sizeof(kt_row) * nrows);
    for (int i = 0; i < nrows; i++) rw[i] = (kt_row){i, 0, T / nrows};
    int pieces;
    CUdeviceptr m = kt_rows_dev(&hk.d, rw, nrows, 0, &pieces), tm = kt_tm_dev(&hk.d, pieces, nv);
    CUdeviceptr qd = hk_up(qkv, sizeof(float) * (size_t)T * cd), bd = hk_up(bb, sizeof(float) * (size_t)T * nv);
    CUdeviceptr ad = hk_up(aa, sizeof(float) * (size_t)T * nv), Sd = hk_up(S, sizeof(float) * nS), od = hk_up(NULL, sizeof(float) * nO);
    kt_gdn_run(&hk.k, hk.s, kernel, m, nrows, tm, pieces, qd, cd, bd, ad, ga, gd, Sd, od, nk, nv, dk, dv);
    float *go = hk_down(od, sizeof(float) * nO), *gS = hk_down(Sd, sizeof(float) * nS);
    for (int i = 0, t = 0; i < nrows; t += rw[i].len, i++)
        kt_gdn_row(qkv + (size_t)t * cd, cd, bb + (size_t)t * nv, aa + (size_t)t * nv, &alog, &dtb, S + (size_t)i * slot,
                   o + (size_t)t * nv * dv, nk, nv, dk, dv, rw[i].pos, rw[i].len, kernel == K_GDN_RULE);
    double err = fmax(check_nerr(go, o, nO), check_nerr(gS, S, nS)), us;
    // (k_gdn_chunk: the timed launches find q̂, k̂ where the first found q, k — k_gdn_prep normalises them again, the same work)
    HK_TIME(us, kt_gdn_run(&hk.k, hk.s, kernel, m, nrows, tm, pieces, qd, cd, bd, ad, ga, gd, Sd, od, nk, nv, dk, dv));
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d in %d row%s, %d/%d heads of %d", T, nrows, nrows > 1 ? "s" : "", nk, nv, dk);
    hk_row(kernel == K_GDN_RULE ? "k_gdn_rule" : "k_gdn_chunk", shape, "f32", err, GPU_TOL_GDN, us,
           8.0 * nS + 4.0 * T * cd + 8.0 * T * nv + 4.0 * nO);
    if (kernel == K_GDN_RULE && gpu_gdn_rule_norm_ok(dk, dv)) {
        // the gated norm folded in (k_gdn_rule_norm, a decode step's): against kt_gdn_row then
        // ref_gated_rmsnorm from the same state; its time against k_gdn_rule + k_gated_norm's
        uint16_t *wb = malloc(sizeof(uint16_t) * dv);
        ck_mat w = kt_bf16_vec(wb, dv, 1.0f, 0.2f);
        gpu_mat wd = gpu_put(&hk.d, &w, "gated norm");
        float *z = hk_normal(nO, 1.0f), *S1 = hk_normal(nS, 0.1f);
        CUdeviceptr zd = hk_up(z, sizeof(float) * nO), xd = hk_up(NULL, 2 * GPU_MM_SPLITS * nO);
        CU_CHECK(cu.cuMemcpyHtoD(Sd, S1, sizeof(float) * nS));
        CU_CHECK(cu.cuCtxSynchronize());   // the legacy stream's copy before the harness stream's launch
        const CUdeviceptr st4 = (CUdeviceptr)nrows * 4;
        const long long ss = (long long)slot;
#define HK_RN gpu_k_gdn_rule_norm(&hk.k, hk.s, qd, cd, bd, ad, ga, gd, Sd, ss, od, nk, nv, dk, dv, m, m + st4, m + 2 * st4, m + 4 * st4, nrows, 0, 0, \
                                  zd, wd, (float)c->eps, xd, T)
        HK_RN;
        float *fo = hk_down(od, sizeof(float) * nO), *fS = hk_down(Sd, sizeof(float) * nS);
        for (int i = 0, t = 0; i < nrows; t += rw[i].len, i++)
            kt_gdn_row(qkv + (size_t)t * cd, cd, bb + (size_t)t * nv, aa + (size_t)t * nv, &alog, &dtb, S1 + (size_t)i * slot,
                       o + (size_t)t * nv * dv, nk, nv, dk, dv, rw[i].pos, rw[i].len, 1);
        for (size_t h = 0; h < (size_t)T * nv; h++) ref_gated_rmsnorm(o + h * dv, z + h * dv, &w, dv, c->eps);
        double ferr = fmax(check_nerr(fo, o, nO), check_nerr(fS, S1, nS)), fus, pus;
        HK_TIME(fus, HK_RN);
#undef HK_RN
        HK_TIME(pus, (kt_gdn_run(&hk.k, hk.s, K_GDN_RULE, m, nrows, tm, pieces, qd, cd, bd, ad, ga, gd, Sd, od, nk, nv, dk, dv),
                      gpu_k_gated_norm(&hk.k, hk.s, od, zd, wd, nv, dv, (float)c->eps, xd, T)));
        hk_row("k_gdn_rule_norm", shape, "f32, bf16 w", ferr, HK_TOL_GDN_NORM, fus,
               8.0 * nS + 4.0 * T * cd + 8.0 * T * nv + 12.0 * nO + 2.0 * GPU_MM_SPLITS * nO + 2.0 * dv);
        hk_time_row("k_gdn_rule + k_gated_norm", shape, pus);
        free(wb), free(z), free(S1), free(fo), free(fS);
    }
    if (kernel == K_GDN_CHUNK) {   // of which k_gdn_prep (its first launch), timed alone: the walk is the rest
        double prep;
        HK_TIME(prep, kt_gdn_prep_run(&hk.k, hk.s, m, nrows, tm, pieces, qd, cd, bd, ad, ga, gd, nk, nv, dk, dv));
        printf("%-18s %-46s of it: k_gdn_prep alone %.1f µs (%d pieces), the walk ≈ %.1f µs (%.1f a piece a row)\n", "", shape, prep, pieces,
               us - prep, (us - prep) / ((double)pieces / nrows));
    }
    free(qkv), free(bb), free(aa), free(S), free(o), free(rw), free(go), free(gS);
    hk_reset();
}

// k_gated_norm against ref_gated_rmsnorm, every (token, value head); a BF16 weight [dv].
static void hk_gated_norm(void) {
    const ck_config *c = &hk.m.cfg;
    int nv = c->lv_heads, dv = c->lv_dim;
    uint16_t *wb = malloc(sizeof(uint16_t) * dv);
    ck_mat w = kt_bf16_vec(wb, dv, 1.0f, 0.2f);
    gpu_mat wd = gpu_put(&hk.d, &w, "gated norm");
    for (int T = 1; T <= 512; T += 511) {
        size_t n = (size_t)T * nv * dv;
        float *o = hk_normal(n, 0.1f), *z = hk_normal(n, 1.0f);
        CUdeviceptr od = hk_up(o, sizeof(float) * n), zd = hk_up(z, sizeof(float) * n);
        gpu_k_gated_norm(&hk.k, hk.s, od, zd, wd, nv, dv, (float)c->eps, 0, T);
        float *got = hk_down(od, sizeof(float) * n);
        for (size_t h = 0; h < (size_t)T * nv; h++) ref_gated_rmsnorm(o + h * dv, z + h * dv, &w, dv, c->eps);
        double err = check_nerr(got, o, n), us;
        HK_TIME(us, gpu_k_gated_norm(&hk.k, hk.s, od, zd, wd, nv, dv, (float)c->eps, 0, T));
        char shape[64];
        snprintf(shape, sizeof shape, "T=%d x %d heads of %d", T, nv, dv);
        hk_row("k_gated_norm", shape, "f32, bf16 w", err, HK_TOL_SUM, us, 12.0 * n + 2.0 * dv);
        free(o), free(z), free(got);
    }
    free(wb);
    hk_reset();
}

// The stored element i of a KV cache of type kv (raw: its bytes) as a float, with its scale.
static float hk_kv_get(int kv, const void *raw, size_t i, float scale) {
    if (kv == GPU_KV_F32) return ((const float *)raw)[i];
    if (kv == GPU_KV_BF16) return ck_bf16((const uint8_t *)raw + 2 * i);
    return ck_e4m3_lut[((const uint8_t *)raw)[i]] * scale;
}

// The twin of one query's attention (ref_attn_core) at position p into out [nh·hd], and the range
// lo, hi [nh·hd] the GPU's output may take (the one-part k_fa: ref_attn_fa1's, see HK_FA1_EPS; else
// out itself).
static void hk_attn_twin(const float *qg, const float *K, const float *V, int p, float *scores, float *out, float *lo, float *hi) {
    const ck_config *c = &hk.m.cfg;
    const int nh = c->n_heads, hd = c->head_dim, kvd = c->n_kv_heads * hd, group = nh / c->n_kv_heads;
    ref_attn_core(&hk.r, qg, K, V, p, scores, out);
    if (!(hk.r.act_bf16 && hk.r.kv_round)) {
        memcpy(lo, out, sizeof(float) * nh * hd), memcpy(hi, out, sizeof(float) * nh * hd);
        return;
    }
    for (int h = 0; h < nh; h++) {
        const float *qh = qg + (size_t)h * 2 * hd, *gate = qh + hd;
        float qb[GPU_ATT_MAX_HD];
        double o[GPU_ATT_MAX_HD], l[GPU_ATT_MAX_HD], u[GPU_ATT_MAX_HD];
        for (int d = 0; d < hd; d++) qb[d] = ref_bf16_round(qh[d]);
        ref_attn_fa1(qb, K, V, p, kvd, h / group, hd, 1.0f / sqrtf((float)hd), hk.r.kv_round == GPU_KV_FP8, scores, o, HK_FA1_EPS, l, u);
        for (int d = 0; d < hd; d++) {
            const double g = ref_sigmoid(gate[d]);
            lo[(size_t)h * hd + d] = (float)(l[d] * g), hi[(size_t)h * hd + d] = (float)(u[d] * g);
        }
    }
}

// How far got [n] lies outside [lo, hi] at most, in units of the twin's spread (ref): check_nerr's
// measure where lo = hi = ref.
static double hk_range_err(const float *got, const float *ref, const float *lo, const float *hi, size_t n) {
    double mean = 0, var = 0, mx = 0;
    for (size_t i = 0; i < n; i++) mean += ref[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (ref[i] - mean) * (ref[i] - mean);
    for (size_t i = 0; i < n; i++) {
        const double d = fmax(0, fmax((double)lo[i] - got[i], (double)got[i] - hi[i]));
        if (!(d <= mx)) mx = isnan(got[i]) ? INFINITY : d;
    }
    const double sd = sqrt(var / (double)n);
    return mx / (sd > 0 ? sd : 1);
}

// k_attn_prep and k_attention for one KV type over a sequence of P = 4,096 positions in one
// slot (pages in order). k_attn_prep fills the cache in three launches — positions [0, 512),
// [512, P − 1), P − 1 — each against ref_attn_prep: q and k in f32 (bound HK_TOL_SUM), and the
// cache exactly what ref_kv_round makes of the GPU's own k and v (a key computed in another
// order can land on the other side of a bf16 / e4m3 rounding boundary; that is the f32 check's
// business, not the cache's). k_attention against ref_attn_core over the GPU's cache (decoded):
// one query at P − 1 (decode), and the 512 queries of [0, 512) (prefill; every fourth checked).
static void hk_attention(int kv) {
    const ck_config *c = &hk.m.cfg;
    enum { P = 4096, TP = 512 };
    int nh = c->n_heads, kvh = c->n_kv_heads, hd = c->head_dim, kvd = kvh * hd, pw = 2 * nh * hd, rot = c->rot_dim;
    size_t elem = gpu_kv_elem(kv);
    float eps = (float)c->eps, scale = 1.0f / sqrtf((float)hd);
    float *proj = hk_normal((size_t)P * pw, 1.0f), *kk = hk_normal((size_t)P * kvd, 1.0f), *vv = hk_normal((size_t)P * kvd, 1.0f);
    uint16_t qb[GPU_ATT_MAX_HD], kb[GPU_ATT_MAX_HD];
    ck_mat qn = kt_bf16_vec(qb, hd, 0.0f, 0.3f), kn = kt_bf16_vec(kb, hd, 0.0f, 0.3f);
    int32_t *pos = malloc(sizeof(int32_t) * P), *slot = calloc(P, sizeof(int32_t)), *bt = malloc(sizeof(int32_t) * (P / GPU_KV_PAGE));
    for (int p = 0; p < P; p++) pos[p] = p;
    for (int b = 0; b < P / GPU_KV_PAGE; b++) bt[b] = b;
    gpu_mat qnd = gpu_put(&hk.d, &qn, "q_norm"), knd = gpu_put(&hk.d, &kn, "k_norm");
    CUdeviceptr projd = hk_up(proj, sizeof(float) * (size_t)P * pw), kkd = hk_up(kk, sizeof(float) * (size_t)P * kvd);
    CUdeviceptr vvd = hk_up(vv, sizeof(float) * (size_t)P * kvd), inv = hk_up(hk.r.inv_freq, sizeof(float) * (size_t)(rot / 2));
    CUdeviceptr posd = hk_up(pos, sizeof(int32_t) * P), slotd = hk_up(slot, sizeof(int32_t) * P), btd = hk_up(bt, sizeof(int32_t) * (P / GPU_KV_PAGE));
    CUdeviceptr kc = hk_up(NULL, elem * (size_t)P * kvd), vc = hk_up(NULL, elem * (size_t)P * kvd), ks = 0, vs = 0;
    if (kv == GPU_KV_FP8) ks = hk_up(NULL, sizeof(float) * (size_t)P * kvh), vs = hk_up(NULL, sizeof(float) * (size_t)P * kvh);
    int bts = P / GPU_KV_PAGE;
    // launch the prep of tokens [a, b)
#define HK_PREP(a, b)                                                                                                              \
    gpu_k_attn_prep(&hk.k, hk.s, kv, projd + (size_t)(a) * pw * 4, kkd + (size_t)(a) * kvd * 4, vvd + (size_t)(a) * kvd * 4, qnd, knd, \
                    inv, rot, posd + (size_t)(a) * 4, slotd + (size_t)(a) * 4, btd, bts, kc, vc, ks, vs, nh, kvh, hd, eps, (b) - (a))
    const int cut[4] = {0, TP, P - 1, P};
    for (int i = 0; i < 3; i++) HK_PREP(cut[i], cut[i + 1]);
    float *gq = hk_down(projd, sizeof(float) * (size_t)P * pw), *gk = hk_down(kkd, sizeof(float) * (size_t)P * kvd);
    uint8_t *gkc = hk_down(kc, elem * (size_t)P * kvd), *gvc = hk_down(vc, elem * (size_t)P * kvd);
    float *gks = ks ? hk_down(ks, sizeof(float) * (size_t)P * kvh) : NULL, *gvs = vs ? hk_down(vs, sizeof(float) * (size_t)P * kvh) : NULL;
    // the twin, and the GPU's cache decoded [P, kvd]
    float *Kr = malloc(sizeof(float) * (size_t)P * kvd), *Vr = malloc(sizeof(float) * (size_t)P * kvd);
    float *Kg = malloc(sizeof(float) * (size_t)P * kvd), *Vg = malloc(sizeof(float) * (size_t)P * kvd);
    float *Kx = malloc(sizeof(float) * (size_t)P * kvd), *Vx = malloc(sizeof(float) * (size_t)P * kvd);
    hk.r.kv_round = kv;
    for (int p = 0; p < P; p++)
        ref_attn_prep(&hk.r, &qn, &kn, proj + (size_t)p * pw, kk + (size_t)p * kvd, vv + (size_t)p * kvd, Kr + (size_t)p * kvd,
                      Vr + (size_t)p * kvd, p);
    for (int p = 0; p < P; p++)
        for (int j = 0; j < kvh; j++) {
            size_t o = (size_t)p * kvd + (size_t)j * hd;
            float ksc = gks ? gks[(size_t)p * kvh + j] : 1, vsc = gvs ? gvs[(size_t)p * kvh + j] : 1;
            for (int d = 0; d < hd; d++) Kg[o + d] = hk_kv_get(kv, gkc, o + d, ksc), Vg[o + d] = hk_kv_get(kv, gvc, o + d, vsc);
            memcpy(Kx + o, gk + o, sizeof(float) * hd);   // what the cache must hold: the GPU's k and v, rounded as ref_kv_round does
            memcpy(Vx + o, vv + o, sizeof(float) * hd);
            if (kv != GPU_KV_F32) ref_kv_round(Kx + o, hd, kv), ref_kv_round(Vx + o, hd, kv);
        }
    char name[32], shape[64];
    double err_prep[2], bytes_prep[2];   // T = 512 from position 0, T = 1 at P − 1
    for (int i = 0; i < 2; i++) {
        size_t a = (size_t)cut[2 * i], n = (size_t)(cut[2 * i + 1] - cut[2 * i]);
        double err = fmax(check_nerr(gq + a * pw, proj + a * pw, n * pw), check_nerr(gk + a * kvd, kk + a * kvd, n * kvd));
        err_prep[i] = fmax(err, fmax(check_nerr(Kg + a * kvd, Kx + a * kvd, n * kvd), check_nerr(Vg + a * kvd, Vx + a * kvd, n * kvd)));
        // q read and written, k read and written, v read, the cache row written (+ fp8 scales), position and slot
        bytes_prep[i] = n * (8.0 * nh * hd + 8.0 * kvd + 4.0 * kvd + 2.0 * elem * kvd + (kv == GPU_KV_FP8 ? 8.0 * kvh : 0) + 8.0);
    }
    // k_attention: one query at P − 1, then the prefill's queries [0, TP)
    CUdeviceptr core = hk_up(NULL, sizeof(float) * (size_t)TP * nh * hd);
    float *scores = malloc(sizeof(float) * P), *ref = malloc(sizeof(float) * (size_t)TP * nh * hd);
    float *rlo = malloc(sizeof(float) * (size_t)TP * nh * hd), *rhi = malloc(sizeof(float) * (size_t)TP * nh * hd);
    snprintf(name, sizeof name, "k_attention_%s", gpu_kv_names[kv]);
    for (int dec = 1; dec >= 0; dec--) {
        int a = dec ? P - 1 : 0, T = dec ? 1 : TP;
        gpu_k_attention(&hk.k, hk.s, kv, projd + (size_t)a * pw * 4, posd + (size_t)a * 4, slotd + (size_t)a * 4, btd, bts, kc, vc, ks, vs, core,
                        nh, kvh, hd, scale, 0, T, 1);
        float *got = hk_down(core, sizeof(float) * (size_t)T * nh * hd);
        size_t m = 0;   // rows compared, packed: every fourth query of the prefill
        for (int t = dec ? 0 : 3; t < T; t += dec ? 1 : 4, m++) {
            hk_attn_twin(gq + (size_t)(a + t) * pw, Kg, Vg, a + t, scores, ref + m * nh * hd, rlo + m * nh * hd, rhi + m * nh * hd);
            memmove(got + m * nh * hd, got + (size_t)t * nh * hd, sizeof(float) * nh * hd);
        }
        double err = hk_range_err(got, ref, rlo, rhi, m * nh * hd), us;
        HK_TIME(us, gpu_k_attention(&hk.k, hk.s, kv, projd + (size_t)a * pw * 4, posd + (size_t)a * 4, slotd + (size_t)a * 4, btd, bts, kc, vc, ks,
                                    vs, core, nh, kvh, hd, scale, 0, T, 1));
        int span = dec ? P : TP;   // positions read: the cache once
        // q and gate read, the output written, keys and values read once (+ fp8 scales), positions and slots
        double bytes = 8.0 * T * nh * hd + 4.0 * T * nh * hd + 2.0 * span * kvd * elem + (kv == GPU_KV_FP8 ? 8.0 * span * kvh : 0) + 8.0 * T;
        if (dec) snprintf(shape, sizeof shape, "T=1 at depth %d, %d/%d heads of %d", P, nh, kvh, hd);
        else snprintf(shape, sizeof shape, "T=%d from 0, %d/%d heads of %d", TP, nh, kvh, hd);
        hk_row(name, shape, gpu_kv_names[kv], err, HK_TOL_ATT, us, bytes);
        free(got);
    }
    // k_fa_w (k_fa's walk on wgmma) where the image has it, on prompts of the cache's first T positions from 0: every output
    // k_fa's bits (else the error is INFINITY), both times and TFLOP/s (2 · nh · hd · T² of causal products) — the data
    // for gpu_kernels.fa_w_min (forced on here: fa_w_min 1); HK_TIME's runs leave each kernel's outputs
    if (kv != GPU_KV_F32 && hk.k.fa_w_min && hk.k.parts == 1) {
        static const int Tw[] = {TP, 1024, 2048, P};
        CUdeviceptr c1 = hk_up(NULL, sizeof(float) * (size_t)P * nh * hd), c2 = hk_up(NULL, sizeof(float) * (size_t)P * nh * hd);
        const int keep = hk.k.fa_w_min;
        for (size_t i = 0; i < sizeof Tw / sizeof Tw[0]; i++) {
            const int T = Tw[i];
            double uf, uw;
            hk.k.fa_w_min = 0;
            HK_TIME(uf, gpu_k_attention(&hk.k, hk.s, kv, projd, posd, slotd, btd, bts, kc, vc, ks, vs, c1, nh, kvh, hd, scale, 0, T, 1));
            hk.k.fa_w_min = 1;
            const int took = gpu_fa_w_take(&hk.k, nh, kvh, hd, T, 1);
            HK_TIME(uw, gpu_k_attention(&hk.k, hk.s, kv, projd, posd, slotd, btd, bts, kc, vc, ks, vs, c2, nh, kvh, hd, scale, 0, T, 1));
            hk.k.fa_w_min = keep;
            float *g1 = hk_down(c1, sizeof(float) * (size_t)T * nh * hd), *g2 = hk_down(c2, sizeof(float) * (size_t)T * nh * hd);
            const int same = took && !memcmp(g1, g2, sizeof(float) * (size_t)T * nh * hd);
            const double fl = 2.0 * nh * hd * (double)T * T;
            snprintf(name, sizeof name, "k_fa_w_%s", gpu_kv_names[kv]);
            snprintf(shape, sizeof shape, "T=%d from 0: k_fa %.1f µs, %.1f TFLOP/s", T, uf, fl / (uf * 1e-6) / 1e12);
            hk_row(name, shape, gpu_kv_names[kv], same ? 0 : INFINITY, HK_TOL_ATT, uw, 2.0 * T * kvd * elem);
            printf("%-18s k_fa_w %.1f TFLOP/s, %s k_fa's bits\n", "", fl / (uw * 1e-6) / 1e12, same ? "bitwise equal to" : "NOT");
            free(g1), free(g2);
        }
    }
    // a prompt's last query (a row among the prefill's others, in its tile) and the same query alone
    // as a decode step (split over its chunks): the same bits, or the error is INFINITY
    {
        int a = TP - 1, nc = P / GPU_ATT_CHUNK;
        CUdeviceptr part = hk_up(NULL, sizeof(float) * (size_t)nh * nc * (hd + 2)), core2 = hk_up(NULL, sizeof(float) * (size_t)nh * hd);
        gpu_k_attention(&hk.k, hk.s, kv, projd, posd, slotd, btd, bts, kc, vc, ks, vs, core, nh, kvh, hd, scale, 0, TP, 1);
        gpu_k_attn_split(&hk.k, hk.s, kv, projd + (size_t)a * pw * 4, posd + (size_t)a * 4, slotd + (size_t)a * 4, btd, bts, kc, vc, ks, vs,
                         part, nc, core2, nh, kvh, hd, scale, 0, 1, TP);
        float *g1 = hk_down(core, sizeof(float) * (size_t)TP * nh * hd), *g2 = hk_down(core2, sizeof(float) * (size_t)nh * hd);
        hk_attn_twin(gq + (size_t)a * pw, Kg, Vg, a, scores, ref, rlo, rhi);
        double err = memcmp(g1 + (size_t)a * nh * hd, g2, sizeof(float) * (size_t)nh * hd) ? INFINITY : hk_range_err(g2, ref, rlo, rhi, (size_t)nh * hd);
        snprintf(name, sizeof name, "k_attn_split_%s", gpu_kv_names[kv]);
        snprintf(shape, sizeof shape, "T=1 at %d = row %d of the prefill", a, a);
        hk_row(name, shape, gpu_kv_names[kv], err, HK_TOL_ATT, NAN, 0);
        free(g1), free(g2);
    }
    // k_attn_part + k_attn_merge (a decode step: the query at P − 1, its P / GPU_ATT_CHUNK chunks in
    // parallel) against the twin, and the same bits as k_attention (else the error is INFINITY)
    {
        int a = P - 1, nc = P / GPU_ATT_CHUNK;
        CUdeviceptr part = hk_up(NULL, sizeof(float) * (size_t)nh * nc * (hd + 2)), core2 = hk_up(NULL, sizeof(float) * (size_t)nh * hd);
        gpu_k_attention(&hk.k, hk.s, kv, projd + (size_t)a * pw * 4, posd + (size_t)a * 4, slotd + (size_t)a * 4, btd, bts, kc, vc, ks, vs, core,
                        nh, kvh, hd, scale, 0, 1, 1);
        gpu_k_attn_split(&hk.k, hk.s, kv, projd + (size_t)a * pw * 4, posd + (size_t)a * 4, slotd + (size_t)a * 4, btd, bts, kc, vc, ks, vs,
                         part, nc, core2, nh, kvh, hd, scale, 0, 1, P);
        float *g1 = hk_down(core, sizeof(float) * (size_t)nh * hd), *g2 = hk_down(core2, sizeof(float) * (size_t)nh * hd);
        hk_attn_twin(gq + (size_t)a * pw, Kg, Vg, a, scores, ref, rlo, rhi);
        double err = memcmp(g1, g2, sizeof(float) * (size_t)nh * hd) ? INFINITY : hk_range_err(g2, ref, rlo, rhi, (size_t)nh * hd), us;
        HK_TIME(us, gpu_k_attn_split(&hk.k, hk.s, kv, projd + (size_t)a * pw * 4, posd + (size_t)a * 4, slotd + (size_t)a * 4, btd, bts, kc, vc,
                                     ks, vs, part, nc, core2, nh, kvh, hd, scale, 0, 1, P));
        snprintf(name, sizeof name, "k_attn_split_%s", gpu_kv_names[kv]);
        snprintf(shape, sizeof shape, "T=1 at depth %d, %d chunks, %d/%d heads", P, nc, nh, kvh);
        hk_row(name, shape, gpu_kv_names[kv], err, HK_TOL_ATT, us,
               12.0 * nh * hd + 2.0 * P * kvd * elem + (kv == GPU_KV_FP8 ? 8.0 * P * kvh : 0) + 8.0 * nh * nc * (hd + 2));
        free(g1), free(g2);
    }
    // k_attn_prep's times last: each launch rewrites q, k and the cache in place
    snprintf(name, sizeof name, "k_attn_prep_%s", gpu_kv_names[kv]);
    for (int i = 0; i < 2; i++) {
        double us;
        HK_TIME(us, HK_PREP(cut[2 * i], cut[2 * i + 1]));
        if (i) snprintf(shape, sizeof shape, "T=1 at position %d, %d/%d heads", P - 1, nh, kvh);
        else snprintf(shape, sizeof shape, "T=%d from position 0, %d/%d heads", TP, nh, kvh);
        hk_row(name, shape, gpu_kv_names[kv], err_prep[i], HK_TOL_SUM, us, bytes_prep[i]);
    }
#undef HK_PREP
    hk.r.kv_round = 0;
    free(proj), free(kk), free(vv), free(pos), free(slot), free(bt), free(gq), free(gk), free(gkc), free(gvc), free(gks), free(gvs);
    free(Kr), free(Vr), free(Kg), free(Vg), free(Kx), free(Vx), free(scores), free(ref), free(rlo), free(rhi);
    hk_reset();
}

// Whether section `name` runs: every one, or those HK_ONLY (a comma-separated list) names.
static int hk_want(const char *name) {
    const char *only = getenv("HK_ONLY");
    if (!only || !*only) return 1;
    size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)); p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

int main(void) {
    moet_err e = {{0}};
    if (gpu_open(&hk.dev, &e)) {
        printf("harness_kernels: no GPU: %s\n", e.msg);
        return 1;
    }
    gpu_describe(&hk.dev, stdout);
    ck_init_tables();
    hk.rng = 0x9e3779b97f4a7c15ull;
    if (ck_config_read(&hk.m.cfg, HK_CONFIG, &e)) moet_die("%s", e.msg);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (ref_init(&hk.r, &hk.m, 1, 4096, 512, cores > 1 ? (int)cores : 1, &e)) moet_die("%s", e.msg);
    if (gpu_kernels_load(&hk.k, &hk.dev, &e)) moet_die("%s", e.msg);
    const char *act = getenv("HK_ACT");
    if (act && strcmp(act, "bf16") && strcmp(act, "f32")) moet_die("HK_ACT=%s: bf16 or f32", act);
    hk.act = act && !strcmp(act, "bf16");
    hk.k.parts = hk.act ? 1 : GPU_MM_SPLITS, hk.r.act_bf16 = hk.act;
    const ck_config *c = &hk.m.cfg;
    gpu_kernel_smem(&hk.k, K_GDN_RULE, gpu_gdn_rule_smem(c->lk_dim, 1));
    // k_gdn_chunk's layout as the engine picks it; HK_GDN_LEAN=1 the lean one (what a 99 KiB block takes)
    const char *lean = getenv("HK_GDN_LEAN");
    hk.k.gdn_lean = lean && !strcmp(lean, "1") ? 1 : gpu_gdn_layout(hk.k.smem_optin, c->lk_dim) == 1;
    gpu_kernel_smem(&hk.k, K_GDN_CHUNK, gpu_gdn_chunk_smem_max(hk.k.smem_optin, c->lk_dim, hk.k.gdn_lean));
    gpu_kernel_smem(&hk.k, K_GDN_PREP, gpu_gdn_prep_smem(c->lk_dim));
    CU_CHECK(cu.cuStreamCreate(&hk.s, GPU_STREAM_NON_BLOCKING));
    for (int i = 0; i < HK_REPS; i++)
        for (int j = 0; j < 2; j++) CU_CHECK(cu.cuEventCreate(&hk.ev[i][j], 0));
    size_t fw = (size_t)HK_FLUSH_ROWS * HK_FLUSH_K, fx = (size_t)2 * GPU_MM_SPLITS * HK_FLUSH_K, fy = sizeof(float) * HK_FLUSH_ROWS;
    if (arena_init_kind(&hk.flush, "L2 flush", ARENA_DEVICE, fw + fx + fy + 3 * 256, &e) ||   // + the three takes' alignment
        arena_init_kind(&hk.d, "harness", ARENA_DEVICE, HK_SCRATCH, &e))
        moet_die("%s", e.msg);
    {   // the flush: y = W x over FP8 zeros (all written once here: nothing dirty is left by the reads)
        CUdeviceptr fb = (uintptr_t)arena_take(&hk.flush, fw, 256, "flush matrix");
        hk.flush_xs = (uintptr_t)arena_take(&hk.flush, fx, 256, "flush input");
        CUdeviceptr fyd = (uintptr_t)arena_take(&hk.flush, fy, 256, "flush output");
        CU_CHECK(cu.cuMemsetD8(fb, 0, fw));
        CU_CHECK(cu.cuMemsetD8(hk.flush_xs, 0, fx));
        memset(&hk.flush_set, 0, sizeof hk.flush_set);
        hk.flush_set.n = 1;
        hk.flush_set.W[0] = (gpu_mat){.w = fb, .row_bytes = HK_FLUSH_K, .kind = GPU_W_FP8, .rows = HK_FLUSH_ROWS, .cols = HK_FLUSH_K, .s = 1.f};
        hk.flush_set.y[0] = fyd, hk.flush_set.ldy[0] = HK_FLUSH_ROWS;
        CU_CHECK(cu.cuCtxSynchronize());
    }
    printf("Qwen3.6-35B-A3B shapes (%s): H %d, attention %d/%d heads of %d, GDN %d/%d heads of %d, %d experts top-%d of %d, vocab %d; "
           "median of %d launches, L2 flushed before each\n",
           HK_CONFIG, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->lk_heads, c->lv_heads, c->lk_dim, c->n_experts, c->topk,
           c->inter, c->vocab, HK_REPS);
    hk_copy();
    if (hk_want("embed")) hk_embed();
    if (hk_want("norm")) hk_norm();
    if (hk_want("linear")) hk_linear();
    if (hk_want("gemm")) hk_gemm();
    if (hk_want("router")) hk_router(), hk_route_fused();
    if (hk_want("experts")) hk_experts(CK_W_PLANES);
    if (hk_want("experts") && !hk_prompt_only()) hk_experts(CK_W_NVFP4);
    if (hk_want("combine")) hk_combine_silu();
    if (hk_want("argmax")) hk_argmax();
    if (hk_want("gdn")) {
        hk_gdn_conv();
        hk_gdn_rule(K_GDN_RULE, 1, 0);
        hk_gdn_rule(K_GDN_RULE, 512, 0);
        hk_gdn_rule(K_GDN_CHUNK, 512, 1);
        hk_gdn_rule(K_GDN_CHUNK, 2048, 1);    // one prompt's 32 pieces: 128 blocks, the walk's latency
        hk_gdn_rule(K_GDN_CHUNK, 4096, 16);   // 16 prompts of 256: 2,048 blocks, the occupancy

        hk_gated_norm();
    }
    if (hk_want("attention"))
        for (int kv = GPU_KV_F32; kv <= GPU_KV_FP8; kv++) hk_attention(kv);
    ref_free(&hk.r);
    arena_release(&hk.d);
    arena_release(&hk.flush);
    return check_report("harness_kernels");
}
