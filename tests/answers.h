// tests/answers.h — the answer lines of a moet serve run, parsed: ans_doc[i] / ans_line[i],
// path() into one answer, find_answer() by id. Every line must be JSON and end with a newline.
// The including test defines out_text (the captured stdout) before including this.
#ifndef MOET_ANSWERS_H
#define MOET_ANSWERS_H

#define MAX_ANS 40000
static char *ans_line[MAX_ANS];
static int n_ans;
static js_doc ans_doc[MAX_ANS];
static js_node node_pool[8 << 20];
static char str_pool[32 << 20];

// The type an error code has (format/PROTOCOL.md §7): server_error for a failed backend step,
// invalid_request_error for every other code.
static const char *error_type_of(const char *code) {
    return !strcmp(code, "server_error") ? "server_error" : "invalid_request_error";
}

// The error object e (of an answer line, or the body of a Batch output line) of document d: a
// code, the type that code has, and a message.
static int error_well_formed(const js_doc *d, const js_node *err) {
    const js_node *code = js_get(d, err, "code"), *type = js_get(d, err, "type"), *msg = js_get(d, err, "message");
    return code && code->type == JS_STR && js_str_is(type, error_type_of(code->str)) && msg && msg->type == JS_STR &&
           msg->len > 0;
}

static const js_node *path(int i, const char *a, const char *b, const char *c, const char *d4);

// Answer i is an error line of this code, with the type the code has.
static int error_is(int i, const char *code) {
    const js_node *err = path(i, "error", 0, 0, 0);
    return js_str_is(js_get(&ans_doc[i], err, "code"), code) && js_str_is(js_get(&ans_doc[i], err, "type"), error_type_of(code));
}

// Splits out_text into lines and parses each. One property per run: every line is JSON and ends
// in a newline, and every error in it (an error line, or a Batch line's error body) has a code,
// the type of that code and a message.
static void parse_answers(void) {
    static check_prop lines = {"every answer line is JSON, ends in a newline, and its error (if any) has a code, its type and a "
                               "message", 0, 0};
    n_ans = 0;
    size_t nodes_used = 0, strs_used = 0;
    for (char *p = out_text; *p;) {
        char *nl = strchr(p, '\n');
        CHECK_PROP(&lines, nl != NULL, "output ends without a newline: %.200s", p);
        if (!nl) break;
        *nl = 0;
        MOET_ASSERT(n_ans < MAX_ANS, "too many answers");
        js_doc *d = &ans_doc[n_ans];
        memset(d, 0, sizeof *d);
        uint32_t nn;
        size_t ns;
        int ok = js_measure(d, p, (size_t)(nl - p), &nn, &ns) == 0;
        CHECK_PROP(&lines, ok, "answer line is not JSON: %s: %.200s", d->err, p);
        if (ok) {
            MOET_ASSERT(nodes_used + nn <= sizeof node_pool / sizeof node_pool[0] && strs_used + ns + 1 <= sizeof str_pool, "pool");
            d->nodes = node_pool + nodes_used;
            d->cap_nodes = nn;
            d->strs = str_pool + strs_used;
            d->cap_strs = ns + 1;
            nodes_used += nn;
            strs_used += ns + 1;
            MOET_ASSERT(js_parse(d, p, (size_t)(nl - p)) == 0, "reparse");
            const js_node *r = js_root(d), *err = js_get(d, r, "error");
            const js_node *berr = js_get(d, js_get(d, js_get(d, r, "response"), "body"), "error");
            // ("error": null on a Batch output line that is not an error)
            if (err && err->type != JS_NULL)
                CHECK_PROP(&lines, error_well_formed(d, err), "error line without a code, its type and a message: %.300s", p);
            if (berr && berr->type != JS_NULL)
                CHECK_PROP(&lines, error_well_formed(d, berr), "Batch error without a code, its type and a message: %.300s", p);
        }
        ans_line[n_ans++] = p;
        p = nl + 1;
    }
    if (lines.cases) check_prop_end(&lines);   // an empty output is judged by the caller's checks
}

// Member a / b / c / d4 of answer i ("0": the first array element); NULL keys end the path.
static const js_node *path(int i, const char *a, const char *b, const char *c, const char *d4) {
    const js_doc *d = &ans_doc[i];
    const js_node *n = js_root(d);
    const char *keys[4] = {a, b, c, d4};
    for (int k = 0; k < 4 && keys[k] && n; k++) n = !strcmp(keys[k], "0") ? js_at(d, n, 0) : js_get(d, n, keys[k]);
    return n;
}

// The answer with this id (and this "object", when given), or -1.
static int find_answer(const char *id, const char *object) {
    for (int i = 0; i < n_ans; i++)
        if (js_str_is(path(i, "id", 0, 0, 0), id) && (!object || js_str_is(path(i, "object", 0, 0, 0), object))) return i;
    return -1;
}

#endif
