// sass/gpu_abi.h — what the host (C) and the kernels (CUDA) agree on: weight descriptors, the
// kinds of stored weights and every launch geometry constant. Included by gpu/ and by every
// sass/*.cu; C and C++ alike.
#ifndef MOET_GPU_ABI_H
#define MOET_GPU_ABI_H

#ifdef __cplusplus
#define GPU_ABI_ASSERT(cond, why) static_assert(cond, why)
#else
#define GPU_ABI_ASSERT(cond, why) _Static_assert(cond, why)
#endif

// ---- launch geometry ---------------------------------------------------------------------
//
// Threads per block (GPU_*_NT) are each kernel's __launch_bounds__ and the block its launcher
// in gpu/launch.c asks for; the other constants are how a kernel cuts its work, from which the
// launcher computes the grid. Each kernel's header comment says how it uses them.

// k_linear, k_moe_gate_up, k_moe_down: a block of GPU_LIN_ROWS warps, one output row each.
#define GPU_LIN_ROWS 8
#define GPU_LIN_NT (GPU_LIN_ROWS * 32)
// k_linear: tokens per block (a weight chunk is decoded once per this many tokens).
#define GPU_LIN_TT 8
// k_gdn_rule, k_gdn_chunk: value columns per block (k_gdn_chunk: one a lane of a warp).
#define GPU_GDN_VC 32
// k_gdn_rule: the key head dimensions whose state is kept in registers (others: in shared
// memory, a warp's GPU_GDN_VC columns one a lane, blocks of one warp), and the lanes that share a
// state column there (GPU_GDN_RULE_LP: each its rows d ≡ its part mod GPU_GDN_RULE_LP, the
// column's sums meeting by shuffles; blocks of GPU_GDN_RULE_NT threads, GPU_GDN_VC columns).
#define GPU_GDN_RULE_REGS(dk) ((dk) == 32 || (dk) == 64 || (dk) == 128)
#define GPU_GDN_RULE_LP 4
#define GPU_GDN_RULE_NT (GPU_GDN_RULE_LP * GPU_GDN_VC)
GPU_ABI_ASSERT(GPU_GDN_RULE_LP >= 1 && GPU_GDN_RULE_LP <= 32 && (GPU_GDN_RULE_LP & (GPU_GDN_RULE_LP - 1)) == 0,
               "k_gdn_rule: a power of two of lanes a column, at most a warp (so it divides the registers forms' dk)");
// k_gdn_chunk: tokens per piece (prompts are cut at its multiples of their positions: the GPU
// backend's chunk_align) and threads per block; its thread mapping (16 × 16 tiles of 4 × 4
// tokens, 8 warps, 8 lanes per value column) is written for exactly these three numbers.
#define GPU_GDN_C 64
#define GPU_GDN_NT 256
GPU_ABI_ASSERT(GPU_GDN_VC == 32 && GPU_GDN_C == 64 && GPU_GDN_NT == 256, "k_gdn_chunk's thread mapping");
// k_gdn_prep's floats for one value head of one piece (tm): T and M [C, C], then the piece's β, decay
// weights e^{γ_{n−1} − γ_r} and e^{γ_r} [C] (the walk's; sass/gdn_chunk.cu).
#define GPU_GDN_TM (2 * GPU_GDN_C * GPU_GDN_C + 3 * GPU_GDN_C)
// k_gdn_chunk's form (its last argument, bits): lean (T and M in q̂'s place, for blocks of 99 KiB)
// and ahead (two sets of a piece's arrays: the next piece's copies issued at a piece's start, for
// grids of at most one block a multiprocessor; gpu/kernels.c: gpu_gdn_chunk_grid_smem).
#define GPU_GDN_LEAN 1
#define GPU_GDN_AHEAD 2
// k_attention: warps per block (each takes every GPU_ATT_WARPS-th position) and the largest
// head_dim (one accumulator per lane per 32 dims, and one row per warp in shared memory).
#define GPU_ATT_WARPS 16
#define GPU_ATT_NT (GPU_ATT_WARPS * 32)
#define GPU_ATT_MAX_HD 512
GPU_ABI_ASSERT(GPU_ATT_MAX_HD % GPU_ATT_NT == 0, "k_attention: whole dims per thread");
// Attention's chunks of absolute positions (sass/attention.cu): the unit of its split over the
// context and of the order its partial states fold in.
#define GPU_ATT_CHUNK 256
// Steps of up to this many tokens (and --max-num-seqs) take attention split over the chunks
// (k_attn_part, k_attn_merge); longer ones walk them in one block per token and head.
#define GPU_ATT_SPLIT_T 64
// k_fa (sass/flash.cu, bf16 and fp8 caches): keys per tile (the unit of the online softmax;
// divides GPU_ATT_CHUNK); the walk's warps per block and how many share a tile of 16 query rows;
// the split form's warps (all sharing its one tile: a 16-key step of each key tile each).
#define GPU_FA_KT 64
#define GPU_FA_WALK_W 8
#define GPU_FA_WALK_SPLIT 2
#define GPU_FA_SPLIT_W 4
GPU_ABI_ASSERT(GPU_FA_SPLIT_W * 16 == GPU_FA_KT && GPU_FA_KT % (16 * GPU_FA_WALK_SPLIT) == 0 && GPU_FA_WALK_W % GPU_FA_WALK_SPLIT == 0,
               "flash: whole 16-key steps of a key tile per warp");
GPU_ABI_ASSERT(GPU_FA_WALK_W / GPU_FA_WALK_SPLIT * 16 * 4 <= 2 * GPU_FA_KT * 2, "flash: the row tiles' f32 query scratch fits in the two tiles");
// k_fa_w (sass/flash_w.cu: k_fa's walk on wgmma, sm_90a one-part images): heads of GPU_FAW_HD, GPU_FAW_NT threads (a
// producer warpgroup, two consumer warpgroups of 64 query rows), GPU_FAW_STAGES stages of a key tile and its value tile;
// GPU_FAW_SMEM of dynamic shared memory: the queries 2 × 64 rows × GPU_FAW_HD bf16, the stages (GPU_FA_KT keys and
// values × GPU_FAW_HD bf16 each), their fp8 scales (f32), the barriers (padded to 1,024) and 1,024 to align the base.
#define GPU_FAW_HD 256
#define GPU_FAW_NT 384
#define GPU_FAW_STAGES 2
#define GPU_FAW_SMEM (2 * 64 * GPU_FAW_HD * 2 + GPU_FAW_STAGES * 2 * GPU_FA_KT * GPU_FAW_HD * 2 + GPU_FAW_STAGES * 2 * GPU_FA_KT * 4 + 1024 + 1024)
// k_attn_prep: 4 warps, one head at a time each.
#define GPU_PREP_NT 128
// k_router: the most experts a token may choose (a shared array of their weights), and the most
// experts (each lane holds E / 32 of their probabilities in registers: sass/router.cu).
#define GPU_ROUTER_NT 32
#define GPU_ROUTER_SUM_NT 256   // the block whose summation order k_router keeps (sass/router.cu)
#define GPU_ROUTER_MAX_K 64
#define GPU_ROUTER_MAX_E 1024
// k_gdn_conv: a block of 32 channels × GPU_CONV_NT / 32 segments of a row's tokens; the longest
// conv kernel (taps and history in registers).
#define GPU_CONV_NT 512
GPU_ABI_ASSERT(GPU_CONV_NT % 32 == 0 && ((GPU_CONV_NT / 32) & (GPU_CONV_NT / 32 - 1)) == 0, "k_gdn_conv: whole warps, a power of two of them");
#define GPU_CONV_MAX_K 8
// the one-block-per-row and element-wise kernels
#define GPU_EMBED_NT 256     // k_embed: a block per token
#define GPU_NORM_NT 256      // k_add_rmsnorm: a block per row
#define GPU_GNORM_NT 128     // k_gated_norm: a warp per (token, value head), four a block; k_gdn_rule_norm: a value head a block
#define GPU_GDN_RN_NT (GPU_GDN_RULE_LP * GPU_GNORM_NT)   // k_gdn_rule_norm4: a value head a block, GPU_GDN_RULE_LP lanes a column
// k_gdn_rule_norm / k_gdn_rule_norm4: the blocks a multiprocessor each asks of ptxas (__launch_bounds__; the
// host sizes the four-lane form's launches by the second: gpu_gdn_rule_lanes)
#define GPU_GDN_RN_MINB 3
#define GPU_GDN_RN4_MINB 2
#define GPU_COMBINE_NT 256   // k_moe_combine: a thread per (token, hidden element)
#define GPU_SILU_NT 256      // k_silu_mul: a thread per element
#define GPU_ARGMAX_NT 256    // k_argmax: a block per slice of a row of logits
#define GPU_ARGMAX_SLICES 64 // k_argmax: the slices of a row (blocks), merged by the row's last block
// k_argmax's int32 buffer for up to `rows` rows a launch: ids [rows], the rows' finished-slice counters [rows]
// (zero between launches: set once, each row's last block puts it back), each slice's (largest
// value, its first index) [rows][GPU_ARGMAX_SLICES][2]
#define GPU_ARGMAX_INTS(rows) ((size_t)(rows) * (2 + 2 * GPU_ARGMAX_SLICES))
GPU_ABI_ASSERT(GPU_ARGMAX_SLICES <= GPU_ARGMAX_NT && GPU_ARGMAX_NT % 32 == 0, "k_argmax: a merging thread per slice");
// k_sample: a block per row; the row's blocks of 64 logits (samp_block_max's: SAMP_BLOCK) in shared
// memory, so V ≤ 64 · GPU_SAMPLE_NB; rows that sample keep at most GPU_SAMPLE_KMAX tokens (top_k ≤ it)
#define GPU_SAMPLE_NT 1024
#define GPU_SAMPLE_NB 4096
#define GPU_SAMPLE_KMAX 1024
GPU_ABI_ASSERT(GPU_SAMPLE_KMAX == GPU_SAMPLE_NT && GPU_SAMPLE_NB <= 65536, "k_sample: a thread per kept token (its sort), block ids in 16 bits");
// k_sample: the (token, times generated) pairs of the penalized rows of one launch, all rows together
#define GPU_SAMPLE_PEN (1 << 20)
// One row of a k_sample launch: its slot's sampling parameters and generator (gpu/backend.c fills
// it from the slot's samp_bank entry before each step): temperature 0 is greedy, else a pick
// with 1 ≤ top_k ≤ GPU_SAMPLE_KMAX; the penalties on the tokens the slot has seen; the parts of
// the pick's logprobs (gpu_samp_lp: of the raw logits, penalized row or not; the host's log finishes them).
typedef struct {
    uint64_t rng[4];     // the slot's generator before the pick (the host's copy takes the same one draw after)
    float temperature;   // 0: greedy
    float inv_t;         // 1.0f / temperature, the host's float division (samp_pick's)
    float min_p;         // 0: none
    float min_p_log;     // logf(min_p) − 1e-3f where min_p > 0 (samp_pick's bound, by the host's logf)
    float top_p;
    int top_k;
    float rep, freq, pres;   // the repetition (1: none), frequency and presence penalties
    int pen_off, pen_n;      // the seen tokens: pairs [pen_off, pen_off + pen_n) of the launch's (id, times generated);
                             // with logprobs k_sample overwrites each second half with the token's raw logit
    int logprobs, n_top;     // the pick's logprobs wanted, and this many most likely tokens (≤ GPU_SAMPLE_TOP)
    int pad[3];
} gpu_samp_row;
GPU_ABI_ASSERT(sizeof(gpu_samp_row) == 96, "gpu_samp_row: 96 bytes");
// What k_sample gives of a row's logprobs (samp_logprobs's parts; the host takes lse = top + log(total)):
#define GPU_SAMPLE_TOP 20
typedef struct {
    double total;                 // Σ e^(x − top) over the row's logits, samp_sum_exp's order
    float top, chosen;            // the row's largest logit, the picked token's
    int n;                        // most likely tokens found: min(n_top, the row's numbers)
    int ids[GPU_SAMPLE_TOP];      // most likely first, ties to the lower id
    float vals[GPU_SAMPLE_TOP];   // their logits
    int pad[3];
} gpu_samp_lp;
GPU_ABI_ASSERT(sizeof(gpu_samp_lp) == 192, "gpu_samp_lp: 192 bytes");

// FP8 weights on the device: each 4-byte group of a row holds its codes in the order c0 c2 c1 c3
// (gpu/engine.c gpu_put permutes them on the way up), so the tensor-core products widen a word
// into the pairs (c0, c1) and (c2, c3) with masks and shifts alone (sass/mm.cuh: mm_fp8x4). Code i
// of a group is at byte GPU_FP8_SLOT(i) (its own inverse).
#define GPU_FP8_SLOT(i) ((i) == 1 ? 2 : (i) == 2 ? 1 : (i))

// k_mm*, k_moe_up*, k_moe_dn* (sass/mm.cuh): a block of GPU_MM_WARPS warps, each one slice of
// k (the 64-blocks kb ≡ warp mod GPU_MM_WARPS), over a tile of 16·RT rows and GPU_MM_TOK tokens
// (four n-tiles of 8); activations as GPU_MM_SPLITS bf16 parts (k_mm_split: hi, mid, lo), of
// which the products read GPU_MM_PARTS: all three (f32-faithful: the kernels of sass/all.cu) or
// hi alone, the bf16 rounding of the activations (the same sources built from sass/all_bf.cu,
// `--act-dtype bf16`). The host learns which from the image a kernel comes from (gpu_kernels.parts).
#define GPU_MM_WARPS 8
#define GPU_MM_NT (GPU_MM_WARPS * 32)
#define GPU_MM_TOK 32
#define GPU_MM_SPLITS 3
#ifndef GPU_MM_PARTS
#define GPU_MM_PARTS GPU_MM_SPLITS
#endif
// The launch shapes (sass/mm.cu, moe_mm.cu): _d for steps of up to 8 tokens (or 8 expert pairs), _b up to
// GPU_MM_TOK_B, _p beyond.
#define GPU_MM_TOK_B 128
// k_mm_v: steps of up to GPU_MM_TOK_V tokens (their parts in shared memory), each thread's
// weights of GPU_MM_RING_BYTES / (8 KiB, 16 KiB for BF16) steps in flight through a ring of
// GPU_MM_RING_BYTES of shared memory, GPU_MM_V_BLOCKS blocks per multiprocessor (the registers are
// capped for it). The xs layout there is [part][token][K] (T·K elements per part).
#define GPU_MM_TOK_V 4
#define GPU_MM_RING_BYTES 49152
#define GPU_MM_V_BLOCKS 3
// k_mm_v2: k_mm_v's steps for GPU_MM_TOK_V + 1 to GPU_MM_TOK_V2 tokens (two n-tiles), the tokens
// read from global memory (L1), the ring alone in shared memory; GPU_MM_V2_BLOCKS a multiprocessor.
#define GPU_MM_TOK_V2 16
#define GPU_MM_V2_BLOCKS 2
// k_mm_v4: k_mm_v2's steps for GPU_MM_TOK_V2 + 1 to GPU_MM_TOK_V4 tokens (four n-tiles), its warps'
// sums (GPU_MM_V4_RED bytes: two tiles' worth) after the ring in dynamic shared memory.
#define GPU_MM_TOK_V4 32
#define GPU_MM_V4_BLOCKS 2
#define GPU_MM_V4_RED (2 * GPU_MM_WARPS * 128 * 4 * 4)
// k_mm_t: k_mm_v's row tiles, the weights through a ring of GPU_MT_RING bytes of stages of at
// most GPU_MT_STAGE_BYTES (sass/mm.cuh: mt_kbc) that bulk copies fill, at most GPU_MT_STAGES of
// them (their mbarriers are static), GPU_MT_BLOCKS blocks per multiprocessor.
#define GPU_MT_RING 73728
#define GPU_MT_STAGE_BYTES 24576
#define GPU_MT_STAGES 8
#define GPU_MT_BLOCKS 2
#define GPU_MT_MIN_BYTES (32.0 * 1024 * 1024)   // gpu_k_mm: k_mm_t from this many bytes of weights (none FP8)
GPU_ABI_ASSERT(GPU_MM_TOK == 32 && GPU_MM_SPLITS == 3 && (GPU_MM_PARTS == 3 || GPU_MM_PARTS == 1), "sass/mm.cu: four n-tiles of 8 tokens, mm_split3");
// k_mm_g (sass/mm.cuh: mmg_run): prompt steps in tiles of GPU_MMG_BM rows × GPU_MMG_BN tokens per block
// (warp w copies row tile w of 16; warps as 4 × 2 of 32 rows × GPU_MMG_BN / 2 tokens), GPU_MMG_STAGES
// 64-blocks of both operands in flight through shared memory, GPU_MMG_BLOCKS blocks per multiprocessor;
// the experts' k_moe_up_g / k_moe_dn_g GPU_MOEG_BLOCKS (reading one part, sass/all_bf.cu: two — 128
// registers without spilling, a third of the staged activations; k_mm_g would spill there).
#define GPU_MMG_BM 128
#define GPU_MMG_BN 64
#define GPU_MMG_STAGES 4
#define GPU_MMG_BLOCKS 1
#define GPU_MOEG_BLOCKS (GPU_MM_PARTS == 1 ? 2 : 1)
// k_mm_g32: k_mm_g's tiles of GPU_MMG_BN32 tokens (half the stages' bytes), GPU_MMG32_BLOCKS blocks
// per multiprocessor.
#define GPU_MMG_BN32 32
// k_mm_g128: tiles of GPU_MMG_BN128 tokens (one bf16 part only: gpu_mm_pick), one block a multiprocessor.
#define GPU_MMG_BN128 128
#define GPU_MMG32_BLOCKS 2
// k_mm_w (sass/mm_w.cu; the sm_90a cubin's one-part image only): prompt products of FP8 and NVFP4
// weights on wgmma in tiles of GPU_MMW_BM rows × GPU_MMW_BN tokens, GPU_MMW_NT threads (two producer
// warpgroups, the weights' and the tokens', two consumer warpgroups of 64 rows each), GPU_MMW_STAGES
// widened 64-blocks and GPU_MMW_RAW raw ones (GPU_MMW_RAW_A bytes a weight row: 16 past FP8's 64,
// so eight lanes' 16-byte reads meet eight bank groups; GPU_MMW_RAW_B a token, a 128-byte line whose
// pieces are swizzled instead) in flight; GPU_MMW_SMEM of dynamic shared memory (1 KiB of it to
// align the stages to 1,024 bytes, wgmma's 128B swizzle). k_moe_up_w / k_moe_dn_w (sass/moe_w.cu):
// with 2-bit plane experts the tokens go straight into the stages, so the raw ring holds weights
// alone — GPU_MMW_PL_SLOT bytes a 64-block (the eight producer warps' buffers of their 16-row blocks'
// codes and scales), a slot a stage — and GPU_MMW_STAGES_PL stages fit; GPU_MMW_SMEM_MOE, the larger
// of the two plans (a block a multiprocessor either way: its registers).
#define GPU_MMW_BM 128
#define GPU_MMW_BN 128
#define GPU_MMW_NT 512
#define GPU_MMW_STAGES 4
#define GPU_MMW_STAGES_PL 6
#define GPU_MMW_RAW 3
#define GPU_MMW_RAW_A 80
#define GPU_MMW_RAW_B 128
#define GPU_MMW_PL_SLOT 2304
#define GPU_MMW_SMEM_FP (GPU_MMW_STAGES * (GPU_MMW_BM + GPU_MMW_BN) * 128 + GPU_MMW_RAW * (GPU_MMW_BM * GPU_MMW_RAW_A + GPU_MMW_BN * GPU_MMW_RAW_B))
#define GPU_MMW_SMEM_PL (GPU_MMW_STAGES_PL * ((GPU_MMW_BM + GPU_MMW_BN) * 128 + GPU_MMW_PL_SLOT))
#define GPU_MMW_SMEM (GPU_MMW_SMEM_FP + 1024)
#define GPU_MMW_SMEM_MOE ((GPU_MMW_SMEM_FP > GPU_MMW_SMEM_PL ? GPU_MMW_SMEM_FP : GPU_MMW_SMEM_PL) + 1024)
// k_moe_up_c / k_moe_dn_c (sass/moe_c.cu: the chain products of prompts' full pieces' pairs, 2-bit plane experts):
// tiles of GPU_MOEC_BM weight rows × GPU_MMW_BN tokens, GPU_MMW_NT threads, GPU_MOEC_STAGES stages of the widened
// rows and the tokens and as many raw slots of the sixteen 16-row blocks' codes and scales (GPU_MOEC_SLOT bytes);
// GPU_MOEC_SMEM of dynamic shared memory (1 KiB of it to align the stages).
#define GPU_MOEC_BM 256
#define GPU_MOEC_STAGES 4
#define GPU_MOEC_SLOT 4608
#define GPU_MOEC_SMEM (GPU_MOEC_STAGES * ((GPU_MOEC_BM + GPU_MMW_BN) * 128 + GPU_MOEC_SLOT) + 1024)
// k_moe_up_r / k_moe_dn_r (sass/moe_r.cu; the engine's chain path): k_moe_up_c / k_moe_dn_c's tiles with the
// weights' A operand from registers: GPU_MOER_NT threads (a copying warpgroup, two consumer warpgroups),
// GPU_MOER_STAGES stages of the tokens' 64-block and the sixteen 16-row blocks' raw codes and scales (GPU_MOER_STAGE
// bytes, 1,024-aligned), GPU_MOER_SMEM of dynamic shared memory (1 KiB of it to align the stages).
#define GPU_MOER_NT 384
#define GPU_MOER_STAGES 10
#define GPU_MOER_STAGE 21504
#define GPU_MOER_SMEM (GPU_MOER_STAGES * GPU_MOER_STAGE + 1024)
// k_mm_c (sass/mm_c.cu; the sm_90a cubin's one-part image only): the FP8 products of a prompt's full
// pieces (GPU_MMC_PIECE tokens at positions [64m, 64m + 64) of one sequence, wholly in the step) in
// chain order — one accumulator over K, the 64-blocks and their k in ascending order — on wgmma, in
// tiles of GPU_MMC_BM rows × GPU_MMC_BN tokens (GPU_MMC_BN / GPU_MMC_PIECE pieces), GPU_MMC_NT
// threads (one producer warpgroup, two consumer warpgroups of 64 rows × 256 tokens each),
// GPU_MMC_STAGES widened 64-blocks and GPU_MMC_RAW raw ones of weights (GPU_MMC_RAW_A bytes a
// row) in flight, GPU_MMC_SMEM of dynamic shared memory (1 KiB of it to align the stages).
#define GPU_MMC_PIECE 64
#define GPU_MMC_BM 128
#define GPU_MMC_BN 256
#define GPU_MMC_NT 384
#define GPU_MMC_STAGES 4
#define GPU_MMC_RAW (GPU_MMC_STAGES - 1)
#define GPU_MMC_RAW_A 80
#define GPU_MMC_SMEM (GPU_MMC_STAGES * (GPU_MMC_BM + GPU_MMC_BN) * 128 + GPU_MMC_RAW * GPU_MMC_BM * GPU_MMC_RAW_A + 1024)
// k_rows (sass/rows.cu): threads a block (a row's words in blocks of them).
#define GPU_ROWS_NT 256
GPU_ABI_ASSERT(GPU_MMC_BN % GPU_MMC_PIECE == 0 && GPU_MMC_PIECE == 64, "k_mm_c: whole pieces a token tile");
GPU_ABI_ASSERT(GPU_MMG_BM == 16 * GPU_MM_WARPS && GPU_MMG_BN % 16 == 0 && GPU_MMG_BN32 % 16 == 0 && GPU_MMG_BN128 % 16 == 0 && GPU_MM_WARPS == 8,
               "mmg_run: a row tile per warp, warps 4 × 2");
// k_moe_sort: one block, a thread per expert for its scans; each thread's pairs read this many at a
// time (moe_sort_block: their loads in flight together)
#define GPU_MOE_SORT_NT 1024
#define GPU_MOE_SORT_U 8
// ... and its grouped form for steps of more than GPU_MOE_SORT_PB pairs (gpu_k_moe_sort): blocks of
// GPU_MOE_SORT_PB pairs, k_moe_hist counting them (GPU_MOE_HIST_NT threads, GPU_MOE_SORT_U pairs a
// thread) into hist [blocks][E] past perm in the map, then k_moe_place placing them (GPU_MOE_SORT_NT
// threads: a thread per expert for the scans).
#define GPU_MOE_SORT_PB 2048
#define GPU_MOE_HIST_NT 256
GPU_ABI_ASSERT(GPU_MOE_SORT_PB == GPU_MOE_HIST_NT * GPU_MOE_SORT_U && GPU_MOE_SORT_PB % GPU_MOE_SORT_NT == 0, "k_moe_hist / k_moe_place: a block's pairs");
// k_moe_split: a pair a thread, GPU_MOE_SPLIT_NT threads a block.
#define GPU_MOE_SPLIT_NT 256
// k_route (sass/route.cu): steps of up to this many tokens route, group and take the shared
// expert's activation in one block (a warp per token's router).
#define GPU_ROUTE_T 32
GPU_ABI_ASSERT(GPU_ROUTE_T <= GPU_MOE_SORT_NT / 32, "k_route: a warp per token");
// ... and at most this many blocks past its first for the shared expert's SiLU · up.
#define GPU_ROUTE_SILU_BLOCKS 32
// The routed experts' _d shape (steps of up to GPU_MM_TOK_B pairs, or of up to GPU_MOE_D_PPE pairs
// per expert on average: gpu/launch.c gpu_moe_shape): items of at most GPU_MOE_CAP_D pairs of one
// expert (one n-tile, staged in shared memory).
#define GPU_MOE_CAP_D 8
#define GPU_MOE_D_PPE 16

// Stored weight kinds; the values are format/checkpoint.c's CK_W_* (checked there).
enum { GPU_W_BF16 = 0, GPU_W_F16 = 1, GPU_W_F32 = 2, GPU_W_FP8 = 3, GPU_W_NVFP4 = 4, GPU_W_PLANES = 5 };

// KV cache element types (--kv-dtype).
enum { GPU_KV_F32 = 0, GPU_KV_BF16 = 1, GPU_KV_FP8 = 2 };

// Tokens per KV page: a sequence's keys and values live in pages of this many positions,
// found through its row of the block table.
#define GPU_KV_PAGE 16

// One weight matrix [rows, cols] = [out_features, in_features] in device memory, in its stored
// precision (format/CHECKPOINT.md §A.5–A.7, format/PLANES.md §3 for the 2-bit planes). Passed by value to kernels
// or read from a device table (routed experts). 48 bytes.
typedef struct {
    unsigned long long w;          // device address of row 0 (NVFP4: packed [rows, cols/2]; PLANES: fragment-major codes)
    unsigned long long scale;      // NVFP4: e4m3 [rows, cols/16]; PLANES: e8m0 [rows/16, cols/32, 16]; else 0
    unsigned long long row_bytes;  // bytes between rows (BF16/F16/F32/FP8/NVFP4)
    int kind;                      // GPU_W_*
    int rows, cols;
    float s;                       // FP8: weight_scale; NVFP4: weight_scale_2; else 1
    int pad[2];
} gpu_mat;

// Up to GPU_LIN_SET matrices that read the same input x [T, K] (every W[i].cols = K), computed
// by one k_linear launch: matrix i takes the blocks [first[i], first[i + 1]) of grid.x (GPU_LIN_ROWS
// output rows each) and writes y_i [T, ldy_i] (a device address). Passed by value (272 bytes).
#define GPU_LIN_SET 4
typedef struct {
    gpu_mat W[GPU_LIN_SET];
    unsigned long long y[GPU_LIN_SET];
    int ldy[GPU_LIN_SET];
    int first[GPU_LIN_SET + 1];
    int n;
    int pad[2];
} gpu_lin_set;
GPU_ABI_ASSERT(sizeof(gpu_lin_set) == 272, "gpu_lin_set: the same layout on the host and in the kernels");

#endif
