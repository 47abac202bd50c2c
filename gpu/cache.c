// gpu/cache.c — the expert cache on the device (--expert-cache-gb with the GPU backend): a pool of
// fewer places than the plane file has slots, filled as the layers' routers choose, so a GPU whose
// memory does not hold every expert (or a GB10 sharing its memory) serves the model.
//
// Per layer of a step (gpu_moe_layer calls gpu_cache_routed after the router, queues the next
// layer's router on this layer's input (the guess) and gpu_cache_guessed, then the shared
// expert's down product, which needs no routed expert, then calls gpu_cache_fetch):
//   compute stream  the router's choices sel [T, K] copied to pinned memory, event `routed`; the
//                   guess's choices, event `guessed`;
//   host            waits for `routed` only (the guess and the shared expert's product run
//                   meanwhile), and for the reads the previous layer queued ahead (below); each
//                   distinct expert chosen is held (a hit: its place used now) or missing: a place
//                   is taken — a free one, else one not chosen by this layer in this step (those
//                   are pinned): the least recently used of those unused for a step, else of
//                   the layer that comes again last (gpu_cache_victim) — and the slot is read by the reader
//                   threads (O_DIRECT into each one's pinned buffer, SHA-256 against the table on
//                   every read unless --no-verify) and copied to its place on the fetch stream;
//                   then (prefetch) the guess's experts of the next layer that are not held are
//                   queued for the readers too, into places not chosen by this layer, and not
//                   waited for: they are read while this layer computes, and the next layer's
//                   fetch drops those not yet started that it did not choose, and waits for the
//                   rest before it looks (a failed one just leaves its slot unheld); the host
//                   waits for this layer's own reads only; the layer's expert
//                   table (a pinned copy) is rewritten for the new places and copied after them;
//                   event `fetched`;
//   compute stream  waits for `fetched` (the routed products read the new places and the table).
// Strict: a routed product never runs before its experts are in place. A read or hash that fails
// frees its place and fails the step with the slot named (gpu_step returns the error; the server
// fails that step's requests and goes on). Eviction is safe: a place a queued kernel may still
// read was chosen by an earlier layer, whose products the compute stream finished before this
// layer's `routed` (stream order), and this layer's own choices are pinned. The bits are those of
// the resident pool: the same kernels over the same slot bytes, at other addresses.
// Counters: pf_cache_stats (format/planes_model.c), as the CPU's cache keeps them (bench, stats).

typedef struct gpu_cache_s gpu_cache;

typedef struct {
    gpu_cache *c;
    pthread_t tid;
    uint8_t *buf;        // pinned [slot_stride]
    CUevent ev;          // its last copy out of buf
    int used;            // ev recorded
    pf_sha sha;
} gpu_cache_reader;

struct gpu_cache_s {
    const gpu_device *dev;
    pf_file f;                   // open for the run
    int verify;                  // hash every slot read
    int read_ahead;              // the guess's slots read ahead (--expert-prefetch, on by default)
    int n_pool, n_layers, E, first_layer;
    uint64_t n_slots;
    size_t stride;               // bytes per place (the file's slot stride)
    CUdeviceptr pool;            // [n_pool · stride]
    CUdeviceptr tables[MOET_MAX_LAYERS];   // each model layer's expert table on the device ([E, 3] gpu_mat)
    int32_t *where;              // [n_slots] the place of each slot, −1: not held
    int32_t *owner;              // [n_pool] the slot held there, −1: free
    uint64_t *used;              // [n_pool] last use (a tick)
    uint64_t tick, mark;         // mark: the first tick of the current layer
    uint64_t cycle;              // the mark of the current layer's previous fetch (a step ago)
    uint64_t *lmark;             // [n_layers] each layer's last mark
    gpu_mat *tab;                // pinned [n_layers · E · 3] what the device tables hold
    int32_t *sel;                // pinned [Tm · K] the router's choices
    int32_t *guess;              // pinned [Tm · K] the next layer's router on this layer's input
    CUstream fetch;
    CUevent routed, guessed, fetched;
    // reads queued: jobs [n_jobs) of slot job_slot[j] into place job_place[j]; the current
    // layer's own first, then those queued ahead for the next layer (job_ahead)
    pthread_mutex_t mu;
    pthread_cond_t work, done_cv;
    int64_t *job_slot;           // [2E]
    int32_t *job_place;          // [2E] (−1 after a failed read)
    uint8_t *job_done, *job_ahead;   // [2E]
    uint8_t *ahead;              // [n_pool] filled ahead and not yet chosen
    uint8_t *tab_dirty;          // [n_layers] the layer's pinned table changed since its last copy
    int n_jobs, next_job, done_jobs, stop;
    moet_err err;                // the first failed read of the layer
    int failed;
    uint64_t fault_read, reads;  // MOET_FAULT=read:N: the N-th read fails as an I/O error
    int n_readers;               // --io-depth
    gpu_cache_reader rd[MOET_GPU_CACHE_READERS];
    // moet bench --route-zipf s: each layer's choices replaced by draws from a Zipf popularity
    // (rank r of E with weight 1 / (r + 1)^s; rank r is expert (r · zmul + layer · 61) mod E, so
    // each layer has its own popular experts), K distinct a token, from a fixed seed: what the
    // cache sees from a router with skewed popularity (the answers are not the model's)
    double zipf;
    double *zcdf;                // [E] cumulative popularity by rank
    int zmul;                    // odd, coprime to E
    uint64_t zrng;
    int started;                 // threads running
};

// Places for --expert-cache-gb G: the most whole slots in G GiB, at least what one layer of a step
// can choose (every expert of a layer), at most the file's slots (then nothing is cached: every
// slot resident). 0 with e set when G holds too few.
static int gpu_cache_places(double gb, size_t stride, uint64_t n_slots, int E, int *n_pool, moet_err *e) {
    double want = gb * 1073741824.0 / (double)stride;
    if (want >= (double)n_slots) return *n_pool = (int)n_slots, 0;
    if (want < E)
        return err_set(e, "--expert-cache-gb %g holds %.0f expert slots of %zu bytes; a step can choose every one of a layer's %d "
                          "experts: at least %.3f GiB", gb, floor(want), stride, E, (double)E * stride / 1073741824.0);
    *n_pool = (int)want;
    return 0;
}

// What the cache's arenas are planned from: n_pool places of the file's n_slots (stride bytes
// each) for n_layers layers of E experts, the reads in flight (--io-depth) and --route-zipf.
static void gpu_cache_plan(gpu_cache *c, const gpu_device *dev, int n_pool, int n_layers, int E, uint64_t n_slots, size_t stride,
                           const pf_serve_opts *po) {
    c->dev = dev, c->n_pool = n_pool, c->n_layers = n_layers, c->E = E, c->n_slots = n_slots, c->stride = stride;
    c->n_readers = po->io_depth ? po->io_depth : MOET_IO_DEPTH, c->zipf = po->route_zipf;
}

// The cache's memory: pinned (reader buffers, choices, tables) and host (maps, jobs), planned in
// the engine's arenas (gpu_carve_pinned, gpu_carve_host).
static void gpu_cache_carve_pinned(gpu_cache *c, arena *a, size_t Tm, int K) {
    for (int r = 0; r < c->n_readers; r++) c->rd[r].buf = arena_take(a, c->stride, PF_PAGE, "expert cache reads");
    c->sel = arena_take(a, sizeof(int32_t) * Tm * K, 256, "expert cache choices");
    c->guess = arena_take(a, sizeof(int32_t) * Tm * K, 256, "expert cache guesses");
    c->tab = arena_take(a, sizeof(gpu_mat) * (size_t)c->n_layers * c->E * 3, 256, "expert cache tables");
}
static void gpu_cache_carve_host(gpu_cache *c, arena *a) {
    ARENA_TAKE(a, c->where, c->n_slots, "expert cache: slot places");
    ARENA_TAKE(a, c->owner, c->n_pool, "expert cache: place owners");
    ARENA_TAKE(a, c->used, c->n_pool, "expert cache: place uses");
    ARENA_TAKE(a, c->job_slot, 2 * (size_t)c->E, "expert cache: reads");
    ARENA_TAKE(a, c->job_place, 2 * (size_t)c->E, "expert cache: read places");
    ARENA_TAKE(a, c->job_done, 2 * (size_t)c->E, "expert cache: reads done");
    ARENA_TAKE(a, c->job_ahead, 2 * (size_t)c->E, "expert cache: reads ahead");
    ARENA_TAKE(a, c->ahead, c->n_pool, "expert cache: places filled ahead");
    ARENA_TAKE(a, c->tab_dirty, c->n_layers, "expert cache: tables changed");
    ARENA_TAKE(a, c->lmark, c->n_layers, "expert cache: layers' marks");
    if (c->zipf > 0) ARENA_TAKE(a, c->zcdf, c->E, "expert cache: Zipf popularity");
}

// --route-zipf's popularity (zcdf), permutation (zmul) and seed.
static void gpu_cache_zipf_init(gpu_cache *c) {
    for (int r = 0; r < c->E; r++) c->zcdf[r] = (r ? c->zcdf[r - 1] : 0) + pow(r + 1.0, -c->zipf);
    for (c->zmul = 97;; c->zmul += 2) {   // the first odd multiplier from 97 coprime to E: a permutation of the ranks
        int a = c->zmul, b = c->E;
        while (b) a %= b, a ^= b, b ^= a, a ^= b;   // gcd(zmul, E) in a
        if (a == 1) break;
    }
    c->zrng = 0x9e3779b97f4a7c15ull;
}

// The Zipf draws of --route-zipf: sel [T, K] of layer l (index in the file) rewritten.
static void gpu_cache_zipf(gpu_cache *c, int l, int T, int K) {
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int x;
            for (int fresh = 0; !fresh;) {   // K ≤ E distinct: redraw a repeat
                c->zrng ^= c->zrng << 13, c->zrng ^= c->zrng >> 7, c->zrng ^= c->zrng << 17;
                const double u = (double)(c->zrng >> 11) * 0x1p-53 * c->zcdf[c->E - 1];
                int lo = 0, hi = c->E - 1;   // the first rank whose cumulative weight exceeds u
                while (lo < hi) {
                    const int mid = (lo + hi) / 2;
                    if (c->zcdf[mid] > u) hi = mid;
                    else lo = mid + 1;
                }
                x = (int)(((int64_t)lo * c->zmul + (int64_t)(c->first_layer + l) * 61) % c->E);
                fresh = 1;
                for (int j = 0; j < k; j++) fresh &= c->sel[t * K + j] != x;
            }
            c->sel[t * K + k] = x;
        }
}

// A reader thread: the current layer's jobs, one at a time, into its own buffer, then onto the
// fetch stream (its buffer reused only once that copy is done).
static void *gpu_cache_read(void *arg) {
    gpu_cache_reader *r = arg;
    gpu_cache *c = r->c;
    const pf_layout *L = &c->f.h.L;
    gpu_bind(c->dev);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->next_job >= c->n_jobs) pthread_cond_wait(&c->work, &c->mu);
        if (c->stop) break;
        int j = c->next_job++;
        if (c->job_done[j]) continue;   // (a read ahead dropped before it started: gpu_cache_fetch)
        int64_t i = c->job_slot[j];
        int p = c->job_place[j], fault = c->fault_read && ++c->reads == c->fault_read;
        pthread_mutex_unlock(&c->mu);
        uint32_t layer = L->g.first_layer + (uint32_t)(i / L->g.n_experts), x = (uint32_t)(i % L->g.n_experts);
        moet_err e = {{0}};
        if (r->used) CU_CHECK(cu.cuEventSynchronize(r->ev));   // the buffer's previous copy is done
        int rc = fault ? pf_fault_read_err(&c->f, layer, x, c->fault_read, &e)
                       : pf_read_slot(&c->f, layer, x, r->buf, c->stride, c->verify ? &r->sha : NULL, &e);
        if (rc == 0) {
            CU_CHECK(cu.cuMemcpyHtoDAsync(c->pool + (CUdeviceptr)p * c->stride, r->buf, c->stride, c->fetch));
            CU_CHECK(cu.cuEventRecord(r->ev, c->fetch));
            r->used = 1;
        }
        pthread_mutex_lock(&c->mu);
        if (rc) {
            if (!c->failed && !c->job_ahead[j]) c->failed = 1, c->err = e;   // (a read ahead that fails only leaves its slot unheld)
            c->job_place[j] = -1;
        }
        c->job_done[j] = 1;
        c->done_jobs++;
        pthread_cond_broadcast(&c->done_cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void gpu_cache_close(gpu_cache *c) {
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_broadcast(&c->work);
        pthread_mutex_unlock(&c->mu);
        for (int r = 0; r < c->started; r++) pthread_join(c->rd[r].tid, NULL);
        c->started = 0;
    }
    if (c->fetch) {
        CU_CHECK(cu.cuStreamSynchronize(c->fetch));
        for (int r = 0; r < c->n_readers; r++)
            if (c->rd[r].ev) CU_CHECK(cu.cuEventDestroy(c->rd[r].ev));
        CU_CHECK(cu.cuEventDestroy(c->routed));
        CU_CHECK(cu.cuEventDestroy(c->guessed));
        CU_CHECK(cu.cuEventDestroy(c->fetched));
        CU_CHECK(cu.cuStreamDestroy(c->fetch));
        c->fetch = 0;
        pthread_mutex_destroy(&c->mu), pthread_cond_destroy(&c->work), pthread_cond_destroy(&c->done_cv);
        for (int r = 0; r < c->n_readers && c->verify; r++) pf_sha_free(&c->rd[r].sha);
        pf_close(&c->f);
    }
}

// The table entries (pinned copy) of slot i at place s.
static void gpu_cache_entry(gpu_cache *c, int64_t i, int s) {
    const pf_layout *L = &c->f.h.L;
    ck_mat m3[3];
    pf_expert_mats(L, (const uint8_t *)(uintptr_t)(c->pool + (CUdeviceptr)s * c->stride), &m3[0], &m3[1], &m3[2]);
    for (int q = 0; q < 3; q++) c->tab[(size_t)i * 3 + q] = gpu_mat_desc(&m3[q], (uintptr_t)m3[q].w, (uintptr_t)m3[q].scale);
}

// Opens the plane file for the run, points every table entry at place 0 (no entry is read before
// a fetch maps it: the router's choices are resolved first), starts the readers. The arenas are
// carved (where, owner, tab, sel, buffers). 0, or −1 with e set (nothing left running).
static int gpu_cache_open(gpu_cache *c, const ck_model *m, const char *planes, const pf_serve_opts *po, moet_err *e) {
    pf_serve_opts oo = *po;
    oo.no_verify = 1;   // each slot is hashed as it is read
    if (pf_open_for_model(&c->f, planes, &m->cfg, m->dir, &oo, e)) return -1;
    const pf_layout *L = &c->f.h.L;
    MOET_ASSERT(L->n_slots == c->n_slots && L->slot_stride == c->stride && (int)L->g.n_experts == c->E, "expert cache: the plane file changed");
    c->verify = !po->no_verify;
    // reads ahead only when asked: on the H200 (a 1.0–1.6 GB/s disk) they made batch-1 decoding
    // 6–17 % slower (README), the disk's time going to guesses; (the next router's guess does not
    // predict Zipf draws)
    c->read_ahead = po->prefetch > 0 && !(c->zipf > 0);
    if (c->zipf > 0) gpu_cache_zipf_init(c);
    c->first_layer = (int)L->g.first_layer;
    for (uint64_t i = 0; i < c->n_slots; i++) c->where[i] = -1;
    for (int l = 0; l < c->n_layers; l++) c->tab_dirty[l] = 0, c->lmark[l] = 0;
    for (int p = 0; p < c->n_pool; p++) c->owner[p] = -1, c->used[p] = 0, c->ahead[p] = 0;
    c->tick = c->mark = 0;
    for (int l = 0; l < c->n_layers; l++) {
        for (int x = 0; x < c->E; x++) gpu_cache_entry(c, (int64_t)l * c->E + x, 0);
        CU_CHECK(cu.cuMemcpyHtoD(c->tables[c->first_layer + l], c->tab + (size_t)l * c->E * 3, sizeof(gpu_mat) * c->E * 3));
    }
    c->fault_read = pf_fault_read(), c->reads = 0;
    pthread_mutex_init(&c->mu, NULL), pthread_cond_init(&c->work, NULL), pthread_cond_init(&c->done_cv, NULL);
    CU_CHECK(cu.cuStreamCreate(&c->fetch, GPU_STREAM_NON_BLOCKING));
    CU_CHECK(cu.cuEventCreate(&c->routed, 2 /* CU_EVENT_DISABLE_TIMING */));
    CU_CHECK(cu.cuEventCreate(&c->guessed, 2));
    CU_CHECK(cu.cuEventCreate(&c->fetched, 2));
    c->n_jobs = c->next_job = c->done_jobs = c->stop = c->failed = 0;
    for (int r = 0; r < c->n_readers; r++) {
        c->rd[r].c = c, c->rd[r].used = 0;
        CU_CHECK(cu.cuEventCreate(&c->rd[r].ev, 2));
        if (c->verify && pf_sha_init(&c->rd[r].sha, e)) {
            for (int q = 0; q < r; q++) pf_sha_free(&c->rd[q].sha);
            c->verify = 0;   // (none left to free in close)
            gpu_cache_close(c);
            return -1;
        }
    }
    for (; c->started < c->n_readers; c->started++)
        if (pthread_create(&c->rd[c->started].tid, NULL, gpu_cache_read, &c->rd[c->started])) {
            err_set(e, "cannot start expert cache reader thread %d", c->started);
            gpu_cache_close(c);
            return -1;
        }
    memset(&pf_cache_stats, 0, sizeof pf_cache_stats);
    pf_cache_stats.pool_slots = (uint64_t)c->n_pool;
    pf_cache_stats.file_slots = c->n_slots;
    fprintf(stderr, "moet: expert cache: %d of %" PRIu64 " slots on the device (%.2f GiB), %d reader threads, %s, %s\n", c->n_pool, c->n_slots,
            (double)c->n_pool * c->stride / 1073741824.0, c->n_readers, c->verify ? "every read SHA-256 checked" : "reads not verified",
            c->read_ahead ? "the next layer's guessed experts read ahead" : "no reads ahead");
    if (c->zipf > 0) fprintf(stderr, "moet: expert cache: the routers' choices replaced by Zipf draws (exponent %g; --route-zipf)\n", c->zipf);
    return 0;
}

// After the router of model layer `layer` (compute stream): its choices sel_dev [T, K] to pinned
// memory, and the event the host waits for.
static void gpu_cache_routed(gpu_cache *c, CUstream compute, CUdeviceptr sel_dev, int T, int K) {
    CU_CHECK(cu.cuMemcpyDtoHAsync(c->sel, sel_dev, sizeof(int32_t) * (size_t)T * K, compute));
    CU_CHECK(cu.cuEventRecord(c->routed, compute));
}

// After the guess (the next layer's router on this layer's input, guess_dev [T, K]), or with
// guess_dev 0 when there is none (the file's last layer): its choices to pinned memory.
static void gpu_cache_guessed(gpu_cache *c, CUstream compute, CUdeviceptr guess_dev, int T, int K) {
    if (guess_dev) CU_CHECK(cu.cuMemcpyDtoHAsync(c->guess, guess_dev, sizeof(int32_t) * (size_t)T * K, compute));
    CU_CHECK(cu.cuEventRecord(c->guessed, compute));
}

// A place for a new slot while layer l (of the file) fetches, among those not chosen by this
// layer in this step (used before mark): a free one; else the least recently used of those no
// layer has used since this layer's previous fetch (used before cycle: stale a whole step);
// else — every place was used within the last step: the pool holds less than a step's slots —
// one of the layer that comes again last (the layers run in a cycle: a slot of this layer is next
// needed a step on, one of layer l − 1 a step less a layer, …, one of layer l + 1 soonest), the
// least recently used of that layer. (Least recently used alone evicts, on that cycle, exactly
// the slots needed soonest: measured, 0 hits in 31,893 at batch 16 with a quarter of the slots.)
// −1: none (cannot happen with n_pool ≥ E).
static int gpu_cache_victim(const gpu_cache *c, int l) {
    int s = -1, sd = -1, old = -1;
    for (int p = 0; p < c->n_pool; p++) {
        if (c->owner[p] < 0) return p;
        if (c->used[p] >= c->mark) continue;
        if (c->used[p] < c->cycle && (old < 0 || c->used[p] < c->used[old])) old = p;
        int d = ((int)(c->owner[p] / c->E) - l + c->n_layers) % c->n_layers;   // layers until its own
        if (d == 0) d = c->n_layers;
        if (d > sd || (d == sd && c->used[p] < c->used[s])) s = p, sd = d;
    }
    return old >= 0 ? old : s;
}

// Waits until the readers have done jobs [0, upto) (all: upto = n_jobs); the caller holds mu.
static void gpu_cache_wait_jobs(gpu_cache *c, int upto) {
    for (;;) {
        int all = 1;
        for (int j = 0; j < upto && all; j++) all = c->job_done[j];
        if (all) return;
        pthread_cond_wait(&c->done_cv, &c->mu);
    }
}

// The layer's chosen experts in place before its routed products (see the top): host side, then
// the compute stream made to wait. 0, or −1 with e naming the first slot that failed (the step
// must launch nothing more: its requests fail).
static int gpu_cache_fetch(gpu_cache *c, CUstream compute, int layer, int T, int K, moet_err *e) {
    const pf_layout *L = &c->f.h.L;
    double t0 = moet_now();
    CU_CHECK(cu.cuEventSynchronize(c->routed));
    const int l = layer - c->first_layer;
    MOET_ASSERT(l >= 0 && l < c->n_layers, "expert cache: layer %d outside the plane file", layer);
    if (c->zipf > 0) gpu_cache_zipf(c, l, T, K);   // (gpu_moe_layer copies them to the device)
    // the reads queued ahead (by the layer before, normally for this one): done, then their slots
    // held (table entries written; a layer's table is copied before its next products) or, failed,
    // unheld (a later choice reads them again)
    pthread_mutex_lock(&c->mu);
    // a read ahead not yet started whose slot this layer did not choose is dropped (the disk's
    // time goes to the slots needed now); its place is freed below
    for (int j = c->next_job; j < c->n_jobs; j++) {
        if (!c->job_ahead[j] || c->job_done[j]) continue;
        const int64_t i = c->job_slot[j];
        int chosen = 0;
        for (int p = 0; p < T * K && !chosen; p++) chosen = (int64_t)l * c->E + c->sel[p] == i;
        if (chosen) continue;
        c->job_place[j] = -1, c->job_done[j] = 1, c->done_jobs++;
        pf_cache_stats.prefetched--, pf_cache_stats.bytes -= L->slot_bytes, pf_cache_stats.prefetch_dropped++;
    }
    gpu_cache_wait_jobs(c, c->n_jobs);
    for (int j = 0; j < c->n_jobs; j++) {
        const int64_t i = c->job_slot[j];
        const int s = c->job_place[j];
        if (s == -2) continue;   // an own read of that layer, dealt with there
        if (s < 0) {
            const int p = c->where[i];
            if (p >= 0) c->where[i] = -1, c->owner[p] = -1, c->used[p] = 0, c->ahead[p] = 0;
            continue;
        }
        gpu_cache_entry(c, i, s);
        c->tab_dirty[i / c->E] = 1;
    }
    c->n_jobs = c->next_job = c->done_jobs = 0, c->failed = 0;
    pthread_mutex_unlock(&c->mu);
    // this layer's choices: held, or a place and an own read (pinned from here on: used ≥ mark)
    c->mark = ++c->tick;
    c->cycle = c->lmark[l], c->lmark[l] = c->mark;
    int n = 0;
    for (int p = 0; p < T * K; p++) {
        const int x = c->sel[p];
        MOET_ASSERT(x >= 0 && x < c->E, "expert cache: the router chose expert %d of %d", x, c->E);
        const int64_t i = (int64_t)l * c->E + x;
        int s = c->where[i];
        if (s >= 0) {
            if (c->used[s] < c->mark) {   // (a second choice of it in this layer counts once)
                pf_cache_stats.hits++;
                if (c->ahead[s]) pf_cache_stats.prefetch_used++, c->ahead[s] = 0;
            }
            c->used[s] = ++c->tick;
            continue;
        }
        s = gpu_cache_victim(c, l);
        MOET_ASSERT(s >= 0, "expert cache: no place for a slot (%d places, %d experts a layer)", c->n_pool, c->E);
        if (c->owner[s] >= 0) c->where[c->owner[s]] = -1;
        c->owner[s] = (int32_t)i, c->where[i] = s, c->used[s] = ++c->tick, c->ahead[s] = 0;
        c->job_slot[n] = i, c->job_place[n] = s, c->job_done[n] = 0, c->job_ahead[n] = 0, n++;
    }
    const int n_own = n;
    pthread_mutex_lock(&c->mu);
    c->n_jobs = n;
    if (n) pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->mu);
    // reads ahead: the guess's experts of the next layer in the file that are not held, into
    // places this layer did not choose nor just took ahead (both used ≥ mark), behind the own reads
    CU_CHECK(cu.cuEventSynchronize(c->guessed));
    for (int p = 0; c->read_ahead && l + 1 < c->n_layers && p < T * K && n < 2 * c->E; p++) {
        const int x = c->guess[p];
        if (x < 0 || x >= c->E) continue;   // (only a guess: a bad one is skipped)
        const int64_t i = (int64_t)(l + 1) * c->E + x;
        if (c->where[i] >= 0) continue;
        const int s = gpu_cache_victim(c, l);
        if (s < 0) break;
        if (c->owner[s] >= 0) c->where[c->owner[s]] = -1;
        c->owner[s] = (int32_t)i, c->where[i] = s, c->used[s] = ++c->tick, c->ahead[s] = 1;
        pthread_mutex_lock(&c->mu);
        c->job_slot[n] = i, c->job_place[n] = s, c->job_done[n] = 0, c->job_ahead[n] = 1;
        c->n_jobs = ++n;
        pthread_cond_broadcast(&c->work);
        pthread_mutex_unlock(&c->mu);
        pf_cache_stats.prefetched++;
        pf_cache_stats.bytes += L->slot_bytes;
    }
    // this layer's own reads (those ahead go on while the layer computes)
    pthread_mutex_lock(&c->mu);
    gpu_cache_wait_jobs(c, n_own);
    const int failed = c->failed;
    if (failed) *e = c->err;
    for (int j = 0; j < n_own; j++) {
        const int64_t i = c->job_slot[j];
        const int s = c->job_place[j];
        c->job_place[j] = -2;   // dealt with here (the next fetch skips it)
        if (s < 0) {   // a failed read: its place is free again, nothing half-read is used
            const int p = c->where[i];
            c->where[i] = -1, c->owner[p] = -1, c->used[p] = 0;
            continue;
        }
        gpu_cache_entry(c, i, s);
        c->tab_dirty[l] = 1;
        pf_cache_stats.misses++;
        pf_cache_stats.bytes += L->slot_bytes;
    }
    pthread_mutex_unlock(&c->mu);
    // the table after the slots (the fetch stream's order), then the compute stream waits for both;
    // also when a read failed: the slots that did arrive are held, and a later step that finds
    // them held must find the table pointing at them
    if (c->tab_dirty[l]) {
        CU_CHECK(cu.cuMemcpyHtoDAsync(c->tables[layer], c->tab + (size_t)l * c->E * 3, sizeof(gpu_mat) * c->E * 3, c->fetch));
        CU_CHECK(cu.cuEventRecord(c->fetched, c->fetch));
        CU_CHECK(cu.cuStreamWaitEvent(compute, c->fetched, 0));   // the routed products read the new places and table
        c->tab_dirty[l] = 0;
    }
    pf_cache_stats.read_s += moet_now() - t0;
    return failed ? -1 : 0;
}
