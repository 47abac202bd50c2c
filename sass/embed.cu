// sass/embed.cu — x[t, :] = embed[ids[t], :] as f32 (MODEL.md §3.1). CPU twin: ck_row_f32 (of the
// embedding, in ref_forward). Launch (gpu_k_embed): block GPU_EMBED_NT, grid T. The embedding is
// BF16/F16/F32.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_EMBED_NT) k_embed(gpu_mat E, const int *__restrict__ ids, float *__restrict__ x, int H) {
    GPU_DEP();
    int t = blockIdx.x;
    const uint8_t *row = (const uint8_t *)E.w + (size_t)ids[t] * E.row_bytes;
    gpu_mat r = E;
    r.w = (unsigned long long)row;
    for (int j = threadIdx.x; j < H; j += blockDim.x) x[(size_t)t * H + j] = vec_at(r, j);
}
