// format/checkpoint.c — a qwen3_5_moe checkpoint: config, quantization map, every weight.
//
// Three on-disk flavours are accepted (CHECKPOINT.md, sass/MODEL.md §2):
//   1. BF16 (or F16/F32) with fused 3-D routed experts: mlp.experts.gate_up_proj [E, 2I, H]
//      (gate rows first) and mlp.experts.down_proj [E, H, I];
//   2. per-expert 2-D experts: mlp.experts.{e}.{gate,up,down}_proj.weight;
//   3. ModelOpt MIXED_PRECISION: per module, the algorithm named in hf_quant_config.json
//      `quantized_layers` (a prefix entry like "…mlp.experts" covers "…mlp.experts.7.up_proj"):
//        FP8          weight F8_E4M3 [N, K] × weight_scale F32 scalar
//        W4A16_NVFP4  weight U8 [N, K/2] (two e2m1 per byte, low nibble = even k)
//                     × weight_scale F8_E4M3 [N, K/16] × weight_scale_2 F32 scalar
//      input_scale is ignored (weight-only); unlisted modules are BF16.
// Names may be prefixed `model.language_model.` (the VL checkpoints) or `model.`; `model.visual.*`
// is not read. The multi-token-prediction head `mtp.*` (sass/MODEL.md §6), when the shards
// hold it or ck_mtp_open names its own file, is read into ck_model.mtp in either expert layout
// (a malformed one in the shards is not loaded; ck_mtp_need reports why). Weights stay in the mapping in their stored precision: a ck_mat
// describes one matrix and ck_row_f32 / ck_row_f64 decode one row of it exactly.

// ---- element decoders --------------------------------------------------------------------

static float ck_e4m3_lut[256];   // OCP float8_e4m3fn: no infinities, 0x7f/0xff are NaN
static const double ck_e2m1_lut[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6};

static double ck_e4m3(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1 + m / 8.0, e - 7);
    return s ? -v : v;
}

static void ck_init_tables(void) {
    for (int b = 0; b < 256; b++) ck_e4m3_lut[b] = (float)ck_e4m3((uint8_t)b);
}

static float ck_bf16(const uint8_t *p) {
    uint32_t u = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float ck_f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

static float ck_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

// ---- config ------------------------------------------------------------------------------

typedef struct {
    int hidden;                 // H
    int n_layers;               // L
    int vocab;                  // V (embedding / lm_head rows)
    int n_heads, n_kv_heads;    // gated attention: query heads, KV heads (GQA)
    int head_dim;               // per head; q_proj has 2 · n_heads · head_dim rows (query | gate)
    int rot_dim;                // rotary dims per head = head_dim · partial_rotary_factor
    double rope_theta;
    int lk_heads, lv_heads;     // Gated DeltaNet key / value heads
    int lk_dim, lv_dim;         // their head dims
    int conv_k;                 // causal conv kernel width
    int n_experts, topk;        // E routed experts, top-K per token
    int inter, shared_inter;    // I routed expert width, shared expert width
    double eps;                 // rms_norm_eps
    int tie_embeddings;
    int max_pos;                // max_position_embeddings
    uint8_t full_attn[MOET_MAX_LAYERS];  // 1 = gated full attention, 0 = Gated DeltaNet
    int n_full, n_gdn;
    int mtp_layers;             // mtp_num_hidden_layers: decoder layers of the mtp.* head (0 or 1 read)
    // derived
    int key_dim, value_dim, conv_dim;    // GDN: lk_heads·lk_dim, lv_heads·lv_dim, 2·key_dim + value_dim
} ck_config;

static int ck_int_field(const js_doc *d, const js_node *obj, const char *key, int64_t def, int64_t lo, int64_t hi,
                        int *out, const char *path, moet_err *e) {
    const js_node *n = js_get(d, obj, key);
    int64_t v = def;
    if (n && n->type != JS_NULL) {
        if (js_int(n, &v)) return err_set(e, "%s: %s must be an integer, found %s", path, key, js_type_name(n));
    }
    if (v < lo || v > hi) return err_set(e, "%s: %s = %" PRId64 " is outside [%" PRId64 ", %" PRId64 "]", path, key, v, lo, hi);
    *out = (int)v;
    return 0;
}

static int ck_num_field(const js_doc *d, const js_node *obj, const char *key, double def, double *out,
                        const char *path, moet_err *e) {
    const js_node *n = js_get(d, obj, key);
    *out = def;
    if (n && n->type != JS_NULL && js_num(n, out)) return err_set(e, "%s: %s must be a number, found %s", path, key, js_type_name(n));
    return 0;
}

// Reads the text config (config.json's text_config, or the file itself when flat). Defaults
// are those of transformers' Qwen3_5MoeTextConfig.
static int ck_config_parse(ck_config *c, const js_doc *d, const char *path, moet_err *e) {
    memset(c, 0, sizeof *c);
    const js_node *root = js_root(d);
    if (!root || root->type != JS_OBJ) return err_set(e, "%s: not a JSON object", path);
    const js_node *tc = js_get(d, root, "text_config");
    if (tc && tc->type != JS_OBJ) return err_set(e, "%s: text_config is not an object", path);
    const js_node *mt = js_get(d, root, "model_type");
    const js_node *tmt = tc ? js_get(d, tc, "model_type") : NULL;
    int ok = js_str_is(mt, "qwen3_5_moe") || js_str_is(mt, "qwen3_5_moe_text") || js_str_is(tmt, "qwen3_5_moe_text");
    if (!ok) {
        const js_node *shown = mt ? mt : tmt;
        return err_set(e, "%s: model_type %s%s%s is not qwen3_5_moe (only Qwen3.5/3.6 MoE models are supported)", path,
                       shown && shown->type == JS_STR ? "'" : "", shown && shown->type == JS_STR ? shown->str : "absent",
                       shown && shown->type == JS_STR ? "'" : "");
    }
    const js_node *t = tc ? tc : root;
    const int64_t BIG = 1 << 30;
    if (ck_int_field(d, t, "hidden_size", 2048, 16, MOET_MAX_HIDDEN, &c->hidden, path, e) ||
        ck_int_field(d, t, "num_hidden_layers", 40, 1, MOET_MAX_LAYERS, &c->n_layers, path, e) ||
        ck_int_field(d, t, "vocab_size", 248320, 1, MOET_MAX_VOCAB, &c->vocab, path, e) ||
        ck_int_field(d, t, "num_attention_heads", 16, 1, MOET_MAX_HEADS, &c->n_heads, path, e) ||
        ck_int_field(d, t, "num_key_value_heads", 2, 1, MOET_MAX_HEADS, &c->n_kv_heads, path, e) ||
        ck_int_field(d, t, "linear_num_key_heads", 16, 1, MOET_MAX_HEADS, &c->lk_heads, path, e) ||
        ck_int_field(d, t, "linear_num_value_heads", 32, 1, MOET_MAX_HEADS, &c->lv_heads, path, e) ||
        ck_int_field(d, t, "linear_key_head_dim", 128, 1, MOET_MAX_HEAD_DIM, &c->lk_dim, path, e) ||
        ck_int_field(d, t, "linear_value_head_dim", 128, 1, MOET_MAX_HEAD_DIM, &c->lv_dim, path, e) ||
        ck_int_field(d, t, "linear_conv_kernel_dim", 4, 1, MOET_MAX_CONV_KERNEL, &c->conv_k, path, e) ||
        ck_int_field(d, t, "num_experts", 256, 1, MOET_MAX_EXPERTS, &c->n_experts, path, e) ||
        ck_int_field(d, t, "num_experts_per_tok", 8, 1, MOET_MAX_TOPK, &c->topk, path, e) ||
        ck_int_field(d, t, "moe_intermediate_size", 512, 1, BIG, &c->inter, path, e) ||
        ck_int_field(d, t, "shared_expert_intermediate_size", 512, 1, BIG, &c->shared_inter, path, e) ||
        ck_int_field(d, t, "max_position_embeddings", 32768, 1, INT32_MAX, &c->max_pos, path, e) ||
        ck_int_field(d, t, "mtp_num_hidden_layers", 0, 0, MOET_MAX_LAYERS, &c->mtp_layers, path, e))
        return -1;
    if (ck_int_field(d, t, "head_dim", c->hidden / c->n_heads, 2, MOET_MAX_HEAD_DIM, &c->head_dim, path, e)) return -1;
    if (ck_num_field(d, t, "rms_norm_eps", 1e-6, &c->eps, path, e)) return -1;
    if (!(c->eps > 0 && c->eps < 1)) return err_set(e, "%s: rms_norm_eps = %g is not in (0, 1)", path, c->eps);
    const js_node *tie = js_get(d, t, "tie_word_embeddings");
    if (!tie) tie = js_get(d, root, "tie_word_embeddings");
    c->tie_embeddings = tie && tie->type == JS_TRUE;
    const js_node *gate = js_get(d, t, "attn_output_gate");
    if (gate && gate->type == JS_FALSE)
        return err_set(e, "%s: attn_output_gate = false is not supported (qwen3_5_moe attention is gated)", path);
    // rotary: rope_parameters (transformers 5) or the flat fields (older configs)
    const js_node *rp = js_get(d, t, "rope_parameters");
    if (!rp || rp->type != JS_OBJ) rp = js_get(d, t, "rope_scaling");
    if (rp && rp->type != JS_OBJ) rp = NULL;
    double prf, theta;
    if (ck_num_field(d, t, "partial_rotary_factor", 0.25, &prf, path, e)) return -1;
    if (rp && js_get(d, rp, "partial_rotary_factor") && ck_num_field(d, rp, "partial_rotary_factor", prf, &prf, path, e)) return -1;
    if (ck_num_field(d, t, "rope_theta", 10000.0, &theta, path, e)) return -1;
    if (rp && js_get(d, rp, "rope_theta") && ck_num_field(d, rp, "rope_theta", theta, &theta, path, e)) return -1;
    if (rp) {
        const js_node *rt = js_get(d, rp, "rope_type");
        if (!rt) rt = js_get(d, rp, "type");
        if (rt && !js_str_is(rt, "default"))
            return err_set(e, "%s: rope_type '%s' is not supported (only the default rotary embedding)", path,
                           rt->type == JS_STR ? rt->str : js_type_name(rt));
    }
    c->rope_theta = theta;
    c->rot_dim = (int)(c->head_dim * prf);
    if (!(prf > 0 && prf <= 1) || c->rot_dim < 2 || c->rot_dim % 2)
        return err_set(e, "%s: partial_rotary_factor %g gives %d rotary dims of head_dim %d (need an even count >= 2)",
                       path, prf, c->rot_dim, c->head_dim);
    // layer kinds
    const js_node *lt = js_get(d, t, "layer_types");
    if (lt && lt->type != JS_NULL) {
        if (lt->type != JS_ARR || (int)lt->len != c->n_layers)
            return err_set(e, "%s: layer_types must be an array of %d strings", path, c->n_layers);
        int i = 0;
        for (const js_node *x = js_first(lt); x; x = js_after(d, lt, x), i++) {
            if (js_str_is(x, "full_attention")) c->full_attn[i] = 1;
            else if (js_str_is(x, "linear_attention")) c->full_attn[i] = 0;
            else return err_set(e, "%s: layer_types[%d] is %s%s%s, expected \"linear_attention\" or \"full_attention\"", path, i,
                                x->type == JS_STR ? "\"" : "", x->type == JS_STR ? x->str : js_type_name(x), x->type == JS_STR ? "\"" : "");
        }
    } else {
        int interval;
        if (ck_int_field(d, t, "full_attention_interval", 4, 1, MOET_MAX_LAYERS, &interval, path, e)) return -1;
        for (int i = 0; i < c->n_layers; i++) c->full_attn[i] = (i + 1) % interval == 0;
    }
    for (int i = 0; i < c->n_layers; i++) c->n_full += c->full_attn[i];
    c->n_gdn = c->n_layers - c->n_full;
    // shape rules the math relies on
    if (c->n_heads % c->n_kv_heads)
        return err_set(e, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path, c->n_heads, c->n_kv_heads);
    if (c->lv_heads % c->lk_heads)
        return err_set(e, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", path, c->lv_heads, c->lk_heads);
    if (c->topk > c->n_experts)
        return err_set(e, "%s: num_experts_per_tok %d exceeds num_experts %d", path, c->topk, c->n_experts);
    c->key_dim = c->lk_heads * c->lk_dim;
    c->value_dim = c->lv_heads * c->lv_dim;
    c->conv_dim = 2 * c->key_dim + c->value_dim;
    return 0;
}

static int ck_config_read(ck_config *c, const char *path, moet_err *e) {
    js_doc d;
    if (js_load_file(&d, path, MOET_MAX_CONFIG_BYTES, e)) return -1;
    int rc = ck_config_parse(c, &d, path, e);
    js_free_doc(&d);
    return rc;
}

// ---- matrices ----------------------------------------------------------------------------

enum { CK_W_BF16, CK_W_F16, CK_W_F32, CK_W_FP8, CK_W_NVFP4, CK_W_PLANES };

typedef struct {
    uint8_t kind;            // CK_W_*
    int rows, cols;          // logical [rows, cols] = [out_features, in_features]
    const uint8_t *w;        // BF16/F16/F32/FP8: row r at w + r·row_bytes; NVFP4: packed [rows, cols/2];
                             // PLANES: 2-bit codes in fragment-major order (PLANES.md §3)
    size_t row_bytes;
    const uint8_t *scale;    // NVFP4: e4m3 [rows, cols/16]; PLANES: e8m0 [rows/16, cols/32, 16]
    float s;                 // FP8: weight_scale; NVFP4: weight_scale_2
} ck_mat;

// Code c of a 2-bit plane means level {-4, -1, +1, +4}[c] × 2^(scale byte − 127).
static const float ck_plane_level[4] = {-4.f, -1.f, 1.f, 4.f};

// A UE8M0 scale byte as a float, 2^(b − 127), built from its bits: the exponent field is b
// itself (b = 0 is the subnormal 2^−127, b = 255 is +inf, as ldexpf gives).
static float ck_e8m0(uint8_t b) {
    uint32_t u = b ? (uint32_t)b << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// One row of a fragment-major 2-bit matrix [N, K] (PLANES.md §3), exact, into out32[K] or out64[K].
static void ck_plane_row(const ck_mat *m, int n, float *out32, double *out64) {
    int K = m->cols, KB = K / 64, nb = n / 16, tile = (n % 16) / 8, g = n % 8;
    const uint8_t *scales = m->scale + (size_t)nb * (K / 32) * 16 + n % 16;   // stride 16 per 32-block
    for (int kb = 0; kb < KB; kb++)
        for (int k32 = 0; k32 < 2; k32++) {
            float sc = ck_e8m0(scales[(size_t)(kb * 2 + k32) * 16]);   // a power of two: products are exact
            float lv[4] = {ck_plane_level[0] * sc, ck_plane_level[1] * sc, ck_plane_level[2] * sc, ck_plane_level[3] * sc};
            for (int t = 0; t < 4; t++) {
                const uint8_t *frag = m->w + ((((size_t)nb * KB + kb) * 8 + g) * 4 + t) * 8 + tile * 4 + k32 * 2;
                for (int half = 0; half < 2; half++) {
                    uint8_t byte = frag[half];
                    int k0 = kb * 64 + k32 * 32 + half * 16 + t * 4;
                    if (out32)
                        for (int j = 0; j < 4; j++) out32[k0 + j] = lv[(byte >> (2 * j)) & 3];
                    else
                        for (int j = 0; j < 4; j++) out64[k0 + j] = lv[(byte >> (2 * j)) & 3];
                }
            }
        }
}

// Row r of m as float32, exactly the value the stored format encodes (rounded to f32 once).
static void ck_row_f32(const ck_mat *m, int r, float *out) {
    const uint8_t *p = m->w + (size_t)r * m->row_bytes;
    int K = m->cols;
    switch (m->kind) {
    case CK_W_BF16: for (int k = 0; k < K; k++) out[k] = ck_bf16(p + 2 * k); break;
    case CK_W_F16: for (int k = 0; k < K; k++) out[k] = ck_f16(p + 2 * k); break;
    case CK_W_F32: memcpy(out, p, (size_t)K * 4); break;
    // e4m3 × f32 scale: the f32 product is correctly rounded, as the exact product cast to f32
    case CK_W_FP8: for (int k = 0; k < K; k++) out[k] = ck_e4m3_lut[p[k]] * m->s; break;
    case CK_W_NVFP4: {
        const uint8_t *sc = m->scale + (size_t)r * (K / 16);
        for (int b = 0; b < K / 16; b++) {
            double s = (double)ck_e4m3_lut[sc[b]] * (double)m->s;  // exact in f64; one rounding below
            for (int j = 0; j < 8; j++) {
                uint8_t byte = p[b * 8 + j];
                out[b * 16 + 2 * j] = (float)(ck_e2m1_lut[byte & 15] * s);
                out[b * 16 + 2 * j + 1] = (float)(ck_e2m1_lut[byte >> 4] * s);
            }
        }
        break;
    }
    case CK_W_PLANES: ck_plane_row(m, r, out, NULL); break;
    default: moet_die("matrix kind %d", m->kind);
    }
}

// Row r of m in float64, exact (every stored format is exactly representable in f64).
static void ck_row_f64(const ck_mat *m, int r, double *out) {
    const uint8_t *p = m->w + (size_t)r * m->row_bytes;
    int K = m->cols;
    switch (m->kind) {
    case CK_W_FP8: for (int k = 0; k < K; k++) out[k] = (double)ck_e4m3_lut[p[k]] * (double)m->s; break;
    case CK_W_NVFP4: {
        const uint8_t *sc = m->scale + (size_t)r * (K / 16);
        for (int b = 0; b < K / 16; b++) {
            double s = (double)ck_e4m3_lut[sc[b]] * (double)m->s;
            for (int j = 0; j < 8; j++) {
                uint8_t byte = p[b * 8 + j];
                out[b * 16 + 2 * j] = ck_e2m1_lut[byte & 15] * s;
                out[b * 16 + 2 * j + 1] = ck_e2m1_lut[byte >> 4] * s;
            }
        }
        break;
    }
    case CK_W_BF16: for (int k = 0; k < K; k++) out[k] = ck_bf16(p + 2 * k); break;
    case CK_W_F16: for (int k = 0; k < K; k++) out[k] = ck_f16(p + 2 * k); break;
    case CK_W_F32: for (int k = 0; k < K; k++) out[k] = ck_f32(p + 4 * k); break;
    case CK_W_PLANES: ck_plane_row(m, r, NULL, out); break;
    default: moet_die("matrix kind %d", m->kind);
    }
}

// One element of a vector-like tensor (norm weights, A_log, dt_bias …): m is [1, n].
static float ck_at(const ck_mat *m, int r, int k) {
    const uint8_t *p = m->w + (size_t)r * m->row_bytes;
    switch (m->kind) {
    case CK_W_BF16: return ck_bf16(p + 2 * k);
    case CK_W_F16: return ck_f16(p + 2 * k);
    case CK_W_F32: return ck_f32(p + 4 * k);
    default: moet_die("ck_at on a quantized matrix");
    }
}

// ---- the model's weights -----------------------------------------------------------------

typedef struct {
    ck_mat in_norm, post_norm;       // [1, H] zero-centred: scale (1 + w)
    // gated full attention (cfg.full_attn[l])
    ck_mat q;                        // [2·nh·hd, H]: per head h rows h·2hd + [0, hd) query, + [hd, 2hd) gate
    ck_mat k, v;                     // [kvh·hd, H]
    ck_mat o;                        // [H, nh·hd]
    ck_mat q_norm, k_norm;           // [1, hd] zero-centred, shared by all heads
    // Gated DeltaNet (otherwise)
    ck_mat qkv;                      // [conv_dim, H]: q [key_dim] | k [key_dim] | v [value_dim]
    ck_mat z;                        // [value_dim, H] output gate
    ck_mat b, a;                     // [lv_heads, H] beta / decay pre-activations
    ck_mat conv;                     // [conv_dim, conv_k] depthwise causal conv (stored [conv_dim, 1, conv_k])
    ck_mat A_log, dt_bias;           // [1, lv_heads]
    ck_mat gnorm;                    // [1, lv_dim] gated RMSNorm, plain scale w
    ck_mat out;                      // [H, value_dim]
    // mixture of experts
    ck_mat router;                   // [E, H]
    ck_mat *gate, *up, *down;        // [E] each: [I, H], [I, H], [H, I]
    ck_mat sh_gate, sh_up;           // [SI, H]
    ck_mat sh_down;                  // [H, SI]
    ck_mat sh_gate_w;                // [1, H] sigmoid gate of the shared expert
} ck_layer;

// The multi-token-prediction head (sass/MODEL.md §6): row t reads h_t (the main model's hidden
// state after its final norm) and x_{t+1}; u = fc(cat(norm_emb(embed(x_{t+1})), norm_hid(h_t)));
// one decoder layer with its own KV; norm; the main lm_head predicts x_{t+2}. BF16 as released.
typedef struct {
    int present;                     // 0: the checkpoint has no head (nothing below is set)
    ck_mat norm_emb, norm_hid;       // [1, H] zero-centred pre-fc norms of embed(x_{t+1}) and of h_t
    ck_mat fc;                       // [H, 2H]: input cat(normed embedding, normed hidden), embedding first
    ck_layer layer;                  // gated full attention + MoE, as the main model's full-attention layers
    ck_mat norm;                     // [1, H] zero-centred, before the shared lm_head
    char expert_layout[8];           // "fused" (gate_up_proj [E, 2I, H], down_proj [E, H, I]) or "split"
    st_set *file;                    // the head's own safetensors file (ck_mtp_open with a path), else NULL
    moet_err refused;                // why the mtp.* tensors the shards hold are not a head (present = 0)
} ck_mtp;

typedef struct {
    ck_config cfg;
    st_set st;
    const st_set *src;               // where the loaders look: NULL = st; the head's own file while it loads
    char dir[MOET_MAX_PATH];
    char prefix[32];                 // "model.language_model." or "model."
    char expert_format[16];          // how the routed experts are stored: "nvfp4", "fp8" or "bf16"
    ck_mat embed;                    // [V, H]
    ck_mat final_norm;               // [1, H] zero-centred
    ck_mat lm_head;                  // [V, H]
    ck_layer *layers;                // [L]
    ck_mtp mtp;                      // the multi-token-prediction head, when present
    struct pf_cache_s *xcache;       // NULL, or the expert cache the routed experts come from (format/planes_model.c)
    uint8_t *mem;                    // layers + expert matrices (and the head's), one allocation
    size_t mem_bytes;
} ck_model;

// A tensor of the set the loaders read (ck_model.src).
static const st_tensor *ck_find(const ck_model *m, const char *name) { return st_find(m->src ? m->src : &m->st, name); }

enum { CK_Q_NONE, CK_Q_FP8, CK_Q_NVFP4 };

typedef struct {
    js_doc doc;
    const js_node *layers;           // quantized_layers object, or NULL (an unquantized checkpoint)
    char source[MOET_MAX_PATH];      // where it came from, for messages
} ck_quant;

// "model.language_model.layers.3.x" and "model.layers.3.x" name the same module.
static const char *ck_canon(const char *name) {
    static const char *pre[] = {"model.language_model.", "language_model.model.", "language_model.", "model."};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) {
        size_t k = strlen(pre[i]);
        if (!strncmp(name, pre[i], k)) return name + k;
    }
    return name;
}

// The algorithm of `module` (a checkpoint name without ".weight"): an exact entry of
// quantized_layers, else the longest entry that is a dotted prefix of it; absent = BF16.
static int ck_quant_algo(const ck_quant *q, const char *module, moet_err *e) {
    if (!q->layers) return CK_Q_NONE;
    const char *m = ck_canon(module);
    size_t best_len = 0;
    const js_node *best = NULL, *best_key = NULL;
    for (const js_node *k = js_first(q->layers); k; k = js_member_next(&q->doc, q->layers, k)) {
        const char *c = ck_canon(k->str);
        size_t n = strlen(c);
        if (!strncmp(m, c, n) && (m[n] == 0 || m[n] == '.') && n >= best_len) {
            best_len = n;
            best = k + 1;
            best_key = k;
        }
    }
    if (!best) return CK_Q_NONE;
    const js_node *algo = js_get(&q->doc, best, "quant_algo");
    if (js_str_is(algo, "FP8")) return CK_Q_FP8;
    if (js_str_is(algo, "W4A16_NVFP4")) {
        const js_node *gs = js_get(&q->doc, best, "group_size");
        int64_t g = 16;
        if (gs && (js_int(gs, &g) || g != 16))
            return err_set(e, "%s: module '%s' has W4A16_NVFP4 group_size %s, only 16 is supported", q->source, best_key->str,
                           gs->type == JS_NUM ? "other than 16" : js_type_name(gs));
        return CK_Q_NVFP4;
    }
    return err_set(e, "%s: module '%s' has unsupported quant_algo %s%s%s (supported: FP8, W4A16_NVFP4)", q->source, best_key->str,
                   algo && algo->type == JS_STR ? "'" : "", algo && algo->type == JS_STR ? algo->str : js_type_name(algo),
                   algo && algo->type == JS_STR ? "'" : "");
}

static void ck_quant_free(ck_quant *q) { js_free_doc(&q->doc); q->layers = NULL; }

// The quantization map of one file: an hf_quant_config.json (from_hf: its "quantization"
// object) or a config.json (its quantization_config); a config without one means none.
static int ck_quant_read_file(ck_quant *q, const char *path, int from_hf, moet_err *e) {
    memset(q, 0, sizeof *q);
    const js_node *qc = NULL;
    snprintf(q->source, sizeof q->source, "%s", path);
    if (js_load_file(&q->doc, path, MOET_MAX_CONFIG_BYTES, e)) return -1;
    const js_node *root = js_root(&q->doc);
    qc = from_hf ? js_get(&q->doc, root, "quantization") : js_get(&q->doc, root, "quantization_config");
    if (!qc || qc->type == JS_NULL) {
        if (from_hf) { ck_quant_free(q); return err_set(e, "%s: no \"quantization\" object", path); }
        ck_quant_free(q);  // an unquantized checkpoint
        return 0;
    }
    if (qc->type != JS_OBJ) { ck_quant_free(q); return err_set(e, "%s: the quantization entry is not an object", path); }
    const js_node *method = js_get(&q->doc, qc, "quant_method");
    if (!from_hf && method && !js_str_is(method, "modelopt")) {
        ck_quant_free(q);
        return err_set(e, "%s: quantization_config.quant_method %s%s%s is not supported (ModelOpt checkpoints only)", path,
                       method->type == JS_STR ? "'" : "", method->type == JS_STR ? method->str : js_type_name(method),
                       method->type == JS_STR ? "'" : "");
    }
    const js_node *algo = js_get(&q->doc, qc, "quant_algo");
    if (!js_str_is(algo, "MIXED_PRECISION")) {
        err_set(e, "%s: quant_algo %s%s%s is not supported (MIXED_PRECISION with per-module FP8 / W4A16_NVFP4 expected)", path,
                algo && algo->type == JS_STR ? "'" : "", algo && algo->type == JS_STR ? algo->str : js_type_name(algo),
                algo && algo->type == JS_STR ? "'" : "");
        ck_quant_free(q);
        return -1;
    }
    q->layers = js_get(&q->doc, qc, "quantized_layers");
    if (!q->layers || q->layers->type != JS_OBJ) {
        ck_quant_free(q);
        return err_set(e, "%s: MIXED_PRECISION without a quantized_layers object", path);
    }
    return 0;
}

// hf_quant_config.json when present, else config.json's quantization_config, else none.
static int ck_quant_read(ck_quant *q, const char *dir, moet_err *e) {
    char path[MOET_MAX_PATH];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    int from_hf = access(path, F_OK) == 0;
    if (!from_hf) snprintf(path, sizeof path, "%s/config.json", dir);
    return ck_quant_read_file(q, path, from_hf, e);
}

static const char *ck_algo_name(int algo) { return algo == CK_Q_FP8 ? "FP8" : algo == CK_Q_NVFP4 ? "W4A16_NVFP4" : "unquantized"; }

// The tensor `name` with one of the allowed dtypes (a bit mask of 1 << ST_*) and exactly `shape`.
static const st_tensor *ck_tensor(const ck_model *m, const char *name, unsigned dtypes, int ndim, const int64_t *shape,
                                  const char *why, moet_err *e) {
    const st_tensor *t = ck_find(m, name);
    char want[160], got[160], dts[96] = "";
    st_shape_str(shape, ndim, want, sizeof want);
    for (int d = 0; d < ST_N_DTYPES; d++)
        if (dtypes & (1u << d)) snprintf(dts + strlen(dts), sizeof dts - strlen(dts), "%s%s", *dts ? "/" : "", st_dtypes[d].name);
    if (!t) {
        err_set(e, "%s: missing tensor '%s' (expected %s %s%s%s)", m->dir, name, dts, want, why ? ", " : "", why ? why : "");
        return NULL;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!(dtypes & (1u << t->dtype)) || !same) {
        err_set(e, "%s: tensor '%s': expected %s %s, found %s %s%s%s", m->dir, name, dts, want, st_dtypes[t->dtype].name,
                st_shape_str(t->shape, t->ndim, got, sizeof got), why ? " (" : "", why ? why : "");
        if (why && e) snprintf(e->msg + strlen(e->msg), sizeof e->msg - strlen(e->msg), ")");
        return NULL;
    }
    return t;
}

#define CK_DT_FLOAT ((1u << ST_BF16) | (1u << ST_F16) | (1u << ST_F32))

static void ck_float_mat(ck_mat *out, const st_tensor *t, int rows, int cols) {
    out->kind = t->dtype == ST_BF16 ? CK_W_BF16 : t->dtype == ST_F16 ? CK_W_F16 : CK_W_F32;
    out->rows = rows;
    out->cols = cols;
    out->w = t->data;
    out->row_bytes = (size_t)cols * st_dtypes[t->dtype].bytes;
}

// A scalar F32 scale tensor (shape [] or [1]).
static int ck_scalar(const ck_model *m, const char *name, float *out, moet_err *e) {
    const st_tensor *t = ck_find(m, name);
    if (!t) return err_set(e, "%s: missing tensor '%s' (expected an F32 scalar)", m->dir, name);
    if (t->dtype != ST_F32 || t->numel != 1) {
        char got[160];
        return err_set(e, "%s: tensor '%s': expected an F32 scalar, found %s %s", m->dir, name, st_dtypes[t->dtype].name,
                       st_shape_str(t->shape, t->ndim, got, sizeof got));
    }
    *out = ck_f32(t->data);
    if (!isfinite(*out) || *out <= 0) return err_set(e, "%s: tensor '%s' = %g is not a positive finite scale", m->dir, name, *out);
    return 0;
}

// A linear layer [rows, cols] stored as its module's algorithm says. `module` is the full
// checkpoint name without ".weight".
static int ck_linear(const ck_model *m, const ck_quant *q, const char *module, int rows, int cols, ck_mat *out, moet_err *e) {
    char name[MOET_MAX_NAME + 32], why[MOET_MAX_NAME + 64];
    int algo = ck_quant_algo(q, module, e);
    if (algo < 0) return -1;
    snprintf(why, sizeof why, "module %s is %s", module, ck_algo_name(algo));
    snprintf(name, sizeof name, "%s.weight", module);
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    if (algo == CK_Q_NONE) {
        int64_t shape[2] = {rows, cols};
        const st_tensor *t = ck_tensor(m, name, CK_DT_FLOAT, 2, shape, NULL, e);
        if (!t) return -1;
        ck_float_mat(out, t, rows, cols);
        return 0;
    }
    if (algo == CK_Q_FP8) {
        int64_t shape[2] = {rows, cols};
        const st_tensor *t = ck_tensor(m, name, 1u << ST_F8_E4M3, 2, shape, why, e);
        if (!t) return -1;
        snprintf(name, sizeof name, "%s.weight_scale", module);
        if (ck_scalar(m, name, &out->s, e)) return -1;
        out->kind = CK_W_FP8;
        out->w = t->data;
        out->row_bytes = (size_t)cols;
        return 0;
    }
    if (cols % 16) return err_set(e, "%s: module %s is W4A16_NVFP4 but its input width %d is not a multiple of 16", m->dir, module, cols);
    int64_t shape[2] = {rows, cols / 2}, sshape[2] = {rows, cols / 16};
    const st_tensor *t = ck_tensor(m, name, 1u << ST_U8, 2, shape, why, e);
    if (!t) return -1;
    snprintf(name, sizeof name, "%s.weight_scale", module);
    const st_tensor *sc = ck_tensor(m, name, 1u << ST_F8_E4M3, 2, sshape, why, e);
    if (!sc) return -1;
    snprintf(name, sizeof name, "%s.weight_scale_2", module);
    if (ck_scalar(m, name, &out->s, e)) return -1;
    out->kind = CK_W_NVFP4;
    out->w = t->data;
    out->row_bytes = (size_t)cols / 2;
    out->scale = sc->data;
    return 0;
}

// A float vector [n] (norm weights, A_log, dt_bias) as a [1, n] matrix.
static int ck_vector(const ck_model *m, const char *name, int n, ck_mat *out, moet_err *e) {
    int64_t shape[1] = {n};
    const st_tensor *t = ck_tensor(m, name, CK_DT_FLOAT, 1, shape, NULL, e);
    if (!t) return -1;
    ck_float_mat(out, t, 1, n);
    return 0;
}

// Routed experts of the layer named p ("model.layers.3.", "mtp.layers.0."): fused 3-D tensors,
// or one module per expert.
// `label` names the layer in messages ("layer 3").
static int ck_experts(ck_model *m, const ck_quant *q, const char *p, const char *label, ck_layer *L, moet_err *e) {
    const ck_config *c = &m->cfg;
    int E = c->n_experts, I = c->inter, H = c->hidden;
    char name[MOET_MAX_NAME + 64];
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", p);
    if (ck_find(m, name)) {
        int64_t gs[3] = {E, 2 * I, H}, ds[3] = {E, H, I};
        const st_tensor *gu = ck_tensor(m, name, CK_DT_FLOAT, 3, gs, "fused routed experts", e);
        if (!gu) return -1;
        snprintf(name, sizeof name, "%smlp.experts.down_proj", p);
        const st_tensor *dn = ck_tensor(m, name, CK_DT_FLOAT, 3, ds, "fused routed experts", e);
        if (!dn) return -1;
        size_t esz = (size_t)st_dtypes[gu->dtype].bytes, dsz = (size_t)st_dtypes[dn->dtype].bytes;
        for (int x = 0; x < E; x++) {
            st_tensor sub = *gu;
            ck_float_mat(&L->gate[x], &sub, I, H);
            L->gate[x].w = gu->data + (size_t)x * 2 * I * H * esz;
            L->up[x] = L->gate[x];
            L->up[x].w = L->gate[x].w + (size_t)I * H * esz;
            sub = *dn;
            ck_float_mat(&L->down[x], &sub, H, I);
            L->down[x].w = dn->data + (size_t)x * H * I * dsz;
        }
        snprintf(m->expert_format, sizeof m->expert_format, "bf16");
        return 0;
    }
    snprintf(name, sizeof name, "%smlp.experts.0.gate_proj.weight", p);
    if (!ck_find(m, name))
        return err_set(e, "%s: %s has no routed experts: neither %smlp.experts.gate_up_proj nor %s", m->dir, label, p, name);
    for (int x = 0; x < E; x++) {
        snprintf(name, sizeof name, "%smlp.experts.%d.gate_proj", p, x);
        if (ck_linear(m, q, name, I, H, &L->gate[x], e)) return -1;
        snprintf(name, sizeof name, "%smlp.experts.%d.up_proj", p, x);
        if (ck_linear(m, q, name, I, H, &L->up[x], e)) return -1;
        snprintf(name, sizeof name, "%smlp.experts.%d.down_proj", p, x);
        if (ck_linear(m, q, name, H, I, &L->down[x], e)) return -1;
    }
    int kind = L->gate[0].kind;
    snprintf(m->expert_format, sizeof m->expert_format, "%s", kind == CK_W_NVFP4 ? "nvfp4" : kind == CK_W_FP8 ? "fp8" : "bf16");
    return 0;
}

// The decoder layer named p ("model.layers.3.", "mtp.layers.0."): gated full attention when
// full, else Gated DeltaNet; then the MoE.
static int ck_layer_at(ck_model *m, const ck_quant *q, const char *p, const char *label, int full, ck_layer *L, moet_err *e) {
    const ck_config *c = &m->cfg;
    int H = c->hidden;
    char n[MOET_MAX_NAME + 64];
#define CK_NAME(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    if (ck_vector(m, CK_NAME("input_layernorm.weight"), H, &L->in_norm, e) ||
        ck_vector(m, CK_NAME("post_attention_layernorm.weight"), H, &L->post_norm, e))
        return -1;
    if (full) {
        int qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
        if (ck_linear(m, q, CK_NAME("self_attn.q_proj"), 2 * qd, H, &L->q, e) ||
            ck_linear(m, q, CK_NAME("self_attn.k_proj"), kd, H, &L->k, e) ||
            ck_linear(m, q, CK_NAME("self_attn.v_proj"), kd, H, &L->v, e) ||
            ck_linear(m, q, CK_NAME("self_attn.o_proj"), H, qd, &L->o, e) ||
            ck_vector(m, CK_NAME("self_attn.q_norm.weight"), c->head_dim, &L->q_norm, e) ||
            ck_vector(m, CK_NAME("self_attn.k_norm.weight"), c->head_dim, &L->k_norm, e))
            return -1;
    } else {
        if (ck_linear(m, q, CK_NAME("linear_attn.in_proj_qkv"), c->conv_dim, H, &L->qkv, e) ||
            ck_linear(m, q, CK_NAME("linear_attn.in_proj_z"), c->value_dim, H, &L->z, e) ||
            ck_linear(m, q, CK_NAME("linear_attn.in_proj_b"), c->lv_heads, H, &L->b, e) ||
            ck_linear(m, q, CK_NAME("linear_attn.in_proj_a"), c->lv_heads, H, &L->a, e) ||
            ck_linear(m, q, CK_NAME("linear_attn.out_proj"), H, c->value_dim, &L->out, e) ||
            ck_vector(m, CK_NAME("linear_attn.A_log"), c->lv_heads, &L->A_log, e) ||
            ck_vector(m, CK_NAME("linear_attn.dt_bias"), c->lv_heads, &L->dt_bias, e) ||
            ck_vector(m, CK_NAME("linear_attn.norm.weight"), c->lv_dim, &L->gnorm, e))
            return -1;
        int64_t cs[3] = {c->conv_dim, 1, c->conv_k};
        const st_tensor *t = ck_tensor(m, CK_NAME("linear_attn.conv1d.weight"), CK_DT_FLOAT, 3, cs, NULL, e);
        if (!t) return -1;
        ck_float_mat(&L->conv, t, c->conv_dim, c->conv_k);
    }
    if (ck_linear(m, q, CK_NAME("mlp.gate"), c->n_experts, H, &L->router, e) ||
        ck_linear(m, q, CK_NAME("mlp.shared_expert.gate_proj"), c->shared_inter, H, &L->sh_gate, e) ||
        ck_linear(m, q, CK_NAME("mlp.shared_expert.up_proj"), c->shared_inter, H, &L->sh_up, e) ||
        ck_linear(m, q, CK_NAME("mlp.shared_expert.down_proj"), H, c->shared_inter, &L->sh_down, e) ||
        ck_linear(m, q, CK_NAME("mlp.shared_expert_gate"), 1, H, &L->sh_gate_w, e))
        return -1;
#undef CK_NAME
    return ck_experts(m, q, p, label, L, e);
}

static int ck_layer_load(ck_model *m, const ck_quant *q, int l, moet_err *e) {
    char p[MOET_MAX_NAME], label[32];
    snprintf(p, sizeof p, "%slayers.%d.", m->prefix, l);
    snprintf(label, sizeof label, "layer %d", l);
    return ck_layer_at(m, q, p, label, m->cfg.full_attn[l], &m->layers[l], e);
}

// The mtp.* head from the set ck_find reads (sass/MODEL.md §6): every tensor checked by name,
// dtype and shape; the experts fused or per expert, whichever the file holds. Its expert
// matrices are the last 3·E of the model's table. On error the head stays absent.
static int ck_mtp_load(ck_model *m, const ck_quant *q, moet_err *e) {
    const ck_config *c = &m->cfg;
    ck_mtp *h = &m->mtp;
    int H = c->hidden, E = c->n_experts;
    if (c->mtp_layers > 1)
        return err_set(e, "%s: mtp_num_hidden_layers = %d: only a one-layer multi-token-prediction head is supported", m->dir,
                       c->mtp_layers);
    ck_mat *xm = (ck_mat *)(m->mem + (size_t)c->n_layers * sizeof(ck_layer)) + (size_t)3 * c->n_layers * E;
    st_set *file = h->file;
    memset(h, 0, sizeof *h);
    h->file = file;
    h->layer.gate = xm;
    h->layer.up = xm + E;
    h->layer.down = xm + 2 * E;
    int64_t fs[2] = {H, 2 * H};
    const st_tensor *fc = ck_tensor(m, "mtp.fc.weight", CK_DT_FLOAT, 2, fs, "input cat(normed embedding, normed hidden)", e);
    if (!fc) return err_wrap(e, "the multi-token-prediction head");   // (h->present is 0)
    ck_float_mat(&h->fc, fc, H, 2 * H);
    char keep[sizeof m->expert_format];   // the main layers' expert format stays what it was
    memcpy(keep, m->expert_format, sizeof keep);
    int rc = ck_vector(m, "mtp.pre_fc_norm_embedding.weight", H, &h->norm_emb, e) ||
             ck_vector(m, "mtp.pre_fc_norm_hidden.weight", H, &h->norm_hid, e) ||
             ck_vector(m, "mtp.norm.weight", H, &h->norm, e) || ck_layer_at(m, q, "mtp.layers.0.", "the MTP layer", 1, &h->layer, e);
    memcpy(m->expert_format, keep, sizeof keep);
    if (rc) {
        h->present = 0;
        return err_wrap(e, "the multi-token-prediction head");
    }
    snprintf(h->expert_layout, sizeof h->expert_layout, "%s", ck_find(m, "mtp.layers.0.mlp.experts.gate_up_proj") ? "fused" : "split");
    h->present = 1;
    return 0;
}

// Whether a set holds any mtp.* tensor (then the whole head must be there and well formed).
static int ck_mtp_in(const st_set *s) {
    for (uint32_t i = 0; i < s->n_tensors; i++)
        if (!strncmp(s->tensors[i].name, "mtp.", 4)) return 1;
    return 0;
}

static void ck_close(ck_model *m) {
    if (m->mtp.file) {
        st_close(m->mtp.file);
        arena_sys_free(m->mtp.file, sizeof *m->mtp.file);
    }
    memset(&m->mtp, 0, sizeof m->mtp);
    st_close(&m->st);
    if (m->mem) arena_sys_free(m->mem, m->mem_bytes);
    m->mem = NULL;
    m->layers = NULL;
}

// Opens the checkpoint in dir: config, quantization map, every shard, every weight checked by
// name, dtype and shape. On error nothing stays open.
static int ck_open(ck_model *m, const char *dir, moet_err *e) {
    memset(m, 0, sizeof *m);
    ck_init_tables();
    if (strlen(dir) >= sizeof m->dir - 64) return err_set(e, "%s: path too long", dir);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    char path[MOET_MAX_PATH];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ck_config_read(&m->cfg, path, e)) return -1;
    const ck_config *c = &m->cfg;
    ck_quant q;
    if (ck_quant_read(&q, dir, e)) return -1;
    int rc = -1;
    if (st_open(&m->st, dir, e)) goto out;
    if (st_find(&m->st, "model.language_model.embed_tokens.weight")) snprintf(m->prefix, sizeof m->prefix, "model.language_model.");
    else if (st_find(&m->st, "model.embed_tokens.weight")) snprintf(m->prefix, sizeof m->prefix, "model.");
    else {
        err_set(e, "%s: no embedding: neither model.language_model.embed_tokens.weight nor model.embed_tokens.weight", dir);
        goto out;
    }
    // one allocation: layers [L] | expert matrices [L + 1][3][E] (the last for the MTP head)
    size_t lb = (size_t)c->n_layers * sizeof(ck_layer), xb = (size_t)(c->n_layers + 1) * 3 * c->n_experts * sizeof(ck_mat);
    m->mem_bytes = lb + xb;
    m->mem = arena_sys_alloc(m->mem_bytes, "checkpoint tables");
    if (!m->mem) { err_set(e, "%s: out of memory for the weight tables", dir); goto out; }
    m->layers = (ck_layer *)m->mem;
    ck_mat *xm = (ck_mat *)(m->mem + lb);
    char name[MOET_MAX_NAME];
    snprintf(name, sizeof name, "%sembed_tokens.weight", m->prefix);
    int64_t es[2] = {c->vocab, c->hidden};
    const st_tensor *emb = ck_tensor(m, name, CK_DT_FLOAT, 2, es, NULL, e);
    if (!emb) goto out;
    ck_float_mat(&m->embed, emb, c->vocab, c->hidden);
    snprintf(name, sizeof name, "%snorm.weight", m->prefix);
    if (ck_vector(m, name, c->hidden, &m->final_norm, e)) goto out;
    if (c->tie_embeddings) m->lm_head = m->embed;
    else if (ck_linear(m, &q, "lm_head", c->vocab, c->hidden, &m->lm_head, e)) goto out;
    for (int l = 0; l < c->n_layers; l++) {
        ck_layer *L = &m->layers[l];
        L->gate = xm + (size_t)(3 * l + 0) * c->n_experts;
        L->up = xm + (size_t)(3 * l + 1) * c->n_experts;
        L->down = xm + (size_t)(3 * l + 2) * c->n_experts;
        if (ck_layer_load(m, &q, l, e)) goto out;
    }
    // mtp.* tensors in the shards: the head, or the reason they are not one (kept for ck_mtp_need;
    // the main model does not depend on them)
    if (ck_mtp_in(&m->st) && ck_mtp_load(m, &q, &m->mtp.refused)) m->mtp.present = 0;
    rc = 0;
out:
    ck_quant_free(&q);
    if (rc) ck_close(m);
    return rc;
}

// The multi-token-prediction head of an open model from its own safetensors file `path` (a
// release may ship it apart; tests/fixtures/demo_mtp), BF16 (the head is never quantized), in
// place of any head the shards held. Errors name the file, the tensor, expected and found.
static int ck_mtp_open(ck_model *m, const char *path, moet_err *e) {
    if (m->mtp.file) {
        st_close(m->mtp.file);
        arena_sys_free(m->mtp.file, sizeof *m->mtp.file);
    }
    memset(&m->mtp, 0, sizeof m->mtp);
    st_set *s = arena_sys_alloc(sizeof *s, "MTP head tensor table");
    if (!s) return err_set(e, "%s: out of memory for the tensor table", path);
    if (st_open(s, path, e)) {
        arena_sys_free(s, sizeof *s);
        return -1;
    }
    if (!ck_mtp_in(s)) {
        st_close(s);
        arena_sys_free(s, sizeof *s);
        return err_set(e, "%s: no mtp.* tensor (not a multi-token-prediction head)", path);
    }
    ck_quant none = {0};
    char dir[sizeof m->dir];   // messages name the head's file
    memcpy(dir, m->dir, sizeof dir);
    snprintf(m->dir, sizeof m->dir, "%s", path);
    m->src = s;
    int rc = ck_mtp_load(m, &none, e);
    m->src = NULL;
    memcpy(m->dir, dir, sizeof dir);
    if (rc) {
        st_close(s);
        arena_sys_free(s, sizeof *s);
        return -1;
    }
    m->mtp.file = s;
    return 0;
}

// For a caller that needs the head: 0 when the model has one, else -1 with why (the shards'
// mtp.* tensors refused, with the tensor named, or none at all).
static int ck_mtp_need(const ck_model *m, moet_err *e) {
    if (m->mtp.present) return 0;
    if (m->mtp.refused.msg[0]) return err_set(e, "%s", m->mtp.refused.msg);
    return err_set(e, "%s: no multi-token-prediction head (no mtp.* tensor in the checkpoint)", m->dir);
}

// Makes the weight bytes of one matrix resident (arena_resident). Plane matrices point into an
// arena, which is resident since its allocation.
static int ck_mat_resident(const ck_mat *w) {
    if (!w->w || w->kind == CK_W_PLANES) return 0;   // !w: a matrix this layer kind does not have
    if (arena_resident(w->w, (size_t)w->rows * w->row_bytes, 0)) return -1;
    if (w->kind == CK_W_NVFP4 && arena_resident(w->scale, (size_t)w->rows * (size_t)(w->cols / 16), 0)) return -1;
    return 0;
}

// Makes every byte of the mapped checkpoint that the model's matrices read resident now, so a
// forward pass after boot takes no page fault on it. Only those bytes: tensors no matrix reads
// (mtp.*, the checkpoint's own experts once a plane file replaced them: most of Qwen3.6's 21 GB)
// stay on disk. Clean file pages: the kernel may still drop them under memory pressure and read
// them again on use. Returns -1 with e set when the kernel refuses.
static int ck_resident(const ck_model *m, moet_err *e) {
    const ck_config *c = &m->cfg;
    int rc = ck_mat_resident(&m->embed) | ck_mat_resident(&m->final_norm) | ck_mat_resident(&m->lm_head);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const ck_layer *L = &m->layers[l];
        const ck_mat *mats[] = {&L->in_norm, &L->post_norm, &L->q, &L->k, &L->v, &L->o, &L->q_norm, &L->k_norm,
                                &L->qkv, &L->z, &L->b, &L->a, &L->conv, &L->A_log, &L->dt_bias, &L->gnorm, &L->out,
                                &L->router, &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_gate_w};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) rc |= ck_mat_resident(mats[i]);
        for (int x = 0; x < c->n_experts; x++)
            rc |= ck_mat_resident(&L->gate[x]) | ck_mat_resident(&L->up[x]) | ck_mat_resident(&L->down[x]);
    }
    return rc ? err_set(e, "%s: cannot make the weights resident: %s", m->dir, strerror(errno)) : 0;
}

// Routed expert x of layer l in float64, exactly as stored: w13 [2I, H] (gate_proj rows, then
// up_proj rows) and w2 [H, I]. This is the quantizer's input (PLANES.md §2 step 1).
static void ck_expert_f64(const ck_model *m, int l, int x, double *w13, double *w2) {
    const ck_config *c = &m->cfg;
    const ck_layer *L = &m->layers[l];
    int I = c->inter, H = c->hidden;
    for (int r = 0; r < I; r++) {
        ck_row_f64(&L->gate[x], r, w13 + (size_t)r * H);
        ck_row_f64(&L->up[x], r, w13 + (size_t)(I + r) * H);
    }
    for (int r = 0; r < H; r++) ck_row_f64(&L->down[x], r, w2 + (size_t)r * I);
}

// ---- where a checkpoint lives and what it is called -------------------------------------------

// A Hugging Face cache snapshot directory ".../models--ORG--NAME/snapshots/REV" names its repo
// and revision. Returns 1 and fills repo ("ORG/NAME") and rev when dir is one, else 0.
static int ck_hf_snapshot(const char *dir, char *repo, size_t repo_cap, char *rev, size_t rev_cap) {
    char p[MOET_MAX_PATH];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (attempt == 0) snprintf(p, sizeof p, "%s", dir);
        else if (!realpath(dir, p)) return 0;
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/') p[--n] = 0;
        char *c3 = strrchr(p, '/');                 // "/REV"
        if (!c3) continue;
        *c3 = 0;
        char *c2 = strrchr(p, '/');                 // "/snapshots"
        if (!c2 || strcmp(c2 + 1, "snapshots")) continue;
        *c2 = 0;
        char *c1 = strrchr(p, '/');                 // "/models--ORG--NAME"
        const char *m = c1 ? c1 + 1 : p;
        if (strncmp(m, "models--", 8) || !m[8] || !c3[1]) continue;
        const char *name = m + 8;
        const char *sep = strstr(name, "--");      // Hub names cannot contain "--": the first one is the "/"
        if (sep) snprintf(repo, repo_cap, "%.*s/%s", (int)(sep - name), name, sep + 2);
        else snprintf(repo, repo_cap, "%s", name);
        snprintf(rev, rev_cap, "%s", c3 + 1);
        return 1;
    }
    return 0;
}

// dir + "/" + file into out[cap]; -1 when it does not fit.
static int ck_path(char *out, size_t cap, const char *dir, const char *file) {
    size_t a = strlen(dir), b = strlen(file);
    if (a + 1 + b + 1 > cap) return -1;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, file, b + 1);
    return 0;
}

// The "model" of the answers when --served-model-name is not given: ORG/NAME for a Hugging Face
// cache snapshot (…/models--ORG--NAME/snapshots/REV, whose last component is only the revision),
// else the directory's own name — never the path as typed, which would put a local path in
// every answer ("dir/" and "a/b/." name "dir" and "b").
static void ck_model_name(const char *dir, char *out, size_t cap) {
    char repo[256], rev[256];
    if (ck_hf_snapshot(dir, repo, sizeof repo, rev, sizeof rev)) {
        snprintf(out, cap, "%s", repo);
        return;
    }
    char p[MOET_MAX_PATH];
    snprintf(p, sizeof p, "%s", dir);
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    const char *b = strrchr(p, '/');
    b = b && b[1] ? b + 1 : p;
    if ((!strcmp(b, ".") || !strcmp(b, "..")) && realpath(dir, p)) {   // the name of what "." is
        b = strrchr(p, '/');
        b = b && b[1] ? b + 1 : p;
    }
    snprintf(out, cap, "%s", b);
}

// ---- generation_config.json: sampling defaults and stop ids ---------------------------------

// What the checkpoint's generation_config.json recommends; without the file: temperature 1,
// top_p 1, top_k 0 (format/PROTOCOL.md), no max_new_tokens, stop on the chat end tokens.
typedef struct {
    float temperature;          // 0: greedy (also for "do_sample": false)
    int top_k;                  // 0: all
    float top_p, min_p, repetition_penalty, presence_penalty;
    int max_new_tokens;         // 0: not given
    int n_eos;
    int32_t eos[MOET_MAX_EOS_IDS];   // stop token ids (eos_token_id, else <|im_end|> / <|endoftext|>)
} ck_gen;

static int ck_gen_config(const char *dir, const tok *t, ck_gen *c, moet_err *e) {
    char path[MOET_MAX_PATH];
    memset(c, 0, sizeof *c);
    c->temperature = c->top_p = c->repetition_penalty = 1.0f;
    if (ck_path(path, sizeof path, dir, "generation_config.json")) return err_set(e, "%s: path too long", dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        js_doc doc;
        if (js_load_file(&doc, path, MOET_MAX_CONFIG_BYTES, e)) return -1;
        const js_node *root = js_root(&doc), *v;
        int rc = -1;
        if (!root || root->type != JS_OBJ) { err_set(e, "%s: expected a JSON object", path); goto out; }
        double x;
        int64_t k;
        if ((v = js_get(&doc, root, "temperature")) && js_num(v, &x) == 0 && x >= 0) c->temperature = (float)x;
        if ((v = js_get(&doc, root, "top_p")) && js_num(v, &x) == 0 && x > 0 && x <= 1) c->top_p = (float)x;
        if ((v = js_get(&doc, root, "top_k")) && js_int(v, &k) == 0 && k >= 0 && k <= INT32_MAX) c->top_k = (int)k;
        if ((v = js_get(&doc, root, "min_p")) && js_num(v, &x) == 0 && x >= 0 && x <= 1) c->min_p = (float)x;
        if ((v = js_get(&doc, root, "repetition_penalty")) && js_num(v, &x) == 0 && x > 0) c->repetition_penalty = (float)x;
        if ((v = js_get(&doc, root, "presence_penalty")) && js_num(v, &x) == 0 && x >= -2 && x <= 2) c->presence_penalty = (float)x;
        // do_sample false means greedy decoding (transformers' GenerationConfig)
        if ((v = js_get(&doc, root, "do_sample")) && v->type == JS_FALSE) c->temperature = 0;
        if ((v = js_get(&doc, root, "max_new_tokens")) && js_int(v, &k) == 0 && k >= 1 && k <= INT32_MAX) c->max_new_tokens = (int)k;
        v = js_get(&doc, root, "eos_token_id");
        if (v && v->type == JS_NUM) {
            if (js_int(v, &k) || k < 0 || k >= t->n_ids) { err_set(e, "%s: eos_token_id is not a token id", path); goto out; }
            c->eos[c->n_eos++] = (int32_t)k;
        } else if (v && v->type == JS_ARR) {
            const js_node *x1 = js_first(v);
            for (uint32_t i = 0; i < v->len; i++, x1 = js_next(&doc, x1)) {
                if (js_int(x1, &k) || k < 0 || k >= t->n_ids) { err_set(e, "%s: eos_token_id[%u] is not a token id", path, i); goto out; }
                if (c->n_eos == MOET_MAX_EOS_IDS) { err_set(e, "%s: more than %d eos_token_id entries", path, MOET_MAX_EOS_IDS); goto out; }
                c->eos[c->n_eos++] = (int32_t)k;
            }
        } else if (v && v->type != JS_NULL) {
            err_set(e, "%s: eos_token_id: expected an integer or a list, got %s", path, js_type_name(v));
            goto out;
        }
        rc = 0;
    out:
        js_free_doc(&doc);
        if (rc) return -1;
    }
    if (c->n_eos == 0) {
        const char *names[] = {"<|im_end|>", "<|endoftext|>"};
        for (int i = 0; i < 2; i++) {
            int32_t id = tok_find(t, names[i], strlen(names[i]));
            if (id >= 0) c->eos[c->n_eos++] = id;
        }
    }
    return 0;
}

