// format/tokenizer_cmd.c — `moet tokenize`: text lines (JSON strings) to token ids, or back
// with --decode; the tokenizer itself is format/tokenizer.c.

// ==========================================================================================
// moet tokenize
// ==========================================================================================

static const char tok_cli_usage[] =
    "usage: moet tokenize --tokenizer FILE|DIR [--config FILE] [--decode [--skip-special]]\n"
    "  Reads stdin line by line. Each line is a JSON string: prints the JSON array of its token\n"
    "  ids (no special tokens added). With --decode each line is a JSON array of ids: prints\n"
    "  the decoded text as a JSON string (--skip-special drops special added tokens).\n"
    "  FILE is a tokenizer.json; a tokenizer_config.json beside it (or --config FILE) adds the\n"
    "  added tokens of its added_tokens_decoder. DIR means DIR/tokenizer.json.\n"
    "  Every input line gives exactly one output line: a bad line gives\n"
    "  {\"error\":{\"line\":N,\"message\":\"...\"}} (and the message on stderr), the others go on;\n"
    "  the exit status is then 1. A UTF-8 byte order mark at the start of a line is skipped.\n";

// A bad input line: the message on stderr, and in the line's place on stdout an error object,
// {"error":{"line":N,"message":"..."}}, so output line i always answers input line i.
static void tok_cli_bad(int64_t lineno, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tok_cli_bad(int64_t lineno, const char *fmt, ...) {
    char msg[1200], out[6 * sizeof msg + 64];   // a JSON escape is at most 6 bytes per byte
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "moet tokenize: line %" PRId64 ": %s\n", lineno, msg);
    js_writer w;
    js_w_init(&w, out, sizeof out);
    js_w_obj(&w);
    js_w_key(&w, "error");
    js_w_obj(&w);
    js_w_key(&w, "line");
    js_w_int(&w, lineno);
    js_w_key(&w, "message");
    js_w_str(&w, msg);
    js_w_end_obj(&w);
    js_w_end_obj(&w);
    MOET_ASSERT(!w.overflow, "error line exceeds %zu bytes", sizeof out);
    so_write(out, w.len);
    so_write("\n", 1);
}

static void tok_put_u32(uint32_t v) {
    char b[12];
    int k = 12;
    do { b[--k] = (char)('0' + v % 10); v /= 10; } while (v);
    so_write(b + k, (size_t)(12 - k));
}

typedef struct {
    const char *tokenizer, *config;
    int decode, skip_special;
} tok_cli_flags;

static const moet_flag tok_cli_flag_table[] = {
    FLAG_PATH("--tokenizer", tok_cli_flags, tokenizer, ARG_IN_ANY, "FILE|DIR"),
    FLAG_FILE("--config", tok_cli_flags, config),
    FLAG_SWITCH("--decode", tok_cli_flags, decode),
    FLAG_SWITCH("--skip-special", tok_cli_flags, skip_special),
};

static int cmd_tokenize(int argc, char **argv) {
    tok_cli_flags fl = {0};
    int arc = moet_args("tokenize", tok_cli_usage, tok_cli_flag_table, (int)(sizeof tok_cli_flag_table / sizeof tok_cli_flag_table[0]),
                        argc, argv, &fl);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : 2;   // a refused tokenizer path too: 2, as a refused tokenizer
    const char *path = fl.tokenizer, *config = fl.config;
    int decode = fl.decode, skip_special = fl.skip_special;
    if (!path) return moet_usage_error("tokenize", tok_cli_usage, "--tokenizer FILE is required");
    if (skip_special && !decode) {
        fprintf(stderr, "moet tokenize: --skip-special applies to --decode only\n");
        return 2;
    }
    char json_path[MOET_MAX_PATH], cfg_path[MOET_MAX_PATH];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(json_path, sizeof json_path, "%s/tokenizer.json", path) >= sizeof json_path) {
            fprintf(stderr, "moet tokenize: path too long: %s\n", path);
            return 2;
        }
    } else if ((size_t)snprintf(json_path, sizeof json_path, "%s", path) >= sizeof json_path) {
        fprintf(stderr, "moet tokenize: path too long: %s\n", path);
        return 2;
    }
    if (!config && tok_config_beside(json_path, cfg_path, sizeof cfg_path) == 0) config = cfg_path;

    moet_err e;
    tok t;
    if (tok_load(&t, json_path, config, &e)) {
        fprintf(stderr, "moet tokenize: %s\n", e.msg);
        return 2;
    }
    // fixed buffers for the whole run: the line reader's, a line's JSON tree, the ids, the text pieces
    const size_t max_line = MOET_TOK_CLI_MAX_LINE, max_ids = MOET_TOK_CLI_MAX_IDS, in_cap = max_line + 1 + (64u << 10);
    const size_t chunk_cap = tok_stream_max_out(&t), esc_cap = 6 * chunk_cap + 8;
    arena io;
    char *line = NULL, *chunk = NULL, *esc = NULL;
    js_node *nodes = NULL;
    char *strs = NULL;
    int32_t *ids = NULL;
    arena_plan iop = arena_plan_begin(&io, "tokenize buffers", ARENA_HOST, &e);
    while (arena_plan_pass(&iop)) {
        ARENA_TAKE(iop.on, line, in_cap, "line buffer");
        ARENA_TAKE(iop.on, nodes, max_ids + 1, "JSON values");
        ARENA_TAKE(iop.on, strs, max_line + 1, "JSON strings");
        ARENA_TAKE(iop.on, ids, max_ids, "ids");
        ARENA_TAKE(iop.on, chunk, chunk_cap, "decoded piece");
        ARENA_TAKE(iop.on, esc, esc_cap, "escaped piece");
    }
    if (iop.failed) {
        fprintf(stderr, "moet tokenize: %s\n", e.msg);
        tok_free(&t);
        return 2;
    }
    tok_scratch scr;
    arena scr_mem;
    if (tok_scratch_init(&scr, &scr_mem, MOET_TOK_CLI_MAX_TEXT, &e)) {
        fprintf(stderr, "moet tokenize: %s\n", e.msg);
        arena_release(&io);
        tok_free(&t);
        return 2;
    }

    int failed = 0;
    ln_reader in;
    ln_init_fd(&in, 0, line, in_cap, max_line);
    for (;;) {
        ln_line l;
        int k = ln_take(&in, &l);
        if (k == LN_NONE) {
            if (in.eof) break;
            ln_fill(&in, -1);
            continue;
        }
        if (so_failed()) break;   // nobody reads the answers any more
        int64_t lineno = l.no;
        size_t len = l.n;
        const char *text = l.s;
        if (k == LN_LONG) {
            tok_cli_bad(lineno, "longer than %zu bytes", max_line);
            failed = 1;
            continue;
        }
        js_doc d = {0};
        uint32_t n_nodes;
        size_t n_strs;
        if (js_measure(&d, text, len, &n_nodes, &n_strs)) {
            tok_cli_bad(lineno, "invalid JSON: %s", d.err);
            failed = 1;
            continue;
        }
        if (n_nodes > max_ids + 1) {
            tok_cli_bad(lineno, "more than %zu ids", max_ids);
            failed = 1;
            continue;
        }
        d.nodes = nodes;
        d.cap_nodes = n_nodes;
        d.strs = strs;
        d.cap_strs = max_line + 1;
        MOET_ASSERT(js_parse(&d, text, len) == 0, "second JSON pass: %s", d.err);
        const js_node *root = js_root(&d);
        if (!decode) {
            if (root->type != JS_STR) {
                tok_cli_bad(lineno, "expected a JSON string, got %s", js_type_name(root));
                failed = 1;
                continue;
            }
            size_t n;
            if (tok_encode(&t, &scr, root->str, root->len, ids, max_ids, &n, &e)) {
                tok_cli_bad(lineno, "%s", e.msg);
                failed = 1;
                continue;
            }
            so_write("[", 1);
            for (size_t i = 0; i < n; i++) {
                if (i) so_write(",", 1);
                tok_put_u32((uint32_t)ids[i]);
            }
            so_write("]\n", 2);
            continue;
        }
        if (root->type != JS_ARR) {
            tok_cli_bad(lineno, "expected a JSON array of ids, got %s", js_type_name(root));
            failed = 1;
            continue;
        }
        // check every id before printing anything of the line
        const js_node *v = js_first(root);
        int bad = 0;
        for (uint32_t i = 0; i < root->len; i++, v = js_next(&d, v)) {
            int64_t id;
            if (js_int(v, &id) || id < 0 || id >= t.n_ids || t.entries[id].kind == TOK_GAP) {
                if (js_int(v, &id))
                    tok_cli_bad(lineno, "element %u: expected an integer id, got %s", i,
                                v->type == JS_NUM ? "a fraction or an out-of-range number" : js_type_name(v));
                else tok_cli_bad(lineno, "element %u: id %" PRId64 " is not in the vocabulary (ids 0..%d)", i, id, t.n_ids - 1);
                bad = 1;
                break;
            }
            ids[i] = (int32_t)id;
        }
        if (bad) { failed = 1; continue; }
        tok_stream ts;
        tok_stream_init(&ts, skip_special);
        so_write("\"", 1);
        for (uint32_t i = 0; i <= root->len; i++) {
            size_t n;
            if (i < root->len) MOET_ASSERT(tok_decode_stream(&t, &ts, ids[i], chunk, chunk_cap, &n, &e) == 0, "%s", e.msg);
            else n = tok_stream_flush(&ts, chunk);
            if (!n) continue;
            js_writer w;
            js_w_init(&w, esc, esc_cap);
            js_w_strn(&w, chunk, n);
            MOET_ASSERT(!w.overflow && w.len >= 2, "escape buffer");
            so_write(esc + 1, w.len - 2);   // without the quotes js_w_strn adds
        }
        so_write("\"\n", 2);
    }
    if (in.err) {   // not the end of the input: say so, and fail
        fprintf(stderr, "moet tokenize: reading stdin failed: %s\n", strerror(in.err));
        failed = 1;
    }
    arena_release(&scr_mem);
    arena_release(&io);
    tok_free(&t);
    return failed;
}
