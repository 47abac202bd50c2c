// sass/common.cuh — what every kernel shares: exact decoders of the stored formats, fixed-order
// reductions, and the per-warp dot product of one weight row with a tile of activations.
//
// Numerics (arena/DESIGN.md §3): activations, accumulators, norms and softmax are fp32; weights are decoded
// in registers exactly (each stored value is exact in fp32). Every reduction has a fixed order that
// depends only on the reduced length, never on the batch: a row's result is the same whatever
// else runs in the step (batch invariance).
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "gpu_abi.h"

#define WARP 32

// Programmatic dependent launch (sm_90 and newer; gpu/kernels.c: gpu_launch starts a kernel while
// its predecessor in the stream still runs). GPU_DEP() waits until every earlier kernel of the
// stream has finished and its writes are visible, then lets the next kernel's blocks start (they
// load their weights while this one computes, then wait here in turn). Every kernel calls it
// before it reads or writes anything another kernel writes or reads; only weights, written
// before the first step and never after, may be loaded before it. Without the launch attribute
// (the profiler's launches) both instructions return at once.
#define GPU_DEP() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")

// ---- exact element decoders ---------------------------------------------------------------

__device__ __forceinline__ float dec_bf16(uint32_t b16) { return __uint_as_float(b16 << 16); }

// OCP e4m3fn via half: the 7 magnitude bits shifted into an f16 give the value · 2^-8 for
// normals and subnormals alike (f16 bias 15 vs e4m3 bias 7); × 256 is exact.
__device__ __forceinline__ float dec_e4m3(uint32_t b) {
    unsigned short h = (unsigned short)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
    return __half2float(__ushort_as_half(h)) * 256.f;
}

// e2m1 nibble (sign bit 3): magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, built from the bits.
__device__ __forceinline__ float dec_e2m1(uint32_t n) {
    uint32_t e = (n >> 1) & 3u, m = n & 1u;
    uint32_t bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | ((n & 8u) << 28));
}

// 2-bit plane code c → level {-4, -1, +1, +4}[c] (format/PLANES.md §2).
__device__ __forceinline__ float dec_plane(uint32_t c) {
    float mag = ((c ^ (c >> 1)) & 1u) ? 1.f : 4.f;
    return (c & 2u) ? mag : -mag;
}

// UE8M0 scale byte → 2^(b − 127) (b = 0: 2^-127, a subnormal).
__device__ __forceinline__ float dec_e8m0(uint32_t b) { return __uint_as_float(b ? b << 23 : 0x00400000u); }

// Element i of a float-kind vector-like weight (norm weights, conv taps, A_log, dt_bias).
__device__ __forceinline__ float vec_at(const gpu_mat &m, long long i) {
    const uint8_t *p = (const uint8_t *)m.w;
    switch (m.kind) {
    case GPU_W_BF16: return dec_bf16(((const uint16_t *)p)[i]);
    case GPU_W_F16: return __half2float(((const __half *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

// ---- fixed-order reductions ---------------------------------------------------------------

// Butterfly sum over the warp: every lane ends with the same value, in an order fixed by lane ids.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block sum (blockDim.x a multiple of 32, at most 1024): warps first, then the warp sums in
// warp order. red must hold 32 floats. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

__device__ __forceinline__ float block_max(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = -INFINITY;
    for (int i = 0; i < nw; i++) s = fmaxf(s, red[i]);
    return s;
}

// The block's largest of m where NaN never wins (a comparison, not fmaxf: −inf when every value is
// NaN), and the block's least int: NW warps (NW · 32 threads), red [NW] (free: its barriers come
// first); every thread gets the result, in an order that depends on no timing.
template <int NW>
__device__ __forceinline__ float block_max_cmp(float m, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, m, o);
        m = v > m ? v : m;
    }
    __syncthreads();
    if (lane == 0) red[w] = m;
    __syncthreads();
    m = red[0];
    for (int i = 1; i < NW; i++) m = red[i] > m ? red[i] : m;
    return m;
}

template <int NW>
__device__ __forceinline__ int block_min_int(int v, int *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = red[0];
    for (int i = 1; i < NW; i++) v = min(v, red[i]);
    return v;
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }

// Token t's MoE choices by ascending expert id (the order the reference adds the experts in):
// order[n] the choice of rank n, wk[n] its weight — by the block's threads k < K (the caller
// synchronises before reading them). sel, selw [·, K]; the token's ids are distinct.
__device__ __forceinline__ void moe_choice_order(const int *__restrict__ sel, const float *__restrict__ selw, int t, int K, int *order, float *wk) {
    const int *s = sel + (size_t)t * K;
    if (threadIdx.x < K) {   // choice k's rank among the token's ids
        const int id = s[threadIdx.x];
        int rank = 0;
        for (int k = 0; k < K; k++) rank += s[k] < id;
        order[rank] = threadIdx.x;
        wk[rank] = selw[(size_t)t * K + threadIdx.x];
    }
}

// ---- one weight row · a tile of activations ------------------------------------------------
//
// row_dot<TT>: the calling warp computes acc[t] = Σ_k W[row, k] · x[t·ldx + k] for t < nt ≤ TT.
// The row is cut into chunks (BF16: 8 values, one 16-byte load; FP8: 16 values; NVFP4: 16
// values and their e4m3 scale; PLANES: the 16 codes of one fragment lane and their two e8m0
// scales), lane l takes chunks l, l + 32, …; scaled formats sum a block before scaling it.
// Each lane's partial sums are then added by warp_sum. The order depends only on the row's
// length: the same for every token of every batch. Every lane returns the full sums.
// Requires: x 16-byte aligned with ldx % 4 == 0; BF16/F16 cols % 8 == 0, FP8/NVFP4 cols % 16 == 0,
// PLANES rows % 16 == 0 and cols % 64 == 0 (checked at boot by the host).

template <int TT>
__device__ __forceinline__ void row_dot(const gpu_mat &W, int row, const float *__restrict__ x, int ldx, int nt, float acc[TT]) {
    const int lane = threadIdx.x & 31;
    const int K = W.cols;
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = 0.f;
    const uint8_t *wrow = (const uint8_t *)W.w + (size_t)row * W.row_bytes;
    switch (W.kind) {
    case GPU_W_BF16:
    case GPU_W_F16: {
        for (int c = lane; c < K / 8; c += WARP) {
            uint4 q = __ldg((const uint4 *)(wrow + (size_t)c * 16));
            float w[8];
            uint32_t qq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (W.kind == GPU_W_BF16) {
                    w[2 * j] = dec_bf16(qq[j] & 0xffffu);
                    w[2 * j + 1] = dec_bf16(qq[j] >> 16);
                } else {
                    w[2 * j] = __half2float(__ushort_as_half((unsigned short)(qq[j] & 0xffffu)));
                    w[2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(qq[j] >> 16)));
                }
            }
#pragma unroll
            for (int t = 0; t < TT; t++) {
                if (t < nt) {
                    const float4 *xp = (const float4 *)(x + (size_t)t * ldx + c * 8);
                    float4 a = __ldg(xp), b = __ldg(xp + 1);
                    acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
                }
            }
        }
        break;
    }
    case GPU_W_F32: {
        for (int c = lane; c < K / 4; c += WARP) {
            float4 w = __ldg((const float4 *)(wrow + (size_t)c * 16));
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < nt) {
                    float4 a = __ldg((const float4 *)(x + (size_t)t * ldx + c * 4));
                    acc[t] += w.x * a.x + w.y * a.y + w.z * a.z + w.w * a.w;
                }
        }
        break;
    }
    case GPU_W_FP8: {
        for (int c = lane; c < K / 16; c += WARP) {
            uint4 q = __ldg((const uint4 *)(wrow + (size_t)c * 16));
            uint32_t qq[4] = {q.x, q.y, q.z, q.w};
            float w[16];
#pragma unroll
            for (int j = 0; j < 16; j++) w[j] = dec_e4m3((qq[j / 4] >> (8 * GPU_FP8_SLOT(j % 4))) & 0xffu);   // (the stored order)
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < nt) {
                    const float4 *xp = (const float4 *)(x + (size_t)t * ldx + c * 16);
                    float s = 0.f;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        float4 a = __ldg(xp + j);
                        s += w[4 * j] * a.x + w[4 * j + 1] * a.y + w[4 * j + 2] * a.z + w[4 * j + 3] * a.w;
                    }
                    acc[t] += s;
                }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) acc[t] *= W.s;   // per-tensor scale once, after the sum
        break;
    }
    case GPU_W_NVFP4: {
        const uint8_t *srow = (const uint8_t *)W.scale + (size_t)row * (K / 16);
        for (int c = lane; c < K / 16; c += WARP) {
            uint2 q = __ldg((const uint2 *)(wrow + (size_t)c * 8));
            float sc = dec_e4m3(__ldg(srow + c)) * W.s;
            uint32_t qq[2] = {q.x, q.y};
            float w[16];
#pragma unroll
            for (int j = 0; j < 16; j++) w[j] = dec_e2m1((qq[j / 8] >> (4 * (j % 8))) & 15u);   // low nibble = even k
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < nt) {
                    const float4 *xp = (const float4 *)(x + (size_t)t * ldx + c * 16);
                    float s = 0.f;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        float4 a = __ldg(xp + j);
                        s += w[4 * j] * a.x + w[4 * j + 1] * a.y + w[4 * j + 2] * a.z + w[4 * j + 3] * a.w;
                    }
                    acc[t] += s * sc;
                }
        }
        break;
    }
    case GPU_W_PLANES: {
        // format/PLANES.md §3: row n sits in 16-row block nb as (tile, g); for each 64-wide k block kb and
        // each t < 4, lane (g, t) of the fragment holds 4 bytes of this row at +tile·4:
        // bytes k32·2 + half, each 4 codes at k = kb·64 + k32·32 + half·16 + 4t + j.
        const int KB = K / 64, nb = row / 16, tile = (row % 16) / 8, g = row % 8;
        const uint8_t *codes = (const uint8_t *)W.w;
        const uint8_t *sc = (const uint8_t *)W.scale + (size_t)nb * (K / 32) * 16 + row % 16;
        for (int c = lane; c < KB * 4; c += WARP) {
            int kb = c / 4, tt = c % 4;
            uint32_t q = __ldg((const uint32_t *)(codes + ((((size_t)nb * KB + kb) * 8 + g) * 4 + tt) * 8 + tile * 4));
            float s0 = dec_e8m0(__ldg(sc + (size_t)(kb * 2) * 16)), s1 = dec_e8m0(__ldg(sc + (size_t)(kb * 2 + 1) * 16));
            float w[16];
#pragma unroll
            for (int j = 0; j < 16; j++) w[j] = dec_plane((q >> (2 * j)) & 3u);
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t < nt) {
                    const float *xt = x + (size_t)t * ldx + kb * 64 + 4 * tt;
                    // byte b = k32·2 + half covers k = k32·32 + half·16 + 4t + (0..3)
                    float p0 = 0.f, p1 = 0.f;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        float4 a = __ldg((const float4 *)(xt + (b >> 1) * 32 + (b & 1) * 16));
                        float s = w[4 * b] * a.x + w[4 * b + 1] * a.y + w[4 * b + 2] * a.z + w[4 * b + 3] * a.w;
                        if (b < 2) p0 += s; else p1 += s;
                    }
                    acc[t] += p0 * s0 + p1 * s1;
                }
        }
        break;
    }
    default: break;
    }
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t] = warp_sum(acc[t]);
}
