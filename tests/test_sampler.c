// tests/test_sampler.c — the sampler's rules on small hand-made logits, through the per-slot
// bank every backend picks with.
#include "../moet.c"
#include "check.h"

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
    samp_bank_free(&B);
    return check_report("test_sampler");
}
