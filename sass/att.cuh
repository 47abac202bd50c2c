// sass/att.cuh — what attention.cu (an f32 cache) and flash.cu (bf16, fp8) share: the fold of a chunk's softmax
// state into the running one, and the output's store (with its bf16 parts for the next product).
#pragma once
#include "mm.cuh"

// Folds a chunk's state (Mc, Lc, oc) into the running one (M, L, o): rescaled to the larger max.
// Explicit roundings (no contraction left to the compiler): both kernels fold the same bits.
__device__ __forceinline__ void att_fold(float &M, float &L, float &o, float Mc, float Lc, float oc) {
    float Mn = fmaxf(M, Mc), a = expf(M - Mn), b = expf(Mc - Mn);
    o = __fmaf_rn(o, a, __fmul_rn(oc, b));
    L = __fmaf_rn(L, a, __fmul_rn(Lc, b));
    M = Mn;
}

// core[i] = v, and its parts when xs (ss elements apart).
__device__ __forceinline__ void att_out(float *core, __nv_bfloat16 *xs, size_t i, size_t ss, float v) {
    core[i] = v;
    if (xs) mm_split3(v, xs + i, ss);
}
