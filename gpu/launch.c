// gpu/launch.c — one typed launcher per kernel of sass/: gpu_k_<kernel>(k, stream, the kernel's
// parameters in its order, then the extent of the launch).
//
// A launcher is the only place that knows how its kernel is launched: it computes the grid, the
// block and the dynamic shared memory from the shapes and the geometry constants of
// sass/gpu_abi.h (the numbers the kernel itself is compiled with), and asserts what the kernel
// assumes of its arguments (alignment of what it loads 16 bytes at a time, the limits of its
// fixed arrays). gpu_launch then checks the grid against CUDA's limits. The engine and the tests
// launch through these functions only, so a kernel's argument list is spelled once.
//
// Dimension letters as in gpu/engine.c: T tokens of the launch, H hidden, E experts, K top-k,
// I expert width; pointers are device addresses (CUdeviceptr) of f32 arrays unless said.

#define GPU_ARGS(...) ((void *[]){__VA_ARGS__})   // the addresses of a launch's arguments, in order

// Every model the config parser accepts fits the kernels' fixed arrays.
_Static_assert(MOET_MAX_HEAD_DIM <= GPU_ATT_MAX_HD && MOET_MAX_TOPK <= GPU_ROUTER_MAX_K && MOET_MAX_EXPERTS <= GPU_ROUTER_MAX_E &&
                   MOET_MAX_CONV_KERNEL <= GPU_CONV_MAX_K,
               "the limits of arena/limits.h within the kernels' (sass/gpu_abi.h)");

// Whether a is a multiple of b (a function: MOET_ASSERT's condition text must hold no '%').
static int gpu_multiple(long long a, long long b) { return a % b == 0; }
static int gpu_aligned(CUdeviceptr p, unsigned align) { return p % align == 0; }

static long long gpu_cdiv(long long a, long long b) { return (a + b - 1) / b; }

// What row_dot (sass/common.cuh) loads of a weight matrix: 16-byte chunks of rows, so rows at
// 16-byte multiples and in_features a multiple of the chunk's values (boot checks the same on
// the checkpoint: gpu_mat_check).
static void gpu_assert_rows(const char *kernel, const gpu_mat *W, int ldx) {
    int need = W->kind == GPU_W_F32 ? 4 : W->kind == GPU_W_BF16 || W->kind == GPU_W_F16 ? 8 : W->kind == GPU_W_PLANES ? 64 : 16;
    MOET_ASSERT(gpu_multiple(W->cols, need) && W->cols <= ldx, "%s: a weight of %d in_features (kind %d) over inputs of stride %d", kernel,
                W->cols, W->kind, ldx);
    MOET_ASSERT(W->kind == GPU_W_PLANES ? gpu_multiple(W->rows, 16) : gpu_multiple((long long)W->row_bytes, 16) && gpu_aligned(W->w, 16),
                "%s: weight rows are not 16-byte chunks (kind %d, %llu bytes per row)", kernel, W->kind, W->row_bytes);
}

// row_dot's activations: 16-byte loads of rows of stride ldx floats.
static void gpu_assert_x(const char *kernel, CUdeviceptr x, int ldx) {
    MOET_ASSERT(gpu_aligned(x, 16) && gpu_multiple(ldx, 4), "%s: inputs at %#llx with a stride of %d floats; 16-byte rows needed", kernel, x, ldx);
}

// ---- embedding and norms -----------------------------------------------------------------

// x[t] = E[ids[t]] for t < T. ids: int32 [T]; x [T, H].
static void gpu_k_embed(gpu_kernels *k, CUstream s, gpu_mat E, CUdeviceptr ids, CUdeviceptr x, int H, int T) {
    MOET_ASSERT(E.cols == H && E.kind <= GPU_W_F32, "k_embed: an embedding of %d columns (kind %d) for H = %d", E.cols, E.kind, H);
    gpu_launch(k, K_EMBED, (gpu_dim){T, 1, 1, "(tokens, 1, 1)"}, GPU_EMBED_NT, 0, s, GPU_ARGS(&E, &ids, &x, &H));
}

// if y: x[r] += y[r]; xn[i] = RMSNorm1p(x[r]) · (1 + w), r = rows ? rows[i] : i, for i < n;
// if xs: xn's bf16 parts as gpu_k_mm_split writes them ([GPU_MM_SPLITS][n][H]).
// x, y [·, H]; rows: int32 [n] or 0; xn [n, H].
static void gpu_k_add_rmsnorm(gpu_kernels *k, CUstream s, CUdeviceptr x, CUdeviceptr y, gpu_mat w, CUdeviceptr xn, CUdeviceptr xs,
                              CUdeviceptr rows, int H, float eps, int n) {
    MOET_ASSERT(w.cols == H, "k_add_rmsnorm: a weight of %d for H = %d", w.cols, H);
    gpu_launch(k, K_ADD_RMSNORM, (gpu_dim){n, 1, 1, "(rows, 1, 1)"}, GPU_NORM_NT, 0, s, GPU_ARGS(&x, &y, &w, &xn, &xs, &rows, &H, &eps));
}

// gpu_k_add_rmsnorm with y the MoE layer's output made in the kernel from its parts, as
// gpu_k_moe_combine makes it (the same bits as that launch then gpu_k_add_rmsnorm of its y):
// ye [·K, H] the experts' outputs by (token, choice), sel / selw [·, K], sh [·, H] the shared
// expert's, sg [·] its gate's logit — of token r for output row i.
static void gpu_k_moe_add_rmsnorm(gpu_kernels *k, CUstream s, CUdeviceptr x, CUdeviceptr ye, CUdeviceptr sel, CUdeviceptr selw, CUdeviceptr sh,
                                  CUdeviceptr sg, int K, gpu_mat w, CUdeviceptr xn, CUdeviceptr xs, CUdeviceptr rows, int H, float eps, int n) {
    MOET_ASSERT(w.cols == H, "k_moe_add_rmsnorm: a weight of %d for H = %d", w.cols, H);
    MOET_ASSERT(K >= 1 && K <= GPU_ROUTER_MAX_K && K <= GPU_NORM_NT, "k_moe_add_rmsnorm: top-%d", K);
    gpu_launch(k, K_MOE_ADD_RMSNORM, (gpu_dim){n, 1, 1, "(rows, 1, 1)"}, GPU_NORM_NT, 0, s,
               GPU_ARGS(&x, &ye, &sel, &selw, &sh, &sg, &K, &w, &xn, &xs, &rows, &H, &eps));
}

// ---- matrix products -------------------------------------------------------------------------

// y_i = x W_iᵀ for the set's matrices (sass/gpu_abi.h: gpu_lin_set, first[] in row blocks of
// GPU_LIN_ROWS), x [T, ldx].
static void gpu_k_linear(gpu_kernels *k, CUstream s, const gpu_lin_set *set, CUdeviceptr x, int ldx, int T) {
    MOET_ASSERT(set->n >= 1 && set->n <= GPU_LIN_SET && set->first[0] == 0, "k_linear: a set of %d matrices", set->n);
    for (int i = 0; i < set->n; i++) {
        gpu_assert_rows("k_linear", &set->W[i], ldx);
        MOET_ASSERT(set->first[i + 1] - set->first[i] == gpu_cdiv(set->W[i].rows, GPU_LIN_ROWS),
                    "k_linear: matrix %d of %d rows takes blocks [%d, %d)", i, set->W[i].rows, set->first[i], set->first[i + 1]);
    }
    gpu_assert_x("k_linear", x, ldx);
    gpu_launch(k, K_LINEAR, (gpu_dim){set->first[set->n], gpu_cdiv(T, GPU_LIN_TT), 1, "(row blocks of every matrix, token tiles, 1)"},
               GPU_LIN_NT, 0, s, GPU_ARGS((void *)set, &x, &ldx, &T));
}

// ---- weight descriptors ------------------------------------------------------------------------

_Static_assert((int)CK_W_BF16 == (int)GPU_W_BF16 && (int)CK_W_F16 == (int)GPU_W_F16 && (int)CK_W_F32 == (int)GPU_W_F32 &&
                   (int)CK_W_FP8 == (int)GPU_W_FP8 && (int)CK_W_NVFP4 == (int)GPU_W_NVFP4 && (int)CK_W_PLANES == (int)GPU_W_PLANES,
               "weight kinds agree");
_Static_assert(sizeof(gpu_mat) == 48, "gpu_mat is 48 bytes on both sides");

// The kernels' descriptor of matrix m with its values at device address w and its scales at
// scale (0: none): the weights uploaded by gpu_put and the expert pool's slots alike.
static gpu_mat gpu_mat_desc(const ck_mat *m, CUdeviceptr w, CUdeviceptr scale) {
    gpu_mat d;
    memset(&d, 0, sizeof d);
    d.w = w;
    d.scale = scale;
    d.row_bytes = m->row_bytes;
    d.kind = m->kind;
    d.rows = m->rows;
    d.cols = m->cols;
    d.s = m->kind == CK_W_FP8 || m->kind == CK_W_NVFP4 ? m->s : 1.f;
    return d;
}

// ---- tensor-core products (sass/mm.cu, sass/moe_mm.cu) ------------------------------------------

// Whether the tensor-core kernels take this matrix: FP8, NVFP4, BF16 or planes, in_features a
// multiple of 64 (the 64-blocks of sass/mm.cuh), rows at 16-byte multiples (planes: whole tiles of
// 16 rows). F16 and F32 weights, and other widths, take k_linear.
static int gpu_mm_ok(const gpu_mat *W) {
    if (W->kind == GPU_W_PLANES) return W->cols % 64 == 0 && W->rows % 16 == 0;
    return (W->kind == GPU_W_FP8 || W->kind == GPU_W_NVFP4 || W->kind == GPU_W_BF16) && W->cols % 64 == 0 && W->row_bytes % 16 == 0 &&
           W->w % 16 == 0;
}

// The launch shape of a step of n tokens (or expert pairs), sass/mm.cu and moe_mm.cu: 0 _d (n ≤ 8), 1 _b
// (n ≤ GPU_MM_TOK_B), 2 _p; its row tiles of 16 per block and tokens per block. The sums are the
// same bits in every shape (sass/mm.cuh: the order depends on K alone).
static int gpu_mm_shape(long long n) { return n <= 8 ? 0 : n <= GPU_MM_TOK_B ? 1 : 2; }
static const int gpu_mm_rt[3] = {1, 1, 2};
static const int gpu_mm_tok[3] = {8, GPU_MM_TOK, GPU_MM_TOK};

// xs = the three bf16 parts of x [T, ldx]'s first K columns: bf16 [GPU_MM_SPLITS][T][K].
static void gpu_k_mm_split(gpu_kernels *k, CUstream s, CUdeviceptr x, int ldx, int K, int T, CUdeviceptr xs) {
    MOET_ASSERT(gpu_multiple(K, 64) && K <= ldx && gpu_multiple(ldx, 4) && gpu_aligned(x, 16), "k_mm_split: %d columns of rows of %d floats", K,
                ldx);
    long long n = (long long)T * K / 4;
    gpu_launch(k, K_MM_SPLIT, (gpu_dim){gpu_cdiv(n, GPU_MM_NT), 1, 1, "(quads / threads, 1, 1)"}, GPU_MM_NT, 0, s,
               GPU_ARGS(&x, &ldx, &K, &T, &xs));
}

// A kernel with static shared memory (at most GPU_SMEM_STATIC of it) that asks for smem dynamic bytes:
// past 48 KiB together they need its opt-in, taken once up to the device's limit less the static
// room. Returns whether the launch fits.
#define GPU_SMEM_STATIC 20480   // bytes: room for a kernel's static arrays (k_moe_dn_d: 16 KiB of sums and the table)
static int gpu_smem_room(gpu_kernels *k, int fn, size_t smem) {
    if (smem + GPU_SMEM_STATIC > GPU_SMEM_DEFAULT && k->smem_max[fn] == GPU_SMEM_DEFAULT && k->smem_optin > GPU_SMEM_STATIC)
        gpu_kernel_smem(k, fn, (size_t)k->smem_optin - GPU_SMEM_STATIC);
    return k->smem_max[fn] == GPU_SMEM_DEFAULT ? smem + GPU_SMEM_STATIC <= GPU_SMEM_DEFAULT : smem <= (size_t)k->smem_max[fn];
}

// k_mm_g's dynamic shared memory for weights of kind (sass/mm.cuh: mmg_stage): GPU_MMG_STAGES stages
// of the weights' slots (2, or 4 for BF16, 16-byte slots per thread) and the tokens' parts the
// products read (k->parts of them).
static size_t gpu_mmg_smem_bn(const gpu_kernels *k, int kind, int bn) {
    return (size_t)GPU_MMG_STAGES * ((kind == GPU_W_BF16 ? 4 : 2) * GPU_MM_NT * 16 + 2 * (size_t)k->parts * bn * 64);
}

// Whether k_mm_t can take every matrix of the set: each bulk copy's source and size 16-byte
// aligned (sass/mm.cuh: mt_kind, mt_kbc) — FP8 and BF16 rows, NVFP4 rows and their scale rows (K a
// multiple of 256), the planes as stored.
static int gpu_mt_ok(const gpu_lin_set *set) {
    for (int i = 0; i < set->n; i++) {
        const gpu_mat *W = &set->W[i];
        if (W->w % 16 || W->scale % 16 || (W->kind != GPU_W_PLANES && W->row_bytes % 16) || (W->kind == GPU_W_NVFP4 && W->cols % 256)) return 0;
    }
    return 1;
}

// The dynamic shared memory of gpu_k_mm_stream's kernel for a step of T tokens (bulk as there).
static size_t gpu_mm_stream_smem(const gpu_kernels *k, const gpu_lin_set *set, int T, int bulk) {
    if (bulk == 4) return GPU_MM_RING_BYTES + GPU_MM_V4_RED;
    return bulk == 2 ? GPU_MM_RING_BYTES : (bulk ? GPU_MT_RING : GPU_MM_RING_BYTES) + (size_t)2 * k->parts * T * set->W[0].cols;
}

// k_mm_v (bulk 0), k_mm_t (bulk 1, gpu_mt_ok), k_mm_v2 (bulk 2: GPU_MM_TOK_V + 1 to
// GPU_MM_TOK_V2 tokens, read from xs) or k_mm_v4 (bulk 4: GPU_MM_TOK_V2 + 1 to GPU_MM_TOK_V4):
// runs of row tiles per block, GPU_MM_V_BLOCKS (GPU_MT_BLOCKS, GPU_MM_V2_BLOCKS,
// GPU_MM_V4_BLOCKS) blocks per multiprocessor, the ring of weights and (k_mm_v, k_mm_t) the
// tokens' parts or (k_mm_v4) the warps' sums in dynamic shared memory (it must fit the device:
// asserted); the same bits.
static void gpu_k_mm_stream(gpu_kernels *k, CUstream s, gpu_lin_set *set, CUdeviceptr xs, int T, int bulk) {
    const int fn = bulk == 4 ? K_MM_V4 : bulk == 2 ? K_MM_V2 : bulk ? K_MM_T : K_MM_V;
    const int tmax = bulk == 4 ? GPU_MM_TOK_V4 : bulk == 2 ? GPU_MM_TOK_V2 : GPU_MM_TOK_V;
    const size_t smem = gpu_mm_stream_smem(k, set, T, bulk);
    const int room = gpu_smem_room(k, fn, smem);   // (the kernel's opt-in, taken once)
    MOET_ASSERT(T >= 1 && T <= tmax && (bulk != 1 || gpu_mt_ok(set)) && room,
                "%s: %d tokens, %zu bytes of shared memory", gpu_kernel_names[fn], T, smem);
    long long tiles = 0;
    for (int i = 0; i < set->n; i++) tiles += gpu_cdiv(set->W[i].rows, 16);
    const int bpm = bulk == 4 ? GPU_MM_V4_BLOCKS : bulk == 2 ? GPU_MM_V2_BLOCKS : bulk ? GPU_MT_BLOCKS : GPU_MM_V_BLOCKS;
    int per = (int)gpu_cdiv(tiles, (long long)bpm * (k->sms > 0 ? k->sms : 1));
    set->pad[0] = per;
    set->first[0] = 0;
    for (int i = 0; i < set->n; i++) set->first[i + 1] = set->first[i] + (int)gpu_cdiv(gpu_cdiv(set->W[i].rows, 16), per);
    gpu_launch(k, fn, (gpu_dim){set->first[set->n], 1, 1, "(runs of row tiles of every matrix, 1, 1)"}, GPU_MM_NT, smem, s,
               GPU_ARGS((void *)set, &xs, &T));
}

static void gpu_k_mm_fixed(gpu_kernels *k, CUstream s, gpu_lin_set *set, CUdeviceptr xs, int T, int sh);

// k_mm_g's shared memory for the set (its widest kind's stages), or 0 when a matrix is planes
// (k_mm_g carries FP8, NVFP4 and BF16).
static size_t gpu_mm_g_smem(const gpu_kernels *k, const gpu_lin_set *set, int bn) {
    size_t gsmem = 0;
    for (int i = 0; i < set->n; i++) {
        if (set->W[i].kind == GPU_W_PLANES) return 0;
        gsmem = gpu_mmg_smem_bn(k, set->W[i].kind, bn) > gsmem ? gpu_mmg_smem_bn(k, set->W[i].kind, bn) : gsmem;
    }
    return gsmem;
}

// The shape of a step of T > GPU_MM_TOK_V tokens (or one whose tokens do not fit k_mm_v): 3
// k_mm_g — tiles of GPU_MMG_BM rows × GPU_MMG_BN tokens, both operands staged, where its shared
// memory fits (not on a GB10) — for steps of k->mm_g_min tokens or more, and from a whole token
// tile where its blocks (row blocks × token tiles) number k->mm_g_blocks or more (4: k_mm_g32, its
// tiles of GPU_MMG_BN32 tokens, for such steps of up to k->mm_g32_max tokens; 5: k_mm_g128, tiles of
// GPU_MMG_BN128 tokens, for such steps of k->mm_g128_min tokens or more where the products read one
// part); else gpu_mm_shape's,
// _p for a step of up to GPU_MM_TOK_B tokens whose T · rows reach k->mm_p_work. The kernel harness
// on the H200 (`k_mm shapes`, the same bits in each): at 64 tokens the GDN in-projections (98 blocks)
// `_b` 154.0, `_p` 118.6, `_g` 79.9 µs, attention o (16 blocks) 51.1, 38.2, 145.2; at 16 tokens
// attention q|k|v (T · rows 147,456) 47.3, 43.8, 81.6, attention o (32,768) 21.5, 28.0, 146.1.
static int gpu_mm_pick(gpu_kernels *k, const gpu_lin_set *set, int T) {
    long long rows = 0, blocks = 0;
    for (int i = 0; i < set->n; i++) rows += set->W[i].rows, blocks += gpu_cdiv(set->W[i].rows, GPU_MMG_BM);
    blocks *= gpu_cdiv(T, GPU_MMG_BN);
    const size_t gsmem = gpu_mm_g_smem(k, set, GPU_MMG_BN), gsmem32 = gpu_mm_g_smem(k, set, GPU_MMG_BN32);
    if ((T >= k->mm_g_min || (T >= GPU_MMG_BN && blocks >= k->mm_g_blocks)) && gsmem && gpu_smem_room(k, K_MM_G, gsmem)) {
        if (k->parts == 1 && k->mm_g128_min && T >= k->mm_g128_min && gpu_smem_room(k, K_MM_G128, gpu_mm_g_smem(k, set, GPU_MMG_BN128))) return 5;
        return T <= k->mm_g32_max && gpu_smem_room(k, K_MM_G32, gsmem32) ? 4 : 3;
    }
    const int sh = gpu_mm_shape(T);
    return sh == 1 && (long long)T * rows >= k->mm_p_work ? 2 : sh;
}

// Whether kernel fn can have `bytes` of dynamic shared memory, opting it in to exactly that once: for
// the warp-specialised kernels, whose static arrays (1 KiB and their barriers) leave them more than
// gpu_smem_room's margin of GPU_SMEM_STATIC would (4 KiB of room kept).
static int gpu_smem_exact(gpu_kernels *k, int fn, size_t bytes) {
    if ((size_t)k->smem_max[fn] < bytes && bytes + 4096 <= (size_t)k->smem_optin) gpu_kernel_smem(k, fn, bytes);
    return (size_t)k->smem_max[fn] >= bytes;
}

// Whether a step of T tokens takes k_mm_w for the set's FP8 and NVFP4 matrices (the rest, if any, in
// a launch of their own: the same bits either way): one part, k->mm_w_min tokens or more or up to
// k->mm_w_small, a matrix of those kinds in the set, and the kernel's GPU_MMW_SMEM of shared memory
// (gpu_smem_exact). (gpu_k_mm asks only for steps that would take k_mm_g's tiles.)
static int gpu_mm_w_take(gpu_kernels *k, const gpu_lin_set *set, int T) {
    if (k->parts != 1 || !k->mm_w_min || (T < k->mm_w_min && T > k->mm_w_small)) return 0;
    int any = 0;
    for (int i = 0; i < set->n; i++) any |= set->W[i].kind == GPU_W_FP8 || set->W[i].kind == GPU_W_NVFP4;
    return any && gpu_smem_exact(k, K_MM_W, GPU_MMW_SMEM);
}

// k_mm_c over np full pieces (pieces: their first tokens' step indices, int [np]) for the set's matrices, every one
// FP8 (set->first is set here, in row blocks of GPU_MMC_BM); xs: the step's one bf16 part [T][K] (k->mm_c: the
// one-part sm_90a image).
static void gpu_k_mm_c(gpu_kernels *k, CUstream s, gpu_lin_set *set, CUdeviceptr xs, CUdeviceptr pieces, int np) {
    const int room = gpu_smem_exact(k, K_MM_C, GPU_MMC_SMEM);   // (the kernel's opt-in, taken once)
    MOET_ASSERT(k->mm_c && k->parts == 1 && np >= 1 && set->n >= 1 && room, "k_mm_c: %d pieces, %d parts, %d bytes of shared memory", np,
                k->parts, GPU_MMC_SMEM);
    set->first[0] = 0;
    for (int i = 0; i < set->n; i++) {
        MOET_ASSERT(set->W[i].kind == GPU_W_FP8 && (set->W[i].cols & 63) == 0 && set->W[i].cols == set->W[0].cols, "k_mm_c: matrix %d (kind %d, [%d, %d])",
                    i, set->W[i].kind, set->W[i].rows, set->W[i].cols);
        set->first[i + 1] = set->first[i] + (int)gpu_cdiv(set->W[i].rows, GPU_MMC_BM);
    }
    gpu_launch(k, K_MM_C, (gpu_dim){set->first[set->n], gpu_cdiv(np, GPU_MMC_BN / GPU_MMC_PIECE), 1, "(row blocks of every matrix, token tiles of pieces, 1)"},
               GPU_MMC_NT, GPU_MMC_SMEM, s, GPU_ARGS((void *)set, &xs, &pieces, &np));
}

// k_rows: n rows of `words` 4-byte words, dst[i] = src[list[i]] (scatter 0) or dst[list[i]] = src[i] (scatter 1).
static void gpu_k_rows(gpu_kernels *k, CUstream s, CUdeviceptr src, long long lds, CUdeviceptr dst, long long ldd, CUdeviceptr list, int n, int words,
                       int scatter) {
    MOET_ASSERT(n >= 1 && words >= 1 && lds >= words && ldd >= words, "k_rows: %d rows of %d words (ld %lld, %lld)", n, words, lds, ldd);
    gpu_launch(k, K_ROWS, (gpu_dim){n, gpu_cdiv(words, GPU_ROWS_NT), 1, "(rows, blocks of a row's words, 1)"}, GPU_ROWS_NT, 0, s,
               GPU_ARGS(&src, &lds, &dst, &ldd, &list, &words, &scatter));
}

static void gpu_k_mm(gpu_kernels *k, CUstream s, gpu_lin_set *set, CUdeviceptr xs, int T);

// A step's full pieces and the other tokens (gpu/engine.c: gpu_mmc_split): the pieces' first tokens (int [np]) and the
// others (int [nt]), device addresses; room for the others' inputs (xs_t: [nt][K] bf16) and outputs (y_t: [nt][rows]).
typedef struct {
    CUdeviceptr pieces, tail, xs_t, y_t;
    int np, nt;
    size_t rows;
} gpu_mmc_step;

// The set's products for a step with full pieces, from xs (one bf16 part [T][K]): its FP8 matrices by k_mm_c over the
// pieces and by gpu_k_mm over the other tokens (gathered into xs_t, their outputs into y_t and scattered back by
// k_rows), its other matrices by gpu_k_mm over every token. A token's outputs: k_mm_c's bits in a piece, gpu_k_mm's
// (the same as a step without pieces) elsewhere.
static void gpu_k_mm_mmc(gpu_kernels *k, CUstream s, const gpu_lin_set *set, CUdeviceptr xs, int T, const gpu_mmc_step *m) {
    gpu_lin_set cs, ts, rs;
    memset(&cs, 0, sizeof cs), memset(&ts, 0, sizeof ts), memset(&rs, 0, sizeof rs);
    const int K = set->W[0].cols;
    size_t col = 0;
    for (int i = 0; i < set->n; i++) {
        gpu_lin_set *d = set->W[i].kind == GPU_W_FP8 ? &cs : &rs;
        d->W[d->n] = set->W[i], d->y[d->n] = set->y[i], d->ldy[d->n] = set->ldy[i], d->n++;
        if (set->W[i].kind == GPU_W_FP8) ts.W[ts.n] = set->W[i], ts.y[ts.n] = m->y_t + 4 * col, ts.n++, col += (size_t)set->W[i].rows;
    }
    for (int i = 0; i < ts.n; i++) ts.ldy[i] = (int)col;
    MOET_ASSERT(col <= m->rows && m->np >= 1 && m->nt >= 0 && m->np * GPU_MMC_PIECE + m->nt == T,
                "k_mm_c: a set of %zu rows (room for %zu); %d pieces and %d other tokens of %d", col, m->rows, m->np, m->nt, T);
    if (cs.n) {
        gpu_k_mm_c(k, s, &cs, xs, m->pieces, m->np);
        if (m->nt) {
            gpu_k_rows(k, s, xs, K / 2, m->xs_t, K / 2, m->tail, m->nt, K / 2, 0);
            gpu_k_mm(k, s, &ts, m->xs_t, m->nt);
            for (int i = 0; i < ts.n; i++) gpu_k_rows(k, s, ts.y[i], (long long)col, cs.y[i], cs.ldy[i], m->tail, m->nt, cs.W[i].rows, 1);
        }
    }
    if (rs.n) gpu_k_mm(k, s, &rs, xs, T);
}

// k_mm_w on the set's FP8 and NVFP4 matrices, then gpu_k_mm on the others (BF16: never k_mm_w's).
static void gpu_k_mm_w(gpu_kernels *k, CUstream s, const gpu_lin_set *set, CUdeviceptr xs, int T) {
    gpu_lin_set w, rest;
    memset(&w, 0, sizeof w), memset(&rest, 0, sizeof rest);
    for (int i = 0; i < set->n; i++) {
        gpu_lin_set *d = set->W[i].kind == GPU_W_FP8 || set->W[i].kind == GPU_W_NVFP4 ? &w : &rest;
        d->W[d->n] = set->W[i], d->y[d->n] = set->y[i], d->ldy[d->n] = set->ldy[i], d->n++;
    }
    w.first[0] = 0;
    for (int i = 0; i < w.n; i++) w.first[i + 1] = w.first[i] + (int)gpu_cdiv(w.W[i].rows, GPU_MMW_BM);
    gpu_launch(k, K_MM_W, (gpu_dim){w.first[w.n], gpu_cdiv(T, GPU_MMW_BN), 1, "(row blocks of every FP8 / NVFP4 matrix, token tiles, 1)"},
               GPU_MMW_NT, GPU_MMW_SMEM, s, GPU_ARGS((void *)&w, &xs, &T));
    if (rest.n) gpu_k_mm(k, s, &rest, xs, T);
}

// y_i = x W_iᵀ for the set's matrices (W, y, ldy and n filled; first[] is set here) from xs, the
// parts of x [T, K] (gpu_k_mm_split).
static void gpu_k_mm(gpu_kernels *k, CUstream s, gpu_lin_set *set, CUdeviceptr xs, int T) {
    int sh = gpu_mm_shape(T);
    MOET_ASSERT(set->n >= 1 && set->n <= GPU_LIN_SET, "k_mm: a set of %d matrices", set->n);
    set->first[0] = 0;   // (each shape's blocks per matrix below)
    for (int i = 0; i < set->n; i++)
        MOET_ASSERT(gpu_mm_ok(&set->W[i]) && set->W[i].cols == set->W[0].cols, "k_mm: matrix %d (kind %d, [%d, %d])", i, set->W[i].kind,
                    set->W[i].rows, set->W[i].cols);
    // k_mm_v, or k_mm_t for sets of GPU_MT_MIN_BYTES of weights or more but FP8 (the kernel
    // harness on the H200: the NVFP4 lm_head 343 → 244 µs at one token, 401 → 298 at four; a 64 MiB
    // BF16 stream 45 → 33 at one, even at four; the FP8 products within 1 µs at one token and up to
    // 12 µs slower at four, k_mm_v ahead on small sets): runs of row tiles per block, the ring of
    // weights and the tokens' parts in shared memory, where they fit (48 + 96 KiB at T = 4 and
    // K = 4,096; a GB10 block takes 99 KiB: there such a step takes k_mm_d, the same bits).
    // Static and dynamic shared memory together past 48 KiB need the kernel's opt-in: taken once,
    // up to the device's limit less room for the kernel's static arrays (red, lut: ~8 KiB).
    if (T <= GPU_MM_TOK_V && gpu_smem_room(k, K_MM_V, gpu_mm_stream_smem(k, set, T, 0))) {
        double bytes = 0;
        int fp8 = 0;
        for (int i = 0; i < set->n; i++) {
            bytes += set->W[i].kind == GPU_W_PLANES ? (double)set->W[i].rows * set->W[i].cols / 4 : (double)set->W[i].rows * (double)set->W[i].row_bytes;
            fp8 |= set->W[i].kind == GPU_W_FP8;
        }
        int bulk = !fp8 && bytes >= GPU_MT_MIN_BYTES && gpu_mt_ok(set) && gpu_smem_room(k, K_MM_T, gpu_mm_stream_smem(k, set, T, 1));
        gpu_k_mm_stream(k, s, set, xs, T, bulk);
        return;
    }
    // k_mm_v2 for steps of GPU_MM_TOK_V + 1 to GPU_MM_TOK_V2 tokens (a batch of decoding sequences):
    // k_mm_v's ring, the tokens read from xs (the kernel harness on the H200 at 16 tokens, against
    // _b / _p: attention q|k|v 18.6 against 25.6 / 25.0 µs, GDN in-projections 19.2 against 30.0 /
    // 26.4, the lm_head 397.0 against 594.5 / 519.0; batch-16 decode 1,869–1,875 → 1,971–1,982 tok/s)
    if (k->mm_v2 && T > GPU_MM_TOK_V && T <= GPU_MM_TOK_V2 && gpu_smem_room(k, K_MM_V2, gpu_mm_stream_smem(k, set, T, 2))) {
        gpu_k_mm_stream(k, s, set, xs, T, 2);
        return;
    }
    // k_mm_v4 for GPU_MM_TOK_V2 + 1 to GPU_MM_TOK_V4 tokens: k_mm_v2's in four n-tiles
    if (k->mm_v4 && T > GPU_MM_TOK_V2 && T <= GPU_MM_TOK_V4 && gpu_smem_room(k, K_MM_V4, gpu_mm_stream_smem(k, set, T, 4))) {
        gpu_k_mm_stream(k, s, set, xs, T, 4);
        return;
    }
    sh = gpu_mm_pick(k, set, T);
    if (sh >= 3 && gpu_mm_w_take(k, set, T)) {   // k_mm_w where it would take k_mm_g's tiles
        gpu_k_mm_w(k, s, set, xs, T);
        return;
    }
    if (sh >= 3) {   // k_mm_g, k_mm_g32, k_mm_g128: tiles of GPU_MMG_BN, GPU_MMG_BN32 or GPU_MMG_BN128 tokens
        const int bn = sh == 5 ? GPU_MMG_BN128 : sh == 4 ? GPU_MMG_BN32 : GPU_MMG_BN;
        for (int i = 0; i < set->n; i++) set->first[i + 1] = set->first[i] + (int)gpu_cdiv(set->W[i].rows, GPU_MMG_BM);
        gpu_launch(k, sh == 5 ? K_MM_G128 : sh == 4 ? K_MM_G32 : K_MM_G, (gpu_dim){set->first[set->n], gpu_cdiv(T, bn), 1, "(row blocks of every matrix, token tiles, 1)"},
                   GPU_MM_NT, gpu_mm_g_smem(k, set, bn), s, GPU_ARGS((void *)set, &xs, &T));
        return;
    }
    gpu_k_mm_fixed(k, s, set, xs, T, sh);
}

// gpu_k_mm in launch shape sh (0 _d, 1 _b, 2 _p) whatever T (the harness compares them); set->first
// in that shape's row blocks.
static void gpu_k_mm_fixed(gpu_kernels *k, CUstream s, gpu_lin_set *set, CUdeviceptr xs, int T, int sh) {
    static const int fn[3] = {K_MM_D, K_MM_B, K_MM_P};
    set->first[0] = 0;
    for (int i = 0; i < set->n; i++) set->first[i + 1] = set->first[i] + (int)gpu_cdiv(set->W[i].rows, 16 * gpu_mm_rt[sh]);
    gpu_launch(k, fn[sh], (gpu_dim){set->first[set->n], gpu_cdiv(T, gpu_mm_tok[sh]), 1, "(row blocks of every matrix, token tiles, 1)"},
               GPU_MM_NT, 0, s, GPU_ARGS((void *)set, &xs, &T));
}

// The routed experts' launch shape for P = T·K pairs over E experts: 0 _d (P ≤ GPU_MM_TOK_B, or
// up to k->moe_d_ppe pairs per expert on average: items of at most GPU_MOE_CAP_D pairs staged in
// shared memory), 1 _p (items of GPU_MM_TOK), 2 _g (items
// of GPU_MMG_BN through k_mm_g's stages: planes and NVFP4 experts where its shared memory fits, and
// a step of k->moe_g_min pairs per expert or more (GPU_MMG_BN / 2: measured on the H200 at 16 pairs
// per expert, k_moe_up_g's emptier tiles took 1.31 ms where _p took 0.78), 3 _g128 (items of
// GPU_MMG_BN128 pairs, k_moe_up_g128 / k_moe_dn_g128, from k->moe_g128_min pairs per expert where
// the products read one bf16 part); the pairs an item holds, and the
// row tiles of 16 per block of k_moe_up and k_moe_dn (_d, _p). Every shape gives the same bits. The
// grouping (k_moe_sort, k_route) and the products take the same shape: k->moe_kind is set once
// (the MTP head's BF16 experts run with it at -1: gpu_mtp_rows).
static int gpu_moe_shape(gpu_kernels *k, long long P, int E) {
    MOET_ASSERT(k->moe_d_ppe >= 0 && k->moe_d_ppe <= GPU_MOE_D_PPE, "gpu_moe_shape: _d up to %d pairs per expert", k->moe_d_ppe);
    if (P <= GPU_MM_TOK_B || P <= (long long)k->moe_d_ppe * E) return 0;
    const size_t s64 = gpu_mmg_smem_bn(k, k->moe_kind, GPU_MMG_BN);
    int g = P >= (long long)k->moe_g_min * E && (k->moe_kind == GPU_W_PLANES || k->moe_kind == GPU_W_NVFP4) &&
            gpu_smem_room(k, K_MOE_UP_G, s64) && gpu_smem_room(k, K_MOE_DN_G, s64);
    if (!g) return 1;
    const size_t s128 = gpu_mmg_smem_bn(k, k->moe_kind, GPU_MMG_BN128);
    const int g128 = k->parts == 1 && k->moe_g128_min && P >= (long long)k->moe_g128_min * E && gpu_smem_room(k, K_MOE_UP_G128, s128) &&
                     gpu_smem_room(k, K_MOE_DN_G128, s128);
    return g128 ? 3 : 2;
}
static int gpu_moe_cap(gpu_kernels *k, long long P, int E) {
    static const int cap[4] = {GPU_MOE_CAP_D, GPU_MM_TOK, GPU_MMG_BN, GPU_MMG_BN128};
    return cap[gpu_moe_shape(k, P, E)];
}
static const int gpu_moe_rt_up[2] = {1, 2}, gpu_moe_rt_dn[2] = {4, 2};

// The expert map of P = T·K pairs over E experts: how many items (runs of ≤ the shape's cap pairs
// of one expert; counted with the smallest cap of P's shapes: GPU_MOE_CAP_D up to GPU_MOE_D_PPE
// pairs per expert, whatever k->moe_d_ppe is, GPU_MM_TOK past it) a step
// can have, and the ints of the map (sass/moe_mm.cu) for any step of up to P pairs (a smaller step
// may hold more items: its items are smaller).
static int gpu_moe_items_bound(long long P, int E) {
    long long b = gpu_cdiv(P, P <= GPU_MM_TOK_B || P <= (long long)GPU_MOE_D_PPE * E ? GPU_MOE_CAP_D : GPU_MM_TOK) + E;
    return (int)(b < P ? b : P);
}
static int gpu_moe_items_max(long long P, int E) {
    const long long d = GPU_MM_TOK_B > (long long)GPU_MOE_D_PPE * E ? GPU_MM_TOK_B : (long long)GPU_MOE_D_PPE * E;   // the most pairs of _d
    int a = gpu_moe_items_bound(P, E), b = gpu_moe_items_bound(P < d ? P : d, E);
    return a > b ? a : b;
}
// (+ the grouped form's hist [⌈P / GPU_MOE_SORT_PB⌉][E] past perm, where P is past one block's: gpu_k_moe_sort; a step
// of fewer pairs finds its hist inside the allocation of the most: its items bound and P are no larger)
static size_t gpu_moe_map_ints(long long P, int E) {
    return 1 + 3 * (size_t)gpu_moe_items_max(P, E) + (size_t)P + (P > GPU_MOE_SORT_PB ? (size_t)gpu_cdiv(P, GPU_MOE_SORT_PB) * E : 0);
}

// map = the pairs of sel (int32 [P]) grouped by expert (sass/moe_mm.cu): one block, or past k->moe_sort_pb pairs the
// grouped form (k_moe_hist, k_moe_place: a block a GPU_MOE_SORT_PB pairs; the same items, each expert's pairs in another
// order — any order serves, as the one block's atomics give).
static void gpu_k_moe_sort_cap(gpu_kernels *k, CUstream s, CUdeviceptr sel, int P, int E, CUdeviceptr map, int cap);
static void gpu_k_moe_sort(gpu_kernels *k, CUstream s, CUdeviceptr sel, int P, int E, CUdeviceptr map) {
    gpu_k_moe_sort_cap(k, s, sel, P, E, map, gpu_moe_cap(k, P, E));
}
// ... in items of up to cap pairs (at least the smallest cap of P's shapes: the items bound holds); a pair of expert
// E or past it (k_moe_split's) is dropped.
static void gpu_k_moe_sort_cap(gpu_kernels *k, CUstream s, CUdeviceptr sel, int P, int E, CUdeviceptr map, int cap) {
    MOET_ASSERT(E >= 1 && E <= GPU_MOE_SORT_NT && E <= GPU_ROUTER_MAX_E && P >= 1 && cap >= gpu_moe_cap(k, P, E), "k_moe_sort: %d experts, cap %d", E, cap);
    int bound = gpu_moe_items_bound(P, E);
    if (k->moe_sort_pb > 0 && P > k->moe_sort_pb && P > GPU_MOE_SORT_PB) {
        const int nb = (int)gpu_cdiv(P, GPU_MOE_SORT_PB);
        gpu_launch(k, K_MOE_HIST, (gpu_dim){nb, 1, 1, "(blocks of GPU_MOE_SORT_PB pairs, 1, 1)"}, GPU_MOE_HIST_NT, 0, s, GPU_ARGS(&sel, &P, &E, &map, &bound));
        gpu_launch(k, K_MOE_PLACE, (gpu_dim){nb, 1, 1, "(blocks of GPU_MOE_SORT_PB pairs, 1, 1)"}, GPU_MOE_SORT_NT, 0, s,
                   GPU_ARGS(&sel, &P, &E, &map, &bound, &cap));
        return;
    }
    gpu_launch(k, K_MOE_SORT, (gpu_dim){1, 1, 1, "(1, 1, 1)"}, GPU_MOE_SORT_NT, 0, s, GPU_ARGS(&sel, &P, &E, &map, &bound, &cap));
}

// A step of T ≤ GPU_ROUTE_T tokens in one launch (sass/route.cu): the router of logits [T, E]
// into sel, selw [T, K]; h = SiLU(g) · u [n = T·SI] and its parts hs; map = the pairs grouped by
// expert (gpu_k_moe_sort's). Returns 0 (nothing launched) when the routers' shared memory does not
// fit: the caller then launches the three kernels.
static int gpu_k_route(gpu_kernels *k, CUstream s, CUdeviceptr logits, int E, int K, int T, CUdeviceptr sel, CUdeviceptr selw, CUdeviceptr g,
                       CUdeviceptr u, CUdeviceptr h, int n, CUdeviceptr hs, CUdeviceptr map) {
    size_t smem = sizeof(float) * (size_t)T * K;
    if (T < 1 || T > GPU_ROUTE_T || !gpu_smem_room(k, K_ROUTE, smem)) return 0;
    MOET_ASSERT(E >= 1 && E <= GPU_MOE_SORT_NT && E <= GPU_ROUTER_MAX_E && K >= 1 && K <= GPU_ROUTER_MAX_K && K <= E,
                "k_route: top-%d of %d experts", K, E);
    int P = T * K, bound = gpu_moe_items_bound(P, E), cap = gpu_moe_cap(k, P, E);
    // threads: a warp per token's router and one per expert for the grouping's scans, no more (no
    // result depends on the block's size; on the H200 a batch-1 step's 40 launches took 0.483 ms
    // against 0.485 with 1,024 threads, one by one)
    const int nt = 32 * (T > gpu_cdiv(E, 32) ? T : gpu_cdiv(E, 32));
    // the shared expert's SiLU · up over blocks of their own past block 0 (which routes and groups),
    // an element a thread where GPU_ROUTE_SILU_BLOCKS allow (k->route_silu; 0: block 0 takes it)
    const int sb = k->route_silu ? (int)(gpu_cdiv(n, nt) < GPU_ROUTE_SILU_BLOCKS ? gpu_cdiv(n, nt) : GPU_ROUTE_SILU_BLOCKS) : 0;
    gpu_launch(k, K_ROUTE, (gpu_dim){1 + sb, 1, 1, "(1 + SiLU blocks, 1, 1)"}, nt, smem, s,
               GPU_ARGS(&logits, &E, &K, &T, &sel, &selw, &g, &u, &h, &n, &hs, &map, &bound, &cap));
    return 1;
}

// The row blocks a block of the _d shape takes (its item's activations staged once for them, the
// same bits with any): k->moe_nrb, or the most of 1, 2, 4, 8 (2 where the 2-bit planes' own
// kernels take the step: GPU_MOE_NRB_DG) that dividing rb row blocks leaves GPU_MOE_NRB_FILL
// blocks per multiprocessor for the step's items bound (a decode step of one token: 8 items × 32
// row blocks, each its own block).
// (GPU_MOE_NRB_DG: H200, full-size synthetic model, decode at depth 64 in one lease, capped at 8 /
// 4 / 2: batch 64 4,164.8-4,192.5 / 4,286.9-4,306.4 / 4,308.0-4,316.3 tok/s, batch 32
// 2,967.0-2,984.5 / 2,976.9-2,984.6 / 3,026.6-3,029.8, batch 16 the same: 2 already)
#define GPU_MOE_NRB_FILL 8
#define GPU_MOE_NRB_DG 2
static int gpu_moe_nrb(gpu_kernels *k, int items, int rb) {
    if (k->moe_nrb > 0) return k->moe_nrb;
    const int most = k->moe_kind == GPU_W_PLANES && k->moe_dg ? GPU_MOE_NRB_DG : 8;
    int nrb = 1;
    while (nrb < most && rb % (2 * nrb) == 0 && (long long)items * (rb / (2 * nrb)) >= (long long)GPU_MOE_NRB_FILL * (k->sms > 0 ? k->sms : 1)) nrb *= 2;
    return nrb;
}

// Whether a _d step takes the 2-bit planes' own kernels (they trap on any other kind):
// k_moe_*_dg4 at more than one row block a block, k_moe_*_dg1 at one, not k_moe_*_d, _d1.
static int gpu_moe_dg(const gpu_kernels *k) { return k->moe_kind == GPU_W_PLANES && k->moe_dg; }

// k_moe_up_w / k_moe_dn_w's blocks (persistent: each takes the step's tiles n ≡ blockIdx.x mod blocks in turn): one a
// multiprocessor (GPU_MMW_SMEM_MOE: one fits), k->moe_w_blocks where set, none past the tiles the items bound can have.
static gpu_dim gpu_moe_w_grid(const gpu_kernels *k, int items, int nrb) {
    long long tiles = (long long)items * nrb, most = k->moe_w_blocks > 0 ? k->moe_w_blocks : k->sms > 0 ? k->sms : 1;
    return (gpu_dim){(int)(tiles < most ? tiles : most), 1, 1, "(blocks: tiles n ≡ blockIdx.x mod blocks)"};
}

// Whether the experts' _g128 items go through k_moe_up_w / k_moe_dn_w (the same bits): one part, k->moe_w, rows that
// fill its tiles (I a multiple of 64, H of GPU_MMW_BM) and its shared memory (gpu_smem_exact).
static int gpu_moe_w_take(gpu_kernels *k, int I, int H) {
    if (k->parts != 1 || !k->moe_w || I % 64 || H % GPU_MMW_BM) return 0;
    return gpu_smem_exact(k, K_MOE_UP_W, GPU_MMW_SMEM_MOE) && gpu_smem_exact(k, K_MOE_DN_W, GPU_MMW_SMEM_MOE);
}

// sel_c, sel_n [P] = the pairs of sel [P = T·K] apart by their token's side (sass/moe_mm.cu: k_moe_split): pieces [np]
// the step's full pieces' first tokens, ascending (gpu_mmc_split).
static void gpu_k_moe_split(gpu_kernels *k, CUstream s, CUdeviceptr sel, int P, int K, int E, CUdeviceptr pieces, int np, CUdeviceptr sel_c,
                            CUdeviceptr sel_n) {
    MOET_ASSERT(P >= 1 && K >= 1 && np >= 1, "k_moe_split: %d pairs, %d pieces", P, np);
    gpu_launch(k, K_MOE_SPLIT, (gpu_dim){(int)gpu_cdiv(P, GPU_MOE_SPLIT_NT), 1, 1, "(blocks of GPU_MOE_SPLIT_NT pairs, 1, 1)"}, GPU_MOE_SPLIT_NT, 0, s,
               GPU_ARGS(&sel, &P, &K, &E, &pieces, &np, &sel_c, &sel_n));
}

// k_moe_up_c / k_moe_dn_c (sass/moe_c.cu): the chain products of the pairs of map's items — 2-bit plane experts, the
// one-part sm_90a image (k->moe_w: where k_moe_up_w runs) — hs [P][I] (one bf16 part) from xs (xn's part [T][H]),
// ye [P][H] from hs; bound: the map's items bound.
static void gpu_k_moe_up_c(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr map, int bound, int K, CUdeviceptr xs, CUdeviceptr hs,
                           int I) {
    MOET_ASSERT(k->moe_w && k->parts == 1 && gpu_multiple(I, 128) && gpu_smem_exact(k, K_MOE_UP_C, GPU_MOEC_SMEM), "k_moe_up_c: I = %d", I);
    gpu_launch(k, K_MOE_UP_C, gpu_moe_w_grid(k, bound, I / 128), GPU_MMW_NT, GPU_MOEC_SMEM, s, GPU_ARGS(&experts, &map, &bound, &K, &xs, &hs, &I));
}
static void gpu_k_moe_dn_c(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr map, int bound, CUdeviceptr hs, CUdeviceptr ye, int H) {
    MOET_ASSERT(k->moe_w && k->parts == 1 && gpu_multiple(H, GPU_MOEC_BM) && gpu_smem_exact(k, K_MOE_DN_C, GPU_MOEC_SMEM), "k_moe_dn_c: H = %d", H);
    gpu_launch(k, K_MOE_DN_C, gpu_moe_w_grid(k, bound, H / GPU_MOEC_BM), GPU_MMW_NT, GPU_MOEC_SMEM, s, GPU_ARGS(&experts, &map, &bound, &hs, &ye, &H));
}

// k_moe_up_r / k_moe_dn_r (sass/moe_r.cu): k_moe_up_c / k_moe_dn_c's products (the same bits) with the weights' A
// operand from registers; the same arguments and conditions (K: the routed experts a token), and the products'
// depths (up's H, down's I: the experts' columns, read by the kernels) multiples of 128 (gpu_engine.moe_chain's condition).
static void gpu_k_moe_up_r(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr map, int bound, int K, CUdeviceptr xs, CUdeviceptr hs,
                           int I) {
    MOET_ASSERT(k->moe_w && k->parts == 1 && gpu_multiple(I, 128) && gpu_smem_exact(k, K_MOE_UP_R, GPU_MOER_SMEM), "k_moe_up_r: I = %d", I);
    gpu_launch(k, K_MOE_UP_R, gpu_moe_w_grid(k, bound, I / 128), GPU_MOER_NT, GPU_MOER_SMEM, s, GPU_ARGS(&experts, &map, &bound, &K, &xs, &hs, &I));
}
static void gpu_k_moe_dn_r(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr map, int bound, CUdeviceptr hs, CUdeviceptr ye, int H) {
    MOET_ASSERT(k->moe_w && k->parts == 1 && gpu_multiple(H, GPU_MOEC_BM) && gpu_smem_exact(k, K_MOE_DN_R, GPU_MOER_SMEM), "k_moe_dn_r: H = %d", H);
    gpu_launch(k, K_MOE_DN_R, gpu_moe_w_grid(k, bound, H / GPU_MOEC_BM), GPU_MOER_NT, GPU_MOER_SMEM, s, GPU_ARGS(&experts, &map, &bound, &hs, &ye, &H));
}

// hs [3][T·K][I] = the parts of SiLU(gate · xn) · (up · xn) for every pair of map (over E
// experts), from xs (the parts of xn [T, H]).
static void gpu_k_moe_up(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr map, int E, int K, CUdeviceptr xs, int T, int H,
                         CUdeviceptr hs, int I) {
    long long P = (long long)T * K;
    int sh = gpu_moe_shape(k, P, E), bound = gpu_moe_items_bound(P, E);
    if (sh == 3 && gpu_moe_w_take(k, I, H)) {   // (sass/moe_w.cu)
        gpu_launch(k, K_MOE_UP_W, gpu_moe_w_grid(k, bound, I / 64), GPU_MMW_NT, GPU_MMW_SMEM_MOE, s, GPU_ARGS(&experts, &map, &bound, &K, &xs, &T, &hs, &I));
        return;
    }
    if (sh >= 2) {   // an item's gate and up rows [64·blockIdx.y, +64) together (sass/moe_mm.cu); _g128: items of up to 128 pairs
        gpu_launch(k, sh == 3 ? K_MOE_UP_G128 : K_MOE_UP_G, (gpu_dim){bound, gpu_cdiv(I, GPU_MMG_BM / 2), 1, "(items bound, row blocks, 1)"},
                   GPU_MM_NT, gpu_mmg_smem_bn(k, k->moe_kind, sh == 3 ? GPU_MMG_BN128 : GPU_MMG_BN), s,
                   GPU_ARGS(&experts, &map, &bound, &K, &xs, &T, &hs, &I));
        return;
    }
    int rt = gpu_moe_rt_up[sh];
    MOET_ASSERT(gpu_multiple(I, 16 * rt), "k_moe_up: I = %d", I);
    int rb = I / (16 * rt), nrb = sh == 0 ? gpu_moe_nrb(k, bound, rb) : 1;
    // (_d1, _dg1: one row block a block, straight through; _dg4, _dg1: 2-bit plane experts alone, gpu_moe_dg)
    const int dg = sh == 0 && gpu_moe_dg(k);
    const int fn = sh ? K_MOE_UP_P : nrb > 1 ? (dg ? K_MOE_UP_DG4 : K_MOE_UP_D) : dg ? K_MOE_UP_DG1 : K_MOE_UP_D1;
    // _d stages an item's tokens (distinct: at most min(T, GPU_MOE_CAP_D)) in shared memory (_dg4 reads them through L1)
    size_t smem = sh == 0 && !dg ? (size_t)2 * k->parts * (T < GPU_MOE_CAP_D ? T : GPU_MOE_CAP_D) * H : 0;
    MOET_ASSERT(gpu_smem_room(k, fn, smem), "k_moe_up_d: %zu bytes of staged activations", smem);
    gpu_launch(k, fn, (gpu_dim){bound, gpu_cdiv(rb, nrb), 1, "(items bound, row blocks, 1)"}, GPU_MM_NT, smem, s,
               GPU_ARGS(&experts, &map, &bound, &K, &xs, &T, &hs, &I, &nrb));
}

// ye [P][H] = down · h for every pair of map (over E experts), from hs (gpu_k_moe_up).
static void gpu_k_moe_dn(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr map, int E, CUdeviceptr hs, int P, int I, CUdeviceptr ye,
                         int H) {
    int sh = gpu_moe_shape(k, P, E), bound = gpu_moe_items_bound(P, E);
    if (sh == 3 && gpu_moe_w_take(k, I, H)) {   // (sass/moe_w.cu)
        gpu_launch(k, K_MOE_DN_W, gpu_moe_w_grid(k, bound, H / GPU_MMW_BM), GPU_MMW_NT, GPU_MMW_SMEM_MOE, s, GPU_ARGS(&experts, &map, &bound, &hs, &P, &ye, &H));
        return;
    }
    if (sh >= 2) {
        gpu_launch(k, sh == 3 ? K_MOE_DN_G128 : K_MOE_DN_G, (gpu_dim){bound, gpu_cdiv(H, GPU_MMG_BM), 1, "(items bound, row blocks, 1)"}, GPU_MM_NT,
                   gpu_mmg_smem_bn(k, k->moe_kind, sh == 3 ? GPU_MMG_BN128 : GPU_MMG_BN), s, GPU_ARGS(&experts, &map, &bound, &hs, &P, &ye, &H));
        return;
    }
    int rt = gpu_moe_rt_dn[sh];
    MOET_ASSERT(gpu_multiple(H, 16 * rt), "k_moe_dn: H = %d", H);
    int rb = H / (16 * rt), nrb = sh == 0 ? gpu_moe_nrb(k, bound, rb) : 1;
    const int dg = sh == 0 && gpu_moe_dg(k);
    const int fn = sh ? K_MOE_DN_P : nrb > 1 ? (dg ? K_MOE_DN_DG4 : K_MOE_DN_D) : dg ? K_MOE_DN_DG1 : K_MOE_DN_D1;
    // _d stages an item's pairs' h (at most GPU_MOE_CAP_D) in shared memory (_dg4 reads them through L1)
    size_t smem = sh == 0 && !dg ? (size_t)2 * k->parts * (P < GPU_MOE_CAP_D ? P : GPU_MOE_CAP_D) * I : 0;
    MOET_ASSERT(gpu_smem_room(k, fn, smem), "k_moe_dn_d: %zu bytes of staged activations", smem);
    gpu_launch(k, fn, (gpu_dim){bound, gpu_cdiv(rb, nrb), 1, "(items bound, row blocks, 1)"}, GPU_MM_NT, smem, s,
               GPU_ARGS(&experts, &map, &bound, &hs, &P, &ye, &H, &nrb));
}

// ---- the mixture of experts -------------------------------------------------------------------

// Per token: softmax over logits [T, E], the K most probable experts into sel (int32 [T, K], by
// descending weight) and their renormalised weights into selw [T, K].
static void gpu_k_router(gpu_kernels *k, CUstream s, CUdeviceptr logits, int E, int K, CUdeviceptr sel, CUdeviceptr selw, int T) {
    MOET_ASSERT(E >= 1 && E <= GPU_ROUTER_MAX_E && K >= 1 && K <= GPU_ROUTER_MAX_K && K <= E,
                "k_router: top-%d of %d experts (at most %d of %d)", K, E, GPU_ROUTER_MAX_K, GPU_ROUTER_MAX_E);
    gpu_launch(k, K_ROUTER, (gpu_dim){T, 1, 1, "(tokens, 1, 1)"}, GPU_ROUTER_NT, 0, s,
               GPU_ARGS(&logits, &E, &K, &sel, &selw));
}

// h[p, i] = SiLU(gate_x[i] · xn[t]) · (up_x[i] · xn[t]) for the pairs p = t·K + k < T·K with expert
// x = sel[p]. experts: gpu_mat [E, 3] (gate, up, down); xn [T, ldx]; h [T·K, I].
static void gpu_k_moe_gate_up(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr sel, CUdeviceptr xn, int ldx, int K,
                              CUdeviceptr h, int I, int T) {
    MOET_ASSERT(gpu_aligned(experts, 8), "k_moe_gate_up: the expert table at %#llx", experts);
    gpu_assert_x("k_moe_gate_up", xn, ldx);
    gpu_launch(k, K_MOE_GATE_UP, (gpu_dim){(long long)T * K, gpu_cdiv(I, GPU_LIN_ROWS), 1, "(tokens x top-k, row blocks of I, 1)"},
               GPU_LIN_NT, 0, s, GPU_ARGS(&experts, &sel, &xn, &ldx, &K, &h, &I));
}

// ye[p, j] = down_x[j] · h[p] for the pairs p < n_pairs, x = sel[p]. h [n_pairs, I]; ye [n_pairs, H].
static void gpu_k_moe_down(gpu_kernels *k, CUstream s, CUdeviceptr experts, CUdeviceptr sel, CUdeviceptr h, int I, CUdeviceptr ye, int H,
                           int n_pairs) {
    MOET_ASSERT(gpu_aligned(experts, 8), "k_moe_down: the expert table at %#llx", experts);
    gpu_assert_x("k_moe_down", h, I);
    gpu_launch(k, K_MOE_DOWN, (gpu_dim){n_pairs, gpu_cdiv(H, GPU_LIN_ROWS), 1, "(tokens x top-k, row blocks of H, 1)"}, GPU_LIN_NT, 0, s,
               GPU_ARGS(&experts, &sel, &h, &I, &ye, &H));
}

// y[t, j] = Σ_k selw[t, k] · ye[t·K + k, j] (ascending expert id) + σ(sg[t]) · sh[t, j], t < T.
static void gpu_k_moe_combine(gpu_kernels *k, CUstream s, CUdeviceptr ye, CUdeviceptr sel, CUdeviceptr selw, CUdeviceptr sh, CUdeviceptr sg,
                              CUdeviceptr y, int K, int H, int T) {
    MOET_ASSERT(K >= 1 && K <= GPU_ROUTER_MAX_K && K <= GPU_COMBINE_NT, "k_moe_combine: top-%d", K);
    gpu_launch(k, K_MOE_COMBINE, (gpu_dim){T, gpu_cdiv(H, GPU_COMBINE_NT), 1, "(tokens, blocks of H, 1)"}, GPU_COMBINE_NT, 0, s,
               GPU_ARGS(&ye, &sel, &selw, &sh, &sg, &y, &K, &H));
}

// h[i] = SiLU(g[i]) · u[i], i < n (h may be g).
static void gpu_k_silu_mul(gpu_kernels *k, CUstream s, CUdeviceptr g, CUdeviceptr u, CUdeviceptr h, int n, CUdeviceptr xs) {
    gpu_launch(k, K_SILU_MUL, (gpu_dim){gpu_cdiv(n, GPU_SILU_NT), 1, 1, "(blocks of elements, 1, 1)"}, GPU_SILU_NT, 0, s,
               GPU_ARGS(&g, &u, &h, &n, &xs));
}

// ---- Gated DeltaNet -----------------------------------------------------------------------------

// k_gdn_conv's segments of a row (warps walking its tokens side by side) for a step whose longest
// row has `longest` tokens: the least power of two ≥ longest, at most GPU_CONV_NT / 32 (the same
// bits with any: sass/gdn_conv.cu).
static int gpu_conv_nseg(int longest) {
    int nseg = 1;
    while (nseg < GPU_CONV_NT / 32 && nseg < longest) nseg *= 2;
    return nseg;
}

// The causal conv + SiLU in place on qkv [T, cd] for n_rows rows (row r: tokens [row_start[r], +
// row_len[r]) of slot row_slot[r], int32 [n_rows] each; none longer than `longest` tokens),
// continuing each slot's window win_base + slot·win_slot_stride [Kc − 1, cd] (floats). w: [cd, Kc].
// With hist (one row only): the window after each of the row's tokens but the last at hist +
// t·hist_stride (floats). A row's segments: gpu_conv_nseg.
static void gpu_k_gdn_conv(gpu_kernels *k, CUstream s, CUdeviceptr qkv, int cd, gpu_mat w, int Kc, CUdeviceptr win_base,
                           long long win_slot_stride, CUdeviceptr row_slot, CUdeviceptr row_start, CUdeviceptr row_len, int n_rows, int longest,
                           CUdeviceptr hist, long long hist_stride) {
    MOET_ASSERT(Kc >= 1 && Kc <= GPU_CONV_MAX_K && w.rows == cd && w.cols == Kc, "k_gdn_conv: a conv of %d taps over %d channels (weight [%d, %d]; "
                "at most %d taps)", Kc, cd, w.rows, w.cols, GPU_CONV_MAX_K);
    MOET_ASSERT(!hist || n_rows == 1, "k_gdn_conv: windows after each token for %d rows", n_rows);
    int nseg = gpu_conv_nseg(longest);
    gpu_launch(k, K_GDN_CONV, (gpu_dim){gpu_cdiv(cd, 32 * (GPU_CONV_NT / 32 / nseg)), n_rows, 1, "(blocks of channels, rows, 1)"}, GPU_CONV_NT, 0, s,
               GPU_ARGS(&qkv, &cd, &w, &Kc, &win_base, &win_slot_stride, &row_slot, &row_start, &row_len, &hist, &hist_stride, &nseg));
}

// The recurrent rule's lanes a state column for a launch of nv value heads over n_rows rows with keys
// of dk (sass/gdn_rule.cu; the same bits either way): GPU_GDN_RULE_LP where the state is in registers
// and the heads' blocks number at most two waves of k_gdn_rule_norm4 (GPU_GDN_RN4_MINB a multiprocessor), else 1
// (fewer instructions a column: the four-lane form's gates and q̂, k̂ are each warp's own). On an
// H100, decode at depth 64, one lane a column at every size → four at every size: batch 1 (32
// blocks) 354.0, 354.9 → 373.5, 374.8 tok/s, 16 (512) 2,629.5, 2,657.5 → 2,668.3, 2,662.5, 64
// (2,048) 4,925.4, 4,949.4 → 4,850.3, 4,860.4 (this bound keeps 64 on one lane: gpu/PERF.md §2).
// k->gdn_rule_lanes forces one (tests).
static int gpu_gdn_rule_lanes(const gpu_kernels *k, int nv, int n_rows, int dk) {
    if (!GPU_GDN_RULE_REGS(dk)) return 1;
    if (k->gdn_rule_lanes) return k->gdn_rule_lanes;
    return (long long)nv * n_rows <= 2LL * GPU_GDN_RN4_MINB * k->sms ? GPU_GDN_RULE_LP : 1;   // (two waves)
}

// The gated delta rule, recurrent form, over the rows rows[0 .. n_rows) (int32 indices into
// row_slot / row_start / row_len): qkv [T, cd] after the conv, bb, aa [T, nv], state of slot s at
// S_base + s·S_slot_stride [nv, dk, dv] (floats), o [T, nv·dv]. With hist (one row only): the
// state after each of the row's tokens but the last at hist + t·hist_stride (floats).
static void gpu_k_gdn_rule(gpu_kernels *k, CUstream s, CUdeviceptr qkv, int cd, CUdeviceptr bb, CUdeviceptr aa, gpu_mat A_log,
                           gpu_mat dt_bias, CUdeviceptr S_base, long long S_slot_stride, CUdeviceptr o, int nk, int nv, int dk, int dv,
                           CUdeviceptr row_slot, CUdeviceptr row_start, CUdeviceptr row_len, CUdeviceptr rows, int n_rows, CUdeviceptr hist,
                           long long hist_stride) {
    MOET_ASSERT(nk >= 1 && gpu_multiple(nv, nk) && cd == 2 * nk * dk + nv * dv, "k_gdn_rule: %d key heads, %d value heads of %d, %d, conv dim %d",
                nk, nv, dk, dv, cd);
    MOET_ASSERT(!hist || n_rows == 1, "k_gdn_rule: states after each token for %d rows", n_rows);
    const int lanes = gpu_gdn_rule_lanes(k, nv, n_rows, dk);
    gpu_launch(k, lanes > 1 ? K_GDN_RULE4 : K_GDN_RULE, (gpu_dim){nv, n_rows, gpu_cdiv(dv, GPU_GDN_VC), "(value heads, rows, value column blocks)"},
               lanes > 1 ? GPU_GDN_RULE_NT : 32, gpu_gdn_rule_smem(dk, lanes), s,
               GPU_ARGS(&qkv, &cd, &bb, &aa, &A_log, &dt_bias, &S_base, &S_slot_stride, &o, &nk, &nv, &dk, &dv, &row_slot, &row_start,
                        &row_len, &rows, &hist, &hist_stride));
}

// The pieces k_gdn_chunk cuts a row of len tokens from absolute position pos into (at multiples of
// GPU_GDN_C of the positions; sass/gdn_chunk.cu): at most ⌈len / GPU_GDN_C⌉ + 1.
static int gpu_gdn_row_pieces(int len, int pos) {
    const int n0 = GPU_GDN_C - pos % GPU_GDN_C < len ? GPU_GDN_C - pos % GPU_GDN_C : len;
    return 1 + (int)gpu_cdiv(len - n0, GPU_GDN_C);
}

// piece0[i] = the pieces of rows 0 .. i − 1 (lengths len, first positions pos); returns them all.
static int gpu_gdn_pieces(const int *len, const int *pos, int n, int *piece0) {
    int all = 0;
    for (int i = 0; i < n; i++) piece0[i] = all, all += gpu_gdn_row_pieces(len[i], pos[i]);
    return all;
}

// The most pieces a step of T tokens in n rows holds: ⌈len / C⌉ + 1 a row.
static int gpu_gdn_pieces_max(int T, int n) { return (int)gpu_cdiv(T, GPU_GDN_C) + 2 * n; }

// k_gdn_prep alone (gpu_k_gdn_chunk's first launch, arguments as there; the kernel harness times
// it apart): T, M and the gates of every piece of the rows into tm, q̂ and k̂ over their q and k in qkv.
static void gpu_k_gdn_prep(gpu_kernels *k, CUstream s, CUdeviceptr qkv, int cd, CUdeviceptr bb, CUdeviceptr aa, gpu_mat A_log, gpu_mat dt_bias,
                           int nk, int nv, int dk, int dv, CUdeviceptr row_start, CUdeviceptr row_len, CUdeviceptr row_pos, CUdeviceptr rows,
                           int n_rows, CUdeviceptr tm, CUdeviceptr piece0, int pieces) {
    MOET_ASSERT(nk >= 1 && gpu_multiple(nv, nk) && cd == 2 * nk * dk + nv * dv && (dk & 15) == 0 && (qkv & 7) == 0,
                "k_gdn_prep: %d key heads (of a multiple of 16), %d value heads of %d, %d, conv dim %d, q|k|v at 8-byte alignment (its cp.async)",
                nk, nv, dk, dv, cd);
    MOET_ASSERT(pieces >= n_rows && tm && piece0, "k_gdn_prep: %d pieces of %d rows", pieces, n_rows);
    gpu_launch(k, K_GDN_PREP, (gpu_dim){nk, pieces, 1, "(key heads, pieces, 1)"}, GPU_GDN_NT, gpu_gdn_prep_smem(dk), s,
               GPU_ARGS(&qkv, &cd, &bb, &aa, &A_log, &dt_bias, &tm, &nk, &nv, &dk, &row_start, &row_len, &row_pos, &rows, &piece0, &n_rows));
}

// The chunked form, arguments as gpu_k_gdn_rule's plus row_pos (int32: each row's first absolute
// position, where its pieces of GPU_GDN_C are cut), tm (k_gdn_prep's [pieces, nv, GPU_GDN_TM] f32) and
// piece0 (int32, gpu_gdn_pieces' of the rows, in rows' order): k_gdn_prep, then k_gdn_chunk. qkv's q
// and k of the rows' pieces of two or more tokens are left normalised (k_gdn_prep's q̂, k̂): a second
// launch over the same rows needs q and k again.
static void gpu_k_gdn_chunk(gpu_kernels *k, CUstream s, CUdeviceptr qkv, int cd, CUdeviceptr bb, CUdeviceptr aa, gpu_mat A_log,
                            gpu_mat dt_bias, CUdeviceptr S_base, long long S_slot_stride, CUdeviceptr o, int nk, int nv, int dk, int dv,
                            CUdeviceptr row_slot, CUdeviceptr row_start, CUdeviceptr row_len, CUdeviceptr row_pos, CUdeviceptr rows,
                            int n_rows, CUdeviceptr tm, CUdeviceptr piece0, int pieces) {
    gpu_k_gdn_prep(k, s, qkv, cd, bb, aa, A_log, dt_bias, nk, nv, dk, dv, row_start, row_len, row_pos, rows, n_rows, tm, piece0, pieces);
    MOET_ASSERT(!k->gdn_lean || dk + 4 >= 2 * GPU_GDN_C, "k_gdn_chunk lean: key heads of %d cannot hold T and M in q̂'s place", dk);
    const long long blocks = (long long)nv * n_rows * gpu_cdiv(dv, GPU_GDN_VC);
    int form;
    const size_t smem = gpu_gdn_chunk_grid_smem(k, dk, blocks, &form);
    gpu_launch(k, K_GDN_CHUNK, (gpu_dim){nv, n_rows, gpu_cdiv(dv, GPU_GDN_VC), "(value heads, rows, value column blocks)"}, GPU_GDN_NT, smem, s,
               GPU_ARGS(&qkv, &cd, &bb, &aa, &A_log, &dt_bias, &S_base, &S_slot_stride, &o, &nk, &nv, &dk, &dv, &row_slot, &row_start,
                        &row_len, &row_pos, &rows, &tm, &piece0, &form));
}

// o[t, h] ← w · (o / rms(o)) · SiLU(z[t, h]) for every (token, value head): o, z [T, nv·dv].
static void gpu_k_gated_norm(gpu_kernels *k, CUstream s, CUdeviceptr o, CUdeviceptr z, gpu_mat w, int nv, int dv, float eps, CUdeviceptr xs,
                             int T) {
    MOET_ASSERT(w.cols == dv, "k_gated_norm: a weight of %d for value heads of %d", w.cols, dv);
    gpu_launch(k, K_GATED_NORM, (gpu_dim){gpu_cdiv((long long)T * nv, GPU_GNORM_NT / 32), 1, 1, "((token, value head) items / warps a block, 1, 1)"},
               GPU_GNORM_NT, 0, s, GPU_ARGS(&o, &z, &w, &nv, &dv, &eps, &xs, &T));
}

// Whether gpu_k_gdn_rule_norm takes a layer of value heads of dv with keys of dk: a head in one block
// (GPU_GNORM_NT columns, one or GPU_GDN_RULE_LP lanes each), the state in registers.
static int gpu_gdn_rule_norm_ok(int dk, int dv) { return GPU_GDN_RULE_REGS(dk) && dv <= GPU_GNORM_NT; }

// gpu_k_gdn_rule, then gpu_k_gated_norm of its rows' tokens (z, w, eps, xs as its), in one launch
// (the same bits): for a step whose every row takes the recurrent rule (T its tokens: xs's part
// stride), where gpu_gdn_rule_norm_ok.
static void gpu_k_gdn_rule_norm(gpu_kernels *k, CUstream s, CUdeviceptr qkv, int cd, CUdeviceptr bb, CUdeviceptr aa, gpu_mat A_log,
                                gpu_mat dt_bias, CUdeviceptr S_base, long long S_slot_stride, CUdeviceptr o, int nk, int nv, int dk, int dv,
                                CUdeviceptr row_slot, CUdeviceptr row_start, CUdeviceptr row_len, CUdeviceptr rows, int n_rows, CUdeviceptr hist,
                                long long hist_stride, CUdeviceptr z, gpu_mat w, float eps, CUdeviceptr xs, int T) {
    MOET_ASSERT(nk >= 1 && gpu_multiple(nv, nk) && cd == 2 * nk * dk + nv * dv, "k_gdn_rule_norm: %d key heads, %d value heads of %d, %d, conv dim %d",
                nk, nv, dk, dv, cd);
    MOET_ASSERT(gpu_gdn_rule_norm_ok(dk, dv), "k_gdn_rule_norm: keys of %d, value heads of %d", dk, dv);
    MOET_ASSERT(w.cols == dv, "k_gdn_rule_norm: a norm weight of %d for value heads of %d", w.cols, dv);
    MOET_ASSERT(!hist || n_rows == 1, "k_gdn_rule_norm: states after each token for %d rows", n_rows);
    const int lanes = gpu_gdn_rule_lanes(k, nv, n_rows, dk), nt = lanes * GPU_GNORM_NT;
    const size_t smem = sizeof(float) * (nt / 32) * 2 * (size_t)dk;   // q̂ and k̂ [dk] a warp
    gpu_launch(k, lanes > 1 ? K_GDN_RULE_NORM4 : K_GDN_RULE_NORM, (gpu_dim){nv, n_rows, 1, "(value heads, rows, 1)"}, nt, smem, s,
               GPU_ARGS(&qkv, &cd, &bb, &aa, &A_log, &dt_bias, &S_base, &S_slot_stride, &o, &nk, &nv, &dk, &dv, &row_slot, &row_start,
                        &row_len, &rows, &hist, &hist_stride, &z, &w, &eps, &xs, &T));
}

// ---- gated attention ----------------------------------------------------------------------------

static void gpu_assert_attn(const char *kernel, int kv_dtype, CUdeviceptr ks, CUdeviceptr vs, int nh, int kvh, int hd) {
    MOET_ASSERT(kv_dtype >= GPU_KV_F32 && kv_dtype <= GPU_KV_FP8, "%s: KV type %d", kernel, kv_dtype);
    MOET_ASSERT((kv_dtype == GPU_KV_FP8) == (ks && vs), "%s: fp8 caches and only they have scales", kernel);
    MOET_ASSERT(kvh >= 1 && gpu_multiple(nh, kvh) && hd >= 1 && hd <= GPU_ATT_MAX_HD, "%s: %d query heads over %d KV heads of %d (at most %d)", kernel,
                nh, kvh, hd, GPU_ATT_MAX_HD);
}

// q/k norms, partial RoPE and the KV append for T tokens (sass/attn_prep.cu), with the kernel of
// the cache's element type kv_dtype (GPU_KV_*). proj [T, 2·nh·hd] (q normed and roped in place),
// kk (in place), vv [T, kvh·hd]; inv_freq [rot / 2]; tok_pos, tok_slot: int32 [T]; bt: int32
// [slots, bt_stride]; kc, vc this layer's pages; ks, vs their fp8 scales (else 0).
static void gpu_k_attn_prep(gpu_kernels *k, CUstream s, int kv_dtype, CUdeviceptr proj, CUdeviceptr kk, CUdeviceptr vv, gpu_mat qn,
                            gpu_mat kn, CUdeviceptr inv_freq, int rot, CUdeviceptr tok_pos, CUdeviceptr tok_slot, CUdeviceptr bt,
                            int bt_stride, CUdeviceptr kc, CUdeviceptr vc, CUdeviceptr ks, CUdeviceptr vs, int nh, int kvh, int hd, float eps,
                            int T) {
    gpu_assert_attn("k_attn_prep", kv_dtype, ks, vs, nh, kvh, hd);
    MOET_ASSERT(gpu_multiple(rot, 2) && rot <= hd && qn.cols == hd && kn.cols == hd, "k_attn_prep: %d rotary dims, norms of %d and %d, heads of %d",
                rot, qn.cols, kn.cols, hd);
    gpu_launch(k, K_ATTN_PREP_F32 + kv_dtype, (gpu_dim){T, gpu_cdiv(nh + kvh, GPU_PREP_NT / 32), 1, "(tokens, head groups, 1)"}, GPU_PREP_NT, 0, s,
               GPU_ARGS(&proj, &kk, &vv, &qn, &kn, &inv_freq, &rot, &tok_pos, &tok_slot, &bt, &bt_stride, &kc, &vc, &ks, &vs, &nh, &kvh, &hd,
                        &eps));
}

// The warps per block of attention's walking form on the tensor cores (sass/flash.cu: every bf16
// and fp8 cache) for query heads nh over kvh KV heads of hd on a device of smem_optin bytes of
// shared memory per block: the most, up to GPU_FA_WALK_W, whose shared memory fits; 0 where the
// kernel cannot take the geometry (hd other than 32, 64 or 256, more than 16 query heads per KV
// head, the split form's shared memory past the device's): gpu_init refuses a bf16 or fp8
// cache then (gpu_fa_refuse).
static int gpu_fa_fits(int nh, int kvh, int hd, int smem_optin) {
    if (!(hd == 32 || hd == 64 || hd == 256) || kvh < 1 || nh % kvh || nh / kvh > 16) return 0;
    int nw = GPU_FA_WALK_W;   // (its fewest, one tile of rows, takes the split form's shared memory)
    while (nw > GPU_FA_WALK_SPLIT && gpu_fa_smem(nw / GPU_FA_WALK_SPLIT, hd, GPU_MM_SPLITS) > (size_t)smem_optin) nw /= 2;
    return gpu_fa_smem(nw / GPU_FA_WALK_SPLIT, hd, GPU_MM_SPLITS) <= (size_t)smem_optin ? nw : 0;   // (three parts: either image fits)
}

// gpu_fa_fits for a launch: a bf16 or fp8 cache whose geometry gpu_init let through.
static int gpu_fa_warps(gpu_kernels *k, int kv_dtype, int nh, int kvh, int hd) {
    int nw = gpu_fa_fits(nh, kvh, hd, k->smem_optin);
    MOET_ASSERT(kv_dtype != GPU_KV_F32 && nw, "k_fa: a %s cache, %d query heads over %d KV heads of %d, %d bytes of shared memory per block "
                "(gpu_init refuses what the kernel cannot take)", kv_dtype == GPU_KV_F32 ? "f32" : "bf16 or fp8", nh, kvh, hd, k->smem_optin);
    return nw;
}

// Whether a model's attention can keep a cache of kv_dtype on a device of smem_optin bytes per
// block (0), else -1 with the reason: bf16 and fp8 caches take the tensor-core kernel alone.
static int gpu_fa_refuse(const ck_config *c, int kv_dtype, int smem_optin, moet_err *e) {
    if (!c->n_full || kv_dtype == GPU_KV_F32 || gpu_fa_fits(c->n_heads, c->n_kv_heads, c->head_dim, smem_optin)) return 0;
    return err_set(e, "--kv-dtype %s on the GPU takes attention on the tensor cores, which needs head_dim 32, 64 or 256 and at most 16 query "
                   "heads per KV head in %zu bytes of shared memory per block (this model: head_dim %d, %d query heads over %d KV heads; "
                   "the GPU: %d bytes); --kv-dtype f32 serves it",
                   kv_dtype == GPU_KV_BF16 ? "bf16" : "fp8", gpu_fa_smem(1, c->head_dim, GPU_MM_SPLITS), c->head_dim, c->n_heads, c->n_kv_heads, smem_optin);
}

// Opts kernel fn in to bytes of dynamic shared memory where the default is less.
static void gpu_fa_room(gpu_kernels *k, int fn, size_t bytes) {
    if (bytes > (size_t)k->smem_max[fn]) gpu_kernel_smem(k, fn, (size_t)k->smem_optin);
}

// Whether a step of T tokens in `rows` sequences takes k_fa_w (sass/flash_w.cu: the same bits as k_fa's walk) for
// attention over a bf16 or fp8 cache: one part, k->fa_w_min tokens or more (0: never; the sm_90a cubin alone has it),
// heads of GPU_FAW_HD with G = nh / kvh dividing 64, 16 tokens or more a sequence on the average (a block of 128 / G
// tokens walks each sequence's run of them in turn: a step of many short rows keeps k_fa), and its shared memory.
static int gpu_fa_w_take(gpu_kernels *k, int nh, int kvh, int hd, int T, int rows) {
    if (k->parts != 1 || !k->fa_w_min || T < k->fa_w_min || hd != GPU_FAW_HD || kvh < 1 || nh % kvh || 64 % (nh / kvh) ||
        T < 16LL * rows)
        return 0;
    return gpu_smem_exact(k, K_FA_W, GPU_FAW_SMEM);
}

// Each of the T tokens' queries over its sequence's cache up to its position, gated
// (sass/attention.cu for an f32 cache, sass/flash.cu or sass/flash_w.cu for bf16 and fp8): core [T, nh·hd].
// Arguments as gpu_k_attn_prep's; scale = 1/sqrt(hd); rows: the sequences the step's tokens belong to.
static void gpu_k_attention(gpu_kernels *k, CUstream s, int kv_dtype, CUdeviceptr proj, CUdeviceptr tok_pos, CUdeviceptr tok_slot,
                            CUdeviceptr bt, int bt_stride, CUdeviceptr kc, CUdeviceptr vc, CUdeviceptr ks, CUdeviceptr vs, CUdeviceptr core,
                            int nh, int kvh, int hd, float scale, CUdeviceptr xs, int T, int rows) {
    gpu_assert_attn("k_attention", kv_dtype, ks, vs, nh, kvh, hd);
    if (kv_dtype != GPU_KV_F32 && gpu_fa_w_take(k, nh, kvh, hd, T, rows)) {   // a block per tile of 128 / G tokens and KV head
        int fp8 = kv_dtype == GPU_KV_FP8;
        gpu_launch(k, K_FA_W, (gpu_dim){gpu_cdiv(T, 128 / (nh / kvh)), kvh, 1, "(token tiles, KV heads, 1)"}, GPU_FAW_NT, GPU_FAW_SMEM, s,
                   GPU_ARGS(&proj, &tok_pos, &tok_slot, &bt, &bt_stride, &kc, &vc, &ks, &vs, &core, &nh, &kvh, &scale, &xs, &T, &fp8));
        return;
    }
    if (kv_dtype != GPU_KV_F32) {   // a block per tile of nw / GPU_FA_WALK_SPLIT · ⌊16 / G⌋ tokens and KV head
        int nw = gpu_fa_warps(k, kv_dtype, nh, kvh, hd), nq = nw / GPU_FA_WALK_SPLIT, tb = nq * (16 / (nh / kvh)), nc = 0, fp8 = kv_dtype == GPU_KV_FP8;
        size_t smem = gpu_fa_smem(nq, hd, k->parts);
        gpu_fa_room(k, K_FA, smem);
        gpu_launch(k, K_FA, (gpu_dim){gpu_cdiv(T, tb), kvh, 1, "(token tiles, KV heads, 1)"}, nw * 32, smem, s,
                   GPU_ARGS(&proj, &tok_pos, &tok_slot, &bt, &bt_stride, &kc, &vc, &ks, &vs, &core, &nc, &nh, &kvh, &hd, &scale, &xs, &T, &fp8));
        return;
    }
    gpu_launch(k, K_ATTENTION_F32, (gpu_dim){T, nh, 1, "(tokens, query heads, 1)"}, GPU_ATT_NT, 0, s,
               GPU_ARGS(&proj, &tok_pos, &tok_slot, &bt, &bt_stride, &kc, &vc, &ks, &vs, &core, &nh, &kvh, &hd, &scale, &xs));
}

// The same attention with a long context's chunks in parallel: k_attn_part (an f32 cache) or
// k_fa's split form (bf16, fp8) writes each (token, head, chunk)'s partial state into part [T,
// nh, nc, hd + 2] (nc chunks per token reserved: ceil(max_len / GPU_ATT_CHUNK)), for the chunks
// of the step's deepest token (reach: its position + 1), then k_attn_merge folds them into core.
// The same bits as gpu_k_attention.
static void gpu_k_attn_split(gpu_kernels *k, CUstream s, int kv_dtype, CUdeviceptr proj, CUdeviceptr tok_pos, CUdeviceptr tok_slot,
                             CUdeviceptr bt, int bt_stride, CUdeviceptr kc, CUdeviceptr vc, CUdeviceptr ks, CUdeviceptr vs, CUdeviceptr part,
                             int nc, CUdeviceptr core, int nh, int kvh, int hd, float scale, CUdeviceptr xs, int T, int reach) {
    gpu_assert_attn("k_attn_part", kv_dtype, ks, vs, nh, kvh, hd);
    int nz = (int)gpu_cdiv(reach, GPU_ATT_CHUNK);
    MOET_ASSERT(nz >= 1 && nz <= nc, "k_attn_part: a context of %d positions in %d chunks of %d", reach, nc, GPU_ATT_CHUNK);
    if (kv_dtype != GPU_KV_F32) {   // a block per token, KV head and chunk
        int fp8 = kv_dtype == GPU_KV_FP8;
        gpu_fa_warps(k, kv_dtype, nh, kvh, hd);   // (the geometry checked)
        size_t smem = gpu_fa_smem(1, hd, k->parts);
        gpu_fa_room(k, K_FA, smem);
        gpu_launch(k, K_FA, (gpu_dim){T, kvh, nz, "(tokens, KV heads, chunks of the deepest token)"}, GPU_FA_SPLIT_W * 32, smem, s,
                   GPU_ARGS(&proj, &tok_pos, &tok_slot, &bt, &bt_stride, &kc, &vc, &ks, &vs, &part, &nc, &nh, &kvh, &hd, &scale, &xs, &T, &fp8));
    } else {
        gpu_launch(k, K_ATTN_PART_F32, (gpu_dim){T, nh, nz, "(tokens, query heads, chunks of the deepest token)"}, GPU_ATT_NT, 0, s,
                   GPU_ARGS(&proj, &tok_pos, &tok_slot, &bt, &bt_stride, &kc, &vc, &ks, &vs, &part, &nc, &nh, &kvh, &hd, &scale));
    }
    gpu_launch(k, K_ATTN_MERGE, (gpu_dim){T, nh, 1, "(tokens, query heads, 1)"}, GPU_ATT_NT, 0, s,
               GPU_ARGS(&proj, &tok_pos, &part, &nc, &core, &nh, &hd, &xs));
}

// ids[r] = the first index of row r's largest value in logits [rows, V] (ids: int32
// [GPU_ARGMAX_INTS(cap)], the ids first; zero before its first use, as every launch leaves it past
// the ids; every launch on one buffer gives the same cap): a greedy row's token, as samp_pick takes it at temperature 0 without penalties
// (sass/argmax.cu).
static void gpu_k_argmax(gpu_kernels *k, CUstream s, CUdeviceptr logits, int V, CUdeviceptr ids, int cap, int rows) {
    MOET_ASSERT(V >= 1 && rows >= 1 && rows <= cap, "k_argmax: %d rows of %d in a buffer of %d", rows, V, cap);
    gpu_launch(k, K_ARGMAX, (gpu_dim){rows, GPU_ARGMAX_SLICES, 1, "(rows, slices, 1)"}, GPU_ARGMAX_NT, 0, s, GPU_ARGS(&logits, &V, &ids, &cap));
}

// ids[r] = the token samp_bank_pick takes from row r of logits [rows, V] with rows[r]'s parameters,
// generator and penalties (gpu_samp_row: greedy, or top_k ≤ GPU_SAMPLE_KMAX; a penalized row's seen
// tokens are pen [pairs: id, times generated] from its pen_off; its logits are penalized in place, and
// with logprobs its pairs' second halves take its tokens' raw logits; -1 where the row has no
// candidate), and lp[r] the parts of its logprobs where the row wants them (gpu_samp_lp [rows]): a
// step's picks on the device (sass/sample.cu).
static void gpu_k_sample(gpu_kernels *k, CUstream s, CUdeviceptr logits, int V, CUdeviceptr rows, CUdeviceptr pen, CUdeviceptr ids, CUdeviceptr lp,
                         int nr) {
    MOET_ASSERT(V >= 1 && V <= 64 * GPU_SAMPLE_NB && nr >= 1, "k_sample: %d rows of %d logits (at most %d)", nr, V, 64 * GPU_SAMPLE_NB);
    gpu_launch(k, K_SAMPLE, (gpu_dim){nr, 1, 1, "(rows, 1, 1)"}, GPU_SAMPLE_NT, 0, s, GPU_ARGS(&logits, &V, &rows, &pen, &ids, &lp));
}

#undef GPU_ARGS

// ---- the plan's largest step against CUDA's grid limits ----------------------------------------
//
// Every launch of a step puts its token count (or token × top-k pairs) along grid.x, which holds
// 2³¹ − 1 blocks; what lies along grid.y and grid.z (65,535 blocks each) is bounded by the model's
// shapes, the sequences of a step, and k_linear's token tiles (ceil(T / GPU_LIN_TT)). gpu_init
// checks a plan of max_tokens per step and max_seqs rows here, before it allocates anything, so a
// plan that could not launch is refused with its reason instead of aborting in a launcher
// mid-request. The launchers assert the same limits for every launch (gpu_launch).
static int gpu_plan_grids(const ck_config *c, int max_tokens, int max_seqs, int max_len, moet_err *e) {
    const long long X = 2147483647LL, Y = 65535;
    long long T = max_tokens, pairs = T * c->topk;
    struct {
        const char *what;
        long long blocks, limit;
    } dim[] = {
        {"k_linear's token tiles (grid.y = ceil(max-batch-tokens / 8))", (T + GPU_LIN_TT - 1) / GPU_LIN_TT, Y},
        {"the routed experts' (token, choice) pairs (grid.x of k_moe_gate_up / k_moe_down)", pairs, X},
        {"the expert rows per block (grid.y of k_moe_gate_up / k_moe_down)", gpu_cdiv(c->hidden > c->inter ? c->hidden : c->inter, GPU_LIN_ROWS), Y},
        {"the rows of a step (grid.y of k_gdn_conv, k_gdn_rule, k_gdn_chunk)", max_seqs, Y},
        {"the heads (grid.y of k_attention)", c->n_heads, Y},
        {"the GDN output norm's (token, value head) items (grid.x of k_gated_norm, four a block)", gpu_cdiv(T * c->lv_heads, GPU_GNORM_NT / 32), X},
        {"the shared expert's elements (k_silu_mul's int count, T · shared_intermediate)", T * c->shared_inter, X},
        {"k_mm's token tiles (grid.y = ceil(max-batch-tokens / 32))", gpu_cdiv(T, GPU_MM_TOK), Y},
        {"attention's chunks of a context (grid.z of k_attn_part)", gpu_cdiv(max_len, GPU_ATT_CHUNK), Y},
        {"the experts' items (grid.x of k_moe_up / k_moe_dn)", gpu_moe_items_max(pairs, c->n_experts), X},
        {"the expert rows per block (grid.y of k_moe_up / k_moe_dn)", gpu_cdiv(c->hidden > c->inter ? c->hidden : c->inter, 16), Y},
        {"k_mm_split's quads of a step's widest input", gpu_cdiv(T * (c->hidden > c->n_heads * c->head_dim ? c->hidden : c->n_heads * c->head_dim) * 2, GPU_MM_NT), X},
    };
    for (size_t i = 0; i < sizeof dim / sizeof dim[0]; i++)
        if (dim[i].blocks > dim[i].limit)
            return err_set(e, "a step of %d tokens cannot launch on the GPU: %s needs %lld blocks, CUDA takes at most %lld "
                              "(lower --max-batch-tokens%s)", max_tokens, dim[i].what, dim[i].blocks, dim[i].limit,
                          strstr(dim[i].what, "rows of a step") ? " or --max-num-seqs" : strstr(dim[i].what, "context") ? " or --max-model-len" : "");
    return 0;
}
