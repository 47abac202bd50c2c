// format/unicode.c — code point properties and NFC normalization, for the tokenizer.
//
// Tables come from format/unicode_tables.h, generated from the Unicode Character Database by
// format/gen_unicode.c (`./build.sh unicode`). NFC follows UAX #15 the way the Rust
// unicode-normalization crate (used by Hugging Face tokenizers) implements it: full canonical
// decomposition (Hangul algorithmic), canonical ordering of each run of non-starters (a stable
// sort by combining class), then canonical composition with blocking, primary composites only
// (composition exclusions honoured), Hangul LV / LVT composed algorithmically.
//
// The tables are Unicode 15.0 (Debian's UCD). Hugging Face's builds may carry older tables (its
// normalization crate is a 2019 fork, its regex engine bundles its own); text with characters
// assigned after their version can then normalize or split differently. Everything assigned by
// then gives the same result, as the goldens check.
//
// Text handed to these functions is well-formed UTF-8 (the caller validated it).

#include "unicode_tables.h"

_Static_assert(UNI_MAX_DECOMP <= 4, "a decomposition fits the per-character bound used below");
_Static_assert(UNI_DECOMP_PER_BYTE_X2 <= 3, "uni_nfc_cps_cap assumes at most 1.5 code points per byte");

static inline uint8_t uni_props(uint32_t cp) {
    if (cp >= 0x110000) return 0;
    return uni_props_stage2[uni_props_stage1[cp >> 8]][cp & 255];
}

static inline uint8_t uni_ccc(uint32_t cp) {
    if (cp >= 0x110000) return 0;
    return uni_ccc_stage2[uni_ccc_stage1[cp >> 8]][cp & 255];
}

// Decodes the code point at s (well-formed UTF-8, at least one byte available); *len = its bytes.
static inline uint32_t uni_dec(const uint8_t *s, size_t *len) {
    uint8_t c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F); }
    *len = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

// Offset of the first byte of s[0..n) that is not well-formed UTF-8, or n when all are.
static size_t uni_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t k = js_utf8_len(s + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

// ---- Hangul (Unicode §3.12)
enum {
    UNI_S_BASE = 0xAC00, UNI_L_BASE = 0x1100, UNI_V_BASE = 0x1161, UNI_T_BASE = 0x11A7,
    UNI_L_COUNT = 19, UNI_V_COUNT = 21, UNI_T_COUNT = 28,
    UNI_N_COUNT = UNI_V_COUNT * UNI_T_COUNT, UNI_S_COUNT = UNI_L_COUNT * UNI_N_COUNT,
};

// Full canonical decomposition of cp into out[0..4); returns its length (1: cp itself).
static int uni_decompose(uint32_t cp, uint32_t out[4]) {
    if (cp >= UNI_S_BASE && cp < UNI_S_BASE + UNI_S_COUNT) {
        uint32_t s = cp - UNI_S_BASE;
        out[0] = UNI_L_BASE + s / UNI_N_COUNT;
        out[1] = UNI_V_BASE + (s % UNI_N_COUNT) / UNI_T_COUNT;
        if (s % UNI_T_COUNT == 0) return 2;
        out[2] = UNI_T_BASE + s % UNI_T_COUNT;
        return 3;
    }
    if (cp >= 0xC0) {   // nothing below U+00C0 decomposes
        size_t lo = 0, hi = UNI_N_DECOMP;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (uni_decomp_cp[mid] < cp) lo = mid + 1;
            else hi = mid;
        }
        if (lo < UNI_N_DECOMP && uni_decomp_cp[lo] == cp) {
            int len = uni_decomp_at[lo] & 7, off = uni_decomp_at[lo] >> 3;
            for (int i = 0; i < len; i++) out[i] = uni_decomp_data[off + i];
            return len;
        }
    }
    out[0] = cp;
    return 1;
}

// The primary composite of (a, b), or 0 when there is none.
static uint32_t uni_compose(uint32_t a, uint32_t b) {
    if (a >= UNI_L_BASE && a < UNI_L_BASE + UNI_L_COUNT && b >= UNI_V_BASE && b < UNI_V_BASE + UNI_V_COUNT)
        return UNI_S_BASE + ((a - UNI_L_BASE) * UNI_V_COUNT + (b - UNI_V_BASE)) * UNI_T_COUNT;
    if (a >= UNI_S_BASE && a < UNI_S_BASE + UNI_S_COUNT && (a - UNI_S_BASE) % UNI_T_COUNT == 0 &&
        b > UNI_T_BASE && b < UNI_T_BASE + UNI_T_COUNT)
        return a + (b - UNI_T_BASE);
    uint64_t key = (uint64_t)a << 21 | b;
    size_t lo = 0, hi = UNI_N_COMP;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uni_comp_key[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < UNI_N_COMP && uni_comp_key[lo] == key ? uni_comp_val[lo] : 0;
}

// NFC quick check (UAX #15 §9): 1 when s[0..n) is certainly already in NFC, 0 when it may not be.
static int uni_nfc_quick(const uint8_t *s, size_t n) {
    uint8_t last = 0;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { last = 0; i++; continue; }
        size_t k;
        uint32_t cp = uni_dec(s + i, &k);
        uint8_t cc = uni_ccc(cp);
        if (cc && last > cc) return 0;
        if (uni_props(cp) & UNI_QC) return 0;
        last = cc;
        i += k;
    }
    return 1;
}

// Code points of work space uni_nfc needs for n bytes of input (each of its two buffers).
static size_t uni_nfc_cps_cap(size_t n) { return n + n / 2 + 4; }

// Stable sort of cps[0..n) by combining class (a counting sort through tmp[0..n)).
static void uni_sort_by_ccc(uint32_t *cps, size_t n, uint32_t *tmp) {
    if (n < 2) return;
    if (n <= 16) {   // insertion sort: the common case is one or two marks
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cps[i];
            uint8_t cc = uni_ccc(c);
            size_t j = i;
            while (j > 0 && uni_ccc(cps[j - 1]) > cc) { cps[j] = cps[j - 1]; j--; }
            cps[j] = c;
        }
        return;
    }
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++) count[uni_ccc(cps[i]) + 1]++;
    for (int c = 1; c < 257; c++) count[c] += count[c - 1];
    for (size_t i = 0; i < n; i++) tmp[count[uni_ccc(cps[i])]++] = cps[i];
    memcpy(cps, tmp, n * sizeof *cps);
}

// NFC of s[0..n) into out (cap bytes): *out_len its length. cps and tmp are work space of
// uni_nfc_cps_cap(n) code points each. Returns -1 when the result does not fit cap.
static int uni_nfc(const uint8_t *s, size_t n, uint32_t *cps, uint32_t *tmp, uint8_t *out, size_t cap,
                   size_t *out_len) {
    // 1. decompose, then order each run of non-starters by combining class
    size_t m = 0, run = 0;   // run: start of the current run of non-starters
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t d[4];
        int nd = uni_decompose(uni_dec(s + i, &k), d);
        i += k;
        MOET_ASSERT(m + (size_t)nd <= uni_nfc_cps_cap(n), "NFC work space of %zu code points", uni_nfc_cps_cap(n));
        for (int j = 0; j < nd; j++) {
            if (uni_ccc(d[j]) == 0) {
                uni_sort_by_ccc(cps + run, m - run, tmp);
                run = m + 1;
            }
            cps[m++] = d[j];
        }
    }
    uni_sort_by_ccc(cps + run, m - run, tmp);

    // 2. canonical composition (the unicode-normalization crate's Recompositions): `starter` is
    // the pending composee, `last` the class of the last character kept after it (-1: none)
    size_t w = 0, starter = SIZE_MAX;
    int last = -1;
    for (size_t r = 0; r < m; r++) {
        uint32_t c = cps[r];
        int cc = uni_ccc(c);
        if (starter == SIZE_MAX) {
            cps[w++] = c;
            if (cc == 0) { starter = w - 1; last = -1; }
            continue;
        }
        if (last >= cc) {   // blocked from the starter (last >= 0 here, as cc >= 0)
            cps[w++] = c;
            if (cc == 0) { starter = w - 1; last = -1; }
            else last = cc;
            continue;
        }
        uint32_t comp = uni_compose(cps[starter], c);
        if (comp) { cps[starter] = comp; continue; }
        cps[w++] = c;
        if (cc == 0 && last == -1) { starter = w - 1; }
        else last = cc;
    }

    // 3. encode
    size_t o = 0;
    for (size_t r = 0; r < w; r++) {
        uint8_t u[4];
        size_t k = js_utf8_put(cps[r], u);
        if (k > cap - o) return -1;
        memcpy(out + o, u, k);
        o += k;
    }
    *out_len = o;
    return 0;
}
