// format/gen_unicode.c — generates format/unicode_tables.h from the Unicode Character Database.
//
// Not part of moet.c: a separate build-time program, run by `./build.sh unicode`, which reads
// the UCD text files of Debian's `unicode-data` package (/usr/share/unicode, or the directory
// given as argv[1]) and writes the tables the tokenizer needs to stdout:
//   - per code point property bits: \p{L} (Lu Ll Lt Lm Lo), \p{M} (Mn Mc Me), \p{N} (Nd Nl No),
//     White_Space (what \s means in Oniguruma and in the Rust regex crate), and NFC_QC != Yes;
//   - the canonical combining class of every code point;
//   - the full (recursively expanded) canonical decomposition of every code point that has one,
//     Hangul syllables excluded (they are algorithmic);
//   - the primary composites: canonical pairs (a, b) -> c for every c whose decomposition is two
//     code points and which is not Full_Composition_Exclusion.
// Property and class tables are two-level (256 code points per block, identical blocks shared).
// The output is deterministic: the same UCD gives the same bytes, so the committed header can be
// regenerated and diffed.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CP 0x110000
#define BLOCK 256
#define N_BLOCKS (N_CP / BLOCK)

enum { P_L = 1, P_M = 2, P_N = 4, P_WS = 8, P_QC = 16 };

static uint8_t props[N_CP];
static uint8_t ccc[N_CP];
static uint8_t decomp_len[N_CP];      // canonical decomposition as listed (one level), 0 = none
static uint32_t decomp[N_CP][2];      // one-level canonical decompositions have at most 2 code points
static uint8_t excluded[N_CP];        // Full_Composition_Exclusion
static char version[64];

static void die(const char *what, const char *detail) {
    fprintf(stderr, "gen_unicode: %s: %s\n", what, detail);
    exit(1);
}

static FILE *open_ucd(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) die("cannot open", path);
    return f;
}

// Parses "XXXX" or "XXXX..YYYY" at the start of a line into [lo, hi].
static int parse_range(const char *s, uint32_t *lo, uint32_t *hi) {
    char *end;
    unsigned long a = strtoul(s, &end, 16);
    if (end == s) return -1;
    unsigned long b = a;
    if (end[0] == '.' && end[1] == '.') b = strtoul(end + 2, &end, 16);
    if (a > b || b >= N_CP) return -1;
    *lo = (uint32_t)a;
    *hi = (uint32_t)b;
    return 0;
}

static uint8_t gc_bits(const char *gc) {
    if (gc[0] == 'L') return P_L;
    if (gc[0] == 'M') return P_M;
    if (gc[0] == 'N') return P_N;
    return 0;
}

static void read_unicode_data(const char *dir) {
    FILE *f = open_ucd(dir, "UnicodeData.txt");
    char line[1024];
    uint32_t range_lo = 0;
    int in_range = 0;
    while (fgets(line, sizeof line, f)) {
        char *field[15];
        int n = 0;
        char *p = line;
        field[n++] = p;
        for (; *p && n < 15; p++)
            if (*p == ';') { *p = 0; field[n++] = p + 1; }
        if (n < 15) die("UnicodeData.txt", "line with fewer than 15 fields");
        uint32_t cp = (uint32_t)strtoul(field[0], NULL, 16);
        if (cp >= N_CP) die("UnicodeData.txt", "code point out of range");
        uint8_t bits = gc_bits(field[2]);
        uint8_t cls = (uint8_t)atoi(field[3]);
        size_t name_len = strlen(field[1]);
        if (name_len > 8 && !strcmp(field[1] + name_len - 8, ", First>")) {
            range_lo = cp;
            in_range = 1;
            continue;
        }
        uint32_t lo = cp;
        if (name_len > 7 && !strcmp(field[1] + name_len - 7, ", Last>")) {
            if (!in_range) die("UnicodeData.txt", "range end without start");
            lo = range_lo;
            in_range = 0;
        }
        for (uint32_t c = lo; c <= cp; c++) {
            props[c] |= bits;
            ccc[c] = cls;
        }
        const char *d = field[5];
        if (d[0] && d[0] != '<') {   // canonical decomposition ("<tag> ..." is compatibility)
            char *end;
            int k = 0;
            for (;;) {
                unsigned long v = strtoul(d, &end, 16);
                if (end == d) break;
                if (k == 2) die("UnicodeData.txt", "canonical decomposition longer than 2");
                decomp[cp][k++] = (uint32_t)v;
                d = end;
            }
            decomp_len[cp] = (uint8_t)k;
        }
    }
    fclose(f);
}

// Reads "range ; Property [; value]" lines; marks code points whose property (and value) match.
static void read_prop(const char *dir, const char *file, const char *prop, const char *value,
                      uint8_t *table, uint8_t bit) {
    FILE *f = open_ucd(dir, file);
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (!version[0] && line[0] == '#') {   // "# DerivedNormalizationProps-15.0.0.txt"
            char v[64];
            if (sscanf(line, "# DerivedNormalizationProps-%63[0-9.]", v) == 1) {
                size_t k = strlen(v);
                while (k && v[k - 1] == '.') v[--k] = 0;   // the '.' of ".txt"
                memcpy(version, v, k + 1);
            }
        }
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *semi = strchr(line, ';');
        if (!semi) continue;
        uint32_t lo, hi;
        if (parse_range(line, &lo, &hi)) continue;
        char name[128] = "", val[32] = "";
        if (sscanf(semi + 1, " %127[^; \t\n] ; %31[^; \t\n]", name, val) < 1) continue;
        if (strcmp(name, prop)) continue;
        if (value && strcmp(val, value)) continue;
        found = 1;
        for (uint32_t c = lo; c <= hi; c++) table[c] |= bit;
    }
    fclose(f);
    if (!found) die(file, prop);
}

// Full canonical decomposition of cp into out (returns its length; 0 when cp has none).
static int full_decomp(uint32_t cp, uint32_t *out) {
    if (!decomp_len[cp]) { out[0] = cp; return 1; }
    int n = 0;
    for (int i = 0; i < decomp_len[cp]; i++) n += full_decomp(decomp[cp][i], out + n);
    return n;
}

static int is_hangul_syllable(uint32_t c) { return c >= 0xAC00 && c <= 0xD7A3; }

// Writes a two-level table of bytes: NAME_stage1[N_BLOCKS] indexes NAME_stage2[k][BLOCK].
static void emit_two_level(const char *name, const uint8_t *t) {
    static uint16_t stage1[N_BLOCKS];
    static uint32_t uniq[N_BLOCKS];
    int n_uniq = 0;
    for (int b = 0; b < N_BLOCKS; b++) {
        int k;
        for (k = 0; k < n_uniq; k++)
            if (!memcmp(t + (size_t)uniq[k] * BLOCK, t + (size_t)b * BLOCK, BLOCK)) break;
        if (k == n_uniq) uniq[n_uniq++] = (uint32_t)b;
        stage1[b] = (uint16_t)k;
    }
    if (n_uniq > 255) die(name, "more than 255 distinct blocks");
    printf("static const uint8_t %s_stage1[%d] = {", name, N_BLOCKS);
    for (int b = 0; b < N_BLOCKS; b++) printf("%s%u,", b % 32 ? "" : "\n    ", stage1[b]);
    printf("\n};\n");
    printf("static const uint8_t %s_stage2[%d][%d] = {\n", name, n_uniq, BLOCK);
    for (int k = 0; k < n_uniq; k++) {
        printf("    {");
        for (int i = 0; i < BLOCK; i++)
            printf("%s%u,", i % 32 ? "" : "\n        ", t[(size_t)uniq[k] * BLOCK + i]);
        printf("\n    },\n");
    }
    printf("};\n\n");
}

// --nfc-tests: filters NormalizationTest.txt (stdin) to the lines that test NFC, for
// tests/fixtures/unicode/nfc_tests.txt: the five columns of every line of Parts 0, 2 and 3, and
// of the Part 1 lines whose NFC or NFD differs from the character itself (Hangul syllables,
// algorithmic, only every 61st). Every code point not kept as a Part 1 c1 is its own NFC.
static int nfc_tests(void) {
    char line[4096];
    int part = -1;
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "@Part", 5)) {
            part = atoi(line + 5);
            printf("@Part%d\n", part);
            continue;
        }
        if (line[0] == '#' || line[0] == '\n') continue;
        char *col[5], *p = line;
        for (int i = 0; i < 5; i++) {
            col[i] = p;
            p = strchr(p, ';');
            if (!p) die("NormalizationTest.txt", "line with fewer than 5 columns");
            *p++ = 0;
        }
        if (part == 1) {
            if (!strcmp(col[0], col[1]) && !strcmp(col[0], col[2])) continue;
            unsigned long v = strtoul(col[0], NULL, 16);
            if (v >= 0xAC00 && v <= 0xD7A3 && v % 61) continue;
        }
        printf("%s;%s;%s;%s;%s\n", col[0], col[1], col[2], col[3], col[4]);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--nfc-tests")) return nfc_tests();
    const char *dir = argc > 1 ? argv[1] : "/usr/share/unicode";
    read_unicode_data(dir);
    read_prop(dir, "PropList.txt", "White_Space", NULL, props, P_WS);
    read_prop(dir, "DerivedNormalizationProps.txt", "NFC_QC", "N", props, P_QC);
    read_prop(dir, "DerivedNormalizationProps.txt", "NFC_QC", "M", props, P_QC);
    read_prop(dir, "DerivedNormalizationProps.txt", "Full_Composition_Exclusion", NULL, excluded, 1);
    if (!version[0]) die("DerivedNormalizationProps.txt", "no version line");

    printf("// format/unicode_tables.h — GENERATED by format/gen_unicode.c from the Unicode Character\n"
           "// Database %s (Debian unicode-data: UnicodeData.txt, PropList.txt,\n"
           "// DerivedNormalizationProps.txt). Do not edit: run `./build.sh unicode`.\n\n", version);
    printf("#define UNI_VERSION \"%s\"\n", version);
    printf("enum { UNI_L = %d, UNI_M = %d, UNI_N = %d, UNI_WS = %d, UNI_QC = %d };\n\n",
           P_L, P_M, P_N, P_WS, P_QC);
    printf("// property bits of each code point (UNI_*): uni_props_stage2[uni_props_stage1[cp >> 8]][cp & 255]\n");
    emit_two_level("uni_props", props);
    printf("// canonical combining class of each code point\n");
    emit_two_level("uni_ccc", ccc);

    // full canonical decompositions, sorted by code point
    int n_dec = 0, n_data = 0, max_len = 0;
    uint32_t buf[32];
    double max_ratio = 0;
    for (uint32_t c = 0; c < N_CP; c++) {
        if (!decomp_len[c] || is_hangul_syllable(c)) continue;
        int k = full_decomp(c, buf);
        if (k > max_len) max_len = k;
        int utf8 = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if ((double)k / utf8 > max_ratio) max_ratio = (double)k / utf8;
        n_dec++;
        n_data += k;
    }
    // Hangul syllables: 3 bytes -> at most 3 code points (ratio 1)
    if (max_ratio < 1) max_ratio = 1;
    printf("// full canonical decompositions (Hangul syllables excluded: algorithmic)\n");
    printf("#define UNI_N_DECOMP %d\n#define UNI_MAX_DECOMP %d\n", n_dec, max_len);
    printf("// most code points one UTF-8 byte can decompose to, times 2 (so an integer)\n");
    printf("#define UNI_DECOMP_PER_BYTE_X2 %d\n", (int)(max_ratio * 2 + 0.999));
    printf("static const uint32_t uni_decomp_cp[%d] = {", n_dec);
    int i = 0;
    for (uint32_t c = 0; c < N_CP; c++) {
        if (!decomp_len[c] || is_hangul_syllable(c)) continue;
        printf("%s0x%X,", i++ % 12 ? "" : "\n    ", c);
    }
    printf("\n};\n");
    printf("// offset << 3 | length into uni_decomp_data\n");
    printf("static const uint16_t uni_decomp_at[%d] = {", n_dec);
    i = 0;
    int off = 0;
    for (uint32_t c = 0; c < N_CP; c++) {
        if (!decomp_len[c] || is_hangul_syllable(c)) continue;
        int k = full_decomp(c, buf);
        if (off > 8191 || k > 7) die("decomposition table", "offset or length does not fit 16 bits");
        printf("%s%d,", i++ % 16 ? "" : "\n    ", off << 3 | k);
        off += k;
    }
    printf("\n};\n");
    printf("static const uint32_t uni_decomp_data[%d] = {", n_data);
    i = 0;
    for (uint32_t c = 0; c < N_CP; c++) {
        if (!decomp_len[c] || is_hangul_syllable(c)) continue;
        int k = full_decomp(c, buf);
        for (int j = 0; j < k; j++) printf("%s0x%X,", i++ % 12 ? "" : "\n    ", buf[j]);
    }
    printf("\n};\n\n");

    // primary composites: key = a << 21 | b, sorted (a-major, then b, because c loops in
    // code point order would not sort by key: collect, then sort)
    static uint64_t keys[N_CP];
    int n_comp = 0;
    for (uint32_t c = 0; c < N_CP; c++) {
        if (decomp_len[c] != 2 || excluded[c] || is_hangul_syllable(c)) continue;
        keys[n_comp++] = ((uint64_t)decomp[c][0] << 42) | ((uint64_t)decomp[c][1] << 21) | c;
    }
    for (int a = 1; a < n_comp; a++) {   // insertion sort: ~1000 entries, once
        uint64_t v = keys[a];
        int b = a;
        while (b > 0 && keys[b - 1] > v) { keys[b] = keys[b - 1]; b--; }
        keys[b] = v;
    }
    printf("// primary composites: (first << 21 | second) -> composite, sorted by key\n");
    printf("#define UNI_N_COMP %d\n", n_comp);
    printf("static const uint64_t uni_comp_key[%d] = {", n_comp);
    for (int k = 0; k < n_comp; k++)
        printf("%s0x%llXull,", k % 6 ? "" : "\n    ", (unsigned long long)(keys[k] >> 21));
    printf("\n};\n");
    printf("static const uint32_t uni_comp_val[%d] = {", n_comp);
    for (int k = 0; k < n_comp; k++)
        printf("%s0x%X,", k % 12 ? "" : "\n    ", (unsigned)(keys[k] & 0x1FFFFF));
    printf("\n};\n");
    return 0;
}
