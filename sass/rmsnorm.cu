// sass/rmsnorm.cu — the residual add and the zero-centred RMSNorm (MODEL.md §3.2):
//   if y: x[r] += y[r];   xn[i] = x[r] / sqrt(mean(x[r]²) + eps) · (1 + w),   r = rows ? rows[i] : i
// (rows gathers the tokens whose logits are wanted, for the final norm), and if xs: xn's three
// bf16 parts for the tensor-core products that read it (k_mm_split's layout, [3][n][H]).
// CPU twin: ref_rmsnorm1p (the residual add is ref_forward's x += y before it). Launch
// (gpu_k_add_rmsnorm): block GPU_NORM_NT, grid n (output rows). One block per row: batch invariant.
#include "mm.cuh"

extern "C" __global__ void __launch_bounds__(GPU_NORM_NT) k_add_rmsnorm(float *__restrict__ x, const float *__restrict__ y, gpu_mat w,
                                                                        float *__restrict__ xn, __nv_bfloat16 *__restrict__ xs, const int *__restrict__ rows,
                                                                        int H, float eps) {
    GPU_DEP();
    __shared__ float red[32];
    int i = blockIdx.x, r = rows ? rows[i] : i;
    float *xr = x + (size_t)r * H;
    float ss = 0.f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float v = xr[j];
        if (y) xr[j] = v = v + y[(size_t)r * H + j];
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float rn = 1.f / sqrtf(ss / (float)H + eps);
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float v = (xr[j] * rn) * (1.f + vec_at(w, j));
        xn[(size_t)i * H + j] = v;
        if (xs) mm_split3(v, xs + (size_t)i * H + j, (size_t)gridDim.x * H);
    }
}
