// tests/test_planes.c — the MOET2PF1 plane file: layout, quantizer, writer, reader, verifier.
//
// The expected slot bytes come from the fixture (golden.safetensors planes.slots, made by the
// reference implementation in make_fixtures.py with torch). A second oracle, written here as a
// literal transliteration of that Python (bucketize over the midpoints, the 16-entry nibble table,
// the [N/16,2,8,K/64,2,2,4,4] view permuted to (0,3,2,6,1,4,5,7)), checks edge cases the fixture
// does not reach: exact midpoints, zero blocks, tiny and huge blocks, the 5% zero-sign boundary.
#include "../moet.c"
#include "check.h"

#define FIX "tests/fixtures/tiny"

static char tdir[64];   // scratch directory of this test run

static void tpath(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tdir, name); }

// ---- the literal oracle (make_fixtures.py planes_quant, pack_codes, pack_scales) -------------

#define REF_MAX (256 * 256)
static const uint8_t ref_nib2code[16] = {2, 2, 2, 2, 2, 3, 3, 3, 1, 1, 1, 1, 1, 0, 0, 0};
static uint8_t ref_codes[REF_MAX], ref_sb[REF_MAX / 32];

static void ref_quant(const double *w, int N, int K, uint8_t *codes_out, uint8_t *scales_out) {
    static const double mids[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
    static double ex[REF_MAX / 32];
    static uint8_t neg[REF_MAX], zero[REF_MAX], mag[REF_MAX];
    int KS = K / 32;
    for (int n = 0; n < N; n++)
        for (int b = 0; b < KS; b++) {
            double amax = 0;
            for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(w[n * K + b * 32 + j]));
            double x = amax > 0 ? rint(log2(amax / 6.0 + 1e-30)) : -127.0;
            x = x < -127 ? -127 : x > 127 ? 127 : x;
            ex[n * KS + b] = x;
            ref_sb[n * KS + b] = (uint8_t)(x + 127.0);
        }
    long nz = 0, nneg = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            double u = w[n * K + k] / exp2(ex[n * KS + k / 32]);
            int m = 0;
            while (m < 7 && mids[m] < fabs(u)) m++;   // torch.bucketize(right=False)
            mag[n * K + k] = (uint8_t)m;
            neg[n * K + k] = signbit(u) != 0;
            zero[n * K + k] = u == 0;
            nz += zero[n * K + k];
            nneg += zero[n * K + k] && neg[n * K + k];
        }
    if (nz && fmin((double)nneg, (double)(nz - nneg)) < 0.05 * (double)nz)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                if (zero[n * K + k]) neg[n * K + k] = k & 1;
    for (int i = 0; i < N * K; i++) ref_codes[i] = ref_nib2code[mag[i] | neg[i] << 3];
    // pack_codes: c.view(N/16, 2, 8, K/64, 2, 2, 4, 4).permute(0, 3, 2, 6, 1, 4, 5, 7), 4 j's a byte
    size_t o = 0;
    for (int a0 = 0; a0 < N / 16; a0++)
        for (int a3 = 0; a3 < K / 64; a3++)
            for (int a2 = 0; a2 < 8; a2++)
                for (int a6 = 0; a6 < 4; a6++)
                    for (int a1 = 0; a1 < 2; a1++)
                        for (int a4 = 0; a4 < 2; a4++)
                            for (int a5 = 0; a5 < 2; a5++) {
                                int row = a0 * 16 + a1 * 8 + a2, k = a3 * 64 + a4 * 32 + a5 * 16 + a6 * 4;
                                const uint8_t *c = ref_codes + row * K + k;
                                codes_out[o++] = (uint8_t)(c[0] | c[1] << 2 | c[2] << 4 | c[3] << 6);
                            }
    // pack_scales: sb.view(N/16, 16, KS).transpose(1, 2)
    for (int a = 0; a < N / 16; a++)
        for (int b = 0; b < KS; b++)
            for (int r = 0; r < 16; r++) scales_out[(a * KS + b) * 16 + r] = ref_sb[(a * 16 + r) * KS + b];
}

// Compares pf_quant_matrix with the oracle on W [N, K]; also the dequantized values.
static void check_matrix(const char *name, const double *w, int N, int K) {
    static uint8_t c1[REF_MAX / 4], s1[REF_MAX / 32], c2[REF_MAX / 4], s2[REF_MAX / 32], scratch[REF_MAX];
    static float deq[REF_MAX];
    moet_err e = {{0}};
    int rc = pf_quant_matrix(w, (uint32_t)N, (uint32_t)K, c1, s1, scratch, name, &e);
    CHECK(rc == 0, "%s: %s", name, e.msg);
    ref_quant(w, N, K, c2, s2);
    size_t nc = (size_t)N * K / 4, ns = (size_t)N * K / 32, bad = 0;
    for (size_t i = 0; i < nc; i++) bad += c1[i] != c2[i];
    CHECK(bad == 0, "%s: %zu of %zu code bytes differ from the oracle", name, bad, nc);
    CHECK(memcmp(s1, s2, ns) == 0, "%s: scale bytes differ from the oracle", name);
    // dequantized by the serving decoder (ck_row_f32 on the packed bytes) against
    // level {-4,-1,1,4}[code] · 2^(byte - 127) from the oracle's unpacked codes
    ck_mat m = {.kind = CK_W_PLANES, .rows = N, .cols = K, .w = c1, .scale = s1};
    for (int n = 0; n < N; n++) ck_row_f32(&m, n, deq + (size_t)n * K);
    static const double lv[4] = {-4, -1, 1, 4};
    bad = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            double want = lv[ref_codes[n * K + k]] * exp2((double)ref_sb[n * (K / 32) + k / 32] - 127.0);
            bad += (double)deq[n * K + k] != (float)want;
        }
    CHECK(bad == 0, "%s: %zu dequantized values differ", name, bad);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {   // splitmix64
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rnd(void) { return (double)(rng() >> 11) * 0x1p-53 * 2 - 1; }   // [-1, 1)

static void test_quantizer_edges(void) {
    static double w[64 * 128];
    int N = 64, K = 128;
    for (int i = 0; i < N * K; i++) w[i] = rnd() * 0.05;
    // row 0: all zero, mixed signs of zero
    for (int k = 0; k < K; k++) w[k] = (k % 3) ? 0.0 : -0.0;
    // row 1: amax 6 (e = 0) and values exactly on the midpoints and next to them
    static const double mid[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
    for (int k = 0; k < K; k++) {
        double m = mid[k % 7];
        double v = (k / 7) % 3 == 0 ? m : (k / 7) % 3 == 1 ? nextafter(m, 0) : nextafter(m, 10);
        w[1 * K + k] = (k & 1) ? -v : v;
    }
    for (int b = 0; b < K / 32; b++) w[1 * K + b * 32] = 6.0;
    // row 2: blocks far below 1e-30 (the + 1e-30 term decides the exponent), and 0 with them
    for (int k = 0; k < K; k++) w[2 * K + k] = rnd() * 1e-33;
    // row 3: huge values (exponent near the clamp), row 4: subnormal-sized values
    for (int k = 0; k < K; k++) w[3 * K + k] = rnd() * 1e300;
    for (int k = 0; k < K; k++) w[4 * K + k] = rnd() * 1e-310;
    // row 5: block maxima right at 6·√2·2^j (log2 of amax/6 next to a half integer)
    for (int b = 0; b < K / 32; b++)
        for (int j = 0; j < 32; j++) {
            double a = 6.0 * M_SQRT2 * ldexp(1.0, b - 2);
            w[5 * K + b * 32 + j] = j == 0 ? (b & 1 ? nextafter(a, 0) : a) : rnd() * a;
        }
    // row 6: block maxima exactly on halves, log2(amax/6) = 2.5, 1.5, -2.5, -1.5 (amax = 6·√2·2^j
    // for j = 2, 1, -3, -2; these doubles land on the half exactly, checked below). Rounding
    // half to even gives the exponents 2, 2, -2, -2; half away from zero would give 3, 2, -3, -2.
    static const int half_j[4] = {2, 1, -3, -2}, half_e[4] = {2, 2, -2, -2};
    for (int b = 0; b < K / 32; b++)
        for (int j = 0; j < 32; j++) {
            double a = 6.0 * M_SQRT2 * ldexp(1.0, half_j[b]);
            w[6 * K + b * 32 + j] = j == 5 ? -a : rnd() * a;
        }
    check_matrix("edge rows", w, N, K);
    {
        int exact = 1, ok = 1;
        for (int b = 0; b < 4; b++) {
            double a = 6.0 * M_SQRT2 * ldexp(1.0, half_j[b]);
            exact &= log2(a / 6.0 + 1e-30) == half_j[b] + 0.5;
            ok &= pf_block_exp(a) == half_e[b];
        }
        CHECK(exact, "the test's maxima are not exactly on halves on this machine's log2");
        CHECK(ok, "scale exponents at exact halves: %d %d %d %d, want 2 2 -2 -2 (half to even)", pf_block_exp(6 * M_SQRT2 * 4),
              pf_block_exp(6 * M_SQRT2 * 2), pf_block_exp(6 * M_SQRT2 / 8), pf_block_exp(6 * M_SQRT2 / 4));
        static uint8_t c[64 * 128 / 4], sb[64 * 128 / 32], sc[64 * 128];
        moet_err e = {{0}};
        CHECK(pf_quant_matrix(w, (uint32_t)N, (uint32_t)K, c, sb, sc, "halves", &e) == 0, "%s", e.msg);
        ok = 1;
        for (int b = 0; b < 4; b++) ok &= sb[pf_scale_index(6, (uint32_t)b, (uint32_t)K)] == 127 + half_e[b];
        CHECK(ok, "scale bytes of row 6 (exact halves): %u %u %u %u, want 129 129 125 125",
              sb[pf_scale_index(6, 0, K)], sb[pf_scale_index(6, 1, K)], sb[pf_scale_index(6, 2, K)], sb[pf_scale_index(6, 3, K)]);
    }

    // zero-sign rule: all zeros positive (fires), balanced (keeps), and the 5% boundary
    for (int i = 0; i < N * K; i++) w[i] = (i % 5 == 0) ? 0.0 : rnd();
    check_matrix("one-signed zeros", w, N, K);
    for (int i = 0; i < N * K; i++) w[i] = (i % 5 == 0) ? ((i / 5) & 1 ? -0.0 : 0.0) : rnd();
    check_matrix("balanced zeros", w, N, K);
    // 20 zeros: 1 negative is not < 0.05·20 = 1 (kept); 0 negative fires
    for (int i = 0; i < N * K; i++) w[i] = 0.5 + 0.5 * fabs(rnd());
    for (int z = 0; z < 20; z++) w[z * 97] = z == 7 ? -0.0 : 0.0;
    check_matrix("zeros at the 5% boundary (kept)", w, N, K);
    {
        static uint8_t c[64 * 128 / 4], s[64 * 128 / 32], sc[64 * 128];
        moet_err e;
        pf_quant_matrix(w, (uint32_t)N, (uint32_t)K, c, s, sc, "boundary", &e);
        // element 7·97 = row 5, k 39 keeps its -0 → code 1 (level -1) although k is odd… and
        // element 0 (k 0, +0) keeps +1; with the rule firing both would follow the column parity
        CHECK((sc[7 * 97] & 3) == 1 && (sc[0] & 3) == 2, "zero signs kept at the boundary: %u %u", sc[7 * 97] & 3, sc[0] & 3);
    }
    w[7 * 97] = 0.0;
    check_matrix("zeros at the 5% boundary (fires)", w, N, K);
    {
        static uint8_t c[64 * 128 / 4], s[64 * 128 / 32], sc[64 * 128];
        moet_err e;
        pf_quant_matrix(w, (uint32_t)N, (uint32_t)K, c, s, sc, "boundary", &e);
        CHECK((sc[7 * 97] & 3) == 1 && (sc[6 * 97] & 3) == 2, "one-signed zeros follow the column parity (k %d odd, k %d even)",
              (7 * 97) % K, (6 * 97) % K);
    }
    // random matrices of both expert shapes
    for (int i = 0; i < 128 * 128; i++) w[i % (64 * 128)] = rnd() * 0.1;
    check_matrix("random 64x128", w, 64, 128);
    check_matrix("random 128x64", w, 128, 64);
    // non-finite weights are refused, naming the place
    w[3 * K + 77] = NAN;
    static uint8_t c[64 * 128 / 4], s[64 * 128 / 32], sc[64 * 128];
    moet_err e = {{0}};
    CHECK(pf_quant_matrix(w, (uint32_t)N, (uint32_t)K, c, s, sc, "w2", &e) == -1 && strstr(e.msg, "[3, 77]") &&
          strstr(e.msg, "not finite"), "NaN refused: %s", e.msg);
}

// ---- layout ------------------------------------------------------------------------------

static void test_plan(void) {
    // format/PLANES.md §1 reference numbers for Qwen3.6-35B-A3B (40 x 256, H 2048, I 512)
    pf_geom g = {40, 0, 256, 2048, 512};
    pf_layout L;
    moet_err e = {{0}};
    CHECK(pf_plan(&g, &L, &e) == 0, "%s", e.msg);
    CHECK(L.slot_bytes == 884736 && L.slot_stride == 884736, "slot %" PRIu64 " stride %" PRIu64, L.slot_bytes, L.slot_stride);
    CHECK(L.table_bytes == 491520 && L.body_offset == 495616, "table %" PRIu64 " body %" PRIu64, L.table_bytes, L.body_offset);
    CHECK(L.file_bytes == 9060192256ull, "file_bytes %" PRIu64, L.file_bytes);
    CHECK(L.sec_bytes[0] == 524288 && L.sec_bytes[1] == 65536 && L.sec_bytes[2] == 262144 && L.sec_bytes[3] == 32768,
          "sections");
    // from the real config file, as --plan reads it
    ck_config c;
    const char *ref = "tests/fixtures/reference/qwen36-35b-a3b-nvfp4.config.json";
    CHECK(pf_model_config(ref, &c, &e) == 0, "%s", e.msg);
    pf_geom_of_config(&c, &g);
    CHECK(pf_plan(&g, &L, &e) == 0 && L.file_bytes == 9060192256ull, "--plan of the real config: %" PRIu64, L.file_bytes);
    // geometry the format cannot hold
    pf_geom bad[] = {{0, 0, 8, 128, 64}, {4, 0, 0, 128, 64}, {4, 0, 8, 96, 64}, {4, 0, 8, 128, 48},
                     {4, 0, 8, 128, MOET_PF_MAX_INTER + 64}, {4, MOET_MAX_LAYERS, 8, 128, 64}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.msg[0] = 0;
        CHECK(pf_plan(&bad[i], &L, &e) == -1 && strstr(e.msg, "plane geometry"), "bad geometry %zu: %s", i, e.msg);
    }
    // a slot that is not a page multiple pads to the next page
    pf_geom small = {2, 0, 3, 64, 64};
    CHECK(pf_plan(&small, &L, &e) == 0 && L.slot_bytes == 3 * 64 * 64 / 4 + 3 * 64 * 64 / 32 && L.slot_stride == 4096 &&
          L.table_bytes == 4096 && L.file_bytes == 4096 + 4096 + 6 * 4096, "small layout");
}

// ---- capture the output of a command ------------------------------------------------------

#include "capture.h"

// ---- the fixture: slots bit for bit -------------------------------------------------------

static st_set gold;
static const st_tensor *gold_slots;   // U8 [L, E, slot_bytes]

static void test_fixture_slots(const char *planes_path) {
    moet_err e = {{0}};
    static ck_model m;
    CHECK(ck_open(&m, FIX "/nvfp4", &e) == 0, "%s", e.msg);
    if (!m.layers) return;
    CHECK(!strcmp(m.expert_format, "nvfp4"), "expert format %s", m.expert_format);
    pf_geom g;
    pf_geom_of_config(&m.cfg, &g);
    pf_layout L;
    CHECK(pf_plan(&g, &L, &e) == 0, "%s", e.msg);
    int64_t want_shape[3] = {g.n_layers, g.n_experts, (int64_t)L.slot_bytes};
    CHECK(gold_slots && gold_slots->ndim == 3 && !memcmp(gold_slots->shape, want_shape, sizeof want_shape),
          "planes.slots shape matches the layout (slot_bytes %" PRIu64 ")", L.slot_bytes);
    if (!gold_slots || gold_slots->bytes != L.n_slots * L.slot_bytes) { ck_close(&m); return; }

    // direct: every expert quantized in memory
    size_t w13n = (size_t)2 * g.inter * g.hidden, w2n = (size_t)g.inter * g.hidden;
    double *w13 = arena_sys_alloc(w13n * 8, "t"), *w2 = arena_sys_alloc(w2n * 8, "t");
    uint8_t *slot = arena_sys_alloc(L.slot_bytes, "t"), *scratch = arena_sys_alloc(w13n, "t");
    uint64_t bad = 0;
    for (uint32_t l = 0; l < g.n_layers; l++)
        for (uint32_t x = 0; x < g.n_experts; x++) {
            ck_expert_f64(&m, (int)l, (int)x, w13, w2);
            if (pf_quant_expert(&L, w13, w2, slot, scratch, &e)) CHECK(0, "%s", e.msg);
            const uint8_t *want = gold_slots->data + ((size_t)l * g.n_experts + x) * L.slot_bytes;
            if (memcmp(slot, want, L.slot_bytes)) {
                if (!bad) {
                    size_t k = 0;
                    while (slot[k] == want[k]) k++;
                    fprintf(stderr, "layer %u expert %u: first difference at slot byte %zu: 0x%02x vs golden 0x%02x\n", l, x, k,
                            slot[k], want[k]);
                }
                bad++;
            }
        }
    CHECK(bad == 0, "%" PRIu64 " of %" PRIu64 " slots differ from golden planes.slots", bad, L.n_slots);

    // through the writer, with 1 and 3 threads: identical files, every slot equal to the golden
    char p1[80];
    tpath(p1, sizeof p1, "one.planes");
    pf_build_opts o;
    memset(&o, 0, sizeof o);
    o.geom = g;
    o.source_format = m.expert_format;
    o.source_repo = "test/tiny";
    o.source_revision = "0123456789abcdef0123456789abcdef01234567";
    o.source = pf_expert_source;
    o.source_ctx = &m;
    o.threads = 1;
    o.out_path = p1;
    pf_build_stats st;
    CHECK(pf_build(&o, &st, &e) == 0, "%s", e.msg);
    o.threads = 3;
    o.out_path = planes_path;
    CHECK(pf_build(&o, &st, &e) == 0 && st.slots == L.n_slots, "%s", e.msg);
    arena_map a, b;
    CHECK(arena_map_file(&a, p1, &e) == 0 && arena_map_file(&b, planes_path, &e) == 0, "%s", e.msg);
    CHECK(a.size == L.file_bytes && b.size == a.size && !memcmp(a.data, b.data, a.size), "1 and 3 threads give the same file");
    bad = 0;
    for (uint64_t i = 0; i < L.n_slots && b.size == L.file_bytes; i++) {
        bad += memcmp(b.data + L.body_offset + i * L.slot_stride, gold_slots->data + i * L.slot_bytes, L.slot_bytes) != 0;
        for (uint64_t p = L.slot_bytes; p < L.slot_stride; p++) bad += b.data[L.body_offset + i * L.slot_stride + p] != 0;
    }
    CHECK(bad == 0, "file slots equal the golden and padding is zero (%" PRIu64 " bad)", bad);
    // the header bytes, field by field, against format/PLANES.md §1
    if (b.size >= 4096) {
        const uint8_t *h = b.data;
        CHECK(!memcmp(h, "MOET2PF1", 8) && pf_get32(h + 8) == 1 && pf_get32(h + 12) == 4096, "magic, version, page");
        CHECK(pf_get32(h + 16) == g.n_layers && pf_get32(h + 20) == 0 && pf_get32(h + 24) == g.n_experts &&
              pf_get32(h + 28) == g.hidden && pf_get32(h + 32) == g.inter && pf_get32(h + 36) == 32, "geometry fields");
        CHECK(pf_get64(h + 40) == 3ull * 64 * 128 / 4 + 3ull * 64 * 128 / 32 && pf_get64(h + 48) == 8192 &&
              pf_get64(h + 56) == 4096 && pf_get64(h + 64) == 4096 && pf_get64(h + 72) == 8192 &&
              pf_get64(h + 80) == 8192 + 64ull * 8192, "size fields (6912-byte slots, 64 slots)");
        CHECK(!strcmp((const char *)h + 120, "tsym4-e8m0-fragmajor-m16n8k32-v1") && !strcmp((const char *)h + 184, "test/tiny") &&
              !strcmp((const char *)h + 312, o.source_revision) && !strcmp((const char *)h + 376, "nvfp4"), "text fields");
        CHECK(pf_get32(h + 392) == 0 && pf_get32(h + 396) == 4096 && pf_get32(h + 400) == 4096 && pf_get32(h + 404) == 512 &&
              pf_get32(h + 408) == 4608 && pf_get32(h + 412) == 2048 && pf_get32(h + 416) == 6656 && pf_get32(h + 420) == 256,
              "section fields");
        int zero = 1;
        for (int i = 424; i < 4064; i++) zero &= h[i] == 0;
        CHECK(zero, "reserved bytes zero");
        uint8_t sum[32];
        EVP_Digest(h, 4064, sum, NULL, EVP_sha256(), NULL);
        CHECK(!memcmp(sum, h + 4064, 32), "header_sha256 = SHA-256 of [0, 4064)");
        EVP_Digest(h + 4096, L.n_slots * 48, sum, NULL, EVP_sha256(), NULL);
        CHECK(!memcmp(sum, h + 88, 32), "table_sha256 = SHA-256 of the entries");
        uint64_t tbad = 0;
        for (uint64_t i = 0; i < L.n_slots; i++) {
            const uint8_t *t = h + 4096 + i * 48;
            EVP_Digest(h + 8192 + i * 8192, L.slot_bytes, sum, NULL, EVP_sha256(), NULL);
            tbad += pf_get64(t) != 8192 + i * 8192 || pf_get32(t + 8) != L.slot_bytes || pf_get16(t + 12) != i / 16 ||
                    pf_get16(t + 14) != i % 16 || memcmp(t + 16, sum, 32);
        }
        CHECK(tbad == 0, "table entries: offset, bytes, layer, expert, slot hash (%" PRIu64 " bad)", tbad);
    }
    arena_unmap(&a);
    arena_unmap(&b);
    unlink(p1);

    // the bf16 checkpoint (fused experts) through the same path, against the oracle
    static ck_model mb;
    CHECK(ck_open(&mb, FIX "/bf16", &e) == 0, "%s", e.msg);
    if (mb.layers) {
        CHECK(!strcmp(mb.expert_format, "bf16"), "bf16 expert format %s", mb.expert_format);
        static uint8_t rc13[128 * 128 / 4], rs13[128 * 128 / 32];
        ck_expert_f64(&mb, 2, 5, w13, w2);
        CHECK(pf_quant_expert(&L, w13, w2, slot, scratch, &e) == 0, "%s", e.msg);
        ref_quant(w13, 128, 128, rc13, rs13);
        CHECK(!memcmp(slot, rc13, sizeof rc13) && !memcmp(slot + L.sec_off[PF_W13_SCALES], rs13, sizeof rs13), "bf16 expert w13");
        ref_quant(w2, 128, 64, rc13, rs13);
        CHECK(!memcmp(slot + L.sec_off[PF_W2_CODES], rc13, 128 * 64 / 4) &&
              !memcmp(slot + L.sec_off[PF_W2_SCALES], rs13, 128 * 64 / 32), "bf16 expert w2");
        ck_close(&mb);
    }
    arena_sys_free(w13, w13n * 8);
    arena_sys_free(w2, w2n * 8);
    arena_sys_free(slot, L.slot_bytes);
    arena_sys_free(scratch, w13n);
    ck_close(&m);
}

// ---- reader round trip --------------------------------------------------------------------

static void test_round_trip(const char *path) {
    moet_err e = {{0}};
    pf_file f;
    CHECK(pf_open(&f, path, &e) == 0, "%s", e.msg);
    if (f.fd < 0) return;
    const pf_layout *L = &f.h.L;
    CHECK(L->g.n_layers == 4 && L->g.n_experts == 16 && L->g.hidden == 128 && L->g.inter == 64, "geometry read back");
    CHECK(!strcmp(f.h.source_repo, "test/tiny") && !strcmp(f.h.source_format, "nvfp4") &&
          !strcmp(f.h.source_revision, "0123456789abcdef0123456789abcdef01234567"), "source fields read back");
    pf_verify_stats st;
    CHECK(pf_verify_slots(&f, 2, 0, NULL, &st, &e) == 0 && st.bad == 0, "%s", e.msg);
    // one slot: O_DIRECT into an aligned buffer and buffered into an unaligned one, with hashing
    uint8_t *buf = arena_sys_alloc(2 * L->slot_stride, "t");
    pf_sha sha;
    pf_sha_init(&sha, &e);
    CHECK(pf_read_slot(&f, 3, 9, buf, L->slot_stride, &sha, &e) == 0, "%s", e.msg);
    CHECK(!memcmp(buf, gold_slots->data + (3 * 16 + 9) * L->slot_bytes, L->slot_bytes), "slot (3, 9) bytes");
    CHECK(pf_read_slot(&f, 1, 15, buf + 1, L->slot_bytes, &sha, &e) == 0, "%s", e.msg);
    CHECK(!memcmp(buf + 1, gold_slots->data + (1 * 16 + 15) * L->slot_bytes, L->slot_bytes), "slot (1, 15) unaligned");
    e.msg[0] = 0;
    CHECK(pf_read_slot(&f, 4, 0, buf, L->slot_stride, NULL, &e) == -1 && strstr(e.msg, "no slot for layer 4"), "%s", e.msg);
    CHECK(pf_read_slot(&f, 0, 16, buf, L->slot_stride, NULL, &e) == -1 && strstr(e.msg, "expert 16"), "%s", e.msg);
    CHECK(pf_read_slot(&f, 0, 0, buf, L->slot_bytes - 1, NULL, &e) == -1 && strstr(e.msg, "buffer"), "%s", e.msg);
    // pf_expert_mats slices the slot into gate | up (rows of w13) and down: their rows equal the
    // rows of the whole w13 [2I, H] and w2 [H, I] matrices of the slot
    CHECK(pf_read_slot(&f, 2, 4, buf, L->slot_stride, &sha, &e) == 0, "%s", e.msg);
    static float w13[128 * 128], w2[128 * 64], row[128];
    ck_mat m13 = {.kind = CK_W_PLANES, .rows = 128, .cols = 128, .w = buf + L->sec_off[PF_W13_CODES],
                  .scale = buf + L->sec_off[PF_W13_SCALES]};
    ck_mat m2 = {.kind = CK_W_PLANES, .rows = 128, .cols = 64, .w = buf + L->sec_off[PF_W2_CODES],
                 .scale = buf + L->sec_off[PF_W2_SCALES]};
    for (int r = 0; r < 128; r++) {
        ck_row_f32(&m13, r, w13 + r * 128);
        ck_row_f32(&m2, r, w2 + r * 64);
    }
    int bad;
    ck_mat mg, mu, md;
    pf_expert_mats(L, buf, &mg, &mu, &md);
    bad = 0;
    for (int r = 0; r < 64; r++) {
        ck_row_f32(&mg, r, row);
        bad += memcmp(row, w13 + r * 128, 128 * 4) != 0;
        ck_row_f32(&mu, r, row);
        bad += memcmp(row, w13 + (64 + r) * 128, 128 * 4) != 0;
    }
    for (int r = 0; r < 128; r++) {
        ck_row_f32(&md, r, row);
        bad += memcmp(row, w2 + r * 64, 64 * 4) != 0;
    }
    CHECK(bad == 0, "pf_expert_mats gate/up/down rows equal the slot's w13/w2 rows (%d bad)", bad);
    // serving entry point: geometry, revision (warning / strict refusal), verification
    ck_config c;
    CHECK(ck_config_read(&c, FIX "/nvfp4/config.json", &e) == 0, "%s", e.msg);
    pf_file g;
    pf_serve_opts so = {0, 0, 2, 0, 0, 0, 0, 0};
    CHECK(pf_open_for_model(&g, path, &c, FIX "/nvfp4", &so, &e) == 0, "%s", e.msg);
    pf_close(&g);
    CHECK(pf_check_source(&f.h, NULL, 1, &e) == 0, "unknown revision passes");
    CHECK(pf_check_source(&f.h, f.h.source_revision, 1, &e) == 0, "same revision passes");
    CHECK(pf_check_source(&f.h, "feedface", 0, &e) == 1 && strstr(e.msg, "revision mismatch") && strstr(e.msg, "feedface"),
          "other revision warns: %s", e.msg);
    CHECK(pf_check_source(&f.h, "feedface", 1, &e) == -1, "other revision refused when strict");
    pf_sha_free(&sha);
    arena_sys_free(buf, 2 * L->slot_stride);
    pf_close(&f);
}

// ---- the corruption suite -----------------------------------------------------------------

static uint8_t *good;        // the good file
static size_t good_size;

// Writes a variant of the good file (mutated by the caller in `bytes`), n bytes long.
static void write_variant(const char *path, const uint8_t *bytes, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    MOET_ASSERT(fd >= 0, "create %s", path);
    MOET_ASSERT(pf_pwrite_full(fd, bytes, n, 0) == 0, "write %s", path);
    close(fd);
}

// Recomputes header_sha256 (and, with table, table_sha256 first): a corruption that passes the
// checksums, to reach the checks behind them.
static void reseal(uint8_t *f, int table) {
    if (table) {
        uint32_t nl = pf_get32(f + 16), ne = pf_get32(f + 24);
        EVP_Digest(f + 4096, (size_t)nl * ne * 48, f + 88, NULL, EVP_sha256(), NULL);
    }
    EVP_Digest(f, 4064, f + 4064, NULL, EVP_sha256(), NULL);
}

// Runs `moet verify PATH [--model M]` on a variant; it must fail with a message holding each of
// the needles.
static void expect_verify_fails(const char *what, const uint8_t *bytes, size_t n, const char *model, const char *n1,
                                const char *n2) {
    char p[80];
    tpath(p, sizeof p, "bad.planes");
    write_variant(p, bytes, n);
    char *argv[7] = {"moet", "verify", p, "--threads", "2", NULL, NULL};
    int argc = 5;
    if (model) {
        argv[5] = "--model";
        argv[6] = (char *)model;
        argc = 7;
    }
    int rc = capture(cmd_verify, argc, argv);
    CHECK(rc == 1, "%s: verify exit %d (want 1)", what, rc);
    CHECK(strstr(cap_err, n1) != NULL, "%s: message lacks \"%s\": %s", what, n1, cap_err);
    if (n2) CHECK(strstr(cap_err, n2) != NULL, "%s: message lacks \"%s\": %s", what, n2, cap_err);
    unlink(p);
}

static void test_corruption(const char *path) {
    moet_err e = {{0}};
    arena_map m;
    if (arena_map_file(&m, path, &e)) { CHECK(0, "%s", e.msg); return; }
    good_size = m.size;
    good = arena_sys_alloc(good_size, "t");
    uint8_t *v = arena_sys_alloc(good_size + 8192, "t");
    memcpy(good, m.data, good_size);
    arena_unmap(&m);
    const uint64_t body = 8192, stride = 8192, slot_bytes = 6912;
#define FRESH() memcpy(v, good, good_size)

    // the good file passes, and says so
    {
        char *argv[] = {"moet", "verify", (char *)path, "--model", FIX "/nvfp4"};
        CHECK(CAPTURE(cmd_verify, argv) == 0 && strstr(cap_err, "OK"), "good file: %s", cap_err);
    }
    // one flipped byte in a slot: layer 2, expert 13, byte 1000 of its codes
    FRESH();
    v[body + (2 * 16 + 13) * stride + 1000] ^= 0x10;
    expect_verify_fails("slot byte", v, good_size, NULL, "slot (layer 2, expert 13)", "SHA-256 mismatch");
    // the last byte of the last slot's scales
    FRESH();
    v[body + 63 * stride + slot_bytes - 1] ^= 1;
    expect_verify_fails("last slot byte", v, good_size, NULL, "slot (layer 3, expert 15)", "SHA-256 mismatch");
    // non-zero padding after a slot
    FRESH();
    v[body + 5 * stride + slot_bytes + 17] = 0xff;
    expect_verify_fails("slot padding", v, good_size, NULL, "slot (layer 0, expert 5)", "padding");
    // one flipped byte in the table (an entry's hash), then in its padding
    FRESH();
    v[4096 + 48 * 20 + 30] ^= 0x80;
    expect_verify_fails("table byte", v, good_size, NULL, "table_sha256 mismatch", NULL);
    FRESH();
    v[4096 + 64 * 48 + 5] = 1;
    expect_verify_fails("table padding", v, good_size, NULL, "slot table: padding", NULL);
    // a table entry that lies about its offset, with both checksums made consistent
    FRESH();
    pf_put64(v + 4096 + 48 * 21, body + 22 * stride);
    reseal(v, 1);
    expect_verify_fails("table entry offset", v, good_size, NULL, "entry 21 (layer 1, expert 5)", "offset is wrong");
    FRESH();
    pf_put16(v + 4096 + 48 * 40 + 14, 9);
    reseal(v, 1);
    expect_verify_fails("table entry expert", v, good_size, NULL, "entry 40 (layer 2, expert 8)", "expert is wrong");
    // one flipped byte in the header: a field, the hash itself
    FRESH();
    v[28] ^= 1;
    expect_verify_fails("header field byte", v, good_size, NULL, "header_sha256 mismatch", NULL);
    FRESH();
    v[4090] ^= 4;
    expect_verify_fails("header hash byte", v, good_size, NULL, "header_sha256 mismatch", NULL);
    // the zero run, quant_abi, source_format, sizes, with the header hash made consistent
    FRESH();
    v[1000] = 7;
    reseal(v, 0);
    expect_verify_fails("reserved byte", v, good_size, NULL, "reserved byte 1000", NULL);
    FRESH();
    v[120] = 'x';
    reseal(v, 0);
    expect_verify_fails("quant_abi", v, good_size, NULL, "quant_abi", "xsym4");
    FRESH();
    memcpy(v + 376, "int4\0", 5);
    reseal(v, 0);
    expect_verify_fails("source_format", v, good_size, NULL, "source_format \"int4\"", NULL);
    FRESH();
    v[184 + 20] = 'z';   // after the NUL of source_repo
    reseal(v, 0);
    expect_verify_fails("text padding", v, good_size, NULL, "source_repo", "NUL padding");
    FRESH();
    pf_put64(v + 40, slot_bytes + 64);
    reseal(v, 0);
    expect_verify_fails("slot_bytes", v, good_size, NULL, "slot_bytes is 6976", "6912");
    FRESH();
    pf_put64(v + 80, good_size - 4096);
    reseal(v, 0);
    expect_verify_fails("file_bytes", v, good_size, NULL, "file_bytes", NULL);
    FRESH();
    pf_put32(v + 400, 4100);
    reseal(v, 0);
    expect_verify_fails("section", v, good_size, NULL, "section w13_scales", NULL);
    FRESH();
    pf_put32(v + 36, 16);
    reseal(v, 0);
    expect_verify_fails("block", v, good_size, NULL, "block 16", NULL);
    FRESH();
    pf_put32(v + 32, 96);
    reseal(v, 0);
    expect_verify_fails("inter not a multiple of 64", v, good_size, NULL, "intermediate size 96", NULL);
    // truncated files: mid-body, mid-table, mid-header, empty; trailing bytes
    FRESH();
    expect_verify_fails("truncated body", v, good_size - 100, NULL, "truncated", NULL);
    expect_verify_fails("truncated table", v, 5000, NULL, "truncated", NULL);
    expect_verify_fails("truncated header", v, 1000, NULL, "truncated", NULL);
    expect_verify_fails("empty file", v, 0, NULL, "truncated", NULL);
    memset(v + good_size, 0, 4096);
    expect_verify_fails("trailing bytes", v, good_size + 4096, NULL, "trailing bytes", NULL);
    // wrong magic, wrong version (with and without a consistent header hash)
    FRESH();
    memcpy(v, "MOET2PF2", 8);
    expect_verify_fails("magic", v, good_size, NULL, "magic is \"MOET2PF2\"", "not a plane file");
    FRESH();
    pf_put32(v + 8, 2);
    expect_verify_fails("version", v, good_size, NULL, "version 2", "reads version 1");
    reseal(v, 0);
    expect_verify_fails("version resealed", v, good_size, NULL, "version 2", NULL);
    FRESH();
    memcpy(v, "\x89PNG\r\n\x1a\n", 8);
    expect_verify_fails("binary magic", v, good_size, NULL, "magic", "\\x89PNG");

    // geometry that does not match the model: a config with 8 experts, one with I = 128
    char cdir[80], cpath[96];
    tpath(cdir, sizeof cdir, "model8");
    mkdir(cdir, 0755);
    snprintf(cpath, sizeof cpath, "%s/config.json", cdir);
    size_t len;
    char *cfg = arena_read_small(FIX "/nvfp4/config.json", 1 << 20, &len, &e);
    MOET_ASSERT(cfg, "%s", e.msg);
    char *alt = arena_sys_alloc(len + 64, "t");
    char *at = strstr(cfg, "\"num_experts\": 16");
    MOET_ASSERT(at, "fixture config has num_experts 16");
    snprintf(alt, len + 64, "%.*s\"num_experts\": 8%s", (int)(at - cfg), cfg, at + strlen("\"num_experts\": 16"));
    write_variant(cpath, (const uint8_t *)alt, strlen(alt));
    expect_verify_fails("experts vs model", good, good_size, cdir, "geometry mismatch", "experts per layer 16, the model has 8");
    at = strstr(cfg, "\"moe_intermediate_size\": 64");
    MOET_ASSERT(at, "fixture config has moe_intermediate_size 64");
    snprintf(alt, len + 64, "%.*s\"moe_intermediate_size\": 128%s", (int)(at - cfg), cfg, at + strlen("\"moe_intermediate_size\": 64"));
    write_variant(cpath, (const uint8_t *)alt, strlen(alt));
    expect_verify_fails("inter vs model", good, good_size, cpath, "geometry mismatch", "intermediate size 64, the model has 128");
    pf_file f;
    ck_config c;
    CHECK(pf_model_config(cpath, &c, &e) == 0, "%s", e.msg);
    pf_serve_opts so = {1, 0, 1, 0, 0, 0, 0, 0};
    CHECK(pf_open_for_model(&f, path, &c, cdir, &so, &e) == -1 && strstr(e.msg, "geometry mismatch"), "serving refuses: %s", e.msg);
    // a source that is not qwen3_5_moe: verify --model, build-planes --plan and build-planes
    at = strstr(cfg, "\"model_type\": \"qwen3_5_moe\"");
    MOET_ASSERT(at, "fixture config names qwen3_5_moe");
    char *tt = strstr(cfg, "\"model_type\": \"qwen3_5_moe_text\"");
    MOET_ASSERT(tt, "fixture text_config names qwen3_5_moe_text");
    snprintf(alt, len + 64, "%.*s\"model_type\": \"qwen3_moe\"%.*s\"model_type\": \"qwen3_moe_text\"%s", (int)(at - cfg), cfg,
             (int)(tt - at - strlen("\"model_type\": \"qwen3_5_moe\"")), at + strlen("\"model_type\": \"qwen3_5_moe\""),
             tt + strlen("\"model_type\": \"qwen3_5_moe_text\""));
    write_variant(cpath, (const uint8_t *)alt, strlen(alt));
    expect_verify_fails("not qwen3_5_moe", good, good_size, cdir, "qwen3_moe", "not qwen3_5_moe");
    {
        char *argv[] = {"moet", "build-planes", "--model", cdir, "--plan"};
        CHECK(CAPTURE(cmd_build_planes, argv) == 1 && strstr(cap_err, "not qwen3_5_moe"), "build --plan: %s", cap_err);
        char out[96];
        tpath(out, sizeof out, "never.planes");
        char *argv2[] = {"moet", "build-planes", "--model", cdir, "--out", out};
        CHECK(CAPTURE(cmd_build_planes, argv2) == 1 && strstr(cap_err, "not qwen3_5_moe") && access(out, F_OK) != 0,
              "build: %s", cap_err);
    }
    unlink(cpath);
    rmdir(cdir);
    arena_sys_free(cfg, len + 1);
    arena_sys_free(alt, len + 64);
    arena_sys_free(v, good_size + 8192);
#undef FRESH
}

// ---- build failures leave nothing behind --------------------------------------------------

static int fail_at;   // the source fails at this slot index
static int failing_source(void *ctx, uint32_t layer, uint32_t expert, double *w13, double *w2, moet_err *e) {
    const pf_geom *g = ctx;
    if ((int)(layer * g->n_experts + expert) == fail_at) return err_set(e, "decode failed on purpose");
    size_t n13 = (size_t)2 * g->inter * g->hidden;
    for (size_t i = 0; i < n13; i++) w13[i] = (double)((layer * 31 + expert * 7 + i) % 17) - 8;
    for (size_t i = 0; i < n13 / 2; i++) w2[i] = (double)((layer + expert + i) % 5) - 2;
    if ((int)(layer * g->n_experts + expert) == -fail_at) w2[100] = INFINITY;
    return 0;
}

static int dir_has_tmp(void) {
    DIR *d = opendir(tdir);
    int found = 0;
    struct dirent *x;
    while (d && (x = readdir(d)))
        if (strstr(x->d_name, ".tmp.")) found = 1;
    if (d) closedir(d);
    return found;
}

static void test_build_failures(void) {
    pf_geom g = {3, 0, 5, 64, 64};
    char out[80];
    tpath(out, sizeof out, "fail.planes");
    pf_build_opts o;
    memset(&o, 0, sizeof o);
    o.geom = g;
    o.out_path = out;
    o.source_format = "bf16";
    o.source = failing_source;
    o.source_ctx = &g;
    o.threads = 2;
    moet_err e = {{0}};
    fail_at = 9;
    CHECK(pf_build(&o, NULL, &e) == -1 && strstr(e.msg, "layer 1, expert 4") && strstr(e.msg, "on purpose"), "%s", e.msg);
    CHECK(access(out, F_OK) != 0 && !dir_has_tmp(), "a failed build leaves no file");
    fail_at = -7;
    CHECK(pf_build(&o, NULL, &e) == -1 && strstr(e.msg, "layer 1, expert 2") && strstr(e.msg, "not finite"), "%s", e.msg);
    CHECK(access(out, F_OK) != 0 && !dir_has_tmp(), "a refused weight leaves no file");
    o.source_format = "int3";
    fail_at = 1000;
    CHECK(pf_build(&o, NULL, &e) == -1 && strstr(e.msg, "int3"), "%s", e.msg);
    o.source_format = "bf16";
    char longrev[80];
    memset(longrev, 'a', 70);
    longrev[70] = 0;
    o.source_revision = longrev;
    CHECK(pf_build(&o, NULL, &e) == -1 && strstr(e.msg, "longer than 64"), "%s", e.msg);
    o.source_revision = NULL;
    // an unwritable directory
    o.out_path = "/nonexistent-dir/x.planes";
    CHECK(pf_build(&o, NULL, &e) == -1 && strstr(e.msg, "cannot create"), "%s", e.msg);
    // a successful build over an existing file replaces it whole; 15 slots over 4 threads
    write_variant(out, (const uint8_t *)"old", 3);
    o.out_path = out;
    o.threads = 4;
    CHECK(pf_build(&o, NULL, &e) == 0, "%s", e.msg);
    pf_file f;
    CHECK(pf_open(&f, out, &e) == 0 && f.h.L.n_slots == 15, "%s", e.msg);
    pf_verify_stats st;
    if (f.fd >= 0) {
        CHECK(pf_verify_slots(&f, 3, 0, NULL, &st, &e) == 0, "%s", e.msg);
        pf_close(&f);
    }
    unlink(out);
}

// ---- commands: info, --plan, build-planes, snapshot paths ----------------------------------

static void test_commands(const char *path) {
    char *argv[] = {"moet", "info", (char *)path};
    CHECK(CAPTURE(cmd_info, argv) == 0, "info: %s", cap_err);
    js_doc d;
    moet_err e = {{0}};
    CHECK(js_load_doc(&d, cap_out, strlen(cap_out), "info output", &e) == 0, "%s", e.msg);
    const js_node *r = js_root(&d);
    int64_t v = 0;
    CHECK(js_str_is(js_get(&d, r, "magic"), "MOET2PF1") && js_int(js_get(&d, r, "file_bytes"), &v) == 0 && v == 8192 + 64 * 8192,
          "info JSON: %s", cap_out);
    CHECK(js_str_is(js_get(&d, r, "source_format"), "nvfp4") && js_str_is(js_get(&d, r, "quant_abi"), PF_QUANT_ABI) &&
          js_int(js_get(&d, js_get(&d, js_get(&d, r, "sections"), "w2_scales"), "offset"), &v) == 0 && v == 6656, "info fields");
    js_free_doc(&d);
    char *argv_bad[] = {"moet", "info", FIX "/golden.safetensors"};
    CHECK(CAPTURE(cmd_info, argv_bad) == 1 && strstr(cap_err, "magic"), "info on another file: %s", cap_err);

    char *argv_plan[] = {"moet", "build-planes", "--model", "tests/fixtures/reference/qwen36-35b-a3b-nvfp4.config.json", "--plan"};
    CHECK(CAPTURE(cmd_build_planes, argv_plan) == 0 && strstr(cap_out, "\nfile_bytes 9060192256\n"), "--plan: %s%s", cap_out, cap_err);
    // build-planes end to end from the checkpoint directory
    char out[80];
    tpath(out, sizeof out, "cmd.planes");
    char *argv_b[] = {"moet", "build-planes", "--model", FIX "/nvfp4", "--out", out, "--threads", "2", "--source-repo", "org/x"};
    CHECK(CAPTURE(cmd_build_planes, argv_b) == 0 && strstr(cap_err, "experts/s"), "build-planes: %s", cap_err);
    arena_map a, b;
    if (arena_map_file(&a, out, &e) == 0 && arena_map_file(&b, path, &e) == 0) {
        CHECK(a.size == b.size && !memcmp(a.data + 8192, b.data + 8192, a.size - 8192) && !memcmp(a.data + 4096, b.data + 4096, 4096),
              "build-planes writes the same table and slots");
        CHECK(!strcmp((const char *)a.data + 184, "org/x") && a.data[312] == 0, "flags fill source_repo, no revision");
        arena_unmap(&a);
        arena_unmap(&b);
    } else CHECK(0, "%s", e.msg);
    unlink(out);
    char *argv_u[] = {"moet", "build-planes", "--model", FIX "/nvfp4", "--bogus"};
    CHECK(CAPTURE(cmd_build_planes, argv_u) == 2 && strstr(cap_err, "--bogus"), "unknown flag");
    char *argv_t[] = {"moet", "build-planes", "--model", FIX "/nvfp4", "--out", out, "--threads", "0"};
    CHECK(CAPTURE(cmd_build_planes, argv_t) == 2 && strstr(cap_err, "--threads 0"), "bad thread count");
    char *argv_m[] = {"moet", "verify"};
    CHECK(CAPTURE(cmd_verify, argv_m) == 2, "verify without FILE");
    char *argv_n[] = {"moet", "verify", "/nonexistent.planes"};
    CHECK(CAPTURE(cmd_verify, argv_n) == 1 && strstr(cap_err, "cannot open"), "verify missing file: %s", cap_err);

    // Hugging Face cache snapshot paths
    char repo[256], rev[256];
    CHECK(ck_hf_snapshot("/x/hub/models--nvidia--Qwen3.6-35B-A3B-NVFP4/snapshots/491c2f1e0123456789abcdef0123456789abcdef/", repo,
                         sizeof repo, rev, sizeof rev) == 1 &&
          !strcmp(repo, "nvidia/Qwen3.6-35B-A3B-NVFP4") && !strcmp(rev, "491c2f1e0123456789abcdef0123456789abcdef"), "snapshot: %s %s", repo, rev);
    CHECK(ck_hf_snapshot("models--gpt2/snapshots/abc", repo, sizeof repo, rev, sizeof rev) == 1 && !strcmp(repo, "gpt2") &&
          !strcmp(rev, "abc"), "snapshot without org: %s %s", repo, rev);
    CHECK(ck_hf_snapshot("/x/models--a--b/refs/main", repo, sizeof repo, rev, sizeof rev) == 0, "refs/ is not a snapshot");
    CHECK(ck_hf_snapshot(FIX "/nvfp4", repo, sizeof repo, rev, sizeof rev) == 0, "a plain directory is not a snapshot");
    // a snapshot directory (symlinked to the fixture) fills repo and revision, and the flags must agree
    char snap[160], snapdir[128];
    tpath(snapdir, sizeof snapdir, "models--org--tiny");
    mkdir(snapdir, 0755);
    snprintf(snap, sizeof snap, "%s/snapshots", snapdir);
    mkdir(snap, 0755);
    snprintf(snap, sizeof snap, "%s/snapshots/c0ffee", snapdir);
    char abs_fix[MOET_MAX_PATH];
    MOET_ASSERT(realpath(FIX "/nvfp4", abs_fix), "realpath");
    CHECK(symlink(abs_fix, snap) == 0, "symlink");
    char *argv_s[] = {"moet", "build-planes", "--model", snap, "--out", out, "--threads", "2"};
    CHECK(CAPTURE(cmd_build_planes, argv_s) == 0, "build from snapshot: %s", cap_err);
    if (arena_map_file(&a, out, &e) == 0) {
        CHECK(!strcmp((const char *)a.data + 184, "org/tiny") && !strcmp((const char *)a.data + 312, "c0ffee"), "snapshot fills source");
        arena_unmap(&a);
    }
    char *argv_v[] = {"moet", "verify", out, "--model", snap, "--strict-revision"};
    CHECK(CAPTURE(cmd_verify, argv_v) == 0, "verify against its snapshot: %s", cap_err);
    char *argv_c[] = {"moet", "build-planes", "--model", snap, "--out", out, "--source-revision", "beef"};
    CHECK(CAPTURE(cmd_build_planes, argv_c) == 2 && strstr(cap_err, "c0ffee") && strstr(cap_err, "beef"), "conflicting flags: %s", cap_err);
    // the same file against another revision of the model: a warning, a refusal with --strict-revision
    char snap2[160];
    snprintf(snap2, sizeof snap2, "%s/snapshots/d00d", snapdir);
    CHECK(symlink(abs_fix, snap2) == 0, "symlink");
    char *argv_w[] = {"moet", "verify", out, "--model", snap2};
    CHECK(CAPTURE(cmd_verify, argv_w) == 0 && strstr(cap_err, "warning") && strstr(cap_err, "revision mismatch"), "warn: %s", cap_err);
    char *argv_x[] = {"moet", "verify", out, "--model", snap2, "--strict-revision"};
    CHECK(CAPTURE(cmd_verify, argv_x) == 1 && strstr(cap_err, "revision mismatch") && strstr(cap_err, "c0ffee"), "strict: %s", cap_err);
    unlink(snap);
    unlink(snap2);
    snprintf(snap, sizeof snap, "%s/snapshots", snapdir);
    rmdir(snap);
    rmdir(snapdir);
    unlink(out);
}


// ---- moet run --planes: the routed experts from the plane file reproduce the planes goldens ----

// max |a - b| / std(b): both sides compute in float32 from the same weight values (the 2-bit
// levels times powers of two are exact in f32); they differ in summation order and in
// transformers' chunked GDN prefill. Measured: tiny 1.3e-5 (prefill) and 3.7e-6 (decode) → 2e-5;
// check 1.6e-5 and 1.1e-5 → 4e-5 (test_forward's bounds for the same fixtures). A wrong slot
// shows up at 1e-2 or more.
#define PLANES_TOL_TINY 2e-5
#define PLANES_TOL_CHECK 4e-5

static void test_run_planes(const char *fix) {
    char model[160], gpath[160], planes[96], out[96], ids_path[96];
    snprintf(model, sizeof model, "%s/nvfp4", fix);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", fix);
    tpath(planes, sizeof planes, "run.planes");
    tpath(out, sizeof out, "run.safetensors");
    tpath(ids_path, sizeof ids_path, "ids.txt");
    moet_err e = {{0}};
    st_set g;
    if (st_open(&g, gpath, &e)) { CHECK(0, "%s", e.msg); return; }
    const st_tensor *pid = st_find(&g, "prompt_ids"), *gid = st_find(&g, "planes.greedy_ids"),
                    *pl = st_find(&g, "planes.prefill_logits"), *dl = st_find(&g, "planes.decode_logits"),
                    *slots = st_find(&g, "planes.slots");
    CHECK(pid && gid && pl && dl && slots, "%s: planes goldens present", fix);
    if (!pid || !gid || !pl || !dl || !slots) { st_close(&g); return; }
    // build the plane file with the command, and check its slots against the golden
    char *argv_b[] = {"moet", "build-planes", "--model", model, "--out", planes, "--threads", "2"};
    CHECK(CAPTURE(cmd_build_planes, argv_b) == 0, "%s: build-planes: %s", fix, cap_err);
    pf_file f;
    if (pf_open(&f, planes, &e)) { CHECK(0, "%s", e.msg); st_close(&g); return; }
    const pf_layout *L = &f.h.L;
    CHECK(slots->bytes == L->n_slots * L->slot_bytes, "%s: golden slots size", fix);
    uint8_t *buf = arena_sys_alloc(L->slot_stride, "t");
    uint64_t bad = 0;
    for (uint64_t i = 0; i < L->n_slots && slots->bytes == L->n_slots * L->slot_bytes; i++) {
        pf_entry x = pf_entry_expected(L, i);
        if (pf_read_slot(&f, x.layer, x.expert, buf, L->slot_stride, NULL, &e)) CHECK(0, "%s", e.msg);
        bad += memcmp(buf, slots->data + i * L->slot_bytes, L->slot_bytes) != 0;
    }
    CHECK(bad == 0, "%s: %" PRIu64 " slots differ from planes.slots", fix, bad);
    arena_sys_free(buf, L->slot_stride);
    pf_layout layout = *L;
    L = &layout;
    pf_close(&f);
    // the prompt as an ids file
    int T = (int)pid->numel, N = (int)gid->numel;
    const int32_t *ids = (const int32_t *)pid->data;
    FILE *fp = fopen(ids_path, "w");
    for (int t = 0; t < T; t++) fprintf(fp, t ? ",%d" : "%d", ids[t]);
    fclose(fp);
    char nstr[16];
    snprintf(nstr, sizeof nstr, "%d", N);
    char *argv_r[] = {"moet", "run", "--model", model, "--planes", planes, "--ids-file", ids_path, "--greedy", nstr, "--out", out};
    CHECK(CAPTURE(cmd_run, argv_r) == 0, "%s: run --planes: %s", fix, cap_err);
    st_set r;
    if (st_open(&r, out, &e) == 0) {
        const st_tensor *rp = st_find(&r, "prefill_logits"), *rg = st_find(&r, "greedy_ids"), *rd = st_find(&r, "decode_logits");
        CHECK(rp && rg && rd && rp->numel == pl->numel && rg->numel == gid->numel && rd->numel == dl->numel, "%s: run outputs", fix);
        if (rp && rg && rd && rp->numel == pl->numel && rg->numel == gid->numel && rd->numel == dl->numel) {
            double pe = check_nerr((const float *)rp->data, (const float *)pl->data, pl->numel);
            double de = check_nerr((const float *)rd->data, (const float *)dl->data, dl->numel);
            double tol = strstr(fix, "/check") ? PLANES_TOL_CHECK : PLANES_TOL_TINY;
            CHECK(pe < tol, "%s: planes prefill logits: normalised error %.3g", fix, pe);
            CHECK(!memcmp(rg->data, gid->data, gid->bytes), "%s: planes greedy ids", fix);
            CHECK(de < tol, "%s: planes decode logits: normalised error %.3g", fix, de);
            printf("%s/planes: prefill %.2g, decode %.2g (normalised max error; bound %.2g)\n", fix, pe, de, tol);
        }
        st_close(&r);
    } else CHECK(0, "%s", e.msg);
    // a corrupted slot refuses to run; --no-verify skips the hashing (and so runs)
    arena_map mm;
    if (arena_map_file(&mm, planes, &e) == 0) {
        uint8_t *copy = arena_sys_alloc(mm.size, "t");
        memcpy(copy, mm.data, mm.size);
        size_t sz = mm.size, stride = L->slot_stride;   // L: still the layout read above
        arena_unmap(&mm);
        copy[sz - stride + 100] ^= 1;   // a byte of the last slot
        write_variant(planes, copy, sz);
        CHECK(CAPTURE(cmd_run, argv_r) == 1 && strstr(cap_err, "SHA-256 mismatch"), "%s: corrupted slot refused: %s", fix, cap_err);
        char *argv_nv[] = {"moet", "run", "--model", model, "--planes", planes, "--ids", "1,2,3", "--no-verify"};
        CHECK(CAPTURE(cmd_run, argv_nv) == 0, "%s: --no-verify runs: %s", fix, cap_err);
        copy[sz - stride + 100] ^= 1;
        copy[sz - 5] = 0x5a;            // the last slot's padding
        write_variant(planes, copy, sz);
        CHECK(CAPTURE(cmd_run, argv_r) == 1 && strstr(cap_err, "padding"), "%s: non-zero padding refused: %s", fix, cap_err);
        arena_sys_free(copy, sz);
    }
    unlink(planes);
    unlink(out);
    unlink(ids_path);
    st_close(&g);
}

// The expert cache (--expert-cache-gb, pf_cache) on the demo model and its plane file: a pool of a
// quarter of the slots gives the logits of every slot held, bit for bit, over a prompt and a
// greedy decode (slots evicted and read again), and so do pools of one slot and of a quarter with
// the prefetch thread (pf_cache_prefetch); a slot changed on disk after boot is caught by its
// hash when it is next read, the step failing with the slot named, and the engine serves again
// once the file is right; a failed read (simulated) fails its step alone.
#define EC_T 20
#define EC_N 12
static int32_t ec_ids[64];
static float *ec_held;   // [EC_T + EC_N steps][EC_T, V]: the logits with every slot held

// The prompt and EC_N greedy steps (ec_ids) on a cache of `pool` slots (prefetch on or off): 1
// when every step's logits are ec_held's.
static int ec_same(const char *path, int pool, size_t stride, int prefetch, const char *what) {
    static ck_model m;
    moet_err e = {{0}};
    if (ck_open(&m, "tests/fixtures/demo", &e)) { CHECK(0, "%s", e.msg); return 0; }
    pf_attached a;
    pf_serve_opts o = {0, 0, 2, 0, ((double)pool + 0.5) * (double)stride / 1073741824.0, prefetch, 0, 0};
    int ok = pf_attach_planes(&m, path, &o, &a, &e) == 0 && a.cached && a.cache.n_pool == pool && a.cache.prefetch == prefetch;
    CHECK(ok, "%s: a pool of %d slots: %s", what, pool, e.msg);
    static ref_engine r;
    if (!ok || ref_init(&r, &m, 1, 64, 64, 1, &e)) { CHECK(0, "%s", e.msg); ck_close(&m); return 0; }
    engine_backend b = ref_backend(&r);
    const int V = m.cfg.vocab;
    float *l = malloc(sizeof(float) * (size_t)EC_T * V);
    engine_admit ad = {{0, 0, 1, 0, 0, 0, 1}, 0, 0, 0, NULL, 0, EC_T + EC_N, 0};
    int slot = 0, same = b.admit(b.self, 0, &ad, &e) == 0;
    for (int step = 0; same && step <= EC_N; step++) {
        int n = step ? 1 : EC_T, off[2] = {0, n};
        same = b.forward_all(b.self, 1, &slot, step ? &ec_ids[EC_T + step - 1] : ec_ids, off, l, NULL, NULL, NULL, &e) == 0 &&
               !memcmp(l, ec_held + (size_t)step * EC_T * V, sizeof(float) * (size_t)n * V);
    }
    CHECK(same, "%s, a pool of %d slots: the logits differ from every slot held (%s)", what, pool, e.msg);
    b.release(b.self, 0);
    ref_free(&r);
    pf_detach(&a);
    ck_close(&m);
    free(l);
    return same;
}
static void test_expert_cache(void) {
    const char *model = "tests/fixtures/demo";
    char path[96];
    tpath(path, sizeof path, "cache.planes");
    moet_err e = {{0}};
    arena_map mm;
    if (arena_map_file(&mm, "build/demo.planes", &e)) { CHECK(0, "build/demo.planes (run ./build.sh): %s", e.msg); return; }
    size_t sz = mm.size;
    uint8_t *bytes = arena_sys_alloc(sz, "t");
    memcpy(bytes, mm.data, sz);
    arena_unmap(&mm);
    write_variant(path, bytes, sz);
    static ck_model m1, m2;
    if (ck_open(&m1, model, &e) || ck_open(&m2, model, &e)) { CHECK(0, "%s", e.msg); arena_sys_free(bytes, sz); return; }
    pf_attached a1, a2;
    pf_serve_opts o = {0, 0, 2, 0, 0, 0, 0, 0};
    CHECK(pf_attach_planes(&m1, path, &o, &a1, &e) == 0 && !a1.cached, "resident: %s", e.msg);
    pf_file pf;
    if (pf_open(&pf, path, &e)) { CHECK(0, "%s", e.msg); return; }
    size_t stride = pf.h.L.slot_stride, body = pf.h.L.body_offset;
    int n_slots = (int)pf.h.L.n_slots, quarter = n_slots / 4;
    pf_close(&pf);
    o.cache_gb = ((double)quarter + 0.5) * (double)stride / 1073741824.0;
    CHECK(pf_attach_planes(&m2, path, &o, &a2, &e) == 0 && a2.cached && a2.cache.n_pool == quarter, "a pool of %d slots: %s", quarter, e.msg);
    static ref_engine r1, r2;
    if (ref_init(&r1, &m1, 1, 64, 64, 1, &e) || ref_init(&r2, &m2, 1, 64, 64, 1, &e)) { CHECK(0, "%s", e.msg); return; }
    engine_backend b1 = ref_backend(&r1), b2 = ref_backend(&r2);
    const int V = m1.cfg.vocab, T = EC_T, N = EC_N;
    int32_t *ids = ec_ids;
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 7919 + 13) % V);
    ec_held = malloc(sizeof(float) * (size_t)(T + N + 1) * T * V);
    float *l1 = malloc(sizeof(float) * (size_t)T * V), *l2 = malloc(sizeof(float) * (size_t)T * V);
    engine_admit ad = {{0, 0, 1, 0, 0, 0, 1}, 0, 0, 0, NULL, 0, T + N, 0};
    int slot = 0, same = 1, ok = b1.admit(b1.self, 0, &ad, &e) == 0 && b2.admit(b2.self, 0, &ad, &e) == 0;
    for (int step = 0; ok && step <= N; step++) {   // the prompt, then one greedy token a step
        int n = step ? 1 : T, off[2] = {0, n};
        const int32_t *in = step ? &ids[T + step - 1] : ids;
        ok = b1.forward_all(b1.self, 1, &slot, in, off, l1, NULL, NULL, NULL, &e) == 0 &&
             b2.forward_all(b2.self, 1, &slot, in, off, l2, NULL, NULL, NULL, &e) == 0;
        same = same && ok && !memcmp(l1, l2, sizeof(float) * (size_t)n * V);
        memcpy(ec_held + (size_t)step * T * V, l1, sizeof(float) * (size_t)n * V);
        ids[T + step] = moet_argmax(l1 + (size_t)(n - 1) * V, V);
    }
    CHECK(ok && same, "a pool of a quarter of the slots: the logits differ from every slot held (%s)", e.msg);
    CHECK(pf_cache_stats.misses > (uint64_t)quarter && pf_cache_stats.hits > 0 && pf_cache_stats.bytes == pf_cache_stats.misses * 27648,
          "cache counters: %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " bytes", pf_cache_stats.hits, pf_cache_stats.misses,
          pf_cache_stats.bytes);
    printf("expert cache, demo, %d of %d slots: %d prompt + %d greedy tokens with the logits of every slot held; %" PRIu64 " hits, %" PRIu64
           " misses\n", quarter, n_slots, T, N, pf_cache_stats.hits, pf_cache_stats.misses);
    // with the prefetch thread: a quarter of the slots, then one slot (every read waited for)
    if (ec_same(path, quarter, stride, 1, "prefetch")) {
        CHECK(pf_cache_stats.prefetched > 0 && pf_cache_stats.prefetch_used > 0 && pf_cache_stats.guess_needed > 0,
              "prefetch counters: %" PRIu64 " prefetched, %" PRIu64 " used, %" PRIu64 " of %" PRIu64 " guessed", pf_cache_stats.prefetched,
              pf_cache_stats.prefetch_used, pf_cache_stats.guess_named, pf_cache_stats.guess_needed);
        printf("expert cache + prefetch, %d of %d slots: the same logits; %" PRIu64 " slots prefetched, %" PRIu64 " of them used, %" PRIu64
               " read by the step; layer l + 1's router on layer l's input named %" PRIu64 " of the %" PRIu64 " experts layers >= 1 used (%.0f %%)\n",
               quarter, n_slots, pf_cache_stats.prefetched, pf_cache_stats.prefetch_used, pf_cache_stats.misses, pf_cache_stats.guess_named,
               pf_cache_stats.guess_needed, 100.0 * pf_cache_stats.guess_named / (double)(pf_cache_stats.guess_needed ? pf_cache_stats.guess_needed : 1));
    }
    ec_same(path, 1, stride, 1, "prefetch, one slot");
    // every slot changed on disk after boot: the next read fails its hash, naming the slot
    uint8_t *bad = arena_sys_alloc(sz, "t");
    memcpy(bad, bytes, sz);
    for (int i = 0; i < n_slots; i++) bad[body + (size_t)i * stride + 7] ^= 0x40;
    write_variant(path, bad, sz);
    b2.release(b2.self, 0);
    ok = b2.admit(b2.self, 0, &ad, &e) == 0;
    int off[2] = {0, T};
    int rc = ok ? b2.forward_all(b2.self, 1, &slot, ids, off, l2, NULL, NULL, NULL, &e) : 0;
    CHECK(rc != 0 && strstr(e.msg, "SHA-256 mismatch") && strstr(e.msg, "slot (layer "), "a slot changed after boot: %s", e.msg);
    write_variant(path, bytes, sz);   // the file right again: the engine serves
    b2.release(b2.self, 0);
    ok = b2.admit(b2.self, 0, &ad, &e) == 0 && b2.forward_all(b2.self, 1, &slot, ids, off, l2, NULL, NULL, NULL, &e) == 0;
    b1.release(b1.self, 0);
    ok = ok && b1.admit(b1.self, 0, &ad, &e) == 0 && b1.forward_all(b1.self, 1, &slot, ids, off, l1, NULL, NULL, NULL, &e) == 0;
    CHECK(ok && !memcmp(l1, l2, sizeof(float) * (size_t)T * V), "after the file was restored: %s", e.msg);
    // a read error (simulated: the second read from now) fails that step only
    a2.cache.fault_read = a2.cache.reads + 2;
    uint64_t misses = pf_cache_stats.misses;
    b2.release(b2.self, 0);
    ok = b2.admit(b2.self, 0, &ad, &e) == 0;
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 104729 + 5) % V);   // another prompt: other experts to read
    rc = ok ? b2.forward_all(b2.self, 1, &slot, ids, off, l2, NULL, NULL, NULL, &e) : 0;
    CHECK(rc != 0 && strstr(e.msg, "Input/output error") && strstr(e.msg, "slot (layer "), "a failed read: %s (%" PRIu64 " misses before)",
          e.msg, misses);
    b2.release(b2.self, 0);
    ok = b2.admit(b2.self, 0, &ad, &e) == 0 && b2.forward_all(b2.self, 1, &slot, ids, off, l2, NULL, NULL, NULL, &e) == 0;
    CHECK(ok, "the step after a failed read: %s", e.msg);
    b1.release(b1.self, 0), b2.release(b2.self, 0);
    ref_free(&r1), ref_free(&r2);
    pf_detach(&a1), pf_detach(&a2);
    ck_close(&m1), ck_close(&m2);
    free(l1), free(l2), free(ec_held);
    arena_sys_free(bytes, sz), arena_sys_free(bad, sz);
    unlink(path);
}

int main(void) {
    snprintf(tdir, sizeof tdir, "/tmp/moet_test_planes.XXXXXX");
    MOET_ASSERT(mkdtemp(tdir), "mkdtemp");
    moet_err e = {{0}};
    CHECK(st_open(&gold, FIX, &e) == 0, "golden: %s", e.msg);
    gold_slots = st_find(&gold, "planes.slots");
    CHECK(gold_slots && gold_slots->dtype == ST_U8, "golden planes.slots U8");

    test_plan();
    test_quantizer_edges();
    char planes[80];
    tpath(planes, sizeof planes, "tiny.planes");
    test_fixture_slots(planes);
    test_round_trip(planes);
    test_corruption(planes);
    test_build_failures();
    test_commands(planes);
    test_run_planes(FIX);
    test_run_planes("tests/fixtures/check");
    test_expert_cache();

    unlink(planes);
    rmdir(tdir);
    st_close(&gold);
    return check_report("test_planes");
}
