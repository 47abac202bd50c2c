// tests/test_prefix.c — the prefix cache: saved blocks of a prompt's model state, restored for a
// later request, must give the same bits as computing the prompt from its first token.
//
//   backend    through engine_backend only (the CPU reference, and the GPU backend when there is
//              one; ./build.sh test-gpu requires it): a sequence restored from 1, 2 or 3 saved
//              blocks gives the logits of the same positions computed from scratch bit for bit,
//              and the same greedy tokens; also beside another sequence in the same steps, after
//              its blocks were dropped while it runs, and from a chain continued by a restored
//              sequence; a chain out of order, a dropped block, a save off a block boundary are
//              refused; every block dropped, every KV page is free again (GPU)
//   table      the scheduler's block table alone: hash collisions never give another prompt's
//              block, least recently used eviction of leaves nobody holds, deletion from the hash
//              table keeps every other entry findable
//   serve      the scheduler over the backend (serve_run): the same answers (token ids and
//              logprobs, seeded sampling with penalties) with the cache on and off, cached_tokens
//              in usage and the stats line, a small cache under pressure (evictions, never of a
//              block a running request holds), every hold released at the end, nothing
//              allocated after ready
//   moet serve the binary: --prefix-block, --prefix-cache-gb (0 turns it off), the ready, usage
//              and stats fields
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "check.h"
#include <sys/wait.h>

static char out_text[16 << 20];
#include "answers.h"

static int on_gpu_required(void) {
    const char *req = getenv("MOET_REQUIRE_GPU");
    return req && *req == '1';
}

// ---- backends with prefix blocks -------------------------------------------------------------

typedef struct {
    int is_gpu;
    ref_engine r;
    gpu_backend g;
    engine_backend be;
} pbe;

// The CPU reference or the GPU backend (f32 KV: the reference's numbers) with `blocks` prefix
// blocks of `block` tokens. Returns 0, or -1 with e set.
static int pbe_make(pbe *p, int gpu, const ck_model *m, const char *planes, int max_seqs, int max_len, int max_tokens, int block,
                    int blocks, moet_err *e) {
    memset(p, 0, sizeof *p);
    p->is_gpu = gpu;
    if (gpu) {
        gpu_opts o = {max_seqs, max_len, max_tokens, GPU_KV_F32, 0, 0, 0, 0};
        pf_serve_opts po = {0};
        if (gpu_be_init_prefix(&p->g, m, &o, block, blocks, planes, &po, e)) return -1;
        p->be = gpu_backend_of(&p->g);
        return 0;
    }
    if (ref_init(&p->r, m, max_seqs, max_len, max_tokens, 1, e)) return -1;
    if (ref_prefix_init(&p->r, block, blocks, e)) {
        ref_free(&p->r);
        return -1;
    }
    p->be = ref_backend(&p->r);
    return 0;
}

static void pbe_free(pbe *p) {
    if (p->is_gpu) gpu_be_free(&p->g);
    else ref_free(&p->r);
}

// Every block dropped and every sequence released: no KV page is held (GPU), no block kept.
static void pbe_check_empty(pbe *p, const char *tag) {
    int kept = 0, held = 0;
    if (p->is_gpu) {
        const gpu_engine *g = &p->g.g;
        for (int b = 0; b < g->pfx_blocks; b++) kept += g->pfx_end[b] != 0;
        for (size_t i = 0; i < g->n_pages; i++) held += g->page_ref[i] != 0;
        CHECK(g->n_free == g->n_pages, "%s: %zu of %zu KV pages free at the end", tag, g->n_free, g->n_pages);
    } else
        for (int b = 0; b < p->r.pfx_blocks; b++) kept += p->r.pfx_end[b] != 0;
    CHECK(kept == 0 && held == 0, "%s: %d blocks kept, %d KV pages held at the end", tag, kept, held);
}

// ---- the backend's promise -------------------------------------------------------------------

static const char *bname;

static engine_admit greedy_admit(const int32_t *prompt, int n_prompt, int reserve) {
    engine_admit a = {{0, 0, 1, 0, 0, 0, 1}, 0, 0, 0, prompt, n_prompt, reserve, 0};
    return a;
}

// forward_all of ids[0 .. T) into slot in pieces of `piece` tokens, logits [T, V]. 0 or -1.
static int feed_all(engine_backend *be, int slot, const int32_t *ids, int T, int piece, float *logits) {
    moet_err e = {{0}};
    for (int s = 0; s < T; s += piece) {
        int n = T - s < piece ? T - s : piece, off[2] = {0, n};
        if (be->forward_all(be->self, 1, &slot, ids + s, off, logits + (size_t)s * be->n_vocab, NULL, NULL, NULL, &e)) {
            CHECK(0, "%s: forward_all: %s", bname, e.msg);
            return -1;
        }
    }
    return 0;
}

// One launch/collect step of one row; its picked token (or -1).
static int32_t step1(engine_backend *be, int slot, const int32_t *ids, int n, int want) {
    moet_err e = {{0}};
    int off[2] = {0, n};
    uint8_t w = (uint8_t)want;
    engine_step st = {1, &slot, ids, off, &w};
    engine_result res;
    if (be->launch(be->self, &st, &e) || be->collect(be->self, &res, &e)) {
        CHECK(0, "%s: step: %s", bname, e.msg);
        return -2;
    }
    return want ? res.token[0] : -1;
}

// The rest of the prompt from position `from` (a multiple of N) in chunks of N through
// launch/collect, then G greedy tokens into out; saves block ids save_ids[k] after the chunk that
// ends at (k + 1) · N when save_ids is given.
static int greedy_run(engine_backend *be, int slot, const int32_t *ids, int T, int from, int N, const int *save_ids, int G,
                      int32_t *out) {
    moet_err e = {{0}};
    int fed = from;
    while (fed < T) {
        int n = T - fed < N ? T - fed : N;
        int32_t t = step1(be, slot, ids + fed, n, fed + n == T);
        if (t == -2) return -1;
        fed += n;
        if (save_ids && fed % N == 0 && fed < T && be->save(be->self, slot, save_ids[fed / N - 1], &e)) {
            CHECK(0, "%s: save after %d tokens: %s", bname, fed, e.msg);
            return -1;
        }
        if (fed == T) out[0] = t;
    }
    for (int k = 1; k < G; k++)
        if ((out[k] = step1(be, slot, &out[k - 1], 1, 1)) < 0) return -1;
    return 0;
}

// The promise on a prompt of T = 3N + 37 tokens with blocks of N (see the file's head).
static void check_backend(pbe *p, const int32_t *ids, int T, int N) {
    engine_backend *be = &p->be;
    int V = be->n_vocab, G = 8;
    moet_err e = {{0}};
    float *scratch = malloc(sizeof(float) * (size_t)T * V), *got = malloc(sizeof(float) * (size_t)T * V);
    float *junk = malloc(sizeof(float) * (size_t)2 * T * V);
    int32_t tokA[8], tokS[8], tokR[8], rev[512];
    MOET_ASSERT(T <= 512 && scratch && got && junk, "sizes");
    for (int t = 0; t < T; t++) rev[t] = ids[T - 1 - t];
    CHECK(be->prefix_block == N && be->admit_from && be->save && be->drop, "%s: prefix blocks of %d tokens", bname, be->prefix_block);
    // scratch: the whole prompt in one row, and greedy tokens from the prompt in one chunk
    engine_admit ad = greedy_admit(ids, T, T + G);
    if (be->admit(be->self, 1, &ad, &e) || feed_all(be, 1, ids, T, T, scratch)) { CHECK(0, "%s: %s", bname, e.msg); goto out; }
    be->release(be->self, 1);
    if (be->admit(be->self, 3, &ad, &e) || greedy_run(be, 3, ids, T, 0, T, NULL, G, tokS)) { CHECK(0, "%s: %s", bname, e.msg); goto out; }
    be->release(be->self, 3);
    // A: in chunks of N, blocks 0, 1, 2 saved at N, 2N, 3N
    int save012[3] = {0, 1, 2};
    if (be->admit(be->self, 0, &ad, &e) || greedy_run(be, 0, ids, T, 0, N, save012, G, tokA)) { CHECK(0, "%s: %s", bname, e.msg); goto out; }
    be->release(be->self, 0);
    CHECK(!memcmp(tokA, tokS, sizeof tokA), "%s: greedy tokens in chunks of %d differ from one chunk's", bname, N);
    // restored from 1, 2, 3 blocks: the rest's logits are the scratch rows bit for bit
    int32_t chain[3] = {0, 1, 2};
    for (int j = 1; j <= 3; j++) {
        int ok = be->admit_from(be->self, 2, &ad, chain, j, &e) == 0;
        CHECK(ok, "%s: admit from %d blocks: %s", bname, j, e.msg);
        if (!ok) continue;
        ok = feed_all(be, 2, ids + j * N, T - j * N, T, got) == 0;
        be->release(be->self, 2);
        CHECK(ok && !memcmp(got, scratch + (size_t)j * N * V, sizeof(float) * (size_t)(T - j * N) * V),
              "%s: logits after %d restored blocks differ from the prompt computed from its first token", bname, j);
    }
    // restored greedy through launch/collect, in another slot
    if (be->admit_from(be->self, 1, &ad, chain, 3, &e) == 0) {
        int ok = greedy_run(be, 1, ids, T, 3 * N, N, NULL, G, tokR) == 0;
        be->release(be->self, 1);
        CHECK(ok && !memcmp(tokR, tokA, sizeof tokA), "%s: greedy tokens after 3 restored blocks differ", bname);
    } else CHECK(0, "%s: %s", bname, e.msg);
    // restored (2 blocks, slot 2) beside a fresh sequence (slot 0, the reversed prompt) in the same steps
    {
        engine_admit adr = greedy_admit(rev, T, T + G);
        int ok = be->admit(be->self, 0, &adr, &e) == 0 && be->admit_from(be->self, 2, &ad, chain, 2, &e) == 0;
        CHECK(ok, "%s: %s", bname, e.msg);
        int fed0 = 0, fed2 = 2 * N;
        int32_t buf[1024];
        while (ok && fed2 < T) {
            int n0 = N, n2 = T - fed2 < N ? T - fed2 : N, slots[2] = {0, 2}, off[3] = {0, n0, n0 + n2};
            memcpy(buf, rev + fed0, sizeof(int32_t) * (size_t)n0);
            memcpy(buf + n0, ids + fed2, sizeof(int32_t) * (size_t)n2);
            ok = be->forward_all(be->self, 2, slots, buf, off, junk, NULL, NULL, NULL, &e) == 0;
            CHECK(ok, "%s: batched step: %s", bname, e.msg);
            if (ok) memcpy(got + (size_t)fed2 * V, junk + (size_t)n0 * V, sizeof(float) * (size_t)n2 * V);
            fed0 += n0, fed2 += n2;
        }
        be->release(be->self, 0);
        be->release(be->self, 2);
        CHECK(ok && !memcmp(got + (size_t)2 * N * V, scratch + (size_t)2 * N * V, sizeof(float) * (size_t)(T - 2 * N) * V),
              "%s: a restored sequence beside another in the same steps gives other logits", bname);
    }
    // a chain continued by a restored sequence: from block 0, computed to 2N, saved as block 5;
    // then [0, 5] restored
    if (be->admit_from(be->self, 3, &ad, chain, 1, &e) == 0) {
        int ok = feed_all(be, 3, ids + N, N, N, got) == 0 && be->save(be->self, 3, 5, &e) == 0;
        CHECK(ok, "%s: save from a restored sequence: %s", bname, e.msg);
        be->release(be->self, 3);
        int32_t c05[2] = {0, 5};
        ok = ok && be->admit_from(be->self, 1, &ad, c05, 2, &e) == 0;
        ok = ok && feed_all(be, 1, ids + 2 * N, T - 2 * N, T, got) == 0;
        be->release(be->self, 1);
        CHECK(ok && !memcmp(got, scratch + (size_t)2 * N * V, sizeof(float) * (size_t)(T - 2 * N) * V),
              "%s: a chain continued from a restored sequence gives other logits", bname);
    } else CHECK(0, "%s: %s", bname, e.msg);
    // blocks dropped while a sequence restored from them runs: it goes on unchanged
    if (be->admit_from(be->self, 2, &ad, chain, 3, &e) == 0) {
        be->drop(be->self, 2);
        be->drop(be->self, 1);
        int ok = feed_all(be, 2, ids + 3 * N, T - 3 * N, T, got) == 0;
        be->release(be->self, 2);
        CHECK(ok && !memcmp(got, scratch + (size_t)3 * N * V, sizeof(float) * (size_t)(T - 3 * N) * V),
              "%s: dropping the blocks a running sequence started from changed it", bname);
    } else CHECK(0, "%s: %s", bname, e.msg);
    // refusals, each changing nothing: a dropped block, a chain out of order, a chain that leaves
    // nothing of the reserve, a save off a boundary, onto a kept block, out of range
    e.msg[0] = 0;
    CHECK(be->admit_from(be->self, 2, &ad, chain, 3, &e) == -1 && e.msg[0], "%s: admission from a dropped block is refused", bname);
    int32_t bad[2] = {5, 0};
    e.msg[0] = 0;
    CHECK(be->admit_from(be->self, 2, &ad, bad, 2, &e) == -1 && e.msg[0], "%s: a chain out of order is refused", bname);
    engine_admit small = greedy_admit(ids, N, N);
    e.msg[0] = 0;
    CHECK(be->admit_from(be->self, 2, &small, chain, 1, &e) == -1 && e.msg[0], "%s: a chain that fills the reserve is refused", bname);
    if (be->admit(be->self, 2, &ad, &e) == 0) {
        int ok = feed_all(be, 2, ids, N / 2, N, got) == 0;
        e.msg[0] = 0;
        CHECK(ok && be->save(be->self, 2, 3, &e) == -1 && e.msg[0], "%s: a save off a block boundary is refused", bname);
        ok = feed_all(be, 2, ids + N / 2, N / 2, N, got) == 0;
        CHECK(ok && be->save(be->self, 2, 0, &e) == -1, "%s: a save onto a kept block is refused", bname);
        CHECK(be->save(be->self, 2, be->prefix_blocks, &e) == -1, "%s: a save out of range is refused", bname);
        CHECK(be->save(be->self, 2, 3, &e) == 0, "%s: save: %s", bname, e.msg);
        be->release(be->self, 2);
        be->drop(be->self, 3);
    } else CHECK(0, "%s: %s", bname, e.msg);
    CHECK(be->save(be->self, 2, 3, &e) == -1, "%s: a save from a free slot is refused", bname);
    be->drop(be->self, 0);
    be->drop(be->self, 5);
    pbe_check_empty(p, bname);
out:
    free(scratch);
    free(got);
    free(junk);
}

// The tiny model's prompt of 3 blocks of 64 and a tail (the GPU's alignment), and the demo's.
static void backend_checks(int gpu, const char *model, const char *planes) {
    moet_err e = {{0}};
    ck_model m;
    pf_attached pa = {0};
    pf_serve_opts po = {0};
    if (ck_open(&m, model, &e)) { CHECK(0, "%s", e.msg); return; }
    // the CPU serves the experts from the planes through the model; the GPU loads them into its pool
    // (and its comparison with the reference uses the attached ones)
    if (planes && pf_attach_planes(&m, planes, &po, &pa, &e)) { CHECK(0, "%s", e.msg); ck_close(&m); return; }
    int N = 64, T = 3 * N + 37, V = m.cfg.vocab;
    int32_t ids[512];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(((int64_t)t * 7919 + 13 + t * t) % V);
    char tag[256];
    snprintf(tag, sizeof tag, "%s %s%s", gpu ? "gpu" : "cpu", model, planes ? " + planes" : "");
    bname = tag;
    pbe p;
    if (pbe_make(&p, gpu, &m, planes, 4, T + 16, 2 * T, N, 8, &e)) CHECK(0, "%s: %s", tag, e.msg);
    else {
        CHECK(p.be.prefix_blocks == 8, "%s: 8 blocks planned, %d", tag, p.be.prefix_blocks);
        check_backend(&p, ids, T, N);
        if (gpu) {   // and the GPU computes what the reference does (its pages and state as before)
            pbe c;
            float *a = malloc(sizeof(float) * (size_t)T * V), *b = malloc(sizeof(float) * (size_t)T * V);
            engine_admit ad = greedy_admit(ids, T, T);
            int ok = pbe_make(&c, 0, &m, NULL, 1, T, T, N, 0, &e) == 0;
            ok = ok && p.be.admit(p.be.self, 0, &ad, &e) == 0 && c.be.admit(c.be.self, 0, &ad, &e) == 0;
            ok = ok && feed_all(&p.be, 0, ids, T, T, a) == 0 && feed_all(&c.be, 0, ids, T, T, b) == 0;
            double err = ok ? check_nerr(a, b, (size_t)T * V) : INFINITY;
            // f32 KV on both: the kernels' summation orders against the reference's, as test_gpu's
            // GPU_TOL_REF_F32: measured 4.3e-6 – 8.7e-6 on an H200 (tiny bf16 / nvfp4, demo + planes) → 3e-5
            CHECK(err < 3e-5, "%s: logits against the CPU reference: normalised error %.3g (%s)", tag, err, e.msg);
            printf("%s: %.2g normalised error against the CPU reference (f32 KV)\n", tag, err);
            p.be.release(p.be.self, 0);
            if (c.be.self) pbe_free(&c);
            free(a), free(b);
        }
        pbe_free(&p);
    }
    pf_detach(&pa);
    ck_close(&m);
}

// ---- the block table alone -------------------------------------------------------------------

static int dropped[64], n_dropped;
static void fake_drop(void *self, int block) {
    (void)self;
    dropped[n_dropped++] = block;
}

static void test_table(void) {
    prefix_table T;
    memset(&T, 0, sizeof T);
    T.block = 4;
    T.cap = 6;
    T.seed = 77;
    arena mem;
    moet_err e = {{0}};
    arena_plan p = arena_plan_begin(&mem, "table test", ARENA_HOST, &e);
    while (arena_plan_pass(&p)) prefix_carve(&T, p.on);
    MOET_ASSERT(!p.failed, "%s", e.msg);
    prefix_init(&T);
    engine_backend be;
    memset(&be, 0, sizeof be);
    be.drop = fake_drop;
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, b[12] = {1, 2, 3, 4, 5, 6, 7, 9, 9, 10, 11, 12};
    int32_t chain[3];
    uint64_t h;
    CHECK(prefix_match(&T, a, 3, chain, &h) == 0 && h == T.seed, "an empty table matches nothing");
    // a's chain of 3 blocks
    int parent = -1;
    uint64_t hh = T.seed;
    for (int k = 0; k < 3; k++) {
        int x = prefix_take(&T, &be);
        hh = prefix_hash(hh, a + 4 * k, 4);
        prefix_link(&T, x, parent, k + 1, hh, a + 4 * k);
        parent = x;
    }
    CHECK(prefix_match(&T, a, 3, chain, &h) == 3 && h == hh, "a's three blocks are found");
    CHECK(prefix_match(&T, b, 3, chain, &h) == 1, "b shares only the first block with a");
    CHECK(prefix_match(&T, a, 2, chain, &h) == 2, "a lookup stops at its limit");
    // a colliding hash: a block with b's second tokens linked under a's first block with the hash
    // of a's second: found only with its own tokens
    int x = prefix_take(&T, &be);
    uint64_t h1 = prefix_hash(T.seed, a, 4), h2 = prefix_hash(h1, a + 4, 4);
    prefix_link(&T, x, chain[0], 2, h2, b + 4);
    CHECK(prefix_match(&T, b, 3, chain, &h) == 1, "a block with the same hash but other tokens is not taken");
    CHECK(prefix_find(&T, 0, h2, b + 4) == x && prefix_find(&T, 0, h2, a + 4) == 1, "both blocks of one hash are found by their tokens");
    // eviction: leaves nobody holds, least recently used first; never a held block nor a parent
    prefix_hold(&T, 2);   // a's last block
    n_dropped = 0;
    CHECK(prefix_evict(&T, &be) == 1 && n_dropped == 1 && dropped[0] == x, "the only free leaf (the colliding block) goes");
    CHECK(prefix_evict(&T, &be) == 0 && n_dropped == 1, "a held leaf and its parents stay");
    CHECK(prefix_match(&T, a, 3, chain, &h) == 3, "a's chain is whole after evictions");
    prefix_unhold(&T, 2);
    CHECK(prefix_evict(&T, &be) == 1 && dropped[1] == 2, "released, a's last block goes");
    CHECK(prefix_evict(&T, &be) == 1 && dropped[2] == 1 && prefix_evict(&T, &be) == 1 && dropped[3] == 0, "then its parents, leaf first");
    CHECK(T.n_live == 0 && T.n_free == T.cap, "the table is empty");
    // LRU among leaves: three one-block chains used in the order c, a, b: c goes first after a
    // lookup of a and b
    int32_t c[4] = {40, 41, 42, 43};
    const int32_t *firsts[3] = {a, b + 4, c};
    int ent[3];
    for (int k = 0; k < 3; k++) {
        ent[k] = prefix_take(&T, &be);
        prefix_link(&T, ent[k], -1, 1, prefix_hash(T.seed, firsts[k], 4), firsts[k]);
    }
    int32_t q[4];
    memcpy(q, b + 4, sizeof q);
    prefix_match(&T, c, 1, chain, &h);
    prefix_match(&T, a, 1, chain, &h);
    prefix_match(&T, q, 1, chain, &h);
    n_dropped = 0;
    CHECK(prefix_evict(&T, &be) == 1 && dropped[0] == ent[2], "the least recently used leaf goes first");
    // deletion keeps every other entry findable: fill, delete in another order, look up each time
    while (prefix_evict(&T, &be)) {}
    int32_t blk[6][4];
    int id[6];
    for (int k = 0; k < 6; k++) {
        for (int i = 0; i < 4; i++) blk[k][i] = 100 + 10 * k + i;
        id[k] = prefix_take(&T, &be);
        prefix_link(&T, id[k], -1, 1, (uint64_t)(k % 2) + 1, blk[k]);   // two interleaved probe runs in a table of 16
    }
    CHECK(prefix_take(&T, &be) >= 0 && n_dropped > 0, "a full table evicts for a new block");
    int lost = 0;
    for (int k = 0; k < 6; k++)
        if (T.ent[id[k]].live) lost += prefix_find(&T, -1, (uint64_t)(k % 2) + 1, blk[k]) != id[k];
    CHECK(lost == 0, "%d entries lost after a deletion from a probe run", lost);
    arena_release(&mem);
}

// ---- the scheduler over a backend -------------------------------------------------------------

static int codec_encode(void *self, const char *text, size_t n, int32_t *ids, int cap, int *n_ids, moet_err *e) {
    (void)self, (void)text, (void)n, (void)ids, (void)cap, (void)n_ids;
    return err_set(e, "this test sends token ids only");
}
static void codec_piece(void *self, int32_t id, int skip_special, const char **s, size_t *n) {
    (void)self, (void)skip_special;
    static const char hex[] = "0123456789abcdef";
    *s = hex + (id & 15);   // one byte of text per token
    *n = 1;
}

static serve_ctx *live;        // the server running now, for the drop check
static engine_backend inner;   // the backend under it
static long bad_drops, drops;

// A block the table evicts is held by no request and has no cached children; the running
// requests' chains do not contain it.
static void checked_drop(void *self, int block) {
    (void)self;
    drops++;
    const prefix_table *T = &live->pfx;
    bad_drops += T->ent[block].users != 0 || T->ent[block].children != 0;
    for (int i = 0; i < live->n_running; i++)
        for (int x = live->recs[live->running[i]].pfx_at; x >= 0; x = T->ent[x].parent) bad_drops += x == block;
    inner.drop(inner.self, block);
}

static char input[4 << 20];

// Runs the server over `in` on backend be; out_text gets the answers; *S is kept for the counters.
static int run_server(engine_backend be, const char *in, int seqs, int batch, serve_ctx *S) {
    inner = be;
    if (be.drop) be.drop = checked_drop;
    serve_config cfg = {seqs, batch, 256, 5, "test", {1.0f, 0, 1.0f, 0, 0, 0, 1.0f}, 0, {0}, 7, 0, 0, 12345, 0, 0};
    moet_err e = {{0}};
    if (serve_init(S, &cfg, be, (serve_codec){NULL, codec_encode, codec_piece}, &e)) {
        CHECK(0, "serve_init: %s", e.msg);
        return -1;
    }
    live = S;
    char in_path[] = "/tmp/moet_prefix_in_XXXXXX", out_path[] = "/tmp/moet_prefix_out_XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path);
    MOET_ASSERT(fi >= 0 && fo >= 0, "temp files");
    size_t len = strlen(in);
    MOET_ASSERT(write(fi, in, len) == (ssize_t)len, "write");
    lseek(fi, 0, SEEK_SET);
    uint64_t allocs = arena_total_allocs();
    arena_freeze();
    int rc = serve_run(S, fi, fo);
    arena_stats.frozen = 0;
    CHECK(arena_total_allocs() == allocs, "the server allocated %" PRIu64 " times after ready", arena_total_allocs() - allocs);
    lseek(fo, 0, SEEK_SET);
    ssize_t got = read(fo, out_text, sizeof out_text - 1);
    out_text[got > 0 ? got : 0] = 0;
    close(fi), close(fo);
    unlink(in_path), unlink(out_path);
    return rc;
}

// The requests: prefixes of P tokens shared by groups of requests with distinct questions, some
// seeded and sampled with penalties and logprobs, one a prompt that is exactly a cached prefix,
// one extending another's whole prompt (a next turn); a stats line at the end.
static void make_requests(int V, int P, int n_groups, int per_group, int Q) {
    size_t at = 0;
    uint64_t x = 99;
    int32_t pre[8][2048];
    MOET_ASSERT(n_groups <= 8 && P <= 2048, "sizes");
    for (int g = 0; g < n_groups; g++)
        for (int i = 0; i < P; i++) pre[g][i] = (int32_t)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % V;
    for (int k = 0; k < n_groups * per_group; k++) {
        int g = k % n_groups;   // groups interleaved: the cache sees its prefixes come and go
        at += (size_t)snprintf(input + at, sizeof input - at, "{\"id\":\"q%d\",\"input_ids\":[", k);
        for (int i = 0; i < P; i++) at += (size_t)snprintf(input + at, sizeof input - at, i ? ",%d" : "%d", pre[g][i]);
        for (int i = 0; i < Q + k % 5; i++) at += (size_t)snprintf(input + at, sizeof input - at, ",%d", (k * 31 + i * 7) % V);
        at += (size_t)snprintf(input + at, sizeof input - at, "],\"max_tokens\":6,\"return_token_ids\":true,\"ignore_eos\":true%s}\n",
                               k % 3 == 0 ? ",\"temperature\":0" :
                               k % 3 == 1 ? ",\"temperature\":0.9,\"seed\":5,\"presence_penalty\":0.5,\"repetition_penalty\":1.3,"
                                            "\"logprobs\":true,\"top_logprobs\":3" : ",\"seed\":11,\"top_k\":20");
    }
    // exactly the first group's prefix, and the first request's prompt and more
    at += (size_t)snprintf(input + at, sizeof input - at, "{\"id\":\"exact\",\"input_ids\":[");
    for (int i = 0; i < P; i++) at += (size_t)snprintf(input + at, sizeof input - at, i ? ",%d" : "%d", pre[0][i]);
    at += (size_t)snprintf(input + at, sizeof input - at, "],\"max_tokens\":4,\"temperature\":0,\"return_token_ids\":true}\n");
    at += (size_t)snprintf(input + at, sizeof input - at, "{\"id\":\"turn\",\"input_ids\":[");
    for (int i = 0; i < P; i++) at += (size_t)snprintf(input + at, sizeof input - at, i ? ",%d" : "%d", pre[0][i]);
    for (int i = 0; i < Q + 40; i++) at += (size_t)snprintf(input + at, sizeof input - at, ",%d", (i * 7) % V);
    at += (size_t)snprintf(input + at, sizeof input - at, "],\"max_tokens\":4,\"temperature\":0,\"return_token_ids\":true}\n");
    input[at] = 0;
}

// The "choices" of each answer (token ids, logprobs, text, finish_reason), in id order.
typedef struct {
    char id[16];
    char *choices;
    int cached, prompt;
} answer;
static answer ans_off[64], ans_on[64];

static int collect_answers(answer *out) {
    parse_answers();
    int n = 0;
    for (int i = 0; i < n_ans && n < 64; i++) {
        const js_node *id = path(i, "id", 0, 0, 0);
        if (!id || id->type != JS_STR || !path(i, "choices", 0, 0, 0)) continue;
        snprintf(out[n].id, sizeof out[n].id, "%s", id->str);
        const char *c = strstr(ans_line[i], "\"choices\":"), *u = strstr(ans_line[i], ",\"usage\":");
        out[n].choices = c && u && u > c ? strndup(c, (size_t)(u - c)) : strdup("");
        const js_node *ct = path(i, "usage", "prompt_tokens_details", "cached_tokens", 0), *pt = path(i, "usage", "prompt_tokens", 0, 0);
        out[n].cached = ct ? (int)ct->i64 : -1;
        out[n].prompt = pt ? (int)pt->i64 : -1;
        n++;
    }
    return n;
}

static const answer *answer_of(const answer *a, int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (!strcmp(a[i].id, id)) return &a[i];
    return NULL;
}

// On one model and backend: the requests with the cache off, then on with room for all blocks,
// then on with a few blocks (pressure): the same answers each time.
static void serve_checks(int gpu, const char *model) {
    moet_err e = {{0}};
    ck_model m;
    if (ck_open(&m, model, &e)) { CHECK(0, "%s", e.msg); return; }
    int N = gpu ? 64 : 16, P = gpu ? 2 * N + 40 : 3 * N + 5, Q = gpu ? 30 : 9, groups = 3, per = 4, seqs = 3;
    int batch = gpu ? 3 * 64 + 2 : 40, max_len = P + Q + 64;
    make_requests(m.cfg.vocab, P, groups, per, Q);
    int n_req = groups * per + 2;
    char tag[160];
    static serve_ctx S;
    // off
    pbe p;
    int n_off = 0, n_on = 0;
    snprintf(tag, sizeof tag, "serve %s %s", gpu ? "gpu" : "cpu", model);
    if (pbe_make(&p, gpu, &m, NULL, seqs, max_len, batch, N, 0, &e)) { CHECK(0, "%s: %s", tag, e.msg); goto out; }
    CHECK(p.be.prefix_blocks == 0 && !p.be.save, "%s: no blocks: the cache is off", tag);
    CHECK(run_server(p.be, input, seqs, batch, &S) == 0, "%s: off: serve_run", tag);
    n_off = collect_answers(ans_off);
    CHECK(n_off == n_req && S.cached_tokens == 0, "%s: off: %d answers, %" PRIu64 " cached tokens", tag, n_off, S.cached_tokens);
    serve_free(&S);
    pbe_free(&p);
    for (int pass = 0; pass < 2; pass++) {   // room for every block; then 4 blocks (a prefix needs 3 to 4)
        int blocks = pass ? 4 : 64;
        if (pbe_make(&p, gpu, &m, NULL, seqs, max_len, batch, N, blocks, &e)) { CHECK(0, "%s: %s", tag, e.msg); goto out; }
        bad_drops = drops = 0;
        CHECK(run_server(p.be, input, seqs, batch, &S) == 0, "%s: on: serve_run", tag);
        n_on = collect_answers(ans_on);
        CHECK(n_on == n_req, "%s, %d blocks: %d answers of %d", tag, blocks, n_on, n_req);
        int differ = 0, hits = 0;
        uint64_t cached = 0;
        for (int i = 0; i < n_on; i++) {
            const answer *o = answer_of(ans_off, n_off, ans_on[i].id);
            if (!o || strcmp(o->choices, ans_on[i].choices)) {
                differ++;
                fprintf(stderr, "%s: %s: with the cache %s\n   without %s\n", tag, ans_on[i].id, ans_on[i].choices, o ? o->choices : "-");
            }
            CHECK(ans_on[i].cached >= 0 && ans_on[i].cached % N == 0 && ans_on[i].cached < ans_on[i].prompt,
                  "%s: %s: %d cached of %d prompt tokens", tag, ans_on[i].id, ans_on[i].cached, ans_on[i].prompt);
            hits += ans_on[i].cached > 0;
            cached += (uint64_t)ans_on[i].cached;
        }
        CHECK(differ == 0, "%s, %d blocks: %d answers differ from the ones computed without the cache", tag, blocks, differ);
        CHECK(cached == S.cached_tokens && S.pfx.hits == (uint64_t)hits, "%s: usage's cached tokens add up to the counter", tag);
        const answer *ex = answer_of(ans_on, n_on, "exact"), *turn = answer_of(ans_on, n_on, "turn");
        if (!pass) {
            CHECK(hits >= n_req - groups - 1, "%s: %d of %d requests started from cached blocks", tag, hits, n_req);
            CHECK(ex && ex->cached == (P - 1) / N * N, "%s: a prompt that is a cached prefix keeps one token to compute: %d", tag,
                  ex ? ex->cached : -1);
            CHECK(turn && turn->cached >= P / N * N, "%s: a next turn starts from the blocks of the one before: %d", tag,
                  turn ? turn->cached : -1);
        } else
            CHECK(S.pfx.evictions > 0 && drops == (long)S.pfx.evictions, "%s, %d blocks: %" PRIu64 " evictions", tag, blocks, S.pfx.evictions);
        CHECK(bad_drops == 0, "%s: %ld evictions of a block in use", tag, bad_drops);
        printf("%s, %d blocks of %d: %d requests, %d from cached blocks (%" PRIu64 " tokens), %" PRIu64 " saves, %" PRIu64
               " evictions, the same answers as without the cache\n", tag, blocks, N, n_on, hits, S.cached_tokens, S.pfx.saves,
               S.pfx.evictions);
        // every hold released; the table's counts consistent with its entries
        int children = 0, live_n = 0, kids[64] = {0};
        for (int x = 0; x < S.pfx.cap; x++)
            if (S.pfx.ent[x].live) {
                live_n++;
                children += S.pfx.ent[x].children;
                if (S.pfx.ent[x].parent >= 0) kids[S.pfx.ent[x].parent]++;
            }
        int kids_ok = 1;
        for (int x = 0; x < S.pfx.cap; x++) kids_ok &= !S.pfx.ent[x].live || kids[x] == S.pfx.ent[x].children;
        CHECK(prefix_held(&S.pfx) == 0, "%s: %d blocks still held after every request ended", tag, prefix_held(&S.pfx));
        CHECK(live_n == S.pfx.n_live && S.pfx.n_live + S.pfx.n_free == S.pfx.cap && kids_ok, "%s: table counts", tag);
        // drop every block the table kept: the backend ends empty
        for (int x = 0; x < S.pfx.cap; x++)
            if (S.pfx.ent[x].live) p.be.drop(p.be.self, x);
        pbe_check_empty(&p, tag);
        serve_free(&S);
        pbe_free(&p);
        for (int i = 0; i < n_on; i++) free(ans_on[i].choices);
    }
out:
    for (int i = 0; i < n_off; i++) free(ans_off[i].choices);
    ck_close(&m);
}

// ---- moet serve ------------------------------------------------------------------------------

static int run_moet(const char *in, const char *const *args, char *err, size_t err_cap) {
    char in_path[] = "/tmp/moet_pfx_in_XXXXXX", out_path[] = "/tmp/moet_pfx_out_XXXXXX", err_path[] = "/tmp/moet_pfx_err_XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path), fe = mkstemp(err_path);
    MOET_ASSERT(fi >= 0 && fo >= 0 && fe >= 0, "temp files");
    size_t len = strlen(in);
    MOET_ASSERT(write(fi, in, len) == (ssize_t)len, "write input");
    lseek(fi, 0, SEEK_SET);
    const char *argv[32] = {"./moet", "serve"};
    int n = 2;
    const char *backend = getenv("MOET_E2E_BACKEND");
    if (backend) argv[n++] = "--backend", argv[n++] = backend;
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    MOET_ASSERT(pid >= 0, "fork");
    if (pid == 0) {
        dup2(fi, 0), dup2(fo, 1), dup2(fe, 2);
        execv("./moet", (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    lseek(fo, 0, SEEK_SET);
    ssize_t got = read(fo, out_text, sizeof out_text - 1);
    out_text[got > 0 ? got : 0] = 0;
    lseek(fe, 0, SEEK_SET);
    got = read(fe, err, err_cap - 1);
    err[got > 0 ? got : 0] = 0;
    close(fi), close(fo), close(fe);
    unlink(in_path), unlink(out_path), unlink(err_path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_binary(void) {
    static char err[1 << 16];
    // three requests sharing a 200-token prefix, one after the other, then stats
    size_t at = 0;
    for (int k = 0; k < 3; k++) {
        at += (size_t)snprintf(input + at, sizeof input - at, "{\"id\":\"b%d\",\"input_ids\":[", k);
        for (int i = 0; i < 200; i++) at += (size_t)snprintf(input + at, sizeof input - at, i ? ",%d" : "%d", (i * 13 + 5) % 4000);
        for (int i = 0; i < 10; i++) at += (size_t)snprintf(input + at, sizeof input - at, ",%d", (k * 100 + i) % 4000);
        at += (size_t)snprintf(input + at, sizeof input - at, "],\"max_tokens\":3,\"temperature\":0,\"return_token_ids\":true}\n");
    }
    input[at] = 0;
    const char *on[] = {"--max-num-seqs", "1", "--max-batch-tokens", "128", "--prefix-block", "64", NULL};
    int rc = run_moet(input, on, err, sizeof err);
    CHECK(rc == 0, "moet serve --prefix-block 64: exit %d: %s", rc, err);
    parse_answers();
    CHECK(n_ans == 4 && path(0, "prefix_block", 0, 0, 0) && path(0, "prefix_block", 0, 0, 0)->i64 == 64 &&
              path(0, "prefix_blocks", 0, 0, 0)->i64 == MOET_PREFIX_BLOCKS,
          "the ready line names the cache: %s", n_ans ? ans_line[0] : "");
    char tok0[4096] = "", b1_ids[4096];
    for (int k = 0; k < 3; k++) {
        char id[8];
        snprintf(id, sizeof id, "b%d", k);
        int a = find_answer(id, NULL);
        const js_node *c = a >= 0 ? path(a, "usage", "prompt_tokens_details", "cached_tokens", 0) : NULL;
        CHECK(c && c->i64 == (k ? 192 : 0), "%s: cached_tokens %lld", id, c ? (long long)c->i64 : -1LL);
        if (a >= 0 && k == 0) snprintf(tok0, sizeof tok0, "%s", ans_line[a]);
    }
    CHECK(strstr(err, "(384 from the prefix cache)") != NULL, "the done line counts the cached tokens: %s", err);
    // the same with a stats line after the answers: the input is read at once, so stats comes
    // while they run; a second server with the cache off gives the same tokens
    const char *off[] = {"--max-num-seqs", "1", "--max-batch-tokens", "128", "--prefix-cache-gb", "0", NULL};
    int b0 = find_answer("b1", NULL);
    if (b0 >= 0) {
        const char *c = strstr(ans_line[b0], "\"token_ids\""), *u = c ? strchr(c, ']') : NULL;
        snprintf(b1_ids, sizeof b1_ids, "%.*s", c && u ? (int)(u - c) : 0, c ? c : "");
    }
    rc = run_moet(input, off, err, sizeof err);
    parse_answers();
    int a = find_answer("b1", NULL);
    CHECK(rc == 0 && n_ans == 4 && path(0, "prefix_blocks", 0, 0, 0)->i64 == 0, "--prefix-cache-gb 0 turns the cache off");
    CHECK(a >= 0 && path(a, "usage", "prompt_tokens_details", "cached_tokens", 0)->i64 == 0 && strstr(ans_line[a], b1_ids),
          "without the cache: nothing cached, the same tokens");
    CHECK(strstr(err, "prefix cache: off") != NULL, "the boot line says the cache is off");
    // stats fields
    snprintf(input, sizeof input, "{\"op\":\"stats\"}\n");
    rc = run_moet(input, on, err, sizeof err);
    parse_answers();
    int s = -1;
    for (int i = 0; i < n_ans; i++)
        if (js_str_is(path(i, "object", 0, 0, 0), "stats")) s = i;
    CHECK(rc == 0 && s >= 0 && path(s, "cached_prompt_tokens", 0, 0, 0) && path(s, "prefix_cache", "blocks", 0, 0) &&
              path(s, "prefix_cache", "blocks", 0, 0)->i64 == MOET_PREFIX_BLOCKS && path(s, "prefix_cache", "evictions", 0, 0),
          "the stats line has the cache's counters: %s", s >= 0 ? ans_line[s] : "");
    // bad flags
    const char *big[] = {"--max-model-len", "512", "--prefix-block", "512", NULL};
    CHECK(run_moet("", big, err, sizeof err) == 1 && strstr(err, "shorter than the context"), "a block as long as the context: %s", err);
    const char *tiny[] = {"--prefix-cache-gb", "0.0000001", NULL};
    CHECK(run_moet("", tiny, err, sizeof err) == 1 && strstr(err, "holds no block"), "a cache that holds no block: %s", err);
    const char *neg[] = {"--prefix-cache-gb", "-1", NULL};
    CHECK(run_moet("", neg, err, sizeof err) == 2, "a negative cache size is refused");
    (void)tok0;
}

int main(void) {
    test_table();
    backend_checks(0, "tests/fixtures/tiny/bf16", NULL);
    backend_checks(0, "tests/fixtures/demo", "build/demo.planes");
    serve_checks(0, "tests/fixtures/tiny/bf16");
    test_binary();
    gpu_device d;
    moet_err ge = {{0}};
    if (gpu_open(&d, &ge) == 0) {
        gpu_close(&d);
        backend_checks(1, "tests/fixtures/tiny/bf16", NULL);
        backend_checks(1, "tests/fixtures/tiny/nvfp4", NULL);
        backend_checks(1, "tests/fixtures/demo", "build/demo.planes");
        serve_checks(1, "tests/fixtures/tiny/bf16");
        serve_checks(1, "tests/fixtures/demo");
    } else {
        if (on_gpu_required()) CHECK(0, "a GPU is required (MOET_REQUIRE_GPU=1): %s", ge.msg);
        else CHECK_SKIP("the prefix cache on the GPU", "%s", ge.msg);
    }
    return check_report("test_prefix");
}
