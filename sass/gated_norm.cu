// sass/gated_norm.cu — the Gated DeltaNet output norm (MODEL.md §3.3), per token t and value head h:
//   o[t, h, :] = w · (o / sqrt(mean(o²) + eps)) · SiLU(z[t, h, :])     (plain weight, not 1 + w)
// CPU twin: ref_gated_rmsnorm (moet.c; one token's value head). Launch (gpu_k_gated_norm): block
// GPU_GNORM_NT threads, a warp per (token, value head) item (item = t·nv + h), grid
// ceil(T·nv / (GPU_GNORM_NT / 32)). o, z: [T, nv·dv]; if xs: o's three bf16 parts for the output
// projection (k_mm_split's layout, [3][T][nv·dv]).
//
// Σ o² in the order of a block of GPU_GNORM_NT threads a head (gnorm_head_ss's, k_gdn_rule_norm's):
// thread τ's sum over the columns v ≡ τ (mod GPU_GNORM_NT) in increasing v, each warp's warp_sum,
// the warps' sums added in order from 0 — here lane l plays threads l, 32 + l, 64 + l, … in turn,
// so a head's bits are those of the kernel's one-block-a-head form before it (whose 262,144 blocks
// of four warps at an 8,192-token prompt each did one head's 512 bytes between two barriers).
#include "mm.cuh"
#include "gdn.cuh"

// Heads of up to GPU_GNORM_NT columns (Qwen3.6's 128): a lane's GNORM_REG columns 32m + lane held in
// registers — its weights read before GPU_DEP (nothing of the step writes them), its o and z loaded
// together once (o is read again and z only after the head's sum otherwise) — the same operations on
// the same values, so the same bits as the loops below, which take longer heads.
#define GNORM_REG (GPU_GNORM_NT / 32)
extern "C" __global__ void __launch_bounds__(GPU_GNORM_NT) k_gated_norm(float *__restrict__ o, const float *__restrict__ z, gpu_mat w,
                                                                        int nv, int dv, float eps, __nv_bfloat16 *__restrict__ xs, int T) {
    const int lane = threadIdx.x & 31;
    const long long item = (long long)blockIdx.x * (GPU_GNORM_NT / 32) + (threadIdx.x >> 5);
    const size_t base = (size_t)item * dv;
    if (dv <= GPU_GNORM_NT) {
        float wv[GNORM_REG], ov[GNORM_REG], zv[GNORM_REG];
#pragma unroll
        for (int m = 0; m < GNORM_REG; m++) wv[m] = 32 * m + lane < dv ? vec_at(w, 32 * m + lane) : 0.f;
        GPU_DEP();
        if (item >= (long long)T * nv) return;
#pragma unroll
        for (int m = 0; m < GNORM_REG; m++) {
            const int v = 32 * m + lane;
            ov[m] = v < dv ? o[base + v] : 0.f, zv[m] = v < dv ? z[base + v] : 0.f;
        }
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < GNORM_REG; m++) ss += warp_sum(ov[m] * ov[m]);   // (the loop's 0 + o², or 0 past dv)
        const float rn = gnorm_rn(ss, dv, eps);
#pragma unroll
        for (int m = 0; m < GNORM_REG; m++) {
            const int v = 32 * m + lane;
            if (v >= dv) break;
            const float r = gnorm_outw(wv[m], ov[m], rn, zv[m]);
            o[base + v] = r;
            if (xs) mm_split3(r, xs + base + v, (size_t)T * nv * dv);
        }
        return;
    }
    GPU_DEP();
    if (item >= (long long)T * nv) return;
    float ss = 0.f;
#pragma unroll
    for (int m = 0; m < GPU_GNORM_NT / 32; m++) {   // thread 32m + lane of the block form
        float a = 0.f;
        for (int v = 32 * m + lane; v < dv; v += GPU_GNORM_NT) a += o[base + v] * o[base + v];
        ss += warp_sum(a);   // (every lane the same bits: an xor butterfly adds the same two operands in each lane)
    }
    const float rn = gnorm_rn(ss, dv, eps);
    for (int v = lane; v < dv; v += 32) {
        const float r = gnorm_out(w, v, o[base + v], rn, z[base + v]);
        o[base + v] = r;
        if (xs) mm_split3(r, xs + base + v, (size_t)T * nv * dv);
    }
}
