// tests/test_checkpoint.c — element decoders, config reading, and every checkpoint error.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"

// Builds DIR/model.safetensors from the tiny bf16 fixture with one change: `drop` omitted,
// or `retype` given another dtype (its bytes reinterpreted), or `reshape` given another shape.
static void write_variant(const char *dir, const char *drop, const char *retype, int new_dtype, const char *reshape) {
    st_set s;
    moet_err e;
    char path[512];
    MOET_ASSERT(st_open(&s, "tests/fixtures/tiny/bf16/model.safetensors", &e) == 0, "%s", e.msg);
    static st_out out[4096];
    int n = 0;
    for (uint32_t i = 0; i < s.n_tensors; i++) {
        const st_tensor *t = &s.tensors[i];
        if (drop && !strcmp(t->name, drop)) continue;
        st_out *o = &out[n++];
        o->name = t->name;
        o->dtype = t->dtype;
        o->ndim = t->ndim;
        memcpy(o->shape, t->shape, sizeof o->shape);
        o->data = t->data;
        if (retype && !strcmp(t->name, retype)) {
            // same byte count: BF16 → F16 or I16 (same shape), or a 1-byte type with twice the elements
            if (st_dtypes[new_dtype].bytes == 1 && st_dtypes[t->dtype].bytes == 2) o->shape[o->ndim - 1] *= 2;
            o->dtype = new_dtype;
        }
        if (reshape && !strcmp(t->name, reshape)) { o->shape[0] /= 2; o->shape[o->ndim - 1] *= 2; }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    MOET_ASSERT(st_save(path, out, n, &e) == 0, "%s", e.msg);
    st_close(&s);
}

static void copy_file(const char *from, const char *to, const char *find, const char *repl) {
    size_t len;
    moet_err e;
    char *t = arena_read_small(from, 1 << 24, &len, &e);
    MOET_ASSERT(t, "%s", e.msg);
    FILE *f = fopen(to, "wb");
    MOET_ASSERT(f, "%s", to);
    char *hit = find ? strstr(t, find) : NULL;
    if (hit) {
        fwrite(t, 1, (size_t)(hit - t), f);
        fputs(repl, f);
        fputs(hit + strlen(find), f);
    } else fwrite(t, 1, len, f);
    fclose(f);
    arena_sys_free(t, len + 1);
}

// ck_open must fail with a message containing every one of the words.
static void expect_fail(const char *dir, const char *w1, const char *w2, const char *w3) {
    ck_model m;
    moet_err e = {{0}};
    int rc = ck_open(&m, dir, &e);
    CHECK(rc == -1, "%s: opened a broken checkpoint", dir);
    if (rc == 0) { ck_close(&m); return; }
    CHECK(!w1 || strstr(e.msg, w1), "message lacks '%s': %s", w1, e.msg);
    CHECK(!w2 || strstr(e.msg, w2), "message lacks '%s': %s", w2, e.msg);
    CHECK(!w3 || strstr(e.msg, w3), "message lacks '%s': %s", w3, e.msg);
}

int main(void) {
    ck_init_tables();
    // ---- e4m3 (OCP float8_e4m3fn): values from the format's definition
    struct { uint8_t b; double v; } e4[] = {
        {0x00, 0.0}, {0x80, -0.0}, {0x01, 0.001953125 /* 2^-9, smallest subnormal */}, {0x07, 0.013671875 /* 7·2^-9 */},
        {0x08, 0.015625 /* 2^-6 */}, {0x38, 1.0}, {0x39, 1.125}, {0x3F, 1.875}, {0x40, 2.0}, {0x7E, 448.0},
        {0xFE, -448.0}, {0xB8, -1.0}, {0x30, 0.5}, {0x77, 240.0},
    };
    for (size_t i = 0; i < sizeof e4 / sizeof e4[0]; i++)
        CHECK(ck_e4m3_lut[e4[i].b] == (float)e4[i].v && !signbit(ck_e4m3_lut[e4[i].b]) == !signbit(e4[i].v),
              "e4m3 0x%02x = %g, expected %g", e4[i].b, ck_e4m3_lut[e4[i].b], e4[i].v);
    CHECK(isnan(ck_e4m3_lut[0x7F]) && isnan(ck_e4m3_lut[0xFF]), "e4m3 NaN codes");
    int finite = 0;
    for (int b = 0; b < 256; b++) finite += isfinite(ck_e4m3_lut[b]);
    CHECK(finite == 254, "e4m3 has exactly two non-finite codes, found %d finite", finite);
    // ---- e2m1 nibbles: bit 3 sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}
    const double mags[8] = {0, .5, 1, 1.5, 2, 3, 4, 6};
    for (int n = 0; n < 16; n++) CHECK(ck_e2m1_lut[n] == (n & 8 ? -mags[n & 7] : mags[n & 7]), "e2m1 %d", n);
    // ---- UE8M0 plane scales: 2^(b − 127) for every byte
    int e8ok = 1;
    for (int b = 0; b < 256; b++) e8ok &= ck_e8m0((uint8_t)b) == ldexpf(1.f, b - 127);
    CHECK(e8ok, "ck_e8m0 differs from ldexpf");
    // ---- bf16 / f16
    uint8_t b1[2] = {0x80, 0x3F}, b2[2] = {0x00, 0xC0}, b3[2] = {0x80, 0x7F}, b4[2] = {0x01, 0x00};
    CHECK(ck_bf16(b1) == 1.0f && ck_bf16(b2) == -2.0f && isinf(ck_bf16(b3)) && ck_bf16(b4) == ldexpf(1, -133));
    uint8_t h1[2] = {0x00, 0x3C}, h2[2] = {0x01, 0x00}, h3[2] = {0xFF, 0x7B}, h4[2] = {0x00, 0xFC};
    CHECK(ck_f16(h1) == 1.0f && ck_f16(h2) == ldexpf(1, -24) && ck_f16(h3) == 65504.0f && isinf(ck_f16(h4)) && ck_f16(h4) < 0);
    // ---- NVFP4 row decode: value = e2m1 × e4m3(scale) × scale_2, low nibble first
    {
        uint8_t w[8] = {0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xF7}, sc[1] = {0x40 /* 2.0 */};
        ck_mat m = {CK_W_NVFP4, 1, 16, w, 8, sc, 0.25f};
        float row[16];
        ck_row_f32(&m, 0, row);
        CHECK(row[0] == 0.25f && row[1] == 0.5f && row[14] == 3.0f && row[15] == -3.0f, "%g %g %g %g", row[0], row[1], row[14], row[15]);
    }
    // ---- the fixtures open, with the geometry of their configs
    {
        ck_model m;
        moet_err e;
        CHECK(ck_open(&m, "tests/fixtures/tiny/nvfp4", &e) == 0, "%s", e.msg);
        if (!m.layers) return check_report("test_checkpoint");
        CHECK(m.cfg.hidden == 128 && m.cfg.n_layers == 4 && m.cfg.n_full == 1 && m.cfg.full_attn[3] && m.cfg.rot_dim == 8);
        CHECK(!strcmp(m.expert_format, "nvfp4") && m.layers[0].qkv.kind == CK_W_FP8 && m.lm_head.kind == CK_W_NVFP4 &&
              m.layers[0].router.kind == CK_W_BF16 && m.layers[3].q.kind == CK_W_FP8);
        ck_close(&m);
        CHECK(ck_open(&m, "tests/fixtures/check/bf16_split", &e) == 0, "%s", e.msg);
        CHECK(m.cfg.n_full == 2 && m.cfg.lv_dim == 48 && m.cfg.lk_dim == 32 && m.cfg.shared_inter == 128 && m.cfg.inter == 64);
        ck_close(&m);
        ck_config c;
        CHECK(ck_config_read(&c, "tests/fixtures/reference/qwen36-35b-a3b-nvfp4.config.json", &e) == 0, "%s", e.msg);
        CHECK(c.hidden == 2048 && c.n_layers == 40 && c.n_full == 10 && c.full_attn[3] && c.full_attn[39] && !c.full_attn[0] &&
              c.rot_dim == 64 && c.rope_theta == 1e7 && c.vocab == 248320 && c.conv_dim == 8192 && c.n_experts == 256 && c.topk == 8);
    }
    // ---- every error names the problem
    char tmpl[] = "/tmp/moet_ckXXXXXX";
    char *root = mkdtemp(tmpl);
    MOET_ASSERT(root, "mkdtemp");
    char dir[256], path[512], cmd[1024];
    const char *L0 = "model.language_model.layers.0.";
#define VARIANT(sub) (snprintf(dir, sizeof dir, "%s/%s", root, sub), mkdir(dir, 0700), \
                      snprintf(path, sizeof path, "%s/config.json", dir), copy_file("tests/fixtures/tiny/bf16/config.json", path, NULL, NULL))
    char nm[256];
    VARIANT("missing");
    snprintf(nm, sizeof nm, "%slinear_attn.in_proj_z.weight", L0);
    write_variant(dir, nm, NULL, 0, NULL);
    expect_fail(dir, "missing tensor", nm, "BF16");
    VARIANT("dtype");
    snprintf(nm, sizeof nm, "%slinear_attn.out_proj.weight", L0);
    write_variant(dir, NULL, nm, ST_F8_E4M3, NULL);
    expect_fail(dir, nm, "expected F16/BF16/F32 [128, 128]", "found F8_E4M3 [128, 256]");
    // the dtype alone wrong: the same shape and bytes, stored as I16
    VARIANT("dtype16");
    write_variant(dir, NULL, nm, ST_I16, NULL);
    expect_fail(dir, nm, "expected F16/BF16/F32 [128, 128]", "found I16 [128, 128]");
    VARIANT("shape");
    snprintf(nm, sizeof nm, "%smlp.gate.weight", L0);
    write_variant(dir, NULL, NULL, 0, nm);
    expect_fail(dir, nm, "[16, 128]", "found BF16 [8, 256]");
    VARIANT("fused");
    snprintf(nm, sizeof nm, "%smlp.experts.down_proj", L0);
    write_variant(dir, nm, NULL, 0, NULL);
    expect_fail(dir, "missing tensor", nm, "[16, 128, 64]");
    VARIANT("noexperts");
    snprintf(nm, sizeof nm, "%smlp.experts.gate_up_proj", L0);
    write_variant(dir, nm, NULL, 0, NULL);
    expect_fail(dir, "no routed experts", "layer 0", NULL);
    VARIANT("notqwen");
    copy_file("tests/fixtures/tiny/bf16/config.json", path, "\"qwen3_5_moe\"", "\"llama\"");
    copy_file("tests/fixtures/tiny/bf16/config.json", path, "\"model_type\": \"qwen3_5_moe\"", "\"model_type\": \"llama\"");
    write_variant(dir, NULL, NULL, 0, NULL);
    {
        // both model_type fields changed: the text one too
        size_t len;
        moet_err e;
        char *t = arena_read_small(path, 1 << 20, &len, &e);
        char *p = strstr(t, "qwen3_5_moe_text");
        if (p) memcpy(p, "llama_text_xxxxx", 16);
        FILE *f = fopen(path, "wb");
        fwrite(t, 1, len, f);
        fclose(f);
        arena_sys_free(t, len + 1);
    }
    expect_fail(dir, "not qwen3_5_moe", "llama", NULL);
    // quantization: an unknown per-module algorithm, a global algorithm, a missing scale
    snprintf(dir, sizeof dir, "%s/quant", root);
    snprintf(cmd, sizeof cmd, "cp -r tests/fixtures/tiny/nvfp4 %s", dir);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    copy_file("tests/fixtures/tiny/nvfp4/hf_quant_config.json", path, "\"quant_algo\": \"FP8\"", "\"quant_algo\": \"INT4_AWQ\"");
    expect_fail(dir, "unsupported quant_algo 'INT4_AWQ'", "model.language_model.layers", NULL);
    copy_file("tests/fixtures/tiny/nvfp4/hf_quant_config.json", path, "\"MIXED_PRECISION\"", "\"NVFP4\"");
    expect_fail(dir, "quant_algo 'NVFP4' is not supported", NULL, NULL);
    copy_file("tests/fixtures/tiny/nvfp4/hf_quant_config.json", path, "\"group_size\": 16", "\"group_size\": 32");
    expect_fail(dir, "group_size", NULL, NULL);
    copy_file("tests/fixtures/tiny/nvfp4/hf_quant_config.json", path, NULL, NULL);
    {
        // the module of layer 0's in_proj_qkv listed as NVFP4 while stored as FP8
        size_t len;
        moet_err e;
        char *t = arena_read_small(path, 1 << 20, &len, &e);
        char *p = strstr(t, "layers.0.linear_attn.in_proj_qkv\": {");
        char *q = p ? strstr(p, "\"FP8\"") : NULL;
        FILE *f = fopen(path, "wb");
        fwrite(t, 1, (size_t)(q - t), f);
        fputs("\"W4A16_NVFP4\", \"group_size\": 16", f);
        fputs(q + 5, f);
        fclose(f);
        arena_sys_free(t, len + 1);
    }
    expect_fail(dir, "in_proj_qkv.weight", "expected U8 [256, 64]", "found F8_E4M3 [256, 128]");
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
    return check_report("test_checkpoint");
}
