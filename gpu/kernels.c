// gpu/kernels.c — the kernels of sass/, embedded in the binary and resolved once at boot.
//
// build.sh compiles sass/all.cu (every kernel) to one cubin per architecture and one PTX file;
// they are committed, and the assembler's .incbin puts their bytes into this program, so the
// binary needs no file beside it. At boot the image for the device's compute capability is
// loaded (sm_90, sm_120, sm_121 machine code; for any other capability ≥ 9.0 the compute_90
// PTX, which the driver compiles) and every kernel is looked up by name into a table indexed
// by an enum. Launches go through gpu_launch, which checks the grid against CUDA's limits; each
// kernel's typed launcher (gpu/launch.c) computes its geometry.

// the launch geometry constants, the weight descriptor: shared with the kernels
#include "../sass/gpu_abi.h"

#define GPU_EMBED(sym, path)                                                                         \
    __asm__(".section .rodata\n.balign 64\n.hidden " #sym "\n.global " #sym "\n" #sym ":\n.incbin \"" path "\"\n" \
            ".byte 0\n.hidden " #sym "_end\n.global " #sym "_end\n" #sym "_end:\n.previous\n");       \
    extern const unsigned char sym[], sym##_end[];
GPU_EMBED(gpu_img_sm90, "sass/moet.sm_90.cubin")
GPU_EMBED(gpu_img_sm120, "sass/moet.sm_120.cubin")
GPU_EMBED(gpu_img_sm121, "sass/moet.sm_121.cubin")
GPU_EMBED(gpu_img_ptx90, "sass/moet.compute_90.ptx")   // NUL-terminated by the .byte 0 above
// the tensor-core products reading the activations' bf16 rounding (sass/all_bf.cu)
GPU_EMBED(gpu_img_bf_sm90, "sass/moet_bf.sm_90.cubin")
GPU_EMBED(gpu_img_bf_sm120, "sass/moet_bf.sm_120.cubin")
GPU_EMBED(gpu_img_bf_sm121, "sass/moet_bf.sm_121.cubin")
GPU_EMBED(gpu_img_bf_ptx90, "sass/moet_bf.compute_90.ptx")

#define GPU_KERNELS(X)                                                                               \
    X(K_EMBED, "k_embed") X(K_ADD_RMSNORM, "k_add_rmsnorm") X(K_MOE_ADD_RMSNORM, "k_moe_add_rmsnorm") X(K_LINEAR, "k_linear") X(K_ROUTER, "k_router") \
    X(K_MOE_GATE_UP, "k_moe_gate_up") X(K_MOE_DOWN, "k_moe_down") X(K_MOE_COMBINE, "k_moe_combine")        \
    X(K_SILU_MUL, "k_silu_mul") X(K_ROUTE, "k_route") X(K_GDN_CONV, "k_gdn_conv") X(K_GDN_RULE, "k_gdn_rule") X(K_GDN_RULE4, "k_gdn_rule4") X(K_GDN_RULE_NORM, "k_gdn_rule_norm") X(K_GDN_RULE_NORM4, "k_gdn_rule_norm4")                    \
    X(K_GDN_CHUNK, "k_gdn_chunk") X(K_GDN_PREP, "k_gdn_prep")                                                \
    X(K_GATED_NORM, "k_gated_norm") X(K_ATTN_PREP_F32, "k_attn_prep_f32") X(K_ATTN_PREP_BF16, "k_attn_prep_bf16") \
    X(K_ATTN_PREP_FP8, "k_attn_prep_fp8") X(K_ATTENTION_F32, "k_attention_f32")                           \
    X(K_ATTN_PART_F32, "k_attn_part_f32") X(K_ATTN_MERGE, "k_attn_merge")                                 \
    X(K_FA, "k_fa") X(K_FA_W, "k_fa_w") X(K_ARGMAX, "k_argmax") X(K_SAMPLE, "k_sample")                                                                                    \
    X(K_MM_SPLIT, "k_mm_split") X(K_MM_V, "k_mm_v") X(K_MM_V2, "k_mm_v2") X(K_MM_V4, "k_mm_v4") X(K_MM_T, "k_mm_t") X(K_MM_D, "k_mm_d") X(K_MM_B, "k_mm_b") X(K_MM_P, "k_mm_p") X(K_MM_G, "k_mm_g") X(K_MM_G32, "k_mm_g32") X(K_MM_G128, "k_mm_g128") X(K_MM_W, "k_mm_w") X(K_MM_C, "k_mm_c") X(K_ROWS, "k_rows") \
    X(K_MOE_SORT, "k_moe_sort") X(K_MOE_SPLIT, "k_moe_split") X(K_MOE_HIST, "k_moe_hist") X(K_MOE_PLACE, "k_moe_place") X(K_MOE_UP_D, "k_moe_up_d") X(K_MOE_UP_D1, "k_moe_up_d1") X(K_MOE_UP_P, "k_moe_up_p")                      \
    X(K_MOE_DN_D, "k_moe_dn_d") X(K_MOE_DN_D1, "k_moe_dn_d1") X(K_MOE_DN_P, "k_moe_dn_p") X(K_MOE_UP_G, "k_moe_up_g") X(K_MOE_DN_G, "k_moe_dn_g") \
    X(K_MOE_UP_DG4, "k_moe_up_dg4") X(K_MOE_DN_DG4, "k_moe_dn_dg4") X(K_MOE_UP_DG1, "k_moe_up_dg1") X(K_MOE_DN_DG1, "k_moe_dn_dg1") \
    X(K_MOE_UP_G128, "k_moe_up_g128") X(K_MOE_DN_G128, "k_moe_dn_g128") X(K_MOE_UP_W, "k_moe_up_w") X(K_MOE_DN_W, "k_moe_dn_w") X(K_MOE_UP_C, "k_moe_up_c") X(K_MOE_DN_C, "k_moe_dn_c") X(K_MOE_UP_R, "k_moe_up_r") X(K_MOE_DN_R, "k_moe_dn_r")

#define GPU_K_ENUM(id, name) id,
enum { GPU_KERNELS(GPU_K_ENUM) K_COUNT };
#define GPU_K_NAME(id, name) name,
static const char *const gpu_kernel_names[K_COUNT] = {GPU_KERNELS(GPU_K_NAME)};
// The kernels that read the activations' bf16 parts, or write them for the next product: each
// also in the image of sass/all_bf.cu, reading and writing hi alone (gpu_kernels.parts 1), by the
// same name.
static const int gpu_parts_kernels[] = {K_FA, K_FA_W, K_MM_V, K_MM_V2, K_MM_V4, K_MM_T,      K_MM_D,      K_MM_B,      K_MM_P,     K_MM_G,     K_MM_G32,  K_MM_G128,  K_MM_W,  K_MM_C, K_MOE_UP_D,
                                        K_MOE_UP_D1, K_MOE_UP_P,  K_MOE_UP_G,  K_MOE_DN_D,  K_MOE_DN_D1, K_MOE_DN_P, K_MOE_DN_G,
                                        K_MOE_UP_G128, K_MOE_DN_G128, K_MOE_UP_W, K_MOE_DN_W, K_MOE_UP_C, K_MOE_DN_C, K_MOE_UP_R, K_MOE_DN_R, K_MOE_UP_DG4, K_MOE_DN_DG4,
                                        K_MOE_UP_DG1, K_MOE_DN_DG1,
                                        K_MM_SPLIT, K_ADD_RMSNORM, K_MOE_ADD_RMSNORM, K_SILU_MUL, K_ROUTE, K_GDN_RULE_NORM, K_GDN_RULE_NORM4, K_GATED_NORM, K_ATTENTION_F32, K_ATTN_MERGE};

// Dynamic shared memory of k_gdn_prep for key heads of dk (C = GPU_GDN_C): γ [C] (f64); k̂ and q̂
// [C, dk + 2], A and T [C, C + 1], β [C] (f32): 98 KiB at dk = 128, two blocks a multiprocessor.
static size_t gpu_gdn_prep_smem(int dk) {
    return sizeof(double) * GPU_GDN_C +
           sizeof(float) * (2 * (size_t)GPU_GDN_C * (dk + 2) + 2 * (size_t)GPU_GDN_C * (GPU_GDN_C + 1) + (size_t)GPU_GDN_C);
}

// Dynamic shared memory of k_gdn_chunk for key heads of dk in its form (C = GPU_GDN_C, VC =
// GPU_GDN_VC; sass/gdn_chunk.cu): k̂ and q̂ [C, dk + 4], S [dk, VC]; T (k_gdn_prep's) [C, C]
// and M [C, C], M in q̂'s place where dk ≥ C (107.75 KiB at dk = 128, two blocks a
// multiprocessor), or with GPU_GDN_LEAN both there (91.75 KiB: a 99 KiB block of sm_120 /
// sm_121); U [C, VC], β, decay weights, e^γ [C], single-token scratch 2·dk (f32). GPU_GDN_AHEAD
// (not lean, dk ≥ C): two sets of k̂, q̂, T, U and the gates (198.5 KiB at dk = 128).
static size_t gpu_gdn_chunk_smem(int dk, int form) {
    const size_t nam = form & GPU_GDN_LEAN ? 0 : dk >= GPU_GDN_C ? 1 : 2;   // T, and M where it cannot take Q̂'s place
    const size_t set = 2 * (size_t)GPU_GDN_C * (dk + 4) + nam * (size_t)GPU_GDN_C * GPU_GDN_C + (size_t)GPU_GDN_C * GPU_GDN_VC + 3 * (size_t)GPU_GDN_C;
    return sizeof(float) * ((form & GPU_GDN_AHEAD ? 2 : 1) * set + (size_t)dk * GPU_GDN_VC + 2 * (size_t)dk);
}

// Whether k_gdn_chunk's ahead form holds key heads of dk in a layout (its sets keep M in q̂'s place).
static int gpu_gdn_ahead_ok(int dk, int lean) { return !lean && dk >= GPU_GDN_C; }

// k_gdn_chunk's layout on a device of smem_optin bytes a block for key heads of dk: 0 where T has
// its own array, 1 (lean: T and M in q̂'s place once q̂ is read, which holds both where dk ≥ 2C − 4)
// where only that fits, −1 where neither (prompts then take the recurrence).
static int gpu_gdn_layout(int smem_optin, int dk) {
    if (gpu_gdn_chunk_smem(dk, 0) <= (size_t)smem_optin) return 0;
    if (dk + 4 >= 2 * GPU_GDN_C && gpu_gdn_chunk_smem(dk, 1) <= (size_t)smem_optin) return 1;
    return -1;
}

// need bytes padded past half of what a block may take on a device of smem_optin bytes (so that a
// multiprocessor holds one such block), where the padding fits room; else need.
static size_t gpu_gdn_chunk_solo(size_t need, int smem_optin, size_t room) {
    const size_t solo = (size_t)smem_optin / 2 + 1024;
    return need < solo && solo <= room ? solo : need;
}

// What k_gdn_chunk's launches may take (gpu_kernel_smem): its arrays, or more where a grid of at
// most one block per multiprocessor takes gpu_gdn_chunk_grid_smem's padding or the ahead form.
static size_t gpu_gdn_chunk_smem_max(int smem_optin, int dk, int lean) {
    const size_t most = gpu_gdn_chunk_solo(gpu_gdn_chunk_smem(dk, lean), smem_optin, (size_t)smem_optin);
    const size_t ahead = gpu_gdn_chunk_smem(dk, lean | GPU_GDN_AHEAD);
    return gpu_gdn_ahead_ok(dk, lean) && ahead > most && ahead <= (size_t)smem_optin ? ahead : most;
}

// Dynamic shared memory of k_gdn_rule (lanes 1: one warp a block) or k_gdn_rule4 (lanes
// GPU_GDN_RULE_LP: GPU_GDN_RULE_NT threads) for key heads of dk (sass/gdn_rule.cu), per warp q̂ and k̂
// [dk], and S [dk, GPU_GDN_VC] where the state is not in registers (GPU_GDN_RULE_REGS; f32).
static size_t gpu_gdn_rule_smem(int dk, int lanes) {
    const size_t warps = lanes > 1 ? GPU_GDN_RULE_NT / 32 : 1;
    return sizeof(float) * warps * ((GPU_GDN_RULE_REGS(dk) ? 0 : (size_t)dk * GPU_GDN_VC) + 2 * (size_t)dk);
}

// Dynamic shared memory of k_fa with nq tiles of 16 query rows (the walk: one per
// GPU_FA_WALK_SPLIT warps; the split: one) for heads of hd (sass/flash.cu: fa_smem): the queries
// [nq][16][hd] in `parts` bf16 parts (FA_P: three, or one in sass/all_bf.cu's image), a tile of keys
// and one of values [GPU_FA_KT][hd] bf16, their fp8 scales [2][GPU_FA_KT] and each row tile's scores
// [nq][16][GPU_FA_KT] f32.
static size_t gpu_fa_smem(int nq, int hd, int parts) {
    return (size_t)parts * 2 * (size_t)nq * 16 * hd + 2 * 2 * (size_t)GPU_FA_KT * hd + sizeof(float) * (2 + 16 * (size_t)nq) * GPU_FA_KT;
}

// The dynamic shared memory a launch may ask for until the kernel opts in to more
// (cuFuncSetAttribute: gpu_kernel_smem).
#define GPU_SMEM_DEFAULT 49152

// The kernel profiler (moet bench --profile): when on, every launch is bracketed by two events
// and the time between them is added to its kernel's total after the step (gpu_prof_collect).
// The launches then wait on the events' recording, so a profiled step is a little slower than a
// plain one; the split between kernels is what it is for.
#define GPU_PROF_MAX 8192   // launches of one profiled step

typedef struct {
    CUmodule mod, mod_bf;  // sass/all.cu's image, sass/all_bf.cu's
    CUfunction fn[K_COUNT];
    CUfunction fn_bf[K_COUNT];   // gpu_parts_kernels from mod_bf (0 for the others)
    int parts;             // the activations' bf16 parts the products read: GPU_MM_SPLITS (f32-faithful) or 1 (their bf16 rounding: fn_bf)
    const char *image;     // which image was loaded, for the log
    int smem_optin;        // the device's most dynamic shared memory per block (bytes)
    int sms;               // multiprocessors (how many blocks k_mm_v's launches aim for)
    int smem_max[K_COUNT]; // what each kernel may take now (GPU_SMEM_DEFAULT until gpu_kernel_smem)
    int gdn_lean;          // k_gdn_chunk's layout (gpu_gdn_layout: 1 = lean), 0 until the engine picks it
    int gdn_ahead;         // k_gdn_chunk's ahead form: 0 never, 1 for grids of at most one block a multiprocessor, 2 for every grid (tests); where it fits
    int gdn_rule_lanes;    // the recurrent rule's lanes a state column: 0 by the launch's size (gpu_gdn_rule_lanes), else 1 or GPU_GDN_RULE_LP (tests)
    int moe_kind;          // the routed experts' kind (GPU_W_*: the shapes gpu_moe_shape picks), -1 before it is known
    int moe_g_min;         // pairs per expert (on average) from which a step's experts take the _g shape
    int moe_g128_min;      // ... and the _g128 shape (items of up to GPU_MMG_BN128 pairs) where the products read one part (0: never)
    int moe_d_ppe;         // pairs per expert (on average) up to which they take the _d shape (≤ GPU_MOE_D_PPE)
    int mm_g_min;          // tokens from which a step's dense products take k_mm_g (where it carries their kinds)
    int mm_g_blocks;       // ... and from a whole token tile where its blocks number this many (gpu_mm_pick)
    long long mm_p_work;   // T · rows from which a step of up to GPU_MM_TOK_B tokens takes _p, not _b
    int mm_g32_max;        // tokens up to which a step that takes k_mm_g takes k_mm_g32 instead (0: never)
    int mm_g128_min;       // tokens from which such a step takes k_mm_g128 where the products read one part (0: never)
    int mm_w_min;          // ... and k_mm_w for its FP8 and NVFP4 matrices (the sm_90a cubin only; 0: never)
    int mm_w_small;        // ... and up to this many tokens too (steps of decoding sequences; 0: none)
    int mm_c;              // the FP8 products of prompts' full pieces through k_mm_c (the sm_90a cubin's one-part image only)
    int fa_w_min;          // tokens from which a prompt step's attention takes k_fa_w (the sm_90a cubin, one part; 0: never)
    int moe_w;             // the experts' _g128 items through k_moe_up_w / k_moe_dn_w (the sm_90a cubin only; 0: never)
    int moe_w_blocks;      // ... in at most this many blocks (0: one a multiprocessor; the tests' small grids: many tiles a block)
    int moe_nrb;           // row blocks a block of the experts' _d shape takes (0: gpu_moe_nrb's choice)
    int route_silu;        // k_route's SiLU · up in blocks past its first (0: its first block's)
    int moe_sort_pb;       // steps of more than this many pairs group them in k_moe_sort's grouped form (0: one block always)
    int moe_dg;            // 2-bit plane experts' _d shape through their own kernels, k_moe_*_dg4 (k_moe_*_dg1 at one
                           // row block a block; 0: k_moe_*_d, _d1)
    int mm_v2;             // dense products of GPU_MM_TOK_V + 1 to GPU_MM_TOK_V2 tokens through k_mm_v2 (0: the split-K shapes)
    int mm_v4;             // ... and of GPU_MM_TOK_V2 + 1 to GPU_MM_TOK_V4 through k_mm_v4 (0: _b, _p)
    int prof;              // profiling on
    int n_ev;              // launches recorded in this step
    int ev_kernel[GPU_PROF_MAX];
    CUevent ev[GPU_PROF_MAX][2];
    double ms[K_COUNT];    // accumulated per kernel
    uint64_t calls[K_COUNT];
} gpu_kernels;

static int gpu_kernels_load(gpu_kernels *k, const gpu_device *d, moet_err *e) {
    const unsigned char *img, *img_bf;
    if (d->cc_major == 9 && d->cc_minor == 0) img = gpu_img_sm90, img_bf = gpu_img_bf_sm90, k->image = "sm_90 cubin";
    else if (d->cc_major == 12 && d->cc_minor == 0) img = gpu_img_sm120, img_bf = gpu_img_bf_sm120, k->image = "sm_120 cubin";
    else if (d->cc_major == 12 && d->cc_minor == 1) img = gpu_img_sm121, img_bf = gpu_img_bf_sm121, k->image = "sm_121 cubin";
    else img = gpu_img_ptx90, img_bf = gpu_img_bf_ptx90, k->image = "compute_90 PTX (compiled by the driver)";
    CUresult r = cu.cuModuleLoadData(&k->mod, img);
    if (!r) r = cu.cuModuleLoadData(&k->mod_bf, img_bf);
    if (r) {
        const char *name = "?";
        cu.cuGetErrorName(r, &name);
        if (k->mod) CU_CHECK(cu.cuModuleUnload(k->mod)), k->mod = NULL;
        return err_set(e, "cannot load the %s kernels on %s (compute capability %d.%d): %s", k->image, d->name, d->cc_major,
                       d->cc_minor, name);
    }
    for (int i = 0; i < K_COUNT; i++) {
        CU_CHECK(cu.cuModuleGetFunction(&k->fn[i], k->mod, gpu_kernel_names[i]));
        k->fn_bf[i] = NULL;
        k->smem_max[i] = GPU_SMEM_DEFAULT;
    }
    for (size_t i = 0; i < sizeof gpu_parts_kernels / sizeof gpu_parts_kernels[0]; i++)
        CU_CHECK(cu.cuModuleGetFunction(&k->fn_bf[gpu_parts_kernels[i]], k->mod_bf, gpu_kernel_names[gpu_parts_kernels[i]]));
    k->parts = GPU_MM_SPLITS;
    k->gdn_lean = 0;
    k->gdn_ahead = 1;
    k->gdn_rule_lanes = 0;
    k->smem_optin = d->smem_optin;
    k->moe_kind = -1;
    k->moe_g_min = GPU_MMG_BN / 2;
    // _g128 from 128 pairs per expert (its items fill): the H200, one 8,192-token prompt (256 pairs
    // per expert) 9,631 → 11,311 tok/s with k_mm_g128 and _g at two blocks a multiprocessor (the
    // three together; the harness's experts section, at up to 16 pairs per expert, shows _g128 slower
    // there: 1,054 / 670 µs up at 512 tokens, which is why it starts at full items)
    k->moe_g128_min = GPU_MMG_BN128;
    k->mm_g_min = GPU_MM_TOK_B + 1, k->mm_g_blocks = 64, k->mm_p_work = 65536;   // (gpu_mm_pick: the harness's measures)
    // k_mm_g32 up to 128 tokens: the kernel harness on the H200 (`k_mm shapes`, the same bits),
    // _g against _g32 at 128 tokens: attention q|k|v 146.8 / 123.4 µs, GDN in-projections 147.5 /
    // 125.2; at 64 tokens even (79.7 / 79.3, 80.2 / 79.1)
    k->mm_g32_max = 128;
    // k_mm_g128 from 512 tokens (one part only): the kernel harness on the H200 at 8,192 tokens
    // (HK_ACT=bf16, the same bits), k_mm_g128 against k_mm_g: GDN in-projections 2,335 / 3,199 µs
    // (177.5 / 129.6 TFLOP/s), GDN out 735 / 1,022, router + shared expert 354 / 515, shared down
    // 153 / 214
    k->mm_g128_min = 512;
    // k_mm_w (wgmma) where the image is the sm_90a cubin (its other images trap there), from 2,048
    // tokens: on the H200 (HK_ACT=bf16, the same bits) k_mm_w against k_mm_g128, GDN in-projections,
    // GDN out, router + shared expert, shared down, µs: at 8,192 tokens 2,013 / 2,337, 639 / 731,
    // 306 / 354, 117 / 153; at 2,048 570 / 606, 166 / 193, 119 / 124, 33 / 43 (every set faster);
    // at 1,024 325 / 314, 87 / 103, 116 / 65, 19 / 23 (the four sets 44 µs slower in all).
    k->mm_w_min = d->cc_major == 9 && d->cc_minor == 0 ? 2048 : 0;
    // ... and for steps of up to 128 tokens (a batch of decoding sequences) where they would take
    // k_mm_g's tiles (the largest sets: GDN in-projections, attention q|k|v, the lm_head; the same
    // bits): moet bench on the H200, full-size synthetic model, depth 64, one lease, up to 0 / 128 /
    // 256 tokens: batch 64 4,789.7-4,813.3 / 4,995.7 / 5,012.5-5,015.8 tok/s, batch 128
    // 5,368.9-5,377.4 / 5,905.7 / 5,917.5-5,926.9, batch 256 6,487.4-6,488.5 / 6,494.0 /
    // 6,358.5-6,360.1 (its one 128-token tile against k_mm_g32's four of 32 at 128 tokens)
    k->mm_w_small = k->mm_w_min ? 128 : 0;
    // k_mm_c for the full pieces of prompts where k_mm_w runs (the one-part image: gpu_engine's mmc)
    k->mm_c = k->mm_w_min != 0;
    // k_moe_up_w / k_moe_dn_w for every _g128 step there, and _g128 from 64 pairs per expert with
    // them: on the H200 (the harness's k_moe_* shapes rows, Qwen3.6's experts) at 2,048 tokens (64
    // pairs per expert) _w against _g, up + down, 1,342 / 1,518 µs with planes, 1,276 / 1,443 with
    // NVFP4; at 8,192 tokens against _g128 3,801 / 4,320 and 3,396 / 4,018
    k->moe_w = d->cc_major == 9 && d->cc_minor == 0;
    // k_fa_w (k_fa's walk on wgmma) from 1,024 tokens there (gpu_fa_w_take: and 16 tokens a row on the average)
    k->fa_w_min = d->cc_major == 9 && d->cc_minor == 0 ? 1024 : 0;
    if (k->moe_w) k->moe_g128_min = GPU_MMG_BN128 / 2;
    // _d up to GPU_MOE_D_PPE pairs per expert: the kernel harness on the H200 (planes, _d against
    // _p, up + down: 336 against 999 µs at 2 pairs per expert, 610 against 1,340 at 8, 1,030 against
    // 1,688 at 16; the same bits)
    k->moe_d_ppe = GPU_MOE_D_PPE;
    k->mm_v2 = 1;
    // k_mm_v4 for 17-32 tokens (the same bits as _b, _p): moet bench on the H200, full-size synthetic
    // model, depth 64, one lease, twice each, without / with: batch 24 2,915.9-2,925.1 / 2,966.6-2,978.7
    // tok/s, batch 32 3,323.6-3,339.5 / 3,396.7-3,408.4 (batch 1, 16, 64 the same within 0.3 %)
    k->mm_v4 = 1;
    // (H200, full-size synthetic model, decode tok/s at depth 64 in one lease each: batch 16
    // k_moe_*_d 2,008-2,012 -> _dg4 2,189-2,190; with mm_core_pl, _dg4 against the same planes
    // path at three blocks a multiprocessor (k_moe_*_dg, 80 registers, since removed) for steps of
    // more than 32 sequences: batch 64 4,758.8-4,775.5 against 4,581.8-4,598.5; batch 1, one row
    // block a block, _dg1 340.1-341.3 against k_moe_*_d1's 333.3-334.2 (before mm_core_pl _dg1 319
    // against 321-322))
    k->moe_dg = 1;
    // (k_moe_sort is one block: 69 us a launch at an 8,192-token prompt's 65,536 pairs, 2.8 ms of the prompt's 248 on an
    // H100; the grouped form spreads them over blocks of GPU_MOE_SORT_PB)
    k->moe_sort_pb = GPU_MOE_SORT_PB;
    // (the same bench, without / with: batch 1 340.9-343.3 / 347.0-347.2, batch 16 2,433.5-2,445.1 /
    // 2,564.1-2,565.4, batch 32 3,323.6-3,339.5 / 3,460.1-3,463.7, batch 64 5,003.1-5,025.9 /
    // 5,023.5-5,034.5: block 0's routing no longer waits on the SiLU's T·768 elements)
    k->route_silu = 1;
    k->sms = d->sms;
    return 0;
}

// Lets kernel fn take up to `bytes` of dynamic shared memory per block (past GPU_SMEM_DEFAULT it
// must opt in). The caller checked that the device has them (gpu_init refuses a geometry that
// needs more).
static void gpu_kernel_smem(gpu_kernels *k, int fn, size_t bytes) {
    MOET_ASSERT(bytes <= (size_t)k->smem_optin, "%s: %zu bytes of shared memory per block; the device has %d", gpu_kernel_names[fn],
                bytes, k->smem_optin);
    CU_CHECK(cu.cuFuncSetAttribute(k->fn[fn], GPU_FUNC_ATTR_MAX_DYN_SMEM, (int)bytes));
    if (k->fn_bf[fn]) CU_CHECK(cu.cuFuncSetAttribute(k->fn_bf[fn], GPU_FUNC_ATTR_MAX_DYN_SMEM, (int)bytes));
    k->smem_max[fn] = (int)bytes;
}

// The dynamic shared memory of a k_gdn_chunk launch of `blocks` blocks and its form (*form: the
// layout, GPU_GDN_AHEAD added where taken): its arrays (two blocks a multiprocessor at dk = 128),
// but for a grid of at most one block per multiprocessor (one prompt: 128 blocks on 132) the ahead
// form where k->gdn_ahead allows it and it fits the registered limit (more than half of what a
// block may take), else more than half of that by padding, so that no two of them share one while
// others idle — a piece's walk is bound by its latency. `moet bench` on the H200, one prompt
// of 8,192 tokens: 107 KiB (two blocks a multiprocessor allowed) 6,761–6,769 tok/s, padded to
// 114.5 KiB 7,277 (the kernel before M took q̂'s place, 123.5 KiB: 7,213–7,220); 16 prompts of
// 1,024 (2,048 blocks) 8,628–8,653 with two blocks a multiprocessor against 7,779–7,799. Where
// the registered limit is below the padding, the arrays alone.
static size_t gpu_gdn_chunk_grid_smem(const gpu_kernels *k, int dk, long long blocks, int *form) {
    const size_t room = (size_t)k->smem_max[K_GDN_CHUNK], ahead = gpu_gdn_chunk_smem(dk, k->gdn_lean | GPU_GDN_AHEAD);
    *form = k->gdn_lean;
    if ((k->gdn_ahead == 2 || (k->gdn_ahead == 1 && blocks <= k->sms)) && gpu_gdn_ahead_ok(dk, k->gdn_lean) && ahead <= room) {
        *form |= GPU_GDN_AHEAD;
        return blocks <= k->sms ? gpu_gdn_chunk_solo(ahead, k->smem_optin, room) : ahead;
    }
    const size_t need = gpu_gdn_chunk_smem(dk, k->gdn_lean);
    return blocks <= k->sms ? gpu_gdn_chunk_solo(need, k->smem_optin, room) : need;
}

// A launch's grid, in blocks (long long: a launcher's product of shapes is checked, not wrapped),
// and what its axes count, for the message when one is past CUDA's limits.
typedef struct {
    long long x, y, z;
    const char *axes;   // e.g. "(row blocks, token·choice pairs, 1)"
} gpu_dim;

// One kernel launch, called by the typed launchers of gpu/launch.c only. A grid, block or shared
// memory past what CUDA takes is a broken invariant named here (kernel, dimension, value, limit),
// not the driver's CUDA_ERROR_INVALID_VALUE.
static void gpu_launch(gpu_kernels *k, int fn, gpu_dim grid, int block, size_t smem, CUstream s, void **args) {
    const char *name = gpu_kernel_names[fn];
    MOET_ASSERT(grid.x >= 1 && grid.x <= 2147483647LL, "%s: grid.x = %lld blocks %s; CUDA takes 1 .. 2^31 - 1", name, grid.x, grid.axes);
    MOET_ASSERT(grid.y >= 1 && grid.y <= 65535, "%s: grid.y = %lld blocks %s; CUDA takes 1 .. 65,535", name, grid.y, grid.axes);
    MOET_ASSERT(grid.z >= 1 && grid.z <= 65535, "%s: grid.z = %lld blocks %s; CUDA takes 1 .. 65,535", name, grid.z, grid.axes);
    MOET_ASSERT(block >= 1 && block <= 1024, "%s: a block of %d threads; CUDA takes 1 .. 1,024", name, block);
    MOET_ASSERT(smem <= (size_t)k->smem_max[fn], "%s: %zu bytes of dynamic shared memory; the kernel may take %d (gpu_kernel_smem)",
                name, smem, k->smem_max[fn]);
    int p = k->prof && k->n_ev < GPU_PROF_MAX ? k->n_ev++ : -1;
    if (p >= 0) {
        k->ev_kernel[p] = fn;
        CU_CHECK(cu.cuEventRecord(k->ev[p][0], s));
    }
    // Every kernel waits for its predecessors' results itself (GPU_DEP), so each may start while
    // the one before it finishes: its blocks take the room that one leaves and request their
    // weights. The profiler times kernels one by one, without the overlap.
    gpu_launch_attr pdl = {.id = GPU_LAUNCH_ATTR_PROGRAMMATIC, .v.value = 1};
    gpu_launch_config cfg = {(unsigned)grid.x, (unsigned)grid.y, (unsigned)grid.z, (unsigned)block, 1, 1, (unsigned)smem, s, &pdl, k->prof ? 0u : 1u};
    CUresult r = cu.cuLaunchKernelEx(&cfg, k->parts == 1 && k->fn_bf[fn] ? k->fn_bf[fn] : k->fn[fn], args, NULL);
    if (r) {   // which launch, then the driver's word
        fprintf(stderr, "moet: %s: grid (%lld, %lld, %lld) %s, %d threads, %zu bytes of dynamic shared memory:\n", name, grid.x, grid.y, grid.z,
                grid.axes, block, smem);
        CU_CHECK(r);
    }
    if (p >= 0) CU_CHECK(cu.cuEventRecord(k->ev[p][1], s));
}

// Turns the profiler on (events created once, before `ready`) or off.
static void gpu_prof_start(gpu_kernels *k) {
    if (!k->ev[0][0])
        for (int i = 0; i < GPU_PROF_MAX; i++)
            for (int j = 0; j < 2; j++) CU_CHECK(cu.cuEventCreate(&k->ev[i][j], 0));
    memset(k->ms, 0, sizeof k->ms);
    memset(k->calls, 0, sizeof k->calls);
    k->n_ev = 0;
    k->prof = 1;
}

// After a step has finished: adds each recorded launch's time to its kernel.
static void gpu_prof_collect(gpu_kernels *k) {
    for (int i = 0; i < k->n_ev; i++) {
        float ms;
        CU_CHECK(cu.cuEventSynchronize(k->ev[i][1]));
        CU_CHECK(cu.cuEventElapsedTime(&ms, k->ev[i][0], k->ev[i][1]));
        k->ms[k->ev_kernel[i]] += ms;
        k->calls[k->ev_kernel[i]]++;
    }
    k->n_ev = 0;
}

// The table: kernel, calls, total ms, share.
static void gpu_prof_print(const gpu_kernels *k, FILE *f, const char *what, int steps) {
    double total = 0;
    for (int i = 0; i < K_COUNT; i++) total += k->ms[i];
    fprintf(f, "moet bench: kernel time per %s step (%d steps profiled; sum of kernels %.3f ms):\n", what, steps, total / steps);
    for (int i = 0; i < K_COUNT; i++)
        if (k->calls[i])
            fprintf(f, "moet bench:   %-18s %6.0f calls %9.3f ms %5.1f%%\n", gpu_kernel_names[i], (double)k->calls[i] / steps,
                    k->ms[i] / steps, 100 * k->ms[i] / total);
}
