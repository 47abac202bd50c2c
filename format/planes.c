// format/planes.c — MOET2PF1 v1, the 2-bit expert plane file (format/PLANES.md, a binding contract).
//
// One file holds every routed expert of a model as sign-symmetric 2-bit planes: a header page,
// a table of 48-byte slot entries, then one page-aligned slot per (layer, expert). This module is
// the whole format: the layout plan (pf_plan: the one place every size comes from), the quantizer
// (bit-exact, so a file is reproducible from its checkpoint), the header/table codec, the writer
// (pf_build: all cores, a bounded reorder ring, temp file + fsync + rename), the reader for
// serving (pf_open / pf_read_slot) and the slot verifier (O_DIRECT, several
// hashing threads). It knows nothing about checkpoints: the builder takes experts from a callback.
//
// SHA-256 comes from libcrypto's EVP interface; each thread owns one pf_sha (made at boot).

#include <openssl/evp.h>
#include <stdatomic.h>

#define PF_MAGIC         "MOET2PF1"
#define PF_VERSION       1u
#define PF_PAGE          4096u    // every section starts on a page; O_DIRECT alignment
#define PF_BLOCK         32u      // scale block along K
#define PF_ENTRY         48u      // bytes of one slot table entry
#define PF_HASHED        4064u    // header_sha256 covers header bytes [0, 4064)
#define PF_QUANT_ABI     "tsym4-e8m0-fragmajor-m16n8k32-v1"

// header field offsets (PLANES.md §1)
enum {
    PFH_MAGIC = 0, PFH_VERSION = 8, PFH_PAGE = 12, PFH_N_LAYERS = 16, PFH_FIRST_LAYER = 20,
    PFH_N_EXPERTS = 24, PFH_HIDDEN = 28, PFH_INTER = 32, PFH_BLOCK = 36, PFH_SLOT_BYTES = 40,
    PFH_SLOT_STRIDE = 48, PFH_TABLE_OFFSET = 56, PFH_TABLE_BYTES = 64, PFH_BODY_OFFSET = 72,
    PFH_FILE_BYTES = 80, PFH_TABLE_SHA = 88, PFH_QUANT_ABI = 120, PFH_SOURCE_REPO = 184,
    PFH_SOURCE_REV = 312, PFH_SOURCE_FORMAT = 376, PFH_SECTIONS = 392, PFH_RESERVED = 424,
    PFH_HEADER_SHA = 4064,
};
#define PF_ABI_LEN      64
#define PF_REPO_LEN     128
#define PF_REV_LEN      64
#define PF_FORMAT_LEN   16

_Static_assert(PFH_RESERVED == PFH_SECTIONS + 8 * 4, "header sections end where the zero run starts");
_Static_assert(PFH_HEADER_SHA + 32 == PF_PAGE, "header_sha256 closes the header page");
_Static_assert(sizeof(PF_QUANT_ABI) <= PF_ABI_LEN, "quant_abi fits its field");

// ==========================================================================================
// geometry and layout
// ==========================================================================================

typedef struct {
    uint32_t n_layers;     // MoE layers stored
    uint32_t first_layer;  // model index of the first stored layer (0 for qwen3_5_moe)
    uint32_t n_experts;    // routed experts per layer (E)
    uint32_t hidden;       // H
    uint32_t inter;        // I, the routed expert's intermediate size
} pf_geom;

enum { PF_W13_CODES, PF_W13_SCALES, PF_W2_CODES, PF_W2_SCALES };
static const char *const pf_section_names[4] = {"w13_codes", "w13_scales", "w2_codes", "w2_scales"};

typedef struct {
    pf_geom g;
    uint64_t n_slots;                      // n_layers * n_experts
    uint64_t sec_off[4], sec_bytes[4];     // sections within a slot (PF_W13_CODES ...)
    uint64_t slot_bytes;                   // unpadded: 3·I·H/4 + 3·I·H/32
    uint64_t slot_stride;                  // slot_bytes rounded up to a page
    uint64_t table_offset;                 // = one page
    uint64_t table_bytes;                  // n_slots·48 rounded up to a page
    uint64_t body_offset;                  // table_offset + table_bytes
    uint64_t file_bytes;                   // body_offset + n_slots·slot_stride
} pf_layout;

static uint64_t pf_round_page(uint64_t x) { return (x + PF_PAGE - 1) / PF_PAGE * PF_PAGE; }

// The layout of a file from its geometry: every size of the format comes from here (writer,
// reader, --plan and verify). Refuses geometry the format cannot hold: the fragment order needs
// N % 16 = 0 and K % 64 = 0 for both matrices (so H and I multiples of 64); layer and expert
// indices are u16 in the table; a slot's byte count is u32.
static int pf_plan(const pf_geom *g, pf_layout *L, moet_err *e) {
    memset(L, 0, sizeof *L);
    L->g = *g;
    if (g->n_layers < 1 || g->n_layers > MOET_MAX_LAYERS)
        return err_set(e, "plane geometry: %u MoE layers, expected 1..%d", g->n_layers, MOET_MAX_LAYERS);
    if (g->first_layer > MOET_MAX_LAYERS - g->n_layers)
        return err_set(e, "plane geometry: first layer %u + %u layers exceeds the limit of %d layers",
                       g->first_layer, g->n_layers, MOET_MAX_LAYERS);
    if (g->n_experts < 1 || g->n_experts > MOET_MAX_EXPERTS)
        return err_set(e, "plane geometry: %u experts per layer, expected 1..%d", g->n_experts, MOET_MAX_EXPERTS);
    if (g->hidden < 64 || g->hidden > MOET_MAX_HIDDEN || g->hidden % 64)
        return err_set(e, "plane geometry: hidden size %u, expected a multiple of 64 in 64..%d", g->hidden, MOET_MAX_HIDDEN);
    if (g->inter < 64 || g->inter > MOET_PF_MAX_INTER || g->inter % 64)
        return err_set(e, "plane geometry: expert intermediate size %u, expected a multiple of 64 in 64..%d",
                       g->inter, MOET_PF_MAX_INTER);
    uint64_t ih = (uint64_t)g->inter * g->hidden;   // ≤ 2^30: no overflow below
    L->n_slots = (uint64_t)g->n_layers * g->n_experts;
    L->sec_bytes[PF_W13_CODES] = 2 * ih / 4;
    L->sec_bytes[PF_W13_SCALES] = 2 * ih / 32;
    L->sec_bytes[PF_W2_CODES] = ih / 4;
    L->sec_bytes[PF_W2_SCALES] = ih / 32;
    uint64_t off = 0;
    for (int s = 0; s < 4; s++) {
        L->sec_off[s] = off;
        off += L->sec_bytes[s];
    }
    L->slot_bytes = off;
    MOET_ASSERT(L->slot_bytes == 3 * ih / 4 + 3 * ih / 32, "slot sections add up");
    if (L->slot_bytes > UINT32_MAX) return err_set(e, "plane geometry: a slot of %" PRIu64 " bytes does not fit u32", L->slot_bytes);
    L->slot_stride = pf_round_page(L->slot_bytes);
    L->table_offset = PF_PAGE;
    L->table_bytes = pf_round_page(L->n_slots * PF_ENTRY);
    L->body_offset = L->table_offset + L->table_bytes;
    L->file_bytes = L->body_offset + L->n_slots * L->slot_stride;   // < 2^8·2^10·2^32: no overflow
    return 0;
}

// The layout as text, one "name value" per line (build-planes --plan).
static void pf_plan_text(const pf_layout *L, char *out, size_t cap) {
    size_t at = (size_t)snprintf(out, cap, "n_layers %u\nfirst_layer %u\nn_experts %u\nhidden %u\ninter %u\nn_slots %" PRIu64 "\n",
                                 L->g.n_layers, L->g.first_layer, L->g.n_experts, L->g.hidden, L->g.inter, L->n_slots);
    for (int s = 0; s < 4 && at < cap; s++)
        at += (size_t)snprintf(out + at, cap - at, "%s %" PRIu64 " bytes at slot offset %" PRIu64 "\n", pf_section_names[s],
                               L->sec_bytes[s], L->sec_off[s]);
    if (at < cap)
        snprintf(out + at, cap - at, "slot_bytes %" PRIu64 "\nslot_stride %" PRIu64 "\ntable_offset %" PRIu64 "\ntable_bytes %" PRIu64
                 "\nbody_offset %" PRIu64 "\nfile_bytes %" PRIu64 "\n",
                 L->slot_bytes, L->slot_stride, L->table_offset, L->table_bytes, L->body_offset, L->file_bytes);
}

// Slot index of (model layer, expert), or -1 when the file does not hold it.
static int64_t pf_slot_index(const pf_layout *L, uint32_t layer, uint32_t expert) {
    if (layer < L->g.first_layer || layer - L->g.first_layer >= L->g.n_layers || expert >= L->g.n_experts) return -1;
    return (int64_t)(layer - L->g.first_layer) * L->g.n_experts + expert;
}

static uint64_t pf_slot_offset(const pf_layout *L, uint64_t i) { return L->body_offset + i * L->slot_stride; }

// ==========================================================================================
// SHA-256 (libcrypto EVP); one context per thread, made before serving starts
// ==========================================================================================

typedef struct {
    EVP_MD_CTX *ctx;
} pf_sha;

static int pf_sha_init(pf_sha *s, moet_err *e) {
    s->ctx = EVP_MD_CTX_new();
    if (!s->ctx) return err_set(e, "libcrypto: cannot create a SHA-256 context");
    return 0;
}

static void pf_sha_free(pf_sha *s) {
    if (s->ctx) EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}

static void pf_sha256(pf_sha *s, const void *p, size_t n, uint8_t out[32]) {
    unsigned len = 0;
    MOET_ASSERT(EVP_DigestInit_ex(s->ctx, EVP_sha256(), NULL) == 1 && EVP_DigestUpdate(s->ctx, p, n) == 1 &&
                EVP_DigestFinal_ex(s->ctx, out, &len) == 1 && len == 32, "libcrypto SHA-256 failed");
}

static void pf_hex(const uint8_t *b, size_t n, char *out /* [2n + 1] */) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

// ==========================================================================================
// the quantizer (PLANES.md §2-3)
// ==========================================================================================
//
// Per row n and 32-wide block b along K: amax = max|w|; e = round_half_even(log2(amax/6 + 1e-30))
// clamped to [-127, 127] (e = -127 when amax = 0); u = w / 2^e. The e2m1 magnitude index of |u|
// is the number of midpoints {.25,.75,1.25,1.75,2.5,3.5,5} strictly below it, and the code table
// maps indices 0..4 to ±1 and 5..7 to ±4, so the code depends only on the sign bit of u and on
// |u| > 2.5: code = sign ? (big ? 0 : 1) : (big ? 3 : 2), level {-4,-1,+1,+4}[code].
//
// Exactness: amax/6.0 + 1e-30 and log2 are double operations as the spec (and torch, float64)
// writes them; nearbyint rounds half to even in the default rounding mode, as torch.round does.
// Multiplying by 2^-e equals dividing by 2^e bit for bit (both round the same exact value once).

#define PF_BITS_2_5 0x4004000000000000ull   // the IEEE-754 binary64 bits of 2.5
#define PF_BITS_INF 0x7ff0000000000000ull   // and of +inf

// Scale exponent of one block (the UE8M0 byte is e + 127).
static int pf_block_exp(double amax) {
    if (!(amax > 0)) return -127;
    double l = nearbyint(log2(amax / 6.0 + 1e-30));
    if (l < -127) l = -127;
    if (l > 127) l = 127;
    return (int)l;
}

// Codes of a [N, K] matrix into fragment-major bytes [N·K/4] (PLANES.md §3): for each 16-row
// block nb and 64-wide k block kb, lane (g, t) gets 8 bytes: row nb·16+g then row nb·16+g+8,
// each as four 4-code chunks at k = kb·64 + {0,16,32,48} + 4t. The lowest k sits in bits 0-1.
static void pf_pack_codes(const uint8_t *c /* [N, K] codes, bits 0-1 */, uint32_t N, uint32_t K,
                          uint8_t *out /* [N·K/4] */) {
    size_t o = 0;
    for (uint32_t nb = 0; nb < N / 16; nb++)
        for (uint32_t kb = 0; kb < K / 64; kb++)
            for (uint32_t g = 0; g < 8; g++)
                for (uint32_t t = 0; t < 4; t++)
                    for (uint32_t tile = 0; tile < 2; tile++) {
                        const uint8_t *row = c + (size_t)(nb * 16 + tile * 8 + g) * K + kb * 64 + t * 4;
                        for (uint32_t q = 0; q < 4; q++) {   // q = k32·2 + half: k offset 16q
                            const uint8_t *p = row + 16 * q;
                            out[o++] = (uint8_t)((p[0] & 3) | (p[1] & 3) << 2 | (p[2] & 3) << 4 | (p[3] & 3) << 6);
                        }
                    }
}

// Index of the scale byte of (row n, block b) in a [N/16, K/32, 16] section.
static size_t pf_scale_index(uint32_t n, uint32_t b, uint32_t K) {
    return ((size_t)(n / 16) * (K / PF_BLOCK) + b) * 16 + n % 16;
}

// Quantizes one matrix W [N, K] (f64) into its codes section (fragment-major, N·K/4 bytes) and
// scales section (N·K/32 bytes). scratch holds N·K bytes. The zero-sign rule (PLANES.md §2 step 4) is applied
// over the whole matrix. A non-finite weight is refused (it has no scale): -1 naming its place.
static int pf_quant_matrix(const double *w /* [N, K] */, uint32_t N, uint32_t K, uint8_t *codes,
                           uint8_t *scales, uint8_t *scratch /* [N·K] */, const char *what, moet_err *e) {
    int tiles_fit = N % 16 == 0 && K % 64 == 0;
    MOET_ASSERT(tiles_fit, "%s: %u x %u is not a multiple of 16 x 64", what, N, K);
    uint64_t nz = 0, nneg = 0;   // elements with u == 0, and those of them with the sign bit set
    for (uint32_t n = 0; n < N; n++) {
        for (uint32_t b = 0; b < K / PF_BLOCK; b++) {
            const double *x = w + (size_t)n * K + (size_t)b * PF_BLOCK;
            // amax on the magnitude bits (they order like |w|; inf and NaN sort above every finite)
            uint64_t mbits = 0;
            for (uint32_t j = 0; j < PF_BLOCK; j++) {
                uint64_t wb;
                memcpy(&wb, &x[j], sizeof wb);
                wb &= ~(1ull << 63);
                mbits = wb > mbits ? wb : mbits;
            }
            double amax;
            memcpy(&amax, &mbits, sizeof amax);
            if (mbits >= PF_BITS_INF) {
                uint32_t j = 0;
                while (j < PF_BLOCK && isfinite(x[j])) j++;
                return err_set(e, "%s: weight [%u, %u] is %g: not finite, cannot be quantized", what, n,
                               b * PF_BLOCK + j, j < PF_BLOCK ? x[j] : 0.0);
            }
            int ex = pf_block_exp(amax);
            scales[pf_scale_index(n, b, K)] = (uint8_t)(ex + 127);
            double inv = ldexp(1.0, -ex);   // exact power of two
            uint8_t *c = scratch + (size_t)n * K + (size_t)b * PF_BLOCK;
            // branch-free on the bits of u (finite here): sign bit; |u| > 2.5 and u == ±0 compare
            // the magnitude bits, which order like the magnitudes; code = (2 + big) ^ (3 · neg)
            // gives 2, 3 for u ≥ 0 and 1, 0 for u < 0; bit 2 marks u == ±0 for the zero rule.
            unsigned zsum = 0, zneg = 0;
            for (uint32_t j = 0; j < PF_BLOCK; j++) {
                double u = x[j] * inv;
                uint64_t ub;
                memcpy(&ub, &u, sizeof ub);
                unsigned neg = (unsigned)(ub >> 63), mag_zero = (ub << 1) == 0;
                unsigned big = (ub << 1) > (PF_BITS_2_5 << 1);
                c[j] = (uint8_t)(((2u + big) ^ (3u * neg)) | mag_zero << 2);
                zsum += mag_zero;
                zneg += mag_zero & neg;
            }
            nz += zsum;
            nneg += zneg;
        }
    }
    // zero rule: one-signed zeros (< 5% of either sign) take the sign of their column parity
    uint64_t lo = nneg < nz - nneg ? nneg : nz - nneg;
    if (nz && (double)lo < 0.05 * (double)nz) {
        for (uint32_t n = 0; n < N; n++) {
            uint8_t *c = scratch + (size_t)n * K;
            for (uint32_t k = 0; k < K; k++)
                if (c[k] & 4) c[k] = (k & 1) ? 1 : 2;   // sign set → -1, clear → +1
        }
    }
    pf_pack_codes(scratch, N, K, codes);
    return 0;
}

// One expert into its slot bytes [slot_bytes]: w13 = gate rows then up rows [2I, H], w2 [H, I].
// scratch: 2I·H bytes.
static int pf_quant_expert(const pf_layout *L, const double *w13 /* [2I, H] */, const double *w2 /* [H, I] */,
                           uint8_t *slot, uint8_t *scratch, moet_err *e) {
    uint32_t H = L->g.hidden, I = L->g.inter;
    if (pf_quant_matrix(w13, 2 * I, H, slot + L->sec_off[PF_W13_CODES], slot + L->sec_off[PF_W13_SCALES],
                        scratch, "w13 (gate_proj | up_proj)", e))
        return -1;
    return pf_quant_matrix(w2, H, I, slot + L->sec_off[PF_W2_CODES], slot + L->sec_off[PF_W2_SCALES],
                           scratch, "w2 (down_proj)", e);
}

// ==========================================================================================
// header page and slot table
// ==========================================================================================

typedef struct {
    uint32_t version, page_bytes, block;
    pf_layout L;                       // geometry and sizes
    uint8_t table_sha256[32];
    char quant_abi[PF_ABI_LEN + 1];    // NUL-terminated copies of the NUL-padded fields
    char source_repo[PF_REPO_LEN + 1];
    char source_revision[PF_REV_LEN + 1];
    char source_format[PF_FORMAT_LEN + 1];
    uint8_t header_sha256[32];
} pf_header;

typedef struct {
    uint64_t offset;      // absolute file offset of the slot
    uint32_t bytes;       // = slot_bytes
    uint16_t layer;       // model layer index
    uint16_t expert;
    uint8_t sha256[32];   // of the slot's slot_bytes
} pf_entry;

static void pf_put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void pf_put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void pf_put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static uint32_t pf_get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t pf_get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint16_t pf_get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static int pf_source_format_known(const char *s) {
    return !strcmp(s, "nvfp4") || !strcmp(s, "fp8") || !strcmp(s, "bf16");
}

// Fills a header for a geometry (strings empty, hashes zero).
static int pf_header_init(pf_header *h, const pf_geom *g, moet_err *e) {
    memset(h, 0, sizeof *h);
    h->version = PF_VERSION;
    h->page_bytes = PF_PAGE;
    h->block = PF_BLOCK;
    snprintf(h->quant_abi, sizeof h->quant_abi, "%s", PF_QUANT_ABI);
    return pf_plan(g, &h->L, e);
}

// Writes the header page (header_sha256 computed here, stored into h as well).
static void pf_header_encode(pf_header *h, pf_sha *s, uint8_t page[PF_PAGE]) {
    const pf_layout *L = &h->L;
    memset(page, 0, PF_PAGE);
    memcpy(page + PFH_MAGIC, PF_MAGIC, 8);
    pf_put32(page + PFH_VERSION, h->version);
    pf_put32(page + PFH_PAGE, h->page_bytes);
    pf_put32(page + PFH_N_LAYERS, L->g.n_layers);
    pf_put32(page + PFH_FIRST_LAYER, L->g.first_layer);
    pf_put32(page + PFH_N_EXPERTS, L->g.n_experts);
    pf_put32(page + PFH_HIDDEN, L->g.hidden);
    pf_put32(page + PFH_INTER, L->g.inter);
    pf_put32(page + PFH_BLOCK, h->block);
    pf_put64(page + PFH_SLOT_BYTES, L->slot_bytes);
    pf_put64(page + PFH_SLOT_STRIDE, L->slot_stride);
    pf_put64(page + PFH_TABLE_OFFSET, L->table_offset);
    pf_put64(page + PFH_TABLE_BYTES, L->table_bytes);
    pf_put64(page + PFH_BODY_OFFSET, L->body_offset);
    pf_put64(page + PFH_FILE_BYTES, L->file_bytes);
    memcpy(page + PFH_TABLE_SHA, h->table_sha256, 32);
    memcpy(page + PFH_QUANT_ABI, h->quant_abi, strnlen(h->quant_abi, PF_ABI_LEN));
    memcpy(page + PFH_SOURCE_REPO, h->source_repo, strnlen(h->source_repo, PF_REPO_LEN));
    memcpy(page + PFH_SOURCE_REV, h->source_revision, strnlen(h->source_revision, PF_REV_LEN));
    memcpy(page + PFH_SOURCE_FORMAT, h->source_format, strnlen(h->source_format, PF_FORMAT_LEN));
    for (int i = 0; i < 4; i++) {
        pf_put32(page + PFH_SECTIONS + 8 * i, (uint32_t)L->sec_off[i]);
        pf_put32(page + PFH_SECTIONS + 8 * i + 4, (uint32_t)L->sec_bytes[i]);
    }
    pf_sha256(s, page, PF_HASHED, h->header_sha256);
    memcpy(page + PFH_HEADER_SHA, h->header_sha256, 32);
}

// A NUL-padded text field: its bytes up to the first NUL, then only NULs. Copies into out[len+1].
static int pf_get_text(const uint8_t *p, size_t len, char *out, const char *field, moet_err *e) {
    size_t n = strnlen((const char *)p, len);
    for (size_t i = n; i < len; i++)
        if (p[i]) return err_set(e, "header field %s: byte %zu after its terminating NUL is 0x%02x, expected 0 (NUL padding)", field, i, p[i]);
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] == 0x7f)
            return err_set(e, "header field %s: control byte 0x%02x at position %zu", field, p[i], i);
    memcpy(out, p, n);
    out[n] = 0;
    return 0;
}

// Parses and checks the header page (PLANES.md §4, header part, without the file size and the
// model): magic, version, page size, header_sha256, the geometry the format can hold, every size
// and section equal to the layout formulas, the text fields, the zero run. The message names the
// field, expected and actual.
static int pf_header_decode(const uint8_t *page, size_t n, pf_sha *s, pf_header *h, moet_err *e) {
    memset(h, 0, sizeof *h);
    if (n < PF_PAGE) return err_set(e, "header: the file is %zu bytes, shorter than the 4096-byte header page (truncated)", n);
    if (memcmp(page + PFH_MAGIC, PF_MAGIC, 8)) {
        char m[8 * 4 + 1];
        size_t k = 0;
        for (int i = 0; i < 8; i++) {
            uint8_t c = page[i];
            k += (size_t)snprintf(m + k, sizeof m - k, (c >= 0x20 && c < 0x7f && c != '\\') ? "%c" : "\\x%02x", c);
        }
        return err_set(e, "header: magic is \"%s\", expected \"MOET2PF1\" (not a plane file)", m);
    }
    h->version = pf_get32(page + PFH_VERSION);
    if (h->version != PF_VERSION) return err_set(e, "header: version %u, this build reads version %u", h->version, PF_VERSION);
    uint8_t sum[32];
    pf_sha256(s, page, PF_HASHED, sum);
    memcpy(h->header_sha256, page + PFH_HEADER_SHA, 32);
    if (memcmp(sum, h->header_sha256, 32)) {
        char a[65], b[65];
        pf_hex(h->header_sha256, 32, a);
        pf_hex(sum, 32, b);
        return err_set(e, "header: header_sha256 mismatch: stored %s, bytes [0, 4064) hash to %s (corrupt header)", a, b);
    }
    h->page_bytes = pf_get32(page + PFH_PAGE);
    if (h->page_bytes != PF_PAGE) return err_set(e, "header: page_bytes %u, expected %u", h->page_bytes, PF_PAGE);
    h->block = pf_get32(page + PFH_BLOCK);
    if (h->block != PF_BLOCK) return err_set(e, "header: block %u, expected %u", h->block, PF_BLOCK);
    pf_geom g = {pf_get32(page + PFH_N_LAYERS), pf_get32(page + PFH_FIRST_LAYER), pf_get32(page + PFH_N_EXPERTS),
                 pf_get32(page + PFH_HIDDEN), pf_get32(page + PFH_INTER)};
    if (pf_plan(&g, &h->L, e)) return err_wrap(e, "header");
    const pf_layout *L = &h->L;
    static const struct { int off; const char *name; } sz[] = {
        {PFH_SLOT_BYTES, "slot_bytes"}, {PFH_SLOT_STRIDE, "slot_stride"}, {PFH_TABLE_OFFSET, "table_offset"},
        {PFH_TABLE_BYTES, "table_bytes"}, {PFH_BODY_OFFSET, "body_offset"}, {PFH_FILE_BYTES, "file_bytes"}};
    const uint64_t want[6] = {L->slot_bytes, L->slot_stride, L->table_offset, L->table_bytes, L->body_offset, L->file_bytes};
    for (int i = 0; i < 6; i++) {
        uint64_t v = pf_get64(page + sz[i].off);
        if (v != want[i])
            return err_set(e, "header: %s is %" PRIu64 ", the layout formulas give %" PRIu64 " for %u layers x %u experts, H %u, I %u",
                           sz[i].name, v, want[i], g.n_layers, g.n_experts, g.hidden, g.inter);
    }
    for (int i = 0; i < 4; i++) {
        uint32_t off = pf_get32(page + PFH_SECTIONS + 8 * i), len = pf_get32(page + PFH_SECTIONS + 8 * i + 4);
        if (off != L->sec_off[i] || len != L->sec_bytes[i])
            return err_set(e, "header: section %s at %u, %u bytes; expected at %" PRIu64 ", %" PRIu64 " bytes",
                           pf_section_names[i], off, len, L->sec_off[i], L->sec_bytes[i]);
    }
    memcpy(h->table_sha256, page + PFH_TABLE_SHA, 32);
    if (pf_get_text(page + PFH_QUANT_ABI, PF_ABI_LEN, h->quant_abi, "quant_abi", e) ||
        pf_get_text(page + PFH_SOURCE_REPO, PF_REPO_LEN, h->source_repo, "source_repo", e) ||
        pf_get_text(page + PFH_SOURCE_REV, PF_REV_LEN, h->source_revision, "source_revision", e) ||
        pf_get_text(page + PFH_SOURCE_FORMAT, PF_FORMAT_LEN, h->source_format, "source_format", e))
        return err_wrap(e, "header");
    if (!pf_source_format_known(h->source_format))
        return err_set(e, "header: source_format \"%s\", expected nvfp4, fp8 or bf16", h->source_format);
    for (uint32_t i = PFH_RESERVED; i < PFH_HEADER_SHA; i++)
        if (page[i]) return err_set(e, "header: reserved byte %u is 0x%02x, expected 0", i, page[i]);
    return 0;
}

// The quant_abi this build computes with; a file made for another one is refused.
static int pf_check_abi(const pf_header *h, moet_err *e) {
    if (strcmp(h->quant_abi, PF_QUANT_ABI))
        return err_set(e, "quant_abi is \"%s\", this build serves \"%s\"", h->quant_abi, PF_QUANT_ABI);
    return 0;
}

// The slot table entry i as the formulas define it (hash left zero).
static pf_entry pf_entry_expected(const pf_layout *L, uint64_t i) {
    pf_entry x;
    memset(&x, 0, sizeof x);
    x.offset = pf_slot_offset(L, i);
    x.bytes = (uint32_t)L->slot_bytes;
    x.layer = (uint16_t)(L->g.first_layer + i / L->g.n_experts);
    x.expert = (uint16_t)(i % L->g.n_experts);
    return x;
}

// Encodes the table (n_slots entries, then zero padding to table_bytes) and its hash.
static void pf_table_encode(const pf_layout *L, const pf_entry *t, uint8_t *out /* [table_bytes] */,
                            pf_sha *s, uint8_t sha[32]) {
    memset(out, 0, L->table_bytes);
    for (uint64_t i = 0; i < L->n_slots; i++) {
        uint8_t *p = out + i * PF_ENTRY;
        pf_put64(p, t[i].offset);
        pf_put32(p + 8, t[i].bytes);
        pf_put16(p + 12, t[i].layer);
        pf_put16(p + 14, t[i].expert);
        memcpy(p + 16, t[i].sha256, 32);
    }
    pf_sha256(s, out, L->n_slots * PF_ENTRY, sha);
}

// Parses and checks the table bytes [table_bytes] against the header: table_sha256, every entry's
// offset, bytes, layer and expert as the formulas say, zero padding. Fills t[n_slots].
static int pf_table_decode(const pf_header *h, const uint8_t *tab, pf_sha *s, pf_entry *t, moet_err *e) {
    const pf_layout *L = &h->L;
    uint8_t sum[32];
    pf_sha256(s, tab, L->n_slots * PF_ENTRY, sum);
    if (memcmp(sum, h->table_sha256, 32)) {
        char a[65], b[65];
        pf_hex(h->table_sha256, 32, a);
        pf_hex(sum, 32, b);
        return err_set(e, "slot table: table_sha256 mismatch: the header says %s, the %" PRIu64 " entries hash to %s (corrupt table)",
                       a, L->n_slots, b);
    }
    for (uint64_t i = 0; i < L->n_slots; i++) {
        const uint8_t *p = tab + i * PF_ENTRY;
        pf_entry x = pf_entry_expected(L, i);
        t[i].offset = pf_get64(p);
        t[i].bytes = pf_get32(p + 8);
        t[i].layer = pf_get16(p + 12);
        t[i].expert = pf_get16(p + 14);
        memcpy(t[i].sha256, p + 16, 32);
        const char *what = t[i].offset != x.offset ? "offset" : t[i].bytes != x.bytes ? "bytes"
                         : t[i].layer != x.layer ? "layer" : t[i].expert != x.expert ? "expert" : NULL;
        if (what)
            return err_set(e, "slot table entry %" PRIu64 " (layer %u, expert %u): %s is wrong: entry has offset %" PRIu64
                              ", bytes %u, layer %u, expert %u; expected offset %" PRIu64 ", bytes %u, layer %u, expert %u",
                           i, x.layer, x.expert, what, t[i].offset, t[i].bytes, t[i].layer, t[i].expert,
                           x.offset, x.bytes, x.layer, x.expert);
    }
    for (uint64_t i = L->n_slots * PF_ENTRY; i < L->table_bytes; i++)
        if (tab[i]) return err_set(e, "slot table: padding byte at table offset %" PRIu64 " is 0x%02x, expected 0", i, tab[i]);
    return 0;
}

// Model geometry against the file's (PLANES.md §4: n_layers, n_experts, H, I).
static int pf_check_geometry(const pf_header *h, const pf_geom *model, moet_err *e) {
    const pf_geom *g = &h->L.g;
    static const char *names[5] = {"MoE layers", "first layer", "experts per layer", "hidden size", "expert intermediate size"};
    const uint32_t a[5] = {g->n_layers, g->first_layer, g->n_experts, g->hidden, g->inter};
    const uint32_t b[5] = {model->n_layers, model->first_layer, model->n_experts, model->hidden, model->inter};
    for (int i = 0; i < 5; i++)
        if (a[i] != b[i])
            return err_set(e, "geometry mismatch: the plane file has %s %u, the model has %u "
                              "(file: %u layers x %u experts, H %u, I %u; model: %u x %u, H %u, I %u)",
                           names[i], a[i], b[i], g->n_layers, g->n_experts, g->hidden, g->inter,
                           model->n_layers, model->n_experts, model->hidden, model->inter);
    return 0;
}

// The source revision of the file against the checkpoint's (when both are known). Returns 0 when
// they agree or one is unknown; 1 with a warning in e when they differ and !strict; -1 (refusal)
// when they differ and strict.
static int pf_check_source(const pf_header *h, const char *revision, int strict, moet_err *e) {
    if (!revision || !*revision || !h->source_revision[0]) return 0;
    if (!strcmp(revision, h->source_revision)) return 0;
    err_set(e, "source revision mismatch: the plane file was built from revision %s%s%s, the checkpoint is revision %s",
            h->source_revision, h->source_repo[0] ? " of " : "", h->source_repo, revision);
    return strict ? -1 : 1;
}

// ==========================================================================================
// file I/O helpers
// ==========================================================================================

// Reads exactly n bytes at off (retrying short reads and EINTR). 0, or -1 with errno (EIO; 0 at EOF).
static int pf_pread_full(int fd, void *buf, size_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { if (r == 0) errno = 0; return -1; }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int pf_pwrite_full(int fd, const void *buf, size_t n, uint64_t off) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t r = pwrite(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { if (r == 0) errno = EIO; return -1; }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int pf_ncpu(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MOET_PF_MAX_THREADS ? MOET_PF_MAX_THREADS : (int)n;
}

// A progress line on stderr: a bar redrawn in place on a terminal, a line per tenth otherwise.
typedef struct {
    const char *what;
    int tty;
    int last_tenth;
    double t0;
} pf_progress;

static void pf_progress_start(pf_progress *p, const char *what) {
    p->what = what;
    p->tty = isatty(2);
    p->last_tenth = -1;
    p->t0 = moet_now();
}

// done/total units; rate text (e.g. "1.52 GB/s") formed by the caller.
static void pf_progress_show(pf_progress *p, uint64_t done, uint64_t total, const char *rate, int final) {
    int tenth = total ? (int)(done * 10 / total) : 10;
    if (!p->tty && !final && tenth == p->last_tenth) return;
    p->last_tenth = tenth;
    char bar[31];
    int fill = total ? (int)(done * 30 / total) : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "%s%s [%s] %5.1f%% %" PRIu64 "/%" PRIu64 " %s%s", p->tty ? "\r" : "", p->what, bar,
            total ? 100.0 * (double)done / (double)total : 100.0, done, total, rate, (!p->tty || final) ? "\n" : "");
    fflush(stderr);
}

// ==========================================================================================
// the writer
// ==========================================================================================
//
// Worker threads take slot indices in order, ask the source for the expert (f64), quantize it
// into a ring buffer and hash it; the calling thread writes the ring buffers to the file in slot
// order (one sequential stream) and frees them. Slot i uses ring buffer i % B and may start
// only once slot i - B is written, so at most B slots are in flight and the memory (B slot
// buffers + one f64 expert and one code scratch per worker) is planned before the first byte.
// The file is written as <out>.tmp.<pid> in the same directory, fsync'ed, then renamed over
// <out> (format/outfile.c: <out> must be absent or a regular file); on any failure, and on any
// signal that ends the process, the temporary file is removed.

// Decodes one routed expert of the source checkpoint to f64: w13 = gate_proj rows then up_proj
// rows [2I, H], w2 = down_proj [H, I]. Called from several threads at once.
typedef int (*pf_source_fn)(void *ctx, uint32_t layer, uint32_t expert, double *w13 /* [2I, H] */,
                            double *w2 /* [H, I] */, moet_err *e);

typedef struct {
    pf_geom geom;
    const char *out_path;
    of_file *out;                  // when set: the output file, begun already (of_begin) by a command that
                                   // makes its output before the work; pf_build takes it over
    const char *source_repo;       // may be NULL/empty
    const char *source_revision;   // may be NULL/empty
    const char *source_format;     // nvfp4, fp8 or bf16
    int threads;                   // 0: every core
    int progress;                  // progress lines on stderr
    pf_source_fn source;
    void *source_ctx;
} pf_build_opts;

typedef struct {
    uint64_t slots;      // slots written
    double seconds;      // wall time of the quantize + write phase
} pf_build_stats;

typedef struct {
    const pf_build_opts *o;
    const pf_layout *L;
    uint32_t B;                 // ring buffers
    uint8_t **ring;             // [B] each slot_stride bytes (padding stays zero)
    uint8_t *ready;             // [B] buffer holds a finished slot
    pf_entry *table;            // [n_slots]; workers fill the hashes
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next_take;         // next slot index handed to a worker
    uint64_t next_write;        // slots below it are written
    int failed;
    moet_err err;               // the first failure
} pf_build_ctx;

typedef struct {
    pf_build_ctx *b;
    double *w13, *w2;           // [2I, H], [H, I] f64
    uint8_t *scratch;           // [2I·H]
    pf_sha sha;
} pf_worker;

static void pf_build_fail(pf_build_ctx *b, const moet_err *e) {
    pthread_mutex_lock(&b->mu);
    if (!b->failed) {
        b->failed = 1;
        b->err = *e;
    }
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void *pf_build_worker(void *arg) {
    pf_worker *w = arg;
    pf_build_ctx *b = w->b;
    const pf_layout *L = b->L;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        if (b->failed || b->next_take >= L->n_slots) { pthread_mutex_unlock(&b->mu); break; }
        uint64_t i = b->next_take++;
        while (!b->failed && i >= b->next_write + b->B) pthread_cond_wait(&b->cv, &b->mu);
        int stop = b->failed;
        pthread_mutex_unlock(&b->mu);
        if (stop) break;
        uint8_t *slot = b->ring[i % b->B];
        uint32_t layer = L->g.first_layer + (uint32_t)(i / L->g.n_experts), expert = (uint32_t)(i % L->g.n_experts);
        moet_err e;
        e.msg[0] = 0;
        if (b->o->source(b->o->source_ctx, layer, expert, w->w13, w->w2, &e) ||
            pf_quant_expert(L, w->w13, w->w2, slot, w->scratch, &e)) {
            err_wrap(&e, "layer %u, expert %u", layer, expert);
            pf_build_fail(b, &e);
            break;
        }
        pf_sha256(&w->sha, slot, L->slot_bytes, b->table[i].sha256);
        pthread_mutex_lock(&b->mu);
        b->ready[i % b->B] = 1;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

typedef struct {
    uint8_t **ring;      // [B] slot buffers
    uint8_t *ready;      // [B]
    pf_entry *table;     // [n_slots]
    uint8_t *tab;        // [table_bytes] encoded table
    uint8_t *page;       // [4096] header page
    pf_worker *wk;       // [T]
} pf_build_mem;

// Every buffer of a build, carved from a (measuring or real) arena; on a measuring one m's
// pointers are NULL.
static void pf_build_carve(arena *a, const pf_layout *L, int T, uint32_t B, pf_build_mem *m) {
    size_t w13_n = (size_t)2 * L->g.inter * L->g.hidden, w2_n = (size_t)L->g.inter * L->g.hidden;
    m->ring = arena_take(a, sizeof(uint8_t *) * B, 8, "ring");
    m->ready = arena_take(a, B, 8, "ready flags");
    m->table = arena_take(a, sizeof(pf_entry) * L->n_slots, 8, "slot table");
    m->tab = arena_take(a, L->table_bytes, PF_PAGE, "table bytes");
    m->page = arena_take(a, PF_PAGE, PF_PAGE, "header page");
    m->wk = arena_take(a, sizeof(pf_worker) * (size_t)T, 8, "workers");
    for (uint32_t i = 0; i < B; i++) {
        uint8_t *p = arena_take(a, L->slot_stride, PF_PAGE, "slot buffer");
        if (m->ring) m->ring[i] = p;
    }
    for (int t = 0; t < T; t++) {
        double *w13 = arena_take(a, w13_n * sizeof(double), 64, "w13 f64");
        double *w2 = arena_take(a, w2_n * sizeof(double), 64, "w2 f64");
        uint8_t *scratch = arena_take(a, w13_n, 64, "code scratch");
        if (m->wk) {
            memset(&m->wk[t], 0, sizeof m->wk[t]);
            m->wk[t].w13 = w13;
            m->wk[t].w2 = w2;
            m->wk[t].scratch = scratch;
        }
    }
}

// Runs the workers and writes their slots in order to fd, the file `name` (the calling thread
// is the writer). 0, or -1 with b->err set. secs: wall time of the whole run.
static int pf_build_run(pf_build_ctx *b, pf_worker *wk, int T, int fd, const char *name, int progress, double *secs) {
    const pf_layout *L = b->L;
    uint32_t B = b->B;
    int n_started = 0;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    pthread_t tid[MOET_PF_MAX_THREADS];
    for (; n_started < T; n_started++)
        if (pthread_create(&tid[n_started], NULL, pf_build_worker, &wk[n_started])) {
            moet_err te;
            err_set(&te, "cannot start worker thread %d", n_started);
            pf_build_fail(b, &te);
            break;
        }
    pf_progress pr;
    pf_progress_start(&pr, "build-planes");
    double t_last = pr.t0;
    pthread_mutex_lock(&b->mu);
    while (!b->failed && b->next_write < L->n_slots) {
        uint64_t i = b->next_write;
        if (!b->ready[i % B]) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 250000000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        } else {
            pthread_mutex_unlock(&b->mu);
            int wr = pf_pwrite_full(fd, b->ring[i % B], L->slot_stride, pf_slot_offset(L, i));
            int werr = errno;
            pthread_mutex_lock(&b->mu);
            if (wr) {
                if (!b->failed) {
                    b->failed = 1;
                    err_set(&b->err, "%s: write of slot %" PRIu64 " failed: %s", name, i, strerror(werr));
                }
                pthread_cond_broadcast(&b->cv);
                break;
            }
            b->ready[i % B] = 0;
            b->next_write++;
            pthread_cond_broadcast(&b->cv);
        }
        double now = moet_now();
        if (progress && now - t_last >= 0.5) {
            t_last = now;
            uint64_t done = b->next_write;
            pthread_mutex_unlock(&b->mu);
            char rate[64];
            snprintf(rate, sizeof rate, "experts, %.1f experts/s", (double)done / (now - pr.t0 + 1e-9));
            pf_progress_show(&pr, done, L->n_slots, rate, 0);
            pthread_mutex_lock(&b->mu);
        }
    }
    pthread_mutex_unlock(&b->mu);
    for (int t = 0; t < n_started; t++) pthread_join(tid[t], NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    *secs = moet_now() - pr.t0;
    if (b->failed) return -1;
    if (progress) {
        char rate[64];
        snprintf(rate, sizeof rate, "experts, %.1f experts/s", (double)L->n_slots / (*secs + 1e-9));
        pf_progress_show(&pr, L->n_slots, L->n_slots, rate, 1);
    }
    return 0;
}

// Builds the plane file o->out_path into out (begun here when out->fd < 0).
static int pf_build_to(const pf_build_opts *o, of_file *out_file, pf_build_stats *st, moet_err *e) {
    pf_header h;
    if (pf_header_init(&h, &o->geom, e)) return -1;
    const pf_layout *L = &h.L;
    const char *fmt = o->source_format ? o->source_format : "";
    if (!pf_source_format_known(fmt)) return err_set(e, "source format \"%s\", expected nvfp4, fp8 or bf16", fmt);
    snprintf(h.source_format, sizeof h.source_format, "%s", fmt);
    const char *repo = o->source_repo ? o->source_repo : "", *rev = o->source_revision ? o->source_revision : "";
    if (strlen(repo) > PF_REPO_LEN) return err_set(e, "source repo \"%s\" is longer than %d bytes", repo, PF_REPO_LEN);
    if (strlen(rev) > PF_REV_LEN) return err_set(e, "source revision \"%s\" is longer than %d bytes", rev, PF_REV_LEN);
    for (const char *c = repo; *c; c++)
        if ((uint8_t)*c < 0x20 || *c == 0x7f) return err_set(e, "source repo contains a control character");
    for (const char *c = rev; *c; c++)
        if ((uint8_t)*c < 0x20 || *c == 0x7f) return err_set(e, "source revision contains a control character");
    snprintf(h.source_repo, sizeof h.source_repo, "%s", repo);
    snprintf(h.source_revision, sizeof h.source_revision, "%s", rev);
    if (strlen(o->out_path) >= MOET_MAX_PATH) return err_set(e, "output path is longer than %d bytes", MOET_MAX_PATH - 1);

    int T = o->threads > 0 ? o->threads : pf_ncpu();
    if (T > MOET_PF_MAX_THREADS) T = MOET_PF_MAX_THREADS;
    if ((uint64_t)T > L->n_slots) T = (int)L->n_slots;
    uint32_t B = (uint32_t)(2 * T);

    // memory plan: the same carve runs on a measuring arena, then on the real one
    arena mem;
    pf_build_mem m = {0};
    arena_plan mp = arena_plan_begin(&mem, "plane build", ARENA_HOST, e);
    while (arena_plan_pass(&mp)) pf_build_carve(mp.on, L, T, B, &m);
    if (mp.failed) return -1;
    pf_build_ctx b;
    memset(&b, 0, sizeof b);
    b.o = o;
    b.L = L;
    b.B = B;
    b.ring = m.ring;
    b.ready = m.ready;
    b.table = m.table;
    uint8_t *tab = m.tab, *page = m.page;
    pf_worker *wk = m.wk;
    memset(b.ready, 0, B);
    for (uint32_t i = 0; i < B; i++) memset(b.ring[i], 0, L->slot_stride);   // padding stays zero
    for (int t = 0; t < T; t++) wk[t].b = &b;
    for (uint64_t i = 0; i < L->n_slots; i++) b.table[i] = pf_entry_expected(L, i);

    pf_sha sha = {0};
    int rc = -1;
    of_file out = *out_file;
    out_file->fd = -1;   // this function's now: committed or removed below
    if (pf_sha_init(&sha, e)) goto out_file;
    for (int t = 0; t < T; t++)
        if (pf_sha_init(&wk[t].sha, e)) goto out_file;

    if (out.fd < 0 && of_begin(&out, o->out_path, e)) goto out_mem;
    // reserve the whole file now: a full disk shows up before hours of work, not after
    int fr = posix_fallocate(out.fd, 0, (off_t)L->file_bytes);
    if (fr == EOPNOTSUPP || fr == EINVAL) fr = ftruncate(out.fd, (off_t)L->file_bytes) ? errno : 0;
    if (fr) { err_set(e, "%s: cannot reserve %" PRIu64 " bytes: %s", out.tmp, L->file_bytes, strerror(fr)); goto out_file; }

    double secs = 0;
    if (pf_build_run(&b, wk, T, out.fd, out.tmp, o->progress, &secs)) {
        if (e) *e = b.err;
        goto out_file;
    }
    if (st) {
        st->slots = L->n_slots;
        st->seconds = secs;
    }
    pf_table_encode(L, b.table, tab, &sha, h.table_sha256);
    pf_header_encode(&h, &sha, page);
    if (pf_pwrite_full(out.fd, tab, L->table_bytes, L->table_offset) || pf_pwrite_full(out.fd, page, PF_PAGE, 0)) {
        err_set(e, "%s: write of the header/table failed: %s", out.tmp, strerror(errno));
        goto out_file;
    }
    if (of_commit(&out, e)) goto out_mem;
    rc = 0;
out_file:
    of_abort(&out);   // nothing once committed
out_mem:
    for (int t = 0; t < T; t++) pf_sha_free(&wk[t].sha);
    pf_sha_free(&sha);
    arena_release(&mem);
    return rc;
}

// Builds the plane file o->out_path. On failure nothing is left at out_path that was not there
// before, and the temporary file is gone (o->out, when given, too).
static int pf_build(const pf_build_opts *o, pf_build_stats *st, moet_err *e) {
    of_file out = {.fd = -1};
    if (o->out) {
        out = *o->out;
        o->out->fd = -1;
    }
    int rc = pf_build_to(o, &out, st, e);
    of_abort(&out);   // nothing once committed, nothing when pf_build_to took it
    return rc;
}

// ==========================================================================================
// the reader
// ==========================================================================================

typedef struct {
    char path[MOET_MAX_PATH];
    int fd;               // buffered reads
    int fd_direct;        // O_DIRECT reads, or -1 when the filesystem refuses them
    pf_header h;
    pf_entry *table;      // [n_slots]
    size_t table_alloc;   // bytes of the allocation behind table
    uint64_t file_size;
} pf_file;

static void pf_close(pf_file *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->fd_direct >= 0) close(f->fd_direct);
    if (f->table) arena_sys_free(f->table, f->table_alloc);
    f->fd = f->fd_direct = -1;
    f->table = NULL;
}

// Opens a plane file and checks everything but the slots: header (magic, version, hash, sizes,
// fields), quant_abi, file size = file_bytes, slot table (hash, entries, padding). Tries O_DIRECT
// for slot reads and falls back to the page cache, with a warning, when the filesystem refuses it.
static int pf_open(pf_file *f, const char *path, moet_err *e) {
    memset(f, 0, sizeof *f);
    f->fd = f->fd_direct = -1;
    if (strlen(path) >= sizeof f->path) return err_set(e, "plane file path is longer than %d bytes", MOET_MAX_PATH - 1);
    snprintf(f->path, sizeof f->path, "%s", path);
    pf_sha sha = {0};
    uint8_t *page = NULL, *tab = NULL;
    size_t tab_alloc = 0;
    int rc = -1;
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   // a FIFO is refused below, not waited on
    if (f->fd < 0) { err_set(e, "%s: cannot open: %s", path, strerror(errno)); goto out; }
    struct stat st;
    if (fstat(f->fd, &st) || !S_ISREG(st.st_mode)) { err_set(e, "%s: not a regular file", path); goto out; }
    f->file_size = (uint64_t)st.st_size;
    if (pf_sha_init(&sha, e)) goto out;
    page = arena_sys_alloc(PF_PAGE, "plane header page");
    if (!page) { err_set(e, "%s: out of memory", path); goto out; }
    size_t got = f->file_size < PF_PAGE ? (size_t)f->file_size : PF_PAGE;
    if (got && pf_pread_full(f->fd, page, got, 0)) { err_set(e, "%s: cannot read the header: %s", path, strerror(errno)); goto out; }
    if (pf_header_decode(page, got, &sha, &f->h, e) || pf_check_abi(&f->h, e)) { err_wrap(e, "%s", path); goto out; }
    const pf_layout *L = &f->h.L;
    if (f->file_size != L->file_bytes) {
        err_set(e, "%s: file is %" PRIu64 " bytes, the header says file_bytes %" PRIu64 " (%s)", path, f->file_size,
                L->file_bytes, f->file_size < L->file_bytes ? "truncated" : "trailing bytes");
        goto out;
    }
    tab_alloc = L->table_bytes;
    tab = arena_sys_alloc(tab_alloc, "plane table bytes");
    f->table_alloc = sizeof(pf_entry) * L->n_slots;
    f->table = arena_sys_alloc(f->table_alloc, "plane table");
    if (!tab || !f->table) { err_set(e, "%s: out of memory for the slot table", path); goto out; }
    if (pf_pread_full(f->fd, tab, L->table_bytes, L->table_offset)) { err_set(e, "%s: cannot read the slot table: %s", path, strerror(errno)); goto out; }
    if (pf_table_decode(&f->h, tab, &sha, f->table, e)) { err_wrap(e, "%s", path); goto out; }
    // O_DIRECT: open, then prove one aligned read works (some filesystems accept the flag and
    // refuse the read)
    f->fd_direct = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (f->fd_direct >= 0 && pf_pread_full(f->fd_direct, page, PF_PAGE, 0)) {
        int err = errno;
        close(f->fd_direct);
        f->fd_direct = -1;
        errno = err;
    }
    if (f->fd_direct < 0)
        fprintf(stderr, "moet: warning: %s: the filesystem refuses O_DIRECT reads (%s); reading through the page cache\n",
                path, strerror(errno));
    rc = 0;
out:
    if (page) arena_sys_free(page, PF_PAGE);
    if (tab) arena_sys_free(tab, tab_alloc);
    pf_sha_free(&sha);
    if (rc) pf_close(f);
    return rc;
}

// Reads the slot of (model layer, expert) into buf. With cap ≥ slot_stride it reads the whole
// padded slot (straight from disk with O_DIRECT when buf is page-aligned), otherwise slot_bytes
// through the page cache. With sha (a per-thread context) the slot bytes are checked against the
// table entry, and the padding is checked zero when it was read. 0, or -1 naming the slot.
static int pf_read_slot(pf_file *f, uint32_t layer, uint32_t expert, void *buf, size_t cap, pf_sha *sha, moet_err *e) {
    const pf_layout *L = &f->h.L;
    int64_t i = pf_slot_index(L, layer, expert);
    if (i < 0) return err_set(e, "%s: no slot for layer %u, expert %u (the file holds layers %u..%u, %u experts)", f->path,
                              layer, expert, L->g.first_layer, L->g.first_layer + L->g.n_layers - 1, L->g.n_experts);
    if (cap < L->slot_bytes) return err_set(e, "%s: slot buffer of %zu bytes, a slot needs %" PRIu64, f->path, cap, L->slot_bytes);
    uint64_t off = pf_slot_offset(L, (uint64_t)i);
    int whole = cap >= L->slot_stride, direct = whole && f->fd_direct >= 0 && ((uintptr_t)buf % PF_PAGE) == 0;
    if (pf_pread_full(direct ? f->fd_direct : f->fd, buf, whole ? L->slot_stride : L->slot_bytes, off))
        return err_set(e, "%s: slot (layer %u, expert %u) at offset %" PRIu64 ": read failed: %s", f->path, layer, expert, off,
                       errno ? strerror(errno) : "unexpected end of file");
    if (sha) {
        uint8_t sum[32];
        pf_sha256(sha, buf, L->slot_bytes, sum);
        if (memcmp(sum, f->table[i].sha256, 32)) {
            char a[65], b[65];
            pf_hex(f->table[i].sha256, 32, a);
            pf_hex(sum, 32, b);
            return err_set(e, "%s: slot (layer %u, expert %u): SHA-256 mismatch: the table says %s, the slot hashes to %s",
                           f->path, layer, expert, a, b);
        }
        const uint8_t *p = buf;
        for (uint64_t k = L->slot_bytes; whole && k < L->slot_stride; k++)
            if (p[k]) return err_set(e, "%s: slot (layer %u, expert %u): padding byte at slot offset %" PRIu64 " is not zero",
                                     f->path, layer, expert, k);
    }
    return 0;
}

// ==========================================================================================
// slot verification: every slot hashed against its entry, padding zero (PLANES.md §4)
// ==========================================================================================
//
// Threads take runs of consecutive slots, read each run with one O_DIRECT pread into their own
// page-aligned buffer and hash slot by slot; reads of one thread overlap the hashing of another.

enum { PF_SLOT_OK, PF_SLOT_SHA, PF_SLOT_PAD, PF_SLOT_IO };
#define PF_VERIFY_RUN_BYTES (8u << 20)   // bytes per read: large enough for full disk speed

typedef struct {
    pf_file *f;
    uint32_t run;                 // slots per read
    _Atomic uint64_t next;        // next run index
    _Atomic uint64_t bytes_done;
    _Atomic uint32_t n_bad;
    uint8_t *status;              // [n_slots] PF_SLOT_*
    uint32_t *detail;             // [n_slots] padding: first non-zero offset; io: errno
    uint8_t (*sums)[32];          // [n_slots] computed hashes
} pf_verify_ctx;

typedef struct {
    pf_verify_ctx *v;
    uint8_t *buf;                 // [run · slot_stride], page-aligned
    pf_sha sha;
} pf_verifier;

static void *pf_verify_worker(void *arg) {
    pf_verifier *w = arg;
    pf_verify_ctx *v = w->v;
    pf_file *f = v->f;
    const pf_layout *L = &f->h.L;
    uint64_t n_runs = (L->n_slots + v->run - 1) / v->run;
    for (;;) {
        uint64_t r = atomic_fetch_add(&v->next, 1);
        if (r >= n_runs) break;
        uint64_t first = r * v->run, count = L->n_slots - first < v->run ? L->n_slots - first : v->run;
        size_t bytes = (size_t)(count * L->slot_stride);
        int fd = f->fd_direct >= 0 ? f->fd_direct : f->fd;
        if (pf_pread_full(fd, w->buf, bytes, pf_slot_offset(L, first))) {
            uint32_t err = (uint32_t)errno;
            for (uint64_t i = first; i < first + count; i++) {
                v->status[i] = PF_SLOT_IO;
                v->detail[i] = err;
            }
            atomic_fetch_add(&v->n_bad, (uint32_t)count);
            atomic_fetch_add(&v->bytes_done, bytes);
            continue;
        }
        for (uint64_t k = 0; k < count; k++) {
            uint64_t i = first + k;
            const uint8_t *s = w->buf + k * L->slot_stride;
            pf_sha256(&w->sha, s, L->slot_bytes, v->sums[i]);
            if (memcmp(v->sums[i], f->table[i].sha256, 32)) {
                v->status[i] = PF_SLOT_SHA;
                atomic_fetch_add(&v->n_bad, 1);
                continue;
            }
            for (uint64_t p = L->slot_bytes; p < L->slot_stride; p++)
                if (s[p]) {
                    v->status[i] = PF_SLOT_PAD;
                    v->detail[i] = (uint32_t)p;
                    atomic_fetch_add(&v->n_bad, 1);
                    break;
                }
        }
        atomic_fetch_add(&v->bytes_done, bytes);
    }
    return NULL;
}

// Describes the failure of slot i into out.
static void pf_slot_problem(const pf_verify_ctx *v, uint64_t i, char *out, size_t cap) {
    const pf_file *f = v->f;
    const pf_layout *L = &f->h.L;
    pf_entry x = pf_entry_expected(L, i);
    char a[65], b[65];
    switch (v->status[i]) {
    case PF_SLOT_SHA:
        pf_hex(f->table[i].sha256, 32, a);
        pf_hex(v->sums[i], 32, b);
        snprintf(out, cap, "slot (layer %u, expert %u) at offset %" PRIu64 ": SHA-256 mismatch: the table says %s, the %" PRIu64
                           " slot bytes hash to %s", x.layer, x.expert, x.offset, a, L->slot_bytes, b);
        break;
    case PF_SLOT_PAD:
        snprintf(out, cap, "slot (layer %u, expert %u) at offset %" PRIu64 ": padding byte at slot offset %u is not zero",
                 x.layer, x.expert, x.offset, v->detail[i]);
        break;
    default:
        snprintf(out, cap, "slot (layer %u, expert %u) at offset %" PRIu64 ": read failed: %s", x.layer, x.expert, x.offset,
                 v->detail[i] ? strerror((int)v->detail[i]) : "unexpected end of file");
    }
}

// Every buffer of a verification, carved from a (measuring or real) arena; v's buffers and *wp
// are set on the real one.
static void pf_verify_carve(arena *a, const pf_layout *L, int T, uint32_t run, pf_verify_ctx *v, pf_verifier **wp) {
    size_t ns = (size_t)L->n_slots;
    uint8_t *status = arena_take(a, ns, 8, "status");
    uint32_t *detail = arena_take(a, ns * 4, 8, "detail");
    uint8_t(*sums)[32] = arena_take(a, ns * 32, 8, "sums");
    pf_verifier *w = arena_take(a, sizeof(pf_verifier) * (size_t)T, 8, "verifiers");
    for (int t = 0; t < T; t++) {
        uint8_t *buf = arena_take(a, (size_t)run * L->slot_stride, PF_PAGE, "read buffer");
        if (a->base) {
            memset(&w[t], 0, sizeof w[t]);
            w[t].v = v;
            w[t].buf = buf;
        }
    }
    if (a->base) {
        v->status = status;
        v->detail = detail;
        v->sums = sums;
        *wp = w;
    }
}

typedef struct {
    uint64_t bytes;       // bytes read
    double seconds;
    uint32_t bad;         // slots that failed
} pf_verify_stats;

// Hashes every slot with `threads` threads (0: a default) and checks padding. 0 when all hold;
// else -1, e naming the first failing slot and the count; with log, every failure (up to 20) is
// printed there.
static int pf_verify_slots(pf_file *f, int threads, int progress, FILE *log, pf_verify_stats *st, moet_err *e) {
    const pf_layout *L = &f->h.L;
    int T = threads > 0 ? threads : pf_ncpu() + 2;   // + 2: readers waiting on the disk do not hash
    if (T > MOET_PF_MAX_THREADS) T = MOET_PF_MAX_THREADS;
    uint32_t run = (uint32_t)(PF_VERIFY_RUN_BYTES / L->slot_stride);
    if (run < 1) run = 1;
    if ((uint64_t)T * run > L->n_slots) {   // small files: spread the slots over the threads
        run = (uint32_t)((L->n_slots + (uint64_t)T - 1) / (uint64_t)T);
        if ((uint64_t)T > L->n_slots) T = (int)L->n_slots;
    }
    pf_verify_ctx v;
    memset(&v, 0, sizeof v);
    pf_verifier *w = NULL;
    arena mem;
    arena_plan mp = arena_plan_begin(&mem, "plane verify", ARENA_HOST, e);
    while (arena_plan_pass(&mp)) pf_verify_carve(mp.on, L, T, run, &v, &w);
    if (mp.failed) return -1;
    v.f = f;
    v.run = run;
    atomic_init(&v.next, 0);
    atomic_init(&v.bytes_done, 0);
    atomic_init(&v.n_bad, 0);
    memset(v.status, 0, (size_t)L->n_slots);
    memset(v.detail, 0, (size_t)L->n_slots * 4);
    int rc = -1, started = 0;
    pthread_t tid[MOET_PF_MAX_THREADS];
    for (int t = 0; t < T; t++)
        if (pf_sha_init(&w[t].sha, e)) goto out;
    pf_progress pr;
    pf_progress_start(&pr, "verify");
    for (; started < T; started++)
        if (pthread_create(&tid[started], NULL, pf_verify_worker, &w[started])) break;
    if (!started) { err_set(e, "cannot start a hashing thread"); goto out; }
    uint64_t total = L->n_slots * L->slot_stride;
    double t_last = pr.t0;
    for (;;) {
        uint64_t done = atomic_load(&v.bytes_done);
        if (done >= total) break;
        double now = moet_now();
        if (progress && now - t_last >= 0.25) {
            t_last = now;
            char rate[64];
            snprintf(rate, sizeof rate, "bytes, %.2f GB/s", (double)done / 1e9 / (now - pr.t0 + 1e-9));
            pf_progress_show(&pr, done, total, rate, 0);
        }
        struct timespec ts = {0, 10000000};   // 10 ms: small files finish without a visible wait
        nanosleep(&ts, NULL);
    }
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    double secs = moet_now() - pr.t0;
    if (progress) {
        char rate[64];
        snprintf(rate, sizeof rate, "bytes, %.2f GB/s", (double)total / 1e9 / (secs + 1e-9));
        pf_progress_show(&pr, total, total, rate, 1);
    }
    uint32_t bad = atomic_load(&v.n_bad);
    if (st) {
        st->bytes = total;
        st->seconds = secs;
        st->bad = bad;
    }
    if (bad) {
        char msg[512];
        uint32_t shown = 0;
        int first = 1;
        for (uint64_t i = 0; i < L->n_slots; i++) {
            if (v.status[i] == PF_SLOT_OK) continue;
            pf_slot_problem(&v, i, msg, sizeof msg);
            if (first) {
                err_set(e, "%s: %s (%u of %" PRIu64 " slots failed)", f->path, msg, bad, L->n_slots);
                first = 0;
            }
            if (log && shown++ < 20) fprintf(log, "moet: %s: %s\n", f->path, msg);
        }
        goto out;
    }
    rc = 0;
out:
    for (int t = 0; t < T; t++) pf_sha_free(&w[t].sha);
    arena_release(&mem);
    return rc;
}
