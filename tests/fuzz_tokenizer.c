// tests/fuzz_tokenizer.c — libFuzzer target for the tokenizer (./build.sh fuzz).
//
// An input starting with 'T' is text: the rest is encoded with the tiny tokenizer (Qwen3.5
// regex, tests/fixtures/tok/tiny-tokenizer.json) and with the same file on the Qwen2 regex.
// Well-formed UTF-8 must encode; decoding the ids must give back exactly the NFC form of the
// text (so the text itself when it is NFC), token-by-token streaming must give the same bytes
// and only complete characters, and the Split pieces must tile the text. Ill-formed UTF-8 must
// be refused. Any other input is a tokenizer.json: loading either refuses it with a message
// or gives a tokenizer that must round-trip a few texts up to NFC (an added token with
// normalized = true decodes to its content, which NFC maps to the text it matched). Every
// mapping taken by a load must be given back (mmap_count.h).
#include "mmap_count.h"
#include "../moet.c"

#define FZ_MAX_TEXT 4096                 // scratch size; texts are cut to a third (NFC may triple)
#define FZ_OUT (16 * FZ_MAX_TEXT + 64)   // decoded bytes (and their NFC) the checks hold

static tok fz_tok[2];          // tiny (Qwen3.5 regex), tiny on the Qwen2 regex
static tok_scratch fz_scr;
static arena fz_scr_mem;
static long fz_base_maps;      // mappings alive between inputs

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    moet_err e;
    size_t len;
    char *json = arena_read_small("tests/fixtures/tok/tiny-tokenizer.json", 1 << 20, &len, &e);
    MOET_ASSERT(json, "run from the repository root: %s", e.msg);
    MOET_ASSERT(tok_load_mem(&fz_tok[0], json, len, NULL, 0, "tiny", NULL, &e) == 0, "%s", e.msg);
    // the same file with the Qwen2 regex (JSON-escaped as in the file)
    static const char from[] = "[\\\\p{L}\\\\p{M}]+", to[] = "\\\\p{L}+";
    static const char from2[] = "[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]", to2[] = "[^\\\\s\\\\p{L}\\\\p{N}]";
    static char buf[1 << 16];
    char *a = strstr(json, from), *b = strstr(json, from2);
    MOET_ASSERT(a && b && a < b && len < sizeof buf, "tiny regex");
    size_t o = 0;
    memcpy(buf + o, json, (size_t)(a - json)); o += (size_t)(a - json);
    memcpy(buf + o, to, strlen(to)); o += strlen(to);
    char *after = a + strlen(from);
    memcpy(buf + o, after, (size_t)(b - after)); o += (size_t)(b - after);
    memcpy(buf + o, to2, strlen(to2)); o += strlen(to2);
    after = b + strlen(from2);
    memcpy(buf + o, after, len - (size_t)(after - json)); o += len - (size_t)(after - json);
    MOET_ASSERT(tok_load_mem(&fz_tok[1], buf, o, NULL, 0, "tiny-qwen2", NULL, &e) == 0, "%s", e.msg);
    MOET_ASSERT(fz_tok[1].regex == TOK_RE_QWEN2 && fz_tok[0].regex == TOK_RE_QWEN35, "regex variants");
    arena_sys_free(json, len + 1);
    MOET_ASSERT(tok_scratch_init(&fz_scr, &fz_scr_mem, FZ_MAX_TEXT, &e) == 0, "%s", e.msg);
    fz_base_maps = mc_live;
    return 0;
}

// decode(encode(text)) against NFC(text); with exact = 0 both sides are NFC'd first.
static void fz_round_trip(const tok *t, const uint8_t *text, size_t n, int exact) {
    static int32_t ids[4 * FZ_MAX_TEXT + 16];
    static char out[FZ_OUT], piece[3 * (MOET_MAX_TOKEN_BYTES + 4)];
    static uint8_t want[3 * FZ_OUT], got[3 * FZ_OUT];
    static uint32_t cps[2 * FZ_OUT], tmp[2 * FZ_OUT];   // >= uni_nfc_cps_cap(FZ_OUT) each
    moet_err e;
    size_t k, len, wl, gl;
    if (uni_valid_prefix(text, n) != n) {
        MOET_ASSERT(tok_encode(t, &fz_scr, (const char *)text, n, ids, sizeof ids / sizeof ids[0], &k, &e) != 0,
                    "ill-formed UTF-8 was encoded");
        return;
    }
    MOET_ASSERT(tok_encode(t, &fz_scr, (const char *)text, n, ids, sizeof ids / sizeof ids[0], &k, &e) == 0, "%s", e.msg);
    MOET_ASSERT(tok_decode(t, ids, k, 0, out, sizeof out, &len, &e) == 0, "%s", e.msg);
    MOET_ASSERT(uni_nfc(text, n, cps, tmp, want, sizeof want, &wl) == 0, "NFC of the text");
    if (exact) {
        MOET_ASSERT(len == wl && !memcmp(out, want, wl), "decode(encode(text)) is not NFC(text): %zu vs %zu bytes", len, wl);
    } else {
        MOET_ASSERT(uni_nfc((const uint8_t *)out, len, cps, tmp, got, sizeof got, &gl) == 0, "NFC");
        MOET_ASSERT(gl == wl && !memcmp(got, want, wl), "NFC(decode(encode(text))) is not NFC(text)");
    }
    // streaming: complete characters only, same bytes
    tok_stream st;
    tok_stream_init(&st, 0);
    size_t o = 0;
    for (size_t i = 0; i <= k; i++) {
        size_t m;
        if (i < k) MOET_ASSERT(tok_decode_stream(t, &st, ids[i], piece, sizeof piece, &m, &e) == 0, "%s", e.msg);
        else m = tok_stream_flush(&st, piece);
        MOET_ASSERT(uni_valid_prefix((const uint8_t *)piece, m) == m, "stream emitted an incomplete character");
        MOET_ASSERT(m <= len - o && !memcmp(out + o, piece, m), "stream differs from decode");
        o += m;
    }
    MOET_ASSERT(o == len, "stream is shorter than decode");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 1 && data[0] == 'T') {
        const uint8_t *text = data + 1;
        size_t n = size - 1 > FZ_MAX_TEXT / 3 ? FZ_MAX_TEXT / 3 : size - 1;
        for (int v = 0; v < 2; v++) {
            fz_round_trip(&fz_tok[v], text, n, 1);
            // the pieces tile the text, each ends on a character boundary
            if (uni_valid_prefix(text, n) == n)
                for (size_t i = 0; i < n;) {
                    size_t j = tok_split_next(text, n, i, fz_tok[v].regex == TOK_RE_QWEN35);
                    MOET_ASSERT(j > i && j <= n && (j == n || (text[j] & 0xC0) != 0x80), "piece [%zu, %zu)", i, j);
                    i = j;
                }
        }
        return 0;
    }
    tok t;
    moet_err e;
    e.msg[0] = 0;
    if (tok_load_mem(&t, (const char *)data, size, NULL, 0, "fuzz", NULL, &e)) {
        MOET_ASSERT(e.msg[0], "refused without a message");
        MOET_ASSERT(mc_live == fz_base_maps, "a refused load kept %ld mappings", mc_live - fz_base_maps);
        return 0;
    }
    static const char *texts[] = {"Hello, world! It's 12:34\r\n\r\n", "  x \t\xC3\xA9 e\xCC\x81 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80",
                                  "<|im_start|>user\n<think>hi</think><|im_end|>", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8 A\xCC\x8A"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) fz_round_trip(&t, (const uint8_t *)texts[i], strlen(texts[i]), 0);
    tok_free(&t);
    MOET_ASSERT(mc_live == fz_base_maps, "tok_free kept %ld mappings", mc_live - fz_base_maps);
    return 0;
}
