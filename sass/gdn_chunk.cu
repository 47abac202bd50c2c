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
//   R = diag(β) (V − diag(e^γ) K̂ S₀);    solve (I + A) U = R  (forward substitution; U's rows
//                                          are the recurrence's corrections u_r)
//   O = diag(e^γ) Q̂ S₀ + M U;            S ← e^{γ_{n−1}} S₀ + Σ_r e^{γ_{n−1} − γ_r} k̂_r u_rᵀ
// Only differences γ_r − γ_j ≤ 0 are exponentiated, so a strong decay underflows to 0, never
// overflows; γ is summed in f64, so a difference of two large γ (after a strong decay) keeps
// the precision of an f32 difference. Value columns evolve on their own: a block takes GPU_GDN_VC
// columns of one head of one row, holds them in shared memory over the row's pieces, and repeats
// the (cheap) q̂/k̂ work.
// CPU twin: ref_gdn_chunk (moet.c).
// In/out as k_gdn_rule, plus row_pos. Rows: rows[0 .. gridDim.y).
// Launch (gpu_k_gdn_chunk): block GPU_GDN_NT threads, grid (nv, rows, ceil(dv / GPU_GDN_VC)),
// dynamic shared memory gpu_gdn_chunk_smem(dk) bytes (gpu/kernels.c: the sum of the arrays below).
#include "gdn.cuh"

extern "C" __global__ void __launch_bounds__(GPU_GDN_NT, 2) k_gdn_chunk(const float *__restrict__ qkv, int cd, const float *__restrict__ bb,
                                                                     const float *__restrict__ aa, gpu_mat A_log, gpu_mat dt_bias,
                                                                     float *__restrict__ S_base, long long S_slot_stride,
                                                                     float *__restrict__ o, int nk, int nv, int dk, int dv,
                                                                     const int *__restrict__ row_slot, const int *__restrict__ row_start,
                                                                     const int *__restrict__ row_len, const int *__restrict__ row_pos,
                                                                     const int *__restrict__ rows) {
    GPU_DEP();
    extern __shared__ double smd[];
    // padded row strides, no bank conflicts: k̂ and q̂ rows 2 banks apart (dk even: steps 2 and 3
    // read two consecutive d at once, 8-byte aligned), A, M and U rows 1 apart
    const int KP = dk + 2, AP = GPU_GDN_C + 1, UP = GPU_GDN_VC + 1;
    double *gam = smd;                    // [GPU_GDN_C] γ
    float *sm = (float *)(smd + GPU_GDN_C);
    float *Ks = sm;                       // [GPU_GDN_C, KP] k̂ of the piece
    float *Qs = Ks + GPU_GDN_C * KP;      // [GPU_GDN_C, KP] q̂
    float *S = Qs + GPU_GDN_C * KP;       // [dk, GPU_GDN_VC] the state's columns
    float *A = S + dk * GPU_GDN_VC;       // [GPU_GDN_C, AP]
    float *M = dk >= GPU_GDN_C ? Qs : A + GPU_GDN_C * AP;   // [GPU_GDN_C, AP]: in Q̂'s place once Q̂ is read where it fits (AP ≤ KP)
    float *U = A + GPU_GDN_C * AP + (dk >= GPU_GDN_C ? 0 : GPU_GDN_C * AP);   // [GPU_GDN_C, UP] V, then R, then U
    float *bet = U + GPU_GDN_C * UP;      // [GPU_GDN_C] β
    float *wl = bet + GPU_GDN_C;          // [GPU_GDN_C] e^{γ_{n−1} − γ_r}
    float *eg = wl + GPU_GDN_C;           // [GPU_GDN_C] e^{γ_r} (for step 6)
    float *tq = eg + GPU_GDN_C;           // [dk] q scratch of single-token pieces
    float *tk = tq + dk;                  // [dk] k scratch
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = blockIdx.x, r = rows[blockIdx.y], v0 = blockIdx.z * GPU_GDN_VC;
    const int v = v0 + lane, live = v < dv, hk = j / (nv / nk), key_dim = nk * dk;
    float *Sg = S_base + (size_t)row_slot[r] * S_slot_stride + (size_t)j * dk * dv;
    for (int i = tid; i < dk * GPU_GDN_VC; i += GPU_GDN_NT) {
        int d = i / GPU_GDN_VC, c = i % GPU_GDN_VC;
        S[i] = v0 + c < dv ? Sg[(size_t)d * dv + v0 + c] : 0.f;
    }
    const float Aexp = expf(vec_at(A_log, j)), dtb = vec_at(dt_bias, j);
    const float qscale = 1.f / sqrtf((float)dk);
    int t = row_start[r], end = t + row_len[r], p = row_pos[r];
    __syncthreads();
    while (t < end) {
        int n = GPU_GDN_C - p % GPU_GDN_C;
        if (n > end - t) n = end - t;
        if (n == 1) {   // the recurrent update, by warp 0
            if (warp == 0) {
                const float *row = qkv + (size_t)t * cd;
                float beta, g;
                gdn_gates(bb[(size_t)t * nv + j], aa[(size_t)t * nv + j], Aexp, dtb, &beta, &g);
                float vt = live ? row[2 * key_dim + j * dv + v] : 0.f;
                float out = gdn_token(S, tq, tk, row, key_dim, hk, dk, vt, beta, g, qscale, lane);
                if (live) o[(size_t)t * nv * dv + (size_t)j * dv + v] = out;
            }
            __syncthreads();
            t += 1, p += 1;
            continue;
        }
        // 0. the piece's q, k (zero rows past n), its values V into U, β and g
        for (int i = tid; i < GPU_GDN_C * dk; i += GPU_GDN_NT) {
            int rr = i / dk, d = i % dk;
            float qv = 0.f, kv = 0.f;
            if (rr < n) {
                const float *row = qkv + (size_t)(t + rr) * cd;
                qv = row[hk * dk + d];
                kv = row[key_dim + hk * dk + d];
            }
            Qs[rr * KP + d] = qv;
            Ks[rr * KP + d] = kv;
        }
        for (int i = tid; i < GPU_GDN_C * GPU_GDN_VC; i += GPU_GDN_NT) {
            int rr = i / GPU_GDN_VC, c = i % GPU_GDN_VC;
            U[rr * UP + c] = rr < n && v0 + c < dv ? qkv[(size_t)(t + rr) * cd + 2 * key_dim + j * dv + v0 + c] : 0.f;
        }
        if (tid < GPU_GDN_C) {
            float beta = 0.f, g = 0.f;   // padding rows: β = 0, g = 0 change nothing
            if (tid < n) gdn_gates(bb[(size_t)(t + tid) * nv + j], aa[(size_t)(t + tid) * nv + j], Aexp, dtb, &beta, &g);
            bet[tid] = beta;
            gam[tid] = (double)g;
        }
        __syncthreads();
        // 1. L2 norms (a warp per token) while thread 0 sums the log decays in token order
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
        if (tid == 0)
            for (int rr = 1; rr < GPU_GDN_C; rr++) gam[rr] += gam[rr - 1];
        __syncthreads();
        // 2. K̂K̂ᵀ and Q̂K̂ᵀ into registers: thread (ri, ci) takes tokens 4ri .. 4ri+3 against ci,
        //    ci+16, ci+32, ci+48 (A and M are written after step 3: M takes Q̂'s place)
        const int ri = tid >> 4, ci = tid & 15;
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) kk[a][b] = qk[a][b] = 0.f;
        for (int d = 0; d < dk; d += 2) {   // d, then d + 1: each sum in ascending d
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
        if (tid < GPU_GDN_C) wl[tid] = expf((float)(gam[n - 1] - gam[tid])), eg[tid] = expf((float)gam[tid]);
        // 3. R = diag(β)(V − diag(e^γ) K̂ S₀) in place of V, and e^γ Q̂ S₀ kept for the outputs:
        //    lane = column, warp w takes tokens w, w + 8, …
        float oq[GPU_GDN_C / 8];
        {
            float ks[GPU_GDN_C / 8], qs[GPU_GDN_C / 8];
#pragma unroll
            for (int m = 0; m < GPU_GDN_C / 8; m++) ks[m] = qs[m] = 0.f;
            for (int d = 0; d < dk; d++) {
                float s = S[d * GPU_GDN_VC + lane];
#pragma unroll
                for (int m = 0; m < GPU_GDN_C / 8; m++) {
                    int rr = warp + 8 * m;
                    ks[m] += Ks[rr * KP + d] * s;
                    qs[m] += Qs[rr * KP + d] * s;
                }
            }
#pragma unroll
            for (int m = 0; m < GPU_GDN_C / 8; m++) {
                int rr = warp + 8 * m;
                float e = expf((float)gam[rr]);   // as eg[rr], which is not synchronised yet
                U[rr * UP + lane] = bet[rr] * (U[rr * UP + lane] - e * ks[m]);
                oq[m] = e * qs[m];
            }
        }
        __syncthreads();   // every read of Q̂ done: M may take its place
        // 2'. A_rj = β_r (k̂_r·k̂_j) D_rj (j < r), M_rj = (q̂_r·k̂_j) D_rj (j ≤ r)
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int rr = ri * 4 + a, jj = ci + 16 * b;
                float dec = jj <= rr ? expf((float)(gam[rr] - gam[jj])) : 0.f;
                A[rr * AP + jj] = jj < rr ? bet[rr] * kk[a][b] * dec : 0.f;
                M[rr * AP + jj] = qk[a][b] * dec;
            }
        __syncthreads();
        // 4. (I + A) U = R by forward substitution, token after token: 8 lanes per column share
        //    the sum over earlier tokens (j ≡ part mod 8), added in a fixed butterfly order
        {
            const int c = tid >> 3, part = tid & 7;
            for (int rr = 1; rr < n; rr++) {
                float acc = 0.f;
                for (int jj = part; jj < rr; jj += 8) acc += A[rr * AP + jj] * U[jj * UP + c];
                acc += __shfl_xor_sync(0xffffffffu, acc, 1);
                acc += __shfl_xor_sync(0xffffffffu, acc, 2);
                acc += __shfl_xor_sync(0xffffffffu, acc, 4);
                if (part == 0) U[rr * UP + c] -= acc;
                __syncwarp();   // a column's eight lanes are one warp's: no other warp reads its U here
            }
        }
        __syncthreads();
        // 5. outputs O = e^γ Q̂ S₀ + M U
#pragma unroll
        for (int m = 0; m < GPU_GDN_C / 8; m++) {
            int rr = warp + 8 * m;
            if (rr >= n) continue;
            float acc = oq[m];
            for (int jj = 0; jj <= rr; jj++) acc += M[rr * AP + jj] * U[jj * UP + lane];
            if (live) o[(size_t)(t + rr) * nv * dv + (size_t)j * dv + v] = acc;
        }
        // 6. S ← e^{γ_{n−1}} S₀ + Σ_r e^{γ_{n−1} − γ_r} k̂_r u_rᵀ (lane = column, warp w rows d ≡ w mod 8,
        //    eight of them at a time: each token's weight and u loaded once for the eight)
        {
            const float el = eg[n - 1];
            for (int i0 = 0; warp + 8 * i0 < dk; i0 += 8) {
                float acc[8];
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] = 0.f;
                for (int rr = 0; rr < n; rr++) {
                    const float w = wl[rr], u = U[rr * UP + lane];
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const int d = warp + 8 * (i0 + i);
                        if (d < dk) acc[i] += w * Ks[rr * KP + d] * u;
                    }
                }
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const int d = warp + 8 * (i0 + i);
                    if (d < dk) S[d * GPU_GDN_VC + lane] = el * S[d * GPU_GDN_VC + lane] + acc[i];
                }
            }
        }
        __syncthreads();
        t += n, p += n;
    }
    if (live)
        for (int d = 0; d < dk; d++) Sg[(size_t)d * dv + v] = S[d * GPU_GDN_VC + lane];
}
