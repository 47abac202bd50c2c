// format/planes_cmd.c — the plane file's commands: `moet build-planes`, `moet verify`, `moet info`.
//
// The format is format/planes.c; a plane file for a model (geometry checks, attach) is
// format/planes_model.c; the checkpoint is format/checkpoint.c.

// ---- command line: cmd_*(argc, argv) get main's arguments (argv[1] is the command) ----------

static int pf_expert_source(void *ctx, uint32_t layer, uint32_t expert, double *w13, double *w2, moet_err *e) {
    (void)e;
    ck_expert_f64((const ck_model *)ctx, (int)layer, (int)expert, w13, w2);
    return 0;
}

static const char pf_build_usage[] =
    "usage: moet build-planes --model DIR --out FILE [--source-repo R] [--source-revision REV] [--threads N]\n"
    "       moet build-planes --model DIR|CONFIG.json --plan\n"
    "  Requantizes every routed expert of the checkpoint in DIR to 2-bit planes and writes the\n"
    "  MOET2PF1 file FILE (through FILE.tmp.PID, fsync'ed and renamed; removed on any failure or\n"
    "  fatal signal). An existing FILE must be a regular file: a symbolic link (not followed), a\n"
    "  FIFO, a device or a directory is refused before any work. The source repo/revision\n"
    "  come from DIR when it is a Hugging Face cache snapshot (models--ORG--NAME/snapshots/REV).\n"
    "  --plan prints the file layout from the config alone.\n";

typedef struct {
    const char *model, *out, *repo, *rev;
    int threads, plan;
} pf_build_flags;

static const moet_flag pf_build_flag_table[] = {
    FLAG_PATH("--model", pf_build_flags, model, ARG_IN_ANY, "DIR|CONFIG.json"),
    FLAG_PATH("--out", pf_build_flags, out, ARG_OUT_FILE, "FILE"),
    FLAG_STR("--source-repo", pf_build_flags, repo, PF_REPO_LEN),
    FLAG_STR("--source-revision", pf_build_flags, rev, PF_REV_LEN),
    FLAG_INT("--threads", pf_build_flags, threads, 1, MOET_PF_MAX_THREADS),
    FLAG_SWITCH("--plan", pf_build_flags, plan),
};

static int cmd_build_planes(int argc, char **argv) {
    pf_build_flags fl = {0};
    int arc = moet_args("build-planes", pf_build_usage, pf_build_flag_table,
                        (int)(sizeof pf_build_flag_table / sizeof pf_build_flag_table[0]), argc, argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    const char *model = fl.model, *out = fl.out, *repo_flag = fl.repo, *rev_flag = fl.rev;
    int threads = fl.threads, plan = fl.plan;
    if (!model) return moet_usage_error("build-planes", pf_build_usage, "--model is required");
    moet_err e = {{0}};
    if (plan) {
        ck_config c;
        pf_geom g;
        pf_layout L;
        if (pf_model_config(model, &c, &e)) { fprintf(stderr, "moet build-planes: %s\n", e.msg); return 1; }
        pf_geom_of_config(&c, &g);
        if (pf_plan(&g, &L, &e)) { fprintf(stderr, "moet build-planes: %s: %s\n", model, e.msg); return 1; }
        char text[1024];
        pf_plan_text(&L, text, sizeof text);
        so_puts(text);
        return 0;
    }
    if (!out) return moet_usage_error("build-planes", pf_build_usage, "--out is required");
    char repo[256] = "", rev[256] = "";
    if (ck_hf_snapshot(model, repo, sizeof repo, rev, sizeof rev)) {
        if ((repo_flag && strcmp(repo_flag, repo)) || (rev_flag && strcmp(rev_flag, rev))) {
            fprintf(stderr, "moet build-planes: %s is the snapshot %s of %s; --source-repo/--source-revision say %s %s\n",
                    model, rev, repo, repo_flag ? repo_flag : repo, rev_flag ? rev_flag : rev);
            return 2;
        }
    } else {
        snprintf(repo, sizeof repo, "%s", repo_flag ? repo_flag : "");
        snprintf(rev, sizeof rev, "%s", rev_flag ? rev_flag : "");
    }
    // the output file exists (as its temporary) from now on: a path that cannot be written fails
    // before the work, and a signal during the work removes it
    of_file of = {.fd = -1};
    if (of_begin(&of, out, &e)) {
        fprintf(stderr, "moet build-planes: --out %s\n", e.msg);
        return 1;
    }
    ck_model *m = arena_sys_alloc(sizeof *m, "checkpoint");
    if (!m || ck_open(m, model, &e)) {
        fprintf(stderr, "moet build-planes: %s\n", m ? e.msg : "out of memory");
        if (m) arena_sys_free(m, sizeof *m);
        of_abort(&of);
        return 1;
    }
    pf_build_opts o;
    memset(&o, 0, sizeof o);
    pf_geom_of_config(&m->cfg, &o.geom);
    o.out_path = out;
    o.out = &of;
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

static const char pf_verify_usage[] =
    "usage: moet verify FILE [--model DIR|CONFIG.json] [--threads N] [--strict-revision]\n"
    "  Checks a MOET2PF1 file: header, slot table, every slot's SHA-256 and zero padding\n"
    "  (O_DIRECT reads, several hashing threads); with --model, its geometry against the config\n"
    "  and its source revision against a Hugging Face snapshot directory. Exit 0 only when all hold.\n";

typedef struct {
    const char *file, *model;
    int threads, strict;
} pf_verify_flags;

static const moet_flag pf_verify_flag_table[] = {
    FLAG_PATH(NULL, pf_verify_flags, file, ARG_IN_FILE, "FILE"),
    FLAG_PATH("--model", pf_verify_flags, model, ARG_IN_ANY, "DIR|CONFIG.json"),
    FLAG_INT("--threads", pf_verify_flags, threads, 1, MOET_PF_MAX_THREADS),
    FLAG_SWITCH("--strict-revision", pf_verify_flags, strict),
};

static int cmd_verify(int argc, char **argv) {
    pf_verify_flags fl = {0};
    int arc = moet_args("verify", pf_verify_usage, pf_verify_flag_table,
                        (int)(sizeof pf_verify_flag_table / sizeof pf_verify_flag_table[0]), argc, argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    const char *file = fl.file, *model = fl.model;
    int threads = fl.threads, strict = fl.strict;
    if (!file) return moet_usage_error("verify", pf_verify_usage, "FILE is required");
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
        if (ck_hf_snapshot(model, repo, sizeof repo, rev, sizeof rev)) {
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

static const char pf_info_usage[] = "usage: moet info FILE\n  Prints the header of a MOET2PF1 plane file as one JSON object.\n";

typedef struct {
    const char *file;
} pf_info_flags;

static const moet_flag pf_info_flag_table[] = {
    FLAG_PATH(NULL, pf_info_flags, file, ARG_IN_FILE, "FILE"),
};

static int cmd_info(int argc, char **argv) {
    pf_info_flags fl = {0};
    int arc = moet_args("info", pf_info_usage, pf_info_flag_table, 1, argc, argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    const char *file = fl.file;
    if (!file) return moet_usage_error("info", pf_info_usage, "FILE is required");
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
            so_puts(buf);
            so_puts("\n");
            return 0;
        }
    }
    fprintf(stderr, "moet info: %s: %s\n", file, e.msg);
    return 1;
}
