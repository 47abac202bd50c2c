// tests/test_json.c — the JSON reader and writer.
//
// A hand-written valid/invalid corpus in the spirit of JSONTestSuite (structure, strings,
// escapes, surrogates, UTF-8, numbers, nesting, whitespace, NUL bytes), every prefix of valid
// documents, error offsets, the writer's escaping / U+FFFD / shortest-double / overflow
// contracts, and reader → writer → reader round trips of random documents (fixed seed).
// Expected values come from the RFCs (8259, 3629) and hand-worked bytes, or from libc's strtod
// and the compiler's own literals, never from the code under test.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"
#include "json_tree.h"
#include <float.h>
#include <sys/wait.h>

// Two-pass parse into static memory. Returns 0 on success, -1 on a parse error (jt_doc.err),
// -2 when the measured size exceeds the test's buffers. Every parse of the file is a case of one
// property: js_measure and js_parse agree (what one accepts the other does, with the sizes measured).
static check_prop jt_measure_parse = {"js_measure and js_parse agree on every document of this file", 0, 0};
#define JT_NODES (1u << 16)
static js_node jt_nodes[JT_NODES];
static char jt_strs[1 << 20];
static js_doc jt_doc;

static int jt_parse_into(js_doc *d, js_node *nodes, uint32_t cap_nodes, char *strs, size_t cap_strs,
                         const char *text, size_t len) {
    uint32_t n;
    size_t s;
    memset(d, 0, sizeof *d);
    if (js_measure(d, text, len, &n, &s)) return -1;
    if (n > cap_nodes || s > cap_strs) return -2;
    d->nodes = nodes;
    d->cap_nodes = n;
    d->strs = strs;
    d->cap_strs = s;
    int rc = js_parse(d, text, len);
    CHECK_PROP(&jt_measure_parse, rc == 0, "measure accepted what parse refused: %s", d->err);
    CHECK_PROP(&jt_measure_parse, rc || (d->n_nodes == n && d->n_strs == s), "parse used %u nodes / %zu bytes, measured %u / %zu",
               d->n_nodes, d->n_strs, n, s);
    return rc;
}
static int jt_parse(const char *text, size_t len) {
    return jt_parse_into(&jt_doc, jt_nodes, JT_NODES, jt_strs, sizeof jt_strs, text, len);
}
static int jt(const char *text) { return jt_parse(text, strlen(text)); }
static const js_node *jt_root(void) { return js_root(&jt_doc); }

// The error must name its byte offset, and that offset must be `off`.
static void jt_err_at(const char *text, size_t len, size_t off, const char *what) {
    char at[48];
    int rc = jt_parse(text, len);
    snprintf(at, sizeof at, "at byte %zu", off);
    CHECK(rc == -1 && jt_doc.err_off == off && strstr(jt_doc.err, at) && (!what || strstr(jt_doc.err, what)),
          "'%.*s': rc %d, offset %zu (want %zu), err '%s' (want '%s')", (int)len, text, rc, jt_doc.err_off, off,
          jt_doc.err, what ? what : "");
}

static uint64_t jt_rng = 0x9E3779B97F4A7C15ull;  // fixed seed: the same documents every run
static uint64_t jt_rand(void) {                  // xorshift64*
    jt_rng ^= jt_rng >> 12;
    jt_rng ^= jt_rng << 25;
    jt_rng ^= jt_rng >> 27;
    return jt_rng * 0x2545F4914F6CDD1Dull;
}
static unsigned jt_below(unsigned n) { return (unsigned)(jt_rand() % n); }

// ---- valid documents --------------------------------------------------------------------

static void test_valid(void) {
    const char *ok[] = {
        "0", "-0", "1", "-1", "0.5", "-0.5", "1e5", "1E5", "1e+5", "1e-5", "1E-5", "-1.25e-5", "0e0", "0E+0",
        "123456789", "\"\"", "\"x\"", "true", "false", "null", "[]", "{}", "[[]]", "[{}]", "{\"\":0}",
        "{\"a\":{}}", "[1,\"a\",true,false,null,{},[],-0.0]", "\"\x7f\"",   // DEL is no control char in JSON
        "\"\\u0000\"", "\"\\uFFFF\"", "\"\\uffff\"", "\"\\ud800\\udc00\"", "\"\\uDBFF\\uDFFF\"",
        "\"\xF4\x8F\xBF\xBF\"", "\"\xED\x9F\xBF\"", "\"\xEE\x80\x80\"", "\"\xEF\xBF\xBD\"", "\"\xC2\x80\"",
        "\"\xDF\xBF\"", "\"\xE0\xA0\x80\"", "\"\xF0\x90\x80\x80\"",
        " \t\r\n[ \t\r\n1 \t\r\n, \t\r\n2 \t\r\n] \t\r\n", "{ \"a\" : 1 , \"b\" : [ ] }", "\n\n\n0\n\n\n",
        "1.7976931348623157e308", "-1.7976931348623157e308", "1e-400", "[1e308,-1e308]",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        CHECK(jt(ok[i]) == 0, "refused valid JSON #%zu '%s': %s", i, ok[i], jt_doc.err);

    CHECK(jt("{\"a\":[1,2.5,\"x\",true,false,null],\"b\":{\"c\":-0}}") == 0);
    const js_node *r = jt_root();
    const js_node *a = js_get(&jt_doc, r, "a");
    CHECK(r && r->type == JS_OBJ && r->len == 2);
    CHECK(a && a->type == JS_ARR && a->len == 6);
    CHECK(js_at(&jt_doc, a, 1)->num == 2.5 && !js_at(&jt_doc, a, 1)->is_int);
    CHECK(js_str_is(js_at(&jt_doc, a, 2), "x"));
    CHECK(js_at(&jt_doc, a, 3)->type == JS_TRUE && js_at(&jt_doc, a, 4)->type == JS_FALSE);
    CHECK(js_at(&jt_doc, a, 5)->type == JS_NULL && js_at(&jt_doc, a, 6) == NULL);
    const js_node *b = js_get(&jt_doc, r, "b");
    int64_t iv = 1;
    CHECK(b && js_int(js_get(&jt_doc, b, "c"), &iv) == 0 && iv == 0);
    CHECK(js_get(&jt_doc, r, "zz") == NULL && js_get(&jt_doc, a, "a") == NULL && js_get(&jt_doc, NULL, "a") == NULL);
    CHECK(!strcmp(js_type_name(a), "array") && !strcmp(js_type_name(NULL), "absent"));

    // siblings are reached by jumping over whole subtrees
    CHECK(jt("[[1,[2,3]],{\"k\":[4]},5]") == 0);
    r = jt_root();
    {
        int64_t got;
        int i = 0;
        for (const js_node *x = js_first(r); x; x = js_after(&jt_doc, r, x), i++) {
            if (i == 2) CHECK(js_int(x, &got) == 0 && got == 5);
            else CHECK(x->type == (i ? JS_OBJ : JS_ARR));
        }
        CHECK(i == 3, "%d elements", i);
        CHECK(js_first(js_at(&jt_doc, r, 1))->type == JS_STR && js_first(jt_nodes + 0) == jt_nodes + 1);
    }

    // duplicate keys are kept in order; js_get returns the first
    CHECK(jt("{\"a\":1,\"b\":2,\"a\":3}") == 0 && jt_root()->len == 3);
    CHECK(js_int(js_get(&jt_doc, jt_root(), "a"), &iv) == 0 && iv == 1);
    CHECK(jt("{\"o\":{\"x\":\"first\",\"x\":\"second\"}}") == 0);
    CHECK(js_str_is(js_get(&jt_doc, js_get(&jt_doc, jt_root(), "o"), "x"), "first"));

    // escapes decode to the bytes RFC 8259 §7 names
    CHECK(jt("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"") == 0 && jt_root()->len == 8 &&
          memcmp(jt_root()->str, "\"\\/\b\f\n\r\t", 9) == 0);
    // \u escapes become UTF-8 (RFC 3629 table): U+00E9, U+20AC, U+1F600 via a pair, U+10000, U+10FFFF
    CHECK(jt("\"\\u00e9\\u20AC\\ud83d\\ude00\\uD800\\uDC00\\udbff\\udfff\"") == 0);
    CHECK(jt_root()->len == 2 + 3 + 4 + 4 + 4 &&
          !memcmp(jt_root()->str, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF0\x90\x80\x80\xF4\x8F\xBF\xBF", 17));
    CHECK(jt("\"\\u0041\\u007f\\u0080\\u07FF\\u0800\\uFFFF\"") == 0 && jt_root()->len == 1 + 1 + 2 + 2 + 3 + 3 &&
          !memcmp(jt_root()->str, "A\x7f\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF", 12));
    // a decoded \u0000 is kept inside the string, and the string is still NUL-terminated after it
    CHECK(jt_parse("\"a\\u0000b\"", 10) == 0 && jt_root()->len == 3 && !memcmp(jt_root()->str, "a\0b", 4));
    CHECK(!js_str_is(jt_root(), "a"));
    // raw UTF-8 is copied unchanged
    CHECK(jt("\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"") == 0 && jt_root()->len == 9 &&
          !memcmp(jt_root()->str, "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 9));
    // escaped and raw spellings of a key are the same key
    CHECK(jt("{\"caf\\u00e9\":1}") == 0 && js_get(&jt_doc, jt_root(), "caf\xC3\xA9"));
}

// ---- invalid documents ------------------------------------------------------------------

static void test_invalid(void) {
    const char *bad[] = {
        // structure
        "", " ", "\n", "{", "[", "]", "}", ",", ":", "[1,]", "[,1]", "[,]", "[1 2]", "[1,,2]", "{\"a\" 1}", "{\"a\":}",
        "{\"a\"}", "{\"a\",1}", "{\"a\":1,}", "{,}", "{1:1}", "{a:1}", "{'a':1}", "{\"a\":1 \"b\":2}",
        "{\"a\":1:2}", "[}", "{]", "[1]]", "[[1]", "{\"a\":1}}", "[\"a\":1]", "{} {}", "1 2", "\"a\" \"b\"",
        "[1]x", "//c\n1", "/*c*/1", "1//", "[1,2]x", "{\"a\":[}", "{\"a\":{]}", "[\"a\",]",
        // literals
        "t", "tru", "True", "TRUE", "nul", "nulll", "NULL", "fals", "falsee", "truefalse", "undefined",
        // numbers (RFC 8259 §6 grammar)
        "-", "+1", "01", "-01", "00", "1.", ".1", "-.1", "1.e1", "1e", "1e+", "1e-", "1E", "- 1", "--1",
        "0x10", "1_000", "1,000", "NaN", "-NaN", "Infinity", "-Infinity", "inf", "1.5.2", "1e5e5", "1ee5",
        "0.e1", "2.", "\xEF\xBC\x91",   // FULLWIDTH DIGIT ONE
        // strings
        "\"", "\"abc", "'abc'", "\"a\"b\"", "\"\\\"", "\"\\", "\"\\u\"", "\"\\u1\"", "\"\\u12\"", "\"\\u123\"",
        "\"\\u12G4\"", "\"\\u-123\"", "\"\\u 123\"", "\"\\U0041\"", "\"\\x41\"", "\"\\'\"",
        // whitespace: only space, tab, LF, CR (RFC 8259 §2)
        "\f1", "\v1", "1\f", "1\v", "[1,\xC2\xA0" "2]", "\xE2\x80\xA8" "1", "\xEF\xBB\xBF{}", "\xC2\xA0" "1",
        "\x1F" "1", "1\x1C",
        // UTF-8 (RFC 3629 §4): overlongs, UTF-16 surrogates, past U+10FFFF, stray or missing
        // continuation bytes, bytes that never appear
        "\"\xC0\x80\"", "\"\xC0\xAF\"", "\"\xC1\xBF\"", "\"\xE0\x80\x80\"", "\"\xE0\x9F\xBF\"", "\"\xF0\x80\x80\x80\"",
        "\"\xF0\x8F\xBF\xBF\"", "\"\xED\xA0\x80\"", "\"\xED\xAF\xBF\"", "\"\xED\xB0\x80\"", "\"\xED\xBF\xBF\"",
        "\"\xED\xA0\xBD\xED\xB8\x80\"",   // CESU-8 U+1F600: a surrogate pair encoded in UTF-8
        "\"\xF4\x90\x80\x80\"", "\"\xF5\x80\x80\x80\"", "\"\xF7\xBF\xBF\xBF\"", "\"\xF8\x88\x80\x80\x80\"",
        "\"\xFC\x84\x80\x80\x80\x80\"", "\"\xFE\"", "\"\xFF\"", "\"\x80\"", "\"\xBF\"", "\"a\x80" "b\"",
        "\"\xC3\"", "\"\xC3" "A\"", "\"\xE2\x82\"", "\"\xE2\x82" "A\"", "\"\xF0\x9F\x98\"", "\"\xF0\x9F\x98" "A\"",
        "\"\xC3", "\"\xF0\x9F",
        // surrogates in \u escapes
        "\"\\ud800\"", "\"\\udbff\"", "\"\\udc00\"", "\"\\udfff\"", "\"\\ud800\\ud800\"", "\"\\udbff\\udbff\"",
        "\"\\udc00\\ud800\"", "\"\\udfff\\udc00\"", "\"\\ud800\\u0041\"", "\"\\ud800\\uE000\"", "\"\\ud800x\"",
        "\"\\ud800\\n\"", "\"\\ud800\\\"", "\"\\ud800\\u\"", "\"\\ud800\\ud\"", "\"\\ud800\\uDC0G\"",
        "\"\\ud800", "\"\\ud800\\", "\"\\ud800\\u", "\"\\ud800\\udc0", "\"\\ud800\\udc00",
        "\"a\\ud800\"", "\"\\ud83d\\ude00\\ud83d\"",
        // numbers past the double range
        "1e309", "-1e309", "1.7976931348623159e308", "1e99999999999999999999", "[1e400]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = jt(bad[i]);
        CHECK(rc == -1 && jt_doc.err[0] && jt_doc.err_off <= strlen(bad[i]), "accepted invalid JSON #%zu: '%s'", i, bad[i]);
    }

    // every raw control character is refused inside a string (RFC 8259 §7), DEL is not one
    for (int c = 0; c < 0x20; c++) {
        char s[4] = {'"', (char)c, '"', 0};
        jt_err_at(s, 3, 1, "control character");
    }
    // every escape letter except the eight of RFC 8259 §7 (and \u, tested apart) is refused at its backslash
    for (int c = 1; c < 256; c++) {
        if (strchr("\"\\/bfnrtu", c)) continue;
        char s[8] = {'"', 'a', '\\', (char)c, '"', 0};
        jt_err_at(s, 5, 2, NULL);
    }
    // NUL bytes: in a string, between values, before and after the document
    jt_err_at("\"a\0b\"", 5, 2, "control character");
    jt_err_at("[1,\0 2]", 7, 3, "unexpected character");
    jt_err_at("[1\0,2]", 6, 2, "expected");
    jt_err_at("\0{}", 3, 0, "unexpected character");
    jt_err_at("{}\0", 3, 2, "trailing");
    jt_err_at("{\"a\"\0:1}", 8, 4, "':'");
    jt_err_at("\0", 1, 0, NULL);
}

// Byte offsets of errors, worked out by hand.
static void test_offsets(void) {
    jt_err_at("[1,]", 4, 3, "unexpected character");
    jt_err_at("{\"a\":1,}", 8, 7, "key must be a string");
    jt_err_at("{\"a\" 1}", 7, 5, "':'");
    jt_err_at("[1 2]", 5, 3, "']'");
    jt_err_at("\"ab\\x\"", 6, 3, "invalid escape");
    jt_err_at("\"\xC0\x80\"", 4, 1, "UTF-8");
    jt_err_at("\"abc\xED\xA0\x80\"", 8, 4, "UTF-8");
    jt_err_at("\"\\uD800\\uD800\"", 14, 1, "high surrogate");
    jt_err_at("\"x\\uDC00\"", 9, 2, "low surrogate");
    jt_err_at("\"xy\\uD800\"", 10, 3, "lone high surrogate");
    jt_err_at("\"\\u12G4\"", 8, 5, "hex digit");
    jt_err_at("  1e309", 7, 2, "out of range");
    jt_err_at("[0, -1e309]", 11, 4, "out of range");
    jt_err_at("{\"a\":1} x", 9, 8, "trailing");
    jt_err_at("\"abc", 4, 4, "unterminated string");
    jt_err_at("tru", 3, 0, "literal");
    jt_err_at("[1,2", 4, 4, "unterminated array");
    jt_err_at("{\"a\":1", 6, 6, "unterminated object");
    jt_err_at("01", 2, 1, "trailing");
    jt_err_at("1.e5", 4, 2, "decimal point");
    jt_err_at("-", 1, 1, "invalid number");
    jt_err_at("1e+", 3, 3, "exponent");
    jt_err_at("", 0, 0, "value expected");
}

// Nesting: MOET_JSON_MAX_DEPTH containers are accepted, one more is refused at the bracket
// that goes too deep, whatever the mix of arrays and objects; far deeper input fails as fast.
static void test_depth(void) {
    enum { D = MOET_JSON_MAX_DEPTH };
    static char buf[8 * (D + 2) + 100000];
    for (int kind = 0; kind < 3; kind++) {   // arrays, objects, alternating
        for (int depth = D - 1; depth <= D + 1; depth++) {
            size_t k = 0, open_at = 0;
            for (int i = 0; i < depth; i++) {
                int obj = kind == 1 || (kind == 2 && i % 2);
                if (i == D) open_at = k;   // the container one level too deep starts here
                if (obj) { memcpy(buf + k, "{\"k\":", 5); k += 5; }
                else buf[k++] = '[';
            }
            buf[k++] = '1';
            for (int i = depth - 1; i >= 0; i--) buf[k++] = (kind == 1 || (kind == 2 && i % 2)) ? '}' : ']';
            if (depth <= D) CHECK(jt_parse(buf, k) == 0, "kind %d depth %d refused: %s", kind, depth, jt_doc.err);
            else jt_err_at(buf, k, open_at, "nesting too deep");
        }
    }
    // 100000 open brackets: refused at the first one past the limit (no stack exhaustion)
    memset(buf, '[', 100000);
    jt_err_at(buf, 100000, D, "nesting too deep");
    for (int i = 0; i < 20000; i++) memcpy(buf + 5 * i, "{\"\":[", 5);
    jt_err_at(buf, 100000, 5 * (D / 2), "nesting too deep");
}

// Every proper prefix of a valid document is refused unless it is itself a valid document
// (listed by hand); the error offset lies within the prefix.
static void test_prefixes(void) {
    static const struct {
        const char *doc;
        size_t valid[8];   // prefix lengths that are valid documents (besides the whole), 0-terminated
    } cases[] = {
        {"{\"name\":\"t\\u00e9st\\ud83d\\ude00\",\"arr\":[1,-2.5e+3,true,false,null,{\"k\":[]}],\"s\":\"a\\\"b\\\\c\",\"\\u0000\":{}}", {0}},
        {"[1,[2,[3,\"x\"]],{\"a\":{\"b\":[]}}]", {0}},
        {" \"a\\u00e9b\xE2\x82\xAC\" ", {14}},
        {"-12.5e+3", {2, 3, 5}},
        {"1234", {1, 2, 3}},
        {"true", {0}},
        {"null ", {4}},
        {"\t[ ]\n", {4}},
        {"0.25E-7", {1, 3, 4}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = strlen(cases[c].doc);
        for (size_t len = 0; len <= n; len++) {
            char *p = malloc(len ? len : 1);   // exactly the prefix: nothing readable past it
            memcpy(p, cases[c].doc, len);
            int want_ok = len == n;
            for (int v = 0; cases[c].valid[v]; v++) want_ok |= cases[c].valid[v] == len;
            int rc = jt_parse(p, len);
            if (want_ok) CHECK(rc == 0, "case %zu prefix %zu refused: %s", c, len, jt_doc.err);
            else CHECK(rc == -1 && jt_doc.err_off <= len, "case %zu prefix %zu: rc %d offset %zu", c, len, rc, jt_doc.err_off);
            free(p);
        }
    }
}

// Numbers: the RFC grammar, the double range, exact int64 where it fits.
static void test_numbers(void) {
    int64_t v;
    double x;
    const js_node *r;
    CHECK(jt("9223372036854775807") == 0 && js_int(jt_root(), &v) == 0 && v == INT64_MAX);
    CHECK(jt("-9223372036854775808") == 0 && js_int(jt_root(), &v) == 0 && v == INT64_MIN);
    CHECK(jt("-9223372036854775807") == 0 && js_int(jt_root(), &v) == 0 && v == -INT64_MAX);
    CHECK(jt("9223372036854775808") == 0 && js_int(jt_root(), &v) == -1 && jt_root()->num == 9223372036854775808.0);
    CHECK(jt("-9223372036854775809") == 0 && js_int(jt_root(), &v) == -1 && jt_root()->num == -9223372036854775808.0);
    CHECK(jt("18446744073709551616") == 0 && js_int(jt_root(), &v) == -1 && jt_root()->num == 18446744073709551616.0);
    CHECK(jt("99999999999999999999") == 0 && js_int(jt_root(), &v) == -1 && jt_root()->num == 1e20);
    CHECK(jt("-0") == 0 && js_int(jt_root(), &v) == 0 && v == 0 && signbit(jt_root()->num));
    CHECK(jt("-0.0") == 0 && js_int(jt_root(), &v) == -1 && jt_root()->num == 0 && signbit(jt_root()->num));
    CHECK(jt("0") == 0 && js_int(jt_root(), &v) == 0 && v == 0 && !signbit(jt_root()->num));
    CHECK(jt("1.0") == 0 && js_int(jt_root(), &v) == -1 && js_num(jt_root(), &x) == 0 && x == 1.0);
    CHECK(jt("1e2") == 0 && js_int(jt_root(), &v) == -1 && jt_root()->num == 100.0);
    CHECK(jt("\"1\"") == 0 && js_int(jt_root(), &v) == -1 && js_num(jt_root(), &x) == -1);
    CHECK(js_int(NULL, &v) == -1 && js_num(NULL, &x) == -1);
    // the double range: DBL_MAX is the largest literal accepted; underflow goes to (signed) zero
    CHECK(jt("1.7976931348623157e308") == 0 && jt_root()->num == DBL_MAX);
    CHECK(jt("1e308") == 0 && jt_root()->num == 1e308);
    CHECK(jt("4.9406564584124654e-324") == 0 && jt_root()->num == 0x1p-1074);
    CHECK(jt("2.2250738585072014e-308") == 0 && jt_root()->num == DBL_MIN);
    CHECK(jt("1e-400") == 0 && jt_root()->num == 0.0 && !signbit(jt_root()->num));
    CHECK(jt("-1e-400") == 0 && jt_root()->num == 0.0 && signbit(jt_root()->num));
    CHECK(jt("0.1") == 0 && jt_root()->num == 0.1);
    CHECK(jt("123.456e-2") == 0 && jt_root()->num == 1.23456);
    CHECK(jt("1E+2") == 0 && jt_root()->num == 100.0);
    // long literals: 300 digits is 1e299 as a double (no int64); 400 digits is 1e399, past the
    // double range, so an error; 400 digits with an exponent back in range is fine; 400
    // fraction digits round correctly (0.333… is the double nearest 1/3)
    {
        static char n[1100];
        memset(n, '0', sizeof n);
        n[0] = '1';
        n[300] = 0;
        CHECK(jt(n) == 0 && js_int(jt_root(), &v) == -1 && jt_root()->num == 1e299);
        n[300] = '0';
        n[400] = 0;
        CHECK(jt(n) == -1 && strstr(jt_doc.err, "out of range"));
        memcpy(n + 400, "e-100", 6);
        CHECK(jt(n) == 0 && jt_root()->num == 1e299);
        memcpy(n, "0.", 2);
        memset(n + 2, '3', 398);
        n[400] = 0;
        CHECK(jt(n) == 0 && jt_root()->num == 1.0 / 3.0);
        // the literal length limit (JS_MAX_NUMBER_CHARS): at the limit accepted, one more refused
        memset(n + 2, '3', sizeof n - 3);
        n[JS_MAX_NUMBER_CHARS] = 0;
        CHECK(jt(n) == 0 && jt_root()->num == 1.0 / 3.0);
        n[JS_MAX_NUMBER_CHARS] = '3';
        n[JS_MAX_NUMBER_CHARS + 1] = 0;
        CHECK(jt(n) == -1 && strstr(jt_doc.err, "too long") && jt_doc.err_off == 0);
    }
    // libc strtod is the oracle for random literals of every shape the grammar allows
    check_prop lit = {"20,000 random number literals read as strtod reads them", 0, 0},
               lint = {"random integer literals are exact int64 exactly when they fit", 0, 0};
    for (int i = 0; i < 20000; i++) {
        char s[64];
        int k = 0;
        if (jt_below(2)) s[k++] = '-';
        int ip = 1 + (int)jt_below(20);
        s[k++] = (char)(ip == 1 ? '0' + jt_below(10) : '1' + jt_below(9));
        for (int j = 1; j < ip; j++) s[k++] = (char)('0' + jt_below(10));
        int has_frac = jt_below(2), has_exp = jt_below(2);
        if (has_frac) {
            s[k++] = '.';
            for (int j = 0, f = 1 + (int)jt_below(20); j < f; j++) s[k++] = (char)('0' + jt_below(10));
        }
        if (has_exp) {
            s[k++] = jt_below(2) ? 'e' : 'E';
            int sg = (int)jt_below(3);
            if (sg) s[k++] = sg == 1 ? '+' : '-';
            k += snprintf(s + k, sizeof s - (size_t)k, "%u", jt_below(330));
        }
        s[k] = 0;
        double want = strtod(s, NULL);
        int rc = jt(s);
        if (isinf(want)) { CHECK_PROP(&lit, rc == -1, "'%s' overflows but was accepted", s); continue; }
        r = jt_root();
        CHECK_PROP(&lit, rc == 0 && r->num == want && !signbit(r->num) == !signbit(want), "'%s': %.17g, strtod %.17g", s,
                   r ? r->num : 0, want);
        if (rc == 0 && !has_frac && !has_exp) {
            errno = 0;
            long long ll = strtoll(s, NULL, 10);
            int fits = errno != ERANGE;
            CHECK_PROP(&lint, r->is_int == fits && (!fits || r->i64 == ll), "'%s': is_int %d i64 %" PRId64, s, r->is_int, r->i64);
        } else if (rc == 0) CHECK_PROP(&lint, !r->is_int, "'%s' is not an integer literal", s);
    }
    check_prop_end(&lit);
    check_prop_end(&lint);
}

// ---- writer -----------------------------------------------------------------------------

static char jt_out[1 << 20];
static check_prop jt_fits = {"the writer never overflows a 1 MiB buffer with one value", 0, 0};

// The text of one string value written by js_w_strn.
static const char *jt_wstr(const char *s, size_t n) {
    js_writer w;
    js_w_init(&w, jt_out, sizeof jt_out);
    js_w_strn(&w, s, n);
    CHECK_PROP(&jt_fits, !w.overflow);
    return jt_out;
}

static void test_writer_strings(void) {
    // every control character is escaped: \n \r \t by name, others as \u00XX (RFC 8259 §7),
    // and reads back as the same byte
    for (int c = 0; c < 0x20; c++) {
        char in = (char)c, want[16];
        if (c == '\n') strcpy(want, "\"\\n\"");
        else if (c == '\r') strcpy(want, "\"\\r\"");
        else if (c == '\t') strcpy(want, "\"\\t\"");
        else snprintf(want, sizeof want, "\"\\u%04x\"", c);
        const char *got = jt_wstr(&in, 1);
        CHECK(!strcmp(got, want), "control 0x%02x written as %s, want %s", c, got, want);
        CHECK(jt(got) == 0 && jt_root()->len == 1 && (uint8_t)jt_root()->str[0] == c, "0x%02x does not read back", c);
    }
    CHECK(!strcmp(jt_wstr("\x7f", 1), "\"\\u007f\""));
    CHECK(!strcmp(jt_wstr("a\"b\\c/", 6), "\"a\\\"b\\\\c/\""));
    // all printable ASCII except " and \ is copied as it is
    {
        char in[96];
        int n = 0;
        for (int c = 0x20; c < 0x7f; c++)
            if (c != '"' && c != '\\') in[n++] = (char)c;
        const char *got = jt_wstr(in, (size_t)n);
        CHECK(strlen(got) == (size_t)n + 2 && !memcmp(got + 1, in, (size_t)n));
    }
    // well-formed UTF-8 is copied unchanged, up to U+10FFFF
    {
        const char *u = "\xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF";
        const char *got = jt_wstr(u, strlen(u));
        CHECK(strlen(got) == strlen(u) + 2 && !memcmp(got + 1, u, strlen(u)));
    }
    // bytes that are not part of a well-formed sequence each become one U+FFFD (EF BF BD),
    // so the output is always valid JSON; the bytes around them are kept
    static const struct { const char *in, *out; } bad[] = {
        {"\x80", "\"\xEF\xBF\xBD\""},
        {"a\xFF" "b", "\"a\xEF\xBF\xBD" "b\""},
        {"\xC0\xAF", "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},                             // overlong '/'
        {"\xE0\x80\xAF", "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""},             // overlong '/'
        {"\xED\xA0\x80", "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""},             // U+D800 in UTF-8
        {"\xF4\x90\x80\x80", "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""}, // U+110000
        {"\xE2\x82", "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},                             // truncated at the end
        {"\xC3" "A", "\"\xEF\xBF\xBD" "A\""},                                     // continuation missing
        {"\xC3\xA9\xC3", "\"\xC3\xA9\xEF\xBF\xBD\""},
        {"\xF8\x88\x80\x80\x80", "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *got = jt_wstr(bad[i].in, strlen(bad[i].in));
        CHECK(!strcmp(got, bad[i].out), "invalid UTF-8 #%zu written as '%s'", i, got);
        CHECK(jt(got) == 0, "invalid UTF-8 #%zu: output is not valid JSON", i);
    }
    // any 3 bytes at all: the output is valid JSON with no raw control character
    check_prop any3 = {"20,000 random 3-byte strings are written as valid JSON without raw control characters", 0, 0};
    for (int i = 0; i < 20000; i++) {
        uint8_t in[3] = {(uint8_t)jt_rand(), (uint8_t)jt_rand(), (uint8_t)jt_rand()};
        const char *got = jt_wstr((const char *)in, 3);
        int raw_ctl = 0;
        for (const char *c = got; *c; c++) raw_ctl |= (uint8_t)*c < 0x20;
        CHECK_PROP(&any3, jt(got) == 0 && !raw_ctl, "bytes %02x %02x %02x written as invalid JSON", in[0], in[1], in[2]);
    }
    check_prop_end(&any3);
    // keys are escaped like strings, and a key may hold a NUL
    {
        js_writer w;
        js_w_init(&w, jt_out, sizeof jt_out);
        js_w_obj(&w);
        js_w_key(&w, "a\"b\n");
        js_w_int(&w, 1);
        js_w_keyn(&w, "x\0y", 3);
        js_w_str(&w, "v");
        js_w_end_obj(&w);
        CHECK(!w.overflow && !strcmp(jt_out, "{\"a\\\"b\\n\":1,\"x\\u0000y\":\"v\"}"), "%s", jt_out);
        CHECK(jt(jt_out) == 0 && js_first(jt_root())[2].len == 3 && !memcmp(js_first(jt_root())[2].str, "x\0y", 3));
    }
}

// Shortest text that reads back as the same double (the first of %.1g … %.17g that does).
static const char *jt_wnum(double v) {
    js_writer w;
    js_w_init(&w, jt_out, sizeof jt_out);
    js_w_num(&w, v);
    CHECK_PROP(&jt_fits, !w.overflow);
    return jt_out;
}

static void test_writer_numbers(void) {
    static const struct { double v; const char *text; } cases[] = {
        {0.0, "0"}, {-0.0, "-0"}, {1.0, "1"}, {-1.5, "-1.5"}, {0.1, "0.1"},
        {0.1 + 0.2, "0.30000000000000004"},          // needs all 17 digits (the %.17g fallback)
        {1.0 / 3.0, "0.3333333333333333"},           // 16 digits already read back
        {100.0, "100"}, {120.0, "120"}, {-2e100, "-2e100"}, {1e15, "1e15"}, {1e21, "1e21"}, {1e-7, "1e-7"},
        {1.5e-10, "1.5e-10"}, {123456.0, "123456"}, {1234567.0, "1234567"},
        {DBL_MAX, "1.7976931348623157e308"}, {0x1p-1074, "5e-324"}, {DBL_MIN, "2.2250738585072014e-308"},
        {9007199254740993.0, "9007199254740992"},   // 2^53 + 1 is not a double: it is 2^53
        {9007199254740991.0, "9007199254740991"},   // 2^53 - 1, exact
        {0x1p62, "4.611686018427388e18"},           // not "4611686018427388000": that would read back
                                                    // as an exact int64 the double is not
        {1e17, "1e17"}, {-3e16, "-3e16"}, {4e15, "4e15"}, {4096.0, "4096"}, {5e3, "5e3"},   // shorter than "5000"
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = jt_wnum(cases[i].v);
        CHECK(!strcmp(got, cases[i].text), "%.17g written as '%s', want '%s'", cases[i].v, got, cases[i].text);
    }
    CHECK(!strcmp(jt_wnum(NAN), "null") && !strcmp(jt_wnum(INFINITY), "null") && !strcmp(jt_wnum(-INFINITY), "null"));
    // Random doubles (every bit pattern but NaN/Inf): the text reads back bit-exactly through
    // the reader, is valid JSON, and one significant digit less would not read back.
    int n_checked = 0;
    check_prop readback = {"random doubles: the text reads back bit-exactly", 0, 0},
               sig = {"random doubles: at most 17 significant digits, at most 24 characters", 0, 0},
               exact = {"random doubles: a text read back as an int64 is the double exactly", 0, 0},
               shortest = {"random doubles: one significant digit less does not read back", 0, 0};
    for (int i = 0; i < 100000; i++) {
        uint64_t bits = jt_rand();
        if (i % 4 == 0) bits = (bits & 0x800FFFFFFFFFFFFFull) | (uint64_t)(1023 - 30 + jt_below(60)) << 52;  // near 1
        double v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v)) continue;
        const char *got = jt_wnum(v);
        int rc = jt(got);
        uint64_t back = 0;
        if (rc == 0) memcpy(&back, &jt_root()->num, sizeof back);
        CHECK_PROP(&readback, rc == 0 && back == bits, "%a written as '%s' reads back as %a", v, got, rc ? 0 : jt_root()->num);
        // significant digits of the mantissa: without leading zeros and, when it has no decimal
        // point, without trailing ones ("100" holds one: "1e2" would be no shorter)
        char mant[40];
        size_t ml = strcspn(got, "e");
        memcpy(mant, got, ml);
        mant[ml] = 0;
        int digits = 0;
        for (const char *c = mant; *c; c++) digits += isdigit((uint8_t)*c) != 0;
        for (const char *c = mant; *c == '-' || *c == '0' || *c == '.'; c++) digits -= *c == '0';
        if (!strchr(mant, '.'))
            for (size_t j = ml; j > 0 && mant[j - 1] == '0'; j--) digits--;
        CHECK_PROP(&sig, digits >= 1 && digits <= 17 && strlen(got) <= 24, "'%s' has %d significant digits", got, digits);
        // text without '.' or 'e' reads back as an exact int64: it must be the double exactly
        if (rc == 0 && jt_root()->is_int)
            CHECK_PROP(&exact, (double)jt_root()->i64 == v && fabs(v) < 0x1p63, "'%s' reads back as int64 %" PRId64 ", not %a",
                       got, jt_root()->i64, v);
        if (digits > 1) {
            char shorter[320];   // %g may print up to 309 digits as far as the compiler knows
            snprintf(shorter, sizeof shorter, "%.*g", digits - 1, v);
            CHECK_PROP(&shortest, strtod(shorter, NULL) != v, "'%s' is not the shortest: '%s' reads back too", got, shorter);
        }
        n_checked++;
    }
    check_prop_end(&readback);
    check_prop_end(&sig);
    check_prop_end(&exact);
    check_prop_end(&shortest);
    CHECK(n_checked > 90000, "only %d finite random doubles", n_checked);
    // integers: exact, and they read back as exact integers
    int64_t ints[] = {0, -1, 1, INT64_MAX, INT64_MIN, 9007199254740993ll, -1000000000000ll};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        js_writer w;
        char want[32];
        int64_t back;
        js_w_init(&w, jt_out, sizeof jt_out);
        js_w_int(&w, ints[i]);
        snprintf(want, sizeof want, "%lld", (long long)ints[i]);
        CHECK(!strcmp(jt_out, want) && jt(jt_out) == 0 && js_int(jt_root(), &back) == 0 && back == ints[i], "%s", jt_out);
    }
}

// A fixed document written into buffers of every size: the writer overflows exactly when the
// text and its NUL do not fit, never writes past cap, and what it wrote is the text's prefix.
static void jt_sample_doc(js_writer *w) {
    js_w_obj(w);
    js_w_key(w, "id");
    js_w_int(w, -7);
    js_w_key(w, "s");
    js_w_strn(w, "\x01\xFF\xC3\xA9\"", 5);
    js_w_key(w, "a");
    js_w_arr(w);
    js_w_num(w, 0.1);
    js_w_bool(w, 0);
    js_w_null(w);
    js_w_obj(w);
    js_w_end_obj(w);
    js_w_raw(w, "[1,2]", 5);
    js_w_end_arr(w);
    js_w_end_obj(w);
}

static void test_writer_overflow(void) {
    static char full[256], buf[256 + 16];
    js_writer w;
    js_w_init(&w, full, sizeof full);
    jt_sample_doc(&w);
    size_t n = w.len;
    CHECK(!w.overflow && n == strlen(full) &&
          !strcmp(full, "{\"id\":-7,\"s\":\"\\u0001\xEF\xBF\xBD\xC3\xA9\\\"\",\"a\":[0.1,false,null,{},[1,2]]}"), "%s", full);
    CHECK(jt(full) == 0);
    for (size_t cap = 0; cap <= n + 2; cap++) {
        memset(buf, 0x5A, sizeof buf);
        js_w_init(&w, buf, cap);
        jt_sample_doc(&w);
        int guard_ok = 1;
        for (size_t i = cap; i < sizeof buf; i++) guard_ok &= buf[i] == 0x5A;
        CHECK(guard_ok, "cap %zu: written past the buffer", cap);
        CHECK(w.overflow == (cap <= n), "cap %zu: overflow %d for a %zu-byte text", cap, w.overflow, n);
        if (cap) CHECK(w.len < cap && buf[w.len] == 0 && !memcmp(buf, full, w.len), "cap %zu: not a prefix", cap);
        if (!w.overflow) CHECK(!strcmp(buf, full));
    }
    // nesting to the limit writes and reads back; one level more dies loudly (abort, no corruption)
    {
        js_w_init(&w, jt_out, sizeof jt_out);
        for (int i = 0; i < MOET_JSON_MAX_DEPTH; i++) js_w_arr(&w);
        for (int i = 0; i < MOET_JSON_MAX_DEPTH; i++) js_w_end_arr(&w);
        CHECK(!w.overflow && w.len == 2 * MOET_JSON_MAX_DEPTH && jt(jt_out) == 0);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd >= 0) dup2(fd, 2);
            js_w_init(&w, jt_out, sizeof jt_out);
            for (int i = 0; i <= MOET_JSON_MAX_DEPTH; i++) js_w_arr(&w);
            _exit(0);
        }
        int st = 0;
        CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
              "writer nesting past the limit: status 0x%x", st);
    }
}

// ---- random documents: reader → writer → reader -----------------------------------------

static size_t jg_len;
static char jg_buf[1 << 18];
static void jg_put(const char *s, size_t n) {
    if (jg_len + n < sizeof jg_buf) memcpy(jg_buf + jg_len, s, n);
    jg_len += n;
}
static void jg_puts(const char *s) { jg_put(s, strlen(s)); }
static void jg_ws(void) {
    static const char ws[] = " \t\n\r";
    if (jt_below(3) == 0)
        for (unsigned i = jt_below(4); i-- > 0;) jg_put(&ws[jt_below(4)], 1);
}

static void jg_string(void) {
    static const char *pieces[] = {
        "a", "Z", "0", " ", "/", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u0000", "\\u001F",
        "\\u00e9", "\\u20AC", "\\uFFFF", "\\ud83d\\ude00", "\\uDBFF\\uDFFF", "\xC3\xA9", "\xE2\x82\xAC",
        "\xF0\x9F\x98\x80", "\xF4\x8F\xBF\xBF", "\x7f", "key", "model.layers.0.weight",
    };
    jg_puts("\"");
    for (unsigned i = jt_below(6); i-- > 0;) jg_puts(pieces[jt_below(sizeof pieces / sizeof pieces[0])]);
    jg_puts("\"");
}

static void jg_number(void) {
    char s[64];
    switch (jt_below(6)) {
    case 0: snprintf(s, sizeof s, "%d", (int)jt_below(2001) - 1000); break;
    case 1: snprintf(s, sizeof s, "%" PRId64, (int64_t)jt_rand()); break;
    case 2: snprintf(s, sizeof s, "%s", jt_below(2) ? "9223372036854775807" : "-9223372036854775808"); break;
    case 3: snprintf(s, sizeof s, "%.*g", 1 + (int)jt_below(17), ((double)jt_rand() / 1e10) * (jt_below(2) ? 1 : -1)); break;
    case 4: snprintf(s, sizeof s, "%u.%ue%s%u", jt_below(100), jt_below(1000), jt_below(2) ? "-" : "+", jt_below(300)); break;
    default: snprintf(s, sizeof s, "%s0.%u", jt_below(2) ? "-" : "", jt_below(100000)); break;
    }
    jg_puts(s);
}

static void jg_value(int depth) {
    unsigned k = jt_below(depth < 6 ? 9 : 6);
    jg_ws();
    switch (k) {
    case 0: jg_puts("null"); break;
    case 1: jg_puts("true"); break;
    case 2: jg_puts("false"); break;
    case 3: case 4: jg_number(); break;
    case 5: jg_string(); break;
    case 6: case 7: {
        jg_puts("[");
        unsigned n = jt_below(5);
        for (unsigned i = 0; i < n; i++) { if (i) jg_puts(","); jg_value(depth + 1); }
        jg_ws();
        jg_puts("]");
        break;
    }
    default: {
        jg_puts("{");
        unsigned n = jt_below(5);
        for (unsigned i = 0; i < n; i++) {
            if (i) jg_puts(",");
            jg_ws();
            jg_string();   // duplicate keys occur: both are kept
            jg_ws();
            jg_puts(":");
            jg_value(depth + 1);
        }
        jg_ws();
        jg_puts("}");
        break;
    }
    }
    jg_ws();
}

static void test_round_trip(void) {
    static js_node nodes2[JT_NODES];
    static char strs2[1 << 20], text2[1 << 20];
    js_doc d2;
    int docs = 0;
    check_prop rt = {"3,000 random documents: read, written, read again: the same tree, and written again: the same text", 0, 0};
    for (int i = 0; i < 3000; i++) {
        jg_len = 0;
        jg_value(0);
        if (jg_len >= sizeof jg_buf) continue;
        int rc = jt_parse(jg_buf, jg_len);
        CHECK_PROP(&rt, rc == 0, "generated document refused: %s\n%.*s", jt_doc.err, (int)jg_len, jg_buf);
        if (rc) continue;
        js_writer w;
        js_w_init(&w, jt_out, sizeof jt_out);
        jt_write_tree(&w, &jt_doc, jt_root());
        CHECK_PROP(&rt, !w.overflow && w.depth == 0);
        rc = jt_parse_into(&d2, nodes2, JT_NODES, strs2, sizeof strs2, jt_out, w.len);
        CHECK_PROP(&rt, rc == 0, "written document refused: %s\n%s", d2.err, jt_out);
        if (rc) continue;
        CHECK_PROP(&rt, jt_same_tree(&jt_doc, jt_root(), &d2, js_root(&d2)), "round trip differs:\n%.*s\n%s", (int)jg_len, jg_buf,
                   jt_out);
        // writing the re-read tree gives the same text again (the writer is a fixed point)
        js_w_init(&w, text2, sizeof text2);
        jt_write_tree(&w, &d2, js_root(&d2));
        CHECK_PROP(&rt, !w.overflow && !strcmp(text2, jt_out), "second write differs:\n%s\n%s", jt_out, text2);
        docs++;
    }
    check_prop_end(&rt);
    CHECK(docs > 2900, "only %d random documents round-tripped", docs);
}

// js_load_doc: one allocation, released by js_free_doc; errors name the file.
static void test_load_doc(void) {
    js_doc d;
    moet_err e = {{0}};
    uint64_t before = arena_stats.allocs;
    const char *t = "{\"k\":[1,\"two\"]}";
    CHECK(js_load_doc(&d, t, strlen(t), "x.json", &e) == 0 && arena_stats.allocs == before + 1);
    CHECK(js_str_is(js_at(&d, js_get(&d, js_root(&d), "k"), 1), "two"));
    js_free_doc(&d);
    CHECK(d.nodes == NULL && js_root(&d) == NULL);
    CHECK(js_load_doc(&d, "{\"k\":}", 6, "x.json", &e) == -1 && strstr(e.msg, "x.json") && strstr(e.msg, "at byte 5"), "%s", e.msg);
    CHECK(arena_stats.allocs == before + 1, "a refused document allocated");
}

int main(void) {
    test_valid();
    test_invalid();
    test_offsets();
    test_depth();
    test_prefixes();
    test_numbers();
    test_writer_strings();
    test_writer_numbers();
    test_writer_overflow();
    test_round_trip();
    test_load_doc();
    check_prop_end(&jt_measure_parse);
    check_prop_end(&jt_fits);
    return check_report("test_json");
}
