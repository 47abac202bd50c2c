// sass/all_bf.cu — the tensor-core products again, reading one bf16 part of the activations (hi:
// their bf16 rounding) instead of three (gpu_abi.h: GPU_MM_PARTS): one mma per weight fragment
// where the f32-faithful kernels take three, a third of the activations' loads and staged bytes.
// One cubin per architecture (sass/moet_bf.sm_XX.cubin) and a PTX fallback; gpu/kernels.c looks
// the products up there by the same names for `--act-dtype bf16`. Their CPU twin is ref_linear
// with the reference's inputs rounded the same way (ref_engine.act_bf16).
// And k_fa (flash.cu: FA_P), whose queries and softmax weights enter its products as their bf16
// rounding where the cache is bf16 or fp8 (its twin: ref_attn_fa1, with ref_engine.kv_round), and k_fa_w (flash_w.cu),
// its walk on wgmma.
// And the kernels that write the activations' parts for the next product (mm_split3: hi alone
// here) — k_mm_split, the norms, SiLU·mul (k_silu_mul, k_route: with router.cu, whose k_router
// is here unused), the GDN rule with its norm,
// attention's output — which the engine takes from this image too where the products read one
// part: the same kernels, the same outputs and hi, without the two parts nothing reads there
// (Qwen3.6 at a prompt of 8,192 tokens: 8,192 × 12,800 elements a layer, 16.8 GB of stores).
#define GPU_MM_PARTS 1
#include "rmsnorm.cu"
#include "mm.cu"
#include "moe_mm.cu"
#include "mm_w.cu"
#include "mm_c.cu"
#include "moe_w.cu"
#include "moe_c.cu"   // (after moe_w.cu: its tiles)
#include "moe_r.cu"   // (after moe_w.cu: its tiles)
#include "silu_mul.cu"
#include "router.cu"
#include "route.cu"
#include "gdn_rule.cu"
#include "gated_norm.cu"
#include "attention.cu"
#include "flash.cu"
#include "flash_w.cu"
