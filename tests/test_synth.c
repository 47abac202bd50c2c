// tests/test_synth.c — `moet synth` and the streaming safetensors writer.
//
// A synthetic checkpoint must have exactly the tensors (names, dtypes, shapes) of the real
// layout: checked against the fixtures made by make_fixtures.py (ModelOpt NVFP4 and BF16, fused
// experts), which mirror the real checkpoint's inventory at a small size. It must load with the
// checkpoint reader, and its bytes must depend only on the seed and the tensor names.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"

static char tdir[64];

// Runs a command with its progress lines (stderr) discarded.
static int quiet(int (*fn)(int, char **), int argc, char **argv) {
    fflush(stderr);
    int se = dup(2), nul = open("/dev/null", O_WRONLY);
    dup2(nul, 2);
    int rc = fn(argc, argv);
    fflush(stderr);
    dup2(se, 2);
    close(se);
    close(nul);
    return rc;
}
#define QUIET(fn, argv) quiet(fn, (int)(sizeof argv / sizeof argv[0]), argv)
#define SYNTH(argv) QUIET(cmd_synth, argv)

// Same tensor names, dtypes and shapes in a and b, except names starting with a skipped prefix.
static void same_inventory(const char *what, const st_set *a, const st_set *b, const char *skip1, const char *skip2) {
    uint32_t na = 0, miss = 0;
    for (uint32_t i = 0; i < a->n_tensors; i++) {
        const st_tensor *t = &a->tensors[i], *u = st_find(b, t->name);
        na++;
        int same = u && u->dtype == t->dtype && u->ndim == t->ndim && !memcmp(u->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        if (!same) {
            if (miss++ < 5) fprintf(stderr, "%s: %s differs or is missing\n", what, t->name);
        }
    }
    uint32_t nb = 0;
    for (uint32_t i = 0; i < b->n_tensors; i++) {
        const char *nm = b->tensors[i].name;
        if ((skip1 && !strncmp(nm, skip1, strlen(skip1))) || (skip2 && !strncmp(nm, skip2, strlen(skip2)))) continue;
        nb++;
    }
    CHECK(miss == 0 && na == nb, "%s: %u synthetic tensors, %u in the fixture, %u differ", what, na, nb, miss);
}

static void check_values(const char *what, const st_set *s) {
    uint64_t nan_fp8 = 0, bad_scale = 0, bad_bf16 = 0, bad_f32 = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const st_tensor *t = &s->tensors[i];
        const char *nm = t->name;
        size_t ln = strlen(nm);
        int is_scale = ln > 13 && !strcmp(nm + ln - 13, ".weight_scale");
        if (t->dtype == ST_F8_E4M3)
            for (size_t k = 0; k < t->bytes; k++) {
                nan_fp8 += (t->data[k] & 0x7f) == 0x7f;
                if (is_scale) {
                    double v = ck_e4m3(t->data[k]);
                    bad_scale += !(v >= 2 && v <= 240);
                }
            }
        if (t->dtype == ST_BF16)
            for (size_t k = 0; k < t->numel; k++) {
                float v = ck_bf16(t->data + 2 * k);
                bad_bf16 += !(fabsf(v) > 1e-4f && fabsf(v) < 8.0f);
            }
        if (t->dtype == ST_F32) {
            float v = ck_f32(t->data);
            bad_f32 += !(t->numel == 1 && v > 0 && v <= 1);
        }
    }
    CHECK(nan_fp8 == 0, "%s: %" PRIu64 " NaN e4m3 bytes", what, nan_fp8);
    CHECK(bad_scale == 0, "%s: %" PRIu64 " NVFP4 block scales outside [2, 240]", what, bad_scale);
    CHECK(bad_bf16 == 0, "%s: %" PRIu64 " BF16 values outside (1e-4, 8)", what, bad_bf16);
    CHECK(bad_f32 == 0, "%s: %" PRIu64 " F32 scalars outside (0, 1]", what, bad_f32);
}

int main(void) {
    snprintf(tdir, sizeof tdir, "/tmp/moet_test_synth.XXXXXX");
    MOET_ASSERT(mkdtemp(tdir), "mkdtemp");
    moet_err e = {{0}};
    char a[96], b[96], c[96], planes[96];
    snprintf(a, sizeof a, "%s/a", tdir);
    snprintf(b, sizeof b, "%s/b", tdir);
    snprintf(c, sizeof c, "%s/c", tdir);
    snprintf(planes, sizeof planes, "%s/x.planes", tdir);
    ck_init_tables();

    // ModelOpt layout of the "check" fixture config (H 192, 8 layers, 2 attention, 8 experts)
    char *argv_a[] = {"moet", "synth", "--config", "tests/fixtures/check/nvfp4/config.json", "--quant",
                      "tests/fixtures/check/nvfp4/hf_quant_config.json", "--out", a, "--seed", "7", "--shard-gb", "0.001"};
    CHECK(SYNTH(argv_a) == 0, "synth nvfp4");
    st_set sa, fx;
    CHECK(st_open(&sa, a, &e) == 0, "%s", e.msg);
    CHECK(st_open(&fx, "tests/fixtures/check/nvfp4", &e) == 0, "%s", e.msg);
    CHECK(sa.n_shards > 1, "several shards with --shard-gb 0.001 (%d)", sa.n_shards);
    same_inventory("nvfp4 layout", &sa, &fx, "mtp.", "model.visual.");
    check_values("nvfp4 layout", &sa);
    // gate_proj and up_proj of one expert share weight_scale_2; down_proj has its own
    const st_tensor *g2 = st_find(&sa, "model.language_model.layers.5.mlp.experts.3.gate_proj.weight_scale_2"),
                    *u2 = st_find(&sa, "model.language_model.layers.5.mlp.experts.3.up_proj.weight_scale_2"),
                    *d2 = st_find(&sa, "model.language_model.layers.5.mlp.experts.3.down_proj.weight_scale_2");
    CHECK(g2 && u2 && d2 && !memcmp(g2->data, u2->data, 4) && memcmp(g2->data, d2->data, 4), "shared weight_scale_2");
    // it loads, and build-planes + verify work on it
    static ck_model m;
    CHECK(ck_open(&m, a, &e) == 0 && !strcmp(m.expert_format, "nvfp4"), "%s", e.msg);
    if (m.layers) ck_close(&m);
    char *argv_b[] = {"moet", "build-planes", "--model", a, "--out", planes, "--threads", "2"};
    CHECK(QUIET(cmd_build_planes, argv_b) == 0, "build-planes on a synthetic checkpoint");
    pf_file f;
    CHECK(pf_open(&f, planes, &e) == 0, "%s", e.msg);
    if (f.fd >= 0) {
        pf_verify_stats st;
        CHECK(pf_verify_slots(&f, 2, 0, NULL, &st, &e) == 0 && f.h.L.n_slots == 64, "%s", e.msg);
        CHECK(!strcmp(f.h.source_format, "nvfp4"), "source format");
        pf_close(&f);
    }
    unlink(planes);

    // same seed, other sharding and the mtp head: every common tensor has the same bytes
    char *argv_c[] = {"moet", "synth", "--config", "tests/fixtures/check/nvfp4/config.json", "--quant",
                      "tests/fixtures/check/nvfp4/hf_quant_config.json", "--out", c, "--seed", "7", "--mtp"};
    CHECK(SYNTH(argv_c) == 0, "synth nvfp4 --mtp");
    st_set sc;
    CHECK(st_open(&sc, c, &e) == 0 && sc.n_shards == 1, "%s", e.msg);
    uint32_t diff = 0, mtp = 0;
    for (uint32_t i = 0; i < sc.n_tensors; i++) {
        const st_tensor *t = &sc.tensors[i], *u = st_find(&sa, t->name);
        if (!strncmp(t->name, "mtp.", 4)) { mtp++; continue; }
        diff += !u || u->bytes != t->bytes || memcmp(u->data, t->data, t->bytes);
    }
    CHECK(diff == 0, "%u tensors differ between shardings of one seed", diff);
    CHECK(mtp == 19 && st_find(&sc, "mtp.layers.0.mlp.experts.gate_up_proj") && st_find(&sc, "mtp.fc.weight"),
          "the mtp head has its 19 tensors (%u)", mtp);
    const st_tensor *mg = st_find(&sc, "mtp.layers.0.mlp.experts.gate_up_proj"), *mfx = st_find(&fx, "mtp.layers.0.mlp.experts.gate_up_proj");
    CHECK(mg && mfx && mg->ndim == 3 && !memcmp(mg->shape, mfx->shape, sizeof(int64_t) * 3) && mg->dtype == ST_BF16, "mtp experts shape");
    CHECK(ck_open(&m, c, &e) == 0, "a checkpoint with mtp.* loads: %s", e.msg);
    if (m.layers) ck_close(&m);
    st_close(&sc);
    // another seed gives other values
    char *argv_d[] = {"moet", "synth", "--config", "tests/fixtures/check/nvfp4/config.json", "--quant",
                      "tests/fixtures/check/nvfp4/hf_quant_config.json", "--out", c, "--seed", "8"};
    CHECK(SYNTH(argv_d) == 0, "synth seed 8");
    CHECK(st_open(&sc, c, &e) == 0, "%s", e.msg);
    const st_tensor *x7 = st_find(&sa, "model.language_model.layers.0.mlp.experts.0.gate_proj.weight"),
                    *x8 = st_find(&sc, "model.language_model.layers.0.mlp.experts.0.gate_proj.weight");
    CHECK(x7 && x8 && memcmp(x7->data, x8->data, x7->bytes), "seeds differ");
    st_close(&sc);
    st_close(&fx);
    st_close(&sa);

    // BF16 layout (no quantization map): fused experts as the bf16 fixture; --per-expert
    char *argv_e[] = {"moet", "synth", "--config", "tests/fixtures/tiny/bf16/config.json", "--out", b};
    CHECK(SYNTH(argv_e) == 0, "synth bf16");
    st_set sb;
    CHECK(st_open(&sb, b, &e) == 0 && st_open(&fx, "tests/fixtures/tiny/bf16", &e) == 0, "%s", e.msg);
    same_inventory("bf16 layout", &sb, &fx, NULL, NULL);
    check_values("bf16 layout", &sb);
    st_close(&sb);
    st_close(&fx);
    CHECK(ck_open(&m, b, &e) == 0 && !strcmp(m.expert_format, "bf16"), "%s", e.msg);
    if (m.layers) ck_close(&m);
    char *argv_f[] = {"moet", "synth", "--config", "tests/fixtures/check/bf16_split/config.json", "--out", b, "--per-expert"};
    CHECK(SYNTH(argv_f) == 0, "synth bf16 per expert");
    CHECK(st_open(&sb, b, &e) == 0 && st_open(&fx, "tests/fixtures/check/bf16_split", &e) == 0, "%s", e.msg);
    same_inventory("bf16 per-expert layout", &sb, &fx, NULL, NULL);
    st_close(&sb);
    st_close(&fx);

    // refusals: a config that is not qwen3_5_moe, a missing flag, an unknown quant algorithm
    char bad[96];
    snprintf(bad, sizeof bad, "%s/bad.json", tdir);
    FILE *fp = fopen(bad, "w");
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 64}", fp);
    fclose(fp);
    char *argv_g[] = {"moet", "synth", "--config", bad, "--out", c};
    CHECK(SYNTH(argv_g) == 1, "a llama config is refused");
    char *argv_h[] = {"moet", "synth", "--config", bad};
    CHECK(SYNTH(argv_h) == 2, "--out is required");
    fp = fopen(bad, "w");
    fputs("{\"quantization\": {\"quant_algo\": \"MIXED_PRECISION\", \"quantized_layers\": "
          "{\"model.language_model.layers.0.mlp.experts\": {\"quant_algo\": \"INT3\"}}}}", fp);
    fclose(fp);
    char *argv_i[] = {"moet", "synth", "--config", "tests/fixtures/tiny/nvfp4/config.json", "--quant", bad, "--out", c};
    CHECK(SYNTH(argv_i) == 1, "an unknown quant algorithm is refused");

    // the writer refuses more or fewer bytes than declared
    stw_tensor tv[2] = {{"a", ST_F32, 1, {3}}, {"b", ST_U8, 2, {2, 3}}};
    stw_file w;
    char p[96];
    snprintf(p, sizeof p, "%s/w.safetensors", tdir);
    CHECK(stw_begin(&w, p, tv, 2, &e) == 0, "%s", e.msg);
    float fv[3] = {1, 2, 3};
    uint8_t bv[6] = {1, 2, 3, 4, 5, 6};
    CHECK(stw_write(&w, fv, 12, &e) == 0 && stw_write(&w, bv, 5, &e) == 0, "%s", e.msg);
    CHECK(stw_end(&w, &e) == -1 && strstr(e.msg, "17 data bytes written, 18 declared"), "short: %s", e.msg);
    CHECK(stw_begin(&w, p, tv, 2, &e) == 0 && stw_write(&w, fv, 12, &e) == 0 && stw_write(&w, bv, 6, &e) == 0, "%s", e.msg);
    CHECK(stw_write(&w, bv, 1, &e) == -1 && strstr(e.msg, "more bytes than"), "long: %s", e.msg);
    CHECK(stw_end(&w, &e) == 0, "%s", e.msg);
    st_set sw;
    CHECK(st_open(&sw, p, &e) == 0, "the written file reads back: %s", e.msg);
    if (sw.n_tensors == 2) {
        const st_tensor *ta = st_find(&sw, "a"), *tb = st_find(&sw, "b");
        CHECK(ta && tb && !memcmp(ta->data, fv, 12) && !memcmp(tb->data, bv, 6) && tb->shape[1] == 3, "values read back");
        arena_map mm;
        CHECK(arena_map_file(&mm, p, &e) == 0, "%s", e.msg);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | mm.data[i];
        CHECK(hl % 8 == 0 && mm.size == 8 + hl + 18, "header length %" PRIu64 " is a multiple of 8", hl);
        arena_unmap(&mm);
        st_close(&sw);
    }
    // clean up
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tdir);
    CHECK(system(cmd) == 0, "cleanup");
    return check_report("test_synth");
}
