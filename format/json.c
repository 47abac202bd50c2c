// format/json.c — RFC 8259 JSON: a reader that parses into caller-provided memory, and a writer.
//
// Reading is two passes over the same code: js_measure() validates the text and returns the
// exact number of nodes and decoded string bytes, the caller carves that much from an arena,
// and js_parse() fills it. Nothing is allocated per value.
//
// The tree is a flat array of nodes in document order. A container's children follow it
// directly; node.next is the index just past a value's whole subtree, so siblings are reached
// by jumping. An object's children alternate key (a JS_STR node), value.
//
// Accepted: exactly RFC 8259 — one value surrounded by optional whitespace, strings of
// well-formed UTF-8 with the standard escapes, \u escapes with surrogate pairs combined (a lone
// surrogate is an error), numbers in the RFC grammar. Numbers become a double (an error when it
// overflows to infinity) and, when the literal is an integer that fits, an exact int64. Every
// number whose value, read exactly from its text, is an integer in [-2^63, 2^64) (5, 5.0, 5e0,
// 18446744073709551615) is also marked whole, with that exact value: integer fields read it
// (js_whole, js_u64), never the double, which cannot tell 2^64 - 1 from 2^64 - 2.
// Nesting deeper than MOET_JSON_MAX_DEPTH is an error. Every error carries its byte offset.

enum { JS_NULL, JS_FALSE, JS_TRUE, JS_NUM, JS_STR, JS_ARR, JS_OBJ };

enum { JS_FRACTION, JS_WHOLE_I64, JS_WHOLE_U64, JS_WHOLE_BIG };   // js_node.whole

typedef struct {
    uint8_t type;     // JS_*
    uint8_t is_int;   // JS_NUM: the literal is an integer within int64 (i64 is exact)
    uint8_t whole;    // JS_NUM: its exact value is an integer: JS_WHOLE_I64 in int64 (i64), JS_WHOLE_U64
                      // above INT64_MAX and below 2^64 (u64), JS_WHOLE_BIG outside [-2^63, 2^64);
                      // JS_FRACTION: not an integer
    uint32_t len;     // JS_STR: decoded bytes (a NUL follows); JS_ARR: elements; JS_OBJ: members
    uint32_t next;    // index of the first node after this value's subtree
    union {
        const char *str;  // JS_STR: decoded UTF-8, NUL-terminated (may contain NULs from \u0000)
        double num;       // JS_NUM
    };
    union {
        int64_t i64;      // JS_NUM with is_int or whole == JS_WHOLE_I64
        uint64_t u64;     // JS_NUM with whole == JS_WHOLE_U64
    };
} js_node;

typedef struct {
    js_node *nodes;      // [cap_nodes]
    uint32_t n_nodes, cap_nodes;
    char *strs;          // [cap_strs] decoded strings, each followed by a NUL
    size_t n_strs, cap_strs;
    size_t err_off;      // byte offset of the first error
    char err[160];       // what is wrong there
} js_doc;

#define JS_MAX_NUMBER_CHARS 1024  // longest number literal accepted (digits are not lost below it)

typedef struct {
    const uint8_t *s;
    size_t len, pos;
    js_doc *d;
    int measuring;       // count only, write nothing
    uint32_t nodes;      // nodes produced so far
    size_t strs;         // string bytes produced so far
    js_node scratch;     // measuring: the node written to and discarded (per parser, so
                         // parsers on several threads share nothing)
} js_parser;

static int js_fail(js_parser *p, const char *what) {
    p->d->err_off = p->pos;
    snprintf(p->d->err, sizeof p->d->err, "%s at byte %zu", what, p->pos);
    return -1;
}

static void js_ws(js_parser *p) {
    while (p->pos < p->len) {
        uint8_t c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static js_node *js_new(js_parser *p, int type, uint32_t *index) {
    if (p->nodes == UINT32_MAX) return NULL;
    *index = p->nodes++;
    if (p->measuring) {
        memset(&p->scratch, 0, sizeof p->scratch);
        return &p->scratch;
    }
    MOET_ASSERT(*index < p->d->cap_nodes, "JSON node capacity %u below the measured count", p->d->cap_nodes);
    js_node *n = &p->d->nodes[*index];
    memset(n, 0, sizeof *n);
    n->type = (uint8_t)type;
    return n;
}

static void js_put(js_parser *p, const void *bytes, size_t n) {
    if (!p->measuring) {
        MOET_ASSERT(p->strs + n <= p->d->cap_strs, "JSON string capacity below the measured size");
        memcpy(p->d->strs + p->strs, bytes, n);
    }
    p->strs += n;
}

// Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs, no surrogates,
// at most U+10FFFF), or 0 when it is not one.
static size_t js_utf8_len(const uint8_t *s, size_t avail) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return n;
}

static size_t js_utf8_put(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { out[0] = (uint8_t)(0xC0 | cp >> 6); out[1] = (uint8_t)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12); out[1] = (uint8_t)(0x80 | ((cp >> 6) & 63));
        out[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18); out[1] = (uint8_t)(0x80 | ((cp >> 12) & 63));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)); out[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

static int js_hex4(js_parser *p, uint32_t *v) {
    if (p->len - p->pos < 4) return js_fail(p, "truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p->s[p->pos];
        uint32_t d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return js_fail(p, "bad hex digit in \\u escape");
        *v = *v << 4 | d;
        p->pos++;
    }
    return 0;
}

// At the opening quote. Decodes into the string area and fills n->str / n->len.
static int js_string(js_parser *p, js_node *n) {
    p->pos++;  // opening quote
    size_t start = p->strs;
    for (;;) {
        if (p->pos >= p->len) return js_fail(p, "unterminated string");
        uint8_t c = p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return js_fail(p, "control character in string");
        if (c == '\\') {
            p->pos++;
            if (p->pos >= p->len) return js_fail(p, "unterminated escape");
            uint8_t e = p->s[p->pos++], ch;
            switch (e) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case '/': ch = '/'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case 'u': {
                uint32_t cp, lo;
                p->pos -= 2;
                size_t at = p->pos;
                p->pos += 2;
                if (js_hex4(p, &cp)) return -1;
                if (cp >= 0xDC00 && cp <= 0xDFFF) { p->pos = at; return js_fail(p, "lone low surrogate in \\u escape"); }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                        p->pos = at;
                        return js_fail(p, "lone high surrogate in \\u escape");
                    }
                    p->pos += 2;
                    if (js_hex4(p, &lo)) return -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) { p->pos = at; return js_fail(p, "high surrogate not followed by a low one"); }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                uint8_t u[4];
                js_put(p, u, js_utf8_put(cp, u));
                continue;
            }
            default: p->pos -= 2; return js_fail(p, "invalid escape");
            }
            js_put(p, &ch, 1);
            continue;
        }
        size_t k = js_utf8_len(p->s + p->pos, p->len - p->pos);
        if (!k) return js_fail(p, "invalid UTF-8 in string");
        js_put(p, p->s + p->pos, k);
        p->pos += k;
    }
    size_t len = p->strs - start;
    if (len > UINT32_MAX - 1) return js_fail(p, "string too long");
    js_put(p, "", 1);
    n->len = (uint32_t)len;
    n->str = p->measuring ? NULL : p->d->strs + start;
    return 0;
}

// The exact value of a number literal that is well-formed by the RFC grammar, when it is an
// integer in [-2^63, 2^64): JS_WHOLE_I64 with *i, JS_WHOLE_U64 with *u; JS_WHOLE_BIG for an integer
// outside that range, JS_FRACTION for a number that is not an integer. The
// value is digits × 10^(exponent − fraction digits), worked out on the text: no double between.
static int js_whole_of(const char *t, int64_t *i, uint64_t *u) {
    int neg = *t == '-';
    t += neg;
    const char *dig = t, *end_int = t;
    while (isdigit((unsigned char)*end_int)) end_int++;
    const char *frac = *end_int == '.' ? end_int + 1 : end_int, *end_frac = frac;
    while (isdigit((unsigned char)*end_frac)) end_frac++;
    int64_t ex = 0;   // the exponent, saturated far beyond any 64-bit value
    if (*end_frac == 'e' || *end_frac == 'E') {
        const char *x = end_frac + 1;
        int eneg = *x == '-';
        if (*x == '+' || *x == '-') x++;
        for (; isdigit((unsigned char)*x); x++)
            if (ex < 100000) ex = ex * 10 + (*x - '0');
        if (eneg) ex = -ex;
    }
    // the significant digits: integer part then fraction, without leading and trailing zeros
    char d[JS_MAX_NUMBER_CHARS];
    size_t n = 0;
    for (const char *c = dig; c < end_int; c++) d[n++] = *c;
    for (const char *c = frac; c < end_frac; c++) d[n++] = *c;
    ex -= end_frac - frac;
    size_t lead = 0;
    while (lead < n && d[lead] == '0') lead++;
    if (lead == n) { *i = 0; return JS_WHOLE_I64; }   // 0, -0, 0.0e7
    while (d[n - 1] == '0') n--, ex++;
    if (ex < 0) return JS_FRACTION;
    uint64_t v = 0;
    for (size_t k = lead; k < n; k++) {
        if (v > (UINT64_MAX - (uint64_t)(d[k] - '0')) / 10) return JS_WHOLE_BIG;
        v = v * 10 + (uint64_t)(d[k] - '0');
    }
    for (; ex > 0; ex--) {
        if (v > UINT64_MAX / 10) return JS_WHOLE_BIG;
        v *= 10;
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1) return JS_WHOLE_BIG;
        *i = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
        return JS_WHOLE_I64;
    }
    if (v <= (uint64_t)INT64_MAX) { *i = (int64_t)v; return JS_WHOLE_I64; }
    *u = v;
    return JS_WHOLE_U64;
}

// noinline: its 1 KiB literal buffer must not land in the frame of the recursive js_value
// (inlined, nesting to MOET_JSON_MAX_DEPTH would cost ~140 KiB of stack).
__attribute__((noinline)) static int js_number(js_parser *p, js_node *n) {
    size_t start = p->pos;
    const uint8_t *s = p->s;
    int is_int = 1;
    if (p->pos < p->len && s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len || !isdigit(s[p->pos])) return js_fail(p, "invalid number");
    if (s[p->pos] == '0') p->pos++;
    else while (p->pos < p->len && isdigit(s[p->pos])) p->pos++;
    if (p->pos < p->len && s[p->pos] == '.') {
        is_int = 0;
        p->pos++;
        if (p->pos >= p->len || !isdigit(s[p->pos])) return js_fail(p, "digit expected after decimal point");
        while (p->pos < p->len && isdigit(s[p->pos])) p->pos++;
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        is_int = 0;
        p->pos++;
        if (p->pos < p->len && (s[p->pos] == '+' || s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->len || !isdigit(s[p->pos])) return js_fail(p, "digit expected in exponent");
        while (p->pos < p->len && isdigit(s[p->pos])) p->pos++;
    }
    size_t n_chars = p->pos - start;
    if (n_chars > JS_MAX_NUMBER_CHARS) { p->pos = start; return js_fail(p, "number literal too long"); }
    char buf[JS_MAX_NUMBER_CHARS + 1];
    memcpy(buf, s + start, n_chars);
    buf[n_chars] = 0;
    errno = 0;
    double v = strtod(buf, NULL);
    if (isinf(v)) { p->pos = start; return js_fail(p, "number out of range"); }
    n->num = v;
    int64_t i = 0;
    uint64_t u = 0;
    n->whole = (uint8_t)js_whole_of(buf, &i, &u);
    if (n->whole == JS_WHOLE_U64) n->u64 = u;
    else n->i64 = i;
    n->is_int = is_int && n->whole == JS_WHOLE_I64;
    return 0;
}

static int js_literal(js_parser *p, const char *word) {
    size_t k = strlen(word);
    if (p->len - p->pos < k || memcmp(p->s + p->pos, word, k) != 0) return js_fail(p, "invalid literal");
    p->pos += k;
    return 0;
}

static int js_value(js_parser *p, int depth);

static int js_container(js_parser *p, js_node *n, uint32_t self, int depth, int is_obj) {
    if (depth >= MOET_JSON_MAX_DEPTH) return js_fail(p, "nesting too deep");
    uint8_t close = is_obj ? '}' : ']';
    p->pos++;
    js_ws(p);
    uint32_t count = 0;
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
    } else {
        for (;;) {
            if (is_obj) {
                js_ws(p);
                if (p->pos >= p->len) return js_fail(p, "unterminated object");
                if (p->s[p->pos] != '"') return js_fail(p, "object key must be a string");
                if (js_value(p, depth + 1)) return -1;
                js_ws(p);
                if (p->pos >= p->len || p->s[p->pos] != ':') return js_fail(p, "':' expected after object key");
                p->pos++;
            }
            if (js_value(p, depth + 1)) return -1;
            if (count == UINT32_MAX) return js_fail(p, "too many elements");
            count++;
            js_ws(p);
            if (p->pos >= p->len) return js_fail(p, is_obj ? "unterminated object" : "unterminated array");
            uint8_t c = p->s[p->pos];
            if (c == ',') { p->pos++; continue; }
            if (c == close) { p->pos++; break; }
            return js_fail(p, is_obj ? "',' or '}' expected" : "',' or ']' expected");
        }
    }
    if (!p->measuring) {
        n = &p->d->nodes[self];   // re-fetch: writes above did not move the array, but be plain
        n->len = count;
    }
    return 0;
}

static int js_value(js_parser *p, int depth) {
    js_ws(p);
    if (p->pos >= p->len) return js_fail(p, "value expected");
    uint8_t c = p->s[p->pos];
    int type;
    switch (c) {
    case '{': type = JS_OBJ; break;
    case '[': type = JS_ARR; break;
    case '"': type = JS_STR; break;
    case 't': type = JS_TRUE; break;
    case 'f': type = JS_FALSE; break;
    case 'n': type = JS_NULL; break;
    default:
        if (c == '-' || isdigit(c)) { type = JS_NUM; break; }
        return js_fail(p, "unexpected character");
    }
    uint32_t self;
    js_node *n = js_new(p, type, &self);
    if (!n) return js_fail(p, "too many values");
    int rc;
    switch (type) {
    case JS_OBJ: rc = js_container(p, n, self, depth, 1); break;
    case JS_ARR: rc = js_container(p, n, self, depth, 0); break;
    case JS_STR: rc = js_string(p, n); break;
    case JS_NUM: rc = js_number(p, n); break;
    case JS_TRUE: rc = js_literal(p, "true"); break;
    case JS_FALSE: rc = js_literal(p, "false"); break;
    default: rc = js_literal(p, "null"); break;
    }
    if (rc) return rc;
    if (!p->measuring) p->d->nodes[self].next = p->nodes;
    return 0;
}

static int js_run(js_parser *p) {
    if (js_value(p, 0)) return -1;
    js_ws(p);
    if (p->pos != p->len) return js_fail(p, "trailing characters after the value");
    return 0;
}

// Validates `text` and reports the exact capacity js_parse needs. Errors go to d->err.
static int js_measure(js_doc *d, const char *text, size_t len, uint32_t *nodes, size_t *str_bytes) {
    js_parser p = {.s = (const uint8_t *)text, .len = len, .d = d, .measuring = 1};
    d->err[0] = 0;
    d->err_off = 0;
    if (js_run(&p)) return -1;
    *nodes = p.nodes;
    *str_bytes = p.strs;
    return 0;
}

// Parses into d->nodes / d->strs (capacities from js_measure). Errors go to d->err.
static int js_parse(js_doc *d, const char *text, size_t len) {
    js_parser p = {.s = (const uint8_t *)text, .len = len, .d = d};
    d->err[0] = 0;
    d->err_off = 0;
    d->n_nodes = 0;
    d->n_strs = 0;
    if (d->cap_nodes == 0) return js_fail(&p, "no node capacity");
    if (js_run(&p)) return -1;
    d->n_nodes = p.nodes;
    d->n_strs = p.strs;
    return 0;
}

// Measure + one allocation + parse, for boot-time files (config.json, tokenizer.json …).
// js_free_doc releases it.
static int js_load_doc(js_doc *d, const char *text, size_t len, const char *what, moet_err *e) {
    memset(d, 0, sizeof *d);
    uint32_t nodes;
    size_t strs;
    if (js_measure(d, text, len, &nodes, &strs)) return err_set(e, "%s: invalid JSON: %s", what, d->err);
    size_t nb = (size_t)nodes * sizeof(js_node);
    uint8_t *mem = arena_sys_alloc(nb + strs + 1, what);
    if (!mem) return err_set(e, "%s: out of memory for %u JSON values", what, nodes);
    d->nodes = (js_node *)mem;
    d->cap_nodes = nodes;
    d->strs = (char *)mem + nb;
    d->cap_strs = strs + 1;
    MOET_ASSERT(js_parse(d, text, len) == 0, "%s: second JSON pass failed: %s", what, d->err);
    return 0;
}

static void js_free_doc(js_doc *d) {
    if (d->nodes) arena_sys_free(d->nodes, (size_t)d->cap_nodes * sizeof(js_node) + d->cap_strs);
    memset(d, 0, sizeof *d);
}

// A whole small file (config.json, an index …) parsed with js_load_doc; js_free_doc releases it.
static int js_load_file(js_doc *d, const char *path, size_t max_bytes, moet_err *e) {
    size_t len;
    memset(d, 0, sizeof *d);
    char *text = arena_read_small(path, max_bytes, &len, e);
    if (!text) return -1;
    int rc = js_load_doc(d, text, len, path, e);
    arena_sys_free(text, len + 1);
    return rc;
}

// ---- navigation -------------------------------------------------------------------------

static const js_node *js_root(const js_doc *d) { return d->n_nodes ? &d->nodes[0] : NULL; }

// The node after n's subtree: the next sibling inside a container.
static const js_node *js_next(const js_doc *d, const js_node *n) { return &d->nodes[n->next]; }

// First child of a container (for an object: its first key), or NULL when empty.
static const js_node *js_first(const js_node *n) {
    return (n && (n->type == JS_ARR || n->type == JS_OBJ) && n->len) ? n + 1 : NULL;
}

// The sibling after n inside `container`, or NULL at its end. Loops over an array:
//   for (const js_node *x = js_first(arr); x; x = js_after(d, arr, x))
static const js_node *js_after(const js_doc *d, const js_node *container, const js_node *n) {
    return n->next < container->next ? &d->nodes[n->next] : NULL;
}

// Object members: a key node is a leaf, so its value is the node right after it.
//   for (const js_node *k = js_first(obj); k; k = js_member_next(d, obj, k)) { const js_node *v = k + 1; }
static const js_node *js_member_next(const js_doc *d, const js_node *obj, const js_node *key) {
    return js_after(d, obj, key + 1);
}

static int js_str_is(const js_node *n, const char *s) {
    size_t k = strlen(s);
    return n && n->type == JS_STR && n->len == k && memcmp(n->str, s, k) == 0;
}

// Member `key` of object `obj`, or NULL (absent, or obj is not an object). First wins.
static const js_node *js_get(const js_doc *d, const js_node *obj, const char *key) {
    if (!obj || obj->type != JS_OBJ) return NULL;
    for (const js_node *k = js_first(obj); k; k = js_member_next(d, obj, k))
        if (js_str_is(k, key)) return k + 1;
    return NULL;
}

// Element i of array arr, or NULL. O(i): iterate with js_first/js_next in loops.
static const js_node *js_at(const js_doc *d, const js_node *arr, uint32_t i) {
    if (!arr || arr->type != JS_ARR || i >= arr->len) return NULL;
    const js_node *n = js_first(arr);
    while (i--) n = js_next(d, n);
    return n;
}

// An integer value (an integral literal within int64), else -1.
static int js_int(const js_node *n, int64_t *out) {
    if (!n || n->type != JS_NUM) return -1;
    if (n->is_int) { *out = n->i64; return 0; }
    return -1;
}

// A number whose exact value is an integer in int64, however written (5, 5.0, 5e0), else -1.
static int js_whole(const js_node *n, int64_t *out) {
    if (!n || n->type != JS_NUM || n->whole != JS_WHOLE_I64) return -1;
    *out = n->i64;
    return 0;
}

// A number whose exact value is an integer in [0, 2^64), however written, else -1.
static int js_u64(const js_node *n, uint64_t *out) {
    if (!n || n->type != JS_NUM) return -1;
    if (n->whole == JS_WHOLE_U64) { *out = n->u64; return 0; }
    if (n->whole == JS_WHOLE_I64 && n->i64 >= 0) { *out = (uint64_t)n->i64; return 0; }
    return -1;
}

static int js_num(const js_node *n, double *out) {
    if (!n || n->type != JS_NUM) return -1;
    *out = n->num;
    return 0;
}

static const char *js_type_name(const js_node *n) {
    static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return n ? names[n->type] : "absent";
}

// ---- writer -----------------------------------------------------------------------------
//
// Appends to a caller-provided buffer; commas are placed automatically. Running out of room
// sets `overflow` (the caller sized the buffer, so it reports that as an error) and stops.

typedef struct {
    char *buf;
    size_t cap, len;
    int overflow;
    int depth;
    uint8_t has_item[MOET_JSON_MAX_DEPTH];  // per open container: an element was written
    uint8_t after_key;                      // a key was just written; the value takes no comma
} js_writer;

static void js_w_init(js_writer *w, char *buf, size_t cap) {
    memset(w, 0, sizeof *w);
    w->buf = buf;
    w->cap = cap;
    if (cap) buf[0] = 0;
}

static void js_w_bytes(js_writer *w, const char *s, size_t n) {
    if (w->overflow) return;
    if (n >= w->cap - w->len) { w->overflow = 1; return; }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = 0;
}

static void js_w_sep(js_writer *w) {
    if (w->after_key) { w->after_key = 0; return; }
    if (w->depth > 0) {
        if (w->has_item[w->depth - 1]) js_w_bytes(w, ",", 1);
        w->has_item[w->depth - 1] = 1;
    }
}

static void js_w_open(js_writer *w, char c) {
    js_w_sep(w);
    MOET_ASSERT(w->depth < MOET_JSON_MAX_DEPTH, "JSON writer nesting");
    js_w_bytes(w, &c, 1);
    w->has_item[w->depth++] = 0;
}

static void js_w_obj(js_writer *w) { js_w_open(w, '{'); }
static void js_w_arr(js_writer *w) { js_w_open(w, '['); }
static void js_w_end_obj(js_writer *w) { MOET_ASSERT(w->depth > 0, "unbalanced"); w->depth--; js_w_bytes(w, "}", 1); }
static void js_w_end_arr(js_writer *w) { MOET_ASSERT(w->depth > 0, "unbalanced"); w->depth--; js_w_bytes(w, "]", 1); }

// Emits s[0, n) as the body of a JSON string (no quotes) through emit: '"', '\\' and control
// characters escaped, bytes that are not well-formed UTF-8 replaced by U+FFFD (so the output is
// valid), everything else copied in runs. The writer below and the protocol's direct output
// share it.
static void js_escape(const char *s, size_t n, void (*emit)(void *ctx, const char *p, size_t k), void *ctx) {
    const uint8_t *u = (const uint8_t *)s;
    size_t run = 0;  // start of a run of bytes copied as they are
    for (size_t i = 0; i < n;) {
        uint8_t c = u[i];
        const char *esc = NULL;
        char hex[8];
        size_t k = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7f) { snprintf(hex, sizeof hex, "\\u%04x", c); esc = hex; }
        else if (c >= 0x80) {
            k = js_utf8_len(u + i, n - i);
            if (!k) { esc = "\xEF\xBF\xBD"; k = 1; }
        }
        if (esc) {
            if (i > run) emit(ctx, s + run, i - run);
            emit(ctx, esc, strlen(esc));
            run = i + k;
        }
        i += k;
    }
    if (n > run) emit(ctx, s + run, n - run);
}

static void js_w_emit(void *w, const char *p, size_t k) { js_w_bytes(w, p, k); }

// A string value; bytes that are not well-formed UTF-8 become U+FFFD so the output is valid.
static void js_w_strn(js_writer *w, const char *s, size_t n) {
    js_w_sep(w);
    js_w_bytes(w, "\"", 1);
    js_escape(s, n, js_w_emit, w);
    js_w_bytes(w, "\"", 1);
}

static void js_w_str(js_writer *w, const char *s) { js_w_strn(w, s, strlen(s)); }

// A key of n bytes (may hold NULs, as a key read with \u0000 does).
static void js_w_keyn(js_writer *w, const char *k, size_t n) {
    js_w_strn(w, k, n);
    js_w_bytes(w, ":", 1);
    w->after_key = 1;
}

static void js_w_key(js_writer *w, const char *k) { js_w_keyn(w, k, strlen(k)); }

static void js_w_int(js_writer *w, int64_t v) {
    char b[32];
    js_w_sep(w);
    js_w_bytes(w, b, (size_t)snprintf(b, sizeof b, "%" PRId64, v));
}

// Shortest text that reads back as the same double: the fewest significant digits (the first
// of %.1g … %.17g that reads back; %.17g always does), the exponent without '+' or leading
// zeros ("1e21", "1e-7"), and a positive exponent spelled out as zeros when that is no longer
// ("100", not "1e2"). Non-finite values are written as null.
static void js_w_num(js_writer *w, double v) {
    char b[40];
    js_w_sep(w);
    if (!isfinite(v)) { js_w_bytes(w, "null", 4); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    char *x = strchr(b, 'e');
    if (x) {
        char *to = x + 1, *from = x + 1;
        if (*from == '-') *to++ = *from++;
        else if (*from == '+') from++;
        while (*from == '0' && from[1]) from++;
        memmove(to, from, strlen(from) + 1);
        // exponent X >= 0: the same digits padded with zeros to X + 1 (%g chose this form
        // because there are at most X of them), when that text is no longer. Only below 2^53,
        // where that integer is the double exactly: text without '.' or 'e' reads back as an
        // exact int64, and must not claim digits the double does not have.
        int exp10 = atoi(x + 1), neg = b[0] == '-';
        if (exp10 >= 0 && fabs(v) < 0x1p53 && (size_t)(neg + exp10 + 1) <= strlen(b)) {
            char plain[sizeof b];
            size_t n = 0;
            if (neg) plain[n++] = '-';
            for (const char *c = b + neg; c < x; c++)
                if (*c != '.') plain[n++] = *c;
            while (n < (size_t)(neg + exp10 + 1)) plain[n++] = '0';
            plain[n] = 0;
            memcpy(b, plain, n + 1);
        }
    }
    js_w_bytes(w, b, strlen(b));
}

static void js_w_bool(js_writer *w, int v) { js_w_sep(w); js_w_bytes(w, v ? "true" : "false", v ? 4 : 5); }
static void js_w_null(js_writer *w) { js_w_sep(w); js_w_bytes(w, "null", 4); }

// Already-serialized JSON (trusted, produced by this writer or validated by the reader).
static void js_w_raw(js_writer *w, const char *json, size_t n) { js_w_sep(w); js_w_bytes(w, json, n); }
