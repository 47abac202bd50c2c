// tests/test_json.c — the JSON reader and writer.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"

// Parses text (len bytes) with a two-pass measure/parse into static memory; returns 0 on success.
static js_node jt_nodes[4096];
static char jt_strs[65536];
static js_doc jt_doc;

static int jt_parse(const char *text, size_t len) {
    uint32_t n;
    size_t s;
    memset(&jt_doc, 0, sizeof jt_doc);
    if (js_measure(&jt_doc, text, len, &n, &s)) return -1;
    if (n > 4096 || s > sizeof jt_strs) return -2;
    jt_doc.nodes = jt_nodes;
    jt_doc.cap_nodes = n;
    jt_doc.strs = jt_strs;
    jt_doc.cap_strs = s;
    return js_parse(&jt_doc, text, len);
}
static int jt(const char *text) { return jt_parse(text, strlen(text)); }

int main(void) {
    // valid documents
    CHECK(jt("{}") == 0);
    CHECK(jt("[]") == 0);
    CHECK(jt(" \t\r\n 1 ") == 0 && jt_doc.nodes[0].is_int && jt_doc.nodes[0].i64 == 1);
    CHECK(jt("{\"a\":[1,2.5,\"x\",true,false,null],\"b\":{\"c\":-0}}") == 0);
    {
        const js_node *r = js_root(&jt_doc);
        const js_node *a = js_get(&jt_doc, r, "a");
        CHECK(a && a->type == JS_ARR && a->len == 6);
        CHECK(js_at(&jt_doc, a, 1)->num == 2.5);
        CHECK(js_str_is(js_at(&jt_doc, a, 2), "x"));
        CHECK(js_at(&jt_doc, a, 3)->type == JS_TRUE);
        CHECK(js_at(&jt_doc, a, 5)->type == JS_NULL);
        const js_node *b = js_get(&jt_doc, r, "b");
        CHECK(b && js_get(&jt_doc, b, "c") && js_get(&jt_doc, b, "c")->is_int);
        CHECK(js_get(&jt_doc, r, "zz") == NULL);
    }
    // escapes and surrogate pairs
    CHECK(jt("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"") == 0);
    CHECK(jt_doc.nodes[0].len == 8 + 2 + 4 && memcmp(jt_doc.nodes[0].str + 8, "\xC3\xA9\xF0\x9F\x98\x80", 6) == 0);
    CHECK(jt_parse("\"a\\u0000b\"", 10) == 0 && jt_doc.nodes[0].len == 3 && jt_doc.nodes[0].str[1] == 0);
    // integers at the int64 edges
    CHECK(jt("9223372036854775807") == 0 && jt_doc.nodes[0].is_int && jt_doc.nodes[0].i64 == INT64_MAX);
    CHECK(jt("-9223372036854775808") == 0 && jt_doc.nodes[0].is_int && jt_doc.nodes[0].i64 == INT64_MIN);
    CHECK(jt("9223372036854775808") == 0 && !jt_doc.nodes[0].is_int && jt_doc.nodes[0].num == 9223372036854775808.0);
    CHECK(jt("1e308") == 0 && !jt_doc.nodes[0].is_int);
    CHECK(jt("1e-400") == 0 && jt_doc.nodes[0].num == 0.0);   // underflow rounds to 0: representable intent
    // invalid documents, each with an error message and offset
    const char *bad[] = {
        "", " ", "{", "[", "[1,]", "{\"a\":}", "{\"a\" 1}", "{a:1}", "[1 2]", "01", "-", "1.", ".5", "1e",
        "+1", "tru", "nul", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"",
        "\"\x01\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"\xE2\x82\"", "1e400", "-1e400",
        "[1]x", "{} {}", "NaN", "Infinity", "\xEF\xBB\xBF{}", "[\"a\",]", "{\"a\":1,}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = jt(bad[i]);
        CHECK(rc == -1 && jt_doc.err[0], "accepted invalid JSON #%zu: %s", i, bad[i]);
    }
    CHECK(jt("[1,]") == -1 && jt_doc.err_off == 3, "offset %zu", jt_doc.err_off);
    // nesting: the limit is accepted, one more is refused
    {
        char deep[2 * MOET_JSON_MAX_DEPTH + 3];
        size_t k = 0;
        for (int i = 0; i < MOET_JSON_MAX_DEPTH; i++) deep[k++] = '[';
        for (int i = 0; i < MOET_JSON_MAX_DEPTH; i++) deep[k++] = ']';
        CHECK(jt_parse(deep, k) == 0);
        k = 0;
        for (int i = 0; i <= MOET_JSON_MAX_DEPTH; i++) deep[k++] = '[';
        for (int i = 0; i <= MOET_JSON_MAX_DEPTH; i++) deep[k++] = ']';
        CHECK(jt_parse(deep, k) == -1 && strstr(jt_doc.err, "deep"));
    }
    // writer round trip
    {
        char buf[512];
        js_writer w;
        js_w_init(&w, buf, sizeof buf);
        js_w_obj(&w);
        js_w_key(&w, "s");
        js_w_strn(&w, "q\"\\\n\x01\xff\xC3\xA9", 8);
        js_w_key(&w, "n");
        js_w_num(&w, 0.1);
        js_w_key(&w, "i");
        js_w_int(&w, -42);
        js_w_key(&w, "a");
        js_w_arr(&w);
        js_w_bool(&w, 1);
        js_w_null(&w);
        js_w_num(&w, NAN);
        js_w_end_arr(&w);
        js_w_end_obj(&w);
        CHECK(!w.overflow);
        CHECK(strcmp(buf, "{\"s\":\"q\\\"\\\\\\n\\u0001\xEF\xBF\xBD\xC3\xA9\",\"n\":0.1,\"i\":-42,\"a\":[true,null,null]}") == 0, "%s", buf);
        CHECK(jt(buf) == 0);
        js_w_init(&w, buf, 4);
        js_w_str(&w, "toolong");
        CHECK(w.overflow);
    }
    return check_report("test_json");
}
