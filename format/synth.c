// format/synth.c — `moet synth`: a random checkpoint with exactly the tensor names, dtypes and
// shapes a config describes, so build-planes, verify and the engines can run at full size
// without the real weights.
//
// Layout (CHECKPOINT.md §A.4-A.7): each module takes the algorithm of the quantization map
// (--quant's hf_quant_config.json, else config.json's quantization_config; unlisted = BF16):
//   FP8          weight F8_E4M3 [N, K] + weight_scale, input_scale F32 []
//   W4A16_NVFP4  weight U8 [N, K/2] + weight_scale F8_E4M3 [N, K/16] + weight_scale_2, input_scale F32 []
//   BF16         weight BF16 [N, K]
// Routed experts: one module per expert when the map quantizes them (or --per-expert), else the
// fused BF16 tensors mlp.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I]. Norms, conv,
// A_log, dt_bias, router and shared-expert gate are BF16. Shards of at most --shard-gb GB with a
// model.safetensors.index.json; config.json (and the quantization file) copied next to them.
// --mtp adds the BF16 multi-token-prediction head (mtp.*) as the real checkpoint has it.
//
// Values: each tensor has its own generator (splitmix64 seeded by the seed and the tensor name),
// so the bytes do not depend on sharding. BF16 values are ±(1 + m/128)·2^e with e in a 4-octave
// window around 1/sqrt(fan-in); FP8 bytes are any finite e4m3 with weight_scale 1/448 (|w| ≤ 1);
// NVFP4 nibbles are uniform, block scales e4m3 in [2, 240] and weight_scale_2 ≈ 1/2688, so
// |w| ≤ 6·240/2688 ≈ 0.54; gate_proj and up_proj of one expert share weight_scale_2, as ModelOpt
// writes them.

enum { SYN_BF16, SYN_FP8, SYN_NVFP4, SYN_F32 };   // how a tensor's bytes are made

typedef struct {
    char *name;
    int dtype;                       // ST_*
    int ndim;
    int64_t shape[4];
    uint8_t gen;                     // SYN_*
    int8_t log2_scale;               // BF16: magnitude octave; F32: which scalar (see syn_scalar)
    uint32_t shard;
    uint64_t bytes;
} syn_tensor;

enum { SYN_S_FP8_W, SYN_S_FP8_IN, SYN_S_NVFP4_W2, SYN_S_NVFP4_IN };

typedef struct {
    const ck_config *c;
    ck_quant *q;
    int per_expert;                  // BF16 experts as 2-D per-expert tensors
    int mtp;                         // also the mtp.* head (one layer)
    syn_tensor *t;                   // NULL while counting
    uint32_t n;
    char *names;                     // name pool (NULL while counting)
    size_t name_bytes;
    int err;
    moet_err *e;
} syn_list;

static void syn_add(syn_list *L, const char *name, int dtype, int ndim, const int64_t *shape, int gen, int scale) {
    size_t k = strlen(name) + 1;
    if (L->t) {
        syn_tensor *t = &L->t[L->n];
        memset(t, 0, sizeof *t);
        t->name = L->names + L->name_bytes;
        memcpy(t->name, name, k);
        t->dtype = dtype;
        t->ndim = ndim;
        for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
        t->gen = (uint8_t)gen;
        t->log2_scale = (int8_t)scale;
        t->bytes = (uint64_t)st_dtypes[dtype].bytes;
        for (int d = 0; d < ndim; d++) t->bytes *= (uint64_t)shape[d];
    }
    L->n++;
    L->name_bytes += k;
}

// octave of 1/sqrt(fan_in)
static int syn_octave(int64_t fan_in) { return -(int)lround(0.5 * log2((double)fan_in)); }

static void syn_bf16(syn_list *L, const char *name, int ndim, const int64_t *shape, int scale) {
    syn_add(L, name, ST_BF16, ndim, shape, SYN_BF16, scale);
}

// A linear module [N, K] stored as the quantization map says.
static void syn_linear(syn_list *L, const char *module, int64_t N, int64_t K) {
    char n[MOET_MAX_NAME + 32];
    if (L->err) return;
    int algo = ck_quant_algo(L->q, module, L->e);
    if (algo < 0) { L->err = 1; return; }
    static const int64_t none[1] = {0};
    if (algo == CK_Q_NONE) {
        int64_t s[2] = {N, K};
        snprintf(n, sizeof n, "%s.weight", module);
        syn_bf16(L, n, 2, s, syn_octave(K));
    } else if (algo == CK_Q_FP8) {
        int64_t s[2] = {N, K};
        snprintf(n, sizeof n, "%s.weight", module);
        syn_add(L, n, ST_F8_E4M3, 2, s, SYN_FP8, 0);
        snprintf(n, sizeof n, "%s.weight_scale", module);
        syn_add(L, n, ST_F32, 0, none, SYN_F32, SYN_S_FP8_W);
        snprintf(n, sizeof n, "%s.input_scale", module);
        syn_add(L, n, ST_F32, 0, none, SYN_F32, SYN_S_FP8_IN);
    } else {
        if (K % 16) {
            L->err = 1;
            err_set(L->e, "module %s is W4A16_NVFP4 but its input width %" PRId64 " is not a multiple of 16", module, K);
            return;
        }
        int64_t s[2] = {N, K / 2}, ss[2] = {N, K / 16};
        snprintf(n, sizeof n, "%s.weight", module);
        syn_add(L, n, ST_U8, 2, s, SYN_NVFP4, 0);
        snprintf(n, sizeof n, "%s.weight_scale", module);
        syn_add(L, n, ST_F8_E4M3, 2, ss, SYN_NVFP4, 1);
        snprintf(n, sizeof n, "%s.weight_scale_2", module);
        syn_add(L, n, ST_F32, 0, none, SYN_F32, SYN_S_NVFP4_W2);
        snprintf(n, sizeof n, "%s.input_scale", module);
        syn_add(L, n, ST_F32, 0, none, SYN_F32, SYN_S_NVFP4_IN);
    }
}

// Every tensor of the checkpoint, in file order (layer by layer, as the real shards are).
static int syn_enumerate(syn_list *L) {
    const ck_config *c = L->c;
    const char *P = "model.language_model.";
    char n[MOET_MAX_NAME + 64], m[MOET_MAX_NAME];
    int64_t H = c->hidden, V = c->vocab, I = c->inter, SI = c->shared_inter, E = c->n_experts;
    int64_t s2[2], s1[1], s3[3];
    s2[0] = V; s2[1] = H;
    snprintf(n, sizeof n, "%sembed_tokens.weight", P);
    syn_bf16(L, n, 2, s2, 0);
    for (int l = 0; l < c->n_layers && !L->err; l++) {
        char p[96];
        snprintf(p, sizeof p, "%slayers.%d.", P, l);
        s1[0] = H;
        snprintf(n, sizeof n, "%sinput_layernorm.weight", p);
        syn_bf16(L, n, 1, s1, -4);
        snprintf(n, sizeof n, "%spost_attention_layernorm.weight", p);
        syn_bf16(L, n, 1, s1, -4);
        if (c->full_attn[l]) {
            int64_t qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim;
            snprintf(m, sizeof m, "%sself_attn.q_proj", p); syn_linear(L, m, 2 * qd, H);
            snprintf(m, sizeof m, "%sself_attn.k_proj", p); syn_linear(L, m, kd, H);
            snprintf(m, sizeof m, "%sself_attn.v_proj", p); syn_linear(L, m, kd, H);
            snprintf(m, sizeof m, "%sself_attn.o_proj", p); syn_linear(L, m, H, qd);
            s1[0] = c->head_dim;
            snprintf(n, sizeof n, "%sself_attn.q_norm.weight", p); syn_bf16(L, n, 1, s1, -4);
            snprintf(n, sizeof n, "%sself_attn.k_norm.weight", p); syn_bf16(L, n, 1, s1, -4);
        } else {
            snprintf(m, sizeof m, "%slinear_attn.in_proj_qkv", p); syn_linear(L, m, c->conv_dim, H);
            snprintf(m, sizeof m, "%slinear_attn.in_proj_z", p); syn_linear(L, m, c->value_dim, H);
            snprintf(m, sizeof m, "%slinear_attn.in_proj_b", p); syn_linear(L, m, c->lv_heads, H);
            snprintf(m, sizeof m, "%slinear_attn.in_proj_a", p); syn_linear(L, m, c->lv_heads, H);
            snprintf(m, sizeof m, "%slinear_attn.out_proj", p); syn_linear(L, m, H, c->value_dim);
            s3[0] = c->conv_dim; s3[1] = 1; s3[2] = c->conv_k;
            snprintf(n, sizeof n, "%slinear_attn.conv1d.weight", p); syn_bf16(L, n, 3, s3, -1);
            s1[0] = c->lv_heads;
            snprintf(n, sizeof n, "%slinear_attn.A_log", p); syn_bf16(L, n, 1, s1, -1);
            snprintf(n, sizeof n, "%slinear_attn.dt_bias", p); syn_bf16(L, n, 1, s1, -1);
            s1[0] = c->lv_dim;
            snprintf(n, sizeof n, "%slinear_attn.norm.weight", p); syn_bf16(L, n, 1, s1, 0);
        }
        snprintf(m, sizeof m, "%smlp.gate", p); syn_linear(L, m, E, H);
        snprintf(m, sizeof m, "%smlp.shared_expert.gate_proj", p); syn_linear(L, m, SI, H);
        snprintf(m, sizeof m, "%smlp.shared_expert.up_proj", p); syn_linear(L, m, SI, H);
        snprintf(m, sizeof m, "%smlp.shared_expert.down_proj", p); syn_linear(L, m, H, SI);
        snprintf(m, sizeof m, "%smlp.shared_expert_gate", p); syn_linear(L, m, 1, H);
        snprintf(m, sizeof m, "%smlp.experts", p);
        int algo = ck_quant_algo(L->q, m, L->e);
        if (algo < 0) { L->err = 1; break; }
        if (algo == CK_Q_NONE && !L->per_expert) {
            s3[0] = E; s3[1] = 2 * I; s3[2] = H;
            snprintf(n, sizeof n, "%smlp.experts.gate_up_proj", p); syn_bf16(L, n, 3, s3, syn_octave(H));
            s3[1] = H; s3[2] = I;
            snprintf(n, sizeof n, "%smlp.experts.down_proj", p); syn_bf16(L, n, 3, s3, syn_octave(I));
        } else {
            for (int64_t x = 0; x < E && !L->err; x++) {
                snprintf(m, sizeof m, "%smlp.experts.%" PRId64 ".gate_proj", p, x); syn_linear(L, m, I, H);
                snprintf(m, sizeof m, "%smlp.experts.%" PRId64 ".up_proj", p, x); syn_linear(L, m, I, H);
                snprintf(m, sizeof m, "%smlp.experts.%" PRId64 ".down_proj", p, x); syn_linear(L, m, H, I);
            }
        }
    }
    s1[0] = H;
    snprintf(n, sizeof n, "%snorm.weight", P);
    syn_bf16(L, n, 1, s1, -4);
    if (!c->tie_embeddings) syn_linear(L, "lm_head", V, H);
    if (L->mtp) {
        // the multi-token-prediction head, BF16 with fused experts (CHECKPOINT.md §A.5 (4)):
        // fc [H, 2H], three norms, one full-attention MoE layer
        s2[0] = H; s2[1] = 2 * H;
        syn_bf16(L, "mtp.fc.weight", 2, s2, syn_octave(2 * H));
        s1[0] = H;
        syn_bf16(L, "mtp.pre_fc_norm_embedding.weight", 1, s1, -4);
        syn_bf16(L, "mtp.pre_fc_norm_hidden.weight", 1, s1, -4);
        syn_bf16(L, "mtp.norm.weight", 1, s1, -4);
        const char *p = "mtp.layers.0.";
        int64_t qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim;
        static const struct { const char *name; int which; } mats[] = {
            {"self_attn.q_proj.weight", 0}, {"self_attn.k_proj.weight", 1}, {"self_attn.v_proj.weight", 1},
            {"self_attn.o_proj.weight", 2}, {"mlp.gate.weight", 3}, {"mlp.shared_expert.gate_proj.weight", 4},
            {"mlp.shared_expert.up_proj.weight", 4}, {"mlp.shared_expert.down_proj.weight", 5},
            {"mlp.shared_expert_gate.weight", 6}};
        const int64_t rows[7] = {2 * qd, kd, H, E, SI, H, 1}, cols[7] = {H, H, qd, H, H, SI, H};
        snprintf(n, sizeof n, "%sinput_layernorm.weight", p); syn_bf16(L, n, 1, s1, -4);
        snprintf(n, sizeof n, "%spost_attention_layernorm.weight", p); syn_bf16(L, n, 1, s1, -4);
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            s2[0] = rows[mats[i].which];
            s2[1] = cols[mats[i].which];
            snprintf(n, sizeof n, "%s%s", p, mats[i].name);
            syn_bf16(L, n, 2, s2, syn_octave(s2[1]));
        }
        s1[0] = c->head_dim;
        snprintf(n, sizeof n, "%sself_attn.q_norm.weight", p); syn_bf16(L, n, 1, s1, -4);
        snprintf(n, sizeof n, "%sself_attn.k_norm.weight", p); syn_bf16(L, n, 1, s1, -4);
        s3[0] = E; s3[1] = 2 * I; s3[2] = H;
        snprintf(n, sizeof n, "%smlp.experts.gate_up_proj", p); syn_bf16(L, n, 3, s3, syn_octave(H));
        s3[1] = H; s3[2] = I;
        snprintf(n, sizeof n, "%smlp.experts.down_proj", p); syn_bf16(L, n, 3, s3, syn_octave(I));
    }
    return L->err ? -1 : 0;
}

// ---- values ------------------------------------------------------------------------------

static uint64_t syn_mix(uint64_t *s) {   // splitmix64
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t syn_seed(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull ^ seed;   // FNV-1a over the name, then mixed
    while (*name) h = (h ^ (uint8_t)*name++) * 1099511628211ull;
    return syn_mix(&h);
}

// The F32 scalars: FP8 weight_scale 1/448 (e4m3 max 448 → |w| ≤ 1), FP8 input_scale 0.05,
// NVFP4 weight_scale_2 ≈ 1/2688 (shared by gate and up: seeded by the expert's name prefix),
// NVFP4 input_scale 1 (unused by W4A16).
static float syn_scalar(const syn_tensor *t, uint64_t seed) {
    switch (t->log2_scale) {
    case SYN_S_FP8_W: return 1.0f / 448.0f;
    case SYN_S_FP8_IN: return 0.05f;
    case SYN_S_NVFP4_IN: return 1.0f;
    default: {
        char base[MOET_MAX_NAME];
        snprintf(base, sizeof base, "%s", t->name);
        char *dot = strstr(base, ".gate_proj.");
        if (!dot) dot = strstr(base, ".up_proj.");
        if (dot) *dot = 0;   // gate_proj and up_proj of one module share the value
        uint64_t s = syn_seed(seed, base);
        double u = (double)(syn_mix(&s) >> 11) * 0x1p-53;   // [0, 1)
        return (float)((0.5 + 1.5 * u) / 2688.0);
    }
    }
}

// Fills n bytes (a multiple of the dtype size) of tensor t with its next values.
static void syn_fill(const syn_tensor *t, uint64_t *s, uint8_t *p, size_t n) {
    size_t i = 0;
    if (t->gen == SYN_BF16) {
        // ±(1 + m/128) · 2^(o - k), k in 0..3, o the tensor's octave; 16 random bits a value
        unsigned eb = (unsigned)(127 + t->log2_scale);
        unsigned keep_sign = t->log2_scale == 0 && t->ndim == 1;   // plain-scale norms stay positive
        uint64_t r = 0;
        for (; i < n; i += 2) {
            if (i % 8 == 0) r = syn_mix(s);
            unsigned v = (unsigned)(r >> (16 * ((i / 2) % 4))) & 0xffff;
            unsigned bits = (keep_sign ? 0 : (v >> 15) & 1) << 15 | (eb - ((v >> 7) & 3)) << 7 | (v & 127);
            p[i] = (uint8_t)bits;
            p[i + 1] = (uint8_t)(bits >> 8);
        }
    } else if (t->gen == SYN_FP8 || (t->gen == SYN_NVFP4 && t->dtype == ST_U8)) {
        int fp8 = t->gen == SYN_FP8;
        for (; i < n; i += 8) {
            uint64_t r = syn_mix(s);
            for (size_t j = 0; j < 8 && i + j < n; j++) {
                uint8_t b = (uint8_t)(r >> (8 * j));
                if (fp8 && (b & 0x7f) == 0x7f) b ^= 1;   // 0x7f/0xff are NaN in e4m3: take 0x7e/0xfe
                p[i + j] = b;
            }
        }
    } else {   // NVFP4 block scales: positive e4m3 with exponent field 8..14 → [2, 240]
        for (; i < n; i += 8) {
            uint64_t r = syn_mix(s);
            for (size_t j = 0; j < 8 && i + j < n; j++) {
                unsigned v = (unsigned)(r >> (8 * j)) & 0xff;
                p[i + j] = (uint8_t)((8 + v % 7) << 3 | (v >> 5));
            }
        }
    }
}

// ---- the command -------------------------------------------------------------------------

static const char syn_usage[] =
    "usage: moet synth --config CONFIG.json [--quant HF_QUANT_CONFIG.json] --out DIR [--seed S]\n"
    "                  [--per-expert] [--mtp] [--shard-gb G]\n"
    "  Writes a random checkpoint with the tensor names, dtypes and shapes the config and its\n"
    "  quantization map describe (ModelOpt MIXED_PRECISION or BF16), in shards of at most G GB\n"
    "  (default 5) with model.safetensors.index.json. --per-expert stores BF16 routed experts\n"
    "  per expert instead of fused; --mtp adds the BF16 mtp.* head (one layer).\n"
    "  A new DIR is built as DIR.tmp.PID beside it and renamed when complete; an existing DIR must\n"
    "  be a directory (not a symbolic link), whose files are replaced only when complete and only\n"
    "  where they are regular files. Everything is checked before any file is written; a failure\n"
    "  or a fatal signal leaves nothing behind.\n";

typedef struct {
    const char *config, *quant, *out;
    uint64_t seed;
    double shard_gb;
    int per_expert, mtp, have_seed;
} syn_flags;

static const moet_flag syn_flag_table[] = {
    FLAG_FILE("--config", syn_flags, config),
    FLAG_FILE("--quant", syn_flags, quant),
    FLAG_PATH("--out", syn_flags, out, ARG_OUT_DIR, "DIR"),
    FLAG_U64("--seed", syn_flags, seed, have_seed),
    FLAG_NUM("--shard-gb", syn_flags, shard_gb, 0.001, 1000),
    FLAG_SWITCH("--per-expert", syn_flags, per_expert),
    FLAG_SWITCH("--mtp", syn_flags, mtp),
};

// Writes the file `name` of the output directory with `n` bytes of p.
static int syn_write_file(const of_dir *d, const char *name, const void *p, size_t n, moet_err *e) {
    char path[MOET_MAX_PATH + 64];
    of_dir_file(d, name, path, sizeof path);
    of_file f;
    int rc = of_begin(&f, path, e);
    if (!rc) rc = of_write(&f, p, n, e);
    if (!rc) rc = of_commit(&f, e);
    of_abort(&f);   // nothing once committed
    return rc;
}

// Copies the file `from` to the file `name` of the output directory.
static int syn_copy(const char *from, const of_dir *d, const char *name, moet_err *e) {
    size_t len;
    char *text = arena_read_small(from, MOET_MAX_CONFIG_BYTES, &len, e);
    if (!text) return -1;
    int rc = syn_write_file(d, name, text, len, e);
    arena_sys_free(text, len + 1);
    return rc;
}

static int cmd_synth(int argc, char **argv) {
    syn_flags fl = {.shard_gb = 5.0};
    int arc = moet_args("synth", syn_usage, syn_flag_table, (int)(sizeof syn_flag_table / sizeof syn_flag_table[0]), argc, argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    const char *config = fl.config, *quant = fl.quant, *out = fl.out;
    uint64_t seed = fl.seed;
    double shard_gb = fl.shard_gb;
    int per_expert = fl.per_expert, mtp = fl.mtp;
    if (!config || !out) return moet_usage_error("synth", syn_usage, "--config and --out are required");
    moet_err e = {{0}};
    ck_config c;
    if (ck_config_read(&c, config, &e)) { fprintf(stderr, "moet synth: %s\n", e.msg); return 1; }
    // the quantization map, read from the given file (what the written checkpoint will carry)
    ck_quant q;
    if (ck_quant_read_file(&q, quant ? quant : config, quant != NULL, &e)) { fprintf(stderr, "moet synth: %s\n", e.msg); return 1; }

    // the tensor list: count, allocate once, fill
    syn_list L = {&c, &q, per_expert, mtp, NULL, 0, NULL, 0, 0, &e};
    int rc = 1;
    uint8_t *mem = NULL;
    size_t mem_bytes = 0;
    of_dir dir = {0};
    char path[MOET_MAX_PATH + 64], name[64];
    if (syn_enumerate(&L)) { fprintf(stderr, "moet synth: %s\n", e.msg); goto out_q; }
    uint32_t n = L.n;
    // the names rounded up to 8 bytes, so the stw_tensor array after them is aligned
    mem_bytes = sizeof(syn_tensor) * n + ((L.name_bytes + 7) & ~(size_t)7) + sizeof(stw_tensor) * n;
    mem = arena_sys_alloc(mem_bytes, "synth tensor list");
    if (!mem) { fprintf(stderr, "moet synth: out of memory for %u tensors\n", n); goto out_q; }
    L = (syn_list){&c, &q, per_expert, mtp, (syn_tensor *)mem, 0, (char *)mem + sizeof(syn_tensor) * n, 0, 0, &e};
    stw_tensor *st = (stw_tensor *)(mem + mem_bytes - sizeof(stw_tensor) * n);   // [n], shard by shard
    MOET_ASSERT(syn_enumerate(&L) == 0 && L.n == n, "tensor list changed between passes");
    // shards: in file order, a new one when the next tensor would pass the limit
    uint64_t limit = (uint64_t)(shard_gb * 1e9), total = 0, in_shard = 0;
    uint32_t n_shards = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (in_shard && in_shard + L.t[i].bytes > limit) { n_shards++; in_shard = 0; }
        L.t[i].shard = n_shards - 1;
        in_shard += L.t[i].bytes;
        total += L.t[i].bytes;
    }

    // the output directory (format/outfile.c): every file it will hold checked first, then
    // built in a temporary directory, put in place when complete
    if (of_dir_begin(&dir, out, &e)) { fprintf(stderr, "moet synth: --out %s\n", e.msg); goto out_q; }
    int bad = of_dir_check(&dir, "config.json", &e) || of_dir_check(&dir, "hf_quant_config.json", &e) ||
              of_dir_check(&dir, "model.safetensors.index.json", &e);
    for (uint32_t sh = 0; sh < n_shards && !bad; sh++) {
        snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", sh + 1, n_shards);
        bad = of_dir_check(&dir, name, &e);
    }
    if (bad) { fprintf(stderr, "moet synth: --out %s\n", e.msg); goto out_q; }
    if (syn_copy(config, &dir, "config.json", &e)) { fprintf(stderr, "moet synth: %s\n", e.msg); goto out_q; }
    if (quant && syn_copy(quant, &dir, "hf_quant_config.json", &e)) { fprintf(stderr, "moet synth: %s\n", e.msg); goto out_q; }

    fprintf(stderr, "synth: %u tensors, %.2f GB in %u shard%s -> %s\n", n, (double)total / 1e9, n_shards, n_shards > 1 ? "s" : "", out);
    double t0 = moet_now();
    uint64_t done = 0;
    pf_progress pr;
    pf_progress_start(&pr, "synth");
    double t_last = pr.t0;
    uint32_t first = 0;
    for (uint32_t sh = 0; sh < n_shards; sh++) {
        uint32_t end = first;
        while (end < n && L.t[end].shard == sh) end++;
        for (uint32_t i = first; i < end; i++)
            st[i] = (stw_tensor){L.t[i].name, L.t[i].dtype, L.t[i].ndim, {L.t[i].shape[0], L.t[i].shape[1], L.t[i].shape[2], L.t[i].shape[3]}};
        snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", sh + 1, n_shards);
        of_dir_file(&dir, name, path, sizeof path);
        stw_file f;
        if (stw_begin(&f, path, st + first, end - first, &e)) { fprintf(stderr, "moet synth: %s\n", e.msg); goto out_q; }
        for (uint32_t i = first; i < end; i++) {
            const syn_tensor *t = &L.t[i];
            uint64_t s = syn_seed(seed, t->name);
            if (t->gen == SYN_F32) {
                float v = syn_scalar(t, seed);
                if (stw_write(&f, &v, 4, &e)) break;
                continue;
            }
            for (uint64_t left = t->bytes; left;) {
                size_t k = left < STW_BUF_BYTES ? (size_t)left : STW_BUF_BYTES;
                uint8_t *p = stw_reserve(&f, k, &e);
                if (!p) break;
                syn_fill(t, &s, p, k);
                if (stw_commit(&f, k, &e)) break;
                left -= k;
                done += k;
                double now = moet_now();
                if (now - t_last >= 0.5) {
                    t_last = now;
                    char rate[64];
                    snprintf(rate, sizeof rate, "bytes, %.2f GB/s", (double)done / 1e9 / (now - t0 + 1e-9));
                    pf_progress_show(&pr, done, total, rate, 0);
                }
            }
            if (e.msg[0]) break;
        }
        if (e.msg[0] || stw_end(&f, &e)) {
            stw_abort(&f);
            fprintf(stderr, "moet synth: %s\n", e.msg);
            goto out_q;
        }
        first = end;
    }
    {
        char rate[64];
        snprintf(rate, sizeof rate, "bytes, %.2f GB/s", (double)total / 1e9 / (moet_now() - t0 + 1e-9));
        pf_progress_show(&pr, total, total, rate, 1);
    }
    // the index: weight_map in file order
    {
        size_t cap = 256;
        for (uint32_t i = 0; i < n; i++) cap += strlen(L.t[i].name) + 64;
        char *buf = arena_sys_alloc(cap, "index");
        if (!buf) { fprintf(stderr, "moet synth: out of memory for the index\n"); goto out_q; }
        js_writer w;
        js_w_init(&w, buf, cap);
        js_w_obj(&w);
        js_w_key(&w, "metadata");
        js_w_obj(&w);
        js_w_key(&w, "total_size");
        js_w_int(&w, (int64_t)total);
        js_w_end_obj(&w);
        js_w_key(&w, "weight_map");
        js_w_obj(&w);
        for (uint32_t i = 0; i < n; i++) {
            char shard[64];
            snprintf(shard, sizeof shard, "model-%05u-of-%05u.safetensors", L.t[i].shard + 1, n_shards);
            js_w_key(&w, L.t[i].name);
            js_w_str(&w, shard);
        }
        js_w_end_obj(&w);
        js_w_end_obj(&w);
        MOET_ASSERT(!w.overflow, "index exceeds its planned %zu bytes", cap);
        int failed = syn_write_file(&dir, "model.safetensors.index.json", buf, w.len, &e);
        arena_sys_free(buf, cap);
        if (failed) { fprintf(stderr, "moet synth: %s\n", e.msg); goto out_q; }
    }
    if (of_dir_commit(&dir, &e)) { fprintf(stderr, "moet synth: %s\n", e.msg); goto out_q; }
    if (!quant) {   // a map left in DIR by an earlier run would override config.json's for every reader
        snprintf(path, sizeof path, "%s/hf_quant_config.json", out);
        unlink(path);   // absent or a regular file (of_dir_check)
    }
    fprintf(stderr, "synth: wrote %s: %u tensors, %" PRIu64 " bytes in %.1f s (%.2f GB/s)\n", out, n, total, moet_now() - t0,
            (double)total / 1e9 / (moet_now() - t0 + 1e-9));
    rc = 0;
out_q:
    of_dir_abort(&dir);   // nothing once committed
    if (mem) arena_sys_free(mem, mem_bytes);
    ck_quant_free(&q);
    return rc;
}
