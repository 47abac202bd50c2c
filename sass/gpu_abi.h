// sass/gpu_abi.h — what the host (C) and the kernels (CUDA) agree on: weight descriptors and
// the kinds of stored weights. Included by gpu/ and by every sass/*.cu; C and C++ alike.
#ifndef MOET_GPU_ABI_H
#define MOET_GPU_ABI_H

// Stored weight kinds; the values are format/checkpoint.c's CK_W_* (checked there).
enum { GPU_W_BF16 = 0, GPU_W_F16 = 1, GPU_W_F32 = 2, GPU_W_FP8 = 3, GPU_W_NVFP4 = 4, GPU_W_PLANES = 5 };

// KV cache element types (--kv-dtype).
enum { GPU_KV_F32 = 0, GPU_KV_BF16 = 1, GPU_KV_FP8 = 2 };

// Tokens per KV page: a sequence's keys and values live in pages of this many positions,
// found through its row of the block table.
#define GPU_KV_PAGE 16

// One weight matrix [rows, cols] = [out_features, in_features] in device memory, in its stored
// precision (format/CHECKPOINT.md §A.5–A.7, format/PLANES.md §3 for the 2-bit planes). Passed by value to kernels
// or read from a device table (routed experts). 48 bytes.
typedef struct {
    unsigned long long w;          // device address of row 0 (NVFP4: packed [rows, cols/2]; PLANES: fragment-major codes)
    unsigned long long scale;      // NVFP4: e4m3 [rows, cols/16]; PLANES: e8m0 [rows/16, cols/32, 16]; else 0
    unsigned long long row_bytes;  // bytes between rows (BF16/F16/F32/FP8/NVFP4)
    int kind;                      // GPU_W_*
    int rows, cols;
    float s;                       // FP8: weight_scale; NVFP4: weight_scale_2; else 1
    int pad[2];
} gpu_mat;

// Up to GPU_LIN_SET matrices that read the same input x [T, K] (every W[i].cols = K), computed
// by one k_linear launch: matrix i takes the blocks [first[i], first[i + 1]) of grid.x (8 output
// rows each) and writes y_i [T, ldy_i] (a device address). Passed by value (272 bytes).
#define GPU_LIN_SET 4
typedef struct {
    gpu_mat W[GPU_LIN_SET];
    unsigned long long y[GPU_LIN_SET];
    int ldy[GPU_LIN_SET];
    int first[GPU_LIN_SET + 1];
    int n;
    int pad[2];
} gpu_lin_set;
#ifdef __cplusplus
static_assert(sizeof(gpu_lin_set) == 272, "gpu_lin_set: the host's layout");
#else
_Static_assert(sizeof(gpu_lin_set) == 272, "gpu_lin_set: the kernels' layout");
#endif

#endif
