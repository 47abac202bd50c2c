// tests/test_sampler.c — the sampler's rules on small hand-made logits, through the per-slot
// bank every backend picks with; then the fast sampler against the plain one it replaced
// (tests/samp_oracle.h) on random rows: the same tokens, draw for draw.
#include "../moet.c"
#include "check.h"
#include "samp_oracle.h"

enum { V = 8 };
static samp_bank B;

// Slot `slot` starts a sequence with these parameters (logprobs on, top 3).
static void admit(int slot, const samp_params *p, uint64_t seed, const int32_t *prompt, int n) {
    moet_err e = {{0}};
    if (B.slot[slot].active) samp_bank_release(&B, slot);
    CHECK(samp_bank_admit(&B, slot, p, seed, 1, 3, prompt, n, &e) == 0, "%s", e.msg);
}

static int32_t lp_ids[MOET_MAX_LOGPROBS];
static float lp_vals[MOET_MAX_LOGPROBS], lp_chosen;

static int32_t pick(int slot, const float *x) {
    int32_t t = -1;
    samp_bank_pick(&B, slot, x, &t, &lp_chosen, lp_ids, lp_vals);
    return t;
}

static int all_zero(const samp_slot *s) {
    int z = s->n_touched == 0;
    for (int i = 0; i < V; i++) z &= s->count[i] == 0;
    for (int i = 0; i < (V + 7) / 8; i++) z &= s->seen[i] == 0;
    return z;
}

// ---- samp_expf ---------------------------------------------------------------------------

// Every float y <= 0 (from -0 down to -inf, NaN apart): samp_expf never falls as y grows — the
// fast sampler's bound on the tokens it leaves out rests on it — and is within one ulp of libm's
// exp in double rounded to float (its accuracy; the two round the same but where e^y lies within
// about 2^-52 of a boundary between floats). 2^31 values, libm's exp for the 3 · 10^8 of them in
// [-104, -2^-30]: a few seconds.
static void test_expf(void) {
    long long below = 0, off = 0, far = 0, n = 0;
    float prev = 0;   // samp_expf(-inf)
    uint32_t worst = 0;
    for (uint32_t b = 0xff800000u; b >= 0x80000000u; b--) {   // -inf up to -0: y grows
        float y;
        memcpy(&y, &b, sizeof y);
        const float f = samp_expf(y), ref = y < -104.f ? 0.f : y > -0x1p-30f ? 1.f : (float)exp((double)y);
        below += f < prev;   // (past -2^-30, e^y within 2^-30 of 1: libm's rounds to 1 as well)
        if (f != ref) {
            int32_t fi, ri;
            memcpy(&fi, &f, 4);
            memcpy(&ri, &ref, 4);
            off++;
            if (fi - ri > 1 || ri - fi > 1) far++, worst = b;
        }
        prev = f;
        n++;
        if (b == 0x80000000u) break;
    }
    float nan_in = NAN;
    CHECK(n == 0x7f800001LL, "every float from -inf to -0 (%lld)", n);
    CHECK(below == 0, "samp_expf never falls as y grows: %lld values below the one before", below);
    CHECK(far == 0, "samp_expf within an ulp of (float)exp((double)y): %lld further (the last at 0x%08x)", far, worst);
    CHECK(samp_expf(0.f) == 1.f && samp_expf(-0.f) == 1.f && samp_expf(-INFINITY) == 0.f && isnan(samp_expf(nan_in)),
          "samp_expf(±0) = 1, (-inf) = 0, NaN stays NaN");
    CHECK(samp_expf(-104.f) > 0 || samp_expf(-103.9f) > 0, "float subnormals where e^y is one");
    fprintf(stderr, "test_sampler: samp_expf: %lld floats <= 0, %lld one ulp from libm's (float)exp((double)y)\n", n, off);
}

// ---- against the oracle ------------------------------------------------------------------

static uint64_t rnd_state;
static uint64_t rnd(void) { return oracle_splitmix(&rnd_state); }
static double rnd_unit(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

// A row of logits of one of several shapes: 0 spread like a language model's (sd 2.5, a few
// tokens far above); 1 the same rounded to bf16 (many exact ties); 2 with -inf entries and
// several tokens tied at the top; 3 flat (every token tied); 4 one token far above the rest;
// 5 the values of 0, rounded to 0.25 (ties at every level, also across any bound); 6 a
// cluster of 300 logits one ulp apart just under the top, scattered over the row (with a tiny
// temperature min_p's bound falls inside it, with a huge one many of them share a probability:
// the fast sampler's bounds cut through ties and it must notice).
static void rnd_row(float *x, int n, int kind) {
    for (int t = 0; t < n; t++) {
        double u1 = rnd_unit() + 1e-12, u2 = rnd_unit();
        x[t] = (float)(2.5 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        if (rnd() % 1000 == 0) x[t] += 8 + (float)(rnd() % 5);
    }
    if (kind == 1)
        for (int t = 0; t < n; t++) {
            uint32_t b;
            memcpy(&b, &x[t], 4);
            b &= 0xffff0000u;
            memcpy(&x[t], &b, 4);
        }
    if (kind == 2) {
        for (int t = 0; t < n; t++)
            if (rnd() % 7 == 0) x[t] = -INFINITY;
        for (int i = 0; i < 5; i++) x[rnd() % (uint64_t)n] = 30.0f;
    }
    if (kind == 3)
        for (int t = 0; t < n; t++) x[t] = 1.5f;
    if (kind == 4) x[rnd() % (uint64_t)n] = 40.0f;
    if (kind == 5)
        for (int t = 0; t < n; t++) x[t] = roundf(x[t] * 4) / 4;
    if (kind == 6) {
        float v = 24.0f;
        for (int i = 0; i < 300 && i < n; i++) {
            x[rnd() % (uint64_t)n] = v;
            v = nextafterf(v, 0);
        }
    }
}

static void against_oracle(int n_vocab, int rows, int kinds) {
    static const samp_params ps[] = {
        {0, 0, 1, 0, 0, 0, 1},                 // greedy
        {0.7f, 20, 0.8f, 0, 0, 0, 1},          // the demo's generation_config
        {0.6f, 20, 0.95f, 0, 0, 0, 1},         // Qwen3's recommended thinking settings
        {1, 0, 1, 0, 0, 0, 1},                 // plain temperature: every token
        {1, 0, 0.9f, 0, 0, 0, 1},              // top_p alone
        {1, 0, 1, 0.05f, 0, 0, 1},             // min_p alone
        {0.8f, 0, 0.9f, 0.1f, 0, 0, 1},        // min_p + top_p
        {1.5f, 50, 1, 0, 0, 0, 1},             // top_k alone
        {1, 2, 1, 0.5f, 0, 0, 1},              // top_k + min_p
        {1, 5000, 0.97f, 0, 0, 0, 1},          // top_k too large for the block bound
        {0.3f, 1, 1, 0, 0, 0, 1},              // top_k 1
        {100, 20, 1, 0, 0, 0, 1},              // a huge temperature: nearly flat
        {0.01f, 0, 0.9f, 0, 0, 0, 1},          // a tiny temperature
        {1, 0, 1, 1e-7f, 0, 0, 1},             // a min_p that keeps nearly everything
        {0.8f, 40, 0.9f, 0, 0.5f, 0.2f, 1.3f}, // penalties
        {0, 0, 1, 0, 0.4f, 0, 1.5f},           // greedy with penalties
        {1e-4f, 0, 1, 0.5f, 0, 0, 1},          // min_p's bound finer than a logit's ulp
        {300, 20, 1, 0, 0, 0, 1},              // top_k where distinct logits share a probability
        {1e5f, 20, 1, 0, 0, 0, 1},             // ... and where they share it across the bound
    };
    const int np = (int)(sizeof ps / sizeof ps[0]), Vn = n_vocab;
    float *x = malloc(sizeof(float) * (size_t)Vn), *owork = malloc(sizeof(float) * (size_t)Vn);
    int32_t *ocand = malloc(sizeof(int32_t) * (size_t)Vn), prompt[50];
    uint16_t *count = calloc((size_t)Vn, sizeof(uint16_t));
    uint8_t *seen = calloc((size_t)(Vn + 7) / 8, 1);
    samp_bank bank;
    moet_err e = {{0}};
    MOET_ASSERT(samp_bank_init(&bank, Vn, 1, 4 * rows + 64, &e) == 0, "%s", e.msg);
    int bad_tok = 0, bad_top = 0, picks = 0;
    double lp_err = 0;
    for (int pi = 0; pi < np; pi++)
        for (int kind = 0; kind < kinds; kind++) {
            uint64_t seed = rnd();
            for (int i = 0; i < 50; i++) prompt[i] = (int32_t)(rnd() % (uint64_t)Vn);
            if (samp_bank_admit(&bank, 0, &ps[pi], seed, 1, 20, prompt, 50, &e)) CHECK(0, "%s", e.msg);
            oracle_rng orng;
            oracle_seed(&orng, seed);
            oracle_scratch osc = {Vn, owork, ocand};
            oracle_slot os = {count, seen};
            memset(count, 0, sizeof(uint16_t) * (size_t)Vn);
            memset(seen, 0, (size_t)(Vn + 7) / 8);
            oracle_note_prompt(&os, prompt, 50);
            for (int r = 0; r < rows; r++) {
                rnd_row(x, Vn, kind);
                if (ps[pi].repetition_penalty != 1)   // make the penalties matter: seen tokens near the top
                    for (int i = 0; i < 10; i++) x[prompt[i]] = 9.5f - (float)i * 0.1f;
                int32_t got, top[MOET_MAX_LOGPROBS], otop[MOET_MAX_LOGPROBS];
                float lp, top_lp[MOET_MAX_LOGPROBS], otop_lp[MOET_MAX_LOGPROBS];
                samp_bank_pick(&bank, 0, x, &got, &lp, top, top_lp);
                int32_t want = oracle_pick(&osc, &os, &ps[pi], &orng, x);
                float olp = oracle_logprobs(x, Vn, want, 20, otop, otop_lp);
                oracle_note_output(&os, want);
                picks++;
                if (got != want) {
                    if (bad_tok++ < 5) fprintf(stderr, "V %d params %d kind %d row %d: token %d, the oracle %d\n", Vn, pi, kind, r, got, want);
                    break;   // the generators have parted: the rest of this sequence would differ too
                }
                bad_top += memcmp(top, otop, sizeof top) != 0;
                if (!(fabs(lp - olp) <= lp_err)) lp_err = fabs(lp - olp);
                for (int i = 0; i < 20; i++)
                    if (!(fabs(top_lp[i] - otop_lp[i]) <= lp_err)) lp_err = fabs(top_lp[i] - otop_lp[i]);
            }
            samp_bank_release(&bank, 0);
        }
    CHECK(bad_tok == 0, "V %d: %d of %d sequences parted from the oracle", Vn, bad_tok, np * kinds);
    CHECK(bad_top == 0, "V %d: top_logprobs ids differ from the oracle's in %d of %d picks", Vn, bad_top, picks);
    // the oracle sums exp() in double; the fast log-sum-exp uses a float exp within 2 ulp and
    // float sums of 8 per block (relative error ~1e-6 of the sum, so ~1e-6 in every logprob),
    // and logprobs near -40 are floats with an ulp of 4e-6: measured 4.8e-7 .. 1.9e-6 → 6e-6
    CHECK(lp_err < 6e-6, "V %d: logprobs differ from the oracle's by %.3g", Vn, lp_err);
    printf("V %d: %d picks as the oracle's (%d parameter sets x %d row shapes), logprobs within %.2g\n", Vn, picks, np, kinds, lp_err);
    samp_bank_free(&bank);
    free(x), free(owork), free(ocand), free(count), free(seen);
}

int main(void) {
    moet_err e = {{0}};
    CHECK(samp_bank_init(&B, V, 2, 16, &e) == 0, "%s", e.msg);
    samp_params greedy = {0, 0, 1, 0, 0, 0, 1};
    float x[V] = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f, 0.0f, 2.0f, -3.0f};
    admit(0, &greedy, 1, NULL, 0);
    CHECK(pick(0, x) == 1, "greedy: ties go to the lowest id");

    // repetition penalty (HF/vLLM): a seen positive logit is divided, a negative multiplied
    samp_params rep = greedy;
    rep.repetition_penalty = 2.0f;   // 2.0 / 2 = 1.0 < the other 2.0s
    int32_t prompt[1] = {1};
    admit(0, &rep, 1, prompt, 1);
    CHECK(pick(0, x) == 2, "repetition penalty moves greedy off a seen token");
    float neg[V] = {-1, -1.5f, -9, -9, -9, -9, -9, -9};
    int32_t p0[1] = {0};
    admit(0, &rep, 1, p0, 1);
    CHECK(pick(0, neg) == 1, "a negative seen logit is multiplied: -1 * 2 < -1.5");
    samp_bank_release(&B, 0);
    CHECK(all_zero(&B.slot[0]) && !B.slot[0].active, "release clears the penalty state");
    CHECK(samp_bank_admit(&B, 0, &rep, 1, 0, 0, (int32_t[]){8}, 1, &e) == -1 && strstr(e.msg, "outside the vocabulary"),
          "a prompt id outside the vocabulary is refused: %s", e.msg);
    CHECK(!B.slot[0].active && all_zero(&B.slot[0]), "a refused admission takes nothing");

    // presence / frequency over generated tokens only (the picks themselves are noted)
    samp_params pres = greedy;
    pres.presence_penalty = 0.6f;
    admit(0, &pres, 1, NULL, 0);
    float only1[V] = {0, 9, 0, 0, 0, 0, 0, 0}, only2[V] = {0, 0, 9, 0, 0, 0, 0, 0};
    CHECK(pick(0, only1) == 1 && pick(0, only1) == 1 && pick(0, only2) == 2, "picks");
    CHECK(B.slot[0].count[1] == 2 && B.slot[0].count[2] == 1 && B.slot[0].n_touched == 2, "picked tokens are counted");
    CHECK(pick(0, x) == 6, "presence: 1 and 2 lose 0.6, 6 wins");
    samp_params freq = greedy;
    freq.frequency_penalty = 0.3f;   // 1: 2 - 0.6 = 1.4; 2: 2 - 0.3 = 1.7; 6: 2.0
    admit(0, &freq, 1, NULL, 0);
    pick(0, only1), pick(0, only1), pick(0, only2);
    CHECK(pick(0, x) == 6, "frequency: 6 wins");
    admit(0, &freq, 1, NULL, 0);
    pick(0, only1), pick(0, only1), pick(0, only2);
    x[6] = 1.6f;
    CHECK(pick(0, x) == 2, "frequency: 2 (1.7) beats 6 (1.6) and 1 (1.4)");
    x[6] = 2.0f;
    // without a penalty nothing is kept (nothing to clear)
    admit(0, &greedy, 1, prompt, 1);
    pick(0, x);
    CHECK(all_zero(&B.slot[0]), "no penalty: no penalty state");

    // top_k = 1 and min_p near 1 are greedy; draws stay inside top_k / top_p / min_p
    samp_params p = {1.0f, 1, 1, 0, 0, 0, 1};
    admit(0, &p, 1, NULL, 0);
    int one = 1;
    for (int i = 0; i < 50; i++) one &= pick(0, x) == 1;
    CHECK(one, "top_k 1");
    p.top_k = 3;
    admit(0, &p, 1, NULL, 0);
    int hit[V] = {0};
    for (int i = 0; i < 3000; i++) hit[pick(0, x)]++;
    CHECK(hit[1] && hit[2] && hit[6] && hit[1] + hit[2] + hit[6] == 3000, "top_k 3 keeps the three 2.0s");
    // the three tied tokens are equally likely: 1000 each, binomial sd ~26; 5 sd = 130
    CHECK(abs(hit[1] - 1000) < 130 && abs(hit[2] - 1000) < 130 && abs(hit[6] - 1000) < 130, "uniform among ties");
    p.top_k = 0;
    p.top_p = 0.5f;   // the three 2.0s hold ~0.7 of the mass; the first two reach 0.5
    admit(0, &p, 1, NULL, 0);
    memset(hit, 0, sizeof hit);
    for (int i = 0; i < 2000; i++) hit[pick(0, x)]++;
    CHECK(hit[1] + hit[2] == 2000, "top_p 0.5 keeps the two best (id order on ties)");
    // top_p exactly on a boundary: four equal logits, the rest -inf (probability 0): each holds a
    // quarter, so the first two reach 0.5 exactly (1 + 1 = 0.5 · 4, no rounding) and top_p keeps
    // those two; a third would only be needed if the kept mass had to exceed top_p
    float four[V] = {3.0f, 3.0f, 3.0f, 3.0f, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    admit(0, &p, 5, NULL, 0);
    memset(hit, 0, sizeof hit);
    for (int i = 0; i < 2000; i++) hit[pick(0, four)]++;
    CHECK(hit[0] && hit[1] && hit[0] + hit[1] == 2000, "top_p 0.5 on an exact boundary keeps two of four: %d %d %d %d", hit[0],
          hit[1], hit[2], hit[3]);
    p.top_p = 1;
    p.min_p = 0.3f;   // keeps p >= 0.3 * p_max: exp(-1) = 0.37 (logit 1.0) stays, exp(-1.5) goes
    admit(0, &p, 1, NULL, 0);
    memset(hit, 0, sizeof hit);
    for (int i = 0; i < 4000; i++) hit[pick(0, x)]++;
    CHECK(hit[4] > 0 && hit[0] == 0 && hit[3] == 0 && hit[5] == 0 && hit[7] == 0, "min_p 0.3");

    // same seed, same draws, whichever slot; another seed, other draws
    p.min_p = 0;
    admit(0, &p, 99, NULL, 0);
    admit(1, &p, 99, NULL, 0);
    int same = 1;
    for (int i = 0; i < 200; i++) same &= pick(0, x) == pick(1, x);
    CHECK(same, "same seed, same tokens");
    admit(1, &p, 100, NULL, 0);
    admit(0, &p, 99, NULL, 0);
    int differ = 0;
    for (int i = 0; i < 200; i++) differ += pick(0, x) != pick(1, x);
    CHECK(differ > 0, "another seed, other tokens");

    // logprobs: log-softmax of the raw logits, top ones by value then id
    admit(0, &greedy, 1, NULL, 0);
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(x[i]);
    CHECK(pick(0, x) == 1, "greedy pick");
    CHECK(fabs(lp_chosen - (2.0 - log(z))) < 1e-6, "logprob of the chosen token: %f vs %f", lp_chosen, 2.0 - log(z));  // float rounding
    CHECK(lp_ids[0] == 1 && lp_ids[1] == 2 && lp_ids[2] == 6 && fabs(lp_vals[2] - (2.0 - log(z))) < 1e-6, "top logprobs");
    // the penalized logits pick, the raw ones report
    admit(0, &rep, 1, prompt, 1);
    CHECK(pick(0, x) == 2 && fabs(lp_chosen - (2.0 - log(z))) < 1e-6 && lp_ids[0] == 1, "logprobs of the raw logits");

    // samp_bank_plain_greedy: the slots a backend may answer with the row's first largest logit
    // (the GPU's k_argmax) instead of the pick — greedy, no penalty, no logprobs — and for them the
    // pick is exactly that and leaves the slot as it was (no draw, nothing counted); any other
    // slot is not one of them
    {
        admit(1, &greedy, 1, NULL, 0);   // (logprobs on: admit's)
        CHECK(!samp_bank_plain_greedy(&B, 1), "a slot asking for logprobs is not plain greedy");
        samp_bank_release(&B, 1);
        CHECK(samp_bank_admit(&B, 1, &greedy, 7, 0, 0, prompt, 1, &e) == 0, "%s", e.msg);
        CHECK(samp_bank_plain_greedy(&B, 1), "greedy without penalties or logprobs is plain greedy");
        samp_slot before = B.slot[1];
        float bm[1], ties[V] = {1.0f, 3.0f, -2.0f, 3.0f, NAN, 3.0f, 0.5f, -INFINITY};
        int32_t t1 = pick(1, x), t2 = pick(1, ties);
        CHECK(t1 == samp_first_max(x, V, bm, samp_block_max(x, V, bm)) && t2 == samp_first_max(ties, V, bm, samp_block_max(ties, V, bm)) && t2 == 1,
              "plain greedy: the pick is the first largest logit (%d, %d)", t1, t2);
        CHECK(!memcmp(&before.rng, &B.slot[1].rng, sizeof before.rng) && before.n_touched == B.slot[1].n_touched,
              "plain greedy: the pick draws nothing and counts nothing");
        samp_bank_release(&B, 1);
        CHECK(!samp_bank_plain_greedy(&B, 1), "a free slot is not plain greedy");
        samp_params hot = greedy, pen = greedy;
        hot.temperature = 0.7f;
        pen.presence_penalty = 0.1f;
        CHECK(samp_bank_admit(&B, 1, &hot, 7, 0, 0, NULL, 0, &e) == 0 && !samp_bank_plain_greedy(&B, 1), "a sampled slot is not plain greedy");
        samp_bank_release(&B, 1);
        CHECK(samp_bank_admit(&B, 1, &pen, 7, 0, 0, NULL, 0, &e) == 0 && !samp_bank_plain_greedy(&B, 1), "a penalized slot is not plain greedy");
        samp_bank_release(&B, 1);
    }
    samp_bank_free(&B);

    test_expf();
    rnd_state = 2024;
    against_oracle(300, 30, 7);      // a vocabulary that is not a whole number of blocks
    against_oracle(4096, 30, 7);     // the demo model's
    against_oracle(50000, 6, 7);
    against_oracle(248320, 2, 2);    // Qwen3.6's
    return check_report("test_sampler");
}
