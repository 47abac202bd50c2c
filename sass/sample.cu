// sass/sample.cu — a step's picks on the device: ids[r] = the token samp_pick takes from row r of
// logits [rows, V] with row r's parameters and generator (gpu_samp_row: greedy, or temperature,
// min_p, top_k ≤ GPU_SAMPLE_KMAX and top_p; penalties on the tokens pen lists), and where the row
// wants them the parts of its logprobs (lp[r]: smp_logprobs), so a step whose wanted rows are all
// such returns ids instead of its logits (gpu/backend.c). The same token as the host's, draw for
// draw: the same values in the same order wherever an order changes a result — the
// probabilities by samp_expf (sass/samp.h), the sums of top_p and the draw serial in the host's
// order — and elsewhere what depends on no order: maxima, counts, the k-th largest block maximum
// and the k most likely tokens (a total order: probability, then the lower id) found by radix
// selection instead of the host's heaps. −1 where a row has no candidate (the host's assertion).
// CPU twin: samp_bank_pick (moet.c: its penalties, samp_pick, samp_logprobs' sums and selection).
// Launch (gpu_k_sample): block GPU_SAMPLE_NT threads, grid (rows). Per row, as samp_pick:
//  1. the maxima of its blocks of 64 logits (bmax, NaN never the larger) and the row's (top);
//     greedy: the first index holding top (0 when none);
//  2. lo: the (2k + 8)-th largest block maximum where 2k + 8 ≤ blocks, raised to min_p's bound
//     top + (log(min_p) − 0.001) · T; where lo > −inf the candidates A are the logits ≥ lo whose
//     probability f = e^((x − top) / T) is > 0 and ≥ min_p; f(lo) bounds those left out: A is
//     drawn from when f(lo) is 0 or below min_p, or when A's k-th largest f is above f(lo);
//  3. else the candidates B: every logit with such an f;
//  4. the draw from a candidate set S of n: its k most likely, sorted, where k < n, else S in id
//     order; then top_p and one number of the generator (samp_draw's rest: thread 0, serial).
//  5. where the row wants logprobs: the parts smp_logprobs gives, of the raw logits (a penalized
//     row's before its penalties, the pick's own raw logit filled in after the pick).
// A penalized row's logits are penalized in place first (samp_bank_pick's copy of them: the step's
// logits are not read after its picks), and where it wants logprobs its pairs' second halves take
// the raw values of its penalized tokens; nothing else is written but ids and lp.
#include <string.h>
#include "common.cuh"
#include "samp.h"

#define SMP_NW (GPU_SAMPLE_NT / 32)
#define SMP_U 8   // blocks of 64 logits a warp reads at once (their loads in flight together)

struct smp_shared {
    float bmax[GPU_SAMPLE_NB];                  // each block's largest logit
    uint16_t qb[GPU_SAMPLE_NB];                 // the blocks whose maximum reaches lo, ascending
    unsigned long long key[GPU_SAMPLE_KMAX];    // the kept candidates' keys (smp_key), sorted or in id order
    int hist[256];                              // a radix digit's counts
    float wf[SMP_NW];
    int wi[SMP_NW];
    int n, digit, rem;
};

// A candidate's key: its probability's bits (positive floats order as their bits), then its id
// reversed — larger key, earlier in samp_before's order. 0 is below every candidate's.
__device__ __forceinline__ unsigned long long smp_key(float f, int t) {
    return (unsigned long long)__float_as_uint(f) << 32 | (0xffffffffu - (unsigned)t);
}
__device__ __forceinline__ float smp_key_p(unsigned long long k) { return __uint_as_float((unsigned)(k >> 32)); }
__device__ __forceinline__ int smp_key_id(unsigned long long k) { return (int)(0xffffffffu - (unsigned)k); }

// The block's sum of v, every thread's result (sh.wi free: its barriers come first).
__device__ __forceinline__ int smp_block_sum(int v, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh.wi[w] = v;
    __syncthreads();
    v = 0;
    for (int i = 0; i < SMP_NW; i++) v += sh.wi[i];
    return v;
}

// From the counts of a radix pass (hist, by digit): the digit that holds the rem-th largest key — the
// largest d with (keys above d) < rem ≤ (keys at d or above) — into sh.digit, and rem less the keys
// above it into sh.rem. Warp 0 (lane l the digits 255 − 8l down to 248 − 8l, a scan over the lanes).
__device__ __forceinline__ void smp_digit(smp_shared &sh, int rem) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    int c[8], s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) c[i] = sh.hist[255 - 8 * lane - i], s += c[i];
    int incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    const int excl = incl - s;
    const unsigned hit = __ballot_sync(0xffffffffu, excl < rem && rem <= incl);
    if (hit ? lane == __ffs(hit) - 1 : lane == 31) {   // (none: fewer keys than rem, which the callers exclude — digit 0)
        int cum = excl, i = 0;
        while (i < 7 && cum + c[i] < rem) cum += c[i++];
        sh.digit = 255 - 8 * lane - i, sh.rem = rem - cum;
    }
}

// A candidate set: the logits of blocks qb[0, nblk) (or of every block when qb is null) with
// x ≥ lo and f > 0, f ≥ floor_p. Each warp walks whole blocks, blocks ascending by round (warp w
// the round's w-th), lanes t = 64b + lane and 64b + 32 + lane: in(t, &key).
struct smp_set {
    const float *x;
    int V;
    float top, inv_t, lo, floor_p;
    const uint16_t *qb;
    int nblk;
    bool raw;   // the logits themselves (logprobs' most likely): every number, keyed by its value, then the lower id
    __device__ __forceinline__ int block_of(int i) const { return qb ? (int)qb[i] : i; }
    __device__ __forceinline__ bool in(int t, unsigned long long &key) const {
        if (t >= V) return false;
        const float v = x[t];
        if (!(v >= lo)) return false;
        if (raw) {   // ordered bits (−0 as +0: equal values go by id, as samp_before)
            const unsigned u = __float_as_uint(v == 0 ? 0.f : v), o = u & 0x80000000u ? ~u : u | 0x80000000u;
            key = (unsigned long long)o << 32 | (0xffffffffu - (unsigned)t);
            return true;
        }
        const float f = samp_expf(__fmul_rn(__fsub_rn(v, top), inv_t));   // samp_pick's (x − top) · inv_t
        key = smp_key(f, t);
        return f > 0 && f >= floor_p;
    }
};

// How many candidates the set holds (every thread's result).
__device__ int smp_count(const smp_set &s, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int c = 0;
    for (int i = w; i < s.nblk; i += SMP_NW) {
        const int b = s.block_of(i);
        unsigned long long k;
        c += s.in(64 * b + lane, k);
        c += s.in(64 * b + 32 + lane, k);
    }
    return smp_block_sum(c, sh);
}

// The set's k-th largest key (1 ≤ k ≤ its count; keys are distinct): eight passes of a radix
// digit, the largest first, each counting the keys that match the digits found so far.
__device__ unsigned long long smp_select(const smp_set &s, int k, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned long long prefix = 0, mask = 0;
    int rem = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += GPU_SAMPLE_NT) sh.hist[i] = 0;
        __syncthreads();
        for (int i = w; i < s.nblk; i += SMP_NW) {
            const int b = s.block_of(i);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                unsigned long long key = 0;
                const bool on = s.in(64 * b + 32 * h + lane, key) && (key & mask) == prefix;
                const unsigned act = __ballot_sync(0xffffffffu, on);
                if (on) {   // one atomic a digit a warp (the lanes that share it)
                    const int d = (int)(key >> shift) & 255;
                    const unsigned peers = __match_any_sync(act, d);
                    if (lane == __ffs(peers) - 1) atomicAdd(&sh.hist[d], __popc(peers));
                }
            }
        }
        __syncthreads();
        smp_digit(sh, rem);
        __syncthreads();
        prefix |= (unsigned long long)sh.digit << shift;
        mask |= 255ull << shift;
        rem = sh.rem;
        __syncthreads();   // (digit and rem read by every thread before the next pass writes them)
    }
    return prefix;
}

// key[0, n) sorted descending: a bitonic sort of the power of two S ≥ n places from 0 (the zeros
// of the unused places past n last; n ≤ GPU_SAMPLE_KMAX, the same on every thread).
__device__ void smp_sort(smp_shared &sh, int n) {
    const unsigned i = threadIdx.x;
    unsigned S = 2;
    while (S < (unsigned)n) S <<= 1;
    for (unsigned size = 2; size <= S; size <<= 1)
        for (unsigned stride = size / 2; stride > 0; stride >>= 1) {
            __syncthreads();
            const unsigned j = i ^ stride;
            if (j > i && j < S) {
                const unsigned long long a = sh.key[i], b = sh.key[j];
                const bool desc = (i & size) == 0;   // this run descending (the last run: all of it)
                if (desc ? a < b : a > b) sh.key[i] = b, sh.key[j] = a;
            }
        }
    __syncthreads();
}

// The set's keys ≥ kth (its k largest) into key[0, k), sorted; or, with kth 0, every candidate
// (at most GPU_SAMPLE_KMAX) in id order. Returns how many.
__device__ int smp_collect(const smp_set &s, unsigned long long kth, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const unsigned below = (1u << lane) - 1;
    sh.key[threadIdx.x] = 0;
    if (threadIdx.x == 0) sh.n = 0;
    __syncthreads();
    int base = 0;   // id order: the candidates of earlier rounds
    for (int r0 = 0; r0 < s.nblk; r0 += SMP_NW) {
        const int i = r0 + w;
        unsigned long long k0 = 0, k1 = 0;
        bool on0 = false, on1 = false;
        if (i < s.nblk) {
            const int b = s.block_of(i);
            on0 = s.in(64 * b + lane, k0) && k0 >= kth;
            on1 = s.in(64 * b + 32 + lane, k1) && k1 >= kth;
        }
        if (kth) {   // the k largest: any place (sorted below)
            if (on0) sh.key[atomicAdd(&sh.n, 1)] = k0;
            if (on1) sh.key[atomicAdd(&sh.n, 1)] = k1;
            continue;
        }
        const unsigned b0 = __ballot_sync(0xffffffffu, on0), b1 = __ballot_sync(0xffffffffu, on1);
        __syncthreads();   // (wi of the round before read)
        if (lane == 0) sh.wi[w] = __popc(b0) + __popc(b1);
        __syncthreads();
        int at = base, all = 0;
        for (int v = 0; v < SMP_NW; v++) {
            if (v < w) at += sh.wi[v];
            all += sh.wi[v];
        }
        if (on0) sh.key[at + __popc(b0 & below)] = k0;
        if (on1) sh.key[at + __popc(b0) + __popc(b1 & below)] = k1;
        base += all;
    }
    __syncthreads();
    const int n = kth ? sh.n : base;
    if (kth) smp_sort(sh, n);
    return n;
}

// samp_draw's rest on key[0, n) (sorted, or in id order when not): top_p, then one number of the
// generator. Every thread calls it (the unsorted top_p branch sorts with all of them); thread 0
// computes, serially in the host's order, and returns the token (the others' result: nothing).
__device__ int smp_draw(int n, bool sorted, const gpu_samp_row &p, smp_shared &sh) {
    if (p.top_p < 1) {
        __shared__ double total_s;
        if (threadIdx.x == 0) {
            double total = 0;
            for (int i = 0; i < n; i++) total = __dadd_rn(total, (double)smp_key_p(sh.key[i]));
            total_s = total;
            if (!sorted) {   // only the most likely tokens can be kept: those above a threshold (samp_draw's)
                float th = 0;
                for (float t2 = 1e-4f; t2 > 1e-12f && th == 0; t2 = __fmul_rn(t2, 1e-4f)) {
                    double mass = 0;
                    for (int i = 0; i < n; i++) {
                        const float q = smp_key_p(sh.key[i]);
                        if (q >= t2) mass = __dadd_rn(mass, (double)q);
                    }
                    if (mass >= __dmul_rn((double)p.top_p, total)) th = t2;
                }
                if (th > 0) {
                    int k = 0;
                    for (int i = 0; i < n; i++)
                        if (smp_key_p(sh.key[i]) >= th) sh.key[k++] = sh.key[i];
                    for (int i = k; i < n; i++) sh.key[i] = 0;
                    n = k;
                }
                sh.n = n;
            }
        }
        __syncthreads();
        if (!sorted) n = sh.n, smp_sort(sh, n);
        if (threadIdx.x == 0) {
            const double need = __dmul_rn((double)p.top_p, total_s);
            double acc = 0;
            int k = 0;
            while (k < n) {
                acc = __dadd_rn(acc, (double)smp_key_p(sh.key[k++]));
                if (acc >= need) break;
            }
            n = k;
        }
    }
    if (threadIdx.x != 0) return -1;
    double total = 0;
    for (int i = 0; i < n; i++) total = __dadd_rn(total, (double)smp_key_p(sh.key[i]));
    samp_rng rng;
    for (int i = 0; i < 4; i++) rng.s[i] = p.rng[i];
    const double u = __dmul_rn(samp_uniform(&rng), total);
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc = __dadd_rn(acc, (double)smp_key_p(sh.key[i]));
        if (u < acc) return smp_key_id(sh.key[i]);
    }
    return smp_key_id(sh.key[n - 1]);   // u within rounding of the total
}

// The draw from a candidate set of n (n ≥ 1): its k most likely where k < n, else all of it.
__device__ int smp_draw_set(const smp_set &s, int n, const gpu_samp_row &p, smp_shared &sh) {
    if (n <= 0) return -1;
    const int k = p.top_k;
    if (k < n) {
        const unsigned long long kth = smp_select(s, k, sh);
        return smp_draw(smp_collect(s, kth, sh), true, p, sh);
    }
    return smp_draw(smp_collect(s, 0, sh), false, p, sh);
}

// The token of a row that samples (every thread calls it; thread 0's result is the token).
__device__ int smp_sampled(const float *x, int V, float top, int nb, const gpu_samp_row &p, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    // 2. lo, and the candidates A where it is a bound
    const float floor_p = p.min_p > 0 ? p.min_p : 0;
    const int k = p.top_k;
    float lo = -INFINITY;
    if (2 * k + 8 <= nb) {   // the (2k + 8)-th largest block maximum: select on the maxima's ordered bits
        unsigned prefix = 0, mask = 0;
        int rem = 2 * k + 8;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += GPU_SAMPLE_NT) sh.hist[i] = 0;
            __syncthreads();
            for (int b = threadIdx.x; b < nb; b += GPU_SAMPLE_NT) {
                const unsigned u = __float_as_uint(sh.bmax[b]), o = u & 0x80000000u ? ~u : u | 0x80000000u;   // (no NaN among maxima)
                if ((o & mask) == prefix) atomicAdd(&sh.hist[(o >> shift) & 255], 1);
            }
            __syncthreads();
            smp_digit(sh, rem);
            __syncthreads();
            prefix |= (unsigned)sh.digit << shift;
            mask |= 255u << shift;
            rem = sh.rem;
            __syncthreads();
        }
        lo = __uint_as_float(prefix & 0x80000000u ? prefix & 0x7fffffffu : ~prefix);
    }
    if (floor_p > 0) {
        const float lm = __fadd_rn(top, __fmul_rn(p.min_p_log, p.temperature));
        if (lm > lo) lo = lm;
    }
    int id;
    bool drawn = false;
    if (lo > -INFINITY) {
        // the blocks whose maximum reaches lo, ascending
        const unsigned below = (1u << lane) - 1;
        int base = 0;
        for (int b0 = 0; b0 < nb; b0 += GPU_SAMPLE_NT) {
            const int b = b0 + threadIdx.x;
            const bool on = b < nb && sh.bmax[b] >= lo;
            const unsigned bal = __ballot_sync(0xffffffffu, on);
            __syncthreads();
            if (lane == 0) sh.wi[w] = __popc(bal);
            __syncthreads();
            int at = base, all = 0;
            for (int v = 0; v < SMP_NW; v++) {
                if (v < w) at += sh.wi[v];
                all += sh.wi[v];
            }
            if (on) sh.qb[at + __popc(bal & below)] = (uint16_t)b;
            base += all;
        }
        __syncthreads();
        const smp_set a = {x, V, top, p.inv_t, lo, floor_p, sh.qb, base};
        const int n = smp_count(a, sh);
        const float out = samp_expf(__fmul_rn(__fsub_rn(lo, top), p.inv_t));   // no logit left out has a larger f
        if (out == 0 || out < floor_p) {   // none of them is a candidate
            id = smp_draw_set(a, n, p, sh), drawn = true;
        } else if (n > k && k <= nb) {   // none of them can be among the k most likely?
            const unsigned long long kth = smp_select(a, k, sh);
            if (smp_key_p(kth) > out) id = smp_draw(smp_collect(a, kth, sh), true, p, sh), drawn = true;
        }
    }
    if (!drawn) {   // 3. every logit
        const smp_set b = {x, V, top, p.inv_t, -INFINITY, floor_p, nullptr, nb};
        id = smp_draw_set(b, smp_count(b, sh), p, sh);
    }
    return id;
}

// The pick's logprobs parts (samp_logprobs's; the host takes the log): the row's Σ e^(x − top) in
// samp_sum_exp's order — each full block of 64 summed in float by one thread as samp_sum_exp's four
// vectors of four lanes do (smp_exp_lp: samp_exp4's lane), the blocks then the last partial block's
// logits added in double by thread 0 in id order — the picked token's logit, and the n_top most
// likely tokens by logit (then the lower id; NaN never). sh.bmax is free by then: it holds the sums.
__device__ __forceinline__ float smp_exp_lp(float y) {
    y = y > -87.3f ? y : -87.3f;   // (NaN too)
    const float k = __fsub_rn(__fadd_rn(__fmul_rn(y, 1.44269504088896341f), 12582912.0f), 12582912.0f);
    const float r = __fadd_rn(__fsub_rn(y, __fmul_rn(k, 0.693359375f)), __fmul_rn(k, 2.12194440e-4f));
    float q = __fadd_rn(__fmul_rn(8.3338379501e-3f, r), 4.1898577938e-2f);
    q = __fadd_rn(__fmul_rn(q, r), 1.6666886383e-1f);
    q = __fadd_rn(__fmul_rn(q, r), 4.9999142573e-1f);
    const float e = __fadd_rn(__fadd_rn(__fmul_rn(q, __fmul_rn(r, r)), r), 1.0f);
    return __fmul_rn(e, __int_as_float(((int)k + 127) << 23));
}
__device__ void smp_logprobs(const float *x, int V, float top, int id, int n_top, gpu_samp_lp *out, smp_shared &sh) {
    const int nfull = V / 64;
    for (int b = threadIdx.x; b < nfull; b += GPU_SAMPLE_NT) {
        const float *q = x + 64 * b;
        float a[4] = {0, 0, 0, 0}, c[4] = {0, 0, 0, 0}, d[4] = {0, 0, 0, 0}, e[4] = {0, 0, 0, 0};
        for (int i = 0; i < 64; i += 16)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                a[j] = __fadd_rn(a[j], smp_exp_lp(__fsub_rn(q[i + j], top)));
                c[j] = __fadd_rn(c[j], smp_exp_lp(__fsub_rn(q[i + 4 + j], top)));
                d[j] = __fadd_rn(d[j], smp_exp_lp(__fsub_rn(q[i + 8 + j], top)));
                e[j] = __fadd_rn(e[j], smp_exp_lp(__fsub_rn(q[i + 12 + j], top)));
            }
#pragma unroll
        for (int j = 0; j < 4; j++) a[j] = __fadd_rn(__fadd_rn(a[j], c[j]), __fadd_rn(d[j], e[j]));
        sh.bmax[b] = __fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3]));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0;
        for (int b = 0; b < nfull; b++) total = __dadd_rn(total, (double)sh.bmax[b]);
        for (int t = 64 * nfull; t < V; t++) total = __dadd_rn(total, (double)smp_exp_lp(__fsub_rn(x[t], top)));
        out->total = total, out->top = top, out->chosen = id >= 0 ? x[id] : 0.f;
        out->n = 0;
    }
    if (n_top > 0) {
        smp_set s = {x, V, top, 0, -INFINITY, 0, nullptr, (V + 63) / 64};
        s.raw = true;
        const int k = min(smp_count(s, sh), n_top);
        if (k > 0) {
            smp_collect(s, smp_select(s, k, sh), sh);   // (sorted: the k largest keys)
            if ((int)threadIdx.x < k) {
                const unsigned o = (unsigned)(sh.key[threadIdx.x] >> 32);
                out->ids[threadIdx.x] = smp_key_id(sh.key[threadIdx.x]);
                out->vals[threadIdx.x] = __uint_as_float(o & 0x80000000u ? o & 0x7fffffffu : ~o);
            }
            if (threadIdx.x == 0) out->n = k;
        }
    }
}

// 1. The maxima of x's blocks of 64 into sh.bmax and the row's (every thread's result): a warp takes
// SMP_U blocks at a time, a lane two logits of each (8-byte loads where the row allows: every load
// in flight before the warp's sums). Plain loads: not the read-only path, which may hold the values
// before the penalties wrote them.
__device__ float smp_maxima(const float *x, int V, int nb, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float m = -INFINITY;
    const bool pairs = ((uintptr_t)x & 7) == 0;
    for (int b0 = SMP_U * w; b0 < nb; b0 += SMP_U * SMP_NW) {
        float v[SMP_U];
#pragma unroll
        for (int u = 0; u < SMP_U; u++) {
            const int t = 64 * (b0 + u) + 2 * lane;
            float a0 = -INFINITY, a1 = -INFINITY;
            if (pairs && t + 1 < V) {
                const float2 q = *(const float2 *)(x + t);
                a0 = q.x, a1 = q.y;
            } else {
                if (t < V) a0 = x[t];
                if (t + 1 < V) a1 = x[t + 1];
            }
            v[u] = -INFINITY;   // (NaN never the larger)
            v[u] = a0 > v[u] ? a0 : v[u];
            v[u] = a1 > v[u] ? a1 : v[u];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < SMP_U; u++) {
                const float q = __shfl_xor_sync(0xffffffffu, v[u], o);
                v[u] = q > v[u] ? q : v[u];
            }
#pragma unroll
        for (int u = 0; u < SMP_U; u++)
            if (b0 + u < nb) {
                if (lane == 0) sh.bmax[b0 + u] = v[u];
                m = v[u] > m ? v[u] : m;
            }
    }
    return block_max_cmp<SMP_NW>(m, sh.wf);   // (its barriers publish bmax)
}

extern "C" __global__ void __launch_bounds__(GPU_SAMPLE_NT) k_sample(float *logits, int V, const gpu_samp_row *__restrict__ rows,
                                                                    int2 *__restrict__ pen, int *__restrict__ ids, gpu_samp_lp *__restrict__ lp) {
    GPU_DEP();
    __shared__ smp_shared sh;
    __shared__ int id_s;
    __shared__ float chosen_s;
    const int r = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const gpu_samp_row p = rows[r];
    const int nb = (V + 63) / 64;
    float *xw = logits + (size_t)r * V;
    const float *x = xw;
    // a penalized row's logprobs are of its raw logits: their parts before the penalties change them
    // (the pick's own logit filled in after it), the raw values of the tokens penalized kept in
    // their pairs' second halves (the times generated are not read again)
    const bool lp_raw = p.logprobs && p.pen_n;
    if (lp_raw) {
        smp_logprobs(x, V, smp_maxima(x, V, nb, sh), -1, p.n_top, lp + r, sh);
        __syncthreads();   // (every read of the raw row done before the penalties write it)
    }
    // 0. the penalties, in place on the seen tokens (distinct: each thread its own), as samp_bank_pick's
    //    copy: the repetition penalty, then frequency · times generated + presence where generated
    if (p.pen_n) {
        for (int i = threadIdx.x; i < p.pen_n; i += GPU_SAMPLE_NT) {
            const int2 q = pen[p.pen_off + i];
            float v = xw[q.x];
            if (lp_raw) pen[p.pen_off + i].y = __float_as_int(v);
            if (p.rep != 1) v = v > 0 ? __fdiv_rn(v, p.rep) : __fmul_rn(v, p.rep);
            if (q.y) v = __fsub_rn(v, __fadd_rn(__fmul_rn(p.freq, (float)q.y), p.pres));
            xw[q.x] = v;
        }
        __syncthreads();   // (the block's own writes: seen by its threads past the barrier)
    }
    const float top = smp_maxima(x, V, nb, sh);
    int id;
    if (p.temperature == 0) {   // greedy: the first index holding the maximum
        int first = V;
        for (int b = w; b < nb; b += SMP_NW)
            if (sh.bmax[b] == top)
                for (int t = 64 * b + lane; t < min(V, 64 * b + 64); t += 32)
                    if (x[t] == top) first = min(first, t);
        first = block_min_int<SMP_NW>(first, sh.wi);
        id = first < V ? first : 0;
    } else {
        id = smp_sampled(x, V, top, nb, p, sh);
    }
    if (threadIdx.x == 0) ids[r] = id;
    if (p.logprobs && !lp_raw) smp_logprobs(x, V, top, id, p.n_top, lp + r, sh);   // (id: thread 0's)
    if (lp_raw) {   // the pick's raw logit: the row's, or where the pick was penalized its pair's
        if (threadIdx.x == 0) id_s = id, chosen_s = id >= 0 ? x[id] : 0.f;
        __syncthreads();
        for (int i = threadIdx.x; i < p.pen_n; i += GPU_SAMPLE_NT) {
            const int2 q = pen[p.pen_off + i];
            if (q.x == id_s) chosen_s = __int_as_float(q.y);   // (one pair at most: the tokens are distinct)
        }
        __syncthreads();
        if (threadIdx.x == 0) lp[r].chosen = chosen_s;
    }
}
