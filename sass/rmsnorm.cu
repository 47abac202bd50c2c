// sass/rmsnorm.cu — the residual add and the zero-centred RMSNorm (MODEL.md §3.2):
//   if y: x[r] += y[r];   xn[i] = x[r] / sqrt(mean(x[r]²) + eps) · (1 + w),   r = rows ? rows[i] : i
// (rows gathers the tokens whose logits are wanted, for the final norm), and if xs: xn's three
// bf16 parts for the tensor-core products that read it (k_mm_split's layout, [3][n][H]).
// k_moe_add_rmsnorm is the same with y the MoE layer's output made in place (MODEL.md §3.6:
//   y[r, j] = Σ_k w[r, k] · ye[r·K + k, j] (experts in ascending id) + σ(sg[r]) · sh[r, j]),
// k_moe_combine's operations on each element (sass/moe.cu), so that a decode step does not spend a
// launch on y: the same bits as k_moe_combine then k_add_rmsnorm.
// CPU twins: ref_rmsnorm1p (the residual add is ref_forward's x += y before it; the MoE's y is
// ref_moe_combine's). Launch (gpu_k_add_rmsnorm, gpu_k_moe_add_rmsnorm): block GPU_NORM_NT, grid n
// (output rows). One block per row: batch invariant.
#include "mm.cuh"

// Rows of up to GPU_NORM_NT · NORM_REG elements keep their values in registers and load the norm
// weights before GPU_DEP (weights only); longer rows read x back. The same operations in the same
// order either way.
#define NORM_REG 8
#define NORM_KU 8   // k_moe_add_rmsnorm: the choices whose loads a thread issues together (Qwen3.6: top-8)

// The added term: a given y [·, H] (or none)...
struct norm_y_plain {
    const float *y;
    int H;
    __device__ __forceinline__ bool on() const { return y != nullptr; }
    __device__ __forceinline__ void prep(int) const {}
    __device__ __forceinline__ float at(int r, int j) const { return y[(size_t)r * H + j]; }
    static constexpr bool ahead = false;   // (at each element as x's is read)
    __device__ __forceinline__ void vals(int, float (&)[NORM_REG]) const {}
};

// ... or the MoE's output of token r, as k_moe_combine makes each element (prep: the token's choices
// by ascending expert id, before any at; every thread of the block calls it).
__shared__ int moe_order[GPU_ROUTER_MAX_K];   // the token's choices by ascending expert id
__shared__ float moe_wk[GPU_ROUTER_MAX_K], moe_gate;   // their weights; σ of the shared expert's gate
struct norm_y_moe {
    const float *ye, *sh, *sg, *selw;
    const int *sel;
    int K, H;
    __device__ __forceinline__ bool on() const { return true; }
    __device__ __forceinline__ void prep(int r) const {
        moe_choice_order(sel, selw, r, K, moe_order, moe_wk);
        if (threadIdx.x == 0) moe_gate = sigm(sg[r]);
        __syncthreads();
    }
    __device__ __forceinline__ float at(int r, int j) const {
        float acc = 0.f;
        for (int n = 0; n < K; n++) acc += ye[((size_t)r * K + moe_order[n]) * H + j] * moe_wk[n];
        return acc + moe_gate * sh[(size_t)r * H + j];
    }
    static constexpr bool ahead = true;   // (vals before x is read)
    // at(r, j) of this thread's j, the choices outermost: each element's sum in at's order, up to
    // NORM_KU · NORM_REG loads in flight at once (a decode step's one block a token waits on about
    // one round trip for its 9 rows)
    __device__ __forceinline__ void vals(int r, float (&yv)[NORM_REG]) const {
        float acc[NORM_REG];
#pragma unroll
        for (int u = 0; u < NORM_REG; u++) acc[u] = 0.f;
        float e[NORM_KU][NORM_REG];   // the first NORM_KU choices' values, all loaded before their sums
#pragma unroll
        for (int n = 0; n < NORM_KU; n++) {
            const float *row = ye + ((size_t)r * K + moe_order[n < K ? n : K - 1]) * H;   // (past K: a row it has, unused)
#pragma unroll
            for (int u = 0; u < NORM_REG; u++) {
                const int j = threadIdx.x + u * GPU_NORM_NT;
                e[n][u] = j < H ? row[j] : 0.f;
            }
        }
#pragma unroll
        for (int n = 0; n < NORM_KU; n++)
            if (n < K)
#pragma unroll
                for (int u = 0; u < NORM_REG; u++) acc[u] += e[n][u] * moe_wk[n];
        for (int n = NORM_KU; n < K; n++) {
            const float *row = ye + ((size_t)r * K + moe_order[n]) * H, wn = moe_wk[n];
#pragma unroll
            for (int u = 0; u < NORM_REG; u++) {
                const int j = threadIdx.x + u * GPU_NORM_NT;
                if (j < H) acc[u] += row[j] * wn;
            }
        }
#pragma unroll
        for (int u = 0; u < NORM_REG; u++) {
            const int j = threadIdx.x + u * GPU_NORM_NT;
            yv[u] = j < H ? acc[u] + moe_gate * sh[(size_t)r * H + j] : 0.f;
        }
    }
};

template <class Y>
__device__ __forceinline__ void add_rmsnorm(float *__restrict__ x, Y y, gpu_mat w, float *__restrict__ xn, __nv_bfloat16 *__restrict__ xs,
                                            const int *__restrict__ rows, int H, float eps) {
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
        float yv[NORM_REG];
        if (Y::ahead) y.prep(r), y.vals(r, yv);
        float *xr = x + (size_t)r * H;
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < NORM_REG; u++) {
            const int j = threadIdx.x + u * GPU_NORM_NT;
            v[u] = 0.f;
            if (j < H) {
                v[u] = xr[j];
                if (y.on()) xr[j] = v[u] = v[u] + (Y::ahead ? yv[u] : y.at(r, j));
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
    y.prep(r);
    float *xr = x + (size_t)r * H;
    float ss = 0.f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float v = xr[j];
        if (y.on()) xr[j] = v = v + y.at(r, j);
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

extern "C" __global__ void __launch_bounds__(GPU_NORM_NT) k_add_rmsnorm(float *__restrict__ x, const float *__restrict__ y, gpu_mat w,
                                                                        float *__restrict__ xn, __nv_bfloat16 *__restrict__ xs, const int *__restrict__ rows,
                                                                        int H, float eps) {
    add_rmsnorm(x, norm_y_plain{y, H}, w, xn, xs, rows, H, eps);
}

// ye [T·K, H] the experts' outputs of each (token, choice), sel / selw [T, K], sh [T, H] the shared
// expert's, sg [T] its gate's logit.
extern "C" __global__ void __launch_bounds__(GPU_NORM_NT) k_moe_add_rmsnorm(float *__restrict__ x, const float *__restrict__ ye,
                                                                            const int *__restrict__ sel, const float *__restrict__ selw,
                                                                            const float *__restrict__ sh, const float *__restrict__ sg, int K,
                                                                            gpu_mat w, float *__restrict__ xn, __nv_bfloat16 *__restrict__ xs,
                                                                            const int *__restrict__ rows, int H, float eps) {
    add_rmsnorm(x, norm_y_moe{ye, sh, sg, selw, sel, K, H}, w, xn, xs, rows, H, eps);
}
