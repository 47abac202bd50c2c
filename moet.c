// moet.c — the whole program as one translation unit (a unity build).
//
// moet serves qwen3_5_moe models (Qwen3.6-35B-A3B) with every routed expert as 2-bit planes
// read from one MOET2PF1 file. This file is the table of contents: it includes every module in
// dependency order, leaf modules first, then holds the command line. Every function is static.
// Tests `#define MOET_TEST` and include this file to call the internals directly.

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
//          pf_dequant_slot (MOET2PF1 2-bit expert plane file: layout, quantizer, writer, reader)
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
// defines: samp_pick, samp_logprobs, samp_seed (sampler: penalties, temperature, top-k/p, min-p)
#include "format/sampler.c"
// defines: proto_parse (request lines), proto_out / po_* (response writer), proto_write_error
#include "format/protocol.c"
// defines: serve_init, serve_run (continuous-batching scheduler and the line loop of moet serve)
#include "format/serve.c"
// defines: cmd_serve (flags, model + tokenizer + generation config behind the CPU backend)
#include "format/serve_cmd.c"

// ==========================================================================================
// command line
// ==========================================================================================

// ---- moet run: the reference forward over token ids --------------------------------------

static double moet_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

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
    pf_serve_opts popt = {0, 0, 0, 0};   // --no-verify, --strict-revision
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
