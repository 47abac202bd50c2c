// sass/rows.cu — k_rows: rows of 4-byte words moved by a row list, gathered (dst[i] = src[list[i]]) or scattered
// (dst[list[i]] = src[i]), i < n, `words` words a row, lds / ldd words between rows of src / dst. It carries the
// tokens of a step that k_mm_c does not take (gpu/launch.c: gpu_k_mm_mmc) to gpu_k_mm and their outputs back: a
// copy, no arithmetic. CPU twin: the copy itself (test_gpu compares the bytes).
// Launch (gpu_k_rows): block GPU_ROWS_NT, grid (n, ceil(words / GPU_ROWS_NT)).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_ROWS_NT) k_rows(const uint32_t *__restrict__ src, long long lds, uint32_t *__restrict__ dst,
                                                                long long ldd, const int *__restrict__ list, int words, int scatter) {
    GPU_DEP();
    const int i = blockIdx.x, j = blockIdx.y * GPU_ROWS_NT + threadIdx.x;
    if (j >= words) return;
    const long long r = list[i], si = scatter ? i : r, di = scatter ? r : i;
    dst[di * ldd + j] = src[si * lds + j];
}
