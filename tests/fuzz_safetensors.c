// tests/fuzz_safetensors.c — libFuzzer target for st_open (./build.sh fuzz).
//
// The first input byte picks how the rest becomes files in a private temporary directory:
//   mode 0  raw:    the rest is the whole file model.safetensors (opened by its directory, or
//                   by its own path when bit 2 of the first byte is set)
//   mode 1  header: bytes 1-2 are a u16 LE data length D, the rest is the JSON header; the file
//                   is u64 LE header length | header | D bytes of data, so mutations reach the
//                   validation past the length prefix
//   mode 2  set:    the rest split at "\n@@\n": part 0, when not empty, is
//                   model.safetensors.index.json; parts 1..3 are shards s1/s2/s3.safetensors,
//                   each in the header form of mode 1
// st_open must never crash; when it accepts, every tensor lies inside its shard's mapping,
// has numel × dtype size bytes and is found by name; either way st_close / the error path
// must give back every mapping (mmap_count.h; LeakSanitizer does not see mmap).
#include "mmap_count.h"
#include "../moet.c"

static char fz_dir[64];
static st_set fz_set;   // MOET_MAX_SHARDS paths (1 MiB): static
static const char *fz_files[] = {"model.safetensors", "model.safetensors.index.json", "s1.safetensors",
                                 "s2.safetensors", "s3.safetensors"};
enum { FZ_N_FILES = sizeof fz_files / sizeof fz_files[0] };

static void fz_path(char *out, size_t cap, const char *file) { snprintf(out, cap, "%s/%s", fz_dir, file); }

static void fz_clean(void) {
    char p[128];
    for (int i = 0; i < FZ_N_FILES; i++) {
        fz_path(p, sizeof p, fz_files[i]);
        unlink(p);
    }
}

static void fz_cleanup_at_exit(void) {
    fz_clean();
    rmdir(fz_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(fz_dir, sizeof fz_dir, "/tmp/moet_fuzz_st_XXXXXX");
    MOET_ASSERT(mkdtemp(fz_dir), "mkdtemp: %s", strerror(errno));
    atexit(fz_cleanup_at_exit);
    return 0;
}

static void fz_put(FILE *f, const void *p, size_t n) { MOET_ASSERT(fwrite(p, 1, n, f) == n, "write failed"); }

// Writes file: the raw bytes, or (header form) u64 length | header | data_len bytes.
static void fz_write(const char *file, const uint8_t *bytes, size_t n, int header_form) {
    char p[128];
    fz_path(p, sizeof p, file);
    FILE *f = fopen(p, "wb");
    MOET_ASSERT(f, "%s: %s", p, strerror(errno));
    if (!header_form) {
        fz_put(f, bytes, n);
    } else {
        size_t data_len = n >= 2 ? (size_t)(bytes[0] | bytes[1] << 8) : 0;
        const uint8_t *hdr = n >= 2 ? bytes + 2 : bytes;
        size_t hn = n >= 2 ? n - 2 : 0;
        uint8_t len8[8];
        for (int b = 0; b < 8; b++) len8[b] = (uint8_t)((uint64_t)hn >> (8 * b));
        fz_put(f, len8, 8);
        fz_put(f, hdr, hn);
        static uint8_t zeros[65536];
        fz_put(f, zeros, data_len);
    }
    MOET_ASSERT(fclose(f) == 0, "close failed");
}

static const uint8_t *fz_find(const uint8_t *s, size_t n, const char *sep, size_t k) {
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, sep, k)) return s + i;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fz_clean();
    int mode = data[0] % 3, by_file = (data[0] >> 2) & 1;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    char open_path[128];
    snprintf(open_path, sizeof open_path, "%s", fz_dir);
    if (mode == 0) {
        fz_write("model.safetensors", rest, n, 0);
        if (by_file) fz_path(open_path, sizeof open_path, "model.safetensors");
    } else if (mode == 1) {
        fz_write("model.safetensors", rest, n, 1);
    } else {
        static const char sep[] = "\n@@\n";
        for (int part = 0; part < 4; part++) {
            const uint8_t *end = fz_find(rest, n, sep, 4);
            size_t k = end ? (size_t)(end - rest) : n;
            if (part == 0 && k) fz_write("model.safetensors.index.json", rest, k, 0);
            if (part > 0) fz_write(fz_files[1 + part], rest, k, 1);
            if (!end) break;
            rest = end + 4;
            n -= k + 4;
        }
    }
    long live = mc_live;
    long long bytes = mc_bytes;
    moet_err e = {{0}};
    if (st_open(&fz_set, open_path, &e) == 0) {
        MOET_ASSERT(fz_set.n_shards >= 1 && fz_set.n_shards <= MOET_MAX_SHARDS, "%d shards", fz_set.n_shards);
        for (uint32_t i = 0; i < fz_set.n_tensors; i++) {
            const st_tensor *t = &fz_set.tensors[i];
            MOET_ASSERT(t->shard >= 0 && t->shard < fz_set.n_shards, "'%s' in shard %d", t->name, t->shard);
            const arena_map *m = &fz_set.maps[t->shard];
            MOET_ASSERT(t->data >= m->data + 8 && t->bytes <= m->size && t->data - m->data <= (ptrdiff_t)(m->size - t->bytes),
                        "'%s' [%p, +%zu) outside its %zu-byte mapping", t->name, (const void *)t->data, t->bytes, m->size);
            MOET_ASSERT(t->dtype >= 0 && t->dtype < ST_N_DTYPES && t->ndim >= 0 && t->ndim <= MOET_MAX_DIMS, "'%s'", t->name);
            size_t numel = 1;
            for (int k = 0; k < t->ndim; k++) {
                MOET_ASSERT(t->shape[k] >= 0, "'%s' negative dim", t->name);
                numel *= (size_t)t->shape[k];   // cannot wrap: st_open checked it
            }
            MOET_ASSERT(numel == t->numel && t->bytes == numel * (size_t)st_dtypes[t->dtype].bytes, "'%s' size", t->name);
            MOET_ASSERT(st_find(&fz_set, t->name) == t, "'%s' not found by name", t->name);
            volatile uint8_t sink = 0;
            if (t->bytes) sink ^= t->data[0] ^ t->data[t->bytes - 1];
            (void)sink;
        }
        st_close(&fz_set);
    } else {
        MOET_ASSERT(e.msg[0], "st_open failed without a message");
        MOET_ASSERT(fz_set.n_tensors == 0 && fz_set.n_shards == 0 && fz_set.mem == NULL, "set not emptied on error");
    }
    MOET_ASSERT(mc_live == live && mc_bytes == bytes, "%ld mappings (%lld bytes) left behind: %s", mc_live - live,
                mc_bytes - bytes, e.msg);
    return 0;
}
