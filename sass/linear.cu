// sass/linear.cu — y[t, o] = Σ_k W[o, k] · x[t, k]: every dense matrix product of the model on
// any stored format (BF16, F16, F32, FP8 per-tensor, NVFP4 W4A16, 2-bit planes), for up to
// GPU_LIN_SET matrices that read the same input in one launch (a layer's projections of its
// normed input: the small ones alone would leave most of the GPU idle for a launch each).
// CPU twin: ref_linear (moet.c).
//
// Launch: block 256 threads = 8 warps; grid (Σ_i ceil(O_i / 8), ceil(T / LIN_TT)); block x of
// matrix i (set.first[i] ≤ x < set.first[i + 1]) has warp w compute its output row
// (x − first[i])·8 + w; block y takes tokens [y·LIN_TT, y·LIN_TT + LIN_TT).
// Shapes: x [T, ldx] f32, y_i [T, ldy_i] f32, W_i [O_i, K] with K = W_i.cols. Each weight chunk is
// decoded once per LIN_TT tokens; a token's sum depends neither on T nor on the other matrices
// of the set (row_dot's fixed order).
#include "common.cuh"

#define LIN_TT 8

extern "C" __global__ void __launch_bounds__(256) k_linear(gpu_lin_set set, const float *__restrict__ x, int ldx, int T) {
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    int row = ((int)blockIdx.x - set.first[m]) * 8 + (threadIdx.x >> 5);
    int t0 = blockIdx.y * LIN_TT;
    if (row >= W.rows || t0 >= T) return;
    int nt = T - t0 < LIN_TT ? T - t0 : LIN_TT;
    float acc[LIN_TT];
    row_dot<LIN_TT>(W, row, x + (size_t)t0 * ldx, ldx, nt, acc);
    float *__restrict__ y = (float *)set.y[m];
    int ldy = set.ldy[m];
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int t = 0; t < LIN_TT; t++)
            if (t < nt) y[(size_t)(t0 + t) * ldy + row] = acc[t];
}
