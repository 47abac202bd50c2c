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

// Routed experts of a model served from a plane file by the CPU reference: every slot read once
// into host memory (page-aligned, O_DIRECT when the filesystem allows), each checked against
// its table hash unless no_verify, and the model's gate/up/down matrices pointed at them.
typedef struct {
    uint8_t *slots;      // [n_slots · slot_stride]
    size_t bytes;
} pf_attached;

static void pf_detach(pf_attached *a) {
    if (a->slots) arena_sys_free(a->slots, a->bytes);
    a->slots = NULL;
    a->bytes = 0;
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
