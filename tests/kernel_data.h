// tests/kernel_data.h — what the kernel tests (test_gpu.c) and the kernel harness
// (harness_kernels.c) share: random data of every stored weight format, device copies, the row
// metadata of the GDN kernels, and the CPU side of a GDN row cut as k_gdn_chunk cuts it.
// Included after moet.c (MOET_TEST) and check.h.
#ifndef MOET_KERNEL_DATA_H
#define MOET_KERNEL_DATA_H

static uint64_t kt_rng = 0x2545f4914f6cdd1dull;
static uint32_t kt_next(void) {
    kt_rng ^= kt_rng << 13, kt_rng ^= kt_rng >> 7, kt_rng ^= kt_rng << 17;
    return (uint32_t)(kt_rng >> 16);
}
static float kt_normal(void) {   // sum of four uniforms: mean 0, unit variance, enough for test data
    float u = 0;
    for (int i = 0; i < 4; i++) u += (float)(kt_next() & 0xffffff) / 16777216.0f;
    return (u - 2.0f) * 1.7320508f;
}

// A random weight matrix [N, K] of a stored kind (every code and nibble, scales over a range of
// exponents) in host memory: *wp and *scp (the scales, or NULL) for the caller to free.
static ck_mat kt_random_mat(int kind, int N, int K, uint8_t **wp, uint8_t **scp) {
    ck_mat W = {0};
    W.kind = (uint8_t)kind, W.rows = N, W.cols = K;
    size_t wb = kind == CK_W_BF16 ? (size_t)N * K * 2 : kind == CK_W_FP8 ? (size_t)N * K : kind == CK_W_NVFP4 ? (size_t)N * K / 2 : (size_t)N * K / 4;
    size_t sb = kind == CK_W_NVFP4 ? (size_t)N * K / 16 : kind == CK_W_PLANES ? (size_t)N * K / 32 : 0;
    uint8_t *w = malloc(wb), *sc = sb ? malloc(sb) : NULL;
    for (size_t i = 0; i < wb; i++) {
        uint8_t b = (uint8_t)kt_next();
        if (kind == CK_W_FP8 && (b & 0x7f) == 0x7f) b ^= 1;   // e4m3 0x7f / 0xff are NaN
        w[i] = b;
    }
    if (kind == CK_W_BF16)
        for (size_t i = 0; i < wb / 2; i++) {
            float f = kt_normal() * 0.05f;
            uint32_t u;
            memcpy(&u, &f, 4);
            w[2 * i] = (uint8_t)(u >> 16), w[2 * i + 1] = (uint8_t)(u >> 24);
        }
    for (size_t i = 0; i < sb; i++) sc[i] = kind == CK_W_NVFP4 ? (uint8_t)(0x20 + kt_next() % 0x30) : (uint8_t)(118 + kt_next() % 10);
    W.w = w, W.scale = sc;
    W.row_bytes = kind == CK_W_PLANES ? 0 : wb / N;
    W.s = kind == CK_W_FP8 ? 0.002f : kind == CK_W_NVFP4 ? 0.01f : 1.f;
    *wp = w, *scp = sc;
    return W;
}

// A device copy of n floats (a test arena: released by the caller).
static CUdeviceptr kt_dev(arena *d, const float *h, size_t n) {
    CUdeviceptr p = (uintptr_t)arena_take(d, sizeof(float) * n, 256, "test buffer");
    if (h) CU_CHECK(cu.cuMemcpyHtoD(p, h, sizeof(float) * n));
    else CU_CHECK(cu.cuMemsetD8(p, 0xff, sizeof(float) * n));   // NaN: an unwritten output fails
    // those run on the legacy stream, which the engine's non-blocking streams do not wait for
    CU_CHECK(cu.cuCtxSynchronize());
    return p;
}

// A BF16 vector weight [1, n] in host memory, values around `mid` with spread `sd`.
static ck_mat kt_bf16_vec(uint16_t *buf, int n, float mid, float sd) {
    for (int i = 0; i < n; i++) {
        float f = mid + sd * kt_normal();
        uint32_t u;
        memcpy(&u, &f, 4);
        buf[i] = (uint16_t)(u >> 16);
    }
    ck_mat m = {0};
    m.kind = CK_W_BF16, m.rows = 1, m.cols = n, m.w = (const uint8_t *)buf, m.row_bytes = (size_t)n * 2, m.s = 1;
    return m;
}


// ---- the gated delta rule's rows -------------------------------------------------------------

// The GDN kernels against their twins, normalised by the outputs' spread: f32 against f64 over
// sums of dk ≤ 128 products and, in the chunked form, a 64-step triangular solve whose
// coefficients are at most 1 in size: measured 5.2e-6 (chunked and recurrent, H200) → 2e-5.
#define GPU_TOL_GDN 2e-5

typedef struct {
    int slot, pos, len;   // a row: its slot, the absolute position of its first token, its tokens
} kt_row;

// The row metadata of the GDN kernels for rows laid out one after another from token t_first:
// int32 row_slot, row_start, row_len, row_pos, rows (the identity) and piece0 (k_gdn_chunk's
// pieces before each row: gpu_gdn_pieces) [nrows] each, at m + i·nrows·4 for i = 0 .. 5 (the
// address returned); *pieces (if not NULL) the rows' pieces.
static CUdeviceptr kt_rows_dev(arena *d, const kt_row *rw, int nrows, int t_first, int *pieces) {
    int32_t *h = malloc(sizeof(int32_t) * 6 * (size_t)nrows);
    for (int i = 0, t = t_first; i < nrows; t += rw[i].len, i++)
        h[i] = rw[i].slot, h[nrows + i] = t, h[2 * nrows + i] = rw[i].len, h[3 * nrows + i] = rw[i].pos, h[4 * nrows + i] = i;
    const int all = gpu_gdn_pieces(h + 2 * nrows, h + 3 * nrows, nrows, h + 5 * nrows);
    if (pieces) *pieces = all;
    CUdeviceptr m = (uintptr_t)arena_take(d, sizeof(int32_t) * 6 * (size_t)nrows, 256, "test rows");
    CU_CHECK(cu.cuMemcpyHtoD(m, h, sizeof(int32_t) * 6 * (size_t)nrows));
    CU_CHECK(cu.cuCtxSynchronize());
    free(h);
    return m;
}

// k_gdn_prep's scratch for `pieces` pieces of nv value heads (device; not initialised).
static CUdeviceptr kt_tm_dev(arena *d, int pieces, int nv) {
    return (uintptr_t)arena_take(d, sizeof(float) * (size_t)pieces * nv * GPU_GDN_TM, 256, "test GDN pieces");
}

// Launches k_gdn_rule or k_gdn_chunk (kernel: K_GDN_RULE or K_GDN_CHUNK: k_gdn_prep into tm, then
// the walk) over nrows rows whose metadata kt_rows_dev wrote at m (pieces: its count): qkv [T, cd],
// b / a [T, nv], o [T, nv·dv] (device), the states of the slots at S (device, [slots, nv, dk, dv]).
static void kt_gdn_run(gpu_kernels *k, CUstream s, int kernel, CUdeviceptr m, int nrows, CUdeviceptr tm, int pieces, CUdeviceptr qkv, int cd,
                       CUdeviceptr bb, CUdeviceptr aa, gpu_mat alog, gpu_mat dtb, CUdeviceptr S, CUdeviceptr o, int nk, int nv, int dk, int dv) {
    CUdeviceptr stride = (CUdeviceptr)nrows * 4;
    long long sstride = (long long)nv * dk * dv;
    if (kernel == K_GDN_RULE)
        gpu_k_gdn_rule(k, s, qkv, cd, bb, aa, alog, dtb, S, sstride, o, nk, nv, dk, dv, m, m + stride, m + 2 * stride, m + 4 * stride, nrows, 0, 0);
    else
        gpu_k_gdn_chunk(k, s, qkv, cd, bb, aa, alog, dtb, S, sstride, o, nk, nv, dk, dv, m, m + stride, m + 2 * stride, m + 3 * stride,
                        m + 4 * stride, nrows, tm, m + 5 * stride, pieces);
}

// k_gdn_prep alone (gpu_k_gdn_chunk's first launch) on kt_gdn_run's rows and scratch: the harness
// times it apart from the walk.
static void kt_gdn_prep_run(gpu_kernels *k, CUstream s, CUdeviceptr m, int nrows, CUdeviceptr tm, int pieces, CUdeviceptr qkv, int cd,
                            CUdeviceptr bb, CUdeviceptr aa, gpu_mat alog, gpu_mat dtb, int nk, int nv, int dk, int dv) {
    CUdeviceptr stride = (CUdeviceptr)nrows * 4;
    gpu_k_gdn_prep(k, s, qkv, cd, bb, aa, alog, dtb, nk, nv, dk, dv, m + stride, m + 2 * stride, m + 3 * stride, m + 4 * stride, nrows, tm,
                   m + 5 * stride, pieces);
}

// The CPU side of one row of either GDN kernel: with `recurrent`, the reference's one-token
// rule ref_gdn_rule for every token (k_gdn_rule's twin); else the tokens cut into pieces at
// multiples of GPU_GDN_C of their absolute positions as k_gdn_chunk cuts them, ref_gdn_chunk
// for pieces of ≥ 2 tokens and ref_gdn_rule for single tokens, q and k normalised by
// ref_gdn_qk_norm and the gates by ref_gdn_gates as the reference does. qkv [len, cd] after the
// conv (not changed), b, a [len, nv]; S [nv, dk, dv] the slot's state; o [len, nv·dv].
static void kt_gdn_row(const float *qkv, int cd, const float *bb, const float *aa, const ck_mat *alog, const ck_mat *dtb, float *S,
                       float *o, int nk, int nv, int dk, int dv, int pos, int len, int recurrent) {
    enum { C = GPU_GDN_C };
    int key_dim = nk * dk, rep = nv / nk;
    float *qk = malloc(sizeof(float) * (size_t)C * cd);   // the piece's rows, q and k normalised
    float *qh = malloc(sizeof(float) * C * dk), *kh = malloc(sizeof(float) * C * dk), *vh = malloc(sizeof(float) * C * dv);
    float *po = malloc(sizeof(float) * C * dv), *uu = malloc(sizeof(float) * dv), be[C], gg[C];
    double *w = malloc(sizeof(double) * ref_gdn_chunk_scratch(C, dv));
    for (int t = 0; t < len;) {
        int n = recurrent ? 1 : C - (pos + t) % C;
        if (n > len - t) n = len - t;
        memcpy(qk, qkv + (size_t)t * cd, sizeof(float) * (size_t)n * cd);
        if (n == 1) {
            ref_gdn_rule(qk, bb + (size_t)t * nv, aa + (size_t)t * nv, alog, dtb, S, o + (size_t)t * nv * dv, nk, nv, dk, dv, uu);
            t += 1;
            continue;
        }
        for (int r = 0; r < n; r++) ref_gdn_qk_norm(qk + (size_t)r * cd, qk + (size_t)r * cd + key_dim, nk, dk);
        for (int j = 0; j < nv; j++) {
            int hk = j / rep;
            for (int r = 0; r < n; r++) {
                const float *row = qk + (size_t)r * cd;
                memcpy(qh + (size_t)r * dk, row + (size_t)hk * dk, sizeof(float) * dk);
                memcpy(kh + (size_t)r * dk, row + key_dim + (size_t)hk * dk, sizeof(float) * dk);
                memcpy(vh + (size_t)r * dv, row + 2 * key_dim + (size_t)j * dv, sizeof(float) * dv);
                ref_gdn_gates(bb[(size_t)(t + r) * nv + j], aa[(size_t)(t + r) * nv + j], ck_at(alog, 0, j), ck_at(dtb, 0, j), &be[r], &gg[r]);
            }
            ref_gdn_chunk(qh, kh, vh, be, gg, n, dk, dv, S + (size_t)j * dk * dv, po, w);
            for (int r = 0; r < n; r++) memcpy(o + (size_t)(t + r) * nv * dv + (size_t)j * dv, po + (size_t)r * dv, sizeof(float) * dv);
        }
        t += n;
    }
    free(qk), free(qh), free(kh), free(vh), free(po), free(uu), free(w);
}

#endif
