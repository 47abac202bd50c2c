// format/planes_model.c — a plane file for one model: opened and checked against the model's
// config and directory (geometry, source revision), the expert matrices over a slot, and the
// planes attached to a loaded checkpoint in place of its own experts (what the CPU reference
// serves; the GPU's resident pool is gpu/pool.c).
//
// The format itself is format/planes.c; the checkpoint is format/checkpoint.c.

static void pf_geom_of_config(const ck_config *c, pf_geom *g) {
    g->n_layers = (uint32_t)c->n_layers;
    g->first_layer = 0;   // qwen3_5_moe: every decoder layer is a MoE layer
    g->n_experts = (uint32_t)c->n_experts;
    g->hidden = (uint32_t)c->hidden;
    g->inter = (uint32_t)c->inter;
}

// The config named by --model: a checkpoint directory (its config.json) or a config file.
static int pf_model_config(const char *model, ck_config *c, moet_err *e) {
    struct stat st;
    char path[MOET_MAX_PATH];
    if (stat(model, &st)) return err_set(e, "%s: %s", model, strerror(errno));
    if (S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/config.json", model);
    else snprintf(path, sizeof path, "%s", model);
    return ck_config_read(c, path, e);
}

typedef struct {
    int no_verify;          // skip hashing every slot (--no-verify)
    int strict_revision;    // a source revision mismatch refuses instead of warning (--strict-revision)
    int threads;            // hashing threads; 0: a default from the core count
    int progress;           // progress bar on stderr
    double cache_gb;        // > 0: the CPU reference holds at most this many GiB of slots (pf_cache); else every slot
    int prefetch;           // with the cache: reads ahead of the slots steps are expected to use (1 on, 0 off; −1: the
                            // backend's default: on for the CPU's pf_cache_prefetch, off for the GPU's reads ahead)
    int io_depth;           // the GPU's cache: reads in flight (reader threads); 0: MOET_IO_DEPTH
    double route_zipf;      // > 0: the GPU's cache sees Zipf-shaped choices of this exponent (moet bench --route-zipf)
} pf_serve_opts;

// Opens the plane file `path` to serve the routed experts of the model in model_dir (config c):
// header, quant_abi, file size and table (pf_open), geometry equal to the config, the source
// revision against the snapshot's (a warning on stderr, or a refusal with strict_revision), and
// every slot's hash and padding unless no_verify. Nothing may be served from a file this refuses.
static int pf_open_for_model(pf_file *f, const char *path, const ck_config *c, const char *model_dir,
                             const pf_serve_opts *o, moet_err *e) {
    if (pf_open(f, path, e)) return -1;
    pf_geom g;
    pf_geom_of_config(c, &g);
    if (pf_check_geometry(&f->h, &g, e)) {
        err_wrap(e, "%s against %s", path, model_dir);
        pf_close(f);
        return -1;
    }
    char repo[256], rev[256];
    if (model_dir && ck_hf_snapshot(model_dir, repo, sizeof repo, rev, sizeof rev)) {
        int r = pf_check_source(&f->h, rev, o->strict_revision, e);
        if (r < 0) {
            err_wrap(e, "%s", path);
            pf_close(f);
            return -1;
        }
        if (r > 0) fprintf(stderr, "moet: warning: %s: %s (--strict-revision refuses this)\n", path, e ? e->msg : "");
    }
    if (!o->no_verify && pf_verify_slots(f, o->threads, o->progress, stderr, NULL, e)) {
        pf_close(f);
        return -1;
    }
    return 0;
}

// The three matrices of one expert as checkpoint matrices over its slot bytes (no copy), so the
// CPU reference decodes plane rows like any stored weight: gate [I, H] = w13 rows 0..I-1,
// up [I, H] = w13 rows I..2I-1, down [H, I]. The fragment-major codes and the scales are both
// ordered by 16-row block first, so the up half starts I/16 blocks into each section.
static void pf_expert_mats(const pf_layout *L, const uint8_t *slot /* [slot_bytes] */, ck_mat *gate, ck_mat *up, ck_mat *down) {
    int H = (int)L->g.hidden, I = (int)L->g.inter;
    memset(gate, 0, sizeof *gate);
    gate->kind = CK_W_PLANES;
    gate->rows = I;
    gate->cols = H;
    gate->w = slot + L->sec_off[PF_W13_CODES];
    gate->scale = slot + L->sec_off[PF_W13_SCALES];
    *up = *gate;
    up->w += (size_t)I * H / 4;
    up->scale += (size_t)I * H / PF_BLOCK;
    memset(down, 0, sizeof *down);
    down->kind = CK_W_PLANES;
    down->rows = H;
    down->cols = I;
    down->w = slot + L->sec_off[PF_W2_CODES];
    down->scale = slot + L->sec_off[PF_W2_SCALES];
}

// ---- the expert cache (--expert-cache-gb) ----------------------------------------------------
//
// The CPU reference served from a plane file larger than the memory it may take: a pool of
// n_pool slots, filled as experts are used. An expert the step needs and the pool lacks is read
// then and there (O_DIRECT into its page-aligned place) and hashed against the table unless
// no_verify — every time it is read, so a slot changed on disk after boot is caught when it is
// next fetched; the read is waited for, never skipped, so the step computes what it would with
// every slot in memory, bit for bit. The least recently used slot makes room. The reference
// multiplies one expert at a time (ref_moe), so a pool of one slot would do; a pool of a
// layer's experts or more keeps a step's own experts between its tokens' uses.
//
// Prefetch (pf_cache_prefetch, a reader thread started with the cache): once a layer's router
// has chosen, the layer's experts the pool lacks are queued, and so are those layer l + 1's
// router picks on layer l's input (a guess: the residual stream changes little over a layer);
// the thread reads them while the layer computes. A place being filled is never handed out:
// get waits for it (and reads the slot itself if that read failed). Prefetch takes only places
// not used since the current layer began, and never the place of the expert being multiplied.
enum { PF_PLACE_FREE, PF_PLACE_READY, PF_PLACE_LOADING };
typedef struct pf_cache_s {
    pf_file f;              // open for the run
    int verify;             // hash each slot read
    pf_sha sha;             // the caller's; the reader thread has sha_pf
    int n_pool;             // slots held
    uint8_t *pool;          // [n_pool · slot_stride], page-aligned
    size_t pool_bytes;
    int32_t *where;         // [n_slots] the pool place of each slot, −1: not held
    int32_t *owner;         // [n_pool] the slot held there, −1: free
    uint64_t *used;         // [n_pool] last use (a tick)
    uint8_t *state;         // [n_pool] PF_PLACE_*
    uint8_t *ahead;         // [n_pool] filled by prefetch and not yet used
    uint64_t tick, mark;    // mark: the tick when the current layer began (pf_cache_layer)
    int in_use;             // the place of the expert being multiplied (−1: none)
    uint64_t fault_read;    // MOET_FAULT=read:N (tests): the N-th read fails as an I/O error
    uint64_t reads;
    // the reader thread
    int prefetch;           // it runs
    pthread_t tid;
    uint8_t *stack;         // [PF_PREFETCH_STACK]
    pthread_mutex_t mu;
    pthread_cond_t work, ready;
    int32_t *queue;         // [n_pool] places to fill, a ring
    int q_head, q_n, stop;
    pf_sha sha_pf;
} pf_cache;

#define PF_PREFETCH_STACK (256u << 10)   // the reader thread's stack: pf_read_slot and the hash need little

// Over the run (the server's stats line): pool and file sizes in slots, hits, misses (read by
// the step itself), bytes read, the seconds steps spent reading or waiting for a prefetch, the
// slots queued for the reader thread and those of them a step then used, and how well layer
// l + 1's router on layer l's input guessed: of the experts layers ≥ 1 used, those it had named;
// the GPU's reads ahead dropped before they started (their layer chose other slots).
// Only the thread that runs the steps writes them.
typedef struct {
    uint64_t pool_slots, file_slots, hits, misses, bytes;
    double read_s;
    uint64_t prefetched, prefetch_used, guess_needed, guess_named, prefetch_dropped;
} pf_cache_counters;
static pf_cache_counters pf_cache_stats;

// MOET_FAULT=read:N, the expert caches' test hook (the CPU's here, the GPU's in gpu/cache.c; the
// backends' step:N and lost:N are moet.c's engine_fault): N, or 0 when it is not set.
static uint64_t pf_fault_read(void) {
    const char *v = getenv("MOET_FAULT");
    if (!v || strncmp(v, "read:", 5)) return 0;
    char *end;
    uint64_t n = strtoull(v + 5, &end, 10);
    MOET_ASSERT(*end == 0 && n >= 1, "MOET_FAULT=%s: read:N with N >= 1", v);
    return n;
}

// The simulated failure of read N of slot (layer, x): the error a real one gives, the slot named.
static int pf_fault_read_err(const pf_file *f, uint32_t layer, uint32_t x, uint64_t n, moet_err *e) {
    return err_set(e, "%s: slot (layer %u, expert %u): read failed: %s (simulated: MOET_FAULT=read:%" PRIu64 ")", f->path, layer, x,
                   strerror(EIO), n);
}

static void pf_cache_lock(pf_cache *c) {
    if (c->prefetch) pthread_mutex_lock(&c->mu);
}
static void pf_cache_unlock(pf_cache *c) {
    if (c->prefetch) pthread_mutex_unlock(&c->mu);
}

// A place for a new slot: a free one, else the least recently used one that is neither being
// filled nor multiplied (and, for prefetch, not used since the current layer began). −1: none.
static int pf_cache_victim(const pf_cache *c, int for_prefetch) {
    int s = -1;
    for (int k = 0; k < c->n_pool; k++) {
        if (c->state[k] == PF_PLACE_LOADING || k == c->in_use || (for_prefetch && c->owner[k] >= 0 && c->used[k] > c->mark)) continue;
        if (c->owner[k] < 0) return k;
        if (s < 0 || c->used[k] < c->used[s]) s = k;
    }
    return s;
}

static void *pf_cache_reader(void *arg) {
    pf_cache *c = arg;
    const pf_layout *L = &c->f.h.L;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->q_n == 0) pthread_cond_wait(&c->work, &c->mu);
        if (c->stop) break;
        int s = c->queue[c->q_head];
        c->q_head = (c->q_head + 1) % c->n_pool, c->q_n--;
        int64_t i = c->owner[s];
        uint32_t layer = L->g.first_layer + (uint32_t)(i / L->g.n_experts), x = (uint32_t)(i % L->g.n_experts);
        pthread_mutex_unlock(&c->mu);
        moet_err e = {{0}};
        int rc = pf_read_slot(&c->f, layer, x, c->pool + (size_t)s * L->slot_stride, L->slot_stride, c->verify ? &c->sha_pf : NULL, &e);
        pthread_mutex_lock(&c->mu);
        if (rc)   // left to the step that needs it, which reads it and says why it failed
            c->where[i] = -1, c->owner[s] = -1, c->state[s] = PF_PLACE_FREE, c->ahead[s] = 0;
        else c->state[s] = PF_PLACE_READY;
        pthread_cond_broadcast(&c->ready);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

// Queues the slots of (layer, xs[0..n)) the pool lacks, while places allow (no-op without the
// reader thread).
static void pf_cache_prefetch(pf_cache *c, uint32_t layer, const int *xs, int n) {
    if (!c->prefetch) return;
    const pf_layout *L = &c->f.h.L;
    pthread_mutex_lock(&c->mu);
    for (int j = 0; j < n && c->q_n < c->n_pool; j++) {
        int64_t i = pf_slot_index(L, layer, (uint32_t)xs[j]);
        if (i < 0 || c->where[i] >= 0) continue;
        int s = pf_cache_victim(c, 1);
        if (s < 0) break;
        if (c->owner[s] >= 0) c->where[c->owner[s]] = -1;
        c->owner[s] = (int32_t)i, c->where[i] = s, c->state[s] = PF_PLACE_LOADING, c->ahead[s] = 1, c->used[s] = ++c->tick;
        c->queue[(c->q_head + c->q_n++) % c->n_pool] = s;
        pf_cache_stats.prefetched++;   // (counted here, on the caller's thread: the reader thread writes no counter)
        pf_cache_stats.bytes += L->slot_bytes;
    }
    pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
}

// A layer begins (ref_moe): what is used from now on is protected from prefetch.
static void pf_cache_layer(pf_cache *c) {
    pf_cache_lock(c);
    c->mark = c->tick;
    c->in_use = -1;
    pf_cache_unlock(c);
}

// gate, up, down = the matrices of (layer, expert) from the pool, reading the slot first when
// it is not there. -1 with e naming the slot when the read or its hash fails (the pool place
// is then free: nothing half-read is ever used).
static int pf_cache_get(pf_cache *c, uint32_t layer, uint32_t x, ck_mat *gate, ck_mat *up, ck_mat *down, moet_err *e) {
    const pf_layout *L = &c->f.h.L;
    int64_t i = pf_slot_index(L, layer, x);
    if (i < 0) return err_set(e, "%s: no slot for layer %u, expert %u", c->f.path, layer, x);
    pf_cache_lock(c);
    c->in_use = -1;   // the expert asked for before is done
    int s = c->where[i];
    if (s >= 0 && c->state[s] == PF_PLACE_LOADING) {   // on its way: wait (a failed prefetch unmaps it)
        double t0 = moet_now();
        while (c->where[i] == s && c->state[s] == PF_PLACE_LOADING) pthread_cond_wait(&c->ready, &c->mu);
        pf_cache_stats.read_s += moet_now() - t0;
        s = c->where[i];
    }
    if (s >= 0) {
        pf_cache_stats.hits++;
        if (c->ahead[s]) pf_cache_stats.prefetch_used++, c->ahead[s] = 0;
    } else {
        double t0w = moet_now();
        while ((s = pf_cache_victim(c, 0)) < 0) {   // every place being filled: wait for one
            MOET_ASSERT(c->prefetch, "expert cache: no place for a slot (%d places)", c->n_pool);
            pthread_cond_wait(&c->ready, &c->mu);
        }
        pf_cache_stats.read_s += moet_now() - t0w;
        if (c->owner[s] >= 0) c->where[c->owner[s]] = -1;
        c->owner[s] = -1, c->state[s] = PF_PLACE_LOADING, c->ahead[s] = 0;
        pf_cache_unlock(c);
        double t0 = moet_now();
        int rc = 0;
        if (c->fault_read && ++c->reads == c->fault_read) rc = pf_fault_read_err(&c->f, layer, x, c->fault_read, e);
        else rc = pf_read_slot(&c->f, layer, x, c->pool + (size_t)s * L->slot_stride, L->slot_stride, c->verify ? &c->sha : NULL, e);
        pf_cache_lock(c);
        if (rc) {   // the place stays free: nothing half-read is used
            c->state[s] = PF_PLACE_FREE;
            if (c->prefetch) pthread_cond_broadcast(&c->ready);
            pf_cache_unlock(c);
            return -1;
        }
        c->where[i] = s, c->owner[s] = (int32_t)i, c->state[s] = PF_PLACE_READY;
        pf_cache_stats.misses++;
        pf_cache_stats.bytes += L->slot_bytes;
        pf_cache_stats.read_s += moet_now() - t0;
    }
    c->used[s] = ++c->tick;
    c->in_use = s;
    pf_cache_unlock(c);
    pf_expert_mats(L, c->pool + (size_t)s * L->slot_stride, gate, up, down);
    return 0;
}

// Routed experts of a model served from a plane file by the CPU reference: every slot read once
// into host memory (page-aligned, O_DIRECT when the filesystem allows), each checked against
// its table hash unless no_verify, and the model's gate/up/down matrices pointed at them — or,
// with cache_gb smaller than the file, a pool of that size (pf_cache) the model reads through.
typedef struct {
    uint8_t *slots;      // [n_slots · slot_stride]
    size_t bytes;
    int cached;          // the model reads its experts through cache
    pf_cache cache;
} pf_attached;

static void pf_detach(pf_attached *a) {
    if (a->slots) arena_sys_free(a->slots, a->bytes);
    a->slots = NULL;
    a->bytes = 0;
    if (a->cached) {
        pf_cache *c = &a->cache;
        const pf_layout *L = &c->f.h.L;
        if (c->prefetch) {
            pthread_mutex_lock(&c->mu);
            c->stop = 1;
            pthread_cond_signal(&c->work);
            pthread_mutex_unlock(&c->mu);
            pthread_join(c->tid, NULL);
            pthread_mutex_destroy(&c->mu);
            pthread_cond_destroy(&c->work);
            pthread_cond_destroy(&c->ready);
            pf_sha_free(&c->sha_pf);
            c->prefetch = 0;
        }
        if (c->stack) arena_sys_free(c->stack, PF_PREFETCH_STACK);
        if (c->queue) arena_sys_free(c->queue, sizeof(int32_t) * (size_t)c->n_pool);
        if (c->state) arena_sys_free(c->state, (size_t)c->n_pool);
        if (c->ahead) arena_sys_free(c->ahead, (size_t)c->n_pool);
        if (c->pool) arena_sys_free(c->pool, c->pool_bytes);
        if (c->where) arena_sys_free(c->where, sizeof(int32_t) * L->n_slots);
        if (c->owner) arena_sys_free(c->owner, sizeof(int32_t) * (size_t)c->n_pool);
        if (c->used) arena_sys_free(c->used, sizeof(uint64_t) * (size_t)c->n_pool);
        pf_sha_free(&c->sha);
        pf_close(&c->f);
        a->cached = 0;
    }
    memset(&a->cache, 0, sizeof a->cache);
}

// The cache path of pf_attach_planes: the file f (opened, not verified whole) kept open, a pool
// of n_pool slots. On failure f is closed.
static int pf_attach_cache(ck_model *m, pf_file *f, int n_pool, const pf_serve_opts *o, pf_attached *a, moet_err *e) {
    pf_cache *c = &a->cache;
    const pf_layout *L = &f->h.L;
    memset(c, 0, sizeof *c);
    c->f = *f;
    a->cached = 1;
    c->verify = !o->no_verify;
    c->n_pool = n_pool;
    c->pool_bytes = (size_t)n_pool * L->slot_stride;
    c->pool = arena_sys_alloc(c->pool_bytes, "expert cache pool");
    c->where = arena_sys_alloc(sizeof(int32_t) * L->n_slots, "expert cache map");
    c->owner = arena_sys_alloc(sizeof(int32_t) * (size_t)n_pool, "expert cache owners");
    c->used = arena_sys_alloc(sizeof(uint64_t) * (size_t)n_pool, "expert cache ticks");
    c->state = arena_sys_alloc((size_t)n_pool, "expert cache states");
    c->ahead = arena_sys_alloc((size_t)n_pool, "expert cache prefetch marks");
    c->queue = arena_sys_alloc(sizeof(int32_t) * (size_t)n_pool, "expert cache prefetch queue");
    if (!c->pool || !c->where || !c->owner || !c->used || !c->state || !c->ahead || !c->queue || (c->verify && pf_sha_init(&c->sha, e))) {
        if (!e->msg[0]) err_set(e, "%s: cannot allocate an expert cache of %d slots (%.2f GiB)", f->path, n_pool, c->pool_bytes / 1073741824.0);
        pf_detach(a);
        return -1;
    }
    for (uint64_t i = 0; i < L->n_slots; i++) c->where[i] = -1;
    for (int k = 0; k < n_pool; k++) c->owner[k] = -1, c->used[k] = 0, c->state[k] = PF_PLACE_FREE, c->ahead[k] = 0;
    c->in_use = -1;
    if (o->prefetch) {   // the reader thread, on a stack of its own taken now (nothing is allocated after boot)
        pthread_attr_t at;
        c->stack = arena_sys_alloc(PF_PREFETCH_STACK, "expert prefetch stack");
        if (!c->stack || (c->verify && pf_sha_init(&c->sha_pf, e))) {
            if (!e->msg[0]) err_set(e, "cannot allocate the expert prefetch thread's stack");
            pf_detach(a);
            return -1;
        }
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->work, NULL);
        pthread_cond_init(&c->ready, NULL);
        pthread_attr_init(&at);
        pthread_attr_setstack(&at, c->stack, PF_PREFETCH_STACK);
        int rc = pthread_create(&c->tid, &at, pf_cache_reader, c);
        pthread_attr_destroy(&at);
        if (rc) {
            err_set(e, "cannot start the expert prefetch thread: %s", strerror(rc));
            pthread_mutex_destroy(&c->mu), pthread_cond_destroy(&c->work), pthread_cond_destroy(&c->ready);
            if (c->verify) pf_sha_free(&c->sha_pf);
            pf_detach(a);
            return -1;
        }
        c->prefetch = 1;
    }
    c->fault_read = pf_fault_read();
    memset(&pf_cache_stats, 0, sizeof pf_cache_stats);
    pf_cache_stats.pool_slots = (uint64_t)n_pool;
    pf_cache_stats.file_slots = L->n_slots;
    m->xcache = c;
    snprintf(m->expert_format, sizeof m->expert_format, "planes");
    return 0;
}

// One loader thread: claims slot indices from a shared counter and reads each one (O_DIRECT into
// its page-aligned place) while hashing it with its own context.
typedef struct {
    pf_file *f;
    pf_attached *a;
    const pf_layout *L;
    int verify;
    atomic_uint_fast64_t *next, *done;
    pf_sha sha;
    moet_err err;
    int failed;
} pf_loader;

static void *pf_loader_run(void *arg) {
    pf_loader *w = arg;
    const pf_layout *L = w->L;
    for (;;) {
        uint64_t i = atomic_fetch_add(w->next, 1);
        if (i >= L->n_slots) break;
        uint32_t layer = L->g.first_layer + (uint32_t)(i / L->g.n_experts), x = (uint32_t)(i % L->g.n_experts);
        if (pf_read_slot(w->f, layer, x, w->a->slots + i * L->slot_stride, L->slot_stride, w->verify ? &w->sha : NULL, &w->err)) {
            w->failed = 1;
            atomic_store(w->next, L->n_slots);   // the others stop at their next claim
            break;
        }
        atomic_fetch_add(w->done, 1);
    }
    return NULL;
}

// Reads every slot of the plane file into memory, with several threads, hashing each slot as it
// arrives (arena/DESIGN.md §6: stream the slots while hashing them; the bytes served are the bytes checked),
// a progress bar and GB/s on stderr; then the model's routed experts point into those slots.
// Only a complete, verified set replaces the checkpoint's experts.
static int pf_attach_planes(ck_model *m, const char *path, const pf_serve_opts *o, pf_attached *a, moet_err *e) {
    memset(a, 0, sizeof *a);
    pf_serve_opts open_opts = *o;
    open_opts.no_verify = 1;   // hashed below while the slots are read, one pass over the file
    pf_file f;
    if (pf_open_for_model(&f, path, &m->cfg, m->dir, &open_opts, e)) return -1;
    const pf_layout *L = &f.h.L;
    if (o->cache_gb > 0) {   // a pool smaller than the file: its slots read as they are used
        double n = floor(o->cache_gb * 1073741824.0 / (double)L->slot_stride);
        if (n < 1) {
            err_set(e, "--expert-cache-gb %g holds no expert slot of %.2f MiB", o->cache_gb, L->slot_stride / 1048576.0);
            pf_close(&f);
            return -1;
        }
        if (n < (double)L->n_slots) return pf_attach_cache(m, &f, (int)n, o, a, e);
    }
    int rc = -1, T = o->threads > 0 ? o->threads : pf_ncpu() + 2, started = 0;
    if (T > MOET_PF_MAX_THREADS) T = MOET_PF_MAX_THREADS;
    if ((uint64_t)T > L->n_slots) T = (int)L->n_slots;
    static pf_loader w[MOET_PF_MAX_THREADS];
    pthread_t tid[MOET_PF_MAX_THREADS];
    atomic_uint_fast64_t next = 0, done = 0;
    memset(w, 0, sizeof w);
    a->bytes = (size_t)(L->n_slots * L->slot_stride);
    a->slots = arena_sys_alloc(a->bytes, "plane slots");
    if (!a->slots) { err_set(e, "%s: cannot allocate %zu bytes for the expert slots", path, a->bytes); goto out; }
    for (int t = 0; t < T; t++) {
        w[t] = (pf_loader){&f, a, L, !o->no_verify, &next, &done, {0}, {{0}}, 0};
        if (!o->no_verify && pf_sha_init(&w[t].sha, e)) goto join;
    }
    pf_progress pr;
    pf_progress_start(&pr, o->no_verify ? "loading experts" : "loading + verifying experts");
    for (; started < T; started++)
        if (pthread_create(&tid[started], NULL, pf_loader_run, &w[started])) {
            err_set(e, "cannot start loader thread %d", started);
            atomic_store(&next, L->n_slots);
            goto join;
        }
    for (;;) {   // progress while the loaders run
        uint64_t d = atomic_load(&done);
        int busy = atomic_load(&next) < L->n_slots;
        char rate[48];
        double dt = moet_now() - pr.t0;
        snprintf(rate, sizeof rate, "%.2f GB/s", dt > 0 ? (double)d * L->slot_bytes / dt / 1e9 : 0.0);
        if (o->progress) pf_progress_show(&pr, d, L->n_slots, rate, !busy);
        if (!busy) break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    rc = 0;
join:
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    for (int t = 0; t < T; t++) {
        if (rc == 0 && w[t].failed) {
            *e = w[t].err;
            rc = -1;
        }
        pf_sha_free(&w[t].sha);
    }
    if (rc == 0 && atomic_load(&done) != L->n_slots) rc = err_set(e, "%s: %" PRIu64 " of %" PRIu64 " slots loaded", path,
                                                                 (uint64_t)atomic_load(&done), L->n_slots);
    if (rc) goto out;
    for (uint32_t l = 0; l < L->g.n_layers; l++)
        for (uint32_t x = 0; x < L->g.n_experts; x++) {
            ck_layer *cl = &m->layers[L->g.first_layer + l];
            pf_expert_mats(L, a->slots + ((size_t)l * L->g.n_experts + x) * L->slot_stride, &cl->gate[x], &cl->up[x], &cl->down[x]);
        }
    snprintf(m->expert_format, sizeof m->expert_format, "planes");
out:
    pf_close(&f);
    if (rc) pf_detach(a);
    return rc;
}
