// format/sampler.c — from one row of logits to one token id, and the logprobs of it.
//
// The order is vLLM's (the reference for what these parameters mean):
//   1. penalties on the raw logits: repetition (HF/vLLM: a token seen in the prompt or the
//      output has its logit divided by r when positive, multiplied by r when negative), then
//      frequency (minus f × times generated) and presence (minus p once generated), as OpenAI;
//   2. temperature 0 → greedy: the largest penalized logit, ties to the lowest id;
//   3. otherwise logits / temperature → softmax, then min_p (drop p < min_p × p_max), top_k
//      (the k most likely; ties broken by lower id), top_p (the most likely tokens, renormalized,
//      until their mass reaches top_p), then one draw from the kept tokens.
// Each draw takes one number from the request's own generator (xoshiro256**, seeded by
// splitmix64 from the request's seed), and the kept tokens are walked in a fixed order, so
// the same logits and seed give the same token whatever else runs in the batch.
// Logprobs are log-softmax of the raw logits (before penalties and temperature), as vLLM
// reports them by default.

typedef struct {
    float temperature;          // 0 = greedy
    int top_k;                  // 0 = all
    float top_p;                // (0, 1]
    float min_p;                // [0, 1]
    float presence_penalty;     // [-2, 2]
    float frequency_penalty;    // [-2, 2]
    float repetition_penalty;   // > 0; 1 = off
} samp_params;

typedef struct {
    uint64_t s[4];
} samp_rng;

// Penalty state of one sequence slot; all zero when the slot is empty.
typedef struct {
    uint16_t *count;   // [V] times generated (saturates at 65535)
    uint8_t *seen;     // [(V + 7) / 8] bit per token: in the prompt or the output
} samp_slot;

// Working memory for one pick (sampling runs one row at a time).
typedef struct {
    int n_vocab;
    float *work;       // [V] penalized, tempered logits, then probabilities
    int32_t *cand;     // [V] candidate ids
} samp_scratch;

static uint64_t samp_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void samp_seed(samp_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = samp_splitmix(&seed);
}

static uint64_t samp_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t samp_next(samp_rng *r) {
    uint64_t *s = r->s, out = samp_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = samp_rotl(s[3], 45);
    return out;
}

// Uniform in [0, 1) with 53 random bits.
static double samp_uniform(samp_rng *r) { return (double)(samp_next(r) >> 11) * (1.0 / 9007199254740992.0); }

// ---- per-slot penalty state --------------------------------------------------------------

static void samp_slot_note_prompt(samp_slot *s, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) s->seen[ids[i] >> 3] |= (uint8_t)(1u << (ids[i] & 7));
}

static void samp_slot_note_output(samp_slot *s, int32_t id) {
    s->seen[id >> 3] |= (uint8_t)(1u << (id & 7));
    if (s->count[id] != UINT16_MAX) s->count[id]++;
}

// Back to all zero, touching only the tokens of the sequence's history.
static void samp_slot_clear(samp_slot *s, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        s->seen[ids[i] >> 3] = 0;
        s->count[ids[i]] = 0;
    }
}

static int samp_has_penalty(const samp_params *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0 || p->repetition_penalty != 1;
}

// ---- the pick ----------------------------------------------------------------------------

// Candidate order: higher probability first, then lower id (a total order, so the result
// does not depend on the sort algorithm).
static const float *samp_sort_key;
static int samp_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float px = samp_sort_key[x], py = samp_sort_key[y];
    if (px != py) return px > py ? -1 : 1;
    return (x > y) - (x < y);
}

// Moves the k best candidates (in samp_cmp order) to cand[0..k), sorted: a heap of the k
// best so far whose root is the worst of them, O(n log k).
static void samp_heap_down(int32_t *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && samp_cmp(&h[l], &h[w]) > 0) w = l;
        if (r < k && samp_cmp(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        int32_t t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static void samp_select(int32_t *cand, int n, int k, const float *prob) {
    samp_sort_key = prob;
    for (int i = k / 2; i-- > 0;) samp_heap_down(cand, k, i);
    for (int i = k; i < n; i++)
        if (samp_cmp(&cand[i], &cand[0]) < 0) {
            cand[0] = cand[i];
            samp_heap_down(cand, k, 0);
        }
    qsort(cand, (size_t)k, sizeof *cand, samp_cmp);
}

// One token id from logits[0..V). `slot` may be NULL when no penalty is set.
static int32_t samp_pick(samp_scratch *sc, const samp_slot *slot, const samp_params *p, samp_rng *rng,
                         const float *logits) {
    const int V = sc->n_vocab;
    const float *x = logits;
    if (samp_has_penalty(p)) {
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

    // probabilities relative to the most likely token: prob[best] = 1
    float *prob = sc->work;
    const float inv_t = 1.0f / p->temperature, top = x[best];
    for (int t = 0; t < V; t++) prob[t] = expf((x[t] - top) * inv_t);
    float floor_p = p->min_p > 0 ? p->min_p : 0;   // min_p × p_max, and p_max = 1 here
    int32_t *cand = sc->cand;
    int n = 0;
    for (int t = 0; t < V; t++)
        if (prob[t] > 0 && prob[t] >= floor_p) cand[n++] = t;
    MOET_ASSERT(n > 0, "sampler: no candidate token");

    int sorted = 0;
    if (p->top_k > 0 && p->top_k < n) {
        samp_select(cand, n, p->top_k, prob);
        n = p->top_k;
        sorted = 1;
    }
    if (p->top_p < 1) {
        double total = 0;
        for (int i = 0; i < n; i++) total += prob[cand[i]];
        if (!sorted) {
            // Only the most likely tokens can be kept: when the tokens above a threshold
            // already hold top_p of the mass, sort just those (lower the threshold if not).
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
            samp_sort_key = prob;
            qsort(cand, (size_t)n, sizeof *cand, samp_cmp);
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
    double u = samp_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += prob[cand[i]];
        if (u < acc) return cand[i];
    }
    return cand[n - 1];   // u within rounding of the total
}

// ---- logprobs ----------------------------------------------------------------------------

// log-softmax of the raw logits at `chosen`, and the n_top most likely tokens (ids and
// logprobs, most likely first, ties to the lower id).
static float samp_logprobs(const float *logits, int V, int32_t chosen, int n_top, int32_t *top_ids, float *top_lp) {
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
