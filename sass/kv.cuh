// sass/kv.cuh — KV cache element types (--kv-dtype): f32, bf16 (round to nearest even), fp8 e4m3
// (saturating, unit scale: keys are RMS-normalised and values are bounded activations).
#pragma once
#include "common.cuh"

struct kv_f32 {
    typedef float T;
    static __device__ __forceinline__ T put(float v) { return v; }
    static __device__ __forceinline__ float get(T v) { return v; }
};
struct kv_bf16 {
    typedef __nv_bfloat16 T;
    static __device__ __forceinline__ T put(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ float get(T v) { return __bfloat162float(v); }
};
struct kv_fp8 {
    typedef __nv_fp8_e4m3 T;
    static __device__ __forceinline__ T put(float v) { return __nv_fp8_e4m3(v); }
    static __device__ __forceinline__ float get(T v) { return float(v); }
};

// Element (layer's pool) of position p, dimension i of a sequence through its block table row.
// Pool layout per attention layer: [pages, GPU_KV_PAGE, kvd].
__device__ __forceinline__ size_t kv_index(const int *__restrict__ bt, int p, int kvd, int i) {
    return ((size_t)bt[p / GPU_KV_PAGE] * GPU_KV_PAGE + p % GPU_KV_PAGE) * kvd + i;
}
