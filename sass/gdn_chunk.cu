// sass/gdn_chunk.cu — the gated delta rule, chunked (WY) form for prompt chunks (MODEL.md §4.2):
// the same map from (S₀, tokens) to (outputs, S) as the recurrent form, computed with matrix
// products over up to GPU_GDN_C tokens at a time instead of one token after another.
//
// A row's tokens are cut into pieces at multiples of GPU_GDN_C of their absolute positions in the
// sequence (row_pos[r] is the first one's), so a given prompt is cut the same way however the
// scheduler split it into steps, as long as its steps end at such multiples (engine_backend's
// chunk_align); a single-token piece (a prompt's last token past a multiple) takes the recurrent
// update gdn_token, bit for bit as k_gdn_rule does. A piece of n ≥ 2 tokens r = 0 .. n−1 of value
// head j, with q̂, k̂ L2-normalised (q̂ · 1/sqrt(dk)), β_r, and the log decays g_r (sass/gdn.cuh):
//   γ_r = Σ_{i≤r} g_i;  D_rj = exp(γ_r − γ_j) (j ≤ r; never formed above the diagonal)
//   A_rj = β_r (k̂_r·k̂_j) D_rj (j < r);   M_rj = (q̂_r·k̂_j) D_rj (j ≤ r)
//   R = diag(β) (V − diag(e^γ) K̂ S₀);    U = T R, T = (I + A)⁻¹ (in blocks of 16: forward
//                                          substitution inside the diagonal ones, products
//                                          below; U's rows are the recurrence's corrections u_r)
//   O = diag(e^γ) Q̂ S₀ + M U;            S ← e^{γ_{n−1}} S₀ + Σ_r e^{γ_{n−1} − γ_r} k̂_r u_rᵀ
// Only differences γ_r − γ_j ≤ 0 are exponentiated, so a strong decay underflows to 0, never
// overflows; γ is summed in f64, so a difference of two large γ (after a strong decay) keeps
// the precision of an f32 difference. Value columns evolve on their own: a block takes GPU_GDN_VC
// columns of one head of one row and holds them in shared memory over the row's pieces.
// Two launches. What does not depend on S₀ — q̂, k̂, γ, β, A, M and T = (I + A)⁻¹ — depends on the
// piece alone, so k_gdn_prep computes it for every piece of the step at once (grid: key heads ×
// pieces, each block its key head's value heads one after another) into tm — T, M and the gates
// the walk takes from γ and β (β, e^{γ_{n−1} − γ_r}, e^{γ_r}) — and leaves q̂ and k̂ in
// qkv over q and k (once a key head: the walk's blocks of its value heads and value columns copy
// them as they are, where each normalised them again); the walk k_gdn_chunk,
// whose pieces follow one another along a row, keeps what does: R, U = T R (a product instead of
// the forward substitution's chain of n − 1 dependent rows), O and the state — its products on tensor cores, each f32 operand in two tf32 parts
// (3xTF32, below: within ≈ 2⁻²¹ of the f32 product), so the walk is near f32 while its
// instructions are a fraction of the scalar loops'.
// CPU twin: ref_gdn_chunk (moet.c).
// In/out as k_gdn_rule, plus row_pos, piece0 (the pieces of the rows before each: gpu_gdn_pieces)
// and tm [pieces, nv, GPU_GDN_TM] f32 (T, M [GPU_GDN_C, GPU_GDN_C], then β, e^{γ_{n−1} − γ_r}, e^{γ_r}
// [GPU_GDN_C]; a single-token piece's unwritten);
// and qkv is an output too: the q and k of every piece of two or more tokens are q̂ and k̂ after it
// (a single-token piece's as they were: the walk normalises those itself, as k_gdn_rule).
// Rows: rows[0 .. gridDim.y).
// Launch (gpu_k_gdn_chunk): k_gdn_prep, block GPU_GDN_NT threads, grid (nk, pieces), dynamic
// shared memory gpu_gdn_prep_smem(dk); then k_gdn_chunk, block GPU_GDN_NT threads, grid (nv, rows,
// ceil(dv / GPU_GDN_VC)), dynamic shared memory gpu_gdn_chunk_smem(dk, lean) bytes (gpu/kernels.c: the
// sum of the arrays below).
#include "gdn.cuh"
#include "mm.cuh"   // mm_cp: cp.async

// Value head j's gates of a piece of n tokens from token t (threads < GPU_GDN_C, one a token): β
// and the log decays g into bet, gam (β = 0, g = 0 past n); gdn_piece_gam (thread 0, once they
// are published) sums g into γ in token order, in f64.
__device__ __forceinline__ void gdn_piece_gates(const float *__restrict__ bb, const float *__restrict__ aa, float Aexp, float dtb, int t, int n,
                                                int j, int nv, float *bet, double *gam) {
    const int tid = threadIdx.x;
    if (tid < GPU_GDN_C) {
        float beta = 0.f, g = 0.f;
        if (tid < n) gdn_gates(bb[(size_t)(t + tid) * nv + j], aa[(size_t)(t + tid) * nv + j], Aexp, dtb, &beta, &g);
        bet[tid] = beta;
        gam[tid] = (double)g;
    }
}
__device__ __forceinline__ void gdn_piece_gam(double *gam) {
    if (threadIdx.x == 0)
        for (int rr = 1; rr < GPU_GDN_C; rr++) gam[rr] += gam[rr - 1];
}

// The copies of a piece's rows of q and k (n tokens from token t, key head hk) into Qs, Ks [GPU_GDN_C, KP]
// by cp.async, W floats a copy (W = 2: dk, cd even, qkv 8-byte aligned, as gpu_k_gdn_prep asserts;
// W = 4: the walk's where cd and qkv's address allow 16 bytes, gdn_qk16, and KP a multiple of 4),
// every copy of the thread in flight at once (zeros past n, nothing read there): issued, not committed.
// A thread's (row, piece) walked by counters (GPU_GDN_NT = drr rows and dc pieces of hd further), not
// divisions.
template <int W>
__device__ __forceinline__ void gdn_piece_copy_qk(const float *__restrict__ qkv, int cd, int t, int n, int hk, int dk, int key_dim, int KP, float *Qs,
                                                  float *Ks) {
    const int hd = dk / W, drr = GPU_GDN_NT / hd, dc = GPU_GDN_NT % hd;
    for (int rr = threadIdx.x / hd, c = threadIdx.x % hd; rr < GPU_GDN_C;) {
        const int d = W * c;
        const float *row = qkv + (size_t)(t + min(rr, n - 1)) * cd;
        mm_cp<4 * W>(&Qs[rr * KP + d], row + hk * dk + d, rr < n);
        mm_cp<4 * W>(&Ks[rr * KP + d], row + key_dim + hk * dk + d, rr < n);
        rr += drr, c += dc;
        if (c >= hd) c -= hd, rr++;
    }
}
// Whether every q and k row piece of 4 floats (dk a multiple of 4) starts 16-byte aligned: qkv's
// address and its row stride cd
__device__ __forceinline__ bool gdn_qk16(const float *qkv, int cd) { return ((cd & 3) | ((size_t)qkv & 15)) == 0; }

// k_gdn_prep's steps 0 and 1 of a piece of n tokens from token t, value head j (key head hk): q̂ and
// k̂ into Qs, Ks [GPU_GDN_C, KP] (zero rows past n; q and k L2-normalised, q̂ · qscale, a warp per
// token), β and γ (f64, summed in token order by thread 0) into bet, gam [GPU_GDN_C] (padding rows:
// β = 0, g = 0 change nothing). Every thread of the block; ends after a barrier.
__device__ __forceinline__ void gdn_piece_qk(const float *__restrict__ qkv, int cd, const float *__restrict__ bb, const float *__restrict__ aa,
                                             float Aexp, float dtb, float qscale, int t, int n, int j, int nv, int hk, int dk, int key_dim, int KP,
                                             float *Qs, float *Ks, float *bet, double *gam) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    gdn_piece_copy_qk<2>(qkv, cd, t, n, hk, dk, key_dim, KP, Qs, Ks);   // the gates' loads meanwhile
    mm_cp_commit();
    gdn_piece_gates(bb, aa, Aexp, dtb, t, n, j, nv, bet, gam);
    mm_cp_wait<0>();
    __syncthreads();
    for (int rr = warp; rr < n; rr += GPU_GDN_NT / WARP) {
        float sq = 0.f, sk = 0.f;
        for (int d = lane; d < dk; d += WARP) {
            float qv = Qs[rr * KP + d], kv = Ks[rr * KP + d];
            sq += qv * qv;
            sk += kv * kv;
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        float rq = 1.f / sqrtf(sq + 1e-6f) * qscale, rk = 1.f / sqrtf(sk + 1e-6f);
        for (int d = lane; d < dk; d += WARP) {
            Qs[rr * KP + d] *= rq;
            Ks[rr * KP + d] *= rk;
        }
    }
    gdn_piece_gam(gam);
    __syncthreads();
}

// The piece q (of the step's pieces, gpu_gdn_pieces' numbering) of the rows rows[0 .. n_rows):
// its first token *t0 and its tokens *n (0: past the row).
__device__ __forceinline__ void gdn_piece_at(int q, const int *__restrict__ piece0, int n_rows, const int *__restrict__ rows,
                                             const int *__restrict__ row_start, const int *__restrict__ row_len,
                                             const int *__restrict__ row_pos, int *t0, int *n) {
    int k = 0;
    while (k + 1 < n_rows && piece0[k + 1] <= q) k++;
    const int r = rows[k], i = q - piece0[k], t = row_start[r], L = row_len[r], n0 = min(GPU_GDN_C - row_pos[r] % GPU_GDN_C, L);
    *t0 = i ? t + n0 + (i - 1) * GPU_GDN_C : t;
    *n = i ? max(0, min(GPU_GDN_C, t + L - *t0)) : n0;
}

// ---- products on tensor cores: 3xTF32 (the walk's, and k_gdn_prep's blocks of T) -------------
//
// Each f32 operand x is split as hi = tf32(x) and lo = tf32(x − hi) (gdn_tf32), and a
// product a·b taken as lo_a·hi_b + hi_a·lo_b + hi_a·hi_b (the three mma in that order, f32
// accumulation): within ≈ 2⁻²¹ of a·b relative, what dropped lo_a·lo_b and the accumulations'
// rounding leave. mma.m16n8k8 fragments (g = lane / 4, t = lane % 4): A a0 (g, t), a1 (g + 8, t),
// a2 (g, t + 4), a3 (g + 8, t + 4); B b0 (k t, n g), b1 (k t + 4, n g); C c0 (g, 2t), c1 (g, 2t + 1),
// c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
// x rounded to tf32 (10 mantissa bits, to nearest, ties away from zero), as an f32 whose 13 low
// bits are zero: what the mma reads of it is all of it
__device__ __forceinline__ float gdn_tf32(float x) { return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u); }
__device__ __forceinline__ void gdn_split(float x, uint32_t &h, uint32_t &l) {
    const float hf = gdn_tf32(x);
    h = __float_as_uint(hf);
    l = __float_as_uint(gdn_tf32(x - hf));   // x − hf exact: x's bits below hf's
}
__device__ __forceinline__ void gdn_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// An A fragment's values a[4] split (once for every B it meets)
struct gdn_af {
    uint32_t h[4], l[4];
};
__device__ __forceinline__ gdn_af gdn_asplit(const float a[4]) {
    gdn_af f;
#pragma unroll
    for (int i = 0; i < 4; i++) gdn_split(a[i], f.h[i], f.l[i]);
    return f;
}
// c[b] += a · b for NB B tiles b at once (B values b0[b], b1[b] as the fragment holds them, f32,
// split here): each product's three mma in the order above (lo·hi, hi·lo, hi·hi), issued in rounds —
// every tile's lo·hi, then every hi·lo, then every hi·hi — so that consecutive mma are independent
// and none waits on the one before it (a warp issues in order); each accumulator's own sums, and so
// its bits, as if its products came one after another
template <int NB>
__device__ __forceinline__ void gdn_mma3t(float (&c)[NB][4], const gdn_af &a, const float (&b0)[NB], const float (&b1)[NB]) {
    uint32_t bh[NB][2], bl[NB][2];
#pragma unroll
    for (int b = 0; b < NB; b++) gdn_split(b0[b], bh[b][0], bl[b][0]), gdn_split(b1[b], bh[b][1], bl[b][1]);
#pragma unroll
    for (int b = 0; b < NB; b++) gdn_mma(c[b], a.l, bh[b]);
#pragma unroll
    for (int b = 0; b < NB; b++) gdn_mma(c[b], a.h, bl[b]);
#pragma unroll
    for (int b = 0; b < NB; b++) gdn_mma(c[b], a.h, bh[b]);
}
// The same for two A fragments a, e against the same two B tiles (split once): c[b] += a · B_b,
// d[b] += e · B_b, in rounds of four
__device__ __forceinline__ void gdn_mma3t2(float (&c)[2][4], float (&d)[2][4], const gdn_af &a, const gdn_af &e, const float (&b0)[2],
                                           const float (&b1)[2]) {
    uint32_t bh[2][2], bl[2][2];
#pragma unroll
    for (int b = 0; b < 2; b++) gdn_split(b0[b], bh[b][0], bl[b][0]), gdn_split(b1[b], bh[b][1], bl[b][1]);
#pragma unroll
    for (int b = 0; b < 2; b++) gdn_mma(c[b], a.l, bh[b]), gdn_mma(d[b], e.l, bh[b]);
#pragma unroll
    for (int b = 0; b < 2; b++) gdn_mma(c[b], a.h, bl[b]), gdn_mma(d[b], e.h, bl[b]);
#pragma unroll
    for (int b = 0; b < 2; b++) gdn_mma(c[b], a.h, bh[b]), gdn_mma(d[b], e.h, bh[b]);
}
// The A values of rows m0 .. m0 + 15, columns k0 .. k0 + 7 of X [., ld] (row-major), or of Xᵀ
// (A[m][k] = X[k][m]).
__device__ __forceinline__ void gdn_a(float a[4], const float *X, int ld, int m0, int k0, int g, int t) {
    a[0] = X[(m0 + g) * ld + k0 + t], a[1] = X[(m0 + g + 8) * ld + k0 + t];
    a[2] = X[(m0 + g) * ld + k0 + t + 4], a[3] = X[(m0 + g + 8) * ld + k0 + t + 4];
}
// T and M [C, C] as the walk keeps them: row r's 4-column groups swizzled by r mod 8 (16-byte
// copies stay whole), so that an A fragment's 32 loads meet 32 banks
__device__ __forceinline__ int gdn_tsw(int r, int c) { return r * GPU_GDN_C + (c ^ ((r & 7) << 2)); }
__device__ __forceinline__ void gdn_a_tsw(float a[4], const float *X, int m0, int k0, int g, int t) {
    a[0] = X[gdn_tsw(m0 + g, k0 + t)], a[1] = X[gdn_tsw(m0 + g + 8, k0 + t)];
    a[2] = X[gdn_tsw(m0 + g, k0 + t + 4)], a[3] = X[gdn_tsw(m0 + g + 8, k0 + t + 4)];
}
// k_gdn_prep's T or M of a piece (tp: [C, C] row-major) into X (gdn_tsw) by cp.async, 16 bytes a copy
__device__ __forceinline__ void gdn_copy_tsw(float *X, const float *tp) {
    for (int i = threadIdx.x; i < GPU_GDN_C * GPU_GDN_C / 4; i += GPU_GDN_NT) {
        const int r = i / (GPU_GDN_C / 4), c = 4 * (i % (GPU_GDN_C / 4));
        mm_cp<16>(&X[gdn_tsw(r, c)], tp + 4 * i, true);
    }
}

// k_gdn_prep (see the top): piece blockIdx.y, key head blockIdx.x: T and M of each of its nv / nk
// value heads into tm, one after another — q̂, k̂ and their products K̂K̂ᵀ, Q̂K̂ᵀ (the key head's)
// once, then each value head's gates, A, M and T (each head's values as a block of its own would
// leave them). A piece of one token writes nothing (the walk takes the recurrence there).
extern "C" __global__ void __launch_bounds__(GPU_GDN_NT, 2) k_gdn_prep(float *__restrict__ qkv, int cd, const float *__restrict__ bb,
                                                                    const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,
                                                                    float *__restrict__ tm, int nk, int nv, int dk,
                                                                    const int *__restrict__ row_start, const int *__restrict__ row_len,
                                                                    const int *__restrict__ row_pos, const int *__restrict__ rows,
                                                                    const int *__restrict__ piece0, int n_rows) {
    GPU_DEP();
    extern __shared__ double smd[];
    const int KP = dk + 2, AP = GPU_GDN_C + 1;
    double *gam = smd;                    // [GPU_GDN_C] γ
    float *Ks = (float *)(smd + GPU_GDN_C);   // [GPU_GDN_C, KP] k̂ of the piece
    float *Qs = Ks + GPU_GDN_C * KP;      // [GPU_GDN_C, KP] q̂
    float *A = Qs + GPU_GDN_C * KP;       // [GPU_GDN_C, AP]
    float *Tt = A + GPU_GDN_C * AP;       // [GPU_GDN_C, AP] T
    float *bet = Tt + GPU_GDN_C * AP;     // [GPU_GDN_C] β
    const int tid = threadIdx.x, hk = blockIdx.x, q = blockIdx.y, G = nv / nk, key_dim = nk * dk;
    int t, n;
    gdn_piece_at(q, piece0, n_rows, rows, row_start, row_len, row_pos, &t, &n);
    if (n < 2) return;
    gdn_piece_qk(qkv, cd, bb, aa, expf(vec_at(A_log, hk * G)), vec_at(dt_bias, hk * G), 1.f / sqrtf((float)dk), t, n, hk * G, nv, hk, dk, key_dim, KP,
                 Qs, Ks, bet, gam);
    // q̂ and k̂ back over the piece's q and k in qkv (this block's alone: its key head's columns of its
    // piece's rows), for the walk's blocks of the key head's value heads to copy as they are
    {
        const int hd = dk / 2;
        for (int i = tid; i < n * hd; i += GPU_GDN_NT) {
            const int rr = i / hd, d = 2 * (i % hd);
            float *row = qkv + (size_t)(t + rr) * cd;
            *(float2 *)(row + hk * dk + d) = *(const float2 *)&Qs[rr * KP + d];
            *(float2 *)(row + key_dim + hk * dk + d) = *(const float2 *)&Ks[rr * KP + d];
        }
    }
    // K̂K̂ᵀ and Q̂K̂ᵀ: thread (ri, ci) takes tokens 4ri .. 4ri+3 against ci, ci+16, ci+32, ci+48, each
    // sum in ascending d (d, then d + 1: two at a time)
    const int ri = tid >> 4, ci = tid & 15;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) kk[a][b] = qk[a][b] = 0.f;
    for (int d = 0; d < dk; d += 2) {
        float2 kr[4], qr[4], kc[4];
#pragma unroll
        for (int a = 0; a < 4; a++) kr[a] = *(const float2 *)&Ks[(ri * 4 + a) * KP + d], qr[a] = *(const float2 *)&Qs[(ri * 4 + a) * KP + d];
#pragma unroll
        for (int b = 0; b < 4; b++) kc[b] = *(const float2 *)&Ks[(ci + 16 * b) * KP + d];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) kk[a][b] += kr[a].x * kc[b].x, qk[a][b] += qr[a].x * kc[b].x;
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) kk[a][b] += kr[a].y * kc[b].y, qk[a][b] += qr[a].y * kc[b].y;
    }
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, tg = lane & 3;
    for (int h = 0; h < G; h++) {   // value head j = hk·G + h (the first's gates: gdn_piece_qk's)
        const int j = hk * G + h;
        if (h) {
            __syncthreads();   // the head before's T read out of Tt (and its γ, β no longer read)
            gdn_piece_gates(bb, aa, expf(vec_at(A_log, j)), vec_at(dt_bias, j), t, n, j, nv, bet, gam);
            __syncthreads();
            gdn_piece_gam(gam);
            __syncthreads();
        }
        float *tp = tm + ((size_t)q * nv + j) * GPU_GDN_TM, *mp = tp + GPU_GDN_C * GPU_GDN_C;
        // the walk's gates of the piece: β, e^{γ_{n−1} − γ_r}, e^{γ_r} (every r < C: past n β = 0, the
        // weights 1 and e^{γ_{n−1}}, as the walk computed them from γ itself)
        if (tid < GPU_GDN_C) {
            float *gp = mp + GPU_GDN_C * GPU_GDN_C;
            gp[tid] = bet[tid];
            gp[GPU_GDN_C + tid] = expf((float)(gam[n - 1] - gam[tid]));
            gp[2 * GPU_GDN_C + tid] = expf((float)gam[tid]);
        }
        // A_rj = β_r (k̂_r·k̂_j) D_rj (j < r) into A; M_rj = (q̂_r·k̂_j) D_rj (j ≤ r) out
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int rr = ri * 4 + a, jj = ci + 16 * b;
                float dec = jj <= rr ? expf((float)(gam[rr] - gam[jj])) : 0.f;
                A[rr * AP + jj] = jj < rr ? bet[rr] * kk[a][b] * dec : 0.f;
                mp[rr * GPU_GDN_C + jj] = qk[a][b] * dec;
            }
        __syncthreads();
        // T = (I + A)⁻¹ in blocks of 16 (A strictly lower triangular; rows past n, A's rows zero there,
        // stay the identity's). The four diagonal blocks T_ii = (I + A_ii)⁻¹ at once, by forward
        // substitution on the identity's columns (4 lanes a column share the sum over earlier rows of
        // the block, j ≡ part mod 4, added in a fixed butterfly order; 15 dependent rows); then the
        // blocks below, a diagonal of them at a time (16 d after 16 (d − 1)): T_ij = −T_ii Σ_{j≤k<i} A_ik T_kj,
        // block (i, j) by warp i − d of that diagonal (products: gdn_mma3t).
        for (int i = tid; i < GPU_GDN_C * GPU_GDN_C; i += GPU_GDN_NT)
            Tt[(i / GPU_GDN_C) * AP + i % GPU_GDN_C] = i / GPU_GDN_C == i % GPU_GDN_C ? 1.f : 0.f;
        __syncthreads();
        {
            const int part = tid & 3, c = tid >> 2, b0 = c & ~15;   // column c of diagonal block b0 / 16
            for (int rr = b0 + 1; rr < b0 + 16 && rr < n; rr++) {
                float acc = 0.f;
                for (int jj = b0 + part; jj < rr; jj += 4) acc += A[rr * AP + jj] * Tt[jj * AP + c];
                acc += __shfl_xor_sync(0xffffffffu, acc, 1);
                acc += __shfl_xor_sync(0xffffffffu, acc, 2);
                if (part == 0) Tt[rr * AP + c] -= acc;
                __syncwarp();   // a column's four lanes are one warp's: no other warp reads its T here
            }
        }
        __syncthreads();
        for (int d = 1; d < GPU_GDN_C / 16; d++) {
            const int bi = warp + d, bj = warp;   // block (bi, bj) of diagonal d, by warp bj
            if (bi < GPU_GDN_C / 16 && 16 * bi < n) {
                const int r0 = 16 * bi, c0 = 16 * bj;
                float w[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};   // W = Σ_k A_ik T_kj, two tiles of 8 columns
                for (int k0 = c0; k0 < r0; k0 += 8) {
                    float a[4];
                    gdn_a(a, A, AP, r0, k0, g, tg);
                    const gdn_af af = gdn_asplit(a);
                    const float b0[2] = {Tt[(k0 + tg) * AP + c0 + g], Tt[(k0 + tg) * AP + c0 + 8 + g]};
                    const float b1[2] = {Tt[(k0 + tg + 4) * AP + c0 + g], Tt[(k0 + tg + 4) * AP + c0 + 8 + g]};
                    gdn_mma3t(w, af, b0, b1);
                }
                // W into block (bi, bj) (still zero, read by no one else this diagonal), then T_ij = −T_ii W
                // over it: every read of W before any write
#pragma unroll
                for (int b = 0; b < 2; b++)
#pragma unroll
                    for (int q = 0; q < 4; q++) Tt[(r0 + g + 8 * (q >> 1)) * AP + c0 + 8 * b + 2 * tg + (q & 1)] = w[b][q];
                __syncwarp();
                float x[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int k0 = 0; k0 < 16; k0 += 8) {
                    float a[4];
                    gdn_a(a, Tt + r0, AP, r0, k0, g, tg);   // T_ii: rows r0 .., columns r0 + k0 ..
                    const gdn_af af = gdn_asplit(a);
                    const float b0[2] = {Tt[(r0 + k0 + tg) * AP + c0 + g], Tt[(r0 + k0 + tg) * AP + c0 + 8 + g]};
                    const float b1[2] = {Tt[(r0 + k0 + tg + 4) * AP + c0 + g], Tt[(r0 + k0 + tg + 4) * AP + c0 + 8 + g]};
                    gdn_mma3t(x, af, b0, b1);
                }
                __syncwarp();
#pragma unroll
                for (int b = 0; b < 2; b++)
#pragma unroll
                    for (int q = 0; q < 4; q++) Tt[(r0 + g + 8 * (q >> 1)) * AP + c0 + 8 * b + 2 * tg + (q & 1)] = -x[b][q];
            }
            __syncthreads();
        }
        for (int i = tid; i < GPU_GDN_C * GPU_GDN_C; i += GPU_GDN_NT) tp[i] = Tt[(i / GPU_GDN_C) * AP + i % GPU_GDN_C];
    }
}

// The walk's copies of a piece (n ≥ 2 tokens from token t, k_gdn_prep's tm at tp) by cp.async, issued,
// not committed: its values V into U (zeros past n and past dv), its T into A (unless lean: copied
// after step 3), its gates β, e^{γ_{n−1} − γ}, e^γ into bet, wl, eg (tm's order: one copy), and q̂,
// k̂ as k_gdn_prep left them in qkv into Qs, Ks (16 bytes a copy where qk16)
__device__ __forceinline__ void gdn_piece_copy(const float *__restrict__ qkv, int cd, const float *__restrict__ tp, int t, int n, int j, int hk,
                                               int dk, int dv, int v0, int key_dim, int KP, bool qk16, bool lean, float *U, float *A,
                                               float *bet, float *Qs, float *Ks) {
    const int tid = threadIdx.x;
    for (int i = tid; i < GPU_GDN_C * GPU_GDN_VC; i += GPU_GDN_NT) {
        const int rr = i / GPU_GDN_VC, c = i % GPU_GDN_VC, ok = rr < n && v0 + c < dv;
        mm_cp<4>(&U[gdn_sw(rr, c)], qkv + (ok ? (size_t)(t + rr) * cd + 2 * key_dim + j * dv + v0 + c : 0), ok);
    }
    if (!lean) gdn_copy_tsw(A, tp);
    if (tid < 3 * GPU_GDN_C / 4) mm_cp<16>(&bet[4 * tid], tp + 2 * GPU_GDN_C * GPU_GDN_C + 4 * tid, true);
    if (qk16) gdn_piece_copy_qk<4>(qkv, cd, t, n, hk, dk, key_dim, KP, Qs, Ks);
    else gdn_piece_copy_qk<2>(qkv, cd, t, n, hk, dk, key_dim, KP, Qs, Ks);
}

// The walk (see the top). Shared memory (gpu_gdn_chunk_smem), k̂ and q̂'s rows padded to 4 mod 32
// floats, S and U swizzled by gdn_sw, T and M by gdn_tsw, so that every fragment load meets 32
// banks (the transposed k̂ reads of step 6 two-way):
//   k̂, q̂ [C, dk + 4]; S [dk, VC]; T [C, C], copied with V, q, k and the gates; M [C, C] in q̂'s
//   place (copied after step 3) where dk ≥ C, else after T; U [C, VC] (V, then R, then U); the
//   gates β, e^{γ_{n−1} − γ_r}, e^γ [C] (tm's order: one copy); single-token scratch q, k [dk].
//   lean (gpu_gdn_layout: where that does not fit a block, as the 99 KiB of sm_120 / sm_121): no
//   array of T — T and M both copied into q̂'s place after step 3 (dk + 4 ≥ 2C), T waited for
//   before step 4: the same values in the same places of each product, so the same bits.
//   ahead (form & GPU_GDN_AHEAD; not lean, dk ≥ C; where a grid has at most one block a
//   multiprocessor, so shared memory is there to spare: one prompt): two sets of k̂, q̂ (M in its place),
//   T, U and the gates, a piece's in one while the next piece's copies — issued at the piece's start
//   into the other, unless that piece has a single token — land during its steps 3 and 4 instead of
//   at its own start; then S and the scratch. The same values in the same places: the same bits.
// Warps: step 3 warp w takes rows 16 (w mod 4) .. + 15 of both k̂ and q̂ against column tiles
// 2 ⌊w / 4⌋, 2 ⌊w / 4⌋ + 1 (8 columns each) of the block's four; step 4 warp w rows 16 ⌊w / 2⌋,
// columns 16 (w mod 2); step 5 (outputs) every warp its step-3 rows and tiles, their q̂ S₀ still in
// registers; step 6 (state) warp w rows d 16 w .. (no barrier between 5 and 6: a warp done with its
// outputs, fewer where its rows are early, goes on to the state). Which warp takes a tile changes
// no sum: each element's products and their order are the tile's.
extern "C" __global__ void __launch_bounds__(GPU_GDN_NT, 2) k_gdn_chunk(const float *__restrict__ qkv, int cd, const float *__restrict__ bb,
                                                                     const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,
                                                                     float *__restrict__ S_base, long long S_slot_stride,
                                                                     float *__restrict__ o, int nk, int nv, int dk, int dv,
                                                                     const int *__restrict__ row_slot, const int *__restrict__ row_start,
                                                                     const int *__restrict__ row_len, const int *__restrict__ row_pos,
                                                                     const int *__restrict__ rows, const float *__restrict__ tm,
                                                                     const int *__restrict__ piece0, int form) {
    GPU_DEP();
    extern __shared__ float4 smw[];
    const int KP = dk + 4, lean = form & GPU_GDN_LEAN, ahead = form & GPU_GDN_AHEAD;
    float *Ks = (float *)smw;             // [GPU_GDN_C, KP] k̂ of the piece
    float *Qs = Ks + GPU_GDN_C * KP;      // [GPU_GDN_C, KP] q̂
    float *S = Qs + GPU_GDN_C * KP;       // [dk, GPU_GDN_VC] the state's columns (gdn_sw)
    float *A = lean ? Qs : S + dk * GPU_GDN_VC;   // [GPU_GDN_C, GPU_GDN_C] T (k_gdn_prep's; gdn_tsw)
    float *M = lean ? Qs + GPU_GDN_C * GPU_GDN_C : dk >= GPU_GDN_C ? Qs : A + GPU_GDN_C * GPU_GDN_C;   // [C, C]: in Q̂'s place where it fits
    float *U = S + dk * GPU_GDN_VC + (lean ? 0 : dk >= GPU_GDN_C ? 1 : 2) * GPU_GDN_C * GPU_GDN_C;   // [GPU_GDN_C, GPU_GDN_VC] (gdn_sw)
    float *bet = U + GPU_GDN_C * GPU_GDN_VC;   // [GPU_GDN_C] β (k_gdn_prep's gates: β, wl, eg as tm holds them)
    float *tq = bet + 3 * GPU_GDN_C;      // [dk] q scratch of single-token pieces
    // the ahead form (GPU_GDN_AHEAD: not lean, dk ≥ C): two sets of a piece's arrays, set s at
    // GDN_SET floats · s, each k̂, q̂ (M in its place), T, U, the gates; then S and the scratch
    const int GDN_SET = 2 * GPU_GDN_C * KP + GPU_GDN_C * GPU_GDN_C + GPU_GDN_C * GPU_GDN_VC + 3 * GPU_GDN_C;
    if (ahead) S = (float *)smw + 2 * GDN_SET, tq = S + dk * GPU_GDN_VC;
    float *tk = tq + dk;                  // [dk] k scratch
    int sb = 0, have = 0;   // the ahead form: the current piece's set (sb), and whether its copies were issued (a piece before)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tg = lane & 3;
    const int j = blockIdx.x, r = rows[blockIdx.y], v0 = blockIdx.z * GPU_GDN_VC;
    const int v = v0 + lane, live = v < dv, hk = j / (nv / nk), key_dim = nk * dk;
    float *Sg = S_base + (size_t)row_slot[r] * S_slot_stride + (size_t)j * dk * dv;
    for (int i = tid; i < dk * GPU_GDN_VC; i += GPU_GDN_NT) {
        int d = i / GPU_GDN_VC, c = i % GPU_GDN_VC;
        S[gdn_sw(d, c)] = v0 + c < dv ? Sg[(size_t)d * dv + v0 + c] : 0.f;
    }
    const float Aexp = expf(vec_at(A_log, j)), dtb = vec_at(dt_bias, j);   // (single-token pieces)
    const float qscale = 1.f / sqrtf((float)dk);
    const bool qk16 = gdn_qk16(qkv, cd);   // q̂, k̂ copied 16 bytes a copy (KP = dk + 4: rows 16-byte aligned)
    // a thread's fixed parts of its fragments' shared-memory indices (C: g = lane / 4, t = lane % 4):
    // S and U rows k0 + t and k0 + t + 4 (k0 a multiple of 8) have d mod 4 = t, so gdn_sw puts column
    // 8b + g of both at 8 (b ^ t) + g — the same for every k0 (so = row t's, then + k0 · VC)
    const int so = tg * GPU_GDN_VC + g, sc0 = 8 * (0 ^ tg), sc1 = 8 * (1 ^ tg), sc2 = 8 * (2 ^ tg), sc3 = 8 * (3 ^ tg);
    const int scb0 = 8 * ((2 * (warp >> 2)) ^ tg), scb1 = 8 * ((2 * (warp >> 2) + 1) ^ tg);   // steps 3 and 5: the warp's tiles cb, cb + 1
    int t = row_start[r], end = t + row_len[r], p = row_pos[r], pc = piece0[blockIdx.y];   // pc: the piece's number (tm)
    __syncthreads();
    while (t < end) {
        int n = GPU_GDN_C - p % GPU_GDN_C;
        if (n > end - t) n = end - t;
        if (n == 1) {   // the recurrent update, by warp 0
            if (warp == 0) {
                const float *row = qkv + (size_t)t * cd;
                float beta, gg;
                gdn_gates(bb[(size_t)t * nv + j], aa[(size_t)t * nv + j], Aexp, dtb, &beta, &gg);
                float vt = live ? row[2 * key_dim + j * dv + v] : 0.f;
                float out = gdn_token<true>(S, tq, tk, row, key_dim, hk, dk, vt, beta, gg, qscale, lane);
                if (live) o[(size_t)t * nv * dv + (size_t)j * dv + v] = out;
            }
            __syncthreads();
            t += 1, p += 1, pc += 1;
            continue;
        }
        // 0–1. by cp.async, one group: the piece's V, T (unless lean), gates, q̂ and k̂ (gdn_piece_copy) —
        //      in the ahead form into set sb, unless a piece before issued them, and the next piece's
        //      (of two tokens or more) into set sb ^ 1, waited for only before step 5
        const float *tp = tm + ((size_t)pc * nv + j) * GPU_GDN_TM;
        if (ahead) {
            Ks = (float *)smw + sb * GDN_SET, Qs = Ks + GPU_GDN_C * KP, A = Qs + GPU_GDN_C * KP, U = A + GPU_GDN_C * GPU_GDN_C;
            M = Qs, bet = U + GPU_GDN_C * GPU_GDN_VC;
        }
        if (!have) {
            gdn_piece_copy(qkv, cd, tp, t, n, j, hk, dk, dv, v0, key_dim, KP, qk16, lean, U, A, bet, Qs, Ks);
            mm_cp_commit();
        }
        int nn = 0;   // the next piece's tokens (ahead form)
        if (ahead && t + n < end) nn = min(GPU_GDN_C - (p + n) % GPU_GDN_C, end - t - n);
        if (nn >= 2) {
            float *K2 = (float *)smw + (sb ^ 1) * GDN_SET, *Q2 = K2 + GPU_GDN_C * KP, *A2 = Q2 + GPU_GDN_C * KP, *U2 = A2 + GPU_GDN_C * GPU_GDN_C;
            gdn_piece_copy(qkv, cd, tp + (size_t)nv * GPU_GDN_TM, t + n, nn, j, hk, dk, dv, v0, key_dim, KP, qk16, false, U2, A2,
                           U2 + GPU_GDN_C * GPU_GDN_VC, Q2, K2);
            mm_cp_commit();
            mm_cp_wait<1>();   // (the current piece's group, where it is not done already)
        } else
            mm_cp_wait<0>();
        const float *wl = bet + GPU_GDN_C, *eg = wl + GPU_GDN_C;   // e^{γ_{n−1} − γ_r}, e^{γ_r} [GPU_GDN_C]
        __syncthreads();
        // 3. K̂ S₀ and Q̂ S₀: warp w rows m0 .. m0 + 15 of both (m0 = 16 (w mod 4)), column tiles
        //    cb, cb + 1 of the block's four (cb = 2 ⌊w / 4⌋): the two products share each k-step's B
        //    values, and step 5's outputs then fall to every warp, not to half of them
        const int m0 = 16 * (warp & 3), cb = 2 * (warp >> 2);
        float ak[2][4], aq[2][4];   // K̂ S₀ (then R), Q̂ S₀ (then e^γ Q̂ S₀ + M U): tiles cb, cb + 1
#pragma unroll
        for (int b = 0; b < 2; b++)
#pragma unroll
            for (int q = 0; q < 4; q++) ak[b][q] = aq[b][q] = 0.f;
        if (m0 < n) {
            const int xo = (m0 + g) * KP + tg;   // A: gdn_a's X[(m0 + g (+ 8)) · KP + k0 + t (+ 4)]
            for (int k1 = 0; k1 < dk; k1 += 16)   // (dk a multiple of 16)
#pragma unroll
                for (int k0 = k1; k0 < k1 + 16; k0 += 8) {
                    const float a[4] = {Ks[xo + k0], Ks[xo + 8 * KP + k0], Ks[xo + k0 + 4], Ks[xo + 8 * KP + k0 + 4]};
                    const float e[4] = {Qs[xo + k0], Qs[xo + 8 * KP + k0], Qs[xo + k0 + 4], Qs[xo + 8 * KP + k0 + 4]};
                    const float *Sk = S + so + k0 * GPU_GDN_VC, *Sk4 = Sk + 4 * GPU_GDN_VC;   // gdn_sw (k0 + t (+ 4), 8b + g)
                    const float b0[2] = {Sk[scb0], Sk[scb1]}, b1[2] = {Sk4[scb0], Sk4[scb1]};
                    gdn_mma3t2(ak, aq, gdn_asplit(a), gdn_asplit(e), b0, b1);
                }
        }
        // R = diag(β)(V − diag(e^γ) K̂ S₀) in place of V (each element its own thread's); e^γ Q̂ S₀
        // stays in aq for step 5
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int rr = m0 + g + 8 * h;
            const float e = eg[rr];
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const int ui = gdn_sw(rr, 8 * (cb + b) + 2 * tg + q);
                    U[ui] = bet[rr] * (U[ui] - e * ak[b][2 * h + q]);
                    aq[b][2 * h + q] *= e;
                }
        }
        __syncthreads();   // every read of Q̂ done: M (k_gdn_prep's) may take its place, copied during step 4
        if (lean) {   // T too, waited for
            gdn_copy_tsw(A, tp);
            mm_cp_commit();
        }
        gdn_copy_tsw(M, tp + GPU_GDN_C * GPU_GDN_C);
        mm_cp_commit();
        if (lean) {
            mm_cp_wait<1>();   // T (M may still be on its way)
            __syncthreads();
        }
        // 4. U = T R: warp w rows 16 ⌊w / 2⌋ .., columns 16 (w mod 2) .. (T lower triangular: the
        //    k-steps up to its rows' diagonal and n), all read before any is written
        {
            const int mt = 16 * (warp >> 1), nt = 16 * (warp & 1);
            float u[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            if (mt < n)
                for (int k0 = 0; k0 < mt + 16 && k0 < n; k0 += 8) {
                    float a[4];
                    gdn_a_tsw(a, A, mt, k0, g, tg);
                    const gdn_af af = gdn_asplit(a);
                    const float b0[2] = {U[gdn_sw(k0 + tg, nt + g)], U[gdn_sw(k0 + tg, nt + 8 + g)]};
                    const float b1[2] = {U[gdn_sw(k0 + tg + 4, nt + g)], U[gdn_sw(k0 + tg + 4, nt + 8 + g)]};
                    gdn_mma3t(u, af, b0, b1);
                }
            __syncthreads();
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int rr = mt + g + 8 * (i >> 1);
                    if (rr < n) U[gdn_sw(rr, nt + 8 * b + 2 * tg + (i & 1))] = u[b][i];
                }
        }
        mm_cp_wait<0>();   // M (and the next piece's copies in the ahead form)
        __syncthreads();
        // 5. outputs O = e^γ Q̂ S₀ + M U (every warp: its step-3 rows and column tiles, their e^γ Q̂ S₀
        //    still in aq; M lower triangular)
        if (m0 < n) {
            for (int k0 = 0; k0 < m0 + 16 && k0 < n; k0 += 8) {
                float a[4];
                gdn_a_tsw(a, M, m0, k0, g, tg);
                const gdn_af af = gdn_asplit(a);
                const float *Uk = U + so + k0 * GPU_GDN_VC, *Uk4 = Uk + 4 * GPU_GDN_VC;   // gdn_sw (k0 + t (+ 4), 8b + g)
                const float b0[2] = {Uk[scb0], Uk[scb1]}, b1[2] = {Uk4[scb0], Uk4[scb1]};
                gdn_mma3t(aq, af, b0, b1);
            }
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int rr = m0 + g + 8 * (i >> 1), c = v0 + 8 * (cb + b) + 2 * tg + (i & 1);
                    if (rr < n && c < dv) o[(size_t)(t + rr) * nv * dv + (size_t)j * dv + c] = aq[b][i];
                }
        }
        // 6. S ← e^{γ_{n−1}} S₀ + K̂ᵀ diag(e^{γ_{n−1} − γ}) U: warp w rows d 16 w .. + 15 (and 16 (w + 8) ..
        //    where dk > 128), the block's 32 columns; k̂ᵀ's fragment split once for the four column tiles
        {
            const float el = eg[n - 1];
            for (int d0 = 16 * warp; d0 < dk; d0 += 16 * (GPU_GDN_NT / WARP)) {
                float sa[4][4];
#pragma unroll
                for (int b = 0; b < 4; b++) sa[b][0] = sa[b][1] = sa[b][2] = sa[b][3] = 0.f;
                const float *ka = Ks + tg * KP + d0 + g;   // gdn_at's A: Ks[(k0 + t (+ 4)) · KP + d0 + g (+ 8)]
#pragma unroll 2
                for (int k0 = 0; k0 < n; k0 += 8, ka += 8 * KP) {
                    const float a[4] = {ka[0], ka[8], ka[4 * KP], ka[4 * KP + 8]};
                    const gdn_af af = gdn_asplit(a);
                    const float w0 = wl[k0 + tg], w1 = wl[k0 + tg + 4];
                    const float *Uk = U + so + k0 * GPU_GDN_VC, *Uk4 = Uk + 4 * GPU_GDN_VC;   // gdn_sw (k0 + t (+ 4), 8b + g)
                    const float b0[4] = {w0 * Uk[sc0], w0 * Uk[sc1], w0 * Uk[sc2], w0 * Uk[sc3]};
                    const float b1[4] = {w1 * Uk4[sc0], w1 * Uk4[sc1], w1 * Uk4[sc2], w1 * Uk4[sc3]};
                    gdn_mma3t(sa, af, b0, b1);
                }
#pragma unroll
                for (int b = 0; b < 4; b++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int si = gdn_sw(d0 + g + 8 * (q >> 1), 8 * b + 2 * tg + (q & 1));
                        S[si] = el * S[si] + sa[b][q];
                    }
            }
        }
        __syncthreads();
        t += n, p += n, pc += 1;
        have = nn >= 2, sb ^= have;
    }
    if (live)
        for (int d = 0; d < dk; d++) Sg[(size_t)d * dv + v] = S[gdn_sw(d, lane)];
}
