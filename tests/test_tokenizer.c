// tests/test_tokenizer.c — the tokenizer: goldens from Hugging Face tokenizers, decode and
// streaming decode, refusals, added tokens, NFC (the UCD's own conformance test), the Split
// regex piece boundaries, capacities, the `moet tokenize` command.
//
// Expected values come from outside this code: golden_*.jsonl (Hugging Face tokenizers, Rust,
// cross-checked with @huggingface/tokenizers), golden_extra_*.jsonl (@huggingface/tokenizers,
// see tests/gen_tok_goldens.js), NormalizationTest.txt (Unicode), the demo model's
// golden.safetensors (transformers), ids read from the tokenizer files themselves, and piece
// boundaries derived by hand from the regex (each with its reason).
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"
#include <sys/wait.h>

#define TT_SCRATCH (1u << 16)   // text bytes the tests' scratch holds (the longest golden is ~2 KB)
#define TT_MAX_IDS 65536

static tok_scratch tt_scr;
static arena tt_scr_mem;
static int32_t tt_ids[TT_MAX_IDS];
static char tt_text[1 << 18];

// Reads a whole file (NUL-terminated); NULL (and a failed CHECK) when it cannot.
static char *tt_read(const char *path, size_t *len) {
    moet_err e;
    char *s = arena_read_small(path, MOET_MAX_TOKENIZER_BYTES, len, &e);
    CHECK(s != NULL, "%s", e.msg);
    return s;
}

static int tt_load(tok *t, const char *path, const char *config) {
    moet_err e;
    int rc = tok_load(t, path, config, &e);
    CHECK(rc == 0, "loading %s: %s", path, rc ? e.msg : "");
    return rc;
}

// Encodes text; returns the id count or -1 (message in e).
static long tt_encode(const tok *t, const char *s, size_t n, moet_err *e) {
    size_t k;
    if (tok_encode(t, &tt_scr, s, n, tt_ids, TT_MAX_IDS, &k, e)) return -1;
    return (long)k;
}

static void tt_print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

// Streaming decode of ids[0..n) token by token: every piece is complete UTF-8, and the pieces
// put together equal the one-shot decode out[0..len). Returns 1 when both hold; *held counts
// calls that held bytes back.
static int tt_stream_ok(const tok *t, const int32_t *ids, size_t n, int skip, const char *out, size_t len, int *held) {
    tok_stream st;
    tok_stream_init(&st, skip);
    static char piece[3 * (MOET_MAX_TOKEN_BYTES + 4)];
    size_t o = 0;
    moet_err e;
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        if (i < n) {
            if (tok_decode_stream(t, &st, ids[i], piece, sizeof piece, &k, &e)) return 0;
            if (st.n_pend) (*held)++;
        } else {
            k = tok_stream_flush(&st, piece);
        }
        if (uni_valid_prefix((const uint8_t *)piece, k) != k) return 0;   // an incomplete or bad sequence
        if (k > len - o || memcmp(out + o, piece, k)) return 0;
        o += k;
    }
    return o == len;
}

// Runs every case of a golden_*.jsonl: exact ids, decode == "decoded", stream decode.
static void tt_goldens(const tok *t, const char *golden, const char *name, int *held_total) {
    size_t len;
    char *all = tt_read(golden, &len);
    if (!all) return;
    int cases = 0, bad = 0;
    for (char *line = all; line < all + len;) {
        char *nl = memchr(line, '\n', (size_t)(all + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(all + len - line);
        if (ll == 0) { line += 1; continue; }
        js_doc d;
        moet_err e;
        cases++;
        if (js_load_doc(&d, line, ll, golden, &e)) {
            CHECK(0, "%s case %d: %s", name, cases, e.msg);
            break;
        }
        const js_node *r = js_root(&d), *text = js_get(&d, r, "text"), *ids = js_get(&d, r, "ids"),
                      *dec = js_get(&d, r, "decoded");
        if (!(text && text->type == JS_STR && ids && ids->type == JS_ARR && dec && dec->type == JS_STR)) {
            CHECK(0, "%s case %d: not a golden case (text, ids, decoded)", name, cases);
            js_free_doc(&d);
            break;
        }
        static int32_t want[TT_MAX_IDS];
        uint32_t nw = 0;
        for (const js_node *v = js_first(ids); nw < ids->len; v = js_next(&d, v)) want[nw++] = (int32_t)v->i64;
        long n = tt_encode(t, text->str, text->len, &e);
        int ok = n == (long)nw && !memcmp(tt_ids, want, nw * sizeof *want);
        CHECK(ok, "%s case %d: encode %s", name, cases, n < 0 ? e.msg : "ids differ");
        if (!ok && n >= 0) {
            char b[256];
            fprintf(stderr, "  text %s\n", tok_show(text->str, text->len, b));
            tt_print_ids("want", want, nw);
            tt_print_ids("got ", tt_ids, (size_t)n);
        }
        // the long-piece merge (heap) must agree with the short one on every piece
        if (ok && text->len < TT_SCRATCH) {
            const uint8_t *p = (const uint8_t *)text->str;
            size_t pn = text->len;
            int agree = 1;
            if (t->nfc && !uni_nfc_quick(p, pn)) {
                MOET_ASSERT(uni_nfc(p, pn, tt_scr.cps, tt_scr.cps_tmp, tt_scr.nfc, tt_scr.max_text, &pn) == 0, "nfc");
                p = tt_scr.nfc;
            }
            for (size_t i = 0; i < pn && agree;) {
                size_t j = tok_split_next(p, pn, i, t->regex == TOK_RE_QWEN35);
                static int32_t a[TT_SCRATCH], b2[TT_SCRATCH];
                tok_out oa = {a, TT_SCRATCH, 0}, ob = {b2, TT_SCRATCH, 0};
                if (j - i <= TOK_BPE_SMALL) {
                    tok_bpe(t, &tt_scr, p + i, j - i, &oa, &e);
                    tok_bpe_long(t, &tt_scr, p + i, (int32_t)(j - i), &ob, &e);
                    agree = oa.n == ob.n && !memcmp(a, b2, oa.n * sizeof *a);
                }
                i = j;
            }
            CHECK(agree, "%s case %d: the heap merge differs from the array merge", name, cases);
        }
        size_t tl;
        int drc = tok_decode(t, want, nw, 0, tt_text, sizeof tt_text, &tl, &e);
        CHECK(drc == 0 && tl == dec->len && !memcmp(tt_text, dec->str, tl), "%s case %d: decode %s", name, cases,
              drc ? e.msg : "differs");
        if (drc == 0) CHECK(tt_stream_ok(t, want, nw, 0, tt_text, tl, held_total), "%s case %d: streaming decode", name, cases);
        bad += !ok;
        js_free_doc(&d);
        line += ll + 1;
    }
    CHECK(cases >= 10, "%s: only %d cases read", name, cases);
    printf("%s: %d cases, %d with wrong ids\n", name, cases, bad);
    arena_sys_free(all, len + 1);
}

// Returns how many streaming calls held bytes back (a character split across tokens).
static int tt_golden_file(const char *tokenizer, const char *config, const char *golden, const char *name) {
    tok t;
    if (tt_load(&t, tokenizer, config)) return 0;
    int held = 0;
    tt_goldens(&t, golden, name, &held);
    tok_free(&t);
    return held;
}

// ---- refusals: the tiny tokenizer with one thing changed

static char *tt_tiny;
static size_t tt_tiny_len;

// tt_tiny with the first `from` replaced by `to`, loaded; returns the load status, message in e.
static int tt_load_changed(const char *from, const char *to, const char *cfg, moet_err *e) {
    static char buf[1 << 16];
    const char *at = strstr(tt_tiny, from);
    CHECK(at != NULL, "fixture lacks %s", from);
    if (!at) return 0;
    size_t pre = (size_t)(at - tt_tiny), fl = strlen(from), tl = strlen(to);
    MOET_ASSERT(tt_tiny_len - fl + tl < sizeof buf, "buffer");
    memcpy(buf, tt_tiny, pre);
    memcpy(buf + pre, to, tl);
    memcpy(buf + pre + tl, at + fl, tt_tiny_len - pre - fl);
    size_t n = tt_tiny_len - fl + tl;
    tok t;
    int rc = tok_load_mem(&t, buf, n, cfg, cfg ? strlen(cfg) : 0, "tiny", "config", e);
    if (rc == 0) tok_free(&t);
    return rc;
}

static void tt_refused(const char *from, const char *to, const char *cfg, const char *needle) {
    moet_err e;
    e.msg[0] = 0;
    int rc = tt_load_changed(from, to, cfg, &e);
    CHECK(rc != 0 && strstr(e.msg, needle), "replacing %s by %s: want an error naming \"%s\", got rc %d \"%s\"", from, to,
          needle, rc, e.msg);
}

static void tt_refusals(void) {
    moet_err e;
    CHECK(tt_load_changed("\"type\":\"NFC\"", "\"type\":\"NFC\"", NULL, &e) == 0, "unchanged tiny: %s", e.msg);
    // another regex: the GPT-2 pattern, and the Qwen3.5 pattern with one \p{M} dropped
    tt_refused("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+",
               "'s|'t|'re|'ve|'m|'ll|'d| ?\\\\p{L}+", NULL, "Split regex \"'s|'t|'re");
    tt_refused("[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]", "[^\\\\s\\\\p{L}\\\\p{N}]", NULL, "is not one of the two supported");
    tt_refused("\\\\s+(?!\\\\S)|\\\\s+\"", "\\\\s+(?!\\\\S)\"", NULL, "is not one of the two supported");
    tt_refused("\"type\":\"BPE\"", "\"type\":\"WordPiece\"", NULL, "model.type: expected \"BPE\", got \"WordPiece\"");
    tt_refused("\"type\":\"NFC\"", "\"type\":\"NFKC\"", NULL, "normalizer: expected {\"type\": \"NFC\"} or null, got \"NFKC\"");
    tt_refused("\"behavior\":\"Isolated\"", "\"behavior\":\"Removed\"", NULL, "Split.behavior");
    tt_refused("\"invert\":false", "\"invert\":true", NULL, "Split.invert");
    tt_refused("\"add_prefix_space\":false", "\"add_prefix_space\":true", NULL, "add_prefix_space is true");
    tt_refused("\"decoder\":{\"type\":\"ByteLevel\"", "\"decoder\":{\"type\":\"Metaspace\"", NULL, "decoder: expected ByteLevel, got \"Metaspace\"");
    tt_refused("\"post_processor\":null", "\"post_processor\":{\"type\":\"TemplateProcessing\"}", NULL, "post_processor");
    tt_refused("\"truncation\":null", "\"truncation\":{\"max_length\":8}", NULL, "truncation");
    tt_refused("\"byte_fallback\":false", "\"byte_fallback\":true", NULL, "byte_fallback is true");
    tt_refused("\"dropout\":null", "\"dropout\":0.1", NULL, "dropout");
    tt_refused("\"continuing_subword_prefix\":null", "\"continuing_subword_prefix\":\"##\"", NULL, "continuing_subword_prefix");
    tt_refused("[\"o\",\"m\"]", "[\"o\",\"zq\"]", NULL, "token \"zq\" is not in the vocab");
    tt_refused("[\"o\",\"m\"]", "[\"q\",\"z\"]", NULL, "merged token \"q\"\"z\" is not in the vocab");
    tt_refused("[\"o\",\"m\"]", "[\"o\",\"m\",\"x\"]", NULL, "model.merges[243]");
    tt_refused("[\"o\",\"m\"]", "\"o  m\"", NULL, "one space");
    tt_refused("\"!\":0,", "", NULL, "lacks the single-byte token for byte 0x21");
    tt_refused("\"!\":0,", "\"!\":0,\"中\":7,", NULL, "is not spelled in the byte-level alphabet");
    tt_refused("\"!\":0,", "\"!\":0,\"qq\":1,", NULL, "gives id 1 to both");
    tt_refused("\"lstrip\":false", "\"lstrip\":true", NULL, "lstrip is true");
    tt_refused("{\"id\":501,\"content\":\"<|im_start|>\"", "{\"id\":501,\"content\":\"<|endoftext|>\"", NULL,
               "has id 501 here and id 500 earlier");
    tt_refused("{\"id\":501,", "{\"id\":5,", NULL, "which the vocab gives to");
    tt_refused("{\"id\":501,", "{\"id\":-1,", NULL, "added_tokens[1].id");
    // tokenizer_config.json: a conflicting content or flag for an id, a bad key
    tt_refused("\"type\":\"NFC\"", "\"type\":\"NFC\"", "{\"added_tokens_decoder\":{\"500\":{\"content\":\"<|x|>\",\"special\":true}}}",
               "id 500 is \"<|x|>\" here but \"<|endoftext|>\" in tiny");
    tt_refused("\"type\":\"NFC\"", "\"type\":\"NFC\"", "{\"added_tokens_decoder\":{\"x1\":{\"content\":\"<a>\"}}}",
               "key \"x1\" is not an id");
    // not JSON at all
    tok t;
    CHECK(tok_load_mem(&t, "{\"model\":", 9, NULL, 0, "cut", NULL, &e) != 0 && strstr(e.msg, "invalid JSON"), "%s", e.msg);
    CHECK(tok_load(&t, "/nonexistent/tokenizer.json", NULL, &e) != 0 && strstr(e.msg, "cannot open"), "%s", e.msg);
}

// The tiny tokenizer with its merges rewritten from ["a","b"] pairs to "a b" strings (both
// encodings must give the same tokenizer). The merges array ends the file ("...]]}}"): it is
// re-serialized with the JSON writer and the rest of the text kept as it is.
static void tt_string_merges(const char *golden) {
    static char buf[1 << 16], arr[1 << 15];
    js_doc d;
    moet_err e;
    const char *m = strstr(tt_tiny, "\"merges\":[");
    CHECK(m && tt_tiny_len > 3 && !memcmp(tt_tiny + tt_tiny_len - 3, "]}}", 3), "tiny ends with its merges");
    if (!m || js_load_doc(&d, tt_tiny, tt_tiny_len, "tiny", &e)) return;
    const js_node *mg = js_get(&d, js_get(&d, js_root(&d), "model"), "merges");
    js_writer w;
    js_w_init(&w, arr, sizeof arr);
    js_w_arr(&w);
    int pairs = 0;
    for (const js_node *pr = js_first(mg); pairs < (int)mg->len; pr = js_next(&d, pr), pairs++) {
        const js_node *x = js_first(pr), *y = js_next(&d, x);
        char ab[256];
        MOET_ASSERT(x->len + y->len + 1 < sizeof ab, "merge length");
        memcpy(ab, x->str, x->len);
        ab[x->len] = ' ';
        memcpy(ab + x->len + 1, y->str, y->len);
        js_w_strn(&w, ab, x->len + 1 + y->len);
    }
    js_w_end_arr(&w);
    MOET_ASSERT(!w.overflow, "merges buffer");
    size_t pre = (size_t)(m - tt_tiny) + strlen("\"merges\":"), o = 0;
    memcpy(buf, tt_tiny, pre);
    o = pre;
    memcpy(buf + o, arr, w.len);
    o += w.len;
    memcpy(buf + o, "}}", 2);
    o += 2;
    js_free_doc(&d);
    CHECK(pairs == 244, "rewrote %d merges (the file has 244)", pairs);
    tok t;
    if (tok_load_mem(&t, buf, o, NULL, 0, "tiny (string merges)", NULL, &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    int held = 0;
    tt_goldens(&t, golden, "tiny, merges as strings", &held);
    tok_free(&t);
}

// ---- added tokens

static void tt_added(void) {
    tok t;
    moet_err e;
    // the tiny tokenizer plus config-only tokens: overlapping contents for leftmost-longest,
    // one special (skipped by skip_special decoding), one not
    const char *cfg =
        "{\"added_tokens_decoder\":{"
        "\"500\":{\"content\":\"<|endoftext|>\",\"special\":true,\"normalized\":false},"
        "\"504\":{\"content\":\"</think>\",\"special\":true,\"normalized\":true},"
        "\"507\":{\"content\":\"<x>\",\"special\":false,\"normalized\":false},"
        "\"508\":{\"content\":\"<x>y\",\"special\":false,\"normalized\":false},"
        "\"509\":{\"content\":\"x><\",\"special\":false,\"normalized\":false},"
        "\"510\":{\"content\":\"<|audio_start|>\",\"special\":true,\"normalized\":false},"
        "\"511\":{\"content\":\"A\\u030a\",\"special\":false,\"normalized\":true},"
        "\"512\":{\"content\":\"o\\u030a\",\"special\":false,\"normalized\":false}}}";
    if (tok_load_mem(&t, tt_tiny, tt_tiny_len, cfg, strlen(cfg), "tiny", "config", &e)) {
        CHECK(0, "%s", e.msg);
        return;
    }
    CHECK(t.n_added == 7 + 6, "added tokens united by id: %u", t.n_added);
    // 504 "</think>" (special = false in tokenizer.json) is repeated in the config as special:
    // the config's flags win
    CHECK(tok_is_special(&t, 504), "the config's special flag wins");
    CHECK(tok_find(&t, "<|audio_start|>", 15) == 510 && tok_is_special(&t, 510), "config-only special token");
    CHECK(tok_find(&t, "<x>y", 4) == 508 && !tok_is_special(&t, 508), "config-only plain token");
    CHECK(tok_find(&t, "<|im_end|>", 10) == 502 && tok_is_special(&t, 502), "tokenizer.json special token");
    CHECK(tok_find(&t, "<think>", 7) == 503 && !tok_is_special(&t, 503), "<think> is not special");
    CHECK(tok_find(&t, "<nope>", 6) == -1, "absent");
    // single bytes: the ids GPT-2's byte order gives ('!' = 0 ... 'z' = 89), as in the goldens ("a" -> 64)
    CHECK(tok_find(&t, "z", 1) == 89 && tok_find(&t, "a", 1) == 64, "vocab lookup by bytes");
    // "z<x>y<x>x><": at 1 both "<x>" and "<x>y" match: the longest wins; then "<x>" at 5,
    // then "x><" at 8
    long n = tt_encode(&t, "z<x>y<x>x><", 11, &e);
    int32_t want1[] = {89, 508, 507, 509};
    CHECK(n == 4 && !memcmp(tt_ids, want1, sizeof want1), "leftmost-longest: n=%ld", n);
    // "x><x><x>": "x><" at 0 wins over the longer "<x>" at 2 (leftmost first), again at 3,
    // then "x" and ">" are plain pieces (byte ids 87 and 29 in GPT-2 order: '!' = 0)
    n = tt_encode(&t, "x><x><x>", 8, &e);
    int32_t want1b[] = {509, 509, 87, 29};
    CHECK(n == 4 && !memcmp(tt_ids, want1b, sizeof want1b), "leftmost first: n=%ld", n);
    // an added token inside a word splits it; special tokens too
    n = tt_encode(&t, "a<|audio_start|>a", 17, &e);
    int32_t want2[] = {64, 510, 64};
    CHECK(n == 3 && !memcmp(tt_ids, want2, sizeof want2), "added inside a word: n=%ld", n);
    // decoding: skip_special drops 500..502 and 510, keeps <think> and the plain ones
    int32_t ids[] = {510, 64, 508, 500, 503, 502};
    size_t len;
    const char *all = "<|audio_start|>a<x>y<|endoftext|><think><|im_end|>";
    CHECK(tok_decode(&t, ids, 6, 0, tt_text, sizeof tt_text, &len, &e) == 0 && len == strlen(all) &&
          !memcmp(tt_text, all, len), "decode all: %.*s", (int)len, tt_text);
    CHECK(tok_decode(&t, ids, 6, 1, tt_text, sizeof tt_text, &len, &e) == 0 && len == 12 &&
          !memcmp(tt_text, "a<x>y<think>", len), "decode skipping special: %.*s", (int)len, tt_text);
    int held = 0;
    CHECK(tt_stream_ok(&t, ids, 6, 1, "a<x>y<think>", 12, &held), "stream skipping special");
    // "<think>" is normalized = true in tiny: matched in the normalized text
    n = tt_encode(&t, "<think>", 7, &e);
    CHECK(n == 1 && tt_ids[0] == 503, "normalized added token alone");
    // a normalized token is matched by its NFC form (content "A" U+030A -> U+00C5), so both
    // spellings of the text find it; 512, not normalized, only matches its exact bytes
    n = tt_encode(&t, "\xC3\x85", 2, &e);
    CHECK(n == 1 && tt_ids[0] == 511, "normalized token, composed text: n=%ld", n);
    n = tt_encode(&t, "A\xCC\x8A", 3, &e);
    CHECK(n == 1 && tt_ids[0] == 511, "normalized token, decomposed text: n=%ld", n);
    n = tt_encode(&t, "o\xCC\x8A", 3, &e);
    CHECK(n == 1 && tt_ids[0] == 512, "raw token with decomposed content: n=%ld", n);
    tok_free(&t);

    // decode errors: an id past the end, a gap, a negative one
    if (tt_load(&t, "tests/fixtures/tok/tiny-tokenizer.json", NULL)) return;
    int32_t bad[] = {64, 507};
    CHECK(tok_decode(&t, bad, 2, 0, tt_text, sizeof tt_text, &len, &e) != 0 && strstr(e.msg, "ids[1] = 507 is not in the vocabulary"),
          "%s", e.msg);
    bad[1] = -3;
    CHECK(tok_decode(&t, bad, 2, 0, tt_text, sizeof tt_text, &len, &e) != 0, "negative id");
    tok_stream st;
    tok_stream_init(&st, 0);
    static char piece[3 * (MOET_MAX_TOKEN_BYTES + 4)];
    CHECK(tok_decode_stream(&t, &st, 9999, piece, sizeof piece, &len, &e) != 0 && strstr(e.msg, "9999"), "%s", e.msg);
    tok_free(&t);
}

// ---- the streaming decoder on bytes cut anywhere

static void tt_stream_bytes(void) {
    // single-byte tokens of the tiny vocab: feed the UTF-8 of "aé中😀" one byte per token
    tok t;
    if (tt_load(&t, "tests/fixtures/tok/tiny-tokenizer.json", NULL)) return;
    const uint8_t text[] = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
    int32_t ids[16];
    size_t n = sizeof text - 1;
    for (size_t i = 0; i < n; i++) ids[i] = t.byte_id[text[i]];
    tok_stream st;
    tok_stream_init(&st, 0);
    static char piece[3 * (MOET_MAX_TOKEN_BYTES + 4)];
    size_t got[16], k;
    moet_err e;
    for (size_t i = 0; i < n; i++) {
        tok_decode_stream(&t, &st, ids[i], piece, sizeof piece, &k, &e);
        got[i] = k;
    }
    // characters come out whole, when their last byte arrives
    size_t want[] = {1, 0, 2, 0, 0, 3, 0, 0, 0, 4};
    CHECK(!memcmp(got, want, sizeof want), "held back until complete");
    // ill-formed bytes become U+FFFD per maximal subpart, as from_utf8_lossy:
    // E4 B8 'a' -> FFFD a ; F0 9F 98 F0 9F 98 80 -> FFFD 😀 ; C0 -> FFFD ; ED A0 -> FFFD FFFD ;
    // a truncated tail E4 -> FFFD at the flush
    const uint8_t bad[] = "\xE4\xB8" "a" "\xF0\x9F\x98\xF0\x9F\x98\x80" "\xC0" "\xED\xA0" "\xE4";
    size_t nb = sizeof bad - 1;
    for (size_t i = 0; i < nb; i++) ids[i] = t.byte_id[bad[i]];
    size_t len;
    CHECK(tok_decode(&t, ids, nb, 0, tt_text, sizeof tt_text, &len, &e) == 0, "%s", e.msg);
    const char *lossy = "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD" "\xF0\x9F\x98\x80" "\xEF\xBF\xBD" "\xEF\xBF\xBD\xEF\xBF\xBD" "\xEF\xBF\xBD";
    CHECK(len == strlen(lossy) && !memcmp(tt_text, lossy, len), "lossy decode: %zu bytes", len);
    int held = 0;
    CHECK(tt_stream_ok(&t, ids, nb, 0, lossy, strlen(lossy), &held), "stream of ill-formed bytes");
    // capacity: the exact size works, one byte less is an error
    CHECK(tok_decode(&t, ids, nb, 0, tt_text, len, &k, &e) == 0 && k == len, "exact capacity");
    CHECK(tok_decode(&t, ids, nb, 0, tt_text, len - 1, &k, &e) != 0 && strstr(e.msg, "output capacity"), "%s", e.msg);
    tok_free(&t);
}

// ---- NFC: the UCD's NormalizationTest.txt (NFC lines) and every other code point

static void tt_nfc_one(const uint32_t *cp, size_t n, uint8_t *out, size_t *len) {
    static uint8_t in[256];
    static uint32_t cps[512], tmp[512];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += js_utf8_put(cp[i], in + k);
    MOET_ASSERT(uni_nfc(in, k, cps, tmp, out, 256, len) == 0, "nfc");
}

static size_t tt_parse_cps(const char *s, uint32_t *out) {
    size_t n = 0;
    char *end;
    for (;;) {
        unsigned long v = strtoul(s, &end, 16);
        if (end == s) return n;
        out[n++] = (uint32_t)v;
        s = end;
    }
}

static int tt_nfc_eq(const uint32_t *in, size_t n, const uint32_t *want, size_t nw) {
    uint8_t out[256], w[256];
    size_t len, wl = 0;
    tt_nfc_one(in, n, out, &len);
    for (size_t i = 0; i < nw; i++) wl += js_utf8_put(want[i], w + wl);
    return len == wl && !memcmp(out, w, len);
}

static void tt_nfc(void) {
    size_t len;
    char *all = tt_read("tests/fixtures/unicode/nfc_tests.txt", &len);
    if (!all) return;
    static uint8_t part1[0x110000];
    int part = -1, lines = 0, bad = 0;
    for (char *line = all; line < all + len;) {
        char *nl = memchr(line, '\n', (size_t)(all + len - line));
        if (nl) *nl = 0;
        if (!strncmp(line, "@Part", 5)) part = atoi(line + 5);
        else if (*line) {
            uint32_t c[5][32];
            size_t n[5];
            char *f = line;
            for (int i = 0; i < 5; i++) {
                char *semi = strchr(f, ';');
                if (semi) *semi = 0;
                n[i] = tt_parse_cps(f, c[i]);
                f = semi ? semi + 1 : f + strlen(f);
            }
            if (part == 1) part1[c[0][0]] = 1;
            // NFC(c1) = NFC(c2) = NFC(c3) = c2 ; NFC(c4) = NFC(c5) = c4
            int ok = tt_nfc_eq(c[0], n[0], c[1], n[1]) && tt_nfc_eq(c[1], n[1], c[1], n[1]) &&
                     tt_nfc_eq(c[2], n[2], c[1], n[1]) && tt_nfc_eq(c[3], n[3], c[3], n[3]) &&
                     tt_nfc_eq(c[4], n[4], c[3], n[3]);
            if (!ok && bad++ < 5) fprintf(stderr, "  NormalizationTest line %d (Part %d) fails\n", lines + 1, part);
            lines++;
        }
        line = nl ? nl + 1 : all + len;
    }
    CHECK(lines > 4000 && bad == 0, "NormalizationTest NFC: %d of %d lines fail", bad, lines);
    // every code point not listed in Part 1 is its own NFC (the test file's own statement)
    int odd = 0;
    for (uint32_t c = 0; c < 0x110000; c++) {
        if ((c >= 0xD800 && c <= 0xDFFF) || part1[c]) continue;
        if (!tt_nfc_eq(&c, 1, &c, 1) && odd++ < 5) fprintf(stderr, "  NFC(U+%04X) is not itself\n", c);
    }
    CHECK(odd == 0, "%d code points outside Part 1 change under NFC", odd);
    arena_sys_free(all, len + 1);

    // the quick check never says "already NFC" for text that NFC changes (on the test lines'
    // decomposed forms), and says so for plain ASCII
    uint8_t s[] = "e\xCC\x81";   // e + U+0301
    CHECK(!uni_nfc_quick(s, 3), "quick check on a decomposed e-acute");
    CHECK(uni_nfc_quick((const uint8_t *)"plain ASCII", 11), "quick check on ASCII");
}

// ---- piece boundaries of the Split regex, derived by hand from the pattern

// Pieces of s as "|"-joined text, e.g. "a| b".
static const char *tt_pieces(const char *s, int qwen35) {
    static char out[1024];
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        size_t j = tok_split_next((const uint8_t *)s, n, i, qwen35);
        if (i) out[o++] = '|';
        memcpy(out + o, s + i, j - i);
        o += j - i;
        i = j;
    }
    out[o] = 0;
    return out;
}

static void tt_split(void) {
    static const struct { const char *text, *pieces; int qwen35; } cases[] = {
        // contractions come first and fold case; U+017F (long s) folds to s
        {"I'm you'LL it'S 'Ve", "I|'m| you|'LL| it|'S| '|Ve", 0},
        {"'\xC5\xBFx", "'\xC5\xBF|x", 0},
        // an apostrophe not starting a contraction joins the letters after it (2nd alternative)
        {"'x", "'x", 0},
        // digits one at a time; a space before a digit stands alone (\s+ on one space)
        {"a 12", "a| |1|2", 0},
        // whitespace before a letter: all but the last space; that space joins the word
        {"a   b", "a|  | b", 0},
        // trailing whitespace run: whole (\s+(?!\S) at the end of the text)
        {"a   ", "a|   ", 0},
        // newlines: \s*[\r\n]+ ends after the last CR/LF of the run, then the rest of the run
        {"a \n \n  b", "a| \n \n| | b", 0},
        {"x\r\n\r\ny", "x|\r\n\r\n|y", 0},
        // punctuation run with an optional leading space, taking trailing newlines
        {"a ...\n\nb", "a| ...\n\n|b", 0},
        // a tab before a letter is the optional [^\r\n\p{L}\p{N}] of the letter alternative
        {"\tif", "\tif", 0},
        // U+0301 (a mark) is no letter for Qwen2: it is the optional prefix of the next word;
        // Qwen3.5 keeps it in the word
        {"e\xCC\x81x", "e|\xCC\x81x", 0},
        {"e\xCC\x81.", "e|\xCC\x81.", 0},
        {"e\xCC\x81.", "e\xCC\x81|.", 1},
        {"e\xCC\x81x", "e\xCC\x81x", 1},
        // Devanagari: virama U+094D and vowel sign U+0947 are marks
        {"\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
         "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87", 1},
        // U+00A0 is \s: a no-break space before a word behaves like a space
        {"a\xC2\xA0\xC2\xA0" "b", "a|\xC2\xA0|\xC2\xA0" "b", 0},
        // U+0085 (NEL) is White_Space but not [\r\n]: before a word it is its optional prefix;
        // before a digit it stands alone (\s+), with no line-break alternative
        {"a\xC2\x85" "b", "a|\xC2\x85" "b", 0},
        {"a\xC2\x85" "1", "a|\xC2\x85|1", 0},
        {"a\xC2\x85\n1", "a|\xC2\x85\n|1", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = tt_pieces(cases[i].text, cases[i].qwen35);
        CHECK(!strcmp(got, cases[i].pieces), "split case %zu: got \"%s\"", i, got);
    }
}

// golden_pieces_*.jsonl: the Split pieces of each (NFC) text, from @huggingface/tokenizers
static void tt_pieces_file(const char *golden, int qwen35, const char *name) {
    size_t len;
    char *all = tt_read(golden, &len);
    if (!all) return;
    int cases = 0, bad = 0;
    for (char *line = all; line < all + len;) {
        char *nl = memchr(line, '\n', (size_t)(all + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(all + len - line);
        js_doc d;
        moet_err e;
        if (ll && !js_load_doc(&d, line, ll, golden, &e)) {
            const js_node *text = js_get(&d, js_root(&d), "text"), *pieces = js_get(&d, js_root(&d), "pieces");
            const uint8_t *s = (const uint8_t *)text->str;
            size_t i = 0;
            int ok = 1;
            const js_node *p = js_first(pieces);
            for (uint32_t k = 0; k < pieces->len; k++, p = js_next(&d, p)) {
                size_t j = i < text->len ? tok_split_next(s, text->len, i, qwen35) : i;
                if (j - i != p->len || memcmp(s + i, p->str, p->len)) { ok = 0; break; }
                i = j;
            }
            ok = ok && i == text->len;
            if (!ok && bad++ < 3) {
                char b[256];
                fprintf(stderr, "  %s case %d: pieces of %s differ\n", name, cases + 1, tok_show(text->str, text->len, b));
            }
            cases++;
            js_free_doc(&d);
        } else if (ll) {
            CHECK(0, "%s: %s", golden, e.msg);
            break;
        }
        line += ll + 1;
    }
    CHECK(cases > 100 && bad == 0, "%s: %d of %d cases split differently", name, bad, cases);
    arena_sys_free(all, len + 1);
}

// ---- encode errors and capacities

static void tt_limits(void) {
    tok t;
    moet_err e;
    if (tt_load(&t, "tests/fixtures/tok/tiny-tokenizer.json", NULL)) return;
    size_t n;
    CHECK(tok_encode(&t, &tt_scr, "ab\xFF", 3, tt_ids, 10, &n, &e) != 0 && strstr(e.msg, "not valid UTF-8 at byte 2"), "%s", e.msg);
    // "Hello world" is 2 ids in the tiny golden: capacity 2 works, 1 does not
    CHECK(tok_encode(&t, &tt_scr, "Hello world", 11, tt_ids, 2, &n, &e) == 0 && n == 2, "exact output capacity");
    CHECK(tok_encode(&t, &tt_scr, "Hello world", 11, tt_ids, 1, &n, &e) != 0 && strstr(e.msg, "more than 1 token ids"), "%s", e.msg);
    CHECK(tok_encode(&t, &tt_scr, "<|im_end|>", 10, tt_ids, 0, &n, &e) != 0, "no room for an added token");
    // a text longer than the scratch
    tok_scratch small;
    arena mem;
    CHECK(tok_scratch_init(&small, &mem, 8, &e) == 0, "%s", e.msg);
    CHECK(tok_encode(&t, &small, "123456789", 9, tt_ids, 100, &n, &e) != 0 && strstr(e.msg, "more than the 8"), "%s", e.msg);
    // NFC that grows past the scratch: U+0958 (3 bytes) is excluded from composition and stays
    // two code points (U+0915 U+093C, 6 bytes)
    CHECK(tok_encode(&t, &small, "\xE0\xA5\x98\xE0\xA5\x98", 6, tt_ids, 100, &n, &e) != 0 && strstr(e.msg, "NFC form"), "%s", e.msg);
    arena_release(&mem);
    // empty text
    CHECK(tok_encode(&t, &tt_scr, "", 0, tt_ids, 0, &n, &e) == 0 && n == 0, "empty text");
    tok_free(&t);
}

// ---- the demo model's tokenizer: special ids, and the prompts in its golden.safetensors

static void tt_demo(void) {
    char path[1024];
    const char *cfg = "tests/fixtures/demo/tokenizer_config.json";
    snprintf(path, sizeof path, "tests/fixtures/demo/tokenizer.json");
    tok t;
    if (tt_load(&t, path, cfg)) return;
    // ids and flags as the file lists them (read here with the JSON reader)
    size_t len;
    char *text = tt_read(path, &len);
    js_doc d;
    moet_err e;
    if (!text || js_load_doc(&d, text, len, path, &e)) { CHECK(0, "demo tokenizer.json"); return; }
    const js_node *added = js_get(&d, js_root(&d), "added_tokens");
    int n = 0, ok = 1;
    for (const js_node *a = js_first(added); n < (int)added->len; a = js_next(&d, a), n++) {
        const js_node *c = js_get(&d, a, "content");
        int64_t id = js_get(&d, a, "id")->i64;
        int special = js_get(&d, a, "special")->type == JS_TRUE;
        if (tok_find(&t, c->str, c->len) != id || tok_is_special(&t, (int32_t)id) != special) ok = 0;
    }
    CHECK(n == 7 && ok, "demo added tokens: %d, ids and flags %s", n, ok ? "match" : "differ");
    // README: <|endoftext|> <|im_start|> <|im_end|> special; generation_config eos = 4088, 4086
    CHECK(tok_find(&t, "<|im_end|>", 10) == 4088 && tok_find(&t, "<|endoftext|>", 13) == 4086 &&
          tok_find(&t, "<|im_start|>", 12) == 4087 && tok_find(&t, "<think>", 7) == 4089, "demo special ids");
    js_free_doc(&d);
    arena_sys_free(text, len + 1);

    // golden.safetensors: prompt<i>.ids, the templated prompts (README: the Qwen3.6 template
    // with enable_thinking = false) of its three questions, tokenized by transformers
    static const char *q[3] = {"What does numpy.linalg.solve do?", "Explain torch.nn.functional.softmax.",
                               "How do I use json.dumps?"};
    snprintf(path, sizeof path, "tests/fixtures/demo_golden.safetensors");
    char *st = tt_read(path, &len);
    if (!st || len < 8) { tok_free(&t); return; }
    uint64_t hl;
    memcpy(&hl, st, 8);
    if (hl > len - 8 || js_load_doc(&d, st + 8, (size_t)hl, path, &e)) { CHECK(0, "golden.safetensors header"); tok_free(&t); return; }
    for (int i = 0; i < 3; i++) {
        char name[32], prompt[512];
        snprintf(name, sizeof name, "prompt%d.ids", i);
        const js_node *ten = js_get(&d, js_root(&d), name);
        const js_node *offs = js_get(&d, ten, "data_offsets");
        CHECK(ten && js_str_is(js_get(&d, ten, "dtype"), "I32") && offs, "%s in golden.safetensors", name);
        if (!ten || !offs) continue;
        int64_t b0 = js_at(&d, offs, 0)->i64, b1 = js_at(&d, offs, 1)->i64;
        size_t nw = (size_t)(b1 - b0) / 4;
        int32_t want[512];
        MOET_ASSERT(nw <= 512 && 8 + hl + (uint64_t)b1 <= len, "golden tensor");
        memcpy(want, st + 8 + hl + b0, nw * 4);
        int pl = snprintf(prompt, sizeof prompt,
                          "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", q[i]);
        long got = tt_encode(&t, prompt, (size_t)pl, &e);
        int same = got == (long)nw && !memcmp(tt_ids, want, nw * 4);
        CHECK(same, "demo prompt %d: ids differ from golden.safetensors", i);
        if (!same) { tt_print_ids("want", want, nw); if (got > 0) tt_print_ids("got ", tt_ids, (size_t)got); }
    }
    js_free_doc(&d);
    arena_sys_free(st, len + 1);
    tok_free(&t);
}

// ---- `moet tokenize` (the binary ./build.sh test builds first)

static void tt_cli(void) {
    FILE *f = fopen("build/tok_cli_in.txt", "w");
    CHECK(f != NULL, "temp file");
    if (!f) return;
    // line 2 is not JSON, line 3 is not a string: errors naming lines 2 and 3 in their places,
    // so output line i answers input line i
    fputs("\"Hello world\"\n{bad\n[1,2]\n\"a\\n\\n<|im_end|>\"\n", f);
    fclose(f);
    int rc = system("./moet tokenize --tokenizer tests/fixtures/tok/tiny-tokenizer.json < build/tok_cli_in.txt "
                    "> build/tok_cli_out.txt 2> build/tok_cli_err.txt");
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "exit status %d (want 1: bad lines)", WEXITSTATUS(rc));
    size_t len;
    char *out = tt_read("build/tok_cli_out.txt", &len);
    // golden_tiny: "Hello world" = [326,324], "a" = [64], "\n\n" = 446 (in "<think>\n\n</think>\n\n")
    const char *want_ids = "[326,324]\n"
                           "{\"error\":{\"line\":2,\"message\":\"invalid JSON: object key must be a string at byte 1\"}}\n"
                           "{\"error\":{\"line\":3,\"message\":\"expected a JSON string, got array\"}}\n"
                           "[64,446,502]\n";
    CHECK(out && len == strlen(want_ids) && !memcmp(out, want_ids, len), "stdout: %.*s", out ? (int)len : 0, out ? out : "");
    if (out) arena_sys_free(out, len + 1);
    char *err = tt_read("build/tok_cli_err.txt", &len);
    CHECK(err && strstr(err, "line 2: invalid JSON") && strstr(err, "line 3: expected a JSON string"), "stderr: %s", err ? err : "");
    if (err) arena_sys_free(err, len + 1);

    f = fopen("build/tok_cli_in.txt", "w");
    fputs("[326,324]\n[502,64,9999]\n[500,326,502]\n", f);
    fclose(f);
    rc = system("./moet tokenize --tokenizer tests/fixtures/tok/tiny-tokenizer.json --decode --skip-special "
                "< build/tok_cli_in.txt > build/tok_cli_out.txt 2> build/tok_cli_err.txt");
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "decode exit status %d", WEXITSTATUS(rc));
    out = tt_read("build/tok_cli_out.txt", &len);
    const char *want = "\"Hello world\"\n"
                       "{\"error\":{\"line\":2,\"message\":\"element 2: id 9999 is not in the vocabulary (ids 0..506)\"}}\n"
                       "\"Hello\"\n";
    CHECK(out && len == strlen(want) && !memcmp(out, want, len), "decode stdout: %.*s", out ? (int)len : 0, out ? out : "");
    if (out) arena_sys_free(out, len + 1);
    err = tt_read("build/tok_cli_err.txt", &len);
    CHECK(err && strstr(err, "line 2: element 2: id 9999 is not in the vocabulary"), "stderr: %s", err ? err : "");
    if (err) arena_sys_free(err, len + 1);
    rc = system("./moet tokenize </dev/null >/dev/null 2>&1");
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "no --tokenizer: exit %d", WEXITSTATUS(rc));
}

// The Qwen3.5 pre-tokenizer regex on the Qwen3 vocabulary: qwen3-tokenizer.json with its Split
// regex replaced by Qwen3.5's (which adds \p{M} to the letters), written to `out`. The goldens of
// golden_*qwen35*.jsonl were made by Hugging Face's tokenizers from exactly this file
// (tests/gen_tok_goldens.js derives it the same way). Returns out, or NULL.
static const char *tt_derive_qwen35(const char *qwen3, const char *out) {
    static const char from[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
    static const char to[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
    size_t len;
    char *src = tt_read(qwen3, &len);
    if (!src) return NULL;
    const char *at = strstr(src, from);
    int once = at && !strstr(at + 1, from);
    CHECK(once, "%s: the Qwen3 Split regex occurs once", qwen3);
    FILE *f = once ? fopen(out, "wb") : NULL;
    CHECK(!once || f, "%s: %s", out, strerror(errno));
    int ok = f && fwrite(src, 1, (size_t)(at - src), f) == (size_t)(at - src) && fwrite(to, 1, sizeof to - 1, f) == sizeof to - 1;
    size_t tail = len - (size_t)(at - src) - (sizeof from - 1);
    ok = ok && fwrite(at + sizeof from - 1, 1, tail, f) == tail;
    if (f) ok = !fclose(f) && ok;
    CHECK(!f || ok, "%s: written", out);
    arena_sys_free(src, len + 1);
    return ok ? out : NULL;
}

int main(void) {
    moet_err e;
    MOET_ASSERT(tok_scratch_init(&tt_scr, &tt_scr_mem, TT_SCRATCH, &e) == 0, "%s", e.msg);
    tt_tiny = tt_read("tests/fixtures/tok/tiny-tokenizer.json", &tt_tiny_len);
    if (!tt_tiny) return check_report("test_tokenizer");

    const char *qwen3 = "tests/fixtures/tok/qwen3-tokenizer.json";
    const char *qwen35 = tt_derive_qwen35(qwen3, "build/qwen35-regex-on-qwen3.json");
    if (!qwen35) return check_report("test_tokenizer");
    tt_golden_file("tests/fixtures/tok/tiny-tokenizer.json", NULL, "tests/fixtures/tok/golden_tiny.jsonl", "golden_tiny");
    // the emoji, Thai and Devanagari cases split characters across tokens: the holdback runs
    CHECK(tt_golden_file(qwen3, NULL, "tests/fixtures/tok/golden_qwen3.jsonl", "golden_qwen3") > 0,
          "no character of golden_qwen3 was held back");
    tt_golden_file(qwen35, NULL, "tests/fixtures/tok/golden_qwen35-regex-on-qwen3.jsonl", "golden_qwen35");
    tt_golden_file("tests/fixtures/tok/tiny-tokenizer.json", NULL, "tests/fixtures/tok/golden_extra_tiny.jsonl", "golden_extra_tiny");
    tt_golden_file(qwen3, NULL, "tests/fixtures/tok/golden_extra_qwen3.jsonl", "golden_extra_qwen3");
    tt_golden_file(qwen35, NULL, "tests/fixtures/tok/golden_extra_qwen35.jsonl", "golden_extra_qwen35");
    tt_pieces_file("tests/fixtures/tok/golden_pieces_qwen3.jsonl", 0, "golden_pieces_qwen3");
    tt_pieces_file("tests/fixtures/tok/golden_pieces_qwen35.jsonl", 1, "golden_pieces_qwen35");
    tt_string_merges("tests/fixtures/tok/golden_tiny.jsonl");
    tt_refusals();
    tt_added();
    tt_stream_bytes();
    tt_split();
    tt_nfc();
    tt_limits();
    tt_demo();
    tt_cli();
    arena_sys_free(tt_tiny, tt_tiny_len + 1);
    arena_release(&tt_scr_mem);
    return check_report("test_tokenizer");
}
