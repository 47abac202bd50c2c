// sass/linear.cu — y[t, o] = Σ_k W[o, k] · x[t, k]: every dense matrix product of the model on
// any stored format (BF16, F16, F32, FP8 per-tensor, NVFP4 W4A16, 2-bit planes).
// CPU twin: ref_linear (moet.c).
//
// Launch: block 256 threads = 8 warps, warp w of block bx computes output row bx·8 + w;
// grid (ceil(O / 8), ceil(T / LIN_TT)); block y takes tokens [y·LIN_TT, y·LIN_TT + LIN_TT).
// Shapes: x [T, ldx] f32, y [T, ldy] f32, W [O, K] with K = W.cols. Each weight chunk is decoded
// once per LIN_TT tokens; a token's sum does not depend on T (row_dot's fixed order).
#include "common.cuh"

#define LIN_TT 8

extern "C" __global__ void __launch_bounds__(256) k_linear(gpu_mat W, const float *__restrict__ x, int ldx, int T,
                                                            float *__restrict__ y, int ldy) {
    int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    int t0 = blockIdx.y * LIN_TT;
    if (row >= W.rows || t0 >= T) return;
    int nt = T - t0 < LIN_TT ? T - t0 : LIN_TT;
    float acc[LIN_TT];
    row_dot<LIN_TT>(W, row, x + (size_t)t0 * ldx, ldx, nt, acc);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int t = 0; t < LIN_TT; t++)
            if (t < nt) y[(size_t)(t0 + t) * ldy + row] = acc[t];
}
