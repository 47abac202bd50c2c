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

// Splits out_text into lines and parses each.
static void parse_answers(void) {
    n_ans = 0;
    size_t nodes_used = 0, strs_used = 0;
    for (char *p = out_text; *p;) {
        char *nl = strchr(p, '\n');
        CHECK(nl != NULL, "output ends without a newline");
        if (!nl) break;
        *nl = 0;
        MOET_ASSERT(n_ans < MAX_ANS, "too many answers");
        js_doc *d = &ans_doc[n_ans];
        memset(d, 0, sizeof *d);
        uint32_t nn;
        size_t ns;
        int ok = js_measure(d, p, (size_t)(nl - p), &nn, &ns) == 0;
        CHECK(ok, "answer line is not JSON: %s: %.200s", d->err, p);
        if (ok) {
            MOET_ASSERT(nodes_used + nn <= sizeof node_pool / sizeof node_pool[0] && strs_used + ns + 1 <= sizeof str_pool, "pool");
            d->nodes = node_pool + nodes_used;
            d->cap_nodes = nn;
            d->strs = str_pool + strs_used;
            d->cap_strs = ns + 1;
            nodes_used += nn;
            strs_used += ns + 1;
            MOET_ASSERT(js_parse(d, p, (size_t)(nl - p)) == 0, "reparse");
        }
        ans_line[n_ans++] = p;
        p = nl + 1;
    }
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
