// tests/fuzz_planes.c — libFuzzer target for the plane file header and slot table parsers.
//
// Input: one mode byte, then the file's first bytes (header page, then the table). Mode bits:
//   1  recompute header_sha256 over the (fuzzed) header, so the checks behind the hash are reached
//   2  recompute table_sha256 over the (fuzzed) entries first (then the header hash too)
//   4  hand the decoder only the bytes given (a short file) instead of a zero-padded page
// Whatever the bytes, the parsers must return 0 or -1 with a message, never crash or read past.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"

static pf_sha fz_sha;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fz_sha.ctx && pf_sha_init(&fz_sha, NULL)) abort();
    if (size < 1) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    static uint8_t page[PF_PAGE];
    size_t n = size < PF_PAGE ? size : PF_PAGE;
    memset(page, 0, sizeof page);
    memcpy(page, data, n);
    const uint8_t *rest = data + n;   // table bytes as given
    size_t rest_n = size - n;

    uint32_t nl = pf_get32(page + PFH_N_LAYERS), ne = pf_get32(page + PFH_N_EXPERTS);
    uint64_t entries = (uint64_t)nl * ne;
    int small = nl >= 1 && nl <= MOET_MAX_LAYERS && ne >= 1 && ne <= MOET_MAX_EXPERTS;
    size_t tab_cap = small ? (size_t)pf_round_page(entries * PF_ENTRY) : 0;
    uint8_t *tab = tab_cap ? calloc(1, tab_cap) : NULL;
    if (tab) memcpy(tab, rest, rest_n < tab_cap ? rest_n : tab_cap);
    if ((mode & 2) && tab) pf_sha256(&fz_sha, tab, entries * PF_ENTRY, page + PFH_TABLE_SHA);
    if (mode & 3) pf_sha256(&fz_sha, page, PF_HASHED, page + PFH_HEADER_SHA);

    pf_header h;
    moet_err e = {{0}};
    if (pf_header_decode(page, (mode & 4) ? n : PF_PAGE, &fz_sha, &h, &e) == 0) {
        MOET_ASSERT(h.L.table_bytes == tab_cap, "a valid header implies the table size the fuzzer planned");
        char json[4096];
        MOET_ASSERT(pf_header_json(&h, json, sizeof json) == 0, "header JSON fits");
        (void)pf_check_abi(&h, &e);
        pf_geom g = {4, 0, 16, 128, 64};
        (void)pf_check_geometry(&h, &g, &e);
        (void)pf_check_source(&h, "0123456789abcdef0123456789abcdef01234567", 0, &e);
        pf_entry *t = malloc(sizeof(pf_entry) * (size_t)h.L.n_slots);
        if (t && pf_table_decode(&h, tab, &fz_sha, t, &e) == 0) {
            for (uint64_t i = 0; i < h.L.n_slots; i++) {
                int64_t k = pf_slot_index(&h.L, t[i].layer, t[i].expert);
                MOET_ASSERT(k == (int64_t)i && t[i].offset + t[i].bytes <= h.L.file_bytes, "a valid table entry is in range");
            }
        }
        free(t);
    } else {
        MOET_ASSERT(e.msg[0], "a refusal says why");
    }
    free(tab);
    // the snapshot path parser, on the input as a path
    char path[512], repo[256], rev[256];
    size_t k = size < sizeof path - 1 ? size : sizeof path - 1;
    memcpy(path, data, k);
    path[k] = 0;
    if (ck_hf_snapshot(path, repo, sizeof repo, rev, sizeof rev)) MOET_ASSERT(strlen(repo) < sizeof repo, "repo fits");
    return 0;
}
