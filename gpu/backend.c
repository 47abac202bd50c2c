// gpu/backend.c — the GPU engine behind the scheduler's engine_backend, and the one place that
// chooses a backend for `run`, `serve` and `bench` (--backend auto|cpu|gpu).
//
// launch queues the whole step on the compute stream, then the copy of the rows' logits into
// pinned memory, and returns (a step with speculating rows runs before it returns:
// gpu_be_spec_row); collect waits for that copy and picks each wanted row's token
// with the slot's sampler (samp_bank, the same code as the CPU backend: a request samples the
// same way on both). A step whose wanted rows are all greedy without penalties or logprobs
// (samp_bank_plain_greedy) takes their tokens on the device instead (k_argmax: samp_first_max's
// pick), and so does one whose rows are each such or sample from at most GPU_SAMPLE_KMAX tokens,
// penalized or not, with logprobs or not (gpu_be_samp_row; k_sample: samp_bank_pick's token and
// logprobs, draw for draw), and so do a speculating row's verified tokens on the same terms: 4
// bytes a row come back rather than the vocabulary's logits. Admission takes KV pages from the
// free list (gpu_seq_start) and answers 1 when there are not enough: the request waits, nothing
// is preempted.

typedef struct {
    gpu_engine g;
    samp_bank bank;
    int *reserve;            // [max_seqs] tokens each admitted sequence may reach
    int32_t *res_tok;        // [max_seqs] results of the last step
    float *res_lp;           // [max_seqs]
    int32_t *res_top_ids;    // [max_seqs, MOET_MAX_LOGPROBS]
    float *res_top_lp;       // [max_seqs, MOET_MAX_LOGPROBS]
    int *l_slots;            // [max_seqs] the launched step's slots and wants (the caller's arrays
    uint8_t *l_want;         // [max_seqs]  may change before collect)
    int l_n, l_rows, launched;
    int l_ids;               // the launched step's wanted rows are all picked on the device: their ids come back
                             // (k_argmax where all are plain greedy, else k_sample), not logits
    int lost;                // a step's synchronisation failed: the context is unusable (ENGINE_LOST from then on)
    long long spec_dev_rows; // speculating rows' verified tokens whose picks the device made (k_sample)
    engine_fault fault;      // MOET_FAULT (the backend's test hook)
    // speculation with the MTP head (g.o.mtp; as the CPU's ref_be_spec_row): per slot the drafts
    // per decode row (spec ≤ spec_cap, set_spec), the drafts ready for its next row (draft [nd]),
    // whether the head waits for a chunk's next token (has_pend, its h in g.mtp_pend); a step with
    // speculating rows runs in launch (l_sync) and collect gives its results
    int max_spec;
    int *spec, *spec_cap, *nd, *has_pend;   // [max_seqs]
    int32_t *draft;                          // [max_seqs, MOET_MAX_SPEC]
    int *res_n, *res_drafted;                // [max_seqs] (engine_result)
    int32_t *res_more;                       // [max_seqs, MOET_MAX_SPEC]
    float *res_more_lp;                      // [max_seqs, MOET_MAX_SPEC]
    int32_t *res_more_top_ids;               // [max_seqs, MOET_MAX_SPEC, MOET_MAX_LOGPROBS]
    float *res_more_top_lp;                  // [max_seqs, MOET_MAX_SPEC, MOET_MAX_LOGPROBS]
    int32_t *spec_tok, *spec_next;           // [MOET_MAX_SPEC + 1] a verification's fed tokens; [Tm] the head rows' next tokens
    int *sub_slots, *sub_off, *sub_row;      // [max_seqs], [max_seqs + 1], [max_seqs] the step's other rows
    int32_t *sub_ids;                        // [Tm]
    uint8_t *sub_want;                       // [max_seqs]
    int l_sync, l_spec;
    arena mem;
} gpu_backend;

static void gpu_be_carve(gpu_backend *b, arena *a) {
    int S = b->g.o.max_seqs;
    ARENA_TAKE(a, b->reserve, S, "reserves");
    ARENA_TAKE(a, b->res_tok, S, "picked ids");
    ARENA_TAKE(a, b->res_lp, S, "logprobs");
    ARENA_TAKE(a, b->res_top_ids, (size_t)S * MOET_MAX_LOGPROBS, "top ids");
    ARENA_TAKE(a, b->res_top_lp, (size_t)S * MOET_MAX_LOGPROBS, "top logprobs");
    ARENA_TAKE(a, b->l_slots, S, "step slots");
    ARENA_TAKE(a, b->l_want, S, "step wants");
    size_t Sp = b->max_spec ? (size_t)MOET_MAX_SPEC : 0, Sq = b->max_spec ? (size_t)S : 0, Tm = b->max_spec ? (size_t)b->g.o.max_tokens : 0;
    ARENA_TAKE(a, b->spec, Sq, "drafts per row");
    ARENA_TAKE(a, b->spec_cap, Sq, "drafts admitted");
    ARENA_TAKE(a, b->nd, Sq, "drafts ready");
    ARENA_TAKE(a, b->has_pend, Sq, "pending head rows");
    ARENA_TAKE(a, b->draft, Sq * Sp, "drafts");
    ARENA_TAKE(a, b->res_n, Sq, "step token counts");
    ARENA_TAKE(a, b->res_drafted, Sq, "step drafts");
    ARENA_TAKE(a, b->res_more, Sq * Sp, "step tokens past the first");
    ARENA_TAKE(a, b->res_more_lp, Sq * Sp, "their logprobs");
    ARENA_TAKE(a, b->res_more_top_ids, Sq * Sp * MOET_MAX_LOGPROBS, "their top logprob ids");
    ARENA_TAKE(a, b->res_more_top_lp, Sq * Sp * MOET_MAX_LOGPROBS, "their top logprobs");
    ARENA_TAKE(a, b->spec_tok, Sp ? Sp + 1 : 0, "verification tokens");
    ARENA_TAKE(a, b->spec_next, Tm, "MTP head next tokens");
    ARENA_TAKE(a, b->sub_slots, Sq, "other rows' slots");
    ARENA_TAKE(a, b->sub_off, Sq ? Sq + 1 : 0, "other rows' offsets");
    ARENA_TAKE(a, b->sub_row, Sq, "other rows' places");
    ARENA_TAKE(a, b->sub_ids, Tm, "other rows' ids");
    ARENA_TAKE(a, b->sub_want, Sq, "other rows' wants");
}

// The sequence in slot s for engine_check_step: its length and its reserve.
static void gpu_be_at(const void *self, int s, int *pos, int *limit) {
    const gpu_backend *b = self;
    *pos = b->g.pos[s];
    *limit = b->reserve[s];
}

static int gpu_be_check(const gpu_backend *b, const char *what, int n, const int *slots, const int32_t *ids, const int *off, moet_err *e) {
    return engine_check_step(what, b->g.o.max_seqs, b->g.o.max_tokens, b->g.m->cfg.vocab, &b->bank, gpu_be_at, b, n, slots, ids, off, e);
}

static int gpu_be_admit_from(void *self, int slot, const engine_admit *a, const int32_t *from, int n_from, moet_err *e) {
    gpu_backend *b = self;
    if (engine_check_admit(b->g.o.max_seqs, b->g.o.max_len, &b->bank, slot, a, e) ||
        engine_check_from(b->g.pfx_block, b->g.pfx_blocks, b->g.pfx_end, a, from, n_from, e))
        return -1;
    if (a->spec < 0 || a->spec > b->max_spec)
        return b->max_spec ? err_set(e, "admit: %d draft tokens per step; this backend drafts at most %d", a->spec, b->max_spec)
                           : err_set(e, "admit: speculative decoding needs the model's multi-token-prediction head (mtp.*), which is not loaded");
    if (a->spec && n_from)
        return err_set(e, "admit: a speculating sequence starts from its first token (the MTP head's cache is not in prefix blocks)");
    if (gpu_seq_start_from(&b->g, slot, a->reserve, from, n_from)) return 1;   // not enough free KV pages now
    if (samp_bank_admit(&b->bank, slot, &a->sp, a->seed, a->logprobs, a->top_logprobs, a->prompt, a->n_prompt, e)) {
        gpu_seq_end(&b->g, slot);
        return -1;
    }
    b->reserve[slot] = a->reserve;
    if (b->max_spec) b->spec[slot] = b->spec_cap[slot] = a->spec, b->nd[slot] = b->has_pend[slot] = 0;
    return 0;
}

// engine_backend.set_spec: the slot drafts k (≤ what it was admitted with) from its next pick on.
static void gpu_be_set_spec(void *self, int slot, int k) {
    gpu_backend *b = self;
    MOET_ASSERT(b->max_spec && k >= 0 && k <= b->spec_cap[slot], "set_spec: %d drafts for slot %d, admitted with %d", k, slot,
                b->max_spec ? b->spec_cap[slot] : 0);
    b->spec[slot] = k;
}

static int gpu_be_admit(void *self, int slot, const engine_admit *a, moet_err *e) { return gpu_be_admit_from(self, slot, a, NULL, 0, e); }

static int gpu_be_save(void *self, int slot, int block, moet_err *e) {
    gpu_backend *b = self;
    if (b->launched) return err_set(e, "save: a step is launched and not collected");
    const gpu_engine *g = &b->g;
    if (engine_check_save(g->pfx_block, g->pfx_blocks, g->pfx_end, g->o.max_seqs, &b->bank, slot,
                          slot >= 0 && slot < g->o.max_seqs ? g->pos[slot] : 0, block, e))
        return -1;
    gpu_prefix_save(&b->g, slot, block);
    return 0;
}

static void gpu_be_drop(void *self, int block) { gpu_prefix_drop(&((gpu_backend *)self)->g, block); }

static void gpu_be_release(void *self, int slot) {
    gpu_backend *b = self;
    samp_bank_release(&b->bank, slot);
    gpu_seq_end(&b->g, slot);
    b->reserve[slot] = 0;
}

// Whether slot's pick can be made on the device, samp_bank_pick's token draw for draw (k_sample,
// sass/sample.cu): greedy, or sampled from at most GPU_SAMPLE_KMAX tokens (top_k), with penalties and
// logprobs or without; then r is its row: the parameters as samp_pick derives them, the generator
// and a penalized slot's seen tokens with the times each was generated (appended to pen [*npen][2];
// room for GPU_SAMPLE_PEN pairs: a slot past it stays on the host) as they will be at the pick —
// after the n_ahead picks ahead [n_ahead] that come before it in the same step (a speculating row's
// drafts, the row's pick assuming them kept: each advanced the generator by its one draw when the
// slot samples, and was generated once more), which the caller notes only when it takes them
// (gpu_be_took, as the pick does).
static int gpu_be_samp_row(const samp_bank *bk, int slot, const int32_t *ahead, int n_ahead, gpu_samp_row *r, int32_t *pen, int *npen) {
    const samp_slot *s = &bk->slot[slot];
    const samp_params *p = &s->sp;
    _Static_assert(MOET_MAX_LOGPROBS <= GPU_SAMPLE_TOP, "k_sample: a request's top_logprobs");
    if (!s->active || bk->n_vocab > 64 * GPU_SAMPLE_NB) return 0;   // (a row's blocks in its shared memory)
    if (p->temperature != 0 && (p->top_k < 1 || p->top_k > GPU_SAMPLE_KMAX)) return 0;
    MOET_ASSERT(n_ahead >= 0 && n_ahead <= MOET_MAX_SPEC, "k_sample: %d picks ahead of a row", n_ahead);
    // the ids ahead not seen yet (each once): the slot's pick notes them before this one
    int32_t fresh[MOET_MAX_SPEC];
    int nf = 0;
    for (int a = 0; s->penalized && a < n_ahead; a++) {
        const int32_t t = ahead[a];
        int dup = (s->seen[t >> 3] >> (t & 7)) & 1;
        for (int f = 0; f < nf; f++) dup |= fresh[f] == t;
        if (!dup) fresh[nf++] = t;
    }
    const int pn = s->penalized ? s->n_touched + nf : 0;
    if (pn > GPU_SAMPLE_PEN - *npen) return 0;
    memset(r, 0, sizeof *r);
    uint64_t near = 0;   // the ids ahead by their low 6 bits: most seen tokens are none of them
    for (int a = 0; a < n_ahead; a++) near |= 1ull << (ahead[a] & 63);
    for (int i = 0; i < pn; i++) {
        const int32_t t = i < s->n_touched ? s->touched[i] : fresh[i - s->n_touched];
        int c = i < s->n_touched ? s->count[t] : 0;
        if (near >> (t & 63) & 1)
            for (int a = 0; a < n_ahead; a++) c += ahead[a] == t;
        pen[2 * (*npen + i)] = t, pen[2 * (*npen + i) + 1] = c < UINT16_MAX ? c : UINT16_MAX;   // (samp_note's count saturates)
    }
    r->rep = p->repetition_penalty, r->freq = p->frequency_penalty, r->pres = p->presence_penalty;
    r->pen_off = *npen, r->pen_n = pn;
    *npen += pn;
    r->logprobs = s->logprobs, r->n_top = s->logprobs ? s->top_logprobs : 0;
    samp_rng g = s->rng;
    for (int a = 0; p->temperature != 0 && a < n_ahead; a++) samp_next(&g);
    memcpy(r->rng, g.s, sizeof r->rng);
    r->temperature = p->temperature;
    r->inv_t = p->temperature != 0 ? 1.0f / p->temperature : 0;
    r->min_p = p->min_p;
    r->min_p_log = p->min_p > 0 ? logf(p->min_p) - 1e-3f : 0;
    r->top_p = p->top_p;
    r->top_k = p->top_k;
    return 1;
}

// samp_logprobs's ends from k_sample's parts q of a row whose pick is `picked`: lse = top + log(Σ)
// (the host's log), the pick's logit − lse into *lp, the n_top most likely and theirs into ids /
// lps (past the row's numbers: the pick and −inf, as samp_logprobs fills them).
static void gpu_be_lp_finish(const gpu_samp_lp *q, int32_t picked, int n_top, float *lp, int32_t *ids, float *lps) {
    const double lse = q->top + log(q->total);
    *lp = (float)(q->chosen - lse);
    for (int k = 0; k < n_top; k++) {
        ids[k] = k < q->n ? q->ids[k] : picked;
        lps[k] = k < q->n ? (float)(q->vals[k] - lse) : -INFINITY;
    }
}

// Slot's pick made on the device as row j of the last k_sample or k_argmax (ids_host[j], with its
// logprobs' parts samp_lp_host[j] where the slot asked for them): samp_bank_pick's token into *y
// (and *lp, ti / tl [top_logprobs]), the slot's sampler advanced as the pick advances it — one draw
// when it samples, the token noted for the penalties.
static void gpu_be_took(gpu_backend *b, int slot, int j, int32_t *y, float *lp, int32_t *ti, float *tl) {
    samp_slot *sl = &b->bank.slot[slot];
    const int32_t picked = *y = b->g.ids_host[j];
    MOET_ASSERT(picked >= 0 && picked < b->g.m->cfg.vocab, "sampler: no candidate token (k_sample: %d)", picked);
    if (sl->sp.temperature != 0) samp_next(&sl->rng);
    if (sl->penalized) samp_note(&b->bank, sl, picked, 1);
    if (sl->logprobs) gpu_be_lp_finish(&b->g.samp_lp_host[j], picked, sl->top_logprobs, lp, ti, tl);
}

// Queues the picks of a step's nr wanted rows (slots[k] for each k with want[k], in order) behind
// it: where the device can make every one (gpu_be_samp_row), 4 bytes a row come back instead of the
// vocabulary's logits — plain greedy rows through k_argmax, a step with sampling rows too through
// k_sample; else the copy of the rows' logits, for the host's sampler. Returns whether ids come back.
static int gpu_be_queue_picks(gpu_backend *b, int n, const int *slots, const uint8_t *want, int nr) {
    int greedy = nr > 0, dev = nr > 0, npen = 0, lp = 0;
    for (int k = 0, j = 0; k < n; k++) {
        if (!want[k]) continue;
        greedy &= samp_bank_plain_greedy(&b->bank, slots[k]);
        dev &= j < nr && gpu_be_samp_row(&b->bank, slots[k], NULL, 0, &b->g.samp_host[j], b->g.samp_pen_host, &npen);
        lp |= b->bank.slot[slots[k]].logprobs;
        j++;
    }
    if (greedy) gpu_step_greedy_async(&b->g, nr);
    else if (dev) gpu_step_sample_async(&b->g, 0, nr, npen, lp);
    else gpu_step_logits_async(&b->g, nr);
    return greedy || dev;
}

// The pick of slot's row, the j-th wanted row of the step gpu_be_queue_picks queued (ids: it queued
// the device's picks) into result row i — once that step is done.
static void gpu_be_take(gpu_backend *b, int ids, int slot, int j, int i) {
    int32_t *ti = b->res_top_ids + (size_t)i * MOET_MAX_LOGPROBS;
    float *tl = b->res_top_lp + (size_t)i * MOET_MAX_LOGPROBS;
    if (ids) gpu_be_took(b, slot, j, &b->res_tok[i], &b->res_lp[i], ti, tl);
    else samp_bank_pick(&b->bank, slot, b->g.logits_host + (size_t)j * b->g.m->cfg.vocab, &b->res_tok[i], &b->res_lp[i], ti, tl);
}

// spec_accept's pick from the device's (gpu_be_took: row j of the k_sample just run for slot).
typedef struct {
    gpu_backend *b;
    int slot;
} gpu_spec_dev;

static void gpu_spec_pick_dev(void *ctx, int j, int32_t *y, float *lp, int32_t *ti, float *tl) {
    const gpu_spec_dev *d = ctx;
    gpu_be_took(d->b, d->slot, j, y, lp, ti, tl);
}

// Row i of a step (slot, ids [c], want) on a speculating slot, as the CPU's ref_be_spec_row (the
// definition; moet.c): the fed tokens, then the slot's drafts when it is a decode row (c = 1) —
// one verification of 1 + nd tokens through the recurrent GDN kernel (g.rule_rows: the bits of
// single decode steps), every token's logits and hidden state after the final norm kept. After
// each fed token j the slot's sampler picks y_j exactly as without drafts (on the device where
// k_sample can: gpu_be_samp_row), and the draft fed next is kept when it is y_j; past a
// rejection the GDN states and conv windows the verification left after the last kept token are
// taken back (gpu_hist_restore: nothing runs again). The head then takes a row per fed token
// whose successor is known (a prompt chunk's last token waits in g.mtp_pend for the next chunk's
// first) and, after a picked token, drafts from its last row (the greedy pick of its logits,
// k_argmax), each further draft feeding the head's normed output back (those rows undone
// afterwards). Synchronous.
static int gpu_be_spec_row(gpu_backend *b, int i, int slot, const int32_t *ids, int c, int want, moet_err *e) {
    gpu_engine *g = &b->g;
    int H = g->m->cfg.hidden, V = g->m->cfg.vocab, p = g->pos[slot];
    int nd = want && c == 1 ? b->nd[slot] : 0;
    if (nd > b->reserve[slot] - p - 1) nd = b->reserve[slot] - p - 1;   // within the reserve
    if (nd > g->o.max_tokens - 1) nd = g->o.max_tokens - 1;
    if (nd < 0) nd = 0;
    const int32_t *ft = nd ? b->spec_tok : ids;   // the fed tokens: the row's, then the drafts
    if (nd) {
        b->spec_tok[0] = ids[0];
        memcpy(b->spec_tok + 1, b->draft + (size_t)slot * MOET_MAX_SPEC, sizeof(int32_t) * nd);
    }
    int off[2] = {0, c + nd}, nr;
    uint8_t w1 = 1;   // every token's logits and hidden state (the head's rows)
    g->rule_rows = g->keep_hist = nd > 0;
    int rc = gpu_step(g, 1, &slot, ft, off, &w1, GPU_OUT_ALL, NULL, NULL, NULL, &nr, e);
    g->rule_rows = g->keep_hist = 0;
    if (rc) return -1;
    CU_CHECK(cu.cuMemcpyDtoDAsync(g->mtp_h, g->xn, sizeof(float) * (size_t)(c + nd) * H, g->compute));
    int m = 0;             // accepted drafts
    int32_t ylast = -1;    // the last token picked
    b->res_tok[i] = -1, b->res_n[i] = 0, b->res_drafted[i] = nd;
    b->nd[slot] = 0;
    if (want) {   // the picks of rows c − 1 .. c − 1 + nd
        const spec_res o = {b->res_tok, b->res_more, b->res_top_ids, b->res_more_top_ids, b->res_lp, b->res_more_lp, b->res_top_lp, b->res_more_top_lp, b->res_n};
        int dev = 1, npen = 0;   // on the device where each can be (row j assuming the drafts before it kept: past a
                                 // rejection the rows' picks are not taken), 4 bytes a row back instead of V · 4
        for (int j = 0; dev && j <= nd; j++) dev = gpu_be_samp_row(&b->bank, slot, ft + 1, j, &g->samp_host[j], g->samp_pen_host, &npen);
        if (dev) {
            gpu_step_sample_async(g, c - 1, nd + 1, npen, b->bank.slot[slot].logprobs);
            CU_CHECK(cu.cuStreamSynchronize(g->compute));
            gpu_spec_dev d = {b, slot};
            m = spec_accept(gpu_spec_pick_dev, &d, ft, nd, i, &o, &ylast);
            b->spec_dev_rows += nd + 1;
        } else {
            spec_host h = {&b->bank, slot, V, gpu_step_logits(g, nr) + (size_t)(c - 1) * V};
            m = spec_accept(spec_pick_host, &h, ft, nd, i, &o, &ylast);
        }
    }
    int kept = nd ? m + 1 : c;   // fed tokens that stay in the sequence
    if (kept < c + nd) {         // a rejected draft: the state after the last kept token, kept by the verification
        gpu_hist_restore(g, slot, kept - 1);   // (kept ≥ 1: the row's own token; drafts only follow one-token rows)
        g->pos[slot] = p + kept;               // (the KV past it is rewritten before it is read)
    }
    // the head: the pending row (its successor is this row's first token), then the kept tokens
    // whose successors are known: each fed token but the last, and the last when a token was picked
    if (b->has_pend[slot]) {
        gpu_mtp_rows(g, slot, 1, g->mtp_pend + (CUdeviceptr)slot * H * sizeof(float), &ft[0], 0, NULL);
        b->has_pend[slot] = 0;
    }
    for (int j = 0; j + 1 < kept; j++) b->spec_next[j] = ft[j + 1];   // (an accepted draft is the token picked there)
    if (want) b->spec_next[kept - 1] = ylast;
    int rows = want ? kept : kept - 1;
    if (rows > 0) gpu_mtp_rows(g, slot, rows, g->mtp_h, b->spec_next, want, NULL);
    if (!want) {
        CU_CHECK(cu.cuMemcpyDtoDAsync(g->mtp_pend + (CUdeviceptr)slot * H * sizeof(float), g->mtp_h + (CUdeviceptr)(kept - 1) * H * sizeof(float),
                                      sizeof(float) * H, g->compute));
        b->has_pend[slot] = 1;
        return 0;
    }
    // drafts: the last row's prediction, then the head's output fed back with each draft
    int mtp_end = g->mtp_pos[slot], room = g->seq_pages[slot] * GPU_KV_PAGE < g->o.max_len ? g->seq_pages[slot] * GPU_KV_PAGE : g->o.max_len;
    int32_t *dr = b->draft + (size_t)slot * MOET_MAX_SPEC;
    for (int k = 0; k < b->spec[slot]; k++) {
        if (k) {
            if (g->mtp_pos[slot] + 1 > room) break;   // the head's cache is full: fewer drafts
            CU_CHECK(cu.cuMemcpyDtoDAsync(g->mtp_tmp, g->xn + (CUdeviceptr)(k == 1 ? rows - 1 : 0) * H * sizeof(float), sizeof(float) * H, g->compute));
            gpu_mtp_rows(g, slot, 1, g->mtp_tmp, &dr[k - 1], 1, NULL);
        }
        dr[k] = gpu_logits_argmax(g, k ? 0 : rows - 1);
        b->nd[slot] = k + 1;
    }
    g->mtp_pos[slot] = mtp_end;
    return 0;
}

// A step with speculating rows (gpu_be_spec_row, one by one), the others in one step after them,
// all run before it returns (collect gives the results).
static int gpu_be_launch_spec(gpu_backend *b, const engine_step *s, moet_err *e) {
    int n = 0;
    b->sub_off[0] = 0;
    for (int i = 0; i < s->n; i++) {
        int c = s->off[i + 1] - s->off[i];
        b->res_n[i] = 1, b->res_drafted[i] = 0;
        if (b->spec[s->slots[i]]) {
            if (gpu_be_spec_row(b, i, s->slots[i], s->ids + s->off[i], c, s->want[i], e)) return -1;
            continue;
        }
        memcpy(b->sub_ids + b->sub_off[n], s->ids + s->off[i], sizeof(int32_t) * c);
        b->sub_slots[n] = s->slots[i], b->sub_want[n] = s->want[i], b->sub_row[n] = i;
        b->sub_off[n + 1] = b->sub_off[n] + c;
        n++;
    }
    if (n) {
        int nr;
        if (gpu_step(&b->g, n, b->sub_slots, b->sub_ids, b->sub_off, b->sub_want, GPU_OUT_LAST, NULL, NULL, NULL, &nr, e)) return -1;
        const int ids = gpu_be_queue_picks(b, n, b->sub_slots, b->sub_want, nr);
        CU_CHECK(cu.cuStreamSynchronize(b->g.compute));
        for (int k = 0, j = 0; k < n; k++) {
            int i = b->sub_row[k];
            b->res_tok[i] = -1;   // no token for a mid-prompt chunk
            if (b->sub_want[k]) gpu_be_take(b, ids, b->sub_slots[k], j++, i);
        }
    }
    b->l_sync = 1;
    b->launched = 1;
    return 0;
}

static int gpu_be_launch(void *self, const engine_step *s, moet_err *e) {
    gpu_backend *b = self;
    if (b->launched) return err_set(e, "launch: the step launched before was not collected");
    if (b->lost) return err_set(e, "the GPU context was lost in an earlier step"), ENGINE_LOST;
    int f = engine_fault_launch(&b->fault, e);
    if (f) return f;
    if (gpu_be_check(b, "launch", s->n, s->slots, s->ids, s->off, e)) return -1;
    int n_spec = 0;
    for (int i = 0; b->max_spec && i < s->n; i++) n_spec += b->spec[s->slots[i]] > 0;
    b->l_sync = 0;
    if (n_spec) return gpu_be_launch_spec(b, s, e);
    int nr;
    if (gpu_step(&b->g, s->n, s->slots, s->ids, s->off, s->want, GPU_OUT_LAST, NULL, NULL, NULL, &nr, e)) return -1;
    b->l_ids = gpu_be_queue_picks(b, s->n, s->slots, s->want, nr);
    memcpy(b->l_slots, s->slots, sizeof(int) * (size_t)s->n);
    memcpy(b->l_want, s->want, (size_t)s->n);
    b->l_n = s->n;
    b->l_rows = nr;
    b->launched = 1;
    return 0;
}

static int gpu_be_collect(void *self, engine_result *out, moet_err *e) {
    gpu_backend *b = self;
    if (!b->launched) return err_set(e, "collect: no step was launched");
    if (b->l_sync) {   // a step with speculating rows: done in launch
        b->launched = 0;
        *out = (engine_result){.token = b->res_tok, .logprob = b->res_lp, .top_ids = b->res_top_ids, .top_lp = b->res_top_lp,
                               .n_tok = b->res_n, .drafted = b->res_drafted, .more = b->res_more, .more_lp = b->res_more_lp,
                               .more_top_ids = b->res_more_top_ids, .more_top_lp = b->res_more_top_lp};
        return 0;
    }
    // the step and its logits copy are done. An error here is the step's kernels' (launches and copies
    // were accepted): a fault in a kernel, which CUDA makes sticky — the context can run nothing
    // more. The scheduler answers every request and the server exits (ENGINE_LOST).
    CUresult r = cu.cuStreamSynchronize(b->g.compute);
    if (r) {
        const char *name = "?", *str = "?";
        if (cu.cuGetErrorName) cu.cuGetErrorName(r, &name);
        if (cu.cuGetErrorString) cu.cuGetErrorString(r, &str);
        b->lost = 1, b->launched = 0;
        return err_set(e, "the GPU failed in a step: %s (%d): %s", name, r, str), ENGINE_LOST;
    }
    for (int i = 0, j = 0; i < b->l_n; i++) {
        b->res_tok[i] = -1;   // no token for a mid-prompt chunk
        if (b->l_want[i]) gpu_be_take(b, b->l_ids, b->l_slots[i], j++, i);
    }
    b->launched = 0;
    *out = (engine_result){.token = b->res_tok, .logprob = b->res_lp, .top_ids = b->res_top_ids, .top_lp = b->res_top_lp};
    return 0;
}

static int gpu_be_forward_all(void *self, int n, const int *slots, const int32_t *ids, const int *off, float *logits,
                              float **hidden, int32_t **router_ids, float **router_w, moet_err *e) {
    gpu_backend *b = self;
    if (b->launched) return err_set(e, "forward_all: the step launched before was not collected");
    if (gpu_be_check(b, "forward_all", n, slots, ids, off, e)) return -1;
    int nr;
    if (gpu_step(&b->g, n, slots, ids, off, NULL, GPU_OUT_ALL, hidden, router_ids, router_w, &nr, e)) return -1;
    memcpy(logits, gpu_step_logits(&b->g, nr), sizeof(float) * (size_t)nr * b->g.m->cfg.vocab);
    return 0;
}

// One step through every kernel before the ready line: the driver's first-launch work and any
// first-touch cost happen at boot, not in the first request (slot 0's state is zeroed again
// when a request takes it; its KV pages are written before they are read).
// Two steps: a row of two tokens (the chunked GDN kernel) and then one of one token (the
// recurrent one), as far as the sizes allow.
static void gpu_warm(gpu_engine *g) {
    int slot = 0, nr = 0, n = g->o.max_tokens < 2 || g->o.max_len < 3 ? 1 : 2;
    int32_t ids[2] = {0, 0};
    moet_err we;
    if (gpu_seq_start(g, slot, n + (n == 2))) return;
    for (int k = n; k >= 1; k--) {
        int off[2] = {0, k};
        if (gpu_step(g, 1, &slot, ids, off, NULL, GPU_OUT_LAST, NULL, NULL, NULL, &nr, &we)) break;
        gpu_step_logits(g, nr);
    }
    if (nr > 0) {   // and the picks' kernels on its last row (what they pick is not used)
        g->samp_host[0] = (gpu_samp_row){.temperature = 1, .inv_t = 1, .top_p = 1, .top_k = 1};
        gpu_step_greedy_async(g, 1);
        g->samp_host[0].logprobs = 1, g->samp_host[0].n_top = 1;
        gpu_step_sample_async(g, 0, 1, 0, 1);
        CU_CHECK(cu.cuStreamSynchronize(g->compute));
    }
    gpu_seq_end(g, slot);
    if (g->cached) g->cache.reads = 0;   // MOET_FAULT=read:N counts the reads of serving, not these (the readers are idle)
}

static void gpu_be_free(gpu_backend *b) {
    gpu_free(&b->g);
    samp_bank_free(&b->bank);
    arena_release(&b->mem);
}

// With pfx_blocks prefix blocks of pfx_block tokens (gpu_init_prefix; 0: none).
static int gpu_be_init_prefix(gpu_backend *b, const ck_model *m, const gpu_opts *o, int pfx_block, int pfx_blocks, const char *planes,
                              const pf_serve_opts *po, moet_err *e) {
    memset(b, 0, sizeof *b);
    if (gpu_init_prefix(&b->g, m, o, pfx_block, pfx_blocks, planes, po, e)) return -1;
    b->max_spec = o->mtp ? MOET_MAX_SPEC : 0;
    arena_plan p = arena_plan_begin(&b->mem, "gpu backend", ARENA_HOST, e);
    while (arena_plan_pass(&p)) gpu_be_carve(b, p.on);
    if (p.failed || samp_bank_init(&b->bank, m->cfg.vocab, o->max_seqs, o->max_len, e)) {
        gpu_be_free(b);
        return -1;
    }
    gpu_warm(&b->g);
    return 0;
}

static int gpu_be_init(gpu_backend *b, const ck_model *m, const gpu_opts *o, const char *planes, const pf_serve_opts *po, moet_err *e) {
    return gpu_be_init_prefix(b, m, o, 0, 0, planes, po, e);
}

static engine_backend gpu_backend_of(gpu_backend *b) {
    b->lost = 0;
    engine_fault_init(&b->fault);
    engine_backend be = {b, b->g.m->cfg.vocab, b->g.o.max_seqs, b->g.o.max_len, b->g.chunk_align, gpu_be_admit, gpu_be_release,
                         gpu_be_launch, gpu_be_collect, gpu_be_forward_all, b->g.pfx_block, b->g.pfx_blocks,
                         b->g.pfx_blocks ? gpu_be_admit_from : NULL, b->g.pfx_blocks ? gpu_be_save : NULL,
                         b->g.pfx_blocks ? gpu_be_drop : NULL, b->max_spec, b->max_spec ? gpu_be_set_spec : NULL};
    return be;
}

// ---- choosing a backend ------------------------------------------------------------------------

typedef struct {
    int max_seqs, max_len, max_tokens;   // sequence slots, tokens per sequence, tokens per step
    int threads;                         // CPU: matrix product workers
    int kv_dtype;                        // GPU: GPU_KV_*
    const char *planes;                  // routed experts from this plane file, or NULL
    pf_serve_opts popt;
    double host_margin_gb;               // GPU sharing the host's memory: GiB of MemAvailable left to the host
    int no_graphs;                       // GPU: no decode graphs, every kernel launched by the host (gpu_opts)
    int no_drafts;                       // GPU: the command never drafts: the model's MTP head stays off the device
    int act_bf16;                        // --act-dtype bf16: the tensor-core products read their inputs' bf16 rounding (both backends);
                                         // −1 (auto): the GPU decides (gpu_opts), the CPU reference takes f32
} engine_opts;

typedef struct {
    int is_gpu;
    ref_engine r;
    gpu_backend g;
    pf_attached pa;      // CPU: the plane slots in host memory
    engine_backend be;
} engine_any;

// --kv-dtype: f32, bf16 or fp8.
static int engine_kv_dtype(const char *s, int *out) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, gpu_kv_names[i])) { *out = i; return 0; }
    return -1;
}

// --act-dtype: f32 (the products' inputs as they are: three bf16 parts on the GPU), bf16 (their
// bf16 rounding: one part) or auto (−1: bf16 on the GPU unless the KV cache is f32, f32 on the
// CPU reference) → *bf16.
static int engine_act_dtype(const char *s, int *bf16) {
    if (!strcmp(s, "auto")) { *bf16 = -1; return 0; }
    if (!strcmp(s, "f32") || !strcmp(s, "bf16")) { *bf16 = !strcmp(s, "bf16"); return 0; }
    return -1;
}

// Whether the open engine's products read their inputs' bf16 rounding (what auto became).
static int engine_act_bf16(const engine_any *E) { return E->is_gpu ? E->g.g.k.parts == 1 : E->r.act_bf16; }

// How many prefix blocks of `bytes` each --prefix-cache-gb (gb) holds: MOET_PREFIX_BLOCKS when
// it was not given (gb < 0), none without a block size. A size that holds no block is an error.
static int engine_prefix_blocks(int block, double gb, size_t bytes, int *blocks, moet_err *e) {
    *blocks = 0;
    if (block <= 0 || gb == 0) return 0;
    if (gb < 0) { *blocks = MOET_PREFIX_BLOCKS; return 0; }
    double n = floor(gb * 1073741824.0 / (double)bytes);
    if (n < 1)
        return err_set(e, "--prefix-cache-gb %g holds no block of %d tokens (%.2f MiB each); 0 turns the cache off", gb, block,
                       bytes / 1048576.0);
    *blocks = n > MOET_MAX_PREFIX_BLOCKS ? MOET_MAX_PREFIX_BLOCKS : (int)n;
    return 0;
}

// Opens the backend `which` (auto | cpu | gpu) for model m (whose experts the CPU path may point
// at the plane file). auto takes the GPU when a driver and a device are there and says on stderr
// which backend runs and why; gpu without one is an error. `who` prefixes the messages.
// With prefix_block > 0 the backend keeps prefix blocks of that many tokens, as many as
// prefix_gb GiB hold (engine_prefix_blocks: < 0 for the default).
static int engine_open_prefix(engine_any *E, const char *which, ck_model *m, const engine_opts *o, int prefix_block,
                              double prefix_gb, const char *who, moet_err *e) {
    memset(E, 0, sizeof *E);
    int want_gpu = !strcmp(which, "gpu"), want_cpu = !strcmp(which, "cpu");
    if (!want_gpu && !want_cpu && strcmp(which, "auto")) return err_set(e, "--backend %s: expected auto, cpu or gpu", which);
    if (!want_cpu) {
        // the MTP head on the device too where the model has one and the command may draft
        // (speculation: --speculative-tokens; its BF16 layer is ~1.7 GB on Qwen3.6)
        gpu_opts go = {o->max_seqs, o->max_len, o->max_tokens, o->kv_dtype, (size_t)(o->host_margin_gb * 1073741824.0), o->no_graphs,
                       m->mtp.present && !o->no_drafts, o->act_bf16};
        int blocks;
        if (engine_prefix_blocks(prefix_block, prefix_gb, gpu_prefix_bytes(&m->cfg, o->kv_dtype, prefix_block, go.mtp), &blocks, e))
            return -1;
        // a flag the GPU cannot take is an error where there is one (asked before anything is
        // loaded), not a fallback
        int bad_block = blocks && prefix_block % GPU_GDN_C;
        if (bad_block) {
            gpu_device d;
            moet_err pe = {{0}};
            if (gpu_open(&d, &pe) == 0) {
                gpu_close(&d);
                return err_set(e, "--prefix-block %d: the GPU backend cuts prompts at multiples of %d tokens; a block must be one",
                               prefix_block, GPU_GDN_C);
            }
        }
        moet_err ge = {{0}};
        if (gpu_be_init_prefix(&E->g, m, &go, blocks ? prefix_block : 0, blocks, o->planes, &o->popt, &ge) == 0) {
            E->is_gpu = 1;
            E->be = gpu_backend_of(&E->g);
            gpu_describe(&E->g.g.dev, stderr);
            gpu_print_plan(&E->g.g, stderr);
            fprintf(stderr, "%s: backend gpu (%s, kernels: %s)\n", who, which, E->g.g.k.image);
            return 0;
        }
        if (want_gpu) return err_set(e, "--backend gpu: %s", ge.msg);
        fprintf(stderr, "%s: backend cpu (auto: %s)\n", who, ge.msg);
    } else
        fprintf(stderr, "%s: backend cpu (--backend cpu)\n", who);
    if (o->planes) {
        fprintf(stderr, "%s: reading the routed experts from %s%s\n", who, o->planes, o->popt.no_verify ? " (not verified)" : "");
        if (pf_attach_planes(m, o->planes, &o->popt, &E->pa, e)) return -1;
        if (E->pa.cached)
            fprintf(stderr, "%s: expert cache: %" PRIu64 " of %" PRIu64 " slots (%.1f MiB), a missing slot read%s when a step needs it\n", who,
                    pf_cache_stats.pool_slots, pf_cache_stats.file_slots, E->pa.cache.pool_bytes / 1048576.0,
                    o->popt.no_verify ? "" : " and hashed");
    }
    int pfx_blocks;
    if (engine_prefix_blocks(prefix_block, prefix_gb, ref_prefix_bytes(&m->cfg, prefix_block), &pfx_blocks, e) ||
        ref_init(&E->r, m, o->max_seqs, o->max_len, o->max_tokens, o->threads, e)) {
        pf_detach(&E->pa);
        return -1;
    }
    if (ref_prefix_init(&E->r, prefix_block, pfx_blocks, e)) {
        ref_free(&E->r);
        pf_detach(&E->pa);
        return -1;
    }
    E->r.act_bf16 = o->act_bf16 > 0;   // (auto: f32 on the CPU reference)
    E->be = ref_backend(&E->r);
    return 0;
}

static int engine_open(engine_any *E, const char *which, ck_model *m, const engine_opts *o, const char *who, moet_err *e) {
    return engine_open_prefix(E, which, m, o, 0, 0, who, e);
}

static void engine_close(engine_any *E) {
    if (E->is_gpu) gpu_be_free(&E->g);
    else {
        ref_free(&E->r);
        pf_detach(&E->pa);
    }
}

// Host + device bytes the engine holds (its sampler's included), for the boot line.
static double engine_mib(const engine_any *E) {
    if (!E->is_gpu) return (E->r.mem.cap + E->r.bank.mem.cap + E->r.pfx_mem.cap) / 1048576.0;
    const gpu_engine *g = &E->g.g;
    return (double)(g->weights.cap + g->pool.cap + g->kv.cap + g->state.cap + g->act.cap + g->pinned.cap + E->g.mem.cap +
                    E->g.bank.mem.cap) / 1048576.0;
}
