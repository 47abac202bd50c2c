// tests/test_eval.c — moet eval on the bundled demo model (NVFP4 experts, and build/demo.planes)
// over a small text set written for this test (tests/fixtures/eval/text.jsonl: text lines,
// two conversations, one line long enough to be cut into windows).
//
// Expected values are computed here from the reference forward pass (ref_forward over each
// line or window on its own, logits of every position) with this file's own float64
// log-softmax, tokens chosen by this file's own rules: nothing is taken from eval's code paths
// but the model and the tokenizer.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"

#define DEMO "tests/fixtures/demo"
#define PLANES "build/demo.planes"
#define TEXT "tests/fixtures/eval/text.jsonl"
#define HELDOUT "tests/fixtures/eval/heldout.jsonl"   // the demo model's held-out docstrings (its README's perplexities)
#define N_LINES 5

// Perplexities here and in eval come from the same float32 logits (the forward pass is batch-
// and chunk-invariant bit for bit); only the order in which float64 log-probabilities are added
// differs. Over fewer than 10^4 terms of magnitude < 30 that moves the sum by < 1e-10
// relative; 1e-9 leaves room and still catches one token scored twice or left out (> 1e-4).
#define PPL_TOL 1e-9

// The two conversations rendered by the Qwen3.6 template without a generation prompt, written
// out by hand, with the assistant bodies that must be scored ("<think>" block only on the turn
// after the last user message, as the template keeps reasoning only there).
static const char *const conv_text[2] = {
    "<|im_start|>user\nWhat does tally.clamp do?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    "Clamp a value to the closed interval [lo, hi].<|im_end|>\n",
    "<|im_start|>system\nYou write docstrings.<|im_end|>\n<|im_start|>user\nExplain tally.parse.<|im_end|>\n"
    "<|im_start|>assistant\nParse a string into a list of tokens.<|im_end|>\n<|im_start|>user\nAnd tally.join?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\nJoin tokens with a separator.\n\n:param sep: The separator.\n:rtype: str"
    "<|im_end|>\n"};
static const char *const conv_body[2][2] = {
    {"<think>\n\n</think>\n\nClamp a value to the closed interval [lo, hi].<|im_end|>", NULL},
    {"Parse a string into a list of tokens.<|im_end|>",
     "<think>\n\n</think>\n\nJoin tokens with a separator.\n\n:param sep: The separator.\n:rtype: str<|im_end|>"}};

static tok T;
static ck_model M_nv, M_pl;
static int V;

// Every line's tokens and scored positions, as this test sees them.
static int32_t line_ids[N_LINES][4096];
static uint8_t line_scored[N_LINES][4096];
static int line_n[N_LINES];

static char *read_file(const char *path, size_t *n) {
    moet_err e;
    char *s = arena_read_small(path, 1 << 24, n, &e);
    MOET_ASSERT(s, "%s", e.msg);
    return s;
}

static void write_file(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    MOET_ASSERT(f && fwrite(s, 1, n, f) == n && fclose(f) == 0, "writing %s", path);
}

static int encode(const char *s, size_t n, int32_t *ids, size_t cap) {
    static tok_scratch sc;
    static arena mem;
    moet_err e;
    if (!sc.max_text) MOET_ASSERT(tok_scratch_init(&sc, &mem, 1 << 16, &e) == 0, "%s", e.msg);
    size_t k;
    MOET_ASSERT(tok_encode(&T, &sc, s, n, ids, cap, &k, &e) == 0, "%s", e.msg);
    return (int)k;
}

// Text lines: every token after the first. Conversations: the tokens of the whole rendered text
// whose bytes lie inside an assistant body (offsets from the decoded pieces: the text is ASCII,
// so the tokens' bytes add up to it exactly).
static void expected_lines(void) {
    size_t n;
    char *data = read_file(TEXT, &n);
    js_doc d;
    moet_err e;
    char *line = data;
    for (int i = 0; i < N_LINES; i++) {
        char *nl = strchr(line, '\n');
        MOET_ASSERT(nl, "line %d", i + 1);
        MOET_ASSERT(js_load_doc(&d, line, (size_t)(nl - line), "line", &e) == 0, "%s", e.msg);
        const js_node *tx = js_get(&d, js_root(&d), "text");
        int conv = i == 2 ? 0 : i == 3 ? 1 : -1;
        const char *s = tx ? tx->str : conv_text[conv];
        size_t len = tx ? tx->len : strlen(s);
        CHECK((tx != NULL) == (conv < 0), "line %d: the test's view of the file is out of date", i + 1);
        line_n[i] = encode(s, len, line_ids[i], 4096);
        size_t at = 0;
        for (int t = 0; t < line_n[i]; t++) {
            size_t tl = T.entries[line_ids[i][t]].len;
            int in = conv < 0;
            for (int b = 0; conv >= 0 && b < 2 && conv_body[conv][b]; b++) {
                const char *p = strstr(s, conv_body[conv][b]);
                MOET_ASSERT(p, "body %d of conversation %d", b, conv);
                size_t b0 = (size_t)(p - s), b1 = b0 + strlen(conv_body[conv][b]);
                in |= at >= b0 && at + tl <= b1;
            }
            line_scored[i][t] = t > 0 && in;
            at += tl;
        }
        CHECK(at == len, "line %d: token bytes %zu, text %zu", i + 1, at, len);
        js_free_doc(&d);
        line = nl + 1;
    }
    arena_sys_free(data, n + 1);
}

// log p(y) from one logits row, in float64.
static double logprob(const float *row, int y) {
    double mx = row[0], s = 0;
    for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    for (int v = 0; v < V; v++) s += exp(row[v] - mx);
    return row[y] - mx - log(s);
}

// Runs every window of every line on a fresh slot (ctx, stride as Hugging Face's loop) and adds
// up log p of the scored targets: returns Σ log p, *count the targets. With lp (ctx large: one
// window per line), also the full log-softmax rows of the scored targets, [count, V].
static double forward_sum(const ck_model *m, int ctx, int stride, int64_t *count, double *lp) {
    ref_engine r;
    moet_err e;
    MOET_ASSERT(ref_init(&r, m, 1, 4096, 4096, 1, &e) == 0, "%s", e.msg);
    float *logits = malloc(sizeof(float) * 4096 * (size_t)V);
    double sum = 0;
    *count = 0;
    for (int i = 0; i < N_LINES; i++) {
        int n = line_n[i];
        for (int b = 0, prev_end = 0;; b += stride) {
            int end = b + ctx < n ? b + ctx : n, slot = 0, off[2] = {0, end - b};
            ref_reset(&r, 0);
            MOET_ASSERT(ref_forward(&r, 1, &slot, line_ids[i] + b, off, NULL, logits, 1, NULL, &e) == 0, "%s", e.msg);
            for (int p = (prev_end > b + 1 ? prev_end : b + 1); p < end; p++) {
                if (!line_scored[i][p]) continue;
                const float *row = logits + (size_t)(p - 1 - b) * V;
                sum += logprob(row, line_ids[i][p]);
                if (lp) {
                    double mx = row[0], s = 0;
                    for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
                    for (int v = 0; v < V; v++) s += exp(row[v] - mx);
                    for (int v = 0; v < V; v++) lp[(size_t)*count * V + v] = row[v] - mx - log(s);
                }
                ++*count;
            }
            prev_end = end;
            if (end == n) break;
        }
    }
    free(logits);
    ref_free(&r);
    return sum;
}

static eval_opts opts(const char *data) {
    eval_opts o = {0};
    o.model = DEMO;
    o.data = data;
    o.max_seqs = 8;
    o.max_batch_tokens = 512;
    o.threads = 1;
    o.backend = "cpu";   // the exact float64 sums below are the reference's
    o.top_k = 32;
    return o;
}

static int run(const eval_opts *o, eval_result *res, moet_err *e) {
    memset(e, 0, sizeof *e);
    return eval_main(o, res, e);
}

// eval's own tokens and targets (eval_prepare) are exactly the test's.
static void test_tokens(void) {
    static eval_ctx E;
    eval_opts o = opts(TEXT);
    moet_err e = {{0}};
    CHECK(eval_prepare(&E, &o, &M_nv.cfg, &T, &e) == 0, "%s", e.msg);
    int64_t at = 0, bad = 0, n_scored = 0;
    for (int i = 0; i < N_LINES; i++) {
        for (int t = 0; t < line_n[i]; t++) {
            bad += E.ids[at + t] != line_ids[i][t] || E.mask[at + t] != line_scored[i][t];
            n_scored += line_scored[i][t];
        }
        at += line_n[i];
    }
    CHECK(at == E.n_tok && bad == 0, "%" PRId64 " tokens differ (%" PRId64 " vs %" PRId64 " tokens)", bad, at, E.n_tok);
    CHECK(E.n_scored == n_scored && E.n_windows == N_LINES, "%" PRId64 " scored in %" PRId64 " windows", E.n_scored, E.n_windows);
    eval_release(&E);
}

static double *lp_nv, *lp_pl;   // [N, V] full log-softmax rows of every scored target, per model

static void test_ppl_and_refs(void) {
    int64_t n_nv, n_pl;
    double s_nv = forward_sum(&M_nv, 4096, 2048, &n_nv, lp_nv), s_pl = forward_sum(&M_pl, 4096, 2048, &n_pl, lp_pl);
    double want_nv = exp(-s_nv / n_nv), want_pl = exp(-s_pl / n_pl);
    eval_result a, b, c, d;
    moet_err e;

    // the NVFP4 experts, saving a top-8 reference
    eval_opts o = opts(TEXT);
    o.save_ref = "build/evaltest.k8.ref";
    o.top_k = 8;
    CHECK(run(&o, &a, &e) == 0, "%s", e.msg);
    CHECK(a.tokens == n_nv && fabs(a.ppl / want_nv - 1) < PPL_TOL, "perplexity %.15g over %" PRId64 " tokens, the float64 sum gives %.15g over %" PRId64,
          a.ppl, a.tokens, want_nv, n_nv);
    CHECK(fabs(a.nll - (-s_nv / n_nv)) < PPL_TOL, "mean NLL %.15g, expected %.15g", a.nll, -s_nv / n_nv);
    CHECK(a.lines == N_LINES && a.skipped == 0 && a.windows == N_LINES && a.ppl_se > 0, "lines %" PRId64, a.lines);

    // the same run against its own reference, batched differently (3 windows, 40 tokens a
    // step: windows split over steps), saving a reference of the whole vocabulary
    o.ref = "build/evaltest.k8.ref";
    o.save_ref = "build/evaltest.full.ref";
    o.top_k = V;
    o.max_seqs = 3;
    o.max_batch_tokens = 40;
    CHECK(run(&o, &b, &e) == 0, "%s", e.msg);
    CHECK(b.ppl == a.ppl, "batching changed the perplexity: %.17g vs %.17g", b.ppl, a.ppl);
    CHECK(b.has_ref && b.kl_mean == 0 && b.kl_p99 == 0 && b.top1 == 1 && b.ppl_diff == 0,
          "against itself: KL %g, p99 %g, top-1 %g, perplexity difference %g", b.kl_mean, b.kl_p99, b.top1, b.ppl_diff);
    CHECK(b.kl_upper_mean >= 0 && b.tail_mass_mean > 0, "upper %g, tail %g", b.kl_upper_mean, b.tail_mass_mean);

    // the 2-bit planes against the whole-vocabulary reference: the exact KL
    o = opts(TEXT);
    o.planes = PLANES;
    o.ref = "build/evaltest.full.ref";
    CHECK(run(&o, &c, &e) == 0, "%s", e.msg);
    CHECK(fabs(c.ppl / want_pl - 1) < PPL_TOL, "planes perplexity %.15g, the float64 sum gives %.15g", c.ppl, want_pl);
    double kl = 0, kl_max = 0;
    int64_t agree = 0;
    for (int64_t t = 0; t < n_nv; t++) {
        const double *p = lp_nv + (size_t)t * V, *q = lp_pl + (size_t)t * V;
        double k1 = 0;
        int bp = 0, bq = 0;
        for (int v = 0; v < V; v++) {
            k1 += exp(p[v]) * (p[v] - q[v]);
            bp = p[v] > p[bp] ? v : bp;
            bq = q[v] > q[bq] ? v : bq;
        }
        kl += k1;
        agree += bp == bq;
        kl_max = k1 > kl_max ? k1 : kl_max;
    }
    kl /= n_nv;
    // eval rounds both log-probabilities of each term to float32 (relative 6e-8, |log p| < 40 for
    // the tokens that carry mass): < 1e-5 absolute on the mean
    CHECK(c.has_ref && c.ref_top_k == V && fabs(c.kl_mean - kl) < 1e-5, "KL %.9g, exact %.9g", c.kl_mean, kl);
    CHECK(fabs(c.kl_upper_mean - c.kl_mean) < 1e-12 && c.tail_mass_mean == 0, "no tail: upper %g, KL %g", c.kl_upper_mean, c.kl_mean);
    CHECK(c.kl_p99 > c.kl_mean && c.kl_p99 <= kl_max + 1e-5, "p99 %g, mean %g, max %g", c.kl_p99, c.kl_mean, kl_max);
    CHECK(c.top1 == (double)agree / n_nv && c.top1 < 1, "top-1 %g, expected %g", c.top1, (double)agree / n_nv);
    CHECK(c.ref_ppl == a.ppl && c.ppl_diff == c.ppl - a.ppl && c.ppl_diff_se > 0,
          "reference perplexity %.17g (run %.17g), difference %g ± %g", c.ref_ppl, a.ppl, c.ppl_diff, c.ppl_diff_se);

    // against the top-8 reference: the coarse KL is a lower bound, kl_upper an upper bound
    o.ref = "build/evaltest.k8.ref";
    CHECK(run(&o, &d, &e) == 0, "%s", e.msg);
    CHECK(d.ref_top_k == 8 && d.kl_mean <= kl + 1e-5 && d.kl_upper_mean >= kl - 1e-5 && d.kl_mean < d.kl_upper_mean,
          "top-8: KL %g, upper %g, exact %g", d.kl_mean, d.kl_upper_mean, kl);
    CHECK(d.top1 == c.top1 && d.ppl_diff == c.ppl_diff, "top-1 and perplexity need no more than the top 1");
    printf("demo, test text (%" PRId64 " tokens): perplexity %.4f NVFP4, %.4f planes; KL %.4f (top-8: %.4f .. %.4f), top-1 %.1f %%\n",
           a.tokens, a.ppl, c.ppl, kl, d.kl_mean, d.kl_upper_mean, 100 * c.top1);

    // the result line
    char line[4096];
    eval_json(&o, &d, line, sizeof line);
    js_doc doc;
    CHECK(js_load_doc(&doc, line, strlen(line), "result", &e) == 0, "%s", e.msg);
    const js_node *root = js_root(&doc), *ref = js_get(&doc, root, "ref");
    double x;
    CHECK(js_num(js_get(&doc, root, "ppl"), &x) == 0 && x == d.ppl, "ppl in %s", line);
    CHECK(ref && js_num(js_get(&doc, ref, "kl_mean"), &x) == 0 && x == d.kl_mean, "ref.kl_mean in %s", line);
    js_free_doc(&doc);
}

// `--act-dtype bf16` on the CPU reference (the matrix products' inputs rounded to bf16, as the
// GPU's one-part products read them), the bundled model with its planes, on the first 20 lines of
// its held-out text (2,927 tokens), against the f32 run's whole distributions: it must cost no
// more than bf16 activations may (KL mean ≤ 1e-3, perplexity within 0.2 %; measured here 4.8e-4
// and −0.009 %, on 200 lines 5.5e-4 and +0.033 %), and something (KL > 0: the inputs were
// rounded). (On the 320 tokens of the test text the perplexity moves +0.41 %: too few tokens.)
static void test_act_bf16(void) {
    eval_result a, b;
    moet_err e;
    eval_opts o = opts(HELDOUT);
    o.limit = 20;
    o.planes = PLANES;
    o.save_ref = "build/evaltest.planes.ref";
    o.top_k = V;
    o.act_bf16 = -1;   // auto (the default): f32 on the CPU reference, as the explicit f32 run below
    CHECK(run(&o, &a, &e) == 0, "%s", e.msg);
    CHECK(a.tokens == 2927, "the held-out text's first 20 lines: %" PRId64 " tokens", a.tokens);
    {
        eval_result f;
        eval_opts of = opts(HELDOUT);
        of.limit = 20;
        of.planes = PLANES;
        of.act_bf16 = 0;
        CHECK(run(&of, &f, &e) == 0, "%s", e.msg);
        CHECK(f.ppl == a.ppl && f.tokens == a.tokens, "--act-dtype auto on the CPU: perplexity %.9g, f32's %.9g", a.ppl, f.ppl);
    }
    o = opts(HELDOUT);
    o.limit = 20;
    o.planes = PLANES;
    o.ref = "build/evaltest.planes.ref";
    o.act_bf16 = 1;
    CHECK(run(&o, &b, &e) == 0, "%s", e.msg);
    CHECK(b.has_ref && b.kl_mean > 0 && b.kl_mean <= 1e-3 && fabs(b.ppl / a.ppl - 1) <= 2e-3 && b.ref_ppl == a.ppl,
          "act bf16: KL mean %g, perplexity %.6f against %.6f", b.kl_mean, b.ppl, a.ppl);
    printf("demo + planes, held-out text (20 lines): --act-dtype bf16 KL mean %.3g (p99 %.3g), perplexity %.4f against %.4f, top-1 %.1f %%\n", b.kl_mean,
           b.kl_p99, b.ppl, a.ppl, 100 * b.top1);
}

// A line longer than ctx: windows of 32 tokens every 16, each scoring the targets past the last.
static void test_windows(void) {
    int64_t n;
    double s = forward_sum(&M_nv, 32, 16, &n, NULL), want = exp(-s / n);
    int64_t n_all;
    forward_sum(&M_nv, 4096, 2048, &n_all, NULL);
    eval_opts o = opts(TEXT);
    o.ctx = 32;
    o.stride = 16;
    o.max_batch_tokens = 50;
    eval_result r;
    moet_err e;
    CHECK(run(&o, &r, &e) == 0, "%s", e.msg);
    CHECK(n == n_all && r.tokens == n && fabs(r.ppl / want - 1) < PPL_TOL && r.windows > N_LINES,
          "windows: perplexity %.15g over %" PRId64 " tokens in %" PRId64 " windows, expected %.15g over %" PRId64, r.ppl, r.tokens,
          r.windows, want, n);
    o.stride = 32;   // no overlap: every window's first token is context only
    CHECK(run(&o, &r, &e) == 0, "%s", e.msg);
    s = forward_sum(&M_nv, 32, 32, &n, NULL);
    CHECK(r.tokens == n && n < n_all && fabs(r.ppl / exp(-s / n) - 1) < PPL_TOL, "stride = ctx: %" PRId64 " tokens, expected %" PRId64,
          r.tokens, n);
}

// The CPU reference announcing another chunk_align (it keeps every promise of 1, so results
// must not move), each forward_all row checked: a window's rows start at multiples of the
// alignment (so only its last row ends elsewhere).
static struct {
    engine_backend in;
    int align;
    int pos[8];          // tokens fed to each slot's window
    long rows, cut, misaligned;
} al;

static int al_admit(void *self, int slot, const engine_admit *a, moet_err *e) {
    (void)self;
    al.pos[slot] = 0;
    return al.in.admit(al.in.self, slot, a, e);
}
static void al_release(void *self, int slot) {
    (void)self;
    al.in.release(al.in.self, slot);
}
static int al_forward_all(void *self, int n, const int *slots, const int32_t *ids, const int *off, float *logits, float **hidden,
                          int32_t **router_ids, float **router_w, moet_err *e) {
    (void)self;
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        al.misaligned += al.pos[s] % al.align != 0;
        al.cut += al.pos[s] > 0;
        al.pos[s] += off[i + 1] - off[i];
        al.rows++;
    }
    return al.in.forward_all(al.in.self, n, slots, ids, off, logits, hidden, router_ids, router_w, e);
}

// eval_run over the test text with max_seqs windows at once, mbt tokens a step, on the CPU
// reference announcing chunk_align `align`: 0 with res filled, or -1 with e set.
static int run_aligned(int align, int max_seqs, int mbt, eval_result *res, moet_err *e) {
    static eval_ctx E;
    static ref_engine r;
    eval_opts o = opts(TEXT);
    o.max_seqs = max_seqs;
    o.max_batch_tokens = mbt;
    memset(res, 0, sizeof *res);
    memset(e, 0, sizeof *e);
    MOET_ASSERT(eval_prepare(&E, &o, &M_nv.cfg, &T, e) == 0 && ref_init(&r, &M_nv, E.max_seqs, E.longest, E.mbt, 1, e) == 0,
                "%s", e->msg);
    MOET_ASSERT(E.max_seqs <= 8, "%d slots", E.max_seqs);
    memset(&al, 0, sizeof al);
    al.in = ref_backend(&r);
    al.align = align;
    engine_backend be = al.in;
    be.chunk_align = align;
    be.admit = al_admit;
    be.release = al_release;
    be.forward_all = al_forward_all;
    int rc = eval_run(&E, &be, e);
    if (rc == 0) eval_summarize(&E, res);
    ref_free(&r);
    eval_release(&E);
    return rc;
}

// Windows cut at multiples of chunk_align whatever the budget (and the room a step has left),
// with the perplexity of the uncut run bit for bit; a budget below one aligned block is refused.
static void test_chunk_align(void) {
    eval_result a, b;
    moet_err e;
    CHECK(run_aligned(1, 8, 4096, &a, &e) == 0 && al.cut == 0, "uncut: %s (%ld rows continue a window)", e.msg, al.cut);
    const int runs[3][3] = {{16, 3, 40}, {16, 8, 16}, {64, 2, 100}};   // align, max_seqs, max_batch_tokens
    for (int k = 0; k < 3; k++) {
        int rc = run_aligned(runs[k][0], runs[k][1], runs[k][2], &b, &e);
        CHECK(rc == 0 && al.misaligned == 0 && al.cut > 0, "align %d, %d tokens a step: %s; %ld of %ld rows start off the alignment, "
              "%ld continue a window", runs[k][0], runs[k][2], e.msg, al.misaligned, al.rows, al.cut);
        CHECK(rc == 0 && b.ppl == a.ppl && b.nll == a.nll && b.tokens == a.tokens, "align %d: perplexity %.17g over %" PRId64
              " tokens, uncut %.17g over %" PRId64, runs[k][0], b.ppl, b.tokens, a.ppl, a.tokens);
    }
    CHECK(run_aligned(16, 3, 15, &b, &e) == -1 && strstr(e.msg, "--max-batch-tokens 15 must be at least 16") && al.rows == 0,
          "a budget below the alignment is refused before any step: %s", e.msg);
}

// References that do not belong to this run are refused before any forward pass.
static void test_refusals(void) {
    eval_result r;
    moet_err e;
    eval_opts o = opts(TEXT);
    o.ref = "build/evaltest.k8.ref";
    // another model: the tiny fixture (other geometry) with its own tokenizer
    o.model = "tests/fixtures/tiny/nvfp4";
    o.tokenizer = "tests/fixtures/tok/tiny-tokenizer.json";
    CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "another model") && strstr(e.msg, "vocab is 4096, this model's is 512"), "%s", e.msg);
    // another tokenizer file
    o = opts(TEXT);
    o.ref = "build/evaltest.k8.ref";
    size_t n;
    char *tj = read_file(DEMO "/tokenizer.json", &n);
    mkdir("build/evaltest_tok", 0755);
    tj[n] = ' ';   // one more byte of whitespace: the same tokenizer, another file
    write_file("build/evaltest_tok/tokenizer.json", tj, n + 1);
    arena_sys_free(tj, n + 1);
    o.tokenizer = "build/evaltest_tok/tokenizer.json";
    CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "another tokenizer"), "%s", e.msg);
    // other data: the first two lines only
    char *data = read_file(TEXT, &n);
    char *second = strchr(strchr(data, '\n') + 1, '\n');
    write_file("build/evaltest_other.jsonl", data, (size_t)(second + 1 - data));
    arena_sys_free(data, n + 1);
    o = opts("build/evaltest_other.jsonl");
    o.ref = "build/evaltest.k8.ref";
    CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "other data") && strstr(e.msg, "5 lines of text.jsonl"), "%s", e.msg);
    // other windows
    o = opts(TEXT);
    o.ref = "build/evaltest.k8.ref";
    o.ctx = 64;
    CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "other windows") && strstr(e.msg, "--ctx 4096"), "%s", e.msg);
    // damaged, truncated, not a reference at all
    char *ref = read_file("build/evaltest.k8.ref", &n);
    ref[n - 5] ^= 1;
    write_file("build/evaltest.bad.ref", ref, n);
    o.ctx = 0;
    o.ref = "build/evaltest.bad.ref";
    CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "damaged"), "%s", e.msg);
    write_file("build/evaltest.bad.ref", ref, n - 8);
    CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "truncated"), "%s", e.msg);
    arena_sys_free(ref, n + 1);
    o.ref = TEXT;
    CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "not a moet eval reference file"), "%s", e.msg);
    // a failed --save-ref leaves nothing behind
    o = opts(TEXT);
    o.ref = "build/evaltest.bad.ref";
    o.save_ref = "build/evaltest.never.ref";
    struct stat sb;
    CHECK(run(&o, &r, &e) != 0 && stat("build/evaltest.never.ref", &sb) != 0, "%s", e.msg);
}

// Bad lines: one error naming file and line; the run stops, or with skip_bad goes on.
static void test_bad_lines(void) {
    const char *good = "{\"text\": \"Return the first item.\"}\n";
    const char *bad[5][2] = {{"{}", "expected {\"text\": ...} or {\"messages\": [...]}"},
                             {"{\"text\": \"\"}", "\"text\" is empty"},
                             {"{\"text\": \"unfinished", "not valid JSON"},
                             {"{\"messages\": []}", "\"messages\" is empty"},
                             {"{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}", "no assistant turn"}};
    char buf[1024], all[4096] = "";
    eval_result r;
    moet_err e;
    strcat(all, good);
    for (int i = 0; i < 5; i++) {
        snprintf(buf, sizeof buf, "%s\n%s\n%s", good, bad[i][0], good);   // the bad line is line 3
        write_file("build/evaltest_bad.jsonl", buf, strlen(buf));
        eval_opts o = opts("build/evaltest_bad.jsonl");
        CHECK(run(&o, &r, &e) != 0 && strstr(e.msg, "evaltest_bad.jsonl:3: ") && strstr(e.msg, bad[i][1]), "%s", e.msg);
        strcat(all, bad[i][0]);
        strcat(all, "\n");
    }
    strcat(all, good);
    write_file("build/evaltest_bad.jsonl", all, strlen(all));
    eval_opts o = opts("build/evaltest_bad.jsonl");
    o.skip_bad = 1;
    CHECK(run(&o, &r, &e) == 0 && r.lines == 2 && r.skipped == 5 && r.windows == 2, "%s: %" PRId64 " lines, %" PRId64 " skipped",
          e.msg, r.lines, r.skipped);
}

// The command: one JSON line on stdout.
static void test_cli(void) {
    FILE *p = popen("./moet eval -q --model " DEMO " --data " TEXT " --limit 2", "r");
    char out[8192];
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    int st = p ? pclose(p) : -1;
    out[n] = 0;
    js_doc d;
    moet_err e;
    char *nl = strchr(out, '\n');
    CHECK(st == 0 && nl && nl[1] == 0, "exit %d, stdout: %s", st, out);
    if (!nl) return;
    CHECK(js_load_doc(&d, out, (size_t)(nl - out), "stdout", &e) == 0, "%s", e.msg);
    int64_t k;
    CHECK(js_int(js_get(&d, js_root(&d), "lines"), &k) == 0 && k == 2 && js_get(&d, js_root(&d), "ppl_se"), "%s", out);
    js_free_doc(&d);
}

int main(void) {
    moet_err e;
    struct stat sb;
    mkdir("build", 0755);
    if (stat(PLANES, &sb) != 0) CHECK(system("./moet build-planes --model " DEMO " --out " PLANES " >/dev/null 2>&1") == 0, "build-planes");
    MOET_ASSERT(tok_load(&T, DEMO "/tokenizer.json", DEMO "/tokenizer_config.json", &e) == 0, "%s", e.msg);
    MOET_ASSERT(ck_open(&M_nv, DEMO, &e) == 0 && ck_open(&M_pl, DEMO, &e) == 0, "%s", e.msg);
    pf_serve_opts po = {0};
    pf_attached pa;
    MOET_ASSERT(pf_attach_planes(&M_pl, PLANES, &po, &pa, &e) == 0, "%s", e.msg);
    V = M_nv.cfg.vocab;
    expected_lines();
    int64_t total = 0;
    for (int i = 0; i < N_LINES; i++)
        for (int t = 0; t < line_n[i]; t++) total += line_scored[i][t];
    lp_nv = malloc(sizeof(double) * (size_t)total * V);
    lp_pl = malloc(sizeof(double) * (size_t)total * V);
    test_tokens();
    test_ppl_and_refs();
    test_act_bf16();
    test_windows();
    test_chunk_align();
    test_refusals();
    test_bad_lines();
    test_cli();
    return check_report("test_eval");
}
