// tests/test_forward.c — the reference forward pass against transformers' float32 goldens.
//
// Fixtures (made by transformers 5.17 in float32 eager mode, see tests/fixtures/*/README.txt):
//   tiny  : H 128, 4 layers (1 attention), GQA 4, 16 experts top-4, shared width = routed width
//   check : H 192, 8 layers (2 attention), GQA 3, GDN key dim 32 ≠ value dim 48, 8 experts top-2,
//           shared width 128 ≠ routed 64, a 150-token prompt; bf16_split = per-expert 2-D experts
// Both variants bf16 (the stored bf16 values) and nvfp4 (NVFP4/FP8 dequantized exactly) must
// match every hidden state, the prefill logits, the greedy tokens and the decode logits.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"

// Error normalised by the golden's spread: max |a − b| / std(b). Both sides compute in float32
// from the same weight values; they differ only in summation order and in transformers'
// chunked (WY) form of the GDN prefill versus our recurrence, which is an exact reformulation
// up to rounding. Those differences grow with depth and prompt length, so each fixture has its
// own bound, about twice the worst error measured on it (hidden states, prefill and decode
// logits, every variant: bf16, nvfp4, planes):
//   tiny  (4 layers, 12-token prompt): measured 3.7e-6 .. 1.3e-5 → bound 2e-5
//   check (8 layers, 150-token prompt): measured 7.7e-6 .. 2.7e-5 → bound 4e-5
// A wrong equation shows up at 1e-2 or more; a sign error in the norms' epsilon (eps subtracted)
// gives 1.5e-5 .. 1.9e-5 on tiny and 2e-5 .. 6e-5 on check, which these bounds catch.
#define FWD_TOL_TINY 2e-5
#define FWD_TOL_CHECK 4e-5
static double fwd_tol(const char *fix) { return strstr(fix, "/check") ? FWD_TOL_CHECK : FWD_TOL_TINY; }

static const st_tensor *gold(const st_set *g, const char *name) {
    const st_tensor *t = st_find(g, name);
    CHECK(t != NULL, "golden tensor %s missing", name);
    return t;
}

static void run_variant(const char *fix, const char *model_sub, const char *tag, int router) {
    char dir[512], gpath[512], name[128];
    moet_err e = {{0}};
    snprintf(dir, sizeof dir, "%s/%s", fix, model_sub);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", fix);
    st_set g;
    ck_model m;
    if (st_open(&g, gpath, &e)) { CHECK(0, "%s", e.msg); return; }
    if (ck_open(&m, dir, &e)) { CHECK(0, "%s", e.msg); st_close(&g); return; }
    const ck_config *c = &m.cfg;
    int H = c->hidden, V = c->vocab, L = c->n_layers, Kt = c->topk;
    const st_tensor *pid = gold(&g, "prompt_ids");
    snprintf(name, sizeof name, "%s.greedy_ids", tag);
    const st_tensor *gid = gold(&g, name);
    if (!pid || !gid) goto out_ck;
    int T = (int)pid->numel, N = (int)gid->numel;
    const int32_t *ids = (const int32_t *)pid->data, *gids = (const int32_t *)gid->data;
    ref_engine r;
    if (ref_init(&r, &m, 2, T + N, T, 1, &e)) { CHECK(0, "%s", e.msg); goto out_ck; }
    float *logits = malloc(sizeof(float) * (size_t)T * V), *hid[MOET_MAX_LAYERS + 1];
    int32_t *rid[MOET_MAX_LAYERS];
    float *rw[MOET_MAX_LAYERS];
    for (int i = 0; i <= L; i++) hid[i] = malloc(sizeof(float) * (size_t)T * H);
    for (int i = 0; i < L; i++) { rid[i] = malloc(sizeof(int32_t) * (size_t)T * Kt); rw[i] = malloc(sizeof(float) * (size_t)T * Kt); }
    r.trace_ids = rid;
    r.trace_w = rw;
    int slot = 0, off[2] = {0, T};
    CHECK(ref_forward(&r, 1, &slot, ids, off, NULL, logits, 1, hid, &e) == 0, "%s", e.msg);
    const double FWD_TOL = fwd_tol(fix);
    double worst_h = 0, werr = 0;
    r.trace_ids = NULL;
    r.trace_w = NULL;
    for (int i = 0; i <= L; i++) {
        snprintf(name, sizeof name, "%s.hidden.%d", tag, i);
        const st_tensor *h = gold(&g, name);
        if (!h) continue;
        double err = check_nerr(hid[i], (const float *)h->data, h->numel);
        if (err > worst_h) worst_h = err;
        CHECK(err < FWD_TOL, "%s %s: normalised error %.3g", fix, name, err);
    }
    snprintf(name, sizeof name, "%s.prefill_logits", tag);
    const st_tensor *pl = gold(&g, name);
    double perr = pl ? check_nerr(logits, (const float *)pl->data, pl->numel) : 1;
    CHECK(perr < FWD_TOL, "%s %s: normalised error %.3g", fix, name, perr);
    if (router) {
        // router choices: the same experts in the same order (by weight), weights to f32 rounding
        int bad = 0;
        for (int l = 0; l < L; l++) {
            snprintf(name, sizeof name, "%s.router_ids.%d", tag, l);
            const st_tensor *ri = gold(&g, name);
            snprintf(name, sizeof name, "%s.router_weights.%d", tag, l);
            const st_tensor *rwt = gold(&g, name);
            if (!ri || !rwt) continue;
            for (size_t i = 0; i < ri->numel; i++) {
                bad += rid[l][i] != ((const int32_t *)ri->data)[i];
                double d = fabs(rw[l][i] - ((const float *)rwt->data)[i]);
                if (d > werr) werr = d;
            }
        }
        CHECK(bad == 0, "%s: %d router choices differ", fix, bad);
        // weights are O(0.1-1), computed from the router logits, which carry the hidden state's
        // error (above): measured 1.5e-6 (tiny) and 6.3e-6 (check) → bound 1e-5
        CHECK(werr < 1e-5, "%s: router weight error %.3g", fix, werr);
    }
    // greedy decode from the cache, one token at a time
    snprintf(name, sizeof name, "%s.decode_logits", tag);
    const st_tensor *dl = gold(&g, name);
    int next = moet_argmax(logits + (size_t)(T - 1) * V, V), same = 1;
    double derr = 0;
    float *dlog = malloc(sizeof(float) * V);
    for (int s = 0; s < N && dl; s++) {
        same &= next == gids[s];
        int o1[2] = {0, 1};
        int32_t feed = gids[s];   // the golden token, so one divergence does not cascade
        if (ref_forward(&r, 1, &slot, &feed, o1, NULL, dlog, 1, NULL, &e)) CHECK(0, "%s", e.msg);
        double de = check_nerr(dlog, (const float *)dl->data + (size_t)s * V, V);
        if (de > derr) derr = de;
        next = moet_argmax(dlog, V);
    }
    CHECK(same, "%s %s: greedy tokens differ", fix, tag);
    CHECK(derr < FWD_TOL, "%s %s decode logits: normalised error %.3g", fix, tag, derr);
    printf("%s/%s: prefill %.2g, hidden %.2g, decode %.2g (normalised max error; bound %.2g); router weights %.2g (absolute)\n",
           fix, model_sub, perr, worst_h, derr, FWD_TOL, werr);

    // decode-vs-prefill: the prompt fed one token at a time (slot 1) gives the prefill logits,
    // bit for bit: every op is computed per token in the same order either way.
    ref_reset(&r, 1);
    int exact = 1;
    for (int t = 0; t < T; t++) {
        int s1 = 1, o1[2] = {0, 1};
        if (ref_forward(&r, 1, &s1, ids + t, o1, NULL, dlog, 1, NULL, &e)) CHECK(0, "%s", e.msg);
        exact &= !memcmp(dlog, logits + (size_t)t * V, sizeof(float) * V);
    }
    CHECK(exact, "%s: token-by-token logits differ from the prefill logits", fix);
    // batch invariance: two sequences in one step (a chunk of slot 0 beside a chunk of slot 1)
    // give each the logits it gets alone
    ref_reset(&r, 0);
    ref_reset(&r, 1);
    {
        int k = T / 3, slots2[2] = {0, 1}, o2[3] = {0, k, k + (T - k)};
        int32_t *both = malloc(sizeof(int32_t) * (size_t)T);
        float *two = malloc(sizeof(float) * 2 * (size_t)V);
        memcpy(both, ids, sizeof(int32_t) * k);          // slot 0: the first k tokens
        memcpy(both + k, ids, sizeof(int32_t) * (T - k)); // slot 1: the first T−k tokens
        CHECK(ref_forward(&r, 2, slots2, both, o2, NULL, two, 0, NULL, &e) == 0, "%s", e.msg);
        CHECK(!memcmp(two, logits + (size_t)(k - 1) * V, sizeof(float) * V), "%s: batched row 0 differs", fix);
        CHECK(!memcmp(two + V, logits + (size_t)(T - k - 1) * V, sizeof(float) * V), "%s: batched row 1 differs", fix);
        free(both);
        free(two);
    }
    free(dlog);
    for (int i = 0; i <= L; i++) free(hid[i]);
    for (int i = 0; i < L; i++) { free(rid[i]); free(rw[i]); }
    free(logits);
    ref_free(&r);
out_ck:
    ck_close(&m);
    st_close(&g);
}

// The worker threads split output rows; every element is computed by one thread in the same
// order, so 1 and 3 threads give the same bits.
static void thread_invariance(const char *dir) {
    ck_model m;
    moet_err e = {{0}};
    if (ck_open(&m, dir, &e)) { CHECK(0, "%s", e.msg); return; }
    int T = 40, V = m.cfg.vocab, slot = 0, off[2] = {0, T};
    int32_t ids[40];
    for (int t = 0; t < T; t++) ids[t] = (t * 37 + 11) % V;
    float *a = malloc(sizeof(float) * (size_t)T * V), *b = malloc(sizeof(float) * (size_t)T * V);
    ref_engine r1, r3;
    CHECK(ref_init(&r1, &m, 1, T, T, 1, &e) == 0 && ref_init(&r3, &m, 1, T, T, 3, &e) == 0, "%s", e.msg);
    CHECK(r3.n_workers == 2, "workers started: %d", r3.n_workers);
    CHECK(ref_forward(&r1, 1, &slot, ids, off, NULL, a, 1, NULL, &e) == 0, "%s", e.msg);
    CHECK(ref_forward(&r3, 1, &slot, ids, off, NULL, b, 1, NULL, &e) == 0, "%s", e.msg);
    CHECK(!memcmp(a, b, sizeof(float) * (size_t)T * V), "%s: 3 threads differ from 1", dir);
    ref_free(&r1);
    ref_free(&r3);
    free(a);
    free(b);
    ck_close(&m);
}

// The command line as a user runs it: moet run --ids-file … --out, compared with the goldens
// (prompt in uneven chunks, two threads: neither may change a result).
static void cli_run(const char *fix, const char *sub, const char *tag) {
    char gpath[512], ids_path[] = "/tmp/moet_ids_XXXXXX", out_path[] = "/tmp/moet_out_XXXXXX", cmd[2048], name[128];
    moet_err e = {{0}};
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", fix);
    st_set g, o;
    if (st_open(&g, gpath, &e)) { CHECK(0, "%s", e.msg); return; }
    const st_tensor *pid = st_find(&g, "prompt_ids");
    snprintf(name, sizeof name, "%s.greedy_ids", tag);
    const st_tensor *gid = st_find(&g, name);
    int fd = mkstemp(ids_path), fo = mkstemp(out_path);
    MOET_ASSERT(fd >= 0 && fo >= 0 && pid && gid, "temp files, golden");
    close(fo);
    FILE *f = fdopen(fd, "w");
    fputc('[', f);
    for (size_t i = 0; i < pid->numel; i++) fprintf(f, "%s%d", i ? ", " : "", ((const int32_t *)pid->data)[i]);
    fputs("]\n", f);
    fclose(f);
    // MOET_RUN_BACKEND=gpu (./build.sh test-gpu): the same command on the GPU, its KV cache in f32
    // (the reference's precision, so the same bound holds), in chunks of 64 (its cut alignment)
    const char *be = getenv("MOET_RUN_BACKEND");
    int gpu = be && !strcmp(be, "gpu");
    char err_path[] = "/tmp/moet_err_XXXXXX";
    int fe = mkstemp(err_path);
    MOET_ASSERT(fe >= 0, "temp file");
    close(fe);
    snprintf(cmd, sizeof cmd, "./moet run --model %s/%s --ids-file %s --greedy %zu --out %s --dump-hidden --chunk %d --threads 2 "
             "--backend %s --kv-dtype f32 2>%s", fix, sub, ids_path, gid->numel, out_path, gpu ? 64 : 33, be ? be : "cpu", err_path);
    CHECK(system(cmd) == 0, "%s", cmd);
    {   // the backend that ran, as moet run says on stderr: never a silent fallback to the other one
        static char log[1 << 16];
        FILE *lf = fopen(err_path, "r");
        size_t got = lf ? fread(log, 1, sizeof log - 1, lf) : 0;
        log[got] = 0;
        if (lf) fclose(lf);
        const char *want = gpu ? "moet run: backend gpu (" : "moet run: backend cpu (";
        CHECK(strstr(log, want) != NULL, "%s: stderr lacks \"%s\": %s", cmd, want, log);
        unlink(err_path);
    }
    // on the GPU (f32 KV cache) the same bound per fixture (its own summation order against
    // transformers': tiny measured ≤ 8e-6 here, see test_gpu.c's GPU_TOL_F32_*)
    const double FWD_TOL = fwd_tol(fix);
    if (st_open(&o, out_path, &e)) { CHECK(0, "%s", e.msg); goto out; }
    const char *names[] = {"prefill_logits", "decode_logits", "hidden.0", "hidden.2", "hidden.4"};
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "%s.%s", tag, names[i]);
        const st_tensor *a = st_find(&o, names[i]), *b = st_find(&g, name);
        CHECK(a && b && a->numel == b->numel, "%s: %s present with the golden's size", out_path, names[i]);
        if (a && b && a->numel == b->numel) {
            double err = check_nerr((const float *)a->data, (const float *)b->data, a->numel);
            CHECK(err < FWD_TOL, "moet run --out %s: normalised error %.3g", names[i], err);
            printf("moet run --backend %s %s/%s: %s normalised error %.2g (bound %.2g)\n", be ? be : "cpu", fix, sub, names[i], err, FWD_TOL);
        }
    }
    const st_tensor *gi = st_find(&o, "greedy_ids");
    CHECK(gi && gi->numel == gid->numel && !memcmp(gi->data, gid->data, gid->bytes), "moet run --out: greedy ids");
    st_close(&o);
out:
    unlink(ids_path);
    unlink(out_path);
    st_close(&g);
}

// The reference's KV rounding (ref_kv_round, what the GPU's bf16 / fp8 caches store and what
// test_gpu.c compares them with) on values worked out by hand: bf16 rounds to nearest, ties to
// even (a tie is half a bf16 step: 2^-8 above 1); e4m3 with the head's scale amax / 448 (here
// 3.5 / 448 = 2^-7 exactly, so x·448/amax is exact) rounds to nearest even among 3 mantissa bits
// (step 4 in [32, 64)), with subnormal steps of 2^-9 below 2^-6.
static void kv_round_unit(void) {
    float b[6] = {1 + 0x1p-8f, 1 + 3 * 0x1p-8f, 1 + 0x1p-8f + 0x1p-20f, -(1 + 3 * 0x1p-8f), 1 + 0x1p-9f, 3.0f};
    const float bw[6] = {1.0f, 1 + 0x1p-6f, 1 + 0x1p-7f, -(1 + 0x1p-6f), 1.0f, 3.0f};
    ref_kv_round(b, 6, GPU_KV_BF16);
    int ok = 1;
    for (int i = 0; i < 6; i++) ok &= b[i] == bw[i];
    CHECK(ok, "bf16 KV rounding: %a %a %a %a %a %a", b[0], b[1], b[2], b[3], b[4], b[5]);
    // the head: 3.5 (the amax, 448 · 2^-7), -1 (128), 0.3 (38.4 → 40), 34 · 2^-7 (a tie: 32),
    // 38 · 2^-7 (a tie: 40), 0.01 · 2^-7 (subnormal 5.12 steps → 5), 0
    float f[7] = {3.5f, -1.0f, 0.3f, 34 * 0x1p-7f, 38 * 0x1p-7f, 0.01f * 0x1p-7f, 0.0f};
    const float fw[7] = {3.5f, -1.0f, 40 * 0x1p-7f, 32 * 0x1p-7f, 40 * 0x1p-7f, 5 * 0x1p-9f * 0x1p-7f, 0.0f};
    ref_kv_round(f, 7, GPU_KV_FP8);
    ok = 1;
    for (int i = 0; i < 7; i++) ok &= f[i] == fw[i];
    CHECK(ok, "fp8 KV rounding: %a %a %a %a %a %a %a", f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
    float z[3] = {0.25f, -7.0f, 1e-3f};
    ref_kv_round(z, 3, GPU_KV_F32);
    CHECK(z[0] == 0.25f && z[1] == -7.0f && z[2] == 1e-3f, "an f32 cache keeps its values");
}

// ref_attn_fa1 with an fp8 cache rounds p times the value row's scale (recovered as the row's
// largest magnitude / 448) and multiplies the codes: (a) where every row's scale is a power of two
// the scaling commutes with the rounding, so the output is, bit for bit, the one that rounds p alone
// (fp8 off); (b) with the scales of ref_kv_round on random rows it is not, and it stays within p's
// rounding of the plain softmax (as attn_fa1_unit's bound); (c) its range (lo, hi) holds o, and is o
// itself at eps 0.
static void attn_fa1_fp8_unit(void) {
    enum { P = 300, HD = 64, KVD = HD };
    float *K = malloc(sizeof(float) * (P + 1) * KVD), *V = malloc(sizeof(float) * (P + 1) * KVD), *V2 = malloc(sizeof(float) * (P + 1) * KVD);
    float q[HD], sc[P + 1];
    double o8[HD], o1[HD], lo[HD], hi[HD], pl[HD];
    uint32_t st = 4242;
#define FA8_U() (st = st * 1664525u + 1013904223u, (float)(st >> 8) / 16777216.0f - 0.5f)
    for (int d = 0; d < HD; d++) q[d] = ref_bf16_round(FA8_U() * 4.0f);
    for (int i = 0; i < (P + 1) * KVD; i++) K[i] = ref_bf16_round(FA8_U() * 4.0f), V2[i] = FA8_U() * 3.0f;
    for (int tau = 0; tau <= P; tau++) {   // (a) codes times 2^-6, each row's first code 448
        for (int d = 0; d < HD; d++) V[(size_t)tau * KVD + d] = ref_e4m3_round(FA8_U() * 800.0f) * 0x1p-6f;
        V[(size_t)tau * KVD] = 448.0f * 0x1p-6f;
        ref_kv_round(V2 + (size_t)tau * KVD, HD, GPU_KV_FP8);   // (b)
    }
    ref_attn_fa1(q, K, V, P, KVD, 0, HD, 0.125f, 1, sc, o8, 0, NULL, NULL);
    ref_attn_fa1(q, K, V, P, KVD, 0, HD, 0.125f, 0, sc, o1, 0, NULL, NULL);
    CHECK(!memcmp(o8, o1, sizeof o8), "ref_attn_fa1 fp8 with power-of-two scales: not the bits of p's rounding alone");
    ref_attn_fa1(q, K, V2, P, KVD, 0, HD, 0.125f, 1, sc, o8, 0x1p-14, lo, hi);
    ref_attn_fa1(q, K, V2, P, KVD, 0, HD, 0.125f, 0, sc, o1, 0, NULL, NULL);
    double mean = 0, var = 0, diff = 0, err = 0, out = 0, width = 0;
    {   // the plain softmax of the same query
        double M = -INFINITY, L = 0;
        for (int tau = 0; tau <= P; tau++) M = fmax(M, sc[tau]);
        for (int d = 0; d < HD; d++) pl[d] = 0;
        for (int tau = 0; tau <= P; tau++) {
            const double w = exp(sc[tau] - M);
            L += w;
            for (int d = 0; d < HD; d++) pl[d] += w * V2[(size_t)tau * KVD + d];
        }
        for (int d = 0; d < HD; d++) pl[d] /= L, mean += pl[d] / HD;
    }
    for (int d = 0; d < HD; d++) {
        var += (pl[d] - mean) * (pl[d] - mean) / HD, diff = fmax(diff, fabs(o8[d] - o1[d])), err = fmax(err, fabs(o8[d] - pl[d]));
        out = fmax(out, fmax(lo[d] - o8[d], o8[d] - hi[d])), width = fmax(width, hi[d] - lo[d]);
    }
    const double sd = sqrt(var);
    CHECK(diff > 0, "ref_attn_fa1 fp8 with ref_kv_round's scales: the same as p's rounding alone (the scale not in the rounding)");
    CHECK(err / sd < 5e-2, "ref_attn_fa1 fp8: %.3g of the spread from the plain softmax (p's bf16 rounding: < 5e-2)", err / sd);
    CHECK(out <= 0, "ref_attn_fa1 fp8: o outside its own range by %.3g", out);
    ref_attn_fa1(q, K, V2, P, KVD, 0, HD, 0.125f, 1, sc, o1, 0, lo, hi);
    CHECK(!memcmp(lo, o1, sizeof lo) && !memcmp(hi, o1, sizeof hi), "ref_attn_fa1 fp8: the range at eps 0 is not o itself");
    printf("ref_attn_fa1 fp8 (%d positions): %.3g of the spread from the plain softmax, %.3g from rounding p alone; range at eps 2^-14 %.3g wide\n",
           P + 1, err / sd, diff / sd, width / sd);
#undef FA8_U
    free(K), free(V), free(V2);
}

// The reference's bf16 product inputs (`--act-dtype bf16`: ref_linear with act_bf16). The tiny
// model's lm_head (BF16 [vocab, 128]: a matrix the GPU takes on its tensor cores) over 200 tokens
// of inputs whose mantissas bf16 cannot hold, on three threads: exactly ref_linear_f32 of the
// inputs rounded to bf16 (so the runs of the rounding buffer change nothing), and not its product
// of the inputs as they are; a view of it 100 columns wide (not a multiple of 64: the GPU's
// k_linear, f32) and act_bf16 off keep the inputs as they are.
// The twin of the one-part k_fa (ref_attn_core with act_bf16 and a rounded cache: ref_attn_fa1) over
// 700 positions (three chunks of GPU_ATT_CHUNK, a partial tile of GPU_FA_KT): (a) with every score
// equal every p is 1 (exact in bf16) and the output is the mean of the values, whatever the tiles and
// chunks — what a fold dropping or double-counting keys would not give; (b) on random inputs it is
// the plain softmax's of the rounded query within what p's bf16 rounding moves (2^-9 relative a
// weight: emulated 1.6e-2 of the outputs' spread at most → 5e-2), and not equal to it.
static void attn_fa1_unit(void) {
    ck_model m;
    moet_err e = {{0}};
    if (ck_open(&m, "tests/fixtures/tiny/bf16", &e)) { CHECK(0, "%s", e.msg); return; }
    const ck_config *c = &m.cfg;
    enum { P = 700 };
    const int hd = c->head_dim, nh = c->n_heads, kvd = c->n_kv_heads * hd;
    ref_engine r;
    if (ref_init(&r, &m, 1, P + 1, 4, 1, &e)) { CHECK(0, "%s", e.msg); ck_close(&m); return; }
    float *qg = malloc(sizeof(float) * 2 * nh * hd), *K = malloc(sizeof(float) * (P + 1) * kvd), *V = malloc(sizeof(float) * (P + 1) * kvd);
    float *sc = malloc(sizeof(float) * (P + 1)), *a = malloc(sizeof(float) * nh * hd), *b = malloc(sizeof(float) * nh * hd);
    uint32_t st = 777;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 2 * nh * hd; i++) {
            st = st * 1664525u + 1013904223u;
            qg[i] = ref_bf16_round(((float)(st >> 8) / 16777216.0f - 0.5f) * 4.0f);
        }
        for (int i = 0; i < (P + 1) * kvd; i++) {
            st = st * 1664525u + 1013904223u;
            K[i] = pass ? ref_bf16_round(((float)(st >> 8) / 16777216.0f - 0.5f) * 4.0f) : 1.0f;   // pass 0: every key alike
            st = st * 1664525u + 1013904223u;
            V[i] = ref_bf16_round(((float)(st >> 8) / 16777216.0f - 0.5f) * 2.0f);
        }
        r.act_bf16 = 1, r.kv_round = GPU_KV_BF16;
        ref_attn_core(&r, qg, K, V, P, sc, a);
        r.act_bf16 = 0, r.kv_round = 0;
        ref_attn_core(&r, qg, K, V, P, sc, b);   // (the query is bf16 already: the same function without p's rounding)
        double mean = 0, var = 0, err = 0;
        for (int i = 0; i < nh * hd; i++) mean += b[i] / (nh * hd);
        for (int i = 0; i < nh * hd; i++) var += (b[i] - mean) * (b[i] - mean) / (nh * hd), err = fmax(err, fabs((double)a[i] - b[i]));
        const double nerr = err / sqrt(var);
        if (pass == 0) CHECK(nerr < 1e-5, "ref_attn_fa1 with every p 1: %.3g of the spread from the plain softmax (the mean of the values)", nerr);
        else CHECK(nerr > 0 && nerr < 5e-2, "ref_attn_fa1 on random inputs: %.3g of the spread from the plain softmax (p's bf16 rounding: < 5e-2, > 0)", nerr);
        printf("ref_attn_fa1 (%s, %d positions): %.3g of the outputs' spread from the plain softmax\n", pass ? "random" : "every score alike", P + 1, nerr);
    }
    free(qg), free(K), free(V), free(sc), free(a), free(b);
    ref_free(&r);
    ck_close(&m);
}

static void act_bf16_unit(void) {
    ck_model m;
    moet_err e = {{0}};
    if (ck_open(&m, "tests/fixtures/tiny/bf16", &e)) { CHECK(0, "%s", e.msg); return; }
    enum { T = 200 };
    const ck_mat *W = &m.lm_head;
    const int K = W->cols, V = W->rows;
    ref_engine r;
    if (ref_init(&r, &m, 1, T, T, 3, &e)) { CHECK(0, "%s", e.msg); ck_close(&m); return; }
    CHECK(ref_tensor_core(W) && K == 128 && (size_t)T * K > r.xr_floats, "the lm_head [%d, %d] in runs of %zu floats", V, K, r.xr_floats);
    float *x = malloc(sizeof(float) * T * K), *xr = malloc(sizeof(float) * T * K);
    float *a = malloc(sizeof(float) * (size_t)T * V), *b = malloc(sizeof(float) * (size_t)T * V), *c = malloc(sizeof(float) * (size_t)T * V);
    uint32_t st = 12345;
    for (int i = 0; i < T * K; i++) {
        st = st * 1664525u + 1013904223u;
        x[i] = ((float)(st >> 8) / 16777216.0f - 0.5f) * 3.0f + 0x1p-12f;   // 24-bit mantissas
        xr[i] = ref_bf16_round(x[i]);
    }
    r.act_bf16 = 1;
    ref_linear(&r, W, x, K, T, a, V);
    ref_linear_f32(&r, W, xr, K, T, b, V);
    ref_linear_f32(&r, W, x, K, T, c, V);
    CHECK(!memcmp(a, b, sizeof(float) * (size_t)T * V), "act bf16: not the product of the rounded inputs");
    CHECK(memcmp(a, c, sizeof(float) * (size_t)T * V) != 0, "act bf16: the inputs were not rounded");
    ck_mat W100 = *W;
    W100.cols = 100;
    CHECK(!ref_tensor_core(&W100), "100 columns taken as a tensor-core product");
    ref_linear(&r, &W100, x, K, T, a, V);
    ref_linear_f32(&r, &W100, x, K, T, c, V);
    CHECK(!memcmp(a, c, sizeof(float) * (size_t)T * V), "act bf16 rounded a product the GPU keeps in f32");
    r.act_bf16 = 0;
    ref_linear(&r, W, x, K, T, a, V);
    ref_linear_f32(&r, W, x, K, T, c, V);
    CHECK(!memcmp(a, c, sizeof(float) * (size_t)T * V), "act f32 rounded its inputs");
    free(x), free(xr), free(a), free(b), free(c);
    ref_free(&r);
    ck_close(&m);
}

int main(void) {
    kv_round_unit();
    act_bf16_unit();
    attn_fa1_unit();
    attn_fa1_fp8_unit();
    cli_run("tests/fixtures/tiny", "nvfp4", "nvfp4");
    thread_invariance("tests/fixtures/check/nvfp4");
    run_variant("tests/fixtures/tiny", "bf16", "bf16", 1);
    run_variant("tests/fixtures/tiny", "nvfp4", "nvfp4", 0);
    run_variant("tests/fixtures/check", "bf16_split", "bf16", 1);
    run_variant("tests/fixtures/check", "nvfp4", "nvfp4", 0);
    return check_report("test_forward");
}
