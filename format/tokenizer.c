// format/tokenizer.c — the Qwen byte-level BPE tokenizer (tokenizer.json), encode and decode.
//
// What is accepted (CHECKPOINT.md §C), and everything else is refused with a message naming it:
//   model        BPE, byte-level vocabulary (every token spelled in the GPT-2 byte alphabet, all
//                256 single bytes present), merges as "a b" strings or ["a", "b"] pairs,
//                no dropout, no subword prefix/suffix, no byte fallback;
//   normalizer   NFC (or none);
//   pre_tokenizer Sequence[Split(Regex R, Isolated, invert false), ByteLevel(no prefix space,
//                use_regex false)] where R is exactly the Qwen2/3 pattern or the Qwen3.5/3.6 one
//                (with \p{M}); each is implemented below by a hand-written matcher;
//   post_processor none or ByteLevel (it adds no tokens); decoder ByteLevel;
//   added tokens from tokenizer.json `added_tokens` and tokenizer_config.json
//                `added_tokens_decoder`, united by id (the config's special / normalized
//                flags win; two contents for one id, or two ids for one content, are errors).
//
// Encoding follows Hugging Face tokenizers (encode with add_special_tokens = false):
//   1. added tokens with normalized = false are found in the raw text, leftmost then longest;
//   2. each stretch between them is NFC-normalized, then split on added tokens with
//      normalized = true (matched against their NFC form);
//   3. each remaining stretch is cut into pieces by the Split regex;
//   4. each piece's bytes become single-byte symbols, merged by BPE: repeatedly the adjacent
//      pair with the lowest merge rank, the leftmost one on a tie.
// Decoding maps each id to its bytes (an added token to its content), skipping special added
// tokens on request, and turns bytes into text the way Rust's String::from_utf8_lossy does
// (each maximal ill-formed subsequence becomes one U+FFFD). The streaming decoder does the same
// one token at a time, holding back an incomplete UTF-8 sequence until it completes.
//
// Memory: tok_load builds everything into one arena sized by a measure pass; encode works in a
// caller-provided tok_scratch (carved once) and writes ids into a caller buffer of fixed
// capacity. Nothing is allocated per call; a loaded tok is read-only and may be shared by threads
// that each own a tok_scratch.

enum { TOK_RE_QWEN2 = 1, TOK_RE_QWEN35 = 2 };
enum { TOK_GAP = 0, TOK_VOCAB = 1, TOK_ADDED = 2 };

// The two Split patterns, as tokenizer.json holds them once its JSON escapes are decoded.
static const char tok_regex_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char tok_regex_qwen35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

_Static_assert(MOET_MAX_VOCAB <= (1 << 20), "a merge key packs two ids in 20 bits each");
_Static_assert(MOET_MAX_TOKEN_BYTES <= 65535, "tok_entry.len is 16 bits");

typedef struct {
    uint32_t off;      // into tok.bytes: what decoding this id yields
    uint16_t len;      // bytes (0 only for a gap)
    uint8_t kind;      // TOK_GAP (no token has this id), TOK_VOCAB, TOK_ADDED
    uint8_t special;   // an added token with special = true: dropped by skip_special decoding
} tok_entry;

typedef struct {
    uint64_t key;      // (left << 20 | right) + 1; 0 marks an empty slot
    uint32_t rank;     // index in model.merges: a lower rank merges first
    int32_t id;        // the merged token
} tok_merge;

typedef struct {
    int32_t id;
    uint32_t off, len;     // into tok.bytes: the string matched in the text (the content, or its
                           // NFC form for a normalized token)
    uint8_t normalized;    // matched in the normalized text (step 2) instead of the raw text
} tok_added;

typedef struct {
    uint32_t n;            // tokens in this set
    uint32_t start[257];   // order[start[b] .. start[b + 1]) are the tokens whose match begins
                           // with byte b, longest first (so the first hit is the longest)
    uint32_t *order;       // [n] indices into tok.added
} tok_added_set;

typedef struct {
    arena mem;                  // everything below points into it
    int32_t n_ids;              // ids are 0 .. n_ids - 1; some may be gaps
    uint32_t n_vocab;           // model.vocab entries
    tok_entry *entries;         // [n_ids]
    uint8_t *bytes;             // token bytes and added-token match strings
    int32_t *vocab_slots;       // [vocab_mask + 1] vocab ids by hash of their bytes, -1 = empty
    uint32_t vocab_mask;
    tok_merge *merges;          // [merge_mask + 1] open addressing on (left, right)
    uint32_t merge_mask;
    uint32_t n_merges;          // distinct pairs
    int32_t byte_id[256];       // the single-byte token of each byte
    tok_added *added;           // [n_added]
    uint32_t n_added, n_special;
    tok_added_set raw, norm;    // added tokens matched in the raw / the normalized text
    uint16_t byte_cp[256];      // GPT-2 byte-level alphabet: byte -> code point
    int16_t cp_byte[0x144];     // and back (-1: not in the alphabet)
    int regex;                  // TOK_RE_*
    int nfc;                    // normalizer is NFC
    int ignore_merges;          // a piece found whole in the vocab is not merged
    uint32_t max_token_bytes;   // longest decoded token
} tok;

// Work space of tok_encode, sized for texts of up to max_text bytes (and NFC forms of up to
// max_text bytes). One per thread.
typedef struct {
    size_t max_text;
    uint8_t *nfc;         // [max_text] NFC form of a stretch of text
    uint32_t *cps;        // [uni_nfc_cps_cap(max_text)] decomposed code points
    uint32_t *cps_tmp;    // [uni_nfc_cps_cap(max_text)] reordering work space
    // BPE of a piece longer than TOK_BPE_SMALL bytes: symbols as a linked list over byte
    // positions, pairs in an indexed min-heap ordered by (rank, position). These arrays share
    // their memory with cps / cps_tmp (never in use at the same time).
    int32_t *sym;         // [max_text] token id of the symbol starting at a position
    int32_t *prev, *next; // [max_text] neighbour symbol positions (-1: none)
    uint32_t *rank;       // [max_text] rank of the pair starting at a position (UINT32_MAX: none)
    int32_t *merged;      // [max_text] the token that pair merges into
    int32_t *heap;        // [max_text] positions, a binary min-heap on (rank, position)
    int32_t *heap_at;     // [max_text] where a position sits in heap (-1: absent)
} tok_scratch;

#define TOK_BPE_SMALL 64   // pieces up to this many bytes merge in arrays on the stack

// ==========================================================================================
// hashing
// ==========================================================================================

static inline uint32_t tok_hash64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return (uint32_t)k;
}

static inline uint32_t tok_hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;   // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return tok_hash64(h);
}

static uint32_t tok_pow2_slots(size_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n) cap <<= 1;   // load factor at most 1/2
    return cap;
}

static inline int tok_merge_get(const tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 20 | (uint32_t)b) + 1;
    for (uint32_t h = tok_hash64(key) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const tok_merge *m = &t->merges[h];
        if (m->key == key) { *rank = m->rank; *id = m->id; return 1; }
        if (!m->key) return 0;
    }
}

// Id of the vocab token whose bytes are s[0..n), or -1.
static int32_t tok_vocab_find(const tok *t, const uint8_t *s, size_t n) {
    for (uint32_t h = tok_hash_bytes(s, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slots[h];
        if (id < 0) return -1;
        const tok_entry *en = &t->entries[id];
        if (en->len == n && !memcmp(t->bytes + en->off, s, n)) return id;
    }
}

// ==========================================================================================
// loading
// ==========================================================================================

static void tok_byte_map(tok *t) {
    for (int c = 0; c < 0x144; c++) t->cp_byte[c] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        t->byte_cp[b] = (uint16_t)(printable ? b : 256 + extra++);
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

// Bytes spelled by a byte-level token string s[0..n) (UTF-8), written to out (may be NULL
// to only count); -1 when a character is outside the byte alphabet.
static long tok_unbyte(const tok *t, const char *s, size_t n, uint8_t *out) {
    long k = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = uni_dec((const uint8_t *)s + i, &len);
        if (cp >= 0x144 || t->cp_byte[cp] < 0) return -1;
        if (out) out[k] = (uint8_t)t->cp_byte[cp];
        k++;
        i += len;
    }
    return k;
}

// A string for messages: at most 60 bytes of s, non-printing bytes as \xNN.
static const char *tok_show(const char *s, size_t n, char buf[256]) {
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n && o < 240; i++) {
        uint8_t c = (uint8_t)s[i];
        if (i == 60) { o += (size_t)snprintf(buf + o, 256 - o, "..."); break; }
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, 256 - o, "\\x%02x", c);
    }
    buf[o++] = '"';
    buf[o] = 0;
    return buf;
}

// Absent or null.
static int tok_is_none(const js_node *n) { return !n || n->type == JS_NULL; }

static int tok_flag(const js_doc *d, const js_node *obj, const char *key, int def, int *out,
                    const char *what, const char *where, moet_err *e) {
    const js_node *v = js_get(d, obj, key);
    if (!v) { *out = def; return 0; }
    if (v->type != JS_TRUE && v->type != JS_FALSE)
        return err_set(e, "%s: %s.%s: expected true or false, got %s", what, where, key, js_type_name(v));
    *out = v->type == JS_TRUE;
    return 0;
}

// Requires obj[key] to be absent, null, or (when allow_false) false.
static int tok_require_off(const js_doc *d, const js_node *obj, const char *key, const char *what,
                           const char *where, const char *why, moet_err *e) {
    const js_node *v = js_get(d, obj, key);
    if (tok_is_none(v) || v->type == JS_FALSE) return 0;
    if (v->type == JS_STR && v->len == 0) return 0;
    return err_set(e, "%s: %s.%s is %s; %s", what, where, key,
                   v->type == JS_TRUE ? "true" : js_type_name(v), why);
}

static int tok_type_is(const js_doc *d, const js_node *obj, const char *type) {
    return obj && obj->type == JS_OBJ && js_str_is(js_get(d, obj, "type"), type);
}

static const char *tok_type_of(const js_doc *d, const js_node *obj, char buf[256]) {
    if (!obj || obj->type != JS_OBJ) return js_type_name(obj);
    const js_node *ty = js_get(d, obj, "type");
    if (!ty || ty->type != JS_STR) return "an object without a \"type\" string";
    return tok_show(ty->str, ty->len, buf);
}

// Checks everything but the model and the added tokens; sets t->regex and t->nfc.
static int tok_check_pipeline(tok *t, const js_doc *d, const js_node *root, const char *what, moet_err *e) {
    char b[256];
    const js_node *n = js_get(d, root, "normalizer");
    if (tok_is_none(n)) t->nfc = 0;
    else if (tok_type_is(d, n, "NFC")) t->nfc = 1;
    else return err_set(e, "%s: normalizer: expected {\"type\": \"NFC\"} or null, got %s", what, tok_type_of(d, n, b));

    const js_node *pt = js_get(d, root, "pre_tokenizer");
    if (!tok_type_is(d, pt, "Sequence"))
        return err_set(e, "%s: pre_tokenizer: expected a Sequence of Split and ByteLevel, got %s", what,
                       tok_type_of(d, pt, b));
    const js_node *seq = js_get(d, pt, "pretokenizers");
    if (!seq || seq->type != JS_ARR || seq->len != 2)
        return err_set(e, "%s: pre_tokenizer.pretokenizers: expected an array of 2 (Split, ByteLevel), got %s of %u",
                       what, js_type_name(seq), seq && seq->type == JS_ARR ? seq->len : 0);
    const js_node *split = js_first(seq), *bl = js_next(d, split);
    if (!tok_type_is(d, split, "Split"))
        return err_set(e, "%s: pre_tokenizer.pretokenizers[0]: expected Split, got %s", what, tok_type_of(d, split, b));
    const js_node *pat = js_get(d, split, "pattern");
    const js_node *re = js_get(d, pat, "Regex");
    if (!re || re->type != JS_STR)
        return err_set(e, "%s: pre_tokenizer Split.pattern: expected {\"Regex\": string}, got %s", what,
                       pat && pat->type == JS_OBJ && js_get(d, pat, "String") ? "a String pattern" : js_type_name(pat));
    if (re->len == sizeof tok_regex_qwen2 - 1 && !memcmp(re->str, tok_regex_qwen2, re->len)) t->regex = TOK_RE_QWEN2;
    else if (re->len == sizeof tok_regex_qwen35 - 1 && !memcmp(re->str, tok_regex_qwen35, re->len)) t->regex = TOK_RE_QWEN35;
    else
        return err_set(e, "%s: pre_tokenizer Split regex %s is not one of the two supported patterns "
                       "(the Qwen2/Qwen3 one, or the Qwen3.5/3.6 one with \\p{M})", what, tok_show(re->str, re->len, b));
    if (!js_str_is(js_get(d, split, "behavior"), "Isolated"))
        return err_set(e, "%s: pre_tokenizer Split.behavior: expected \"Isolated\"", what);
    int inv = 0;   // set by tok_flag on success; GCC cannot see that through err_set when inlined
    if (tok_flag(d, split, "invert", 0, &inv, what, "pre_tokenizer Split", e)) return -1;
    if (inv) return err_set(e, "%s: pre_tokenizer Split.invert: expected false, got true", what);
    if (!tok_type_is(d, bl, "ByteLevel"))
        return err_set(e, "%s: pre_tokenizer.pretokenizers[1]: expected ByteLevel, got %s", what, tok_type_of(d, bl, b));
    if (tok_require_off(d, bl, "add_prefix_space", what, "pre_tokenizer ByteLevel", "a prefix space is not supported", e) ||
        tok_require_off(d, bl, "use_regex", what, "pre_tokenizer ByteLevel", "the GPT-2 regex is not supported after Split", e))
        return -1;

    const js_node *pp = js_get(d, root, "post_processor");
    if (!tok_is_none(pp) && !tok_type_is(d, pp, "ByteLevel"))
        return err_set(e, "%s: post_processor: expected ByteLevel or null, got %s", what, tok_type_of(d, pp, b));
    const js_node *dec = js_get(d, root, "decoder");
    if (!tok_type_is(d, dec, "ByteLevel"))
        return err_set(e, "%s: decoder: expected ByteLevel, got %s", what, tok_type_of(d, dec, b));
    if (!tok_is_none(js_get(d, root, "truncation")))
        return err_set(e, "%s: truncation is set; moet does not truncate (expected null)", what);
    if (!tok_is_none(js_get(d, root, "padding")))
        return err_set(e, "%s: padding is set; moet does not pad (expected null)", what);
    return 0;
}

static int tok_check_model(tok *t, const js_doc *d, const js_node *m, const char *what, moet_err *e) {
    char b[256];
    if (!tok_type_is(d, m, "BPE")) return err_set(e, "%s: model.type: expected \"BPE\", got %s", what, tok_type_of(d, m, b));
    const js_node *dropout = js_get(d, m, "dropout");
    double p;
    if (!tok_is_none(dropout) && (js_num(dropout, &p) || p != 0))
        return err_set(e, "%s: model.dropout: expected null (BPE dropout is not supported)", what);
    const js_node *unk = js_get(d, m, "unk_token");
    if (!tok_is_none(unk) && unk->type != JS_STR)
        return err_set(e, "%s: model.unk_token: expected a string or null, got %s", what, js_type_name(unk));
    if (tok_require_off(d, m, "continuing_subword_prefix", what, "model", "subword prefixes are not supported", e) ||
        tok_require_off(d, m, "end_of_word_suffix", what, "model", "word suffixes are not supported", e) ||
        tok_require_off(d, m, "byte_fallback", what, "model", "byte fallback is not supported", e))
        return -1;
    int fuse;
    if (tok_flag(d, m, "fuse_unk", 0, &fuse, what, "model", e)) return -1;   // inert: no unknown bytes
    if (tok_flag(d, m, "ignore_merges", 0, &t->ignore_merges, what, "model", e)) return -1;
    const js_node *v = js_get(d, m, "vocab"), *mg = js_get(d, m, "merges");
    if (!v || v->type != JS_OBJ) return err_set(e, "%s: model.vocab: expected an object, got %s", what, js_type_name(v));
    if (!mg || mg->type != JS_ARR) return err_set(e, "%s: model.merges: expected an array, got %s", what, js_type_name(mg));
    if (v->len == 0) return err_set(e, "%s: model.vocab is empty", what);
    if (v->len > MOET_MAX_VOCAB) return err_set(e, "%s: model.vocab has %u tokens, more than the limit of %d", what, v->len, MOET_MAX_VOCAB);
    if (mg->len > MOET_MAX_MERGES) return err_set(e, "%s: model.merges has %u entries, more than the limit of %d", what, mg->len, MOET_MAX_MERGES);
    return 0;
}

// One added token as read from either file.
typedef struct {
    int64_t id;
    const char *content;
    uint32_t len;
    int special, normalized;
} tok_added_in;

// Reads one added-token object (fields of tokenizer.json added_tokens or of a
// tokenizer_config.json added_tokens_decoder value).
static int tok_read_added(const js_doc *d, const js_node *o, tok_added_in *a, const char *what, const char *where,
                          moet_err *e) {
    if (!o || o->type != JS_OBJ) return err_set(e, "%s: %s: expected an object, got %s", what, where, js_type_name(o));
    const js_node *c = js_get(d, o, "content");
    if (!c || c->type != JS_STR) return err_set(e, "%s: %s.content: expected a string, got %s", what, where, js_type_name(c));
    if (c->len == 0) return err_set(e, "%s: %s.content is empty", what, where);
    if (c->len > MOET_MAX_TOKEN_BYTES)
        return err_set(e, "%s: %s.content has %u bytes, more than the limit of %d", what, where, c->len, MOET_MAX_TOKEN_BYTES);
    a->content = c->str;
    a->len = c->len;
    if (tok_flag(d, o, "special", 0, &a->special, what, where, e)) return -1;
    // Hugging Face's default for a token without the field: normalized unless special
    if (tok_flag(d, o, "normalized", !a->special, &a->normalized, what, where, e)) return -1;
    static const char *const off[] = {"lstrip", "rstrip", "single_word"};
    for (int i = 0; i < 3; i++) {
        int v = 0;
        if (tok_flag(d, o, off[i], 0, &v, what, where, e)) return -1;
        if (v) {
            char b[256];
            return err_set(e, "%s: %s (%s): %s is true; only exact-match added tokens are supported", what, where,
                           tok_show(a->content, a->len, b), off[i]);
        }
    }
    return 0;
}

// Sizes of everything tok_carve lays out.
typedef struct {
    uint32_t n_ids, n_vocab, n_merge_slots, n_vocab_slots, n_added;
    size_t bytes;
} tok_plan;

static void tok_carve(tok *t, arena *a, const tok_plan *p) {
    t->entries = arena_take(a, (size_t)p->n_ids * sizeof(tok_entry), 64, "token table");
    t->vocab_slots = arena_take(a, (size_t)p->n_vocab_slots * sizeof(int32_t), 64, "vocab hash");
    t->merges = arena_take(a, (size_t)p->n_merge_slots * sizeof(tok_merge), 64, "merge hash");
    t->added = arena_take(a, (size_t)p->n_added * sizeof(tok_added), 64, "added tokens");
    t->raw.order = arena_take(a, (size_t)p->n_added * sizeof(uint32_t), 64, "added token index");
    t->norm.order = arena_take(a, (size_t)p->n_added * sizeof(uint32_t), 64, "added token index");
    t->bytes = arena_take(a, p->bytes, 64, "token bytes");
}

// Sorts a set's order[] by (first byte, length descending) and fills start[].
static void tok_index_added(tok *t, tok_added_set *s) {
    for (uint32_t i = 1; i < s->n; i++) {   // insertion sort: at most MOET_MAX_ADDED_TOKENS, at boot
        uint32_t x = s->order[i];
        const tok_added *ax = &t->added[x];
        uint8_t bx = t->bytes[ax->off];
        uint32_t j = i;
        while (j > 0) {
            const tok_added *ay = &t->added[s->order[j - 1]];
            uint8_t by = t->bytes[ay->off];
            if (by < bx || (by == bx && ay->len >= ax->len)) break;
            s->order[j] = s->order[j - 1];
            j--;
        }
        s->order[j] = x;
    }
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        s->start[b] = k;
        while (k < s->n && t->bytes[t->added[s->order[k]].off] == b) k++;
    }
    s->start[256] = k;
}

// NFC of an added token's content into out (for normalized tokens); returns its length.
// cps and tmp hold uni_nfc_cps_cap(MOET_MAX_TOKEN_BYTES) code points each.
static size_t tok_nfc_small(const char *s, size_t n, uint32_t *cps, uint32_t *tmp, uint8_t *out, size_t cap) {
    size_t len;
    if (uni_nfc_quick((const uint8_t *)s, n)) {
        MOET_ASSERT(n <= cap, "NFC buffer");
        memcpy(out, s, n);
        return n;
    }
    MOET_ASSERT(uni_nfc((const uint8_t *)s, n, cps, tmp, out, cap, &len) == 0, "NFC of an added token");
    return len;
}

// Id of an added-token entry: tokenizer.json carries it in "id", tokenizer_config.json in the key.
static int tok_added_id(const js_node *o_id, const js_node *key, int64_t *id, const char *what, const char *where,
                        moet_err *e) {
    if (key) {
        int64_t v = 0;
        if (key->len == 0 || key->len > 7) goto bad_key;
        for (uint32_t i = 0; i < key->len; i++) {
            if (key->str[i] < '0' || key->str[i] > '9') goto bad_key;
            v = v * 10 + (key->str[i] - '0');
        }
        if (v >= MOET_MAX_VOCAB) goto bad_key;
        *id = v;
        return 0;
    bad_key:;
        char b[256];
        return err_set(e, "%s: %s: key %s is not an id in [0, %d)", what, where, tok_show(key->str, key->len, b), MOET_MAX_VOCAB);
    }
    if (js_int(o_id, id) || *id < 0 || *id >= MOET_MAX_VOCAB)
        return err_set(e, "%s: %s.id: expected an integer in [0, %d), got %s", what, where, MOET_MAX_VOCAB, js_type_name(o_id));
    return 0;
}

// Work space of tok_build, released when it returns.
typedef struct {
    tok_added_in *in;      // [n] added tokens of both files, in reading order
    uint8_t *keep;         // [n] not a repeat of an earlier one
    int32_t *by_id;        // [slots] indices into in, hashed by id, -1 empty
    int32_t *by_content;   // [slots] the same, hashed by content
    uint32_t slots;
    uint32_t *cps, *tmp;   // [uni_nfc_cps_cap(MOET_MAX_TOKEN_BYTES)] NFC work space
} tok_work;

static void tok_carve_work(tok_work *w, arena *a, uint32_t n) {
    w->slots = tok_pow2_slots(n);
    w->in = arena_take(a, (size_t)n * sizeof *w->in, 64, "added token list");
    w->keep = arena_take(a, n, 64, "added token flags");
    w->by_id = arena_take(a, (size_t)w->slots * sizeof(int32_t), 64, "added ids");
    w->by_content = arena_take(a, (size_t)w->slots * sizeof(int32_t), 64, "added contents");
    w->cps = arena_take(a, uni_nfc_cps_cap(MOET_MAX_TOKEN_BYTES) * sizeof(uint32_t), 64, "NFC work space");
    w->tmp = arena_take(a, uni_nfc_cps_cap(MOET_MAX_TOKEN_BYTES) * sizeof(uint32_t), 64, "NFC work space");
}

// Reads, checks and de-duplicates the added tokens of both files into w (which has room for n).
static int tok_read_all_added(tok_work *w, const js_doc *d, const js_node *added, const js_doc *cd, const js_node *dec,
                              const char *what, const char *cwhat, int64_t *max_id, uint32_t *n_keep, moet_err *e) {
    uint32_t n_json = added ? added->len : 0, n_cfg = dec ? dec->len : 0;
    memset(w->by_id, 0xff, (size_t)w->slots * sizeof(int32_t));
    memset(w->by_content, 0xff, (size_t)w->slots * sizeof(int32_t));
    const js_node *o = added ? js_first(added) : NULL, *key = dec ? js_first(dec) : NULL;
    *n_keep = 0;
    for (uint32_t i = 0; i < n_json + n_cfg; i++) {
        tok_added_in *a = &w->in[i];
        char where[80], b[256], b2[256];
        const char *file = i < n_json ? what : cwhat;
        if (i < n_json) {
            snprintf(where, sizeof where, "added_tokens[%u]", i);
            if (tok_read_added(d, o, a, file, where, e) || tok_added_id(js_get(d, o, "id"), NULL, &a->id, file, where, e))
                return -1;
            o = js_next(d, o);
        } else {
            snprintf(where, sizeof where, "added_tokens_decoder[%s]", tok_show(key->str, key->len, b));
            const js_node *v = js_next(cd, key);
            if (tok_read_added(cd, v, a, file, where, e) || tok_added_id(NULL, key, &a->id, file, where, e)) return -1;
            key = js_next(cd, v);
        }
        if (a->id > *max_id) *max_id = a->id;
        // union by id: a repeat must agree on everything
        uint32_t h;
        int32_t j = -1;
        for (h = tok_hash64((uint64_t)a->id) & (w->slots - 1); w->by_id[h] >= 0; h = (h + 1) & (w->slots - 1))
            if (w->in[w->by_id[h]].id == a->id) { j = w->by_id[h]; break; }
        if (j >= 0) {
            tok_added_in *x = &w->in[j];
            if (x->len != a->len || memcmp(x->content, a->content, a->len))
                return err_set(e, "%s: %s: id %" PRId64 " is %s here but %s in %s", file, where, a->id,
                               tok_show(a->content, a->len, b), tok_show(x->content, x->len, b2), (uint32_t)j < n_json ? what : cwhat);
            // the same token again: the later flags win, as when transformers adds the
            // tokenizer_config.json tokens to the loaded tokenizer.json
            x->special = a->special;
            x->normalized = a->normalized;
            w->keep[i] = 0;
            continue;
        }
        w->by_id[h] = (int32_t)i;
        uint32_t hc = tok_hash_bytes((const uint8_t *)a->content, a->len) & (w->slots - 1);
        for (; w->by_content[hc] >= 0; hc = (hc + 1) & (w->slots - 1)) {
            const tok_added_in *x = &w->in[w->by_content[hc]];
            if (x->len == a->len && !memcmp(x->content, a->content, a->len))
                return err_set(e, "%s: %s: content %s has id %" PRId64 " here and id %" PRId64 " earlier", file, where,
                               tok_show(a->content, a->len, b), a->id, x->id);
        }
        w->by_content[hc] = (int32_t)i;
        w->keep[i] = 1;
        (*n_keep)++;
    }
    return 0;
}

// Builds t from the parsed tokenizer.json (d) and tokenizer_config.json (cd, or NULL).
// what / cwhat name the files in messages. On failure t holds nothing (tok_free is harmless).
static int tok_build(tok *t, const js_doc *d, const js_doc *cd, const char *what, const char *cwhat, moet_err *e) {
    memset(t, 0, sizeof *t);
    tok_byte_map(t);
    const js_node *root = js_root(d);
    if (!root || root->type != JS_OBJ) return err_set(e, "%s: expected a JSON object at the top", what);
    if (tok_check_pipeline(t, d, root, what, e)) return -1;
    const js_node *model = js_get(d, root, "model");
    if (tok_check_model(t, d, model, what, e)) return -1;
    const js_node *vocab = js_get(d, model, "vocab"), *merges = js_get(d, model, "merges");
    char b[256], b2[256];

    // ---- validate and measure the vocab
    tok_plan p = {0};
    p.n_vocab = vocab->len;
    int64_t max_id = -1;
    const js_node *k = js_first(vocab);
    for (uint32_t i = 0; i < vocab->len; i++) {
        const js_node *v = js_next(d, k);
        int64_t id;
        if (js_int(v, &id) || id < 0 || id >= MOET_MAX_VOCAB)
            return err_set(e, "%s: model.vocab[%s]: expected an id in [0, %d), got %s", what, tok_show(k->str, k->len, b),
                           MOET_MAX_VOCAB, js_type_name(v));
        long nb = tok_unbyte(t, k->str, k->len, NULL);
        if (nb < 0)
            return err_set(e, "%s: model.vocab token %s (id %" PRId64 ") is not spelled in the byte-level alphabet", what,
                           tok_show(k->str, k->len, b), id);
        if (nb == 0) return err_set(e, "%s: model.vocab has an empty token (id %" PRId64 ")", what, id);
        if (nb > MOET_MAX_TOKEN_BYTES)
            return err_set(e, "%s: model.vocab token id %" PRId64 " has %ld bytes, more than the limit of %d", what, id, nb,
                           MOET_MAX_TOKEN_BYTES);
        p.bytes += (size_t)nb;
        if (id > max_id) max_id = id;
        k = js_next(d, v);
    }

    // ---- the added tokens of both files, in a work arena
    const js_node *added = js_get(d, root, "added_tokens"), *dec = NULL;
    if (tok_is_none(added)) added = NULL;
    else if (added->type != JS_ARR) return err_set(e, "%s: added_tokens: expected an array, got %s", what, js_type_name(added));
    if (cd) {
        const js_node *croot = js_root(cd);
        if (!croot || croot->type != JS_OBJ) return err_set(e, "%s: expected a JSON object at the top", cwhat);
        dec = js_get(cd, croot, "added_tokens_decoder");
        if (tok_is_none(dec)) dec = NULL;
        else if (dec->type != JS_OBJ)
            return err_set(e, "%s: added_tokens_decoder: expected an object, got %s", cwhat, js_type_name(dec));
    }
    uint64_t n_in = (uint64_t)(added ? added->len : 0) + (dec ? dec->len : 0);
    if (n_in > MOET_MAX_ADDED_TOKENS)
        return err_set(e, "%s: %" PRIu64 " added tokens, more than the limit of %d", what, n_in, MOET_MAX_ADDED_TOKENS);
    tok_work w = {0};
    arena wa;
    arena_plan wp = arena_plan_begin(&wa, "tokenizer load work space", ARENA_HOST, e);
    while (arena_plan_pass(&wp)) tok_carve_work(&w, wp.on, (uint32_t)n_in);
    if (wp.failed) return -1;
    uint32_t n_keep;
    if (tok_read_all_added(&w, d, added, cd, dec, what, cwhat, &max_id, &n_keep, e)) goto fail;
    for (uint32_t i = 0; i < n_in; i++)
        if (w.keep[i]) p.bytes += (size_t)w.in[i].len * (w.in[i].normalized && t->nfc ? 4 : 1);   // + NFC form, at most 3x

    // ---- plan, allocate, carve
    p.n_ids = (uint32_t)(max_id + 1);
    p.n_added = n_keep;
    p.n_vocab_slots = tok_pow2_slots(p.n_vocab);
    p.n_merge_slots = tok_pow2_slots(merges->len);
    arena_plan tp = arena_plan_begin(&t->mem, "tokenizer", ARENA_HOST, e);
    while (arena_plan_pass(&tp)) tok_carve(t, tp.on, &p);
    if (tp.failed) goto fail;
    t->n_ids = (int32_t)p.n_ids;
    t->n_vocab = p.n_vocab;
    memset(t->entries, 0, (size_t)p.n_ids * sizeof(tok_entry));
    memset(t->vocab_slots, 0xff, (size_t)p.n_vocab_slots * sizeof(int32_t));
    memset(t->merges, 0, (size_t)p.n_merge_slots * sizeof(tok_merge));
    t->vocab_mask = p.n_vocab_slots - 1;
    t->merge_mask = p.n_merge_slots - 1;

    // ---- vocab
    size_t off = 0;
    k = js_first(vocab);
    for (uint32_t i = 0; i < vocab->len; i++) {
        const js_node *v = js_next(d, k);
        int32_t id = (int32_t)v->i64;
        uint8_t *s = t->bytes + off;
        long nb = tok_unbyte(t, k->str, k->len, s);
        tok_entry *en = &t->entries[id];
        if (en->kind) {
            err_set(e, "%s: model.vocab gives id %d to both %s and %s", what, id,
                    tok_show((const char *)t->bytes + en->off, en->len, b), tok_show(k->str, k->len, b2));
            goto fail;
        }
        if (tok_vocab_find(t, s, (size_t)nb) >= 0) {
            err_set(e, "%s: model.vocab lists token %s twice", what, tok_show(k->str, k->len, b));
            goto fail;
        }
        *en = (tok_entry){(uint32_t)off, (uint16_t)nb, TOK_VOCAB, 0};
        uint32_t h = tok_hash_bytes(s, (size_t)nb) & t->vocab_mask;
        while (t->vocab_slots[h] >= 0) h = (h + 1) & t->vocab_mask;
        t->vocab_slots[h] = id;
        off += (size_t)nb;
        if ((uint32_t)nb > t->max_token_bytes) t->max_token_bytes = (uint32_t)nb;
        k = js_next(d, v);
    }
    for (int c = 0; c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        t->byte_id[c] = tok_vocab_find(t, &byte, 1);
        if (t->byte_id[c] < 0) {
            err_set(e, "%s: model.vocab lacks the single-byte token for byte 0x%02x; a byte-level vocab needs all 256", what, c);
            goto fail;
        }
    }

    // ---- merges: rank = position; a pair listed twice keeps its last rank (as Hugging Face's map does)
    const js_node *m = js_first(merges);
    for (uint32_t i = 0; i < merges->len; i++, m = js_next(d, m)) {
        const char *sa, *sb;
        size_t la, lb;
        if (m->type == JS_STR) {
            const char *sp = memchr(m->str, ' ', m->len);
            if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str))) {
                err_set(e, "%s: model.merges[%u] %s: expected two tokens separated by one space", what, i,
                        tok_show(m->str, m->len, b));
                goto fail;
            }
            sa = m->str;
            la = (size_t)(sp - m->str);
            sb = sp + 1;
            lb = m->len - la - 1;
        } else if (m->type == JS_ARR && m->len == 2 && js_first(m)->type == JS_STR && js_next(d, js_first(m))->type == JS_STR) {
            sa = js_first(m)->str;
            la = js_first(m)->len;
            sb = js_next(d, js_first(m))->str;
            lb = js_next(d, js_first(m))->len;
        } else {
            err_set(e, "%s: model.merges[%u]: expected \"a b\" or [\"a\", \"b\"], got %s", what, i, js_type_name(m));
            goto fail;
        }
        uint8_t ab[2 * MOET_MAX_TOKEN_BYTES];
        long na = tok_unbyte(t, sa, la, NULL), nb = tok_unbyte(t, sb, lb, NULL);
        int32_t ia = -1, ib = -1, iab = -1;
        if (na > 0 && na <= MOET_MAX_TOKEN_BYTES) ia = tok_vocab_find(t, ab, (size_t)tok_unbyte(t, sa, la, ab));
        if (nb > 0 && nb <= MOET_MAX_TOKEN_BYTES && ia >= 0) ib = tok_vocab_find(t, ab + na, (size_t)tok_unbyte(t, sb, lb, ab + na));
        if (ia < 0 || ib < 0) {
            err_set(e, "%s: model.merges[%u]: token %s is not in the vocab", what, i,
                    ia < 0 ? tok_show(sa, la, b) : tok_show(sb, lb, b));
            goto fail;
        }
        if (na + nb <= MOET_MAX_TOKEN_BYTES) iab = tok_vocab_find(t, ab, (size_t)(na + nb));
        if (iab < 0) {
            err_set(e, "%s: model.merges[%u]: the merged token %s%s is not in the vocab", what, i, tok_show(sa, la, b),
                    tok_show(sb, lb, b2));
            goto fail;
        }
        uint64_t key = ((uint64_t)(uint32_t)ia << 20 | (uint32_t)ib) + 1;
        uint32_t h = tok_hash64(key) & t->merge_mask;
        while (t->merges[h].key && t->merges[h].key != key) h = (h + 1) & t->merge_mask;
        if (!t->merges[h].key) t->n_merges++;
        t->merges[h] = (tok_merge){key, i, iab};
    }

    // ---- added tokens
    uint32_t j = 0;
    for (uint32_t i = 0; i < n_in; i++) {
        if (!w.keep[i]) continue;
        const tok_added_in *a = &w.in[i];
        tok_entry *en = &t->entries[a->id];
        if (en->kind == TOK_VOCAB && (en->len != a->len || memcmp(t->bytes + en->off, a->content, a->len))) {
            err_set(e, "%s: added token %s has id %" PRId64 ", which the vocab gives to %s", what,
                    tok_show(a->content, a->len, b), a->id, tok_show((const char *)t->bytes + en->off, en->len, b2));
            goto fail;
        }
        memcpy(t->bytes + off, a->content, a->len);
        *en = (tok_entry){(uint32_t)off, (uint16_t)a->len, TOK_ADDED, (uint8_t)a->special};
        tok_added *ad = &t->added[j];
        *ad = (tok_added){(int32_t)a->id, (uint32_t)off, a->len, (uint8_t)a->normalized};
        off += a->len;
        if (a->normalized && t->nfc) {   // matched by its NFC form
            ad->off = (uint32_t)off;
            ad->len = (uint32_t)tok_nfc_small(a->content, a->len, w.cps, w.tmp, t->bytes + off, 3 * (size_t)a->len);
            off += ad->len;
        }
        tok_added_set *set = a->normalized ? &t->norm : &t->raw;
        set->order[set->n++] = j;
        if (a->len > t->max_token_bytes) t->max_token_bytes = a->len;
        t->n_special += (uint32_t)a->special;
        j++;
    }
    t->n_added = j;
    MOET_ASSERT(off <= p.bytes, "token bytes %zu past the plan of %zu", off, p.bytes);
    tok_index_added(t, &t->raw);
    tok_index_added(t, &t->norm);
    arena_release(&wa);
    return 0;
fail:
    arena_release(&wa);
    arena_release(&t->mem);
    return -1;
}

static void tok_free(tok *t) {
    arena_release(&t->mem);
    memset(t, 0, sizeof *t);
}

// Loads from memory: json[0..len) is tokenizer.json, cfg[0..cfg_len) tokenizer_config.json
// (cfg NULL: none). what / cwhat name them in messages.
static int tok_load_mem(tok *t, const char *json, size_t len, const char *cfg, size_t cfg_len, const char *what,
                        const char *cwhat, moet_err *e) {
    js_doc d, cd;
    memset(t, 0, sizeof *t);
    if (js_load_doc(&d, json, len, what, e)) return -1;
    if (cfg && js_load_doc(&cd, cfg, cfg_len, cwhat, e)) {
        js_free_doc(&d);
        return -1;
    }
    int rc = tok_build(t, &d, cfg ? &cd : NULL, what, cwhat, e);
    js_free_doc(&d);
    if (cfg) js_free_doc(&cd);
    return rc;
}

// Loads tokenizer.json at path, and tokenizer_config.json at config_path unless that is NULL.
static int tok_load(tok *t, const char *path, const char *config_path, moet_err *e) {
    size_t len, cfg_len = 0;
    memset(t, 0, sizeof *t);
    char *json = arena_read_small(path, MOET_MAX_TOKENIZER_BYTES, &len, e);
    if (!json) return -1;
    char *cfg = NULL;
    if (config_path && !(cfg = arena_read_small(config_path, MOET_MAX_CONFIG_BYTES, &cfg_len, e))) {
        arena_sys_free(json, len + 1);
        return -1;
    }
    int rc = tok_load_mem(t, json, len, cfg, cfg_len, path, config_path, e);
    arena_sys_free(json, len + 1);
    if (cfg) arena_sys_free(cfg, cfg_len + 1);
    return rc;
}

// The tokenizer_config.json next to tokenizer.json `path`, written to out, when such a file
// exists; otherwise returns -1 and leaves out empty.
static int tok_config_beside(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    out[0] = 0;
    if (dir + sizeof "tokenizer_config.json" > cap) return -1;
    memcpy(out, path, dir);
    memcpy(out + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    struct stat st;
    if (stat(out, &st) != 0 || !S_ISREG(st.st_mode)) { out[0] = 0; return -1; }
    return 0;
}

// ---- lookups for the server

// Id of the added token whose content is exactly s[0..n), or else of the vocab token spelling
// those bytes; -1 when neither exists. (Linear in the added tokens: call it at boot.)
static int32_t tok_find(const tok *t, const char *s, size_t n) {
    for (uint32_t i = 0; i < t->n_added; i++) {
        const tok_entry *en = &t->entries[t->added[i].id];
        if (en->len == n && !memcmp(t->bytes + en->off, s, n)) return t->added[i].id;
    }
    return n ? tok_vocab_find(t, (const uint8_t *)s, n) : -1;
}

// 1 when id is an added token marked special (what skip_special decoding drops).
static int tok_is_special(const tok *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->entries[id].kind == TOK_ADDED && t->entries[id].special;
}

// ==========================================================================================
// the Split regex, by hand
// ==========================================================================================
//
// Both patterns are
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?LET+ | \p{N} | ' '?PUN+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
// with LET = \p{L} and PUN = [^\s\p{L}\p{N}] (Qwen2/3), or LET = [\p{L}\p{M}] and
// PUN = [^\s\p{L}\p{M}\p{N}] (Qwen3.5/3.6). Every character is matched by some alternative (a
// letter by the 2nd, a digit by the 3rd, whitespace by the last, anything else by the 4th, and
// in Qwen3.5 a mark by the 2nd), so the matches tile the text and each starts where the last
// ended. At a position the alternatives are tried in order (leftmost-first, as Oniguruma and
// the Rust regex crate do), each with its greedy-then-backtrack result:
//   - (?i:…) folds case with Unicode simple case folding, so 's' also matches U+017F (ſ);
//     no other character folds to one of s t r e v m l d;
//   - \s*[\r\n]+ ends after the last CR or LF of the whitespace run (if there is one);
//   - \s+(?!\S) takes the whole run when it ends the text, else all of it but its last
//     character, and fails on a single whitespace character followed by a non-space.
// \s is White_Space (what both engines use); \p{L}, \p{M}, \p{N} are the general categories.

static inline uint32_t tok_cp_at(const uint8_t *s, size_t i, uint8_t *cls, size_t *len) {
    static const uint8_t ascii[128] = {
        ['\t'] = UNI_WS, ['\n'] = UNI_WS, ['\v'] = UNI_WS, ['\f'] = UNI_WS, ['\r'] = UNI_WS, [' '] = UNI_WS,
        ['0'] = UNI_N, ['1'] = UNI_N, ['2'] = UNI_N, ['3'] = UNI_N, ['4'] = UNI_N,
        ['5'] = UNI_N, ['6'] = UNI_N, ['7'] = UNI_N, ['8'] = UNI_N, ['9'] = UNI_N,
        ['A'] = UNI_L, ['B'] = UNI_L, ['C'] = UNI_L, ['D'] = UNI_L, ['E'] = UNI_L, ['F'] = UNI_L, ['G'] = UNI_L,
        ['H'] = UNI_L, ['I'] = UNI_L, ['J'] = UNI_L, ['K'] = UNI_L, ['L'] = UNI_L, ['M'] = UNI_L, ['N'] = UNI_L,
        ['O'] = UNI_L, ['P'] = UNI_L, ['Q'] = UNI_L, ['R'] = UNI_L, ['S'] = UNI_L, ['T'] = UNI_L, ['U'] = UNI_L,
        ['V'] = UNI_L, ['W'] = UNI_L, ['X'] = UNI_L, ['Y'] = UNI_L, ['Z'] = UNI_L,
        ['a'] = UNI_L, ['b'] = UNI_L, ['c'] = UNI_L, ['d'] = UNI_L, ['e'] = UNI_L, ['f'] = UNI_L, ['g'] = UNI_L,
        ['h'] = UNI_L, ['i'] = UNI_L, ['j'] = UNI_L, ['k'] = UNI_L, ['l'] = UNI_L, ['m'] = UNI_L, ['n'] = UNI_L,
        ['o'] = UNI_L, ['p'] = UNI_L, ['q'] = UNI_L, ['r'] = UNI_L, ['s'] = UNI_L, ['t'] = UNI_L, ['u'] = UNI_L,
        ['v'] = UNI_L, ['w'] = UNI_L, ['x'] = UNI_L, ['y'] = UNI_L, ['z'] = UNI_L,
    };
    if (s[i] < 0x80) {
        *len = 1;
        *cls = ascii[s[i]];
        return s[i];
    }
    uint32_t cp = uni_dec(s + i, len);
    *cls = uni_props(cp);
    return cp;
}

// End of (?i:'s|'t|'re|'ve|'m|'ll|'d) when s[i] follows an apostrophe, else 0.
static size_t tok_contraction(const uint8_t *s, size_t n, size_t i) {
    uint8_t c = s[i] | 0x20;   // ASCII lower case (non-letters never compare equal below)
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 1;
    if (s[i] == 0xC5 && i + 1 < n && s[i + 1] == 0xBF) return i + 2;   // U+017F folds to 's'
    if (i + 1 < n) {
        uint8_t c2 = s[i + 1] | 0x20;
        if ((c == 'r' || c == 'v') && c2 == 'e') return i + 2;
        if (c == 'l' && c2 == 'l') return i + 2;
    }
    return 0;
}

// End of the match that starts at i < n (see above). qwen35: the \p{M} variant.
static size_t tok_split_next(const uint8_t *s, size_t n, size_t i, int qwen35) {
    const uint8_t let = qwen35 ? (UNI_L | UNI_M) : UNI_L;
    const uint8_t not_pun = UNI_WS | UNI_L | UNI_N | (qwen35 ? UNI_M : 0);
    uint8_t k0, k1 = 0, k;
    size_t l0, l1 = 0, l;
    uint32_t c0 = tok_cp_at(s, i, &k0, &l0);
    size_t i1 = i + l0, j;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c0 == '\'' && i1 < n && (j = tok_contraction(s, n, i1))) return j;
    if (i1 < n) tok_cp_at(s, i1, &k1, &l1);
    // [^\r\n\p{L}\p{N}]?LET+
    j = 0;
    if (c0 != '\r' && c0 != '\n' && !(k0 & (UNI_L | UNI_N)) && i1 < n && (k1 & let)) j = i1 + l1;
    else if (k0 & let) j = i1;
    if (j) {
        while (j < n) {
            tok_cp_at(s, j, &k, &l);
            if (!(k & let)) break;
            j += l;
        }
        return j;
    }
    // \p{N}
    if (k0 & UNI_N) return i1;
    // ' '?PUN+[\r\n]*
    if (c0 == ' ' && i1 < n && !(k1 & not_pun)) j = i1 + l1;
    else if (!(k0 & not_pun)) j = i1;
    if (j) {
        while (j < n) {
            tok_cp_at(s, j, &k, &l);
            if (k & not_pun) break;
            j += l;
        }
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    // whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
    MOET_ASSERT(k0 & UNI_WS, "U+%04X matched no alternative of the Split regex", c0);
    size_t last_nl = SIZE_MAX, last = i;
    j = i;
    while (j < n) {
        uint32_t c = tok_cp_at(s, j, &k, &l);
        if (!(k & UNI_WS)) break;
        if (c == '\r' || c == '\n') last_nl = j;
        last = j;
        j += l;
    }
    if (last_nl != SIZE_MAX) return last_nl + 1;
    if (j == n || last == i) return j;
    return last;
}

// ==========================================================================================
// BPE
// ==========================================================================================

typedef struct {
    int32_t *ids;
    size_t cap, n;
} tok_out;

// Heap order: (rank, position).
static inline int tok_heap_less(const tok_scratch *s, int32_t a, int32_t b) {
    return s->rank[a] < s->rank[b] || (s->rank[a] == s->rank[b] && a < b);
}

static void tok_heap_swap(tok_scratch *s, int32_t i, int32_t j) {
    int32_t a = s->heap[i], b = s->heap[j];
    s->heap[i] = b;
    s->heap[j] = a;
    s->heap_at[b] = i;
    s->heap_at[a] = j;
}

static void tok_heap_fix(tok_scratch *s, int32_t n, int32_t i) {
    while (i > 0 && tok_heap_less(s, s->heap[i], s->heap[(i - 1) / 2])) {
        tok_heap_swap(s, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        int32_t c = 2 * i + 1, best = i;
        if (c < n && tok_heap_less(s, s->heap[c], s->heap[best])) best = c;
        if (c + 1 < n && tok_heap_less(s, s->heap[c + 1], s->heap[best])) best = c + 1;
        if (best == i) return;
        tok_heap_swap(s, i, best);
        i = best;
    }
}

// Sets the pair starting at position p (with its current right neighbour) in the heap.
static void tok_heap_set(const tok *t, tok_scratch *s, int32_t *n, int32_t p) {
    uint32_t r = UINT32_MAX;
    int32_t m = -1;
    if (s->next[p] >= 0 && !tok_merge_get(t, s->sym[p], s->sym[s->next[p]], &r, &m)) r = UINT32_MAX;
    s->rank[p] = r;
    s->merged[p] = m;
    int32_t at = s->heap_at[p];
    if (r == UINT32_MAX) {
        if (at < 0) return;
        (*n)--;
        s->heap_at[p] = -1;
        if (at != *n) {
            s->heap[at] = s->heap[*n];
            s->heap_at[s->heap[at]] = at;
            tok_heap_fix(s, *n, at);
        }
        return;
    }
    if (at < 0) {
        at = (*n)++;
        s->heap[at] = p;
        s->heap_at[p] = at;
    }
    tok_heap_fix(s, *n, at);
}

static int tok_full(const tok_out *o, moet_err *e) {
    return err_set(e, "the text needs more than %zu token ids (the output capacity)", o->cap);
}

// BPE of a long piece w[0..n): the same merge order as the array version, in O(n log n).
static int tok_bpe_long(const tok *t, tok_scratch *s, const uint8_t *w, int32_t n, tok_out *o, moet_err *e) {
    for (int32_t i = 0; i < n; i++) {
        s->sym[i] = t->byte_id[w[i]];
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < n ? i + 1 : -1;
        s->heap_at[i] = -1;
    }
    int32_t hn = 0;
    for (int32_t i = 0; i < n; i++) tok_heap_set(t, s, &hn, i);
    while (hn > 0) {
        int32_t p = s->heap[0], q = s->next[p];
        s->sym[p] = s->merged[p];
        s->next[p] = s->next[q];
        if (s->next[q] >= 0) s->prev[s->next[q]] = p;
        s->next[q] = -1;
        tok_heap_set(t, s, &hn, q);   // q is gone: drop its pair
        tok_heap_set(t, s, &hn, p);
        if (s->prev[p] >= 0) tok_heap_set(t, s, &hn, s->prev[p]);
    }
    size_t count = 0;
    for (int32_t p = 0; p >= 0; p = s->next[p]) count++;
    if (count > o->cap - o->n) return tok_full(o, e);
    for (int32_t p = 0; p >= 0; p = s->next[p]) o->ids[o->n++] = s->sym[p];
    return 0;
}

// BPE of one piece w[0..n) (1 <= n <= max_text), appended to o. -1 when o is full.
static int tok_bpe(const tok *t, tok_scratch *s, const uint8_t *w, size_t n, tok_out *o, moet_err *e) {
    if (n == 1 || t->ignore_merges) {
        int32_t id = n == 1 ? t->byte_id[w[0]] : tok_vocab_find(t, w, n);
        if (id >= 0) {
            if (o->n == o->cap) return tok_full(o, e);
            o->ids[o->n++] = id;
            return 0;
        }
    }
    if (n > TOK_BPE_SMALL) return tok_bpe_long(t, s, w, (int32_t)n, o, e);
    // Short piece: symbols in an array, rank[i] / merged[i] describe the pair (sym[i], sym[i+1]).
    // Each step merges the first pair of lowest rank; only its two neighbours change.
    int32_t sym[TOK_BPE_SMALL], merged[TOK_BPE_SMALL];
    uint32_t rank[TOK_BPE_SMALL];
    size_t m = n;
    for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[w[i]];
    for (size_t i = 0; i + 1 < m; i++)
        if (!tok_merge_get(t, sym[i], sym[i + 1], &rank[i], &merged[i])) rank[i] = UINT32_MAX;
    for (;;) {
        uint32_t best = UINT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) { best = rank[i]; bi = i; }
        if (best == UINT32_MAX) break;
        sym[bi] = merged[bi];
        for (size_t i = bi + 1; i + 1 < m; i++) sym[i] = sym[i + 1];
        for (size_t i = bi + 1; i + 2 < m; i++) { rank[i] = rank[i + 1]; merged[i] = merged[i + 1]; }
        m--;
        if (bi + 1 < m && !tok_merge_get(t, sym[bi], sym[bi + 1], &rank[bi], &merged[bi])) rank[bi] = UINT32_MAX;
        if (bi > 0 && !tok_merge_get(t, sym[bi - 1], sym[bi], &rank[bi - 1], &merged[bi - 1])) rank[bi - 1] = UINT32_MAX;
    }
    if (m > o->cap - o->n) return tok_full(o, e);
    memcpy(o->ids + o->n, sym, m * sizeof *sym);
    o->n += m;
    return 0;
}

// ==========================================================================================
// encode
// ==========================================================================================

static void tok_scratch_carve(tok_scratch *s, arena *a, size_t max_text) {
    size_t n = max_text ? max_text : 1, c = uni_nfc_cps_cap(n);
    size_t nfc_work = 2 * c * sizeof(uint32_t), bpe_work = 7 * n * sizeof(int32_t);
    s->max_text = max_text;
    s->nfc = arena_take(a, n, 64, "NFC text");
    // The NFC work space is dead once a stretch is normalized (the pieces are read from s->nfc
    // or the text), and BPE runs only after that: the two share one block.
    uint8_t *work = arena_take(a, nfc_work > bpe_work ? nfc_work : bpe_work, 64, "NFC / BPE work space");
    uint32_t *u = (uint32_t *)work;
    int32_t *w = (int32_t *)work;
    s->cps = u;
    s->cps_tmp = u ? u + c : NULL;
    s->sym = w;
    s->prev = w ? w + n : NULL;
    s->next = w ? w + 2 * n : NULL;
    s->rank = u ? u + 3 * n : NULL;
    s->merged = w ? w + 4 * n : NULL;
    s->heap = w ? w + 5 * n : NULL;
    s->heap_at = w ? w + 6 * n : NULL;
}

// Allocates and carves scratch for texts of up to max_text bytes into its own arena `mem`.
static int tok_scratch_init(tok_scratch *s, arena *mem, size_t max_text, moet_err *e) {
    if (max_text > (size_t)INT32_MAX) return err_set(e, "tokenizer scratch: %zu bytes of text is over the 2 GiB limit", max_text);
    arena_plan p = arena_plan_begin(mem, "tokenizer scratch", ARENA_HOST, e);
    while (arena_plan_pass(&p)) tok_scratch_carve(s, p.on, max_text);
    return p.failed ? -1 : 0;
}

// Leftmost-longest added token of `set` in s[from..n): 1 with *at and *which, or 0.
static int tok_added_find(const tok *t, const tok_added_set *set, const uint8_t *s, size_t n, size_t from, size_t *at,
                          uint32_t *which) {
    if (!set->n) return 0;
    for (size_t i = from; i < n; i++) {
        uint32_t lo = set->start[s[i]], hi = set->start[s[i] + 1];
        for (uint32_t k = lo; k < hi; k++) {
            const tok_added *a = &t->added[set->order[k]];
            if (a->len <= n - i && !memcmp(t->bytes + a->off, s + i, a->len)) {
                *at = i;
                *which = set->order[k];
                return 1;
            }
        }
    }
    return 0;
}

// Split + BPE of normalized text p[0..n).
static int tok_encode_pieces(const tok *t, tok_scratch *s, const uint8_t *p, size_t n, tok_out *o, moet_err *e) {
    int qwen35 = t->regex == TOK_RE_QWEN35;
    for (size_t i = 0; i < n;) {
        size_t j = tok_split_next(p, n, i, qwen35);
        if (tok_bpe(t, s, p + i, j - i, o, e)) return -1;
        i = j;
    }
    return 0;
}

// A stretch of raw text between added tokens: NFC, then normalized added tokens, then pieces.
static int tok_encode_stretch(const tok *t, tok_scratch *s, const uint8_t *seg, size_t len, tok_out *o, moet_err *e) {
    const uint8_t *p = seg;
    size_t n = len;
    if (t->nfc && !uni_nfc_quick(seg, len)) {
        if (uni_nfc(seg, len, s->cps, s->cps_tmp, s->nfc, s->max_text, &n))
            return err_set(e, "the NFC form of the text is longer than %zu bytes (the tokenizer scratch size)", s->max_text);
        p = s->nfc;
    }
    size_t pos = 0, at;
    uint32_t which;
    while (tok_added_find(t, &t->norm, p, n, pos, &at, &which)) {
        if (tok_encode_pieces(t, s, p + pos, at - pos, o, e)) return -1;
        if (o->n == o->cap) return tok_full(o, e);
        o->ids[o->n++] = t->added[which].id;
        pos = at + t->added[which].len;
    }
    return tok_encode_pieces(t, s, p + pos, n - pos, o, e);
}

// Token ids of text[0..len) (UTF-8, at most s->max_text bytes) into ids[0..cap): *n_ids of them.
// No special tokens are added (Hugging Face's add_special_tokens = false); added tokens written
// in the text become their ids. Errors: ill-formed UTF-8, text longer than the scratch, more
// ids than cap. Allocates nothing.
static int tok_encode(const tok *t, tok_scratch *s, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n_ids,
                      moet_err *e) {
    const uint8_t *u = (const uint8_t *)text;
    *n_ids = 0;
    size_t bad = uni_valid_prefix(u, len);
    if (bad < len) return err_set(e, "the text is not valid UTF-8 at byte %zu", bad);
    if (len > s->max_text)
        return err_set(e, "the text has %zu bytes, more than the %zu of the tokenizer scratch", len, s->max_text);
    tok_out o = {ids, cap, 0};
    size_t pos = 0, at;
    uint32_t which;
    while (tok_added_find(t, &t->raw, u, len, pos, &at, &which)) {
        if (at > pos && tok_encode_stretch(t, s, u + pos, at - pos, &o, e)) return -1;
        if (o.n == o.cap) return tok_full(&o, e);
        o.ids[o.n++] = t->added[which].id;
        pos = at + t->added[which].len;
    }
    if (len > pos && tok_encode_stretch(t, s, u + pos, len - pos, &o, e)) return -1;
    *n_ids = o.n;
    return 0;
}

// ==========================================================================================
// decode
// ==========================================================================================

// Streaming decoder state: the bytes of an incomplete UTF-8 sequence held back.
typedef struct {
    uint8_t pend[4];
    uint8_t n_pend;        // held bytes
    uint8_t need;          // length of the sequence they begin
    uint8_t skip_special;  // drop added tokens marked special
} tok_stream;

static void tok_stream_init(tok_stream *st, int skip_special) {
    memset(st, 0, sizeof *st);
    st->skip_special = (uint8_t)(skip_special != 0);
}

// Bytes one tok_decode_stream call may write at most (every byte of the longest token, plus
// the held ones, as U+FFFD).
static size_t tok_stream_max_out(const tok *t) { return 3 * ((size_t)t->max_token_bytes + 4); }

static inline void tok_put_fffd(uint8_t *out, size_t *o) {
    out[(*o)++] = 0xEF;
    out[(*o)++] = 0xBF;
    out[(*o)++] = 0xBD;
}

// Feeds one byte to the UTF-8 decoder (Unicode §3.9 "maximal subpart" replacement, as
// Rust's String::from_utf8_lossy): complete characters and U+FFFD go to out[*o...].
static void tok_utf8_feed(tok_stream *st, uint8_t c, uint8_t *out, size_t *o) {
    for (;;) {
        if (st->n_pend == 0) {
            if (c < 0x80) { out[(*o)++] = c; return; }
            if (c >= 0xC2 && c <= 0xDF) st->need = 2;
            else if (c >= 0xE0 && c <= 0xEF) st->need = 3;
            else if (c >= 0xF0 && c <= 0xF4) st->need = 4;
            else { tok_put_fffd(out, o); return; }
            st->pend[st->n_pend++] = c;
            return;
        }
        uint8_t lo = 0x80, hi = 0xBF;
        if (st->n_pend == 1) {
            switch (st->pend[0]) {
            case 0xE0: lo = 0xA0; break;   // no overlong 3-byte forms
            case 0xED: hi = 0x9F; break;   // no surrogates
            case 0xF0: lo = 0x90; break;   // no overlong 4-byte forms
            case 0xF4: hi = 0x8F; break;   // nothing past U+10FFFF
            }
        }
        if (c >= lo && c <= hi) {
            st->pend[st->n_pend++] = c;
            if (st->n_pend == st->need) {
                memcpy(out + *o, st->pend, st->need);
                *o += st->need;
                st->n_pend = 0;
            }
            return;
        }
        tok_put_fffd(out, o);   // the held bytes are a maximal subpart; c starts afresh
        st->n_pend = 0;
    }
}

// Decodes one id: writes to out[0..cap) only complete characters (an incomplete sequence at the
// end is held in st until later bytes complete or break it), *n_out bytes. cap must be at least
// tok_stream_max_out(t). Error: an id that is no token.
static int tok_decode_stream(const tok *t, tok_stream *st, int32_t id, char *out, size_t cap, size_t *n_out, moet_err *e) {
    *n_out = 0;
    if (id < 0 || id >= t->n_ids || t->entries[id].kind == TOK_GAP)
        return err_set(e, "token id %" PRId32 " is not in the vocabulary (ids 0..%d)", id, t->n_ids - 1);
    MOET_ASSERT(cap >= tok_stream_max_out(t), "stream decode buffer of %zu bytes, below %zu", cap, tok_stream_max_out(t));
    const tok_entry *en = &t->entries[id];
    if (en->special && st->skip_special) return 0;
    const uint8_t *b = t->bytes + en->off;
    size_t o = 0;
    for (uint32_t i = 0; i < en->len; i++) tok_utf8_feed(st, b[i], (uint8_t *)out, &o);
    *n_out = o;
    return 0;
}

// End of the sequence: a held incomplete sequence becomes U+FFFD (out has room for 3 bytes).
// Returns the bytes written.
static size_t tok_stream_flush(tok_stream *st, char *out) {
    size_t o = 0;
    if (st->n_pend) tok_put_fffd((uint8_t *)out, &o);
    st->n_pend = 0;
    return o;
}

// Text of ids[0..n) into out[0..cap) (not NUL-terminated), *len bytes; skip_special drops added
// tokens marked special. Errors: an id that is no token, or a text longer than cap.
static int tok_decode(const tok *t, const int32_t *ids, size_t n, int skip_special, char *out, size_t cap, size_t *len,
                      moet_err *e) {
    tok_stream st;
    tok_stream_init(&st, skip_special);
    size_t o = 0;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || t->entries[ids[i]].kind == TOK_GAP)
            return err_set(e, "ids[%zu] = %" PRId32 " is not in the vocabulary (ids 0..%d)", i, ids[i], t->n_ids - 1);
        const tok_entry *en = &t->entries[ids[i]];
        if (en->special && st.skip_special) continue;
        const uint8_t *b = t->bytes + en->off;
        for (uint32_t k = 0; k < en->len; k++) {
            uint8_t tmp[8];   // one byte yields at most 6 (U+FFFD twice)
            size_t m = 0;
            tok_utf8_feed(&st, b[k], tmp, &m);
            if (m > cap - o) return err_set(e, "the decoded text is longer than %zu bytes (the output capacity)", cap);
            memcpy(out + o, tmp, m);
            o += m;
        }
    }
    if (st.n_pend) {
        if (cap - o < 3) return err_set(e, "the decoded text is longer than %zu bytes (the output capacity)", cap);
        o += tok_stream_flush(&st, out + o);
    }
    *len = o;
    return 0;
}
