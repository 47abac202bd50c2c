// format/planes_cmd.c — the plane file against a checkpoint: `moet build-planes`, `moet verify`,
// `moet info`, and pf_open_for_model (what serving calls to take its experts from a plane file).
//
// The format itself is format/planes.c; the checkpoint (config, experts decoded to f64) is
// format/checkpoint.c.

// A Hugging Face cache snapshot directory ".../models--ORG--NAME/snapshots/REV" names its repo
// and revision. Returns 1 and fills repo ("ORG/NAME") and rev when dir is one, else 0.
static int pf_hf_snapshot(const char *dir, char *repo, size_t repo_cap, char *rev, size_t rev_cap) {
    char p[MOET_MAX_PATH];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (attempt == 0) snprintf(p, sizeof p, "%s", dir);
        else if (!realpath(dir, p)) return 0;
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/') p[--n] = 0;
        char *c3 = strrchr(p, '/');                 // "/REV"
        if (!c3) continue;
        *c3 = 0;
        char *c2 = strrchr(p, '/');                 // "/snapshots"
        if (!c2 || strcmp(c2 + 1, "snapshots")) continue;
        *c2 = 0;
        char *c1 = strrchr(p, '/');                 // "/models--ORG--NAME"
        const char *m = c1 ? c1 + 1 : p;
        if (strncmp(m, "models--", 8) || !m[8] || !c3[1]) continue;
        const char *name = m + 8;
        const char *sep = strstr(name, "--");      // Hub names cannot contain "--": the first one is the "/"
        if (sep) snprintf(repo, repo_cap, "%.*s/%s", (int)(sep - name), name, sep + 2);
        else snprintf(repo, repo_cap, "%s", name);
        snprintf(rev, rev_cap, "%s", c3 + 1);
        return 1;
    }
    return 0;
}

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
    if (model_dir && pf_hf_snapshot(model_dir, repo, sizeof repo, rev, sizeof rev)) {
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

// ---- command line: cmd_*(argc, argv) get main's arguments (argv[1] is the command) ----------

static int pf_arg_threads(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 1 || v > MOET_PF_MAX_THREADS) {
        fprintf(stderr, "moet: --threads %s: expected an integer in 1..%d\n", s, MOET_PF_MAX_THREADS);
        return -1;
    }
    *out = (int)v;
    return 0;
}

// The value of a flag at argv[*i] (advancing *i), or NULL with a message when it is missing.
static const char *pf_arg_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "moet: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int pf_expert_source(void *ctx, uint32_t layer, uint32_t expert, double *w13, double *w2, moet_err *e) {
    (void)e;
    ck_expert_f64((const ck_model *)ctx, (int)layer, (int)expert, w13, w2);
    return 0;
}

static void pf_build_usage(FILE *f) {
    fputs("usage: moet build-planes --model DIR --out FILE [--source-repo R] [--source-revision REV] [--threads N]\n"
          "       moet build-planes --model DIR|CONFIG.json --plan\n"
          "  Requantizes every routed expert of the checkpoint in DIR to 2-bit planes and writes the\n"
          "  MOET2PF1 file FILE (through FILE.tmp.PID, fsync'ed and renamed; removed on any failure or\n"
          "  fatal signal). An existing FILE must be a regular file: a symbolic link (not followed), a\n"
          "  FIFO, a device or a directory is refused. The source repo/revision\n"
          "  come from DIR when it is a Hugging Face cache snapshot (models--ORG--NAME/snapshots/REV).\n"
          "  --plan prints the file layout from the config alone.\n", f);
}

static int cmd_build_planes(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *repo_flag = NULL, *rev_flag = NULL;
    int threads = 0, plan = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) { if (!(model = pf_arg_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--out")) { if (!(out = pf_arg_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--source-repo")) { if (!(repo_flag = pf_arg_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--source-revision")) { if (!(rev_flag = pf_arg_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--threads")) {
            const char *v = pf_arg_value(argc, argv, &i);
            if (!v || pf_arg_threads(v, &threads)) return 2;
        } else if (!strcmp(a, "--plan")) plan = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { pf_build_usage(stdout); return 0; }
        else {
            fprintf(stderr, "moet build-planes: unknown argument '%s'\n", a);
            pf_build_usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "moet build-planes: --model is required\n");
        pf_build_usage(stderr);
        return 2;
    }
    moet_err e = {{0}};
    if (plan) {
        ck_config c;
        pf_geom g;
        pf_layout L;
        if (pf_model_config(model, &c, &e)) { fprintf(stderr, "moet build-planes: %s\n", e.msg); return 1; }
        pf_geom_of_config(&c, &g);
        if (pf_plan(&g, &L, &e)) { fprintf(stderr, "moet build-planes: %s: %s\n", model, e.msg); return 1; }
        pf_print_plan(stdout, &L);
        return 0;
    }
    if (!out) {
        fprintf(stderr, "moet build-planes: --out is required\n");
        pf_build_usage(stderr);
        return 2;
    }
    if (of_check_target(out, &e)) {   // before the work (and again when the file is put in place)
        fprintf(stderr, "moet build-planes: %s\n", e.msg);
        return 1;
    }
    char repo[256] = "", rev[256] = "";
    if (pf_hf_snapshot(model, repo, sizeof repo, rev, sizeof rev)) {
        if ((repo_flag && strcmp(repo_flag, repo)) || (rev_flag && strcmp(rev_flag, rev))) {
            fprintf(stderr, "moet build-planes: %s is the snapshot %s of %s; --source-repo/--source-revision say %s %s\n",
                    model, rev, repo, repo_flag ? repo_flag : repo, rev_flag ? rev_flag : rev);
            return 2;
        }
    } else {
        snprintf(repo, sizeof repo, "%s", repo_flag ? repo_flag : "");
        snprintf(rev, sizeof rev, "%s", rev_flag ? rev_flag : "");
    }
    ck_model *m = arena_sys_alloc(sizeof *m, "checkpoint");
    if (!m) { fprintf(stderr, "moet build-planes: out of memory\n"); return 1; }
    if (ck_open(m, model, &e)) {
        fprintf(stderr, "moet build-planes: %s\n", e.msg);
        arena_sys_free(m, sizeof *m);
        return 1;
    }
    pf_build_opts o;
    memset(&o, 0, sizeof o);
    pf_geom_of_config(&m->cfg, &o.geom);
    o.out_path = out;
    o.source_repo = repo;
    o.source_revision = rev;
    o.source_format = m->expert_format;
    o.threads = threads;
    o.progress = 1;
    o.source = pf_expert_source;
    o.source_ctx = m;
    fprintf(stderr, "build-planes: %s (%s experts, %d layers x %d experts, H %d, I %d)%s%s%s%s -> %s\n", model,
            m->expert_format, m->cfg.n_layers, m->cfg.n_experts, m->cfg.hidden, m->cfg.inter, *repo ? ", repo " : "", repo,
            *rev ? ", revision " : "", rev, out);
    pf_build_stats st = {0};
    int rc = pf_build(&o, &st, &e);
    ck_close(m);
    arena_sys_free(m, sizeof *m);
    if (rc) {
        fprintf(stderr, "moet build-planes: %s\n", e.msg);
        return 1;
    }
    pf_layout L;
    pf_plan(&o.geom, &L, NULL);
    fprintf(stderr, "build-planes: wrote %s: %" PRIu64 " slots, %" PRIu64 " bytes in %.1f s (%.1f experts/s)\n", out, st.slots,
            L.file_bytes, st.seconds, (double)st.slots / (st.seconds + 1e-9));
    return 0;
}

static void pf_verify_usage(FILE *f) {
    fputs("usage: moet verify FILE [--model DIR|CONFIG.json] [--threads N] [--strict-revision]\n"
          "  Checks a MOET2PF1 file: header, slot table, every slot's SHA-256 and zero padding\n"
          "  (O_DIRECT reads, several hashing threads); with --model, its geometry against the config\n"
          "  and its source revision against a Hugging Face snapshot directory. Exit 0 only when all hold.\n", f);
}

static int cmd_verify(int argc, char **argv) {
    const char *file = NULL, *model = NULL;
    int threads = 0, strict = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) { if (!(model = pf_arg_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--threads")) {
            const char *v = pf_arg_value(argc, argv, &i);
            if (!v || pf_arg_threads(v, &threads)) return 2;
        } else if (!strcmp(a, "--strict-revision")) strict = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { pf_verify_usage(stdout); return 0; }
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "moet verify: unknown argument '%s'\n", a);
            pf_verify_usage(stderr);
            return 2;
        } else if (!file) file = a;
        else {
            fprintf(stderr, "moet verify: one FILE only ('%s' and '%s')\n", file, a);
            return 2;
        }
    }
    if (!file) {
        pf_verify_usage(stderr);
        return 2;
    }
    moet_err e = {{0}};
    ck_config c;
    if (model && pf_model_config(model, &c, &e)) {
        fprintf(stderr, "moet verify: %s\n", e.msg);
        return 1;
    }
    pf_file f;
    if (pf_open(&f, file, &e)) {
        fprintf(stderr, "moet verify: FAILED: %s\n", e.msg);
        return 1;
    }
    if (model) {
        pf_geom g;
        pf_geom_of_config(&c, &g);
        if (pf_check_geometry(&f.h, &g, &e)) {
            fprintf(stderr, "moet verify: FAILED: %s against %s: %s\n", file, model, e.msg);
            pf_close(&f);
            return 1;
        }
        char repo[256], rev[256];
        if (pf_hf_snapshot(model, repo, sizeof repo, rev, sizeof rev)) {
            int r = pf_check_source(&f.h, rev, strict, &e);
            if (r < 0) {
                fprintf(stderr, "moet verify: FAILED: %s: %s\n", file, e.msg);
                pf_close(&f);
                return 1;
            }
            if (r > 0) fprintf(stderr, "moet verify: warning: %s: %s\n", file, e.msg);
        }
    }
    pf_verify_stats st = {0};
    int rc = pf_verify_slots(&f, threads, 1, stderr, &st, &e);
    const pf_layout *L = &f.h.L;
    if (rc) fprintf(stderr, "moet verify: FAILED: %s\n", e.msg);
    else
        fprintf(stderr, "verify: %s OK: %u layers x %u experts, %" PRIu64 " slots, %" PRIu64 " bytes, %.2f GB/s%s\n", file,
                L->g.n_layers, L->g.n_experts, L->n_slots, L->file_bytes, (double)st.bytes / 1e9 / (st.seconds + 1e-9),
                f.fd_direct >= 0 ? " (O_DIRECT)" : " (page cache)");
    pf_close(&f);
    return rc ? 1 : 0;
}

// The header as one JSON object (into buf, NUL-terminated). Returns -1 when buf is too small.
static int pf_header_json(const pf_header *h, char *buf, size_t cap) {
    const pf_layout *L = &h->L;
    char hex[65];
    js_writer w;
    js_w_init(&w, buf, cap);
    js_w_obj(&w);
    js_w_key(&w, "magic"); js_w_str(&w, PF_MAGIC);
    js_w_key(&w, "version"); js_w_int(&w, h->version);
    js_w_key(&w, "page_bytes"); js_w_int(&w, h->page_bytes);
    js_w_key(&w, "n_layers"); js_w_int(&w, L->g.n_layers);
    js_w_key(&w, "first_layer"); js_w_int(&w, L->g.first_layer);
    js_w_key(&w, "n_experts"); js_w_int(&w, L->g.n_experts);
    js_w_key(&w, "hidden"); js_w_int(&w, L->g.hidden);
    js_w_key(&w, "inter"); js_w_int(&w, L->g.inter);
    js_w_key(&w, "block"); js_w_int(&w, h->block);
    js_w_key(&w, "slot_bytes"); js_w_int(&w, (int64_t)L->slot_bytes);
    js_w_key(&w, "slot_stride"); js_w_int(&w, (int64_t)L->slot_stride);
    js_w_key(&w, "table_offset"); js_w_int(&w, (int64_t)L->table_offset);
    js_w_key(&w, "table_bytes"); js_w_int(&w, (int64_t)L->table_bytes);
    js_w_key(&w, "body_offset"); js_w_int(&w, (int64_t)L->body_offset);
    js_w_key(&w, "file_bytes"); js_w_int(&w, (int64_t)L->file_bytes);
    pf_hex(h->table_sha256, 32, hex);
    js_w_key(&w, "table_sha256"); js_w_str(&w, hex);
    js_w_key(&w, "quant_abi"); js_w_str(&w, h->quant_abi);
    js_w_key(&w, "source_repo"); js_w_str(&w, h->source_repo);
    js_w_key(&w, "source_revision"); js_w_str(&w, h->source_revision);
    js_w_key(&w, "source_format"); js_w_str(&w, h->source_format);
    js_w_key(&w, "sections");
    js_w_obj(&w);
    for (int s = 0; s < 4; s++) {
        js_w_key(&w, pf_section_names[s]);
        js_w_obj(&w);
        js_w_key(&w, "offset"); js_w_int(&w, (int64_t)L->sec_off[s]);
        js_w_key(&w, "bytes"); js_w_int(&w, (int64_t)L->sec_bytes[s]);
        js_w_end_obj(&w);
    }
    js_w_end_obj(&w);
    pf_hex(h->header_sha256, 32, hex);
    js_w_key(&w, "header_sha256"); js_w_str(&w, hex);
    js_w_end_obj(&w);
    return w.overflow ? -1 : 0;
}

static int cmd_info(int argc, char **argv) {
    if (argc != 3 || argv[2][0] == '-') {
        int help = argc == 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"));
        fputs("usage: moet info FILE\n  Prints the header of a MOET2PF1 plane file as one JSON object.\n", help ? stdout : stderr);
        return help ? 0 : 2;
    }
    const char *file = argv[2];
    moet_err e = {{0}};
    // O_NONBLOCK: a FIFO must not hang the open; it is refused below like every non-file
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        fprintf(stderr, "moet info: %s: cannot open: %s\n", file, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "moet info: %s: not a regular file\n", file);
        close(fd);
        return 1;
    }
    uint8_t page[PF_PAGE];
    ssize_t n = 0;
    while ((size_t)n < sizeof page) {
        ssize_t r = pread(fd, page + n, sizeof page - (size_t)n, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            fprintf(stderr, "moet info: %s: cannot read: %s\n", file, strerror(errno));
            close(fd);
            return 1;
        }
        if (r == 0) break;
        n += r;
    }
    close(fd);
    pf_sha sha;
    pf_header h;
    if (pf_sha_init(&sha, &e) == 0) {
        int rc = pf_header_decode(page, (size_t)n, &sha, &h, &e);
        pf_sha_free(&sha);
        if (rc == 0) {
            char buf[4096];
            MOET_ASSERT(pf_header_json(&h, buf, sizeof buf) == 0, "header JSON exceeds %zu bytes", sizeof buf);
            printf("%s\n", buf);
            return 0;
        }
    }
    fprintf(stderr, "moet info: %s: %s\n", file, e.msg);
    return 1;
}
