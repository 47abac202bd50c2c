// moet.c — the whole program as one translation unit (a unity build).
//
// moet serves qwen3_5_moe models (Qwen3.6-35B-A3B) with every routed expert as 2-bit planes
// read from one MOET2PF1 file. This file is the table of contents: it includes every module in
// dependency order, leaf modules first (arena/, format/), then holds the engine — the backend
// interface, the reference forward pass (the CPU backend), the sampler, the scheduler and
// serve loop — and the command line. Every function is static.
// Tests `#define MOET_TEST` and include this file to call the internals directly.

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <link.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

// defines: every fixed limit (MOET_MAX_*)
#include "arena/limits.h"
// defines: moet_err, err_set, MOET_ASSERT, moet_die, checked size arithmetic
#include "arena/base.c"
// defines: arena (measure / init / take), arena_map_file, the allocation counter
#include "arena/arena.c"
// defines: js_doc, js_measure, js_parse, js_get, js_writer (RFC 8259 JSON)
#include "format/json.c"
// defines: uni_props, uni_nfc (Unicode properties and NFC, tables from format/unicode_tables.h)
#include "format/unicode.c"
// defines: tok, tok_load, tok_encode, tok_decode, tok_decode_stream, tok_find, cmd_tokenize
#include "format/tokenizer.c"
// defines: st_set, st_open, st_find (safetensors shards: mmap + validation)
#include "format/safetensors.c"
// defines: ck_config, ck_model, ck_open, ck_mat + ck_row_f32/ck_row_f64 (exact weight decode)
#include "format/checkpoint.c"
// defines: pf_plan, pf_quant_expert, pf_build, pf_open, pf_read_slot, pf_verify_slots,
//          (MOET2PF1 2-bit expert plane file: layout, quantizer, writer, reader)
#include "format/planes.c"
// defines: pf_open_for_model, pf_expert_mats, cmd_build_planes, cmd_verify, cmd_info
#include "format/planes_cmd.c"
// defines: stw_begin, stw_write, stw_end (streaming safetensors writer)
#include "format/st_write.c"
// defines: cmd_synth (a random checkpoint of any qwen3_5_moe config, full size included)
#include "format/synth.c"

// ==========================================================================================
// engine backend: what the scheduler needs from a forward pass (the CPU reference, the GPU)
// ==========================================================================================
//
// A backend holds max_seqs sequence slots, each an independent token history of at most
// max_len tokens (KV pages / recurrent state live behind it). step() runs one batched
// forward: row i appends ids[off[i] .. off[i+1]) to slot slots[i] (a prefill chunk or one
// decode token; each slot appears at most once per step, off[0] = 0, every row non-empty)
// and writes the logits after that row's last token to logits[i * n_vocab ..] // [n, V] f32.
// Row results must not depend on the other rows of the step (batch invariance).
typedef struct {
    void *self;
    int n_vocab;      // logits per row
    int max_seqs;     // sequence slots
    int max_len;      // tokens per sequence (context limit)
    void (*reset)(void *self, int slot);   // slot becomes an empty sequence (position 0, zeroed state)
    // One batched step: for i in [0,n): append tokens ids[off[i] .. off[i+1]) to sequence slot slots[i]
    // and write the logits after its last appended token to logits[i * n_vocab ..]. Returns 0, or -1 with e set.
    int (*step)(void *self, int n, const int *slots, const int32_t *ids, const int *off, float *logits, moet_err *e);
} engine_backend;

// ==========================================================================================
// the reference forward pass: plain C, float32, weights decoded exactly (MODEL.md §3–4)
// ==========================================================================================
//
// This is the executable definition of the model: every GPU kernel is checked against it,
// and it is the backend that serves small models on machines without a GPU. It runs on the
// stored formats directly (ck_row_f32 decodes one weight row at a time from the mapping), so
// it needs no float copy of the model. Clear over fast: one loop nest per equation.
//
// Dimension letters: T tokens of the step, H hidden, V vocab, E experts, K top-k, I expert width.

// One worker's share of a matrix product: output rows [r0, r1).
typedef struct ref_linear_job {
    const ck_mat *W;
    const float *x;   // [T, ldx]
    float *y;         // [T, ldy]
    int T, ldx, ldy, r0, r1;
    float *row;       // [W->cols] this worker's decoded weight row
} ref_linear_job;

#define REF_STACK (256u << 10)   // bytes of a worker's stack: ref_linear_rows needs little

typedef struct {
    struct ref_engine_s *r;
    int index;   // its job, 1 .. threads − 1 (the caller runs job 0)
} ref_worker_arg;

typedef struct {
    int pos;        // tokens already in the sequence (the next token's RoPE position)
    float *k, *v;   // [n_full, max_len, kvh·hd] keys (after k_norm and RoPE) and values
    float *conv;    // [n_gdn, conv_k − 1, conv_dim] the last conv_k − 1 pre-conv inputs, oldest first
    float *ssm;     // [n_gdn, lv_heads, lk_dim, lv_dim] Gated DeltaNet state S (fp32)
} ref_seq;

typedef struct ref_engine_s {
    const ck_model *m;
    int max_seqs, max_len, max_tokens;  // slots, tokens per sequence, tokens per step
    int threads;                        // workers for the matrix products (1 = this thread)
    ref_seq *seqs;                      // [max_seqs]
    int *kind_index;                    // [L] index of the layer among full-attention or GDN layers
    // scratch of one step (Tm = max_tokens)
    float *x;        // [Tm, H] residual stream
    float *xn;       // [Tm, H] normed sublayer input
    float *y;        // [Tm, H] sublayer output
    float *proj;     // [Tm, max(2·nh·hd, conv_dim)] q|gate, or the GDN qkv (then conv output)
    float *kk, *vv;  // [Tm, kvh·hd]
    float *core;     // [Tm, max(nh·hd, value_dim)] attention or GDN output before the out projection
    float *zz;       // [Tm, value_dim] GDN output gate
    float *bb, *aa;  // [Tm, lv_heads] GDN beta / decay pre-activations
    float *rl;       // [Tm, E] router probabilities
    int *sel;        // [Tm, K] chosen experts, by descending weight
    float *selw;     // [Tm, K] their renormalised weights
    int *rows;       // [Tm] tokens routed to one expert
    float *rw;       // [Tm] their weights
    float *gx;       // [Tm, H] gathered expert inputs
    float *eg, *eu;  // [Tm, max(I, SI)] gate / up projections
    float *ed;       // [Tm, H] expert outputs
    float *wrow;     // [threads, max row] one decoded weight row per worker
    float *scores;   // [max_len] attention scores of one query
    float *tmp;      // [max(conv_dim, 2·lv_dim, ...)] per-token temporaries
    float *inv_freq; // [rot_dim / 2]
    // workers for the matrix products: threads − 1 pthreads started at init on stacks carved
    // from the engine's arena; a step hands them row ranges and waits (no allocation per call)
    struct ref_linear_job *jobs;   // [threads]
    uint8_t *stacks;               // [threads − 1, REF_STACK]
    pthread_t tid[MOET_MAX_THREADS];
    ref_worker_arg wargs[MOET_MAX_THREADS];
    int n_workers;                 // started
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;                  // bumped per dispatched product
    int pending;                   // workers still on the current product
    int stop;
    int32_t **trace_ids; // NULL, or [L] buffers [T, K] receiving each layer's router choices (tests)
    float **trace_w;     // NULL, or [L] buffers [T, K] receiving their weights
    arena mem;
} ref_engine;

static int ref_max_row(const ck_config *c) {
    int r = c->hidden;
    int cand[] = {c->n_heads * c->head_dim, c->value_dim, c->inter, c->shared_inter, c->conv_dim};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) if (cand[i] > r) r = cand[i];
    return r;
}

#define REF_TAKE(a, ptr, count, what) ((ptr) = arena_take((a), sizeof(*(ptr)) * (size_t)(count), 64, (what)))

// Carves every buffer; run once on a measuring arena (sizes only) and once on the real one.
static void ref_carve(ref_engine *r, arena *a) {
    const ck_config *c = &r->m->cfg;
    size_t Tm = (size_t)r->max_tokens, H = (size_t)c->hidden;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t projw = (size_t)(2 * c->n_heads * c->head_dim > c->conv_dim ? 2 * c->n_heads * c->head_dim : c->conv_dim);
    size_t corew = (size_t)(c->n_heads * c->head_dim > c->value_dim ? c->n_heads * c->head_dim : c->value_dim);
    size_t ew = (size_t)(c->inter > c->shared_inter ? c->inter : c->shared_inter);
    REF_TAKE(a, r->seqs, r->max_seqs, "sequence table");
    REF_TAKE(a, r->kind_index, c->n_layers, "layer index");
    for (int s = 0; s < r->max_seqs; s++) {
        ref_seq *q = a->base ? &r->seqs[s] : &(ref_seq){0};
        REF_TAKE(a, q->k, (size_t)c->n_full * r->max_len * kvd, "KV cache keys");
        REF_TAKE(a, q->v, (size_t)c->n_full * r->max_len * kvd, "KV cache values");
        REF_TAKE(a, q->conv, (size_t)c->n_gdn * (c->conv_k - 1) * c->conv_dim, "conv windows");
        REF_TAKE(a, q->ssm, (size_t)c->n_gdn * c->lv_heads * c->lk_dim * c->lv_dim, "GDN states");
    }
    REF_TAKE(a, r->x, Tm * H, "residual");
    REF_TAKE(a, r->xn, Tm * H, "normed input");
    REF_TAKE(a, r->y, Tm * H, "sublayer output");
    REF_TAKE(a, r->proj, Tm * projw, "projections");
    REF_TAKE(a, r->kk, Tm * kvd, "keys");
    REF_TAKE(a, r->vv, Tm * kvd, "values");
    REF_TAKE(a, r->core, Tm * corew, "mixer output");
    REF_TAKE(a, r->zz, Tm * c->value_dim, "GDN gate");
    REF_TAKE(a, r->bb, Tm * c->lv_heads, "GDN beta");
    REF_TAKE(a, r->aa, Tm * c->lv_heads, "GDN decay");
    REF_TAKE(a, r->rl, Tm * c->n_experts, "router");
    REF_TAKE(a, r->sel, Tm * c->topk, "routing");
    REF_TAKE(a, r->selw, Tm * c->topk, "routing weights");
    REF_TAKE(a, r->rows, Tm, "expert rows");
    REF_TAKE(a, r->rw, Tm, "expert row weights");
    REF_TAKE(a, r->gx, Tm * H, "expert inputs");
    REF_TAKE(a, r->eg, Tm * ew, "expert gate");
    REF_TAKE(a, r->eu, Tm * ew, "expert up");
    REF_TAKE(a, r->ed, Tm * H, "expert output");
    REF_TAKE(a, r->wrow, (size_t)r->threads * ref_max_row(c), "weight rows");
    REF_TAKE(a, r->scores, r->max_len, "attention scores");
    REF_TAKE(a, r->tmp, 2 * (size_t)(c->conv_dim > 2 * c->lv_dim ? c->conv_dim : 2 * c->lv_dim), "temporaries");
    REF_TAKE(a, r->inv_freq, c->rot_dim / 2, "rotary frequencies");
    REF_TAKE(a, r->jobs, r->threads, "worker jobs");
    r->stacks = arena_take(a, (size_t)(r->threads - 1) * REF_STACK, 4096, "worker stacks");
}

static void ref_reset(ref_engine *r, int slot) {
    const ck_config *c = &r->m->cfg;
    ref_seq *q = &r->seqs[slot];
    q->pos = 0;
    memset(q->conv, 0, sizeof(float) * (size_t)c->n_gdn * (c->conv_k - 1) * c->conv_dim);
    memset(q->ssm, 0, sizeof(float) * (size_t)c->n_gdn * c->lv_heads * c->lk_dim * c->lv_dim);
}

// Σ a[i]·b[i] in float32 over 8 interleaved lanes (vectorisable without reassociation flags),
// lanes added in f64. The order is fixed, so a result never depends on the batch or threads.
typedef float ref_v8 __attribute__((vector_size(32)));
static float ref_dot(const float *a, const float *b, int n) {
    ref_v8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        ref_v8 x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        acc += x * y;
    }
    double s = 0;
    for (int j = 0; j < 8; j++) s += acc[j];
    for (; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}


static void ref_linear_rows(const ref_linear_job *j) {
    for (int o = j->r0; o < j->r1; o++) {
        ck_row_f32(j->W, o, j->row);
        for (int t = 0; t < j->T; t++) j->y[(size_t)t * j->ldy + o] = ref_dot(j->row, j->x + (size_t)t * j->ldx, j->W->cols);
    }
}

// A worker: waits for a new product (gen), runs its share, reports, until stop.
static void *ref_worker(void *arg) {
    ref_engine *r = ((ref_worker_arg *)arg)->r;
    int me = ((ref_worker_arg *)arg)->index;
    uint64_t seen = 0;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->gen == seen) pthread_cond_wait(&r->go, &r->mu);
        if (r->stop) break;
        seen = r->gen;
        pthread_mutex_unlock(&r->mu);
        ref_linear_rows(&r->jobs[me]);
        pthread_mutex_lock(&r->mu);
        if (--r->pending == 0) pthread_cond_signal(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void ref_free(ref_engine *r) {
    if (r->n_workers) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->go);
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < r->n_workers; i++) pthread_join(r->tid[i], NULL);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->go);
        pthread_cond_destroy(&r->done);
        r->n_workers = 0;
    }
    arena_release(&r->mem);
}

// Plans and allocates an engine for max_seqs sequences of max_len tokens, steps of at most
// max_tokens tokens, matrix products on `threads` workers.
static int ref_init(ref_engine *r, const ck_model *m, int max_seqs, int max_len, int max_tokens, int threads, moet_err *e) {
    memset(r, 0, sizeof *r);
    r->m = m;
    r->max_seqs = max_seqs;
    r->max_len = max_len;
    r->max_tokens = max_tokens;
    r->threads = threads < 1 ? 1 : threads > MOET_MAX_THREADS ? MOET_MAX_THREADS : threads;
    if (max_seqs < 1 || max_len < 1 || max_tokens < 1) return err_set(e, "engine sizes must be positive");
    arena plan = arena_measure("reference engine");
    ref_carve(r, &plan);
    if (arena_init(&r->mem, "reference engine", plan.used, e)) return -1;
    ref_carve(r, &r->mem);
    arena_done(&r->mem);
    const ck_config *c = &m->cfg;
    int nf = 0, ng = 0;
    for (int l = 0; l < c->n_layers; l++) r->kind_index[l] = c->full_attn[l] ? nf++ : ng++;
    // transformers: inv_freq = 1 / theta^(arange(0, d, 2) / d), all in float32
    for (int i = 0; i < c->rot_dim / 2; i++)
        r->inv_freq[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->rot_dim);
    for (int s = 0; s < max_seqs; s++) ref_reset(r, s);
    if (r->threads > 1) {
        pthread_mutex_init(&r->mu, NULL);
        pthread_cond_init(&r->go, NULL);
        pthread_cond_init(&r->done, NULL);
        for (int i = 0; i < r->threads - 1; i++) {
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setstack(&at, r->stacks + (size_t)i * REF_STACK, REF_STACK);
            r->wargs[i] = (ref_worker_arg){r, i + 1};
            int rc = pthread_create(&r->tid[i], &at, ref_worker, &r->wargs[i]);
            pthread_attr_destroy(&at);
            if (rc) {
                ref_free(r);
                return err_set(e, "cannot start worker thread %d: %s", i + 1, strerror(rc));
            }
            r->n_workers++;
        }
    }
    return 0;
}

// ---- ops ---------------------------------------------------------------------------------

// y[t, o] = Σ_k W[o, k] · x[t, k] for t < T, o < W.rows. Each weight row is decoded once per
// call and reused for every token. Rows are split over the workers; each output element is
// computed by one worker in a fixed order, so results do not depend on the thread count.
static void ref_linear(ref_engine *r, const ck_mat *W, const float *x, int ldx, int T, float *y, int ldy) {
    int nt = r->n_workers + 1, maxrow = ref_max_row(&r->m->cfg);
    if (nt == 1 || (size_t)W->rows * W->cols * T < (1u << 16)) {   // small products: not worth a hand-off
        ref_linear_job j = {W, x, y, T, ldx, ldy, 0, W->rows, r->wrow};
        ref_linear_rows(&j);
        return;
    }
    int per = (W->rows + nt - 1) / nt;
    for (int i = 0; i < nt; i++) {
        int r0 = i * per < W->rows ? i * per : W->rows, r1 = r0 + per < W->rows ? r0 + per : W->rows;
        r->jobs[i] = (ref_linear_job){W, x, y, T, ldx, ldy, r0, r1, r->wrow + (size_t)i * maxrow};
    }
    pthread_mutex_lock(&r->mu);
    r->pending = nt - 1;
    r->gen++;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->mu);
    ref_linear_rows(&r->jobs[0]);
    pthread_mutex_lock(&r->mu);
    while (r->pending) pthread_cond_wait(&r->done, &r->mu);   // the workers' rows of y are written
    pthread_mutex_unlock(&r->mu);
}

// Zero-centred RMSNorm (MODEL.md §3.2): y = x / sqrt(mean(x²) + eps) · (1 + w).
static void ref_rmsnorm1p(const float *x, const ck_mat *w, int n, double eps, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * (1.0f + ck_at(w, 0, i));
}

static float ref_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }
static float ref_silu(float x) { return x * ref_sigmoid(x); }
// PyTorch softplus (beta 1, threshold 20): x itself above the threshold.
static float ref_softplus(float x) { return x > 20.f ? x : (float)log1p(exp((double)x)); }

// Partial rotary embedding on the first rot_dim dims of u (MODEL.md §3.4 step 4), position p.
static void ref_rope(const ref_engine *r, float *u, int p) {
    int half = r->m->cfg.rot_dim / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)p * r->inv_freq[i];  // f32 product, as transformers' position × inv_freq
        float c = (float)cos((double)ang), s = (float)sin((double)ang);
        float a = u[i], b = u[i + half];
        u[i] = a * c - b * s;
        u[i + half] = b * c + a * s;
    }
}

// Gated full attention for the tokens [t0, t0 + n) of one sequence (MODEL.md §3.4).
static void ref_attention(ref_engine *r, const ck_layer *L, int layer, ref_seq *q, int t0, int n) {
    const ck_config *c = &r->m->cfg;
    int hd = c->head_dim, nh = c->n_heads, kvh = c->n_kv_heads, group = nh / kvh;
    int kvd = kvh * hd, pw = 2 * nh * hd;
    size_t lay = (size_t)r->kind_index[layer] * r->max_len * kvd;
    float *K = q->k + lay, *Vc = q->v + lay;
    float scale = 1.0f / sqrtf((float)hd);
    for (int t = t0; t < t0 + n; t++) {
        int p = q->pos + (t - t0);
        float *qg = r->proj + (size_t)t * pw;
        for (int h = 0; h < nh; h++) {
            float *qh = qg + (size_t)h * 2 * hd;
            ref_rmsnorm1p(qh, &L->q_norm, hd, c->eps, qh);
            ref_rope(r, qh, p);
        }
        for (int j = 0; j < kvh; j++) {
            float *kh = r->kk + (size_t)t * kvd + (size_t)j * hd;
            ref_rmsnorm1p(kh, &L->k_norm, hd, c->eps, kh);
            ref_rope(r, kh, p);
        }
        memcpy(K + (size_t)p * kvd, r->kk + (size_t)t * kvd, sizeof(float) * kvd);
        memcpy(Vc + (size_t)p * kvd, r->vv + (size_t)t * kvd, sizeof(float) * kvd);
    }
    for (int t = t0; t < t0 + n; t++) {
        int p = q->pos + (t - t0);
        const float *qg = r->proj + (size_t)t * pw;
        float *out = r->core + (size_t)t * nh * hd;
        for (int h = 0; h < nh; h++) {
            const float *qh = qg + (size_t)h * 2 * hd, *gate = qh + hd;
            int j = h / group;
            float mx = -INFINITY;
            for (int tau = 0; tau <= p; tau++) {
                r->scores[tau] = ref_dot(qh, K + (size_t)tau * kvd + (size_t)j * hd, hd) * scale;
                if (r->scores[tau] > mx) mx = r->scores[tau];
            }
            double sum = 0;
            for (int tau = 0; tau <= p; tau++) sum += (r->scores[tau] = (float)exp((double)(r->scores[tau] - mx)));
            float inv = (float)(1.0 / sum);
            float *o = out + (size_t)h * hd;
            for (int d = 0; d < hd; d++) {
                double acc = 0;
                for (int tau = 0; tau <= p; tau++) acc += (double)(r->scores[tau] * inv) * Vc[(size_t)tau * kvd + (size_t)j * hd + d];
                o[d] = (float)acc * ref_sigmoid(gate[d]);   // element-wise output gate
            }
        }
    }
}

// Gated DeltaNet for the tokens [t0, t0 + n) of one sequence, recurrent form (MODEL.md §3.5,
// §4.1). r->proj holds the qkv projections of these tokens; it is overwritten by the conv output.
static void ref_gdn(ref_engine *r, const ck_layer *L, int layer, ref_seq *q, int t0, int n) {
    const ck_config *c = &r->m->cfg;
    int cd = c->conv_dim, K = c->conv_k, nk = c->lk_heads, nv = c->lv_heads, dk = c->lk_dim, dv = c->lv_dim;
    int rep = nv / nk;
    size_t gi = (size_t)r->kind_index[layer];
    float *win = q->conv + gi * (K - 1) * cd;                 // [K-1, cd]
    float *S0 = q->ssm + gi * nv * dk * dv;                   // [nv, dk, dv]
    float *conv_out = r->tmp, *kvmem = r->tmp + cd;           // [cd], [dv]
    float qscale = 1.0f / sqrtf((float)dk);
    for (int t = t0; t < t0 + n; t++) {
        float *m = r->proj + (size_t)t * cd;
        // causal depthwise conv over (window, current) then SiLU; the window keeps pre-conv inputs
        for (int ch = 0; ch < cd; ch++) {
            double acc = 0;
            for (int j = 0; j < K - 1; j++) acc += (double)ck_at(&L->conv, ch, j) * win[(size_t)j * cd + ch];
            acc += (double)ck_at(&L->conv, ch, K - 1) * m[ch];
            conv_out[ch] = ref_silu((float)acc);
        }
        if (K > 1) {
            memmove(win, win + cd, sizeof(float) * (size_t)(K - 2) * cd);
            memcpy(win + (size_t)(K - 2) * cd, m, sizeof(float) * cd);
        }
        memcpy(m, conv_out, sizeof(float) * cd);
        float *qv = m, *kv = m + c->key_dim, *vv = m + 2 * c->key_dim;
        // L2-normalise q and k per key head (eps inside the sqrt), then scale q by 1/sqrt(dk)
        for (int h = 0; h < nk; h++) {
            float *qh = qv + (size_t)h * dk, *kh = kv + (size_t)h * dk;
            double sq = 0, sk = 0;
            for (int d = 0; d < dk; d++) { sq += (double)qh[d] * qh[d]; sk += (double)kh[d] * kh[d]; }
            float rq = (float)(1.0 / sqrt(sq + 1e-6)), rk = (float)(1.0 / sqrt(sk + 1e-6));
            for (int d = 0; d < dk; d++) { qh[d] = qh[d] * rq * qscale; kh[d] = kh[d] * rk; }
        }
        for (int j = 0; j < nv; j++) {
            const float *qh = qv + (size_t)(j / rep) * dk, *kh = kv + (size_t)(j / rep) * dk, *vh = vv + (size_t)j * dv;
            float beta = ref_sigmoid(r->bb[(size_t)t * nv + j]);
            float g = -expf(ck_at(&L->A_log, 0, j)) * ref_softplus(r->aa[(size_t)t * nv + j] + ck_at(&L->dt_bias, 0, j));
            float decay = expf(g);
            float *S = S0 + (size_t)j * dk * dv;               // [dk, dv]
            for (size_t i = 0; i < (size_t)dk * dv; i++) S[i] *= decay;
            for (int v = 0; v < dv; v++) {
                double acc = 0;
                for (int d = 0; d < dk; d++) acc += (double)S[(size_t)d * dv + v] * kh[d];
                kvmem[v] = (vh[v] - (float)acc) * beta;       // the correction u = β (v − Sᵀk)
            }
            for (int d = 0; d < dk; d++)
                for (int v = 0; v < dv; v++) S[(size_t)d * dv + v] += kh[d] * kvmem[v];
            float *o = r->core + (size_t)t * c->value_dim + (size_t)j * dv;
            for (int v = 0; v < dv; v++) {
                double acc = 0;
                for (int d = 0; d < dk; d++) acc += (double)S[(size_t)d * dv + v] * qh[d];
                o[v] = (float)acc;
            }
            // gated RMSNorm (MODEL.md §3.3): plain weight, then SiLU(z)
            double ss = 0;
            for (int v = 0; v < dv; v++) ss += (double)o[v] * o[v];
            float rn = (float)(1.0 / sqrt(ss / dv + c->eps));
            const float *z = r->zz + (size_t)t * c->value_dim + (size_t)j * dv;
            for (int v = 0; v < dv; v++) o[v] = ck_at(&L->gnorm, 0, v) * (o[v] * rn) * ref_silu(z[v]);
        }
    }
}

// Router, routed experts and the gated shared expert over all T tokens (MODEL.md §3.6).
// Output in r->y.
static void ref_moe(ref_engine *r, const ck_layer *L, int layer, int T) {
    const ck_config *c = &r->m->cfg;
    int H = c->hidden, E = c->n_experts, Kt = c->topk, I = c->inter, SI = c->shared_inter;
    ref_linear(r, &L->router, r->xn, H, T, r->rl, E);
    for (int t = 0; t < T; t++) {
        float *p = r->rl + (size_t)t * E;
        float mx = -INFINITY;
        for (int x = 0; x < E; x++) if (p[x] > mx) mx = p[x];
        double sum = 0;
        for (int x = 0; x < E; x++) sum += (p[x] = (float)exp((double)(p[x] - mx)));
        for (int x = 0; x < E; x++) p[x] = (float)(p[x] / sum);
        // top-K by probability, ties to the lower expert id; then renormalise over the K
        int *sel = r->sel + (size_t)t * Kt;
        float *w = r->selw + (size_t)t * Kt;
        double ws = 0;
        for (int k = 0; k < Kt; k++) {
            int best = -1;
            for (int x = 0; x < E; x++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= sel[j] == x;
                if (!taken && (best < 0 || p[x] > p[best])) best = x;
            }
            sel[k] = best;
            w[k] = p[best];
            ws += p[best];
        }
        for (int k = 0; k < Kt; k++) w[k] = (float)(w[k] / ws);
        if (r->trace_ids) {
            memcpy(r->trace_ids[layer] + (size_t)t * Kt, sel, sizeof(int32_t) * Kt);
            memcpy(r->trace_w[layer] + (size_t)t * Kt, w, sizeof(float) * Kt);
        }
    }
    memset(r->y, 0, sizeof(float) * (size_t)T * H);
    // routed experts in ascending id, each over the tokens that chose it (as transformers' loop)
    for (int x = 0; x < E; x++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < Kt; k++)
                if (r->sel[(size_t)t * Kt + k] == x) {
                    r->rows[n] = t;
                    r->rw[n] = r->selw[(size_t)t * Kt + k];
                    memcpy(r->gx + (size_t)n * H, r->xn + (size_t)t * H, sizeof(float) * H);
                    n++;
                }
        if (!n) continue;
        ref_linear(r, &L->gate[x], r->gx, H, n, r->eg, I);
        ref_linear(r, &L->up[x], r->gx, H, n, r->eu, I);
        for (size_t i = 0; i < (size_t)n * I; i++) r->eg[i] = ref_silu(r->eg[i]) * r->eu[i];
        ref_linear(r, &L->down[x], r->eg, I, n, r->ed, H);
        for (int i = 0; i < n; i++) {
            float *yt = r->y + (size_t)r->rows[i] * H;
            const float *d = r->ed + (size_t)i * H;
            for (int h = 0; h < H; h++) yt[h] += d[h] * r->rw[i];
        }
    }
    // shared expert, scaled by its sigmoid gate
    ref_linear(r, &L->sh_gate, r->xn, H, T, r->eg, SI);
    ref_linear(r, &L->sh_up, r->xn, H, T, r->eu, SI);
    for (size_t i = 0; i < (size_t)T * SI; i++) r->eg[i] = ref_silu(r->eg[i]) * r->eu[i];
    ref_linear(r, &L->sh_down, r->eg, SI, T, r->ed, H);
    ref_linear(r, &L->sh_gate_w, r->xn, H, T, r->gx, 1);
    for (int t = 0; t < T; t++) {
        float sg = ref_sigmoid(r->gx[t]);
        for (int h = 0; h < H; h++) r->y[(size_t)t * H + h] += sg * r->ed[(size_t)t * H + h];
    }
}

// One batched forward step. Sequence i of n appends ids[off[i] .. off[i+1]) to slot slots[i].
// logits: with all_logits, [off[n], V] (every token); else [n, V] (each sequence's last token).
// hidden: NULL, or L + 1 buffers [off[n], H] receiving the residual stream as transformers'
// output_hidden_states (0: embeddings, i: after layer i − 1, L: after the final norm).
static int ref_forward(ref_engine *r, int n, const int *slots, const int32_t *ids, const int *off, float *logits,
                       int all_logits, float **hidden, moet_err *e) {
    const ck_model *m = r->m;
    const ck_config *c = &m->cfg;
    int H = c->hidden, V = c->vocab, T = off[n];
    if (n < 1 || off[0] != 0 || T > r->max_tokens)
        return err_set(e, "step of %d tokens in %d rows exceeds the %d tokens planned", T, n, r->max_tokens);
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= r->max_seqs) return err_set(e, "sequence slot %d out of range", slots[i]);
        for (int j = 0; j < i; j++) if (slots[j] == slots[i]) return err_set(e, "sequence slot %d appears twice in one step", slots[i]);
        if (off[i + 1] <= off[i]) return err_set(e, "row %d has no tokens", i);
        if (r->seqs[slots[i]].pos + (off[i + 1] - off[i]) > r->max_len)
            return err_set(e, "sequence in slot %d would reach %d tokens; the limit is %d", slots[i],
                           r->seqs[slots[i]].pos + (off[i + 1] - off[i]), r->max_len);
    }
    for (int t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= V) return err_set(e, "token id %d outside the vocabulary [0, %d)", ids[t], V);
        ck_row_f32(&m->embed, ids[t], r->x + (size_t)t * H);
    }
    if (hidden) memcpy(hidden[0], r->x, sizeof(float) * (size_t)T * H);
    for (int l = 0; l < c->n_layers; l++) {
        const ck_layer *L = &m->layers[l];
        for (int t = 0; t < T; t++) ref_rmsnorm1p(r->x + (size_t)t * H, &L->in_norm, H, c->eps, r->xn + (size_t)t * H);
        if (c->full_attn[l]) {
            int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
            ref_linear(r, &L->q, r->xn, H, T, r->proj, 2 * qd);
            ref_linear(r, &L->k, r->xn, H, T, r->kk, kvd);
            ref_linear(r, &L->v, r->xn, H, T, r->vv, kvd);
            for (int i = 0; i < n; i++) ref_attention(r, L, l, &r->seqs[slots[i]], off[i], off[i + 1] - off[i]);
            ref_linear(r, &L->o, r->core, qd, T, r->y, H);
        } else {
            ref_linear(r, &L->qkv, r->xn, H, T, r->proj, c->conv_dim);
            ref_linear(r, &L->z, r->xn, H, T, r->zz, c->value_dim);
            ref_linear(r, &L->b, r->xn, H, T, r->bb, c->lv_heads);
            ref_linear(r, &L->a, r->xn, H, T, r->aa, c->lv_heads);
            for (int i = 0; i < n; i++) ref_gdn(r, L, l, &r->seqs[slots[i]], off[i], off[i + 1] - off[i]);
            ref_linear(r, &L->out, r->core, c->value_dim, T, r->y, H);
        }
        for (size_t i = 0; i < (size_t)T * H; i++) r->x[i] += r->y[i];
        for (int t = 0; t < T; t++) ref_rmsnorm1p(r->x + (size_t)t * H, &L->post_norm, H, c->eps, r->xn + (size_t)t * H);
        ref_moe(r, L, l, T);
        for (size_t i = 0; i < (size_t)T * H; i++) r->x[i] += r->y[i];
        if (hidden && l + 1 < c->n_layers) memcpy(hidden[l + 1], r->x, sizeof(float) * (size_t)T * H);
    }
    for (int i = 0; i < n; i++) r->seqs[slots[i]].pos += off[i + 1] - off[i];
    // final norm + lm_head, for every token or only each row's last one
    int nrows = all_logits ? T : n;
    for (int i = 0; i < nrows; i++) {
        int t = all_logits ? i : off[i + 1] - 1;
        ref_rmsnorm1p(r->x + (size_t)t * H, &m->final_norm, H, c->eps, r->xn + (size_t)i * H);
    }
    if (hidden) memcpy(hidden[c->n_layers], r->xn, sizeof(float) * (size_t)nrows * H);
    ref_linear(r, &m->lm_head, r->xn, H, nrows, logits, V);
    return 0;
}

// ---- the CPU backend of the scheduler ----------------------------------------------------

static void ref_backend_reset(void *self, int slot) { ref_reset(self, slot); }

static int ref_backend_step(void *self, int n, const int *slots, const int32_t *ids, const int *off, float *logits, moet_err *e) {
    return ref_forward(self, n, slots, ids, off, logits, 0, NULL, e);
}

static engine_backend ref_backend(ref_engine *r) {
    engine_backend b = {r, r->m->cfg.vocab, r->max_seqs, r->max_len, ref_backend_reset, ref_backend_step};
    return b;
}

// defines: chat_render (the Qwen3.6 chat template), chat_split_* (reasoning/content splitter)
#include "format/chat.c"

// ==========================================================================================
// the sampler
// ==========================================================================================
//
// From one row of logits to one token id, and the logprobs of it.
//
// The order is vLLM's (the reference for what these parameters mean):
//   1. penalties on the raw logits: repetition (HF/vLLM: a token seen in the prompt or the
//      output has its logit divided by r when positive, multiplied by r when negative), then
//      frequency (minus f × times generated) and presence (minus p once generated), as OpenAI;
//   2. temperature 0 → greedy: the largest penalized logit, ties to the lowest id;
//   3. otherwise logits / temperature → softmax, then min_p (drop p < min_p × p_max), top_k
//      (the k most likely; ties broken by lower id), top_p (the most likely tokens, renormalized,
//      until their mass reaches top_p), then one draw from the kept tokens.
// Each draw takes one number from the request's own generator (xoshiro256**, seeded by
// splitmix64 from the request's seed), and the kept tokens are walked in a fixed order, so
// the same logits and seed give the same token whatever else runs in the batch.
// Logprobs are log-softmax of the raw logits (before penalties and temperature), as vLLM
// reports them by default.

typedef struct {
    float temperature;          // 0 = greedy
    int top_k;                  // 0 = all
    float top_p;                // (0, 1]
    float min_p;                // [0, 1]
    float presence_penalty;     // [-2, 2]
    float frequency_penalty;    // [-2, 2]
    float repetition_penalty;   // > 0; 1 = off
} samp_params;

typedef struct {
    uint64_t s[4];
} samp_rng;

// Penalty state of one sequence slot; all zero when the slot is empty.
typedef struct {
    uint16_t *count;   // [V] times generated (saturates at 65535)
    uint8_t *seen;     // [(V + 7) / 8] bit per token: in the prompt or the output
} samp_slot;

// Working memory for one pick (sampling runs one row at a time).
typedef struct {
    int n_vocab;
    float *work;       // [V] penalized, tempered logits, then probabilities
    int32_t *cand;     // [V] candidate ids
} samp_scratch;

static uint64_t samp_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void samp_seed(samp_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = samp_splitmix(&seed);
}

static uint64_t samp_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t samp_next(samp_rng *r) {
    uint64_t *s = r->s, out = samp_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = samp_rotl(s[3], 45);
    return out;
}

// Uniform in [0, 1) with 53 random bits.
static double samp_uniform(samp_rng *r) { return (double)(samp_next(r) >> 11) * (1.0 / 9007199254740992.0); }

// ---- per-slot penalty state --------------------------------------------------------------

static void samp_slot_note_prompt(samp_slot *s, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) s->seen[ids[i] >> 3] |= (uint8_t)(1u << (ids[i] & 7));
}

static void samp_slot_note_output(samp_slot *s, int32_t id) {
    s->seen[id >> 3] |= (uint8_t)(1u << (id & 7));
    if (s->count[id] != UINT16_MAX) s->count[id]++;
}

// Back to all zero, touching only the tokens of the sequence's history.
static void samp_slot_clear(samp_slot *s, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        s->seen[ids[i] >> 3] = 0;
        s->count[ids[i]] = 0;
    }
}

static int samp_has_penalty(const samp_params *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0 || p->repetition_penalty != 1;
}

// ---- the pick ----------------------------------------------------------------------------

// Candidate order: higher probability first, then lower id (a total order, so the result
// does not depend on the sort algorithm).
static const float *samp_sort_key;
static int samp_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float px = samp_sort_key[x], py = samp_sort_key[y];
    if (px != py) return px > py ? -1 : 1;
    return (x > y) - (x < y);
}

// Moves the k best candidates (in samp_cmp order) to cand[0..k), sorted: a heap of the k
// best so far whose root is the worst of them, O(n log k).
static void samp_heap_down(int32_t *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && samp_cmp(&h[l], &h[w]) > 0) w = l;
        if (r < k && samp_cmp(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        int32_t t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

// Sorts cand[0..n) in samp_cmp order (key: samp_sort_key) in place, by heapsort: libc's qsort
// may allocate (glibc's merge sort mallocs past 1 KiB), and nothing allocates after ready.
static void samp_sort(int32_t *cand, int n) {
    for (int i = n / 2; i-- > 0;) samp_heap_down(cand, n, i);
    for (int k = n - 1; k > 0; k--) {   // the root is the worst of cand[0..k]: it goes last
        int32_t t = cand[0]; cand[0] = cand[k]; cand[k] = t;
        samp_heap_down(cand, k, 0);
    }
}

static void samp_select(int32_t *cand, int n, int k, const float *prob) {
    samp_sort_key = prob;
    for (int i = k / 2; i-- > 0;) samp_heap_down(cand, k, i);
    for (int i = k; i < n; i++)
        if (samp_cmp(&cand[i], &cand[0]) < 0) {
            cand[0] = cand[i];
            samp_heap_down(cand, k, 0);
        }
    samp_sort(cand, k);
}

// One token id from logits[0..V). `slot` may be NULL when no penalty is set.
static int32_t samp_pick(samp_scratch *sc, const samp_slot *slot, const samp_params *p, samp_rng *rng,
                         const float *logits) {
    const int V = sc->n_vocab;
    const float *x = logits;
    if (samp_has_penalty(p)) {
        float *w = sc->work;
        memcpy(w, logits, (size_t)V * sizeof *w);
        for (int t = 0; t < V; t++) {
            if (!(slot->seen[t >> 3] & (1u << (t & 7)))) continue;
            if (p->repetition_penalty != 1) w[t] = w[t] > 0 ? w[t] / p->repetition_penalty : w[t] * p->repetition_penalty;
            uint16_t c = slot->count[t];
            if (c) w[t] -= p->frequency_penalty * (float)c + p->presence_penalty;
        }
        x = w;
    }
    int32_t best = 0;
    for (int t = 1; t < V; t++)
        if (x[t] > x[best]) best = t;
    if (p->temperature == 0) return best;

    // probabilities relative to the most likely token: prob[best] = 1
    float *prob = sc->work;
    const float inv_t = 1.0f / p->temperature, top = x[best];
    for (int t = 0; t < V; t++) prob[t] = expf((x[t] - top) * inv_t);
    float floor_p = p->min_p > 0 ? p->min_p : 0;   // min_p × p_max, and p_max = 1 here
    int32_t *cand = sc->cand;
    int n = 0;
    for (int t = 0; t < V; t++)
        if (prob[t] > 0 && prob[t] >= floor_p) cand[n++] = t;
    MOET_ASSERT(n > 0, "sampler: no candidate token");

    int sorted = 0;
    if (p->top_k > 0 && p->top_k < n) {
        samp_select(cand, n, p->top_k, prob);
        n = p->top_k;
        sorted = 1;
    }
    if (p->top_p < 1) {
        double total = 0;
        for (int i = 0; i < n; i++) total += prob[cand[i]];
        if (!sorted) {
            // Only the most likely tokens can be kept: when the tokens above a threshold
            // already hold top_p of the mass, sort just those (lower the threshold if not).
            float th = 0;
            for (float t2 = 1e-4f; t2 > 1e-12f && th == 0; t2 *= 1e-4f) {
                double mass = 0;
                for (int i = 0; i < n; i++)
                    if (prob[cand[i]] >= t2) mass += prob[cand[i]];
                if (mass >= p->top_p * total) th = t2;
            }
            if (th > 0) {
                int k = 0;
                for (int i = 0; i < n; i++)
                    if (prob[cand[i]] >= th) cand[k++] = cand[i];
                n = k;
            }
            samp_sort_key = prob;
            samp_sort(cand, n);
        }
        double acc = 0, need = p->top_p * total;
        int k = 0;
        while (k < n) {
            acc += prob[cand[k++]];
            if (acc >= need) break;
        }
        n = k;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += prob[cand[i]];
    double u = samp_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += prob[cand[i]];
        if (u < acc) return cand[i];
    }
    return cand[n - 1];   // u within rounding of the total
}

// ---- logprobs ----------------------------------------------------------------------------

// log-softmax of the raw logits at `chosen`, and the n_top most likely tokens (ids and
// logprobs, most likely first, ties to the lower id).
static float samp_logprobs(const float *logits, int V, int32_t chosen, int n_top, int32_t *top_ids, float *top_lp) {
    float mx = logits[0];
    for (int t = 1; t < V; t++)
        if (logits[t] > mx) mx = logits[t];
    double sum = 0;
    for (int t = 0; t < V; t++) sum += exp((double)logits[t] - mx);
    const double lse = mx + log(sum);
    int have = 0;
    for (int t = 0; t < V && n_top > 0; t++) {
        float v = logits[t];
        if (have == n_top && v <= logits[top_ids[have - 1]]) continue;
        int i = have < n_top ? have++ : have - 1;
        while (i > 0 && logits[top_ids[i - 1]] < v) {
            top_ids[i] = top_ids[i - 1];
            i--;
        }
        top_ids[i] = t;
    }
    for (int i = 0; i < have; i++) top_lp[i] = (float)(logits[top_ids[i]] - lse);
    return (float)(logits[chosen] - lse);
}

// defines: proto_parse (request lines), proto_out / po_* (response writer), proto_write_error
#include "format/protocol.c"

// ==========================================================================================
// the scheduler and the serve loop
// ==========================================================================================
//
// The scheduler (continuous batching over an engine_backend) and the line loop of
// docs/PROTOCOL.md.
//
// One thread does everything, in this order, forever: read what stdin has (poll, so decoding
// never waits for input and an idle server sleeps), turn complete lines into requests or
// answers, give free sequence slots to waiting requests (first come, first served), run one
// batched step — every decoding sequence contributes its next token, prefilling sequences
// share what is left of --max-batch-tokens in chunks — then sample, detokenize, stop, stream
// and answer. All memory (request records, token and text buffers, per-slot sampler state,
// step buffers, the input buffer) is planned from the flags and allocated once before the
// ready line; after it nothing is allocated (arena_freeze).
//
// Determinism: a request's tokens depend only on its own logits and its own generator, and
// the backend promises row results independent of the other rows and of how a prompt is cut
// into chunks, so a seeded request gives the same tokens alone or in a busy batch.


// Text side of the model: prompt text → ids, one id → its bytes.
typedef struct {
    void *self;
    // ids of text (added tokens matched); n_ids may exceed cap (then only cap were written)
    int (*encode)(void *self, const char *text, size_t n, int32_t *ids, int cap, int *n_ids, moet_err *e);
    // the bytes of one token; with skip_special, special tokens (<|im_end|> …) give none
    void (*piece)(void *self, int32_t id, int skip_special, const char **s, size_t *n);
} serve_codec;

typedef struct {
    int max_num_seqs;       // sequences decoded together (backend slots)
    int max_batch_tokens;   // tokens per step
    int max_queue;          // requests read and waiting for a slot
    int max_logprobs;       // top_logprobs accepted (storage per request)
    const char *model_name; // "model" of every response
    samp_params defaults;   // generation_config.json
    int n_eos;
    int32_t eos[MOET_MAX_EOS_IDS];  // stop token ids of the model
    uint64_t seed_base;     // requests without a seed draw from this + a counter
    int thinking;           // enable_thinking of requests that do not set it
    int max_new_tokens;     // max_tokens of requests that give none (generation_config.json); 0: to the context limit
} serve_config;

enum { REC_FREE, REC_WAITING, REC_PREFILL, REC_DECODE };
enum { FIN_NONE, FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR };
static const char *const serve_finish_name[] = {"", "stop", "length", "cancelled", "error"};

typedef struct {
    int state;              // REC_*
    int kind, batch, stream, thinking, legacy_lp;
    char id[MOET_MAX_ID + 1];
    uint64_t batch_no;      // Batch lines: the n of "batch_req_<n>"
    uint64_t order;         // arrival order
    int64_t created;        // unix seconds at arrival
    samp_params sp;
    samp_rng rng;
    int logprobs, top_logprobs, max_tokens, ignore_eos, return_token_ids;
    int n_stop;
    uint16_t stop_len[MOET_MAX_STOP];
    char *stop;             // [MOET_MAX_STOP][MOET_MAX_STOP_BYTES]
    size_t stop_max;        // longest stop string
    int n_stop_ids;
    int32_t stop_ids[MOET_MAX_STOP_IDS];
    int32_t *tok;           // [max_len] prompt, then generated tokens
    int n_prompt, n_tok, n_fed;   // n_fed: tokens the backend has seen
    char *text;             // [text_cap] generated text (special tokens skipped)
    size_t text_len;
    size_t released;        // completion stream: bytes handed out
    chat_split split;       // chat stream: reasoning/content handed out
    float *lp;              // [max_len] logprob of each generated token
    int32_t *lp_ids;        // [max_len, max_logprobs]
    float *lp_vals;         // [max_len, max_logprobs]
    int lp_sent;            // generated tokens whose logprobs were streamed
    int slot;               // backend slot, -1 while waiting
    int finish;             // FIN_*
    int cancel;             // asked to stop
    int sent_first;         // stream: the first chunk (with the role) went out
    double t_read, t_admit, t_first, t_done;
} serve_rec;

typedef struct {
    serve_config cfg;
    engine_backend be;
    serve_codec codec;
    int V, max_len;
    size_t text_cap;
    // requests
    serve_rec *recs;        // [n_recs]
    int n_recs;
    int *free_recs, n_free_recs;   // stack
    int *waiting, wait_head, n_waiting;  // ring of rec indices, arrival order
    int *running, n_running;       // rec indices in admission order
    int *free_slots, n_free_slots; // stack of backend slots
    samp_slot *pen;         // [max_num_seqs] penalty state per backend slot
    // one step
    float *logits;          // [max_num_seqs, V]
    int32_t *ids;           // [max_batch_tokens]
    int *row_slot, *row_rec, *off;   // [max_num_seqs], [max_num_seqs], [max_num_seqs + 1]
    samp_scratch sc;
    // one line
    char *in;               // [in_cap] bytes read, not yet consumed
    size_t in_cap, in_start, in_end;
    int skipping, in_eof;
    js_doc doc;
    chat_mem cm;
    char *prompt;           // [prompt_cap] rendered chat prompt
    size_t prompt_cap;
    int32_t *enc;           // [enc_cap] encoded prompt
    int enc_cap;
    proto_out out;
    // counters
    uint64_t lines, order, batch_no, seed_count;
    int n_cancel;           // requests marked cancelled and not yet finished
    uint64_t n_done, n_cancelled, n_errors, prompt_tokens, gen_tokens, steps;
    double t_start;
    uint64_t allocs_at_ready;
    long minflt_at_ready, majflt_at_ready;   // page faults of the process before the ready line
    arena mem;
} serve_ctx;

static volatile sig_atomic_t serve_signals;   // SIGTERM/SIGINT count
static void serve_on_signal(int sig) {
    (void)sig;
    serve_signals++;
}

// ---- memory plan ---------------------------------------------------------------------------

#define SERVE_TAKE(a, ptr, count, what) ((ptr) = arena_take((a), sizeof(*(ptr)) * (size_t)(count), 64, (what)))

static void serve_carve(serve_ctx *S, arena *a) {
    const serve_config *c = &S->cfg;
    int K = c->max_logprobs;
    SERVE_TAKE(a, S->recs, S->n_recs, "request records");
    for (int i = 0; i < S->n_recs; i++) {
        serve_rec *r = a->base ? &S->recs[i] : &(serve_rec){0};
        SERVE_TAKE(a, r->tok, S->max_len, "token buffers");
        SERVE_TAKE(a, r->text, S->text_cap, "text buffers");
        SERVE_TAKE(a, r->stop, MOET_MAX_STOP * MOET_MAX_STOP_BYTES, "stop strings");
        SERVE_TAKE(a, r->lp, S->max_len, "logprobs");
        SERVE_TAKE(a, r->lp_ids, (size_t)S->max_len * (K ? K : 1), "top logprob ids");
        SERVE_TAKE(a, r->lp_vals, (size_t)S->max_len * (K ? K : 1), "top logprobs");
    }
    SERVE_TAKE(a, S->free_recs, S->n_recs, "record free list");
    SERVE_TAKE(a, S->waiting, S->n_recs, "waiting queue");
    SERVE_TAKE(a, S->running, c->max_num_seqs, "running list");
    SERVE_TAKE(a, S->free_slots, c->max_num_seqs, "slot free list");
    SERVE_TAKE(a, S->pen, c->max_num_seqs, "penalty state");
    for (int s = 0; s < c->max_num_seqs; s++) {
        samp_slot *p = a->base ? &S->pen[s] : &(samp_slot){0};
        SERVE_TAKE(a, p->count, S->V, "penalty counts");
        SERVE_TAKE(a, p->seen, (S->V + 7) / 8, "penalty bits");
    }
    SERVE_TAKE(a, S->logits, (size_t)c->max_num_seqs * S->V, "step logits");
    SERVE_TAKE(a, S->ids, c->max_batch_tokens, "step tokens");
    SERVE_TAKE(a, S->row_slot, c->max_num_seqs, "step rows");
    SERVE_TAKE(a, S->row_rec, c->max_num_seqs, "step rows");
    SERVE_TAKE(a, S->off, c->max_num_seqs + 1, "step offsets");
    SERVE_TAKE(a, S->sc.work, S->V, "sampler scratch");
    SERVE_TAKE(a, S->sc.cand, S->V, "sampler candidates");
    SERVE_TAKE(a, S->in, S->in_cap, "input buffer");
    SERVE_TAKE(a, S->doc.nodes, MOET_MAX_LINE_VALUES, "request JSON values");
    SERVE_TAKE(a, S->doc.strs, MOET_MAX_LINE + 1, "request JSON strings");
    SERVE_TAKE(a, S->cm.scratch, MOET_MAX_LINE, "message text");
    SERVE_TAKE(a, S->cm.args.nodes, MOET_MAX_LINE_VALUES, "tool argument values");
    SERVE_TAKE(a, S->cm.args.strs, MOET_MAX_LINE + 1, "tool argument strings");
    SERVE_TAKE(a, S->prompt, S->prompt_cap, "rendered prompt");
    SERVE_TAKE(a, S->enc, S->enc_cap, "encoded prompt");
    SERVE_TAKE(a, S->out.buf, MOET_OUT_BUFFER, "output buffer");
}

// Plans and allocates everything for the backend `be` and the codec. Returns -1 with e set
// when a flag is out of range or the memory is refused.
static int serve_init(serve_ctx *S, const serve_config *cfg, engine_backend be, serve_codec codec, moet_err *e) {
    memset(S, 0, sizeof *S);
    S->cfg = *cfg;
    S->be = be;
    S->codec = codec;
    S->V = be.n_vocab;
    S->max_len = be.max_len;
    const serve_config *c = &S->cfg;
    if (c->max_num_seqs < 1 || c->max_num_seqs > be.max_seqs)
        return err_set(e, "--max-num-seqs %d: the backend has %d sequence slots", c->max_num_seqs, be.max_seqs);
    if (c->max_batch_tokens < c->max_num_seqs)
        return err_set(e, "--max-batch-tokens %d must be at least --max-num-seqs %d (one decode token per sequence)",
                       c->max_batch_tokens, c->max_num_seqs);
    if (c->max_queue < 0 || c->max_queue > MOET_MAX_QUEUE)
        return err_set(e, "--max-queue %d: expected 0 .. %d", c->max_queue, MOET_MAX_QUEUE);
    if (c->max_logprobs < 0 || c->max_logprobs > MOET_MAX_LOGPROBS)
        return err_set(e, "--max-logprobs %d: expected 0 .. %d", c->max_logprobs, MOET_MAX_LOGPROBS);
    if (S->max_len < 2) return err_set(e, "context length %d: at least 2 tokens are needed", S->max_len);
    S->n_recs = c->max_num_seqs + c->max_queue;
    S->text_cap = (size_t)S->max_len * MOET_TEXT_PER_TOKEN + 256;
    S->in_cap = MOET_MAX_LINE + 1 + (64u << 10);
    // the line's strings plus the template around them; tool JSON re-serialized with Python's
    // separators can grow, and a prompt past this is refused with a message
    S->prompt_cap = (size_t)MOET_MAX_LINE + MOET_MAX_LINE / 2 + (64u << 10);
    S->enc_cap = (int)S->prompt_cap;   // a token is at least one byte of text
    S->sc.n_vocab = S->V;
    S->doc.cap_nodes = MOET_MAX_LINE_VALUES;
    S->doc.cap_strs = MOET_MAX_LINE + 1;
    S->cm.scratch_cap = MOET_MAX_LINE;
    S->cm.args.cap_nodes = MOET_MAX_LINE_VALUES;
    S->cm.args.cap_strs = MOET_MAX_LINE + 1;
    S->out.cap = MOET_OUT_BUFFER;
    arena plan = arena_measure("serve");
    serve_carve(S, &plan);
    if (arena_init(&S->mem, "serve", plan.used, e)) return -1;
    serve_carve(S, &S->mem);
    arena_done(&S->mem);
    for (int i = 0; i < S->n_recs; i++) S->free_recs[S->n_free_recs++] = S->n_recs - 1 - i;
    for (int s = 0; s < c->max_num_seqs; s++) {
        S->free_slots[S->n_free_slots++] = c->max_num_seqs - 1 - s;
        memset(S->pen[s].count, 0, sizeof(uint16_t) * (size_t)S->V);
        memset(S->pen[s].seen, 0, (size_t)(S->V + 7) / 8);
    }
    for (int i = 0; i < S->n_recs; i++) S->recs[i].state = REC_FREE;
    return 0;
}

static void serve_free(serve_ctx *S) { arena_release(&S->mem); }

// ---- responses -------------------------------------------------------------------------------

static void serve_head(serve_ctx *S, const serve_rec *r, const char *object) {
    proto_out *o = &S->out;
    po_s(o, "{\"id\":");
    po_cstr(o, r->id);
    po_fmt(o, ",\"object\":\"%s\",\"created\":%" PRId64 ",\"model\":", object, r->created);
    po_cstr(o, S->cfg.model_name);
}

static void serve_usage_timing(serve_ctx *S, const serve_rec *r) {
    proto_out *o = &S->out;
    int gen = r->n_tok - r->n_prompt;
    po_fmt(o, ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", r->n_prompt, gen, r->n_tok);
    double t_first = r->t_first > 0 ? r->t_first : r->t_done;
    double admit = r->t_admit > 0 ? r->t_admit : r->t_done;
    double decode = r->t_done - t_first;
    po_s(o, ",\"timing\":{\"queue_ms\":");
    po_num(o, round((admit - r->t_read) * 1e4) / 10);
    po_s(o, ",\"prefill_ms\":");
    po_num(o, round((t_first - admit) * 1e4) / 10);
    po_s(o, ",\"decode_ms\":");
    po_num(o, round(decode * 1e4) / 10);
    po_s(o, ",\"decode_tok_s\":");
    po_num(o, gen > 1 && decode > 0 ? round((gen - 1) / decode * 10) / 10 : 0);
    po_s(o, "}");
}

static void serve_token_text(serve_ctx *S, int32_t id, int as_key) {
    const char *s;
    size_t n;
    S->codec.piece(S->codec.self, id, 0, &s, &n);
    (void)as_key;
    po_str(&S->out, s, n);
}

static void serve_token_bytes(serve_ctx *S, int32_t id) {
    const char *s;
    size_t n;
    S->codec.piece(S->codec.self, id, 0, &s, &n);
    po_s(&S->out, "[");
    for (size_t i = 0; i < n; i++) po_fmt(&S->out, i ? ",%u" : "%u", (unsigned)(uint8_t)s[i]);
    po_s(&S->out, "]");
}

// "logprobs" of generated tokens [from, to): the chat shape, or the legacy completions shape.
static void serve_logprobs(serve_ctx *S, const serve_rec *r, int from, int to) {
    proto_out *o = &S->out;
    int K = S->cfg.max_logprobs;
    if (!r->logprobs || from >= to) { po_s(o, "null"); return; }
    if (!r->legacy_lp) {
        po_s(o, "{\"content\":[");
        for (int i = from; i < to; i++) {
            int32_t id = r->tok[r->n_prompt + i];
            po_s(o, i > from ? ",{\"token\":" : "{\"token\":");
            serve_token_text(S, id, 0);
            po_s(o, ",\"logprob\":");
            po_num(o, r->lp[i]);
            po_s(o, ",\"bytes\":");
            serve_token_bytes(S, id);
            po_s(o, ",\"top_logprobs\":[");
            for (int k = 0; k < r->top_logprobs; k++) {
                int32_t t = r->lp_ids[(size_t)i * K + k];
                po_s(o, k ? ",{\"token\":" : "{\"token\":");
                serve_token_text(S, t, 0);
                po_s(o, ",\"logprob\":");
                po_num(o, r->lp_vals[(size_t)i * K + k]);
                po_s(o, ",\"bytes\":");
                serve_token_bytes(S, t);
                po_s(o, "}");
            }
            po_s(o, "]}");
        }
        po_s(o, "]}");
        return;
    }
    po_s(o, "{\"tokens\":[");
    for (int i = from; i < to; i++) {
        if (i > from) po_s(o, ",");
        serve_token_text(S, r->tok[r->n_prompt + i], 0);
    }
    po_s(o, "],\"token_logprobs\":[");
    for (int i = from; i < to; i++) {
        if (i > from) po_s(o, ",");
        po_num(o, r->lp[i]);
    }
    po_s(o, "],\"top_logprobs\":[");
    for (int i = from; i < to; i++) {
        po_s(o, i > from ? ",{" : "{");
        for (int k = 0; k < r->top_logprobs; k++) {
            if (k) po_s(o, ",");
            serve_token_text(S, r->lp_ids[(size_t)i * K + k], 1);
            po_s(o, ":");
            po_num(o, r->lp_vals[(size_t)i * K + k]);
        }
        po_s(o, "}");
    }
    po_s(o, "],\"text_offset\":[");
    size_t at = 0;
    for (int i = 0; i < to; i++) {
        const char *s;
        size_t n;
        S->codec.piece(S->codec.self, r->tok[r->n_prompt + i], 1, &s, &n);
        if (i >= from) po_fmt(o, i > from ? ",%zu" : "%zu", at);
        at += n;
    }
    po_s(o, "]}");
}

// The whole answer of a finished, non-streamed request (chat.completion / text_completion),
// wrapped as a Batch output line when the request came as one.
static void serve_write_final(serve_ctx *S, serve_rec *r) {
    proto_out *o = &S->out;
    int gen = r->n_tok - r->n_prompt;
    if (r->batch) {
        po_fmt(o, "{\"id\":\"batch_req_%" PRIu64 "\",\"custom_id\":", r->batch_no);
        po_cstr(o, r->id);
        po_s(o, ",\"response\":{\"status_code\":200,\"request_id\":");
        po_cstr(o, r->id);
        po_s(o, ",\"body\":");
    }
    if (r->kind == PROTO_CHAT) {
        size_t r0, r1, c0, c1;
        chat_split_all(r->thinking, r->text, r->text_len, &r0, &r1, &c0, &c1);
        serve_head(S, r, "chat.completion");
        po_s(o, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\"");
        if (r->thinking) {
            po_s(o, ",\"reasoning_content\":");
            po_str(o, r->text + r0, r1 - r0);
        }
        po_s(o, ",\"content\":");
        po_str(o, r->text + c0, c1 - c0);
        po_s(o, "},\"logprobs\":");
    } else {
        serve_head(S, r, "text_completion");
        po_s(o, ",\"choices\":[{\"index\":0,\"text\":");
        po_str(o, r->text, r->text_len);
        po_s(o, ",\"logprobs\":");
    }
    serve_logprobs(S, r, 0, r->logprobs ? gen : 0);
    po_fmt(o, ",\"finish_reason\":\"%s\"", serve_finish_name[r->finish]);
    if (r->return_token_ids) {   // every generated id, a stop token included (vLLM's field)
        po_s(o, ",\"token_ids\":[");
        for (int i = r->n_prompt; i < r->n_tok; i++) po_fmt(o, i > r->n_prompt ? ",%d" : "%d", r->tok[i]);
        po_s(o, "]");
    }
    po_s(o, "}]");
    if (r->return_token_ids) {
        po_s(o, ",\"prompt_token_ids\":[");
        for (int i = 0; i < r->n_prompt; i++) po_fmt(o, i ? ",%d" : "%d", r->tok[i]);
        po_s(o, "]");
    }
    serve_usage_timing(S, r);
    po_s(o, "}");
    if (r->batch) po_s(o, "},\"error\":null}");
    po_end_line(o);
}

// Streams what became safe to show: text that no stop string can still cut, ending on a
// whole UTF-8 character, split into reasoning/content. final: the request is finished.
static void serve_stream(serve_ctx *S, serve_rec *r, int final) {
    proto_out *o = &S->out;
    size_t safe = r->text_len;
    if (!final) {
        size_t hold = 0;   // the longest tail that begins a stop string
        for (int k = 0; k < r->n_stop; k++) {
            const char *st = r->stop + (size_t)k * MOET_MAX_STOP_BYTES;
            for (size_t j = r->stop_len[k] - 1; j > hold; j--)
                if (j <= r->text_len && memcmp(r->text + r->text_len - j, st, j) == 0) { hold = j; break; }
        }
        safe -= hold;
        // back to a character boundary: an unfinished multi-byte sequence waits
        for (size_t back = 1; back <= 3 && back <= safe; back++) {
            uint8_t c = (uint8_t)r->text[safe - back];
            if ((c & 0xc0) == 0x80) continue;
            size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            if (need > back) safe -= back;
            break;
        }
    }
    size_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;   // reasoning delta, content delta
    if (r->kind == PROTO_CHAT) {
        chat_delta d;
        chat_split_update(&r->split, r->text, safe, final, &d);
        a0 = d.r_from, a1 = d.r_to, b0 = d.c_from, b1 = d.c_to;
    } else if (safe > r->released) {
        b0 = r->released;
        b1 = r->released = safe;
    }
    int gen = r->n_tok - r->n_prompt;
    int lp_due = r->logprobs && r->lp_sent < gen;
    if (a1 > a0 || b1 > b0 || (final && lp_due)) {
        if (r->kind == PROTO_CHAT) {
            serve_head(S, r, "chat.completion.chunk");
            po_s(o, ",\"choices\":[{\"index\":0,\"delta\":{");
            int comma = 0;
            if (!r->sent_first) { po_s(o, "\"role\":\"assistant\""); comma = 1; }
            if (a1 > a0) {
                po_s(o, comma ? ",\"reasoning_content\":" : "\"reasoning_content\":");
                po_str(o, r->text + a0, a1 - a0);
                comma = 1;
            }
            if (b1 > b0) {
                po_s(o, comma ? ",\"content\":" : "\"content\":");
                po_str(o, r->text + b0, b1 - b0);
            }
            po_s(o, "},\"logprobs\":");
        } else {
            serve_head(S, r, "text_completion");
            po_s(o, ",\"choices\":[{\"index\":0,\"text\":");
            po_str(o, r->text + b0, b1 - b0);
            po_s(o, ",\"logprobs\":");
        }
        serve_logprobs(S, r, r->lp_sent, lp_due ? gen : r->lp_sent);
        r->lp_sent = gen;
        po_s(o, ",\"finish_reason\":null}]}");
        po_end_line(o);
        r->sent_first = 1;
    }
    if (final) {
        serve_head(S, r, r->kind == PROTO_CHAT ? "chat.completion.chunk" : "text_completion");
        if (r->kind == PROTO_CHAT)   // the role goes in the first chunk, even when it is this one
            po_s(o, r->sent_first ? ",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null"
                                  : ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"logprobs\":null");
        else po_s(o, ",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null");
        po_fmt(o, ",\"finish_reason\":\"%s\"}]", serve_finish_name[r->finish]);
        serve_usage_timing(S, r);
        po_s(o, "}");
        po_end_line(o);
    }
}

// ---- request lifetime ---------------------------------------------------------------------

static void serve_release(serve_ctx *S, serve_rec *r) {
    int idx = (int)(r - S->recs);
    if (r->slot >= 0) {
        samp_slot_clear(&S->pen[r->slot], r->tok, r->n_tok);
        S->free_slots[S->n_free_slots++] = r->slot;
        for (int i = 0; i < S->n_running; i++)
            if (S->running[i] == idx) {
                memmove(&S->running[i], &S->running[i + 1], sizeof(int) * (size_t)(S->n_running - i - 1));
                S->n_running--;
                break;
            }
    } else {   // still in the waiting ring: take it out, keeping the order of the others
        int n = S->n_waiting, k = 0;
        for (int i = 0; i < n; i++) {
            int v = S->waiting[(S->wait_head + i) % S->n_recs];
            if (v != idx) S->waiting[(S->wait_head + k++) % S->n_recs] = v;
        }
        S->n_waiting = k;
    }
    r->state = REC_FREE;
    r->slot = -1;
    S->free_recs[S->n_free_recs++] = idx;
}

static void serve_finish(serve_ctx *S, serve_rec *r, int why) {
    if (r->cancel) S->n_cancel--;
    r->finish = why;
    r->t_done = moet_now();
    if (why == FIN_CANCELLED) S->n_cancelled++;
    S->n_done++;
    S->gen_tokens += (uint64_t)(r->n_tok - r->n_prompt);
    if (r->stream && !r->batch) serve_stream(S, r, 1);
    else serve_write_final(S, r);
    serve_release(S, r);
}

// A failure of the backend while this request ran: an error answer, the slot freed.
static void serve_fail(serve_ctx *S, serve_rec *r, const char *msg) {
    if (r->cancel) S->n_cancel--;
    S->n_errors++;
    proto_write_error(&S->out, r->id, r->batch, r->batch_no, "server_error", "server_error", msg);
    serve_release(S, r);
}

static int serve_is_stop_id(const serve_ctx *S, const serve_rec *r, int32_t id) {
    for (int i = 0; i < S->cfg.n_eos; i++)
        if (S->cfg.eos[i] == id) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return 1;
    return 0;
}

// Samples the next token of r from its logits row and applies every stop rule.
static void serve_sample(serve_ctx *S, serve_rec *r, const float *row) {
    samp_slot *pen = &S->pen[r->slot];
    int32_t id = samp_pick(&S->sc, pen, &r->sp, &r->rng, row);
    int gen = r->n_tok - r->n_prompt;   // index of this token among the generated ones
    if (r->logprobs)
        r->lp[gen] = samp_logprobs(row, S->V, id, r->top_logprobs, r->lp_ids + (size_t)gen * S->cfg.max_logprobs,
                                   r->lp_vals + (size_t)gen * S->cfg.max_logprobs);
    if (r->t_first == 0) r->t_first = moet_now();
    r->tok[r->n_tok++] = id;
    samp_slot_note_output(pen, id);
    gen++;
    int why = FIN_NONE;
    if (!r->ignore_eos && serve_is_stop_id(S, r, id)) why = FIN_STOP;
    else {
        const char *s;
        size_t n;
        S->codec.piece(S->codec.self, id, 1, &s, &n);
        if (n > S->text_cap - r->text_len) why = FIN_LENGTH;   // planned text room used up
        else {
            size_t from = r->text_len > r->stop_max ? r->text_len - r->stop_max + 1 : 0;
            memcpy(r->text + r->text_len, s, n);
            r->text_len += n;
            // a stop string ending in the new bytes: cut the text before it
            size_t cut = SIZE_MAX;
            for (int k = 0; k < r->n_stop; k++) {
                const char *st = r->stop + (size_t)k * MOET_MAX_STOP_BYTES;
                size_t L = r->stop_len[k];
                for (size_t p = from; p + L <= r->text_len && p < cut; p++)
                    if (memcmp(r->text + p, st, L) == 0) { cut = p; break; }
            }
            if (cut != SIZE_MAX) {
                r->text_len = cut;
                why = FIN_STOP;
            }
        }
        if (why == FIN_NONE && ((r->max_tokens && gen >= r->max_tokens) || r->n_tok >= S->max_len)) why = FIN_LENGTH;
    }
    if (why != FIN_NONE) { serve_finish(S, r, why); return; }
    if (r->stream && !r->batch) serve_stream(S, r, 0);
}

// Gives free backend slots to waiting requests, oldest first.
static void serve_admit(serve_ctx *S) {
    while (S->n_waiting && S->n_free_slots) {
        int idx = S->waiting[S->wait_head];
        S->wait_head = (S->wait_head + 1) % S->n_recs;
        S->n_waiting--;
        serve_rec *r = &S->recs[idx];
        r->slot = S->free_slots[--S->n_free_slots];
        S->be.reset(S->be.self, r->slot);
        samp_slot_note_prompt(&S->pen[r->slot], r->tok, r->n_prompt);
        r->state = REC_PREFILL;
        r->t_admit = moet_now();
        S->running[S->n_running++] = idx;
    }
}

// One batched step over the running requests. Returns 0, or -1 when the backend failed
// (the requests of the step are answered with an error).
static int serve_step(serve_ctx *S) {
    int n = 0, T = 0;
    S->off[0] = 0;
    for (int i = 0; i < S->n_running; i++) {   // every decoding sequence: its next token
        serve_rec *r = &S->recs[S->running[i]];
        if (r->state != REC_DECODE) continue;
        S->ids[T++] = r->tok[r->n_fed];
        S->row_slot[n] = r->slot;
        S->row_rec[n++] = S->running[i];
        S->off[n] = T;
    }
    for (int i = 0; i < S->n_running && T < S->cfg.max_batch_tokens; i++) {   // prefill chunks, oldest first
        serve_rec *r = &S->recs[S->running[i]];
        if (r->state != REC_PREFILL) continue;
        int take = r->n_prompt - r->n_fed;
        if (take > S->cfg.max_batch_tokens - T) take = S->cfg.max_batch_tokens - T;
        memcpy(S->ids + T, r->tok + r->n_fed, sizeof(int32_t) * (size_t)take);
        T += take;
        S->row_slot[n] = r->slot;
        S->row_rec[n++] = S->running[i];
        S->off[n] = T;
    }
    if (n == 0) return 0;
    moet_err e = {{0}};
    S->steps++;
    if (S->be.step(S->be.self, n, S->row_slot, S->ids, S->off, S->logits, &e) != 0) {
        fprintf(stderr, "moet serve: backend step failed: %s\n", e.msg);
        for (int i = 0; i < n; i++) serve_fail(S, &S->recs[S->row_rec[i]], e.msg);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        serve_rec *r = &S->recs[S->row_rec[i]];
        r->n_fed += S->off[i + 1] - S->off[i];
        if (r->state == REC_PREFILL) {
            if (r->n_fed < r->n_prompt) continue;   // more prompt to go: these logits are not needed
            r->state = REC_DECODE;
        }
        serve_sample(S, r, S->logits + (size_t)i * S->V);
    }
    return 0;
}

// ---- lines ---------------------------------------------------------------------------------

// Resident memory in KiB, from /proc (read without stdio: no allocation): all of it, and its
// anonymous part (arenas, stacks, static data: what the process owns; the rest are file pages
// the kernel shares with the page cache and may drop). 0 when /proc cannot be read.
static void serve_rss(long *rss_kb, long *anon_kb) {
    long pages = 0, rss = 0, shared = 0;
    char sm[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = read(fd, sm, sizeof sm - 1);
        close(fd);
        sm[k > 0 ? k : 0] = 0;
        if (sscanf(sm, "%ld %ld %ld", &pages, &rss, &shared) != 3) rss = shared = 0;
    }
    *rss_kb = rss * (sysconf(_SC_PAGESIZE) / 1024);
    *anon_kb = (rss - shared) * (sysconf(_SC_PAGESIZE) / 1024);
}

static void serve_stats(serve_ctx *S, const proto_req *q) {
    proto_out *o = &S->out;
    long rss, anon;
    serve_rss(&rss, &anon);
    struct rusage ru;   // page faults of every thread
    getrusage(RUSAGE_SELF, &ru);
    po_s(o, "{\"object\":\"stats\"");
    if (q->has_id) { po_s(o, ",\"id\":"); po_cstr(o, q->id); }
    po_fmt(o, ",\"running\":%d,\"waiting\":%d,\"max_num_seqs\":%d,\"requests_finished\":%" PRIu64
              ",\"requests_cancelled\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"prompt_tokens\":%" PRIu64
              ",\"completion_tokens\":%" PRIu64 ",\"steps\":%" PRIu64,
           S->n_running, S->n_waiting, S->cfg.max_num_seqs, S->n_done, S->n_cancelled, S->n_errors, S->prompt_tokens,
           S->gen_tokens, S->steps);
    po_fmt(o, ",\"allocations_after_ready\":%" PRIu64 ",\"rss_kb\":%ld,\"rss_anon_kb\":%ld,\"minor_faults_after_ready\":%ld"
              ",\"major_faults_after_ready\":%ld,\"uptime_s\":",
           arena_stats.allocs - S->allocs_at_ready, rss, anon, ru.ru_minflt - S->minflt_at_ready,
           ru.ru_majflt - S->majflt_at_ready);
    po_num(o, round((moet_now() - S->t_start) * 1000) / 1000);
    po_s(o, "}");
    po_end_line(o);
}

static void serve_error(serve_ctx *S, const char *id, int batch, uint64_t batch_no, const char *code, const char *msg) {
    S->n_errors++;
    proto_write_error(&S->out, id, batch, batch_no, code, "invalid_request_error", msg);
}

static serve_rec *serve_find(serve_ctx *S, const char *id) {
    for (int i = 0; i < S->n_recs; i++)
        if (S->recs[i].state != REC_FREE && !strcmp(S->recs[i].id, id)) return &S->recs[i];
    return NULL;
}

// One complete input line (without its "\n"). Needs a free record (the caller checks).
static void serve_line(serve_ctx *S, char *line, size_t n) {
    S->lines++;
    double t_read = moet_now();
    if (n && line[n - 1] == '\r') n--;
    char auto_id[32];
    snprintf(auto_id, sizeof auto_id, "req-%" PRIu64, S->lines);
    char msg[512];
    int64_t bad = proto_bad_utf8(line, n);
    if (bad >= 0) {
        snprintf(msg, sizeof msg, "the line is not valid UTF-8 (byte %" PRId64 ")", bad);
        serve_error(S, NULL, 0, 0, "invalid_utf8", msg);
        return;
    }
    uint32_t nodes;
    size_t strs;
    if (js_measure(&S->doc, line, n, &nodes, &strs) != 0) {
        snprintf(msg, sizeof msg, "the line is not valid JSON: %s", S->doc.err);
        serve_error(S, NULL, 0, 0, "invalid_json", msg);
        return;
    }
    if (nodes > S->doc.cap_nodes) {
        snprintf(msg, sizeof msg, "the line has %u JSON values; the limit is %u", nodes, S->doc.cap_nodes);
        serve_error(S, NULL, 0, 0, "request_too_large", msg);
        return;
    }
    MOET_ASSERT(js_parse(&S->doc, line, n) == 0, "second JSON pass: %s", S->doc.err);
    proto_req q;
    proto_error pe = {0};
    proto_limits lim = {S->cfg.defaults, S->V, S->cfg.max_logprobs, S->cfg.thinking};
    int is_batch_line = 0;
    if (proto_parse(&S->doc, &lim, auto_id, &q, &pe) != 0) {
        is_batch_line = q.batch && q.has_id;
        // the line named itself, or was recognized as a request (which got an assigned id)
        serve_error(S, q.has_id || q.kind == PROTO_CHAT || q.kind == PROTO_COMPLETION ? q.id : NULL, is_batch_line,
                    is_batch_line ? ++S->batch_no : 0, pe.code, pe.e.msg);
        return;
    }
    if (q.kind == PROTO_STATS) { serve_stats(S, &q); return; }
    if (q.kind == PROTO_CANCEL) {
        serve_rec *r = serve_find(S, q.id);
        if (!r) {
            snprintf(msg, sizeof msg, "no request with id \"%.256s\" is running or waiting", q.id);
            serve_error(S, q.id, 0, 0, "not_found", msg);
            return;
        }
        if (!r->cancel) S->n_cancel++;
        r->cancel = 1;
        po_s(&S->out, "{\"object\":\"cancel\",\"id\":");
        po_cstr(&S->out, q.id);
        po_s(&S->out, ",\"cancelled\":true}");
        po_end_line(&S->out);
        return;
    }
    uint64_t batch_no = q.batch ? ++S->batch_no : 0;
    if (q.has_id && serve_find(S, q.id)) {
        snprintf(msg, sizeof msg, "a request with id \"%.256s\" is still running", q.id);
        serve_error(S, q.id, q.batch, batch_no, "duplicate_id", msg);
        return;
    }
    // the prompt's tokens
    moet_err e = {{0}};
    int n_ids = 0;
    const int32_t *ids = S->enc;
    if (q.kind == PROTO_CHAT) {
        size_t len;
        if (chat_render(&S->doc, q.messages, q.tools, &q.chat, &S->cm, S->prompt, S->prompt_cap, &len, &e) != 0) {
            serve_error(S, q.id, q.batch, batch_no, "invalid_request", e.msg);
            return;
        }
        if (S->codec.encode(S->codec.self, S->prompt, len, S->enc, S->enc_cap, &n_ids, &e) != 0) {
            serve_error(S, q.id, q.batch, batch_no, "invalid_request", e.msg);
            return;
        }
    } else if (q.prompt) {
        if (S->codec.encode(S->codec.self, q.prompt->str, q.prompt->len, S->enc, S->enc_cap, &n_ids, &e) != 0) {
            serve_error(S, q.id, q.batch, batch_no, "invalid_request", e.msg);
            return;
        }
    } else {
        n_ids = (int)q.input_ids->len;
        ids = NULL;
    }
    if (n_ids >= S->max_len) {
        snprintf(msg, sizeof msg, "prompt has %d tokens; the limit is %d (the context of %d tokens needs room for one "
                 "generated token)", n_ids, S->max_len - 1, S->max_len);
        serve_error(S, q.id, q.batch, batch_no, "context_length_exceeded", msg);
        return;
    }
    if (n_ids == 0) {
        serve_error(S, q.id, q.batch, batch_no, "invalid_value", "the prompt encodes to no tokens");
        return;
    }
    MOET_ASSERT(S->n_free_recs > 0, "no free request record");
    int idx = S->free_recs[--S->n_free_recs];
    serve_rec *r = &S->recs[idx];
    int32_t *toks = r->tok;   // the planned buffers stay; everything else starts from zero
    char *text = r->text, *stop = r->stop;
    float *lp = r->lp, *lpv = r->lp_vals;
    int32_t *lpi = r->lp_ids;
    memset(r, 0, sizeof *r);
    r->tok = toks, r->text = text, r->stop = stop, r->lp = lp, r->lp_vals = lpv, r->lp_ids = lpi;
    r->state = REC_WAITING;
    r->kind = q.kind;
    r->batch = q.batch;
    r->stream = q.stream && !q.batch;
    r->thinking = q.kind == PROTO_CHAT && q.chat.enable_thinking;
    r->legacy_lp = q.kind == PROTO_COMPLETION;
    memcpy(r->id, q.id, sizeof r->id);
    r->batch_no = batch_no;
    r->order = ++S->order;
    r->created = (int64_t)time(NULL);
    r->sp = q.sp;
    samp_seed(&r->rng, q.has_seed ? q.seed : S->cfg.seed_base + ++S->seed_count * 0x9e3779b97f4a7c15ull);
    r->logprobs = q.logprobs;
    r->top_logprobs = q.top_logprobs;
    r->max_tokens = q.max_tokens ? q.max_tokens : S->cfg.max_new_tokens;
    r->ignore_eos = q.ignore_eos;
    r->return_token_ids = q.return_token_ids;
    r->n_stop = q.n_stop;
    for (int k = 0; k < q.n_stop; k++) {
        memcpy(r->stop + (size_t)k * MOET_MAX_STOP_BYTES, q.stop[k]->str, q.stop[k]->len);
        r->stop_len[k] = (uint16_t)q.stop[k]->len;
        if (q.stop[k]->len > r->stop_max) r->stop_max = q.stop[k]->len;
    }
    r->n_stop_ids = q.n_stop_ids;
    memcpy(r->stop_ids, q.stop_ids, sizeof(int32_t) * (size_t)q.n_stop_ids);
    if (ids) memcpy(r->tok, ids, sizeof(int32_t) * (size_t)n_ids);
    else {
        const js_node *t = js_first(q.input_ids);
        for (int k = 0; k < n_ids; k++, t = js_next(&S->doc, t)) r->tok[k] = (int32_t)t->i64;
    }
    r->n_prompt = r->n_tok = n_ids;
    r->slot = -1;
    chat_split_init(&r->split, r->thinking);
    r->t_read = t_read;
    S->prompt_tokens += (uint64_t)n_ids;
    S->waiting[(S->wait_head + S->n_waiting++) % S->n_recs] = idx;
}

// Takes the next complete line from the input buffer (oversized lines are skipped and
// answered here). Returns 1 with the line, 0 when none is complete yet.
static int serve_next_line(serve_ctx *S, char **line, size_t *n) {
    for (;;) {
        char *base = S->in + S->in_start;
        size_t avail = S->in_end - S->in_start;
        char *nl = memchr(base, '\n', avail);
        if (S->skipping) {
            if (nl) S->in_start += (size_t)(nl - base) + 1;
            else {
                S->in_start = S->in_end;
                if (!S->in_eof) return 0;   // else the oversized line ended with the input
            }
            S->skipping = 0;
            S->lines++;
            char msg[160];
            snprintf(msg, sizeof msg, "the line is longer than the limit of %u bytes; it was skipped", MOET_MAX_LINE);
            serve_error(S, NULL, 0, 0, "line_too_long", msg);
            continue;
        }
        if (nl && (size_t)(nl - base) <= MOET_MAX_LINE) {
            *line = base;
            *n = (size_t)(nl - base);
            S->in_start += *n + 1;
            return 1;
        }
        if (nl || avail > MOET_MAX_LINE) {   // too long: skip through its newline
            S->skipping = 1;
            continue;
        }
        if (S->in_eof && avail) {   // the last line had no "\n"
            *line = base;
            *n = avail;
            S->in_start = S->in_end;
            return 1;
        }
        return 0;
    }
}

// Reads what fd has (waiting up to timeout_ms, -1 = until input or a signal).
static void serve_read(serve_ctx *S, int fd, int timeout_ms) {
    if (S->in_start > 0) {   // keep the unconsumed bytes at the front
        memmove(S->in, S->in + S->in_start, S->in_end - S->in_start);
        S->in_end -= S->in_start;
        S->in_start = 0;
    }
    if (S->in_end == S->in_cap) return;
    struct pollfd p = {fd, POLLIN, 0};
    int k = poll(&p, 1, timeout_ms);
    if (k <= 0) return;   // nothing yet, or a signal
    ssize_t got = read(fd, S->in + S->in_end, S->in_cap - S->in_end);
    if (got > 0) S->in_end += (size_t)got;
    else if (got == 0 || (errno != EINTR && errno != EAGAIN)) S->in_eof = 1;
}

static void serve_ready(serve_ctx *S) {
    proto_out *o = &S->out;
    po_s(o, "{\"object\":\"ready\",\"model\":");
    po_cstr(o, S->cfg.model_name);
    po_fmt(o, ",\"max_model_len\":%d,\"max_num_seqs\":%d,\"max_batch_tokens\":%d,\"max_queue\":%d,\"n_vocab\":%d,"
              "\"max_line_bytes\":%u}",
           S->max_len, S->cfg.max_num_seqs, S->cfg.max_batch_tokens, S->cfg.max_queue, S->V, MOET_MAX_LINE);
    po_end_line(o);
}

// The server: answers every line of fd_in on fd_out until EOF (then finishes what was read
// and returns 0) or signals (first: stop reading and finish; second: cancel what runs).
// Returns 1 when fd_out failed (the reader went away).
static int serve_run(serve_ctx *S, int fd_in, int fd_out) {
    S->out.fd = fd_out;
    S->t_start = moet_now();
    serve_ready(S);
    S->allocs_at_ready = arena_stats.allocs;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    S->minflt_at_ready = ru.ru_minflt;
    S->majflt_at_ready = ru.ru_majflt;
    int stopping = 0, cancelled_all = 0;
    for (;;) {
        if (S->out.failed) {
            fprintf(stderr, "moet serve: writing the answers failed: %s\n", strerror(S->out.err));
            return 1;
        }
        int sig = serve_signals;
        if (sig >= 1 && !stopping) {
            stopping = 1;
            if (S->in_end > S->in_start)
                fprintf(stderr, "moet serve: signal: %zu bytes of unread input dropped\n", S->in_end - S->in_start);
            S->in_start = S->in_end = 0;
            S->in_eof = 1;
            fprintf(stderr, "moet serve: signal: finishing %d running and %d waiting requests\n", S->n_running, S->n_waiting);
        }
        if (sig >= 2 && !cancelled_all) {
            cancelled_all = 1;
            for (int i = 0; i < S->n_recs; i++)
                if (S->recs[i].state != REC_FREE && !S->recs[i].cancel) S->recs[i].cancel = 1, S->n_cancel++;
        }
        // input: lines while a record is free
        if (!stopping) {
            char *line;
            size_t n;
            while (S->n_free_recs > 0 && serve_next_line(S, &line, &n)) serve_line(S, line, n);
            int busy = S->n_running > 0 || S->n_waiting > 0;
            if (!S->in_eof && S->n_free_recs > 0) {
                serve_read(S, fd_in, busy ? 0 : -1);
                while (S->n_free_recs > 0 && serve_next_line(S, &line, &n)) serve_line(S, line, n);
            }
        }
        // cancellations
        for (int i = 0; S->n_cancel > 0 && i < S->n_recs; i++)
            if (S->recs[i].state != REC_FREE && S->recs[i].cancel) serve_finish(S, &S->recs[i], FIN_CANCELLED);
        serve_admit(S);
        if (S->n_running) {
            serve_step(S);
            continue;
        }
        if (S->in_eof && !S->n_waiting && !(S->in_end > S->in_start)) break;
    }
    po_flush(&S->out);
    return S->out.failed;
}


// ==========================================================================================
// moet serve
// ==========================================================================================
//
// `moet serve`: flags, the model (checkpoint, tokenizer, generation
// config, optional plane file) behind the CPU reference backend, then the line loop.

// ---- the tokenizer as the server's codec -------------------------------------------------

typedef struct {
    tok t;
    tok_scratch sc;
    arena sc_mem;
} serve_tok;

static int serve_tok_encode(void *self, const char *text, size_t n, int32_t *ids, int cap, int *n_ids, moet_err *e) {
    serve_tok *st = self;
    size_t k = 0;
    int rc = tok_encode(&st->t, &st->sc, text, n, ids, (size_t)cap, &k, e);
    *n_ids = (int)k;
    return rc;
}

static void serve_tok_piece(void *self, int32_t id, int skip_special, const char **s, size_t *n) {
    const tok *t = &((serve_tok *)self)->t;
    *s = "";
    *n = 0;
    if (id < 0 || id >= t->n_ids) return;   // padding rows of the embedding: no text
    const tok_entry *en = &t->entries[id];
    if (en->kind == TOK_GAP || (skip_special && en->kind == TOK_ADDED && en->special)) return;
    *s = (const char *)t->bytes + en->off;
    *n = en->len;
}

// dir + "/" + file into out[cap]; -1 when it does not fit.
static int serve_path(char *out, size_t cap, const char *dir, const char *file) {
    size_t a = strlen(dir), b = strlen(file);
    if (a + 1 + b + 1 > cap) return -1;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, file, b + 1);
    return 0;
}

// ---- generation_config.json: sampling defaults and stop ids ---------------------------------

static int serve_gen_config(const char *dir, const tok *t, serve_config *c, moet_err *e) {
    char path[MOET_MAX_PATH];
    if (serve_path(path, sizeof path, dir, "generation_config.json")) return err_set(e, "%s: path too long", dir);
    // without the file: temperature 1, top_p 1, top_k 0 (PROTOCOL.md), stop on the chat end tokens
    samp_params d = {1.0f, 0, 1.0f, 0, 0, 0, 1.0f};
    c->defaults = d;
    c->n_eos = 0;
    c->max_new_tokens = 0;
    struct stat sb;
    if (stat(path, &sb) == 0) {
        js_doc doc;
        if (js_load_file(&doc, path, MOET_MAX_CONFIG_BYTES, e)) return -1;
        const js_node *root = js_root(&doc), *v;
        int rc = -1;
        if (!root || root->type != JS_OBJ) { err_set(e, "%s: expected a JSON object", path); goto out; }
        double x;
        int64_t k;
        if ((v = js_get(&doc, root, "temperature")) && js_num(v, &x) == 0 && x >= 0) c->defaults.temperature = (float)x;
        if ((v = js_get(&doc, root, "top_p")) && js_num(v, &x) == 0 && x > 0 && x <= 1) c->defaults.top_p = (float)x;
        if ((v = js_get(&doc, root, "top_k")) && js_int(v, &k) == 0 && k >= 0 && k <= INT32_MAX) c->defaults.top_k = (int)k;
        if ((v = js_get(&doc, root, "min_p")) && js_num(v, &x) == 0 && x >= 0 && x <= 1) c->defaults.min_p = (float)x;
        if ((v = js_get(&doc, root, "repetition_penalty")) && js_num(v, &x) == 0 && x > 0) c->defaults.repetition_penalty = (float)x;
        if ((v = js_get(&doc, root, "presence_penalty")) && js_num(v, &x) == 0 && x >= -2 && x <= 2) c->defaults.presence_penalty = (float)x;
        // do_sample false means greedy decoding (transformers' GenerationConfig)
        if ((v = js_get(&doc, root, "do_sample")) && v->type == JS_FALSE) c->defaults.temperature = 0;
        if ((v = js_get(&doc, root, "max_new_tokens")) && js_int(v, &k) == 0 && k >= 1 && k <= INT32_MAX) c->max_new_tokens = (int)k;
        v = js_get(&doc, root, "eos_token_id");
        if (v && v->type == JS_NUM) {
            if (js_int(v, &k) || k < 0 || k >= t->n_ids) { err_set(e, "%s: eos_token_id is not a token id", path); goto out; }
            c->eos[c->n_eos++] = (int32_t)k;
        } else if (v && v->type == JS_ARR) {
            const js_node *x1 = js_first(v);
            for (uint32_t i = 0; i < v->len; i++, x1 = js_next(&doc, x1)) {
                if (js_int(x1, &k) || k < 0 || k >= t->n_ids) { err_set(e, "%s: eos_token_id[%u] is not a token id", path, i); goto out; }
                if (c->n_eos == MOET_MAX_EOS_IDS) { err_set(e, "%s: more than %d eos_token_id entries", path, MOET_MAX_EOS_IDS); goto out; }
                c->eos[c->n_eos++] = (int32_t)k;
            }
        } else if (v && v->type != JS_NULL) {
            err_set(e, "%s: eos_token_id: expected an integer or a list, got %s", path, js_type_name(v));
            goto out;
        }
        rc = 0;
    out:
        js_free_doc(&doc);
        if (rc) return -1;
    }
    if (c->n_eos == 0) {
        const char *names[] = {"<|im_end|>", "<|endoftext|>"};
        for (int i = 0; i < 2; i++) {
            int32_t id = tok_find(t, names[i], strlen(names[i]));
            if (id >= 0) c->eos[c->n_eos++] = id;
        }
    }
    return 0;
}

// ---- resident before the ready line ---------------------------------------------------------
//
// After the ready line the server takes no page fault of its own: a first touch in the hot path
// costs latency, and memory that grows while serving cannot be told from a leak. The arenas are
// resident from their allocation (arena_sys_alloc); serve_resident makes the rest resident
// before ready: the code, tables and static data of the program and of its libraries (a code
// path first run after ready — a cancel, an error line, a libm function — would fault its pages
// in), the weights the engine reads from the mapped checkpoint (ck_resident), and the main
// stack down to MOET_SERVE_STACK below the serve loop. Worker stacks are carved from the engine's
// arena. The kernel may still drop clean file pages (code, weights) under memory pressure and
// fault them in again; the stats line counts faults after ready.

// Every loaded segment of one object (dl_iterate_phdr): read-only ones read in, writable ones
// written (static data becomes private pages now rather than at its first write after ready),
// except the part made read-only after relocation (PT_GNU_RELRO), which is read in.
static int serve_resident_object(struct dl_phdr_info *info, size_t size, void *failures) {
    (void)size;
    uintptr_t ro_lo = 0, ro_hi = 0;   // the RELRO pages, as the loader protects them (whole pages inside it)
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
            ro_lo = (info->dlpi_addr + info->dlpi_phdr[i].p_vaddr) & ~(uintptr_t)4095;
            ro_hi = (info->dlpi_addr + info->dlpi_phdr[i].p_vaddr + info->dlpi_phdr[i].p_memsz) & ~(uintptr_t)4095;
        }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        int rc = 0;
        if (!(ph->p_flags & PF_W)) rc = arena_resident((void *)lo, hi - lo, 0);
        else {
            uintptr_t a = lo > ro_lo ? lo : ro_lo, b = hi < ro_hi ? hi : ro_hi;   // [a, b): the RELRO part
            if (a >= b) a = b = hi;
            rc = (a > lo ? arena_resident((void *)lo, a - lo, 1) : 0) | arena_resident((void *)a, b - a, 0) |
                 (hi > b ? arena_resident((void *)b, hi - b, 1) : 0);
        }
        *(int *)failures += rc != 0;
    }
    return 0;
}

// MOET_SERVE_STACK bytes of stack below the caller's frame, written top down (the stack grows
// down, one page after the other).
static __attribute__((noinline)) void serve_resident_stack(void) {
    volatile uint8_t pad[MOET_SERVE_STACK];
    for (size_t i = sizeof pad; i >= 4096; i -= 4096) pad[i - 1] = 0;
    pad[0] = 0;
}

// Called by cmd_serve, the caller of serve_run, just before the ready line. Returns -1 with e set
// when the weights or the stack cannot be made resident; a segment that cannot is a warning
// (test_serve_e2e counts the faults after ready).
static int serve_resident(const ck_model *m, moet_err *e) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 2 * (rlim_t)MOET_SERVE_STACK)
        return err_set(e, "the stack limit (ulimit -s) is %lu KiB; the server needs at least %u KiB", (unsigned long)(rl.rlim_cur >> 10),
                       2 * MOET_SERVE_STACK >> 10);
    if (ck_resident(m, e)) return -1;
    int failures = 0;
    dl_iterate_phdr(serve_resident_object, &failures);
    if (failures) fprintf(stderr, "moet serve: warning: %d program segments could not be made resident\n", failures);
    serve_resident_stack();
    return 0;
}

// The bundled demo model next to the executable: its checkpoint (tests/fixtures/demo) and the
// plane file ./build.sh makes of its routed experts (build/demo.planes).
static int serve_default_model(char *model, char *planes, size_t cap) {
    char exe[MOET_MAX_PATH];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return -1;
    *slash = 0;
    int k = snprintf(model, cap, "%s/tests/fixtures/demo", exe);
    int j = snprintf(planes, cap, "%s/build/demo.planes", exe);
    return k > 0 && (size_t)k < cap && j > 0 && (size_t)j < cap ? 0 : -1;
}

static void serve_usage(FILE *f) {
    fputs("usage: moet serve [options] < requests.jsonl > answers.jsonl\n"
          "JSONL requests on stdin (OpenAI chat/completions bodies, Batch API lines, raw prompts,\n"
          "{\"op\":\"stats\"}, {\"op\":\"cancel\",\"id\":...}); one JSON answer per line on stdout; logs on stderr.\n"
          "options:\n"
          "  --model DIR             checkpoint directory (config.json, safetensors, tokenizer.json,\n"
          "                          generation_config.json); default: the bundled demo model,\n"
          "                          tests/fixtures/demo next to the executable, with its routed\n"
          "                          experts from build/demo.planes (made by ./build.sh)\n"
          "  --planes FILE           serve the routed experts from this MOET2PF1 plane file\n"
          "  --no-verify             with --planes: skip the SHA-256 check of every slot\n"
          "  --strict-revision       with --planes: refuse a file built from another revision of the\n"
          "                          checkpoint (a Hugging Face snapshot path names it); else a warning\n"
          "  --max-num-seqs N        sequences decoded together (default 8)\n"
          "  --max-batch-tokens N    tokens per forward step; prompts are prefilled in chunks that\n"
          "                          share it with the decoding sequences (default 256, >= max-num-seqs)\n"
          "  --max-model-len N       context length: prompt + generated tokens per request\n"
          "                          (default: the model's, at most 4096)\n"
          "  --max-queue N           requests read ahead and waiting for a free sequence (default 64);\n"
          "                          when full, stdin is not read until one finishes\n"
          "  --max-logprobs N        largest top_logprobs a request may ask for (default 20, max 20)\n"
          "  --threads N             worker threads of the CPU reference matrix products (default 1)\n"
          "  --served-model-name S   the \"model\" of every answer (default: the model directory's name)\n"
          "  --seed N                base of the seeds of requests that give none (default: from the clock)\n"
          "  --default-thinking on|off  enable_thinking of requests that do not set it (default on, as\n"
          "                          the model's template; off for the bundled demo model, which was\n"
          "                          trained on answers without a thinking block)\n"
          "  -h, --help              this text\n",
          f);
}

static int serve_arg_int(const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "moet serve: %s %s: expected an integer in %ld..%ld\n", flag, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *planes = NULL, *name = NULL;
    int seqs = 8, batch = 256, max_len = 0, queue = 64, max_lp = MOET_MAX_LOGPROBS, threads = 1, have_seed = 0;
    int thinking = -1;   // -1: on, except for the bundled demo model
    uint64_t seed = 0;
    pf_serve_opts popt = {0, 0, 0, 1};   // --no-verify, --strict-revision; progress on stderr
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { serve_usage(stdout); return 0; }
        else if (!strcmp(a, "--no-verify")) { popt.no_verify = 1; continue; }
        else if (!strcmp(a, "--strict-revision")) { popt.strict_revision = 1; continue; }
        if (!v) {
            fprintf(stderr, "moet serve: unknown option or missing value: '%s'\n", a);
            serve_usage(stderr);
            return 2;
        }
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--planes")) planes = v;
        else if (!strcmp(a, "--served-model-name")) name = v;
        else if (!strcmp(a, "--max-num-seqs")) rc = serve_arg_int(a, v, 1, MOET_MAX_SEQS, &seqs);
        else if (!strcmp(a, "--max-batch-tokens")) rc = serve_arg_int(a, v, 1, 1 << 20, &batch);
        else if (!strcmp(a, "--max-model-len")) rc = serve_arg_int(a, v, 2, INT32_MAX, &max_len);
        else if (!strcmp(a, "--max-queue")) rc = serve_arg_int(a, v, 0, MOET_MAX_QUEUE, &queue);
        else if (!strcmp(a, "--max-logprobs")) rc = serve_arg_int(a, v, 0, MOET_MAX_LOGPROBS, &max_lp);
        else if (!strcmp(a, "--threads")) rc = serve_arg_int(a, v, 1, MOET_MAX_THREADS, &threads);
        else if (!strcmp(a, "--default-thinking")) {
            if (strcmp(v, "on") && strcmp(v, "off")) { fprintf(stderr, "moet serve: --default-thinking %s: expected on or off\n", v); return 2; }
            thinking = !strcmp(v, "on");
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            seed = strtoull(v, &end, 10);
            if (!*v || *end || errno) { fprintf(stderr, "moet serve: --seed %s: expected an unsigned integer\n", v); return 2; }
            have_seed = 1;
        } else {
            fprintf(stderr, "moet serve: unknown option '%s'\n", a);
            serve_usage(stderr);
            return 2;
        }
        if (rc) return 2;
        i++;
    }
    if (batch < seqs) {
        fprintf(stderr, "moet serve: --max-batch-tokens %d must be at least --max-num-seqs %d\n", batch, seqs);
        return 2;
    }
    char def[MOET_MAX_PATH], defp[MOET_MAX_PATH];
    if (!model) {
        if (serve_default_model(def, defp, sizeof def)) {
            fprintf(stderr, "moet serve: cannot find the bundled model next to the executable; give --model DIR\n");
            return 1;
        }
        model = def;
        if (!planes) {
            struct stat pb;
            if (stat(defp, &pb) != 0) {
                fprintf(stderr, "moet serve: the bundled model's plane file %s is missing; run ./build.sh\n", defp);
                return 1;
            }
            planes = defp;
        }
        if (thinking < 0) thinking = 0;   // the demo model answers without a thinking block
    }
    if (thinking < 0) thinking = 1;
    // signals: the first stops reading, the second cancels (poll and read return EINTR)
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = serve_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);   // a closed stdout is reported by write(), not fatal

    double t0 = moet_now();
    moet_err e = {{0}};
    static ck_model m;
    static serve_tok st;
    static ref_engine r;
    static serve_ctx S;
    pf_attached pa = {0};
    int rc = 1, have_m = 0, have_tok = 0, have_r = 0, have_s = 0;
    char tpath[MOET_MAX_PATH], cpath[MOET_MAX_PATH];
    fprintf(stderr, "moet serve: loading %s\n", model);
    if (ck_open(&m, model, &e)) goto fail;
    have_m = 1;
    if (planes) {
        fprintf(stderr, "moet serve: reading the routed experts from %s%s\n", planes, popt.no_verify ? " (not verified)" : "");
        if (pf_attach_planes(&m, planes, &popt, &pa, &e)) goto fail;
    }
    if (serve_path(tpath, sizeof tpath, model, "tokenizer.json") || serve_path(cpath, sizeof cpath, model, "tokenizer_config.json")) {
        err_set(&e, "%s: path too long", model);
        goto fail;
    }
    struct stat sb;
    if (tok_load(&st.t, tpath, stat(cpath, &sb) == 0 ? cpath : NULL, &e)) goto fail;
    have_tok = 1;
    serve_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (serve_gen_config(model, &st.t, &cfg, &e)) goto fail;
    if (max_len == 0) max_len = m.cfg.max_pos < 4096 ? m.cfg.max_pos : 4096;
    if (max_len > m.cfg.max_pos)
        fprintf(stderr, "moet serve: warning: --max-model-len %d is above the model's max_position_embeddings %d\n", max_len,
                m.cfg.max_pos);
    if (ref_init(&r, &m, seqs, max_len, batch, threads, &e)) goto fail;
    have_r = 1;
    // names: the directory's last component
    const char *base = strrchr(model, '/');
    base = base && base[1] ? base + 1 : model;
    cfg.max_num_seqs = seqs;
    cfg.max_batch_tokens = batch;
    cfg.max_queue = queue;
    cfg.max_logprobs = max_lp;
    cfg.model_name = name ? name : base;
    cfg.thinking = thinking;
    cfg.seed_base = have_seed ? seed : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    if (serve_init(&S, &cfg, ref_backend(&r), (serve_codec){&st, serve_tok_encode, serve_tok_piece}, &e)) goto fail;
    have_s = 1;
    if (tok_scratch_init(&st.sc, &st.sc_mem, S.prompt_cap, &e)) goto fail;
    if (serve_resident(&m, &e)) goto fail;
    long rss, anon;
    serve_rss(&rss, &anon);
    fprintf(stderr, "moet serve: %s (%s experts, vocab %d) ready in %.2f s: context %d, %d sequences, %d tokens per step, "
            "queue %d, %d thread%s; host memory: engine %.1f MiB, server %.1f MiB; resident %.1f MiB (%.1f MiB anonymous)\n",
            cfg.model_name, m.expert_format, m.cfg.vocab, moet_now() - t0, max_len, seqs, batch, queue, threads,
            threads > 1 ? "s" : "", r.mem.cap / 1048576.0, S.mem.cap / 1048576.0, rss / 1024.0, anon / 1024.0);
    arena_freeze();   // from the ready line on, nothing is allocated
    rc = serve_run(&S, 0, 1);
    fprintf(stderr, "moet serve: done: %" PRIu64 " requests answered (%" PRIu64 " cancelled), %" PRIu64 " errors, %" PRIu64
            " prompt + %" PRIu64 " generated tokens in %" PRIu64 " steps\n",
            S.n_done, S.n_cancelled, S.n_errors, S.prompt_tokens, S.gen_tokens, S.steps);
    goto done;
fail:
    fprintf(stderr, "moet serve: %s\n", e.msg);
done:
    arena_stats.frozen = 0;   // shutting down: releasing is not allocating
    if (have_s) serve_free(&S);
    if (have_r) ref_free(&r);
    arena_release(&st.sc_mem);
    if (have_tok) tok_free(&st.t);
    pf_detach(&pa);
    if (have_m) ck_close(&m);
    return rc;
}


// ==========================================================================================
// command line
// ==========================================================================================

// ---- moet run: the reference forward over token ids --------------------------------------

// Token ids from text: a JSON array or integers separated by commas and/or whitespace.
// Returns the count, or -1 with e set. out has room for cap ids.
static int moet_parse_ids(const char *s, size_t len, int32_t *out, int cap, const char *what, moet_err *e) {
    int n = 0;
    size_t i = 0;
    int bracket = 0;
    while (i < len && isspace((unsigned char)s[i])) i++;
    if (i < len && s[i] == '[') { bracket = 1; i++; }
    for (;;) {
        while (i < len && (isspace((unsigned char)s[i]) || s[i] == ',')) i++;
        if (i >= len || (bracket && s[i] == ']')) break;
        if (!isdigit((unsigned char)s[i])) return err_set(e, "%s: byte %zu: expected a token id, found '%c'", what, i, s[i]);
        int64_t v = 0;
        while (i < len && isdigit((unsigned char)s[i])) {
            v = v * 10 + (s[i++] - '0');
            if (v > INT32_MAX) return err_set(e, "%s: token id at byte %zu is too large", what, i);
        }
        if (n >= cap) return err_set(e, "%s: more than %d token ids", what, cap);
        out[n++] = (int32_t)v;
    }
    if (bracket) {
        if (i >= len || s[i] != ']') return err_set(e, "%s: missing ']'", what);
        i++;
        while (i < len && isspace((unsigned char)s[i])) i++;
        if (i != len) return err_set(e, "%s: trailing characters after ']'", what);
    }
    return n;
}

static int moet_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;   // ties: the lowest id
    return b;
}

static void run_usage(FILE *f) {
    fputs("usage: moet run --model DIR (--ids LIST | --ids-file FILE) [options]\n"
          "The float32 reference forward pass over token ids: prefill, then greedy decode steps.\n"
          "options:\n"
          "  --model DIR          checkpoint directory (config.json, *.safetensors, hf_quant_config.json)\n"
          "  --ids LIST           prompt token ids, comma separated\n"
          "  --ids-file FILE      prompt token ids: a JSON array, or ids separated by commas/whitespace\n"
          "  --greedy N           greedy decode steps after the prompt (default 0)\n"
          "  --out FILE           write prefill_logits [T,V], greedy_ids [N], decode_logits [N,V] (safetensors)\n"
          "  --dump-hidden        also write hidden.<i> [T,H] (embeddings, each layer's output, final norm)\n"
          "  --planes FILE        routed experts from this MOET2PF1 plane file\n"
          "  --no-verify          with --planes: skip the SHA-256 check of every slot\n"
          "  --strict-revision    with --planes: refuse a file built from another checkpoint revision\n"
          "  --backend cpu        the backend (cpu only)\n"
          "  --threads N          worker threads for the matrix products (default 1)\n"
          "  --chunk N            prefill in chunks of N tokens (default 512)\n"
          "  -h, --help           this text\n",
          f);
}

static int cmd_run(int argc, char **argv) {
    const char *model = NULL, *ids_arg = NULL, *ids_file = NULL, *out = NULL, *backend = "cpu", *planes = NULL;
    int greedy = 0, dump_hidden = 0, threads = 1, chunk = 512;
    pf_serve_opts popt = {0, 0, 0, 1};   // --no-verify, --strict-revision; progress on stderr
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") && more) model = argv[++i];
        else if (!strcmp(a, "--ids") && more) ids_arg = argv[++i];
        else if (!strcmp(a, "--ids-file") && more) ids_file = argv[++i];
        else if (!strcmp(a, "--greedy") && more) greedy = atoi(argv[++i]);
        else if (!strcmp(a, "--out") && more) out = argv[++i];
        else if (!strcmp(a, "--dump-hidden")) dump_hidden = 1;
        else if (!strcmp(a, "--backend") && more) backend = argv[++i];
        else if (!strcmp(a, "--threads") && more) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--chunk") && more) chunk = atoi(argv[++i]);
        else if (!strcmp(a, "--planes") && more) planes = argv[++i];
        else if (!strcmp(a, "--no-verify")) popt.no_verify = 1;
        else if (!strcmp(a, "--strict-revision")) popt.strict_revision = 1;
        else {
            fprintf(stderr, "moet run: unknown or incomplete option '%s'\n", a);
            run_usage(stderr);
            return 2;
        }
    }
    if (!model || (!ids_arg == !ids_file)) {
        fprintf(stderr, "moet run: need --model DIR and exactly one of --ids LIST / --ids-file FILE\n");
        return 2;
    }
    if (strcmp(backend, "cpu")) {
        fprintf(stderr, "moet run: backend '%s' is not available (cpu)\n", backend);
        return 2;
    }
    if (greedy < 0 || greedy > MOET_MAX_RUN_TOKENS || threads < 1 || threads > MOET_MAX_THREADS || chunk < 1) {
        fprintf(stderr, "moet run: --greedy must be in [0, %d], --threads in [1, %d], --chunk >= 1\n", MOET_MAX_RUN_TOKENS, MOET_MAX_THREADS);
        return 2;
    }
    moet_err e = {{0}};
    static int32_t ids[MOET_MAX_RUN_TOKENS];
    int T;
    if (ids_arg) T = moet_parse_ids(ids_arg, strlen(ids_arg), ids, MOET_MAX_RUN_TOKENS, "--ids", &e);
    else {
        size_t len;
        char *text = arena_read_small(ids_file, 64u << 20, &len, &e);
        T = text ? moet_parse_ids(text, len, ids, MOET_MAX_RUN_TOKENS, ids_file, &e) : -1;
        if (text) arena_sys_free(text, len + 1);
    }
    if (T < 0 || T == 0) {
        fprintf(stderr, "moet run: %s\n", T < 0 ? e.msg : "no token ids given");
        return 1;
    }
    if (T + greedy > MOET_MAX_RUN_TOKENS) {
        fprintf(stderr, "moet run: %d prompt + %d generated tokens exceed the limit of %d\n", T, greedy, MOET_MAX_RUN_TOKENS);
        return 1;
    }
    ck_model m;
    if (ck_open(&m, model, &e)) {
        fprintf(stderr, "moet run: %s\n", e.msg);
        return 1;
    }
    pf_attached pa = {0};   // routed experts from the plane file (--planes)
    if (planes && pf_attach_planes(&m, planes, &popt, &pa, &e)) {
        fprintf(stderr, "moet run: %s\n", e.msg);
        ck_close(&m);
        return 1;
    }
    const ck_config *c = &m.cfg;
    int V = c->vocab, H = c->hidden, L = c->n_layers;
    for (int t = 0; t < T; t++)
        if (ids[t] >= V) {
            fprintf(stderr, "moet run: token id %d (position %d) is outside the vocabulary of %d\n", ids[t], t, V);
            ck_close(&m);
            return 1;
        }
    if (chunk > T) chunk = T;
    ref_engine r;
    if (ref_init(&r, &m, 1, T + greedy, chunk, threads, &e)) {
        fprintf(stderr, "moet run: %s\n", e.msg);
        ck_close(&m);
        return 1;
    }
    // outputs: prefill logits [T, V] (only kept with --out), decode logits [N, V], hidden [L+1][T, H]
    arena plan = arena_measure("run outputs"), mem;
    float *prefill = NULL, *decode = NULL, *hid[MOET_MAX_LAYERS + 1] = {0};
    int32_t *gids = NULL;
    for (int pass = 0; pass < 2; pass++) {
        arena *a = pass ? &mem : &plan;
        if (pass && arena_init(&mem, "run outputs", plan.used, &e)) {
            fprintf(stderr, "moet run: %s\n", e.msg);
            return 1;
        }
        prefill = arena_take(a, sizeof(float) * (size_t)(out ? T : chunk) * V, 64, "prefill logits");
        decode = arena_take(a, sizeof(float) * (size_t)(greedy ? greedy : 1) * V, 64, "decode logits");
        gids = arena_take(a, sizeof(int32_t) * (size_t)(greedy ? greedy : 1), 64, "greedy ids");
        for (int i = 0; dump_hidden && i <= L; i++) hid[i] = arena_take(a, sizeof(float) * (size_t)T * H, 64, "hidden");
    }
    arena_done(&mem);
    int slot = 0, rc = 1;
    double t0 = moet_now();
    for (int s = 0; s < T; s += chunk) {
        int n = T - s < chunk ? T - s : chunk, off[2] = {0, n};
        float *hp[MOET_MAX_LAYERS + 1];
        for (int i = 0; dump_hidden && i <= L; i++) hp[i] = hid[i] + (size_t)s * H;
        float *lp = out ? prefill + (size_t)s * V : prefill;
        if (ref_forward(&r, 1, &slot, ids + s, off, lp, 1, dump_hidden ? hp : NULL, &e)) goto fail;
    }
    double t1 = moet_now();
    const float *last = prefill + (size_t)((out ? T : ((T - 1) % chunk) + 1) - 1) * V;
    int next = moet_argmax(last, V);
    for (int s = 0; s < greedy; s++) {
        int off[2] = {0, 1};
        gids[s] = next;
        if (ref_forward(&r, 1, &slot, &gids[s], off, decode + (size_t)s * V, 1, NULL, &e)) goto fail;
        next = moet_argmax(decode + (size_t)s * V, V);
    }
    double t2 = moet_now();
    fprintf(stderr, "moet run: %d prompt tokens in %.3f s (%.1f tok/s), %d greedy tokens in %.3f s (%.1f tok/s):", T, t1 - t0,
            T / (t1 - t0), greedy, t2 - t1, greedy ? greedy / (t2 - t1) : 0.0);
    for (int s = 0; s < greedy && s < 32; s++) fprintf(stderr, " %d", gids[s]);
    fprintf(stderr, "%s\n", greedy > 32 ? " ..." : "");
    if (out) {
        st_out tv[3 + MOET_MAX_LAYERS + 1];
        static char names[MOET_MAX_LAYERS + 1][32];
        int nt = 0;
        tv[nt++] = (st_out){"prefill_logits", ST_F32, 2, {T, V}, prefill};
        if (greedy) {
            tv[nt++] = (st_out){"greedy_ids", ST_I32, 1, {greedy}, gids};
            tv[nt++] = (st_out){"decode_logits", ST_F32, 2, {greedy, V}, decode};
        }
        for (int i = 0; dump_hidden && i <= L; i++) {
            snprintf(names[i], sizeof names[i], "hidden.%d", i);
            tv[nt++] = (st_out){names[i], ST_F32, 2, {T, H}, hid[i]};
        }
        if (st_save(out, tv, nt, &e)) goto fail;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moet run: %s\n", e.msg);
done:
    arena_release(&mem);
    ref_free(&r);
    pf_detach(&pa);
    ck_close(&m);
    return rc;
}

static void moet_usage(FILE *f) {
    fputs("usage: moet <command> [options]\n"
          "commands:\n"
          "  run       reference forward pass of a model over token ids (see README)\n"
          "  serve     JSONL requests on stdin, answers on stdout (moet serve --help)\n"
          "  build-planes  requantize the routed experts of a checkpoint into a MOET2PF1 plane file\n"
          "  verify    check a plane file: header, slot table, every slot's SHA-256 and padding\n"
          "  info      print the header of a plane file as JSON\n"
          "  synth     write a random checkpoint with the tensors a config describes\n"
          "  tokenize  text lines (JSON strings) to token ids, or back with --decode\n",
          f);
}

#ifndef MOET_TEST
int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        moet_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "run")) return cmd_run(argc, argv);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc, argv);
    if (!strcmp(argv[1], "build-planes")) return cmd_build_planes(argc, argv);
    if (!strcmp(argv[1], "verify")) return cmd_verify(argc, argv);
    if (!strcmp(argv[1], "info")) return cmd_info(argc, argv);
    if (!strcmp(argv[1], "synth")) return cmd_synth(argc, argv);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc, argv);
    fprintf(stderr, "moet: unknown command '%s'\n", argv[1]);
    moet_usage(stderr);
    return 2;
}
#endif
