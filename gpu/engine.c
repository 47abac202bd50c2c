// gpu/engine.c — the device forward pass: arenas planned at boot, dense weights uploaded in their
// stored precision, the routed experts resident (plane slot pool or checkpoint formats), a
// paged KV cache, per-slot GDN state, and one batched step as a fixed sequence of kernel
// launches on the compute stream.
//
// The math is the reference forward's (ref_forward in moet.c), op for op; each kernel's CPU
// twin is named in its sass/ header. Activations are fp32 (arena/DESIGN.md §3: fp32 accumulation,
// norms and state; the weights, which are what decode reads, stay in their stored precision and
// are decoded in registers).
//
// Dimension letters: T tokens of the step (≤ Tm = max_tokens), H hidden, E experts, K top-k,
// I expert width, SI shared expert width, V vocab, n rows (sequences) of the step.

typedef struct {
    gpu_mat in_norm, post_norm;
    gpu_mat q, k, v, o, q_norm, k_norm;                 // gated attention
    gpu_mat qkv, z, b, a, conv, A_log, dt_bias, gnorm, out;   // Gated DeltaNet
    gpu_mat router, sh_gate, sh_up, sh_down, sh_gate_w;
    CUdeviceptr experts;                                // [E, 3] gpu_mat: gate, up, down of each routed expert
} gpu_layer;

typedef struct {
    int max_seqs, max_len, max_tokens;   // slots, tokens per sequence, tokens per step
    int kv_dtype;                        // GPU_KV_*
    size_t host_margin;                  // bytes of the host's MemAvailable a GPU sharing it leaves alone
    int no_graphs;                       // 1: every step's kernels launched one by one (moet bench --cuda-graphs off)
    int mtp;                             // 1: the checkpoint's MTP head on the device too (gpu_mtp_rows)
    int act_bf16;                        // 1: the products read one bf16 part of their inputs (gpu_kernels.parts 1: sass/all_bf.cu);
                                         // −1 (auto): 1 unless kv_dtype is f32 or the routed experts stay on the f32 kernels
} gpu_opts;

// Room for one graph's nodes: the kernels of a layer (13 on the fast paths; the fallbacks of
// gpu_linear_n and gpu_moe_layer a few more), and the step's head and tail as one more layer.
#define GPU_GRAPH_LAYER_NODES 24

// A decode step as a CUDA graph (gpu_graphs_capture): the kernels of a step of n rows of one
// token each, captured at boot and replayed by one launch. Such steps differ only in their
// metadata (device buffers the kernels read: ids, positions, slots, block tables) and in the
// chunks split attention covers, the grid.z of its kernel: set again on the executable graph's
// attention nodes when the step's deepest token enters another chunk (gpu_graph_launch).
typedef struct {
    CUgraph graph;                       // kept: its kernel nodes own the argument copies att_p points at
    CUgraphExec exec;
    int nz;                              // the attention nodes' grid.z now (chunks of GPU_ATT_CHUNK)
    int n_att;                           // split-attention nodes (one per attention layer, or none)
    CUgraphNode *att;                    // [n_att]
    gpu_kernel_node *att_p;              // [n_att] their parameters as captured
} gpu_graph;

typedef struct {
    gpu_device dev;
    gpu_kernels k;
    const ck_model *m;
    gpu_opts o;
    CUstream compute, copy;
    // arenas (arena/DESIGN.md §2.2)
    arena weights, pool, kv, state, act, pinned, host;
    gpu_layer *layers;               // [L] host copies of the descriptors
    gpu_mat embed, final_norm, lm_head;
    CUdeviceptr inv_freq;            // [rot / 2] f32
    // expert pool: one slot per (layer, expert) of the plane file, or NULL (checkpoint experts);
    // with --expert-cache-gb fewer places than slots, filled per layer (gpu/cache.c)
    uint64_t slot_stride, n_slots;
    int cached;                      // the pool is the expert cache's
    int n_cache_layers;              // the plane file's layers
    gpu_cache cache;
    int step_failed;                 // a fetch of this step failed: nothing more is launched (step_err says why)
    // the MoE layer's combine left to the norm after it (gpu_moe_layer, gpu_norm: k_moe_add_rmsnorm
    // makes y in place), and a decode step's GDN output norm folded into the rule (gpu_gdn_layer:
    // k_gdn_rule_norm): a launch fewer a layer each, the same bits; no_fold: neither, the kernels
    // one by one as before (tests compare the two)
    int comb_pending, no_fold;
    // the FP8 products of prompts' full pieces in chain order (k_mm_c; sass/mm_c.cu says why the bits hold): mmc where the
    // image has it (k.mm_c, one part; the tests turn it off to compare), this step's pieces and the other tokens
    // (gpu_step_meta_at: GM_MMC_PIECES, GM_MMC_TAIL), mmc_live while the layers' products run (gpu_step_kernels); those
    // other tokens' inputs [mmc_tail_max][mm_width] (one bf16 part) and outputs [mmc_tail_max][mmc_rows] gathered and
    // scattered there
    int mmc, mmc_live, mmc_np, mmc_nt, mmc_tail_max;
    size_t mmc_rows;
    CUdeviceptr xs_t, y_t;
    moet_err step_err;
    // KV cache: pages of GPU_KV_PAGE positions, one page id per (slot, block) for every layer
    size_t n_pages, page_bytes_all;  // pages; bytes of one page over all attention layers (K and V)
    int32_t *page_ref;               // [n_pages] holders of each page: the sequence that took it, the prefix blocks that keep it
    int bt_stride;                   // blocks per sequence = ceil(max_len / page)
    CUdeviceptr kc, vc;              // [n_full, n_pages, page, kvd]
    CUdeviceptr ks, vs;              // fp8 only: [n_full, n_pages, page, kvh] f32 scales (sass/kv.cuh), else 0
    CUdeviceptr bt;                  // [max_seqs, bt_stride] int32
    int32_t *bt_host;                // [max_seqs, bt_stride]
    int32_t *free_pages;             // stack of free page ids
    size_t n_free;
    int *seq_pages;                  // [max_seqs] pages held
    int *pos;                        // [max_seqs] tokens in each sequence
    int chunk_align;                 // GPU_GDN_C where k_gdn_chunk runs (engine_backend.chunk_align), else 1
    int pieces;                      // k_gdn_chunk's pieces of this step's rows_many (gpu_step_meta_at)
    CUdeviceptr gdn_tm;              // k_gdn_prep's T, M and gates of every piece: [gpu_gdn_pieces_max, nv, GPU_GDN_TM] f32 (0 without k_gdn_chunk)
    // GDN state per slot: conv windows [n_gdn, Kc − 1, cd] and S [n_gdn, nv, dk, dv], f32
    CUdeviceptr win, ssm;
    size_t win_slot, ssm_slot;       // floats per slot
    int *kind_index;                 // [L] index among attention or GDN layers
    int n_kv;                        // attention layers with KV pages: the full-attention layers, and the MTP head's (gpu_opts.mtp)
    // the MTP head (gpu_opts.mtp; sass/MODEL.md §6): its weights (fc as its two halves, the
    // normed embedding's columns and the normed hidden state's), its layer's KV at kind index
    // n_full, and per slot the head's rows so far (the next row's position in its cache)
    gpu_layer mtp_layer;
    gpu_mat mtp_norm_emb, mtp_norm_hid, mtp_fc_emb, mtp_fc_hid, mtp_norm;
    int *mtp_pos;                    // [max_seqs]
    size_t mtp_bytes;                // the head's weights (not in dense_bytes: a decode step without drafts reads none)
    // speculation (gpu/backend.c): the main model's hidden states of a row's tokens after its final
    // norm (the head's input h), each slot's pending row (a prompt chunk's last token, whose
    // successor comes with the next chunk), one row's scratch; the GDN states and conv windows after
    // each token of a verification but its last (rows are verified one at a time: keep_hist), for a
    // rejection past it; rule_rows: this step's rows all take the recurrent GDN kernel whatever
    // their length (a verification's tokens give the bits of single decode steps)
    CUdeviceptr mtp_h, mtp_pend, mtp_tmp;   // [Tm, H], [max_seqs, H], [H]
    CUdeviceptr hist_win, hist_ssm;         // [MOET_MAX_SPEC, win_slot], [MOET_MAX_SPEC, ssm_slot] f32
    int rule_rows, keep_hist;
    // prefix blocks (engine_backend.save): the GDN state of a sequence after a multiple of
    // pfx_block tokens copied on the device, the KV pages of the block's positions shared by
    // reference count (page_ref) with the sequence that wrote them and every one restored from it
    int pfx_block, pfx_blocks;       // tokens per block, blocks (0: none kept)
    int pfx_pages;                   // KV pages per block: pfx_block / GPU_KV_PAGE (0 without attention layers)
    CUdeviceptr pfx_win, pfx_ssm;    // [pfx_blocks, win_slot], [pfx_blocks, ssm_slot] f32
    int32_t *pfx_page;               // [pfx_blocks, pfx_pages] the pages each block keeps
    int *pfx_end;                    // [pfx_blocks] the position each block's state is after (0: free)
    // activations (Tm rows)
    CUdeviceptr x, xn, y, proj, kk, vv, core, zz, bb, aa, rl, sel, selw, eh, ye, sg, su, sh, sgate, logits;
    CUdeviceptr grl, gsel, gselw;    // the expert cache's guess: the next layer's router on this layer's input [Tm, E], [Tm, K] ×2
    CUdeviceptr ids;                 // int32 [GPU_ARGMAX_INTS(Tm)] greedy rows' tokens first (k_argmax), copied to ids_host
    CUdeviceptr samp;                // gpu_samp_row [Tm] the picked rows' parameters (k_sample), from samp_host
    CUdeviceptr samp_pen;            // int2 [GPU_SAMPLE_PEN] their penalized tokens (id, times generated), from samp_pen_host
    CUdeviceptr samp_lp;             // gpu_samp_lp [Tm] their logprobs' parts, copied to samp_lp_host
    // the tensor-core products' inputs (sass/mm.cu, sass/moe_mm.cu): the bf16 parts of a product's activations
    // [GPU_MM_SPLITS][T][K ≤ mm_width], of the experts' SiLU·up [GPU_MM_SPLITS][T·topk][I], and the
    // step's pairs grouped by expert (int32, gpu_moe_map_ints)
    CUdeviceptr xs, hs, moe_map;
    // the experts' chain path (moe_chain: sass/moe_r.cu; sass/moe_c.cu says why the bits hold; where k_mm_c runs and
    // the experts are 2-bit planes of widths its tiles take): a step's pairs apart by their token's side (sel_c: the
    // full pieces', sel_n: the others' — int [Tm·topk] each, k_moe_split) and the pieces' pairs grouped by expert
    // (moe_map_c, gpu_moe_map_ints)
    int moe_chain;
    CUdeviceptr sel_c, sel_n, moe_map_c;
    CUdeviceptr shs;                 // the shared expert's SiLU·up as bf16 parts [GPU_MM_SPLITS][T][shared_inter]
    size_t mm_width;
    // attention's partial states for steps of up to att_split_T tokens (gpu_k_attn_split):
    // [att_split_T, nh, att_nc, hd + 2] f32, att_nc = ceil(max_len / GPU_ATT_CHUNK); 0 without
    CUdeviceptr att_part;
    int att_split_T, att_nc;
    int reach;                       // this step's deepest token: its position + 1
    int step_rows;                   // this step's sequences (gpu_fa_w_take: their tokens on the average)
    // decode graphs: graphs[n] replays a step of n rows of one token, 1 ≤ n ≤ graph_rows
    int graph_rows;                  // 0: none (gpu_opts.no_graphs)
    gpu_graph *graphs;               // [graph_rows + 1]
    CUgraphNode *graph_att;          // [graph_rows + 1, n_full] the graphs' attention nodes
    gpu_kernel_node *graph_att_p;    // [graph_rows + 1, n_full]
    CUgraphNode *graph_nodes;        // [graph_cap] one graph's nodes while they are searched
    size_t graph_cap, graph_size;    // nodes room, nodes of the largest graph
    double graph_s;                  // seconds capturing them at boot
    uint64_t graph_steps;            // steps that replayed a graph
    int moe_mm;                      // the routed experts take k_moe_up / k_moe_dn (every expert matrix gpu_mm_ok)
    CUdeviceptr meta;                // step metadata (below), copied from meta_host once per step
    int32_t *meta_host;              // pinned
    float *logits_host;              // pinned [Tm, V]
    int32_t *ids_host;               // pinned [Tm]
    gpu_samp_row *samp_host;         // pinned [Tm]
    int32_t *samp_pen_host;          // pinned [GPU_SAMPLE_PEN][2]
    gpu_samp_lp *samp_lp_host;       // pinned [Tm]
    size_t meta_ints;
    double dense_bytes;              // weight bytes every decode step reads: all but the embedding and the routed experts
    double expert_bytes;             // bytes of one routed expert (gate, up, down with scales)
    size_t weight_bytes, pool_bytes;
} gpu_engine;

// Step metadata, ints, in this order (offsets in units of Tm): ids, tok_slot, tok_pos, out_rows,
// mmc_pieces (the first token of each full piece: gpu_step_meta_at), mmc_tail (the other tokens)
// ([Tm] each), then row_slot, row_start, row_len, row_pos (the row's first absolute position),
// rows_one (the rows of one token), rows_many (the others), piece0 (k_gdn_chunk's pieces before
// each of rows_many: gpu_gdn_pieces) ([max_seqs] each).
enum { GM_IDS, GM_TOK_SLOT, GM_TOK_POS, GM_OUT_ROWS, GM_MMC_PIECES, GM_MMC_TAIL, GM_ROWS };
static CUdeviceptr gpu_meta(const gpu_engine *g, int which) {
    if (which < GM_ROWS) return g->meta + (CUdeviceptr)which * g->o.max_tokens * 4;
    return g->meta + (CUdeviceptr)GM_ROWS * g->o.max_tokens * 4 + (CUdeviceptr)(which - GM_ROWS) * g->o.max_seqs * 4;
}
#define GM_ROW_SLOT (GM_ROWS + 0)
#define GM_ROW_START (GM_ROWS + 1)
#define GM_ROW_LEN (GM_ROWS + 2)
#define GM_ROW_POS (GM_ROWS + 3)
#define GM_ROWS_ONE (GM_ROWS + 4)
#define GM_ROWS_MANY (GM_ROWS + 5)
#define GM_ROW_PIECE0 (GM_ROWS + 6)
#define GM_ROW_ARRAYS 7

static size_t gpu_kv_elem(int kv_dtype) { return kv_dtype == GPU_KV_F32 ? 4 : kv_dtype == GPU_KV_BF16 ? 2 : 1; }
static const char *const gpu_kv_names[] = {"f32", "bf16", "fp8"};

// ---- weights -------------------------------------------------------------------------------

// Bytes of a stored matrix's values and of its scales.
static size_t gpu_mat_bytes(const ck_mat *m) {
    return m->kind == CK_W_PLANES ? (size_t)m->rows * m->cols / 4 : (size_t)m->rows * m->row_bytes;
}
static size_t gpu_scale_bytes(const ck_mat *m) {
    return m->kind == CK_W_NVFP4 ? (size_t)m->rows * (m->cols / 16) : m->kind == CK_W_PLANES ? (size_t)m->rows * m->cols / 32 : 0;
}

// gpu_mm_ok (gpu/launch.c) of the matrix gpu_put makes of m (its rows 256-byte aligned).
static int gpu_mm_ok_ck(const ck_mat *m) {
    gpu_mat d = gpu_mat_desc(m, 256, 0);
    return gpu_mm_ok(&d);
}

// FP8 weights go up with each 4-byte group's codes in the device's order c0 c2 c1 c3
// (sass/gpu_abi.h: GPU_FP8_SLOT), through this staging buffer a piece at a time (boot only).
#define GPU_FP8_STAGE (4u << 20)
static uint32_t gpu_fp8_stage[GPU_FP8_STAGE / 4];

// A group's four codes c0 c1 c2 c3 (low byte first) in the device's order: code i at byte GPU_FP8_SLOT(i).
static uint32_t gpu_fp8_order(uint32_t v) { return (v & 0xff0000ffu) | ((v & 0x0000ff00u) << 8) | ((v & 0x00ff0000u) >> 8); }

static void gpu_put_fp8(CUdeviceptr dst, const uint8_t *src, size_t n) {
    MOET_ASSERT((n & 3) == 0, "an FP8 matrix of %zu bytes (rows of a multiple of 16 codes)", n);
    for (size_t at = 0; at < n; at += GPU_FP8_STAGE) {
        const size_t k = n - at < GPU_FP8_STAGE ? n - at : GPU_FP8_STAGE;
        for (size_t i = 0; i < k / 4; i++) {
            uint32_t v;
            memcpy(&v, src + at + 4 * i, 4);   // c0 c1 c2 c3, low byte first
            gpu_fp8_stage[i] = gpu_fp8_order(v);
        }
        CU_CHECK(cu.cuMemcpyHtoD(dst + at, gpu_fp8_stage, k));
    }
}

// Carves room for one matrix in the weight arena and, on the real pass, copies it there (FP8 in
// the device's order: gpu_put_fp8).
static gpu_mat gpu_put(arena *a, const ck_mat *m, const char *what) {
    gpu_mat d;
    memset(&d, 0, sizeof d);
    uint8_t *w = arena_take(a, gpu_mat_bytes(m), 256, what);
    uint8_t *s = gpu_scale_bytes(m) ? arena_take(a, gpu_scale_bytes(m), 256, what) : NULL;
    if (!a->base) return d;
    if (m->kind == CK_W_FP8) gpu_put_fp8((CUdeviceptr)(uintptr_t)w, m->w, gpu_mat_bytes(m));
    else CU_CHECK(cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)w, m->w, gpu_mat_bytes(m)));
    if (s) CU_CHECK(cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)s, m->scale, gpu_scale_bytes(m)));
    return gpu_mat_desc(m, (uintptr_t)w, (uintptr_t)s);
}

// Whether k_linear / row_dot can take this matrix (sass/common.cuh's requirements).
static int gpu_mat_check(const ck_mat *m, const char *what, moet_err *e) {
    int need = m->kind == CK_W_F32 ? 4 : m->kind == CK_W_BF16 || m->kind == CK_W_F16 ? 8 : 16;
    if (m->kind == CK_W_PLANES) need = 64;
    if (m->cols % need || m->row_bytes % 16 || (m->kind == CK_W_PLANES && m->rows % 16))
        return err_set(e, "%s [%d, %d] (%s): the GPU kernels need in_features divisible by %d", what, m->rows, m->cols,
                       m->kind == CK_W_PLANES ? "planes" : ck_algo_name(m->kind == CK_W_FP8 ? CK_Q_FP8 : m->kind == CK_W_NVFP4 ? CK_Q_NVFP4 : CK_Q_NONE),
                       need);
    // the tensor-core products widen e4m3 by its bits (sass/mm.cuh: mm_fp8x4), which reads the NaN
    // codes 0x7f / 0xff as ±480 where the reference has NaN: no quantizer writes them, refused here
    if (m->kind == CK_W_FP8) {
        size_t n = gpu_mat_bytes(m), bad = n;
        for (size_t i = 0; i < n && bad == n; i += 65536) {   // a plain scan, a branch per 64 KiB
            size_t end = i + 65536 < n ? i + 65536 : n;
            int hit = 0;
            for (size_t j = i; j < end; j++) hit |= (m->w[j] & 0x7f) == 0x7f;
            if (hit)
                for (size_t j = i; j < end && bad == n; j++)
                    if ((m->w[j] & 0x7f) == 0x7f) bad = j;
        }
        if (bad < n)
            return err_set(e, "%s [%d, %d] (fp8): byte %zu of its weights is 0x%02x, e4m3's NaN (row %zu)", what, m->rows, m->cols, bad,
                           m->w[bad], bad / m->row_bytes);
    }
    return 0;
}

// One decoder layer's weights (attn: gated attention, else Gated DeltaNet) into G, its routed
// experts' table (E rows of gate, up, down) and, when experts_here, the experts themselves.
static void gpu_carve_layer(arena *a, const ck_layer *L, int attn, int experts_here, int E, gpu_layer *G) {
    G->in_norm = gpu_put(a, &L->in_norm, "norms");
    G->post_norm = gpu_put(a, &L->post_norm, "norms");
    if (attn) {
        G->q = gpu_put(a, &L->q, "attention");
        G->k = gpu_put(a, &L->k, "attention");
        G->v = gpu_put(a, &L->v, "attention");
        G->o = gpu_put(a, &L->o, "attention");
        G->q_norm = gpu_put(a, &L->q_norm, "attention");
        G->k_norm = gpu_put(a, &L->k_norm, "attention");
    } else {
        G->qkv = gpu_put(a, &L->qkv, "gdn");
        G->z = gpu_put(a, &L->z, "gdn");
        G->b = gpu_put(a, &L->b, "gdn");
        G->a = gpu_put(a, &L->a, "gdn");
        G->conv = gpu_put(a, &L->conv, "gdn");
        G->A_log = gpu_put(a, &L->A_log, "gdn");
        G->dt_bias = gpu_put(a, &L->dt_bias, "gdn");
        G->gnorm = gpu_put(a, &L->gnorm, "gdn");
        G->out = gpu_put(a, &L->out, "gdn");
    }
    G->router = gpu_put(a, &L->router, "router");
    G->sh_gate = gpu_put(a, &L->sh_gate, "shared expert");
    G->sh_up = gpu_put(a, &L->sh_up, "shared expert");
    G->sh_down = gpu_put(a, &L->sh_down, "shared expert");
    G->sh_gate_w = gpu_put(a, &L->sh_gate_w, "shared expert");
    gpu_mat *tab = arena_take(a, sizeof(gpu_mat) * 3 * (size_t)E, 256, "expert table");
    if (a->base) G->experts = (uintptr_t)tab;
    if (experts_here)
        for (int x = 0; x < E; x++) {
            gpu_mat t3[3] = {gpu_put(a, &L->gate[x], "routed experts"), gpu_put(a, &L->up[x], "routed experts"), gpu_put(a, &L->down[x], "routed experts")};
            if (a->base) CU_CHECK(cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)(tab + 3 * x), t3, sizeof t3));
        }
}

// Every dense weight (and the routed experts unless a pool holds them), in model order; then the
// MTP head's (gpu_opts.mtp).
static void gpu_carve_weights(gpu_engine *g, arena *a, int experts_here) {
    const ck_model *m = g->m;
    const ck_config *c = &m->cfg;
    // the routed experts take the tensor-core kernels when every matrix of every expert can
    // (planes always can: rows and columns are multiples of 64) and the tiles divide I and H
    g->moe_mm = c->inter % 32 == 0 && c->hidden % 64 == 0;
    if (experts_here)
        for (int l = 0; l < c->n_layers; l++)
            for (int x = 0; x < c->n_experts; x++) {
                const ck_layer *L = &m->layers[l];
                g->moe_mm &= gpu_mm_ok_ck(&L->gate[x]) && gpu_mm_ok_ck(&L->up[x]) && gpu_mm_ok_ck(&L->down[x]) && L->gate[x].kind == L->up[x].kind;
            }
    for (int x = 0; g->o.mtp && x < c->n_experts; x++) {
        const ck_layer *L = &m->mtp.layer;
        g->moe_mm &= gpu_mm_ok_ck(&L->gate[x]) && gpu_mm_ok_ck(&L->up[x]) && gpu_mm_ok_ck(&L->down[x]) && L->gate[x].kind == L->up[x].kind;
    }
    // the kind every routed expert matrix has (the launch shapes of gpu_moe_shape), or -1
    g->k.moe_kind = experts_here ? m->layers[0].gate[0].kind : GPU_W_PLANES;
    for (int l = 0; experts_here && l < c->n_layers; l++)
        for (int x = 0; x < c->n_experts; x++) {
            const ck_layer *L = &m->layers[l];
            if (L->gate[x].kind != g->k.moe_kind || L->up[x].kind != g->k.moe_kind || L->down[x].kind != g->k.moe_kind) g->k.moe_kind = -1;
        }
    g->embed = gpu_put(a, &m->embed, "embedding");
    g->final_norm = gpu_put(a, &m->final_norm, "final norm");
    g->lm_head = gpu_put(a, &m->lm_head, "lm_head");
    float *inv = arena_take(a, sizeof(float) * (size_t)(c->rot_dim / 2 + 1), 256, "rotary frequencies");
    if (a->base) {
        float tmp[MOET_MAX_HEAD_DIM / 2 + 1];
        for (int i = 0; i < c->rot_dim / 2; i++) tmp[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->rot_dim);
        CU_CHECK(cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)inv, tmp, sizeof(float) * (size_t)(c->rot_dim / 2 + 1)));
        g->inv_freq = (uintptr_t)inv;
    }
    for (int l = 0; l < c->n_layers; l++)
        gpu_carve_layer(a, &m->layers[l], c->full_attn[l], experts_here, c->n_experts, a->base ? &g->layers[l] : &(gpu_layer){0});
    if (g->o.mtp) {   // the MTP head: BF16 as released, its experts always from the checkpoint
        const ck_mtp *M = &m->mtp;
        size_t before = a->used;
        g->mtp_norm_emb = gpu_put(a, &M->norm_emb, "mtp head");
        g->mtp_norm_hid = gpu_put(a, &M->norm_hid, "mtp head");
        gpu_mat fc = gpu_put(a, &M->fc, "mtp head");   // [H, 2H]: the embedding's columns first
        g->mtp_fc_emb = fc, g->mtp_fc_hid = fc;
        g->mtp_fc_emb.cols = g->mtp_fc_hid.cols = c->hidden;
        g->mtp_fc_hid.w += (unsigned long long)c->hidden * (M->fc.kind == CK_W_F32 ? 4 : 2);
        g->mtp_norm = gpu_put(a, &M->norm, "mtp head");
        gpu_carve_layer(a, &M->layer, 1, 1, c->n_experts, &g->mtp_layer);
        g->mtp_bytes = a->used - before;
    }
}

// ---- the plan -------------------------------------------------------------------------------

// count floats of device memory carved from a, 256-byte aligned: the device address (0 while
// measuring), never dereferenced on the host.
static CUdeviceptr gpu_take_f32(arena *a, size_t count, const char *what) {
    return (CUdeviceptr)(uintptr_t)arena_take(a, sizeof(float) * count, 256, what);
}

static void gpu_carve_act(gpu_engine *g, arena *a) {
    const ck_config *c = &g->m->cfg;
    size_t Tm = (size_t)g->o.max_tokens, H = (size_t)c->hidden, K = (size_t)c->topk;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t projw = 2 * qd > (size_t)c->conv_dim ? 2 * qd : (size_t)c->conv_dim;
    size_t corew = qd > (size_t)c->value_dim ? qd : (size_t)c->value_dim;
    g->x = gpu_take_f32(a, Tm * H, "residual");
    g->xn = gpu_take_f32(a, Tm * H, "normed input");
    g->y = gpu_take_f32(a, Tm * H, "sublayer output");
    g->proj = gpu_take_f32(a, Tm * projw, "projections");
    g->kk = gpu_take_f32(a, Tm * kvd, "keys");
    g->vv = gpu_take_f32(a, Tm * kvd, "values");
    g->core = gpu_take_f32(a, Tm * corew, "mixer output");
    g->zz = gpu_take_f32(a, Tm * c->value_dim, "GDN gate");
    g->bb = gpu_take_f32(a, Tm * c->lv_heads, "GDN beta");
    g->aa = gpu_take_f32(a, Tm * c->lv_heads, "GDN decay");
    g->rl = gpu_take_f32(a, Tm * c->n_experts, "router logits");
    g->sel = gpu_take_f32(a, Tm * K, "routing");
    g->selw = gpu_take_f32(a, Tm * K, "routing weights");
    g->grl = g->cached ? gpu_take_f32(a, Tm * c->n_experts, "expert cache guess logits") : 0;
    g->gsel = g->cached ? gpu_take_f32(a, Tm * K, "expert cache guesses") : 0;
    g->gselw = g->cached ? gpu_take_f32(a, Tm * K, "expert cache guess weights") : 0;
    // the experts' SiLU·up: f32 for k_moe_gate_up / k_moe_down, bf16 parts (below) for the tensor cores
    g->eh = g->moe_mm ? 0 : gpu_take_f32(a, Tm * K * c->inter, "expert activations");
    g->ye = gpu_take_f32(a, Tm * K * H, "expert outputs");
    g->sg = gpu_take_f32(a, Tm * c->shared_inter, "shared gate");
    g->su = gpu_take_f32(a, Tm * c->shared_inter, "shared up");
    g->sh = gpu_take_f32(a, Tm * H, "shared output");
    g->sgate = gpu_take_f32(a, Tm, "shared expert gate");
    g->logits = gpu_take_f32(a, Tm * c->vocab, "logits");
    g->ids = gpu_take_f32(a, GPU_ARGMAX_INTS(Tm), "greedy tokens");   // and k_argmax's slices (zeroed at boot)
    g->samp = gpu_take_f32(a, Tm * sizeof(gpu_samp_row) / sizeof(float), "sampling rows");   // k_sample's rows (gpu_samp_row)
    g->samp_pen = gpu_take_f32(a, 2 * (size_t)GPU_SAMPLE_PEN, "sampling penalties");
    g->samp_lp = gpu_take_f32(a, Tm * sizeof(gpu_samp_lp) / sizeof(float), "sampling logprobs");
    g->mtp_h = g->o.mtp ? gpu_take_f32(a, Tm * H, "MTP head inputs") : 0;
    g->mtp_pend = g->o.mtp ? gpu_take_f32(a, (size_t)g->o.max_seqs * H, "MTP head pending rows") : 0;
    g->mtp_tmp = g->o.mtp ? gpu_take_f32(a, H, "MTP head draft row") : 0;
    g->meta = gpu_take_f32(a, (size_t)GM_ROWS * Tm + GM_ROW_ARRAYS * (size_t)g->o.max_seqs, "step metadata");
    g->gdn_tm = g->chunk_align == GPU_GDN_C ? gpu_take_f32(a, (size_t)gpu_gdn_pieces_max((int)Tm, g->o.max_seqs) * c->lv_heads * GPU_GDN_TM,
                                                               "GDN pieces' T, M and gates")
                                            : 0;
    // the widest input of a product: H, the attention output (qd), the GDN output (value_dim),
    // the shared expert's (shared_inter)
    size_t mw = H > corew ? H : corew;
    if ((size_t)c->shared_inter > mw) mw = (size_t)c->shared_inter;
    g->mm_width = mw;
    g->xs = (CUdeviceptr)(uintptr_t)arena_take(a, 2 * GPU_MM_SPLITS * Tm * mw, 256, "product inputs (bf16 parts)");
    g->shs = (CUdeviceptr)(uintptr_t)arena_take(a, 2 * GPU_MM_SPLITS * Tm * (size_t)c->shared_inter, 256, "shared expert activations (bf16 parts)");
    // k_mm_c's other tokens: at most 63 before a row's first full piece and 63 after its last (126 where it has none)
    g->mmc = g->k.mm_c && g->k.parts == 1;
    g->mmc_tail_max = (int)(Tm < (size_t)126 * g->o.max_seqs ? Tm : (size_t)126 * g->o.max_seqs);
    size_t mr = (size_t)c->conv_dim + c->value_dim, ma = 2 * qd + 2 * kvd;   // a set's rows: GDN in-projections, attention q|k|v
    mr = mr > ma ? mr : ma;
    mr = mr > H ? mr : H;
    g->mmc_rows = mr;
    g->xs_t = g->mmc ? (CUdeviceptr)(uintptr_t)arena_take(a, 2 * (size_t)g->mmc_tail_max * mw, 256, "chain products' other tokens' inputs") : 0;
    g->y_t = g->mmc ? gpu_take_f32(a, (size_t)g->mmc_tail_max * mr, "chain products' other tokens' outputs") : 0;
    if (g->moe_mm) {
        g->hs = (CUdeviceptr)(uintptr_t)arena_take(a, 2 * GPU_MM_SPLITS * Tm * K * (size_t)c->inter, 256, "expert activations (bf16 parts)");
        g->moe_map = (CUdeviceptr)(uintptr_t)arena_take(a, 4 * gpu_moe_map_ints((long long)Tm * K, c->n_experts), 256, "experts' pairs");
    } else {
        g->hs = g->moe_map = 0;
    }
    g->moe_chain = g->mmc && g->moe_mm && g->k.moe_w && g->k.moe_kind == GPU_W_PLANES && c->inter % 128 == 0 && c->hidden % GPU_MOEC_BM == 0 &&
                   gpu_smem_exact(&g->k, K_MOE_UP_R, GPU_MOER_SMEM) && gpu_smem_exact(&g->k, K_MOE_DN_R, GPU_MOER_SMEM);
    g->sel_c = g->moe_chain ? gpu_take_f32(a, Tm * K, "the pieces' routing") : 0;
    g->sel_n = g->moe_chain ? gpu_take_f32(a, Tm * K, "the other tokens' routing") : 0;
    g->moe_map_c = g->moe_chain ? (CUdeviceptr)(uintptr_t)arena_take(a, 4 * gpu_moe_map_ints((long long)Tm * K, c->n_experts), 256, "the pieces' experts' pairs") : 0;
    // decode steps (up to GPU_ATT_SPLIT_T tokens) take attention split over the context's chunks
    g->att_nc = (int)((g->o.max_len + GPU_ATT_CHUNK - 1) / GPU_ATT_CHUNK);
    g->att_split_T = c->n_full ? (int)(Tm < (size_t)g->o.max_seqs ? Tm : (size_t)g->o.max_seqs) : 0;
    if (g->att_split_T > GPU_ATT_SPLIT_T) g->att_split_T = GPU_ATT_SPLIT_T;
    g->att_part = g->att_split_T ? (CUdeviceptr)(uintptr_t)arena_take(a, sizeof(float) * (size_t)g->att_split_T * c->n_heads * g->att_nc * (c->head_dim + 2), 256,
                                                                  "attention's partial states")
                                 : 0;
}

static size_t gpu_kv_page_bytes(const ck_config *c, int kv_dtype);
static void gpu_graphs_capture(gpu_engine *g);

static void gpu_carve_state(gpu_engine *g, arena *a) {
    const ck_config *c = &g->m->cfg;
    g->win_slot = (size_t)c->n_gdn * (c->conv_k - 1) * c->conv_dim;
    g->ssm_slot = (size_t)c->n_gdn * c->lv_heads * c->lk_dim * c->lv_dim;
    uint8_t *w = arena_take(a, sizeof(float) * g->win_slot * g->o.max_seqs + 4, 256, "conv windows");
    uint8_t *s = arena_take(a, sizeof(float) * g->ssm_slot * g->o.max_seqs + 4, 256, "GDN states");
    if (a->base) g->win = (uintptr_t)w, g->ssm = (uintptr_t)s;
    if (g->o.mtp) {   // one slot's state after each token of a verification but its last (gpu/backend.c: speculation)
        uint8_t *sw = arena_take(a, sizeof(float) * g->win_slot * MOET_MAX_SPEC + 4, 256, "conv windows after each verified token");
        uint8_t *ss = arena_take(a, sizeof(float) * g->ssm_slot * MOET_MAX_SPEC + 4, 256, "GDN states after each verified token");
        if (a->base) g->hist_win = (uintptr_t)sw, g->hist_ssm = (uintptr_t)ss;
    }
    if (g->pfx_blocks) {
        uint8_t *pw = arena_take(a, sizeof(float) * g->win_slot * g->pfx_blocks + 4, 256, "prefix conv windows");
        uint8_t *ps = arena_take(a, sizeof(float) * g->ssm_slot * g->pfx_blocks + 4, 256, "prefix GDN states");
        if (a->base) g->pfx_win = (uintptr_t)pw, g->pfx_ssm = (uintptr_t)ps;
    }
}

// Bytes of one page (GPU_KV_PAGE positions) of keys or of values over all attention layers,
// with the fp8 scales.
static size_t gpu_kv_page_bytes_n(int n_kv, const ck_config *c, int kv_dtype) {
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t b = (size_t)n_kv * GPU_KV_PAGE * kvd * gpu_kv_elem(kv_dtype);
    if (kv_dtype == GPU_KV_FP8) b += (size_t)n_kv * GPU_KV_PAGE * c->n_kv_heads * sizeof(float);
    return b;
}
// (the main model's attention layers: without the MTP head's)
static size_t gpu_kv_page_bytes(const ck_config *c, int kv_dtype) { return gpu_kv_page_bytes_n(c->n_full, c, kv_dtype); }

// Bytes one prefix block of `block` tokens takes on the device: the GDN state and conv windows
// of a slot, and the KV pages of its positions (what --prefix-cache-gb is divided by); with the
// MTP head on the device (mtp) a page holds its attention kind too.
static size_t gpu_prefix_bytes(const ck_config *c, int kv_dtype, int block, int mtp) {
    size_t state = sizeof(float) * ((size_t)c->n_gdn * (c->conv_k - 1) * c->conv_dim + (size_t)c->n_gdn * c->lv_heads * c->lk_dim * c->lv_dim);
    return state + (c->n_full ? (size_t)(block / GPU_KV_PAGE) * 2 * gpu_kv_page_bytes_n(c->n_full + (mtp ? 1 : 0), c, kv_dtype) : 0);
}

static void gpu_carve_kv(gpu_engine *g, arena *a) {
    const ck_config *c = &g->m->cfg;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, per = (size_t)g->n_kv * GPU_KV_PAGE * kvd * gpu_kv_elem(g->o.kv_dtype);
    uint8_t *k = arena_take(a, per * g->n_pages + 4, 256, "KV keys");
    uint8_t *v = arena_take(a, per * g->n_pages + 4, 256, "KV values");
    uint8_t *ks = NULL, *vs = NULL;
    if (g->o.kv_dtype == GPU_KV_FP8) {
        size_t sc = (size_t)g->n_kv * GPU_KV_PAGE * c->n_kv_heads * sizeof(float) * g->n_pages + 4;
        ks = arena_take(a, sc, 256, "KV key scales");
        vs = arena_take(a, sc, 256, "KV value scales");
    }
    uint8_t *bt = arena_take(a, sizeof(int32_t) * (size_t)g->o.max_seqs * g->bt_stride, 256, "block table");
    if (a->base) g->kc = (uintptr_t)k, g->vc = (uintptr_t)v, g->ks = (uintptr_t)ks, g->vs = (uintptr_t)vs, g->bt = (uintptr_t)bt;
}

static void gpu_carve_pinned(gpu_engine *g, arena *a) {
    size_t Tm = (size_t)g->o.max_tokens;
    g->meta_ints = (size_t)GM_ROWS * Tm + GM_ROW_ARRAYS * (size_t)g->o.max_seqs;
    g->meta_host = arena_take(a, sizeof(int32_t) * g->meta_ints, 256, "step metadata");
    g->logits_host = arena_take(a, sizeof(float) * Tm * g->m->cfg.vocab, 256, "logits");
    g->ids_host = arena_take(a, sizeof(int32_t) * Tm, 256, "greedy tokens");
    g->samp_host = arena_take(a, sizeof(gpu_samp_row) * Tm, 256, "sampling rows");
    g->samp_pen_host = arena_take(a, 2 * sizeof(int32_t) * GPU_SAMPLE_PEN, 256, "sampling penalties");
    g->samp_lp_host = arena_take(a, sizeof(gpu_samp_lp) * Tm, 256, "sampling logprobs");
    if (g->cached) gpu_cache_carve_pinned(&g->cache, a, Tm, g->m->cfg.topk);
}

static void gpu_carve_host(gpu_engine *g, arena *a) {
    const ck_config *c = &g->m->cfg;
    ARENA_TAKE(a, g->layers, c->n_layers, "layer descriptors");
    ARENA_TAKE(a, g->kind_index, c->n_layers, "layer index");
    ARENA_TAKE(a, g->bt_host, (size_t)g->o.max_seqs * g->bt_stride, "block table");
    ARENA_TAKE(a, g->free_pages, g->n_pages, "free pages");
    ARENA_TAKE(a, g->seq_pages, g->o.max_seqs, "pages per sequence");
    ARENA_TAKE(a, g->pos, g->o.max_seqs, "positions");
    ARENA_TAKE(a, g->mtp_pos, g->o.mtp ? g->o.max_seqs : 0, "MTP head positions");
    ARENA_TAKE(a, g->page_ref, g->n_pages, "page holders");
    ARENA_TAKE(a, g->pfx_page, (size_t)g->pfx_blocks * g->pfx_pages, "prefix block pages");
    ARENA_TAKE(a, g->pfx_end, g->pfx_blocks, "prefix block ends");
    ARENA_TAKE(a, g->graphs, g->graph_rows + 1, "decode graphs");
    ARENA_TAKE(a, g->graph_att, (size_t)(g->graph_rows + 1) * c->n_full, "decode graph attention nodes");
    ARENA_TAKE(a, g->graph_att_p, (size_t)(g->graph_rows + 1) * c->n_full, "decode graph attention parameters");
    ARENA_TAKE(a, g->graph_nodes, g->graph_cap, "decode graph nodes");
    if (g->cached) gpu_cache_carve_host(&g->cache, a);
}

static void gpu_free(gpu_engine *g) {
    if (!g->dev.ctx) return;
    gpu_bind(&g->dev);
    CU_CHECK(cu.cuCtxSynchronize());
    for (int i = 0; i < GPU_PROF_MAX && g->k.ev[i][0]; i++)
        for (int j = 0; j < 2; j++) CU_CHECK(cu.cuEventDestroy(g->k.ev[i][j]));
    for (int n = 1; g->graphs && n <= g->graph_rows; n++) {
        if (g->graphs[n].exec) CU_CHECK(cu.cuGraphExecDestroy(g->graphs[n].exec));
        if (g->graphs[n].graph) CU_CHECK(cu.cuGraphDestroy(g->graphs[n].graph));
    }
    if (g->cached) gpu_cache_close(&g->cache);   // its readers stopped before their buffers go
    arena *as[] = {&g->weights, &g->pool, &g->kv, &g->state, &g->act, &g->pinned, &g->host};
    for (size_t i = 0; i < sizeof as / sizeof as[0]; i++) arena_release(as[i]);
    if (g->compute) CU_CHECK(cu.cuStreamDestroy(g->compute));
    if (g->copy) CU_CHECK(cu.cuStreamDestroy(g->copy));
    if (g->k.mod) CU_CHECK(cu.cuModuleUnload(g->k.mod));
    if (g->k.mod_bf) CU_CHECK(cu.cuModuleUnload(g->k.mod_bf));
    gpu_close(&g->dev);
}

// Prints the plan: bytes per arena, KV capacity in tokens.
static void gpu_print_plan(const gpu_engine *g, FILE *f) {
    const arena *as[] = {&g->weights, &g->pool, &g->kv, &g->state, &g->act, &g->pinned, &g->host};
    fprintf(f, "moet: GPU memory plan:\n");
    for (size_t i = 0; i < sizeof as / sizeof as[0]; i++)
        if (as[i]->cap)
            fprintf(f, "moet:   %-12s %-7s %10.3f GiB\n", as[i]->name, arena_kind_name[as[i]->kind], (double)as[i]->cap / (1u << 30));
    fprintf(f, "moet:   KV cache: %zu pages of %d tokens = %zu tokens (%s), %d sequences of up to %d tokens\n", g->n_pages,
            GPU_KV_PAGE, g->n_pages * GPU_KV_PAGE, gpu_kv_names[g->o.kv_dtype], g->o.max_seqs, g->o.max_len);
    fprintf(f, "moet:   matrix products: inputs as %s\n",
            g->k.parts == 1 ? "their bf16 rounding (--act-dtype bf16, auto's choice on the GPU: one tensor-core product a weight fragment)"
                            : "three bf16 parts (f32, exact up to the order of the additions)");
    if (g->graph_rows)
        fprintf(f, "moet:   decode graphs: steps of 1 to %d rows of one token, %zu kernels each at most, captured in %.2f s\n",
                g->graph_rows, g->graph_size, g->graph_s);
    if (g->pfx_blocks)
        fprintf(f, "moet:   prefix cache: %d blocks of %d tokens, %.1f MiB each (GDN state %.1f MiB + %d KV pages among the above)\n",
                g->pfx_blocks, g->pfx_block, gpu_prefix_bytes(&g->m->cfg, g->o.kv_dtype, g->pfx_block, g->o.mtp) / 1048576.0,
                sizeof(float) * (g->win_slot + g->ssm_slot) / 1048576.0, g->pfx_pages);
}


// MemAvailable of /proc/meminfo in bytes (0 when unknown): on a GPU with unified memory, what can
// be taken without pushing the host into swap or the OOM killer.
static size_t gpu_mem_available(void) {
    char buf[4096];
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    const char *p = strstr(buf, "MemAvailable:");
    unsigned long long kb = 0;
    return p && sscanf(p + 13, "%llu", &kb) == 1 ? (size_t)kb * 1024 : 0;
}

// ---- the plan against the memory there is ----------------------------------------------------
//
// What gpu_init must fit: the fixed arenas (weights, expert pool, state, activations on the
// device; pinned staging and the engine's host arena in host memory) and then as many KV pages as
// every sequence at full length needs, or what is left. On a discrete GPU the device arenas fit
// in the device's free memory. On a GPU that shares the host's memory (GB10: integrated) every
// arena is the same memory, so all of them, pinned staging and the host arena included, must fit
// in the smaller of the device's free memory and the host's MemAvailable less host_margin (what
// the plan leaves the host and its other work); the boot then refuses with what did not fit,
// before anything is allocated. Managed memory is never used.
typedef struct {
    size_t weights, pool, state, act, pinned, host;   // bytes of the fixed arenas
    size_t page_bytes;          // one KV page of every attention layer, keys and values (0: none)
    size_t want_pages;          // every sequence at full length (+ the prefix blocks' pages)
    size_t min_pages;           // one sequence at full length
    size_t device_free;         // cuMemGetInfo's free bytes
    int integrated;             // the device's memory is the host's
    size_t mem_available;       // the host's MemAvailable (0: unknown)
    size_t host_margin;         // bytes left to the host on an integrated device
} gpu_fit_in;

#define GPU_ARENA_SLACK ((size_t)(64u << 20) * 6)   // alignment slack over the six device arenas
#define GPU_DRIVER_HEADROOM ((size_t)1 << 30)       // the driver's own needs (module, streams, events)

// The KV pages that fit (*pages, at most want_pages), or -1 with e saying what did not fit.
static int gpu_plan_fit(const gpu_fit_in *in, const char *device, int max_len, size_t *pages, moet_err *e) {
    const double G = 1073741824.0;
    size_t budget = in->device_free, fixed = in->weights + in->pool + in->state + in->act + GPU_ARENA_SLACK;
    const char *what = "free on the device";
    if (in->integrated) {
        fixed += in->pinned + in->host;
        if (in->mem_available) {
            size_t host = in->mem_available > in->host_margin ? in->mem_available - in->host_margin : 0;
            if (host < budget) budget = host, what = "the host's MemAvailable less --host-margin-gb";
        }
    }
    if (fixed + GPU_DRIVER_HEADROOM > budget)
        return err_set(e, "the model does not fit on %s: weights %.2f GiB + expert pool %.2f GiB + state %.2f GiB + activations %.2f GiB%s "
                          "+ %.2f GiB for the driver > %.2f GiB %s (less --max-num-seqs or --max-batch-tokens%s?)",
                       device, in->weights / G, in->pool / G, in->state / G, in->act / G,
                       in->integrated ? " + pinned staging and host arenas" : "", GPU_DRIVER_HEADROOM / G, budget / G, what,
                       in->integrated ? ", or a smaller --host-margin-gb" : "");
    size_t room = budget - fixed - GPU_DRIVER_HEADROOM, fit = in->page_bytes ? room / in->page_bytes : in->want_pages;
    if (fit < in->min_pages)
        return err_set(e, "the KV cache does not fit: one sequence of %d tokens needs %.2f GiB, %.2f GiB are left after the weights "
                          "(lower --max-model-len)", max_len, (double)in->min_pages * in->page_bytes / G, room / G);
    *pages = fit < in->want_pages ? fit : in->want_pages;
    return 0;
}

// The expert pool when every slot does not fit (no --expert-cache-gb given): the places of
// slot_bytes that the memory left after the other arenas (in->pool not counted) and one
// sequence's KV cache at full length holds, at most n_slots, at least E (a layer's experts: what
// one step can choose); the KV cache then gets what gpu_plan_fit gives it with that pool. The
// resident pool is kept whenever it fits with that one sequence (a smaller KV cache makes requests
// wait; a cache makes every step read the disk). 0 with *n_pool, or −1 with e: what did not fit.
static int gpu_plan_pool(const gpu_fit_in *in, const char *device, int max_len, size_t slot_bytes, uint64_t n_slots, int E, uint64_t *n_pool,
                         moet_err *e) {
    gpu_fit_in x = *in;
    x.pool = 0;
    x.want_pages = x.min_pages;
    size_t pages;
    moet_err pe = {{0}};
    const double G = 1073741824.0;
    if (gpu_plan_fit(&x, device, max_len, &pages, &pe))   // not even without a pool
        return err_set(e, "%s (without an expert pool)", pe.msg);
    size_t budget = in->device_free, fixed = in->weights + in->state + in->act + GPU_ARENA_SLACK + GPU_DRIVER_HEADROOM +
                                                in->min_pages * in->page_bytes;
    if (in->integrated) {
        fixed += in->pinned + in->host;
        if (in->mem_available) {
            size_t host = in->mem_available > in->host_margin ? in->mem_available - in->host_margin : 0;
            if (host < budget) budget = host;
        }
    }
    uint64_t n = budget > fixed ? (budget - fixed) / slot_bytes : 0;
    if (n > n_slots) n = n_slots;
    if (n < (uint64_t)E)
        return err_set(e, "the model does not fit on %s: %.2f GiB are left for the expert pool after the weights, state, activations "
                          "and one sequence's KV cache; the expert cache needs at least one layer's %d experts (%.2f GiB)",
                       device, budget > fixed ? (budget - fixed) / G : 0.0, E, (double)E * slot_bytes / G);
    *n_pool = n;
    return 0;
}

// Opens the GPU, plans and allocates every arena, uploads the weights and (planes != NULL) loads
// the routed experts from the plane file into the slot pool. Returns -1 with e set when there is
// no GPU, the geometry is not supported, or the plan does not fit. With pfx_blocks > 0 it also
// keeps that many prefix blocks of pfx_block tokens (engine_backend.save): their GDN states in
// the state arena, their KV pages beyond the sequences' in the KV cache.
static int gpu_init_prefix(gpu_engine *g, const ck_model *m, const gpu_opts *o, int pfx_block, int pfx_blocks, const char *planes,
                           const pf_serve_opts *po, moet_err *e) {
    memset(g, 0, sizeof *g);
    g->m = m;
    g->o = *o;
    const ck_config *c = &m->cfg;
    if (o->max_seqs < 1 || o->max_len < 1 || o->max_tokens < 1) return err_set(e, "engine sizes must be positive");
    if (gpu_open(&g->dev, e)) return -1;
    // geometry the kernels take (sass/ headers)
    if (c->hidden % 4 || c->inter % 4 || c->shared_inter % 4 || c->value_dim % 4 || (c->n_heads * c->head_dim) % 4)
        return err_set(e, "the GPU kernels need hidden, expert, value and attention widths divisible by 4"), gpu_close(&g->dev), -1;
    if (c->head_dim > GPU_ATT_MAX_HD || c->topk > GPU_ROUTER_MAX_K || c->n_experts > GPU_ROUTER_MAX_E || c->conv_k > GPU_CONV_MAX_K)
        return err_set(e, "geometry beyond the GPU kernels' limits (head_dim ≤ %d, top-k ≤ %d, experts ≤ %d, conv ≤ %d)", GPU_ATT_MAX_HD,
                       GPU_ROUTER_MAX_K, GPU_ROUTER_MAX_E, GPU_CONV_MAX_K), gpu_close(&g->dev), -1;
    {
        size_t smem = gpu_gdn_rule_smem(c->lk_dim, 1), smem4 = gpu_gdn_rule_smem(c->lk_dim, GPU_GDN_RULE_LP);
        if (smem4 > smem) smem = smem4;
        if (smem > (size_t)g->dev.smem_optin)
            return err_set(e, "linear_key_head_dim %d needs %zu bytes of shared memory per block; the GPU has %d", c->lk_dim, smem,
                           g->dev.smem_optin), gpu_close(&g->dev), -1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        const ck_layer *L = &m->layers[l];
        const ck_mat *mats[] = {&L->q, &L->k, &L->v, &L->o, &L->qkv, &L->z, &L->b, &L->a, &L->out, &L->router, &L->sh_gate,
                                &L->sh_up, &L->sh_down, &L->sh_gate_w};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (mats[i]->w && gpu_mat_check(mats[i], "a layer weight", e)) return gpu_close(&g->dev), -1;
        if (!planes)   // (the shapes are every expert's; an FP8 expert's codes are scanned one by one)
            for (int x = 0; x < (L->gate[0].kind == CK_W_FP8 ? c->n_experts : 1); x++)
                if (gpu_mat_check(&L->gate[x], "a routed expert", e) || gpu_mat_check(&L->up[x], "a routed expert", e) ||
                    gpu_mat_check(&L->down[x], "a routed expert", e))
                    return gpu_close(&g->dev), -1;
    }
    if (gpu_mat_check(&m->lm_head, "lm_head", e)) return gpu_close(&g->dev), -1;
    if (o->mtp) {   // the MTP head: its weights as the kernels take them
        if (!m->mtp.present) return err_set(e, "the model has no MTP head (mtp.* weights)"), gpu_close(&g->dev), -1;
        const ck_layer *L = &m->mtp.layer;
        const ck_mat *mats[] = {&m->mtp.fc, &L->q, &L->k, &L->v, &L->o, &L->router, &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_gate_w};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (gpu_mat_check(mats[i], "an MTP head weight", e)) return gpu_close(&g->dev), -1;
        for (int x = 0; x < c->n_experts; x++)
            if (gpu_mat_check(&L->gate[x], "an MTP head expert", e) || gpu_mat_check(&L->up[x], "an MTP head expert", e) ||
                gpu_mat_check(&L->down[x], "an MTP head expert", e))
                return gpu_close(&g->dev), -1;
    }
    g->n_kv = c->n_full + (o->mtp ? 1 : 0);
    if (gpu_fa_refuse(c, o->kv_dtype, g->dev.smem_optin, e)) return gpu_close(&g->dev), -1;
    if (gpu_plan_grids(c, o->max_tokens, o->max_seqs, o->max_len, e)) return gpu_close(&g->dev), -1;
    if (gpu_kernels_load(&g->k, &g->dev, e)) return gpu_close(&g->dev), -1;
    gpu_kernel_smem(&g->k, K_GDN_RULE, (size_t)g->dev.smem_optin);
    // the chunked GDN form where its shared memory fits (gpu_gdn_layout: Qwen3.6's key heads of 128
    // in 227 KiB with T's own array, in 99 KiB lean) and the key heads' size is a multiple of 16 (its
    // walk's tensor-core tiles of 16 key dims): prompts are then cut at multiples of GPU_GDN_C;
    // otherwise every token takes the recurrence
    g->chunk_align = 1;
    const int lay = c->n_gdn && c->lk_dim % 16 == 0 && gpu_gdn_prep_smem(c->lk_dim) <= (size_t)g->dev.smem_optin
                        ? gpu_gdn_layout(g->dev.smem_optin, c->lk_dim)
                        : -1;
    if (lay >= 0) {
        g->chunk_align = GPU_GDN_C;
        g->k.gdn_lean = lay;
        gpu_kernel_smem(&g->k, K_GDN_CHUNK, gpu_gdn_chunk_smem_max(g->dev.smem_optin, c->lk_dim, lay));
        gpu_kernel_smem(&g->k, K_GDN_PREP, gpu_gdn_prep_smem(c->lk_dim));
    }
    if (pfx_blocks) {   // a block ends where a prompt may be cut, and on a KV page boundary
        int unit = g->chunk_align > GPU_KV_PAGE ? g->chunk_align : GPU_KV_PAGE;
        if (pfx_block < unit || pfx_block % unit || pfx_block > o->max_len || pfx_blocks < 0 || pfx_blocks > MOET_MAX_PREFIX_BLOCKS)
            return err_set(e, "--prefix-block %d: the GPU backend needs a multiple of %d tokens (its prompt cuts and KV pages) "
                              "up to the context of %d", pfx_block, unit, o->max_len), gpu_close(&g->dev), -1;
        g->pfx_block = pfx_block;
        g->pfx_blocks = pfx_blocks;
        g->pfx_pages = g->n_kv ? pfx_block / GPU_KV_PAGE : 0;
    }
    CU_CHECK(cu.cuStreamCreate(&g->compute, GPU_STREAM_NON_BLOCKING));
    CU_CHECK(cu.cuStreamCreate(&g->copy, GPU_STREAM_NON_BLOCKING));

    pf_file pf;
    memset(&pf, 0, sizeof pf);
    size_t pool_bytes = 0;
    if (planes) {
        pf_serve_opts oo = *po;
        oo.no_verify = 1;   // the pool loader hashes each slot as it arrives
        if (pf_open_for_model(&pf, planes, c, m->dir, &oo, e)) return gpu_free(g), -1;
        g->slot_stride = pf.h.L.slot_stride;
        g->n_slots = pf.h.L.n_slots;
        int n_pool = (int)g->n_slots;
        if (po->cache_gb > 0 && gpu_cache_places(po->cache_gb, g->slot_stride, g->n_slots, (int)pf.h.L.g.n_experts, &n_pool, e))
            return pf_close(&pf), gpu_free(g), -1;
        g->n_cache_layers = (int)pf.h.L.g.n_layers;
        if ((uint64_t)n_pool < g->n_slots) {   // the expert cache: its places, maps and reads planned with the rest
            g->cached = 1;
            gpu_cache_plan(&g->cache, &g->dev, n_pool, g->n_cache_layers, (int)pf.h.L.g.n_experts, g->n_slots, g->slot_stride, po);
        }
        pool_bytes = g->slot_stride * (size_t)n_pool;
        pf_close(&pf);
    }
    g->bt_stride = (o->max_len + GPU_KV_PAGE - 1) / GPU_KV_PAGE;
    // plans: weights, pool, state, activations, pinned, host; the KV cache takes what it needs
    // (or what --kv-pages says), and must fit in what the device has left.
    arena pw = arena_measure("weights"), ps = arena_measure("state"), pa = arena_measure("activations"),
          pp = arena_measure("staging"), ph = arena_measure("engine host");
    gpu_carve_weights(g, &pw, planes == NULL);
    // --act-dtype bf16 rounds the inputs of the products the tensor cores take, as the reference
    // does for every such matrix (ref_tensor_core); routed experts whose shape keeps them on the
    // f32 kernels (moe_mm) would make the two differ: refused, and auto (act_bf16 < 0) takes f32
    // there; else auto is bf16 unless the KV cache is f32 (the exact mode)
    const ck_layer *Lx = &m->layers[0];
    const int experts_f32 = !g->moe_mm && (gpu_mm_ok_ck(&Lx->gate[0]) || gpu_mm_ok_ck(&Lx->up[0]) || gpu_mm_ok_ck(&Lx->down[0]));
    if (o->act_bf16 > 0 && experts_f32)
        return err_set(e, "--act-dtype bf16: the routed experts [%d, %d] do not take the tensor-core products here (needs "
                          "moe_intermediate_size a multiple of 32 and hidden_size of 64, one kind for gate and up); use --act-dtype f32",
                       c->inter, c->hidden), gpu_free(g), -1;
    const int act = o->act_bf16 < 0 ? o->kv_dtype != GPU_KV_F32 && !experts_f32 : o->act_bf16;
    g->k.parts = act ? 1 : GPU_MM_SPLITS;
    gpu_carve_state(g, &ps);
    gpu_carve_act(g, &pa);
    gpu_carve_pinned(g, &pp);
    g->page_bytes_all = 2 * gpu_kv_page_bytes_n(g->n_kv, c, o->kv_dtype);
    // every sequence at full length, and the pages the prefix blocks keep beyond them: a page a
    // block shares stays taken when its sequence ends
    size_t want_pages = (size_t)o->max_seqs * g->bt_stride + (size_t)g->pfx_blocks * g->pfx_pages;
    if (g->n_kv == 0) want_pages = o->max_seqs;   // no attention layer: pages only name positions
    size_t free_b = 0, total_b = 0;
    CU_CHECK(cu.cuMemGetInfo(&free_b, &total_b));
    arena ph0 = arena_measure("engine host");
    // decode graphs for steps of up to MOET_GRAPH_ROWS rows (each row one token), their nodes at
    // most GPU_GRAPH_LAYER_NODES per layer and the head's and tail's few
    // (none with the expert cache: its layers wait on the host for the router's choices)
    g->graph_rows = o->no_graphs || g->cached ? 0 : o->max_seqs < o->max_tokens ? o->max_seqs : o->max_tokens;
    if (g->graph_rows > MOET_GRAPH_ROWS) g->graph_rows = MOET_GRAPH_ROWS;
    g->graph_cap = g->graph_rows ? (size_t)GPU_GRAPH_LAYER_NODES * (c->n_layers + 1) : 0;
    g->n_pages = want_pages;   // the host arena with its page lists at their longest
    gpu_carve_host(g, &ph0);
    gpu_fit_in fit_in = {pw.used, pool_bytes, ps.used, pa.used, pp.used, ph0.used, g->page_bytes_all, want_pages,
                         g->n_kv ? (size_t)g->bt_stride : want_pages, free_b, g->dev.integrated,
                         g->dev.integrated ? gpu_mem_available() : 0, o->host_margin};
    size_t fit = 0;
    if (planes && !g->cached && !(po->cache_gb > 0) && gpu_plan_fit(&fit_in, g->dev.name, o->max_len, &fit, e)) {
        // every slot does not fit: the expert cache, as many places as fit beside one sequence's
        // KV cache (gpu_plan_pool), its buffers planned with the others
        uint64_t n_pool = 0;
        if (gpu_plan_pool(&fit_in, g->dev.name, o->max_len, g->slot_stride, g->n_slots, c->n_experts, &n_pool, e)) return gpu_free(g), -1;
        g->cached = 1;
        gpu_cache_plan(&g->cache, &g->dev, (int)n_pool, g->n_cache_layers, c->n_experts, g->n_slots, g->slot_stride, po);
        pool_bytes = g->slot_stride * (size_t)n_pool;
        pp = arena_measure("staging"), ph0 = arena_measure("engine host"), pa = arena_measure("activations");
        gpu_carve_pinned(g, &pp);
        gpu_carve_act(g, &pa);   // (the guess's buffers)
        g->graph_rows = 0, g->graph_cap = 0;   // (no decode graphs with the cache)
        gpu_carve_host(g, &ph0);
        fit_in.pool = pool_bytes, fit_in.pinned = pp.used, fit_in.host = ph0.used, fit_in.act = pa.used;
        fprintf(stderr, "moet: every expert slot (%.2f GiB) does not fit beside the rest: an expert cache of %" PRIu64 " of %" PRIu64 " slots "
                        "(%.2f GiB; --expert-cache-gb sets it)\n", (double)g->slot_stride * g->n_slots / 1073741824.0, n_pool, g->n_slots,
                pool_bytes / 1073741824.0);
        *e = (moet_err){{0}};
    }
    if (gpu_plan_fit(&fit_in, g->dev.name, o->max_len, &fit, e)) return gpu_free(g), -1;
    if (fit < want_pages) {
        fprintf(stderr, "moet: KV cache limited by %s memory: %zu of %zu pages (requests wait for room)\n",
                g->dev.integrated ? "the host's" : "GPU", fit, want_pages);
        want_pages = fit;
    }
    g->n_pages = want_pages;
    arena pk = arena_measure("kv");
    gpu_carve_kv(g, &pk);
    gpu_carve_host(g, &ph);
    // allocate once, then carve for real
    if (arena_init_kind(&g->weights, "weights", ARENA_DEVICE, pw.used, e) ||
        (pool_bytes && arena_init_kind(&g->pool, "expert pool", ARENA_DEVICE, pool_bytes, e)) ||
        arena_init_kind(&g->kv, "kv cache", ARENA_DEVICE, pk.used, e) || arena_init_kind(&g->state, "state", ARENA_DEVICE, ps.used, e) ||
        arena_init_kind(&g->act, "activations", ARENA_DEVICE, pa.used, e) ||
        arena_init_kind(&g->pinned, "staging", ARENA_PINNED, pp.used, e) || arena_init_kind(&g->host, "engine host", ARENA_HOST, ph.used, e))
        return gpu_free(g), -1;
    gpu_carve_host(g, &g->host);
    arena_done(&g->host);
    double t0 = moet_now();
    gpu_carve_weights(g, &g->weights, planes == NULL);
    arena_done(&g->weights);
    g->weight_bytes = g->weights.cap;
    fprintf(stderr, "moet: weights on the GPU: %.2f GiB in %.1f s\n", g->weights.cap / 1073741824.0, moet_now() - t0);
    gpu_carve_state(g, &g->state);
    arena_done(&g->state);
    gpu_carve_act(g, &g->act);
    arena_done(&g->act);
    gpu_carve_pinned(g, &g->pinned);
    arena_done(&g->pinned);
    gpu_carve_kv(g, &g->kv);
    arena_done(&g->kv);
    int nf = 0, ng = 0;
    for (int l = 0; l < c->n_layers; l++) g->kind_index[l] = c->full_attn[l] ? nf++ : ng++;
    for (size_t i = 0; i < g->n_pages; i++) g->free_pages[i] = (int32_t)(g->n_pages - 1 - i), g->page_ref[i] = 0;
    g->n_free = g->n_pages;
    for (int b = 0; b < g->pfx_blocks; b++) g->pfx_end[b] = 0;
    for (int s = 0; s < o->max_seqs; s++) g->seq_pages[s] = 0, g->pos[s] = 0;
    for (int s = 0; o->mtp && s < o->max_seqs; s++) g->mtp_pos[s] = 0;
    memset(g->bt_host, 0, sizeof(int32_t) * (size_t)o->max_seqs * g->bt_stride);
    CU_CHECK(cu.cuMemcpyHtoD(g->bt, g->bt_host, sizeof(int32_t) * (size_t)o->max_seqs * g->bt_stride));
    CU_CHECK(cu.cuMemsetD8(g->win, 0, sizeof(float) * g->win_slot * o->max_seqs));
    CU_CHECK(cu.cuMemsetD8(g->ssm, 0, sizeof(float) * g->ssm_slot * o->max_seqs));
    CU_CHECK(cu.cuMemsetD8(g->ids, 0, sizeof(int32_t) * GPU_ARGMAX_INTS(o->max_tokens)));   // k_argmax's counters start at 0
    if (planes) {
        CUdeviceptr tables[MOET_MAX_LAYERS];
        for (int l = 0; l < c->n_layers; l++) tables[l] = g->layers[l].experts;
        if (g->cached) {
            g->cache.pool = (CUdeviceptr)(uintptr_t)g->pool.base;
            for (int l = 0; l < c->n_layers; l++) g->cache.tables[l] = tables[l];
            if (gpu_cache_open(&g->cache, m, planes, po, e)) return g->cached = 0, gpu_free(g), -1;
        } else if (gpu_pool_load(&g->dev, (CUdeviceptr)(uintptr_t)g->pool.base, tables, m, planes, po, e)) return gpu_free(g), -1;
    }
    // the uploads and memsets above (and the pool's expert tables) went through the legacy
    // stream, which the non-blocking streams of the steps do not wait for
    CU_CHECK(cu.cuCtxSynchronize());
    // what a decode step reads (moet bench): the dense weights but the embedding (one row per
    // token), and per routed expert touched its three matrices
    const ck_layer *L0 = &m->layers[0];
    g->expert_bytes = planes ? (double)g->slot_stride
                             : (double)(gpu_mat_bytes(&L0->gate[0]) + gpu_scale_bytes(&L0->gate[0]) + gpu_mat_bytes(&L0->up[0]) +
                                        gpu_scale_bytes(&L0->up[0]) + gpu_mat_bytes(&L0->down[0]) + gpu_scale_bytes(&L0->down[0]));
    g->dense_bytes = (double)g->weights.cap - (double)gpu_mat_bytes(&m->embed) - (double)g->mtp_bytes -
                     (planes ? 0 : g->expert_bytes * c->n_experts * c->n_layers);
    gpu_graphs_capture(g);
    return 0;
}

// ---- sequences -------------------------------------------------------------------------------

// A new sequence in slot with pages for `reserve` tokens: after the prefix blocks from[0 .. n_from)
// (checked by engine_check_from), their pages shared and the last one's GDN state copied, at
// position n_from · pfx_block; else at position 0 with a zeroed state. The other pages come from
// the free list. 1 when there are not enough free pages (nothing changed).
static int gpu_seq_start_from(gpu_engine *g, int slot, int reserve, const int32_t *from, int n_from) {
    MOET_ASSERT(slot >= 0 && slot < g->o.max_seqs && g->seq_pages[slot] == 0, "slot %d is not free", slot);
    int need = g->n_kv ? (reserve + GPU_KV_PAGE - 1) / GPU_KV_PAGE : 0;
    if (need > g->bt_stride) need = g->bt_stride;
    int shared = n_from * g->pfx_pages;
    MOET_ASSERT(shared <= need, "%d shared pages of %d", shared, need);
    if ((size_t)(need - shared) > g->n_free) return 1;
    int32_t *row = g->bt_host + (size_t)slot * g->bt_stride;
    for (int i = 0; i < n_from; i++)
        for (int j = 0; j < g->pfx_pages; j++) {
            int32_t pg = g->pfx_page[(size_t)from[i] * g->pfx_pages + j];
            row[i * g->pfx_pages + j] = pg;
            g->page_ref[pg]++;
        }
    for (int i = shared; i < need; i++) {
        row[i] = g->free_pages[--g->n_free];
        g->page_ref[row[i]] = 1;
    }
    g->seq_pages[slot] = need;
    g->pos[slot] = n_from * g->pfx_block;
    if (g->o.mtp) g->mtp_pos[slot] = 0;   // (a sequence after prefix blocks has no head rows yet)
    // ordered before the next step on the same stream
    CUdeviceptr win = g->win + (CUdeviceptr)slot * g->win_slot * 4, ssm = g->ssm + (CUdeviceptr)slot * g->ssm_slot * 4;
    if (need) CU_CHECK(cu.cuMemcpyHtoDAsync(g->bt + (CUdeviceptr)slot * g->bt_stride * 4, row, sizeof(int32_t) * (size_t)need, g->compute));
    if (n_from) {
        CUdeviceptr b = (CUdeviceptr)from[n_from - 1];
        CU_CHECK(cu.cuMemcpyDtoDAsync(win, g->pfx_win + b * g->win_slot * 4, g->win_slot * 4, g->compute));
        CU_CHECK(cu.cuMemcpyDtoDAsync(ssm, g->pfx_ssm + b * g->ssm_slot * 4, g->ssm_slot * 4, g->compute));
    } else {
        CU_CHECK(cu.cuMemsetD8Async(win, 0, g->win_slot * 4, g->compute));
        CU_CHECK(cu.cuMemsetD8Async(ssm, 0, g->ssm_slot * 4, g->compute));
    }
    CU_CHECK(cu.cuStreamSynchronize(g->compute));   // row is host memory the next admission may rewrite
    return 0;
}

static int gpu_seq_start(gpu_engine *g, int slot, int reserve) { return gpu_seq_start_from(g, slot, reserve, NULL, 0); }

static int gpu_init(gpu_engine *g, const ck_model *m, const gpu_opts *o, const char *planes, const pf_serve_opts *po, moet_err *e) {
    return gpu_init_prefix(g, m, o, 0, 0, planes, po, e);
}

// One holder fewer for page pg: free once nobody holds it.
static void gpu_page_put(gpu_engine *g, int32_t pg) {
    MOET_ASSERT(g->page_ref[pg] > 0, "KV page %d released with no holder", pg);
    if (--g->page_ref[pg] == 0) g->free_pages[g->n_free++] = pg;
}

static void gpu_seq_end(gpu_engine *g, int slot) {
    int32_t *row = g->bt_host + (size_t)slot * g->bt_stride;
    for (int i = g->seq_pages[slot] - 1; i >= 0; i--) gpu_page_put(g, row[i]);
    g->seq_pages[slot] = 0;
    g->pos[slot] = 0;
}

// Keeps the state of the sequence in slot (at pos = k · pfx_block, its last step queued) as prefix
// block b: its GDN state and conv windows copied on the compute stream after that step and before
// the next, the pages of positions [pos − pfx_block, pos) held once more.
static void gpu_prefix_save(gpu_engine *g, int slot, int b) {
    int pos = g->pos[slot], on_boundary = pos >= g->pfx_block && pos % g->pfx_block == 0;
    MOET_ASSERT(b >= 0 && b < g->pfx_blocks && g->pfx_end[b] == 0 && on_boundary, "prefix block %d from slot %d at %d", b, slot, pos);
    const int32_t *row = g->bt_host + (size_t)slot * g->bt_stride;
    int first = (pos - g->pfx_block) / GPU_KV_PAGE;
    for (int j = 0; j < g->pfx_pages; j++) {
        int32_t pg = row[first + j];
        g->pfx_page[(size_t)b * g->pfx_pages + j] = pg;
        g->page_ref[pg]++;
    }
    CU_CHECK(cu.cuMemcpyDtoDAsync(g->pfx_win + (CUdeviceptr)b * g->win_slot * 4, g->win + (CUdeviceptr)slot * g->win_slot * 4,
                                  g->win_slot * 4, g->compute));
    CU_CHECK(cu.cuMemcpyDtoDAsync(g->pfx_ssm + (CUdeviceptr)b * g->ssm_slot * 4, g->ssm + (CUdeviceptr)slot * g->ssm_slot * 4,
                                  g->ssm_slot * 4, g->compute));
    g->pfx_end[b] = pos;
}

// Prefix block b is no longer kept: its pages lose a holder (a restore that copied its state is
// ordered before any later save into b on the same stream).
static void gpu_prefix_drop(gpu_engine *g, int b) {
    MOET_ASSERT(b >= 0 && b < g->pfx_blocks && g->pfx_end[b] > 0, "prefix block %d is not kept", b);
    for (int j = 0; j < g->pfx_pages; j++) gpu_page_put(g, g->pfx_page[(size_t)b * g->pfx_pages + j]);
    g->pfx_end[b] = 0;
}

// ---- one step ------------------------------------------------------------------------------

// One matrix product of a set that reads the same input: W [O, K], y [T, ldy].
typedef struct {
    const gpu_mat *W;
    CUdeviceptr y;
    int ldy;
} gpu_lin_out;

// y_i = x W_iᵀ for the n ≤ GPU_LIN_SET matrices of outs (the same K columns each), x [T, ldx],
// in one k_linear launch: the same bits as one launch each.
// parts: the buffer that already holds x's bf16 parts (g->xs after gpu_norm, the attention and the
// gated norm; g->shs after the shared expert's SiLU·up), or 0: they are made into g->xs first.
static void gpu_linear_n(gpu_engine *g, int n, const gpu_lin_out *outs, CUdeviceptr x, int ldx, int T, CUdeviceptr parts) {
    MOET_ASSERT(n >= 1 && n <= GPU_LIN_SET, "%d matrices in one k_linear launch", n);
    gpu_lin_set set;
    memset(&set, 0, sizeof set);
    set.n = n;
    int mm = 1;
    for (int i = 0; i < n; i++) {
        MOET_ASSERT(outs[i].W->cols == outs[0].W->cols, "matrices of one k_linear launch need the same input width");
        set.W[i] = *outs[i].W;
        set.y[i] = outs[i].y;
        set.ldy[i] = outs[i].ldy;
        set.first[i + 1] = set.first[i] + (outs[i].W->rows + GPU_LIN_ROWS - 1) / GPU_LIN_ROWS;
        mm &= gpu_mm_ok(outs[i].W);
    }
    int K = outs[0].W->cols;
    if (mm && (size_t)K <= g->mm_width) {   // tensor cores: the input's parts, then one k_mm launch
        if (!parts) gpu_k_mm_split(&g->k, g->compute, x, ldx, K, T, g->xs);
        if (g->mmc_live && g->mmc_np) {   // the step's full pieces by k_mm_c (gpu_mmc_split)
            const gpu_mmc_step ms = {gpu_meta(g, GM_MMC_PIECES), gpu_meta(g, GM_MMC_TAIL), g->xs_t, g->y_t, g->mmc_np, g->mmc_nt, g->mmc_rows};
            gpu_k_mm_mmc(&g->k, g->compute, &set, parts ? parts : g->xs, T, &ms);
        }
        else gpu_k_mm(&g->k, g->compute, &set, parts ? parts : g->xs, T);
        return;
    }
    if (g->k.parts == 1 && n > 1 && (size_t)K <= g->mm_width) {
        // --act-dtype bf16 and a set that mixes kinds: each matrix where the reference puts it
        // (ref_tensor_core: the tensor cores for those gpu_mm_ok takes, rounding their input)
        for (int i = 0; i < n; i++) gpu_linear_n(g, 1, &outs[i], x, ldx, T, parts);
        return;
    }
    gpu_k_linear(&g->k, g->compute, &set, x, ldx, T);
}

static void gpu_linear(gpu_engine *g, const gpu_mat *W, CUdeviceptr x, int ldx, int T, CUdeviceptr y, int ldy, CUdeviceptr parts) {
    gpu_lin_out o = {W, y, ldy};
    gpu_linear_n(g, 1, &o, x, ldx, T, parts);
}

static void gpu_norm(gpu_engine *g, CUdeviceptr x, CUdeviceptr y, const gpu_mat *w, CUdeviceptr xn, CUdeviceptr rows, int n) {
    const ck_config *c = &g->m->cfg;
    // xn's bf16 parts too (g->xs), for the tensor-core products that read it next (gpu_linear_n's parts)
    if (g->comb_pending) {   // y is the MoE layer's, made here from its parts (gpu_moe_layer)
        MOET_ASSERT(y == g->y, "the MoE layer's output left to a norm that does not add it");
        gpu_k_moe_add_rmsnorm(&g->k, g->compute, x, g->ye, g->sel, g->selw, g->sh, g->sgate, c->topk, *w, xn, g->xs, rows, c->hidden,
                              (float)c->eps, n);
        g->comb_pending = 0;
        return;
    }
    gpu_k_add_rmsnorm(&g->k, g->compute, x, y, *w, xn, g->xs, rows, c->hidden, (float)c->eps, n);
}

// The gated attention layer G over the KV pages of attention kind kv (kind_index of its layer;
// the MTP head's: n_full).
static void gpu_attention_layer(gpu_engine *g, const gpu_layer *G, int kv, int T) {
    const ck_config *c = &g->m->cfg;
    int nh = c->n_heads, kvh = c->n_kv_heads, hd = c->head_dim, qd = nh * hd, kvd = kvh * hd, H = c->hidden, rot = c->rot_dim;
    gpu_lin_out qkv[3] = {{&G->q, g->proj, 2 * qd}, {&G->k, g->kk, kvd}, {&G->v, g->vv, kvd}};
    gpu_linear_n(g, 3, qkv, g->xn, H, T, g->xs);
    size_t lay = (size_t)kv * g->n_pages * GPU_KV_PAGE * kvd * gpu_kv_elem(g->o.kv_dtype);
    CUdeviceptr kc = g->kc + lay, vc = g->vc + lay, tp = gpu_meta(g, GM_TOK_POS), ts = gpu_meta(g, GM_TOK_SLOT);
    size_t slay = (size_t)kv * g->n_pages * GPU_KV_PAGE * kvh * sizeof(float);
    CUdeviceptr ks = g->ks ? g->ks + slay : 0, vs = g->vs ? g->vs + slay : 0;
    gpu_k_attn_prep(&g->k, g->compute, g->o.kv_dtype, g->proj, g->kk, g->vv, G->q_norm, G->k_norm, g->inv_freq, rot, tp, ts, g->bt,
                    g->bt_stride, kc, vc, ks, vs, nh, kvh, hd, (float)c->eps, T);
    if (T <= g->att_split_T)   // a decode step: the chunks of each context in parallel (the same bits)
        gpu_k_attn_split(&g->k, g->compute, g->o.kv_dtype, g->proj, tp, ts, g->bt, g->bt_stride, kc, vc, ks, vs, g->att_part, g->att_nc, g->core,
                         nh, kvh, hd, 1.0f / sqrtf((float)hd), g->xs, T, g->reach);
    else
        gpu_k_attention(&g->k, g->compute, g->o.kv_dtype, g->proj, tp, ts, g->bt, g->bt_stride, kc, vc, ks, vs, g->core, nh, kvh, hd,
                        1.0f / sqrtf((float)hd), g->xs, T, g->step_rows);
    gpu_linear(g, &G->o, g->core, qd, T, g->y, H, g->xs);   // core's parts from the attention kernel
}

// The GDN layer; n1 rows of one token take the recurrent kernel, nm longer rows the chunked one
// (each over the row lists of the step metadata).
static void gpu_gdn_layer(gpu_engine *g, const gpu_layer *G, int layer, int n, int n1, int nm, int T) {
    const ck_config *c = &g->m->cfg;
    int H = c->hidden, cd = c->conv_dim, vd = c->value_dim, nv = c->lv_heads, nk = c->lk_heads, dk = c->lk_dim, dv = c->lv_dim,
        Kc = c->conv_k;
    gpu_lin_out in[4] = {{&G->qkv, g->proj, cd}, {&G->z, g->zz, vd}, {&G->b, g->bb, nv}, {&G->a, g->aa, nv}};
    gpu_linear_n(g, 4, in, g->xn, H, T, g->xs);
    size_t gi = (size_t)g->kind_index[layer];
    CUdeviceptr win = g->win + gi * (size_t)(Kc - 1) * cd * 4, ssm = g->ssm + gi * (size_t)nv * dk * dv * 4;
    long long win_stride = (long long)g->win_slot, ssm_stride = (long long)g->ssm_slot;
    CUdeviceptr rs = gpu_meta(g, GM_ROW_SLOT), r0 = gpu_meta(g, GM_ROW_START), rn = gpu_meta(g, GM_ROW_LEN);
    // a verification (one row, keep_hist): the windows and states after each of its tokens too
    CUdeviceptr hw = g->keep_hist ? g->hist_win + gi * (size_t)(Kc - 1) * cd * 4 : 0, hs = g->keep_hist ? g->hist_ssm + gi * (size_t)nv * dk * dv * 4 : 0;
    gpu_k_gdn_conv(&g->k, g->compute, g->proj, cd, G->conv, Kc, win, win_stride, rs, r0, rn, n, T - n + 1, hw, (long long)g->win_slot);
    CUdeviceptr rp = gpu_meta(g, GM_ROW_POS), one = gpu_meta(g, GM_ROWS_ONE), many = gpu_meta(g, GM_ROWS_MANY);
    if (n1 && !nm && !g->no_fold && gpu_gdn_rule_norm_ok(dk, dv)) {   // every row one rule: the gated norm folded in (the same bits)
        gpu_k_gdn_rule_norm(&g->k, g->compute, g->proj, cd, g->bb, g->aa, G->A_log, G->dt_bias, ssm, ssm_stride, g->core, nk, nv, dk, dv, rs,
                            r0, rn, one, n1, hs, (long long)g->ssm_slot, g->zz, G->gnorm, (float)c->eps, g->xs, T);
        gpu_linear(g, &G->out, g->core, vd, T, g->y, H, g->xs);
        return;
    }
    if (n1)
        gpu_k_gdn_rule(&g->k, g->compute, g->proj, cd, g->bb, g->aa, G->A_log, G->dt_bias, ssm, ssm_stride, g->core, nk, nv, dk, dv, rs, r0,
                       rn, one, n1, hs, (long long)g->ssm_slot);
    if (nm)
        gpu_k_gdn_chunk(&g->k, g->compute, g->proj, cd, g->bb, g->aa, G->A_log, G->dt_bias, ssm, ssm_stride, g->core, nk, nv, dk, dv, rs,
                        r0, rn, rp, many, nm, g->gdn_tm, gpu_meta(g, GM_ROW_PIECE0), g->pieces);
    gpu_k_gated_norm(&g->k, g->compute, g->core, g->zz, G->gnorm, nv, dv, (float)c->eps, g->xs, T);   // with core's parts
    gpu_linear(g, &G->out, g->core, vd, T, g->y, H, g->xs);
}

static void gpu_moe_layer(gpu_engine *g, const gpu_layer *G, int T) {
    const ck_config *c = &g->m->cfg;
    int H = c->hidden, E = c->n_experts, K = c->topk, I = c->inter, SI = c->shared_inter;
    // the router and the shared expert's gate, up and sigmoid gate read the same normed input
    gpu_lin_out in[4] = {{&G->router, g->rl, E}, {&G->sh_gate, g->sg, SI}, {&G->sh_up, g->su, SI}, {&G->sh_gate_w, g->sgate, 1}};
    gpu_linear_n(g, 4, in, g->xn, H, T, g->xs);
    // a decode step: the router, the shared expert's SiLU·up (h into sg, its parts into shs) and the
    // grouping by expert in one launch (the same bits as the three below)
    int routed = g->moe_mm && gpu_k_route(&g->k, g->compute, g->rl, E, K, T, g->sel, g->selw, g->sg, g->su, g->sg, T * SI, g->shs, g->moe_map);
    if (!routed) {
        gpu_k_router(&g->k, g->compute, g->rl, E, K, g->sel, g->selw, T);
        gpu_k_silu_mul(&g->k, g->compute, g->sg, g->su, g->sg, T * SI, g->shs);
    }
    // the expert cache (a main layer's experts from the pool): the choices to the host, the shared
    // expert's down product queued meanwhile (it reads no routed expert: the same bits in either
    // order), then the layer's experts fetched and waited for (gpu/cache.c)
    const int cache_l = g->cached && G >= g->layers && G < g->layers + c->n_layers ? (int)(G - g->layers) : -1;
    if (cache_l >= 0) {
        gpu_cache_routed(&g->cache, g->compute, g->sel, T, K);
        // the guess for reads ahead: the next layer's router on this layer's input (its choices
        // change little over a layer); only which slots are read early depends on it
        const int nl = cache_l + 1;
        CUdeviceptr guess = 0;
        if (g->cache.read_ahead && nl < c->n_layers && nl - g->cache.first_layer < g->cache.n_layers) {
            gpu_linear(g, &g->layers[nl].router, g->xn, H, T, g->grl, E, g->xs);
            gpu_k_router(&g->k, g->compute, g->grl, E, K, g->gsel, g->gselw, T);
            guess = g->gsel;
        }
        gpu_cache_guessed(&g->cache, g->compute, guess, T, K);
        gpu_linear(g, &G->sh_down, g->sg, SI, T, g->sh, H, g->shs);
        if (gpu_cache_fetch(&g->cache, g->compute, cache_l, T, K, &g->step_err)) {
            g->step_failed = 1;   // nothing more of this step is launched (gpu_step_kernels, gpu_step)
            return;
        }
        if (g->cache.zipf > 0) {   // moet bench --route-zipf: the products take the cache's draws (pinned: queued, not waited for)
            CU_CHECK(cu.cuMemcpyHtoDAsync(g->sel, g->cache.sel, sizeof(int32_t) * (size_t)T * K, g->compute));
            routed = 0;   // (the grouping by expert redone from them)
        }
    }
    // the chain path: a step with full pieces, the main layers' plane experts (not the MTP head's: gpu_mtp_rows runs
    // with moe_kind -1) — the pieces' pairs through k_moe_up_r / k_moe_dn_r (k_moe_up_c / k_moe_dn_c's bits), the
    // others through the class order's shapes (hs and ye are a pair's rows: the two write apart). A pair's side is its token's position's alone.
    const int chain = g->moe_chain && g->mmc_live && g->mmc_np && g->k.moe_kind == GPU_W_PLANES;
    if (g->moe_mm && chain) {
        MOET_ASSERT(!routed, "the chain path: a step of %d tokens grouped by k_route", T);   // (GPU_ROUTE_T < GPU_MMC_PIECE)
        const int P = T * K, bound = gpu_moe_items_bound(P, E);
        gpu_k_moe_split(&g->k, g->compute, g->sel, P, K, E, gpu_meta(g, GM_MMC_PIECES), g->mmc_np, g->sel_c, g->sel_n);
        gpu_k_moe_sort(&g->k, g->compute, g->sel_n, P, E, g->moe_map);
        gpu_k_moe_sort_cap(&g->k, g->compute, g->sel_c, P, E, g->moe_map_c, GPU_MMW_BN);
        gpu_k_moe_up(&g->k, g->compute, G->experts, g->moe_map, E, K, g->xs, T, H, g->hs, I);
        gpu_k_moe_up_r(&g->k, g->compute, G->experts, g->moe_map_c, bound, K, g->xs, g->hs, I);
        gpu_k_moe_dn(&g->k, g->compute, G->experts, g->moe_map, E, g->hs, P, I, g->ye, H);
        gpu_k_moe_dn_r(&g->k, g->compute, G->experts, g->moe_map_c, bound, g->hs, g->ye, H);
    } else if (g->moe_mm) {   // tensor cores over the pairs grouped by expert, from xn's parts (gpu_norm's)
        if (!routed) gpu_k_moe_sort(&g->k, g->compute, g->sel, T * K, E, g->moe_map);
        gpu_k_moe_up(&g->k, g->compute, G->experts, g->moe_map, E, K, g->xs, T, H, g->hs, I);
        gpu_k_moe_dn(&g->k, g->compute, G->experts, g->moe_map, E, g->hs, T * K, I, g->ye, H);
    } else {
        gpu_k_moe_gate_up(&g->k, g->compute, G->experts, g->sel, g->xn, H, K, g->eh, I, T);
        gpu_k_moe_down(&g->k, g->compute, G->experts, g->sel, g->eh, I, g->ye, H, T * K);
    }
    if (cache_l < 0) gpu_linear(g, &G->sh_down, g->sg, SI, T, g->sh, H, g->shs);
    // y = the experts' outputs weighted + the gated shared expert's: made by the norm that adds it
    // to the residual stream next (every caller's next launch), or here
    if (g->no_fold) gpu_k_moe_combine(&g->k, g->compute, g->ye, g->sel, g->selw, g->sh, g->sgate, g->y, K, H, T);
    else g->comb_pending = 1;
}

// What a step returns: logits of each row's last token, or of every token.
enum { GPU_OUT_LAST, GPU_OUT_ALL };

// What the step must be (engine_check_step checked it in the backend; gpu_warm and the tests
// feed valid steps): asserted, since a wrong step would write outside its buffers.
static void gpu_step_assert(const gpu_engine *g, int n, const int *slots, const int32_t *ids, const int *off) {
    int T = n > 0 ? off[n] : 0, V = g->m->cfg.vocab;
    MOET_ASSERT(n >= 1 && n <= g->o.max_seqs && off[0] == 0 && T <= g->o.max_tokens, "step of %d tokens in %d rows", T, n);
    for (int i = 0; i < n; i++) {
        int s = slots[i], reach = g->pos[s] + (off[i + 1] - off[i]);
        MOET_ASSERT(s >= 0 && s < g->o.max_seqs && off[i + 1] > off[i] && reach <= g->o.max_len, "row %d: slot %d", i, s);
        for (int j = 0; j < i; j++) MOET_ASSERT(slots[j] != s, "slot %d twice in one step", s);
        MOET_ASSERT(!g->n_kv || reach <= g->seq_pages[s] * GPU_KV_PAGE, "slot %d: %d tokens in %d KV pages", s, reach,
                    g->seq_pages[s]);
    }
    for (int t = 0; t < T; t++) MOET_ASSERT(ids[t] >= 0 && ids[t] < V, "token id %d", ids[t]);
}

// k_mm_c's share of a step (g->mmc): the full pieces — positions [64m, 64m + 64) of a row wholly in it — as the step
// index of their first tokens (GM_MMC_PIECES, mmc_np of them), every other token (GM_MMC_TAIL, mmc_nt). A token's
// side depends on its sequence's position alone (sass/mm_c.cu). Without mmc: none.
static void gpu_mmc_split(gpu_engine *g, const int *pos, int n, const int *slots, const int *off) {
    int Tm = g->o.max_tokens, np = 0, nt = 0;
    int32_t *mh = g->meta_host;
    for (int i = 0; i < n && g->mmc; i++) {
        const int p = pos[slots[i]], len = off[i + 1] - off[i];
        const int m0 = (p + GPU_MMC_PIECE - 1) / GPU_MMC_PIECE, m1 = (p + len) / GPU_MMC_PIECE;   // the row's full pieces [m0, m1)
        for (int t = off[i]; t < off[i + 1]; t++) {
            const int q = p + (t - off[i]);
            if (q >= m0 * GPU_MMC_PIECE && q < m1 * GPU_MMC_PIECE) {
                if (q % GPU_MMC_PIECE == 0) mh[GM_MMC_PIECES * Tm + np++] = t;
            } else
                mh[GM_MMC_TAIL * Tm + nt++] = t;
        }
    }
    MOET_ASSERT(nt <= g->mmc_tail_max || !np, "a step of %d tokens outside full pieces; room for %d", nt, g->mmc_tail_max);
    g->mmc_np = np, g->mmc_nt = nt;
}

// Writes a step's metadata into meta_host (the layout above) for rows at positions pos[slot]
// (the slots' current ones: gpu_step_meta; the MTP head's: gpu_mtp_rows): nr output rows (as
// gpu_step's out and want say), n1 rows of one token and nm longer ones (the two GDN kernels' row
// lists); and g->reach.
static void gpu_step_meta_at(gpu_engine *g, const int *pos, int n, const int *slots, const int32_t *ids, const int *off, const uint8_t *want,
                             int out, int *nr_out, int *n1_out, int *nm_out) {
    int Tm = g->o.max_tokens, ms = g->o.max_seqs, nr = 0, n1 = 0, nm = 0, reach = 0;
    int32_t *mh = g->meta_host;
    int pieces = 0;   // k_gdn_chunk's pieces of rows_many so far
    for (int i = 0; i < n; i++) {
        int s = slots[i];
        for (int t = off[i]; t < off[i + 1]; t++) {
            mh[GM_IDS * Tm + t] = ids[t];
            mh[GM_TOK_SLOT * Tm + t] = s;
            mh[GM_TOK_POS * Tm + t] = pos[s] + (t - off[i]);
            if (out == GPU_OUT_ALL) mh[GM_OUT_ROWS * Tm + nr++] = t;
        }
        if (out == GPU_OUT_LAST && (!want || want[i])) mh[GM_OUT_ROWS * Tm + nr++] = off[i + 1] - 1;
        mh[GM_ROWS * Tm + 0 * ms + i] = s;
        mh[GM_ROWS * Tm + 1 * ms + i] = off[i];
        mh[GM_ROWS * Tm + 2 * ms + i] = off[i + 1] - off[i];
        mh[GM_ROWS * Tm + 3 * ms + i] = pos[s];
        if (off[i + 1] - off[i] == 1 || g->chunk_align == 1 || g->rule_rows) mh[GM_ROWS * Tm + 4 * ms + n1++] = i;
        else {
            mh[GM_ROWS * Tm + 6 * ms + nm] = pieces;
            pieces += gpu_gdn_row_pieces(off[i + 1] - off[i], pos[s]);
            mh[GM_ROWS * Tm + 5 * ms + nm++] = i;
        }
        if (pos[s] + off[i + 1] - off[i] > reach) reach = pos[s] + off[i + 1] - off[i];
    }
    MOET_ASSERT(pieces <= gpu_gdn_pieces_max(Tm, ms), "a step of %d GDN pieces; room for %d", pieces, gpu_gdn_pieces_max(Tm, ms));
    g->pieces = pieces;
    gpu_mmc_split(g, pos, n, slots, off);
    *nr_out = nr, *n1_out = n1, *nm_out = nm;
    g->reach = reach;   // the step's deepest token (position + 1): the chunks split attention covers
    g->step_rows = n;
}

// gpu_step_meta_at for rows at their slots' current positions.
static void gpu_step_meta(gpu_engine *g, int n, const int *slots, const int32_t *ids, const int *off, const uint8_t *want, int out,
                          int *nr_out, int *n1_out, int *nm_out) {
    gpu_step_meta_at(g, g->pos, n, slots, ids, off, want, out, nr_out, n1_out, nm_out);
}

// The kernels of a step of T tokens in n rows (n1 of one token, nm longer: gpu_step_meta's lists),
// nr output rows, on the compute stream after its metadata (gpu_step); the logits land in g->logits.
// hidden / trace: the test entry's extras (synchronous copies, host buffers as ref_forward's).
static void gpu_step_kernels(gpu_engine *g, int n, int n1, int nm, int T, int nr, float **hidden, int32_t **trace_ids, float **trace_w) {
    const ck_config *c = &g->m->cfg;
    int H = c->hidden;
    CUdeviceptr none = 0;
    g->comb_pending = 0;   // (a step that wanted no logits left its last layer's)
    gpu_k_embed(&g->k, g->compute, g->embed, gpu_meta(g, GM_IDS), g->x, H, T);
    if (hidden) {   // the stream is non-blocking: a plain copy does not wait for it
        CU_CHECK(cu.cuStreamSynchronize(g->compute));
        CU_CHECK(cu.cuMemcpyDtoH(hidden[0], g->x, sizeof(float) * (size_t)T * H));
    }
    g->mmc_live = 1;   // (the layers' products: their inputs' rows are the step's tokens)
    for (int l = 0; l < c->n_layers; l++) {
        const gpu_layer *G = &g->layers[l];
        gpu_norm(g, g->x, l ? g->y : none, &G->in_norm, g->xn, none, T);
        if (hidden && l) {
            CU_CHECK(cu.cuStreamSynchronize(g->compute));
            CU_CHECK(cu.cuMemcpyDtoH(hidden[l], g->x, sizeof(float) * (size_t)T * H));
        }
        if (c->full_attn[l]) gpu_attention_layer(g, G, g->kind_index[l], T);
        else gpu_gdn_layer(g, G, l, n, n1, nm, T);
        gpu_norm(g, g->x, g->y, &G->post_norm, g->xn, none, T);
        gpu_moe_layer(g, G, T);
        if (g->step_failed) {   // an expert could not be fetched: the step ends here (gpu_step says why)
            g->mmc_live = 0;
            return;
        }
        if (trace_ids) {
            CU_CHECK(cu.cuStreamSynchronize(g->compute));
            CU_CHECK(cu.cuMemcpyDtoH(trace_ids[l], g->sel, sizeof(int32_t) * (size_t)T * c->topk));
            CU_CHECK(cu.cuMemcpyDtoH(trace_w[l], g->selw, sizeof(float) * (size_t)T * c->topk));
        }
    }
    g->mmc_live = 0;
    if (nr == 0) return;
    gpu_norm(g, g->x, g->y, &g->final_norm, g->xn, gpu_meta(g, GM_OUT_ROWS), nr);
    if (hidden) {
        CU_CHECK(cu.cuStreamSynchronize(g->compute));
        CU_CHECK(cu.cuMemcpyDtoH(hidden[c->n_layers], g->xn, sizeof(float) * (size_t)nr * H));
    }
    gpu_linear(g, &g->lm_head, g->xn, H, nr, g->logits, c->vocab, g->xs);
}

// Captures graphs[1 .. graph_rows] (at boot: a capture launches nothing) and finds in each the
// split attention's kernel nodes, whose grid.z gpu_graph_launch sets per step.
static void gpu_graphs_capture(gpu_engine *g) {
    const ck_config *c = &g->m->cfg;
    double t0 = moet_now();
    for (int n = 1; n <= g->graph_rows; n++) {
        gpu_graph *G = &g->graphs[n];
        memset(G, 0, sizeof *G);
        G->att = g->graph_att + (size_t)n * c->n_full;
        G->att_p = g->graph_att_p + (size_t)n * c->n_full;
        g->reach = 1;   // one chunk; every step sets its own
        G->nz = 1;
        g->mmc_np = 0;   // (rows of one token: no full piece)
        CU_CHECK(cu.cuStreamBeginCapture(g->compute, GPU_CAPTURE_RELAXED));
        gpu_step_kernels(g, n, n, 0, n, n, NULL, NULL, NULL);
        CU_CHECK(cu.cuStreamEndCapture(g->compute, &G->graph));
        size_t cnt = 0;
        CU_CHECK(cu.cuGraphGetNodes(G->graph, NULL, &cnt));
        MOET_ASSERT(cnt <= g->graph_cap, "a decode graph of %zu nodes; room for %zu", cnt, g->graph_cap);
        CU_CHECK(cu.cuGraphGetNodes(G->graph, g->graph_nodes, &cnt));
        if (cnt > g->graph_size) g->graph_size = cnt;
        for (size_t i = 0; i < cnt && n <= g->att_split_T; i++) {
            int type;
            gpu_kernel_node p;
            CU_CHECK(cu.cuGraphNodeGetType(g->graph_nodes[i], &type));
            if (type != GPU_NODE_KERNEL) continue;
            CU_CHECK(cu.cuGraphKernelNodeGetParams(g->graph_nodes[i], &p));
            if (p.func != g->k.fn[K_FA] && p.func != g->k.fn_bf[K_FA] && p.func != g->k.fn[K_ATTN_PART_F32]) continue;   // (k_fa: either image's)
            MOET_ASSERT(G->n_att < c->n_full && p.grid_z == 1, "decode graph of %d rows: split attention node %d (grid.z %u)", n, G->n_att, p.grid_z);
            G->att[G->n_att] = g->graph_nodes[i];
            G->att_p[G->n_att++] = p;
        }
        MOET_ASSERT(G->n_att == (n <= g->att_split_T ? c->n_full : 0), "decode graph of %d rows: %d split attention nodes for %d layers", n,
                    G->n_att, c->n_full);
        CU_CHECK(cu.cuGraphInstantiate(&G->exec, G->graph, 0));
        CU_CHECK(cu.cuGraphUpload(G->exec, g->compute));
    }
    CU_CHECK(cu.cuStreamSynchronize(g->compute));
    g->graph_s = moet_now() - t0;
}

// Replays graph G after this step's metadata: its attention nodes first cover the chunks of the
// step's deepest token (g->reach, gpu_step_meta).
static void gpu_graph_launch(gpu_engine *g, gpu_graph *G) {
    int nz = (int)gpu_cdiv(g->reach, GPU_ATT_CHUNK);
    MOET_ASSERT(nz >= 1 && nz <= g->att_nc, "a decode graph over %d chunks of %d", nz, g->att_nc);
    if (G->n_att && nz != G->nz) {
        for (int i = 0; i < G->n_att; i++) {
            gpu_kernel_node p = G->att_p[i];
            p.grid_z = (unsigned)nz;
            CU_CHECK(cu.cuGraphExecKernelNodeSetParams(G->exec, G->att[i], &p));
        }
        G->nz = nz;
    }
    CU_CHECK(cu.cuGraphLaunch(G->exec, g->compute));
}

// The kernel of a decode graph's node (-1: not a kernel node, or none of ours).
static int gpu_graph_node_kernel(const gpu_engine *g, CUgraphNode node) {
    int type;
    CU_CHECK(cu.cuGraphNodeGetType(node, &type));
    if (type != GPU_NODE_KERNEL) return -1;
    gpu_kernel_node p;
    CU_CHECK(cu.cuGraphKernelNodeGetParams(node, &p));
    for (int i = 0; i < K_COUNT; i++)
        if (p.func == g->k.fn[i] || (g->k.fn_bf[i] && p.func == g->k.fn_bf[i])) return i;
    return -1;
}

// What each kernel costs inside the decode graph of n rows (bench --profile): the graph replayed
// `reps` times as the last step left its metadata, then again with every node of one kernel
// disabled (cuGraphNodeSetEnabled: the node does nothing), kernel by kernel. ms[i]: a replay
// without kernel i's nodes (0 where it has none), nodes[i] their count; returns a whole replay's
// ms (0: no graph of n rows). The replays compute on stale inputs and leave the sequences'
// states and caches written (a measurement's end, not a step); launches overlap in the graph
// (each kernel starts while the one before it ends), so a kernel's cost here is what the step
// saves without it, not its time alone.
static double gpu_graph_costs(gpu_engine *g, int n, int reps, double ms[K_COUNT], int nodes[K_COUNT]) {
    memset(ms, 0, sizeof(double) * K_COUNT);
    memset(nodes, 0, sizeof(int) * K_COUNT);
    if (n < 1 || n > g->graph_rows || !g->graphs[n].exec) return 0;
    gpu_graph *G = &g->graphs[n];
    size_t cnt = 0;
    CU_CHECK(cu.cuGraphGetNodes(G->graph, NULL, &cnt));
    MOET_ASSERT(cnt <= g->graph_cap, "a decode graph of %zu nodes; room for %zu", cnt, g->graph_cap);
    CU_CHECK(cu.cuGraphGetNodes(G->graph, g->graph_nodes, &cnt));
    for (size_t i = 0; i < cnt; i++) {
        int k = gpu_graph_node_kernel(g, g->graph_nodes[i]);
        if (k >= 0) nodes[k]++;
    }
    CUevent *ev = g->k.ev[0];   // the profiler's first pair (gpu_prof_start created them)
    MOET_ASSERT(ev[0] && ev[1], "gpu_graph_costs before gpu_prof_start");
    double base = 0;
    for (int kind = -1; kind < K_COUNT; kind++) {   // -1: the whole graph
        if (kind >= 0 && !nodes[kind]) continue;
        for (size_t i = 0; kind >= 0 && i < cnt; i++)
            if (gpu_graph_node_kernel(g, g->graph_nodes[i]) == kind) CU_CHECK(cu.cuGraphNodeSetEnabled(G->exec, g->graph_nodes[i], 0));
        CU_CHECK(cu.cuGraphLaunch(G->exec, g->compute));   // one untimed (the enabled set's first replay)
        CU_CHECK(cu.cuEventRecord(ev[0], g->compute));
        for (int r = 0; r < reps; r++) CU_CHECK(cu.cuGraphLaunch(G->exec, g->compute));
        CU_CHECK(cu.cuEventRecord(ev[1], g->compute));
        CU_CHECK(cu.cuEventSynchronize(ev[1]));
        float t;
        CU_CHECK(cu.cuEventElapsedTime(&t, ev[0], ev[1]));
        if (kind < 0) base = t / reps;
        else ms[kind] = t / reps;
        for (size_t i = 0; kind >= 0 && i < cnt; i++)
            if (gpu_graph_node_kernel(g, g->graph_nodes[i]) == kind) CU_CHECK(cu.cuGraphNodeSetEnabled(G->exec, g->graph_nodes[i], 1));
    }
    return base;
}

// Launches one batched step on the compute stream (as ref_forward: row i appends ids[off[i] ..
// off[i+1]) to slot slots[i]). out: GPU_OUT_LAST (the last token of each row with want, every
// row when want is NULL, in row order), GPU_OUT_ALL (off[n] rows). A step of n ≤ graph_rows rows
// of one token each, every row's logits wanted, replays graphs[n] (the same kernels).
// The logits land in g->logits (device); gpu_step_logits copies them out. hidden / trace: the
// test entry's extras (synchronous copies, host buffers as ref_forward's).
static int gpu_step(gpu_engine *g, int n, const int *slots, const int32_t *ids, const int *off, const uint8_t *want, int out,
                    float **hidden, int32_t **trace_ids, float **trace_w, int *n_out, moet_err *e) {
    // the step was checked before (gpu_step_assert): nothing here fails but a CU_CHECK, which aborts,
    // and an expert cache's fetch (a read or hash of a slot), which ends the step with e set
    gpu_step_assert(g, n, slots, ids, off);
    int T = off[n];
    // the previous step's metadata copy must be done before the host rewrites it
    CU_CHECK(cu.cuStreamSynchronize(g->compute));
    int nr, n1, nm;
    gpu_step_meta(g, n, slots, ids, off, want, out, &nr, &n1, &nm);
    CU_CHECK(cu.cuMemcpyHtoDAsync(g->meta, g->meta_host, sizeof(int32_t) * g->meta_ints, g->compute));
    if (T == n && nr == n && n <= g->graph_rows && !hidden && !trace_ids && !g->k.prof) {
        gpu_graph_launch(g, &g->graphs[n]);
        g->graph_steps++;
    } else gpu_step_kernels(g, n, n1, nm, T, nr, hidden, trace_ids, trace_w);
    if (g->step_failed) {   // the expert cache could not fetch a slot: the step's rows fail (their state is partial)
        g->step_failed = 0;
        *e = g->step_err;
        return -1;
    }
    for (int i = 0; i < n; i++) g->pos[slots[i]] += off[i + 1] - off[i];
    *n_out = nr;
    return 0;
}

// Queues the copy of the last step's logits (rows [0, nr)) into the pinned buffer.
static void gpu_step_logits_async(gpu_engine *g, int nr) {
    if (nr) CU_CHECK(cu.cuMemcpyDtoHAsync(g->logits_host, g->logits, sizeof(float) * (size_t)nr * g->m->cfg.vocab, g->compute));
}

// Queues each row's largest logit's index (rows [0, nr) of the last step: k_argmax) and its copy
// into the pinned ids_host: the tokens of greedy rows without penalties, 4 bytes a row where the
// logits are V · 4.
static void gpu_step_greedy_async(gpu_engine *g, int nr) {
    if (!nr) return;
    gpu_k_argmax(&g->k, g->compute, g->logits, g->m->cfg.vocab, g->ids, g->o.max_tokens, nr);
    CU_CHECK(cu.cuMemcpyDtoHAsync(g->ids_host, g->ids, sizeof(int32_t) * (size_t)nr, g->compute));
}

// Queues each row's pick (rows [r0, r0 + nr) of the last step, their parameters in samp_host[0, nr),
// their npen penalized tokens in samp_pen_host: k_sample) and its copy into the pinned ids_host[0,
// nr): the tokens of rows that are greedy or sample from at most GPU_SAMPLE_KMAX tokens, 4 bytes a
// row where the logits are V · 4 (penalized rows' logits are penalized in place, and the device's
// copy of their pairs written); with lp, also the rows' logprobs' parts into samp_lp_host (192 bytes
// a row).
static void gpu_step_sample_async(gpu_engine *g, int r0, int nr, int npen, int lp) {
    if (!nr) return;
    CU_CHECK(cu.cuMemcpyHtoDAsync(g->samp, g->samp_host, sizeof(gpu_samp_row) * (size_t)nr, g->compute));
    if (npen) CU_CHECK(cu.cuMemcpyHtoDAsync(g->samp_pen, g->samp_pen_host, 2 * sizeof(int32_t) * (size_t)npen, g->compute));
    const CUdeviceptr rows = g->logits + (CUdeviceptr)r0 * g->m->cfg.vocab * sizeof(float);
    gpu_k_sample(&g->k, g->compute, rows, g->m->cfg.vocab, g->samp, g->samp_pen, g->ids, g->samp_lp, nr);
    if (lp) CU_CHECK(cu.cuMemcpyDtoHAsync(g->samp_lp_host, g->samp_lp, sizeof(gpu_samp_lp) * (size_t)nr, g->compute));
    CU_CHECK(cu.cuMemcpyDtoHAsync(g->ids_host, g->ids, sizeof(int32_t) * (size_t)nr, g->compute));
}

// Copies the logits of the last step (rows [0, nr)) into the pinned buffer and waits.
static const float *gpu_step_logits(gpu_engine *g, int nr) {
    gpu_step_logits_async(g, nr);
    CU_CHECK(cu.cuStreamSynchronize(g->compute));
    return g->logits_host;
}

// ---- the MTP head (sass/MODEL.md §6) ------------------------------------------------------------

// Stage k of gpu_mtp_rows into the host buffer stages[k] [n, H] (tests), when asked.
static void gpu_mtp_stage(gpu_engine *g, float **stages, int k, CUdeviceptr src, int n) {
    if (!stages) return;
    CU_CHECK(cu.cuStreamSynchronize(g->compute));
    CU_CHECK(cu.cuMemcpyDtoH(stages[k], src, sizeof(float) * (size_t)n * g->m->cfg.hidden));
}

// The head's n rows for the sequence in slot (gpu_opts.mtp), appended to its cache at positions
// mtp_pos[slot] .. + n: row t from h [n, H] (device, f32: the main model's hidden states after
// its final norm) and next[t], the token after h_t's (as ref_mtp). u = fc(cat(norm_emb(embed(next)),
// norm_hid(h))) — the fc as its two halves, fc_hid · b + fc_emb · a, summed by the layer's input
// norm —, one gated-attention + MoE layer over the head's KV (attention kind n_full), then the
// head's norm: the rows after it in g->xn [n, H] and, when logits, the shared lm_head's logits in
// g->logits [n, V]. stages (tests: host buffers [n, H], synchronous copies): [0] the normed
// embeddings, [1] the normed hidden states, [2] u, [3] the layer's output, [4] after the head's norm.
static void gpu_mtp_rows(gpu_engine *g, int slot, int n, CUdeviceptr h, const int32_t *next, int logits, float **stages) {
    const ck_config *c = &g->m->cfg;
    const gpu_layer *L = &g->mtp_layer;
    int H = c->hidden, V = c->vocab;
    CUdeviceptr none = 0;
    MOET_ASSERT(g->o.mtp && slot >= 0 && slot < g->o.max_seqs && n >= 1 && n <= g->o.max_tokens, "MTP head: %d rows in slot %d", n, slot);
    MOET_ASSERT(g->mtp_pos[slot] + n <= g->o.max_len && (!g->n_kv || g->mtp_pos[slot] + n <= g->seq_pages[slot] * GPU_KV_PAGE),
                "MTP head of slot %d: %d + %d rows past its %d KV pages", slot, g->mtp_pos[slot], n, g->seq_pages[slot]);
    for (int t = 0; t < n; t++) MOET_ASSERT(next[t] >= 0 && next[t] < V, "token id %d", next[t]);
    CU_CHECK(cu.cuStreamSynchronize(g->compute));   // the previous step's metadata copy is done
    int off[2] = {0, n}, nr, n1, nm;
    gpu_step_meta_at(g, g->mtp_pos, 1, &slot, next, off, NULL, GPU_OUT_ALL, &nr, &n1, &nm);
    CU_CHECK(cu.cuMemcpyHtoDAsync(g->meta, g->meta_host, sizeof(int32_t) * g->meta_ints, g->compute));
    // a = norm_emb(embed(next)); y = fc_emb · a
    g->comb_pending = 0;
    gpu_k_embed(&g->k, g->compute, g->embed, gpu_meta(g, GM_IDS), g->x, H, n);
    gpu_k_add_rmsnorm(&g->k, g->compute, g->x, none, g->mtp_norm_emb, g->xn, g->xs, none, H, (float)c->eps, n);
    gpu_mtp_stage(g, stages, 0, g->xn, n);
    gpu_linear(g, &g->mtp_fc_emb, g->xn, H, n, g->y, H, g->xs);
    // b = norm_hid(h); x = fc_hid · b
    CU_CHECK(cu.cuMemcpyDtoDAsync(g->x, h, sizeof(float) * (size_t)n * H, g->compute));
    gpu_k_add_rmsnorm(&g->k, g->compute, g->x, none, g->mtp_norm_hid, g->xn, g->xs, none, H, (float)c->eps, n);
    gpu_mtp_stage(g, stages, 1, g->xn, n);
    gpu_linear(g, &g->mtp_fc_hid, g->xn, H, n, g->x, H, g->xs);
    // u = x + y, normed for the layer
    gpu_norm(g, g->x, g->y, &L->in_norm, g->xn, none, n);
    gpu_mtp_stage(g, stages, 2, g->x, n);
    gpu_attention_layer(g, L, c->n_full, n);
    gpu_norm(g, g->x, g->y, &L->post_norm, g->xn, none, n);
    // the head's experts (BF16) must not take a launch shape chosen for the main experts' kind
    int kind = g->k.moe_kind;
    g->k.moe_kind = -1;
    gpu_moe_layer(g, L, n);
    g->k.moe_kind = kind;
    gpu_norm(g, g->x, g->y, &g->mtp_norm, g->xn, none, n);
    gpu_mtp_stage(g, stages, 3, g->x, n);
    gpu_mtp_stage(g, stages, 4, g->xn, n);
    if (logits) gpu_linear(g, &g->lm_head, g->xn, H, n, g->logits, V, g->xs);
    g->mtp_pos[slot] += n;
}

// The slot's GDN states and conv windows as they were after token t of the verification just run
// (keep_hist), on the compute stream: a rejection past token t (gpu/backend.c).
static void gpu_hist_restore(gpu_engine *g, int slot, int t) {
    MOET_ASSERT(g->o.mtp && slot >= 0 && slot < g->o.max_seqs && t >= 0 && t < MOET_MAX_SPEC, "the state after token %d of slot %d", t, slot);
    CUdeviceptr win = g->win + (CUdeviceptr)slot * g->win_slot * 4, ssm = g->ssm + (CUdeviceptr)slot * g->ssm_slot * 4;
    CU_CHECK(cu.cuMemcpyDtoDAsync(win, g->hist_win + (CUdeviceptr)t * g->win_slot * 4, g->win_slot * 4, g->compute));
    CU_CHECK(cu.cuMemcpyDtoDAsync(ssm, g->hist_ssm + (CUdeviceptr)t * g->ssm_slot * 4, g->ssm_slot * 4, g->compute));
}

// The largest logit's first index of row r of g->logits (k_argmax), read back: a greedy draft.
static int32_t gpu_logits_argmax(gpu_engine *g, int r) {
    int V = g->m->cfg.vocab;
    gpu_k_argmax(&g->k, g->compute, g->logits + (CUdeviceptr)r * V * sizeof(float), V, g->ids, g->o.max_tokens, 1);
    CU_CHECK(cu.cuMemcpyDtoHAsync(g->ids_host, g->ids, sizeof(int32_t), g->compute));
    CU_CHECK(cu.cuStreamSynchronize(g->compute));
    return g->ids_host[0];
}
