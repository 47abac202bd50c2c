// format/eval.c — moet eval: teacher-forced scoring of a JSONL data set (perplexity), and the
// reference file (MOETREF1) that lets a later run measure what changed: KL divergence, top-1
// agreement and the perplexity difference, token by token.
//
// Data. One JSON object per line (blank lines are ignored):
//   {"text": "..."}          tokenized as it is (added tokens written in the text, such as
//                            <|im_start|>, become their ids; nothing is prepended); every
//                            token after the first is scored
//   {"messages": [...]}      an OpenAI conversation (+ optional "tools"), rendered with the chat
//                            template without a generation prompt; only the assistant turns are
//                            scored — each turn's body after "<|im_start|>assistant\n" through its
//                            "<|im_end|>" — unless score_all, which scores every token after the
//                            first
// A line that cannot be scored (not JSON, neither or both fields, an empty conversation, fewer
// than two tokens, nothing to score) is a bad line: one error naming file and line, then the run
// stops, or with skip_bad goes on without it.
//
// Windows. A line longer than ctx tokens is cut as Hugging Face's strided perplexity does
// (transformers' "Perplexity of fixed-length models"): windows of ctx tokens begin at 0, stride,
// 2·stride, … until one reaches the end of the line; each window starts from an empty state and
// scores only the targets past the previous window's end (the first window from position 1), so
// every token is scored once, and every window after the first gives each of its targets at
// least ctx − stride tokens of context. A line of at most ctx tokens is one window, scored whole.
//
// Reference file (MOETREF1), little-endian:
//   [0, 4096)        "MOETREF1", u32 n, n bytes of JSON (what made it: model geometry, tokenizer
//                    SHA-256, data SHA-256 and line count, ctx, stride, the SHA-256 of the token
//                    stream and of the records), zero padding
//   [4096, …)        one record per scored token, in data order (line, then position):
//                    f64 log p(target), f64 log of the mass outside the top k (−inf: none),
//                    i32 target id, i32 0, i32 ids[k] (the k most likely, descending, ties to the
//                    lower id), f32 their log-probabilities
// KL(ref ‖ run) per token is then computed exactly over the reference's top k, and the tail
// (the tokens outside it) is taken as one outcome: that is the KL between the two distributions
// coarsened to k + 1 outcomes, a lower bound of the true KL (data processing inequality). The
// true value is at most kl_upper: the tail term maximised over every reference tail that is
// consistent with what was stored (total mass P_T, no token above the k-th probability), which
// puts the mass on the run's least likely tail tokens. Both are reported; the gap says what the
// truncation to k costs on this data.

// ---- the backend ---------------------------------------------------------------------------------
//
// All-position logits come from the engine backend's test entry (forward_all): the same forward
// pass the server runs, on whichever backend engine_open chose. A window runs in a slot taken
// with admit (a reserve of the longest window) and given back with release.

// ---- options, results ---------------------------------------------------------------------------

typedef struct {
    const char *model, *planes;   // checkpoint directory; routed experts from a plane file (or NULL)
    int no_verify, strict_revision;
    const char *tokenizer;        // tokenizer.json (NULL: the model directory's)
    const char *data;             // the JSONL file
    int64_t limit;                // score the first `limit` non-blank lines (0: all)
    int ctx, stride;              // window length and step in tokens (0: defaults)
    int score_all;                // conversations: score every token, not only the assistant turns
    int skip_bad;                 // bad lines: report and skip (else: stop at the first)
    int max_seqs, max_batch_tokens, threads;
    const char *backend;          // auto | gpu | cpu
    int kv_dtype;                 // GPU KV cache (GPU_KV_*)
    int act_bf16;                 // --act-dtype bf16: the matrix products' inputs rounded to bf16
    const char *save_ref;         // write a reference file
    int top_k;                    // log-probabilities it keeps per token
    const char *ref;              // compare with this reference file
    int progress;                 // progress lines on stderr
    double host_margin_gb;        // GPU sharing the host's memory: GiB of MemAvailable left to the host
} eval_opts;

typedef struct {
    char model[256], experts[16];
    int64_t lines, skipped, windows, tokens, forwarded;
    int ctx, stride;
    double nll, nll_se, ppl, ppl_se, seconds;
    // against a reference (has_ref)
    int has_ref, ref_top_k;
    char ref_model[256], ref_experts[16];
    double ref_ppl, ppl_diff, ppl_diff_se;   // this run − the reference
    double kl_mean, kl_se, kl_p99, kl_upper_mean, tail_mass_mean, top1;
} eval_result;

// ---- SHA-256 over several pieces (libcrypto EVP, on a pf_sha context) -------------------------

static void eval_sha_begin(pf_sha *s) { MOET_ASSERT(EVP_DigestInit_ex(s->ctx, EVP_sha256(), NULL) == 1, "SHA-256 init"); }
static void eval_sha_add(pf_sha *s, const void *p, size_t n) {
    MOET_ASSERT(EVP_DigestUpdate(s->ctx, p, n) == 1, "SHA-256 update");
}
static void eval_sha_end(pf_sha *s, uint8_t out[32]) {
    unsigned len = 0;
    MOET_ASSERT(EVP_DigestFinal_ex(s->ctx, out, &len) == 1 && len == 32, "SHA-256 final");
}

// ---- the model geometry a reference must share ---------------------------------------------------

#define EVAL_GEOM 14
static const char *const eval_geom_name[EVAL_GEOM] = {
    "vocab", "hidden", "layers", "attention_layers", "heads", "kv_heads", "head_dim", "linear_key_heads",
    "linear_value_heads", "linear_key_dim", "linear_value_dim", "experts", "experts_per_token", "expert_width"};

static void eval_geometry(const ck_config *c, int64_t g[EVAL_GEOM]) {
    int64_t v[EVAL_GEOM] = {c->vocab, c->hidden, c->n_layers, c->n_full, c->n_heads, c->n_kv_heads, c->head_dim,
                            c->lk_heads, c->lv_heads, c->lk_dim, c->lv_dim, c->n_experts, c->topk, c->inter};
    memcpy(g, v, sizeof v);
}

// ---- the run's state --------------------------------------------------------------------------

typedef struct {
    int64_t tok;      // first token in ids
    int32_t len;      // tokens of the window (the last one scored is its last token)
    int32_t from;     // window positions [from, len) are targets (when the mask says so); from >= 1
    int64_t first;    // index of its first scored token among all scored tokens
} eval_window;

typedef struct {
    int w;            // window in this slot, -1: idle
    int taken;        // admitted in the backend
    int fed;          // its tokens already through the forward pass
    int64_t next;     // index of its next scored token
} eval_slot;

// A reference file's header, as read back.
typedef struct {
    int top_k;
    size_t rec_bytes;
    int64_t tokens, data_lines, geom[EVAL_GEOM];
    int ctx, stride, score_all;
    uint8_t tok_sha[32], data_sha[32], tokens_sha[32], rec_sha[32];
    char model[256], experts[16], data[256];
} eval_ref_hdr;

#define EVAL_REC_HEAD 24   // f64 target log-prob, f64 tail log-mass, i32 target, i32 0
static size_t eval_rec_bytes(int k) { return EVAL_REC_HEAD + (size_t)8 * k; }

typedef struct {
    eval_opts o;
    const ck_config *cfg;
    const tok *t;
    int V;
    pf_sha sha;
    uint8_t tok_sha[32];
    // the data file
    arena_map data;
    const char *data_name;       // its last path component
    size_t data_used;            // bytes of the lines considered (through the --limit-th)
    uint8_t data_sha[32];        // SHA-256 of those bytes
    int64_t n_lines, n_skipped;  // lines considered / skipped as bad
    // one line at a time (its own arena, sized by the longest line)
    size_t line_cap, text_cap;
    js_doc doc;
    chat_mem cm;
    chat_turns turns;            // a conversation's assistant turns
    char *text;                  // [text_cap] the rendered conversation
    int32_t *enc;                // [text_cap] a line's tokens (a token is at least one byte of text)
    int32_t *whole;              // [text_cap] a conversation's tokens encoded in one piece
    uint8_t *enc_mask;           // [text_cap] 1: a target to score
    tok_scratch sc;
    arena line_mem, sc_mem;
    // the whole data set, tokenized (planned by a counting pass)
    int64_t n_tok, n_windows, n_scored, n_forward;
    int longest;                 // tokens fed for the longest window (its length − 1)
    int32_t *ids;                // [n_tok] every good line's tokens, in order
    uint8_t *mask;               // [n_tok] 1: scored when it is a window's target
    eval_window *win;            // [n_windows]
    uint8_t tokens_sha[32];
    // per scored token, summed in data order at the end (so results do not depend on batching)
    double *nll;                 // [n_scored] −log p(target)
    double *kl, *kl_hi;          // [n_scored] with a reference: KL lower / upper bound
    uint8_t *top1;               // [n_scored] with a reference: the argmaxes agree
    // one forward step
    int max_seqs, mbt;
    float *logits;               // [mbt, V]
    int32_t *step_ids;           // [mbt]
    int *row_slot, *off;         // [max_seqs], [max_seqs + 1]
    eval_slot *slots;            // [max_seqs]
    // scoring scratch
    samp_cand *cand;             // [V] (logit, id) candidates of the top-k selection
    int32_t *top_ids;            // [V] the selected ids, in order
    uint8_t *mark;               // [V] 1: in the current top-k set (all 0 between tokens)
    double *tail;                // [V] the run's tail log-probabilities (upper bound of the KL)
    uint8_t *recs;               // [mbt, rec_bytes] records of one step's row, for --save-ref
    arena mem;
    // reference in (--ref) and out (--save-ref)
    arena_map refm;
    eval_ref_hdr rh;
    of_file out;                 // the reference being written (format/outfile.c: removed on a failure or a signal)
    int out_k;
    size_t out_rec;
} eval_ctx;

// ---- reading the data --------------------------------------------------------------------------

static int eval_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

// The next non-blank line of the data (format/lines.c: without "\r\n" and a byte order mark;
// *long_line when it is over the line limit); 0 at the end.
static int eval_next_line(ln_reader *r, ln_line *l, int *long_line) {
    for (;;) {
        int k = ln_take(r, l);
        if (k == LN_NONE) return 0;
        *long_line = k == LN_LONG;
        if (*long_line || !eval_blank(l->s, l->n)) return 1;
    }
}

// Appends the tokens of text[0..n) to E->enc[*k ..) with mask value `scored`.
static int eval_encode(eval_ctx *E, const char *text, size_t n, int scored, size_t *k, moet_err *e) {
    size_t got = 0;
    if (n && tok_encode(E->t, &E->sc, text, n, E->enc + *k, E->text_cap - *k, &got, e)) return -1;
    memset(E->enc_mask + *k, scored, got);
    *k += got;
    return 0;
}

// One line into E->enc / E->enc_mask (*n tokens); -1 with e set when it is a bad line.
static int eval_line_tokens(eval_ctx *E, const char *s, size_t len, int *n, moet_err *e) {
    *n = 0;
    if (len > E->line_cap) return err_set(e, "the line has %zu bytes; the limit is %u", len, MOET_MAX_LINE);
    uint32_t nodes;
    size_t strs;
    if (js_measure(&E->doc, s, len, &nodes, &strs)) return err_set(e, "not valid JSON: %s", E->doc.err);
    if (nodes > E->doc.cap_nodes) return err_set(e, "%u JSON values; the limit is %u", nodes, E->doc.cap_nodes);
    MOET_ASSERT(js_parse(&E->doc, s, len) == 0, "second JSON pass: %s", E->doc.err);
    const js_node *root = js_root(&E->doc);
    if (root->type != JS_OBJ) return err_set(e, "expected a JSON object, got %s", js_type_name(root));
    const js_node *text = js_get(&E->doc, root, "text"), *msgs = js_get(&E->doc, root, "messages");
    if (text && msgs) return err_set(e, "has both \"text\" and \"messages\"; expected one of them");
    size_t k = 0;
    if (text) {
        if (text->type != JS_STR) return err_set(e, "\"text\": expected a string, got %s", js_type_name(text));
        if (text->len == 0) return err_set(e, "\"text\" is empty");
        if (eval_encode(E, text->str, text->len, 1, &k, e)) return -1;
    } else if (msgs) {
        chat_opts co = {0, 0};
        size_t tl;
        // no generation prompt: the conversation is complete
        if (chat_render_turns(&E->doc, msgs, js_get(&E->doc, root, "tools"), &co, 0, &E->turns, &E->cm, E->text,
                              E->text_cap, &tl, e))
            return -1;
        if (E->o.score_all) {
            if (eval_encode(E, E->text, tl, 1, &k, e)) return -1;
        } else {
            // A turn boundary falls right after "assistant\n" or right after "<|im_end|>" (an
            // added token), where the pre-tokenizer cuts the text anyway, so encoding the pieces
            // one by one gives the tokens of the whole text. Not when a body starts with a line
            // break the template leaves ("\r\n" after a </think>): "\n\r\n" is one piece. That
            // is checked, and such a line refused rather than scored on other tokens.
            size_t at = 0;
            for (int i = 0; i < E->turns.n; i++) {
                size_t a = E->turns.at[2 * i], b = E->turns.at[2 * i + 1];
                if (eval_encode(E, E->text + at, a - at, 0, &k, e) || eval_encode(E, E->text + a, b - a, 1, &k, e))
                    return -1;
                at = b;
            }
            if (eval_encode(E, E->text + at, tl - at, 0, &k, e)) return -1;
            if (E->turns.n == 0) return err_set(e, "the conversation has no assistant turn to score");
            size_t whole = 0;
            if (tok_encode(E->t, &E->sc, E->text, tl, E->whole, E->text_cap, &whole, e)) return -1;
            if (whole != k || memcmp(E->whole, E->enc, sizeof(int32_t) * k))
                return err_set(e, "an assistant turn starts inside a token of the rendered conversation (a body that "
                               "begins with a line break?); --score-all scores the whole conversation");
        }
    } else {
        return err_set(e, "expected {\"text\": ...} or {\"messages\": [...]}");
    }
    if (k < 2) return err_set(e, "%zu token; at least 2 are needed (the first is context only)", k);
    E->enc_mask[0] = 0;   // nothing predicts the first token
    *n = (int)k;
    return 0;
}

// The windows of one line (its tokens go to ids[tok0 ..], mask m): fills win[] when it is not
// NULL. Returns the windows that score something; *scored (the scored tokens before this line on
// entry) and *forward count the targets and the tokens fed.
static int64_t eval_cut(eval_ctx *E, int64_t tok0, int n, const uint8_t *m, eval_window *win, int64_t *scored,
                        int64_t *forward) {
    int C = E->o.ctx, S = E->o.stride;
    int64_t nw = 0;
    for (int b = 0, prev_end = 0;; b += S) {
        int end = b + C < n ? b + C : n, from = (prev_end > b + 1 ? prev_end : b + 1) - b, last = -1, cnt = 0;
        for (int p = from; p < end - b; p++)
            if (m[b + p]) { cnt++; last = p; }
        prev_end = end;
        if (cnt) {   // a window with nothing to score is not run; it ends at its last target
            if (win) win[nw] = (eval_window){tok0 + b, last + 1, from, *scored};
            nw++;
            *scored += cnt;
            *forward += last;
            if (last > E->longest) E->longest = last;
        }
        if (end == n) break;
    }
    return nw;
}

// Carves the data set and the step buffers; run once on a measuring arena and once for real.
static void eval_carve(eval_ctx *E, arena *a) {
    int has_ref = E->o.ref != NULL;
    ARENA_TAKE(a, E->ids, E->n_tok, "tokens");
    ARENA_TAKE(a, E->mask, E->n_tok, "target mask");
    ARENA_TAKE(a, E->win, E->n_windows, "windows");
    ARENA_TAKE(a, E->nll, E->n_scored, "token NLL");
    ARENA_TAKE(a, E->kl, has_ref ? E->n_scored : 0, "token KL");
    ARENA_TAKE(a, E->kl_hi, has_ref ? E->n_scored : 0, "token KL bound");
    ARENA_TAKE(a, E->top1, has_ref ? E->n_scored : 0, "top-1 agreement");
    ARENA_TAKE(a, E->logits, (size_t)E->mbt * E->V, "step logits");
    ARENA_TAKE(a, E->step_ids, E->mbt, "step tokens");
    ARENA_TAKE(a, E->row_slot, E->max_seqs, "step rows");
    ARENA_TAKE(a, E->off, E->max_seqs + 1, "step offsets");
    ARENA_TAKE(a, E->slots, E->max_seqs, "slots");
    ARENA_TAKE(a, E->cand, E->V, "top-k candidates");
    ARENA_TAKE(a, E->top_ids, E->V, "top-k ids");
    ARENA_TAKE(a, E->mark, E->V, "top-k marks");
    ARENA_TAKE(a, E->tail, has_ref ? E->V : 0, "tail log-probabilities");
    E->recs = arena_take(a, E->o.save_ref ? (size_t)E->mbt * E->out_rec : 0, 64, "reference records");
}

static void eval_carve_line(eval_ctx *E, arena *a) {
    ARENA_TAKE(a, E->doc.nodes, E->doc.cap_nodes, "line JSON values");
    ARENA_TAKE(a, E->doc.strs, E->doc.cap_strs, "line JSON strings");
    ARENA_TAKE(a, E->cm.scratch, E->cm.scratch_cap, "message text");
    ARENA_TAKE(a, E->cm.args.nodes, E->cm.args.cap_nodes, "tool argument values");
    ARENA_TAKE(a, E->cm.args.strs, E->cm.args.cap_strs, "tool argument strings");
    ARENA_TAKE(a, E->turns.at, 2 * (size_t)E->turns.max, "assistant turns");
    ARENA_TAKE(a, E->text, E->text_cap, "rendered conversation");
    ARENA_TAKE(a, E->enc, E->text_cap, "line tokens");
    ARENA_TAKE(a, E->whole, E->text_cap, "conversation tokens");
    ARENA_TAKE(a, E->enc_mask, E->text_cap, "line mask");
}

// Reads the data: line buffers sized by the longest line, a counting pass (tokens, windows,
// scored tokens), one plan for everything, then the pass that fills it. Bad lines are reported
// in the first pass (and the run stops there unless skip_bad); the second pass meets the same.
static int eval_load(eval_ctx *E, moet_err *e) {
    if (arena_map_file(&E->data, E->o.data, e)) return -1;
    const char *slash = strrchr(E->o.data, '/');
    E->data_name = slash ? slash + 1 : E->o.data;
    size_t longest = 0;
    int64_t lines = 0;
    ln_reader rd;
    ln_line l;
    int long_line;
    ln_init_text(&rd, (const char *)E->data.data, E->data.size, MOET_MAX_LINE);
    while ((E->o.limit == 0 || lines < E->o.limit) && eval_next_line(&rd, &l, &long_line)) {
        lines++;
        if (!long_line && l.n > longest) longest = l.n;
    }
    if (lines == 0) return err_set(e, "%s: no data lines", E->o.data);
    E->n_lines = lines;
    E->data_used = rd.start;
    E->line_cap = longest;
    // the text of a line plus the template around it; tool JSON re-serialized with Python's
    // separators can grow, as the server allows for
    E->text_cap = longest + longest / 2 + (64u << 10);
    E->doc.cap_nodes = E->cm.args.cap_nodes = (uint32_t)(longest + 1 < MOET_MAX_LINE_VALUES ? longest + 1 : MOET_MAX_LINE_VALUES);
    E->doc.cap_strs = E->cm.args.cap_strs = longest + 1;
    E->cm.scratch_cap = longest;
    E->turns.max = MOET_EVAL_MAX_TURNS;
    arena_plan lp = arena_plan_begin(&E->line_mem, "eval lines", ARENA_HOST, e);
    while (arena_plan_pass(&lp)) eval_carve_line(E, lp.on);
    if (lp.failed) return -1;
    if (tok_scratch_init(&E->sc, &E->sc_mem, E->text_cap, e)) return -1;

    for (int pass = 0; pass < 2; pass++) {
        int64_t at = 0, nw = 0, scored = 0, forward = 0;   // tokens, windows, targets, fed tokens so far
        lines = 0;
        ln_init_text(&rd, (const char *)E->data.data, E->data.size, MOET_MAX_LINE);
        if (pass) eval_sha_begin(&E->sha);
        while (lines < E->n_lines && eval_next_line(&rd, &l, &long_line)) {
            lines++;
            moet_err le = {{0}};
            int n = 0;
            int bad = long_line ? err_set(&le, "the line is longer than %u bytes", MOET_MAX_LINE) : eval_line_tokens(E, l.s, l.n, &n, &le);
            if (bad) {
                if (pass == 0) {
                    if (!E->o.skip_bad) return err_set(e, "%s:%" PRId64 ": %s", E->o.data, l.no, le.msg);
                    fprintf(stderr, "moet eval: %s:%" PRId64 ": %s; line skipped\n", E->o.data, l.no, le.msg);
                    E->n_skipped++;
                }
                continue;
            }
            int64_t w = eval_cut(E, at, n, E->enc_mask, pass ? E->win + nw : NULL, &scored, &forward);
            if (pass) {
                memcpy(E->ids + at, E->enc, sizeof(int32_t) * (size_t)n);
                memcpy(E->mask + at, E->enc_mask, (size_t)n);
                int32_t n32 = n;
                eval_sha_add(&E->sha, &n32, sizeof n32);
                eval_sha_add(&E->sha, E->enc, sizeof(int32_t) * (size_t)n);
                eval_sha_add(&E->sha, E->enc_mask, (size_t)n);
            }
            at += n;
            nw += w;
        }
        if (pass == 0) {
            E->n_tok = at;
            E->n_windows = nw;
            E->n_scored = scored;
            E->n_forward = forward;
            if (scored == 0) return err_set(e, "%s: no token to score in %" PRId64 " lines", E->o.data, lines);
            if (E->max_seqs > nw) E->max_seqs = (int)nw;   // no more slots than windows
            arena_plan p2 = arena_plan_begin(&E->mem, "eval", ARENA_HOST, e);
            while (arena_plan_pass(&p2)) eval_carve(E, p2.on);
            if (p2.failed) return -1;
            memset(E->mark, 0, (size_t)E->V);
        } else {
            MOET_ASSERT(at == E->n_tok && nw == E->n_windows && scored == E->n_scored, "the two data passes disagree");
            int32_t cs[2] = {E->o.ctx, E->o.stride};
            eval_sha_add(&E->sha, cs, sizeof cs);
            eval_sha_end(&E->sha, E->tokens_sha);
        }
    }
    pf_sha256(&E->sha, E->data.data, E->data_used, E->data_sha);
    return 0;
}

// ---- the reference file -----------------------------------------------------------------------

static int eval_unhex(const js_node *v, uint8_t out[32]) {
    if (!v || v->type != JS_STR || v->len != 64) return -1;
    for (int i = 0; i < 64; i++) {
        char c = v->str[i];
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (x < 0) return -1;
        if (i % 2 == 0) out[i / 2] = (uint8_t)(x << 4);
        else out[i / 2] |= (uint8_t)x;
    }
    return 0;
}

static void eval_w_sha(js_writer *w, const char *key, const uint8_t sha[32]) {
    char hex[65];
    pf_hex(sha, 32, hex);
    js_w_key(w, key);
    js_w_str(w, hex);
}

// Writes the header page of the reference being made (the records are already in place).
static int eval_ref_header(eval_ctx *E, const eval_result *res, const uint8_t rec_sha[32], moet_err *e) {
    static uint8_t page[MOET_EVAL_REF_PAGE];
    memset(page, 0, sizeof page);
    js_writer w;
    js_w_init(&w, (char *)page + 12, sizeof page - 12);
    js_w_obj(&w);
    js_w_key(&w, "format"); js_w_str(&w, "MOETREF1");
    js_w_key(&w, "version"); js_w_int(&w, 1);
    js_w_key(&w, "top_k"); js_w_int(&w, E->out_k);
    js_w_key(&w, "record_bytes"); js_w_int(&w, (int64_t)E->out_rec);
    js_w_key(&w, "tokens"); js_w_int(&w, E->n_scored);
    js_w_key(&w, "model"); js_w_str(&w, res->model);
    js_w_key(&w, "experts"); js_w_str(&w, res->experts);
    js_w_key(&w, "geometry");
    js_w_obj(&w);
    int64_t g[EVAL_GEOM];
    eval_geometry(E->cfg, g);
    for (int i = 0; i < EVAL_GEOM; i++) { js_w_key(&w, eval_geom_name[i]); js_w_int(&w, g[i]); }
    js_w_end_obj(&w);
    eval_w_sha(&w, "tokenizer_sha256", E->tok_sha);
    js_w_key(&w, "data"); js_w_str(&w, E->data_name);
    js_w_key(&w, "data_lines"); js_w_int(&w, E->n_lines);
    eval_w_sha(&w, "data_sha256", E->data_sha);
    js_w_key(&w, "ctx"); js_w_int(&w, E->o.ctx);
    js_w_key(&w, "stride"); js_w_int(&w, E->o.stride);
    js_w_key(&w, "score_all"); js_w_bool(&w, E->o.score_all);
    eval_w_sha(&w, "tokens_sha256", E->tokens_sha);
    eval_w_sha(&w, "records_sha256", rec_sha);
    js_w_key(&w, "ppl"); js_w_num(&w, res->ppl);
    js_w_end_obj(&w);
    if (w.overflow) return err_set(e, "%s: the header does not fit in %d bytes", E->o.save_ref, MOET_EVAL_REF_PAGE);
    uint32_t n = (uint32_t)w.len;
    memcpy(page, "MOETREF1", 8);
    memcpy(page + 8, &n, 4);
    if (pwrite(E->out.fd, page, sizeof page, 0) != (ssize_t)sizeof page)
        return err_set(e, "%s: cannot write: %s", E->out.tmp, strerror(errno));
    return 0;
}

// Maps and checks the reference file against this run: its format, then (so that the first
// difference is the one reported) the model geometry, the tokenizer, the data, the settings and
// the token stream; then its size and the records' hash.
static int eval_ref_open(eval_ctx *E, moet_err *e) {
    const char *path = E->o.ref;
    eval_ref_hdr *h = &E->rh;
    if (arena_map_file(&E->refm, path, e)) return -1;
    const uint8_t *p = E->refm.data;
    uint32_t n = 0;
    if (E->refm.size < MOET_EVAL_REF_PAGE || memcmp(p, "MOETREF1", 8))
        return err_set(e, "%s: not a moet eval reference file (no MOETREF1 header)", path);
    memcpy(&n, p + 8, 4);
    if (n > MOET_EVAL_REF_PAGE - 12) return err_set(e, "%s: header length %u is past the 4096-byte header page", path, n);
    js_doc d;
    if (js_load_doc(&d, (const char *)p + 12, n, path, e)) return -1;
    int rc = -1;
    const js_node *root = js_root(&d), *v;
    int64_t x;
    char a[65], b[65];
#define REF_INT(key, lo, hi, dst)                                                                                  \
    do {                                                                                                           \
        v = js_get(&d, root, key);                                                                                 \
        if (!v || js_int(v, &x) || x < (lo) || x > (hi)) { err_set(e, "%s: header field \"%s\" is missing or out of range", path, key); goto out; } \
        dst = x;                                                                                                   \
    } while (0)
    if (root->type != JS_OBJ || !js_str_is(js_get(&d, root, "format"), "MOETREF1")) {
        err_set(e, "%s: the header is not a MOETREF1 object", path);
        goto out;
    }
    REF_INT("version", 1, 1, x);
    REF_INT("top_k", 1, MOET_MAX_VOCAB, h->top_k);
    REF_INT("record_bytes", 0, INT32_MAX, h->rec_bytes);
    REF_INT("tokens", 1, INT64_MAX / 2, h->tokens);
    REF_INT("data_lines", 0, INT64_MAX, h->data_lines);
    REF_INT("ctx", 2, INT32_MAX, h->ctx);
    REF_INT("stride", 1, INT32_MAX, h->stride);
    v = js_get(&d, root, "model");
    snprintf(h->model, sizeof h->model, "%s", v && v->type == JS_STR ? v->str : "?");
    v = js_get(&d, root, "experts");
    snprintf(h->experts, sizeof h->experts, "%s", v && v->type == JS_STR ? v->str : "?");
    v = js_get(&d, root, "data");
    snprintf(h->data, sizeof h->data, "%s", v && v->type == JS_STR ? v->str : "?");
    v = js_get(&d, root, "score_all");
    h->score_all = v && v->type == JS_TRUE;
    if (h->rec_bytes != eval_rec_bytes(h->top_k)) {
        err_set(e, "%s: record_bytes %zu does not match top_k %d", path, h->rec_bytes, h->top_k);
        goto out;
    }
    const js_node *geom = js_get(&d, root, "geometry");
    for (int i = 0; i < EVAL_GEOM; i++) {
        v = geom ? js_get(&d, geom, eval_geom_name[i]) : NULL;
        if (!v || js_int(v, &h->geom[i])) { err_set(e, "%s: header geometry lacks \"%s\"", path, eval_geom_name[i]); goto out; }
    }
    if (eval_unhex(js_get(&d, root, "tokenizer_sha256"), h->tok_sha) || eval_unhex(js_get(&d, root, "data_sha256"), h->data_sha) ||
        eval_unhex(js_get(&d, root, "tokens_sha256"), h->tokens_sha) || eval_unhex(js_get(&d, root, "records_sha256"), h->rec_sha)) {
        err_set(e, "%s: a SHA-256 field of the header is missing or not 64 hex digits", path);
        goto out;
    }
    // the checks, most fundamental first
    int64_t g[EVAL_GEOM];
    eval_geometry(E->cfg, g);
    for (int i = 0; i < EVAL_GEOM; i++)
        if (g[i] != h->geom[i]) {
            err_set(e, "%s was made by another model (%s, %s experts): its %s is %" PRId64 ", this model's is %" PRId64
                    "; a reference compares runs of one model",
                    path, h->model, h->experts, eval_geom_name[i], h->geom[i], g[i]);
            goto out;
        }
    if (memcmp(h->tok_sha, E->tok_sha, 32)) {
        pf_hex(h->tok_sha, 32, a);
        pf_hex(E->tok_sha, 32, b);
        err_set(e, "%s was made with another tokenizer: SHA-256 %.16s… there, %.16s… here", path, a, b);
        goto out;
    }
    if (memcmp(h->data_sha, E->data_sha, 32) || h->data_lines != E->n_lines) {
        pf_hex(h->data_sha, 32, a);
        pf_hex(E->data_sha, 32, b);
        err_set(e, "%s was made from other data: %" PRId64 " lines of %s (SHA-256 %.16s…) there, %" PRId64
                " lines of %s (SHA-256 %.16s…) here",
                path, h->data_lines, h->data, a, E->n_lines, E->data_name, b);
        goto out;
    }
    if (h->ctx != E->o.ctx || h->stride != E->o.stride || h->score_all != E->o.score_all) {
        err_set(e, "%s scored other windows: --ctx %d --stride %d%s there, --ctx %d --stride %d%s here", path, h->ctx,
                h->stride, h->score_all ? " --score-all" : "", E->o.ctx, E->o.stride, E->o.score_all ? " --score-all" : "");
        goto out;
    }
    if (memcmp(h->tokens_sha, E->tokens_sha, 32) || h->tokens != E->n_scored) {
        err_set(e, "%s scored other tokens (%" PRId64 " there, %" PRId64 " here) from the same data and tokenizer file: "
                "it comes from another version of the tokenizer or of the chat template", path, h->tokens, E->n_scored);
        goto out;
    }
    size_t want = MOET_EVAL_REF_PAGE + (size_t)h->tokens * h->rec_bytes;
    if (E->refm.size != want) {
        err_set(e, "%s: %zu bytes; %" PRId64 " records of %zu bytes make %zu (truncated?)", path, E->refm.size, h->tokens,
                h->rec_bytes, want);
        goto out;
    }
    uint8_t sum[32];
    pf_sha256(&E->sha, p + MOET_EVAL_REF_PAGE, want - MOET_EVAL_REF_PAGE, sum);
    if (memcmp(sum, h->rec_sha, 32)) {
        err_set(e, "%s: the records do not match the SHA-256 in the header (the file is damaged)", path);
        goto out;
    }
    rc = 0;
#undef REF_INT
out:
    js_free_doc(&d);
    return rc;
}

// ---- scoring one token ---------------------------------------------------------------------------

// Rearranges a[0..n) so that a[0..k) are its k smallest values and a[k] the next one (k < n).
// Quickselect with a median-of-three pivot: deterministic, O(n) on average.
static void eval_select_smallest(double *a, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        double x = a[lo], y = a[mid], z = a[hi];
        double piv = x < y ? (y < z ? y : x < z ? z : x) : (x < z ? x : y < z ? z : y);
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] < piv) i++;
            while (a[j] > piv) j--;
            if (i <= j) {
                double t = a[i]; a[i] = a[j]; a[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return;
    }
}

// log Σ exp(x[v] − lse) over the tokens not marked in E->mark (the tail of a top-k set), in
// index order; −inf when every token is marked. Also gathers those log-probabilities into
// E->tail when gather is set.
static double eval_tail_lp(const eval_ctx *E, const float *x, double lse, int gather, int *n_tail) {
    double mx = -INFINITY, s = 0;
    int nt = 0;
    for (int v = 0; v < E->V; v++)
        if (!E->mark[v] && x[v] > mx) mx = x[v];
    if (mx == -INFINITY) { *n_tail = 0; return -INFINITY; }
    for (int v = 0; v < E->V; v++)
        if (!E->mark[v]) {
            s += exp((double)x[v] - mx);
            if (gather) E->tail[nt] = (double)x[v] - lse;
            nt++;
        }
    *n_tail = nt;
    return mx + log(s) - lse;
}

// Scores the target y of one logits row x [V] as scored token idx; with --save-ref fills its
// record at rec, with --ref compares it with the reference's record idx.
static int eval_score(eval_ctx *E, const float *x, int32_t y, int64_t idx, uint8_t *rec, moet_err *e) {
    int V = E->V, best = 0;
    for (int v = 1; v < V; v++)
        if (x[v] > x[best]) best = v;   // ties: the lowest id
    double mx = x[best], s = 0;
    for (int v = 0; v < V; v++) s += exp((double)x[v] - mx);
    double lse = mx + log(s);
    E->nll[idx] = lse - (double)x[y];
    int nt;
    if (rec) {
        int k = E->out_k;
        for (int v = 0; v < V; v++) E->cand[v] = (samp_cand){x[v], v};
        samp_top(E->cand, V, k);   // the k largest logits, descending, ties to the lower id
        for (int i = 0; i < k; i++) E->top_ids[i] = E->cand[i].id, E->mark[E->cand[i].id] = 1;
        double head[2] = {(double)x[y] - lse, eval_tail_lp(E, x, lse, 0, &nt)};
        int32_t tz[2] = {y, 0};
        memcpy(rec, head, 16);
        memcpy(rec + 16, tz, 8);
        memcpy(rec + EVAL_REC_HEAD, E->top_ids, sizeof(int32_t) * (size_t)k);
        for (int i = 0; i < k; i++) {
            float lp = (float)((double)x[E->top_ids[i]] - lse);
            memcpy(rec + EVAL_REC_HEAD + 4 * (size_t)k + 4 * (size_t)i, &lp, 4);
            E->mark[E->top_ids[i]] = 0;
        }
    }
    if (E->o.ref) {
        const eval_ref_hdr *h = &E->rh;
        const uint8_t *r = E->refm.data + MOET_EVAL_REF_PAGE + (size_t)idx * h->rec_bytes;
        int k = h->top_k;
        double head[2];
        int32_t target, id;
        memcpy(head, r, 16);
        memcpy(&target, r + 16, 4);
        if (target != y)
            return err_set(e, "%s: scored token %" PRId64 " is id %d there and %d here", E->o.ref, idx, target, y);
        // exact over the reference's top k: Σ P(v) (log P(v) − log Q(v)), both log-probabilities
        // rounded to f32 the same way, so that a run against its own reference gives exactly 0
        double kl = 0, pmin_lp = 0;
        for (int i = 0; i < k; i++) {
            float lp;
            memcpy(&id, r + EVAL_REC_HEAD + 4 * (size_t)i, 4);
            memcpy(&lp, r + EVAL_REC_HEAD + 4 * (size_t)k + 4 * (size_t)i, 4);
            if (id < 0 || id >= V) return err_set(e, "%s: record %" PRId64 " holds token id %d", E->o.ref, idx, id);
            float lq = (float)((double)x[id] - lse);
            kl += exp((double)lp) * ((double)lp - (double)lq);
            E->mark[id] = 1;
            pmin_lp = lp;
        }
        memcpy(&id, r + EVAL_REC_HEAD, 4);
        E->top1[idx] = id == best;
        double p_tail_lp = head[1], q_tail_lp = eval_tail_lp(E, x, lse, 1, &nt);
        for (int i = 0; i < k; i++) {
            memcpy(&id, r + EVAL_REC_HEAD + 4 * (size_t)i, 4);
            E->mark[id] = 0;
        }
        double lo = 0, hi = 0;
        if (p_tail_lp > -INFINITY && nt > 0) {
            double pt = exp(p_tail_lp), pmin = exp((double)pmin_lp);
            lo = pt * (p_tail_lp - q_tail_lp);   // the tail as one outcome: a lower bound
            // the most the tail can add: mass pmin on each of the run's least likely tail tokens
            double f = floor(pt / pmin);
            int full = f < nt ? (int)f : nt;
            double rest = full < nt ? pt - full * pmin : 0;
            if (full < nt) eval_select_smallest(E->tail, nt, full);
            for (int i = 0; i < full; i++) hi += pmin * ((double)pmin_lp - E->tail[i]);
            if (rest > 0) hi += rest * (log(rest) - E->tail[full]);
            if (hi < lo) hi = lo;   // rounding: the maximum is never below the coarse value
        }
        E->kl[idx] = kl + lo;
        E->kl_hi[idx] = kl + hi;
    }
    return 0;
}

// ---- the run --------------------------------------------------------------------------------------

// Feeds every window through the backend, several per step up to mbt tokens, and scores each
// target as its logits arrive. Each window runs in a fresh slot (admitted anew: position 0); a
// window longer than the room left in a step is cut at a multiple of the backend's chunk_align
// (its positions are the window's own) and continues in the next steps, so its logits are
// those of any other cutting. A window whose next aligned block does not fit waits a step.
static int eval_run(eval_ctx *E, const engine_backend *be, moet_err *e) {
    int V = E->V, ns = E->max_seqs, align = be->chunk_align;
    int64_t next_w = 0, done_w = 0, scored = 0, fed = 0;
    double t0 = moet_now(), last_report = t0;
    MOET_ASSERT(be->n_vocab == V && be->max_seqs >= ns && be->max_len >= E->longest, "the backend was made for another plan");
    MOET_ASSERT(align >= 1, "chunk_align %d", align);
    if (E->mbt < align)   // the first window of a step must be able to take one aligned block
        return err_set(e, "--max-batch-tokens %d must be at least %d: this backend cuts windows at multiples of %d tokens",
                       E->mbt, align, align);
    for (int s = 0; s < ns; s++) E->slots[s].w = -1, E->slots[s].taken = 0;
    while (done_w < E->n_windows) {
        int n = 0, T = 0;
        for (int s = 0; s < ns && T < E->mbt; s++) {
            eval_slot *q = &E->slots[s];
            if (q->w < 0) {
                if (next_w == E->n_windows) continue;
                q->w = (int)next_w++;
                q->fed = 0;
                q->next = E->win[q->w].first;
                if (q->taken) be->release(be->self, s);
                // greedy parameters (nothing is sampled); room for the longest window
                engine_admit ad = {{0, 0, 1, 0, 0, 0, 1}, 0, 0, 0, NULL, 0, E->longest, 0};
                int ar = be->admit(be->self, s, &ad, e);
                if (ar) return ar > 0 ? err_set(e, "the backend has no room for a window of %d tokens", E->longest) : -1;
                q->taken = 1;
            }
            const eval_window *w = &E->win[q->w];
            int take = engine_chunk_take(q->fed, w->len - 1 - q->fed, E->mbt - T, align);
            if (take <= 0) continue;
            memcpy(E->step_ids + T, E->ids + w->tok + q->fed, sizeof(int32_t) * (size_t)take);
            E->row_slot[n] = s;
            E->off[n] = T;
            T += take;
            E->off[++n] = T;
        }
        if (be->forward_all(be->self, n, E->row_slot, E->step_ids, E->off, E->logits, NULL, NULL, NULL, e)) return -1;
        for (int i = 0; i < n; i++) {
            eval_slot *q = &E->slots[E->row_slot[i]];
            const eval_window *w = &E->win[q->w];
            int64_t first = q->next;
            for (int j = 0; j < E->off[i + 1] - E->off[i]; j++) {
                int p = q->fed + j + 1;   // the target this position predicts
                if (p < w->from || !E->mask[w->tok + p]) continue;
                uint8_t *rec = E->o.save_ref ? E->recs + (size_t)(q->next - first) * E->out_rec : NULL;
                if (eval_score(E, E->logits + (size_t)(E->off[i] + j) * V, E->ids[w->tok + p], q->next, rec, e)) return -1;
                q->next++;
            }
            if (E->o.save_ref && q->next > first) {
                // a row's scored tokens are consecutive in the data: one write at their place
                size_t bytes = (size_t)(q->next - first) * E->out_rec;
                off_t at = (off_t)(MOET_EVAL_REF_PAGE + (size_t)first * E->out_rec);
                if (pwrite(E->out.fd, E->recs, bytes, at) != (ssize_t)bytes)
                    return err_set(e, "%s: cannot write: %s", E->out.tmp, strerror(errno));
            }
            scored += q->next - first;
            q->fed += E->off[i + 1] - E->off[i];
            if (q->fed == w->len - 1) {
                q->w = -1;
                done_w++;
            }
        }
        fed += T;
        double now = moet_now();
        if (E->o.progress && (now - last_report >= 2 || done_w == E->n_windows)) {
            double rate = fed / (now - t0);
            fprintf(stderr, "moet eval: %" PRId64 "/%" PRId64 " tokens scored (%.1f %%), %.1f tok/s, %.0f s left\n", scored,
                    E->n_scored, 100.0 * scored / E->n_scored, rate, rate > 0 ? (E->n_forward - fed) / rate : 0.0);
            last_report = now;
        }
    }
    MOET_ASSERT(scored == E->n_scored && fed == E->n_forward, "scored %" PRId64 " of %" PRId64, scored, E->n_scored);
    for (int s = 0; s < ns; s++)
        if (E->slots[s].taken) be->release(be->self, s), E->slots[s].taken = 0;
    return 0;
}

static int eval_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The summary, in data order. Standard errors treat the scored tokens as independent samples
// (as llama.cpp's perplexity tool does): tokens of one text are correlated, so they understate
// the uncertainty somewhat.
static void eval_summarize(eval_ctx *E, eval_result *res) {
    int64_t N = E->n_scored;
    double sa = 0, saa = 0;
    for (int64_t i = 0; i < N; i++) sa += E->nll[i];
    double ma = sa / N;
    for (int64_t i = 0; i < N; i++) saa += (E->nll[i] - ma) * (E->nll[i] - ma);
    double va = N > 1 ? saa / (N - 1) : 0;
    res->tokens = N;
    res->nll = ma;
    res->nll_se = sqrt(va / N);
    res->ppl = exp(ma);
    res->ppl_se = res->ppl * res->nll_se;
    if (!E->o.ref) return;
    const eval_ref_hdr *h = &E->rh;
    double sb = 0, sbb = 0, sab = 0, kl = 0, klk = 0, hi = 0, tail = 0, top1 = 0;
    for (int64_t i = 0; i < N; i++) {
        double head[2];
        memcpy(head, E->refm.data + MOET_EVAL_REF_PAGE + (size_t)i * h->rec_bytes, 16);
        sb += -head[0];
        tail += exp(head[1]);
        kl += E->kl[i];
        hi += E->kl_hi[i];
        top1 += E->top1[i];
    }
    double mb = sb / N, mk = kl / N;
    for (int64_t i = 0; i < N; i++) {
        double head[2];
        memcpy(head, E->refm.data + MOET_EVAL_REF_PAGE + (size_t)i * h->rec_bytes, 16);
        double b = -head[0] - mb;
        sbb += b * b;
        sab += (E->nll[i] - ma) * b;
        klk += (E->kl[i] - mk) * (E->kl[i] - mk);
    }
    double vb = N > 1 ? sbb / (N - 1) : 0, cab = N > 1 ? sab / (N - 1) : 0;
    res->has_ref = 1;
    res->ref_top_k = h->top_k;
    snprintf(res->ref_model, sizeof res->ref_model, "%s", h->model);
    snprintf(res->ref_experts, sizeof res->ref_experts, "%s", h->experts);
    res->ref_ppl = exp(mb);
    res->ppl_diff = res->ppl - res->ref_ppl;
    // delta method: Var(e^a − e^b) ≈ e^2a Var(a) + e^2b Var(b) − 2 e^(a+b) Cov(a, b), of the means
    double vd = (res->ppl * res->ppl * va + res->ref_ppl * res->ref_ppl * vb - 2 * res->ppl * res->ref_ppl * cab) / N;
    res->ppl_diff_se = sqrt(vd > 0 ? vd : 0);
    res->kl_mean = mk;
    res->kl_se = sqrt((N > 1 ? klk / (N - 1) : 0) / N);
    res->kl_upper_mean = hi / N;
    res->tail_mass_mean = tail / N;
    res->top1 = top1 / N;
    qsort(E->kl, (size_t)N, sizeof(double), eval_cmp_double);   // last use of the per-token values
    int64_t r99 = (int64_t)ceil(0.99 * (double)N) - 1;          // nearest rank
    res->kl_p99 = E->kl[r99 < 0 ? 0 : r99];
}

// Creates the output file (format/outfile.c: FILE.tmp.PID beside FILE, only over a regular
// file, removed on a failure or a fatal signal) with room for every record (a full disk fails now).
static int eval_out_open(eval_ctx *E, moet_err *e) {
    if (of_begin(&E->out, E->o.save_ref, e)) return err_wrap(e, "--save-ref");
    off_t size = (off_t)(MOET_EVAL_REF_PAGE + (size_t)E->n_scored * E->out_rec);
    int rc = posix_fallocate(E->out.fd, 0, size);
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(E->out.fd, size) ? errno : 0;
    if (rc) return err_set(e, "%s: cannot reserve %lld bytes: %s", E->out.tmp, (long long)size, strerror(rc));
    return 0;
}

// Hashes the records back from the file, writes the header, syncs and renames over FILE.
static int eval_out_finish(eval_ctx *E, const eval_result *res, moet_err *e) {
    uint8_t sum[32];
    size_t total = (size_t)E->n_scored * E->out_rec, chunk = (size_t)E->mbt * E->out_rec;
    eval_sha_begin(&E->sha);
    for (size_t at = 0; at < total; at += chunk) {
        size_t n = total - at < chunk ? total - at : chunk;
        if (pread(E->out.fd, E->recs, n, (off_t)(MOET_EVAL_REF_PAGE + at)) != (ssize_t)n)
            return err_set(e, "%s: cannot read back: %s", E->out.tmp, strerror(errno));
        eval_sha_add(&E->sha, E->recs, n);
    }
    eval_sha_end(&E->sha, sum);
    if (eval_ref_header(E, res, sum, e)) return -1;
    return of_commit(&E->out, e);
}

// SHA-256 of the tokenizer files: tokenizer.json, then tokenizer_config.json when there is one.
static int eval_tok_sha(pf_sha *s, const char *path, const char *cpath, uint8_t out[32], moet_err *e) {
    eval_sha_begin(s);
    for (int i = 0; i < 2; i++) {
        const char *p = i ? cpath : path;
        if (!p) continue;
        arena_map m;
        if (arena_map_file(&m, p, e)) return -1;
        eval_sha_add(s, m.data, m.size);
        arena_unmap(&m);
    }
    eval_sha_end(s, out);
    return 0;
}

// Settles the options against the model (defaults, ranges) and reads the data into E.
// eval_release frees what it holds, also after a failure.
static int eval_prepare(eval_ctx *E, const eval_opts *opts, const ck_config *cfg, const tok *t, moet_err *e) {
    memset(E, 0, sizeof *E);
    E->o = *opts;
    E->out.fd = -1;
    E->cfg = cfg;
    E->t = t;
    E->V = cfg->vocab;
    eval_opts *o = &E->o;
    if (pf_sha_init(&E->sha, e)) return -1;
    // windows of the model's context (at most 4096, as the server), half overlapping
    if (o->ctx == 0) o->ctx = cfg->max_pos < 4096 ? cfg->max_pos : 4096;
    if (o->ctx < 2) return err_set(e, "--ctx %d: at least 2 tokens", o->ctx);
    if (o->stride == 0) o->stride = o->ctx / 2;
    if (o->stride < 1 || o->stride > o->ctx) return err_set(e, "--stride %d: expected 1 .. --ctx (%d)", o->stride, o->ctx);
    if (o->top_k < 1) return err_set(e, "--top-k %d: expected at least 1", o->top_k);
    if (o->max_seqs < 1 || o->max_batch_tokens < 1) return err_set(e, "--max-num-seqs and --max-batch-tokens must be positive");
    E->out_k = o->top_k < E->V ? o->top_k : E->V;
    E->out_rec = eval_rec_bytes(E->out_k);
    E->mbt = o->max_batch_tokens;
    E->max_seqs = o->max_seqs;
    return eval_load(E, e);
}

static void eval_release(eval_ctx *E) {
    of_abort(&E->out);   // never leave half a reference behind
    arena_release(&E->mem);
    arena_release(&E->line_mem);
    arena_release(&E->sc_mem);
    arena_unmap(&E->refm);
    arena_unmap(&E->data);
    pf_sha_free(&E->sha);
}

// The whole evaluation: model (+ planes), tokenizer, data, reference checks, engine, run,
// summary, reference file. res is filled on success.
static int eval_main(const eval_opts *opts, eval_result *res, moet_err *e) {
    static ck_model m;
    static tok t;
    static engine_any EA;
    static eval_ctx E;
    int rc = -1, have_m = 0, have_t = 0, have_r = 0;
    memset(res, 0, sizeof *res);
    memset(&E, 0, sizeof E);
    E.out.fd = -1;
    double t0 = moet_now();
    if (ck_open(&m, opts->model, e)) goto out;
    have_m = 1;
    char tpath[MOET_MAX_PATH], cpath[MOET_MAX_PATH];
    if (opts->tokenizer) snprintf(tpath, sizeof tpath, "%s", opts->tokenizer);
    else if (ck_path(tpath, sizeof tpath, opts->model, "tokenizer.json")) { err_set(e, "%s: path too long", opts->model); goto out; }
    int has_cfg = tok_config_beside(tpath, cpath, sizeof cpath) == 0;
    if (tok_load(&t, tpath, has_cfg ? cpath : NULL, e)) goto out;
    have_t = 1;
    if (eval_prepare(&E, opts, &m.cfg, &t, e)) goto out;
    const eval_opts *o = &E.o;
    if (eval_tok_sha(&E.sha, tpath, has_cfg ? cpath : NULL, E.tok_sha, e)) goto out;
    if (o->ref && eval_ref_open(&E, e)) goto out;
    if (o->save_ref && eval_out_open(&E, e)) goto out;
    // the engine: a slot per window run at once, each as long as the longest window
    engine_opts eo = {E.max_seqs, E.longest, E.mbt, o->threads, o->kv_dtype, o->planes,
                      {o->no_verify, o->strict_revision, 0, o->progress, 0, 0, 0, 0}, o->host_margin_gb, 0, 1, o->act_bf16};   // (eval does not draft)
    if (engine_open(&EA, o->backend ? o->backend : "auto", &m, &eo, "moet eval", e)) goto out;
    have_r = 1;
    engine_backend be = EA.be;
    ck_model_name(o->model, res->model, sizeof res->model);   // as serve and bench name it
    snprintf(res->experts, sizeof res->experts, "%s", o->planes ? "planes" : m.expert_format);
    if (o->progress)
        fprintf(stderr, "moet eval: %s (%s experts): %" PRId64 " lines%s, %" PRId64 " tokens to score in %" PRId64
                " windows (ctx %d, stride %d), %" PRId64 " through the forward pass; %d sequences, %d tokens per step, "
                "on the %s; memory: engine %.1f MiB, eval %.1f MiB\n",
                res->model, res->experts, E.n_lines - E.n_skipped, E.n_skipped ? " (some skipped)" : "", E.n_scored,
                E.n_windows, o->ctx, o->stride, E.n_forward, E.max_seqs, E.mbt, EA.is_gpu ? "GPU" : "CPU",
                engine_mib(&EA), (E.mem.cap + E.line_mem.cap + E.sc_mem.cap) / 1048576.0);
    double t1 = moet_now();
    if (eval_run(&E, &be, e)) goto out;
    res->seconds = moet_now() - t1;
    res->lines = E.n_lines - E.n_skipped;
    res->skipped = E.n_skipped;
    res->windows = E.n_windows;
    res->forwarded = E.n_forward;
    res->ctx = o->ctx;
    res->stride = o->stride;
    eval_summarize(&E, res);
    if (o->save_ref && eval_out_finish(&E, res, e)) goto out;
    if (o->progress) fprintf(stderr, "moet eval: done in %.1f s (%.1f s loading)\n", moet_now() - t0, t1 - t0);
    rc = 0;
out:
    eval_release(&E);
    if (have_r) engine_close(&EA);
    if (have_t) tok_free(&t);
    if (have_m) ck_close(&m);
    return rc;
}

// The result as one JSON line.
static void eval_json(const eval_opts *o, const eval_result *r, char *buf, size_t cap) {
    js_writer w;
    js_w_init(&w, buf, cap);
    js_w_obj(&w);
    js_w_key(&w, "object"); js_w_str(&w, "eval");
    js_w_key(&w, "model"); js_w_str(&w, r->model);
    js_w_key(&w, "experts"); js_w_str(&w, r->experts);
    js_w_key(&w, "data"); js_w_str(&w, o->data);
    js_w_key(&w, "lines"); js_w_int(&w, r->lines);
    js_w_key(&w, "lines_skipped"); js_w_int(&w, r->skipped);
    js_w_key(&w, "windows"); js_w_int(&w, r->windows);
    js_w_key(&w, "ctx"); js_w_int(&w, r->ctx);
    js_w_key(&w, "stride"); js_w_int(&w, r->stride);
    js_w_key(&w, "tokens"); js_w_int(&w, r->tokens);
    js_w_key(&w, "nll"); js_w_num(&w, r->nll);
    js_w_key(&w, "nll_se"); js_w_num(&w, r->nll_se);
    js_w_key(&w, "ppl"); js_w_num(&w, r->ppl);
    js_w_key(&w, "ppl_se"); js_w_num(&w, r->ppl_se);
    js_w_key(&w, "tokens_forward"); js_w_int(&w, r->forwarded);
    js_w_key(&w, "seconds"); js_w_num(&w, round(r->seconds * 1000) / 1000);
    js_w_key(&w, "tok_s"); js_w_num(&w, round(r->forwarded / (r->seconds > 0 ? r->seconds : 1) * 10) / 10);
    if (r->has_ref) {
        js_w_key(&w, "ref");
        js_w_obj(&w);
        js_w_key(&w, "file"); js_w_str(&w, o->ref);
        js_w_key(&w, "model"); js_w_str(&w, r->ref_model);
        js_w_key(&w, "experts"); js_w_str(&w, r->ref_experts);
        js_w_key(&w, "top_k"); js_w_int(&w, r->ref_top_k);
        js_w_key(&w, "ppl"); js_w_num(&w, r->ref_ppl);
        js_w_key(&w, "ppl_diff"); js_w_num(&w, r->ppl_diff);
        js_w_key(&w, "ppl_diff_se"); js_w_num(&w, r->ppl_diff_se);
        js_w_key(&w, "kl_mean"); js_w_num(&w, r->kl_mean);
        js_w_key(&w, "kl_se"); js_w_num(&w, r->kl_se);
        js_w_key(&w, "kl_p99"); js_w_num(&w, r->kl_p99);
        js_w_key(&w, "kl_upper_mean"); js_w_num(&w, r->kl_upper_mean);
        js_w_key(&w, "ref_tail_mass_mean"); js_w_num(&w, r->tail_mass_mean);
        js_w_key(&w, "top1_agreement"); js_w_num(&w, r->top1);
        js_w_end_obj(&w);
    }
    js_w_end_obj(&w);
    MOET_ASSERT(!w.overflow, "the result line is longer than %zu bytes", cap);
}

// ---- the command -------------------------------------------------------------------------------

static const char eval_usage[] =
    "usage: moet eval --model DIR --data FILE.jsonl [options]\n"
    "Teacher-forced scoring: perplexity of the data, and with --ref the KL divergence, top-1\n"
    "agreement and perplexity difference against a reference run. One JSON line on stdout.\n"
    "data: one object per line, {\"text\": \"...\"} (every token after the first is scored) or\n"
    "  {\"messages\": [...]} (rendered with the chat template, no generation prompt; only the\n"
    "  assistant turns are scored: each body after \"<|im_start|>assistant\\n\" through \"<|im_end|>\")\n"
    "options:\n"
    "  --model DIR             checkpoint directory (config.json, safetensors, tokenizer.json)\n"
    "  --planes FILE           routed experts from this MOET2PF1 plane file\n"
    "  --no-verify             with --planes: skip the SHA-256 check of every slot\n"
    "  --strict-revision       with --planes: refuse a file built from another checkpoint revision\n"
    "  --tokenizer FILE        tokenizer.json to use (default: DIR/tokenizer.json)\n"
    "  --data FILE             the JSONL data set\n"
    "  --limit N               score only the first N non-blank lines (default: all)\n"
    "  --score-all             conversations: score every token after the first, not only the\n"
    "                          assistant turns\n"
    "  --skip-bad-lines        a line that cannot be scored is reported and skipped (default: the\n"
    "                          run stops at it)\n"
    "  --ctx N                 window length in tokens (default: the model's context, at most 4096)\n"
    "  --stride N              a longer line is cut as Hugging Face's strided perplexity: windows of\n"
    "                          ctx tokens start every N tokens until one reaches the end; each\n"
    "                          scores only the tokens past the previous window's end, so every\n"
    "                          token is scored once with at least ctx - N tokens of context\n"
    "                          (default ctx / 2; N = ctx: windows do not overlap and each window's\n"
    "                          first token is context only)\n"
    "  --save-ref FILE         write a reference file: per scored token the top-k log-probabilities,\n"
    "                          the log of the rest's mass and log p(target) (24 + 8k bytes); made\n"
    "                          as FILE.tmp.PID before the run, renamed over FILE when complete,\n"
    "                          removed on a failure or a signal; an existing FILE must be a regular file\n"
    "  --top-k K               log-probabilities kept per token by --save-ref (default 128; the\n"
    "                          vocabulary size or more keeps whole distributions: exact KL)\n"
    "  --ref FILE              compare with a reference of the same model geometry, tokenizer, data\n"
    "                          and windows: KL(ref || run) mean and 99th percentile, top-1\n"
    "                          agreement, perplexity difference. The KL is exact over the\n"
    "                          reference's top k and treats the rest as one outcome, a lower bound;\n"
    "                          kl_upper_mean bounds it from above (the rest's mass placed on the\n"
    "                          run's least likely tokens, none above the k-th probability)\n"
    "  --max-num-seqs N        windows run together (default 8)\n"
    "  --max-batch-tokens N    tokens per forward step, shared by those windows (default 512;\n"
    "                          the GPU cuts windows at multiples of 64 tokens and needs >= 64)\n"
    "  --backend B             auto (default: the GPU when there is one, else the CPU reference),\n"
    "                          gpu or cpu\n"
    "  --kv-dtype T            GPU KV cache: bf16 (default, as the server), fp8 or f32\n"
    "  --act-dtype T           the matrix products' inputs: auto (default, as the server: bf16 on\n"
    "                          the GPU, f32 with --kv-dtype f32 and on the CPU), f32 or bf16\n"
    "                          (rounded to bf16, on either backend)\n"
    "  --threads N             worker threads of the CPU reference matrix products (default 1)\n"
    "  --host-margin-gb G      on a GPU that shares the host's memory (GB10): GiB of MemAvailable\n"
    "                          the memory plan leaves the host (default 4)\n"
    "  -q, --quiet             no progress lines on stderr\n"
    "  -h, --help              this text\n";

typedef struct {
    eval_opts o;
    const char *kv_dtype, *act_dtype;
    int quiet;
} eval_flags;

static const moet_flag eval_flag_table[] = {
    FLAG_DIR("--model", eval_flags, o.model),
    FLAG_FILE("--planes", eval_flags, o.planes),
    FLAG_SWITCH("--no-verify", eval_flags, o.no_verify),
    FLAG_SWITCH("--strict-revision", eval_flags, o.strict_revision),
    FLAG_FILE("--tokenizer", eval_flags, o.tokenizer),
    FLAG_FILE("--data", eval_flags, o.data),
    FLAG_I64("--limit", eval_flags, o.limit, 1, INT64_MAX),
    FLAG_SWITCH("--score-all", eval_flags, o.score_all),
    FLAG_SWITCH("--skip-bad-lines", eval_flags, o.skip_bad),
    FLAG_INT("--ctx", eval_flags, o.ctx, 2, INT32_MAX),
    FLAG_INT("--stride", eval_flags, o.stride, 1, INT32_MAX),
    FLAG_PATH("--save-ref", eval_flags, o.save_ref, ARG_OUT_FILE, "FILE"),
    FLAG_INT("--top-k", eval_flags, o.top_k, 1, MOET_MAX_VOCAB),
    FLAG_FILE("--ref", eval_flags, o.ref),
    FLAG_INT("--max-num-seqs", eval_flags, o.max_seqs, 1, MOET_MAX_SEQS),
    FLAG_INT("--max-batch-tokens", eval_flags, o.max_batch_tokens, 1, 1 << 20),
    FLAG_CHOICE("--backend", eval_flags, o.backend, "auto|gpu|cpu"),
    FLAG_CHOICE("--kv-dtype", eval_flags, kv_dtype, "bf16|fp8|f32"),
    FLAG_CHOICE("--act-dtype", eval_flags, act_dtype, "auto|f32|bf16"),
    FLAG_INT("--threads", eval_flags, o.threads, 1, MOET_MAX_THREADS),
    FLAG_NUM("--host-margin-gb", eval_flags, o.host_margin_gb, 0, 1 << 20),
    {.name = "--quiet", .alias = "-q", .kind = ARG_SWITCH, .at = offsetof(eval_flags, quiet)},
};

static int cmd_eval(int argc, char **argv) {
    eval_flags fl = {.kv_dtype = "bf16", .act_dtype = "auto", .o.host_margin_gb = MOET_HOST_MARGIN_GB};
    eval_opts *op = &fl.o;
    op->max_seqs = 8;
    op->max_batch_tokens = 512;
    op->threads = 1;
    op->backend = "auto";
    op->top_k = 128;
    int arc = moet_args("eval", eval_usage, eval_flag_table, (int)(sizeof eval_flag_table / sizeof eval_flag_table[0]), argc, argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    if (!op->model || !op->data) return moet_usage_error("eval", eval_usage, "need --model DIR and --data FILE.jsonl");
    MOET_ASSERT(engine_kv_dtype(fl.kv_dtype, &op->kv_dtype) == 0, "kv dtype %s", fl.kv_dtype);
    MOET_ASSERT(engine_act_dtype(fl.act_dtype, &op->act_bf16) == 0, "act dtype %s", fl.act_dtype);
    op->progress = !fl.quiet;
    eval_opts o = *op;
    eval_result res;
    moet_err e = {{0}};
    if (eval_main(&o, &res, &e)) {
        fprintf(stderr, "moet eval: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "moet eval: %s (%s experts): %" PRId64 " tokens, perplexity %.4f ± %.4f, mean NLL %.5f\n", res.model,
            res.experts, res.tokens, res.ppl, res.ppl_se, res.nll);
    if (res.has_ref)
        fprintf(stderr, "moet eval: against %s (%s experts, perplexity %.4f): KL mean %.6f ± %.6f (at most %.6f), p99 %.6f, "
                "top-1 agreement %.2f %%, perplexity difference %+.4f ± %.4f\n",
                res.ref_model, res.ref_experts, res.ref_ppl, res.kl_mean, res.kl_se, res.kl_upper_mean, res.kl_p99,
                100 * res.top1, res.ppl_diff, res.ppl_diff_se);
    static char line[16 * MOET_MAX_PATH];   // two paths, each escaped to at most 6 bytes per byte (\u00XX), and numbers
    eval_json(&o, &res, line, sizeof line);
    so_puts(line);
    so_puts("\n");
    return 0;
}
