// moet.c — the whole program as one translation unit (a unity build), and its table of contents.
//
// moet serves qwen3_5_moe models (Qwen3.6-35B-A3B) with every routed expert as 2-bit planes read
// from one MOET2PF1 file. Every module is included here in floor order — each file uses only
// names defined above it — and every function is static. Tests `#define MOET_TEST` and include
// this file to call the internals directly.
//
//   memory    arena/limits.h        every fixed limit (MOET_MAX_*)
//             sass/gpu_abi.h        what host and kernels agree on (weight descriptors, KV types,
//                                   launch geometry): constants only, shared with nvcc
//             arena/base.c          errors (moet_err, MOET_ASSERT), checked size arithmetic, clock
//             arena/arena.c         planned memory: host/pinned/device arenas, ARENA_TAKE, arena_plan
//                                   (arena/DESIGN.md: memory plan, numerics, streams, invariance)
//   bytes     format/json.c         RFC 8259 JSON: parser, writer
//             format/outfile.c      output files and directories: a temporary beside them, renamed
//                                   when complete, removed on failure and on every fatal signal
//             format/stdout.c       the commands' stdout: one writer, a failed write is an error
//             format/lines.c        input lines (serve, eval --data, tokenize): BOM, CR, UTF-8, length
//             format/args.c         the command line of every command: flag tables, exact numbers,
//                                   lists, input and output paths checked before any work
//             format/unicode.c      Unicode properties and NFC for the tokenizer
//             format/tokenizer.c    byte-level BPE (tokenizer.json): encode, decode, streaming
//             format/safetensors.c  safetensors shards: mmap + validation
//             format/checkpoint.c   config.json, the weights as stored (BF16/FP8/NVFP4),
//                                   generation_config.json, the model's name  (format/CHECKPOINT.md)
//             format/planes.c       the MOET2PF1 plane file: layout, quantizer, writer, reader
//                                   (format/PLANES.md)
//             format/planes_model.c a plane file for one model: geometry checks, attach
//             format/st_write.c     streaming safetensors writer
//             format/chat.c         the chat template; reasoning/content split
//             format/protocol.c     the JSONL protocol: request lines, sampling parameters,
//                                   the line writer's primitives (format/PROTOCOL.md)
//   engine    (this file)           the sampler; the backend interface (engine_backend); the
//                                   reference forward pass, the CPU backend and every kernel's
//                                   twin (sass/MODEL.md)
//   device    gpu/cuda.c            the Driver API (dlopen), CU_CHECK, the device
//             gpu/kernels.c         the embedded cubins, the kernel table, gpu_launch, profiler
//             gpu/launch.c          one typed launcher per kernel (geometry from the shapes, limits checked)
//             gpu/pool.c            the resident expert pool (O_DIRECT, SHA-256, copy streams)
//             gpu/cache.c           the expert cache on the device (--expert-cache-gb: fetches per layer)
//             gpu/engine.c          the device forward pass (arenas, weights, KV pages, steps)
//             gpu/backend.c         the GPU engine_backend; engine_open (--backend)
//   serving   (this file)           the prefix cache's block table (hash chains of prompt blocks,
//                                   least recently used eviction); the scheduler and serve loop;
//                                   the answer and error lines; `moet serve`
//   commands  format/tokenizer_cmd.c  `moet tokenize`
//             format/planes_cmd.c   `moet build-planes`, `moet verify`, `moet info`
//             format/synth.c        `moet synth`
//             format/eval.c         `moet eval`
//             gpu/bench.c           `moet bench`
//             (this file)           `moet run`; main and its command table

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
#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <dlfcn.h>

// ==========================================================================================
// memory
// ==========================================================================================

// defines: every fixed limit (MOET_MAX_*)
#include "arena/limits.h"
// defines: gpu_mat, gpu_lin_set, GPU_W_*, GPU_KV_*, GPU_KV_PAGE, kernel geometry (shared with sass/)
#include "sass/gpu_abi.h"
// defines: samp_rng, samp_seed / samp_next / samp_uniform, samp_expf (the sampler's arithmetic, shared with sass/)
#include "sass/samp.h"
// defines: moet_err, err_set, err_wrap, MOET_ASSERT, moet_die, size_mul/size_add, moet_now
#include "arena/base.c"
// defines: arena (host, pinned, device: measure / init / take), ARENA_TAKE, arena_plan,
//          arena_map_file, the allocation counter and its freeze
#include "arena/arena.c"

// ==========================================================================================
// bytes: files, text and lines
// ==========================================================================================

// defines: js_doc, js_measure, js_parse, js_get, js_writer (RFC 8259 JSON)
#include "format/json.c"
// defines: of_begin, of_write, of_commit, of_abort (an output file: temporary file + rename,
//          only over a regular file, removed on every error and fatal signal); of_dir_begin,
//          of_dir_file, of_dir_check, of_dir_commit, of_dir_abort (an output directory, the same)
#include "format/outfile.c"
// defines: so_write, so_puts, so_printf, so_failed, so_finish, so_guard_fds (the commands' stdout)
#include "format/stdout.c"
// defines: ln_reader, ln_init_fd, ln_init_text, ln_take, ln_fill, ln_bad_utf8 (input lines)
#include "format/lines.c"
// defines: moet_flag, moet_args, FLAG_* (flag tables), moet_text_i64, moet_text_u64,
//          moet_list_parse (numbers and lists read exactly)
#include "format/args.c"
// defines: uni_props, uni_nfc (Unicode properties and NFC, tables from format/unicode_tables.h)
#include "format/unicode.c"
// defines: tok, tok_load, tok_encode, tok_decode, tok_decode_stream, tok_find
#include "format/tokenizer.c"
// defines: st_set, st_open, st_find (safetensors shards: mmap + validation)
#include "format/safetensors.c"
// defines: ck_config, ck_model, ck_open, ck_mat + ck_row_f32/ck_row_f64 (exact weight decode),
//          ck_gen_config (generation_config.json), ck_path, ck_hf_snapshot, ck_model_name
#include "format/checkpoint.c"
// defines: pf_plan, pf_quant_expert, pf_build, pf_open, pf_read_slot, pf_verify_slots,
//          (MOET2PF1 2-bit expert plane file: layout, quantizer, writer, reader)
#include "format/planes.c"
// defines: pf_serve_opts, pf_open_for_model, pf_expert_mats, pf_attach_planes
#include "format/planes_model.c"
// defines: stw_begin, stw_write, stw_end (streaming safetensors writer)
#include "format/st_write.c"
// defines: chat_render (the Qwen3.6 chat template), chat_split_* (reasoning/content splitter)
#include "format/chat.c"
// defines: samp_params, proto_parse (request lines), proto_out / po_* (line writer primitives)
#include "format/protocol.c"

// ==========================================================================================
// the engine, 1: the sampler
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
//
// The state of a sequence's sampler — its parameters, its generator, its penalty counts —
// lives in a samp_bank, one entry per backend sequence slot: taken at admission, cleared at
// release. Every backend picks through it, so a request samples the same way on each.

// The sampler state of one sequence slot. Penalty state is kept only when a penalty is set,
// and is all zero when the slot is free.
typedef struct {
    samp_params sp;
    samp_rng rng;
    int active;          // taken by a sequence
    int penalized;       // a penalty is set: seen, count and touched are kept
    int logprobs;        // report the picked token's logprob ...
    int top_logprobs;    // ... and this many most likely tokens (0 .. MOET_MAX_LOGPROBS)
    uint16_t *count;     // [V] times generated (saturates at 65535)
    uint8_t *seen;       // [(V + 7) / 8] bit per token: in the prompt or the output
    int32_t *touched;    // [touch_cap] the ids with a seen bit, each once (to clear them)
    int n_touched;
} samp_slot;

#define SAMP_BLOCK 64   // logits per block maximum of the pick (256 bytes)

// A candidate token: its value (a logit, then a probability) and its id.
typedef struct {
    float p;
    int32_t id;
} samp_cand;

// Working memory for one pick (rows are picked one at a time).
typedef struct {
    float *work;         // [V] penalized logits
    float *bmax;         // [n_blocks] block maxima of the penalized logits
    float *bmax_raw;     // [n_blocks] block maxima of the raw row
    float *heap;         // [n_blocks] order statistics of block maxima or of candidates
    samp_cand *cand;     // [V] candidates
} samp_scratch;

// Sampler state of every sequence slot of a backend, planned once.
typedef struct {
    int n_vocab, n_slots;
    int touch_cap;       // distinct ids one slot can note: min(V, 2 · max_len) (prompt + picks)
    samp_slot *slot;     // [n_slots]
    samp_scratch sc;
    arena mem;
} samp_bank;

static int samp_has_penalty(const samp_params *p) {
    return p->presence_penalty != 0 || p->frequency_penalty != 0 || p->repetition_penalty != 1;
}

// ---- the bank: per-slot state ---------------------------------------------------------------


static void samp_bank_carve(samp_bank *b, arena *a) {
    size_t V = (size_t)b->n_vocab;
    ARENA_TAKE(a, b->slot, b->n_slots, "sampler slots");
    for (int s = 0; s < b->n_slots; s++) {
        samp_slot *q = a->base ? &b->slot[s] : &(samp_slot){0};
        ARENA_TAKE(a, q->count, V, "penalty counts");
        ARENA_TAKE(a, q->seen, (V + 7) / 8, "penalty bits");
        ARENA_TAKE(a, q->touched, b->touch_cap, "penalty ids");
    }
    size_t nb = (V + SAMP_BLOCK - 1) / SAMP_BLOCK;
    ARENA_TAKE(a, b->sc.work, V, "sampler scratch");
    ARENA_TAKE(a, b->sc.bmax, nb, "sampler block maxima");
    ARENA_TAKE(a, b->sc.bmax_raw, nb, "sampler block maxima");
    ARENA_TAKE(a, b->sc.heap, nb, "sampler heap");
    ARENA_TAKE(a, b->sc.cand, V, "sampler candidates");
}

// Plans and allocates the state of n_slots sequences of at most max_len tokens over a
// vocabulary of n_vocab. Returns -1 with e set when the memory is refused.
static int samp_bank_init(samp_bank *b, int n_vocab, int n_slots, int max_len, moet_err *e) {
    memset(b, 0, sizeof *b);
    if (n_vocab < 1 || n_slots < 1 || max_len < 1) return err_set(e, "sampler sizes must be positive");
    b->n_vocab = n_vocab;
    b->n_slots = n_slots;
    b->touch_cap = (int64_t)2 * max_len < n_vocab ? 2 * max_len : n_vocab;
    arena_plan p = arena_plan_begin(&b->mem, "sampler", ARENA_HOST, e);
    while (arena_plan_pass(&p)) samp_bank_carve(b, p.on);
    if (p.failed) return -1;
    for (int s = 0; s < n_slots; s++) {   // the penalty state starts (and stays, between sequences) zero
        samp_slot *q = &b->slot[s];
        memset(q->count, 0, sizeof(uint16_t) * (size_t)n_vocab);
        memset(q->seen, 0, (size_t)(n_vocab + 7) / 8);
        q->active = q->n_touched = 0;
    }
    return 0;
}

static void samp_bank_free(samp_bank *b) { arena_release(&b->mem); }

// Marks id as seen (prompt or output); an output also counts.
static void samp_note(const samp_bank *b, samp_slot *s, int32_t id, int output) {
    uint8_t bit = (uint8_t)(1u << (id & 7));
    if (!(s->seen[id >> 3] & bit)) {
        MOET_ASSERT(s->n_touched < b->touch_cap, "sampler: more than %d distinct ids noted in one slot", b->touch_cap);
        s->seen[id >> 3] |= bit;
        s->touched[s->n_touched++] = id;
    }
    if (output && s->count[id] != UINT16_MAX) s->count[id]++;
}

// Takes slot for a new sequence: its parameters, its generator seeded, the prompt's tokens
// seen (for the repetition penalty). Returns -1 with e set on a bad argument.
static int samp_bank_admit(samp_bank *b, int slot, const samp_params *sp, uint64_t seed, int logprobs, int top_logprobs,
                           const int32_t *prompt, int n_prompt, moet_err *e) {
    if (slot < 0 || slot >= b->n_slots) return err_set(e, "sampler: slot %d out of range [0, %d)", slot, b->n_slots);
    samp_slot *s = &b->slot[slot];
    if (s->active) return err_set(e, "sampler: slot %d is taken", slot);
    if (top_logprobs < 0 || top_logprobs > MOET_MAX_LOGPROBS || top_logprobs > b->n_vocab)
        return err_set(e, "sampler: top_logprobs %d: expected 0 .. %d", top_logprobs,
                       MOET_MAX_LOGPROBS < b->n_vocab ? MOET_MAX_LOGPROBS : b->n_vocab);
    if (n_prompt < 0 || (n_prompt > 0 && !prompt)) return err_set(e, "sampler: no prompt of %d tokens", n_prompt);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= b->n_vocab)
            return err_set(e, "sampler: prompt token %d (position %d) outside the vocabulary [0, %d)", prompt[i], i, b->n_vocab);
    s->sp = *sp;
    samp_seed(&s->rng, seed);
    s->logprobs = logprobs != 0;
    s->top_logprobs = logprobs ? top_logprobs : 0;
    s->penalized = samp_has_penalty(sp);
    s->active = 1;
    if (s->penalized)
        for (int i = 0; i < n_prompt; i++) samp_note(b, s, prompt[i], 0);
    return 0;
}

// The slot's sequence is over: back to all zero, touching only the ids it noted.
static void samp_bank_release(samp_bank *b, int slot) {
    samp_slot *s = &b->slot[slot];
    for (int i = 0; i < s->n_touched; i++) {
        int32_t id = s->touched[i];
        s->seen[id >> 3] = 0;
        s->count[id] = 0;
    }
    s->n_touched = 0;
    s->active = 0;
}

// ---- the pick ----------------------------------------------------------------------------
//
// Fast at Qwen3.6's vocabulary (V = 248,320, a row of 970 KiB) and exactly the tokens of the
// plain algorithm (every probability computed, all candidates sorted; tests/samp_oracle.h
// keeps it, and tests/test_sampler.c compares the two). One pass over the row finds the
// maximum of each block of SAMP_BLOCK logits (vector max, no branch on the data); the rest
// looks only at the blocks that matter:
//  - greedy: the first block that holds the row maximum, then its first index (ties go to
//    the lowest id);
//  - top_k / min_p: logits below a bound `lo` (the (2k + 8)-th largest block maximum, which
//    at least 2k + 8 logits reach; max + T·(log(min_p) − 0.001)) are never exponentiated.
//    The probability of the gathered ones is computed with the very expression of the plain
//    algorithm, and f(lo) bounds every probability left out (the probability never falls as
//    the logit grows: the float difference and product are monotone, and so is samp_expf,
//    sass/samp.h, checked over every float <= 0 by tests/test_sampler.c); when that bound shows no left-out token can be a
//    candidate, or none can reach the top k, the result is exact; otherwise (rare: ties
//    across the bound) every probability is computed;
//  - top_p alone and plain temperature sampling need the whole row's mass, summed in id
//    order: every probability is computed (the plain path, minus the global sort);
//  - logprobs: one vector pass for the log-sum-exp, the top_logprobs gathered from the blocks.
// Candidates carry their own sort key (probability, then id: a total order), so no global
// key, no qsort (glibc's may allocate), and the result never depends on the sort algorithm.

// a comes before b: larger value, then lower id.
static int samp_before(samp_cand a, samp_cand b) { return a.p > b.p || (a.p == b.p && a.id < b.id); }

// Block maxima of x[0..V) into bmax[ceil(V / SAMP_BLOCK)]; returns the row maximum. `>`
// selects on 8 independent lanes (NaN never wins), which the compiler turns into vector max.
static float samp_block_max(const float *x, int V, float *bmax) {
    float all = -INFINITY;
    int b = 0;
    for (; (b + 1) * SAMP_BLOCK <= V; b++) {
        const float *p = x + (size_t)b * SAMP_BLOCK;
        float l[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (int i = 0; i < SAMP_BLOCK; i += 8)
            for (int j = 0; j < 8; j++) l[j] = p[i + j] > l[j] ? p[i + j] : l[j];
        float m01 = l[1] > l[0] ? l[1] : l[0], m23 = l[3] > l[2] ? l[3] : l[2];   // a tree over the lanes
        float m45 = l[5] > l[4] ? l[5] : l[4], m67 = l[7] > l[6] ? l[7] : l[6];
        m01 = m23 > m01 ? m23 : m01;
        m45 = m67 > m45 ? m67 : m45;
        float m = m45 > m01 ? m45 : m01;
        bmax[b] = m;
        all = m > all ? m : all;
    }
    if (b * SAMP_BLOCK < V) {   // the short last block
        float m = -INFINITY;
        for (int t = b * SAMP_BLOCK; t < V; t++) m = x[t] > m ? x[t] : m;
        bmax[b] = m;
        all = m > all ? m : all;
    }
    return all;
}

// The lowest id holding the row maximum mx (0 when the row holds no number).
static int32_t samp_first_max(const float *x, int V, const float *bmax, float mx) {
    int nb = (V + SAMP_BLOCK - 1) / SAMP_BLOCK;
    for (int b = 0; b < nb; b++)
        if (bmax[b] == mx) {
            int end = (b + 1) * SAMP_BLOCK < V ? (b + 1) * SAMP_BLOCK : V;
            for (int t = b * SAMP_BLOCK; t < end; t++)
                if (x[t] == mx) return t;
        }
    return 0;
}

// Min-heaps of floats: the r largest values so far, the smallest of them at the root.
static void samp_fheap_down(float *h, int r, int i) {
    for (;;) {
        int l = 2 * i + 1, q = l + 1, w = i;
        if (l < r && h[l] < h[w]) w = l;
        if (q < r && h[q] < h[w]) w = q;
        if (w == i) return;
        float t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

// The r-th largest of v[0..n) (1 <= r <= n); heap has room for r.
static float samp_kth(const float *v, int n, int r, float *heap) {
    for (int i = 0; i < r; i++) heap[i] = v[i];
    for (int i = r / 2; i-- > 0;) samp_fheap_down(heap, r, i);
    for (int i = r; i < n; i++)
        if (v[i] > heap[0]) {
            heap[0] = v[i];
            samp_fheap_down(heap, r, 0);
        }
    return heap[0];
}

// The same over the values of candidates.
static float samp_kth_cand(const samp_cand *c, int n, int r, float *heap) {
    for (int i = 0; i < r; i++) heap[i] = c[i].p;
    for (int i = r / 2; i-- > 0;) samp_fheap_down(heap, r, i);
    for (int i = r; i < n; i++)
        if (c[i].p > heap[0]) {
            heap[0] = c[i].p;
            samp_fheap_down(heap, r, 0);
        }
    return heap[0];
}

// Every logit >= lo, in id order, from the blocks whose maximum reaches it: out[i] = {x, id}.
static int samp_gather(const float *x, int V, const float *bmax, float lo, samp_cand *out) {
    int n = 0, nb = (V + SAMP_BLOCK - 1) / SAMP_BLOCK;
    for (int b = 0; b < nb; b++) {
        if (!(bmax[b] >= lo)) continue;
        int end = (b + 1) * SAMP_BLOCK < V ? (b + 1) * SAMP_BLOCK : V;
        for (int t = b * SAMP_BLOCK; t < end; t++) {   // written always, kept when it passes
            out[n] = (samp_cand){x[t], t};
            n += x[t] >= lo;
        }
    }
    return n;
}

// Heaps of candidates whose root is the one that comes last (the worst kept so far).
static void samp_heap_down(samp_cand *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && samp_before(h[w], h[l])) w = l;
        if (r < k && samp_before(h[w], h[r])) w = r;
        if (w == i) return;
        samp_cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

// c[0..k) sorted, first the one that comes first (heapsort: no allocation, O(k log k)).
static void samp_sort(samp_cand *c, int k) {
    for (int i = k / 2; i-- > 0;) samp_heap_down(c, k, i);
    for (int end = k - 1; end > 0; end--) {
        samp_cand t = c[0]; c[0] = c[end]; c[end] = t;
        samp_heap_down(c, end, 0);
    }
}

// Moves the k (1 <= k <= n) candidates that come first to c[0..k), sorted: O(n log k).
static void samp_top(samp_cand *c, int n, int k) {
    for (int i = k / 2; i-- > 0;) samp_heap_down(c, k, i);
    for (int i = k; i < n; i++)
        if (samp_before(c[i], c[0])) {
            c[0] = c[i];
            samp_heap_down(c, k, 0);
        }
    samp_sort(c, k);
}

// The draw from the candidates c[0..n) (id order, probabilities relative to the most likely
// token): top_k, top_p, then one number of the generator, as the plain algorithm.
static int32_t samp_draw(samp_cand *c, int n, const samp_params *p, samp_rng *rng) {
    MOET_ASSERT(n > 0, "sampler: no candidate token");
    int sorted = 0;
    if (p->top_k > 0 && p->top_k < n) {
        samp_top(c, n, p->top_k);
        n = p->top_k;
        sorted = 1;
    }
    if (p->top_p < 1) {
        double total = 0;
        for (int i = 0; i < n; i++) total += c[i].p;
        if (!sorted) {
            // Only the most likely tokens can be kept: when the tokens above a threshold
            // already hold top_p of the mass, sort just those (lower the threshold if not).
            float th = 0;
            for (float t2 = 1e-4f; t2 > 1e-12f && th == 0; t2 *= 1e-4f) {
                double mass = 0;
                for (int i = 0; i < n; i++)
                    if (c[i].p >= t2) mass += c[i].p;
                if (mass >= p->top_p * total) th = t2;
            }
            if (th > 0) {
                int k = 0;
                for (int i = 0; i < n; i++)
                    if (c[i].p >= th) c[k++] = c[i];
                n = k;
            }
            samp_sort(c, n);
        }
        double acc = 0, need = p->top_p * total;
        int k = 0;
        while (k < n) {
            acc += c[k++].p;
            if (acc >= need) break;
        }
        n = k;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += c[i].p;
    double u = samp_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;   // u within rounding of the total
}

// One token id from the (penalized) logits x[0..V) with block maxima bmax and maximum mx.
static int32_t samp_pick(samp_scratch *sc, int V, const samp_params *p, samp_rng *rng, const float *x, const float *bmax,
                         float mx) {
    if (p->temperature == 0) return samp_first_max(x, V, bmax, mx);
    // probabilities relative to the most likely token, f(x) = exp((x − top) / T): f(top) = 1
    const float inv_t = 1.0f / p->temperature, top = mx;
    const float floor_p = p->min_p > 0 ? p->min_p : 0;   // min_p × p_max, and p_max = 1 here
    const int nb = (V + SAMP_BLOCK - 1) / SAMP_BLOCK, k = p->top_k;
    samp_cand *c = sc->cand;
    float lo = -INFINITY;   // only logits >= lo are looked at
    if (k > 0 && 2 * k + 8 <= nb) lo = samp_kth(bmax, nb, 2 * k + 8, sc->heap);
    if (floor_p > 0) {
        float lm = top + (logf(floor_p) - 1e-3f) * p->temperature;
        if (lm > lo) lo = lm;
    }
    if (lo > -INFINITY) {
        int g = samp_gather(x, V, bmax, lo, c), n = 0;
        for (int i = 0; i < g; i++) {
            float f = samp_expf((c[i].p - top) * inv_t);
            c[n] = (samp_cand){f, c[i].id};
            n += f > 0 && f >= floor_p;
        }
        float out = samp_expf((lo - top) * inv_t);   // no logit left out has a larger probability
        if (out == 0 || out < floor_p) return samp_draw(c, n, p, rng);   // none of them is a candidate
        if (k > 0 && n > k && k <= nb && samp_kth_cand(c, n, k, sc->heap) > out)
            return samp_draw(c, n, p, rng);   // none of them can be among the top k
    }
    int n = 0;
    for (int t = 0; t < V; t++) {
        float f = samp_expf((x[t] - top) * inv_t);
        c[n] = (samp_cand){f, t};
        n += f > 0 && f >= floor_p;
    }
    return samp_draw(c, n, p, rng);
}

// ---- logprobs ----------------------------------------------------------------------------

typedef float samp_v4 __attribute__((vector_size(16)));
typedef int32_t samp_i4 __attribute__((vector_size(16)));

// exp(y) on 4 lanes for y <= 0, to about 1.2e-7 relative (1 ulp): Cody-Waite reduction to
// [−ln2/2, ln2/2], e^r = 1 + r + r²·q(r) with q of degree 3 fitted for the least relative
// error there, 2^n put into the exponent bits. y below −87.3 counts as −87.3 (exp of it,
// 1e-38, is nothing beside the 1 of the row maximum in a sum).
static inline samp_v4 samp_exp4(samp_v4 y) {
    const samp_v4 lo = {-87.3f, -87.3f, -87.3f, -87.3f};
    samp_i4 keep = y > lo;   // NaN takes −87.3 too
    y = (samp_v4)(((samp_i4)y & keep) | ((samp_i4)lo & ~keep));
    samp_v4 k = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   // round to nearest
    samp_v4 r = y - k * 0.693359375f + k * 2.12194440e-4f;
    samp_v4 q = ((8.3338379501e-3f * r + 4.1898577938e-2f) * r + 1.6666886383e-1f) * r + 4.9999142573e-1f;
    samp_v4 e = q * (r * r) + r + 1.0f;
    samp_i4 scale = (__builtin_convertvector(k, samp_i4) + 127) << 23;
    return e * (samp_v4)scale;
}

// Σ exp(x[t] − mx) over the row: 8 lanes summed in float within a block, blocks in double.
static double samp_sum_exp(const float *x, int V, float mx) {
    const samp_v4 m = {mx, mx, mx, mx};
    double total = 0;
    int t = 0;
    for (; t + SAMP_BLOCK <= V; t += SAMP_BLOCK) {
        samp_v4 a = {0, 0, 0, 0}, b = a, c = a, d = a;
        for (int i = 0; i < SAMP_BLOCK; i += 16) {
            samp_v4 u, v, w, z;
            memcpy(&u, x + t + i, sizeof u);
            memcpy(&v, x + t + i + 4, sizeof v);
            memcpy(&w, x + t + i + 8, sizeof w);
            memcpy(&z, x + t + i + 12, sizeof z);
            a += samp_exp4(u - m);
            b += samp_exp4(v - m);
            c += samp_exp4(w - m);
            d += samp_exp4(z - m);
        }
        a = (a + b) + (c + d);
        total += (double)((a[0] + a[1]) + (a[2] + a[3]));
    }
    for (; t < V; t++) {
        samp_v4 u = {x[t] - mx, 0, 0, 0};
        total += (double)samp_exp4(u)[0];
    }
    return total;
}

// log-softmax of the raw logits (block maxima bmax, maximum mx) at `chosen`, and the n_top
// most likely tokens (ids and logprobs, most likely first, ties to the lower id).
static float samp_logprobs(samp_scratch *sc, const float *logits, int V, const float *bmax, float mx, int32_t chosen, int n_top,
                           int32_t *top_ids, float *top_lp) {
    const double lse = mx + log(samp_sum_exp(logits, V, mx));
    if (n_top > 0) {
        int nb = (V + SAMP_BLOCK - 1) / SAMP_BLOCK;
        float lo = n_top <= nb ? samp_kth(bmax, nb, n_top, sc->heap) : -INFINITY;   // n_top logits reach it
        int n = samp_gather(logits, V, bmax, lo, sc->cand), k = n < n_top ? n : n_top;
        samp_top(sc->cand, n, k);
        for (int i = 0; i < k; i++) {
            top_ids[i] = sc->cand[i].id;
            top_lp[i] = (float)(sc->cand[i].p - lse);
        }
        for (int i = k; i < n_top; i++) top_ids[i] = chosen, top_lp[i] = -INFINITY;   // a row of NaNs only
    }
    return (float)(logits[chosen] - lse);
}

// ---- the bank's pick ------------------------------------------------------------------------

// Whether slot's pick is its row's first largest logit and nothing else (greedy, no penalty to
// apply or count, no logprobs): samp_bank_pick then draws no random number and changes no state,
// so a backend may take that token where the logits are (the GPU's k_argmax) and skip the pick.
static int samp_bank_plain_greedy(const samp_bank *b, int slot) {
    const samp_slot *s = &b->slot[slot];
    return s->active && s->sp.temperature == 0 && !s->penalized && !s->logprobs;
}

// Picks the next token of the sequence in slot from its logits row [V] and notes it in the
// slot's penalty counts. When the slot asked for logprobs, *lp gets the token's logprob and
// top_ids / top_lp [top_logprobs] the most likely tokens; otherwise they are not written.
// Speculative decoding verifies a draft with this same pick (sass/MODEL.md §6): the draft is
// kept when it is the token picked.
static void samp_bank_pick(samp_bank *b, int slot, const float *row, int32_t *token, float *lp, int32_t *top_ids, float *top_lp) {
    samp_slot *s = &b->slot[slot];
    samp_scratch *sc = &b->sc;
    const samp_params *p = &s->sp;
    const int V = b->n_vocab;
    MOET_ASSERT(s->active, "sampler: pick from free slot %d", slot);
    const int pen = s->penalized && s->n_touched;
    // the raw row's block maxima: for the pick without penalties, for the logprobs always
    const float mx_raw = !pen || s->logprobs ? samp_block_max(row, V, sc->bmax_raw) : 0;
    const float *x = row, *bmax = sc->bmax_raw;
    float mx = mx_raw;
    if (pen) {   // penalties change only the tokens seen
        float *w = sc->work;
        memcpy(w, row, sizeof(float) * (size_t)V);
        for (int i = 0; i < s->n_touched; i++) {
            int32_t t = s->touched[i];
            if (p->repetition_penalty != 1) w[t] = w[t] > 0 ? w[t] / p->repetition_penalty : w[t] * p->repetition_penalty;
            uint16_t c = s->count[t];
            if (c) w[t] -= p->frequency_penalty * (float)c + p->presence_penalty;
        }
        x = w;
        bmax = sc->bmax;
        mx = samp_block_max(w, V, sc->bmax);
    }
    int32_t id = samp_pick(sc, V, p, &s->rng, x, bmax, mx);
    if (s->logprobs) *lp = samp_logprobs(sc, row, V, sc->bmax_raw, mx_raw, id, s->top_logprobs, top_ids, top_lp);
    if (s->penalized) samp_note(b, s, id, 1);
    *token = id;
}

// ==========================================================================================
// the engine, 2: the backend interface
// ==========================================================================================
//
// What the scheduler needs from a forward pass (the CPU reference, the GPU).
//
// A backend holds max_seqs sequence slots, each an independent token history of at most
// max_len tokens; KV room, recurrent state and the sampler state (samp_bank) live behind it.
// A sequence's life: admit (KV room reserved, sampler seeded) → steps → release. A step
// appends tokens to some slots and, for the rows that want one, picks each row's next token
// with that slot's own sampler, so logits never have to leave the backend. launch/collect
// split a step so the host can prepare the next step while this one runs.
//
// Promises of every backend (tests/test_backend.c checks them through this interface):
//  - a row's results depend only on its own slot's history and sampler state: never on the
//    other rows of the step (batch invariance), nor on how a prompt was cut into chunks when
//    every cut lies at a multiple of chunk_align, counted in absolute token positions of the
//    sequence (chunk invariance). So a seeded request gives the same tokens alone or in a busy
//    batch. Callers cut a prompt only at such multiples or at its end, and feed generated
//    tokens one at a time. A backend that works on fixed blocks of positions (the GPU's
//    chunked gated delta rule) rounds differently for a cut inside a block: still
//    deterministic for the same cuts, but not the same floats;
//  - with no sequence admitted, any reserve <= max_len fits (a waiting request always gets in
//    once the others are done);
//  - a row that would take its sequence past its reserve is refused (-1), nothing changed;
//  - a failing call (-1, e set) changes nothing;
//  - a sequence admitted from saved prefix blocks (engine_backend.admit_from, save) gives
//    the same bits as the same sequence computed from its first token, with every cut at a
//    multiple of chunk_align: a block holds the state after a multiple of prefix_block tokens,
//    itself a multiple of chunk_align, so the restored sequence is one cut at its first
//    position, which chunk invariance promises to be free.

// What a sequence slot needs from the request that takes it (admission).
typedef struct {
    samp_params sp;            // temperature 0 = greedy, top_k, top_p, min_p, penalties
    uint64_t seed;             // the request's generator seed (xoshiro256** seeded by splitmix64)
    int logprobs;              // 0: none; 1: the chosen token's logprob (+ top_logprobs of them)
    int top_logprobs;          // 0..MOET_MAX_LOGPROBS
    const int32_t *prompt;     // [n_prompt] for the repetition penalty's "seen" set (may be NULL when 0)
    int n_prompt;
    int reserve;               // tokens this sequence may reach (prompt + max new tokens, <= max_len): KV room taken now
    int spec;                  // 0..backend max_spec: draft tokens the MTP head proposes per decode row (0: none);
                               // a decode row then emits 1 .. spec + 1 tokens (engine_result)
} engine_admit;

// One step: row i appends ids[off[i] .. off[i+1]) to slot slots[i] (a prefill chunk or one
// decode token). The arrays stay untouched by the caller until collect.
typedef struct {
    int n;                     // rows
    const int *slots;          // [n] each slot at most once per step
    const int32_t *ids;        // [off[n]]
    const int *off;            // [n + 1], off[0] = 0, every row non-empty
    const uint8_t *want;       // [n] 1: pick a token after the row's last token; 0: mid-prompt chunk, no token
} engine_step;

typedef struct {               // arrays owned by the backend, valid until the next launch
    const int32_t *token;      // [n] the picked id (rows with want)
    const float *logprob;      // [n] its logprob (log-softmax of the raw logits), when the slot asked for logprobs
    const int32_t *top_ids;    // [n, MOET_MAX_LOGPROBS] the slot's top_logprobs most likely ids, most likely first
    const float *top_lp;       // [n, MOET_MAX_LOGPROBS]
    // Speculation (slots admitted with spec > 0; NULL from a backend that never speculates): row i
    // emitted n_tok[i] tokens, token[i] then more[i, 0 .. n_tok[i] − 1), each picked by the row's
    // sampler in turn (its logprobs likewise), after verifying drafted[i] drafts of which
    // n_tok[i] − 1 were accepted.
    const int *n_tok;          // [n]
    const int *drafted;        // [n]
    const int32_t *more;       // [n, MOET_MAX_SPEC]
    const float *more_lp;      // [n, MOET_MAX_SPEC]
    const int32_t *more_top_ids; // [n, MOET_MAX_SPEC, MOET_MAX_LOGPROBS]
    const float *more_top_lp;  // [n, MOET_MAX_SPEC, MOET_MAX_LOGPROBS]
} engine_result;

typedef struct {
    void *self;
    int n_vocab, max_seqs, max_len;
    int chunk_align;           // tokens: prompt cuts at multiples of this keep chunk invariance (1: any cut)
    // Takes slot for a new sequence (position 0, zeroed state, sampler seeded, penalty counts from the prompt)
    // and reserves KV room for a->reserve tokens. 0 = taken; 1 = no room now (the caller keeps the request
    // waiting; nothing changed); -1 = error with e set.
    int (*admit)(void *self, int slot, const engine_admit *a, moet_err *e);
    // The slot's sequence is over: its KV room returns to the free list, its sampler state is cleared.
    void (*release)(void *self, int slot);
    // Starts one step (may return before it is computed). Picks tokens for rows with want; each picked
    // token is also noted in the slot's penalty counts. -1: this step failed (its sequences are to be
    // ended; the backend serves the others); ENGINE_LOST: the device can run nothing more (a lost
    // context: every later call fails the same way).
    int (*launch)(void *self, const engine_step *s, moet_err *e);
    // Waits for the step launched last and gives its results. -1 or ENGINE_LOST as launch.
    int (*collect)(void *self, engine_result *out, moet_err *e);
    // Test entry (moet run, tests, eval): one batched step that writes logits for EVERY token [off[n], V]
    // (no sampling), and when non-NULL: hidden [L + 1] buffers [off[n], H] as today's ref_forward,
    // router_ids / router_w [L] buffers [off[n], K] (each layer's chosen experts / renormalised weights).
    // The slots must be admitted (their reserve bounds them as in launch); not while a launch is uncollected.
    int (*forward_all)(void *self, int n, const int *slots, const int32_t *ids, const int *off, float *logits,
                       float **hidden, int32_t **router_ids, float **router_w, moet_err *e);
    // Prefix snapshots (the scheduler's prefix cache: serving, 0). 0 / NULL: the backend keeps none.
    int prefix_block;          // tokens per block: a multiple of chunk_align
    int prefix_blocks;         // block ids 0 .. prefix_blocks − 1, storage planned at boot
    // admit, with the sequence starting after the saved blocks from[0 .. n_from) (save), in the order of the
    // sequence (from[i] holds the state after (i + 1) · prefix_block tokens): at position n_from · prefix_block
    // with the GDN states and conv windows of from[n_from − 1] and the KV of the positions of each. The prompt
    // (for the penalties) is the whole one. 0 / 1 / -1 as admit.
    int (*admit_from)(void *self, int slot, const engine_admit *a, const int32_t *from, int n_from, moet_err *e);
    // The slot's sequence stands at pos = k · prefix_block after a collected step: keep its state as block
    // `block` (a free id or one dropped before): the GDN states and conv windows, and the KV of positions
    // [pos − prefix_block, pos) (copied, or its pages shared by reference count). Not while a step is launched.
    int (*save)(void *self, int slot, int block, moet_err *e);
    // Block `block` is no longer kept (KV pages it shares return when no sequence holds them either).
    void (*drop)(void *self, int block);
    // Speculative decoding with the model's MTP head (engine_admit.spec): the most draft tokens a
    // slot may ask for (0: this backend or model does not speculate).
    int max_spec;
    // The slot (admitted with spec > 0) drafts k ≤ that many tokens from its next pick on (its
    // answer is the same with any k; --speculative-tokens auto). NULL where max_spec is 0.
    void (*set_spec)(void *self, int slot, int k);
} engine_backend;

// What launch and collect return when the device is lost (engine_backend.launch).
#define ENGINE_LOST (-2)

// ---- simulated device faults (MOET_FAULT) -----------------------------------------------------
//
// A test hook of every backend: MOET_FAULT=step:N makes the backend's N-th launch fail as a step
// the device recovers from (a failed launch, a non-sticky error); MOET_FAULT=lost:N makes it fail
// as a lost device (a sticky error), and every launch after it. Read when a backend is made.
// (MOET_FAULT=read:N is the expert cache's: its N-th slot read fails, format/planes_model.c.)
enum { FAULT_NONE, FAULT_STEP, FAULT_LOST };
typedef struct {
    int kind;            // FAULT_*
    long long at, n;     // the launch that fails (1-based); launches so far
    int lost;            // a lost device was simulated: every launch fails
} engine_fault;

static void engine_fault_init(engine_fault *f) {
    memset(f, 0, sizeof *f);
    const char *v = getenv("MOET_FAULT");
    if (!v || !*v || !strncmp(v, "read:", 5)) return;
    char *end;
    if (!strncmp(v, "step:", 5)) f->kind = FAULT_STEP, f->at = strtoll(v + 5, &end, 10);
    else if (!strncmp(v, "lost:", 5)) f->kind = FAULT_LOST, f->at = strtoll(v + 5, &end, 10);
    else end = (char *)v;
    MOET_ASSERT(f->kind && *end == 0 && f->at >= 1, "MOET_FAULT=%s: step:N, lost:N or read:N with N >= 1", v);
}

// At the start of a launch: 0, or the simulated failure (-1 or ENGINE_LOST with e set).
static int engine_fault_launch(engine_fault *f, moet_err *e) {
    if (f->lost) return err_set(e, "the device was lost at launch %lld (simulated: MOET_FAULT)", f->at), ENGINE_LOST;
    if (!f->kind || ++f->n != f->at) return 0;
    if (f->kind == FAULT_STEP) return err_set(e, "step %lld failed on the device (simulated: MOET_FAULT=step:%lld)", f->n, f->at);
    f->lost = 1;
    return err_set(e, "the device was lost at launch %lld (simulated: MOET_FAULT=lost:%lld)", f->n, f->at), ENGINE_LOST;
}

// ---- the checks every backend makes -----------------------------------------------------------
//
// A step and an admission are checked here, once, for every backend (launch, forward_all and
// admit call these first); a backend adds only what is its own (the GPU: free KV pages). A
// failing check changes nothing. The forward passes behind them (ref_forward, gpu_step) only
// assert what these established.

// A step: 1..max_seqs rows, off[0] = 0 and off[n] <= max_tokens, each slot in range, holding an
// admitted sequence (bank) and named once, each row non-empty and within its sequence's reserve
// (pos[s] tokens so far, limit[s] its reserve: at(self, s, &pos, &limit)), every id in [0, V).
static int engine_check_step(const char *what, int max_seqs, int max_tokens, int V, const samp_bank *bank,
                             void (*at)(const void *self, int slot, int *pos, int *limit), const void *self, int n,
                             const int *slots, const int32_t *ids, const int *off, moet_err *e) {
    if (n < 1 || n > max_seqs) return err_set(e, "%s: %d rows; expected 1 .. %d", what, n, max_seqs);
    if (off[0] != 0 || off[n] > max_tokens)
        return err_set(e, "%s: a step of %d tokens in %d rows exceeds the %d tokens planned", what, off[n], n, max_tokens);
    for (int i = 0; i < n; i++) {
        int s = slots[i], pos, limit;
        if (s < 0 || s >= max_seqs) return err_set(e, "%s: sequence slot %d out of range [0, %d)", what, s, max_seqs);
        for (int j = 0; j < i; j++)
            if (slots[j] == s) return err_set(e, "%s: sequence slot %d appears twice in one step", what, s);
        if (!bank->slot[s].active) return err_set(e, "%s: sequence slot %d was not admitted", what, s);
        if (off[i + 1] <= off[i]) return err_set(e, "%s: row %d has no tokens", what, i);
        at(self, s, &pos, &limit);
        if (pos + (off[i + 1] - off[i]) > limit)
            return err_set(e, "%s: the sequence in slot %d would reach %d tokens; its reserve is %d", what, s,
                           pos + (off[i + 1] - off[i]), limit);
    }
    for (int t = 0; t < off[n]; t++)
        if (ids[t] < 0 || ids[t] >= V) return err_set(e, "%s: token id %d outside the vocabulary [0, %d)", what, ids[t], V);
    return 0;
}

// An admission: the slot in range and free, a reserve that holds the prompt and fits the context.
static int engine_check_admit(int max_seqs, int max_len, const samp_bank *bank, int slot, const engine_admit *a, moet_err *e) {
    if (slot < 0 || slot >= max_seqs) return err_set(e, "admit: sequence slot %d out of range [0, %d)", slot, max_seqs);
    if (bank->slot[slot].active) return err_set(e, "admit: sequence slot %d is taken", slot);
    if (a->reserve < 1 || a->reserve < a->n_prompt)
        return err_set(e, "admit: a reserve of %d tokens does not hold the prompt of %d", a->reserve, a->n_prompt);
    if (a->reserve > max_len) return err_set(e, "admit: a reserve of %d tokens exceeds the context of %d", a->reserve, max_len);
    return 0;
}

// The saved blocks an admission starts from: each one kept (end[b] > 0: the position its state is
// after) and in the sequence's order (from[i] ended at (i + 1) · block), all within the reserve.
static int engine_check_from(int block, int n_blocks, const int *end, const engine_admit *a, const int32_t *from, int n_from,
                             moet_err *e) {
    if (n_from == 0) return 0;
    if (n_from < 0 || !from || block < 1) return err_set(e, "admit: %d prefix blocks; this backend keeps none", n_from);
    if ((int64_t)n_from * block >= a->reserve)
        return err_set(e, "admit: %d prefix blocks of %d tokens leave nothing of a reserve of %d", n_from, block, a->reserve);
    for (int i = 0; i < n_from; i++) {
        int b = from[i];
        if (b < 0 || b >= n_blocks) return err_set(e, "admit: prefix block %d out of range [0, %d)", b, n_blocks);
        if (end[b] != (i + 1) * block)
            return err_set(e, "admit: prefix block %d holds the state after %d tokens; position %d of the sequence needs %d", b,
                           end[b], i, (i + 1) * block);
    }
    return 0;
}

// A save: a free block id in range, a slot holding a sequence that stands on a block boundary.
static int engine_check_save(int block, int n_blocks, const int *end, int max_seqs, const samp_bank *bank, int slot, int pos, int id,
                             moet_err *e) {
    if (block < 1) return err_set(e, "save: this backend keeps no prefix blocks");
    if (id < 0 || id >= n_blocks) return err_set(e, "save: prefix block %d out of range [0, %d)", id, n_blocks);
    if (end[id]) return err_set(e, "save: prefix block %d is kept (drop it first)", id);
    if (slot < 0 || slot >= max_seqs || !bank->slot[slot].active) return err_set(e, "save: sequence slot %d holds no sequence", slot);
    if (pos < block || pos % block)
        return err_set(e, "save: the sequence in slot %d stands at %d tokens, not at a multiple of %d", slot, pos, block);
    return 0;
}

// How many of a prompt's `left` tokens a step with `room` tokens left takes when `fed` are in:
// all of them when they fit, else up to the last multiple of align (absolute positions). 0 or
// less: the next aligned block does not fit; the prompt waits for a later step.
static int engine_chunk_take(int fed, int left, int room, int align) {
    return left <= room ? left : (fed + room) / align * align - fed;
}

// The same cut with a prefix cache saving a block every `block` tokens (a multiple of align; 0:
// none): a chunk also ends at the next multiple of block, so that each block's state can be
// saved after the step that reaches it. Chunk invariance makes the extra cuts free.
static int engine_chunk_take_block(int fed, int left, int room, int align, int block) {
    int take = engine_chunk_take(fed, left, room, align);
    if (block > 0 && take > 0) {
        int next = (fed / block + 1) * block;
        if (fed + take > next) take = next - fed;
    }
    return take;
}

// ==========================================================================================
// the engine, 3: the reference forward pass
// ==========================================================================================
//
// Plain C, float32, weights decoded exactly (sass/MODEL.md §3–4).
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
    int limit;      // tokens it may reach: its admission's reserve (0 while the slot is free)
    float *k, *v;   // [n_full, max_len, kvh·hd] keys (after k_norm and RoPE) and values
    float *conv;    // [n_gdn, conv_k − 1, conv_dim] the last conv_k − 1 pre-conv inputs, oldest first
    float *ssm;     // [n_gdn, lv_heads, lk_dim, lv_dim] Gated DeltaNet state S (fp32)
    int mtp_pos;    // rows already in the MTP head's own cache (the next row's RoPE position)
    float *mtp_k, *mtp_v;  // [max_len, kvh·hd] the MTP head's keys and values (models with a head)
    // speculation (engine_admit.spec; models with a head): ref_be_spec_row
    int spec;       // drafts per decode row (0: none), at most spec_cap (engine_backend.set_spec)
    int spec_cap;   // the drafts it was admitted with
    int nd;         // drafts waiting for the next decode row
    int32_t draft[MOET_MAX_SPEC];
    int has_pend;   // pend is the hidden state of the last fed token, whose successor was not fed yet
    float *pend;    // [H]
    float *snap_conv, *snap_ssm;  // the recurrent state before a verification, restored past a rejection
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
    int *rows;       // [Tm] the (token, choice) pairs t·K + k routed to one expert
    // the expert cache's prefetch (ref_moe): layer l + 1's router on layer l's input, the experts
    // it names, and what the last layer named (guess) for the counters
    float *rl2;      // [Tm, E]
    int *sel2;       // [Tm, K]
    float *selw2;    // [Tm, K]
    int *xlist;      // [E] a layer's experts, ascending
    uint8_t *guess;  // [E] named for the layer to come
    uint8_t *xmark;  // [E] chosen in this layer
    int guess_for;   // the layer guess was made for (−1: none)
    float *ye;       // [Tm·K, H] the routed experts' outputs, one row per pair
    float *gx;       // [Tm, H] gathered expert inputs
    float *eg, *eu;  // [Tm, max(I, SI)] gate / up projections
    float *ed;       // [Tm, H] expert outputs
    float *wrow;     // [threads, max row] one decoded weight row per worker
    float *scores;   // [max_len] attention scores of one query
    float *tmp;      // [max(conv_dim, 2·lv_dim, ...)] per-token temporaries
    float *inv_freq; // [rot_dim / 2]
    float *mtp_in;   // [Tm, 2H] the MTP head's fc input (models with a head)
    float *hid_all;  // NULL, or [T, H]: ref_forward writes every token's hidden state after the final norm there
    // speculation (models with a head; ref_be_spec_row)
    int spec_max;         // the most drafts a slot may ask for: MOET_MAX_SPEC with a head, else 0
    float *spec_hid;      // [Tm, H] a speculating row's hidden states (hid_all)
    float *spec_logits;   // [MOET_MAX_SPEC + 1, V] a verification's logits, one row per fed token
    float *spec_h;        // [H] the head's own output fed back for the drafts past the first
    int32_t *spec_next;   // [Tm] the tokens after the head's rows
    int32_t *spec_tok;    // [MOET_MAX_SPEC + 1] a verification's fed tokens
    int *sub_slots, *sub_off, *sub_row;  // [max_seqs + 1] the step's other rows, run together
    int32_t *sub_ids;     // [Tm]
    uint8_t *sub_want;    // [max_seqs]
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
    int kv_round;        // GPU_KV_*: the stored keys and values rounded as the GPU's KV cache stores them (tests)
    int act_bf16;        // the tensor-core products' inputs rounded to bf16, as the GPU's `--act-dtype bf16` (ref_linear)
    float *xr;           // [xr_floats] those rounded inputs, a run of tokens at a time
    size_t xr_floats;
    // the backend interface (engine_backend): sampler state and the results of one step
    samp_bank bank;      // per-slot sampler state
    float *step_logits;  // [max_seqs, V] the last-token logits of the rows that want a token
    int32_t *res_tok;    // [max_seqs] picked ids
    float *res_lp;       // [max_seqs] their logprobs
    int32_t *res_top_ids;// [max_seqs, MOET_MAX_LOGPROBS]
    float *res_top_lp;   // [max_seqs, MOET_MAX_LOGPROBS]
    int *res_n, *res_drafted;      // [max_seqs] tokens each row emitted, drafts it verified (engine_result)
    int32_t *res_more;             // [max_seqs, MOET_MAX_SPEC] the tokens after res_tok
    float *res_more_lp;            // [max_seqs, MOET_MAX_SPEC]
    int32_t *res_more_top_ids;     // [max_seqs, MOET_MAX_SPEC, MOET_MAX_LOGPROBS]
    float *res_more_top_lp;        // [max_seqs, MOET_MAX_SPEC, MOET_MAX_LOGPROBS]
    int failed;          // the expert cache failed inside the step (ref_moe): fail says why
    moet_err fail;
    int launched;        // a step waits for collect
    int spec_step;       // it has speculating rows (engine_result's n_tok … are filled)
    engine_fault fault;  // MOET_FAULT (the backend's test hook)
    arena mem;
    // prefix blocks (engine_backend.save; ref_prefix_init): copies of a sequence's state after
    // a multiple of pfx_block tokens and of the keys and values of the block's own positions
    int pfx_block, pfx_blocks;  // tokens per block, blocks (0: none kept)
    int *pfx_end;        // [pfx_blocks] the position each block's state is after (0: free)
    float *pfx_conv;     // [pfx_blocks, n_gdn, conv_k − 1, conv_dim] conv windows
    float *pfx_ssm;      // [pfx_blocks, n_gdn, lv_heads, lk_dim, lv_dim] GDN states
    float *pfx_k, *pfx_v;// [pfx_blocks, n_full, pfx_block, kvh·hd] keys / values of positions [end − pfx_block, end)
    arena pfx_mem;
} ref_engine;

static int ref_max_row(const ck_config *c) {
    int r = c->hidden;
    int cand[] = {c->n_heads * c->head_dim, c->value_dim, c->inter, c->shared_inter, c->conv_dim};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) if (cand[i] > r) r = cand[i];
    return r;
}


// Carves every buffer; run once on a measuring arena (sizes only) and once on the real one.
static void ref_carve(ref_engine *r, arena *a) {
    const ck_config *c = &r->m->cfg;
    size_t Tm = (size_t)r->max_tokens, H = (size_t)c->hidden;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t projw = (size_t)(2 * c->n_heads * c->head_dim > c->conv_dim ? 2 * c->n_heads * c->head_dim : c->conv_dim);
    size_t corew = (size_t)(c->n_heads * c->head_dim > c->value_dim ? c->n_heads * c->head_dim : c->value_dim);
    size_t ew = (size_t)(c->inter > c->shared_inter ? c->inter : c->shared_inter);
    ARENA_TAKE(a, r->seqs, r->max_seqs, "sequence table");
    ARENA_TAKE(a, r->kind_index, c->n_layers, "layer index");
    for (int s = 0; s < r->max_seqs; s++) {
        ref_seq *q = a->base ? &r->seqs[s] : &(ref_seq){0};
        ARENA_TAKE(a, q->k, (size_t)c->n_full * r->max_len * kvd, "KV cache keys");
        ARENA_TAKE(a, q->v, (size_t)c->n_full * r->max_len * kvd, "KV cache values");
        ARENA_TAKE(a, q->conv, (size_t)c->n_gdn * (c->conv_k - 1) * c->conv_dim, "conv windows");
        ARENA_TAKE(a, q->ssm, (size_t)c->n_gdn * c->lv_heads * c->lk_dim * c->lv_dim, "GDN states");
        if (r->m->mtp.present) {
            ARENA_TAKE(a, q->mtp_k, (size_t)r->max_len * kvd, "MTP head keys");
            ARENA_TAKE(a, q->mtp_v, (size_t)r->max_len * kvd, "MTP head values");
            ARENA_TAKE(a, q->pend, H, "MTP head pending row");
            ARENA_TAKE(a, q->snap_conv, (size_t)c->n_gdn * (c->conv_k - 1) * c->conv_dim, "conv windows before a verification");
            ARENA_TAKE(a, q->snap_ssm, (size_t)c->n_gdn * c->lv_heads * c->lk_dim * c->lv_dim, "GDN states before a verification");
        }
    }
    if (r->m->mtp.present) {
        size_t V = (size_t)c->vocab, Sp = MOET_MAX_SPEC, S1 = MOET_MAX_SPEC + 1, B = (size_t)r->max_seqs;
        ARENA_TAKE(a, r->mtp_in, Tm * 2 * H, "MTP head input");
        ARENA_TAKE(a, r->spec_hid, Tm * H, "speculation hidden states");
        ARENA_TAKE(a, r->spec_logits, S1 * V, "verification logits");
        ARENA_TAKE(a, r->spec_h, H, "MTP head feedback");
        ARENA_TAKE(a, r->spec_next, Tm, "MTP head next tokens");
        ARENA_TAKE(a, r->spec_tok, S1, "verification tokens");
        ARENA_TAKE(a, r->sub_slots, B + 1, "plain rows: slots");
        ARENA_TAKE(a, r->sub_off, B + 1, "plain rows: offsets");
        ARENA_TAKE(a, r->sub_row, B + 1, "plain rows: step rows");
        ARENA_TAKE(a, r->sub_ids, Tm, "plain rows: ids");
        ARENA_TAKE(a, r->sub_want, B, "plain rows: want");
        ARENA_TAKE(a, r->res_n, B, "step token counts");
        ARENA_TAKE(a, r->res_drafted, B, "step drafts");
        ARENA_TAKE(a, r->res_more, B * Sp, "step tokens past the first");
        ARENA_TAKE(a, r->res_more_lp, B * Sp, "their logprobs");
        ARENA_TAKE(a, r->res_more_top_ids, B * Sp * MOET_MAX_LOGPROBS, "their top logprob ids");
        ARENA_TAKE(a, r->res_more_top_lp, B * Sp * MOET_MAX_LOGPROBS, "their top logprobs");
    }
    ARENA_TAKE(a, r->x, Tm * H, "residual");
    ARENA_TAKE(a, r->xn, Tm * H, "normed input");
    ARENA_TAKE(a, r->y, Tm * H, "sublayer output");
    ARENA_TAKE(a, r->proj, Tm * projw, "projections");
    ARENA_TAKE(a, r->kk, Tm * kvd, "keys");
    ARENA_TAKE(a, r->vv, Tm * kvd, "values");
    ARENA_TAKE(a, r->core, Tm * corew, "mixer output");
    ARENA_TAKE(a, r->zz, Tm * c->value_dim, "GDN gate");
    ARENA_TAKE(a, r->bb, Tm * c->lv_heads, "GDN beta");
    ARENA_TAKE(a, r->aa, Tm * c->lv_heads, "GDN decay");
    ARENA_TAKE(a, r->rl, Tm * c->n_experts, "router");
    ARENA_TAKE(a, r->sel, Tm * c->topk, "routing");
    ARENA_TAKE(a, r->selw, Tm * c->topk, "routing weights");
    ARENA_TAKE(a, r->rows, Tm, "expert rows");
    ARENA_TAKE(a, r->rl2, Tm * c->n_experts, "next layer's router");
    ARENA_TAKE(a, r->sel2, Tm * c->topk, "next layer's routing");
    ARENA_TAKE(a, r->selw2, Tm * c->topk, "next layer's routing weights");
    ARENA_TAKE(a, r->xlist, c->n_experts, "a layer's experts");
    ARENA_TAKE(a, r->guess, c->n_experts, "experts named ahead");
    ARENA_TAKE(a, r->xmark, c->n_experts, "experts of a layer");
    ARENA_TAKE(a, r->ye, Tm * c->topk * H, "expert outputs");
    ARENA_TAKE(a, r->gx, Tm * H, "expert inputs");
    ARENA_TAKE(a, r->eg, Tm * ew, "expert gate");
    ARENA_TAKE(a, r->eu, Tm * ew, "expert up");
    ARENA_TAKE(a, r->ed, Tm * H, "expert output");
    ARENA_TAKE(a, r->wrow, (size_t)r->threads * ref_max_row(c), "weight rows");
    r->xr_floats = (Tm < 64 ? Tm : 64) * (size_t)ref_max_row(c);   // runs of up to 64 tokens of the widest input
    ARENA_TAKE(a, r->xr, r->xr_floats, "bf16-rounded product inputs");
    ARENA_TAKE(a, r->scores, r->max_len, "attention scores");
    ARENA_TAKE(a, r->tmp, 2 * (size_t)(c->conv_dim > 2 * c->lv_dim ? c->conv_dim : 2 * c->lv_dim), "temporaries");
    ARENA_TAKE(a, r->inv_freq, c->rot_dim / 2, "rotary frequencies");
    ARENA_TAKE(a, r->jobs, r->threads, "worker jobs");
    ARENA_TAKE(a, r->step_logits, (size_t)r->max_seqs * c->vocab, "step logits");
    ARENA_TAKE(a, r->res_tok, r->max_seqs, "step tokens");
    ARENA_TAKE(a, r->res_lp, r->max_seqs, "step logprobs");
    ARENA_TAKE(a, r->res_top_ids, (size_t)r->max_seqs * MOET_MAX_LOGPROBS, "step top logprob ids");
    ARENA_TAKE(a, r->res_top_lp, (size_t)r->max_seqs * MOET_MAX_LOGPROBS, "step top logprobs");
    r->stacks = arena_take(a, (size_t)(r->threads - 1) * REF_STACK, 4096, "worker stacks");
}

static void ref_reset(ref_engine *r, int slot) {
    const ck_config *c = &r->m->cfg;
    ref_seq *q = &r->seqs[slot];
    q->pos = 0;
    q->mtp_pos = 0;
    q->spec = q->nd = q->has_pend = 0;
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
    samp_bank_free(&r->bank);
    arena_release(&r->mem);
    arena_release(&r->pfx_mem);
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
    r->spec_max = m->mtp.present ? MOET_MAX_SPEC : 0;
    r->guess_for = -1;
    if (max_seqs < 1 || max_len < 1 || max_tokens < 1) return err_set(e, "engine sizes must be positive");
    arena_plan p = arena_plan_begin(&r->mem, "reference engine", ARENA_HOST, e);
    while (arena_plan_pass(&p)) ref_carve(r, p.on);
    if (p.failed) return -1;
    if (samp_bank_init(&r->bank, m->cfg.vocab, max_seqs, max_len, e)) {
        arena_release(&r->mem);
        return -1;
    }
    const ck_config *c = &m->cfg;
    int nf = 0, ng = 0;
    for (int l = 0; l < c->n_layers; l++) r->kind_index[l] = c->full_attn[l] ? nf++ : ng++;
    // transformers: inv_freq = 1 / theta^(arange(0, d, 2) / d), all in float32
    for (int i = 0; i < c->rot_dim / 2; i++)
        r->inv_freq[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->rot_dim);
    for (int s = 0; s < max_seqs; s++) {
        ref_reset(r, s);
        r->seqs[s].limit = 0;
    }
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

// ---- prefix blocks ---------------------------------------------------------------------------
//
// A block is the state of a sequence after k · pfx_block tokens: GDN states and conv windows
// copied whole, keys and values of its own pfx_block positions (a sequence's KV is one
// contiguous region per slot here, so a restored sequence copies every block of its chain).

// Floats of one slot's GDN state and of its conv windows.
static size_t ref_ssm_floats(const ck_config *c) { return (size_t)c->n_gdn * c->lv_heads * c->lk_dim * c->lv_dim; }
static size_t ref_conv_floats(const ck_config *c) { return (size_t)c->n_gdn * (c->conv_k - 1) * c->conv_dim; }

// Bytes one block of `block` tokens takes (what --prefix-cache-gb is divided by).
static size_t ref_prefix_bytes(const ck_config *c, int block) {
    return sizeof(float) * (ref_ssm_floats(c) + ref_conv_floats(c) + 2 * (size_t)c->n_full * block * c->n_kv_heads * c->head_dim);
}

static void ref_prefix_carve(ref_engine *r, arena *a) {
    const ck_config *c = &r->m->cfg;
    size_t nb = (size_t)r->pfx_blocks, kv = (size_t)c->n_full * r->pfx_block * c->n_kv_heads * c->head_dim;
    ARENA_TAKE(a, r->pfx_end, nb, "prefix block ends");
    ARENA_TAKE(a, r->pfx_conv, nb * ref_conv_floats(c), "prefix conv windows");
    ARENA_TAKE(a, r->pfx_ssm, nb * ref_ssm_floats(c), "prefix GDN states");
    ARENA_TAKE(a, r->pfx_k, nb * kv, "prefix keys");
    ARENA_TAKE(a, r->pfx_v, nb * kv, "prefix values");
}

// Plans `blocks` prefix blocks of `block` tokens (after ref_init, before serving). 0 blocks: none.
static int ref_prefix_init(ref_engine *r, int block, int blocks, moet_err *e) {
    if (blocks == 0) return 0;
    if (block < 1 || blocks < 0 || blocks > MOET_MAX_PREFIX_BLOCKS || block > r->max_len)
        return err_set(e, "prefix cache: %d blocks of %d tokens (context %d)", blocks, block, r->max_len);
    r->pfx_block = block;
    r->pfx_blocks = blocks;
    arena_plan p = arena_plan_begin(&r->pfx_mem, "prefix cache", ARENA_HOST, e);
    while (arena_plan_pass(&p)) ref_prefix_carve(r, p.on);
    if (p.failed) {
        r->pfx_block = r->pfx_blocks = 0;
        return -1;
    }
    memset(r->pfx_end, 0, sizeof(int) * (size_t)blocks);
    return 0;
}

// Copies slot q's state (after pos = k · block tokens) and its KV rows [pos − block, pos) into block b.
static void ref_prefix_save(ref_engine *r, const ref_seq *q, int b) {
    const ck_config *c = &r->m->cfg;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, N = (size_t)r->pfx_block, p0 = (size_t)q->pos - N;
    memcpy(r->pfx_conv + b * ref_conv_floats(c), q->conv, sizeof(float) * ref_conv_floats(c));
    memcpy(r->pfx_ssm + b * ref_ssm_floats(c), q->ssm, sizeof(float) * ref_ssm_floats(c));
    for (int l = 0; l < c->n_full; l++) {
        size_t from = ((size_t)l * r->max_len + p0) * kvd, to = ((size_t)b * c->n_full + l) * N * kvd;
        memcpy(r->pfx_k + to, q->k + from, sizeof(float) * N * kvd);
        memcpy(r->pfx_v + to, q->v + from, sizeof(float) * N * kvd);
    }
    r->pfx_end[b] = q->pos;
}

// Slot q starts after the chain from[0 .. n): the KV rows of every block, the state of the last.
static void ref_prefix_restore(ref_engine *r, ref_seq *q, const int32_t *from, int n) {
    const ck_config *c = &r->m->cfg;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, N = (size_t)r->pfx_block;
    for (int i = 0; i < n; i++)
        for (int l = 0; l < c->n_full; l++) {
            size_t to = ((size_t)l * r->max_len + (size_t)i * N) * kvd, src = ((size_t)from[i] * c->n_full + l) * N * kvd;
            memcpy(q->k + to, r->pfx_k + src, sizeof(float) * N * kvd);
            memcpy(q->v + to, r->pfx_v + src, sizeof(float) * N * kvd);
        }
    memcpy(q->conv, r->pfx_conv + from[n - 1] * ref_conv_floats(c), sizeof(float) * ref_conv_floats(c));
    memcpy(q->ssm, r->pfx_ssm + from[n - 1] * ref_ssm_floats(c), sizeof(float) * ref_ssm_floats(c));
    q->pos = n * r->pfx_block;
}

// ---- ops ---------------------------------------------------------------------------------

// float → bf16 → float, round to nearest even (as __float2bfloat16_rn; no NaN here).
static float ref_bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

// Whether the GPU multiplies W on the tensor cores (gpu_mm_ok: FP8, NVFP4, BF16 or planes, in_features
// a multiple of 64; the planes' rows a multiple of 16), where `--act-dtype bf16` gives the
// products the bf16 rounding of their inputs.
static int ref_tensor_core(const ck_mat *W) {
    if (W->cols % 64) return 0;
    return W->kind == CK_W_FP8 || W->kind == CK_W_NVFP4 || W->kind == CK_W_BF16 || (W->kind == CK_W_PLANES && W->rows % 16 == 0);
}

static void ref_linear_f32(ref_engine *r, const ck_mat *W, const float *x, int ldx, int T, float *y, int ldy);

// y[t, o] = Σ_k W[o, k] · x[t, k] for t < T, o < W.rows (ref_linear_f32). With r->act_bf16 and a
// matrix the GPU takes on its tensor cores (ref_tensor_core), x is first rounded to bf16, token by
// token, into r->xr (runs of as many tokens as it holds: each output depends on its own token).
static void ref_linear(ref_engine *r, const ck_mat *W, const float *x, int ldx, int T, float *y, int ldy) {
    if (!r->act_bf16 || !ref_tensor_core(W)) {
        ref_linear_f32(r, W, x, ldx, T, y, ldy);
        return;
    }
    const int K = W->cols, run = (int)(r->xr_floats / (size_t)K);
    MOET_ASSERT(run >= 1, "ref_linear: inputs of %d exceed the rounding buffer (%zu floats)", K, r->xr_floats);
    for (int t0 = 0; t0 < T; t0 += run) {
        const int n = T - t0 < run ? T - t0 : run;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++) r->xr[(size_t)t * K + k] = ref_bf16_round(x[(size_t)(t0 + t) * ldx + k]);
        ref_linear_f32(r, W, r->xr, K, n, y + (size_t)t0 * ldy, ldy);
    }
}

// y[t, o] = Σ_k W[o, k] · x[t, k] for t < T, o < W.rows. Each weight row is decoded once per
// call and reused for every token. Rows are split over the workers; each output element is
// computed by one worker in a fixed order, so results do not depend on the thread count.
static void ref_linear_f32(ref_engine *r, const ck_mat *W, const float *x, int ldx, int T, float *y, int ldy) {
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

// Zero-centred RMSNorm (sass/MODEL.md §3.2): y = x / sqrt(mean(x²) + eps) · (1 + w).
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

// Partial rotary embedding on the first rot_dim dims of u (sass/MODEL.md §3.4 step 4), position p.
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

// float → e4m3fn → float, round to nearest even, saturating to ±448 (as __nv_fp8_e4m3(float)).
static float ref_e4m3_round(float x) {
    float a = fabsf(x);
    if (a >= 448.f) return x < 0 ? -448.f : 448.f;
    // e4m3 values of magnitude a: subnormal step 2^-9 below 2^-6, else 3 mantissa bits
    int ex;
    frexpf(a, &ex);   // a = f · 2^ex, f in [0.5, 1)
    float step = a < 0.015625f ? 0.001953125f : ldexpf(1.f, ex - 4);
    float q = nearbyintf(a / step) * step;   // the FPU's default rounding: to nearest even
    return x < 0 ? -q : q;
}

// One head's stored keys or values as the GPU's KV cache holds them (sass/kv.cuh): bf16, or
// e4m3 with the scale amax / 448 of the head at this position.
static void ref_kv_round(float *x, int n, int kv) {
    if (kv == GPU_KV_BF16) {
        for (int i = 0; i < n; i++) x[i] = ref_bf16_round(x[i]);
    } else if (kv == GPU_KV_FP8) {
        float amax = 0;
        for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = amax > 0 ? amax / 448.f : 1.f, inv = 1.f / s;
        for (int i = 0; i < n; i++) x[i] = ref_e4m3_round(x[i] * inv) * s;
    }
}

// Gated attention before the scores for one token at position p (sass/MODEL.md §3.4 steps 3–5):
// per-head zero-centred RMSNorm of q (q_norm) and k (k_norm), partial RoPE on both, then k and
// v stored as the cache row of position p (rounded as the GPU's KV cache stores them when
// r->kv_round is set). qg [nh, 2·hd] (per head: query, then gate; the query normed and roped in
// place), k [kvh·hd] (in place), v [kvh·hd]; kc, vc: this layer's cache rows of position p
// [kvh·hd]. GPU twin: k_attn_prep_{f32,bf16,fp8}.
static void ref_attn_prep(const ref_engine *r, const ck_mat *q_norm, const ck_mat *k_norm, float *qg, float *k, const float *v,
                          float *kc, float *vc, int p) {
    const ck_config *c = &r->m->cfg;
    int hd = c->head_dim, nh = c->n_heads, kvh = c->n_kv_heads, kvd = kvh * hd;
    for (int h = 0; h < nh; h++) {
        float *qh = qg + (size_t)h * 2 * hd;
        ref_rmsnorm1p(qh, q_norm, hd, c->eps, qh);
        ref_rope(r, qh, p);
    }
    for (int j = 0; j < kvh; j++) {
        float *kh = k + (size_t)j * hd;
        ref_rmsnorm1p(kh, k_norm, hd, c->eps, kh);
        ref_rope(r, kh, p);
    }
    memcpy(kc, k, sizeof(float) * kvd);
    memcpy(vc, v, sizeof(float) * kvd);
    for (int j = 0; j < kvh && r->kv_round; j++) {
        ref_kv_round(kc + (size_t)j * hd, hd, r->kv_round);
        ref_kv_round(vc + (size_t)j * hd, hd, r->kv_round);
    }
}

// The twin of k_fa built with one part (sass/all_bf.cu: a bf16 or fp8 cache with `--act-dtype bf16`,
// the tests' r->act_bf16 with r->kv_round): its roundings where it makes them — q to bf16 (qb, the
// caller's), and p = e^(s − M) to bf16 for the sum with the values at the running max M of each tile
// of GPU_FA_KT positions (M fresh at each chunk of GPU_ATT_CHUNK positions), L adding the unrounded
// p, the chunks folded in order (att_fold's). With an fp8 cache k_fa rounds p · v_scale (the value
// row's scale, amax / 448: recovered from the decoded row, whose largest magnitude is code 448 times
// it, to within an ulp) and multiplies the e4m3 codes (Vc / v_scale). Writes o (unnormalised by the
// gate) [hd] for KV head j. lo, hi (NULL: none): o's range where each rounded weight may take either
// neighbour when its unrounded value lies within a relative eps of a bf16 rounding midpoint (the
// GPU's f32 scores differ from these by that little: which side it lands on is not the twin's to
// know); every factor after the rounding is positive, so the range carries through the folds.
static void ref_attn_fa1(const float *qb, const float *K, const float *Vc, int p, int kvd, int j, int hd, float scale, int fp8, float *scores,
                         double *o, double eps, double *lo, double *hi) {
    double Mt = -INFINITY, Lt = 0;
    for (int d = 0; d < hd; d++) o[d] = 0;
    if (lo)
        for (int d = 0; d < hd; d++) lo[d] = hi[d] = 0;
    for (int tau = 0; tau <= p; tau++) scores[tau] = (float)(ref_dot(qb, K + (size_t)tau * kvd + (size_t)j * hd, hd) * scale);
    for (int c0 = 0; c0 <= p; c0 += GPU_ATT_CHUNK) {   // a chunk: its tiles from a fresh state, then folded
        double M = -INFINITY, L = 0, oc[GPU_ATT_MAX_HD], lc[GPU_ATT_MAX_HD], hc[GPU_ATT_MAX_HD];
        for (int d = 0; d < hd; d++) oc[d] = lc[d] = hc[d] = 0;
        for (int b = c0; b < c0 + GPU_ATT_CHUNK && b <= p; b += GPU_FA_KT) {
            const int e = b + GPU_FA_KT - 1 < p ? b + GPU_FA_KT - 1 : p;
            float mx = -INFINITY;
            for (int tau = b; tau <= e; tau++) mx = scores[tau] > mx ? scores[tau] : mx;
            const double mn = M > mx ? M : mx, cf = M == -INFINITY ? 0 : exp(M - mn);
            double sum = 0;
            for (int d = 0; d < hd; d++) oc[d] *= cf, lc[d] *= cf, hc[d] *= cf;
            for (int tau = b; tau <= e; tau++) {
                const float *v = Vc + (size_t)tau * kvd + (size_t)j * hd;
                float sv = 1;
                if (fp8) {
                    float amax = 0;
                    for (int d = 0; d < hd; d++) amax = fmaxf(amax, fabsf(v[d]));
                    sv = amax > 0 ? amax / 448.f : 1.f;
                }
                const float pt = expf(scores[tau] - (float)mn), x = fp8 ? pt * sv : pt, pb = ref_bf16_round(x);
                const float pl = lo ? ref_bf16_round((float)(x * (1 - eps))) : pb, ph = lo ? ref_bf16_round((float)(x * (1 + eps))) : pb;
                sum += pt;
                for (int d = 0; d < hd; d++) {
                    const double c = (double)v[d] / sv;   // (fp8: the code)
                    oc[d] += pb * c;
                    if (lo) lc[d] += fmin(pl * c, ph * c), hc[d] += fmax(pl * c, ph * c);
                }
            }
            L = L * cf + sum, M = mn;
        }
        const double Mn = Mt > M ? Mt : M, a = Mt == -INFINITY ? 0 : exp(Mt - Mn), bb = exp(M - Mn);
        for (int d = 0; d < hd; d++) o[d] = o[d] * a + oc[d] * bb;
        if (lo)
            for (int d = 0; d < hd; d++) lo[d] = lo[d] * a + lc[d] * bb, hi[d] = hi[d] * a + hc[d] * bb;
        Lt = Lt * a + L * bb, Mt = Mn;
    }
    for (int d = 0; d < hd; d++) o[d] /= Lt;
    if (lo)
        for (int d = 0; d < hd; d++) lo[d] /= Lt, hi[d] /= Lt;
}

// Causal GQA attention of one query token at position p over this layer's cache (sass/MODEL.md §3.4
// steps 6–7): for query head h (KV head h / (nh / kvh)), o = Σ_{τ ≤ p} softmax_τ(q · k_τ /
// sqrt(hd)) v_τ, then out[h] = o ⊙ σ(gate). qg [nh, 2·hd] after ref_attn_prep; K, Vc [p + 1,
// kvh·hd]; scores: scratch [p + 1]; out [nh·hd]. GPU twin: k_attention_{f32,bf16,fp8}; with
// r->act_bf16 and r->kv_round, k_fa's one-part image's roundings (ref_attn_fa1).
static void ref_attn_core(const ref_engine *r, const float *qg, const float *K, const float *Vc, int p, float *scores, float *out) {
    const ck_config *c = &r->m->cfg;
    int hd = c->head_dim, nh = c->n_heads, kvh = c->n_kv_heads, group = nh / kvh, kvd = kvh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    if (r->act_bf16 && r->kv_round) {
        MOET_ASSERT(hd <= GPU_ATT_MAX_HD, "ref_attn_core: head_dim %d", hd);
        for (int h = 0; h < nh; h++) {
            const float *qh = qg + (size_t)h * 2 * hd, *gate = qh + hd;
            float qb[GPU_ATT_MAX_HD];
            double o[GPU_ATT_MAX_HD];
            for (int d = 0; d < hd; d++) qb[d] = ref_bf16_round(qh[d]);
            ref_attn_fa1(qb, K, Vc, p, kvd, h / group, hd, scale, r->kv_round == GPU_KV_FP8, scores, o, 0, NULL, NULL);
            for (int d = 0; d < hd; d++) out[(size_t)h * hd + d] = (float)o[d] * ref_sigmoid(gate[d]);
        }
        return;
    }
    for (int h = 0; h < nh; h++) {
        const float *qh = qg + (size_t)h * 2 * hd, *gate = qh + hd;
        int j = h / group;
        float mx = -INFINITY;
        for (int tau = 0; tau <= p; tau++) {
            scores[tau] = ref_dot(qh, K + (size_t)tau * kvd + (size_t)j * hd, hd) * scale;
            if (scores[tau] > mx) mx = scores[tau];
        }
        double sum = 0;
        for (int tau = 0; tau <= p; tau++) sum += (scores[tau] = (float)exp((double)(scores[tau] - mx)));
        float inv = (float)(1.0 / sum);
        float *o = out + (size_t)h * hd;
        for (int d = 0; d < hd; d++) {
            double acc = 0;
            for (int tau = 0; tau <= p; tau++) acc += (double)(scores[tau] * inv) * Vc[(size_t)tau * kvd + (size_t)j * hd + d];
            o[d] = (float)acc * ref_sigmoid(gate[d]);   // element-wise output gate
        }
    }
}

// Gated full attention for the tokens [t0, t0 + n) of one sequence (sass/MODEL.md §3.4): every token
// into the cache, then every token's query over it.
static void ref_attention(ref_engine *r, const ck_layer *L, int layer, ref_seq *q, int t0, int n) {
    const ck_config *c = &r->m->cfg;
    int hd = c->head_dim, nh = c->n_heads, kvd = c->n_kv_heads * hd, pw = 2 * nh * hd;
    size_t lay = (size_t)r->kind_index[layer] * r->max_len * kvd;
    float *K = q->k + lay, *Vc = q->v + lay;
    for (int t = t0; t < t0 + n; t++) {
        int p = q->pos + (t - t0);
        ref_attn_prep(r, &L->q_norm, &L->k_norm, r->proj + (size_t)t * pw, r->kk + (size_t)t * kvd, r->vv + (size_t)t * kvd,
                      K + (size_t)p * kvd, Vc + (size_t)p * kvd, p);
    }
    for (int t = t0; t < t0 + n; t++)
        ref_attn_core(r, r->proj + (size_t)t * pw, K, Vc, q->pos + (t - t0), r->scores, r->core + (size_t)t * nh * hd);
}

// The gated RMSNorm of one GDN value head (sass/MODEL.md §3.3): o = w · (o / rms(o)) · SiLU(z), a
// plain weight (not 1 + w). GPU twin: k_gated_norm.
static void ref_gated_rmsnorm(float *o, const float *z, const ck_mat *w, int dv, double eps) {
    double ss = 0;
    for (int v = 0; v < dv; v++) ss += (double)o[v] * o[v];
    float rn = (float)(1.0 / sqrt(ss / dv + eps));
    for (int v = 0; v < dv; v++) o[v] = ck_at(w, 0, v) * (o[v] * rn) * ref_silu(z[v]);
}

// The causal depthwise conv of one GDN token, then SiLU (sass/MODEL.md §3.5): for channel ch,
//   x[ch] ← SiLU(Σ_{j < Kc−1} w[ch, j] · win[j, ch] + w[ch, Kc−1] · x[ch])
// in place on x [cd] (the token's qkv projection in, the conv output out); win [Kc − 1, cd]
// holds the sequence's last Kc − 1 pre-conv inputs, oldest first, and takes this one.
// w [cd, Kc]; tmp: scratch [cd]. GPU twin: k_gdn_conv (a row's tokens in order).
static void ref_gdn_conv(const ck_mat *w, int cd, int Kc, float *x, float *win, float *tmp) {
    for (int ch = 0; ch < cd; ch++) {
        double acc = 0;
        for (int j = 0; j < Kc - 1; j++) acc += (double)ck_at(w, ch, j) * win[(size_t)j * cd + ch];
        acc += (double)ck_at(w, ch, Kc - 1) * x[ch];
        tmp[ch] = ref_silu((float)acc);
    }
    if (Kc > 1) {
        memmove(win, win + cd, sizeof(float) * (size_t)(Kc - 2) * cd);
        memcpy(win + (size_t)(Kc - 2) * cd, x, sizeof(float) * cd);
    }
    memcpy(x, tmp, sizeof(float) * cd);
}

// q and k of one GDN token L2-normalised per key head (eps inside the sqrt), q then scaled by
// 1/sqrt(dk), in place: q, k [nk·dk]. GPU twin: the start of gdn_token (sass/gdn.cuh), and
// step 1 of k_gdn_chunk.
static void ref_gdn_qk_norm(float *q, float *k, int nk, int dk) {
    float qscale = 1.0f / sqrtf((float)dk);
    for (int h = 0; h < nk; h++) {
        float *qh = q + (size_t)h * dk, *kh = k + (size_t)h * dk;
        double sq = 0, sk = 0;
        for (int d = 0; d < dk; d++) { sq += (double)qh[d] * qh[d]; sk += (double)kh[d] * kh[d]; }
        float rq = (float)(1.0 / sqrt(sq + 1e-6)), rk = (float)(1.0 / sqrt(sk + 1e-6));
        for (int d = 0; d < dk; d++) { qh[d] = qh[d] * rq * qscale; kh[d] = kh[d] * rk; }
    }
}

// The gates of one GDN token and value head (sass/MODEL.md §3.5): β = σ(b), and the log decay
// g = −exp(A_log) · softplus(a + dt_bias) ≤ 0. GPU twin: gdn_gates (sass/gdn.cuh).
static void ref_gdn_gates(float b, float a, float A_log, float dt_bias, float *beta, float *g) {
    *beta = ref_sigmoid(b);
    *g = -expf(A_log) * ref_softplus(a + dt_bias);
}

// One token of the gated delta rule for one value head, recurrent form (sass/MODEL.md §4.1): S [dk, dv]
// in/out, q̂ and k̂ [dk] normalised (q̂ scaled by 1/sqrt(dk)), v [dv], β = σ(b), g the log decay;
//   S ← e^g S,  u = β (v − Sᵀk̂),  S ← S + k̂ uᵀ,  o = Sᵀq̂ (before the gated norm)
// u: scratch [dv]. GPU twin: gdn_token (sass/gdn.cuh).
static void ref_gdn_token(float *S, const float *qh, const float *kh, const float *vh, float beta, float g, int dk, int dv, float *u,
                          float *o) {
    float decay = expf(g);
    for (size_t i = 0; i < (size_t)dk * dv; i++) S[i] *= decay;
    for (int v = 0; v < dv; v++) {
        double acc = 0;
        for (int d = 0; d < dk; d++) acc += (double)S[(size_t)d * dv + v] * kh[d];
        u[v] = (vh[v] - (float)acc) * beta;   // the correction u = β (v − Sᵀk)
    }
    for (int d = 0; d < dk; d++)
        for (int v = 0; v < dv; v++) S[(size_t)d * dv + v] += kh[d] * u[v];
    for (int v = 0; v < dv; v++) {
        double acc = 0;
        for (int d = 0; d < dk; d++) acc += (double)S[(size_t)d * dv + v] * qh[d];
        o[v] = (float)acc;
    }
}

// The gated delta rule for one token of a sequence, every value head, recurrent form
// (sass/MODEL.md §3.5, §4.1): qkv [cd] is the token's conv output q [nk·dk] | k [nk·dk] | v [nv·dv]
// (q and k normalised in place); b, a [nv] its gate pre-activations; A_log, dt_bias [1, nv];
// S [nv, dk, dv] the sequence's state, in/out; o [nv·dv] the output before the gated norm.
// Value head j reads key head j / (nv / nk). u: scratch [dv]. GPU twin: k_gdn_rule.
static void ref_gdn_rule(float *qkv, const float *b, const float *a, const ck_mat *A_log, const ck_mat *dt_bias, float *S, float *o,
                         int nk, int nv, int dk, int dv, float *u) {
    int key_dim = nk * dk, rep = nv / nk;
    float *qv = qkv, *kv = qkv + key_dim, *vv = qkv + 2 * key_dim;
    ref_gdn_qk_norm(qv, kv, nk, dk);
    for (int j = 0; j < nv; j++) {
        float beta, g;
        ref_gdn_gates(b[j], a[j], ck_at(A_log, 0, j), ck_at(dt_bias, 0, j), &beta, &g);
        ref_gdn_token(S + (size_t)j * dk * dv, qv + (size_t)(j / rep) * dk, kv + (size_t)(j / rep) * dk, vv + (size_t)j * dv, beta, g,
                      dk, dv, u, o + (size_t)j * dv);
    }
}

// Gated DeltaNet for the tokens [t0, t0 + n) of one sequence, recurrent form (sass/MODEL.md §3.5,
// §4.1). r->proj holds the qkv projections of these tokens; it is overwritten by the conv output.
static void ref_gdn(ref_engine *r, const ck_layer *L, int layer, ref_seq *q, int t0, int n) {
    const ck_config *c = &r->m->cfg;
    int cd = c->conv_dim, K = c->conv_k, nk = c->lk_heads, nv = c->lv_heads, dk = c->lk_dim, dv = c->lv_dim;
    size_t gi = (size_t)r->kind_index[layer];
    float *win = q->conv + gi * (K - 1) * cd;                 // [K-1, cd]
    float *S0 = q->ssm + gi * nv * dk * dv;                   // [nv, dk, dv]
    for (int t = t0; t < t0 + n; t++) {
        float *m = r->proj + (size_t)t * cd, *o = r->core + (size_t)t * c->value_dim;
        ref_gdn_conv(&L->conv, cd, K, m, win, r->tmp);
        ref_gdn_rule(m, r->bb + (size_t)t * nv, r->aa + (size_t)t * nv, &L->A_log, &L->dt_bias, S0, o, nk, nv, dk, dv, r->tmp + cd);
        for (int j = 0; j < nv; j++)
            ref_gated_rmsnorm(o + (size_t)j * dv, r->zz + (size_t)t * c->value_dim + (size_t)j * dv, &L->gnorm, dv, c->eps);
    }
}

// The chunked (WY) form of the gated delta rule (sass/MODEL.md §4.2) for one value head over n tokens
// taken as one chunk: q̂, k̂ [n, dk] already L2-normalised (q̂ scaled by 1/sqrt(dk)), v [n, dv],
// beta [n] = σ(b), g [n] the log decays (≤ 0); S [dk, dv] in/out, o [n, dv] out. Sums in f64;
// w: scratch of ref_gdn_chunk_scratch(n, dv) doubles. It is the same map as the recurrence of
// ref_gdn_rule up to rounding (the executable definition stays the recurrent one). GPU twin:
// k_gdn_chunk, which cuts prompts into such chunks at multiples of 64 of their positions.
static size_t ref_gdn_chunk_scratch(int n, int dv) { return (size_t)n * (2 * (size_t)n + dv + 1); }

static void ref_gdn_chunk(const float *qh, const float *kh, const float *vh, const float *beta, const float *g, int n, int dk,
                          int dv, float *S, float *o, double *w) {
    double *gam = w, *A = gam + n, *M = A + (size_t)n * n, *U = M + (size_t)n * n;   // [n], [n, n], [n, n], [n, dv]
    for (int r = 0; r < n; r++) gam[r] = (r ? gam[r - 1] : 0) + g[r];
    for (int r = 0; r < n; r++)
        for (int j = 0; j < n; j++) {
            double kk = 0, qk = 0;
            for (int d = 0; d < dk; d++) {
                kk += (double)kh[(size_t)r * dk + d] * kh[(size_t)j * dk + d];
                qk += (double)qh[(size_t)r * dk + d] * kh[(size_t)j * dk + d];
            }
            double dec = j <= r ? exp(gam[r] - gam[j]) : 0;
            A[(size_t)r * n + j] = j < r ? beta[r] * kk * dec : 0;   // strictly lower
            M[(size_t)r * n + j] = qk * dec;                         // lower with the diagonal
        }
    // R = diag(β)(V − diag(e^γ) K̂ S₀), then (I + A) U = R by forward substitution
    for (int r = 0; r < n; r++)
        for (int v = 0; v < dv; v++) {
            double ks = 0;
            for (int d = 0; d < dk; d++) ks += (double)kh[(size_t)r * dk + d] * S[(size_t)d * dv + v];
            double u = beta[r] * (vh[(size_t)r * dv + v] - exp(gam[r]) * ks);
            for (int j = 0; j < r; j++) u -= A[(size_t)r * n + j] * U[(size_t)j * dv + v];
            U[(size_t)r * dv + v] = u;
        }
    // O = diag(e^γ) Q̂ S₀ + M U (S₀ still in S)
    for (int r = 0; r < n; r++)
        for (int v = 0; v < dv; v++) {
            double qs = 0, mu = 0;
            for (int d = 0; d < dk; d++) qs += (double)qh[(size_t)r * dk + d] * S[(size_t)d * dv + v];
            for (int j = 0; j <= r; j++) mu += M[(size_t)r * n + j] * U[(size_t)j * dv + v];
            o[(size_t)r * dv + v] = (float)(exp(gam[r]) * qs + mu);
        }
    // S ← e^{γ_{n−1}} S₀ + Σ_r e^{γ_{n−1} − γ_r} k̂_r u_rᵀ
    for (int d = 0; d < dk; d++)
        for (int v = 0; v < dv; v++) {
            double s = exp(gam[n - 1]) * S[(size_t)d * dv + v];
            for (int r = 0; r < n; r++) s += exp(gam[n - 1] - gam[r]) * kh[(size_t)r * dk + d] * U[(size_t)r * dv + v];
            S[(size_t)d * dv + v] = (float)s;
        }
}

// The router of one token (sass/MODEL.md §3.6): softmax over the E logits p (overwritten by the
// probabilities), the K most probable experts (ties to the lower id) into sel, by descending
// probability, and their probabilities renormalised to sum 1 into w. GPU twin: k_router.
static void ref_route(float *p, int E, int Kt, int *sel, float *w) {
    float mx = -INFINITY;
    for (int x = 0; x < E; x++) if (p[x] > mx) mx = p[x];
    double sum = 0;
    for (int x = 0; x < E; x++) sum += (p[x] = (float)exp((double)(p[x] - mx)));
    for (int x = 0; x < E; x++) p[x] = (float)(p[x] / sum);
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
}

// h[i] = SiLU(g[i]) · u[i] for i < n (h may be g). GPU twin: k_silu_mul.
static void ref_silu_mul(const float *g, const float *u, float *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = ref_silu(g[i]) * u[i];
}

// One routed expert's first half over the n tokens that chose it (sass/MODEL.md §3.6):
// h[t, i] = SiLU(gate[i] · x[t]) · (up[i] · x[t]), x [n, H], h [n, I]; u: scratch [n, I].
// GPU twin: k_moe_gate_up (each (token, choice) pair alone).
static void ref_moe_gate_up(ref_engine *r, const ck_mat *gate, const ck_mat *up, const float *x, int n, float *h, float *u) {
    int H = gate->cols, I = gate->rows;
    ref_linear(r, gate, x, H, n, h, I);
    ref_linear(r, up, x, H, n, u, I);
    ref_silu_mul(h, u, h, (size_t)n * I);
}

// Its second half: ye[t, j] = down[j] · h[t], h [n, I], ye [n, H]. GPU twin: k_moe_down.
static void ref_moe_down(ref_engine *r, const ck_mat *down, const float *h, int n, float *ye) {
    ref_linear(r, down, h, down->cols, n, ye, down->rows);
}

// The MoE output of one token (sass/MODEL.md §3.6): y[j] = Σ_k w[k] · ye[k, j], the K chosen experts
// taken in ascending id (the order transformers' loop over the experts adds them), then
// + σ(sg) · sh[j], the shared expert scaled by its sigmoid gate. ye [K, H] the chosen experts'
// outputs in choice order, sel [K] their ids (distinct), w [K] their weights; sg the shared
// expert's gate logit, sh [H] its output; y [H]. GPU twin: k_moe_combine.
static void ref_moe_combine(const float *ye, const int *sel, const float *w, float sg, const float *sh, int K, int H, float *y) {
    float s = ref_sigmoid(sg);
    for (int j = 0; j < H; j++) {
        float acc = 0;
        for (int n = 0, last = -1; n < K; n++) {
            int best = -1;
            for (int k = 0; k < K; k++)
                if (sel[k] > last && (best < 0 || sel[k] < sel[best])) best = k;
            last = sel[best];
            acc += ye[(size_t)best * H + j] * w[best];
        }
        y[j] = acc + s * sh[j];
    }
}

// Router, routed experts and the gated shared expert over all T tokens (sass/MODEL.md §3.6).
// Output in r->y.
static void ref_moe(ref_engine *r, const ck_layer *L, int layer, int T) {
    const ck_config *c = &r->m->cfg;
    int H = c->hidden, E = c->n_experts, Kt = c->topk, SI = c->shared_inter;
    ref_linear(r, &L->router, r->xn, H, T, r->rl, E);
    for (int t = 0; t < T; t++) {
        int *sel = r->sel + (size_t)t * Kt;
        float *w = r->selw + (size_t)t * Kt;
        ref_route(r->rl + (size_t)t * E, E, Kt, sel, w);
        if (r->trace_ids) memcpy(r->trace_ids[layer] + (size_t)t * Kt, sel, sizeof(int32_t) * Kt);
        if (r->trace_w) memcpy(r->trace_w[layer] + (size_t)t * Kt, w, sizeof(float) * Kt);
    }
    // the expert cache: this layer's experts the pool lacks, and those layer + 1's router picks on
    // this layer's input, are read ahead while the experts below compute (format/planes_model.c)
    pf_cache *xc = L != &r->m->mtp.layer ? r->m->xcache : NULL;
    if (xc) {
        pf_cache_layer(xc);
        int n = 0;
        memset(r->xmark, 0, (size_t)E);
        for (int p = 0; p < T * Kt; p++) r->xmark[r->sel[p]] = 1;
        for (int x = 0; x < E; x++) {
            if (!r->xmark[x]) continue;
            r->xlist[n++] = x;
            if (r->guess_for == layer) pf_cache_stats.guess_needed++, pf_cache_stats.guess_named += r->guess[x];
        }
        pf_cache_prefetch(xc, (uint32_t)layer, r->xlist, n);
        r->guess_for = -1;
        if (xc->prefetch && layer + 1 < c->n_layers) {   // (only a reader thread can use the guess)
            const ck_layer *N = &r->m->layers[layer + 1];
            ref_linear(r, &N->router, r->xn, H, T, r->rl2, E);
            memset(r->guess, 0, (size_t)E);
            for (int t = 0; t < T; t++) {
                ref_route(r->rl2 + (size_t)t * E, E, Kt, r->sel2 + (size_t)t * Kt, r->selw2 + (size_t)t * Kt);
                for (int k = 0; k < Kt; k++) r->guess[r->sel2[(size_t)t * Kt + k]] = 1;
            }
            n = 0;
            for (int x = 0; x < E; x++)
                if (r->guess[x]) r->xlist[n++] = x;
            pf_cache_prefetch(xc, (uint32_t)layer + 1, r->xlist, n);
            r->guess_for = layer + 1;
        }
    }
    // routed experts in ascending id, each over the tokens that chose it (as transformers' loop);
    // row i of an expert's batch is the pair r->rows[i] = t·K + k
    for (int x = 0; x < E; x++) {
        int n = 0;
        for (int p = 0; p < T * Kt; p++)
            if (r->sel[p] == x) {
                r->rows[n] = p;
                memcpy(r->gx + (size_t)n * H, r->xn + (size_t)(p / Kt) * H, sizeof(float) * H);
                n++;
            }
        if (!n) continue;
        const ck_mat *G = &L->gate[x], *U = &L->up[x], *D = &L->down[x];
        ck_mat cg, cu, cd;
        if (xc) {   // the expert cache: waited for, or read now, when not held (format/planes_model.c)
            if (pf_cache_get(xc, (uint32_t)layer, (uint32_t)x, &cg, &cu, &cd, &r->fail)) {
                r->failed = 1;
                return;
            }
            G = &cg, U = &cu, D = &cd;
        }
        ref_moe_gate_up(r, G, U, r->gx, n, r->eg, r->eu);
        ref_moe_down(r, D, r->eg, n, r->ed);
        for (int i = 0; i < n; i++) memcpy(r->ye + (size_t)r->rows[i] * H, r->ed + (size_t)i * H, sizeof(float) * H);
    }
    // the shared expert, and each token's output
    ref_linear(r, &L->sh_gate, r->xn, H, T, r->eg, SI);
    ref_linear(r, &L->sh_up, r->xn, H, T, r->eu, SI);
    ref_silu_mul(r->eg, r->eu, r->eg, (size_t)T * SI);
    ref_linear(r, &L->sh_down, r->eg, SI, T, r->ed, H);
    ref_linear(r, &L->sh_gate_w, r->xn, H, T, r->gx, 1);
    for (int t = 0; t < T; t++)
        ref_moe_combine(r->ye + (size_t)t * Kt * H, r->sel + (size_t)t * Kt, r->selw + (size_t)t * Kt, r->gx[t], r->ed + (size_t)t * H,
                        Kt, H, r->y + (size_t)t * H);
}

// One batched forward step. Sequence i of n appends ids[off[i] .. off[i+1]) to slot slots[i].
// logits: with all_logits, [off[n], V] (every token); else one row per sequence that wants
// logits after its last token (want NULL: every sequence), in row order: [count, V].
// hidden: NULL, or L + 1 buffers [off[n], H] receiving the residual stream as transformers'
// output_hidden_states (0: embeddings, i: after layer i − 1, L: after the final norm).
// The step was checked by engine_check_step (the backend's launch or forward_all, or a test
// that feeds valid steps): returns 0, or -1 with e set when the expert cache could not read an
// expert (the step's sequences are then part-way through it: their callers end them).
static int ref_forward(ref_engine *r, int n, const int *slots, const int32_t *ids, const int *off, const uint8_t *want,
                       float *logits, int all_logits, float **hidden, moet_err *e) {
    const ck_model *m = r->m;
    const ck_config *c = &m->cfg;
    int H = c->hidden, V = c->vocab, T = off[n];
    // the step was checked (engine_check_step); what would break memory is asserted
    MOET_ASSERT(n >= 1 && n <= r->max_seqs && off[0] == 0 && T <= r->max_tokens, "step of %d tokens in %d rows", T, n);
    for (int i = 0; i < n; i++)
        MOET_ASSERT(slots[i] >= 0 && slots[i] < r->max_seqs && off[i + 1] > off[i] &&
                        r->seqs[slots[i]].pos + (off[i + 1] - off[i]) <= r->max_len,
                    "row %d: slot %d, %d tokens", i, slots[i], off[i + 1] - off[i]);
    for (int t = 0; t < T; t++) {
        MOET_ASSERT(ids[t] >= 0 && ids[t] < V, "token id %d", ids[t]);
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
        if (r->failed) {   // an expert the cache could not read: the step fails (its rows' state is part-way)
            r->failed = 0;
            *e = r->fail;
            return -1;
        }
        for (size_t i = 0; i < (size_t)T * H; i++) r->x[i] += r->y[i];
        if (hidden && l + 1 < c->n_layers) memcpy(hidden[l + 1], r->x, sizeof(float) * (size_t)T * H);
    }
    for (int i = 0; i < n; i++) r->seqs[slots[i]].pos += off[i + 1] - off[i];
    if (r->hid_all)
        for (int t = 0; t < T; t++) ref_rmsnorm1p(r->x + (size_t)t * H, &m->final_norm, H, c->eps, r->hid_all + (size_t)t * H);
    // final norm + lm_head, for every token or only the last one of each row that wants it
    int nrows = 0;
    for (int i = 0; i < (all_logits ? T : n); i++) {
        if (!all_logits && want && !want[i]) continue;   // a mid-prompt chunk: its logits are not needed
        int t = all_logits ? i : off[i + 1] - 1;
        ref_rmsnorm1p(r->x + (size_t)t * H, &m->final_norm, H, c->eps, r->xn + (size_t)nrows++ * H);
    }
    if (hidden) memcpy(hidden[c->n_layers], r->xn, sizeof(float) * (size_t)nrows * H);
    if (nrows) ref_linear(r, &m->lm_head, r->xn, H, nrows, logits, V);
    return 0;
}

// The multi-token-prediction head (sass/MODEL.md §6) over n rows appended to slot `slot`'s own
// MTP cache: row i reads h[i] (the main model's hidden state after its final norm at position
// p_i, e.g. ref_forward's hidden[L]) and next[i] (the token at p_i + 1) and is computed at RoPE
// position mtp_pos + i, so rows fed in order from a fresh slot sit at p_i. The head's layer runs
// the main model's ops on the step scratch (it overwrites what ref_forward left there).
// logits: NULL, or [n, V], the head's prediction of the token at p_i + 2. stages: NULL, or 5
// buffers [n, H]: the normed embedding, the normed hidden state, the fc output u, the layer's
// output z (residual stream), z after the head's norm.
static void ref_mtp(ref_engine *r, int slot, int n, const float *h, const int32_t *next, float *logits, float **stages) {
    const ck_model *m = r->m;
    const ck_config *c = &m->cfg;
    const ck_mtp *M = &m->mtp;
    const ck_layer *L = &M->layer;
    int H = c->hidden, V = c->vocab, hd = c->head_dim, nh = c->n_heads, qd = nh * hd, kvd = c->n_kv_heads * hd;
    MOET_ASSERT(M->present, "the model has no MTP head");
    MOET_ASSERT(slot >= 0 && slot < r->max_seqs && n >= 1 && n <= r->max_tokens, "MTP step of %d rows in slot %d", n, slot);
    ref_seq *q = &r->seqs[slot];
    MOET_ASSERT(q->mtp_pos + n <= r->max_len, "MTP cache of slot %d: %d + %d rows past %d", slot, q->mtp_pos, n, r->max_len);
    // u = fc(cat(RMSNorm(embed(next); pre_fc_norm_embedding), RMSNorm(h; pre_fc_norm_hidden)))
    for (int t = 0; t < n; t++) {
        float *in = r->mtp_in + (size_t)t * 2 * H;
        MOET_ASSERT(next[t] >= 0 && next[t] < V, "token id %d", next[t]);
        ck_row_f32(&m->embed, next[t], in);
        ref_rmsnorm1p(in, &M->norm_emb, H, c->eps, in);
        ref_rmsnorm1p(h + (size_t)t * H, &M->norm_hid, H, c->eps, in + H);
        if (stages) {
            memcpy(stages[0] + (size_t)t * H, in, sizeof(float) * H);
            memcpy(stages[1] + (size_t)t * H, in + H, sizeof(float) * H);
        }
    }
    ref_linear(r, &M->fc, r->mtp_in, 2 * H, n, r->x, H);
    if (stages) memcpy(stages[2], r->x, sizeof(float) * (size_t)n * H);
    // one decoder layer as a main full-attention layer, its keys and values in the head's cache
    for (int t = 0; t < n; t++) ref_rmsnorm1p(r->x + (size_t)t * H, &L->in_norm, H, c->eps, r->xn + (size_t)t * H);
    ref_linear(r, &L->q, r->xn, H, n, r->proj, 2 * qd);
    ref_linear(r, &L->k, r->xn, H, n, r->kk, kvd);
    ref_linear(r, &L->v, r->xn, H, n, r->vv, kvd);
    for (int t = 0; t < n; t++) {
        int p = q->mtp_pos + t;
        ref_attn_prep(r, &L->q_norm, &L->k_norm, r->proj + (size_t)t * 2 * qd, r->kk + (size_t)t * kvd, r->vv + (size_t)t * kvd,
                      q->mtp_k + (size_t)p * kvd, q->mtp_v + (size_t)p * kvd, p);
    }
    for (int t = 0; t < n; t++)
        ref_attn_core(r, r->proj + (size_t)t * 2 * qd, q->mtp_k, q->mtp_v, q->mtp_pos + t, r->scores, r->core + (size_t)t * qd);
    ref_linear(r, &L->o, r->core, qd, n, r->y, H);
    for (size_t i = 0; i < (size_t)n * H; i++) r->x[i] += r->y[i];
    for (int t = 0; t < n; t++) ref_rmsnorm1p(r->x + (size_t)t * H, &L->post_norm, H, c->eps, r->xn + (size_t)t * H);
    int32_t **tid = r->trace_ids;   // the router traces are the main layers'
    float **tw = r->trace_w;
    r->trace_ids = NULL;
    r->trace_w = NULL;
    ref_moe(r, L, 0, n);
    r->trace_ids = tid;
    r->trace_w = tw;
    for (size_t i = 0; i < (size_t)n * H; i++) r->x[i] += r->y[i];
    if (stages) memcpy(stages[3], r->x, sizeof(float) * (size_t)n * H);
    q->mtp_pos += n;
    // the head's norm, then the shared lm_head
    for (int t = 0; t < n; t++) ref_rmsnorm1p(r->x + (size_t)t * H, &M->norm, H, c->eps, r->xn + (size_t)t * H);
    if (stages) memcpy(stages[4], r->xn, sizeof(float) * (size_t)n * H);
    if (logits) ref_linear(r, &m->lm_head, r->xn, H, n, logits, V);
}

// ---- the CPU backend: engine_backend over the reference forward ----------------------------
//
// Everything runs inside launch (the step is computed before it returns); collect hands out
// the results. The KV of each slot is its own contiguous max_len region, so admission only
// checks reserve <= max_len: a larger reserve can never fit, and is an error (-1) rather than
// "no room now" (1), which would keep a request waiting forever. Each slot's reserve then
// bounds its sequence, as the paged KV of a GPU backend would.

// The rows of a step (or of forward_all) on admitted slots, within their reserves.
// The sequence in slot s for engine_check_step: its length and its reserve.
static void ref_be_at(const void *self, int s, int *pos, int *limit) {
    const ref_engine *r = self;
    *pos = r->seqs[s].pos;
    *limit = r->seqs[s].limit;
}

static int ref_be_admit_from(void *self, int slot, const engine_admit *a, const int32_t *from, int n_from, moet_err *e) {
    ref_engine *r = self;
    if (engine_check_admit(r->max_seqs, r->max_len, &r->bank, slot, a, e) ||
        engine_check_from(r->pfx_block, r->pfx_blocks, r->pfx_end, a, from, n_from, e))
        return -1;
    if (a->spec < 0 || a->spec > r->spec_max)
        return r->spec_max ? err_set(e, "admit: %d draft tokens per step; this backend drafts at most %d", a->spec, r->spec_max)
                           : err_set(e, "admit: speculative decoding needs the model's multi-token-prediction head (mtp.*), which is not loaded");
    if (a->spec && n_from)
        return err_set(e, "admit: a speculating sequence starts from its first token (the MTP head's cache is not in prefix blocks)");
    if (samp_bank_admit(&r->bank, slot, &a->sp, a->seed, a->logprobs, a->top_logprobs, a->prompt, a->n_prompt, e)) return -1;
    ref_reset(r, slot);
    if (n_from) ref_prefix_restore(r, &r->seqs[slot], from, n_from);
    r->seqs[slot].limit = a->reserve;
    r->seqs[slot].spec = r->seqs[slot].spec_cap = a->spec;
    return 0;
}

// engine_backend.set_spec: the slot drafts k (≤ what it was admitted with) from its next pick on.
static void ref_be_set_spec(void *self, int slot, int k) {
    ref_engine *r = self;
    ref_seq *q = &r->seqs[slot];
    MOET_ASSERT(k >= 0 && k <= q->spec_cap, "set_spec: %d drafts for slot %d, admitted with %d", k, slot, q->spec_cap);
    q->spec = k;
}

static int ref_be_admit(void *self, int slot, const engine_admit *a, moet_err *e) { return ref_be_admit_from(self, slot, a, NULL, 0, e); }

static int ref_be_save(void *self, int slot, int block, moet_err *e) {
    ref_engine *r = self;
    if (r->launched) return err_set(e, "save: a step is launched and not collected");
    if (engine_check_save(r->pfx_block, r->pfx_blocks, r->pfx_end, r->max_seqs, &r->bank, slot, slot >= 0 && slot < r->max_seqs ? r->seqs[slot].pos : 0,
                          block, e))
        return -1;
    ref_prefix_save(r, &r->seqs[slot], block);
    return 0;
}

static void ref_be_drop(void *self, int block) {
    ref_engine *r = self;
    MOET_ASSERT(block >= 0 && block < r->pfx_blocks && r->pfx_end[block] > 0, "prefix block %d of %d is not kept", block, r->pfx_blocks);
    r->pfx_end[block] = 0;
}

static void ref_be_release(void *self, int slot) {
    ref_engine *r = self;
    samp_bank_release(&r->bank, slot);
    r->seqs[slot].limit = 0;
}

static int moet_argmax(const float *x, int n);   // (below, with moet run)

// A speculating row's results, either backend's (engine_result's arrays, [max_seqs, ...]).
typedef struct {
    int32_t *tok, *more, *top_ids, *more_top_ids;
    float *lp, *more_lp, *top_lp, *more_top_lp;
    int *n;
} spec_res;

// One pick of spec_accept: the token after fed token j into *y (and, when the slot asked for
// logprobs, *lp and ti / tl [top_logprobs]), the slot's sampler advanced as samp_bank_pick advances
// it — by samp_bank_pick over that row's logits (spec_pick_host), or from the device's pick of it
// (the GPU's k_sample, which took it as samp_bank_pick would).
typedef void (*spec_pick_fn)(void *ctx, int j, int32_t *y, float *lp, int32_t *ti, float *tl);

// spec_pick_host's context: the slot's sampler and the logits of its verified tokens, lg [nd + 1, V].
typedef struct {
    samp_bank *bank;
    int slot, V;
    const float *lg;
} spec_host;

static void spec_pick_host(void *ctx, int j, int32_t *y, float *lp, int32_t *ti, float *tl) {
    const spec_host *h = ctx;
    samp_bank_pick(h->bank, h->slot, h->lg + (size_t)j * h->V, y, lp, ti, tl);
}

// The picks of row i over its verified tokens (row j: after fed token j; ft[j + 1] the draft fed
// next): y_j picked exactly as without drafts, the draft kept while it is y_j. Returns the drafts
// accepted; *ylast is the last pick.
static int spec_accept(spec_pick_fn pick, void *ctx, const int32_t *ft, int nd, int i, const spec_res *o, int32_t *ylast) {
    int m = 0;
    for (int j = 0;; j++) {
        int32_t y;
        float lp;
        int32_t *ti = j ? o->more_top_ids + ((size_t)i * MOET_MAX_SPEC + j - 1) * MOET_MAX_LOGPROBS : o->top_ids + (size_t)i * MOET_MAX_LOGPROBS;
        float *tl = j ? o->more_top_lp + ((size_t)i * MOET_MAX_SPEC + j - 1) * MOET_MAX_LOGPROBS : o->top_lp + (size_t)i * MOET_MAX_LOGPROBS;
        pick(ctx, j, &y, &lp, ti, tl);
        if (j) o->more[(size_t)i * MOET_MAX_SPEC + j - 1] = y, o->more_lp[(size_t)i * MOET_MAX_SPEC + j - 1] = lp;
        else o->tok[i] = y, o->lp[i] = lp;
        o->n[i] = j + 1;
        if (j == nd || ft[j + 1] != y) {
            *ylast = y;
            return m;
        }
        m++;
    }
}

// Row i of a step (slot `slot`, ids [c], want) on a speculating slot (sass/MODEL.md §6): the
// fed tokens, then the slot's drafts when it is a decode row (c = 1) — one verification of
// 1 + nd tokens, every hidden state after the final norm kept (hid_all). After each fed token j
// the slot's sampler picks y_j exactly as without drafts (samp_bank_pick: the same row bits, the
// same generator draws in the same order), and the draft fed next is kept when it is y_j; a
// token other than the draft (or the token after the last draft) ends the row: it emits
// y_0 .. y_m. Past a rejection the recurrent state is restored (snap_*) and the kept tokens fed
// again, which gives the verification's bits (the reference cuts anywhere: chunk_align 1), so a
// sequence, greedy or sampled, is the one non-speculative steps would have made, token for token.
// The head then takes a row per fed token whose successor is known — (h_t, x_{t+1}); a prompt
// chunk's last token waits in pend for the next chunk's first — and, after a picked token, the
// last row's logits give the first draft (argmax); each further draft feeds the head's own
// output back (its rows are undone afterwards: the next step's true rows replace them).
// What a GDN layer costs this way: one copy of the slot's states and conv windows per
// verification, and a second pass over the kept tokens after a rejection.
static int ref_be_spec_row(ref_engine *r, int i, int slot, const int32_t *ids, int c, int want, moet_err *e) {
    const ck_config *cf = &r->m->cfg;
    int H = cf->hidden, V = cf->vocab;
    ref_seq *q = &r->seqs[slot];
    int p = q->pos, nd = want && c == 1 ? q->nd : 0;
    if (nd > q->limit - p - 1) nd = q->limit - p - 1;   // within the reserve
    if (nd > r->max_tokens - 1) nd = r->max_tokens - 1;
    if (nd < 0) nd = 0;
    const int32_t *ft = nd ? r->spec_tok : ids;   // the fed tokens: the row's, then the drafts
    if (nd) {
        r->spec_tok[0] = ids[0];
        memcpy(r->spec_tok + 1, q->draft, sizeof(int32_t) * nd);
        memcpy(q->snap_conv, q->conv, sizeof(float) * ref_conv_floats(cf));
        memcpy(q->snap_ssm, q->ssm, sizeof(float) * ref_ssm_floats(cf));
    }
    int off[2] = {0, c + nd};
    uint8_t w1 = (uint8_t)want;
    r->hid_all = r->spec_hid;
    int rc = ref_forward(r, 1, &slot, ft, off, &w1, r->spec_logits, nd > 0, NULL, e);
    r->hid_all = NULL;
    if (rc) return -1;
    int m = 0;            // accepted drafts
    int32_t ylast = -1;   // the last token picked
    r->res_tok[i] = -1, r->res_n[i] = 0, r->res_drafted[i] = nd;
    q->nd = 0;
    if (want) {
        const spec_res o = {r->res_tok, r->res_more, r->res_top_ids, r->res_more_top_ids, r->res_lp, r->res_more_lp, r->res_top_lp, r->res_more_top_lp, r->res_n};
        spec_host h = {&r->bank, slot, V, r->spec_logits};
        m = spec_accept(spec_pick_host, &h, ft, nd, i, &o, &ylast);
    }
    int kept = nd ? m + 1 : c;   // fed tokens that stay in the sequence
    if (kept < c + nd) {         // a rejected draft: back to the state before, the kept tokens again
        memcpy(q->conv, q->snap_conv, sizeof(float) * ref_conv_floats(cf));
        memcpy(q->ssm, q->snap_ssm, sizeof(float) * ref_ssm_floats(cf));
        q->pos = p;
        int off2[2] = {0, kept};
        uint8_t w0 = 0;
        if (ref_forward(r, 1, &slot, ft, off2, &w0, NULL, 0, NULL, e)) return -1;
    }
    // the head: the pending row (its successor is this row's first token), then the kept tokens
    // whose successors are known: each fed token but the last, and the last when a token was picked
    if (q->has_pend) {
        ref_mtp(r, slot, 1, q->pend, &ft[0], NULL, NULL);
        q->has_pend = 0;
    }
    for (int j = 0; j + 1 < kept; j++) r->spec_next[j] = ft[j + 1];   // (an accepted draft is the token picked there)
    if (want) r->spec_next[kept - 1] = ylast;
    int rows = want ? kept : kept - 1;
    if (rows > 0) ref_mtp(r, slot, rows, r->spec_hid, r->spec_next, NULL, NULL);
    if (!want) {
        memcpy(q->pend, r->spec_hid + (size_t)(kept - 1) * H, sizeof(float) * H);
        q->has_pend = 1;
        return 0;
    }
    // drafts: the last row's prediction, then the head's output fed back with each draft
    int mtp_end = q->mtp_pos;
    const float *hl = r->xn + (size_t)(rows - 1) * H;   // the last row after the head's norm (ref_mtp)
    for (int k = 0; k < q->spec; k++) {
        if (k) {
            if (q->mtp_pos + 1 > r->max_len) break;   // the head's cache is full: fewer drafts
            memcpy(r->spec_h, hl, sizeof(float) * H);
            ref_mtp(r, slot, 1, r->spec_h, &q->draft[k - 1], NULL, NULL);
            hl = r->xn;
        }
        ref_linear(r, &r->m->lm_head, hl, H, 1, r->spec_logits, V);
        q->draft[k] = moet_argmax(r->spec_logits, V);
        q->nd = k + 1;
    }
    q->mtp_pos = mtp_end;
    return 0;
}

static int ref_be_launch(void *self, const engine_step *s, moet_err *e) {
    ref_engine *r = self;
    int V = r->m->cfg.vocab;
    if (r->launched) return err_set(e, "launch: the step launched before was not collected");
    int f = engine_fault_launch(&r->fault, e);
    if (f) return f;
    if (engine_check_step("launch", r->max_seqs, r->max_tokens, V, &r->bank, ref_be_at, r, s->n, s->slots, s->ids, s->off, e))
        return -1;
    // the rows of speculating slots one by one (ref_be_spec_row), the others in one forward
    int n_spec = 0;
    for (int i = 0; i < s->n; i++) n_spec += r->seqs[s->slots[i]].spec > 0;
    const int *slots = s->slots, *off = s->off, *row = NULL;
    const int32_t *ids = s->ids;
    const uint8_t *want = s->want;
    int n = s->n;
    if (n_spec) {
        n = 0;
        r->sub_off[0] = 0;
        for (int i = 0; i < s->n; i++) {
            int c = s->off[i + 1] - s->off[i];
            if (r->seqs[s->slots[i]].spec) continue;
            memcpy(r->sub_ids + r->sub_off[n], s->ids + s->off[i], sizeof(int32_t) * c);
            r->sub_slots[n] = s->slots[i], r->sub_want[n] = s->want[i], r->sub_row[n] = i;
            r->sub_off[n + 1] = r->sub_off[n] + c;
            n++;
        }
        slots = r->sub_slots, off = r->sub_off, ids = r->sub_ids, want = r->sub_want, row = r->sub_row;
        for (int i = 0; i < s->n; i++) {
            r->res_n[i] = 1, r->res_drafted[i] = 0;
            if (r->seqs[s->slots[i]].spec &&
                ref_be_spec_row(r, i, s->slots[i], s->ids + s->off[i], s->off[i + 1] - s->off[i], s->want[i], e))
                return -1;
        }
    }
    if (n && ref_forward(r, n, slots, ids, off, want, r->step_logits, 0, NULL, e)) return -1;
    for (int k = 0, j = 0; k < n; k++) {
        int i = row ? row[k] : k;
        r->res_tok[i] = -1;   // no token for a mid-prompt chunk
        if (!want[k]) continue;
        samp_bank_pick(&r->bank, slots[k], r->step_logits + (size_t)j++ * V, &r->res_tok[i], &r->res_lp[i],
                       r->res_top_ids + (size_t)i * MOET_MAX_LOGPROBS, r->res_top_lp + (size_t)i * MOET_MAX_LOGPROBS);
    }
    r->launched = 1;
    r->spec_step = n_spec > 0;
    return 0;
}

static int ref_be_collect(void *self, engine_result *out, moet_err *e) {
    ref_engine *r = self;
    if (!r->launched) return err_set(e, "collect: no step was launched");
    r->launched = 0;
    *out = (engine_result){.token = r->res_tok, .logprob = r->res_lp, .top_ids = r->res_top_ids, .top_lp = r->res_top_lp};
    if (r->spec_step)
        out->n_tok = r->res_n, out->drafted = r->res_drafted, out->more = r->res_more, out->more_lp = r->res_more_lp,
        out->more_top_ids = r->res_more_top_ids, out->more_top_lp = r->res_more_top_lp;
    return 0;
}

static int ref_be_forward_all(void *self, int n, const int *slots, const int32_t *ids, const int *off, float *logits,
                              float **hidden, int32_t **router_ids, float **router_w, moet_err *e) {
    ref_engine *r = self;
    if (r->launched) return err_set(e, "forward_all: the step launched before was not collected");
    if (engine_check_step("forward_all", r->max_seqs, r->max_tokens, r->m->cfg.vocab, &r->bank, ref_be_at, r, n, slots, ids, off, e))
        return -1;
    r->trace_ids = router_ids;
    r->trace_w = router_w;
    int rc = ref_forward(r, n, slots, ids, off, NULL, logits, 1, hidden, e);
    r->trace_ids = NULL;
    r->trace_w = NULL;
    return rc;
}

static engine_backend ref_backend(ref_engine *r) {
    engine_fault_init(&r->fault);
    engine_backend b = {r, r->m->cfg.vocab, r->max_seqs, r->max_len, 1, ref_be_admit, ref_be_release,
                        ref_be_launch, ref_be_collect, ref_be_forward_all, r->pfx_block, r->pfx_blocks,
                        r->pfx_blocks ? ref_be_admit_from : NULL, r->pfx_blocks ? ref_be_save : NULL,
                        r->pfx_blocks ? ref_be_drop : NULL, r->spec_max, r->spec_max ? ref_be_set_spec : NULL};
    return b;
}

// ==========================================================================================
// the device
// ==========================================================================================

// defines: gpu_open, gpu_device, cu (the Driver API table, dlopen), CU_CHECK; the arena's GPU kinds
#include "gpu/cuda.c"
// defines: gpu_kernels (the embedded cubins, the kernel table K_*), gpu_launch
#include "gpu/kernels.c"
// defines: gpu_k_* (one typed launcher per kernel: its grid, block and shared memory from the shapes)
#include "gpu/launch.c"
// defines: gpu_pool_load (the resident expert pool: O_DIRECT reads, SHA-256, copy streams)
#include "gpu/pool.c"
// defines: gpu_cache (the expert cache on the device: places, reader threads, the fetch stream)
#include "gpu/cache.c"
// defines: gpu_engine (device arenas, weights, KV pages, GDN state), gpu_init, gpu_step, gpu_seq_start/end
#include "gpu/engine.c"
// defines: gpu_backend (the GPU engine_backend), engine_open (--backend auto|cpu|gpu for every command)
#include "gpu/backend.c"

// ==========================================================================================
// serving, 0: the prefix cache's block table
// ==========================================================================================
//
// Which prompt prefixes have a saved state.
//
// JSONL jobs send many requests that share a long prefix (a system prompt, tool definitions,
// few-shot examples). On this hybrid model a prefix is not only attention KV: the 30 Gated
// DeltaNet layers carry a recurrent state that summarises everything before it. That state (and
// the conv windows) after a prefix is a fixed-size snapshot, so the backend can keep it
// (engine_backend.save) at every multiple of the block size and start a later sequence from it
// (engine_admit.from); this table decides which snapshots exist.
//
// A block is the prompt's tokens [k·N, (k+1)·N) after a given prefix: it is named by a hash
// chain (the identity of model and backend, then each block's tokens in turn) and found by
// that hash, but a hit is only taken when the parent block and the N tokens are equal too, so
// a hash collision can never give a request another prompt's state. A block's entry index is
// the backend's block id: the table and the backend's storage have the same number of slots,
// planned at boot.
//
// Lifetimes: a running request holds one block (users), the last one it started from or saved;
// a block with cached children is not a leaf. Only a leaf that nobody holds can be evicted, and
// the least recently used one goes first. So a request's chain stays whole while it runs, and
// a chain in the table is always whole from its first block (what a lookup walks).
//
// Exactness: a restored sequence is a prompt cut at k·N, a multiple of the backend's
// chunk_align, which the backend promises gives the same bits as no cut (tests/test_prefix.c
// checks it on the CPU and the GPU).

typedef struct {
    uint64_t hash;       // chain hash through this block (prefix_hash)
    int parent;          // the entry of the block before (−1: the prompt's first block)
    int depth;           // blocks up to and with this one: its state is after depth · N tokens
    int children;        // entries whose parent this is
    int users;           // running requests holding it
    int live;            // holds a saved state (else on the free list)
    uint64_t used;       // tick of its last lookup or save (least recently used goes first)
} prefix_entry;

typedef struct {
    int block;           // N: tokens per block (engine_backend.prefix_block); 0: no cache
    int cap;             // entries = the backend's block ids
    uint64_t seed;       // the chain's start: the identity of model, weights, plane file, backend, N
    prefix_entry *ent;   // [cap]
    int32_t *tokens;     // [cap, N] each block's own tokens, compared on every hit
    int32_t *slot;       // [tcap] hash table, linear probing: entry + 1, 0 empty
    int tcap;            // a power of two, at least 2 · cap
    int32_t *free;       // [cap] free entries (stack)
    int n_free, n_live;
    uint64_t tick;
    uint64_t saves, evictions, hits;   // blocks saved, blocks evicted, admissions that started from a block
} prefix_table;

static int prefix_tcap(int cap) {
    int t = 16;
    while (t < 2 * cap) t *= 2;
    return t;
}

// Planned with the server (serve_carve): block and cap set before.
static void prefix_carve(prefix_table *T, arena *a) {
    T->tcap = prefix_tcap(T->cap);
    ARENA_TAKE(a, T->ent, T->cap, "prefix table");
    ARENA_TAKE(a, T->tokens, (size_t)T->cap * T->block, "prefix block tokens");
    ARENA_TAKE(a, T->slot, T->tcap, "prefix hash table");
    ARENA_TAKE(a, T->free, T->cap, "prefix free list");
}

static void prefix_init(prefix_table *T) {
    memset(T->ent, 0, sizeof(prefix_entry) * (size_t)T->cap);
    memset(T->slot, 0, sizeof(int32_t) * (size_t)T->tcap);
    T->n_free = 0;
    for (int i = T->cap - 1; i >= 0; i--) T->free[T->n_free++] = i;
    T->n_live = 0;
    T->tick = T->saves = T->evictions = T->hits = 0;
}

// The chain hash of a block of n tokens after the chain hash h (murmur3's 64-bit finaliser over
// FNV-1a of the ids: collisions are caught by the token comparison, this only spreads).
static uint64_t prefix_hash(uint64_t h, const int32_t *ids, int n) {
    h ^= 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

// The entry of the block (parent, tokens) whose chain hash is h, or −1.
static int prefix_find(const prefix_table *T, int parent, uint64_t h, const int32_t *ids) {
    for (int i = (int)(h & (uint64_t)(T->tcap - 1));; i = (i + 1) & (T->tcap - 1)) {
        int e = T->slot[i] - 1;
        if (e < 0) return -1;
        const prefix_entry *x = &T->ent[e];
        if (x->hash == h && x->parent == parent && !memcmp(T->tokens + (size_t)e * T->block, ids, sizeof(int32_t) * (size_t)T->block))
            return e;
    }
}

// The longest chain of cached blocks that starts the prompt ids[0 .. n_blocks · N): its entries
// into chain[0 ..), each touched (most recently used); returns how many, with *h the chain hash
// through the last (the seed when none).
static int prefix_match(prefix_table *T, const int32_t *ids, int n_blocks, int32_t *chain, uint64_t *h) {
    int k = 0, parent = -1;
    uint64_t hh = T->seed;
    T->tick++;
    for (; k < n_blocks; k++) {
        uint64_t nh = prefix_hash(hh, ids + (size_t)k * T->block, T->block);
        int e = prefix_find(T, parent, nh, ids + (size_t)k * T->block);
        if (e < 0) break;
        T->ent[e].used = T->tick;
        chain[k] = e;
        parent = e;
        hh = nh;
    }
    *h = hh;
    return k;
}

static void prefix_hold(prefix_table *T, int e) { T->ent[e].users++; }

static void prefix_unhold(prefix_table *T, int e) {
    MOET_ASSERT(T->ent[e].users > 0, "prefix block %d released by nobody", e);
    T->ent[e].users--;
    T->ent[e].used = ++T->tick;   // its holder just used it
}

// Takes entry e out of the hash table (backward-shift deletion: later entries of its probe run
// move up, so no lookup ever stops at a hole before them).
static void prefix_unlink(prefix_table *T, int e) {
    int m = T->tcap - 1, i = (int)(T->ent[e].hash & (uint64_t)m);
    while (T->slot[i] != e + 1) i = (i + 1) & m;
    for (int j = (i + 1) & m;; j = (j + 1) & m) {
        int x = T->slot[j] - 1;
        if (x < 0) break;
        int home = (int)(T->ent[x].hash & (uint64_t)m);
        // x may fill the hole at i unless its home lies cyclically in (i, j]
        if (((j - home) & m) >= ((j - i) & m)) {
            T->slot[i] = T->slot[j];
            i = j;
        }
    }
    T->slot[i] = 0;
}

// Evicts the least recently used leaf nobody holds: out of the table, its backend block dropped.
// Returns 0 when every block is held or has children (nothing may go).
static int prefix_evict(prefix_table *T, const engine_backend *be) {
    int best = -1;
    for (int e = 0; e < T->cap; e++) {
        const prefix_entry *x = &T->ent[e];
        if (x->live && !x->users && !x->children && (best < 0 || x->used < T->ent[best].used)) best = e;
    }
    if (best < 0) return 0;
    prefix_entry *x = &T->ent[best];
    prefix_unlink(T, best);
    if (x->parent >= 0) T->ent[x->parent].children--;
    be->drop(be->self, best);
    memset(x, 0, sizeof *x);
    T->free[T->n_free++] = best;
    T->n_live--;
    T->evictions++;
    return 1;
}

// A free entry for a new block, evicting one when none is free; −1 when nothing may be evicted.
static int prefix_take(prefix_table *T, const engine_backend *be) {
    if (!T->n_free && !prefix_evict(T, be)) return -1;
    return T->free[--T->n_free];
}

// A taken entry whose state could not be saved goes back.
static void prefix_put(prefix_table *T, int e) { T->free[T->n_free++] = e; }

// Entry e (taken, its state saved by the backend) becomes the block `ids` after parent.
static void prefix_link(prefix_table *T, int e, int parent, int depth, uint64_t h, const int32_t *ids) {
    prefix_entry *x = &T->ent[e];
    *x = (prefix_entry){h, parent, depth, 0, 0, 1, ++T->tick};
    memcpy(T->tokens + (size_t)e * T->block, ids, sizeof(int32_t) * (size_t)T->block);
    if (parent >= 0) T->ent[parent].children++;
    int i = (int)(h & (uint64_t)(T->tcap - 1));
    while (T->slot[i]) i = (i + 1) & (T->tcap - 1);
    T->slot[i] = e + 1;
    T->n_live++;
    T->saves++;
}

// Blocks held by running requests (each holds at most one).
static int prefix_held(const prefix_table *T) {
    int n = 0;
    for (int e = 0; e < T->cap; e++) n += T->ent[e].users;
    return n;
}

// ---- identity -----------------------------------------------------------------------------
//
// What the chain starts from: one process serves one model, so the table never mixes models,
// but the key says what a state depends on, so a cache kept across models could never mix them
// either: the model's config.json, every shard's safetensors header (tensor names, dtypes,
// shapes, offsets) with its size and modification time, the Hugging Face revision when the
// path names one, the plane file's header page (its SHA-256 covers the hash of every expert
// slot), the backend (CPU or GPU, and the GPU's KV dtype), the products' input rounding
// (`--act-dtype bf16`) and the block size. SHA-256, first 8 bytes. Boot only (it allocates).
static uint64_t prefix_identity(const ck_model *m, const char *planes, int is_gpu, int kv_dtype, int act_bf16, int block, moet_err *e) {
    pf_sha sha;
    if (pf_sha_init(&sha, e)) return 0;
    uint8_t sum[32], acc[32];
    memset(acc, 0, sizeof acc);
    // acc = SHA-256(acc || piece) for each piece, in order
#define PREFIX_ID_ADD(p, n)                                                 \
    do {                                                                    \
        uint8_t t_[32];                                                     \
        pf_sha256(&sha, (p), (n), t_);                                      \
        uint8_t both_[64];                                                  \
        memcpy(both_, acc, 32);                                             \
        memcpy(both_ + 32, t_, 32);                                         \
        pf_sha256(&sha, both_, 64, acc);                                    \
    } while (0)
    char path[MOET_MAX_PATH];
    size_t n = 0;
    if (ck_path(path, sizeof path, m->dir, "config.json") == 0) {
        moet_err ce;
        char *cfg = arena_read_small(path, MOET_MAX_CONFIG_BYTES, &n, &ce);
        if (cfg) {
            PREFIX_ID_ADD(cfg, n);
            arena_sys_free(cfg, n + 1);
        }
    }
    for (int i = 0; i < m->st.n_shards; i++) {
        const arena_map *mp = &m->st.maps[i];
        uint64_t hdr = 0;
        for (int b = 0; b < 8 && (size_t)b < mp->size; b++) hdr |= (uint64_t)mp->data[b] << (8 * b);
        if (hdr <= mp->size - 8) PREFIX_ID_ADD(mp->data, 8 + hdr);
        struct stat st;
        if (stat(m->st.shard_path[i], &st) == 0) {
            int64_t v[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
            PREFIX_ID_ADD(v, sizeof v);
        }
    }
    char repo[256], rev[256];
    if (ck_hf_snapshot(m->dir, repo, sizeof repo, rev, sizeof rev)) PREFIX_ID_ADD(rev, strlen(rev));
    if (planes) {
        uint8_t page[4096];
        int fd = open(planes, O_RDONLY | O_CLOEXEC);
        ssize_t got = fd >= 0 ? read(fd, page, sizeof page) : -1;
        if (fd >= 0) close(fd);
        if (got > 0) PREFIX_ID_ADD(page, (size_t)got);
    }
    int32_t be[3] = {is_gpu, is_gpu ? kv_dtype : -1, block};
    PREFIX_ID_ADD(be, sizeof be);
    if (act_bf16) PREFIX_ID_ADD("act bf16", 8);   // (an f32 run's identity as before)
#undef PREFIX_ID_ADD
    memcpy(sum, acc, 32);
    pf_sha_free(&sha);
    uint64_t id = 0;
    for (int i = 0; i < 8; i++) id = id << 8 | sum[i];
    return id;
}

// ==========================================================================================
// serving, 1: the scheduler and the serve loop
// ==========================================================================================
//
// The scheduler (continuous batching over an engine_backend) and the line loop of
// format/PROTOCOL.md.
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
// into chunks at multiples of its chunk_align (the only places a step cuts one), so a seeded
// request gives the same tokens alone or in a busy batch.


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
    uint64_t prefix_identity;   // the prefix cache's chain seed (prefix_identity); the cache is on when the backend keeps blocks
    int spec;               // drafts per decode step (--speculative-tokens; 0: none); with spec_auto the most
    int spec_auto;          // --speculative-tokens auto: each step's drafts chosen by measurement (spec_ctrl)
} serve_config;

// ---- --speculative-tokens auto: a step's drafts chosen by measurement ------------------------------
//
// Drafting pays when the tokens a step emits per row grow faster than its time, which depends on
// the device, the batch and the text (the head's acceptance): so it is measured. Per decode
// batch size (buckets 1, 2–3, 4–7, …), each k in 0 .. kmax is held for SPEC_RUN steps at a time;
// a run's first step is not counted (it verifies what the k before drafted), the others feed the
// k's running mean of tokens per second (exponential, weight SPEC_EWMA). Every k is run
// SPEC_PROBES times first, in order 0, 1, …; then the k of the most tokens per second is held
// (a k > 0 only when it beats k = 0 by SPEC_MARGIN, so noise does not make decoding slower), and
// one run of a neighbour (one less, then one more, in turn) keeps its measure current: SPEC_REPROBE
// steps after the choice was made, then twice as long after each run that leaves the choice as it
// was (up to SPEC_REPROBE_MAX), so a neighbour that keeps losing — drafts that cost far more than
// they give, as a head that is never accepted — costs SPEC_RUN of SPEC_REPROBE_MAX steps; a run
// that changes the choice starts the gap again. And never sooner than its measured loss allows:
// a run of a neighbour whose steps take x times as long per token as the choice's comes no sooner
// than SPEC_RUN · (x − 1) / SPEC_LOSS steps after the last, so reprobes cost at most SPEC_LOSS
// of the time (by the last measurements) from the first choice on. Only the speed depends on it:
// a sequence's tokens are the same with any drafts.
#define SPEC_BUCKETS 13     // batch sizes up to 2^13 − 1 (MOET_MAX_SEQS 4,096)
#define SPEC_RUN 4          // steps a choice is held
#define SPEC_PROBES 2       // runs of every k before choosing
#define SPEC_REPROBE 64     // steps between two runs of a neighbour of the choice, at first
#define SPEC_REPROBE_MAX 2048   // ... and at most, the gap doubling after each run that changed nothing
#define SPEC_LOSS 0.005     // the most of the time reprobes may cost, by the neighbour's measured loss
#define SPEC_LOSS_GAP 8192  // ... unless the gap that takes grows past this (then a run every this many steps)
#define SPEC_EWMA 0.25      // weight of a new measurement
#define SPEC_MARGIN 1.03    // how much faster than no drafts a k > 0 must be
#define SPEC_AUTO_MAX 4     // the most drafts auto tries
_Static_assert(MOET_MAX_SEQS < (1 << SPEC_BUCKETS), "spec_ctrl: a bucket for every batch size");
typedef struct {
    int kmax;
    double tps[SPEC_BUCKETS][MOET_MAX_SPEC + 1];   // tokens per second of steps with k drafts a row
    int obs[SPEC_BUCKETS][MOET_MAX_SPEC + 1];      // steps counted
    int runs[SPEC_BUCKETS][MOET_MAX_SPEC + 1];     // runs ended
    int cur[SPEC_BUCKETS], left[SPEC_BUCKETS], first[SPEC_BUCKETS];   // the k held, its steps to go, its first step to come
    int side[SPEC_BUCKETS];                        // the next reprobe's neighbour: 0 below, 1 above
    uint64_t since[SPEC_BUCKETS];                  // steps since the last reprobe
    int gap[SPEC_BUCKETS];                         // steps from one reprobe to the next (SPEC_REPROBE .. SPEC_REPROBE_MAX)
    int probe[SPEC_BUCKETS], choice[SPEC_BUCKETS]; // the k of the reprobe under way (-1: none) and the choice it was run against
} spec_ctrl;

static void spec_ctrl_init(spec_ctrl *c, int kmax) {
    memset(c, 0, sizeof *c);
    c->kmax = kmax < 0 ? 0 : kmax > MOET_MAX_SPEC ? MOET_MAX_SPEC : kmax;
    for (int b = 0; b < SPEC_BUCKETS; b++) c->gap[b] = SPEC_REPROBE, c->probe[b] = -1;
}

static int spec_bucket(int B) {
    int b = 0;
    while (b + 1 < SPEC_BUCKETS && (2 << b) <= B) b++;
    return b;
}

// The choice of bucket b: 0, or the fastest k measured when it beats 0 by SPEC_MARGIN.
static int spec_ctrl_best(const spec_ctrl *c, int b) {
    int best = 0;
    for (int k = 1; k <= c->kmax; k++)
        if (c->obs[b][k] && c->tps[b][k] > c->tps[b][best] && (best > 0 || c->tps[b][k] > SPEC_MARGIN * c->tps[b][0])) best = k;
    return best;
}

// The drafts a row of a decode step of B rows proposes (held for SPEC_RUN steps of its bucket).
static int spec_ctrl_pick(spec_ctrl *c, int B) {
    int b = spec_bucket(B);
    if (c->left[b] > 0) return c->cur[b];
    int k = -1;
    for (int i = 0; i <= c->kmax && k < 0; i++)
        if (c->runs[b][i] < SPEC_PROBES) k = i;
    if (k >= 0) c->since[b] = 0;   // (the gaps count from the first choice)
    if (k < 0) {
        k = spec_ctrl_best(c, b);
        int n = c->side[b] ? k - 1 : k + 1;   // the next reprobe's neighbour (side toggles when it runs)
        n = n < 0 ? k + 1 : n > c->kmax ? k - 1 : n;
        double gap = c->gap[b];
        if (c->kmax > 0 && c->obs[b][n] && c->tps[b][n] > 0) {   // its loss: x − 1 of SPEC_RUN steps, at most SPEC_LOSS of the gap
            const double x = c->tps[b][k] / c->tps[b][n], need = SPEC_RUN * (x - 1) / SPEC_LOSS;
            if (need > gap) gap = need < SPEC_LOSS_GAP ? need : SPEC_LOSS_GAP;
        }
        if (c->since[b] >= gap && c->kmax > 0) {
            c->since[b] = 0;
            c->side[b] ^= 1;
            c->choice[b] = k;
            k = n;
            c->probe[b] = k;
        }
    }
    c->cur[b] = k, c->left[b] = SPEC_RUN, c->first[b] = 1;
    return k;
}

// A decode step of B rows with k drafts a row (spec_ctrl_pick's) emitted `tokens` in `seconds`.
static void spec_ctrl_note(spec_ctrl *c, int B, int k, double tokens, double seconds) {
    int b = spec_bucket(B);
    if (k != c->cur[b] || c->left[b] <= 0 || seconds <= 0) return;
    c->since[b]++;
    const int end = --c->left[b] == 0;
    if (end) c->runs[b][k]++;
    if (c->first[b]) c->first[b] = 0;
    else {
        double v = tokens / seconds;
        c->tps[b][k] = c->obs[b][k]++ ? (1 - SPEC_EWMA) * c->tps[b][k] + SPEC_EWMA * v : v;
    }
    if (end && c->probe[b] == k) {   // a reprobe's run ended: the next one later if it changed nothing
        c->probe[b] = -1;
        c->gap[b] = spec_ctrl_best(c, b) == c->choice[b] ? (c->gap[b] * 2 < SPEC_REPROBE_MAX ? c->gap[b] * 2 : SPEC_REPROBE_MAX) : SPEC_REPROBE;
    }
}

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
    uint64_t seed;          // the generator's seed (the generator itself lives with the backend slot)
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
    // prefix cache
    int n_cached;           // prompt tokens restored from saved blocks at admission
    int pfx_at;             // the prefix block it holds (the last it started from or saved), −1: none
    int pfx_depth;          // its chain's blocks so far: pfx_at's depth
    uint64_t pfx_hash;      // the chain hash through pfx_at
    int pfx_off;            // saves no more blocks (the table had no room, or a save failed)
    // speculation (cfg.spec)
    int spec;               // drafts per decode step it was admitted with
    int drafted, accepted;  // drafts verified; those emitted in its answer
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
    // one step
    int32_t *ids;           // [max_batch_tokens]
    int *row_slot, *row_rec, *off;   // [max_num_seqs], [max_num_seqs], [max_num_seqs + 1]
    uint8_t *want;          // [max_num_seqs] the row ends a prompt or decodes: a token is picked
    // one line
    char *in_buf;           // [in_cap] the line reader's buffer
    size_t in_cap;
    ln_reader in;           // the request lines (format/lines.c)
    int stopping;           // a signal came: stdin is no longer read
    int lost;               // the backend lost its device: every request was answered, the server exits 1
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
    // prefix cache (on when the backend keeps blocks: pfx.cap > 0)
    prefix_table pfx;
    int32_t *chain;         // [max_len / prefix_block] one admission's cached blocks
    uint64_t cached_tokens; // prompt tokens restored from the cache
    uint64_t spec_drafted, spec_accepted;   // drafts verified, and emitted, over every request
    spec_ctrl ctl;          // --speculative-tokens auto
    arena mem;
} serve_ctx;

static volatile sig_atomic_t serve_signals;   // SIGTERM/SIGINT count
static void serve_on_signal(int sig) {
    (void)sig;
    serve_signals++;
}

// ---- memory plan ---------------------------------------------------------------------------


static void serve_carve(serve_ctx *S, arena *a) {
    const serve_config *c = &S->cfg;
    int K = c->max_logprobs;
    ARENA_TAKE(a, S->recs, S->n_recs, "request records");
    for (int i = 0; i < S->n_recs; i++) {
        serve_rec *r = a->base ? &S->recs[i] : &(serve_rec){0};
        ARENA_TAKE(a, r->tok, S->max_len, "token buffers");
        ARENA_TAKE(a, r->text, S->text_cap, "text buffers");
        ARENA_TAKE(a, r->stop, MOET_MAX_STOP * MOET_MAX_STOP_BYTES, "stop strings");
        ARENA_TAKE(a, r->lp, S->max_len, "logprobs");
        ARENA_TAKE(a, r->lp_ids, (size_t)S->max_len * (K ? K : 1), "top logprob ids");
        ARENA_TAKE(a, r->lp_vals, (size_t)S->max_len * (K ? K : 1), "top logprobs");
    }
    ARENA_TAKE(a, S->free_recs, S->n_recs, "record free list");
    ARENA_TAKE(a, S->waiting, S->n_recs, "waiting queue");
    ARENA_TAKE(a, S->running, c->max_num_seqs, "running list");
    ARENA_TAKE(a, S->free_slots, c->max_num_seqs, "slot free list");
    ARENA_TAKE(a, S->ids, c->max_batch_tokens, "step tokens");
    ARENA_TAKE(a, S->row_slot, c->max_num_seqs, "step rows");
    ARENA_TAKE(a, S->row_rec, c->max_num_seqs, "step rows");
    ARENA_TAKE(a, S->off, c->max_num_seqs + 1, "step offsets");
    ARENA_TAKE(a, S->want, c->max_num_seqs, "step picks");
    ARENA_TAKE(a, S->in_buf, S->in_cap, "input buffer");
    ARENA_TAKE(a, S->doc.nodes, MOET_MAX_LINE_VALUES, "request JSON values");
    ARENA_TAKE(a, S->doc.strs, MOET_MAX_LINE + 1, "request JSON strings");
    ARENA_TAKE(a, S->cm.scratch, MOET_MAX_LINE, "message text");
    ARENA_TAKE(a, S->cm.args.nodes, MOET_MAX_LINE_VALUES, "tool argument values");
    ARENA_TAKE(a, S->cm.args.strs, MOET_MAX_LINE + 1, "tool argument strings");
    ARENA_TAKE(a, S->prompt, S->prompt_cap, "rendered prompt");
    ARENA_TAKE(a, S->enc, S->enc_cap, "encoded prompt");
    ARENA_TAKE(a, S->out.buf, MOET_OUT_BUFFER, "output buffer");
    if (S->pfx.cap) {
        prefix_carve(&S->pfx, a);
        ARENA_TAKE(a, S->chain, S->max_len / S->pfx.block + 1, "prefix chain");
    }
}

// Plans and allocates everything for the backend `be` and the codec. Returns -1 with e set
// when a flag is out of range or the memory is refused.
static int serve_init(serve_ctx *S, const serve_config *cfg, engine_backend be, serve_codec codec, moet_err *e) {
    memset(S, 0, sizeof *S);
    S->cfg = *cfg;
    MOET_ASSERT(!cfg->spec_auto || (be.set_spec && cfg->spec >= 1 && cfg->spec <= be.max_spec), "--speculative-tokens auto: up to %d drafts "
                "on a backend of %d", cfg->spec, be.max_spec);
    spec_ctrl_init(&S->ctl, cfg->spec_auto ? cfg->spec : 0);
    S->be = be;
    S->codec = codec;
    S->V = be.n_vocab;
    S->max_len = be.max_len;
    const serve_config *c = &S->cfg;
    if (c->max_num_seqs < 1 || c->max_num_seqs > be.max_seqs)
        return err_set(e, "--max-num-seqs %d: the backend has %d sequence slots", c->max_num_seqs, be.max_seqs);
    MOET_ASSERT(be.chunk_align >= 1, "chunk_align %d", be.chunk_align);
    if (c->max_batch_tokens < c->max_num_seqs)
        return err_set(e, "--max-batch-tokens %d must be at least --max-num-seqs %d (one decode token per sequence)",
                       c->max_batch_tokens, c->max_num_seqs);
    // a step beside max_num_seqs − 1 decoding sequences must still hold one aligned prompt chunk
    if (be.chunk_align > 1 && c->max_batch_tokens < c->max_num_seqs - 1 + be.chunk_align)
        return err_set(e, "--max-batch-tokens %d must be at least %d: --max-num-seqs %d - 1 decode tokens plus one prompt "
                          "chunk of %d tokens (this backend cuts prompts at multiples of %d tokens)",
                       c->max_batch_tokens, c->max_num_seqs - 1 + be.chunk_align, c->max_num_seqs, be.chunk_align,
                       be.chunk_align);
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
    S->doc.cap_nodes = MOET_MAX_LINE_VALUES;
    S->doc.cap_strs = MOET_MAX_LINE + 1;
    S->cm.scratch_cap = MOET_MAX_LINE;
    S->cm.args.cap_nodes = MOET_MAX_LINE_VALUES;
    S->cm.args.cap_strs = MOET_MAX_LINE + 1;
    S->out.cap = MOET_OUT_BUFFER;
    if (be.prefix_blocks > 0) {   // the backend keeps blocks: the table has as many entries
        int aligned = be.prefix_block > 0 && be.prefix_block % be.chunk_align == 0;
        MOET_ASSERT(be.admit_from && be.save && be.drop && aligned, "prefix blocks of %d tokens, chunk_align %d", be.prefix_block,
                    be.chunk_align);
        S->pfx.block = be.prefix_block;
        S->pfx.cap = be.prefix_blocks;
        S->pfx.seed = c->prefix_identity;
    }
    arena_plan p = arena_plan_begin(&S->mem, "serve", ARENA_HOST, e);
    while (arena_plan_pass(&p)) serve_carve(S, p.on);
    if (p.failed) return -1;
    if (S->pfx.cap) prefix_init(&S->pfx);
    for (int i = 0; i < S->n_recs; i++) S->free_recs[S->n_free_recs++] = S->n_recs - 1 - i;
    for (int s = 0; s < c->max_num_seqs; s++) S->free_slots[S->n_free_slots++] = c->max_num_seqs - 1 - s;
    for (int i = 0; i < S->n_recs; i++) S->recs[i].state = REC_FREE;
    return 0;
}

static void serve_free(serve_ctx *S) { arena_release(&S->mem); }

// ---- the lines out: answers, stream chunks, errors, stats, ready ---------------------------
//
// Everything the server writes on stdout is composed here, on the primitives of
// format/protocol.c (po_*), and nowhere else.

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
    po_fmt(o, ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
              "\"prompt_tokens_details\":{\"cached_tokens\":%d}",
           r->n_prompt, gen, r->n_tok, r->n_cached);
    if (r->spec)   // drafted by the MTP head: those in the answer, and the others
        po_fmt(o, ",\"completion_tokens_details\":{\"accepted_prediction_tokens\":%d,\"rejected_prediction_tokens\":%d}", r->accepted,
               r->drafted - r->accepted);
    po_s(o, "}");
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

// {"id": ..., "error": {...}} — or, for a Batch line, its output line with status 400.
static void serve_write_error(proto_out *o, const char *id, int batch, uint64_t batch_no, const char *code,
                              const char *type, const char *msg) {
    if (batch) {
        po_fmt(o, "{\"id\":\"batch_req_%" PRIu64 "\",\"custom_id\":", batch_no);
        po_cstr(o, id);
        po_s(o, ",\"response\":{\"status_code\":400,\"request_id\":");
        po_cstr(o, id);
        po_s(o, ",\"body\":{\"error\":{\"message\":");
        po_cstr(o, msg);
        po_s(o, ",\"type\":");
        po_cstr(o, type);
        po_s(o, ",\"param\":null,\"code\":");
        po_cstr(o, code);
        po_s(o, "}}},\"error\":null}");
    } else {
        po_s(o, "{\"id\":");
        if (id) po_cstr(o, id);
        else po_s(o, "null");
        po_s(o, ",\"error\":{\"type\":");
        po_cstr(o, type);
        po_s(o, ",\"code\":");
        po_cstr(o, code);
        po_s(o, ",\"message\":");
        po_cstr(o, msg);
        po_s(o, "}}");
    }
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
           arena_total_allocs() - S->allocs_at_ready, rss, anon, ru.ru_minflt - S->minflt_at_ready,
           ru.ru_majflt - S->majflt_at_ready);
    po_num(o, round((moet_now() - S->t_start) * 1000) / 1000);
    po_fmt(o, ",\"device_bytes\":%" PRIu64 ",\"pinned_bytes\":%" PRIu64, arena_stats.device_bytes, arena_stats.pinned_bytes);
    const prefix_table *T = &S->pfx;
    po_fmt(o, ",\"cached_prompt_tokens\":%" PRIu64 ",\"prefix_cache\":{\"block_tokens\":%d,\"blocks\":%d,\"blocks_used\":%d,"
              "\"blocks_held\":%d,\"hits\":%" PRIu64 ",\"saves\":%" PRIu64 ",\"evictions\":%" PRIu64 "}",
           S->cached_tokens, T->block, T->cap, T->n_live, T->cap ? prefix_held(T) : 0, T->hits, T->saves, T->evictions);
    po_fmt(o, ",\"speculation\":{\"draft_tokens\":%d,\"drafted\":%" PRIu64 ",\"accepted\":%" PRIu64, S->cfg.spec, S->spec_drafted,
           S->spec_accepted);
    if (S->cfg.spec_auto) {   // each batch bucket's choice and tokens per second per k (null: not measured)
        po_fmt(o, ",\"auto\":[");
        int any = 0;
        for (int b = 0; b < SPEC_BUCKETS; b++) {
            int seen = 0;
            for (int k = 0; k <= S->ctl.kmax; k++) seen |= S->ctl.obs[b][k] > 0;
            if (!seen) continue;
            po_fmt(o, "%s{\"batch_from\":%d,\"draft_tokens\":%d,\"tok_s\":[", any++ ? "," : "", 1 << b, spec_ctrl_best(&S->ctl, b));
            for (int k = 0; k <= S->ctl.kmax; k++)
                if (S->ctl.obs[b][k]) po_fmt(o, "%s%.1f", k ? "," : "", S->ctl.tps[b][k]);
                else po_fmt(o, "%snull", k ? "," : "");
            po_fmt(o, "]}");
        }
        po_fmt(o, "]");
    }
    po_fmt(o, "}");
    po_fmt(o, ",\"expert_cache\":{\"pool_slots\":%" PRIu64 ",\"file_slots\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
              ",\"bytes_read\":%" PRIu64 ",\"read_s\":",
           pf_cache_stats.pool_slots, pf_cache_stats.file_slots, pf_cache_stats.hits, pf_cache_stats.misses, pf_cache_stats.bytes);
    po_num(o, round(pf_cache_stats.read_s * 1e6) / 1e6);
    po_fmt(o, ",\"prefetched\":%" PRIu64 ",\"prefetch_used\":%" PRIu64 ",\"prefetch_dropped\":%" PRIu64 ",\"next_layer_used\":%" PRIu64
              ",\"next_layer_named\":%" PRIu64 "}",
           pf_cache_stats.prefetched, pf_cache_stats.prefetch_used, pf_cache_stats.prefetch_dropped, pf_cache_stats.guess_needed,
           pf_cache_stats.guess_named);
    po_s(o, "}");
    po_end_line(o);
}

// The answer to a cancel line: the request will stop (its own answer follows, finish_reason
// "cancelled").
static void serve_write_cancelled(proto_out *o, const char *id) {
    po_s(o, "{\"object\":\"cancel\",\"id\":");
    po_cstr(o, id);
    po_s(o, ",\"cancelled\":true}");
    po_end_line(o);
}

// The first line: the server is ready, with its limits.
static void serve_ready(serve_ctx *S) {
    proto_out *o = &S->out;
    po_s(o, "{\"object\":\"ready\",\"model\":");
    po_cstr(o, S->cfg.model_name);
    po_fmt(o, ",\"max_model_len\":%d,\"max_num_seqs\":%d,\"max_batch_tokens\":%d,\"max_queue\":%d,\"n_vocab\":%d,"
              "\"max_line_bytes\":%u,\"prefix_block\":%d,\"prefix_blocks\":%d}",
           S->max_len, S->cfg.max_num_seqs, S->cfg.max_batch_tokens, S->cfg.max_queue, S->V, MOET_MAX_LINE, S->pfx.block,
           S->pfx.cap);
    po_end_line(o);
}

// ---- request lifetime ---------------------------------------------------------------------

static void serve_release(serve_ctx *S, serve_rec *r) {
    int idx = (int)(r - S->recs);
    if (r->pfx_at >= 0) prefix_unhold(&S->pfx, r->pfx_at);
    r->pfx_at = -1;
    if (r->slot >= 0) {
        S->be.release(S->be.self, r->slot);
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
    serve_write_error(&S->out, r->id, r->batch, r->batch_no, "server_error", "server_error", msg);
    serve_release(S, r);
}

static int serve_is_stop_id(const serve_ctx *S, const serve_rec *r, int32_t id) {
    for (int i = 0; i < S->cfg.n_eos; i++)
        if (S->cfg.eos[i] == id) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return 1;
    return 0;
}

// Takes the token the backend picked for r (row `row` of the step's results) with its
// logprobs, and applies every stop rule.
static void serve_sample(serve_ctx *S, serve_rec *r, const engine_result *res, int row, int j) {
    size_t mj = (size_t)row * MOET_MAX_SPEC + (size_t)(j - 1);   // (j > 0: the row's j-th token, engine_result.more)
    int32_t id = j ? res->more[mj] : res->token[row];
    MOET_ASSERT(id >= 0 && id < S->V, "backend picked token %d outside the vocabulary of %d", id, S->V);
    int gen = r->n_tok - r->n_prompt;   // index of this token among the generated ones
    if (r->logprobs) {
        size_t K = (size_t)S->cfg.max_logprobs;
        const int32_t *ti = j ? res->more_top_ids + mj * MOET_MAX_LOGPROBS : res->top_ids + (size_t)row * MOET_MAX_LOGPROBS;
        const float *tl = j ? res->more_top_lp + mj * MOET_MAX_LOGPROBS : res->top_lp + (size_t)row * MOET_MAX_LOGPROBS;
        r->lp[gen] = j ? res->more_lp[mj] : res->logprob[row];
        memcpy(r->lp_ids + (size_t)gen * K, ti, sizeof(int32_t) * (size_t)r->top_logprobs);
        memcpy(r->lp_vals + (size_t)gen * K, tl, sizeof(float) * (size_t)r->top_logprobs);
    }
    if (r->t_first == 0) r->t_first = moet_now();
    r->tok[r->n_tok++] = id;
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

// Gives free backend slots to waiting requests, oldest first. A request takes KV room for
// all the tokens it may reach (prompt + max_tokens, or the context), so a running sequence
// never runs out of it (no preemption: results stay deterministic); when the backend has no
// room now, the request at the head waits and so do the ones behind it (first come, first served).
//
// With the prefix cache, a request starts after the longest chain of saved blocks its prompt
// begins with (at least one prompt token is left to compute: its logits pick the first token).
// A request whose prompt shares whole blocks beyond that with a prompt still being computed waits
// for those blocks to be saved (and so do the ones behind it): computing them again would cost
// what the cache saves. When the backend has no room, unused cached blocks are evicted, least
// recently used first, before the request waits.

// 1 when a running request still prefilling (and saving blocks) will save blocks of r's prompt
// beyond the `have` that r found in the table.
static int serve_prefix_pending(const serve_ctx *S, const serve_rec *r, int have) {
    int N = S->pfx.block;
    for (int i = 0; i < S->n_running; i++) {
        const serve_rec *q = &S->recs[S->running[i]];
        if (q->state != REC_PREFILL || q->pfx_off) continue;
        int lim = r->n_prompt - 1 < q->n_prompt ? r->n_prompt - 1 : q->n_prompt, same = 0;
        while (same < lim && r->tok[same] == q->tok[same]) same++;
        if (same / N > have && q->n_fed < same / N * N) return 1;
    }
    return 0;
}

static void serve_admit(serve_ctx *S) {
    while (S->n_waiting && S->n_free_slots) {
        int idx = S->waiting[S->wait_head];
        serve_rec *r = &S->recs[idx];
        int slot = S->free_slots[S->n_free_slots - 1];
        int reserve = r->max_tokens && r->max_tokens < S->max_len - r->n_prompt ? r->n_prompt + r->max_tokens : S->max_len;
        int nb = 0;
        uint64_t h = 0;
        // requests draft with the MTP head (--speculative-tokens); they start from their first
        // token (the head's cache is not in prefix blocks), and save blocks as any other. With
        // auto, a request whose prompt starts with cached blocks takes them and does not draft.
        int spec = S->cfg.spec;
        if (S->pfx.cap && (!spec || S->cfg.spec_auto)) {
            nb = prefix_match(&S->pfx, r->tok, (r->n_prompt - 1) / S->pfx.block, S->chain, &h);
            if (serve_prefix_pending(S, r, nb)) break;
            if (nb) prefix_hold(&S->pfx, S->chain[nb - 1]), spec = 0;   // not evicted below (nor its parents: they have a child)
        }
        engine_admit a = {r->sp, r->seed, r->logprobs, r->top_logprobs, r->tok, r->n_prompt, reserve, spec};
        moet_err e = {{0}};
        int rc = S->pfx.cap ? S->be.admit_from(S->be.self, slot, &a, S->chain, nb, &e) : S->be.admit(S->be.self, slot, &a, &e);
        while (rc == 1 && S->pfx.cap && prefix_evict(&S->pfx, &S->be)) rc = S->be.admit_from(S->be.self, slot, &a, S->chain, nb, &e);
        if (rc != 0 && nb) prefix_unhold(&S->pfx, S->chain[nb - 1]);
        if (rc == 1 && S->n_running > 0) break;   // room comes back when a running sequence ends
        S->wait_head = (S->wait_head + 1) % S->n_recs;
        S->n_waiting--;
        if (rc != 0) {   // refused, or no room even with nothing running: it would wait forever
            if (rc == 1) snprintf(e.msg, sizeof e.msg, "the backend has no room for %d tokens even when idle", reserve);
            fprintf(stderr, "moet serve: request %s not admitted: %s\n", r->id, e.msg);
            serve_fail(S, r, e.msg);
            continue;
        }
        S->n_free_slots--;
        r->slot = slot;
        r->state = REC_PREFILL;
        r->spec = spec;
        r->drafted = r->accepted = 0;
        r->t_admit = moet_now();
        if (nb) {
            r->pfx_at = S->chain[nb - 1];
            r->pfx_depth = nb;
            r->pfx_hash = h;
            r->n_fed = r->n_cached = nb * S->pfx.block;
            S->cached_tokens += (uint64_t)r->n_cached;
            S->pfx.hits++;
        }
        S->running[S->n_running++] = idx;
    }
}

// r's last step ended on a block boundary of its prompt (n_fed = k · N, k = pfx_depth + 1): the
// block is saved, unless it is in the table already (another request computed the same
// tokens: the same bits), and r holds it instead of the one before. When the table has no room
// (every block held or a parent), r saves no more.
static void serve_prefix_save(serve_ctx *S, serve_rec *r) {
    prefix_table *T = &S->pfx;
    int N = T->block, depth = r->n_fed / N;
    if (depth != r->pfx_depth + 1) {   // every boundary is a cut (engine_chunk_take_block): a skipped one ends the chain
        r->pfx_off = 1;
        return;
    }
    const int32_t *ids = r->tok + (size_t)(depth - 1) * N;
    uint64_t h = prefix_hash(r->pfx_depth ? r->pfx_hash : T->seed, ids, N);
    int e = prefix_find(T, r->pfx_at, h, ids);
    if (e < 0) {
        e = prefix_take(T, &S->be);
        if (e < 0) {
            r->pfx_off = 1;
            return;
        }
        moet_err err = {{0}};
        if (S->be.save(S->be.self, r->slot, e, &err)) {
            prefix_put(T, e);
            fprintf(stderr, "moet serve: request %s: prefix block not saved: %s\n", r->id, err.msg);
            r->pfx_off = 1;
            return;
        }
        prefix_link(T, e, r->pfx_at, depth, h, ids);
    } else T->ent[e].used = ++T->tick;
    prefix_hold(T, e);
    if (r->pfx_at >= 0) prefix_unhold(T, r->pfx_at);
    r->pfx_at = e;
    r->pfx_depth = depth;
    r->pfx_hash = h;
}

static void serve_input(serve_ctx *S, int block);

// One batched step over the running requests: launched, then new input lines are read while
// it runs, then its tokens are collected. Returns 0, or -1 when the backend failed (the
// requests of the step are answered with an error).
static int serve_step(serve_ctx *S) {
    int n = 0, T = 0;
    S->off[0] = 0;
    for (int i = 0; i < S->n_running; i++) {   // every decoding sequence: its next token
        serve_rec *r = &S->recs[S->running[i]];
        if (r->state != REC_DECODE) continue;
        S->ids[T++] = r->tok[r->n_fed];
        S->row_slot[n] = r->slot;
        S->want[n] = 1;
        S->row_rec[n++] = S->running[i];
        S->off[n] = T;
    }
    int n_dec = n;   // the decode rows: the first n_dec
    // prefill chunks, oldest first. A chunk ends at the prompt's end or at a multiple of
    // chunk_align (absolute positions; every earlier chunk ended at one, so n_fed is one): a
    // prompt whose next aligned block does not fit waits, and a later one may use the room.
    int align = S->be.chunk_align;
    for (int i = 0; i < S->n_running && T < S->cfg.max_batch_tokens; i++) {
        serve_rec *r = &S->recs[S->running[i]];
        if (r->state != REC_PREFILL) continue;
        int take = engine_chunk_take_block(r->n_fed, r->n_prompt - r->n_fed, S->cfg.max_batch_tokens - T, align,
                                           S->pfx.cap && !r->pfx_off ? S->pfx.block : 0);
        if (take <= 0) continue;
        memcpy(S->ids + T, r->tok + r->n_fed, sizeof(int32_t) * (size_t)take);
        T += take;
        S->row_slot[n] = r->slot;
        S->want[n] = r->n_fed + take == r->n_prompt;   // only the prompt's last chunk ends in a token
        S->row_rec[n++] = S->running[i];
        S->off[n] = T;
    }
    if (n == 0) return 0;
    // --speculative-tokens auto: the drafts of this step's decode rows (spec_ctrl), timed when
    // the step is all decode rows
    int k = -1;
    if (S->cfg.spec_auto && n_dec) {
        k = spec_ctrl_pick(&S->ctl, n_dec);
        for (int i = 0; i < n_dec; i++) {
            const serve_rec *r = &S->recs[S->row_rec[i]];
            if (r->spec) S->be.set_spec(S->be.self, r->slot, k < r->spec ? k : r->spec);
        }
    }
    moet_err e = {{0}};
    engine_step st = {n, S->row_slot, S->ids, S->off, S->want};
    engine_result res;
    S->steps++;
    double t0 = moet_now();
    int rc = S->be.launch(S->be.self, &st, &e);
    if (rc == 0) {
        // host work while the step runs: new lines become requests (admitted before the next
        // step, as when they are read after this one), cancels are marked, errors answered
        if (!S->stopping) serve_input(S, 0);
        rc = S->be.collect(S->be.self, &res, &e);
    }
    if (rc == 0 && k >= 0 && n == n_dec) {
        int emitted = 0;
        for (int i = 0; i < n; i++) emitted += res.n_tok ? res.n_tok[i] : 1;
        spec_ctrl_note(&S->ctl, n_dec, k, emitted, moet_now() - t0);
    }
    if (rc != 0) {
        // a failed step ends its own requests; a lost device every request there is (running and
        // waiting), and the server stops (serve_run exits 1)
        fprintf(stderr, "moet serve: backend step failed: %s\n", e.msg);
        for (int i = 0; i < n; i++) serve_fail(S, &S->recs[S->row_rec[i]], e.msg);
        if (rc == ENGINE_LOST) {
            S->lost = 1;
            for (int i = 0; i < S->n_recs; i++)
                if (S->recs[i].state != REC_FREE) serve_fail(S, &S->recs[i], e.msg);
        }
        return -1;
    }
    for (int i = 0; i < n; i++) {
        serve_rec *r = &S->recs[S->row_rec[i]];
        r->n_fed += S->off[i + 1] - S->off[i];
        // a prompt chunk that ended on a block boundary: its state is saved before the request
        // may finish (and its slot go) on the token it picks
        if (S->pfx.cap && !r->pfx_off && r->n_fed <= r->n_prompt && r->n_fed % S->pfx.block == 0) serve_prefix_save(S, r);
        if (!S->want[i]) continue;   // more prompt to go
        r->state = REC_DECODE;
        // with drafts: the accepted ones were fed in this step too, each followed by the token
        // picked after it; a request that finishes early leaves the rest unemitted (the sequence
        // ends with it)
        int nt = res.n_tok ? res.n_tok[i] : 1;
        if (res.n_tok) r->drafted += res.drafted[i], S->spec_drafted += (uint64_t)res.drafted[i];
        serve_sample(S, r, &res, i, 0);
        for (int j = 1; j < nt && r->state == REC_DECODE; j++) {
            r->n_fed++;
            r->accepted++, S->spec_accepted++;
            serve_sample(S, r, &res, i, j);
        }
    }
    return 0;
}

// ---- lines ---------------------------------------------------------------------------------

static void serve_error(serve_ctx *S, const char *id, int batch, uint64_t batch_no, const char *code, const char *msg) {
    S->n_errors++;
    serve_write_error(&S->out, id, batch, batch_no, code, "invalid_request_error", msg);
}

static serve_rec *serve_find(serve_ctx *S, const char *id) {
    for (int i = 0; i < S->n_recs; i++)
        if (S->recs[i].state != REC_FREE && !strcmp(S->recs[i].id, id)) return &S->recs[i];
    return NULL;
}

// The id of a request whose line gives none: "req-<line number>", or, when a request that named
// itself so is still running, "req-<line number>.<k>" with the smallest k not in use, so an
// answer or a cancel can never match two requests.
static void serve_auto_id(serve_ctx *S, char *id, size_t cap) {
    snprintf(id, cap, "req-%" PRIu64, S->lines);
    for (uint64_t k = 1; serve_find(S, id); k++) snprintf(id, cap, "req-%" PRIu64 ".%" PRIu64, S->lines, k);
}

// One complete input line (without its "\n"). Needs a free record (the caller checks).
static void serve_line(serve_ctx *S, const ln_line *l) {
    S->lines++;
    double t_read = moet_now();
    const char *line = l->s;   // without "\r" and a byte order mark (format/lines.c)
    size_t n = l->n;
    char auto_id[48];
    serve_auto_id(S, auto_id, sizeof auto_id);
    char msg[512];
    int64_t bad = l->bad_utf8;
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
        serve_write_cancelled(&S->out, q.id);
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
    r->seed = q.has_seed ? q.seed : S->cfg.seed_base + ++S->seed_count * 0x9e3779b97f4a7c15ull;
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
        for (int k = 0; k < n_ids; k++, t = js_next(&S->doc, t)) r->tok[k] = (int32_t)(t->is_int ? t->i64 : (int64_t)t->num);
    }
    r->n_prompt = r->n_tok = n_ids;
    r->slot = -1;
    r->pfx_at = -1;
    chat_split_init(&r->split, r->thinking);
    r->t_read = t_read;
    S->prompt_tokens += (uint64_t)n_ids;
    S->waiting[(S->wait_head + S->n_waiting++) % S->n_recs] = idx;
}

// Takes the next line from the reader (a line over the limit is answered here). Returns 1 with
// the line, 0 when none is complete yet.
static int serve_next_line(serve_ctx *S, ln_line *l) {
    for (;;) {
        int k = ln_take(&S->in, l);
        if (k == LN_LINE) return 1;
        if (k == LN_NONE) return 0;
        S->lines++;
        char msg[160];
        snprintf(msg, sizeof msg, "the line is longer than the limit of %u bytes; it was skipped", MOET_MAX_LINE);
        serve_error(S, NULL, 0, 0, "line_too_long", msg);
    }
}

// Reads what stdin has (waiting for it only when block) and turns complete lines into
// requests or answers while a record is free.
static void serve_input(serve_ctx *S, int block) {
    ln_line l;
    while (S->n_free_recs > 0 && serve_next_line(S, &l)) serve_line(S, &l);
    if (!S->in.eof && S->n_free_recs > 0) {
        ln_fill(&S->in, block ? -1 : 0);
        while (S->n_free_recs > 0 && serve_next_line(S, &l)) serve_line(S, &l);
    }
}

// The server: answers every line of fd_in on fd_out until EOF (then finishes what was read
// and returns 0) or signals (first: stop reading and finish; second: cancel what runs).
// Returns 1 when fd_out failed (the reader went away), or when reading fd_in failed (after
// answering every request read before the failure).
static int serve_run(serve_ctx *S, int fd_in, int fd_out) {
    S->out.fd = fd_out;
    ln_init_fd(&S->in, fd_in, S->in_buf, S->in_cap, MOET_MAX_LINE);
    S->t_start = moet_now();
    serve_ready(S);
    S->allocs_at_ready = arena_total_allocs();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    S->minflt_at_ready = ru.ru_minflt;
    S->majflt_at_ready = ru.ru_majflt;
    int cancelled_all = 0;
    for (;;) {
        if (S->out.failed) {
            fprintf(stderr, "moet serve: writing the answers to stdout failed: %s\n", strerror(S->out.err));
            return 1;
        }
        int sig = serve_signals;
        if (sig >= 1 && !S->stopping) {
            S->stopping = 1;
            if (ln_pending(&S->in)) fprintf(stderr, "moet serve: signal: %zu bytes of unread input dropped\n", ln_pending(&S->in));
            ln_drop(&S->in);
            fprintf(stderr, "moet serve: signal: finishing %d running and %d waiting requests\n", S->n_running, S->n_waiting);
        }
        if (sig >= 2 && !cancelled_all) {
            cancelled_all = 1;
            for (int i = 0; i < S->n_recs; i++)
                if (S->recs[i].state != REC_FREE && !S->recs[i].cancel) S->recs[i].cancel = 1, S->n_cancel++;
        }
        // input: lines while a record is free (with sequences running, the step reads them
        // while it computes); an idle server waits for input
        if (!S->stopping && !S->n_running) serve_input(S, !S->n_waiting);
        // cancellations
        for (int i = 0; S->n_cancel > 0 && i < S->n_recs; i++)
            if (S->recs[i].state != REC_FREE && S->recs[i].cancel) serve_finish(S, &S->recs[i], FIN_CANCELLED);
        serve_admit(S);
        if (S->n_running) {
            serve_step(S);
            if (S->lost) {
                po_flush(&S->out);
                fprintf(stderr, "moet serve: the device is lost: every running and waiting request was answered with "
                                "server_error; the %zu bytes of input not read yet are not\n", ln_pending(&S->in));
                return 1;
            }
            continue;
        }
        if (S->in.eof && !S->n_waiting && !ln_pending(&S->in)) break;
    }
    po_flush(&S->out);
    if (S->in.err) {
        fprintf(stderr, "moet serve: reading the requests failed: %s (the %" PRIu64 " lines read before were answered)\n",
                strerror(S->in.err), S->lines);
        return 1;
    }
    return S->out.failed;
}


// ==========================================================================================
// serving, 2: moet serve
// ==========================================================================================
//
// `moet serve`: flags, the model (checkpoint, tokenizer, generation config, optional plane
// file) behind the backend engine_open picks (GPU or CPU reference), then the line loop.

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

// ---- resident before the ready line ---------------------------------------------------------
//
// After the ready line the server takes no page fault of its own: a first touch in the hot path
// costs latency, and memory that grows while serving cannot be told from a leak. The arenas are
// resident from their allocation (arena_sys_alloc); serve_resident makes the rest resident
// before ready: the code, tables and static data of the program and of its libraries (a code
// path first run after ready — a cancel, an error line, a libm function — would fault its pages
// in), the weights the engine reads from the mapped checkpoint (ck_resident), the main stack
// down to MOET_SERVE_STACK below the serve loop, and a cushion at the top of the C library's
// heap for the libraries that allocate while serving. Worker stacks are carved from the engine's
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

// The C library's heap (malloc's main arena): the server allocates nothing after ready, but a
// library may; on the GPU, libcuda's calls on the serving thread grew [heap] by 48 KiB over 3,000
// requests (/proc/PID/smaps), a page fault each. MOET_HEAP_CUSHION bytes at the heap's top are
// written now and kept (the top is never trimmed below them), so those allocations land on
// resident pages. Pieces of 64 KiB stay under malloc's mmap threshold (128 KiB): from the heap.
static void serve_resident_heap(void) {
    enum { PIECE = 64 << 10, N = MOET_HEAP_CUSHION / PIECE };
    void *p[N];
    mallopt(M_TRIM_THRESHOLD, 4 * MOET_HEAP_CUSHION);
    for (int i = 0; i < N; i++)
        if ((p[i] = malloc(PIECE))) memset(p[i], 0, PIECE);
    for (int i = N - 1; i >= 0; i--) free(p[i]);
}

// Called by cmd_serve, the caller of serve_run, just before the ready line. Returns -1 with e set
// when the weights or the stack cannot be made resident; a segment that cannot is a warning
// (test_serve_e2e counts the faults after ready).
static int serve_resident(const ck_model *m /* NULL: the checkpoint's mapping is not read after boot */, moet_err *e) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 2 * (rlim_t)MOET_SERVE_STACK)
        return err_set(e, "the stack limit (ulimit -s) is %lu KiB; the server needs at least %u KiB", (unsigned long)(rl.rlim_cur >> 10),
                       2 * MOET_SERVE_STACK >> 10);
    if (m && ck_resident(m, e)) return -1;
    int failures = 0;
    dl_iterate_phdr(serve_resident_object, &failures);
    if (failures) fprintf(stderr, "moet serve: warning: %d program segments could not be made resident\n", failures);
    serve_resident_stack();
    serve_resident_heap();
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

static const char serve_usage[] =
    "usage: moet serve [options] < requests.jsonl > answers.jsonl\n"
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
    "                          share it with the decoding sequences (default 256, >= max-num-seqs;\n"
    "                          the GPU cuts prompt chunks at multiples of 64 tokens and needs\n"
    "                          >= max-num-seqs + 63)\n"
    "  --max-model-len N       context length: prompt + generated tokens per request\n"
    "                          (default: the model's, at most 4096)\n"
    "  --max-queue N           requests read ahead and waiting for a free sequence (default 64);\n"
    "                          when full, stdin is not read until one finishes\n"
    "  --max-logprobs N        largest top_logprobs a request may ask for (default 20, max 20)\n"
    "  --backend B             auto (default: the GPU when a driver and a GPU are there, else the\n"
    "                          CPU reference), gpu (an error without one) or cpu\n"
    "  --kv-dtype T            GPU KV cache: bf16 (default), fp8 (e4m3 with a scale per position\n"
    "                          and head) or f32\n"
    "  --act-dtype T           the matrix products' inputs: auto (default: bf16 on the GPU, f32\n"
    "                          with --kv-dtype f32 and on the CPU), f32 (on the GPU three bf16\n"
    "                          parts, exact) or bf16 (rounded to bf16: one tensor-core product\n"
    "                          where f32 takes three; the CPU reference rounds the same way)\n"
    "  --threads N             worker threads of the CPU reference matrix products (default 1)\n"
    "  --host-margin-gb G      on a GPU that shares the host's memory (GB10): GiB of MemAvailable\n"
    "                          the memory plan leaves the host (default 4)\n"
    "  --prefix-block N        prefix cache: the model state is kept after every N prompt tokens\n"
    "                          (default 256; on the GPU a multiple of 64), and a request whose\n"
    "                          prompt starts with kept blocks computes only the rest\n"
    "  --prefix-cache-gb G     memory for the kept blocks, planned at boot (default: room for 64\n"
    "                          blocks; the boot line says how much that is); 0 turns the cache off\n"
    "  --served-model-name S   the \"model\" of every answer (default: the model directory's name)\n"
    "  --seed N                base of the seeds of requests that give none (default: from the clock)\n"
    "  --default-thinking on|off  enable_thinking of requests that do not set it (default on, as\n"
    "                          the model's template; off for the bundled demo model, which was\n"
    "                          trained on answers without a thinking block)\n"
    "  --expert-cache-gb G     with --planes: hold at most G GiB of expert slots, reading (and\n"
    "                          hashing) a missing one when a step needs it (default: every slot,\n"
    "                          read at boot); the answers are the same bits either way. On the GPU\n"
    "                          at least one layer's experts; its steps run without decode graphs\n"
    "  --expert-prefetch on|off  with --expert-cache-gb: a reader thread reads a layer's missing\n"
    "                          experts, and those the next layer's router picks on this layer's\n"
    "                          input, while the layer computes (default: on for the CPU reference,\n"
    "                          off on the GPU, where it measured slower)\n"
    "  --io-depth N            GPU, with --expert-cache-gb: slot reads in flight (reader threads,\n"
    "                          1 to 32; default 8)\n"
    "  --mtp FILE              the multi-token-prediction head (mtp.* tensors) from this file, for a\n"
    "                          checkpoint whose shards hold none (the demo's: tests/fixtures/demo_mtp)\n"
    "  --speculative-tokens auto|0..8  drafts the MTP head proposes per decode step; an answer\n"
    "                          is the one without drafts, token for token. auto (default): with a\n"
    "                          head, 0 to 4 drafts a step, for each batch size the fastest\n"
    "                          measured (tried in turn at first, then now and then again); none\n"
    "                          without a head\n"
    "  -h, --help              this text\n";

typedef struct {
    const char *model, *planes, *name, *backend, *kv_dtype, *act_dtype, *thinking, *mtp, *spec, *prefetch;
    int no_verify, strict_revision, seqs, batch, max_len, queue, max_lp, threads, have_seed, io_depth;
    double host_margin_gb;     // GiB of MemAvailable left to the host on a GPU sharing its memory
    double expert_cache_gb;    // > 0: the CPU reference holds at most this many GiB of plane slots
    int prefix_block;          // 0: MOET_PREFIX_BLOCK, and no cache when the context is not longer
    double prefix_gb;          // < 0: room for MOET_PREFIX_BLOCKS blocks
    uint64_t seed;
} serve_flags;

static const moet_flag serve_flag_table[] = {
    FLAG_DIR("--model", serve_flags, model),
    FLAG_FILE("--planes", serve_flags, planes),
    FLAG_SWITCH("--no-verify", serve_flags, no_verify),
    FLAG_SWITCH("--strict-revision", serve_flags, strict_revision),
    FLAG_INT("--max-num-seqs", serve_flags, seqs, 1, MOET_MAX_SEQS),
    FLAG_INT("--max-batch-tokens", serve_flags, batch, 1, 1 << 20),
    FLAG_INT("--max-model-len", serve_flags, max_len, 2, INT32_MAX),
    FLAG_INT("--max-queue", serve_flags, queue, 0, MOET_MAX_QUEUE),
    FLAG_INT("--max-logprobs", serve_flags, max_lp, 0, MOET_MAX_LOGPROBS),
    FLAG_CHOICE("--backend", serve_flags, backend, "auto|gpu|cpu"),
    FLAG_CHOICE("--kv-dtype", serve_flags, kv_dtype, "bf16|fp8|f32"),
    FLAG_CHOICE("--act-dtype", serve_flags, act_dtype, "auto|f32|bf16"),
    FLAG_INT("--threads", serve_flags, threads, 1, MOET_MAX_THREADS),
    FLAG_NUM("--host-margin-gb", serve_flags, host_margin_gb, 0, 1 << 20),
    FLAG_INT("--prefix-block", serve_flags, prefix_block, 1, 1 << 20),
    FLAG_NUM("--prefix-cache-gb", serve_flags, prefix_gb, 0, 1 << 20),
    FLAG_STR("--served-model-name", serve_flags, name, MOET_MAX_ID),
    FLAG_U64("--seed", serve_flags, seed, have_seed),
    FLAG_CHOICE("--default-thinking", serve_flags, thinking, "on|off"),
    FLAG_FILE("--mtp", serve_flags, mtp),
    FLAG_NUM("--expert-cache-gb", serve_flags, expert_cache_gb, 0, 1 << 20),
    FLAG_CHOICE("--expert-prefetch", serve_flags, prefetch, "on|off"),
    FLAG_INT("--io-depth", serve_flags, io_depth, 1, MOET_GPU_CACHE_READERS),
    FLAG_CHOICE("--speculative-tokens", serve_flags, spec, "auto|0|1|2|3|4|5|6|7|8"),
};

_Static_assert(MOET_MAX_SPEC == 8, "--speculative-tokens lists 0..MOET_MAX_SPEC");

static int cmd_serve(int argc, char **argv) {
    serve_flags fl = {.backend = "auto", .kv_dtype = "bf16", .act_dtype = "auto", .seqs = 8, .batch = 256, .queue = 64, .max_lp = MOET_MAX_LOGPROBS,
                      .threads = 1, .prefix_gb = -1, .host_margin_gb = MOET_HOST_MARGIN_GB};
    int arc = moet_args("serve", serve_usage, serve_flag_table, (int)(sizeof serve_flag_table / sizeof serve_flag_table[0]), argc,
                        argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    const char *model = fl.model, *planes = fl.planes, *name = fl.name, *backend = fl.backend;
    int seqs = fl.seqs, batch = fl.batch, max_len = fl.max_len, queue = fl.queue, max_lp = fl.max_lp, threads = fl.threads;
    int have_seed = fl.have_seed, kv_dtype = GPU_KV_BF16, act_bf16 = 0;
    int thinking = fl.thinking ? !strcmp(fl.thinking, "on") : -1;   // -1: on, except for the bundled demo model
    uint64_t seed = fl.seed;
    int prefix_block = fl.prefix_block;
    double prefix_gb = fl.prefix_gb;
    pf_serve_opts popt = {fl.no_verify, fl.strict_revision, 0, 1, fl.expert_cache_gb, fl.prefetch ? strcmp(fl.prefetch, "off") != 0 : -1,
                          fl.io_depth, 0};   // progress on stderr
    MOET_ASSERT(engine_kv_dtype(fl.kv_dtype, &kv_dtype) == 0, "kv dtype %s", fl.kv_dtype);
    MOET_ASSERT(engine_act_dtype(fl.act_dtype, &act_bf16) == 0, "act dtype %s", fl.act_dtype);
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
    if (fl.expert_cache_gb > 0 && !planes)
        return moet_usage_error("serve", serve_usage, "--expert-cache-gb needs --planes FILE (the cache holds the plane file's slots)");
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
    static engine_any E;
    static serve_ctx S;
    int rc = 1, have_m = 0, have_tok = 0, have_r = 0, have_s = 0;
    char tpath[MOET_MAX_PATH], cpath[MOET_MAX_PATH];
    fprintf(stderr, "moet serve: loading %s\n", model);
    if (ck_open(&m, model, &e)) goto fail;
    have_m = 1;
    if (fl.mtp && ck_mtp_open(&m, fl.mtp, &e)) goto fail;
    // --speculative-tokens: a number needs the head; auto drafts where the backend can (below)
    int spec_auto = !fl.spec || !strcmp(fl.spec, "auto"), spec = spec_auto ? 0 : atoi(fl.spec);
    if (spec && ck_mtp_need(&m, &e)) goto fail;
    if (ck_path(tpath, sizeof tpath, model, "tokenizer.json") || ck_path(cpath, sizeof cpath, model, "tokenizer_config.json")) {
        err_set(&e, "%s: path too long", model);
        goto fail;
    }
    struct stat sb;
    if (tok_load(&st.t, tpath, stat(cpath, &sb) == 0 ? cpath : NULL, &e)) goto fail;
    have_tok = 1;
    serve_config cfg;
    memset(&cfg, 0, sizeof cfg);
    ck_gen gen;
    if (ck_gen_config(model, &st.t, &gen, &e)) goto fail;
    cfg.defaults = (samp_params){gen.temperature, gen.top_k, gen.top_p, gen.min_p, gen.presence_penalty, 0, gen.repetition_penalty};
    cfg.max_new_tokens = gen.max_new_tokens;
    cfg.n_eos = gen.n_eos;
    memcpy(cfg.eos, gen.eos, sizeof cfg.eos);
    if (max_len == 0) max_len = m.cfg.max_pos < 4096 ? m.cfg.max_pos : 4096;
    if (max_len > m.cfg.max_pos)
        fprintf(stderr, "moet serve: warning: --max-model-len %d is above the model's max_position_embeddings %d\n", max_len,
                m.cfg.max_pos);
    // the prefix cache: blocks of --prefix-block tokens (the default only where the context is
    // longer than a block), as many as --prefix-cache-gb holds
    if (prefix_block && prefix_block >= max_len) {
        err_set(&e, "--prefix-block %d must be shorter than the context of %d tokens", prefix_block, max_len);
        goto fail;
    }
    int pblock = prefix_block ? prefix_block : MOET_PREFIX_BLOCK < max_len ? MOET_PREFIX_BLOCK : 0;
    engine_opts eo = {seqs, max_len, batch, threads, kv_dtype, planes, popt, fl.host_margin_gb, 0, !spec_auto && !spec, act_bf16};
    if (engine_open_prefix(&E, backend, &m, &eo, pblock, prefix_gb, "moet serve", &e)) goto fail;
    have_r = 1;
    if (spec > E.be.max_spec) {
        err_set(&e, "--speculative-tokens %d: the %s backend %s", spec, E.is_gpu ? "GPU" : "CPU",
                E.be.max_spec ? "drafts fewer tokens per step" : "does not draft (yet)");
        goto fail;
    }
    cfg.spec = spec;
    if (spec_auto && E.be.max_spec > 0) {   // a head and a backend that drafts: measured per batch size
        cfg.spec = E.be.max_spec < SPEC_AUTO_MAX ? E.be.max_spec : SPEC_AUTO_MAX;
        cfg.spec_auto = 1;
        fprintf(stderr, "moet serve: speculative decoding: auto (0 to %d draft tokens per step, each batch size's fastest, measured)\n",
                cfg.spec);
    } else if (spec) fprintf(stderr, "moet serve: speculative decoding: %d draft tokens per step\n", spec);
    if (E.be.prefix_blocks) {
        cfg.prefix_identity = prefix_identity(&m, planes, E.is_gpu, kv_dtype, engine_act_bf16(&E), E.be.prefix_block, &e);
        size_t per = E.is_gpu ? gpu_prefix_bytes(&m.cfg, kv_dtype, E.be.prefix_block, E.g.g.o.mtp) : ref_prefix_bytes(&m.cfg, E.be.prefix_block);
        fprintf(stderr, "moet serve: prefix cache: %d blocks of %d tokens, %.2f MiB each, %.2f GiB\n", E.be.prefix_blocks,
                E.be.prefix_block, per / 1048576.0, (double)per * E.be.prefix_blocks / 1073741824.0);
    } else
        fprintf(stderr, "moet serve: prefix cache: off\n");
    char base[MOET_MAX_PATH];
    ck_model_name(model, base, sizeof base);
    cfg.max_num_seqs = seqs;
    cfg.max_batch_tokens = batch;
    cfg.max_queue = queue;
    cfg.max_logprobs = max_lp;
    cfg.model_name = name ? name : base;
    cfg.thinking = thinking;
    cfg.seed_base = have_seed ? seed : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    if (serve_init(&S, &cfg, E.be, (serve_codec){&st, serve_tok_encode, serve_tok_piece}, &e)) goto fail;
    have_s = 1;
    if (tok_scratch_init(&st.sc, &st.sc_mem, S.prompt_cap, &e)) goto fail;
    // resident before ready: the CPU backend reads the checkpoint's mapping every step; the GPU
    // backend read it once, into the device, at boot
    if (serve_resident(E.is_gpu ? NULL : &m, &e)) goto fail;
    long rss, anon;
    serve_rss(&rss, &anon);
    fprintf(stderr, "moet serve: %s (%s experts, vocab %d) ready in %.2f s on the %s: context %d, %d sequences, %d tokens per step, "
            "queue %d; memory: engine %.1f MiB, server %.1f MiB; host resident %.1f MiB (%.1f MiB anonymous)\n",
            cfg.model_name, planes ? "planes" : m.expert_format, m.cfg.vocab, moet_now() - t0, E.is_gpu ? "GPU" : "CPU", max_len,
            seqs, batch, queue, engine_mib(&E), S.mem.cap / 1048576.0, rss / 1024.0, anon / 1024.0);
    arena_freeze();   // from the ready line on, nothing is allocated
    rc = serve_run(&S, 0, 1);
    fprintf(stderr, "moet serve: done: %" PRIu64 " requests answered (%" PRIu64 " cancelled), %" PRIu64 " errors, %" PRIu64
            " prompt (%" PRIu64 " from the prefix cache) + %" PRIu64 " generated tokens in %" PRIu64 " steps, %.3f s after ready\n",
            S.n_done, S.n_cancelled, S.n_errors, S.prompt_tokens, S.cached_tokens, S.gen_tokens, S.steps, moet_now() - S.t_start);
    goto done;
fail:
    fprintf(stderr, "moet serve: %s\n", e.msg);
done:
    arena_stats.frozen = 0;   // shutting down: releasing is not allocating
    // a lost device is left as it is: its context can free nothing, and the process exits
    int lost = have_s && S.lost;
    if (have_s) serve_free(&S);
    if (have_r && !lost) engine_close(&E);
    arena_release(&st.sc_mem);
    if (have_tok) tok_free(&st.t);
    if (have_m) ck_close(&m);
    return rc;
}

// ==========================================================================================
// the commands
// ==========================================================================================

// defines: cmd_tokenize
#include "format/tokenizer_cmd.c"
// defines: cmd_build_planes, cmd_verify, cmd_info
#include "format/planes_cmd.c"
// defines: cmd_synth (a random checkpoint of any qwen3_5_moe config, full size included)
#include "format/synth.c"
// defines: eval_main, cmd_eval (perplexity of a JSONL data set; MOETREF1 reference files for
//          KL divergence and top-1 agreement between runs)
#include "format/eval.c"
// defines: cmd_bench (moet bench: prefill / decode throughput, bytes per step, achieved GB/s)
#include "gpu/bench.c"

// ---- moet run: the reference forward over token ids --------------------------------------

// Token ids from text: a JSON array, or integers separated by commas and/or whitespace (the
// flag lists' rule, moet_list_parse: an empty item is refused). Returns the count, or -1 with e
// set naming `what`. out has room for cap ids.
static int moet_parse_ids(const char *s, size_t len, int32_t *out, int cap, const char *what, moet_err *e) {
    size_t a = 0, b = len;
    while (a < b && moet_space(s[a])) a++;
    while (b > a && moet_space(s[b - 1])) b--;
    if (a < b && s[a] == '[') {
        if (s[b - 1] != ']') return err_set(e, "%s: a JSON array must end with ']'", what);
        a++, b--;
        size_t k = a;
        while (k < b && moet_space(s[k])) k++;
        if (k == b) return 0;   // []
    }
    char why[160];
    int n = moet_list_parse(s + a, b - a, 0, INT32_MAX, out, cap, why, sizeof why);
    if (n < 0) return err_set(e, "%s: %s; expected token ids (integers in 0..%d), comma separated", what, why, INT32_MAX);
    return n;
}

static int moet_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;   // ties: the lowest id
    return b;
}

static const char run_usage[] =
    "usage: moet run --model DIR (--ids LIST | --ids-file FILE) [options]\n"
    "The forward pass over token ids (the GPU or the float32 reference): prefill, then greedy decode steps.\n"
    "options:\n"
    "  --model DIR          checkpoint directory (config.json, *.safetensors, hf_quant_config.json)\n"
    "  --ids LIST           prompt token ids, comma separated\n"
    "  --ids-file FILE      prompt token ids: a JSON array, or ids separated by commas/whitespace\n"
    "  --greedy N           greedy decode steps after the prompt (default 0)\n"
    "  --out FILE           write prefill_logits [T,V], greedy_ids [N], decode_logits [N,V] (safetensors)\n"
    "                       through FILE.tmp.PID (made before the work, renamed over FILE when\n"
    "                       complete, removed on a failure or a signal); an existing FILE must be\n"
    "                       a regular file (a symbolic link, FIFO, device or directory is refused)\n"
    "  --dump-hidden        also write hidden.<i> [T,H] (embeddings, each layer's output, final norm)\n"
    "  --planes FILE        routed experts from this MOET2PF1 plane file\n"
    "  --no-verify          with --planes: skip the SHA-256 check of every slot\n"
    "  --strict-revision    with --planes: refuse a file built from another checkpoint revision\n"
    "  --backend B          auto (default: the GPU when there is one), gpu or cpu (the float32 reference)\n"
    "  --kv-dtype T         GPU KV cache: bf16 (default), fp8 or f32 (f32: the reference's own precision)\n"
    "  --act-dtype T        the matrix products' inputs: auto (default: bf16 on the GPU, f32 with\n"
    "                       --kv-dtype f32 and on the CPU), f32 or bf16 (rounded to bf16, on both\n"
    "                       backends: one tensor-core product where f32 takes three)\n"
    "  --threads N          CPU: worker threads for the matrix products (default 1)\n"
    "  --host-margin-gb G   on a GPU that shares the host's memory (GB10): GiB of MemAvailable the\n"
    "                       memory plan leaves the host (default 4)\n"
    "  --expert-cache-gb G  with --planes: hold at most G GiB of expert slots (on the GPU at least one\n"
    "                       layer's experts), reading a missing one when a step needs it (default:\n"
    "                       every slot, read at boot)\n"
    "  --expert-prefetch on|off  with --expert-cache-gb: read a layer's missing experts, and those\n"
    "                       the next layer's router picks on this layer's input, ahead (default: on\n"
    "                       for the CPU reference, off on the GPU, where it measured slower)\n"
    "  --io-depth N         GPU, with --expert-cache-gb: slot reads in flight (reader threads, 1 to\n"
    "                       32; default 8)\n"
    "  --chunk N            prefill in chunks of N tokens (default 512); rounded down to a multiple\n"
    "                       of the backend's cut alignment (the GPU's: 64 tokens; below it: refused)\n"
    "  -h, --help           this text\n";

typedef struct {
    const char *model, *ids, *ids_file, *out, *backend, *kv_dtype, *act_dtype, *planes, *prefetch;
    int greedy, dump_hidden, threads, chunk, no_verify, strict_revision, io_depth;
    double host_margin_gb, expert_cache_gb;
} run_flags;

static const moet_flag run_flag_table[] = {
    FLAG_DIR("--model", run_flags, model),
    FLAG_STR("--ids", run_flags, ids, 0),
    FLAG_FILE("--ids-file", run_flags, ids_file),
    FLAG_INT("--greedy", run_flags, greedy, 0, MOET_MAX_RUN_TOKENS),
    FLAG_PATH("--out", run_flags, out, ARG_OUT_FILE, "FILE"),
    FLAG_SWITCH("--dump-hidden", run_flags, dump_hidden),
    FLAG_CHOICE("--backend", run_flags, backend, "auto|gpu|cpu"),
    FLAG_CHOICE("--kv-dtype", run_flags, kv_dtype, "bf16|fp8|f32"),
    FLAG_CHOICE("--act-dtype", run_flags, act_dtype, "auto|f32|bf16"),
    FLAG_INT("--threads", run_flags, threads, 1, MOET_MAX_THREADS),
    FLAG_NUM("--host-margin-gb", run_flags, host_margin_gb, 0, 1 << 20),
    FLAG_INT("--chunk", run_flags, chunk, 1, INT32_MAX),
    FLAG_NUM("--expert-cache-gb", run_flags, expert_cache_gb, 0, 1 << 20),
    FLAG_CHOICE("--expert-prefetch", run_flags, prefetch, "on|off"),
    FLAG_INT("--io-depth", run_flags, io_depth, 1, MOET_GPU_CACHE_READERS),
    FLAG_FILE("--planes", run_flags, planes),
    FLAG_SWITCH("--no-verify", run_flags, no_verify),
    FLAG_SWITCH("--strict-revision", run_flags, strict_revision),
};

static int cmd_run(int argc, char **argv) {
    run_flags fl = {.backend = "auto", .kv_dtype = "bf16", .act_dtype = "auto", .threads = 1, .chunk = 512, .host_margin_gb = MOET_HOST_MARGIN_GB};
    int arc = moet_args("run", run_usage, run_flag_table, (int)(sizeof run_flag_table / sizeof run_flag_table[0]), argc, argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    if (!fl.model || (!fl.ids == !fl.ids_file))
        return moet_usage_error("run", run_usage, "need --model DIR and exactly one of --ids LIST / --ids-file FILE");
    if (fl.expert_cache_gb > 0 && !fl.planes)
        return moet_usage_error("run", run_usage, "--expert-cache-gb needs --planes FILE (the cache holds the plane file's slots)");
    const char *model = fl.model, *ids_arg = fl.ids, *ids_file = fl.ids_file, *out = fl.out, *backend = fl.backend, *planes = fl.planes;
    int greedy = fl.greedy, dump_hidden = fl.dump_hidden, threads = fl.threads, chunk = fl.chunk, kv_dtype = GPU_KV_BF16, act_bf16 = 0;
    MOET_ASSERT(engine_kv_dtype(fl.kv_dtype, &kv_dtype) == 0, "kv dtype %s", fl.kv_dtype);
    MOET_ASSERT(engine_act_dtype(fl.act_dtype, &act_bf16) == 0, "act dtype %s", fl.act_dtype);
    pf_serve_opts popt = {fl.no_verify, fl.strict_revision, 0, 1, fl.expert_cache_gb, fl.prefetch ? strcmp(fl.prefetch, "off") != 0 : -1,
                          fl.io_depth, 0};   // progress on stderr
    moet_err e = {{0}};
    static int32_t ids[MOET_MAX_RUN_TOKENS];
    int T;
    if (ids_arg) {
        char what[64 + 40];
        snprintf(what, sizeof what, "--ids %.60s%s", ids_arg, strlen(ids_arg) > 60 ? "..." : "");
        T = moet_parse_ids(ids_arg, strlen(ids_arg), ids, MOET_MAX_RUN_TOKENS, what, &e);
        if (T <= 0) {
            fprintf(stderr, "moet run: %s\n", T < 0 ? e.msg : "--ids: no token ids given");
            return 2;
        }
    } else {
        size_t len;
        char *text = arena_read_small(ids_file, 64u << 20, &len, &e);
        T = text ? moet_parse_ids(text, len, ids, MOET_MAX_RUN_TOKENS, ids_file, &e) : -1;
        if (text) arena_sys_free(text, len + 1);
        if (T <= 0) {
            fprintf(stderr, "moet run: --ids-file %s\n", T < 0 ? e.msg : "holds no token ids");
            return 1;
        }
    }
    if (T + greedy > MOET_MAX_RUN_TOKENS) {
        fprintf(stderr, "moet run: %d prompt + %d generated tokens exceed the limit of %d\n", T, greedy, MOET_MAX_RUN_TOKENS);
        return 1;
    }
    // the output file exists (as its temporary) from now on: a path that cannot be written fails
    // before the work, and a signal during the work removes it
    of_file of = {.fd = -1};
    if (out && of_begin(&of, out, &e)) {
        fprintf(stderr, "moet run: --out %s\n", e.msg);
        return 1;
    }
    static ck_model m;
    static engine_any E;   // routed experts from the plane file with --planes
    arena mem = {0};
    int rc = 1, have_m = 0, have_e = 0;
    if (ck_open(&m, model, &e)) goto fail;
    have_m = 1;
    const ck_config *c = &m.cfg;
    int V = c->vocab, H = c->hidden, L = c->n_layers;
    for (int t = 0; t < T; t++)
        if (ids[t] >= V) {
            err_set(&e, "token id %d (position %d) is outside the vocabulary of %d", ids[t], t, V);
            goto fail;
        }
    if (chunk > T) chunk = T;
    engine_opts eo = {1, T + greedy, chunk, threads, kv_dtype, planes, popt, fl.host_margin_gb, 0, 1, act_bf16};   // (run does not draft)
    if (engine_open(&E, backend, &m, &eo, "moet run", &e)) goto fail;
    have_e = 1;
    // a cut inside the prompt must lie at a multiple of the backend's chunk_align for the
    // results to be those of any other chunking (the engine was sized for `chunk` tokens a step,
    // so a chunk below one aligned block is refused rather than enlarged)
    int align = E.be.chunk_align;
    if (chunk < T && chunk % align) {
        if (chunk < align) {
            err_set(&e, "--chunk %d: this backend cuts prompts at multiples of %d tokens; use --chunk %d or a multiple of it", chunk,
                    align, align);
            rc = 2;
            goto fail;
        }
        fprintf(stderr, "moet run: --chunk %d rounded down to %d (this backend cuts prompts at multiples of %d tokens)\n", chunk,
                chunk / align * align, align);
        chunk = chunk / align * align;
    }
    // outputs: prefill logits [T, V] (only kept with --out), decode logits [N, V], hidden [L+1][T, H]
    float *prefill = NULL, *decode = NULL, *hid[MOET_MAX_LAYERS + 1] = {0};
    int32_t *gids = NULL;
    arena_plan mp = arena_plan_begin(&mem, "run outputs", ARENA_HOST, &e);
    while (arena_plan_pass(&mp)) {
        ARENA_TAKE(mp.on, prefill, (size_t)(out ? T : chunk) * V, "prefill logits");
        ARENA_TAKE(mp.on, decode, (size_t)(greedy ? greedy : 1) * V, "decode logits");
        ARENA_TAKE(mp.on, gids, greedy ? greedy : 1, "greedy ids");
        for (int i = 0; dump_hidden && i <= L; i++) ARENA_TAKE(mp.on, hid[i], (size_t)T * H, "hidden");
    }
    if (mp.failed) goto fail;
    // through the backend interface's test entry (forward_all: the logits of every token), so
    // the same command runs on any backend
    engine_backend be = E.be;
    engine_admit ad = {{0, 0, 1, 0, 0, 0, 1}, 0, 0, 0, NULL, 0, T + greedy, 0};   // greedy; KV room for everything
    int slot = 0;
    if (be.admit(be.self, slot, &ad, &e)) goto fail;
    double t0 = moet_now();
    for (int s = 0; s < T; s += chunk) {
        int n = T - s < chunk ? T - s : chunk, off[2] = {0, n};
        float *hp[MOET_MAX_LAYERS + 1];
        for (int i = 0; dump_hidden && i <= L; i++) hp[i] = hid[i] + (size_t)s * H;
        float *lp = out ? prefill + (size_t)s * V : prefill;
        if (be.forward_all(be.self, 1, &slot, ids + s, off, lp, dump_hidden ? hp : NULL, NULL, NULL, &e)) goto fail;
    }
    double t1 = moet_now();
    const float *last = prefill + (size_t)((out ? T : ((T - 1) % chunk) + 1) - 1) * V;
    int next = moet_argmax(last, V);
    for (int s = 0; s < greedy; s++) {
        int off[2] = {0, 1};
        gids[s] = next;
        if (be.forward_all(be.self, 1, &slot, &gids[s], off, decode + (size_t)s * V, NULL, NULL, NULL, &e)) goto fail;
        next = moet_argmax(decode + (size_t)s * V, V);
    }
    be.release(be.self, slot);
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
        if (st_save_into(&of, tv, nt, &e)) goto fail;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moet run: %s\n", e.msg);
done:
    of_abort(&of);   // nothing once committed
    arena_release(&mem);
    if (have_e) engine_close(&E);
    if (have_m) ck_close(&m);
    return rc;
}

// ---- main: the command table ---------------------------------------------------------------
//
// Every command declares its flags in a table (format/args.c) and writes its stdout through
// format/stdout.c; main guards the standard descriptors before it runs and checks stdout after.
// tests/test_commands.c holds the same list of commands and refuses one it does not know.

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);   // argv[1] is the command's name
    const char *what;                    // one line for `moet --help`
    const moet_flag *flags;              // its command line (moet_args)
    int n_flags;
} moet_command;

#define MOET_FLAGS(t) t, (int)(sizeof t / sizeof t[0])

static const moet_command moet_commands[] = {
    {"run", cmd_run, "forward pass of a model over token ids: logits, greedy tokens, hidden states", MOET_FLAGS(run_flag_table)},
    {"serve", cmd_serve, "JSONL requests on stdin, answers on stdout (moet serve --help)", MOET_FLAGS(serve_flag_table)},
    {"eval", cmd_eval, "perplexity of a JSONL data set, KL divergence against a reference run (moet eval --help)",
     MOET_FLAGS(eval_flag_table)},
    {"build-planes", cmd_build_planes, "requantize the routed experts of a checkpoint into a MOET2PF1 plane file",
     MOET_FLAGS(pf_build_flag_table)},
    {"verify", cmd_verify, "check a plane file: header, slot table, every slot's SHA-256 and padding", MOET_FLAGS(pf_verify_flag_table)},
    {"info", cmd_info, "print the header of a plane file as JSON", MOET_FLAGS(pf_info_flag_table)},
    {"bench", cmd_bench, "prefill and decode throughput on the GPU (or the CPU), bytes per step, GB/s", MOET_FLAGS(bench_flag_table)},
    {"synth", cmd_synth, "write a random checkpoint with the tensors a config describes", MOET_FLAGS(syn_flag_table)},
    {"tokenize", cmd_tokenize, "text lines (JSON strings) to token ids, or back with --decode", MOET_FLAGS(tok_cli_flag_table)},
};
#define MOET_N_COMMANDS ((int)(sizeof moet_commands / sizeof moet_commands[0]))

static void moet_usage(int to_stdout) {
    char line[256];
    snprintf(line, sizeof line, "usage: moet <command> [options]\ncommands:\n");
    if (to_stdout) so_puts(line); else fputs(line, stderr);
    for (int i = 0; i < MOET_N_COMMANDS; i++) {
        snprintf(line, sizeof line, "  %-13s %s\n", moet_commands[i].name, moet_commands[i].what);
        if (to_stdout) so_puts(line); else fputs(line, stderr);
    }
}

// The whole program: a command by its name, with the standard descriptors guarded and stdout
// checked at the end (a failed write is exit status 1).
static int moet_main(int argc, char **argv) {
    so_guard_fds();
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        moet_usage(argc >= 2);
        return so_finish("", argc < 2 ? 2 : 0);
    }
    for (int i = 0; i < MOET_N_COMMANDS; i++)
        if (!strcmp(argv[1], moet_commands[i].name)) return so_finish(moet_commands[i].name, moet_commands[i].run(argc, argv));
    fprintf(stderr, "moet: unknown command '%s'\n", argv[1]);
    moet_usage(0);
    return 2;
}

#ifndef MOET_TEST
int main(int argc, char **argv) { return moet_main(argc, argv); }
#endif
