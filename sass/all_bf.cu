// sass/all_bf.cu — the tensor-core products again, reading one bf16 part of the activations (hi:
// their bf16 rounding) instead of three (gpu_abi.h: GPU_MM_PARTS): one mma per weight fragment
// where the f32-faithful kernels take three, a third of the activations' loads and staged bytes.
// One cubin per architecture (sass/moet_bf.sm_XX.cubin) and a PTX fallback; gpu/kernels.c looks
// the products up there by the same names for `--act-dtype bf16`. Their CPU twin is ref_linear
// with the reference's inputs rounded the same way (ref_engine.act_bf16).
// And k_fa (flash.cu: FA_P), whose queries and softmax weights enter its products as their bf16
// rounding where the cache is bf16 or fp8 (its twin: ref_attn_fa1, with ref_engine.kv_round), and k_fa_w (flash_w.cu),
// its walk on wgmma.
#define GPU_MM_PARTS 1
#include "mm.cu"
#include "moe_mm.cu"
#include "mm_w.cu"
#include "mm_c.cu"
#include "moe_w.cu"
#include "flash.cu"
#include "flash_w.cu"
