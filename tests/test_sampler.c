// tests/test_sampler.c — the sampler's rules on small hand-made logits.
#include "../moet.c"
#include "check.h"

enum { V = 8 };
static float work[V];
static int32_t cand[V];
static uint16_t counts[V];
static uint8_t seen[1];

static int32_t pick(const samp_params *p, samp_rng *r, const float *x) {
    samp_scratch sc = {V, work, cand};
    samp_slot s = {counts, seen};
    return samp_pick(&sc, &s, p, r, x);
}

int main(void) {
    samp_params greedy = {0, 0, 1, 0, 0, 0, 1};
    samp_rng r;
    samp_seed(&r, 1);
    float x[V] = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f, 0.0f, 2.0f, -3.0f};
    CHECK(pick(&greedy, &r, x) == 1, "greedy: ties go to the lowest id");

    // repetition penalty (HF/vLLM): a seen positive logit is divided, a negative multiplied
    memset(counts, 0, sizeof counts);
    seen[0] = 0;
    samp_slot s = {counts, seen};
    int32_t prompt[1] = {1};
    samp_slot_note_prompt(&s, prompt, 1);
    samp_params rep = greedy;
    rep.repetition_penalty = 2.0f;   // 2.0 / 2 = 1.0 < the other 2.0s
    CHECK(pick(&rep, &r, x) == 2, "repetition penalty moves greedy off a seen token");
    float neg[V] = {-1, -1.5f, -9, -9, -9, -9, -9, -9};
    int32_t p0[1] = {0};
    samp_slot_clear(&s, prompt, 1);
    samp_slot_note_prompt(&s, p0, 1);
    CHECK(pick(&rep, &r, neg) == 1, "a negative seen logit is multiplied: -1 * 2 < -1.5");
    samp_slot_clear(&s, p0, 1);
    CHECK(seen[0] == 0 && counts[0] == 0, "cleared");

    // presence / frequency over generated tokens only
    samp_params pres = greedy;
    pres.presence_penalty = 0.6f;
    samp_slot_note_output(&s, 1);
    samp_slot_note_output(&s, 1);
    samp_slot_note_output(&s, 2);
    CHECK(pick(&pres, &r, x) == 6, "presence: 1 and 2 lose 0.6, 6 wins");
    samp_params freq = greedy;
    freq.frequency_penalty = 0.3f;   // 1: 2 - 0.6 = 1.4; 2: 2 - 0.3 = 1.7; 6: 2.0
    CHECK(pick(&freq, &r, x) == 6, "frequency: 6 wins");
    x[6] = 1.6f;
    CHECK(pick(&freq, &r, x) == 2, "frequency: 2 (1.7) beats 6 (1.6) and 1 (1.4)");
    int32_t out3[3] = {1, 1, 2};
    samp_slot_clear(&s, out3, 3);
    x[6] = 2.0f;

    // top_k = 1 and min_p near 1 are greedy; draws stay inside top_k / top_p / min_p
    samp_params p = {1.0f, 1, 1, 0, 0, 0, 1};
    for (int i = 0; i < 50; i++) CHECK(pick(&p, &r, x) == 1, "top_k 1");
    p.top_k = 3;
    int hit[V] = {0};
    for (int i = 0; i < 3000; i++) hit[pick(&p, &r, x)]++;
    CHECK(hit[1] && hit[2] && hit[6] && hit[1] + hit[2] + hit[6] == 3000, "top_k 3 keeps the three 2.0s");
    // the three tied tokens are equally likely: 1000 each, binomial sd ~26; 5 sd = 130
    CHECK(abs(hit[1] - 1000) < 130 && abs(hit[2] - 1000) < 130 && abs(hit[6] - 1000) < 130, "uniform among ties");
    p.top_k = 0;
    p.top_p = 0.5f;   // the three 2.0s hold ~0.7 of the mass; the first two reach 0.5
    memset(hit, 0, sizeof hit);
    for (int i = 0; i < 2000; i++) hit[pick(&p, &r, x)]++;
    CHECK(hit[1] + hit[2] == 2000, "top_p 0.5 keeps the two best (id order on ties)");
    p.top_p = 1;
    p.min_p = 0.3f;   // keeps p >= 0.3 * p_max: exp(-1) = 0.37 (logit 1.0) stays, exp(-1.5) goes
    memset(hit, 0, sizeof hit);
    for (int i = 0; i < 4000; i++) hit[pick(&p, &r, x)]++;
    CHECK(hit[4] > 0 && hit[0] == 0 && hit[3] == 0 && hit[5] == 0 && hit[7] == 0, "min_p 0.3");

    // same seed, same draws
    samp_rng a, b;
    samp_seed(&a, 99);
    samp_seed(&b, 99);
    p.min_p = 0;
    int same = 1;
    for (int i = 0; i < 200; i++) same &= pick(&p, &a, x) == pick(&p, &b, x);
    CHECK(same, "same seed, same tokens");

    // logprobs: log-softmax of the raw logits, top ones by value then id
    int32_t ids[3];
    float lps[3];
    float lp = samp_logprobs(x, V, 4, 3, ids, lps);
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(x[i]);
    CHECK(fabs(lp - (1.0 - log(z))) < 1e-5, "logprob of token 4: %f vs %f", lp, 1.0 - log(z));  // float rounding
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 6 && fabs(lps[0] - (2.0 - log(z))) < 1e-5, "top logprobs");

    // samp_sort (in place, no allocation) orders as qsort with samp_cmp: probability down, then id;
    // 5,000 candidates drawn from 40 values, so most keys tie and the id order decides
    static float key[5000];
    static int32_t s1[5000], s2[5000];
    samp_seed(&a, 7);
    for (int i = 0; i < 5000; i++) key[i] = (float)(samp_next(&a) % 40) / 40.0f;
    for (int n = 0; n <= 5000; n += n < 10 ? 1 : 997) {
        for (int i = 0; i < n; i++) s1[i] = s2[i] = (int32_t)((uint64_t)i * 2654435761u % 5000);
        samp_sort_key = key;
        samp_sort(s1, n);
        qsort(s2, (size_t)n, sizeof *s2, samp_cmp);
        CHECK(!memcmp(s1, s2, sizeof *s1 * (size_t)n), "samp_sort of %d candidates orders as qsort", n);
    }
    return check_report("test_sampler");
}
