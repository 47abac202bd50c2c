// sass/mm_w.cu — prompt products y_i = x W_iᵀ of FP8 and NVFP4 weights on wgmma: k_mm_w, for long prompt steps where
// the products read one bf16 part and the cubin is sm_90a (H100 / H200); the warp-specialised product of mmw.cuh, whose
// sums are k_mm_g's, so a token's outputs are the bits of k_mm_v, _p, _g or _g128. CPU twin: ref_linear.
//
// grid (the row blocks of GPU_MMW_BM rows of every matrix of the set, set.first; token tiles of GPU_MMW_BN), GPU_MMW_NT
// threads, GPU_MMW_SMEM bytes of dynamic shared memory. A set's BF16 matrices are not taken (gpu_k_mm_w launches them
// apart). Rows past a matrix read zeros, tokens past T nothing (their columns: whatever the stages held), and write nothing;
// the last token tile takes the narrowest product that holds its tokens (mmw_consume_n).
#include "mmw.cuh"

extern "C" __global__ void __launch_bounds__(GPU_MMW_NT, 1) k_mm_w(gpu_lin_set set, const __nv_bfloat16 *__restrict__ xs, int T) {
#if MMW_ON
    extern __shared__ __align__(1024) uint8_t mmw_smem[];
    __shared__ __align__(8) uint64_t full[GPU_MMW_STAGES], empty[GPU_MMW_STAGES];
    mmw_stage *st = mmw_setup(mmw_smem, full, empty, GPU_MMW_STAGES);
    int m = 0;
    while (m + 1 < set.n && (int)blockIdx.x >= set.first[m + 1]) m++;
    const int base = ((int)blockIdx.x - set.first[m]) * GPU_MMW_BM, t0 = blockIdx.y * GPU_MMW_BN, K = set.W[m].cols, wg = threadIdx.x >> 7;
    __syncthreads();   // the barriers initialised
    if (wg < 2) {   // the producers: warpgroup 0 the weights, 1 the tokens
        mmw_regs_producer();
        const int i = threadIdx.x & 127;
        const mmw_src w = {set.W[m], base + i};
        const int tok = t0 + i < T ? t0 + i : -1;
        if (w.W.kind == GPU_W_FP8) mmw_produce<GPU_W_FP8>(w, xs, tok, K, st, full, empty, NULL, wg == 0);
        else mmw_produce<GPU_W_NVFP4>(w, xs, tok, K, st, full, empty, NULL, wg == 0);   // (gpu_k_mm_w: FP8 and NVFP4 only)
        return;
    }
    mmw_regs_consumer();
    GPU_DEP();
    const int c = wg - 2, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
    float tot[64];
    mmw_consume_n<GPU_MMW_STAGES>(st, full, empty, K, c, tot, 0, T - t0 < GPU_MMW_BN ? T - t0 : GPU_MMW_BN);
    const gpu_mat &W = set.W[m];
    const float post = mm_post(W);
    float *__restrict__ y = (float *)set.y[m];
    const int ldy = set.ldy[m];
#pragma unroll
    for (int n = 0; n < 16; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = base + 64 * c + 16 * warp + g + 8 * (e >> 1), r = 8 * n + 2 * t + (e & 1);
            if (row < W.rows && t0 + r < T) y[(size_t)(t0 + r) * ldy + row] = tot[4 * n + e] * post;
        }
#else
    __trap();   // (gpu_kernels.mm_w_min is 0 but where this image is the sm_90a cubin's one-part image)
#endif
}
