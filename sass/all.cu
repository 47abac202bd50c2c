// sass/all.cu — every kernel in one compilation unit, so each GPU architecture gets one cubin
// (sass/moet.sm_XX.cubin) and the PTX fallback one file (sass/moet.compute_90.ptx).
#include "embed.cu"
#include "rmsnorm.cu"
#include "linear.cu"
#include "router.cu"
#include "moe.cu"
#include "silu_mul.cu"
#include "gdn_conv.cu"
#include "gdn_rule.cu"
#include "gdn_chunk.cu"
#include "gated_norm.cu"
#include "attn_prep.cu"
#include "attention.cu"
