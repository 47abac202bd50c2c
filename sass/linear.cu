// sass/linear.cu — y[t, o] = Σ_k W[o, k] · x[t, k]: every dense matrix product of the model on
// any stored format (BF16, F16, F32, FP8 per-tensor, NVFP4 W4A16, 2-bit planes), for up to
// GPU_LIN_SET matrices that read the same input in one launch (a layer's projections of its
// normed input: the small ones alone would leave most of the GPU idle for a launch each).
// CPU twin: ref_linear (moet.c).
//
// Launch (gpu_k_linear): block GPU_LIN_NT threads = GPU_LIN_ROWS warps; grid (Σ_i ceil(O_i /
// GPU_LIN_ROWS), ceil(T / GPU_LIN_TT)); block x of matrix i (set.first[i] ≤ x < set.first[i + 1])
// has warp w compute its output row (x − first[i])·GPU_LIN_ROWS + w; block y takes tokens
// [y·GPU_LIN_TT, y·GPU_LIN_TT + GPU_LIN_TT).
// Shapes: x [T, ldx] f32, y_i [T, ldy_i] f32, W_i [O_i, K] with K = W_i.cols. Each weight chunk is
// decoded once per GPU_LIN_TT tokens; a token's sum depends neither on T nor on the other matrices
// of the set (row_dot's fixed order).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_LIN_NT) k_linear(gpu_lin_set set, const float *__restrict__ x, int ldx, int T) {
    GPU_DEP();
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const gpu_mat W = set.W[m];
    int row = ((int)blockIdx.x - set.first[m]) * GPU_LIN_ROWS + (threadIdx.x >> 5);
    int t0 = blockIdx.y * GPU_LIN_TT;
    if (row >= W.rows || t0 >= T) return;
    int nt = T - t0 < GPU_LIN_TT ? T - t0 : GPU_LIN_TT;
    float acc[GPU_LIN_TT];
    row_dot<GPU_LIN_TT>(W, row, x + (size_t)t0 * ldx, ldx, nt, acc);
    float *__restrict__ y = (float *)set.y[m];
    int ldy = set.ldy[m];
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int t = 0; t < GPU_LIN_TT; t++)
            if (t < nt) y[(size_t)(t0 + t) * ldy + row] = acc[t];
}
