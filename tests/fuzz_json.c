// tests/fuzz_json.c — libFuzzer target for the JSON reader and writer (./build.sh fuzz).
//
// Any bytes: js_measure either refuses them (with a message and an offset inside the input)
// or js_parse fills buffers of exactly the measured size (heap, so ASan sees any overrun).
// A valid document is then written back with js_writer; that text must be valid, read back as
// the same tree, and write again to the same text. The writer must overflow exactly when its
// buffer is one byte short, never writing past it. js_load_doc / js_free_doc must give back
// every mapping they take (mmap_count.h; LeakSanitizer does not see mmap).
#include "mmap_count.h"
#include "../moet.c"
#include "json_tree.h"

// Measure + parse into exact-size heap buffers; returns 0, or -1 when the text is invalid.
static int fz_parse(js_doc *d, const char *text, size_t len) {
    uint32_t nodes;
    size_t strs;
    memset(d, 0, sizeof *d);
    if (js_measure(d, text, len, &nodes, &strs)) {
        MOET_ASSERT(d->err[0] && d->err_off <= len, "error without message or offset past the input: %s", d->err);
        return -1;
    }
    MOET_ASSERT(nodes > 0, "a valid document has a root");
    d->nodes = malloc((size_t)nodes * sizeof(js_node));
    d->strs = malloc(strs ? strs : 1);
    MOET_ASSERT(d->nodes && d->strs, "out of memory");
    d->cap_nodes = nodes;
    d->cap_strs = strs;
    MOET_ASSERT(js_parse(d, text, len) == 0, "measure accepted what parse refused: %s", d->err);
    MOET_ASSERT(d->n_nodes == nodes && d->n_strs == strs, "parse used %u nodes / %zu bytes, measured %u / %zu",
                d->n_nodes, d->n_strs, nodes, strs);
    MOET_ASSERT(js_root(d)->next == nodes, "the root's subtree is not the whole document");
    return 0;
}

static void fz_free(js_doc *d) {
    free(d->nodes);
    free(d->strs);
    memset(d, 0, sizeof *d);
}

// Navigation agrees with the tree walk: js_at(arr, i) is the i-th element, js_get(obj, key)
// the value of the first member with that key (keys holding a NUL cannot be asked for), and
// js_int / js_num / js_type_name read what the node holds. The first 64 children of each
// container are checked, so wide documents stay fast.
static void fz_check_navigation(const js_doc *d, const js_node *n) {
    double x;
    int64_t i64;
    MOET_ASSERT(strcmp(js_type_name(n), "absent") != 0, "type name of a present node");
    MOET_ASSERT((js_num(n, &x) == 0) == (n->type == JS_NUM), "js_num on a %s", js_type_name(n));
    MOET_ASSERT((js_int(n, &i64) == 0) == (n->type == JS_NUM && n->is_int) && (!n->is_int || i64 == n->i64), "js_int");
    if (n->type == JS_ARR) {
        uint32_t i = 0;
        for (const js_node *c = js_first(n); c; c = js_after(d, n, c), i++) {
            if (i < 64) MOET_ASSERT(js_at(d, n, i) == c, "js_at(%u)", i);
            fz_check_navigation(d, c);
        }
        MOET_ASSERT(i == n->len && js_at(d, n, i) == NULL, "array of %u elements walked as %u", n->len, i);
    } else if (n->type == JS_OBJ) {
        uint32_t i = 0;
        for (const js_node *k = js_first(n); k; k = js_member_next(d, n, k), i++) {
            MOET_ASSERT(k->type == JS_STR, "object key of type %s", js_type_name(k));
            if (i < 64 && !memchr(k->str, 0, k->len)) {
                const js_node *v = js_get(d, n, k->str);
                MOET_ASSERT(v && v <= k + 1 && js_str_is(v - 1, k->str), "js_get('%s') is not the first such member", k->str);
            }
            fz_check_navigation(d, k + 1);
        }
        MOET_ASSERT(i == n->len, "object of %u members walked as %u", n->len, i);
    }
}

// Writes d into a fresh heap buffer of `cap` bytes; returns it (caller frees) and the writer.
static char *fz_write(const js_doc *d, size_t cap, js_writer *w) {
    char *buf = malloc(cap ? cap : 1);
    MOET_ASSERT(buf, "out of memory");
    js_w_init(w, buf, cap);
    jt_write_tree(w, d, js_root(d));
    MOET_ASSERT(w->depth == 0, "writer depth %d after a whole document", w->depth);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    js_doc d;
    if (fz_parse(&d, text, size)) {
        // js_load_doc refuses it too and holds nothing
        long live = mc_live;
        moet_err e = {{0}};
        js_doc ld;
        MOET_ASSERT(js_load_doc(&ld, text, size, "fuzz", &e) == -1 && strstr(e.msg, "invalid JSON"), "load_doc: %s", e.msg);
        MOET_ASSERT(mc_live == live, "a refused js_load_doc kept a mapping");
        return 0;
    }
    fz_check_navigation(&d, js_root(&d));
    // Written text is at most 8 bytes per input byte: a string byte becomes at most 6
    // ("\u001f"), a number never gets longer than the literal it was read from.
    size_t cap = 8 * size + 64;
    js_writer w;
    char *out = fz_write(&d, cap, &w);
    MOET_ASSERT(!w.overflow, "writer overflowed %zu bytes for a %zu-byte document", cap, size);
    size_t n = w.len;
    js_doc d2;
    MOET_ASSERT(fz_parse(&d2, out, n) == 0, "written text is invalid: %s\n%s", d2.err, out);
    MOET_ASSERT(jt_same_tree(&d, js_root(&d), &d2, js_root(&d2)), "round trip changed the document:\n%.*s\n%s", (int)size,
                text, out);
    js_writer w2;
    char *out2 = fz_write(&d2, n + 1, &w2);   // exactly the text and its NUL
    MOET_ASSERT(!w2.overflow && w2.len == n && !memcmp(out, out2, n + 1), "second write differs:\n%s\n%s", out, out2);
    free(out2);
    out2 = fz_write(&d2, n, &w2);             // one byte short
    MOET_ASSERT(w2.overflow && (n == 0 || w2.len < n), "writer did not overflow a %zu-byte buffer for %zu bytes", n, n);
    free(out2);
    // js_load_doc agrees and js_free_doc gives everything back
    long live = mc_live;
    long long bytes = mc_bytes;
    moet_err e = {{0}};
    js_doc ld;
    MOET_ASSERT(js_load_doc(&ld, text, size, "fuzz", &e) == 0, "load_doc refused a valid document: %s", e.msg);
    MOET_ASSERT(jt_same_tree(&d, js_root(&d), &ld, js_root(&ld)), "load_doc built another tree");
    js_free_doc(&ld);
    MOET_ASSERT(mc_live == live && mc_bytes == bytes, "js_free_doc left %ld mappings", mc_live - live);
    free(out);
    fz_free(&d2);
    fz_free(&d);
    return 0;
}
