// sass/moe.cu — the routed experts of one layer (MODEL.md §3.6): for each (token t, choice k)
// pair p = t·K + k with expert x = sel[p],
//   k_moe_gate_up: h[p, i] = SiLU(gate_x[i] · xn[t]) · (up_x[i] · xn[t])      i < I
//   k_moe_down:    ye[p, j] = down_x[j] · h[p]                                  j < H
// and k_moe_combine: y[t, j] = Σ_k w[t, k] · ye[t·K + k, j] (experts in ascending id, as the
// reference adds them) + sigmoid(sg[t]) · sh[t, j] (the gated shared expert).
// CPU twins: ref_moe_gate_up, ref_moe_down (one expert over the tokens that chose it) and
// ref_moe_combine (one token), which ref_moe calls (moet.c). The experts' matrices come from a
// device table experts[3·x + {0 gate, 1 up, 2 down}] (slot pool planes or checkpoint formats alike).
//
// Launch (gpu_k_moe_gate_up, gpu_k_moe_down): block GPU_LIN_NT (GPU_LIN_ROWS warps, one output
// row each), grid (T·K, ceil(rows / GPU_LIN_ROWS)). combine (gpu_k_moe_combine): block
// GPU_COMBINE_NT, grid (T, ceil(H / GPU_COMBINE_NT)). The pairs and tokens run along grid.x
// (up to 2³¹ − 1 blocks; grid.y stops at 65,535, which T·K reaches at T = 8,192 with K = 8).
// Each pair is computed alone: batch invariant.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_LIN_NT) k_moe_gate_up(const gpu_mat *__restrict__ experts, const int *__restrict__ sel,
                                                                       const float *__restrict__ xn, int ldx, int K, float *__restrict__ h, int I) {
    GPU_DEP();
    int i = blockIdx.y * GPU_LIN_ROWS + (threadIdx.x >> 5), p = blockIdx.x;
    if (i >= I) return;
    int x = sel[p], t = p / K;
    gpu_mat G = experts[3 * x], U = experts[3 * x + 1];
    float g[1], u[1];
    row_dot<1>(G, i, xn + (size_t)t * ldx, ldx, 1, g);
    row_dot<1>(U, i, xn + (size_t)t * ldx, ldx, 1, u);
    if ((threadIdx.x & 31) == 0) h[(size_t)p * I + i] = silu(g[0]) * u[0];
}

extern "C" __global__ void __launch_bounds__(GPU_LIN_NT) k_moe_down(const gpu_mat *__restrict__ experts, const int *__restrict__ sel,
                                                                    const float *__restrict__ h, int I, float *__restrict__ ye, int H) {
    GPU_DEP();
    int j = blockIdx.y * GPU_LIN_ROWS + (threadIdx.x >> 5), p = blockIdx.x;
    if (j >= H) return;
    gpu_mat D = experts[3 * sel[p] + 2];
    float d[1];
    row_dot<1>(D, j, h + (size_t)p * I, I, 1, d);
    if ((threadIdx.x & 31) == 0) ye[(size_t)p * H + j] = d[0];
}

extern "C" __global__ void __launch_bounds__(GPU_COMBINE_NT) k_moe_combine(const float *__restrict__ ye, const int *__restrict__ sel,
                                                                           const float *__restrict__ selw, const float *__restrict__ sh,
                                                                           const float *__restrict__ sg, float *__restrict__ y, int K, int H) {
    GPU_DEP();
    __shared__ int order[GPU_ROUTER_MAX_K];   // the token's choices by ascending expert id
    __shared__ float wk[GPU_ROUTER_MAX_K];
    const int j = blockIdx.y * blockDim.x + threadIdx.x, t = blockIdx.x;
    moe_choice_order(sel, selw, t, K, order, wk);
    __syncthreads();
    if (j >= H) return;
    float acc = 0.f;
    for (int n = 0; n < K; n++) acc += ye[((size_t)t * K + order[n]) * H + j] * wk[n];
    y[(size_t)t * H + j] = acc + sigm(sg[t]) * sh[(size_t)t * H + j];
}
