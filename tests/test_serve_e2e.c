// tests/test_serve_e2e.c — `./moet serve` as users run it: the real binary, the bundled demo
// model, requests through a pipe or a file.
//
// Expected tokens come from transformers (the demo's golden.safetensors: the templated prompt
// ids and the greedy answers), never from this program.
#include "../moet.c"
#include "check.h"
#include "chat_tools.h"
#include <sys/wait.h>

static char out_text[64 << 20];
static char input[8 << 20];

// Every moet serve of these tests on the GPU (MOET_E2E_BACKEND=gpu, ./build.sh test-gpu).
static int e2e_on_gpu(void) {
    const char *backend = getenv("MOET_E2E_BACKEND");
    return backend && !strcmp(backend, "gpu");
}

// A small --max-batch-tokens for --max-num-seqs seqs that cuts the demo's prompts into chunks
// on the CPU; the GPU backend cuts prompts only at multiples of 64 tokens and needs seqs + 63.
static const char *small_budget(const char *cpu, const char *gpu) { return e2e_on_gpu() ? gpu : cpu; }

// The backend every moet serve here runs on: cpu, or MOET_E2E_BACKEND (gpu under ./build.sh
// test-gpu). Each run's stderr must say that this backend ran (e2e_backend_ran): never "auto"
// and a silent fallback.
static const char *e2e_backend(void) {
    const char *backend = getenv("MOET_E2E_BACKEND");
    return backend ? backend : "cpu";
}
static check_prop e2e_ran = {"every moet serve says on stderr that it ran on the backend asked for", 0, 0};

// A run that must be refused before the backend starts: the text its stderr must hold instead of
// the backend line (NULL: every other run).
static const char *e2e_refused;

// Reads the stderr a run left in file fe, (with MOET_E2E_LOG) copies it to ours, and checks the
// backend line: "moet serve: backend gpu (" or "moet serve: backend cpu (--backend cpu)"; or,
// for a run that must be refused before it starts, e2e_refused.
static void e2e_backend_ran(int fe) {
    static char log[1 << 20];
    lseek(fe, 0, SEEK_SET);
    ssize_t got = read(fe, log, sizeof log - 1);
    log[got > 0 ? got : 0] = 0;
    if (getenv("MOET_E2E_LOG")) fputs(log, stderr);
    if (e2e_refused) {
        CHECK(strstr(log, e2e_refused) != NULL, "stderr lacks the refusal \"%s\": %.2000s", e2e_refused, log);
        return;
    }
    char want[64];
    snprintf(want, sizeof want, "moet serve: backend %s (", e2e_backend());
    CHECK_PROP(&e2e_ran, strstr(log, want) != NULL, "stderr lacks \"%s\": %.2000s", want, log);
}

// Runs ./moet serve ARGS with `in` on stdin; stdout into out_text. Returns the exit status.
static int run_moet(const char *in, const char *const *args) {
    char in_path[] = "/tmp/moet_e2e_in_XXXXXX", out_path[] = "/tmp/moet_e2e_out_XXXXXX", err_path[] = "/tmp/moet_e2e_err_XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path), fe = mkstemp(err_path);
    MOET_ASSERT(fi >= 0 && fo >= 0 && fe >= 0, "temp files");
    size_t len = strlen(in);
    MOET_ASSERT(write(fi, in, len) == (ssize_t)len, "write input");
    lseek(fi, 0, SEEK_SET);
    const char *argv[32] = {"./moet", "serve", "--backend", e2e_backend()};
    int n = 4;
    for (int i = 0; args && args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    MOET_ASSERT(pid >= 0, "fork");
    if (pid == 0) {
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        execv("./moet", (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    e2e_backend_ran(fe);
    close(fe);
    unlink(err_path);
    lseek(fo, 0, SEEK_SET);
    ssize_t got = read(fo, out_text, sizeof out_text - 1);
    out_text[got > 0 ? got : 0] = 0;
    close(fi);
    close(fo);
    unlink(in_path);
    unlink(out_path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// ---- answers ---------------------------------------------------------------------------------

#include "answers.h"

// 1 when the JSON array `a` holds exactly ids[0..n).
static int same_ids(const js_doc *d, const js_node *a, const int32_t *ids, int n) {
    if (!a || a->type != JS_ARR || (int)a->len != n) return 0;
    const js_node *x = js_first(a);
    for (int i = 0; i < n; i++, x = js_next(d, x))
        if (x->type != JS_NUM || !x->is_int || x->i64 != ids[i]) return 0;
    return 1;
}

// ---- tests ---------------------------------------------------------------------------------

static const char *questions[3] = {"What does numpy.linalg.solve do?", "Explain torch.nn.functional.softmax.",
                                   "How do I use json.dumps?"};

// The greedy answers of transformers, through the template, the tokenizer, the scheduler
// and the reference forward — alone, three at once, with small prefill chunks, and with the
// routed experts from a plane file made by `moet build-planes` (transformers' answers with the
// experts replaced by their 2-bit planes).
static void test_golden(void) {
    const char *gpath = "tests/fixtures/demo_golden.safetensors";
    moet_err e = {{0}};
    st_set g;
    if (st_open(&g, gpath, &e)) { CHECK(0, "%s", e.msg); return; }
    char planes[] = "/tmp/moet_e2e_planes_XXXXXX";
    int pfd = mkstemp(planes);
    MOET_ASSERT(pfd >= 0, "temp file");
    close(pfd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "./moet build-planes --model tests/fixtures/demo --out %s >/dev/null 2>&1", planes);
    CHECK(system(cmd) == 0, "moet build-planes of the demo model");
    // the checkpoint's NVFP4 experts (the model named explicitly, so thinking is set off as the
    // demo was trained), then the plane file made here, then the default: the bundled model
    // served from build/demo.planes, which ./build.sh makes
    // (--act-dtype f32: the products exact as the goldens' f32, where the GPU's default, auto,
    // rounds their inputs to bf16 and one answer of the NVFP4 checkpoint then takes another
    // token at a near-tie; --act-dtype bf16 through the server: test_act_bf16, its cost: moet eval;
    // the default run, bf16 products on the GPU, gives the goldens' tokens for these three)
#define DEMO "--model", "tests/fixtures/demo", "--default-thinking", "off", "--act-dtype", "f32"
    const char *configs[5][13] = {{DEMO, "--max-num-seqs", "1", NULL},
                                  {DEMO, "--max-num-seqs", "3", NULL},
                                  {DEMO, "--max-num-seqs", "3", "--max-batch-tokens", small_budget("5", "66"), NULL},
                                  {DEMO, "--planes", planes, "--max-num-seqs", "3", NULL},
                                  {"--max-num-seqs", "2", NULL}};
#undef DEMO
    for (int c = 0; c < 5; c++) {
        size_t at = 0;
        for (int q = 0; q < 3; q++)
            at += (size_t)snprintf(input + at, sizeof input - at,
                                   "{\"id\":\"g%d\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"temperature\":0,"
                                   "\"max_tokens\":48,\"return_token_ids\":true}\n", q, questions[q]);
        int rc = run_moet(input, configs[c]);
        CHECK(rc == 0, "exit status %d", rc);
        parse_answers();
        for (int q = 0; q < 3; q++) {
            char id[8], name[64];
            snprintf(id, sizeof id, "g%d", q);
            int a = find_answer(id, "chat.completion");
            CHECK(a >= 0, "config %d: g%d answered", c, q);
            if (a < 0) continue;
            snprintf(name, sizeof name, "prompt%d.ids", q);
            const st_tensor *p = st_find(&g, name);
            snprintf(name, sizeof name, "%s.prompt%d.greedy_ids", c >= 3 ? "planes" : "nvfp4", q);
            const st_tensor *gr = st_find(&g, name);
            CHECK(p && gr, "golden tensors of question %d", q);
            if (!p || !gr) continue;
            CHECK(same_ids(&ans_doc[a], path(a, "prompt_token_ids", 0, 0, 0), (const int32_t *)p->data, (int)p->numel),
                  "config %d question %d: prompt ids differ from transformers'", c, q);
            CHECK(same_ids(&ans_doc[a], path(a, "choices", "0", "token_ids", 0), (const int32_t *)gr->data, (int)gr->numel),
                  "config %d question %d: greedy ids differ from transformers': %s", c, q, ans_line[a]);
        }
    }
    st_close(&g);
    unlink(planes);
}

// A seeded, sampled request alone and in the middle of a busy batch: the same tokens.
static void test_determinism(void) {
    const char *req = "{\"id\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"What does os.path.join do?\"}],"
                      "\"temperature\":0.9,\"top_p\":0.95,\"top_k\":40,\"seed\":77,\"max_tokens\":40,\"return_token_ids\":true}\n";
    const char *solo[] = {"--max-num-seqs", "1", NULL};
    run_moet(req, solo);
    parse_answers();
    int a = find_answer("x", "chat.completion");
    CHECK(a >= 0, "alone: answered");
    if (a < 0) return;
    static char first[8192];
    const js_node *ids = path(a, "choices", "0", "token_ids", 0);
    CHECK(ids && ids->len > 0, "alone: token ids");
    snprintf(first, sizeof first, "%s", strstr(ans_line[a], "\"token_ids\""));
    *strstr(first, "]") = 0;
    size_t at = 0;
    for (int k = 0; k < 6; k++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"id\":\"o%d\",\"messages\":[{\"role\":\"user\",\"content\":\"What does re.sub do? %d\"}],"
                               "\"max_tokens\":%d,\"seed\":%d}\n", k, k, 10 + 7 * k, k);
    at += (size_t)snprintf(input + at, sizeof input - at, "%s", req);
    for (int k = 6; k < 9; k++)
        at += (size_t)snprintf(input + at, sizeof input - at, "{\"id\":\"o%d\",\"prompt\":\"def f(x):\",\"max_tokens\":20}\n", k);
    const char *busy[] = {"--max-num-seqs", "4", "--max-batch-tokens", small_budget("9", "67"), NULL};
    run_moet(input, busy);
    parse_answers();
    int b = find_answer("x", "chat.completion");
    CHECK(b >= 0, "busy: answered");
    if (b < 0) return;
    char *s = strstr(ans_line[b], "\"token_ids\"");
    CHECK(s && !strncmp(s, first, strlen(first)) && s[strlen(first)] == ']', "same seeded tokens alone and in a busy batch");
}

// `--act-dtype bf16` through the server (on the GPU: the one-part product images): the products'
// inputs are rounded (the first token's log-probability is not the f32 run's), and a seeded answer
// is the same tokens alone and in a busy, differently chunked batch.
static void test_act_bf16(void) {
    const char *req = "{\"id\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"What does os.path.join do?\"}],"
                      "\"temperature\":0.9,\"top_p\":0.95,\"top_k\":40,\"seed\":77,\"max_tokens\":30,\"return_token_ids\":true,"
                      "\"logprobs\":true}\n";
    double lp[2] = {NAN, NAN};
    static char alone[8192];
    for (int bf = 0; bf < 2; bf++) {
        const char *args[] = {"--max-num-seqs", "1", "--act-dtype", bf ? "bf16" : "f32", NULL};
        run_moet(req, args);
        parse_answers();
        int a = find_answer("x", "chat.completion");
        CHECK(a >= 0, "--act-dtype %s: answered", bf ? "bf16" : "f32");
        if (a < 0) return;
        const js_node *c = path(a, "choices", "0", "logprobs", "content");
        CHECK(c && js_num(js_get(&ans_doc[a], js_at(&ans_doc[a], c, 0), "logprob"), &lp[bf]) == 0, "--act-dtype: a first logprob");
        if (bf) {
            const char *ids = strstr(ans_line[a], "\"token_ids\"");
            CHECK(ids != NULL, "--act-dtype bf16: token ids");
            if (!ids) return;
            snprintf(alone, sizeof alone, "%s", ids);
            *strchr(alone, ']') = 0;
        }
    }
    CHECK(lp[0] != lp[1], "--act-dtype bf16: the first token's logprob %.9g is the f32 run's", lp[1]);
    size_t at = 0;
    for (int k = 0; k < 3; k++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"id\":\"o%d\",\"messages\":[{\"role\":\"user\",\"content\":\"What does re.sub do? %d\"}],"
                               "\"max_tokens\":%d,\"seed\":%d}\n", k, k, 12 + 5 * k, k);
    snprintf(input + at, sizeof input - at, "%s", req);
    const char *busy[] = {"--max-num-seqs", "4", "--max-batch-tokens", small_budget("9", "67"), "--act-dtype", "bf16", NULL};
    run_moet(input, busy);
    parse_answers();
    int b = find_answer("x", "chat.completion");
    CHECK(b >= 0, "--act-dtype bf16, busy: answered");
    if (b < 0) return;
    const char *s = strstr(ans_line[b], "\"token_ids\"");
    CHECK(s && !strncmp(s, alone, strlen(alone)) && s[strlen(alone)] == ']', "--act-dtype bf16: the same seeded tokens alone and in a busy batch");
    printf("--act-dtype bf16 through moet serve (%s): first logprob %.6f (f32 %.6f), the same tokens alone and in a busy batch\n",
           e2e_backend(), lp[1], lp[0]);
}

// Good and bad lines mixed through the real binary: one answer per line, ids matched.
static void test_protocol(void) {
    const char *lines[] = {
        "{\"id\":\"ok1\",\"messages\":[{\"role\":\"user\",\"content\":\"What does math.sqrt do?\"}],\"max_tokens\":12}",
        "{oops",
        "{\"id\":\"bad1\",\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}",
        "{\"id\":\"ok2\",\"prompt\":\"def add(a, b):\",\"max_tokens\":8,\"temperature\":0}",
        "{\"id\":\"bad2\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_p\":1.5}",
        "{\"custom_id\":\"ok3\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"messages\":[{\"role\":\"user\",\"content\":\"Explain len.\"}],\"max_tokens\":6}}",
        "{\"id\":\"ok4\",\"messages\":[{\"role\":\"system\",\"content\":\"Be short.\"},{\"role\":\"user\",\"content\":\"What does sorted do?\"}],\"max_tokens\":10,\"stream\":true}",
        "{\"op\":\"stats\"}",
    };
    size_t at = 0;
    int n = (int)(sizeof lines / sizeof lines[0]);
    for (int i = 0; i < n; i++) at += (size_t)snprintf(input + at, sizeof input - at, "%s\n", lines[i]);
    int rc = run_moet(input, NULL);
    CHECK(rc == 0, "exit 0 at EOF, got %d", rc);
    parse_answers();
    CHECK(n_ans >= 1 && js_str_is(path(0, "object", 0, 0, 0), "ready"), "ready line first");
    CHECK(find_answer("ok1", "chat.completion") >= 0 && find_answer("ok2", "text_completion") >= 0, "good requests answered");
    CHECK(find_answer("bad1", NULL) >= 0 && error_is(find_answer("bad1", NULL), "invalid_request"), "bad role: invalid_request");
    CHECK(find_answer("bad2", NULL) >= 0 && error_is(find_answer("bad2", NULL), "invalid_value"), "bad top_p: invalid_value");
    int batch = -1, stats = -1, nulls = 0, chunks = 0, final = -1;
    for (int i = 0; i < n_ans; i++) {
        if (js_str_is(path(i, "custom_id", 0, 0, 0), "ok3")) batch = i;
        if (js_str_is(path(i, "object", 0, 0, 0), "stats")) stats = i;
        const js_node *id = path(i, "id", 0, 0, 0);
        if (id && id->type == JS_NULL) nulls++;
        if (js_str_is(id, "ok4")) {
            chunks++;
            const js_node *fr = path(i, "choices", "0", "finish_reason", 0);
            if (fr && fr->type == JS_STR) final = i;
        }
    }
    CHECK(batch >= 0 && path(batch, "response", "status_code", 0, 0)->i64 == 200, "batch line answered");
    CHECK(stats >= 0, "stats answered");
    // the stats line agrees: device memory on the GPU, none on the CPU
    CHECK(stats >= 0 && path(stats, "device_bytes", 0, 0, 0) &&
          (e2e_on_gpu() ? path(stats, "device_bytes", 0, 0, 0)->i64 > 0 : path(stats, "device_bytes", 0, 0, 0)->i64 == 0),
          "stats: device_bytes on the %s backend: %s", e2e_backend(), stats >= 0 ? ans_line[stats] : "(none)");
    CHECK(nulls == 1, "one answer with id null (the broken JSON), got %d", nulls);
    CHECK(final >= 0 && chunks >= 2, "streamed request: chunks and a final chunk");
    CHECK(n_ans == 1 + (n - 1) + chunks, "one answer per line (streams aside): %d answers", n_ans);
}

// Streamed deltas add up to the answer of the same request without streaming.
static void test_stream_reassembly(void) {
    const char *base = "{\"id\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":\"Explain itertools.chain.\"}],"
                       "\"seed\":3,\"max_tokens\":60,\"enable_thinking\":%s%s}\n";
    for (int thinking = 0; thinking < 2; thinking++) {
        snprintf(input, sizeof input, base, thinking ? "true" : "false", "");
        run_moet(input, NULL);
        parse_answers();
        int a = find_answer("s", "chat.completion");
        CHECK(a >= 0, "non-streamed answer");
        if (a < 0) continue;
        static char want_c[65536], want_r[65536], got_c[65536], got_r[65536];
        const js_node *m = path(a, "choices", "0", "message", 0);
        const js_node *c = js_get(&ans_doc[a], m, "content"), *r = js_get(&ans_doc[a], m, "reasoning_content");
        snprintf(want_c, sizeof want_c, "%s", c ? c->str : "");
        snprintf(want_r, sizeof want_r, "%s", r ? r->str : "");
        CHECK(thinking ? r != NULL : r == NULL, "reasoning_content present only with thinking on");
        snprintf(input, sizeof input, base, thinking ? "true" : "false", ",\"stream\":true");
        run_moet(input, NULL);
        parse_answers();
        got_c[0] = got_r[0] = 0;
        for (int i = 1; i < n_ans; i++) {
            const js_node *d = path(i, "choices", "0", "delta", 0);
            const js_node *dc = js_get(&ans_doc[i], d, "content"), *dr = js_get(&ans_doc[i], d, "reasoning_content");
            if (dc) strncat(got_c, dc->str, sizeof got_c - strlen(got_c) - 1);
            if (dr) strncat(got_r, dr->str, sizeof got_r - strlen(got_r) - 1);
        }
        CHECK(!strcmp(got_c, want_c) && !strcmp(got_r, want_r), "thinking %d: stream [%s|%s] vs [%s|%s]", thinking, got_r,
              got_c, want_r, want_c);
    }
}

// A chat request with three tools and two tool calls through the real binary: the prompt ids it
// reports are the demo tokenizer's ids (`moet tokenize`, itself checked against Hugging Face's)
// of the prompt the template renders, written out by hand in chat_tools.h.
static void test_tools(void) {
    snprintf(input, sizeof input, "{\"id\":\"t\"," TOOLS3_MEMBERS ",\"max_tokens\":4,\"return_token_ids\":true}\n");
    const char *args[] = {"--model", "tests/fixtures/demo", NULL};
    CHECK(run_moet(input, args) == 0, "tools: exit status");
    parse_answers();
    int a = find_answer("t", "chat.completion");
    CHECK(a >= 0, "tools: answered: %s", n_ans > 1 ? ans_line[1] : "(nothing)");
    if (a < 0) return;
    // the expected prompt as a JSON string line for moet tokenize
    static char line[16384], ids_text[65536];
    js_writer w;
    js_w_init(&w, line, sizeof line - 1);
    js_w_str(&w, TOOLS3_PROMPT);
    MOET_ASSERT(!w.overflow, "tools prompt line");
    char tmp[] = "/tmp/moet_e2e_tok_XXXXXX", cmd[256];
    int fd = mkstemp(tmp);
    MOET_ASSERT(fd >= 0, "temp file");
    size_t n = strlen(line);
    line[n++] = '\n';
    MOET_ASSERT(write(fd, line, n) == (ssize_t)n, "write");
    close(fd);
    snprintf(cmd, sizeof cmd, "./moet tokenize --tokenizer tests/fixtures/demo < %s", tmp);
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(ids_text, 1, sizeof ids_text - 1, p) : 0;
    ids_text[got] = 0;
    CHECK(p && pclose(p) == 0, "%s", cmd);
    unlink(tmp);
    js_doc d;
    moet_err e = {{0}};
    if (js_load_doc(&d, ids_text, strlen(ids_text), "moet tokenize's output", &e)) { CHECK(0, "%s", e.msg); return; }
    const js_node *want = js_root(&d), *have = path(a, "prompt_token_ids", 0, 0, 0);
    int same = want && have && want->type == JS_ARR && have->type == JS_ARR && want->len == have->len;
    for (const js_node *x = same ? js_first(want) : NULL, *y = same ? js_first(have) : NULL; x && y && same;
         x = js_after(&d, want, x), y = js_after(&ans_doc[a], have, y))
        same = x->i64 == y->i64;
    CHECK(same, "tools: the prompt ids differ from the tokenized template prompt (%u ids, want %u)", have ? have->len : 0,
          want ? want->len : 0);
    js_free_doc(&d);
}

// The first SIGTERM stops reading and lets the running request finish; the second cancels.
static void test_signals(void) {
    for (int twice = 0; twice < 2; twice++) {
        int pin[2], pout[2];
        char err_path[] = "/tmp/moet_e2e_err_XXXXXX";
        int fe = mkstemp(err_path);
        MOET_ASSERT(pipe(pin) == 0 && pipe(pout) == 0 && fe >= 0, "pipe");
        pid_t pid = fork();
        MOET_ASSERT(pid >= 0, "fork");
        if (pid == 0) {
            dup2(pin[0], 0);
            dup2(pout[1], 1);
            close(pin[1]);
            close(pout[0]);
            dup2(fe, 2);
            execl("./moet", "./moet", "serve", "--backend", e2e_backend(), (char *)NULL);
            _exit(127);
        }
        close(pin[0]);
        close(pout[1]);
        const char *req = "{\"id\":\"long\",\"prompt\":\"def main():\",\"max_tokens\":400,\"ignore_eos\":true,\"stream\":true}\n";
        MOET_ASSERT(write(pin[1], req, strlen(req)) == (ssize_t)strlen(req), "write");
        // wait for the ready line and the first streamed chunk, then signal
        size_t got = 0;
        int lines = 0;
        while (lines < 2) {
            ssize_t k = read(pout[0], out_text + got, sizeof out_text - 1 - got);
            if (k <= 0) break;
            for (ssize_t i = 0; i < k; i++) lines += out_text[got + (size_t)i] == '\n';
            got += (size_t)k;
        }
        kill(pid, SIGTERM);
        if (twice) { usleep(20000); kill(pid, SIGTERM); }
        for (;;) {
            ssize_t k = read(pout[0], out_text + got, sizeof out_text - 1 - got);
            if (k <= 0) break;
            got += (size_t)k;
        }
        out_text[got] = 0;
        int st = 0;
        waitpid(pid, &st, 0);
        close(pin[1]);
        close(pout[0]);
        e2e_backend_ran(fe);
        close(fe);
        unlink(err_path);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "signal x%d: exit 0 (status %d)", twice + 1, st);
        parse_answers();
        const char *want = twice ? "cancelled" : "length";
        int fin = -1;
        for (int i = 0; i < n_ans; i++) {
            const js_node *fr = path(i, "choices", "0", "finish_reason", 0);
            if (fr && fr->type == JS_STR) fin = i;
        }
        CHECK(fin >= 0 && js_str_is(path(fin, "choices", "0", "finish_reason", 0), want), "signal x%d: finish_reason %s: %s",
              twice + 1, want, fin >= 0 ? ans_line[fin] : "(none)");
        if (!twice) CHECK(fin >= 0 && path(fin, "usage", "completion_tokens", 0, 0)->i64 == 400, "first signal: the request ran to its end");
    }
}

// Nesting of depth d ({"p": and [ alternating, around a 0) at s; returns the bytes written.
static size_t nested(char *s, int d) {
    size_t at = 0;
    for (int i = 0; i < d; i++) at += (size_t)sprintf(s + at, "%s", i % 2 ? "[" : "{\"p\":");
    s[at++] = '0';
    for (int i = d; i-- > 0;) s[at++] = i % 2 ? ']' : '}';
    s[at] = 0;
    return at;
}

// Lines that take the server through every other path once, right after ready, so that code
// or data first used there would show as faults in test_soak: logprobs, penalties, the sort of
// the whole vocabulary (top_k 0), stop strings, thinking, Batch lines, a cancel, each kind of
// error, and the deepest stack (JSON nested to the limit, parsed, then re-serialized by the chat
// template). `want` is what each id must get: a final answer or this error code.
static const char *const soak_ids[][2] = {
    {"x_lp", "answer"},  {"x_lp2", "answer"}, {"x_pen", "answer"}, {"x_all", "answer"},  {"x_stop", "answer"},
    {"x_think", "answer"}, {"x_batch", "answer"}, {"x_tools", "answer"}, {"x_args", "answer"}, {"x_long", "cancelled"},
    {"x_long", "duplicate_id"},
    {"x_ctx", "context_length_exceeded"}, {"x_n", "unsupported_value"}, {"x_none", "not_found"}};

static size_t soak_paths(char *s, size_t cap) {
    static char deep[4096], esc[8192];
    size_t at = 0;
#define ADD(...) (at += (size_t)snprintf(s + at, cap - at, __VA_ARGS__))
    ADD("{\"id\":\"x_lp\",\"messages\":[{\"role\":\"user\",\"content\":\"What does zip do?\"}],\"max_tokens\":6,"
        "\"logprobs\":true,\"top_logprobs\":20,\"stream\":true}\n");
    ADD("{\"id\":\"x_lp2\",\"prompt\":\"def add(a, b):\",\"max_tokens\":4,\"logprobs\":5}\n");
    ADD("{\"id\":\"x_pen\",\"prompt\":\"def f(x):\",\"max_tokens\":8,\"presence_penalty\":0.5,\"frequency_penalty\":0.5,"
        "\"repetition_penalty\":1.3}\n");
    ADD("{\"id\":\"x_all\",\"prompt\":\"def g(x):\",\"max_tokens\":8,\"top_k\":0,\"top_p\":0.99,\"temperature\":2,\"min_p\":0}\n");
    ADD("{\"id\":\"x_stop\",\"prompt\":\"def h(x):\",\"max_tokens\":30,\"stop\":[\"e\",\"the\"],\"stop_token_ids\":[5],"
        "\"stream\":true}\n");
    ADD("{\"id\":\"x_think\",\"messages\":[{\"role\":\"user\",\"content\":\"Explain map.\"}],\"enable_thinking\":true,"
        "\"max_tokens\":12,\"stream\":true}\n");
    ADD("{\"custom_id\":\"x_batch\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"import os\","
        "\"max_tokens\":4}}\n");
    nested(deep, MOET_JSON_MAX_DEPTH - 4);   // the line, its tools array, the tool and its function hold the rest
    ADD("{\"id\":\"x_tools\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"parameters\":%s}}],\"max_tokens\":1}\n", deep);
    nested(deep, MOET_JSON_MAX_DEPTH);   // arguments are a JSON text of their own
    size_t e = 0;
    for (const char *c = deep; *c; c++) {
        if (*c == '"') esc[e++] = '\\';
        esc[e++] = *c;
    }
    esc[e] = 0;
    ADD("{\"id\":\"x_args\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"%s\"}}]},"
        "{\"role\":\"user\",\"content\":\"ok\"}],\"max_tokens\":1}\n", esc);
    ADD("{\"id\":\"x_long\",\"prompt\":\"go\",\"max_tokens\":200,\"ignore_eos\":true}\n");
    ADD("{\"id\":\"x_long\",\"prompt\":\"again\",\"max_tokens\":1}\n");   // duplicate_id: x_long has not finished
    ADD("{\"op\":\"cancel\",\"id\":\"x_long\"}\n{\"op\":\"cancel\",\"id\":\"x_none\"}\n");
    ADD("{\"id\":\"x_n\",\"prompt\":\"a\",\"n\":2}\n{oops\n\xff\xfe\n");
    for (int i = 0; i < MOET_JSON_MAX_DEPTH + 1; i++) s[at++] = '[';   // too deep
    s[at++] = '\n';
    ADD("{\"id\":\"x_ctx\",\"prompt\":\"");   // past the 4,096-token context: the whole prompt is encoded first
    for (int i = 0; i < 5000; i++) ADD("word%d ", i);
    ADD("\"}\n");
    MOET_ASSERT(at + MOET_MAX_LINE + 12 < cap, "soak input buffer");
    memset(s + at, 'z', MOET_MAX_LINE + 10);   // over the line limit: skipped to its newline
    at += MOET_MAX_LINE + 10;
    s[at++] = '\n';
    s[at] = 0;
#undef ADD
    return at;
}

// 10,000 requests through the bundled model, after the lines of soak_paths: every request
// answered once, nothing allocated, and memory flat from the ready line on because everything
// it uses was made resident before that line (the arenas at allocation, then code, static data,
// weights and stack: serve_resident).
static void test_soak(void) {
    size_t at = 0;
    int n = 10000;
    at += (size_t)snprintf(input + at, sizeof input - at, "{\"op\":\"stats\",\"id\":\"st_ready\"}\n");   // read before any request
    // a burst of longer chat prompts fills whole steps (--max-batch-tokens) at once
    for (int k = 0; k < 128; k++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"id\":\"w%d\",\"messages\":[{\"role\":\"user\",\"content\":\"What does numpy.linalg.%s do, "
                               "and how is it used with arrays of shape (n, n)? %d\"}],\"max_tokens\":2}\n",
                               k, k % 2 ? "solve" : "eigvals", k);
    at += soak_paths(input + at, sizeof input - at);
    for (int k = 0; k < n; k++) {
        if (k == n - 1) at += (size_t)snprintf(input + at, sizeof input - at, "{\"op\":\"stats\",\"id\":\"st_end\"}\n");
        if (k % 100 == 0)   // a few through the chat template (~20 prompt tokens each); the CPU reference is slow
            at += (size_t)snprintf(input + at, sizeof input - at,
                                   "{\"id\":\"k%d\",\"messages\":[{\"role\":\"user\",\"content\":\"%d\"}],\"max_tokens\":1}\n", k, k);
        else
            at += (size_t)snprintf(input + at, sizeof input - at, "{\"id\":\"k%d\",\"input_ids\":[%d],\"max_tokens\":%d%s}\n", k,
                                   100 + k % 500, 1 + (k % 7 == 0), k % 3 == 0 ? ",\"stream\":true" : "");
    }
    MOET_ASSERT(at < sizeof input - 1, "soak input too long");
    const char *args[] = {"--max-num-seqs", "64", "--max-batch-tokens", "256", "--max-queue", "64", NULL};
    int rc = run_moet(input, args);
    CHECK(rc == 0, "soak: exit %d", rc);
    parse_answers();
    static unsigned char seen[10000];
    memset(seen, 0, sizeof seen);
    int finals = 0, dup = 0;
    for (int i = 0; i < n_ans; i++) {
        const js_node *id = path(i, "id", 0, 0, 0), *fr = path(i, "choices", "0", "finish_reason", 0);
        if (!fr || fr->type != JS_STR || !id || id->type != JS_STR || id->str[0] != 'k') continue;
        int k = atoi(id->str + 1);
        if (seen[k]) dup++;
        seen[k] = 1;
        finals++;
    }
    CHECK(finals == n && dup == 0, "soak: %d finished answers (%d duplicates) for %d requests", finals, dup, n);
    for (size_t j = 0; j < sizeof soak_ids / sizeof soak_ids[0]; j++) {
        const char *id = soak_ids[j][0], *want = soak_ids[j][1];
        int got = 0;
        for (int i = 0; i < n_ans; i++) {
            const char *cid = js_str_is(path(i, "custom_id", 0, 0, 0), id) ? id : NULL;
            if (!cid && !js_str_is(path(i, "id", 0, 0, 0), id)) continue;
            const js_node *fr = cid ? path(i, "response", "body", "choices", 0) : path(i, "choices", "0", "finish_reason", 0);
            if (cid) fr = fr ? js_get(&ans_doc[i], js_at(&ans_doc[i], fr, 0), "finish_reason") : NULL;
            if (!strcmp(want, "answer") ? fr && fr->type == JS_STR && !js_str_is(fr, "cancelled")
                                        : js_str_is(fr, want) || error_is(i, want))
                got++;
        }
        CHECK(got == 1, "soak: %s: %d lines with %s", id, got, want);
    }
    int errors = 0, json = 0, utf8 = 0, long_ = 0;
    for (int i = 0; i < n_ans; i++) {
        if (!path(i, "error", 0, 0, 0) || path(i, "id", 0, 0, 0)->type != JS_NULL) continue;
        errors++;
        json += error_is(i, "invalid_json");   // the broken line and the one nested too deep
        utf8 += error_is(i, "invalid_utf8");
        long_ += error_is(i, "line_too_long");
    }
    CHECK(errors == 4 && json == 2 && utf8 == 1 && long_ == 1,
          "soak: 4 errors with id null (broken JSON, bad UTF-8, too deep: invalid_json x2, invalid_utf8, line_too_long), got %d "
          "(%d, %d, %d)", errors, json, utf8, long_);

    int s0 = find_answer("st_ready", "stats"), s1 = find_answer("st_end", "stats");
    CHECK(s0 >= 0 && s1 >= 0, "soak: stats lines");
    if (s0 < 0 || s1 < 0) return;
    CHECK(path(s0, "requests_finished", 0, 0, 0)->i64 == 0 && path(s1, "requests_finished", 0, 0, 0)->i64 >= n,
          "soak: the first stats line is read before any request runs, the last after the soak");
    CHECK(path(s1, "allocations_after_ready", 0, 0, 0)->i64 == 0, "soak: no allocation after ready");
    int64_t a0 = path(s0, "rss_anon_kb", 0, 0, 0)->i64, a1 = path(s1, "rss_anon_kb", 0, 0, 0)->i64;
    int64_t r0 = path(s0, "rss_kb", 0, 0, 0)->i64, r1 = path(s1, "rss_kb", 0, 0, 0)->i64;
    int64_t minf = path(s1, "minor_faults_after_ready", 0, 0, 0)->i64, majf = path(s1, "major_faults_after_ready", 0, 0, 0)->i64;
    char seen_mem[256];
    snprintf(seen_mem, sizeof seen_mem, "anonymous %" PRId64 " -> %" PRId64 " KiB, resident %" PRId64 " -> %" PRId64
             " KiB, %" PRId64 " minor + %" PRId64 " major faults after ready", a0, a1, r0, r1, minf, majf);
    fprintf(stderr, "test_serve_e2e: soak: %s\n", seen_mem);
    // Anonymous memory (arenas, stacks, static data): not a page more than at ready (equal in
    // each of 30 runs). Every page of it was made resident before the ready line, so it could
    // only grow through a new allocation (libc's included: the counter above sees only the
    // arena's) or a stack deeper than planned; the kernel never adds one, it can only swap some
    // out. Even 1 byte leaked per request adds pages over these 10,000.
    // On the GPU the process also holds the driver's (libcuda's) own threads and heap, which it
    // grows on its own schedule: once in three GPU runs one page (+4 KiB, 1 minor fault) came
    // after ready, while the server's own memory is the same arenas as on the CPU. On the GPU
    // the bound is 4 pages (16 KiB); the exact one holds on the CPU, with the same server code.
    int64_t slack = e2e_on_gpu() ? 16 : 0;
    CHECK(a1 <= a0 + slack, "soak: anonymous memory grew after ready: %s", seen_mem);
    // Page faults: the server takes none of its own after ready (code, tables, static data,
    // weights, stack: all resident; 0 in each of 30 runs on a shared 2-core machine). The kernel
    // may still cause a few: a page it migrates (compaction), a clean file page it reclaims
    // faults in again on the next touch. 16 allows for those; a leak of more than 7 bytes per
    // request (64 KiB, 16 fresh pages, over 10,000 requests) exceeds it, and the anonymous check
    // above catches smaller ones. Memory pressure that takes away pages the server reads every
    // step exceeds it too (paging out the demo's mapped checkpoint mid-soak, as reclaim would,
    // cost 72 minor and 2 major faults); the message gives both counts.
    CHECK(minf <= 16, "soak: page faults after ready: %s", seen_mem);
    // Total resident memory also holds file pages (the mapped checkpoint, the code) that the
    // kernel may drop and fault back; it never adds one without a fault. One fault maps at most
    // the fault-around window of the file (16 pages, 64 KiB) or one anonymous page, so without
    // faults the total cannot grow at all.
    CHECK(r1 - r0 <= 64 * (minf + majf), "soak: resident memory grew more than the faults after ready map: %s", seen_mem);
}

// Device faults through the backends' test hook (MOET_FAULT), one request running at a time.
// A failed step (step:2, the first request's first decode step) answers that request with
// server_error and the server goes on: the two others are answered and the exit status is 0. A
// lost device (lost:2) answers the running request and the two waiting with server_error, writes
// nothing else, and exits 1.
static void test_faults(void) {
    size_t at = 0;
    for (int i = 0; i < 3; i++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"id\":\"f%d\",\"prompt\":\"def add(a, b):\",\"max_tokens\":4,\"temperature\":0}\n", i);
    const char *one[] = {"--max-num-seqs", "1", NULL};
    for (int lost = 0; lost < 2; lost++) {
        setenv("MOET_FAULT", lost ? "lost:2" : "step:2", 1);
        int rc = run_moet(input, one);
        unsetenv("MOET_FAULT");
        parse_answers();
        int errs = 0, answered = 0, other = 0;
        for (int i = 0; i < 3; i++) {
            char id[8];
            snprintf(id, sizeof id, "f%d", i);
            int k = find_answer(id, NULL);
            if (k >= 0 && error_is(k, "server_error")) errs++;
            else if (k >= 0 && path(k, "choices", "0", "finish_reason", 0)) answered++;
        }
        for (int i = 0; i < n_ans; i++)
            if (!js_str_is(path(i, "object", 0, 0, 0), "ready") && !path(i, "error", 0, 0, 0) && !path(i, "choices", 0, 0, 0)) other++;
        int f0 = find_answer("f0", NULL);
        if (!lost)
            CHECK(rc == 0 && errs == 1 && f0 >= 0 && error_is(f0, "server_error") && answered == 2 && other == 0,
                  "a failed step: its request answered with server_error, the two others answered, exit 0 (exit %d, %d errors, %d answers)",
                  rc, errs, answered);
        else
            CHECK(rc == 1 && errs == 3 && answered == 0 && other == 0 && n_ans == 4,
                  "a lost device: the running and both waiting requests answered with server_error, nothing else, exit 1 "
                  "(exit %d, %d errors, %d answers, %d lines)", rc, errs, answered, n_ans);
    }
}

// Speculative decoding with the demo's trained MTP head (--mtp, --speculative-tokens 3, and auto:
// the drafts of each step chosen by measurement): greedy requests (one with a stop string, one
// with a token budget that ends inside a verified row) give the tokens and logprobs of the run
// without drafts, and say in usage how many drafts made it into the answer; a sampled request
// drafts too. The same on either backend.
static void test_speculation(void) {
    static char texts[3][6][4096];
    size_t at = 0;
    for (int k = 0; k < 4; k++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"id\":\"s%d\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"temperature\":0,"
                               "\"max_tokens\":%d,\"logprobs\":true,\"top_logprobs\":2,\"return_token_ids\":true%s}\n",
                               k, questions[k % 3], k == 3 ? 5 : 40, k == 2 ? ",\"stop\":[\"(\"]" : "");
    at += (size_t)snprintf(input + at, sizeof input - at,
                           "{\"id\":\"s4\",\"prompt\":\"def add(a, b):\",\"temperature\":0.8,\"seed\":5,\"max_tokens\":20,"
                           "\"return_token_ids\":true}\n");
    const char *mtp = "tests/fixtures/demo_mtp/mtp.safetensors";
    long long accepted = 0, rejected = 0;
    for (int run = 0; run < 3; run++) {
        const char *args[] = {"--mtp", mtp, "--speculative-tokens", run == 2 ? "auto" : run ? "3" : "0", "--max-num-seqs", "3", NULL};
        int rc = run_moet(input, args);
        parse_answers();
        CHECK(rc == 0, "speculation run %d: exit %d", run, rc);
        for (int k = 0; k < 5; k++) {
            char id[8];
            snprintf(id, sizeof id, "s%d", k);
            int a = find_answer(id, NULL);
            CHECK(a >= 0 && path(a, "choices", "0", "token_ids", 0), "speculation run %d: %s answered: %.300s", run, id, a >= 0 ? ans_line[a] : "");
            if (a < 0) continue;
            const char *c = strstr(ans_line[a], "\"choices\""), *u = strstr(ans_line[a], "\"usage\"");
            snprintf(texts[run][k], sizeof texts[run][k], "%.*s", c && u && u > c ? (int)(u - c) : 0, c ? c : "");
            const js_node *acc = path(a, "usage", "completion_tokens_details", "accepted_prediction_tokens", 0),
                          *rej = path(a, "usage", "completion_tokens_details", "rejected_prediction_tokens", 0);
            if (run) {
                CHECK(acc && rej && acc->type == JS_NUM && rej->type == JS_NUM, "%s: drafts counted in usage: %.400s", id, ans_line[a]);
                if (acc && rej && k < 4 && run == 1) accepted += acc->i64, rejected += rej->i64;
            } else
                CHECK(!acc && !rej, "%s: no completion_tokens_details without drafts", id);
            if (run && k < 4)
                CHECK(!strcmp(texts[0][k], texts[run][k]), "%s: with drafts (%s) %.600s\nwithout %.600s", id, run == 2 ? "auto" : "3",
                      texts[run][k], texts[0][k]);
        }
    }
    CHECK(accepted > 0, "greedy answers with drafts: %lld accepted, %lld rejected", accepted, rejected);
    printf("serve: speculative decoding, 4 greedy requests, 3 drafts a step: %lld drafts in the answers, %lld not; the answers as "
           "without drafts, with 3 and with auto\n", accepted, rejected);
}

// The expert cache (--expert-cache-gb, either backend): a pool of a quarter of the demo's slots
// (the CPU with its prefetch thread; the GPU: one layer's experts, fetched per layer) gives the
// answers of every slot held; a failed read (MOET_FAULT=read:N) fails the requests of that step
// with the slot named, and the server goes on: the request read after it is answered.
static void test_expert_cache(void) {
    const char *pool[] = {"--expert-cache-gb", "0.000428", "--max-num-seqs", "1", NULL};   // 16 of the demo's 64 slots of 28,672 bytes
    size_t at = 0;
    for (int k = 0; k < 3; k++)
        at += (size_t)snprintf(input + at, sizeof input - at,
                               "{\"id\":\"c%d\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"temperature\":0,"
                               "\"max_tokens\":24,\"return_token_ids\":true}\n", k, questions[k]);
    static char held[3][2048];
    const char *all[] = {"--max-num-seqs", "1", NULL};
    // the failed read: the 30th a step makes itself, during the first request (16 slots, 64 in the
    // file; without the prefetch thread, whose reads would move it)
    const char *faulty[] = {"--expert-cache-gb", "0.000428", "--max-num-seqs", "1", "--expert-prefetch", "off", NULL};
    for (int run = 0; run < 3; run++) {
        if (run == 2) setenv("MOET_FAULT", "read:30", 1);
        int rc = run_moet(input, run == 0 ? all : run == 1 ? pool : faulty);
        unsetenv("MOET_FAULT");
        parse_answers();
        CHECK(rc == 0, "expert cache run %d: exit %d", run, rc);
        for (int k = 0; k < 3; k++) {
            char id[8];
            snprintf(id, sizeof id, "c%d", k);
            int a = find_answer(id, NULL);
            const js_node *ids = a >= 0 ? path(a, "choices", "0", "token_ids", 0) : NULL;
            const char *t = ids ? strstr(ans_line[a], "\"token_ids\"") : NULL;
            if (run == 0) snprintf(held[k], sizeof held[k], "%.*s", t ? (int)(strchr(t, ']') - t) : 0, t ? t : "");
            else if (run == 1)
                CHECK(t && !strncmp(t, held[k], strlen(held[k])), "%s: with a quarter of the slots the tokens differ: %.300s", id,
                      a >= 0 ? ans_line[a] : "");
            else if (k == 0)
                CHECK(a >= 0 && error_is(a, "server_error") && strstr(ans_line[a], "slot (layer ") && strstr(ans_line[a], "Input/output error"),
                      "a failed read: the request of its step answered with the slot named: %.400s", a >= 0 ? ans_line[a] : "");
            else
                CHECK(t && !strncmp(t, held[k], strlen(held[k])), "%s after a failed read: not answered as before: %.300s", id,
                      a >= 0 ? ans_line[a] : "");
        }
    }
}

int main(void) {
    if (access("./moet", X_OK) != 0) {
        CHECK(0, "./moet is missing: build it first (./build.sh)");
        return check_report("test_serve_e2e");
    }
    double t = moet_now();
#define TIMED(f) do { f(); fprintf(stderr, "test_serve_e2e: %s %.1f s\n", #f, moet_now() - t); t = moet_now(); } while (0)
    TIMED(test_golden);
    TIMED(test_determinism);
    TIMED(test_act_bf16);
    TIMED(test_protocol);
    TIMED(test_stream_reassembly);
    TIMED(test_tools);
    TIMED(test_signals);
    TIMED(test_faults);
    TIMED(test_speculation);
    TIMED(test_expert_cache);
    TIMED(test_soak);
    check_prop_end(&e2e_ran);
    return check_report("test_serve_e2e");
}
