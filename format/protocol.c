// format/protocol.c — the JSONL protocol of `moet serve` (format/PROTOCOL.md): one request
// line in, validated into a proto_req (with its sampling parameters, samp_params); and the
// primitives of the line writer (proto_out, po_*) on which the server composes every line it
// writes (moet.c, serving: "the lines out").
//
// Parsing never allocates: the caller owns the line, the JSON document memory and the
// proto_req. Every rejected line gets an error with a code (what kind of mistake), and a
// message that says where and what was expected; `id` is filled as soon as the line gave one,
// so the error line can carry it.

// A request's sampling parameters (the sampler in moet.c applies them; format/PROTOCOL.md gives
// their ranges and defaults).
typedef struct {
    float temperature;          // 0 = greedy
    int top_k;                  // 0 = all
    float top_p;                // (0, 1]
    float min_p;                // [0, 1]
    float presence_penalty;     // [-2, 2]
    float frequency_penalty;    // [-2, 2]
    float repetition_penalty;   // > 0; 1 = off
} samp_params;
#define SAMP_GREEDY_BELOW 1e-5   // a temperature below this is greedy (vLLM's rule)

enum { PROTO_CHAT, PROTO_COMPLETION, PROTO_STATS, PROTO_CANCEL };

typedef struct {
    int kind;                   // PROTO_*, or -1 when the line was not recognized
    int batch;                  // an OpenAI Batch API line: the answer is a Batch output line
    char id[MOET_MAX_ID + 1];   // request id: "id", the Batch custom_id, or assigned
    int has_id;                 // the line named its id (else it is assigned)
    // chat
    const js_node *messages, *tools;
    chat_opts chat;
    // raw completion: prompt text, or token ids
    const js_node *prompt, *input_ids;
    // sampling and stopping
    samp_params sp;
    int has_seed;
    uint64_t seed;
    int max_tokens;             // 0: until the context is full
    int ignore_eos;             // keep going past the stop token ids
    int n_stop;
    const js_node *stop[MOET_MAX_STOP];      // JS_STR, non-empty
    int n_stop_ids;
    int32_t stop_ids[MOET_MAX_STOP_IDS];     // extra stop token ids (vLLM's stop_token_ids)
    int stream;
    int logprobs;               // report logprobs of the chosen tokens
    int top_logprobs;           // and of this many most likely tokens per position
    int return_token_ids;       // answers also carry prompt_token_ids and the choice's token_ids
} proto_req;

// Server-wide defaults and limits the parser checks against.
typedef struct {
    samp_params sp;             // generation_config.json, else temperature 1, top_p 1, top_k 0
    int n_vocab;
    int max_logprobs;           // largest top_logprobs accepted
    int thinking;               // enable_thinking when the request does not say
} proto_limits;

typedef struct {
    const char *code;           // machine-readable kind: invalid_json, invalid_value, ...
    moet_err e;                 // the sentence
} proto_error;

static int proto_fail(proto_error *pe, const char *code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int proto_fail(proto_error *pe, const char *code, const char *fmt, ...) {
    va_list ap;
    pe->code = code;
    va_start(ap, fmt);
    vsnprintf(pe->e.msg, sizeof pe->e.msg, fmt, ap);
    va_end(ap);
    return -1;
}

// Offset of the first byte that is not well-formed UTF-8, or -1 (the line reader's rule).
static int64_t proto_bad_utf8(const char *s, size_t n) { return ln_bad_utf8(s, n); }

// Integers. Every integer field takes a number whose exact value is an integer — written 5,
// 5.0 or 5e0 — read from its text (js_whole, js_u64), never through the double, so nothing is
// rounded: 5.0000000000000001 is a fraction, 2^64 - 1 stays itself. A number that is not an
// integer, or an integer out of the field's range, is `invalid_value`; a value that is not a
// number at all is `invalid_type` (format/PROTOCOL.md §7).

// A token id: an integer in [0, n_vocab). 0 with *v, else -1 with why[cap] saying what the
// value is instead ("1.5, not an integer", "-3, outside [0, 512)").
static int proto_token_id(const js_node *t, int n_vocab, int64_t *v, char *why, size_t cap) {
    if (t->type != JS_NUM) {
        snprintf(why, cap, "%s, not an integer", js_type_name(t));
        return -1;
    }
    if (js_whole(t, v)) {
        if (t->whole == JS_FRACTION) snprintf(why, cap, "%.17g, not an integer", t->num);
        else if (t->whole == JS_WHOLE_U64) snprintf(why, cap, "%" PRIu64 ", outside [0, %d)", t->u64, n_vocab);
        else snprintf(why, cap, "%g, outside [0, %d)", t->num, n_vocab);
        return -1;
    }
    if (*v < 0 || *v >= n_vocab) {
        snprintf(why, cap, "%" PRId64 ", outside [0, %d)", *v, n_vocab);
        return -1;
    }
    return 0;
}

// ---- typed field readers: absent → keep the default; present with the wrong type or out of
// range → an error naming the field

static int proto_num(const js_doc *d, const js_node *o, const char *key, double lo, double hi, int lo_open,
                     double *out, proto_error *pe) {
    const js_node *v = js_get(d, o, key);
    if (!v || v->type == JS_NULL) return 0;
    if (v->type != JS_NUM) return proto_fail(pe, "invalid_type", "\"%s\": expected a number, got %s", key, js_type_name(v));
    if (v->num < lo || (lo_open && v->num == lo) || v->num > hi)
        return proto_fail(pe, "invalid_value", "\"%s\" is %g; expected a value in %s%g, %g]", key, v->num,
                          lo_open ? "(" : "[", lo, hi);
    *out = v->num;
    return 0;
}

// An integer field in [lo, hi]. With clamp, an integer above hi (of any size) is taken as hi:
// fields whose larger values all mean the same (top_k above the vocabulary, max_tokens past
// any context).
static int proto_intv_clamp(const js_doc *d, const js_node *o, const char *key, int64_t lo, int64_t hi, int clamp,
                            int64_t *out, int *present, proto_error *pe) {
    const js_node *v = js_get(d, o, key);
    if (present) *present = 0;
    if (!v || v->type == JS_NULL) return 0;
    if (v->type != JS_NUM) return proto_fail(pe, "invalid_type", "\"%s\": expected an integer, got %s", key, js_type_name(v));
    int64_t x;
    int above = v->whole == JS_WHOLE_U64 || (v->whole == JS_WHOLE_BIG && v->num > 0);
    if (above && clamp) x = hi;
    else if (js_whole(v, &x) != 0)
        return proto_fail(pe, "invalid_value", "\"%s\" is %.17g%s; expected an integer in [%" PRId64 ", %" PRId64 "]", key,
                          v->num, v->whole == JS_FRACTION ? ", not an integer" : "", lo, hi);
    else if (x > hi && clamp) x = hi;
    if (x < lo || x > hi)
        return proto_fail(pe, "invalid_value", "\"%s\" is %" PRId64 "; expected an integer in [%" PRId64 ", %" PRId64 "]",
                          key, x, lo, hi);
    *out = x;
    if (present) *present = 1;
    return 0;
}

static int proto_intv(const js_doc *d, const js_node *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                      int *present, proto_error *pe) {
    return proto_intv_clamp(d, o, key, lo, hi, 0, out, present, pe);
}

// The request's seed: an integer in [-2^63, 2^64 - 1], exactly (a negative one modulo 2^64).
static int proto_seed(const js_node *v, uint64_t *out, proto_error *pe) {
    if (v->type != JS_NUM) return proto_fail(pe, "invalid_type", "\"seed\": expected an integer, got %s", js_type_name(v));
    int64_t i;
    if (js_u64(v, out) == 0) return 0;
    if (js_whole(v, &i) == 0) { *out = (uint64_t)i; return 0; }
    return proto_fail(pe, "invalid_value", "\"seed\" is %.17g; expected an integer in [-2^63, 2^64 - 1]", v->num);
}

static int proto_bool(const js_doc *d, const js_node *o, const char *key, int *out, proto_error *pe) {
    const js_node *v = js_get(d, o, key);
    if (!v || v->type == JS_NULL) return 0;
    if (v->type != JS_TRUE && v->type != JS_FALSE)
        return proto_fail(pe, "invalid_type", "\"%s\": expected true or false, got %s", key, js_type_name(v));
    *out = v->type == JS_TRUE;
    return 0;
}

// The sampling, stopping and output fields shared by chat and completion bodies.
static int proto_params(const js_doc *d, const js_node *b, int chat, const proto_limits *lim, proto_req *r,
                        proto_error *pe) {
    double x;
    int64_t i;
    int present;
    r->sp = lim->sp;
    x = r->sp.temperature;
    if (proto_num(d, b, "temperature", 0, 1e6, 0, &x, pe)) return -1;
    r->sp.temperature = (float)x;
    if (js_get(d, b, "temperature") && x > 0 && x < SAMP_GREEDY_BELOW) r->sp.temperature = 0;
    x = r->sp.top_p;
    if (proto_num(d, b, "top_p", 0, 1, 1, &x, pe)) return -1;
    r->sp.top_p = (float)x;
    x = r->sp.min_p;
    if (proto_num(d, b, "min_p", 0, 1, 0, &x, pe)) return -1;
    r->sp.min_p = (float)x;
    x = r->sp.presence_penalty;
    if (proto_num(d, b, "presence_penalty", -2, 2, 0, &x, pe)) return -1;
    r->sp.presence_penalty = (float)x;
    x = r->sp.frequency_penalty;
    if (proto_num(d, b, "frequency_penalty", -2, 2, 0, &x, pe)) return -1;
    r->sp.frequency_penalty = (float)x;
    x = r->sp.repetition_penalty;
    if (proto_num(d, b, "repetition_penalty", 0, 100, 1, &x, pe)) return -1;
    r->sp.repetition_penalty = (float)x;
    i = r->sp.top_k;
    if (proto_intv_clamp(d, b, "top_k", -1, INT64_MAX, 1, &i, NULL, pe)) return -1;
    if (i > lim->n_vocab) i = 0;         // above the vocabulary: every token
    r->sp.top_k = i < 0 ? 0 : (int)i;    // -1 and 0 both mean every token

    int64_t mt = 0;   // the context ends generation long before 2^31 - 1 tokens
    if (proto_intv_clamp(d, b, "max_tokens", 1, INT32_MAX, 1, &mt, &present, pe)) return -1;
    if (proto_intv_clamp(d, b, "max_completion_tokens", 1, INT32_MAX, 1, &mt, &present, pe)) return -1;
    r->max_tokens = (int)mt;
    i = 1;
    if (proto_intv(d, b, "n", 1, 1, &i, NULL, pe)) {
        if (strcmp(pe->code, "invalid_value")) return -1;   // not an integer at all
        pe->code = "unsupported_value";
        snprintf(pe->e.msg, sizeof pe->e.msg, "\"n\": only n = 1 is supported (one choice per request)");
        return -1;
    }
    const js_node *seed = js_get(d, b, "seed");
    if (seed && seed->type != JS_NULL) {
        if (proto_seed(seed, &r->seed, pe)) return -1;
        r->has_seed = 1;
    }
    if (proto_bool(d, b, "stream", &r->stream, pe)) return -1;
    if (proto_bool(d, b, "ignore_eos", &r->ignore_eos, pe)) return -1;
    if (proto_bool(d, b, "return_token_ids", &r->return_token_ids, pe)) return -1;

    // logprobs: chat takes a boolean plus top_logprobs; completions take the count itself
    const js_node *lp = js_get(d, b, "logprobs");
    if (chat) {
        if (proto_bool(d, b, "logprobs", &r->logprobs, pe)) return -1;
        i = 0;
        if (proto_intv(d, b, "top_logprobs", 0, lim->max_logprobs, &i, &present, pe)) return -1;
        r->top_logprobs = (int)i;
        if (present && i > 0 && !r->logprobs)
            return proto_fail(pe, "invalid_value", "\"top_logprobs\" needs \"logprobs\": true");
    } else if (lp && lp->type != JS_NULL) {
        if (lp->type == JS_TRUE || lp->type == JS_FALSE) r->logprobs = lp->type == JS_TRUE;
        else {
            if (proto_intv(d, b, "logprobs", 0, lim->max_logprobs, &i, NULL, pe)) return -1;
            r->logprobs = 1;
            r->top_logprobs = (int)i;
        }
    }

    const js_node *st = js_get(d, b, "stop");
    if (st && st->type != JS_NULL) {
        const js_node *one = st;
        uint32_t n = 1;
        if (st->type == JS_ARR) { n = st->len; one = js_first(st); }
        else if (st->type != JS_STR)
            return proto_fail(pe, "invalid_type", "\"stop\": expected a string or an array of strings, got %s", js_type_name(st));
        if (n > MOET_MAX_STOP) return proto_fail(pe, "invalid_value", "\"stop\": %u strings; at most %d", n, MOET_MAX_STOP);
        for (uint32_t k = 0; k < n; k++, one = js_next(d, one)) {
            if (one->type != JS_STR)
                return proto_fail(pe, "invalid_type", "\"stop\"[%u]: expected a string, got %s", k, js_type_name(one));
            if (one->len == 0) continue;   // an empty stop string never matches anything useful
            if (one->len > MOET_MAX_STOP_BYTES)
                return proto_fail(pe, "invalid_value", "\"stop\"[%u]: %u bytes; at most %d", k, one->len, MOET_MAX_STOP_BYTES);
            r->stop[r->n_stop++] = one;
        }
    }
    const js_node *sti = js_get(d, b, "stop_token_ids");
    if (sti && sti->type != JS_NULL) {
        if (sti->type != JS_ARR)
            return proto_fail(pe, "invalid_type", "\"stop_token_ids\": expected an array of integers, got %s", js_type_name(sti));
        if (sti->len > MOET_MAX_STOP_IDS)
            return proto_fail(pe, "invalid_value", "\"stop_token_ids\": %u ids; at most %d", sti->len, MOET_MAX_STOP_IDS);
        const js_node *t = js_first(sti);
        for (uint32_t k = 0; k < sti->len; k++, t = js_next(d, t)) {
            int64_t v;
            char why[96];
            if (proto_token_id(t, lim->n_vocab, &v, why, sizeof why))
                return proto_fail(pe, t->type == JS_NUM ? "invalid_value" : "invalid_type",
                                  "\"stop_token_ids\"[%u] is %s; expected a token id in [0, %d)", k, why, lim->n_vocab);
            r->stop_ids[r->n_stop_ids++] = (int32_t)v;
        }
    }

    // enable_thinking / preserve_thinking: chat_template_kwargs, or the top level
    const js_node *kw = js_get(d, b, "chat_template_kwargs");
    if (kw && kw->type != JS_NULL && kw->type != JS_OBJ)
        return proto_fail(pe, "invalid_type", "\"chat_template_kwargs\": expected an object, got %s", js_type_name(kw));
    r->chat.enable_thinking = lim->thinking;
    r->chat.preserve_thinking = 0;
    if (proto_bool(d, b, "enable_thinking", &r->chat.enable_thinking, pe)) return -1;
    if (proto_bool(d, b, "preserve_thinking", &r->chat.preserve_thinking, pe)) return -1;
    if (kw && kw->type == JS_OBJ) {
        if (proto_bool(d, kw, "enable_thinking", &r->chat.enable_thinking, pe)) return err_wrap(&pe->e, "chat_template_kwargs");
        if (proto_bool(d, kw, "preserve_thinking", &r->chat.preserve_thinking, pe)) return err_wrap(&pe->e, "chat_template_kwargs");
    }
    return 0;
}

static int proto_set_id(proto_req *r, const js_node *v, const char *key, proto_error *pe) {
    if (v->type != JS_STR) return proto_fail(pe, "invalid_type", "\"%s\": expected a string, got %s", key, js_type_name(v));
    if (v->len == 0) return proto_fail(pe, "invalid_value", "\"%s\" is empty", key);
    if (v->len > MOET_MAX_ID) return proto_fail(pe, "invalid_value", "\"%s\": %u bytes; at most %d", key, v->len, MOET_MAX_ID);
    if (memchr(v->str, 0, v->len)) return proto_fail(pe, "invalid_value", "\"%s\" contains a NUL character", key);
    memcpy(r->id, v->str, v->len);
    r->id[v->len] = 0;
    r->has_id = 1;
    return 0;
}

// Reads one parsed request line into r. `auto_id` names the request when the line does not.
// On error, r->id / r->has_id tell whether the line got far enough to name itself.
static int proto_parse(const js_doc *d, const proto_limits *lim, const char *auto_id, proto_req *r, proto_error *pe) {
    memset(r, 0, sizeof *r);
    r->kind = -1;   // not yet known to be a request
    snprintf(r->id, sizeof r->id, "%s", auto_id);
    const js_node *root = js_root(d);
    if (!root || root->type != JS_OBJ)
        return proto_fail(pe, "invalid_request", "a request line must be a JSON object, got %s", js_type_name(root));

    const js_node *cid = js_get(d, root, "custom_id"), *url = js_get(d, root, "url"), *body = js_get(d, root, "body");
    if (cid || url || body) {   // an OpenAI Batch API line
        r->batch = 1;
        if (!cid) return proto_fail(pe, "missing_field", "a Batch line needs \"custom_id\"");
        if (proto_set_id(r, cid, "custom_id", pe)) return -1;
        const js_node *method = js_get(d, root, "method");
        if (method && !js_str_is(method, "POST"))
            return proto_fail(pe, "invalid_value", "\"method\": only \"POST\" is supported");
        if (!url || url->type != JS_STR) return proto_fail(pe, "missing_field", "a Batch line needs \"url\" (a string)");
        if (js_str_is(url, "/v1/chat/completions")) r->kind = PROTO_CHAT;
        else if (js_str_is(url, "/v1/completions")) r->kind = PROTO_COMPLETION;
        else return proto_fail(pe, "unsupported_url", "\"url\": \"%.100s\" is not supported (/v1/chat/completions, /v1/completions)",
                               url->str);
        if (!body || body->type != JS_OBJ) return proto_fail(pe, "missing_field", "a Batch line needs \"body\" (an object)");
    } else {
        const js_node *id = js_get(d, root, "id");
        if (id && id->type != JS_NULL && proto_set_id(r, id, "id", pe)) return -1;
        const js_node *op = js_get(d, root, "op");
        if (op) {
            if (js_str_is(op, "stats")) { r->kind = PROTO_STATS; return 0; }
            if (js_str_is(op, "cancel")) {
                r->kind = PROTO_CANCEL;
                if (!r->has_id) return proto_fail(pe, "missing_field", "\"op\": \"cancel\" needs the \"id\" of the request to cancel");
                return 0;
            }
            return proto_fail(pe, "invalid_value", "\"op\": expected \"stats\" or \"cancel\"");
        }
        body = root;
        if (js_get(d, root, "messages")) r->kind = PROTO_CHAT;
        else if (js_get(d, root, "prompt") || js_get(d, root, "input_ids")) r->kind = PROTO_COMPLETION;
        else return proto_fail(pe, "missing_field", "a request needs \"messages\" (chat), \"prompt\" or \"input_ids\"");
    }

    if (r->kind == PROTO_CHAT) {
        const js_node *m = js_get(d, body, "messages");
        if (!m) return proto_fail(pe, "missing_field", "missing \"messages\"");
        if (m->type != JS_ARR) return proto_fail(pe, "invalid_type", "\"messages\": expected an array, got %s", js_type_name(m));
        if (m->len == 0) return proto_fail(pe, "invalid_value", "\"messages\" is empty");
        r->messages = m;
        r->tools = js_get(d, body, "tools");
    } else {
        const js_node *p = js_get(d, body, "prompt"), *ids = js_get(d, body, "input_ids");
        if (p && p->type == JS_ARR) {   // OpenAI completions: a prompt may be token ids, or one string in a list
            if (p->len == 1 && js_first(p)->type == JS_STR) p = js_first(p);
            else { ids = p; p = NULL; }
        }
        if (p && ids) return proto_fail(pe, "invalid_request", "give either \"prompt\" or \"input_ids\", not both");
        if (p) {
            if (p->type != JS_STR) return proto_fail(pe, "invalid_type", "\"prompt\": expected a string, got %s", js_type_name(p));
            if (p->len == 0) return proto_fail(pe, "invalid_value", "\"prompt\" is empty");
            r->prompt = p;
        } else {
            if (!ids) return proto_fail(pe, "missing_field", "missing \"prompt\"");
            if (ids->type != JS_ARR)
                return proto_fail(pe, "invalid_type", "\"input_ids\": expected an array of token ids, got %s", js_type_name(ids));
            if (ids->len == 0) return proto_fail(pe, "invalid_value", "the prompt's token ids are empty");
            const js_node *t = js_first(ids);
            for (uint32_t k = 0; k < ids->len; k++, t = js_next(d, t)) {
                int64_t v;
                char why[96];
                if (proto_token_id(t, lim->n_vocab, &v, why, sizeof why))
                    return proto_fail(pe, t->type == JS_NUM ? "invalid_value" : "invalid_type",
                                      "token id [%u] is %s; expected an integer in [0, %d)", k, why, lim->n_vocab);
            }
            r->input_ids = ids;
        }
    }
    return proto_params(d, body, r->kind == PROTO_CHAT, lim, r, pe);
}

// ---- writing -----------------------------------------------------------------------------
//
// Responses go straight to a file descriptor through one buffer: a line is written in as
// many write() calls as it takes (a full pipe blocks, nothing is dropped) and the buffer is
// flushed at the end of every line. Strings are escaped as RFC 8259 requires; bytes that are
// not well-formed UTF-8 (a token cut inside a character) become U+FFFD.

typedef struct {
    int fd;
    char *buf;          // [cap]
    size_t cap, len;
    int failed;         // a write failed (the reader went away): errno in err
    int err;
} proto_out;

static void po_flush(proto_out *o) {
    size_t at = 0;
    while (at < o->len && !o->failed) {
        ssize_t k = write(o->fd, o->buf + at, o->len - at);
        if (k < 0) {
            if (errno == EINTR) continue;
            o->failed = 1;
            o->err = errno;
            break;
        }
        at += (size_t)k;
    }
    o->len = 0;
}

static void po_raw(proto_out *o, const char *s, size_t n) {
    while (n) {
        if (o->len == o->cap) po_flush(o);
        size_t k = o->cap - o->len < n ? o->cap - o->len : n;
        memcpy(o->buf + o->len, s, k);
        o->len += k;
        s += k;
        n -= k;
    }
}
static void po_s(proto_out *o, const char *s) { po_raw(o, s, strlen(s)); }

static void po_fmt(proto_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void po_fmt(proto_out *o, const char *fmt, ...) {
    char t[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    MOET_ASSERT(k >= 0 && (size_t)k < sizeof t, "po_fmt piece too long");
    po_raw(o, t, (size_t)k);
}

static void po_emit(void *o, const char *p, size_t k) { po_raw(o, p, k); }

static void po_str(proto_out *o, const char *s, size_t n) {
    po_raw(o, "\"", 1);
    js_escape(s, n, po_emit, o);
    po_raw(o, "\"", 1);
}
static void po_cstr(proto_out *o, const char *s) { po_str(o, s, strlen(s)); }

// A float as the shortest text that reads back (JSON has no NaN/inf: those become null).
static void po_num(proto_out *o, double v) {
    char b[40];
    if (!isfinite(v)) { po_s(o, "null"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    po_s(o, b);
}

static void po_end_line(proto_out *o) {
    po_raw(o, "\n", 1);
    po_flush(o);
}
