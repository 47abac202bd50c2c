// format/serve_cmd.c — `moet serve`: flags, the model (checkpoint, tokenizer, generation
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
        size_t len;
        char *text = arena_read_small(path, MOET_MAX_CONFIG_BYTES, &len, e);
        if (!text) return -1;
        js_doc doc;
        int rc = js_load_doc(&doc, text, len, path, e);
        arena_sys_free(text, len + 1);
        if (rc) return -1;
        const js_node *root = js_root(&doc), *v;
        rc = -1;
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
    pf_serve_opts popt = {0, 0, 0, 0};
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

    double t0 = serve_now();
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
    fprintf(stderr, "moet serve: %s (%s experts, vocab %d) ready in %.2f s: context %d, %d sequences, %d tokens per step, "
            "queue %d, %d thread%s; host memory: engine %.1f MiB, server %.1f MiB\n",
            cfg.model_name, m.expert_format, m.cfg.vocab, serve_now() - t0, max_len, seqs, batch, queue, threads,
            threads > 1 ? "s" : "", r.mem.cap / 1048576.0, S.mem.cap / 1048576.0);
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
