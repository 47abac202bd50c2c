// tests/test_safetensors.c — st_open on files the test writes itself (valid checkpoints of one
// or several shards, with and without model.safetensors.index.json, and one directory per
// corruption), and on the real fixtures, whose tensors are checked against their config.json.
//
// Every refused checkpoint must give -1, a message naming the file or tensor and the problem,
// an empty set, and no mapping left behind (counted by mmap_count.h).
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "mmap_count.h"
#include "../moet.c"
#include "check.h"
#include <ftw.h>

static char sf_root[64];   // the mkdtemp directory all cases live in
static int sf_case;
static st_set sf_set;      // holds MOET_MAX_SHARDS paths (1 MiB): static

// A fresh empty directory for one case: out = sf_root/NN_tag.
static void sf_newdir(char *out, size_t cap, const char *tag) {
    snprintf(out, cap, "%s/%02d_%s", sf_root, ++sf_case, tag);
    MOET_ASSERT(mkdir(out, 0700) == 0, "mkdir %s: %s", out, strerror(errno));
}

// Byte i of every data buffer the test writes: tells offsets apart.
static uint8_t sf_pat(size_t i) { return (uint8_t)(i * 7 + 3); }

static void sf_write_bytes(const char *dir, const char *file, const void *bytes, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    MOET_ASSERT(f, "%s: %s", path, strerror(errno));
    MOET_ASSERT(fwrite(bytes, 1, n, f) == n && fclose(f) == 0, "%s: write failed", path);
}
static void sf_write_text(const char *dir, const char *file, const char *text) {
    sf_write_bytes(dir, file, text, strlen(text));
}

// A shard by hand: the u64 little-endian `hdr_len` (any value, to forge lengths), `n_hdr` bytes
// of header, then `data_len` bytes of sf_pat.
static void sf_write_raw(const char *dir, const char *file, uint64_t hdr_len, const char *hdr, size_t n_hdr,
                         size_t data_len) {
    static uint8_t buf[1 << 16];
    MOET_ASSERT(8 + n_hdr + data_len <= sizeof buf, "test shard too big");
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)(hdr_len >> (8 * b));
    memcpy(buf + 8, hdr, n_hdr);
    for (size_t i = 0; i < data_len; i++) buf[8 + n_hdr + i] = sf_pat(i);
    sf_write_bytes(dir, file, buf, 8 + n_hdr + data_len);
}

// A shard as the reference writer makes it: the header padded with spaces to a multiple of 8.
// Returns the header length.
static size_t sf_write(const char *dir, const char *file, const char *hdr, size_t data_len) {
    char buf[8192];
    size_t n = strlen(hdr);
    MOET_ASSERT(n + 8 < sizeof buf, "test header too long");
    memcpy(buf, hdr, n);
    while (n % 8) buf[n++] = ' ';
    sf_write_raw(dir, file, n, buf, n, data_len);
    return n;
}

// st_open(path) must fail with a message holding every word, leave the set empty and hold no
// mapping afterwards.
static void sf_fails_at(int line, const char *path, const char *const *words) {
    moet_err e = {{0}};
    long live = mc_live;
    long long bytes = mc_bytes;
    int rc = st_open(&sf_set, path, &e);
    CHECK(rc == -1, "line %d: %s was opened", line, path);
    if (rc == 0) {
        st_close(&sf_set);
        return;
    }
    for (int i = 0; words[i]; i++)
        CHECK(strstr(e.msg, words[i]) != NULL, "line %d: '%s' missing from: %s", line, words[i], e.msg);
    CHECK(mc_live == live && mc_bytes == bytes, "line %d: %ld mappings (%lld bytes) left after: %s", line,
          mc_live - live, mc_bytes - bytes, e.msg);
    CHECK(sf_set.n_tensors == 0 && sf_set.n_shards == 0 && sf_set.mem == NULL && sf_set.tensors == NULL,
          "line %d: the set is not empty after an error", line);
}
#define SF_FAILS(path, ...) sf_fails_at(__LINE__, path, (const char *const[]){__VA_ARGS__, NULL})

static int sf_open_ok(const char *path) {
    moet_err e = {{0}};
    int rc = st_open(&sf_set, path, &e);
    CHECK(rc == 0, "%s refused: %s", path, e.msg);
    return rc;
}

static const char *sf_base(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

// One expected tensor: shard file, dtype, shape, and where its bytes begin in that shard's data.
typedef struct {
    const char *name, *shard, *dtype;
    int ndim;
    int64_t shape[4];
    size_t numel, begin, bytes;
} sf_want;

// Checks every expected tensor; hdr_len[i] is the header length of shard_files[i].
static void sf_check_tensors(const sf_want *w, int n, const char *const *shard_files, const size_t *hdr_len, int n_shards) {
    CHECK(sf_set.n_tensors == (uint32_t)n && sf_set.n_shards == n_shards, "%u tensors in %d shards", sf_set.n_tensors,
          sf_set.n_shards);
    for (int i = 0; i < n; i++) {
        const st_tensor *t = st_find(&sf_set, w[i].name);
        CHECK(t != NULL, "tensor '%s' not found", w[i].name);
        if (!t) continue;
        int sh = -1;
        for (int k = 0; k < n_shards; k++)
            if (!strcmp(sf_base(sf_set.shard_path[t->shard]), shard_files[k])) sh = k;
        CHECK(sh >= 0 && !strcmp(shard_files[sh], w[i].shard), "'%s' in %s, want %s", w[i].name,
              sf_set.shard_path[t->shard], w[i].shard);
        CHECK(!strcmp(st_dtype_name(t->dtype), w[i].dtype), "'%s' dtype %s, want %s", w[i].name, st_dtype_name(t->dtype),
              w[i].dtype);
        CHECK(t->ndim == w[i].ndim && !memcmp(t->shape, w[i].shape, sizeof(int64_t) * (size_t)w[i].ndim), "'%s' shape",
              w[i].name);
        CHECK(t->numel == w[i].numel && t->bytes == w[i].bytes, "'%s' numel %zu bytes %zu", w[i].name, t->numel, t->bytes);
        if (sh < 0) continue;
        // the pointer is 8 + header length + begin into the shard's mapping, and holds its bytes
        CHECK(t->data == sf_set.maps[t->shard].data + 8 + hdr_len[sh] + w[i].begin, "'%s' data pointer", w[i].name);
        int same = 1;
        for (size_t b = 0; b < t->bytes; b++) same &= t->data[b] == sf_pat(w[i].begin + b);
        CHECK(same, "'%s' bytes", w[i].name);
    }
    CHECK(st_find(&sf_set, "absent.weight") == NULL && st_find(&sf_set, "") == NULL);
}

// ---- valid checkpoints ------------------------------------------------------------------

static void test_valid_single(void) {
    char dir[256], path[300];
    long live = mc_live;
    sf_newdir(dir, sizeof dir, "single");
    // entries out of offset order; a 0-rank scalar; a zero-size tensor; metadata strings
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[40,48]},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]},"
        "\"c\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[16,21]},"
        "\"d\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[21,24]},"
        "\"e\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]},"
        "\"f\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[32,40]},"
        "\"g\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[40,40]}}";
    size_t hl = sf_write(dir, "model.safetensors", hdr, 48);
    CHECK(hl % 8 == 0 && hl > strlen(hdr));   // really padded, so trailing spaces are accepted
    static const sf_want w[] = {
        {"h", "model.safetensors", "F16", 2, {2, 2}, 4, 40, 8},
        {"a", "model.safetensors", "BF16", 2, {2, 3}, 6, 0, 12},
        {"b", "model.safetensors", "F32", 0, {0}, 1, 12, 4},
        {"c", "model.safetensors", "U8", 1, {5}, 5, 16, 5},
        {"d", "model.safetensors", "F8_E4M3", 1, {3}, 3, 21, 3},
        {"e", "model.safetensors", "I64", 1, {1}, 1, 24, 8},
        {"f", "model.safetensors", "I32", 1, {2}, 2, 32, 8},
        {"g", "model.safetensors", "F16", 2, {0, 4}, 0, 40, 0},
    };
    const char *files[] = {"model.safetensors"};
    if (sf_open_ok(dir) == 0) {
        sf_check_tensors(w, 8, files, &hl, 1);
        st_close(&sf_set);
    }
    // the file itself names a one-shard checkpoint too
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (sf_open_ok(path) == 0) {
        sf_check_tensors(w, 8, files, &hl, 1);
        st_close(&sf_set);
    }
    CHECK(mc_live == live, "%ld mappings left after st_close", mc_live - live);

    // every dtype the reader knows, with its size from the safetensors Dtype list
    static const struct { const char *name; size_t bytes; } dts[] = {
        {"U8", 1}, {"I8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8},
    };
    enum { ND = sizeof dts / sizeof dts[0] };
    char h2[4096], nm[ND][16];
    sf_want w2[ND];
    size_t k = (size_t)snprintf(h2, sizeof h2, "{"), at = 0;
    for (int i = 0; i < ND; i++) {
        snprintf(nm[i], sizeof nm[i], "t_%s", dts[i].name);
        k += (size_t)snprintf(h2 + k, sizeof h2 - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[%zu,%zu]}",
                              i ? "," : "", nm[i], dts[i].name, at, at + 3 * dts[i].bytes);
        w2[i] = (sf_want){nm[i], "all.safetensors", dts[i].name, 1, {3}, 3, at, 3 * dts[i].bytes};
        at += 3 * dts[i].bytes;
    }
    snprintf(h2 + k, sizeof h2 - k, "}");
    sf_newdir(dir, sizeof dir, "dtypes");
    size_t hl2 = sf_write(dir, "all.safetensors", h2, at);
    const char *files2[] = {"all.safetensors"};
    if (sf_open_ok(dir) == 0) {
        sf_check_tensors(w2, ND, files2, &hl2, 1);
        st_close(&sf_set);
    }

    // an empty checkpoint (no tensor, no data) is well-formed; so are whitespace, escapes in
    // names, rank 8 and a header exactly as long as its JSON (no padding)
    sf_newdir(dir, sizeof dir, "empty_ok");
    sf_write(dir, "model.safetensors", "{}", 0);
    if (sf_open_ok(dir) == 0) {
        CHECK(sf_set.n_tensors == 0 && sf_set.n_shards == 1);
        st_close(&sf_set);
    }
    sf_newdir(dir, sizeof dir, "spelling");
    const char *h3 = "{ \"caf\\u00e9.w\" : { \"shape\" : [ 1,1,1,1,1,1,1,2 ] ,\n\t\"data_offsets\":[0,4], \"dtype\":\"BF16\"} }";
    sf_write_raw(dir, "x.safetensors", strlen(h3), h3, strlen(h3), 4);
    if (sf_open_ok(dir) == 0) {
        const st_tensor *t = st_find(&sf_set, "caf\xC3\xA9.w");
        CHECK(t && t->ndim == 8 && t->numel == 2 && t->shape[7] == 2 && t->data[0] == sf_pat(0));
        st_close(&sf_set);
    }
}

// Two shards, as with and without the index.
static const char *sf_shard1 =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.embed.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}";
static const char *sf_shard2 =
    "{\"lm_head.weight\":{\"dtype\":\"U8\",\"shape\":[4,1],\"data_offsets\":[0,4]},"
    "\"lm_head.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[4,8]},"
    "\"lm_head.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]}}";
#define SF_S1 "model-00001-of-00002.safetensors"
#define SF_S2 "model-00002-of-00002.safetensors"
static const sf_want sf_two[] = {
    {"model.embed.weight", SF_S1, "BF16", 2, {4, 2}, 8, 0, 16},
    {"model.norm.weight", SF_S1, "F32", 1, {2}, 2, 16, 8},
    {"lm_head.weight", SF_S2, "U8", 2, {4, 1}, 4, 0, 4},
    {"lm_head.weight_scale", SF_S2, "F8_E4M3", 1, {4}, 4, 4, 4},
    {"lm_head.weight_scale_2", SF_S2, "F32", 0, {0}, 1, 8, 4},
};
// total_size is deliberately wrong: nothing may depend on it (format/CHECKPOINT.md §B)
static const char *sf_index =
    "{\"metadata\":{\"total_size\":999},\"weight_map\":{"
    "\"lm_head.weight\":\"" SF_S2 "\",\"lm_head.weight_scale\":\"" SF_S2 "\",\"lm_head.weight_scale_2\":\"" SF_S2 "\","
    "\"model.embed.weight\":\"" SF_S1 "\",\"model.norm.weight\":\"" SF_S1 "\"}}";

static void sf_two_shards(const char *dir, size_t hl[2]) {
    hl[0] = sf_write(dir, SF_S1, sf_shard1, 24);
    hl[1] = sf_write(dir, SF_S2, sf_shard2, 12);
}

static void test_valid_multi(void) {
    char dir[256];
    size_t hl[2];
    const char *files[] = {SF_S1, SF_S2};
    long live = mc_live;
    // with the index; stray files beside it are not opened (the index decides)
    sf_newdir(dir, sizeof dir, "multi_index");
    sf_two_shards(dir, hl);
    sf_write_text(dir, "model.safetensors.index.json", sf_index);
    sf_write_text(dir, "junk.safetensors", "not a safetensors file");
    sf_write_text(dir, "README.md", "# model");
    if (sf_open_ok(dir) == 0) {
        sf_check_tensors(sf_two, 5, files, hl, 2);
        st_close(&sf_set);
    }
    // an index that lists only some tensors: every tensor of the listed shards is still there
    sf_newdir(dir, sizeof dir, "multi_partial_index");
    sf_two_shards(dir, hl);
    sf_write_text(dir, "model.safetensors.index.json",
                  "{\"weight_map\":{\"model.norm.weight\":\"" SF_S1 "\",\"lm_head.weight\":\"" SF_S2 "\"}}");
    if (sf_open_ok(dir) == 0) {
        sf_check_tensors(sf_two, 5, files, hl, 2);
        st_close(&sf_set);
    }
    // without the index: every *.safetensors file, in name order; other files are ignored
    sf_newdir(dir, sizeof dir, "multi_scan");
    sf_two_shards(dir, hl);
    sf_write_text(dir, "notes.txt", "{");
    sf_write_text(dir, "model.safetensors.index.json.bak", "{");
    if (sf_open_ok(dir) == 0) {
        sf_check_tensors(sf_two, 5, files, hl, 2);
        CHECK(!strcmp(sf_base(sf_set.shard_path[0]), SF_S1) && !strcmp(sf_base(sf_set.shard_path[1]), SF_S2));
        st_close(&sf_set);
    }
    // ... and so a broken extra shard is found when scanning
    sf_write_text(dir, "junk.safetensors", "not a safetensors file");
    SF_FAILS(dir, "junk.safetensors", "header length", "exceeds the limit");
    CHECK(mc_live == live, "%ld mappings left", mc_live - live);
}

// ---- corruptions: one directory each, the file is model.safetensors unless named ----------

#define F32_1(name, b, e) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" #b "," #e "]}"

// One shard `model.safetensors` with `hdr` and data_len bytes; returns the directory in dir.
static void sf_one(char *dir, size_t cap, const char *tag, const char *hdr, size_t data_len) {
    sf_newdir(dir, cap, tag);
    sf_write(dir, "model.safetensors", hdr, data_len);
}

static void test_corrupt_entries(void) {
    char d[256];
    // offsets: overlap, hole, past the end, end before begin, not covering the buffer
    sf_one(d, sizeof d, "overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
    SF_FAILS(d, "model.safetensors", "'b'", "overlaps", "[4, 12)", "ending at 8");
    sf_one(d, sizeof d, "same_offsets", "{" F32_1("a", 0, 4) "," F32_1("b", 0, 4) "}", 4);
    SF_FAILS(d, "model.safetensors", "overlaps");
    sf_one(d, sizeof d, "hole", "{" F32_1("a", 0, 4) "," F32_1("b", 8, 12) "}", 12);
    SF_FAILS(d, "model.safetensors", "hole", "[4, 8)", "'b'");
    sf_one(d, sizeof d, "hole_at_start", "{" F32_1("a", 4, 8) "}", 8);
    SF_FAILS(d, "model.safetensors", "hole", "[0, 4)", "'a'");
    sf_one(d, sizeof d, "out_of_range", "{" F32_1("a", 0, 4) ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8);
    SF_FAILS(d, "model.safetensors", "'b'", "end 12", "past the data buffer of 8 bytes");
    sf_one(d, sizeof d, "far_out_of_range", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9223372036854775806,9223372036854775807]}}", 8);
    SF_FAILS(d, "model.safetensors", "'a'", "past the data buffer");
    sf_one(d, sizeof d, "end_before_begin", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8);
    SF_FAILS(d, "model.safetensors", "'a'", "end 4 is before begin 8");
    sf_one(d, sizeof d, "trailing_bytes", "{" F32_1("a", 0, 4) "}", 8);
    SF_FAILS(d, "model.safetensors", "cover 4 bytes of a 8-byte data buffer");
    sf_one(d, sizeof d, "data_no_tensor", "{\"__metadata__\":{}}", 3);
    SF_FAILS(d, "model.safetensors", "cover 0 bytes of a 3-byte");
    // size = numel × dtype size
    sf_one(d, sizeof d, "wrong_size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20);
    SF_FAILS(d, "model.safetensors", "'a'", "F32 [2, 3]", "needs 24 bytes", "hold 20");
    sf_one(d, sizeof d, "wrong_size_dtype", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4);
    SF_FAILS(d, "model.safetensors", "'a'", "BF16 [4]", "needs 8 bytes", "hold 4");
    sf_one(d, sizeof d, "span_too_long", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12);
    SF_FAILS(d, "model.safetensors", "'a'", "F32 [2]", "needs 8 bytes", "hold 12");
    sf_one(d, sizeof d, "scalar_size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,0]}}", 0);
    SF_FAILS(d, "model.safetensors", "'a'", "needs 4 bytes", "hold 0");
    // element count and byte size overflow (2^32 × 2^32; 2^62 elements × 4 bytes)
    sf_one(d, sizeof d, "numel_overflow", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", 0);
    SF_FAILS(d, "model.safetensors", "'a'", "element count overflows");
    sf_one(d, sizeof d, "bytes_overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0);
    SF_FAILS(d, "model.safetensors", "'a'", "byte size overflows");
    sf_one(d, sizeof d, "shape_past_int64", "{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,0]}}", 0);
    SF_FAILS(d, "model.safetensors", "'a'", "shape entry 0");
    // dtype: unknown (F4 exists in safetensors but not here), misspelt, not a string, absent
    sf_one(d, sizeof d, "dtype_f4", "{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1);
    SF_FAILS(d, "model.safetensors", "'a'", "unsupported dtype 'F4'");
    sf_one(d, sizeof d, "dtype_lower", "{\"a\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2);
    SF_FAILS(d, "model.safetensors", "'a'", "unsupported dtype 'bf16'");
    sf_one(d, sizeof d, "dtype_number", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    SF_FAILS(d, "model.safetensors", "'a'", "unsupported dtype number");
    sf_one(d, sizeof d, "dtype_absent", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    SF_FAILS(d, "model.safetensors", "'a'", "unsupported dtype absent");
    // shape and data_offsets of the wrong form
    sf_one(d, sizeof d, "shape_negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4);
    SF_FAILS(d, "model.safetensors", "'a'", "shape entry 0", "non-negative integer");
    sf_one(d, sizeof d, "shape_fraction", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2.5],\"data_offsets\":[0,4]}}", 4);
    SF_FAILS(d, "model.safetensors", "'a'", "shape entry 1");
    sf_one(d, sizeof d, "shape_rank9", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
    SF_FAILS(d, "model.safetensors", "'a'", "no valid shape", "at most 8");
    sf_one(d, sizeof d, "shape_string", "{\"a\":{\"dtype\":\"U8\",\"shape\":\"[1]\",\"data_offsets\":[0,1]}}", 1);
    SF_FAILS(d, "model.safetensors", "'a'", "no valid shape");
    sf_one(d, sizeof d, "offsets_three", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1);
    SF_FAILS(d, "model.safetensors", "'a'", "data_offsets");
    sf_one(d, sizeof d, "offsets_absent", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1);
    SF_FAILS(d, "model.safetensors", "'a'", "no valid data_offsets");
    sf_one(d, sizeof d, "offsets_negative", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1);
    SF_FAILS(d, "model.safetensors", "'a'", "0 <= begin <= end");
    sf_one(d, sizeof d, "offsets_float", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1);
    SF_FAILS(d, "model.safetensors", "'a'", "two integers");
    sf_one(d, sizeof d, "entry_not_object", "{\"a\":[0,1]}", 1);
    SF_FAILS(d, "model.safetensors", "entry 'a' is not an object");
    // names: empty, too long (MOET_MAX_NAME), with a NUL; the longest allowed passes
    sf_one(d, sizeof d, "name_empty", "{" F32_1("", 0, 4) "}", 4);
    SF_FAILS(d, "model.safetensors", "tensor name is empty");
    {
        char h[1200], name[MOET_MAX_NAME + 1];
        memset(name, 'n', MOET_MAX_NAME);
        name[MOET_MAX_NAME] = 0;
        snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
        sf_one(d, sizeof d, "name_too_long", h, 1);
        SF_FAILS(d, "model.safetensors", "512 bytes", "too long", "limit 511");
        name[MOET_MAX_NAME - 1] = 0;
        snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
        sf_one(d, sizeof d, "name_longest", h, 1);
        if (sf_open_ok(d) == 0) {
            CHECK(st_find(&sf_set, name) != NULL);
            st_close(&sf_set);
        }
    }
    sf_one(d, sizeof d, "name_nul", "{" F32_1("a\\u0000b", 0, 4) "}", 4);
    SF_FAILS(d, "model.safetensors", "'a'", "contains a NUL byte");
    // __metadata__ maps strings to strings
    sf_one(d, sizeof d, "metadata_number", "{\"__metadata__\":{\"format\":\"pt\",\"step\":1}," F32_1("a", 0, 4) "}", 4);
    SF_FAILS(d, "model.safetensors", "__metadata__", "'step'", "not a string");
    sf_one(d, sizeof d, "metadata_nested", "{\"__metadata__\":{\"x\":{}}}", 0);
    SF_FAILS(d, "model.safetensors", "__metadata__", "'x'", "not a string");
    sf_one(d, sizeof d, "metadata_array", "{\"__metadata__\":[]}", 0);
    SF_FAILS(d, "model.safetensors", "__metadata__ is not an object");
    // one name twice in one header (both kept by the JSON reader, first wins for js_get)
    sf_one(d, sizeof d, "duplicate_in_shard", "{" F32_1("x", 0, 4) "," F32_1("x", 4, 8) "}", 8);
    SF_FAILS(d, "model.safetensors", "'x'", "appears twice");
}

static void test_corrupt_header(void) {
    char d[256];
    const char *ok = "{" F32_1("a", 0, 4) "," F32_1("b", 4, 8) "}";
    size_t okn = strlen(ok);
    // the length prefix: past the file, past the 100,000,000-byte limit (also near 2^64)
    sf_newdir(d, sizeof d, "len_past_file");
    sf_write_raw(d, "model.safetensors", 1000, ok, okn, 8);
    SF_FAILS(d, "model.safetensors", "header length 1000", "past the end");
    sf_newdir(d, sizeof d, "len_one_past_file");
    sf_write_raw(d, "model.safetensors", okn + 9, ok, okn, 8);
    SF_FAILS(d, "model.safetensors", "past the end");
    static const uint64_t huge[] = {MOET_ST_MAX_HEADER + 1, 1ull << 32, 1ull << 63, UINT64_MAX};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        sf_newdir(d, sizeof d, "len_over_limit");
        sf_write_raw(d, "model.safetensors", huge[i], ok, okn, 8);
        SF_FAILS(d, "model.safetensors", "exceeds the limit of 100000000");
    }
    // the header must be a JSON object that starts with '{'
    sf_newdir(d, sizeof d, "not_brace");
    sf_write_raw(d, "model.safetensors", 2, "[]", 2, 0);
    SF_FAILS(d, "model.safetensors", "does not start with '{'", "0x5b");
    sf_newdir(d, sizeof d, "leading_space");
    sf_write_raw(d, "model.safetensors", 3, " {}", 3, 0);
    SF_FAILS(d, "model.safetensors", "does not start with '{'", "0x20");
    sf_newdir(d, sizeof d, "len_zero");
    sf_write_raw(d, "model.safetensors", 0, "", 0, 0);
    SF_FAILS(d, "model.safetensors", "header length 0", "too short");
    sf_newdir(d, sizeof d, "len_one");
    sf_write_raw(d, "model.safetensors", 1, "{", 1, 0);
    SF_FAILS(d, "model.safetensors", "header length 1", "too short");
    // invalid JSON, with its byte offset inside the header
    sf_one(d, sizeof d, "bad_json", "{\"a\":}", 0);
    SF_FAILS(d, "model.safetensors", "invalid JSON", "at byte 5");
    sf_newdir(d, sizeof d, "nul_padding");   // padding must be spaces, not NULs
    sf_write_raw(d, "model.safetensors", 8, "{}\0\0\0\0\0\0", 8, 0);
    SF_FAILS(d, "model.safetensors", "invalid JSON", "at byte 2");
    sf_one(d, sizeof d, "two_values", "{}{}", 0);
    SF_FAILS(d, "model.safetensors", "invalid JSON", "trailing");
    sf_one(d, sizeof d, "bad_utf8", "{\"\xC0\xAF\":1}", 0);
    SF_FAILS(d, "model.safetensors", "invalid JSON", "UTF-8");
    // short and empty files
    static const uint8_t bytes8[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    for (size_t n = 1; n < 8; n++) {
        sf_newdir(d, sizeof d, "short");
        sf_write_bytes(d, "model.safetensors", bytes8, n);
        char want[32];
        snprintf(want, sizeof want, "%zu bytes, too short", n);
        SF_FAILS(d, "model.safetensors", want);
    }
    sf_newdir(d, sizeof d, "empty");
    sf_write_bytes(d, "model.safetensors", "", 0);
    SF_FAILS(d, "model.safetensors", "empty file");
    // a valid file cut at several points: inside the length, inside the header, at its end,
    // inside the data, one byte short
    sf_newdir(d, sizeof d, "whole");
    size_t hl = sf_write(d, "model.safetensors", ok, 8);
    static uint8_t full[512];
    size_t total = 8 + hl + 8;
    {
        char path[300];
        snprintf(path, sizeof path, "%s/model.safetensors", d);
        FILE *f = fopen(path, "rb");
        MOET_ASSERT(f && fread(full, 1, sizeof full, f) == total, "reading back %s", path);
        fclose(f);
        if (sf_open_ok(d) == 0) st_close(&sf_set);
    }
    const struct { size_t cut; const char *w1, *w2; } cuts[] = {
        {0, "empty file", NULL},
        {5, "5 bytes, too short", NULL},
        {8, "past the end", NULL},
        {8 + hl / 2, "past the end", NULL},
        {8 + hl - 1, "past the end", NULL},
        {8 + hl, "'a'", "past the data buffer of 0 bytes"},
        {8 + hl + 5, "'b'", "past the data buffer of 5 bytes"},
        {total - 1, "'b'", "past the data buffer of 7 bytes"},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        sf_newdir(d, sizeof d, "cut");
        sf_write_bytes(d, "model.safetensors", full, cuts[i].cut);
        if (cuts[i].w2) SF_FAILS(d, "model.safetensors", cuts[i].w1, cuts[i].w2);
        else SF_FAILS(d, "model.safetensors", cuts[i].w1);
    }
}

static void test_corrupt_sets(void) {
    char d[256], sub[300];
    size_t hl[2];
    // no directory, no shard, a shard that is a directory
    snprintf(sub, sizeof sub, "%s/does_not_exist", sf_root);
    SF_FAILS(sub, "does_not_exist", "cannot open the model directory");
    sf_newdir(d, sizeof d, "no_shards");
    sf_write_text(d, "config.json", "{}");
    SF_FAILS(d, "no *.safetensors file");
    sf_newdir(d, sizeof d, "shard_is_dir");
    snprintf(sub, sizeof sub, "%s/a.safetensors", d);
    MOET_ASSERT(mkdir(sub, 0700) == 0, "mkdir");
    SF_FAILS(d, "a.safetensors", "not a regular file");
    // the same tensor in two shards (scan and index)
    sf_newdir(d, sizeof d, "dup_across");
    sf_write(d, "a.safetensors", "{" F32_1("x", 0, 4) "}", 4);
    sf_write(d, "b.safetensors", "{" F32_1("y", 0, 4) "," F32_1("x", 4, 8) "}", 8);
    SF_FAILS(d, "'x'", "appears twice", "a.safetensors", "b.safetensors");
    sf_write_text(d, "model.safetensors.index.json", "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}");
    SF_FAILS(d, "'x'", "appears twice", "a.safetensors", "b.safetensors");
    // the index names a missing shard, a tensor its shard lacks, a tensor in another shard
    sf_newdir(d, sizeof d, "index_missing_shard");
    sf_two_shards(d, hl);
    sf_write_text(d, "model.safetensors.index.json",
                  "{\"weight_map\":{\"model.norm.weight\":\"" SF_S1 "\",\"lm_head.weight\":\"model-00003-of-00002.safetensors\"}}");
    SF_FAILS(d, "model-00003-of-00002.safetensors", "cannot open", "index");
    sf_newdir(d, sizeof d, "index_tensor_absent");
    sf_two_shards(d, hl);
    sf_write_text(d, "model.safetensors.index.json",
                  "{\"weight_map\":{\"model.norm.weight\":\"" SF_S1 "\",\"model.ghost.weight\":\"" SF_S2 "\"}}");
    SF_FAILS(d, "model.safetensors.index.json", "'model.ghost.weight'", "no shard holds it");
    sf_newdir(d, sizeof d, "index_wrong_shard");
    sf_two_shards(d, hl);
    sf_write_text(d, "model.safetensors.index.json",
                  "{\"weight_map\":{\"model.norm.weight\":\"" SF_S2 "\",\"model.embed.weight\":\"" SF_S1 "\"}}");
    SF_FAILS(d, "'model.norm.weight'", "listed in " SF_S2, "found in " SF_S1);
    // shard names that leave the directory, or are no names
    static const char *bad_names[] = {"sub/a.safetensors", "../a.safetensors", "/etc/passwd", "..", ".", ""};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        char idx[256], want[64];
        sf_newdir(d, sizeof d, "index_bad_name");
        sf_two_shards(d, hl);
        snprintf(idx, sizeof idx, "{\"weight_map\":{\"model.norm.weight\":\"%s\"}}", bad_names[i]);
        sf_write_text(d, "model.safetensors.index.json", idx);
        snprintf(want, sizeof want, "shard name '%s'", bad_names[i]);
        SF_FAILS(d, "model.safetensors.index.json", want, "not a plain file name");
    }
    // the index itself: invalid JSON, no weight_map, a non-string file, NUL in a name
    static const struct { const char *text, *w1, *w2; } idx[] = {
        {"{\"weight_map\":", "invalid JSON", "at byte 14"},
        {"{\"metadata\":{}}", "no weight_map object", NULL},
        {"{\"weight_map\":[]}", "no weight_map object", NULL},
        {"{\"weight_map\":{}}", "no weight_map object", NULL},
        {"[]", "no weight_map object", NULL},
        {"{\"weight_map\":{\"model.norm.weight\":1}}", "'model.norm.weight'", "not a file name"},
        {"{\"weight_map\":{\"model.norm.weight\":\"" SF_S1 "\\u0000x\"}}", "'model.norm.weight'", "NUL"},
        {"{\"weight_map\":{\"model.norm.weight\\u0000x\":\"" SF_S1 "\"}}", "'model.norm.weight'", "NUL"},
    };
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) {
        sf_newdir(d, sizeof d, "index_broken");
        sf_two_shards(d, hl);
        sf_write_text(d, "model.safetensors.index.json", idx[i].text);
        if (idx[i].w2) SF_FAILS(d, "model.safetensors.index.json", idx[i].w1, idx[i].w2);
        else SF_FAILS(d, "model.safetensors.index.json", idx[i].w1);
    }
    // a corruption in the second shard is reported with that shard's name
    sf_newdir(d, sizeof d, "second_shard_bad");
    sf_write(d, SF_S1, sf_shard1, 24);
    sf_write(d, SF_S2, sf_shard2, 11);
    sf_write_text(d, "model.safetensors.index.json", sf_index);
    SF_FAILS(d, SF_S2, "'lm_head.weight_scale_2'", "past the data buffer of 11 bytes");
}

// ---- the real fixtures, checked against their config.json -------------------------------

static const char *SF_LM = "model.language_model.";

// Tensor `name` (after the language-model prefix) exists with this dtype (NULL: any) and shape.
static const st_tensor *sf_has(int line, const st_set *s, const char *name, const char *dtype, int ndim,
                               int64_t d0, int64_t d1, int64_t d2) {
    char nm[512];
    snprintf(nm, sizeof nm, "%s%s", strncmp(name, "lm_head", 7) ? SF_LM : "", name);
    const st_tensor *t = st_find(s, nm);
    if (!t) {
        CHECK(0, "line %d: '%s' missing", line, nm);
        return NULL;
    }
    int64_t want[3] = {d0, d1, d2};
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == want[i];
    char got[96];
    // one check per tensor: its shape and dtype
    CHECK(same && (!dtype || !strcmp(st_dtype_name(t->dtype), dtype)), "line %d: '%s' %s %s, want %s rank %d [%" PRId64 ", %" PRId64
          ", %" PRId64 "]", line, nm, st_dtype_name(t->dtype), st_shape_str(t->shape, t->ndim, got, sizeof got), dtype ? dtype : "any",
          ndim, d0, d1, d2);
    return t;
}
#define SF_HAS(s, name, dtype, ndim, d0, d1, d2) sf_has(__LINE__, s, name, dtype, ndim, d0, d1, d2)

// A linear layer's weight, logically [N, K], in its stored format (format/CHECKPOINT.md §A.6–A.7):
// BF16 [N, K]; FP8: F8_E4M3 [N, K] with an F32 scalar weight_scale; NVFP4: U8 [N, K/2] (two
// e2m1 per byte) with F8_E4M3 weight_scale [N, K/16] and an F32 scalar weight_scale_2.
static void sf_linear(int line, const st_set *s, const char *prefix, int64_t N, int64_t K) {
    char nm[512], full[600];
    snprintf(nm, sizeof nm, "%s.weight", prefix);
    snprintf(full, sizeof full, "%s%s", strncmp(nm, "lm_head", 7) ? SF_LM : "", nm);
    const st_tensor *t = st_find(s, full);
    CHECK(t != NULL, "line %d: '%s' missing", line, full);
    if (!t) return;
    if (t->dtype == ST_BF16) {
        sf_has(line, s, nm, "BF16", 2, N, K, 0);
    } else if (t->dtype == ST_F8_E4M3) {
        sf_has(line, s, nm, "F8_E4M3", 2, N, K, 0);
        snprintf(nm, sizeof nm, "%s.weight_scale", prefix);
        sf_has(line, s, nm, "F32", 0, 0, 0, 0);
    } else if (t->dtype == ST_U8) {
        sf_has(line, s, nm, "U8", 2, N, K / 2, 0);
        snprintf(nm, sizeof nm, "%s.weight_scale", prefix);
        sf_has(line, s, nm, "F8_E4M3", 2, N, K / 16, 0);
        snprintf(nm, sizeof nm, "%s.weight_scale_2", prefix);
        sf_has(line, s, nm, "F32", 0, 0, 0, 0);
    } else {
        CHECK(0, "line %d: '%s' has dtype %s, not a linear weight format", line, full, st_dtype_name(t->dtype));
    }
}
#define SF_LINEAR(s, prefix, N, K) sf_linear(__LINE__, s, prefix, N, K)

static int64_t sf_cfg(const js_doc *d, const js_node *tc, const char *key) {
    int64_t v = -1;
    CHECK(js_int(js_get(d, tc, key), &v) == 0 && v > 0, "config.json: %s missing or not a positive integer", key);
    return v;
}

// The 8-byte header length of a shard, read with stdio (independent of the reader under test).
static uint64_t sf_file_header_len(const char *path, uint64_t *file_size) {
    uint8_t b[8] = {0};
    FILE *f = fopen(path, "rb");
    uint64_t n = 0;
    *file_size = 0;
    if (!f) return 0;
    if (fread(b, 1, 8, f) == 8)
        for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    fseek(f, 0, SEEK_END);
    *file_size = (uint64_t)ftell(f);
    fclose(f);
    return n;
}

static void test_fixture(const char *dir) {
    char path[600];
    long live = mc_live;
    moet_err e = {{0}};
    // config.json: text_config, or the flat form
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *text = arena_read_small(path, MOET_MAX_CONFIG_BYTES, &len, &e);
    CHECK(text != NULL, "%s", e.msg);
    if (!text) return;
    js_doc cfg;
    int rc = js_load_doc(&cfg, text, len, path, &e);
    arena_sys_free(text, len + 1);
    CHECK(rc == 0, "%s", e.msg);
    if (rc) return;
    const js_node *tc = js_get(&cfg, js_root(&cfg), "text_config");
    if (!tc) tc = js_root(&cfg);
    int64_t H = sf_cfg(&cfg, tc, "hidden_size"), L = sf_cfg(&cfg, tc, "num_hidden_layers"),
            V = sf_cfg(&cfg, tc, "vocab_size"), E = sf_cfg(&cfg, tc, "num_experts"),
            I = sf_cfg(&cfg, tc, "moe_intermediate_size"), SI = sf_cfg(&cfg, tc, "shared_expert_intermediate_size"),
            NH = sf_cfg(&cfg, tc, "num_attention_heads"), KVH = sf_cfg(&cfg, tc, "num_key_value_heads"),
            HD = sf_cfg(&cfg, tc, "head_dim"), NK = sf_cfg(&cfg, tc, "linear_num_key_heads"),
            NV = sf_cfg(&cfg, tc, "linear_num_value_heads"), DK = sf_cfg(&cfg, tc, "linear_key_head_dim"),
            DV = sf_cfg(&cfg, tc, "linear_value_head_dim"), KC = sf_cfg(&cfg, tc, "linear_conv_kernel_dim");
    const js_node *gate = js_get(&cfg, tc, "attn_output_gate"), *types = js_get(&cfg, tc, "layer_types");
    int64_t q_rows = NH * HD * (gate && gate->type == JS_TRUE ? 2 : 1);   // the output gate doubles q_proj
    CHECK(types && types->type == JS_ARR && types->len == (uint32_t)L, "%s: layer_types", path);

    if (sf_open_ok(dir) == 0) {
        const st_set *s = &sf_set;
        char nm[256];
        // every dtype is one this checkpoint format uses (format/CHECKPOINT.md §B)
        int dt_ok = 1;
        for (uint32_t i = 0; i < s->n_tensors; i++) {
            int dt = s->tensors[i].dtype;
            dt_ok &= dt == ST_BF16 || dt == ST_F32 || dt == ST_F8_E4M3 || dt == ST_U8;
        }
        CHECK(dt_ok, "%s: a dtype outside BF16/F32/F8_E4M3/U8", dir);
        // each shard's tensors fill exactly its data buffer: file size - 8 - header length
        for (int sh = 0; sh < s->n_shards; sh++) {
            uint64_t fsize, hlen = sf_file_header_len(s->shard_path[sh], &fsize);
            size_t sum = 0;
            const char *outside = NULL;
            for (uint32_t i = 0; i < s->n_tensors; i++)
                if (s->tensors[i].shard == sh) {
                    const st_tensor *t = &s->tensors[i];
                    sum += t->bytes;
                    if (!(t->data >= s->maps[sh].data + 8 + hlen && t->data + t->bytes <= s->maps[sh].data + fsize)) outside = t->name;
                }
            CHECK(!outside, "'%s' points outside its data buffer", outside);
            CHECK(fsize > 8 + hlen && sum == fsize - 8 - hlen, "%s: tensors hold %zu of %" PRIu64 " data bytes",
                  s->shard_path[sh], sum, fsize - 8 - hlen);
        }
        // with an index, it lists every tensor the shards hold
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (access(path, F_OK) == 0) {
            char *it = arena_read_small(path, MOET_MAX_CONFIG_BYTES, &len, &e);
            js_doc idx;
            if (it && js_load_doc(&idx, it, len, path, &e) == 0) {
                const js_node *wm = js_get(&idx, js_root(&idx), "weight_map");
                CHECK(wm && wm->len == s->n_tensors, "%s: index lists %u of %u tensors", dir, wm ? wm->len : 0, s->n_tensors);
                js_free_doc(&idx);
            } else CHECK(0, "%s", e.msg);
            if (it) arena_sys_free(it, len + 1);
        }
        SF_HAS(s, "embed_tokens.weight", "BF16", 2, V, H, 0);
        SF_HAS(s, "norm.weight", "BF16", 1, H, 0, 0);
        SF_LINEAR(s, "lm_head", V, H);
        for (int64_t l = 0; l < L; l++) {
            char p[128];
            snprintf(p, sizeof p, "layers.%" PRId64 ".", l);
#define SF_NM(suffix) (snprintf(nm, sizeof nm, "%s%s", p, suffix), nm)
            SF_HAS(s, SF_NM("input_layernorm.weight"), "BF16", 1, H, 0, 0);
            SF_HAS(s, SF_NM("post_attention_layernorm.weight"), "BF16", 1, H, 0, 0);
            SF_HAS(s, SF_NM("mlp.gate.weight"), "BF16", 2, E, H, 0);
            SF_HAS(s, SF_NM("mlp.shared_expert_gate.weight"), "BF16", 2, 1, H, 0);
            SF_LINEAR(s, SF_NM("mlp.shared_expert.gate_proj"), SI, H);
            SF_LINEAR(s, SF_NM("mlp.shared_expert.up_proj"), SI, H);
            SF_LINEAR(s, SF_NM("mlp.shared_expert.down_proj"), H, SI);
            const js_node *lt = js_at(&cfg, types, (uint32_t)l);
            if (js_str_is(lt, "linear_attention")) {
                int64_t conv = 2 * NK * DK + NV * DV;   // q, k and v channels through the short convolution
                SF_LINEAR(s, SF_NM("linear_attn.in_proj_qkv"), conv, H);
                SF_LINEAR(s, SF_NM("linear_attn.in_proj_z"), NV * DV, H);
                SF_LINEAR(s, SF_NM("linear_attn.out_proj"), H, NV * DV);
                SF_HAS(s, SF_NM("linear_attn.in_proj_a.weight"), "BF16", 2, NV, H, 0);
                SF_HAS(s, SF_NM("linear_attn.in_proj_b.weight"), "BF16", 2, NV, H, 0);
                SF_HAS(s, SF_NM("linear_attn.conv1d.weight"), "BF16", 3, conv, 1, KC);
                SF_HAS(s, SF_NM("linear_attn.A_log"), NULL, 1, NV, 0, 0);
                SF_HAS(s, SF_NM("linear_attn.dt_bias"), NULL, 1, NV, 0, 0);
                SF_HAS(s, SF_NM("linear_attn.norm.weight"), NULL, 1, DV, 0, 0);
            } else {
                CHECK(js_str_is(lt, "full_attention"), "%s: layer %" PRId64 " type", dir, l);
                SF_LINEAR(s, SF_NM("self_attn.q_proj"), q_rows, H);
                SF_LINEAR(s, SF_NM("self_attn.k_proj"), KVH * HD, H);
                SF_LINEAR(s, SF_NM("self_attn.v_proj"), KVH * HD, H);
                SF_LINEAR(s, SF_NM("self_attn.o_proj"), H, NH * HD);
                SF_HAS(s, SF_NM("self_attn.q_norm.weight"), "BF16", 1, HD, 0, 0);
                SF_HAS(s, SF_NM("self_attn.k_norm.weight"), "BF16", 1, HD, 0, 0);
            }
            // routed experts: fused BF16 [E, 2I, H] / [E, H, I], or one linear per expert
            snprintf(nm, sizeof nm, "%s%smlp.experts.gate_up_proj", SF_LM, p);
            if (st_find(s, nm)) {
                SF_HAS(s, SF_NM("mlp.experts.gate_up_proj"), "BF16", 3, E, 2 * I, H);
                SF_HAS(s, SF_NM("mlp.experts.down_proj"), "BF16", 3, E, H, I);
            } else {
                for (int64_t x = 0; x < E; x += E - 1) {
                    char ep[200];
                    snprintf(ep, sizeof ep, "%smlp.experts.%" PRId64 ".", p, x);
                    snprintf(nm, sizeof nm, "%sgate_proj", ep);
                    SF_LINEAR(s, nm, I, H);
                    snprintf(nm, sizeof nm, "%sup_proj", ep);
                    SF_LINEAR(s, nm, I, H);
                    snprintf(nm, sizeof nm, "%sdown_proj", ep);
                    SF_LINEAR(s, nm, H, I);
                    if (E == 1) break;
                }
            }
#undef SF_NM
        }
        snprintf(nm, sizeof nm, "%slayers.%" PRId64 ".input_layernorm.weight", SF_LM, L);
        CHECK(st_find(s, nm) == NULL, "%s: a layer past num_hidden_layers", dir);
        st_close(&sf_set);
    }
    js_free_doc(&cfg);
    CHECK(mc_live == live, "%s: %ld mappings left", dir, mc_live - live);
}

static int sf_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int main(void) {
    snprintf(sf_root, sizeof sf_root, "/tmp/moet_st_XXXXXX");
    MOET_ASSERT(mkdtemp(sf_root), "mkdtemp: %s", strerror(errno));
    test_valid_single();
    test_valid_multi();
    test_corrupt_entries();
    test_corrupt_header();
    test_corrupt_sets();
    test_fixture("tests/fixtures/tiny/bf16");
    test_fixture("tests/fixtures/tiny/nvfp4");
    test_fixture("tests/fixtures/demo");
    nftw(sf_root, sf_rm, 16, FTW_DEPTH | FTW_PHYS);
    return check_report("test_safetensors");
}
