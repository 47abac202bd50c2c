// format/serve.c — `moet serve`: the scheduler (continuous batching over an engine_backend)
// and the line loop of docs/PROTOCOL.md.
//
// One thread does everything, in this order, forever: read what stdin has (poll, so decoding
// never waits for input and an idle server sleeps), turn complete lines into requests or
// answers, give free sequence slots to waiting requests (first come, first served), run one
// batched step — every decoding sequence contributes its next token, prefilling sequences
// share what is left of --max-batch-tokens in chunks — then sample, detokenize, stop, stream
// and answer. All memory (request records, token and text buffers, per-slot sampler state,
// step buffers, the input buffer) is planned from the flags and allocated once before the
// ready line; after it nothing is allocated (arena_freeze).
//
// Determinism: a request's tokens depend only on its own logits and its own generator, and
// the backend promises row results independent of the other rows and of how a prompt is cut
// into chunks, so a seeded request gives the same tokens alone or in a busy batch.

#include <poll.h>

// Text side of the model: prompt text → ids, one id → its bytes.
typedef struct {
    void *self;
    // ids of text (added tokens matched); n_ids may exceed cap (then only cap were written)
    int (*encode)(void *self, const char *text, size_t n, int32_t *ids, int cap, int *n_ids, moet_err *e);
    // the bytes of one token; with skip_special, special tokens (<|im_end|> …) give none
    void (*piece)(void *self, int32_t id, int skip_special, const char **s, size_t *n);
} serve_codec;

typedef struct {
    int max_num_seqs;       // sequences decoded together (backend slots)
    int max_batch_tokens;   // tokens per step
    int max_queue;          // requests read and waiting for a slot
    int max_logprobs;       // top_logprobs accepted (storage per request)
    const char *model_name; // "model" of every response
    samp_params defaults;   // generation_config.json
    int n_eos;
    int32_t eos[MOET_MAX_EOS_IDS];  // stop token ids of the model
    uint64_t seed_base;     // requests without a seed draw from this + a counter
    int thinking;           // enable_thinking of requests that do not set it
    int max_new_tokens;     // max_tokens of requests that give none (generation_config.json); 0: to the context limit
} serve_config;

enum { REC_FREE, REC_WAITING, REC_PREFILL, REC_DECODE };
enum { FIN_NONE, FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR };
static const char *const serve_finish_name[] = {"", "stop", "length", "cancelled", "error"};

typedef struct {
    int state;              // REC_*
    int kind, batch, stream, thinking, legacy_lp;
    char id[MOET_MAX_ID + 1];
    uint64_t batch_no;      // Batch lines: the n of "batch_req_<n>"
    uint64_t order;         // arrival order
    int64_t created;        // unix seconds at arrival
    samp_params sp;
    samp_rng rng;
    int logprobs, top_logprobs, max_tokens, ignore_eos, return_token_ids;
    int n_stop;
    uint16_t stop_len[MOET_MAX_STOP];
    char *stop;             // [MOET_MAX_STOP][MOET_MAX_STOP_BYTES]
    size_t stop_max;        // longest stop string
    int n_stop_ids;
    int32_t stop_ids[MOET_MAX_STOP_IDS];
    int32_t *tok;           // [max_len] prompt, then generated tokens
    int n_prompt, n_tok, n_fed;   // n_fed: tokens the backend has seen
    char *text;             // [text_cap] generated text (special tokens skipped)
    size_t text_len;
    size_t released;        // completion stream: bytes handed out
    chat_split split;       // chat stream: reasoning/content handed out
    float *lp;              // [max_len] logprob of each generated token
    int32_t *lp_ids;        // [max_len, max_logprobs]
    float *lp_vals;         // [max_len, max_logprobs]
    int lp_sent;            // generated tokens whose logprobs were streamed
    int slot;               // backend slot, -1 while waiting
    int finish;             // FIN_*
    int cancel;             // asked to stop
    int sent_first;         // stream: the first chunk (with the role) went out
    double t_read, t_admit, t_first, t_done;
} serve_rec;

typedef struct {
    serve_config cfg;
    engine_backend be;
    serve_codec codec;
    int V, max_len;
    size_t text_cap;
    // requests
    serve_rec *recs;        // [n_recs]
    int n_recs;
    int *free_recs, n_free_recs;   // stack
    int *waiting, wait_head, n_waiting;  // ring of rec indices, arrival order
    int *running, n_running;       // rec indices in admission order
    int *free_slots, n_free_slots; // stack of backend slots
    samp_slot *pen;         // [max_num_seqs] penalty state per backend slot
    // one step
    float *logits;          // [max_num_seqs, V]
    int32_t *ids;           // [max_batch_tokens]
    int *row_slot, *row_rec, *off;   // [max_num_seqs], [max_num_seqs], [max_num_seqs + 1]
    samp_scratch sc;
    // one line
    char *in;               // [in_cap] bytes read, not yet consumed
    size_t in_cap, in_start, in_end;
    int skipping, in_eof;
    js_doc doc;
    chat_mem cm;
    char *prompt;           // [prompt_cap] rendered chat prompt
    size_t prompt_cap;
    int32_t *enc;           // [enc_cap] encoded prompt
    int enc_cap;
    proto_out out;
    // counters
    uint64_t lines, order, batch_no, seed_count;
    int n_cancel;           // requests marked cancelled and not yet finished
    uint64_t n_done, n_cancelled, n_errors, prompt_tokens, gen_tokens, steps;
    double t_start;
    uint64_t allocs_at_ready;
    arena mem;
} serve_ctx;

static volatile sig_atomic_t serve_signals;   // SIGTERM/SIGINT count
static void serve_on_signal(int sig) {
    (void)sig;
    serve_signals++;
}

static double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ---- memory plan ---------------------------------------------------------------------------

#define SERVE_TAKE(a, ptr, count, what) ((ptr) = arena_take((a), sizeof(*(ptr)) * (size_t)(count), 64, (what)))

static void serve_carve(serve_ctx *S, arena *a) {
    const serve_config *c = &S->cfg;
    int K = c->max_logprobs;
    SERVE_TAKE(a, S->recs, S->n_recs, "request records");
    for (int i = 0; i < S->n_recs; i++) {
        serve_rec *r = a->base ? &S->recs[i] : &(serve_rec){0};
        SERVE_TAKE(a, r->tok, S->max_len, "token buffers");
        SERVE_TAKE(a, r->text, S->text_cap, "text buffers");
        SERVE_TAKE(a, r->stop, MOET_MAX_STOP * MOET_MAX_STOP_BYTES, "stop strings");
        SERVE_TAKE(a, r->lp, S->max_len, "logprobs");
        SERVE_TAKE(a, r->lp_ids, (size_t)S->max_len * (K ? K : 1), "top logprob ids");
        SERVE_TAKE(a, r->lp_vals, (size_t)S->max_len * (K ? K : 1), "top logprobs");
    }
    SERVE_TAKE(a, S->free_recs, S->n_recs, "record free list");
    SERVE_TAKE(a, S->waiting, S->n_recs, "waiting queue");
    SERVE_TAKE(a, S->running, c->max_num_seqs, "running list");
    SERVE_TAKE(a, S->free_slots, c->max_num_seqs, "slot free list");
    SERVE_TAKE(a, S->pen, c->max_num_seqs, "penalty state");
    for (int s = 0; s < c->max_num_seqs; s++) {
        samp_slot *p = a->base ? &S->pen[s] : &(samp_slot){0};
        SERVE_TAKE(a, p->count, S->V, "penalty counts");
        SERVE_TAKE(a, p->seen, (S->V + 7) / 8, "penalty bits");
    }
    SERVE_TAKE(a, S->logits, (size_t)c->max_num_seqs * S->V, "step logits");
    SERVE_TAKE(a, S->ids, c->max_batch_tokens, "step tokens");
    SERVE_TAKE(a, S->row_slot, c->max_num_seqs, "step rows");
    SERVE_TAKE(a, S->row_rec, c->max_num_seqs, "step rows");
    SERVE_TAKE(a, S->off, c->max_num_seqs + 1, "step offsets");
    SERVE_TAKE(a, S->sc.work, S->V, "sampler scratch");
    SERVE_TAKE(a, S->sc.cand, S->V, "sampler candidates");
    SERVE_TAKE(a, S->in, S->in_cap, "input buffer");
    SERVE_TAKE(a, S->doc.nodes, MOET_MAX_LINE_VALUES, "request JSON values");
    SERVE_TAKE(a, S->doc.strs, MOET_MAX_LINE + 1, "request JSON strings");
    SERVE_TAKE(a, S->cm.scratch, MOET_MAX_LINE, "message text");
    SERVE_TAKE(a, S->cm.args.nodes, MOET_MAX_LINE_VALUES, "tool argument values");
    SERVE_TAKE(a, S->cm.args.strs, MOET_MAX_LINE + 1, "tool argument strings");
    SERVE_TAKE(a, S->prompt, S->prompt_cap, "rendered prompt");
    SERVE_TAKE(a, S->enc, S->enc_cap, "encoded prompt");
    SERVE_TAKE(a, S->out.buf, MOET_OUT_BUFFER, "output buffer");
}

// Plans and allocates everything for the backend `be` and the codec. Returns -1 with e set
// when a flag is out of range or the memory is refused.
static int serve_init(serve_ctx *S, const serve_config *cfg, engine_backend be, serve_codec codec, moet_err *e) {
    memset(S, 0, sizeof *S);
    S->cfg = *cfg;
    S->be = be;
    S->codec = codec;
    S->V = be.n_vocab;
    S->max_len = be.max_len;
    const serve_config *c = &S->cfg;
    if (c->max_num_seqs < 1 || c->max_num_seqs > be.max_seqs)
        return err_set(e, "--max-num-seqs %d: the backend has %d sequence slots", c->max_num_seqs, be.max_seqs);
    if (c->max_batch_tokens < c->max_num_seqs)
        return err_set(e, "--max-batch-tokens %d must be at least --max-num-seqs %d (one decode token per sequence)",
                       c->max_batch_tokens, c->max_num_seqs);
    if (c->max_queue < 0 || c->max_queue > MOET_MAX_QUEUE)
        return err_set(e, "--max-queue %d: expected 0 .. %d", c->max_queue, MOET_MAX_QUEUE);
    if (c->max_logprobs < 0 || c->max_logprobs > MOET_MAX_LOGPROBS)
        return err_set(e, "--max-logprobs %d: expected 0 .. %d", c->max_logprobs, MOET_MAX_LOGPROBS);
    if (S->max_len < 2) return err_set(e, "context length %d: at least 2 tokens are needed", S->max_len);
    S->n_recs = c->max_num_seqs + c->max_queue;
    S->text_cap = (size_t)S->max_len * MOET_TEXT_PER_TOKEN + 256;
    S->in_cap = MOET_MAX_LINE + 1 + (64u << 10);
    // the line's strings plus the template around them; tool JSON re-serialized with Python's
    // separators can grow, and a prompt past this is refused with a message
    S->prompt_cap = (size_t)MOET_MAX_LINE + MOET_MAX_LINE / 2 + (64u << 10);
    S->enc_cap = (int)S->prompt_cap;   // a token is at least one byte of text
    S->sc.n_vocab = S->V;
    S->doc.cap_nodes = MOET_MAX_LINE_VALUES;
    S->doc.cap_strs = MOET_MAX_LINE + 1;
    S->cm.scratch_cap = MOET_MAX_LINE;
    S->cm.args.cap_nodes = MOET_MAX_LINE_VALUES;
    S->cm.args.cap_strs = MOET_MAX_LINE + 1;
    S->out.cap = MOET_OUT_BUFFER;
    arena plan = arena_measure("serve");
    serve_carve(S, &plan);
    if (arena_init(&S->mem, "serve", plan.used, e)) return -1;
    serve_carve(S, &S->mem);
    arena_done(&S->mem);
    for (int i = 0; i < S->n_recs; i++) S->free_recs[S->n_free_recs++] = S->n_recs - 1 - i;
    for (int s = 0; s < c->max_num_seqs; s++) {
        S->free_slots[S->n_free_slots++] = c->max_num_seqs - 1 - s;
        memset(S->pen[s].count, 0, sizeof(uint16_t) * (size_t)S->V);
        memset(S->pen[s].seen, 0, (size_t)(S->V + 7) / 8);
    }
    for (int i = 0; i < S->n_recs; i++) S->recs[i].state = REC_FREE;
    return 0;
}

static void serve_free(serve_ctx *S) { arena_release(&S->mem); }

// ---- responses -------------------------------------------------------------------------------

static void serve_head(serve_ctx *S, const serve_rec *r, const char *object) {
    proto_out *o = &S->out;
    po_s(o, "{\"id\":");
    po_cstr(o, r->id);
    po_fmt(o, ",\"object\":\"%s\",\"created\":%" PRId64 ",\"model\":", object, r->created);
    po_cstr(o, S->cfg.model_name);
}

static void serve_usage_timing(serve_ctx *S, const serve_rec *r) {
    proto_out *o = &S->out;
    int gen = r->n_tok - r->n_prompt;
    po_fmt(o, ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", r->n_prompt, gen, r->n_tok);
    double t_first = r->t_first > 0 ? r->t_first : r->t_done;
    double admit = r->t_admit > 0 ? r->t_admit : r->t_done;
    double decode = r->t_done - t_first;
    po_s(o, ",\"timing\":{\"queue_ms\":");
    po_num(o, round((admit - r->t_read) * 1e4) / 10);
    po_s(o, ",\"prefill_ms\":");
    po_num(o, round((t_first - admit) * 1e4) / 10);
    po_s(o, ",\"decode_ms\":");
    po_num(o, round(decode * 1e4) / 10);
    po_s(o, ",\"decode_tok_s\":");
    po_num(o, gen > 1 && decode > 0 ? round((gen - 1) / decode * 10) / 10 : 0);
    po_s(o, "}");
}

static void serve_token_text(serve_ctx *S, int32_t id, int as_key) {
    const char *s;
    size_t n;
    S->codec.piece(S->codec.self, id, 0, &s, &n);
    (void)as_key;
    po_str(&S->out, s, n);
}

static void serve_token_bytes(serve_ctx *S, int32_t id) {
    const char *s;
    size_t n;
    S->codec.piece(S->codec.self, id, 0, &s, &n);
    po_s(&S->out, "[");
    for (size_t i = 0; i < n; i++) po_fmt(&S->out, i ? ",%u" : "%u", (unsigned)(uint8_t)s[i]);
    po_s(&S->out, "]");
}

// "logprobs" of generated tokens [from, to): the chat shape, or the legacy completions shape.
static void serve_logprobs(serve_ctx *S, const serve_rec *r, int from, int to) {
    proto_out *o = &S->out;
    int K = S->cfg.max_logprobs;
    if (!r->logprobs || from >= to) { po_s(o, "null"); return; }
    if (!r->legacy_lp) {
        po_s(o, "{\"content\":[");
        for (int i = from; i < to; i++) {
            int32_t id = r->tok[r->n_prompt + i];
            po_s(o, i > from ? ",{\"token\":" : "{\"token\":");
            serve_token_text(S, id, 0);
            po_s(o, ",\"logprob\":");
            po_num(o, r->lp[i]);
            po_s(o, ",\"bytes\":");
            serve_token_bytes(S, id);
            po_s(o, ",\"top_logprobs\":[");
            for (int k = 0; k < r->top_logprobs; k++) {
                int32_t t = r->lp_ids[(size_t)i * K + k];
                po_s(o, k ? ",{\"token\":" : "{\"token\":");
                serve_token_text(S, t, 0);
                po_s(o, ",\"logprob\":");
                po_num(o, r->lp_vals[(size_t)i * K + k]);
                po_s(o, ",\"bytes\":");
                serve_token_bytes(S, t);
                po_s(o, "}");
            }
            po_s(o, "]}");
        }
        po_s(o, "]}");
        return;
    }
    po_s(o, "{\"tokens\":[");
    for (int i = from; i < to; i++) {
        if (i > from) po_s(o, ",");
        serve_token_text(S, r->tok[r->n_prompt + i], 0);
    }
    po_s(o, "],\"token_logprobs\":[");
    for (int i = from; i < to; i++) {
        if (i > from) po_s(o, ",");
        po_num(o, r->lp[i]);
    }
    po_s(o, "],\"top_logprobs\":[");
    for (int i = from; i < to; i++) {
        po_s(o, i > from ? ",{" : "{");
        for (int k = 0; k < r->top_logprobs; k++) {
            if (k) po_s(o, ",");
            serve_token_text(S, r->lp_ids[(size_t)i * K + k], 1);
            po_s(o, ":");
            po_num(o, r->lp_vals[(size_t)i * K + k]);
        }
        po_s(o, "}");
    }
    po_s(o, "],\"text_offset\":[");
    size_t at = 0;
    for (int i = 0; i < to; i++) {
        const char *s;
        size_t n;
        S->codec.piece(S->codec.self, r->tok[r->n_prompt + i], 1, &s, &n);
        if (i >= from) po_fmt(o, i > from ? ",%zu" : "%zu", at);
        at += n;
    }
    po_s(o, "]}");
}

// The whole answer of a finished, non-streamed request (chat.completion / text_completion),
// wrapped as a Batch output line when the request came as one.
static void serve_write_final(serve_ctx *S, serve_rec *r) {
    proto_out *o = &S->out;
    int gen = r->n_tok - r->n_prompt;
    if (r->batch) {
        po_fmt(o, "{\"id\":\"batch_req_%" PRIu64 "\",\"custom_id\":", r->batch_no);
        po_cstr(o, r->id);
        po_s(o, ",\"response\":{\"status_code\":200,\"request_id\":");
        po_cstr(o, r->id);
        po_s(o, ",\"body\":");
    }
    if (r->kind == PROTO_CHAT) {
        size_t r0, r1, c0, c1;
        chat_split_all(r->thinking, r->text, r->text_len, &r0, &r1, &c0, &c1);
        serve_head(S, r, "chat.completion");
        po_s(o, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\"");
        if (r->thinking) {
            po_s(o, ",\"reasoning_content\":");
            po_str(o, r->text + r0, r1 - r0);
        }
        po_s(o, ",\"content\":");
        po_str(o, r->text + c0, c1 - c0);
        po_s(o, "},\"logprobs\":");
    } else {
        serve_head(S, r, "text_completion");
        po_s(o, ",\"choices\":[{\"index\":0,\"text\":");
        po_str(o, r->text, r->text_len);
        po_s(o, ",\"logprobs\":");
    }
    serve_logprobs(S, r, 0, r->logprobs ? gen : 0);
    po_fmt(o, ",\"finish_reason\":\"%s\"", serve_finish_name[r->finish]);
    if (r->return_token_ids) {   // every generated id, a stop token included (vLLM's field)
        po_s(o, ",\"token_ids\":[");
        for (int i = r->n_prompt; i < r->n_tok; i++) po_fmt(o, i > r->n_prompt ? ",%d" : "%d", r->tok[i]);
        po_s(o, "]");
    }
    po_s(o, "}]");
    if (r->return_token_ids) {
        po_s(o, ",\"prompt_token_ids\":[");
        for (int i = 0; i < r->n_prompt; i++) po_fmt(o, i ? ",%d" : "%d", r->tok[i]);
        po_s(o, "]");
    }
    serve_usage_timing(S, r);
    po_s(o, "}");
    if (r->batch) po_s(o, "},\"error\":null}");
    po_end_line(o);
}

// Streams what became safe to show: text that no stop string can still cut, ending on a
// whole UTF-8 character, split into reasoning/content. final: the request is finished.
static void serve_stream(serve_ctx *S, serve_rec *r, int final) {
    proto_out *o = &S->out;
    size_t safe = r->text_len;
    if (!final) {
        size_t hold = 0;   // the longest tail that begins a stop string
        for (int k = 0; k < r->n_stop; k++) {
            const char *st = r->stop + (size_t)k * MOET_MAX_STOP_BYTES;
            for (size_t j = r->stop_len[k] - 1; j > hold; j--)
                if (j <= r->text_len && memcmp(r->text + r->text_len - j, st, j) == 0) { hold = j; break; }
        }
        safe -= hold;
        // back to a character boundary: an unfinished multi-byte sequence waits
        for (size_t back = 1; back <= 3 && back <= safe; back++) {
            uint8_t c = (uint8_t)r->text[safe - back];
            if ((c & 0xc0) == 0x80) continue;
            size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            if (need > back) safe -= back;
            break;
        }
    }
    size_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;   // reasoning delta, content delta
    if (r->kind == PROTO_CHAT) {
        chat_delta d;
        chat_split_update(&r->split, r->text, safe, final, &d);
        a0 = d.r_from, a1 = d.r_to, b0 = d.c_from, b1 = d.c_to;
    } else if (safe > r->released) {
        b0 = r->released;
        b1 = r->released = safe;
    }
    int gen = r->n_tok - r->n_prompt;
    int lp_due = r->logprobs && r->lp_sent < gen;
    if (a1 > a0 || b1 > b0 || (final && lp_due)) {
        if (r->kind == PROTO_CHAT) {
            serve_head(S, r, "chat.completion.chunk");
            po_s(o, ",\"choices\":[{\"index\":0,\"delta\":{");
            int comma = 0;
            if (!r->sent_first) { po_s(o, "\"role\":\"assistant\""); comma = 1; }
            if (a1 > a0) {
                po_s(o, comma ? ",\"reasoning_content\":" : "\"reasoning_content\":");
                po_str(o, r->text + a0, a1 - a0);
                comma = 1;
            }
            if (b1 > b0) {
                po_s(o, comma ? ",\"content\":" : "\"content\":");
                po_str(o, r->text + b0, b1 - b0);
            }
            po_s(o, "},\"logprobs\":");
        } else {
            serve_head(S, r, "text_completion");
            po_s(o, ",\"choices\":[{\"index\":0,\"text\":");
            po_str(o, r->text + b0, b1 - b0);
            po_s(o, ",\"logprobs\":");
        }
        serve_logprobs(S, r, r->lp_sent, lp_due ? gen : r->lp_sent);
        r->lp_sent = gen;
        po_s(o, ",\"finish_reason\":null}]}");
        po_end_line(o);
        r->sent_first = 1;
    }
    if (final) {
        serve_head(S, r, r->kind == PROTO_CHAT ? "chat.completion.chunk" : "text_completion");
        if (r->kind == PROTO_CHAT)   // the role goes in the first chunk, even when it is this one
            po_s(o, r->sent_first ? ",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null"
                                  : ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"logprobs\":null");
        else po_s(o, ",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null");
        po_fmt(o, ",\"finish_reason\":\"%s\"}]", serve_finish_name[r->finish]);
        serve_usage_timing(S, r);
        po_s(o, "}");
        po_end_line(o);
    }
}

// ---- request lifetime ---------------------------------------------------------------------

static void serve_release(serve_ctx *S, serve_rec *r) {
    int idx = (int)(r - S->recs);
    if (r->slot >= 0) {
        samp_slot_clear(&S->pen[r->slot], r->tok, r->n_tok);
        S->free_slots[S->n_free_slots++] = r->slot;
        for (int i = 0; i < S->n_running; i++)
            if (S->running[i] == idx) {
                memmove(&S->running[i], &S->running[i + 1], sizeof(int) * (size_t)(S->n_running - i - 1));
                S->n_running--;
                break;
            }
    } else {   // still in the waiting ring: take it out, keeping the order of the others
        int n = S->n_waiting, k = 0;
        for (int i = 0; i < n; i++) {
            int v = S->waiting[(S->wait_head + i) % S->n_recs];
            if (v != idx) S->waiting[(S->wait_head + k++) % S->n_recs] = v;
        }
        S->n_waiting = k;
    }
    r->state = REC_FREE;
    r->slot = -1;
    S->free_recs[S->n_free_recs++] = idx;
}

static void serve_finish(serve_ctx *S, serve_rec *r, int why) {
    if (r->cancel) S->n_cancel--;
    r->finish = why;
    r->t_done = serve_now();
    if (why == FIN_CANCELLED) S->n_cancelled++;
    S->n_done++;
    S->gen_tokens += (uint64_t)(r->n_tok - r->n_prompt);
    if (r->stream && !r->batch) serve_stream(S, r, 1);
    else serve_write_final(S, r);
    serve_release(S, r);
}

// A failure of the backend while this request ran: an error answer, the slot freed.
static void serve_fail(serve_ctx *S, serve_rec *r, const char *msg) {
    if (r->cancel) S->n_cancel--;
    S->n_errors++;
    proto_write_error(&S->out, r->id, r->batch, r->batch_no, "server_error", "server_error", msg);
    serve_release(S, r);
}

static int serve_is_stop_id(const serve_ctx *S, const serve_rec *r, int32_t id) {
    for (int i = 0; i < S->cfg.n_eos; i++)
        if (S->cfg.eos[i] == id) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return 1;
    return 0;
}

// Samples the next token of r from its logits row and applies every stop rule.
static void serve_sample(serve_ctx *S, serve_rec *r, const float *row) {
    samp_slot *pen = &S->pen[r->slot];
    int32_t id = samp_pick(&S->sc, pen, &r->sp, &r->rng, row);
    int gen = r->n_tok - r->n_prompt;   // index of this token among the generated ones
    if (r->logprobs)
        r->lp[gen] = samp_logprobs(row, S->V, id, r->top_logprobs, r->lp_ids + (size_t)gen * S->cfg.max_logprobs,
                                   r->lp_vals + (size_t)gen * S->cfg.max_logprobs);
    if (r->t_first == 0) r->t_first = serve_now();
    r->tok[r->n_tok++] = id;
    samp_slot_note_output(pen, id);
    gen++;
    int why = FIN_NONE;
    if (!r->ignore_eos && serve_is_stop_id(S, r, id)) why = FIN_STOP;
    else {
        const char *s;
        size_t n;
        S->codec.piece(S->codec.self, id, 1, &s, &n);
        if (n > S->text_cap - r->text_len) why = FIN_LENGTH;   // planned text room used up
        else {
            size_t from = r->text_len > r->stop_max ? r->text_len - r->stop_max + 1 : 0;
            memcpy(r->text + r->text_len, s, n);
            r->text_len += n;
            // a stop string ending in the new bytes: cut the text before it
            size_t cut = SIZE_MAX;
            for (int k = 0; k < r->n_stop; k++) {
                const char *st = r->stop + (size_t)k * MOET_MAX_STOP_BYTES;
                size_t L = r->stop_len[k];
                for (size_t p = from; p + L <= r->text_len && p < cut; p++)
                    if (memcmp(r->text + p, st, L) == 0) { cut = p; break; }
            }
            if (cut != SIZE_MAX) {
                r->text_len = cut;
                why = FIN_STOP;
            }
        }
        if (why == FIN_NONE && ((r->max_tokens && gen >= r->max_tokens) || r->n_tok >= S->max_len)) why = FIN_LENGTH;
    }
    if (why != FIN_NONE) { serve_finish(S, r, why); return; }
    if (r->stream && !r->batch) serve_stream(S, r, 0);
}

// Gives free backend slots to waiting requests, oldest first.
static void serve_admit(serve_ctx *S) {
    while (S->n_waiting && S->n_free_slots) {
        int idx = S->waiting[S->wait_head];
        S->wait_head = (S->wait_head + 1) % S->n_recs;
        S->n_waiting--;
        serve_rec *r = &S->recs[idx];
        r->slot = S->free_slots[--S->n_free_slots];
        S->be.reset(S->be.self, r->slot);
        samp_slot_note_prompt(&S->pen[r->slot], r->tok, r->n_prompt);
        r->state = REC_PREFILL;
        r->t_admit = serve_now();
        S->running[S->n_running++] = idx;
    }
}

// One batched step over the running requests. Returns 0, or -1 when the backend failed
// (the requests of the step are answered with an error).
static int serve_step(serve_ctx *S) {
    int n = 0, T = 0;
    S->off[0] = 0;
    for (int i = 0; i < S->n_running; i++) {   // every decoding sequence: its next token
        serve_rec *r = &S->recs[S->running[i]];
        if (r->state != REC_DECODE) continue;
        S->ids[T++] = r->tok[r->n_fed];
        S->row_slot[n] = r->slot;
        S->row_rec[n++] = S->running[i];
        S->off[n] = T;
    }
    for (int i = 0; i < S->n_running && T < S->cfg.max_batch_tokens; i++) {   // prefill chunks, oldest first
        serve_rec *r = &S->recs[S->running[i]];
        if (r->state != REC_PREFILL) continue;
        int take = r->n_prompt - r->n_fed;
        if (take > S->cfg.max_batch_tokens - T) take = S->cfg.max_batch_tokens - T;
        memcpy(S->ids + T, r->tok + r->n_fed, sizeof(int32_t) * (size_t)take);
        T += take;
        S->row_slot[n] = r->slot;
        S->row_rec[n++] = S->running[i];
        S->off[n] = T;
    }
    if (n == 0) return 0;
    moet_err e = {{0}};
    S->steps++;
    if (S->be.step(S->be.self, n, S->row_slot, S->ids, S->off, S->logits, &e) != 0) {
        fprintf(stderr, "moet serve: backend step failed: %s\n", e.msg);
        for (int i = 0; i < n; i++) serve_fail(S, &S->recs[S->row_rec[i]], e.msg);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        serve_rec *r = &S->recs[S->row_rec[i]];
        r->n_fed += S->off[i + 1] - S->off[i];
        if (r->state == REC_PREFILL) {
            if (r->n_fed < r->n_prompt) continue;   // more prompt to go: these logits are not needed
            r->state = REC_DECODE;
        }
        serve_sample(S, r, S->logits + (size_t)i * S->V);
    }
    return 0;
}

// ---- lines ---------------------------------------------------------------------------------

static void serve_stats(serve_ctx *S, const proto_req *q) {
    proto_out *o = &S->out;
    long pages = 0, rss = 0, shared = 0;   // resident pages, from /proc (read without stdio: no allocation)
    char sm[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = read(fd, sm, sizeof sm - 1);
        close(fd);
        sm[k > 0 ? k : 0] = 0;
        if (sscanf(sm, "%ld %ld %ld", &pages, &rss, &shared) != 3) rss = shared = 0;
    }
    po_s(o, "{\"object\":\"stats\"");
    if (q->has_id) { po_s(o, ",\"id\":"); po_cstr(o, q->id); }
    po_fmt(o, ",\"running\":%d,\"waiting\":%d,\"max_num_seqs\":%d,\"requests_finished\":%" PRIu64
              ",\"requests_cancelled\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"prompt_tokens\":%" PRIu64
              ",\"completion_tokens\":%" PRIu64 ",\"steps\":%" PRIu64 ",\"allocations_after_ready\":%" PRIu64
              ",\"rss_kb\":%ld,\"rss_anon_kb\":%ld,\"uptime_s\":",
           S->n_running, S->n_waiting, S->cfg.max_num_seqs, S->n_done, S->n_cancelled, S->n_errors, S->prompt_tokens,
           S->gen_tokens, S->steps, arena_stats.allocs - S->allocs_at_ready, rss * (sysconf(_SC_PAGESIZE) / 1024),
           (rss - shared) * (sysconf(_SC_PAGESIZE) / 1024));
    po_num(o, round((serve_now() - S->t_start) * 1000) / 1000);
    po_s(o, "}");
    po_end_line(o);
}

static void serve_error(serve_ctx *S, const char *id, int batch, uint64_t batch_no, const char *code, const char *msg) {
    S->n_errors++;
    proto_write_error(&S->out, id, batch, batch_no, code, "invalid_request_error", msg);
}

static serve_rec *serve_find(serve_ctx *S, const char *id) {
    for (int i = 0; i < S->n_recs; i++)
        if (S->recs[i].state != REC_FREE && !strcmp(S->recs[i].id, id)) return &S->recs[i];
    return NULL;
}

// One complete input line (without its "\n"). Needs a free record (the caller checks).
static void serve_line(serve_ctx *S, char *line, size_t n) {
    S->lines++;
    double t_read = serve_now();
    if (n && line[n - 1] == '\r') n--;
    char auto_id[32];
    snprintf(auto_id, sizeof auto_id, "req-%" PRIu64, S->lines);
    char msg[512];
    int64_t bad = proto_bad_utf8(line, n);
    if (bad >= 0) {
        snprintf(msg, sizeof msg, "the line is not valid UTF-8 (byte %" PRId64 ")", bad);
        serve_error(S, NULL, 0, 0, "invalid_utf8", msg);
        return;
    }
    uint32_t nodes;
    size_t strs;
    if (js_measure(&S->doc, line, n, &nodes, &strs) != 0) {
        snprintf(msg, sizeof msg, "the line is not valid JSON: %s", S->doc.err);
        serve_error(S, NULL, 0, 0, "invalid_json", msg);
        return;
    }
    if (nodes > S->doc.cap_nodes) {
        snprintf(msg, sizeof msg, "the line has %u JSON values; the limit is %u", nodes, S->doc.cap_nodes);
        serve_error(S, NULL, 0, 0, "request_too_large", msg);
        return;
    }
    MOET_ASSERT(js_parse(&S->doc, line, n) == 0, "second JSON pass: %s", S->doc.err);
    proto_req q;
    proto_error pe = {0};
    proto_limits lim = {S->cfg.defaults, S->V, S->cfg.max_logprobs, S->cfg.thinking};
    int is_batch_line = 0;
    if (proto_parse(&S->doc, &lim, auto_id, &q, &pe) != 0) {
        is_batch_line = q.batch && q.has_id;
        // the line named itself, or was recognized as a request (which got an assigned id)
        serve_error(S, q.has_id || q.kind == PROTO_CHAT || q.kind == PROTO_COMPLETION ? q.id : NULL, is_batch_line,
                    is_batch_line ? ++S->batch_no : 0, pe.code, pe.e.msg);
        return;
    }
    if (q.kind == PROTO_STATS) { serve_stats(S, &q); return; }
    if (q.kind == PROTO_CANCEL) {
        serve_rec *r = serve_find(S, q.id);
        if (!r) {
            snprintf(msg, sizeof msg, "no request with id \"%.256s\" is running or waiting", q.id);
            serve_error(S, q.id, 0, 0, "not_found", msg);
            return;
        }
        if (!r->cancel) S->n_cancel++;
        r->cancel = 1;
        po_s(&S->out, "{\"object\":\"cancel\",\"id\":");
        po_cstr(&S->out, q.id);
        po_s(&S->out, ",\"cancelled\":true}");
        po_end_line(&S->out);
        return;
    }
    uint64_t batch_no = q.batch ? ++S->batch_no : 0;
    if (q.has_id && serve_find(S, q.id)) {
        snprintf(msg, sizeof msg, "a request with id \"%.256s\" is still running", q.id);
        serve_error(S, q.id, q.batch, batch_no, "duplicate_id", msg);
        return;
    }
    // the prompt's tokens
    moet_err e = {{0}};
    int n_ids = 0;
    const int32_t *ids = S->enc;
    if (q.kind == PROTO_CHAT) {
        size_t len;
        if (chat_render(&S->doc, q.messages, q.tools, &q.chat, &S->cm, S->prompt, S->prompt_cap, &len, &e) != 0) {
            serve_error(S, q.id, q.batch, batch_no, "invalid_request", e.msg);
            return;
        }
        if (S->codec.encode(S->codec.self, S->prompt, len, S->enc, S->enc_cap, &n_ids, &e) != 0) {
            serve_error(S, q.id, q.batch, batch_no, "invalid_request", e.msg);
            return;
        }
    } else if (q.prompt) {
        if (S->codec.encode(S->codec.self, q.prompt->str, q.prompt->len, S->enc, S->enc_cap, &n_ids, &e) != 0) {
            serve_error(S, q.id, q.batch, batch_no, "invalid_request", e.msg);
            return;
        }
    } else {
        n_ids = (int)q.input_ids->len;
        ids = NULL;
    }
    if (n_ids >= S->max_len) {
        snprintf(msg, sizeof msg, "prompt has %d tokens; the limit is %d (the context of %d tokens needs room for one "
                 "generated token)", n_ids, S->max_len - 1, S->max_len);
        serve_error(S, q.id, q.batch, batch_no, "context_length_exceeded", msg);
        return;
    }
    if (n_ids == 0) {
        serve_error(S, q.id, q.batch, batch_no, "invalid_value", "the prompt encodes to no tokens");
        return;
    }
    MOET_ASSERT(S->n_free_recs > 0, "no free request record");
    int idx = S->free_recs[--S->n_free_recs];
    serve_rec *r = &S->recs[idx];
    int32_t *toks = r->tok;   // the planned buffers stay; everything else starts from zero
    char *text = r->text, *stop = r->stop;
    float *lp = r->lp, *lpv = r->lp_vals;
    int32_t *lpi = r->lp_ids;
    memset(r, 0, sizeof *r);
    r->tok = toks, r->text = text, r->stop = stop, r->lp = lp, r->lp_vals = lpv, r->lp_ids = lpi;
    r->state = REC_WAITING;
    r->kind = q.kind;
    r->batch = q.batch;
    r->stream = q.stream && !q.batch;
    r->thinking = q.kind == PROTO_CHAT && q.chat.enable_thinking;
    r->legacy_lp = q.kind == PROTO_COMPLETION;
    memcpy(r->id, q.id, sizeof r->id);
    r->batch_no = batch_no;
    r->order = ++S->order;
    r->created = (int64_t)time(NULL);
    r->sp = q.sp;
    samp_seed(&r->rng, q.has_seed ? q.seed : S->cfg.seed_base + ++S->seed_count * 0x9e3779b97f4a7c15ull);
    r->logprobs = q.logprobs;
    r->top_logprobs = q.top_logprobs;
    r->max_tokens = q.max_tokens ? q.max_tokens : S->cfg.max_new_tokens;
    r->ignore_eos = q.ignore_eos;
    r->return_token_ids = q.return_token_ids;
    r->n_stop = q.n_stop;
    for (int k = 0; k < q.n_stop; k++) {
        memcpy(r->stop + (size_t)k * MOET_MAX_STOP_BYTES, q.stop[k]->str, q.stop[k]->len);
        r->stop_len[k] = (uint16_t)q.stop[k]->len;
        if (q.stop[k]->len > r->stop_max) r->stop_max = q.stop[k]->len;
    }
    r->n_stop_ids = q.n_stop_ids;
    memcpy(r->stop_ids, q.stop_ids, sizeof(int32_t) * (size_t)q.n_stop_ids);
    if (ids) memcpy(r->tok, ids, sizeof(int32_t) * (size_t)n_ids);
    else {
        const js_node *t = js_first(q.input_ids);
        for (int k = 0; k < n_ids; k++, t = js_next(&S->doc, t)) r->tok[k] = (int32_t)t->i64;
    }
    r->n_prompt = r->n_tok = n_ids;
    r->slot = -1;
    chat_split_init(&r->split, r->thinking);
    r->t_read = t_read;
    S->prompt_tokens += (uint64_t)n_ids;
    S->waiting[(S->wait_head + S->n_waiting++) % S->n_recs] = idx;
}

// Takes the next complete line from the input buffer (oversized lines are skipped and
// answered here). Returns 1 with the line, 0 when none is complete yet.
static int serve_next_line(serve_ctx *S, char **line, size_t *n) {
    for (;;) {
        char *base = S->in + S->in_start;
        size_t avail = S->in_end - S->in_start;
        char *nl = memchr(base, '\n', avail);
        if (S->skipping) {
            if (nl) S->in_start += (size_t)(nl - base) + 1;
            else {
                S->in_start = S->in_end;
                if (!S->in_eof) return 0;   // else the oversized line ended with the input
            }
            S->skipping = 0;
            S->lines++;
            char msg[160];
            snprintf(msg, sizeof msg, "the line is longer than the limit of %u bytes; it was skipped", MOET_MAX_LINE);
            serve_error(S, NULL, 0, 0, "line_too_long", msg);
            continue;
        }
        if (nl && (size_t)(nl - base) <= MOET_MAX_LINE) {
            *line = base;
            *n = (size_t)(nl - base);
            S->in_start += *n + 1;
            return 1;
        }
        if (nl || avail > MOET_MAX_LINE) {   // too long: skip through its newline
            S->skipping = 1;
            continue;
        }
        if (S->in_eof && avail) {   // the last line had no "\n"
            *line = base;
            *n = avail;
            S->in_start = S->in_end;
            return 1;
        }
        return 0;
    }
}

// Reads what fd has (waiting up to timeout_ms, -1 = until input or a signal).
static void serve_read(serve_ctx *S, int fd, int timeout_ms) {
    if (S->in_start > 0) {   // keep the unconsumed bytes at the front
        memmove(S->in, S->in + S->in_start, S->in_end - S->in_start);
        S->in_end -= S->in_start;
        S->in_start = 0;
    }
    if (S->in_end == S->in_cap) return;
    struct pollfd p = {fd, POLLIN, 0};
    int k = poll(&p, 1, timeout_ms);
    if (k <= 0) return;   // nothing yet, or a signal
    ssize_t got = read(fd, S->in + S->in_end, S->in_cap - S->in_end);
    if (got > 0) S->in_end += (size_t)got;
    else if (got == 0 || (errno != EINTR && errno != EAGAIN)) S->in_eof = 1;
}

static void serve_ready(serve_ctx *S) {
    proto_out *o = &S->out;
    po_s(o, "{\"object\":\"ready\",\"model\":");
    po_cstr(o, S->cfg.model_name);
    po_fmt(o, ",\"max_model_len\":%d,\"max_num_seqs\":%d,\"max_batch_tokens\":%d,\"max_queue\":%d,\"n_vocab\":%d,"
              "\"max_line_bytes\":%u}",
           S->max_len, S->cfg.max_num_seqs, S->cfg.max_batch_tokens, S->cfg.max_queue, S->V, MOET_MAX_LINE);
    po_end_line(o);
}

// The server: answers every line of fd_in on fd_out until EOF (then finishes what was read
// and returns 0) or signals (first: stop reading and finish; second: cancel what runs).
// Returns 1 when fd_out failed (the reader went away).
static int serve_run(serve_ctx *S, int fd_in, int fd_out) {
    S->out.fd = fd_out;
    S->t_start = serve_now();
    serve_ready(S);
    S->allocs_at_ready = arena_stats.allocs;
    int stopping = 0, cancelled_all = 0;
    for (;;) {
        if (S->out.failed) {
            fprintf(stderr, "moet serve: writing the answers failed: %s\n", strerror(S->out.err));
            return 1;
        }
        int sig = serve_signals;
        if (sig >= 1 && !stopping) {
            stopping = 1;
            if (S->in_end > S->in_start)
                fprintf(stderr, "moet serve: signal: %zu bytes of unread input dropped\n", S->in_end - S->in_start);
            S->in_start = S->in_end = 0;
            S->in_eof = 1;
            fprintf(stderr, "moet serve: signal: finishing %d running and %d waiting requests\n", S->n_running, S->n_waiting);
        }
        if (sig >= 2 && !cancelled_all) {
            cancelled_all = 1;
            for (int i = 0; i < S->n_recs; i++)
                if (S->recs[i].state != REC_FREE && !S->recs[i].cancel) S->recs[i].cancel = 1, S->n_cancel++;
        }
        // input: lines while a record is free
        if (!stopping) {
            char *line;
            size_t n;
            while (S->n_free_recs > 0 && serve_next_line(S, &line, &n)) serve_line(S, line, n);
            int busy = S->n_running > 0 || S->n_waiting > 0;
            if (!S->in_eof && S->n_free_recs > 0) {
                serve_read(S, fd_in, busy ? 0 : -1);
                while (S->n_free_recs > 0 && serve_next_line(S, &line, &n)) serve_line(S, line, n);
            }
        }
        // cancellations
        for (int i = 0; S->n_cancel > 0 && i < S->n_recs; i++)
            if (S->recs[i].state != REC_FREE && S->recs[i].cancel) serve_finish(S, &S->recs[i], FIN_CANCELLED);
        serve_admit(S);
        if (S->n_running) {
            serve_step(S);
            continue;
        }
        if (S->in_eof && !S->n_waiting && !(S->in_end > S->in_start)) break;
    }
    po_flush(&S->out);
    return S->out.failed;
}
