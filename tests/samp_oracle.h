// tests/samp_oracle.h — the sampler as it was before the fast one: the oracle the fast sampler
// must reproduce token for token (tests/test_sampler.c) and the "before" of its benchmark
// (tests/bench_sampler.c). Slow and plain on purpose: every probability is computed, candidates
// are sorted with qsort on a global key, logprobs sum exp() in double over the whole row.
// Its own generator copy, so a change to the shared one cannot hide from the comparison.
#ifndef MOET_SAMP_ORACLE_H
#define MOET_SAMP_ORACLE_H

typedef struct {
    uint64_t s[4];
} oracle_rng;

static uint64_t oracle_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void oracle_seed(oracle_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = oracle_splitmix(&seed);
}

static uint64_t oracle_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t oracle_next(oracle_rng *r) {
    uint64_t *s = r->s, out = oracle_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = oracle_rotl(s[3], 45);
    return out;
}

static double oracle_uniform(oracle_rng *r) { return (double)(oracle_next(r) >> 11) * (1.0 / 9007199254740992.0); }

// Penalty state of one sequence.
typedef struct {
    uint16_t *count;   // [V] times generated (saturates at 65535)
    uint8_t *seen;     // [(V + 7) / 8] bit per token: in the prompt or the output
} oracle_slot;

typedef struct {
    int n_vocab;
    float *work;       // [V]
    int32_t *cand;     // [V]
} oracle_scratch;

static void oracle_note_prompt(oracle_slot *s, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) s->seen[ids[i] >> 3] |= (uint8_t)(1u << (ids[i] & 7));
}

static void oracle_note_output(oracle_slot *s, int32_t id) {
    s->seen[id >> 3] |= (uint8_t)(1u << (id & 7));
    if (s->count[id] != UINT16_MAX) s->count[id]++;
}

static int oracle_has_penalty(const samp_params *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0 || p->repetition_penalty != 1;
}

static const float *oracle_sort_key;
static int oracle_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float px = oracle_sort_key[x], py = oracle_sort_key[y];
    if (px != py) return px > py ? -1 : 1;
    return (x > y) - (x < y);
}

static void oracle_heap_down(int32_t *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && oracle_cmp(&h[l], &h[w]) > 0) w = l;
        if (r < k && oracle_cmp(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        int32_t t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static void oracle_select(int32_t *cand, int n, int k, const float *prob) {
    oracle_sort_key = prob;
    for (int i = k / 2; i-- > 0;) oracle_heap_down(cand, k, i);
    for (int i = k; i < n; i++)
        if (oracle_cmp(&cand[i], &cand[0]) < 0) {
            cand[0] = cand[i];
            oracle_heap_down(cand, k, 0);
        }
    qsort(cand, (size_t)k, sizeof *cand, oracle_cmp);
}

static int32_t oracle_pick(oracle_scratch *sc, const oracle_slot *slot, const samp_params *p, oracle_rng *rng,
                           const float *logits) {
    const int V = sc->n_vocab;
    const float *x = logits;
    if (oracle_has_penalty(p)) {
        float *w = sc->work;
        memcpy(w, logits, (size_t)V * sizeof *w);
        for (int t = 0; t < V; t++) {
            if (!(slot->seen[t >> 3] & (1u << (t & 7)))) continue;
            if (p->repetition_penalty != 1) w[t] = w[t] > 0 ? w[t] / p->repetition_penalty : w[t] * p->repetition_penalty;
            uint16_t c = slot->count[t];
            if (c) w[t] -= p->frequency_penalty * (float)c + p->presence_penalty;
        }
        x = w;
    }
    int32_t best = 0;
    for (int t = 1; t < V; t++)
        if (x[t] > x[best]) best = t;
    if (p->temperature == 0) return best;

    float *prob = sc->work;
    const float inv_t = 1.0f / p->temperature, top = x[best];
    for (int t = 0; t < V; t++) prob[t] = samp_expf((x[t] - top) * inv_t);   // (the exp of the sampler: sass/samp.h)
    float floor_p = p->min_p > 0 ? p->min_p : 0;
    int32_t *cand = sc->cand;
    int n = 0;
    for (int t = 0; t < V; t++)
        if (prob[t] > 0 && prob[t] >= floor_p) cand[n++] = t;
    MOET_ASSERT(n > 0, "oracle: no candidate token");

    int sorted = 0;
    if (p->top_k > 0 && p->top_k < n) {
        oracle_select(cand, n, p->top_k, prob);
        n = p->top_k;
        sorted = 1;
    }
    if (p->top_p < 1) {
        double total = 0;
        for (int i = 0; i < n; i++) total += prob[cand[i]];
        if (!sorted) {
            float th = 0;
            for (float t2 = 1e-4f; t2 > 1e-12f && th == 0; t2 *= 1e-4f) {
                double mass = 0;
                for (int i = 0; i < n; i++)
                    if (prob[cand[i]] >= t2) mass += prob[cand[i]];
                if (mass >= p->top_p * total) th = t2;
            }
            if (th > 0) {
                int k = 0;
                for (int i = 0; i < n; i++)
                    if (prob[cand[i]] >= th) cand[k++] = cand[i];
                n = k;
            }
            oracle_sort_key = prob;
            qsort(cand, (size_t)n, sizeof *cand, oracle_cmp);
        }
        double acc = 0, need = p->top_p * total;
        int k = 0;
        while (k < n) {
            acc += prob[cand[k++]];
            if (acc >= need) break;
        }
        n = k;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += prob[cand[i]];
    double u = oracle_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += prob[cand[i]];
        if (u < acc) return cand[i];
    }
    return cand[n - 1];
}

static float oracle_logprobs(const float *logits, int V, int32_t chosen, int n_top, int32_t *top_ids, float *top_lp) {
    float mx = logits[0];
    for (int t = 1; t < V; t++)
        if (logits[t] > mx) mx = logits[t];
    double sum = 0;
    for (int t = 0; t < V; t++) sum += exp((double)logits[t] - mx);
    const double lse = mx + log(sum);
    int have = 0;
    for (int t = 0; t < V && n_top > 0; t++) {
        float v = logits[t];
        if (have == n_top && v <= logits[top_ids[have - 1]]) continue;
        int i = have < n_top ? have++ : have - 1;
        while (i > 0 && logits[top_ids[i - 1]] < v) {
            top_ids[i] = top_ids[i - 1];
            i--;
        }
        top_ids[i] = t;
    }
    for (int i = 0; i < have; i++) top_lp[i] = (float)(logits[top_ids[i]] - lse);
    return (float)(logits[chosen] - lse);
}

#endif
