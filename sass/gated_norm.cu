// sass/gated_norm.cu — the Gated DeltaNet output norm (MODEL.md §3.3), per token t and value head h:
//   o[t, h, :] = w · (o / sqrt(mean(o²) + eps)) · SiLU(z[t, h, :])     (plain weight, not 1 + w)
// CPU twin: ref_gated_rmsnorm (moet.c; one token's value head). Launch (gpu_k_gated_norm): block
// GPU_GNORM_NT, grid (T, nv) (tokens along grid.x). o, z: [T, nv·dv]; if xs: o's three bf16 parts
// for the output projection (k_mm_split's layout, [3][T][nv·dv]).
#include "mm.cuh"
#include "gdn.cuh"

extern "C" __global__ void __launch_bounds__(GPU_GNORM_NT) k_gated_norm(float *__restrict__ o, const float *__restrict__ z, gpu_mat w,
                                                                        int nv, int dv, float eps, __nv_bfloat16 *__restrict__ xs) {
    GPU_DEP();
    __shared__ float red[32];
    size_t base = ((size_t)blockIdx.x * nv + blockIdx.y) * dv;
    float ss = 0.f;
    for (int v = threadIdx.x; v < dv; v += blockDim.x) ss += o[base + v] * o[base + v];
    ss = block_sum(ss, red);
    float rn = gnorm_rn(ss, dv, eps);
    for (int v = threadIdx.x; v < dv; v += blockDim.x) {
        float r = gnorm_out(w, v, o[base + v], rn, z[base + v]);
        o[base + v] = r;
        if (xs) mm_split3(r, xs + base + v, (size_t)gridDim.x * nv * dv);
    }
}
