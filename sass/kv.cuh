// sass/kv.cuh — KV cache element types (--kv-dtype): f32, bf16 (round to nearest even), fp8 e4m3.
// fp8 entries carry one f32 scale per (position, KV head), amax / 448, so a head's largest value
// maps to e4m3's largest finite number: no saturation whatever the activations' range, and a
// relative rounding of 2^-4 per element (bf16 and f32 need no scale; their scale pointers are
// NULL).
#pragma once
#include "common.cuh"

struct kv_f32 {
    static const bool scaled = false;
    typedef float T;
    static __device__ __forceinline__ T put(float v) { return v; }
    static __device__ __forceinline__ float get(T v) { return v; }
};
struct kv_bf16 {
    static const bool scaled = false;
    typedef __nv_bfloat16 T;
    static __device__ __forceinline__ T put(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ float get(T v) { return __bfloat162float(v); }
};
struct kv_fp8 {
    static const bool scaled = true;
    typedef __nv_fp8_e4m3 T;
    static __device__ __forceinline__ T put(float v) { return __nv_fp8_e4m3(v); }
    static __device__ __forceinline__ float get(T v) { return float(v); }
};

// Entry i of position p (of a row of w entries: [pages, GPU_KV_PAGE, w]) where p's page is `page`.
__device__ __forceinline__ size_t kv_page_index(int page, int p, int w, int i) { return ((size_t)page * GPU_KV_PAGE + p % GPU_KV_PAGE) * w + i; }

// Element (layer's pool) of position p, dimension i of a sequence through its block table row.
// Pool layout per attention layer: [pages, GPU_KV_PAGE, kvd].
__device__ __forceinline__ size_t kv_index(const int *__restrict__ bt, int p, int kvd, int i) { return kv_page_index(bt[p / GPU_KV_PAGE], p, kvd, i); }

// The scale entry of position p, KV head j: [pages, GPU_KV_PAGE, kvh].
__device__ __forceinline__ size_t kv_scale_index(const int *__restrict__ bt, int p, int kvh, int j) {
    return kv_page_index(bt[p / GPU_KV_PAGE], p, kvh, j);
}
