// sass/argmax.cu — a greedy row's token on the device: ids[r] = the first index t of row r of
// logits [rows, V] whose value equals the row's largest (NaN never the largest; −0 and +0 equal;
// 0 when every value is NaN), the token samp_pick takes at temperature 0 without penalties, so a
// step of such rows returns ids instead of its logits (gpu/backend.c).
// CPU twin: samp_first_max over samp_block_max (moet.c).
// Launch (gpu_k_argmax): block GPU_ARGMAX_NT threads, grid (rows ≤ cap, GPU_ARGMAX_SLICES). Block b
// takes the row's slice b (ceil(V / slices) indices) and leaves its largest value and the first
// index holding it (V: none, a slice of NaN) in the buffer (GPU_ARGMAX_INTS); the row's last block
// to finish (a counter) merges them: the largest of the slices' largest, then the least first
// index among the slices holding it (±0 compare equal, so a −0 slice and a +0 slice both count,
// as one pass over the row counts both). The result depends on no block order.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(GPU_ARGMAX_NT) k_argmax(const float *__restrict__ logits, int V, int *__restrict__ buf, int cap) {
    GPU_DEP();
    __shared__ float wmax[GPU_ARGMAX_NT / 32];
    __shared__ int wmin[GPU_ARGMAX_NT / 32];
    __shared__ int last;
    const int r = blockIdx.x, b = blockIdx.y, nb = gridDim.y;
    const int per = (V + nb - 1) / nb, lo = min(V, b * per), hi = min(V, lo + per);
    const float *__restrict__ x = logits + (size_t)r * V;
    // the buffer's places by its capacity of cap rows, not this launch's rows: a launch of fewer rows
    // finds the counters where every launch leaves them
    int *ids = buf, *cnt = buf + cap, *part = buf + 2 * (size_t)cap + (size_t)r * nb * 2;   // part: [nb][2] of this row
    // the slice's largest value, then the first index holding it (each thread's indices ascend)
    float m = -INFINITY;
    for (int t = lo + threadIdx.x; t < hi; t += GPU_ARGMAX_NT) {
        const float v = x[t];
        m = v > m ? v : m;
    }
    m = block_max_cmp<GPU_ARGMAX_NT / 32>(m, wmax);
    int first = V;
    for (int t = lo + threadIdx.x; t < hi; t += GPU_ARGMAX_NT)
        if (x[t] == m) {
            first = t;
            break;
        }
    first = block_min_int<GPU_ARGMAX_NT / 32>(first, wmin);
    if (threadIdx.x == 0) {
        part[2 * b] = __float_as_int(m), part[2 * b + 1] = first;
        __threadfence();   // the slice's pair visible to every block before the count says it is there
        const unsigned done = atomicAdd((unsigned *)cnt + r, 1u);
        last = done == (unsigned)nb - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();   // (the pattern's other half: the pairs read below after the count)
    // the row's last block: thread i < nb holds slice i's pair (read past L1: other blocks wrote it)
    float sm = -INFINITY;
    int sf = V;
    if ((int)threadIdx.x < nb) sm = __int_as_float(__ldcg(part + 2 * threadIdx.x)), sf = __ldcg(part + 2 * threadIdx.x + 1);
    const float M = block_max_cmp<GPU_ARGMAX_NT / 32>(sm, wmax);
    const int F = block_min_int<GPU_ARGMAX_NT / 32>((int)threadIdx.x < nb && sm == M ? sf : V, wmin);
    if (threadIdx.x == 0) {
        ids[r] = F < V ? F : 0;
        cnt[r] = 0;   // ready for the next launch
    }
}
