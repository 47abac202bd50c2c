// sass/rmsnorm.cu — the residual add and the zero-centred RMSNorm (MODEL.md §3.2):
//   if y: x[r] += y[r];   xn[i] = x[r] / sqrt(mean(x[r]²) + eps) · (1 + w),   r = rows ? rows[i] : i
// (rows gathers the tokens whose logits are wanted, for the final norm), and if xs: xn's three
// bf16 parts for the tensor-core products that read it (k_mm_split's layout, [3][n][H]).
// CPU twin: ref_rmsnorm1p (the residual add is ref_forward's x += y before it). Launch
// (gpu_k_add_rmsnorm): block GPU_NORM_NT, grid n (output rows). One block per row: batch invariant.
#include "mm.cuh"

// Rows of up to GPU_NORM_NT · NORM_REG elements keep their values in registers and load the norm
// weights before GPU_DEP (weights only); longer rows read x back. The same operations in the same
// order either way.
#define NORM_REG 8

extern "C" __global__ void __launch_bounds__(GPU_NORM_NT) k_add_rmsnorm(float *__restrict__ x, const float *__restrict__ y, gpu_mat w,
                                                                        float *__restrict__ xn, __nv_bfloat16 *__restrict__ xs, const int *__restrict__ rows,
                                                                        int H, float eps) {
    __shared__ float red[32];
    if (H <= GPU_NORM_NT * NORM_REG) {
        float wv[NORM_REG], v[NORM_REG];
#pragma unroll
        for (int u = 0; u < NORM_REG; u++) {
            const int j = threadIdx.x + u * GPU_NORM_NT;
            wv[u] = j < H ? 1.f + vec_at(w, j) : 0.f;
        }
        GPU_DEP();
        const int i = blockIdx.x, r = rows ? rows[i] : i;
        float *xr = x + (size_t)r * H;
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < NORM_REG; u++) {
            const int j = threadIdx.x + u * GPU_NORM_NT;
            v[u] = 0.f;
            if (j < H) {
                v[u] = xr[j];
                if (y) xr[j] = v[u] = v[u] + y[(size_t)r * H + j];
                ss += v[u] * v[u];
            }
        }
        ss = block_sum(ss, red);
        const float rn = 1.f / sqrtf(ss / (float)H + eps);
#pragma unroll
        for (int u = 0; u < NORM_REG; u++) {
            const int j = threadIdx.x + u * GPU_NORM_NT;
            if (j < H) {
                const float o = (v[u] * rn) * wv[u];
                xn[(size_t)i * H + j] = o;
                if (xs) mm_split3(o, xs + (size_t)i * H + j, (size_t)gridDim.x * H);
            }
        }
        return;
    }
    GPU_DEP();
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
